"""The thin seam between the etcd backend and an etcd v3 client library.

:class:`EtcdClient` is everything :mod:`rallypoint_etcd.backend` asks of etcd: reads with the
revision they saw, puts, compare-and-set and compare-and-delete transactions on a key's
``mod_revision``, leases, and a watch from a given revision. It is built on the ``etcd3`` module
(python-etcd3's API, shipped by the ``etcd3-fc`` distribution); the transactions that the library's
helpers cannot express (a range compare, a put that keeps the key's value and lease) are built
from its protocol messages (``etcd3.etcdrpc``) and sent through its stub. Another client library
can take its place by reimplementing this class. Only this module imports ``etcd3`` and ``grpc``, and only
the backend imports this module (the agent and the CLI never load them at start-up).

Errors: :class:`Unavailable` when no endpoint answered (the caller retries), :class:`LeaseGone`
when a lease expired, :class:`EtcdRequestError` for anything else (refused, bad request).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from typing import Any, Literal, NamedTuple, TypeVar

# gRPC's default poller (epoll1) breaks in a child forked while a watch stream is open (gRPC
# aborts the child); the poll poller survives fork. Its informational notes about forks (every
# worker start is a fork) are not for users. Read when gRPC starts, so set before the import; a
# value set by the user wins.
os.environ.setdefault("GRPC_POLL_STRATEGY", "poll")
# gRPC's fork handlers (on by default) restart its threads in the child between fork and exec;
# the agent's workers exec at once and never need them, and a child could die of them (SIGABRT)
# before its first line. Off, as in rallypoint_grpc (see its package docstring).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import etcd3  # type: ignore[import-untyped]
import etcd3.etcdrpc  # type: ignore[import-untyped]
import etcd3.exceptions  # type: ignore[import-untyped]
import etcd3.utils  # type: ignore[import-untyped]
import grpc
import grpc.experimental

from rallypoint_etcd.options import EtcdOptions, parse_endpoint

__all__ = ["KV", "EtcdClient", "EtcdRequestError", "LeaseGone", "Unavailable", "prefix_end"]

T = TypeVar("T")

#: How long a failed endpoint is skipped before it is tried again (seconds).
ENDPOINT_RETRY = 0.25
#: gRPC reconnects quickly after a server restart (its default backoff grows to two minutes).
_CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.keepalive_time_ms", 10000),
    # A unary-stream call (our watch: one request, then answers) is read by the calling thread
    # alone; without it gRPC runs a thread per channel to poll such calls.
    (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1),
]
#: etcd's Watch method. It is bidirectional, but a wait sends one request and half-closes, which is
#: a unary-stream call on the wire: called as one, gRPC needs no thread to feed the request stream.
_WATCH_METHOD = "/etcdserverpb.Watch/Watch"
_UNAVAILABLE = (
    etcd3.exceptions.ConnectionFailedError,
    etcd3.exceptions.ConnectionTimeoutError,
    etcd3.exceptions.NoServerAvailableError,
    etcd3.exceptions.InternalServerError,
    etcd3.exceptions.WatchTimedOut,
)
_RETRY_CODES = {"UNAVAILABLE", "DEADLINE_EXCEEDED", "INTERNAL", "CANCELLED", "UNKNOWN"}


class Unavailable(Exception):
    """No endpoint answered (down, restarting, electing a leader); the request may be retried."""


class LeaseGone(Exception):
    """The lease named in a request no longer exists (it expired or was revoked)."""


class EtcdRequestError(Exception):
    """etcd refused the request (permission denied, bad credentials, invalid request)."""


class KV(NamedTuple):
    """A stored key: its value, the revision of its last write and the revision that created it.

    A named tuple, not a frozen dataclass: a node builds one per key of every answer (a counter's
    arrivals included), and a tuple is built several times faster.
    """

    value: bytes
    mod_revision: int
    create_revision: int = 0


def prefix_end(prefix: str) -> str:
    """The end of the key range of every key that starts with ``prefix``."""
    return str(etcd3.utils.prefix_range_end(prefix.encode()).decode())


def _kvs(kvs: Any) -> dict[str, KV]:
    return {kv.key.decode(): KV(kv.value, kv.mod_revision, kv.create_revision) for kv in kvs}


def _range_op(key: str, end: str) -> Any:
    return etcd3.etcdrpc.RequestOp(request_range=etcd3.etcdrpc.RangeRequest(key=key.encode(), range_end=end.encode()))


def _put_op(key: str, value: bytes | None, lease: int | None) -> Any:
    """A put; ``value=None``: keep the key's value and lease (the key must exist)."""
    if value is None:
        request = etcd3.etcdrpc.PutRequest(key=key.encode(), ignore_value=True, ignore_lease=True)
    else:
        request = etcd3.etcdrpc.PutRequest(key=key.encode(), value=value, lease=lease or 0)
    return etcd3.etcdrpc.RequestOp(request_put=request)


def _delete_op(key: str, end: str | None = None) -> Any:
    request = etcd3.etcdrpc.DeleteRangeRequest(key=key.encode(), range_end=b"" if end is None else end.encode())
    return etcd3.etcdrpc.RequestOp(request_delete_range=request)


def _compare(key: str, target: str, value: int, result: str = "EQUAL") -> Any:
    """``target`` (``MOD`` or ``CREATE`` revision) of ``key`` compared with ``value``."""
    c = etcd3.etcdrpc.Compare
    field = {"MOD": "mod_revision", "CREATE": "create_revision"}[target]
    return c(key=key.encode(), target=getattr(c, target), result=getattr(c, result), **{field: value})


def _add_request(key: str, arrival: str, amount: bytes, zero: bytes, lease: int | None, end: str) -> Any:
    """The transaction of an add (see :meth:`EtcdClient.add_arrival`); its last operation reads ``[key, end)``."""
    return etcd3.etcdrpc.TxnRequest(
        compare=[_compare(key, "CREATE", 0, "GREATER")],
        success=[_put_op(arrival, amount, lease), _put_op(key, None, None), _range_op(key, end)],
        failure=[_put_op(key, zero, lease), _put_op(arrival, amount, lease), _range_op(key, end)],
    )


def _deadline_passed(exc: grpc.RpcError) -> bool:
    """Whether a call ended at its deadline.

    The status is the client's own, or etcd's: its server sees the same deadline and may end the
    stream first, with UNKNOWN "context deadline exceeded".
    """
    code = exc.code() if hasattr(exc, "code") else None
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return True
    details = exc.details() if hasattr(exc, "details") else ""
    return code == grpc.StatusCode.UNKNOWN and "deadline exceeded" in str(details)


def _translate(exc: BaseException, where: str) -> Exception:
    if isinstance(exc, etcd3.exceptions.RevisionCompactedError):
        return Unavailable(f"{where}: watch revision was compacted")
    if isinstance(exc, _UNAVAILABLE):
        return Unavailable(f"{where}: {type(exc).__name__}: {exc}")
    if isinstance(exc, grpc.RpcError):
        code = exc.code() if hasattr(exc, "code") else None
        details = exc.details() if hasattr(exc, "details") else str(exc)
        name = getattr(code, "name", str(code))
        if "lease not found" in str(details):
            return LeaseGone(str(details))
        if name in _RETRY_CODES or "leader" in str(details) or "timed out" in str(details):
            return Unavailable(f"{where}: {name}: {details}")
        return EtcdRequestError(f"{where}: {name}: {details}")
    return exc if isinstance(exc, Exception) else RuntimeError(str(exc))


class EtcdClient:
    """One connection (one gRPC channel per endpoint) to an etcd cluster.

    A request goes to the endpoint in use; when it fails for lack of an answer, that endpoint is
    skipped for :data:`ENDPOINT_RETRY` seconds and the next request goes to another one.

    Args:
        options: endpoints, TLS files, credentials and the per-request timeout.
    """

    def __init__(self, options: EtcdOptions) -> None:
        self.options = options
        self.endpoints = list(options.endpoints)
        self._lock = threading.Lock()
        self._client: Any = None

    # -- plumbing --------------------------------------------------------------------------
    def _connect(self) -> Any:
        opts = self.options
        creds = None
        if opts.tls:
            creds = etcd3.MultiEndpointEtcd3Client.get_secure_creds(opts.tls_ca, opts.tls_key, opts.tls_cert)
        eps = []
        for text in self.endpoints:
            host, port, _ = parse_endpoint(text)
            eps.append(
                etcd3.Endpoint(
                    host, port, secure=opts.tls, creds=creds, time_retry=ENDPOINT_RETRY, opts=_CHANNEL_OPTIONS
                )
            )
        client = etcd3.MultiEndpointEtcd3Client(
            endpoints=eps,
            timeout=opts.connect_timeout,
            user=opts.username,
            password=opts.password(),
            failover=True,
        )
        if not opts.tls:
            # gRPC sends call credentials over TLS only; the login token also travels as plain
            # metadata, which is what etcd reads (it is all a plain-text channel can carry).
            client.call_credentials = None
        return client

    def _call(self, what: str, fn: Callable[[Any], T]) -> T:
        """Run ``fn(client)``, connecting first; translate the library's errors."""
        try:
            with self._lock:
                if self._client is None:
                    self._client = self._connect()
                client = self._client
            return fn(client)
        except (LeaseGone, Unavailable, EtcdRequestError):
            raise
        except Exception as exc:
            err = _translate(exc, f"{what} on {self.current_endpoint()}")
            if isinstance(err, EtcdRequestError) and "auth token" in str(err):
                self.reset()  # simple tokens die with a server restart: authenticate again
                err = Unavailable(str(err))
            raise err from exc

    def current_endpoint(self) -> str:
        """The endpoint requests go to now (for messages)."""
        client = self._client
        ep = getattr(client, "endpoint_in_use", None) if client is not None else None
        return getattr(ep, "netloc", None) or ",".join(self.endpoints)

    def reset(self) -> None:
        """Drop the connection; the next request connects (and authenticates) again."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):  # closing a broken connection
                client.close()

    def close(self) -> None:
        """Close the channels."""
        self.reset()

    # -- key-value ---------------------------------------------------------------------------
    def get(self, key: str) -> tuple[KV | None, int]:
        """The key (or ``None``) and the store's revision at the time of the read."""
        resp = self._call("get", lambda c: c.get_response(key))
        return _kvs(resp.kvs).get(key), resp.header.revision

    def get_prefix(self, prefix: str) -> tuple[dict[str, KV], int]:
        """Every key under ``prefix`` and the store's revision at the time of the read."""
        resp = self._call("range", lambda c: c.get_prefix_response(prefix))
        return _kvs(resp.kvs), resp.header.revision

    def get_range(self, key: str, end: str) -> tuple[dict[str, KV], int]:
        """Every key in ``[key, end)`` and the store's revision at the time of the read."""
        resp = self._call("range", lambda c: c.get_response(key, range_end=end))
        return _kvs(resp.kvs), resp.header.revision

    def put(self, key: str, value: bytes, *, lease: int | None = None) -> int:
        """Write ``key``; return the revision of the write."""
        resp = self._call("put", lambda c: c.put(key, value, lease=lease))
        return int(resp.header.revision)

    def _txn(self, compare: list[Any], success: list[Any], failure: list[Any]) -> Any:
        """One transaction from protocol messages; its raw response."""
        request = etcd3.etcdrpc.TxnRequest(compare=compare, success=success, failure=failure)

        def call(c: Any) -> Any:
            try:
                return c.kvstub.Txn(request, c.timeout, credentials=c.call_credentials, metadata=c.metadata)
            except grpc.RpcError as exc:
                c._manage_grpc_errors(exc)  # marks a silent endpoint failed (failover), as the helpers do
                raise

        return self._call("transaction", call)

    def put_clear(
        self,
        key: str,
        value: bytes,
        *,
        lease: int | None,
        clear: tuple[str, str],
        mod_revision: int | Literal["any"] | None = "any",
    ) -> tuple[int, dict[str, KV]]:
        """Write ``key`` and delete the keys in the range ``clear``, in one transaction.

        Args:
            key: the key to write.
            value: its new value.
            lease: the lease to attach it to (``None``: none).
            clear: ``(start, end)`` of a key range next to ``key`` (it must not hold ``key``).
            mod_revision: ``"any"``: write unconditionally; ``None``: only if ``key`` is absent; an
                int: only if ``key`` is at that ``mod_revision``.

        Returns:
            ``(revision of the write, {})``, or ``(0, the keys in [key, clear end))`` when the
            comparison failed.
        """
        if mod_revision == "any":
            compare = []
        elif mod_revision is None:
            compare = [_compare(key, "CREATE", 0)]
        else:
            compare = [_compare(key, "MOD", int(mod_revision))]
        success = [_put_op(key, value, lease), _delete_op(*clear)]
        resp = self._txn(compare, success, [_range_op(key, clear[1])])
        if resp.succeeded:
            return int(resp.header.revision), {}
        return 0, _kvs(resp.responses[0].response_range.kvs)

    def add_arrival(
        self, key: str, arrival: str, amount: bytes, *, zero: bytes, lease: int | None, end: str
    ) -> dict[str, KV]:
        """Write the new key ``arrival`` and touch ``key``, in one transaction; return ``[key, end)`` after it.

        ``key`` keeps its value and lease and gets a new ``mod_revision``; when it is absent it is
        created with the value ``zero``. Nothing is compared against an earlier read, so the
        transaction never fails for a concurrent writer; etcd applies transactions one at a time,
        so the range read inside it sees exactly the arrivals before this one and this one.
        Sending it again (after a lost answer) rewrites the same arrival key: it counts once.
        """
        add = _add_request(key, arrival, amount, zero, lease, end)
        resp = self._txn(list(add.compare), list(add.success), list(add.failure))
        return _kvs(resp.responses[-1].response_range.kvs)

    def create_and_add(
        self,
        key: str,
        value: bytes,
        counter: str,
        arrival: str,
        amount: bytes,
        *,
        zero: bytes,
        lease: int | None,
        key_end: str,
        counter_end: str,
    ) -> tuple[int, dict[str, KV]]:
        """Create ``key`` if absent and then add to ``counter`` (as :meth:`add_arrival`), in one transaction.

        The add is a transaction nested in the one that compares ``key``'s absence, so both
        happen, or neither.

        Returns:
            ``(revision of the write, [counter, counter_end) after it)`` when ``key`` was created,
            else ``(0, [key, key_end))``.
        """
        add = _add_request(counter, arrival, amount, zero, lease, counter_end)
        resp = self._txn(
            [_compare(key, "CREATE", 0)],
            [_put_op(key, value, lease), etcd3.etcdrpc.RequestOp(request_txn=add)],
            [_range_op(key, key_end)],
        )
        if not resp.succeeded:
            return 0, _kvs(resp.responses[0].response_range.kvs)
        nested = resp.responses[1].response_txn
        return int(resp.header.revision), _kvs(nested.responses[-1].response_range.kvs)

    def check_in(
        self,
        read: tuple[str, str],
        unless: str,
        add: tuple[str, str, bytes, str],
        *,
        lease: int | None,
        claim: tuple[str, bytes] | None = None,
    ) -> tuple[dict[str, KV], dict[str, KV] | None, KV | None]:
        """Read ``read``; unless ``unless`` exists, create ``claim`` if absent and add (as :meth:`add_arrival`).

        The add happens only while ``unless`` is absent and the claim key holds exactly the
        claim's bytes (created now, or before): one transaction, nested ones for the cases.

        Args:
            read: ``(start, end)`` of the range to read.
            unless: the marker key whose existence stops the claim and the add.
            add: ``(counter, arrival, amount, counter range end)``; the counter is created as ``0``.
            lease: the lease of the written keys.
            claim: ``(key, value)`` to create if absent, or ``None``.

        Returns:
            ``(the range read, the counter's range after the add or None when nothing was added,
            the claim key after the transaction or None)``.
        """
        counter, arrival, amount, end = add
        adding = etcd3.etcdrpc.RequestOp(request_txn=_add_request(counter, arrival, amount, b"0", lease, end))
        reading = _range_op(*read)
        if claim is None:
            resp = self._txn([_compare(unless, "CREATE", 0)], [reading, adding], [reading])
            found = _kvs(resp.responses[0].response_range.kvs)
            if not resp.succeeded:
                return found, None, None
            return found, _kvs(resp.responses[1].response_txn.responses[-1].response_range.kvs), None
        key, value = claim
        same = etcd3.etcdrpc.Compare(
            key=key.encode(), target=etcd3.etcdrpc.Compare.VALUE, result=etcd3.etcdrpc.Compare.EQUAL, value=value
        )
        add_if_same = etcd3.etcdrpc.TxnRequest(compare=[_compare(unless, "CREATE", 0), same], success=[adding])
        resp = self._txn(
            [_compare(unless, "CREATE", 0), _compare(key, "CREATE", 0)],
            [reading, _put_op(key, value, lease), adding],
            [reading, _range_op(key, ""), etcd3.etcdrpc.RequestOp(request_txn=add_if_same)],
        )
        found = _kvs(resp.responses[0].response_range.kvs)
        if resp.succeeded:
            counted = _kvs(resp.responses[2].response_txn.responses[-1].response_range.kvs)
            revision = int(resp.header.revision)
            return found, counted, KV(value, revision, revision)
        claimed = _kvs(resp.responses[1].response_range.kvs).get(key)
        nested = resp.responses[2].response_txn
        if not nested.succeeded:
            return found, None, claimed
        return found, _kvs(nested.responses[0].response_txn.responses[-1].response_range.kvs), claimed

    def delete(self, key: str, *, end: str | None = None, mod_revision: int | None = None) -> bool:
        """Delete ``key`` (with ``end``: the keys in ``[key, end)``), only at ``mod_revision`` when given.

        Returns:
            whether ``key`` itself existed (and, with ``mod_revision``, was at it) and was deleted.
        """
        if end is None and mod_revision is None:
            return bool(self._call("delete", lambda c: c.delete(key)))
        if mod_revision is None:
            compare = [_compare(key, "CREATE", 0, "GREATER")]
            resp = self._txn(compare, [_delete_op(key, end)], [_delete_op(key, end)])
        else:
            resp = self._txn([_compare(key, "MOD", mod_revision)], [_delete_op(key, end)], [])
        return bool(resp.succeeded)

    # -- leases ------------------------------------------------------------------------------
    def grant(self, ttl: int, lease: int | None = None) -> int:
        """A new lease of ``ttl`` seconds (etcd may round it up); its id.

        With ``lease``, the lease gets that id; a lease of that id that exists already is kept
        (and its id returned), so clients that race to create the same lease all succeed.
        """

        def call(c: Any) -> int:
            try:
                return int(c.lease(ttl, lease_id=lease).id)
            except etcd3.exceptions.PreconditionFailedError:
                if lease is None:
                    raise
                return lease  # "lease already exists"

        return self._call("lease grant", call)

    def keep_alive(self, lease: int) -> int:
        """Refresh a lease; its remaining TTL in seconds (0 when it no longer exists)."""
        responses = self._call("lease keep-alive", lambda c: list(c.refresh_lease(lease)))
        return int(responses[-1].TTL) if responses else 0

    def revoke(self, lease: int) -> None:
        """Revoke a lease: every key attached to it is deleted."""
        self._call("lease revoke", lambda c: c.revoke_lease(lease))

    # -- watches -----------------------------------------------------------------------------
    def _open_watch(self, key: str, *, prefix: bool, timeout: float) -> Any:
        """A watch stream on ``key`` (or the range under it) from the store's next revision."""
        create = etcd3.etcdrpc.WatchCreateRequest(key=key.encode())
        if prefix:
            create.range_end = etcd3.utils.prefix_range_end(key.encode())
        request = etcd3.etcdrpc.WatchRequest(create_request=create)
        deadline = max(0.001, timeout)

        def open_stream(c: Any) -> Any:
            watch = c._stubs.get("rallypoint-watch")  # cached with the library's stubs, dropped with them
            if watch is None:
                watch = c._stubs["rallypoint-watch"] = c.channel.unary_stream(
                    _WATCH_METHOD,
                    request_serializer=etcd3.etcdrpc.WatchRequest.SerializeToString,
                    response_deserializer=etcd3.etcdrpc.WatchResponse.FromString,
                )
            # One request, then the client half-closes: etcd keeps the watch until the stream ends.
            return watch(request, deadline, credentials=c.call_credentials, metadata=c.metadata)

        return self._call("watch", open_stream)

    def _check_watch(self, key: str, response: Any) -> None:
        """Raise when etcd cancelled the watch (permissions: :class:`EtcdRequestError`; else :class:`Unavailable`)."""
        if response.canceled or response.compact_revision:
            reason = response.cancel_reason or f"compacted at {response.compact_revision}"
            if "permission" in reason or "auth" in reason:
                raise EtcdRequestError(f"watch {key!r} on {self.current_endpoint()}: {reason}")
            raise Unavailable(f"watch {key!r} on {self.current_endpoint()} was cancelled: {reason}")

    def _watch_error(self, exc: grpc.RpcError) -> Exception:
        client = self._client
        if client is not None:
            with contextlib.suppress(Exception):  # marks a silent endpoint failed (failover), then raises
                client._manage_grpc_errors(exc)
        return _translate(exc, f"watch on {self.current_endpoint()}")

    def wait(self, key: str, *, prefix: bool, timeout: float, changed: Callable[[], bool]) -> bool:
        """Watch ``key`` (or the range under it, with ``prefix``) from now; block until it changes.

        The watch starts at the store's next revision, then ``changed()`` (the caller's read) tells
        whether the key already changed before that: together nothing is missed. A watch from an
        earlier revision would be no better: etcd serves a watch that starts in the past from its
        catch-up loop, which runs every 100 ms, not from the write itself.

        Each wait is one watch stream of its own with ``timeout`` as its deadline, read by the
        calling thread: no watcher thread, no callback, nothing left open afterwards (a shared
        stream, as the library keeps, costs a thread per process and its wake-ups). It is called
        as a unary-stream call on a single-threaded channel, so gRPC starts no thread for it
        either (a bidirectional call starts one to send the request and one to poll the channel).

        Returns:
            ``True`` when ``changed()`` said so or an event came, ``False`` when ``timeout`` passed.

        Raises:
            Unavailable: the watch stream broke (the caller reads again and watches again).
            EtcdRequestError: etcd refused the watch (permissions).
        """
        stream = self._open_watch(key, prefix=prefix, timeout=timeout)
        created = False
        try:
            for response in stream:
                self._check_watch(key, response)
                if response.created and not created:
                    created = True
                    if changed():
                        return True
                if response.events:
                    return True
            raise Unavailable(f"watch {key!r} on {self.current_endpoint()}: the stream ended")
        except grpc.RpcError as exc:
            if _deadline_passed(exc):
                # Our own deadline: no event in time. Before the watch was set up, only a read can tell.
                return changed() if not created else False
            raise self._watch_error(exc) from exc
        finally:
            stream.cancel()

    def hold(self, key: str, *, timeout: float) -> Any:
        """Watch ``key`` from the store's next revision for ``timeout`` seconds; return once etcd set it up.

        Every change of ``key`` after this returns reaches :meth:`changes` on the returned stream
        (cancel it when done: ``stream.cancel()``).

        Raises:
            Unavailable: no answer, or not set up within ``timeout``.
            EtcdRequestError: etcd refused the watch (permissions).
        """
        stream = self._open_watch(key, prefix=False, timeout=timeout)
        try:
            for response in stream:
                self._check_watch(key, response)
                if response.created:
                    return stream
            raise Unavailable(f"watch {key!r} on {self.current_endpoint()}: the stream ended")
        except grpc.RpcError as exc:
            stream.cancel()
            if _deadline_passed(exc):
                raise Unavailable(f"watch {key!r} on {self.current_endpoint()}: not set up in {timeout:.3g} s") from exc
            raise self._watch_error(exc) from exc
        except BaseException:
            stream.cancel()
            raise

    def changes(self, stream: Any, key: str) -> list[tuple[KV | None, int]] | None:
        """The next changes on a stream from :meth:`hold`: ``(KV, revision)`` per change, ``KV`` ``None`` when deleted.

        Returns:
            the changes of the next answer that holds any, or ``None`` once the stream's deadline passed.

        Raises:
            Unavailable: the stream broke or ended.
            EtcdRequestError: etcd cancelled the watch (permissions).
        """
        try:
            for response in stream:
                self._check_watch(key, response)
                if response.events:
                    return [
                        (
                            None if e.type == e.DELETE else KV(e.kv.value, e.kv.mod_revision, e.kv.create_revision),
                            e.kv.mod_revision,
                        )
                        for e in response.events
                    ]
            raise Unavailable(f"watch {key!r} on {self.current_endpoint()}: the stream ended")
        except grpc.RpcError as exc:
            if _deadline_passed(exc):
                return None
            raise self._watch_error(exc) from exc
