"""etcd's Lease service: grant a lease, keep it alive, revoke it (and with it the keys attached)."""

from __future__ import annotations

from typing import Any

import etcd3.exceptions  # type: ignore[import-untyped]

from rallypoint_etcd.client.connection import EtcdConnection

__all__ = ["LeaseRequests"]


class LeaseRequests(EtcdConnection):
    """The lease requests, sent over the connection."""

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
