"""rallypoint hooks of the etcd plugin: registers the ``etcd`` rendezvous backend.

Nothing heavy is imported here: the options model is plain pydantic, and the backend (with the
etcd client and gRPC) loads only when the backend is selected.
"""

from __future__ import annotations

from rallypoint.core.plugins import hookimpl
from rallypoint.rendezvous.records import RendezvousBackendRecord


@hookimpl
def rallypoint_rendezvous_backends() -> list[RendezvousBackendRecord]:
    """The ``etcd`` backend: an etcd v3 cluster (transactions, watches, leases)."""
    from rallypoint_etcd.options import EtcdOptions

    return [
        RendezvousBackendRecord(
            name="etcd",
            summary="an etcd v3 cluster: transactions, watches, leases",
            factory="rallypoint_etcd.backend:create_etcd_backend",
            options_model=EtcdOptions,
            endpoint_option="endpoints",
        )
    ]
