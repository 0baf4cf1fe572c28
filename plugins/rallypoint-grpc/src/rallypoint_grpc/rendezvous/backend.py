"""The ``grpc`` rendezvous backend: a client of the rendezvous server (and, agent-hosted, its host).

:class:`GrpcBackend` implements :class:`~rallypoint.rendezvous.backend.RendezvousBackend` over one
channel per process (:func:`rallypoint_grpc.transport.get_channel`), and one long-lived session
stream per backend (:mod:`rallypoint_grpc.rendezvous.session`): every operation, watches included,
is a tagged message on it, and a watch's event is pushed on it when it fires; nothing polls. A
server without sessions (an older version) is called with one unary call per operation instead.
Every operation has a deadline (``call_timeout``); a server that cannot be reached, or a stream that
breaks, is retried with exponential backoff for ``retry_timeout`` (on a new stream; writes carry a
request id, so a retried write is applied once), then the operation raises
:class:`~rallypoint.rendezvous.errors.RendezvousBackendError` naming the endpoint.

Agent-hosted mode (:func:`create_grpc_backend` with ``serve = "auto"``): when the endpoint's
address belongs to this host and its port is free, this process starts the server on that
address (that interface only) before connecting to it; the other agents connect.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import grpc

from rallypoint.rendezvous.backend import (
    CheckIn,
    Entry,
    JSONValue,
    Version,
    WatchedChange,
    check_in_in_steps,
    check_key,
    create_and_add_in_two_steps,
)
from rallypoint.rendezvous.errors import RendezvousBackendError
from rallypoint_grpc._proto import rendezvous_pb2 as pb
from rallypoint_grpc._proto import rendezvous_pb2_grpc as pb_grpc
from rallypoint_grpc.rendezvous.hosting import _HOSTED, host_server  # noqa: F401 - importable from here, as before the split
from rallypoint_grpc.rendezvous.options import GrpcOptions
from rallypoint_grpc.rendezvous.session import OperationRefused, Session, SessionClosed, session_call
from rallypoint_grpc.rendezvous.tls_check import tls_failure
from rallypoint_grpc.transport import (
    DEFAULT_MAX_MESSAGE_BYTES,
    Backoff,
    TlsFiles,
    get_channel,
    read_token,
    token_metadata,
)

__all__ = ["GrpcBackend", "create_grpc_backend", "host_server"]

log = logging.getLogger(__name__)

#: Failures retried with backoff for ``retry_timeout``: the server is unreachable, or the
#: connection was torn down under the call (a starved server missing keepalive pings; this client
#: never cancels its own calls). Writes carry a request id, so a retried write is applied once.
_RETRIED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
#: The session message's field of each operation (named as its unary method).
_FIELDS = {
    "Get": "get",
    "Set": "set",
    "CompareAndSet": "compare_and_set",
    "Add": "add",
    "CreateAndAdd": "create_and_add",
    "CheckIn": "check_in",
    "SetMany": "set_many",
    "Delete": "delete",
    "List": "list",
    "Watch": "watch",
}


def _dump(value: JSONValue) -> str:
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"rendezvous values must be JSON values, got {type(value).__name__}: {exc}") from exc


def _entry(reply: Any, field: str = "entry") -> Entry | None:
    if not reply.HasField(field):
        return None
    found = getattr(reply, field)
    return Entry(json.loads(found.value), found.version)


def _entries(found: Any) -> dict[str, Entry]:
    return {k: Entry(json.loads(e.value), e.version) for k, e in found.items()}


class GrpcBackend:
    """A client of the rendezvous server at ``endpoint``, scoped to ``run_id``.

    Args:
        endpoint: ``HOST:PORT`` of the server.
        run_id: the run id (one key segment).
        token: the shared token, when the server requires one.
        tls: TLS files (``None``: plain TCP).
        call_timeout: deadline of each call, in seconds.
        retry_timeout: how long an unreachable server is retried before raising.
        max_message_bytes: largest request or reply.
    """

    supports_ttl = True
    #: ``HOST:PORT`` of the agent that serves this rendezvous when its state lives and dies with
    #: that agent (agent-hosted, no ``data_dir``, another agent); ``None``: it outlives any one node.
    hosted_by: str | None = None
    #: Whether this process serves the run's state and keeps it nowhere else (agent-hosted, no
    #: ``data_dir``): it ends with this process.
    local_state: bool = False

    def __init__(
        self,
        endpoint: str,
        run_id: str,
        *,
        token: str | None = None,
        tls: TlsFiles | None = None,
        call_timeout: float = 10.0,
        retry_timeout: float = 5.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        check_key(run_id)
        if "/" in run_id:
            raise ValueError(f"invalid run_id {run_id!r} for the grpc rendezvous backend: no '/' allowed")
        self.endpoint = endpoint
        self.run_id = run_id
        self.call_timeout = call_timeout
        self.retry_timeout = retry_timeout
        self._metadata = token_metadata(token)
        self._tls = tls
        self._max = max_message_bytes
        self._two_step_joins = False  # the server lacks CreateAndAdd
        self._step_check_ins = False  # the server lacks CheckIn
        self._set_many = True  # False: the server lacks SetMany
        self._stubs: tuple[Any, Any] | None = None  # (channel, its stub)
        self._sessions = True  # False: the server lacks Session (one unary call per operation)
        self._session: Session | None = None
        self._session_lock = threading.Lock()
        get_channel(endpoint, tls, max_message_bytes=max_message_bytes)  # starts connecting

    @property
    def _stub(self) -> Any:
        # The channel is looked up on each call (the channel cache is per process, so a forked
        # child gets its own); the stub is made again only for another channel (making one
        # builds a callable per method of the service).
        channel = get_channel(self.endpoint, self._tls, max_message_bytes=self._max)
        made = self._stubs
        if made is None or made[0] is not channel:
            made = self._stubs = (channel, pb_grpc.RendezvousStub(channel))  # type: ignore[no-untyped-call]
        return made[1]

    # -- calls ----------------------------------------------------------------------------
    def _error(self, op: str, exc: grpc.RpcError) -> Exception:
        code, details = exc.code(), exc.details()
        where = f"rendezvous server {self.endpoint} (run {self.run_id!r}, {op})"
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            return ValueError(f"{where} refused the request: {details}")
        if code == grpc.StatusCode.FAILED_PRECONDITION:
            return TypeError(f"{where}: {details}")
        if code == grpc.StatusCode.UNAUTHENTICATED:
            return RendezvousBackendError(
                f"{where} refused the call: {details}. Give every node the server's token "
                f"([rendezvous.options] token_file or token_env)"
            )
        if code in _RETRIED:
            why = tls_failure(self.endpoint, self._tls, details or "")
            if why is not None:  # gRPC says "unreachable ... Socket closed": say what TLS refused
                return RendezvousBackendError(f"{where}: TLS failed: {why}")
            return RendezvousBackendError(
                f"{where} unreachable for {self.retry_timeout:g} s ({details}); is the server (or the agent that "
                f"hosts it) running, and is the address reachable from this host?"
            )
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return RendezvousBackendError(f"{where} did not answer within {self.call_timeout:g} s (call_timeout)")
        return RendezvousBackendError(f"{where} failed: {code.name}: {details}")

    def _open_session(self) -> Session:
        """The session of this backend: the open one, or a new one (the first, after a broken stream, after a fork)."""
        with self._session_lock:
            session = self._session
            if session is None or session.ended or session.pid != os.getpid():
                target, tls, limit, metadata = self.endpoint, self._tls, self._max, self._metadata
                session = self._session = Session(lambda: session_call(target, tls, limit, metadata))
            return session

    def _send(self, op: str, request: Any, timeout: float) -> Any:
        """One operation, once: on the session, or as a unary call to a server without sessions.

        A watch (``op`` ``"Watch"``) returns its one event (``changed`` false at its timeout).
        """
        if self._sessions:
            try:
                return self._open_session().call(_FIELDS[op], request, timeout)
            except SessionClosed as exc:
                where = f"rendezvous server {self.endpoint} (run {self.run_id!r}, {op})"
                raise RendezvousBackendError(f"{where}: {exc}") from None
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                if not isinstance(exc, OperationRefused):  # the stream itself: a server of a version without it
                    log.debug("rendezvous server %s has no sessions: one call per operation", self.endpoint)
                    self._sessions = False
        if op == "Watch":
            for event in self._stub.Watch(request, timeout=timeout, metadata=self._metadata):
                return event
            return pb.WatchEvent(changed=False)
        return getattr(self._stub, op)(request, timeout=timeout, metadata=self._metadata)

    def _invoke(self, op: str, request: Any) -> Any:
        """Send ``op`` with a deadline; retry while the server is unavailable; raise gRPC's error."""
        backoff: Backoff | None = None
        while True:
            try:
                return self._send(op, request, self.call_timeout)
            except grpc.RpcError as exc:
                if exc.code() in _RETRIED:
                    backoff = backoff or Backoff(self.retry_timeout)
                    if backoff.wait():
                        continue
                raise

    def _call(self, op: str, request: Any) -> Any:
        """:meth:`_invoke`, with gRPC's errors turned into the protocol's."""
        try:
            return self._invoke(op, request)
        except grpc.RpcError as exc:
            raise self._error(op, exc) from None

    def probe(self, wait: float = 1.0) -> bool:
        """One read, and one on the session (opening its stream), before any round: whether the server answered.

        What a process pays for its first calls (the stub, the connection's first exchanges, the
        first unary call and the session's stream, each dearer than the same call later) is then paid
        here rather than inside the first rendezvous round, as
        torch's TCPStore client validates its connection when it is made; and a token the server
        refuses is reported now. A server that cannot be reached within ``wait`` seconds (not
        started yet, as when another agent will host it) is not an error here: the rendezvous's
        calls retry it for ``retry_timeout``.

        Raises:
            RendezvousBackendError: the server refused the token.
        """
        until = time.monotonic() + max(0.0, wait)
        op = "Get"
        try:
            read = pb.GetRequest(space=self.run_id, key="probe")
            self._stub.Get(read, timeout=max(0.0, wait), metadata=self._metadata, wait_for_ready=True)
            # and the same read on this backend's session, which opens its stream: a stream's
            # first use in a process has costs of its own
            op = "Session"
            self._send("Get", read, max(0.0, until - time.monotonic()))
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                raise self._error(op, exc) from None
            log.debug("rendezvous server %s not probed: %s", self.endpoint, exc.code().name)
            return False
        return True

    # -- protocol -------------------------------------------------------------------------
    def get(self, key: str) -> Entry | None:
        """See :meth:`RendezvousBackend.get`."""
        return _entry(self._call("Get", pb.GetRequest(space=self.run_id, key=check_key(key))))

    def set(self, key: str, value: JSONValue, *, ttl: float | None = None) -> Version:
        """See :meth:`RendezvousBackend.set`."""
        request = pb.SetRequest(
            space=self.run_id, key=check_key(key), value=_dump(value), ttl=ttl, request_id=uuid.uuid4().hex
        )
        return int(self._call("Set", request).version)

    def compare_and_set(
        self, key: str, value: JSONValue, *, version: Version | None, ttl: float | None = None
    ) -> tuple[bool, Entry | None]:
        """See :meth:`RendezvousBackend.compare_and_set`."""
        request = pb.CompareAndSetRequest(
            space=self.run_id,
            key=check_key(key),
            value=_dump(value),
            version=version,
            ttl=ttl,
            request_id=uuid.uuid4().hex,
        )
        reply = self._call("CompareAndSet", request)
        return bool(reply.written), _entry(reply)

    def add(self, key: str, amount: int = 1) -> int:
        """See :meth:`RendezvousBackend.add`."""
        request = pb.AddRequest(space=self.run_id, key=check_key(key), amount=int(amount), request_id=uuid.uuid4().hex)
        return int(self._call("Add", request).total)

    def create_and_add(
        self, key: str, value: JSONValue, counter: str, amount: int = 1
    ) -> tuple[bool, Entry | None, int]:
        """See :class:`~rallypoint.rendezvous.backend.SupportsCreateAndAdd`: one call (a node's join).

        A server of a version without the call (``UNIMPLEMENTED``) gets the two calls instead,
        from then on.
        """
        if self._two_step_joins:
            return create_and_add_in_two_steps(self, key, value, counter, amount)
        request = pb.CreateAndAddRequest(
            space=self.run_id,
            key=check_key(key),
            value=_dump(value),
            counter=check_key(counter),
            amount=int(amount),
            request_id=uuid.uuid4().hex,
        )
        try:
            reply = self._invoke("CreateAndAdd", request)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise self._error("CreateAndAdd", exc) from None
            self._two_step_joins = True
            return create_and_add_in_two_steps(self, key, value, counter, amount)
        return bool(reply.created), _entry(reply), int(reply.total)

    def check_in(
        self, prefix: str, counter: str, *, unless: str, claim: tuple[str, JSONValue] | None = None
    ) -> CheckIn:
        """See :class:`~rallypoint.rendezvous.backend.SupportsCheckIn`: one call (a node's first request).

        The claim key must hold exactly the JSON text this backend writes for the claim's value
        (a value equal as JSON but written otherwise adds nothing; the caller then adds). A server
        of a version without the call (``UNIMPLEMENTED``) gets the step-by-step check-in instead,
        from then on.
        """
        if self._step_check_ins:
            return check_in_in_steps(self, prefix, counter, unless=unless, claim=claim)
        request = pb.CheckInRequest(
            space=self.run_id,
            prefix=check_key(prefix, prefix=True),
            counter=check_key(counter),
            unless=check_key(unless),
            request_id=uuid.uuid4().hex,
        )
        if claim is not None:
            request.claim_key = check_key(claim[0])
            request.claim_value = _dump(claim[1])
        try:
            reply = self._invoke("CheckIn", request)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise self._error("CheckIn", exc) from None
            self._step_check_ins = True
            return check_in_in_steps(self, prefix, counter, unless=unless, claim=claim)
        count = int(reply.count) if reply.HasField("count") else None
        return CheckIn(_entries(reply.entries), count, _entry(reply, "claimed"))

    def set_many(self, items: Mapping[str, JSONValue]) -> None:
        """See :class:`~rallypoint.rendezvous.backend.SupportsSetMany`: one call.

        A server of a version without the call (``UNIMPLEMENTED``) gets one ``Set`` per key
        instead, from then on.
        """
        texts = {check_key(key): _dump(value) for key, value in items.items()}
        if not texts:
            return
        if not self._set_many:
            for key, value in items.items():
                self.set(key, value)
            return
        request = pb.SetManyRequest(space=self.run_id, items=texts, request_id=uuid.uuid4().hex)
        try:
            self._invoke("SetMany", request)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise self._error("SetMany", exc) from None
            self._set_many = False
            self.set_many(items)

    def delete(self, key: str, *, version: Version | None = None) -> bool:
        """See :meth:`RendezvousBackend.delete`."""
        request = pb.DeleteRequest(space=self.run_id, key=check_key(key), version=version, request_id=uuid.uuid4().hex)
        return bool(self._call("Delete", request).deleted)

    def list(self, prefix: str) -> dict[str, Entry]:
        """See :meth:`RendezvousBackend.list`."""
        reply = self._call("List", pb.ListRequest(space=self.run_id, prefix=check_key(prefix, prefix=True)))
        return _entries(reply.entries)

    def _watch(self, make: Callable[[float], Any], timeout: float) -> Any:
        """Wait for a watch's event: a change (the event) or ``timeout`` passing (``None``).

        The watch is sent again (on a new stream) after a lost connection.
        """
        deadline = time.monotonic() + max(0.0, timeout)
        backoff: Backoff | None = None
        while True:
            remaining = max(0.0, deadline - time.monotonic())
            try:
                event = self._send("Watch", make(remaining), remaining + self.call_timeout)
                return event if event.changed else None
            except grpc.RpcError as exc:
                if exc.code() in _RETRIED:
                    backoff = backoff or Backoff(self.retry_timeout)
                    if backoff.wait():
                        continue
                raise self._error("Watch", exc) from None

    def watch(self, key: str, *, version: Version | None, timeout: float) -> bool:
        """See :meth:`RendezvousBackend.watch` (one message on the session, one event back)."""
        check_key(key)

        def request(t: float) -> Any:
            return pb.WatchRequest(space=self.run_id, key=key, version=version, timeout=t)

        return self._watch(request, timeout) is not None

    def wait_with(
        self, key: str, *, version: Version | None, timeout: float, also: Sequence[str]
    ) -> WatchedChange | None:
        """See :class:`~rallypoint.rendezvous.backend.SupportsWaitWith`: one watch, ``also`` in its event.

        A server of an older version sends no ``also`` entries: the keys then read as absent
        (the rendezvous falls back to the roster).
        """
        check_key(key)
        extra = [check_key(k) for k in also]

        def request(t: float) -> Any:
            return pb.WatchRequest(space=self.run_id, key=key, version=version, timeout=t, also=extra)

        event = self._watch(request, timeout)
        if event is None:
            return None
        found = _entries(event.also)
        return WatchedChange(_entry(event), {k: found.get(k) for k in extra})

    def hold_watch(self, key: str, *, timeout: float) -> _HeldWatch:
        """See :class:`~rallypoint.rendezvous.backend.SupportsHeldWatch`.

        Nothing is sent until the wait: the server compares the key with the version the waiter
        holds when the watch arrives, so no change made since the hold can be missed. The change
        comes with the key's entry (from a server of this version; an older one sends none, and
        the caller reads).
        """
        return _HeldWatch(self, check_key(key), time.monotonic() + max(0.0, timeout))

    def watch_prefix(self, prefix: str, *, versions: Mapping[str, Version], timeout: float) -> bool:
        """See :meth:`RendezvousBackend.watch_prefix` (one message on the session, one event back)."""
        check_key(prefix, prefix=True)
        known = dict(versions)
        return (
            self._watch(
                lambda t: pb.WatchRequest(space=self.run_id, key=prefix, prefix=True, versions=known, timeout=t),
                timeout,
            )
            is not None
        )

    def close(self) -> None:
        """End this backend's session (its calls in flight raise); the channel is the process's and stays open.

        A later call opens a new session.
        """
        with self._session_lock:
            session, self._session = self._session, None
        if session is not None and session.pid == os.getpid():
            session.close()


def _client_tls(opts: GrpcOptions) -> TlsFiles | None:
    if not opts.tls:
        return None
    if opts.mutual_tls:
        return TlsFiles(cert=opts.tls_cert, key=opts.tls_key, ca=opts.tls_ca, server_name=opts.tls_server_name)
    return TlsFiles(ca=opts.tls_ca, server_name=opts.tls_server_name)


class _HeldWatch:
    """A :class:`~rallypoint.rendezvous.backend.HeldWatch` on one key of the gRPC server."""

    def __init__(self, backend: GrpcBackend, key: str, until: float) -> None:
        self._backend = backend
        self._key = key
        self._until = until

    def remaining(self) -> float:
        """Seconds until the deadline."""
        return max(0.0, self._until - time.monotonic())

    def wait(self, version: Version | None) -> WatchedChange | None:
        """One watch from ``version`` until the deadline; the change with the key's entry."""
        b = self._backend

        def request(t: float) -> Any:
            return pb.WatchRequest(space=b.run_id, key=self._key, version=version, timeout=t)

        event = b._watch(request, self.remaining())
        if event is None:
            return None
        return WatchedChange(_entry(event))

    def close(self) -> None:
        """Nothing is open between waits."""


#: How long a new backend waits for the server to answer its probe (:meth:`GrpcBackend.probe`).
_PROBE_WAIT = 1.0


def create_grpc_backend(run_id: str, options: Any) -> GrpcBackend:
    """Factory of the ``grpc`` backend record: ``(run_id, options) -> backend``.

    With ``serve = "auto"`` this agent hosts the server when the endpoint is its own (see
    :func:`host_server`). The new backend probes the server (:meth:`GrpcBackend.probe`, waiting
    a second at most), so a refused token fails here and the first round does not pay the
    connection's set-up.
    """
    opts = options if isinstance(options, GrpcOptions) else GrpcOptions.model_validate(dict(options or {}))
    try:
        token = read_token(opts.token_file, opts.token_env)
    except ValueError as exc:
        raise RendezvousBackendError(f"rendezvous.options: {exc}") from None
    hosted_here = host_server(opts, token) if opts.serve == "auto" else None
    backend = GrpcBackend(
        opts.endpoint,
        run_id,
        token=token,
        tls=_client_tls(opts),
        call_timeout=opts.call_timeout,
        retry_timeout=opts.retry_timeout,
        max_message_bytes=opts.max_message_bytes,
    )
    if opts.serve == "auto" and hosted_here is None and opts.data_dir is None:
        # another node's agent serves it and keeps nothing on disk: the job's rendezvous lives
        # and dies with that agent (the agent fails fast when it is lost; see docs/grpc.md)
        backend.hosted_by = opts.endpoint
    backend.local_state = hosted_here is not None and opts.data_dir is None
    backend.probe(min(_PROBE_WAIT, opts.retry_timeout))
    return backend
