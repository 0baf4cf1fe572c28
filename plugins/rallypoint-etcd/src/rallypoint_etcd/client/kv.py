"""etcd's KV service: reads with the revision they saw, writes, and the backend's transactions.

The transactions compare a key's ``mod_revision`` or ``create_revision`` (compare-and-set,
create-if-absent, compare-and-delete) and nest an add in a create or a check-in, so that each of
the backend's steps is one request; their messages are built by :mod:`rallypoint_etcd.client.messages`.
"""

from __future__ import annotations

from typing import Any, Literal

import etcd3.etcdrpc  # type: ignore[import-untyped]
import grpc

from rallypoint_etcd.client.connection import EtcdConnection
from rallypoint_etcd.client.messages import KV, add_request, compare_revision, delete_op, kvs, put_op, range_op

__all__ = ["KVRequests"]


class KVRequests(EtcdConnection):
    """The key-value requests, sent over the connection."""

    def get(self, key: str) -> tuple[KV | None, int]:
        """The key (or ``None``) and the store's revision at the time of the read."""
        resp = self._call("get", lambda c: c.get_response(key))
        return kvs(resp.kvs).get(key), resp.header.revision

    def get_prefix(self, prefix: str) -> tuple[dict[str, KV], int]:
        """Every key under ``prefix`` and the store's revision at the time of the read."""
        resp = self._call("range", lambda c: c.get_prefix_response(prefix))
        return kvs(resp.kvs), resp.header.revision

    def get_range(self, key: str, end: str) -> tuple[dict[str, KV], int]:
        """Every key in ``[key, end)`` and the store's revision at the time of the read."""
        resp = self._call("range", lambda c: c.get_response(key, range_end=end))
        return kvs(resp.kvs), resp.header.revision

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
            compare = [compare_revision(key, "CREATE", 0)]
        else:
            compare = [compare_revision(key, "MOD", int(mod_revision))]
        success = [put_op(key, value, lease), delete_op(*clear)]
        resp = self._txn(compare, success, [range_op(key, clear[1])])
        if resp.succeeded:
            return int(resp.header.revision), {}
        return 0, kvs(resp.responses[0].response_range.kvs)

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
        add = add_request(key, arrival, amount, zero, lease, end)
        resp = self._txn(list(add.compare), list(add.success), list(add.failure))
        return kvs(resp.responses[-1].response_range.kvs)

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
        add = add_request(counter, arrival, amount, zero, lease, counter_end)
        resp = self._txn(
            [compare_revision(key, "CREATE", 0)],
            [put_op(key, value, lease), etcd3.etcdrpc.RequestOp(request_txn=add)],
            [range_op(key, key_end)],
        )
        if not resp.succeeded:
            return 0, kvs(resp.responses[0].response_range.kvs)
        nested = resp.responses[1].response_txn
        return int(resp.header.revision), kvs(nested.responses[-1].response_range.kvs)

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
        adding = etcd3.etcdrpc.RequestOp(request_txn=add_request(counter, arrival, amount, b"0", lease, end))
        reading = range_op(*read)
        if claim is None:
            resp = self._txn([compare_revision(unless, "CREATE", 0)], [reading, adding], [reading])
            found = kvs(resp.responses[0].response_range.kvs)
            if not resp.succeeded:
                return found, None, None
            return found, kvs(resp.responses[1].response_txn.responses[-1].response_range.kvs), None
        key, value = claim
        same = etcd3.etcdrpc.Compare(
            key=key.encode(), target=etcd3.etcdrpc.Compare.VALUE, result=etcd3.etcdrpc.Compare.EQUAL, value=value
        )
        add_if_same = etcd3.etcdrpc.TxnRequest(compare=[compare_revision(unless, "CREATE", 0), same], success=[adding])
        resp = self._txn(
            [compare_revision(unless, "CREATE", 0), compare_revision(key, "CREATE", 0)],
            [reading, put_op(key, value, lease), adding],
            [reading, range_op(key, ""), etcd3.etcdrpc.RequestOp(request_txn=add_if_same)],
        )
        found = kvs(resp.responses[0].response_range.kvs)
        if resp.succeeded:
            counted = kvs(resp.responses[2].response_txn.responses[-1].response_range.kvs)
            revision = int(resp.header.revision)
            return found, counted, KV(value, revision, revision)
        claimed = kvs(resp.responses[1].response_range.kvs).get(key)
        nested = resp.responses[2].response_txn
        if not nested.succeeded:
            return found, None, claimed
        return found, kvs(nested.responses[0].response_txn.responses[-1].response_range.kvs), claimed

    def delete(self, key: str, *, end: str | None = None, mod_revision: int | None = None) -> bool:
        """Delete ``key`` (with ``end``: the keys in ``[key, end)``), only at ``mod_revision`` when given.

        Returns:
            whether ``key`` itself existed (and, with ``mod_revision``, was at it) and was deleted.
        """
        if end is None and mod_revision is None:
            return bool(self._call("delete", lambda c: c.delete(key)))
        if mod_revision is None:
            compare = [compare_revision(key, "CREATE", 0, "GREATER")]
            resp = self._txn(compare, [delete_op(key, end)], [delete_op(key, end)])
        else:
            resp = self._txn([compare_revision(key, "MOD", mod_revision)], [delete_op(key, end)], [])
        return bool(resp.succeeded)
