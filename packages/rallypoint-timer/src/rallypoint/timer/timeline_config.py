"""The timeline's config: which events a worker records, where its log goes, how often it is written.

A JSON file, named by ``RALLYPOINT_TIMELINE_CONFIG`` (see :mod:`rallypoint.timer.timeline`)::

    {"events": ["step", "forward*"], "exclude": ["debug*"], "output": "tl/rank_{rank}.jsonl",
     "flush_interval": 0.5, "cuda": false}

:class:`TimelineError` is the timeline's error, for a bad config file as for a misused event.
"""

from __future__ import annotations

import fnmatch
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["TimelineConfig", "TimelineError"]


class TimelineError(RuntimeError):
    """Misuse of the timeline (an end without a start, a bad config file)."""


@dataclass(frozen=True)
class TimelineConfig:
    """What to record and where.

    Attributes:
        events: glob patterns of event names to record; ``None`` records every event.
        exclude: glob patterns never recorded (checked after ``events``).
        output: the log path when ``RALLYPOINT_TIMELINE_FILE`` is not set; ``{rank}`` is replaced.
        flush_interval: seconds between writes of the log (the most a crash can lose).
        cuda: also time spans with CUDA events when CUDA is in use.
    """

    events: tuple[str, ...] | None = None
    exclude: tuple[str, ...] = ()
    output: str | None = None
    flush_interval: float = 1.0
    cuda: bool = False

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "timeline config") -> TimelineConfig:
        """Validate a parsed JSON config; errors name the source and the key."""
        known = {"events", "exclude", "output", "flush_interval", "cuda"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise TimelineError(f"{source}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")

        def patterns(key: str) -> tuple[str, ...] | None:
            value = data.get(key)
            if value is None:
                return None
            if isinstance(value, str):
                value = [value]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise TimelineError(f"{source}: {key}: expected a list of event names or patterns")
            return tuple(value)

        interval = data.get("flush_interval", 1.0)
        if isinstance(interval, bool) or not isinstance(interval, int | float) or interval <= 0:
            raise TimelineError(f"{source}: flush_interval: expected a positive number of seconds, got {interval!r}")
        output = data.get("output")
        if output is not None and not isinstance(output, str):
            raise TimelineError(f"{source}: output: expected a path, got {output!r}")
        cuda = data.get("cuda", False)
        if not isinstance(cuda, bool):
            raise TimelineError(f"{source}: cuda: expected true or false, got {cuda!r}")
        return cls(
            events=patterns("events"),
            exclude=patterns("exclude") or (),
            output=output,
            flush_interval=float(interval),
            cuda=cuda,
        )

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> TimelineConfig:
        """Read a JSON config file."""
        try:
            data = json.loads(Path(path).read_text())
        except OSError as exc:
            raise TimelineError(f"cannot read timeline config {path}: {exc.strerror}") from exc
        except ValueError as exc:
            raise TimelineError(f"{path}: not valid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise TimelineError(f"{path}: expected a JSON object")
        return cls.from_dict(data, source=str(path))

    def wants(self, name: str) -> bool:
        """Whether events called ``name`` are recorded."""
        if self.events is not None and not any(fnmatch.fnmatchcase(name, p) for p in self.events):
            return False
        return not any(fnmatch.fnmatchcase(name, p) for p in self.exclude)
