"""One worker's RPC endpoint: sends calls, runs the calls it receives, owns and holds RRefs.

:class:`RpcAgent` is transport-agnostic: it turns calls into frames (:mod:`~rallypoint.rpc.wire`),
hands them to its :class:`~rallypoint.rpc.transport.RpcTransport`, and runs what arrives through
:meth:`RpcAgent.handle`. Several agents may live in one process (tests do this); the module-level
API (:mod:`rallypoint.rpc.api`) uses the process's agent, or the one running the current call
(:mod:`~rallypoint.rpc.current`, set while a call runs).

The agent sends; its other jobs have modules of their own, which it delegates to: running the
calls it receives (:mod:`~rallypoint.rpc.incoming`), giving back the credits of collected RRefs
(:mod:`~rallypoint.rpc.credits`) and counting the calls not yet answered
(:mod:`~rallypoint.rpc.in_flight`).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, cast

from rallypoint.rpc.credits import GIVE_BACK_GATHER, CreditReturn
from rallypoint.rpc.errors import RpcError, RpcRefused, RpcTimeout, SerializationError, WorkerUnavailable
from rallypoint.rpc.exposure import Exposure
from rallypoint.rpc.futures import Future
from rallypoint.rpc.in_flight import InFlight
from rallypoint.rpc.incoming import VERSION, IncomingCalls
from rallypoint.rpc.refs import OwnerTable
from rallypoint.rpc.remote_errors import rebuild_exception
from rallypoint.rpc.serialization import Decoder, Encoder, attach_reference, dumps_tree, loads_tree
from rallypoint.rpc.transport import Handler, RpcTransport, TransportError, TransportRefused, TransportTimeout
from rallypoint.rpc.wire import pack_parts, unpack

__all__ = ["GIVE_BACK_GATHER", "RpcAgent", "WorkerInfo"]


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
        self._credits = CreditReturn(info.name, self.owned, self._send_decref)
        self.held = self._credits.held
        self.decoder = Decoder(
            self.exposure,
            info.name,
            allow_pickle=allow_pickle,
            make_rref=self._received_rref,
            on_grad=self._received_grad,
        )
        self._ids = itertools.count()
        self._in_flight = InFlight()
        self._completer = ThreadPoolExecutor(4, thread_name_prefix=f"rpc-{info.name}-reply")
        self._closed = False
        self._incoming = IncomingCalls(self)
        #: The operations a request may name (:attr:`IncomingCalls.ops`).
        self._ops = self._incoming.ops

    # ----------------------------------------------------------------- group
    def serve(self, host: str) -> WorkerInfo:
        """Start the transport's server; returns this worker's info with its address."""
        deferred = getattr(self.transport, "deferred_replies", False)  # see transport.DeferredHandler
        incoming = self._incoming  # the transport calls it directly (no hop through the agent per request)
        handler = cast(Handler, incoming.handle_deferred) if deferred else incoming.handle
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
        header.update(v=VERSION, src=self.info.name, ser=self.serializer, timeout=limit)
        self.grant(enc.out.rrefs, to.name, limit)
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
        self._in_flight.track(fut)

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
        self._in_flight.count(1)
        try:
            data = blocking(to.address, frame, limit)
        except TransportError as exc:
            raise self._transport_error(to, what, limit, exc) from None
        finally:
            self._in_flight.count(-1)
        return self._decode_reply(to, data)

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

    def grant(self, rrefs: list[Any], receiver: str, limit: float | None) -> None:
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
        return self._in_flight.wait_idle(timeout)

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

        Only queues the id (see :meth:`CreditReturn.collected`): the agent's credit return
        gives the credits back from its own thread.
        """
        self._credits.collected(rref_id)

    def flush_collected(self, timeout: float | None = None) -> bool:
        """Wait until the credits of every RRef collected so far were given back (sent, not answered)."""
        return self._credits.flush(timeout)

    def _send_decref(self, owner: str, header: dict[str, Any], what: str) -> None:
        if self._closed or owner not in self.peers:
            return
        with contextlib.suppress(RpcError):  # shut down meanwhile: the owner frees everything at its shutdown
            self.send(self.peers[owner], header, {}, None, what)

    # -------------------------------------------------------------- serving
    def handle(self, frame: Any) -> list[Any]:
        """Run one request frame and return the reply frame's parts. Never raises.

        A call to an :func:`~rallypoint.rpc.functions.async_execution` function holds this
        thread until its future completes; :meth:`handle_deferred` does not. See
        :class:`~rallypoint.rpc.incoming.IncomingCalls`.
        """
        return self._incoming.handle(frame)

    def handle_deferred(self, frame: Any) -> list[Any] | Future[list[Any]]:
        """:meth:`handle`, except that an async_execution call answers with a :class:`Future` of the parts.

        The future completes (never with an error) once the function's own future does; the
        thread that ran the function is free meanwhile. Transports that can send a reply later
        (``deferred_replies = True``) are served through this method.
        """
        return self._incoming.handle_deferred(frame)

    # ------------------------------------------------------------- shutdown
    def close(self) -> None:
        """Stop serving and drop every RRef (after the group-wide drain, see :mod:`~rallypoint.rpc.api`)."""
        self._closed = True
        self._credits.close()
        self.owned.clear()
        self.transport.close()
        self._completer.shutdown(wait=False)
