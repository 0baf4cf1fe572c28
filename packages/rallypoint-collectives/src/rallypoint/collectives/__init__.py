"""rallypoint collectives: worker-side process-group initialisation and a collective facade.

Hook specifications live in :mod:`rallypoint.collectives.hookspecs`. Importing this package does
not import torch.
"""

from rallypoint.collectives.records import Availability, CollectiveBackendRecord

__all__ = ["Availability", "CollectiveBackendRecord"]
