"""torch.futures.wait_all / collect_all take rallypoint's futures while torch's mode installs them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from rallypoint import rpc
from rallypoint.rpc import torch_futures

TORCH_WAIT_ALL = torch.futures.wait_all
TORCH_COLLECT_ALL = torch.futures.collect_all


@pytest.fixture
def installed() -> Iterator[None]:
    torch_futures.install()
    try:
        yield
    finally:
        torch_futures.uninstall()


def _done(value: Any) -> rpc.Future[Any]:
    fut: rpc.Future[Any] = rpc.Future()
    fut.set_result(value)
    return fut


def _torch_done(value: Any) -> torch.futures.Future[Any]:
    fut: torch.futures.Future[Any] = torch.futures.Future()
    fut.set_result(value)
    return fut


def test_torch_refuses_rallypoint_futures_without_it() -> None:
    assert not torch_futures.installed()
    with pytest.raises(TypeError):
        torch.futures.wait_all([_done(1)])


@pytest.mark.usefixtures("installed")
def test_wait_all_takes_rallypoint_futures_and_mixed_lists() -> None:
    assert torch.futures.wait_all([_done(1), _done(2)]) == [1, 2]
    assert torch.futures.wait_all([_torch_done(3), _done(4)]) == [3, 4]
    failed: rpc.Future[int] = rpc.Future()
    failed.set_exception(KeyError("lost"))
    with pytest.raises(KeyError, match="lost"):
        torch.futures.wait_all([_done(1), failed])


@pytest.mark.usefixtures("installed")
def test_lists_of_torch_futures_still_go_to_torch() -> None:
    assert torch.futures.wait_all([_torch_done(5), _torch_done(6)]) == [5, 6]
    together = torch.futures.collect_all([_torch_done(7)])
    assert isinstance(together, torch._C.Future)  # torch's own function made it
    assert not isinstance(together, rpc.Future)
    assert together.wait()[0].wait() == 7
    ours = torch.futures.collect_all([_torch_done(8), _done(9)])
    assert isinstance(ours, rpc.Future)
    assert [f.wait() for f in ours.wait()] == [8, 9]


def test_install_is_idempotent_and_uninstall_puts_torch_back() -> None:
    torch_futures.install()
    torch_futures.install()
    try:
        assert torch.futures.wait_all is not TORCH_WAIT_ALL
        assert torch.futures.wait_all.__wrapped__ is TORCH_WAIT_ALL  # type: ignore[attr-defined]
    finally:
        torch_futures.uninstall()
    torch_futures.uninstall()
    assert torch.futures.wait_all is TORCH_WAIT_ALL
    assert torch.futures.collect_all is TORCH_COLLECT_ALL
    assert not torch_futures.installed()
