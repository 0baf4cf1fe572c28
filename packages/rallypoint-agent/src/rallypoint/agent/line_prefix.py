"""The prefix of each worker line on the agent's console (``agent.line_prefix``).

rallypoint's own form is ``[host:rank] `` (the host and the *global* rank: which of a thousand
workers printed it). torchrun users and their log parsers know ``[default0]:`` (the role and the
*local* rank): ``line_prefix = "torchrun"`` gives that, and torchrun's
``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE`` (``${role_name}``, ``${rank}``, ``${local_rank}``) is
honoured when the job does not set ``agent.line_prefix``.

A template names ``{host}``, ``{rank}``, ``{local_rank}`` and ``{role}``; double braces print one.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rallypoint.agent.ranks import WorkerRanks

__all__ = ["DEFAULT", "FIELDS", "PRESETS", "TORCHRUN_ENV", "check", "from_torchrun", "prefix_of"]

#: rallypoint's prefix: host and global rank.
DEFAULT = "[{host}:{rank}] "
#: Names a template may use.
FIELDS = ("host", "rank", "local_rank", "role")
#: Named templates.
PRESETS = {"rallypoint": DEFAULT, "torchrun": "[{role}{local_rank}]:"}
#: torchrun's variable for the same thing.
TORCHRUN_ENV = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"
_TORCHRUN_MACROS = {"role_name": "role", "rank": "rank", "local_rank": "local_rank"}


def check(value: str) -> str:
    """The template ``value`` names (a preset's, or itself); ``ValueError`` saying what is wrong."""
    template = PRESETS.get(value, value)
    try:
        fields = [(name, spec, conv) for _, name, spec, conv in string.Formatter().parse(template) if name is not None]
    except ValueError as exc:
        raise ValueError(f"{value!r} is not a template ({exc}); use {{{{ and }}}} for literal braces") from None
    unknown = sorted({name for name, _, _ in fields if name not in FIELDS})
    if unknown:
        raise ValueError(
            f"{value!r} names {', '.join('{' + n + '}' for n in unknown)}; a prefix may use "
            f"{', '.join('{' + f + '}' for f in FIELDS)}, or be one of {', '.join(sorted(PRESETS))}"
        )
    if any(spec or conv for _, spec, conv in fields):
        raise ValueError(f"{value!r}: write the fields plainly ({{rank}}), without a format or conversion")
    return template


def from_torchrun(environ: Mapping[str, str]) -> str | None:
    """Torchrun's ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE`` as a template (``None`` when unset).

    Raises:
        ValueError: it names a macro torchrun does not have.
    """
    value = environ.get(TORCHRUN_ENV)
    if not value:
        return None
    macros = [a or b for a, b in re.findall(r"\$\{(\w+)\}|\$(\w+)", value)]
    unknown = sorted(set(macros) - set(_TORCHRUN_MACROS))
    if unknown:
        raise ValueError(
            f"{TORCHRUN_ENV}={value!r} names ${{{unknown[0]}}}; torchrun's macros are "
            + ", ".join(f"${{{m}}}" for m in _TORCHRUN_MACROS)
        )
    escaped = value.replace("{", "{{").replace("}", "}}")
    return re.sub(r"\$\{\{(\w+)\}\}|\$(\w+)", lambda m: "{" + _TORCHRUN_MACROS[m.group(1) or m.group(2)] + "}", escaped)


def prefix_of(template: str, host: str, worker: WorkerRanks) -> str:
    """The prefix of one worker's lines (``template`` checked by :func:`check`)."""
    return template.format(host=host, rank=worker.rank, local_rank=worker.local_rank, role=worker.role)
