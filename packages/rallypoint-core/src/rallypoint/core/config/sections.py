"""Job-file sections, declared by the packages that own them, and the schema built from them.

Core knows no section in advance. Each package declares its sections through the
``rallypoint_config_sections`` hook (a :class:`ConfigSection`: name, pydantic model, summary,
whether it is optional); :func:`build_schema` turns the declared sections into the pydantic
model of a whole job file (phase 1 of validation). Plugin names inside a section are plain
strings here; they are looked up, and their ``options`` tables validated, in phase 2
(:mod:`rallypoint.core.config.resolve`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model
from pydantic_core import PydanticCustomError

from rallypoint.core.errors import PluginError

__all__ = ["ConfigSection", "JobSchema", "PerWorker", "Section", "build_schema", "cross_field_error"]

#: The ``ctx`` entry of a :func:`cross_field_error` that lists the keys it is about.
FIELDS_CTX = "rallypoint_fields"

_NAME_RE = re.compile(r"^[a-z][a-z0-9]*$")
#: Second words of core's own ``RALLYPOINT_*`` controls that take a key (``RALLYPOINT_DISABLE_PLUGINS``):
#: a section with one of these names would read them as configuration. ``RALLYPOINT_DEBUG`` is no
#: such word: the control is the bare variable, which names no key and so is never configuration,
#: and the agent's ``[debug]`` section (hang forensics) owns ``RALLYPOINT_DEBUG_<KEY>``.
RESERVED_NAMES = frozenset({"disable"})


class Section(BaseModel):
    """Base of every section: unknown keys are errors, values are validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True)


def cross_field_error(kind: str, message: str, fields: tuple[str, ...], **values: Any) -> PydanticCustomError:
    """An error of a section's ``model_validator`` about how several of its keys fit together.

    The error is reported at the first of ``fields`` that was set explicitly (its key path and
    where it was set: file, ``RALLYPOINT_*`` variable or flag), and the message names where the
    other fields were set when that differs, so that a value given by a flag is never blamed on
    the file or on the defaults.

    Args:
        kind: the error type (``"nodes_range"``).
        message: a template formatted with ``values``.
        fields: the keys of the section involved, most likely culprit first.
        values: the template's values.

    Example:
        >>> class Span(Section):
        ...     low: int = 0
        ...     high: int = 1
        >>> cross_field_error("span", "high ({high}) < low", ("high", "low"), high=0).message()
        'high (0) < low'
    """
    return PydanticCustomError(kind, message, {**values, FIELDS_CTX: tuple(fields)})


class PerWorker(str):
    """A ``worker_env`` value that differs per worker: the agent fills in :data:`FIELDS` for each one.

    ``{rank}`` (global rank), ``{local_rank}`` and ``{attempt_dir}`` (the attempt's directory in
    the job's log directory, where per-worker files go); ``{{`` and ``}}`` are literal braces.

    Example:
        >>> log = PerWorker("{attempt_dir}/timeline/rank_{rank}.jsonl")
        >>> log.fill(rank=3, local_rank=1, attempt_dir="runs/a/attempt_0")
        'runs/a/attempt_0/timeline/rank_3.jsonl'
    """

    FIELDS = ("rank", "local_rank", "attempt_dir")

    def fill(self, *, rank: int, local_rank: int, attempt_dir: str | Path) -> str:
        """The value for one worker."""
        return self.format(rank=rank, local_rank=local_rank, attempt_dir=str(attempt_dir))


class ProgressFile(PerWorker):
    """A :class:`PerWorker` path that its worker appends to as it makes progress (a timeline).

    The agent's hang watch (``[debug] hang_timeout``) counts the file's growth as progress, like
    a collective that completes.

    Example:
        >>> ProgressFile("{attempt_dir}/events/rank_{rank}.jsonl").fill(rank=0, local_rank=0, attempt_dir="a")
        'a/events/rank_0.jsonl'
    """


@dataclass(frozen=True)
class ConfigSection:
    """One ``[section]`` of the job file, declared by the package that reads it.

    Attributes:
        name: the table name, e.g. ``"widgets"``: lower case letters and digits (no ``_``,
            which separates the section from the key in ``RALLYPOINT_<SECTION>_<KEY>``).
        model: the :class:`Section` subclass validating the table. When a plugin kind selects
            plugins in this section, the model has the selector key (e.g. ``backend``) and an
            ``options: dict[str, Any]`` field validated by the selected plugin.
        summary: one line for people (``rallypoint plugins list``, docs).
        optional: the section is absent (``None``) unless the job file has it (a feature jobs opt into);
            otherwise it is always present, with its defaults.
        worker_env: what every worker of a job that has this section gets in its environment,
            decided once by the agent from the resolved job: called as
            ``worker_env(resolved, base)`` (a :class:`~rallypoint.core.config.ResolvedConfig`,
            and the directory the job's relative paths are taken from), returns
            ``{variable: value}``. Workers read these variables instead of the job file, so a
            value given by ``--set`` or ``RALLYPOINT_*`` reaches them like one from the file
            (:func:`~rallypoint.core.config.section_env` writes a whole section). A value that
            differs per worker is a :class:`PerWorker` template (a :class:`ProgressFile` when the
            worker's writes to it show progress).
        from_environment: what the environment a command runs in gives for keys the job left at
            their defaults (a scheduler's allocation: the number of nodes, the run id): called as
            ``from_environment(loaded, pm, environ)`` (the
            :class:`~rallypoint.core.config.LoadedConfig` as the user gave it, the plugin
            manager, the process environment), returns ``(key, value, source label)`` overrides
            such as ``("nodes.min", 3, "slurm (SLURM_JOB_NUM_NODES)")``. The file, ``RALLYPOINT_*``
            variables and flags win over them (:func:`~rallypoint.core.config.load_in_environment`).
            A callable, or its import path (``"package.module:function"``, imported when first
            called: the module that declares the section need not import it).

    Example:
        >>> class WidgetSection(Section):
        ...     kind: str = "plain"
        >>> ConfigSection("widgets", WidgetSection, "how widgets are made").name
        'widgets'
    """

    name: str
    model: type[Section]
    summary: str = ""
    optional: bool = False
    worker_env: Callable[[Any, Path], Mapping[str, str]] | None = None
    from_environment: Callable[[Any, Any, Mapping[str, str]], Iterable[tuple[str, Any, str]]] | str | None = None

    def __post_init__(self) -> None:
        problem = None
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name):
            problem = "use lower case letters and digits, starting with a letter"
        elif self.name in RESERVED_NAMES or hasattr(BaseModel, self.name):
            problem = "the name is reserved"
        elif not (isinstance(self.model, type) and issubclass(self.model, Section)):
            problem = f"its model {self.model!r} is not a rallypoint.core.config.Section subclass"
        elif self.worker_env is not None and not callable(self.worker_env):
            problem = f"its worker_env {self.worker_env!r} is not callable"
        elif self.from_environment is not None and not (
            callable(self.from_environment) or (isinstance(self.from_environment, str) and ":" in self.from_environment)
        ):
            problem = (
                f"its from_environment {self.from_environment!r} is neither callable nor 'package.module:function'"
            )
        if problem:
            raise PluginError(f"invalid config section {self.name!r}: {problem}")


@dataclass(frozen=True)
class JobSchema:
    """The structure of a job file: the declared sections and the pydantic model built from them.

    Build one with :func:`build_schema`, or ask a plugin manager (``pm.job_schema()``).

    Attributes:
        sections: the sections, in declaration order.
        model: the model of a whole job file; each section is an attribute named after it.
    """

    sections: tuple[ConfigSection, ...]
    model: type[Section]

    @property
    def names(self) -> tuple[str, ...]:
        """The section names, in declaration order."""
        return tuple(s.name for s in self.sections)

    def get(self, name: str) -> ConfigSection | None:
        """The section called ``name``, if declared."""
        return next((s for s in self.sections if s.name == name), None)

    def name_of(self, model: type[Section]) -> str | None:
        """The name of the section validated by ``model``, if declared."""
        return next((s.name for s in self.sections if s.model is model), None)


def build_schema(sections: Iterable[ConfigSection]) -> JobSchema:
    """Build the job-file schema from declared sections (cached per set of sections).

    Raises:
        PluginError: two sections have the same name.

    Example:
        >>> class WidgetSection(Section):
        ...     kind: str = "plain"
        >>> schema = build_schema([ConfigSection("widgets", WidgetSection)])
        >>> schema.model.model_validate({"widgets": {"kind": "bent"}}).widgets.kind
        'bent'
    """
    return _build(tuple(sections))


@functools.lru_cache(maxsize=32)
def _build(sections: tuple[ConfigSection, ...]) -> JobSchema:
    fields: dict[str, Any] = {}
    for section in sections:
        if section.name in fields:
            raise PluginError(f"config section [{section.name}] is declared twice")
        if section.optional:
            fields[section.name] = (section.model | None, Field(default=None, description=section.summary))
        else:
            fields[section.name] = (section.model, Field(default_factory=section.model, description=section.summary))
    model: type[Section] = create_model(
        "JobConfig",
        __base__=Section,
        __doc__="A whole job file; every section is optional in the file and takes its defaults.",
        **fields,
    )
    return JobSchema(sections, model)
