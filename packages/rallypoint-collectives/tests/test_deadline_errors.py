"""An error raised while waiting under a :class:`Deadline` is not chained to an internal ``TypeError`` (#41).

The facade tells a Deadline from seconds by the ``TypeError`` converting it raises; the wait under
the Deadline used to run inside that ``except``, so every error of it (a timeout, a broken group)
printed "During handling of the above exception ... TypeError ... Deadline" first.
"""

from __future__ import annotations

import pytest

from rallypoint.collectives.state import GroupInfo
from rallypoint.collectives.timeouts import Deadline
from rallypoint.collectives.waiting import complete


class _Broken(RuntimeError):
    pass


class _FailingWork:
    """A torch work whose wait fails as a broken group would."""

    def wait(self, timeout: object = None) -> bool:
        raise _Broken("the group broke")


def _info() -> GroupInfo:
    info = GroupInfo.__new__(GroupInfo)
    info.group, info.stream_ordered, info.blocking, info.seq = None, False, True, 0
    return info


@pytest.mark.parametrize("peer", [None, 1], ids=["collective", "point-to-point"])
def test_an_error_under_a_deadline_carries_no_internal_type_error(peer) -> None:
    with pytest.raises(_Broken) as info:
        complete(_FailingWork(), "recv" if peer else "barrier", _info(), 1, Deadline(5), peer)  # type: ignore[arg-type]
    assert info.value.__context__ is None, f"chained to {info.value.__context__!r}"
