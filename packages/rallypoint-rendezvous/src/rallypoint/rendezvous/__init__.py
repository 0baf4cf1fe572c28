"""rallypoint rendezvous: how agents on many hosts agree on who is in the job and in which order.

Hook specifications live in :mod:`rallypoint.rendezvous.hookspecs`; backends register
:class:`~rallypoint.rendezvous.records.RendezvousBackendRecord` records.
"""

from rallypoint.rendezvous.records import RendezvousBackendRecord

__all__ = ["RendezvousBackendRecord"]
