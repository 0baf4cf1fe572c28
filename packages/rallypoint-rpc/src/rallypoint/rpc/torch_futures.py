"""``torch.futures.wait_all`` and ``collect_all`` made to take rallypoint's futures, in torch's mode.

Programs written for ``torch.distributed.rpc`` gather their replies with
``torch.futures.wait_all(futs)``. torch hands that list to its C++ core, which refuses any future
but its own, so a program that switched its import to :mod:`rallypoint.rpc` failed there although
nothing else needed changing. Under ``[rpc] mode = "torch"``, :func:`install` (called by
``init_rpc``) puts two functions in their place in ``torch.futures``: a list made only of torch's
futures goes to torch's own function, untouched; any other list goes to
:func:`rallypoint.rpc.futures.wait_all` or :func:`~rallypoint.rpc.futures.collect_all`, which take
both kinds. :func:`uninstall` (called by ``rpc.shutdown``) puts torch's functions back.

One difference remains with a list holding rallypoint futures: ``wait_all`` waits for every
future before it raises the first error in list order, where torch's raises at the first error.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from rallypoint.rpc import futures

_LOCK = threading.Lock()
_SAVED: dict[str, Callable[..., Any]] = {}


def _all_torch_futures(items: list[Any]) -> bool:
    import torch

    return all(isinstance(item, torch._C.Future) for item in items)


def _wait_all(torch_wait_all: Callable[..., Any]) -> Callable[..., Any]:
    def wait_all(futs: Iterable[Any]) -> list[Any]:
        items = list(futs)
        if _all_torch_futures(items):
            return list(torch_wait_all(items))
        return futures.wait_all(items)

    wait_all.__doc__ = torch_wait_all.__doc__
    wait_all.__wrapped__ = torch_wait_all  # type: ignore[attr-defined]
    return wait_all


def _collect_all(torch_collect_all: Callable[..., Any]) -> Callable[..., Any]:
    def collect_all(futs: Iterable[Any]) -> Any:
        items = list(futs)
        if _all_torch_futures(items):
            return torch_collect_all(items)
        return futures.collect_all(items)

    collect_all.__doc__ = torch_collect_all.__doc__
    collect_all.__wrapped__ = torch_collect_all  # type: ignore[attr-defined]
    return collect_all


def install() -> None:
    """Let ``torch.futures.wait_all`` and ``collect_all`` take rallypoint's futures (idempotent)."""
    import torch.futures

    with _LOCK:
        if _SAVED:
            return
        _SAVED["wait_all"] = torch.futures.wait_all
        _SAVED["collect_all"] = torch.futures.collect_all
        torch.futures.wait_all = _wait_all(_SAVED["wait_all"])
        torch.futures.collect_all = _collect_all(_SAVED["collect_all"])


def uninstall() -> None:
    """Put torch's own ``wait_all`` and ``collect_all`` back (nothing happens if not installed)."""
    import torch.futures

    with _LOCK:
        if not _SAVED:
            return
        torch.futures.wait_all = _SAVED.pop("wait_all")
        torch.futures.collect_all = _SAVED.pop("collect_all")


def installed() -> bool:
    """Whether torch's two functions are replaced now."""
    return bool(_SAVED)
