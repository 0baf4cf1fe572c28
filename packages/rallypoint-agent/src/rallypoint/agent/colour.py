"""Colour for the agent's own messages: on a terminal only, never with ``NO_COLOR`` or ``TERM=dumb``."""

from __future__ import annotations

import os

__all__ = ["agent_line", "colour_enabled"]

_BOLD_CYAN, _RED, _GREEN, _YELLOW, _RESET = "\x1b[1;36m", "\x1b[31m", "\x1b[32m", "\x1b[33m", "\x1b[0m"


def colour_enabled(stream: object, environ: dict[str, str] | None = None) -> bool:
    """Whether to colour text for ``stream``: a terminal, ``NO_COLOR`` unset (or empty), ``TERM`` not ``dumb``."""
    env = os.environ if environ is None else environ
    if env.get("NO_COLOR") or env.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty is not None and isatty())
    except ValueError:  # a closed stream
        return False


def agent_line(host: str, message: str, stream: object, environ: dict[str, str] | None = None) -> str:
    """One agent message, ``[rallypoint HOST] message``, coloured on a terminal.

    The prefix is bold cyan; a message about a failure is red, a success green, a restart or a
    new round yellow. Plain text when :func:`colour_enabled` says no.
    """
    prefix = f"[rallypoint {host}]"
    if not colour_enabled(stream, environ):
        return f"{prefix} {message}"
    lower = message.lower()
    if "failed" in lower or "error" in lower or "killing" in lower:
        colour = _RED
    elif "succeeded" in lower:
        colour = _GREEN
    elif "restart" in lower or "re-rendezvous" in lower:
        colour = _YELLOW
    else:
        return f"{_BOLD_CYAN}{prefix}{_RESET} {message}"
    return f"{_BOLD_CYAN}{prefix}{_RESET} {colour}{message}{_RESET}"
