"""etcd's Watch service: wait for a key to change, or hold a watch open and read its changes.

Each watch is a stream of its own, read by the calling thread (see :meth:`WatchRequests.wait`):
no watcher thread, no callback, nothing left open after a wait.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import etcd3.etcdrpc  # type: ignore[import-untyped]
import etcd3.utils  # type: ignore[import-untyped]
import grpc

from rallypoint_etcd.client.connection import EtcdConnection
from rallypoint_etcd.client.errors import EtcdRequestError, Unavailable, deadline_passed, translate
from rallypoint_etcd.client.messages import KV

__all__ = ["WatchRequests"]

#: etcd's Watch method. It is bidirectional, but a wait sends one request and half-closes, which is
#: a unary-stream call on the wire: called as one, gRPC needs no thread to feed the request stream.
_WATCH_METHOD = "/etcdserverpb.Watch/Watch"


class WatchRequests(EtcdConnection):
    """The watch requests, sent over the connection."""

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
        return translate(exc, f"watch on {self.current_endpoint()}")

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
            if deadline_passed(exc):
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
            if deadline_passed(exc):
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
            if deadline_passed(exc):
                return None
            raise self._watch_error(exc) from exc
