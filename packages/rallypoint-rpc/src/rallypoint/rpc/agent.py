"""One worker's RPC endpoint: sends calls, runs the calls it receives, owns and holds RRefs.

:class:`RpcAgent` is transport-agnostic: it turns calls into frames (:mod:`~rallypoint.rpc.wire`),
hands them to its :class:`~rallypoint.rpc.transport.RpcTransport`, and runs what arrives through
:meth:`RpcAgent.handle`. Several agents may live in one process (tests do this); the module-level
API (:mod:`rallypoint.rpc.api`) uses the process's agent, or the one running the current call
(:mod:`~rallypoint.rpc.current`, set here while a call runs).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, cast

from rallypoint.rpc.current import CURRENT_AGENT
from rallypoint.rpc.errors import RpcError, RpcRefused, RpcTimeout, SerializationError, WorkerUnavailable
from rallypoint.rpc.exposure import Exposure
from rallypoint.rpc.functions import Pending, pending
from rallypoint.rpc.futures import Future
from rallypoint.rpc.refs import HolderTable, OwnerTable
from rallypoint.rpc.remote_errors import describe_exception, rebuild_exception
from rallypoint.rpc.serialization import Decoder, Encoder, attach_reference, dumps_tree, loads_tree
from rallypoint.rpc.transport import Handler, RpcTransport, TransportError, TransportRefused, TransportTimeout
from rallypoint.rpc.wire import pack_parts, unpack

__all__ = ["RpcAgent", "WorkerInfo"]

_VERSION = 1
#: Seconds the agent's thread gathers collected RRefs before it gives their credits back (one
#: message per owner for all of them).
GIVE_BACK_GATHER = 0.005
_MAX_DECREFS = 1 << 20  # RRefs given back in one message, at most
log = logging.getLogger("rallypoint.rpc")


@dataclass(frozen=True)
class WorkerInfo:
    """A worker of the RPC group: its unique ``name`` and its ``id`` (its rank)."""

    name: str
    id: int
    address: str = field(default="", compare=False, repr=False)


class RpcAgent:
    """The RPC state of one worker.

    Args:
        info: this worker's name and rank.
        transport: the transport, not yet serving.
        exposure: what peers may call here.
        allow_pickle: ``serializer = "pickle"`` (both ways).
        timeout: the default timeout of a call in seconds (0: none).
    """

    def __init__(
        self,
        info: WorkerInfo,
        transport: RpcTransport,
        *,
        exposure: Exposure | None = None,
        allow_pickle: bool = False,
        timeout: float = 60.0,
    ) -> None:
        self.info = info
        self.transport = transport
        self.exposure = exposure or Exposure(everything=allow_pickle)
        self.allow_pickle = allow_pickle
        self.serializer = "pickle" if allow_pickle else "safe"
        self.timeout = timeout
        self.peers: dict[str, WorkerInfo] = {}
        self.owned = OwnerTable()
        self.held = HolderTable(self._give_back)
        self.decoder = Decoder(
            self.exposure,
            info.name,
            allow_pickle=allow_pickle,
            make_rref=self._received_rref,
            on_grad=self._received_grad,
        )
        self._ids = itertools.count()
        self._outstanding = 0
        self._pending_lock = threading.Condition()
        self._completer = ThreadPoolExecutor(4, thread_name_prefix=f"rpc-{info.name}-reply")
        self._closed = False
        #: RRef ids whose local objects were collected, for the thread that gives their credits back.
        self._collected: queue.SimpleQueue[str | threading.Event | None] = queue.SimpleQueue()
        self._gathering = threading.local()  # .refs: the credits the collected thread is gathering
        threading.Thread(target=self._give_back_collected, name=f"rpc-{info.name}-collected", daemon=True).start()
        self._ops: dict[str, Callable[[dict[str, Any], list[Any]], Any]] = {
            "call": self._op_call,
            "remote": self._op_remote,
            "method": self._op_method,
            "fetch": self._op_fetch,
            "incref": self._op_incref,
            "decref": self._op_decref,
            "ping": lambda tree, bufs: None,
            "ad_grad": self._op_autograd,
            "ad_release": self._op_autograd,
        }

    # ----------------------------------------------------------------- group
    def serve(self, host: str) -> WorkerInfo:
        """Start the transport's server; returns this worker's info with its address."""
        deferred = getattr(self.transport, "deferred_replies", False)  # see transport.DeferredHandler
        handler = cast(Handler, self.handle_deferred) if deferred else self.handle
        address = self.transport.serve(handler, host)
        self.info = WorkerInfo(self.info.name, self.info.id, address)
        return self.info

    def set_peers(self, peers: Iterable[WorkerInfo]) -> None:
        """The group's workers (this one included)."""
        self.peers = {p.name: p for p in peers}

    def worker(self, to: str | int | WorkerInfo) -> WorkerInfo:
        """The peer named by a name, a rank or a :class:`WorkerInfo`."""
        if isinstance(to, WorkerInfo):
            to = to.name
        if isinstance(to, int) and not isinstance(to, bool):
            for peer in self.peers.values():
                if peer.id == to:
                    return peer
        elif isinstance(to, str) and to in self.peers:
            return self.peers[to]
        names = ", ".join(sorted(self.peers)) or "none"
        raise ValueError(f"unknown RPC worker {to!r}; the workers are: {names}")

    def effective_timeout(self, timeout: float | None) -> float | None:
        """``None`` or negative (torch's ``-1``): the default; ``0``: no timeout (``None`` returned)."""
        value = self.timeout if timeout is None or timeout < 0 else timeout
        return None if value <= 0 else value

    # --------------------------------------------------------------- sending
    def _prepare(
        self,
        to: WorkerInfo,
        header: dict[str, Any],
        values: dict[str, Any],
        timeout: float | None,
        what: str,
        broadcasts: bool = False,
    ) -> tuple[list[Any], float | None]:
        if self._closed:
            raise RpcError(f"RPC on {self.info.name} is shut down; cannot call {what} on {to.name}")
        enc = Encoder(allow_pickle=self.allow_pickle, broadcasts=broadcasts, exposure=self.exposure)
        for key, value in values.items():
            header[key] = enc.add(value)
        limit = self.effective_timeout(timeout)
        header.update(v=_VERSION, src=self.info.name, ser=self.serializer, timeout=limit)
        self._grant(enc.out.rrefs, to.name, limit)
        return pack_parts(dumps_tree(header), enc.out.buffers), limit

    def send(
        self,
        to: WorkerInfo,
        header: dict[str, Any],
        values: dict[str, Any],
        timeout: float | None,
        what: str,
        *,
        broadcasts: bool = False,
    ) -> Future[Any]:
        """Send one request; the future completes with the decoded reply (or the remote error).

        ``broadcasts``: tensors among ``values`` that are broadcast views travel as such (see
        :class:`~rallypoint.rpc.serialization.Encoder`).
        """
        frame, limit = self._prepare(to, header, values, timeout, what, broadcasts)
        fut: Future[Any] = Future(self._completer)
        self._track(fut)

        def reply(data: Any, error: BaseException | None) -> None:
            # decoded in the transport's thread (no user code runs here: the future's callbacks go
            # to the completer threads)
            self._complete(fut, to, what, limit, data, error)

        self.transport.call(to.address, frame, limit, reply)
        return fut

    def call(
        self,
        to: WorkerInfo,
        header: dict[str, Any],
        values: dict[str, Any],
        timeout: float | None,
        what: str,
        *,
        broadcasts: bool = False,
    ) -> Any:
        """Send one request and wait for its reply in this thread (``rpc_sync``); returns the result.

        Uses the transport's ``call_blocking`` when it has one (no thread hand-over), else
        :meth:`send` and a wait. ``broadcasts`` as in :meth:`send`.
        """
        blocking = getattr(self.transport, "call_blocking", None)
        if blocking is None:
            return self.send(to, header, values, timeout, what, broadcasts=broadcasts).wait()
        frame, limit = self._prepare(to, header, values, timeout, what, broadcasts)
        self._count(1)
        try:
            data = blocking(to.address, frame, limit)
        except TransportError as exc:
            raise self._transport_error(to, what, limit, exc) from None
        finally:
            self._count(-1)
        return self._decode_reply(to, data)

    def _count(self, delta: int) -> None:
        with self._pending_lock:
            self._outstanding += delta
            if not self._outstanding:
                self._pending_lock.notify_all()

    def _track(self, fut: Future[Any]) -> None:
        self._count(1)
        fut._add_callback(lambda _: self._count(-1))

    def _decode_reply(self, to: WorkerInfo, data: Any) -> Any:
        header, bufs = unpack(data or b"")
        tree = loads_tree(header)
        if not isinstance(tree, dict):
            raise SerializationError(f"malformed reply from {to.name}")
        if "err" in tree:
            raise rebuild_exception(tree["err"], self.decoder)
        return self.decoder.decode(tree.get("ok"), bufs)

    def _complete(
        self,
        fut: Future[Any],
        to: WorkerInfo,
        what: str,
        limit: float | None,
        data: Any,
        error: BaseException | None,
    ) -> None:
        if error is not None:
            fut.set_exception(self._transport_error(to, what, limit, error))
            return
        try:
            fut.set_result(self._decode_reply(to, data))
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the future
            fut.set_exception(exc)

    def _transport_error(self, to: WorkerInfo, what: str, limit: float | None, error: BaseException) -> BaseException:
        if isinstance(error, TransportTimeout):
            return RpcTimeout(to.name, what, limit or 0.0)
        if isinstance(error, TransportRefused):
            return RpcRefused(f"{to.name} refused {what}: {error}")
        return WorkerUnavailable(f"{to.name} (rank {to.id}, {to.address})", f"{what} failed: {error}")

    def _grant(self, rrefs: list[Any], receiver: str, limit: float | None) -> None:
        """Count a reference for ``receiver`` at each RRef's owner before the message leaves."""
        for rref in rrefs:
            owner = rref.owner_name()
            if owner == self.info.name:
                self.owned.incref(rref.rref_id)
            else:
                header = {"op": "incref", "rref": rref.rref_id, "n": 1, "holder": receiver}
                self.call(self.worker(owner), header, {}, limit, f"RRef {rref.rref_id} (incref)")

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no call sent from here is outstanding; ``False`` if ``timeout`` passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._pending_lock:
            while self._outstanding:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._pending_lock.wait(left)
        return True

    def dead(self, rank: int) -> str | None:
        """``None`` while the worker of ``rank`` answers (busy counts as alive), else who it was."""
        peer = self.worker(rank)
        try:
            self.call(peer, {"op": "ping"}, {}, 5.0, "ping")
        except WorkerUnavailable:
            return f"{peer.name} (rank {rank}, {peer.address})"
        except RpcError:
            return None
        return None

    # -------------------------------------------------------------- RRefs
    def new_rref_id(self) -> str:
        """A fresh id, unique in the group: ``<rank>.<counter>``."""
        return f"{self.info.id}.{next(self._ids)}"

    def _received_rref(self, rref_id: str, owner: str) -> Any:
        """A local RRef object for a received ``rref_id`` owned by ``owner``, carrying one credit."""
        if owner not in self.peers:
            raise SerializationError(f"{self.info.name} received an RRef owned by unknown worker {owner!r}")
        return attach_reference(self, rref_id, self.peers[owner])

    def _received_grad(self, value: Any, tag: Any) -> Any:
        from rallypoint.rpc.autograd import received

        return received(self, value, tag)

    def collected(self, rref_id: str) -> None:
        """A local RRef object of ``rref_id`` was collected (its finalizer; safe wherever it runs).

        The garbage collector runs finalizers in whatever thread allocates, at any point, also
        while that thread holds a lock of the transport (in the middle of a send). So nothing
        happens here but a put on a queue (:class:`queue.SimpleQueue` is safe to reenter); the
        agent's own thread gives the credits back.
        """
        self._collected.put(rref_id)

    def flush_collected(self, timeout: float | None = None) -> bool:
        """Wait until the credits of every RRef collected so far were given back (sent, not answered)."""
        done = threading.Event()
        self._collected.put(done)
        return done.wait(timeout)

    def _give_back_collected(self) -> None:
        """The agent's thread that gives back the credits of collected RRefs.

        It gathers what is collected within :data:`GIVE_BACK_GATHER` seconds of the first and
        gives the credits back with one message per owner: a loop that makes and drops RRefs
        (``remote(...).to_here()``) sends one message for several of them, not one each.
        """
        while True:
            batch = [self._collected.get()]
            deadline = time.monotonic() + GIVE_BACK_GATHER
            while isinstance(batch[-1], str) and (left := deadline - time.monotonic()) > 0:
                try:
                    batch.append(self._collected.get(timeout=left))
                except queue.Empty:
                    break
            gathered: dict[str, dict[str, int]] = {}
            self._gathering.refs = gathered
            try:
                for item in batch:
                    if isinstance(item, str):
                        try:
                            self.held.release(item)
                        except Exception as exc:  # noqa: BLE001 - this thread must go on; the owner frees it at shutdown
                            log.debug("%s: giving back the credits of RRef %s failed: %s", self.info.name, item, exc)
            finally:
                self._gathering.refs = None
            for owner, refs in gathered.items():
                self._send_decref(owner, {"op": "decref", "refs": refs}, f"{len(refs)} RRef(s) (decref)")
            for item in batch:
                if isinstance(item, threading.Event):
                    item.set()
            if None in batch:
                return

    def _give_back(self, owner: str, rref_id: str, credits: int) -> None:
        if owner == self.info.name:
            self.owned.decref(rref_id, credits)
            return
        gathered: dict[str, dict[str, int]] | None = getattr(self._gathering, "refs", None)
        if gathered is not None:  # the collected thread: sent with the others of its batch
            refs = gathered.setdefault(owner, {})
            refs[rref_id] = refs.get(rref_id, 0) + credits
            return
        self._send_decref(owner, {"op": "decref", "rref": rref_id, "n": credits}, f"RRef {rref_id} (decref)")

    def _send_decref(self, owner: str, header: dict[str, Any], what: str) -> None:
        if self._closed or owner not in self.peers:
            return
        with contextlib.suppress(RpcError):  # shut down meanwhile: the owner frees everything at its shutdown
            self.send(self.peers[owner], header, {}, None, what)

    # -------------------------------------------------------------- serving
    def handle(self, frame: Any) -> list[Any]:
        """Run one request frame and return the reply frame's parts. Never raises.

        A call to an :func:`~rallypoint.rpc.functions.async_execution` function holds this
        thread until its future completes; :meth:`handle_deferred` does not.
        """
        answer = self.handle_deferred(frame)
        if not isinstance(answer, Future):
            return answer
        try:
            parts: list[Any] = answer.wait(self.timeout or None)
        except TimeoutError:
            return self._error_parts(RpcTimeout(self.info.name, "an async_execution reply", self.timeout))
        return parts

    def handle_deferred(self, frame: Any) -> list[Any] | Future[list[Any]]:
        """:meth:`handle`, except that an async_execution call answers with a :class:`Future` of the parts.

        The future completes (never with an error) once the function's own future does; the
        thread that ran the function is free meanwhile. Transports that can send a reply later
        (``deferred_replies = True``) are served through this method.
        """
        token = CURRENT_AGENT.set(self)
        src = "?"
        try:
            header, bufs = unpack(frame)
            tree = loads_tree(header)
            if not isinstance(tree, dict) or tree.get("v") != _VERSION:
                raise SerializationError(f"{self.info.name} received a message of an unknown version")
            src = str(tree.get("src", "?"))
            if tree.get("ser") != self.serializer and not self.allow_pickle:
                raise RpcRefused(
                    f"{self.info.name} refused a call from {src} made with the {tree.get('ser')!r} serializer: "
                    'this worker uses the safe one (set serializer = "pickle" on every worker to opt in)'
                )
            op = self._ops.get(str(tree.get("op")))
            if op is None:
                raise RpcRefused(f"{self.info.name} refused an unknown operation {tree.get('op')!r} from {src}")
            if "ad" in tree:  # sent inside a distributed autograd context: run and reply in it
                from rallypoint.rpc.autograd import serving

                with serving(self, tree["ad"], src):
                    return self._answer(src, op(tree, bufs))
            return self._answer(src, op(tree, bufs), broadcasts=tree.get("op") == "ad_grad")
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the caller
            return self._error_parts(exc)
        finally:
            CURRENT_AGENT.reset(token)

    def _error_parts(self, exc: BaseException) -> list[Any]:
        return pack_parts(dumps_tree({"err": describe_exception(exc, self.info.name)}))

    def _answer(self, src: str, result: Any, *, broadcasts: bool = False) -> list[Any] | Future[list[Any]]:
        if not isinstance(result, Pending):
            return self._reply(src, result, broadcasts=broadcasts)
        return result.reply(lambda value: self._reply(src, value), self._error_parts)

    def _reply(self, src: str, result: Any, *, broadcasts: bool = False) -> list[Any]:
        enc = Encoder(allow_pickle=self.allow_pickle, broadcasts=broadcasts, exposure=self.exposure)
        tree = {"ok": enc.add(result)}
        if enc.out.rrefs:
            self._grant(enc.out.rrefs, src, self.timeout or None)
        return pack_parts(dumps_tree(tree), enc.out.buffers)

    def _args(self, tree: dict[str, Any], bufs: list[Any]) -> tuple[list[Any], dict[str, Any]]:
        args = self.decoder.decode(tree.get("args", []), bufs)
        kwargs = self.decoder.decode(tree.get("kwargs", {"$": "dict", "items": []}), bufs)
        if (
            not isinstance(args, list | tuple)
            or not isinstance(kwargs, dict)
            or not all(isinstance(k, str) for k in kwargs)
        ):
            raise SerializationError(f"malformed arguments received by {self.info.name}")
        return list(args), kwargs

    def _op_call(self, tree: dict[str, Any], bufs: list[Any]) -> Any:
        fn = self.exposure.resolve(str(tree.get("fn")), worker=self.info.name)
        args, kwargs = self._args(tree, bufs)
        return pending(fn, fn(*args, **kwargs))

    def _op_remote(self, tree: dict[str, Any], bufs: list[Any]) -> Pending | None:
        new_id = str(tree.get("new"))
        self.owned.incref(new_id)  # the creator's reference
        try:
            value = self._op_method(tree, bufs) if "rref" in tree else self._op_call(tree, bufs)
        except BaseException as exc:
            self.owned.set(new_id, error=exc)
            raise
        if isinstance(value, Pending):  # the value is the future's, once it completes
            return value.store(self.owned, new_id)
        self.owned.set(new_id, value)
        return None

    def _owned_value(self, tree: dict[str, Any]) -> Any:
        rref_id = str(tree.get("rref"))
        timeout = tree.get("timeout")
        limit = timeout if isinstance(timeout, int | float) and not isinstance(timeout, bool) else None
        entry = self.owned.get(rref_id, limit, expected=tree.get("pending") is True)
        if entry is None:
            raise RpcError(f"RRef {rref_id} is unknown to its owner {self.info.name} (deleted, or never created)")
        if entry.error is not None:
            raise entry.error
        return entry.value

    def _op_method(self, tree: dict[str, Any], bufs: list[Any]) -> Any:
        name = str(tree.get("method"))
        if not name.isidentifier() or name.startswith("_"):
            raise RpcRefused(f"{self.info.name} refused a call to method {name!r}: private or not a name")
        obj = self._owned_value(tree)
        self.exposure.check_class(type(obj), worker=self.info.name)
        method = getattr(obj, name, None)
        if not callable(method):
            raise AttributeError(f"{type(obj).__qualname__} has no method {name!r} (on {self.info.name})")
        args, kwargs = self._args(tree, bufs)
        return pending(method, method(*args, **kwargs))

    def _op_fetch(self, tree: dict[str, Any], bufs: list[Any]) -> Any:
        return self._owned_value(tree)

    def _op_autograd(self, tree: dict[str, Any], bufs: list[Any]) -> Any:
        from rallypoint.rpc import autograd

        grad = self.decoder.decode(tree["grad"], bufs) if "grad" in tree else None
        return autograd.handle(self, tree, grad)  # gradients for the sender travel in the reply

    def _op_incref(self, tree: dict[str, Any], bufs: list[Any]) -> None:
        self.owned.incref(str(tree.get("rref")), _count(tree))

    def _op_decref(self, tree: dict[str, Any], bufs: list[Any]) -> None:
        refs = tree.get("refs")
        if refs is None:
            self.owned.decref(str(tree.get("rref")), _count(tree))
            return
        if not isinstance(refs, dict) or len(refs) > _MAX_DECREFS:
            raise SerializationError("malformed reference counts")
        counted = [(str(rref_id), _count({"n": n})) for rref_id, n in refs.items()]  # all checked first
        for rref_id, n in counted:
            self.owned.decref(rref_id, n)

    # ------------------------------------------------------------- shutdown
    def close(self) -> None:
        """Stop serving and drop every RRef (after the group-wide drain, see :mod:`~rallypoint.rpc.api`)."""
        self._closed = True
        self._collected.put(None)
        self.held.clear()
        self.owned.clear()
        self.transport.close()
        self._completer.shutdown(wait=False)


def _count(tree: dict[str, Any]) -> int:
    n = tree.get("n")
    if not isinstance(n, int) or isinstance(n, bool) or not 0 < n < 1 << 40:
        raise SerializationError("malformed reference count")
    return n
