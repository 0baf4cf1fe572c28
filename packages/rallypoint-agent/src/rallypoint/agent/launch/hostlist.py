"""Slurm's host-list syntax: ``node[01-04,07],gpu-a[1-2]-b`` to the host names it stands for."""

from __future__ import annotations

import re

__all__ = ["HostListError", "expand_hostlist"]

#: The most host names one list may stand for (a typo such as ``n[1-99999999]`` is refused).
MAX_HOSTS = 65536
_RANGE = re.compile(r"(\d+)(?:-(\d+))?")


class HostListError(ValueError):
    """A host list that is not in Slurm's syntax."""


def _split_top(text: str) -> list[str]:
    """``text`` split at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
            if depth > 1:
                raise HostListError(f"nested brackets in host list {text!r}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise HostListError(f"unbalanced ']' in host list {text!r}")
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise HostListError(f"unbalanced '[' in host list {text!r}")
    parts.append(text[start:])
    return parts


def _numbers(body: str, whole: str) -> list[str]:
    """The numbers of one bracket body (``01-04,07``), zero-padded as written."""
    out: list[str] = []
    for item in body.split(","):
        match = _RANGE.fullmatch(item.strip())
        if match is None:
            raise HostListError(f"invalid range {item!r} in host list {whole!r}")
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low):
            raise HostListError(f"range {item!r} runs backwards in host list {whole!r}")
        if int(high) - int(low) + len(out) >= MAX_HOSTS:
            raise HostListError(f"host list {whole!r} names more than {MAX_HOSTS} hosts")
        width = len(low) if low.startswith("0") else 0
        out += [str(n).zfill(width) for n in range(int(low), int(high) + 1)]
    return out


def _expand_one(part: str, whole: str) -> list[str]:
    names = [""]
    rest = part
    while rest:
        open_at = rest.find("[")
        if open_at < 0:
            names = [n + rest for n in names]
            break
        close_at = rest.index("]", open_at)
        prefix, body, rest = rest[:open_at], rest[open_at + 1 : close_at], rest[close_at + 1 :]
        names = [n + prefix + num for n in names for num in _numbers(body, whole)]
        if len(names) > MAX_HOSTS:
            raise HostListError(f"host list {whole!r} names more than {MAX_HOSTS} hosts")
    return names


def expand_hostlist(text: str) -> list[str]:
    """The host names of a Slurm host list, in order (``SLURM_JOB_NODELIST``).

    ``node[01-03,07]`` is ``node01 node02 node03 node07`` (zero padding kept), ``a,b[1-2]`` is
    ``a b1 b2``, and several bracket groups multiply (``r[1-2]n[1-2]``: ``r1n1 r1n2 r2n1 r2n2``).

    Raises:
        HostListError: unbalanced or nested brackets, a range that is not ``N`` or ``N-M`` with
            ``N <= M``, an empty name, or more than :data:`MAX_HOSTS` names.
    """
    hosts: list[str] = []
    for part in _split_top(text.strip()):
        part = part.strip()
        if not part:
            raise HostListError(f"empty host name in host list {text!r}")
        hosts += _expand_one(part, text)
        if len(hosts) > MAX_HOSTS:
            raise HostListError(f"host list {text!r} names more than {MAX_HOSTS} hosts")
    return hosts
