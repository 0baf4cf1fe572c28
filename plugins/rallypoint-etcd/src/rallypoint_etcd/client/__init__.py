"""The thin seam between the etcd backend and an etcd v3 client library.

:class:`EtcdClient` is everything :mod:`rallypoint_etcd.backend` asks of etcd: reads with the
revision they saw, puts, compare-and-set and compare-and-delete transactions on a key's
``mod_revision``, leases, and a watch from a given revision. It is built on the ``etcd3`` module
(python-etcd3's API, shipped by the ``etcd3-fc`` distribution); the transactions that the library's
helpers cannot express (a range compare, a put that keeps the key's value and lease) are built
from its protocol messages (``etcd3.etcdrpc``) and sent through its stub. Another client library
can take its place by reimplementing this package. Only this package imports ``etcd3`` and
``grpc``, and only the backend imports it (the agent and the CLI never load them at start-up).

One module per job, in the order etcd's own API groups them:

- :mod:`~rallypoint_etcd.client.connection`: the channels to the endpoints, failover, and the
  one door every request goes through (:meth:`~rallypoint_etcd.client.connection.EtcdConnection._call`);
- :mod:`~rallypoint_etcd.client.errors`: the three errors below and the translation of the
  library's errors into them;
- :mod:`~rallypoint_etcd.client.messages`: :class:`KV`, key ranges and the protocol messages of
  the transactions;
- :mod:`~rallypoint_etcd.client.kv` (reads, writes, transactions),
  :mod:`~rallypoint_etcd.client.lease` and :mod:`~rallypoint_etcd.client.watch`: etcd's KV, Lease
  and Watch services, each a class over the connection; :class:`EtcdClient` is all three.

Errors: :class:`Unavailable` when no endpoint answered (the caller retries), :class:`LeaseGone`
when a lease expired, :class:`EtcdRequestError` for anything else (refused, bad request).

Importing this package first sets gRPC's process settings, before ``grpc`` is imported (every
module of the package imports ``etcd3``, which imports ``grpc``).
"""

from __future__ import annotations

import os

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

from rallypoint_etcd.client.errors import EtcdRequestError, LeaseGone, Unavailable
from rallypoint_etcd.client.kv import KVRequests
from rallypoint_etcd.client.lease import LeaseRequests
from rallypoint_etcd.client.messages import KV, prefix_end
from rallypoint_etcd.client.watch import WatchRequests

__all__ = ["KV", "EtcdClient", "EtcdRequestError", "LeaseGone", "Unavailable", "prefix_end"]


class EtcdClient(KVRequests, LeaseRequests, WatchRequests):
    """One connection (one gRPC channel per endpoint) to an etcd cluster, and every request the backend sends.

    A request goes to the endpoint in use; when it fails for lack of an answer, that endpoint is
    skipped for :data:`~rallypoint_etcd.client.connection.ENDPOINT_RETRY` seconds and the next
    request goes to another one.

    Args:
        options: endpoints, TLS files, credentials and the per-request timeout.
    """
