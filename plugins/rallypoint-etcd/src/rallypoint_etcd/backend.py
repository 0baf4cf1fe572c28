"""The rendezvous backend on etcd's v3 API.

Layout under ``<prefix>/[<namespace>/]<run_id>/``::

    kv/<key>               one etcd key per rendezvous key; the value is JSON text
    kv/<key>#<id>          one key per atomic add to <key> (its amount), until <key> is rewritten
    meta/clients/<id>      one key per open client (removed when it closes)

Versions are etcd ``mod_revision`` numbers of ``kv/<key>``: they change on every write and are
never reused. Compare-and-set and conditional delete are transactions that compare the key's
``mod_revision`` (or its absence); ``watch`` and ``watch_prefix`` watch the key (or prefix) from
the store's next revision and then read it, so no change before the watch is missed, and nothing
polls. (A watch from a past revision would be served by etcd's catch-up loop, every 100 ms, not
as the write commits.)

Atomic add never retries: etcd has no increment, and a read followed by a compare-and-set loses
to every concurrent adder (with 64 nodes arriving together, each retried about 32 times). An add
is instead one transaction that writes a new *arrival* key ``kv/<key>#<id>`` holding the amount,
touches ``kv/<key>`` (a put that keeps its value and lease, so its version changes; created as
``0`` when absent) and reads ``[kv/<key>, kv/<key>$)``. etcd applies transactions one at a time
and a read inside one sees its writes, so that read holds every earlier arrival and this one:
the key's value plus their amounts is the exact sum after this add. Every read of a key reads
that same range (``#`` and ``$`` are no key characters, so it holds the key and its arrivals
only) and returns the sum; arrivals older than the key itself (left by a key that expired) do
not count. ``set``, compare-and-set and ``delete`` remove the arrivals in the same transaction
that writes the key. An add that finds more than :data:`FOLD_AT` arrivals folds them into the key
(one compare-and-set, skipped when another write came first). ``create_and_add`` (a node's join)
nests such an add in the transaction that creates a key only if it is absent.

Waiting: ``hold_watch`` keeps one watch stream open (see
:class:`~rallypoint.rendezvous.backend.SupportsHeldWatch`); the change it reports carries the
key's value from the watch event.

Key lifetime: every key of the run is attached to one *run lease* of ``key_ttl`` seconds that
each open client keeps alive. Its id is derived from the run's key prefix, so every client knows
it without asking; each client creates it (or finds it) when it connects, and a write that finds
it missing (it lapsed) creates it again. When every agent is gone
(killed), the lease lapses and etcd deletes the run's keys ``key_ttl`` seconds later. A client
that closes (or whose process exits) after the job was closed, and finds no other open client,
revokes the lease at once: every key goes and the run id can be used again. Keys written with a
``ttl`` get a lease of their own.

Faults: a request that finds no endpoint answering is retried (on the next endpoint) for
``retry_timeout`` seconds, then fails with :class:`~rallypoint.rendezvous.errors.RendezvousBackendError`
naming every endpoint tried; requests refused by etcd (authentication, permissions) fail at once.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import logging
import math
import os
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from rallypoint.rendezvous.backend import CheckIn, Entry, JSONValue, Version, WatchedChange, check_key
from rallypoint.rendezvous.errors import RendezvousBackendError, RendezvousStateError
from rallypoint_etcd.client import KV, EtcdClient, EtcdRequestError, LeaseGone, Unavailable, prefix_end
from rallypoint_etcd.options import EtcdOptions

__all__ = ["EtcdBackend", "create_etcd_backend"]

log = logging.getLogger("rallypoint.etcd")
T = TypeVar("T")

#: The handler's round header (see :mod:`rallypoint.rendezvous.backend`): read at close to learn
#: whether the job is over.
_HEADER = "round/header"
#: Arrival keys of ``kv/<key>`` are ``kv/<key>#<id>``; ``[kv/<key>, kv/<key>$)`` holds the key and
#: its arrivals and nothing else (``#`` < ``$``, and neither is a key character).
_ARRIVAL, _END = "#", "$"
#: An add that reads more arrivals than this folds them into the key.
FOLD_AT = 256
_OPEN: weakref.WeakSet[EtcdBackend] = weakref.WeakSet()


def _dump(value: JSONValue) -> bytes:
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise TypeError(f"rendezvous values must be JSON values, got {type(value).__name__}: {exc}") from exc


@atexit.register
def _close_all() -> None:
    """At interpreter exit: close every open backend (the last one out of a closed run cleans up)."""
    for backend in list(_OPEN):
        backend.close(wait=2.0)


class EtcdBackend:
    """A :class:`~rallypoint.rendezvous.backend.RendezvousBackend` on an etcd cluster.

    Args:
        run_id: the run id (one path segment).
        options: see :class:`~rallypoint_etcd.options.EtcdOptions`.
        client: the etcd seam to use (a new :class:`~rallypoint_etcd.client.EtcdClient` by default).
    """

    supports_ttl = True

    def __init__(self, run_id: str, options: EtcdOptions, *, client: EtcdClient | None = None) -> None:
        if not run_id or "/" in run_id:
            raise ValueError(f"invalid run_id {run_id!r} for the etcd rendezvous backend: no '/' allowed")
        check_key(run_id)
        self.run_id = run_id
        self.options = options
        self.base = options.base_key(run_id)
        self._kv = self.base + "kv/"
        self._me = self.base + f"meta/clients/{uuid.uuid4().hex}"
        self.client = client or EtcdClient(options)
        #: The run lease's id: the same in every client of the run (derived from its key prefix),
        #: so the first writer creates it and nobody needs to look it up.
        self.lease = int.from_bytes(hashlib.sha256(self.base.encode()).digest()[:8], "big") & (2**63 - 1) or 1
        self._lease_lock = threading.Lock()
        self._stop = threading.Event()
        self._keeper: threading.Thread | None = None
        self._wrote = False  # a key under the run lease (the clean-up on close is for writers only)
        self._closed = False
        self._check_files_and_secrets()
        _OPEN.add(self)
        # Connect now (as torch's handlers do), so that an unreachable etcd, or one that refuses
        # this user the run's keys, fails here, naming the endpoints, and the first rendezvous
        # step pays neither for the connection nor for the run lease (created or found here) nor
        # for this client's registration under it.
        self._retry("connect", lambda: self.client.grant(self.options.key_ttl, self.lease))
        self._retry("connect", lambda: self.client.put(self._me, b"1", lease=self.lease))
        self._start_keeper()

    def _check_files_and_secrets(self) -> None:
        """The password variable is set and the TLS files can be read (else a clear error now)."""
        try:
            self.options.password()
        except ValueError as exc:
            raise RendezvousBackendError(str(exc)) from None
        for name in ("tls_ca", "tls_cert", "tls_key"):
            path = getattr(self.options, name)
            if path is not None and not os.access(path, os.R_OK):
                raise RendezvousBackendError(
                    f"rendezvous.options.{name} = {path!r} cannot be read on this node "
                    f"({'missing' if not os.path.exists(path) else 'no read permission'}); "
                    "give every node the file at that path"
                )

    # -- retries -------------------------------------------------------------------------------
    def _retry(self, what: str, fn: Callable[[], T], *, window: float | None = None) -> T:
        """Run ``fn``; while no endpoint answers, retry for ``retry_timeout`` seconds, then fail."""
        window = self.options.retry_timeout if window is None else window
        deadline: float | None = None
        pause = 0.05
        while True:
            try:
                return fn()
            except Unavailable as exc:
                now = time.monotonic()
                deadline = deadline or now + window
                if now >= deadline:
                    raise self._unreachable(what, window, exc) from exc
                time.sleep(min(pause, deadline - now))
                pause = min(pause * 2, 0.5)
            except EtcdRequestError as exc:
                raise RendezvousBackendError(
                    f"etcd refused to {what} for rendezvous {self.run_id!r} ({exc}); check rendezvous.options "
                    "(username, password_env, TLS files) and the etcd user's permissions on "
                    f"{self.options.prefix!r}"
                ) from exc

    def _unreachable(self, what: str, window: float, exc: Exception) -> RendezvousBackendError:
        return RendezvousBackendError(
            f"etcd unreachable: could not {what} for rendezvous {self.run_id!r} within {window:g}s; endpoints "
            f"tried: {', '.join(self.options.endpoints)} (last error: {exc}). Check that etcd runs and that "
            "rendezvous.options.endpoints lists its client URLs"
        )

    def _write(self, what: str, fn: Callable[[int], T], ttl: float | None) -> T:
        """Run a write with the run lease (or a lease of its own for ``ttl``).

        The run lease was created (or found) when this client connected; a write that finds it
        missing (it lapsed: etcd was away longer than ``key_ttl``) creates it again and writes again.
        """
        if ttl is not None:
            lease = self._retry("grant a lease", lambda: self.client.grant(max(1, math.ceil(ttl))))
            return self._retry(what, lambda: fn(lease))
        self._wrote = True
        for _ in range(3):
            try:
                return self._retry(what, lambda: fn(self.lease))
            except LeaseGone:
                self._retry("create the run lease", lambda: self.client.grant(self.options.key_ttl, self.lease))
        raise RendezvousBackendError(f"etcd kept dropping the run lease of rendezvous {self.run_id!r} while writing")

    # -- leases --------------------------------------------------------------------------------
    def _start_keeper(self) -> None:
        """Start the thread that keeps the run lease alive (once)."""
        with self._lease_lock:
            if self._keeper is None and not self._closed:
                self._keeper = threading.Thread(
                    target=self._keep_alive, name=f"rallypoint-etcd-lease-{self.run_id}", daemon=True
                )
                self._keeper.start()

    def _keep_alive(self) -> None:
        """Refresh the run lease every ``key_ttl / 4`` seconds (registering this client again after it lapsed)."""
        period = max(1.0, self.options.key_ttl / 4)
        registered = True  # when it connected
        wait = period
        while not self._stop.wait(wait):
            wait = period
            try:
                if not registered:
                    self.client.put(self._me, b"1", lease=self.lease)
                    registered = True
                elif self.client.keep_alive(self.lease) <= 0:
                    raise LeaseGone(f"run lease {self.lease:x} expired")
            except LeaseGone:
                registered = False  # the next write creates the lease again; then register again
                wait = min(period, 1.0)
            except Exception as exc:  # noqa: BLE001 - retried soon; writes report errors themselves
                log.debug("rendezvous %r: lease keep-alive failed: %s", self.run_id, exc)
                wait = min(period, 1.0)

    # -- protocol ------------------------------------------------------------------------------
    def _load(self, name: str, data: bytes) -> JSONValue:
        try:
            return json.loads(data)
        except ValueError as exc:
            raise RendezvousStateError(
                f"etcd key {name!r} does not hold JSON ({exc}); something else than rallypoint wrote "
                f"under {self.base!r}: choose another rendezvous.options.prefix or namespace, or delete those keys"
            ) from exc

    def _amount(self, key: str, data: bytes) -> int:
        """The amount an arrival of ``key`` holds (written by :meth:`add`: a JSON integer)."""
        try:
            return int(data)  # the digits themselves: a node reads up to N arrivals per answer
        except ValueError:
            return int(self._load(self._kv + key, data))

    def _entries(self, kvs: Mapping[str, KV]) -> dict[str, tuple[Entry, int]]:
        """Rendezvous keys to their entries (value plus live arrivals) and number of arrivals read."""
        n = len(self._kv)
        bases: dict[str, KV] = {}
        arrivals: dict[str, list[KV]] = {}
        for name, kv in kvs.items():
            key, sep, _ = name[n:].partition(_ARRIVAL)
            if sep:
                arrivals.setdefault(key, []).append(kv)
            else:
                bases[key] = kv
        out = {}
        for key, kv in bases.items():
            value = self._load(self._kv + key, kv.value)
            live = [a for a in arrivals.get(key, ()) if a.create_revision >= kv.create_revision]
            if live and isinstance(value, int) and not isinstance(value, bool):
                value += sum(self._amount(key, a.value) for a in live)
            out[key] = (Entry(value, kv.mod_revision), len(live))
        return out

    def _read(self, key: str) -> Entry | None:
        """One key and its arrivals, in one range read."""
        k = self._kv + key
        kvs, _ = self._retry(f"read {k}", lambda: self.client.get_range(k, k + _END))
        found = self._entries(kvs).get(key)
        return None if found is None else found[0]

    def get(self, key: str) -> Entry | None:
        """See :meth:`RendezvousBackend.get`."""
        return self._read(check_key(key))

    def set(self, key: str, value: JSONValue, *, ttl: float | None = None) -> Version:
        """See :meth:`RendezvousBackend.set`."""
        k, data = self._kv + check_key(key), _dump(value)
        clear = (k + _ARRIVAL, k + _END)
        return self._write(f"write {k}", lambda lease: self.client.put_clear(k, data, lease=lease, clear=clear)[0], ttl)

    def compare_and_set(
        self, key: str, value: JSONValue, *, version: Version | None, ttl: float | None = None
    ) -> tuple[bool, Entry | None]:
        """See :meth:`RendezvousBackend.compare_and_set` (one transaction on ``mod_revision``)."""
        k, data = self._kv + check_key(key), _dump(value)
        clear = (k + _ARRIVAL, k + _END)
        rev, current = self._write(
            f"compare-and-set {k}",
            lambda lease: self.client.put_clear(k, data, lease=lease, clear=clear, mod_revision=version),
            ttl,
        )
        if rev:
            return True, Entry(json.loads(data), rev)
        found = self._entries(current).get(key)
        return False, None if found is None else found[0]

    def add(self, key: str, amount: int = 1) -> int:
        """See :meth:`RendezvousBackend.add`: one transaction, whatever other nodes add at the same time.

        It writes an arrival key holding ``amount`` and reads the key with its arrivals (see the
        module's description); sent again after a lost answer, it rewrites the same arrival key.
        """
        k = self._kv + check_key(key)
        amount = int(amount)
        arrival = f"{k}{_ARRIVAL}{uuid.uuid4().hex[:16]}"
        kvs = self._write(
            f"add to {k}",
            lambda lease: self.client.add_arrival(k, arrival, _dump(amount), zero=b"0", lease=lease, end=k + _END),
            None,
        )
        return self._sum(key, kvs, arrival)

    def _sum(self, key: str, kvs: Mapping[str, KV], arrival: str, *, undo: Callable[[], None] | None = None) -> int:
        """The counter ``key`` after an add read back as ``kvs``; folds its arrivals when there are many.

        Raises:
            TypeError: ``key`` holds no integer: the arrival (and what ``undo`` takes back) is removed.
        """
        entry, arrivals = self._entries(kvs)[key]
        if not isinstance(entry.value, int) or isinstance(entry.value, bool):
            self._retry(f"delete {arrival}", lambda: self.client.delete(arrival))
            if undo is not None:
                undo()
            raise TypeError(f"rendezvous key {key!r} holds {entry.value!r}, not an integer; cannot add to it")
        if arrivals > FOLD_AT:
            self._fold(key, entry)
        return int(entry.value)

    def create_and_add(
        self, key: str, value: JSONValue, counter: str, amount: int = 1
    ) -> tuple[bool, Entry | None, int]:
        """See :class:`~rallypoint.rendezvous.backend.SupportsCreateAndAdd`: one transaction (a node's join).

        The compare-and-set of ``key``'s absence with :meth:`add` nested in it: sent again after a
        lost answer, it finds ``key`` there and adds nothing.
        """
        k, c, data = self._kv + check_key(key), self._kv + check_key(counter), _dump(value)
        amount = int(amount)
        arrival = f"{c}{_ARRIVAL}{uuid.uuid4().hex[:16]}"
        revision, kvs = self._write(
            f"join {k}",
            lambda lease: self.client.create_and_add(
                k, data, c, arrival, _dump(amount), zero=b"0", lease=lease, key_end=k + _END, counter_end=c + _END
            ),
            None,
        )
        if not revision:
            found = self._entries(kvs).get(key)
            return False, None if found is None else found[0], 0

        def take_back() -> None:  # the counter holds no integer: the key was never to be written
            self._retry(f"delete {k}", lambda: self.client.delete(k, mod_revision=revision))

        return True, None, self._sum(counter, kvs, arrival, undo=take_back)

    def check_in(
        self, prefix: str, counter: str, *, unless: str, claim: tuple[str, JSONValue] | None = None
    ) -> CheckIn:
        """See :class:`~rallypoint.rendezvous.backend.SupportsCheckIn`: one transaction (a node's first request).

        The claim key must hold exactly the bytes this backend writes for the claim's value (a
        value equal as JSON but written otherwise adds nothing; the caller then adds). Sent again
        after a lost answer, it finds its claim there and rewrites the same arrival key: it
        counts once.
        """
        p, marker = self._kv + check_key(prefix, prefix=True), self._kv + check_key(unless)
        c = self._kv + check_key(counter)
        arrival = f"{c}{_ARRIVAL}{uuid.uuid4().hex[:16]}"
        wanted = None if claim is None else (self._kv + check_key(claim[0]), _dump(claim[1]))
        found, counted, held = self._write(
            f"check in under {p}",
            lambda lease: self.client.check_in(
                (p, prefix_end(p)), marker, (c, arrival, b"1", c + _END), lease=lease, claim=wanted
            ),
            None,
        )
        entries = {key: entry for key, (entry, _) in self._entries(found).items()}
        claimed = None
        if held is not None and wanted is not None:
            claimed = Entry(self._load(wanted[0], held.value), held.mod_revision)
        return CheckIn(entries, None if counted is None else self._sum(counter, counted, arrival), claimed)

    def _fold(self, key: str, entry: Entry) -> None:
        """Replace the key's arrivals by their sum (once; a concurrent write wins, and the next add folds)."""
        k, data = self._kv + key, _dump(entry.value)
        clear = (k + _ARRIVAL, k + _END)
        with contextlib.suppress(RendezvousBackendError):
            self._write(
                f"fold the arrivals of {k}",
                lambda lease: self.client.put_clear(k, data, lease=lease, clear=clear, mod_revision=entry.version),
                None,
            )

    def delete(self, key: str, *, version: Version | None = None) -> bool:
        """See :meth:`RendezvousBackend.delete` (the key and its arrivals, in one request)."""
        k = self._kv + check_key(key)
        return self._retry(f"delete {k}", lambda: self.client.delete(k, end=k + _END, mod_revision=version))

    def list(self, prefix: str) -> dict[str, Entry]:
        """See :meth:`RendezvousBackend.list` (one range read)."""
        p = self._kv + check_key(prefix, prefix=True)
        kvs, _ = self._retry(f"list {p}", lambda: self.client.get_range(p, prefix_end(p)))
        return {key: entry for key, (entry, _) in self._entries(kvs).items()}

    def watch(self, key: str, *, version: Version | None, timeout: float) -> bool:
        """See :meth:`RendezvousBackend.watch` (an etcd watch from the revision of the read)."""
        k = self._kv + check_key(key)

        def read() -> tuple[bool, int]:
            kv, rev = self.client.get(k)
            return (None if kv is None else kv.mod_revision) != version, rev

        return self._wait(k, False, read, timeout)

    def watch_prefix(self, prefix: str, *, versions: Mapping[str, Version], timeout: float) -> bool:
        """See :meth:`RendezvousBackend.watch_prefix` (an etcd watch on the prefix range)."""
        p = self._kv + check_key(prefix, prefix=True)
        n = len(self._kv)
        known = dict(versions)

        def read() -> tuple[bool, int]:
            kvs, rev = self.client.get_prefix(p)
            versions = {k[n:]: kv.mod_revision for k, kv in kvs.items() if _ARRIVAL not in k[n:]}
            return versions != known, rev

        return self._wait(p, True, read, timeout)

    def hold_watch(self, key: str, *, timeout: float) -> _HeldWatch:
        """See :class:`~rallypoint.rendezvous.backend.SupportsHeldWatch`: an etcd watch stream, kept open.

        The change it reports carries the key's new value from the watch event itself.
        """
        k = self._kv + check_key(key)
        timeout = max(0.0, timeout)
        until = time.monotonic() + timeout
        stream = self._retry(f"watch {k}", lambda: self.client.hold(k, timeout=timeout), window=0)
        return _HeldWatch(self, k, stream, until)

    def _wait(self, key: str, prefix: bool, read: Callable[[], tuple[bool, int]], timeout: float) -> bool:
        """Watch from now, then read: unless already changed, wait for an event or ``timeout``.

        A broken watch (etcd restarting) reads (within ``retry_timeout``) and watches again.
        """
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            left = deadline - time.monotonic()
            if left > 0:
                try:
                    return self._retry(
                        f"watch {key}",
                        lambda left=left: self.client.wait(  # type: ignore[misc]
                            key, prefix=prefix, timeout=left, changed=lambda: read()[0]
                        ),
                        window=0,
                    )
                except RendezvousBackendError:
                    pass
            changed, _ = self._retry(f"read {key}", read)
            left = deadline - time.monotonic()
            if changed or left <= 0:
                return changed
            time.sleep(min(0.1, left))

    def close(self, *, wait: float | None = None) -> None:
        """Stop keeping the run lease alive and close the connection.

        When the job is over (the round header says closed) and no other client is open, the run
        lease is revoked: every key of the run goes at once. The data of a running job stays.

        Args:
            wait: how long to retry the clean-up while etcd does not answer (``retry_timeout``).
        """
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        _OPEN.discard(self)
        try:
            self._retry("clean up", self._clean_up, window=wait)
        except Exception as exc:  # noqa: BLE001 - the keys then expire with the lease
            log.info("rendezvous %r: clean-up skipped (%s); keys expire with the run lease", self.run_id, exc)
        finally:
            self.client.close()

    def _clean_up(self) -> None:
        self.client.delete(self._me)
        if not self._wrote:
            return  # never wrote: leave the run as it is
        header, _ = self.client.get(self._kv + _HEADER)
        others, _ = self.client.get_prefix(self.base + "meta/clients/")
        try:
            closed = header is not None and bool(json.loads(header.value).get("closed"))
        except (ValueError, AttributeError):
            closed = False
        if closed and not others:
            with contextlib.suppress(LeaseGone):  # another client revoked it just now
                self.client.revoke(self.lease)


class _HeldWatch:
    """A :class:`~rallypoint.rendezvous.backend.HeldWatch` on one etcd key (see :meth:`EtcdBackend.hold_watch`)."""

    def __init__(self, backend: EtcdBackend, key: str, stream: Any, until: float) -> None:
        self._backend = backend
        self._key = key
        self._stream = stream
        self._until = until

    def remaining(self) -> float:
        """Seconds until the stream's deadline."""
        return max(0.0, self._until - time.monotonic())

    def wait(self, version: Version | None) -> WatchedChange | None:
        """The first change after ``version``, with the key's new entry; ``None`` at the deadline."""
        b = self._backend
        while True:
            try:
                changes = b.client.changes(self._stream, self._key)
            except (Unavailable, EtcdRequestError) as exc:
                raise RendezvousBackendError(f"the etcd watch of {self._key!r} broke: {exc}") from exc
            if changes is None:
                return None
            # Skip what the caller saw already (revisions only grow; a deletion's is its own).
            fresh = [(kv, revision) for kv, revision in changes if version is None or revision > version]
            if fresh:
                kv, _ = fresh[-1]
                return WatchedChange(None if kv is None else Entry(b._load(self._key, kv.value), kv.mod_revision))

    def close(self) -> None:
        """Cancel the stream."""
        self._stream.cancel()


def create_etcd_backend(run_id: str, options: Any) -> EtcdBackend:
    """Factory of the ``etcd`` backend record: ``(run_id, options) -> backend``."""
    opts = options if isinstance(options, EtcdOptions) else EtcdOptions.model_validate(dict(options or {}))
    return EtcdBackend(run_id, opts)
