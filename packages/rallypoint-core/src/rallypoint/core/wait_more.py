"""``WaitMore``: the one answer "keep waiting" to a timeout, shared by every subsystem that asks.

A timeout that a plugin or the user may extend (a rendezvous that found too few nodes, a
collective that some ranks have not reached) asks a hook or handler what to do; ``WaitMore(s)``
means: wait ``s`` seconds more, then ask again. Each subsystem says how often and how long it
honours the answer (its own caps) and what its other answers are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["WaitMore"]


@dataclass(frozen=True)
class WaitMore:
    """Keep waiting ``seconds`` more before the timeout expires again.

    Attributes:
        seconds: how long (> 0, finite).
    """

    seconds: float

    def __post_init__(self) -> None:
        if not (isinstance(self.seconds, int | float) and 0 < self.seconds < math.inf):
            raise ValueError(f"WaitMore(seconds): expected a finite number of seconds > 0, got {self.seconds!r}")
