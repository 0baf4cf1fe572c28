"""rallypoint.rpc over the grpc transport, three agents in one process: calls, futures, RRefs, errors."""

from __future__ import annotations

import gc
import threading
import time

import pytest
import torch

from rallypoint import rpc
from rallypoint.rpc.api import use_agent

from . import rpc_group as g


def test_rpc_sync_and_async_with_tensors_and_plain_data() -> None:
    with g.rpc_group(3) as agents, use_agent(agents[0]):
        out = rpc.rpc_sync("w1", g.add, args=(torch.ones(2, 3), torch.full((2, 3), 2.0)))
        assert torch.equal(out, torch.full((2, 3), 3.0))
        fut = rpc.rpc_async(2, g.add, args=((1, "a"), (2.5, None)))
        chained = fut.then(lambda f: (*f.wait(), "done"))
        assert chained.wait() == (1, "a", 2.5, None, "done")
        assert fut.done()
        assert rpc.rpc_sync(rpc.get_worker_info("w1"), g.identity, kwargs={"value": {1: [b"x", {2.0}]}}) == {
            1: [b"x", {2.0}]
        }
        t = torch.arange(12, dtype=torch.int64).reshape(3, 4).t()  # not contiguous
        assert torch.equal(rpc.rpc_sync("w2", g.identity, args=(t,)), t)
        assert rpc.get_worker_info().name == "w0"
        assert rpc.get_worker_info("w2") == rpc.WorkerInfo("w2", 2)


def test_remote_object_proxies_and_to_here() -> None:
    with g.rpc_group(3) as agents, use_agent(agents[0]):
        rref = rpc.remote("w1", g.Counter, args=(torch.zeros(2),))
        assert rref.owner() == rpc.WorkerInfo("w1", 1)
        assert rref.owner_name() == "w1"
        assert not rref.is_owner()
        assert torch.equal(rref.rpc_sync().add(torch.ones(2)), torch.ones(2))
        assert torch.equal(rref.rpc_async().add(torch.ones(2)).wait(), torch.full((2,), 2.0))
        value_ref = rref.remote().get()
        assert value_ref.owner_name() == "w1"
        assert torch.equal(value_ref.to_here(), torch.full((2,), 2.0))
        copy = rref.to_here()  # an instance of an exposed class travels as its state
        assert isinstance(copy, g.Counter)
        assert torch.equal(copy.value, torch.full((2,), 2.0))
        assert rref.confirmed_by_owner()
        with pytest.raises(rpc.RpcError, match="owner is w1"):
            rref.local_value()


def _wait_for(condition: object, what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        gc.collect()
        time.sleep(0.02)


def test_the_owner_keeps_the_value_while_any_worker_holds_a_reference() -> None:
    with g.rpc_group(3) as agents, use_agent(agents[0]):
        rref = rpc.remote("w1", g.Counter, args=(5,))
        assert rref.rpc_sync().get() == 5
        # w0 passes the RRef to w2, which passes it on to w1 (the owner): all see the same object
        assert rpc.rpc_sync("w2", g.owner_of, args=(rref,)) == "w1"
        assert rpc.rpc_sync("w2", g.forward, args=(rref, "w1")).value == 5
        kept = rpc.rpc_sync("w2", g.identity, args=(rref,))  # comes back through w2: a second local RRef
        assert len(agents[1].owned) == 1
        del rref
        gc.collect()
        agents[0].wait_idle(10)
        assert len(agents[1].owned) == 1, "a reference is still held (kept)"
        assert kept.rpc_sync().add(1) == 6
        del kept
        _wait_for(lambda: len(agents[1].owned) == 0, "the owner to drop the value")
        _wait_for(lambda: len(agents[2].held) == 0 and len(agents[0].held) == 0, "holders to forget it")


def test_an_rref_collected_while_its_thread_sends_gives_its_credit_back_without_deadlock() -> None:
    """The garbage collector runs finalizers wherever a thread happens to allocate, inside a send too.

    The credit of a collected RRef went back to its owner from the finalizer itself, in that
    thread: inside a send to the same peer it waited for the connection's lock, which that very
    thread held, for ever.
    """
    with g.rpc_group(2) as agents, use_agent(agents[0]):
        rref = rpc.remote("w1", g.Counter, args=(5,))
        assert rref.rpc_sync().get() == 5
        assert len(agents[1].owned) == 1
        conn = agents[0].transport._connections[agents[1].info.address]  # type: ignore[attr-defined]
        refs = [rref]
        del rref
        collected = threading.Event()

        def collect_inside_a_send() -> None:
            with conn._send_lock:  # as if the collector ran while this thread was sending to w1
                refs.clear()  # the last reference: the RRef's finalizer runs here
                gc.collect()
                collected.set()

        thread = threading.Thread(target=collect_inside_a_send, daemon=True)
        thread.start()
        thread.join(10)
        assert collected.is_set(), "the RRef's finalizer waited for the lock its own thread held"
        _wait_for(lambda: len(agents[1].owned) == 0, "the owner to drop the value")
        assert len(agents[0].held) == 0


def test_rrefs_dropped_together_give_their_credits_back_in_one_message() -> None:
    """Each collected RRef used to send a decref message of its own (and wait for its reply):
    a loop of ``remote(...).to_here()`` paid for a third message per iteration."""
    with g.rpc_group(2) as agents, use_agent(agents[0]):
        owner = agents[1]
        received: list[dict[str, object]] = []
        decref = owner._ops["decref"]  # type: ignore[attr-defined]

        def counting(tree: dict[str, object], bufs: list[object]) -> object:
            received.append(tree)
            return decref(tree, bufs)

        owner._ops["decref"] = counting  # type: ignore[attr-defined]
        refs = [rpc.remote("w1", g.Counter, args=(i,)) for i in range(20)]
        assert [r.to_here().value for r in refs] == list(range(20))
        assert len(owner.owned) == 20
        refs.clear()  # all collected at once
        assert agents[0].flush_collected(10)
        _wait_for(lambda: len(owner.owned) == 0, "the owner to drop the values")
        assert len(received) < 5, received  # one message for the batch (20 before)
        assert sum(len(tree["refs"]) for tree in received) == 20  # type: ignore[arg-type]


def test_a_malformed_batch_of_decrefs_changes_nothing() -> None:
    with g.rpc_group(2) as agents, use_agent(agents[0]):
        rref = rpc.remote("w1", g.Counter, args=(1,))
        assert rref.rpc_sync().get() == 1
        owner = agents[1]
        (kept,) = owner.owned.ids()
        for refs in ({kept: 1, "other": -1}, {kept: True}, [kept]):
            with pytest.raises(rpc.RpcError, match="malformed reference count"):
                owner._ops["decref"]({"op": "decref", "refs": refs}, [])  # the agent's incoming side (rpc.incoming)
        assert owner.owned.ids() == [kept]  # nothing given back: the value is still there
        assert rref.rpc_sync().get() == 1


def test_a_value_shared_with_rref_is_freed_after_the_last_user() -> None:
    with g.rpc_group(3) as agents, use_agent(agents[0]):
        shared = rpc.RRef(torch.arange(4.0))
        assert shared.is_owner()
        assert torch.equal(shared.local_value(), torch.arange(4.0))
        assert torch.equal(rpc.rpc_sync("w1", g.fetch, args=(shared,)), torch.arange(4.0))
        assert torch.equal(rpc.rpc_sync("w2", g.forward, args=(shared, "w1")), torch.arange(4.0))
        assert len(agents[0].owned) == 1
        del shared
        _wait_for(lambda: len(agents[0].owned) == 0, "w0 to drop its own shared value")


def test_remote_exceptions_keep_type_message_traceback_and_worker() -> None:
    with g.rpc_group(2) as agents, use_agent(agents[0]):
        with pytest.raises(KeyError) as info:
            rpc.rpc_sync("w1", g.fail, args=("no such key",))
        assert info.value.args == ("no such key",)
        assert info.value.remote_worker == "w1"  # type: ignore[attr-defined]
        assert "in fail" in info.value.remote_traceback  # type: ignore[attr-defined]
        assert any("raised on RPC worker w1" in note for note in info.value.__notes__)
        # a remote() whose function fails: the error surfaces on first use of the RRef
        rref = rpc.remote("w1", g.fail, args=("late",))
        with pytest.raises(KeyError, match="late"):
            rref.to_here()
        with pytest.raises(AttributeError, match="no method 'nope'"):
            rpc.remote("w1", g.Counter, args=(1,)).rpc_sync().nope()


def test_exception_types_of_the_callers_modules_are_rebuilt() -> None:
    with g.rpc_group(2) as agents, use_agent(agents[0]):
        with pytest.raises(g.NotImportedThereError, match="cannot rebuild") as info:
            rpc.rpc_sync("w1", g.fail_custom)
        assert info.value.remote_worker == "w1"  # type: ignore[attr-defined]
        with pytest.raises(rpc.RpcRefused, match="not exposed"):
            rpc.rpc_sync("w1", g.NotImportedThereError, args=("x",))


def test_timeouts_name_the_callee_and_the_function() -> None:
    with g.rpc_group(2) as agents, use_agent(agents[0]):
        with pytest.raises(rpc.RpcTimeout) as info:
            rpc.rpc_sync("w1", g.wait_release, args=(30,), timeout=0.3)
        assert info.value.worker == "w1"
        assert info.value.function.endswith("rpc_group:wait_release")
        assert "w1" in str(info.value)
        assert "wait_release" in str(info.value)
        agents[0].timeout = 0.3  # the default applies when no timeout is given
        with pytest.raises(rpc.RpcTimeout):
            rpc.rpc_async("w1", g.wait_release, args=(30,)).wait()
        g.RELEASE.set()
        assert rpc.rpc_sync("w1", g.wait_release, args=(30,), timeout=0) == "released"  # 0: no timeout


def test_calls_to_a_worker_that_is_gone_name_it() -> None:
    with g.rpc_group(3) as agents, use_agent(agents[0]):
        rref = rpc.remote("w2", g.Counter, args=(1,))
        assert rref.rpc_sync().get() == 1
        pending = rpc.rpc_async("w2", g.wait_release, args=(60,))
        agents[2].transport.close()  # the owner goes away with a call pending
        with pytest.raises(rpc.WorkerUnavailable) as info:
            rref.to_here(timeout=5)
        assert "w2" in str(info.value)
        with pytest.raises((rpc.WorkerUnavailable, rpc.RpcTimeout)) as pending_info:
            pending.wait(30)
        assert "w2" in str(pending_info.value)


def test_wait_idle_waits_for_outstanding_calls() -> None:
    with g.rpc_group(2) as agents, use_agent(agents[0]):
        fut = rpc.rpc_async("w1", g.wait_release, args=(30,))
        assert not agents[0].wait_idle(0.2)
        g.RELEASE.set()
        assert agents[0].wait_idle(10)
        assert fut.wait() == "released"


def test_then_callbacks_run_off_the_transport_threads_and_may_block() -> None:
    import threading

    with g.rpc_group(2) as agents, use_agent(agents[0]):
        seen: list[str] = []

        def callback(fut: rpc.Future[int]) -> int:
            seen.append(threading.current_thread().name)
            with use_agent(agents[0]):  # a blocking call from inside a callback
                return rpc.rpc_sync("w1", g.add, args=(fut.wait(), 10))

        assert rpc.rpc_async("w1", g.add, args=(1, 2)).then(callback).wait(30) == 13
        assert seen[0].startswith("rpc-w0-reply")
