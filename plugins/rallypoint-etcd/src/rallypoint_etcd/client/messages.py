"""What etcd's answers and transactions are made of: stored keys, key ranges, protocol messages.

:class:`KV` is a stored key as the requests return it; :func:`prefix_end` ends a key range. The
other functions build the protocol messages (``etcd3.etcdrpc``) of the transactions that the
client library's helpers cannot express: a range compare, a put that keeps the key's value and
lease, a transaction nested in another (see :mod:`rallypoint_etcd.client.kv`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import etcd3.etcdrpc  # type: ignore[import-untyped]
import etcd3.utils  # type: ignore[import-untyped]

__all__ = ["KV", "add_request", "compare_revision", "delete_op", "kvs", "prefix_end", "put_op", "range_op"]


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


def kvs(found: Any) -> dict[str, KV]:
    """The keys of an answer (its ``kvs`` field) by name."""
    return {kv.key.decode(): KV(kv.value, kv.mod_revision, kv.create_revision) for kv in found}


def range_op(key: str, end: str) -> Any:
    """A read of the keys in ``[key, end)``."""
    return etcd3.etcdrpc.RequestOp(request_range=etcd3.etcdrpc.RangeRequest(key=key.encode(), range_end=end.encode()))


def put_op(key: str, value: bytes | None, lease: int | None) -> Any:
    """A put; ``value=None``: keep the key's value and lease (the key must exist)."""
    if value is None:
        request = etcd3.etcdrpc.PutRequest(key=key.encode(), ignore_value=True, ignore_lease=True)
    else:
        request = etcd3.etcdrpc.PutRequest(key=key.encode(), value=value, lease=lease or 0)
    return etcd3.etcdrpc.RequestOp(request_put=request)


def delete_op(key: str, end: str | None = None) -> Any:
    """A delete of ``key`` (with ``end``: of the keys in ``[key, end)``)."""
    request = etcd3.etcdrpc.DeleteRangeRequest(key=key.encode(), range_end=b"" if end is None else end.encode())
    return etcd3.etcdrpc.RequestOp(request_delete_range=request)


def compare_revision(key: str, target: str, value: int, result: str = "EQUAL") -> Any:
    """``target`` (``MOD`` or ``CREATE`` revision) of ``key`` compared with ``value``."""
    c = etcd3.etcdrpc.Compare
    field = {"MOD": "mod_revision", "CREATE": "create_revision"}[target]
    return c(key=key.encode(), target=getattr(c, target), result=getattr(c, result), **{field: value})


def add_request(key: str, arrival: str, amount: bytes, zero: bytes, lease: int | None, end: str) -> Any:
    """The transaction of an add (see :meth:`~rallypoint_etcd.client.kv.KVRequests.add_arrival`).

    Its last operation reads ``[key, end)``.
    """
    return etcd3.etcdrpc.TxnRequest(
        compare=[compare_revision(key, "CREATE", 0, "GREATER")],
        success=[put_op(arrival, amount, lease), put_op(key, None, None), range_op(key, end)],
        failure=[put_op(key, zero, lease), put_op(arrival, amount, lease), range_op(key, end)],
    )
