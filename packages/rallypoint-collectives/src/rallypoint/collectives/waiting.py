"""The waiting and timeout engine behind every facade call.

How a call is timed (see ``docs/collectives.md``):

* **Blocking backends (Gloo)**: the call is issued asynchronously and waited for with
  ``Work.wait(timeout)``, which is what torch's synchronous path does anyway minus the timeout.
  A call that outlasts a short probe (:data:`~rallypoint.collectives.state.PROBE`) announces its
  arrival on the job's store (one key per rank and call); a call that outlasts its timeout reads
  those announcements and raises :class:`CollectiveTimeout` naming the ranks that never announced.
* **Stream-ordered backends (NCCL)**: without an explicit ``timeout=`` the call is exactly
  torch's (the CPU does not wait; torch's NCCL watchdog enforces the process group's timeout,
  which ``init()`` sets to the job default). With ``timeout=`` the CPU polls the work until it
  completes or the timeout passes, announcing and diagnosing the same way.

Which kind a group is comes from its backend record's ``stream_ordered`` field. Every collective
wrapper ends in :func:`finish_collective`, the one shared fast path. Importing this module
imports torch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch.distributed as _dist

from rallypoint.collectives.broken import mark_broken
from rallypoint.collectives.errors import CollectiveTimeout, format_ranks
from rallypoint.collectives.hang_request import ANSWER_WAIT, ask_agent
from rallypoint.collectives.state import PROBE, STATE, GroupInfo
from rallypoint.collectives.timeouts import MIN_WAIT, Deadline, TimeoutEvent, TimeoutHandler, decide

__all__ = ["Work", "complete", "finish_collective"]

log = logging.getLogger("rallypoint.collectives")

_KEY_PREFIX = "rallypoint/collectives"


def _is_timeout(exc: BaseException) -> bool:
    return "timed out" in str(exc).lower()


def finish_collective(
    work: _dist.Work | None,
    op: str,
    info: GroupInfo,
    async_op: bool,
    timeout: float | Deadline | None,
    result: Any,
    on_timeout: TimeoutHandler | None = None,
) -> Any:
    """The one path every collective wrapper shares, after it has issued torch's call.

    Wrappers issue the call asynchronously (``async_op=True`` to torch) unless the group is
    stream-ordered and the call is synchronous without ``timeout=``: torch's synchronous call
    is then the whole story, and ``work`` is ``None``. So every wrapper is::

        info = GROUPS.get(group) or group_info(group)
        work = torch_call(..., group, info.blocking or async_op or timeout is not None)
        return finish_collective(work, "name", info, async_op, timeout, result, on_timeout)

    Here the call is counted, then handed back as a :class:`Work` (``async_op``) or completed.
    The fast path (a synchronous call without ``timeout=`` on a blocking backend) is one
    ``wait(probe)``. The call is issued by the wrapper itself, not through ``call(*args)``:
    that indirection measured about 1 us more per call (CPython 3.11, torch 2.13).

    Args:
        work: what torch returned (``None``: already complete, or not a member of the group).
        op: the operation's name, for errors (``"all_reduce"``).
        info: the group's :class:`~rallypoint.collectives.state.GroupInfo`.
        async_op: hand back a :class:`Work` instead of waiting.
        timeout: seconds, a :class:`~rallypoint.collectives.timeouts.Deadline`, or ``None``
            for the job default.
        result: what the synchronous call returns (the output tensor or tensors).
        on_timeout: the call's own timeout handler (default: the process-wide one).
    """
    info.seq += 1
    if work is None:
        return result
    if async_op:
        return Work(work, op, info, info.seq, timeout, None, result, on_timeout)
    if timeout is None and info.blocking:  # the fast path
        try:
            work.wait(STATE.probe_td)
            return result
        except RuntimeError as exc:
            if not _is_timeout(exc):
                raise
        _slow_wait(work, op, info, info.seq, STATE.default, STATE.probe, on_timeout)
        return result
    complete(work, op, info, info.seq, timeout, None, on_timeout)
    return result


class Work:
    """An asynchronous call in flight, as returned with ``async_op=True``, ``isend`` and ``irecv``.

    Wraps torch's ``Work``; :meth:`wait` applies the facade's timeout rules and raises
    :class:`CollectiveTimeout` instead of hanging.
    """

    __slots__ = ("_info", "_on_timeout", "_op", "_peer", "_result", "_seq", "_timeout", "work")

    def __init__(
        self,
        work: _dist.Work,
        op: str,
        info: GroupInfo,
        seq: int,
        timeout: float | Deadline | None,
        peer: int | None,
        result: Any = None,
        on_timeout: TimeoutHandler | None = None,
    ) -> None:
        self.work = work
        self._op = op
        self._info = info
        self._seq = seq
        self._timeout = timeout
        self._peer = peer
        self._result = result
        self._on_timeout = on_timeout

    def wait(self, timeout: float | Deadline | None = None) -> bool:
        """Block until the call completes (``True``), or raise :class:`CollectiveTimeout`.

        Args:
            timeout: seconds or a :class:`~rallypoint.collectives.timeouts.Deadline`; default:
                the ``timeout=`` given to the call, else the job default.
        """
        seconds = self._timeout if timeout is None else timeout
        complete(self.work, self._op, self._info, self._seq, seconds, self._peer, self._on_timeout)
        return True

    def is_completed(self) -> bool:
        """Whether the call has completed (never blocks)."""
        return bool(self.work.is_completed())

    def result(self) -> Any:
        """What the synchronous call would have returned (the output tensor or tensors)."""
        return self._result

    def source_rank(self) -> int:
        """For an ``irecv`` from any source: the global rank of the sender (after :meth:`wait`)."""
        group_src = int(self.work._source_rank())
        return _dist.get_global_rank(self._info.pg, group_src) if self._info.group is not None else group_src

    def __repr__(self) -> str:
        return f"<rallypoint Work {self._op} completed={self.is_completed()}>"


def complete(
    work: _dist.Work,
    op: str,
    info: GroupInfo,
    seq: int,
    timeout: float | Deadline | None,
    peer: int | None = None,
    on_timeout: TimeoutHandler | None = None,
    dl: Deadline | None = None,
) -> None:
    """Wait for ``work`` (call ``seq`` on ``info``'s group, or point-to-point with ``peer``).

    Args:
        work: torch's work.
        op: the operation's name, for errors.
        info: the group.
        seq: the call's number on the group.
        timeout: seconds, a :class:`Deadline` (wait what is left of it), or ``None`` (the job's).
        peer: the peer of a point-to-point call (``-1``: any), ``None`` for a collective.
        on_timeout: the call's handler (default: the process-wide one).
        dl: the deadline ``timeout`` was taken from (internal).

    Raises:
        CollectiveTimeout: it did not complete within ``timeout`` (default: the job's), naming
            the ranks that did not arrive, and the timeout handler did not wait it out.
    """
    # A Deadline (or anything else that is not a number) is recognised where a number is
    # converted, by the TypeError there: numbers and None pay nothing for it.
    if info.stream_ordered:
        if timeout is None:  # torch semantics: the watchdog enforces the group's timeout
            work.wait()
        elif isinstance(timeout, int | float):
            _poll_wait(work, op, info, seq, timeout, peer, on_timeout, dl)
        else:
            _complete_under(work, op, info, seq, timeout, peer, on_timeout)
        return
    if peer is not None:  # point-to-point: the missing rank is the peer; one wait
        seconds: float = STATE.default if timeout is None else timeout  # type: ignore[assignment]
        try:
            td = STATE.td(seconds)
        except TypeError:
            td = None  # a Deadline: waited for outside the handler, so its errors carry no TypeError
        if td is None:
            _complete_under(work, op, info, seq, timeout, peer, on_timeout)
            return
        try:
            work.wait(td)
        except RuntimeError as exc:
            if not _is_timeout(exc):
                raise
            # Gloo has closed the connection to the peer: the handler cannot wait more.
            started = time.monotonic() - seconds
            _expire(_p2p_timeout(op, info, peer, seconds), info, started, seconds, 1, False, on_timeout, dl, peer)
        return
    if timeout is None:
        seconds, probe, probe_td = STATE.default, STATE.probe, STATE.probe_td
    else:
        try:
            seconds, probe = timeout, min(PROBE, timeout)  # type: ignore[assignment,type-var]
            numeric = True
        except TypeError:
            numeric = False  # a Deadline: waited for outside the handler (no chained TypeError)
        if not numeric:
            _complete_under(work, op, info, seq, timeout, peer, on_timeout)
            return
        probe_td = timedelta(seconds=probe)
    try:
        work.wait(probe_td)
        return
    except RuntimeError as exc:
        if not _is_timeout(exc):
            raise
    _slow_wait(work, op, info, seq, seconds, probe, on_timeout, dl)


def _complete_under(
    work: _dist.Work,
    op: str,
    info: GroupInfo,
    seq: int,
    dl: object,
    peer: int | None,
    on_timeout: TimeoutHandler | None,
) -> None:
    """:func:`complete` with what is left of ``dl`` (its clock starts now if it had not)."""
    if not isinstance(dl, Deadline):
        raise TypeError(f"{op}: timeout= must be seconds, a rallypoint.collectives.Deadline or None, not {dl!r}")
    dl.close()
    started = time.monotonic()
    complete(work, op, info, seq, max(MIN_WAIT, round(dl.remaining(), 3)), peer, on_timeout, dl)
    dl.record(_label(op, info, peer), time.monotonic() - started)


def _label(op: str, info: GroupInfo, peer: int | None) -> str:
    if peer is None:
        try:
            return f"{op} on {info.name()}"
        except Exception:  # noqa: BLE001 - the group is gone; the name is only for the message
            return op
    if peer < 0:
        return f"{op} from any rank"
    return f"{op} {'to' if op in ('send', 'isend') else 'from'} rank {peer}"


def _waited(work: _dist.Work, seconds: float) -> bool:
    """Wait up to ``seconds``: ``True`` if the call completed, ``False`` if the wait expired."""
    try:
        work.wait(timedelta(seconds=max(MIN_WAIT, seconds)))
    except RuntimeError as exc:
        if not _is_timeout(exc):
            raise
        return False
    return True


def _slow_wait(
    work: _dist.Work,
    op: str,
    info: GroupInfo,
    seq: int,
    timeout: float,
    waited: float,
    on_timeout: TimeoutHandler | None = None,
    dl: Deadline | None = None,
) -> None:
    started = time.monotonic() - waited
    key = _announce(info, seq, op)
    remaining = timeout - waited
    if remaining > 0 and _waited(work, remaining):
        _withdraw(key)
        return
    attempt, allowed = 1, timeout
    while True:
        err = _diagnose(op, info, seq, allowed)
        extra = _expire(err, info, started, timeout, attempt, attempt == 1, on_timeout, dl, None)
        attempt, allowed = attempt + 1, allowed + extra
        if _waited(work, extra):
            _withdraw(key)
            return


def _poll_wait(
    work: _dist.Work,
    op: str,
    info: GroupInfo,
    seq: int,
    timeout: float,
    peer: int | None,
    on_timeout: TimeoutHandler | None = None,
    dl: Deadline | None = None,
) -> None:
    start = time.monotonic()
    deadline = start + timeout
    key: str | None = None
    pause = 0.0001
    attempt, allowed = 1, timeout
    while not work.is_completed():
        now = time.monotonic()
        if key is None and peer is None and now - start >= min(PROBE, timeout):
            key = _announce(info, seq, op)
        if now >= deadline:
            if peer is not None:
                err = _p2p_timeout(op, info, peer, allowed)
            else:
                if key is None:
                    key = _announce(info, seq, op)
                err = _diagnose(op, info, seq, allowed)
            more = _expire(err, info, start, timeout, attempt, attempt == 1, on_timeout, dl, peer)
            deadline = time.monotonic() + more
            attempt, allowed = attempt + 1, allowed + more
        time.sleep(pause)
        pause = min(pause * 2, 0.01)
    work.wait()
    if key is not None:
        _withdraw(key)


def _expire(
    err: CollectiveTimeout,
    info: GroupInfo,
    started: float,
    timeout: float,
    attempt: int,
    can_wait_more: bool,
    on_timeout: TimeoutHandler | None,
    dl: Deadline | None,
    peer: int | None,
) -> float:
    """A wait expired: ask the timeout handler; return the seconds to wait more, or raise.

    The group is marked broken only when the call gives up (the error is raised, or the
    handler ends the process), never while the handler waits more.
    """
    elapsed = time.monotonic() - started
    event = TimeoutEvent(
        err.op, err.group, err.group_ranks, err.missing, err.arrived, err.rank, elapsed, timeout, dl, attempt,
        can_wait_more, err,
    )  # fmt: skip
    try:
        extra = decide(event, on_timeout)
    except BaseException as exc:
        if isinstance(exc, SystemExit):  # the handler ends the process: the agent reports the hang first
            ask_agent(err, wait=0.0 if peer is not None else ANSWER_WAIT)
        _broken(info)
        raise
    if extra is not None:
        return extra
    # before the group is given up: the other ranks still wait, as the report shows (#40). A Gloo
    # point-to-point wait closed the connection to its peer as it expired: the peer fails at once,
    # so this rank does not wait for the report (its failure must come first, not the peer's)
    ask_agent(err, wait=0.0 if peer is not None else ANSWER_WAIT)
    _broken(info)
    if dl is not None:
        dl.record(_label(err.op, info, peer), elapsed, True)
        err = _with_detail(err, dl.describe())
    raise err


def _with_detail(err: CollectiveTimeout, more: str) -> CollectiveTimeout:
    return CollectiveTimeout(
        op=err.op,
        group=err.group,
        group_ranks=err.group_ranks,
        missing=err.missing,
        arrived=err.arrived,
        rank=err.rank,
        timeout=err.timeout,
        detail=f"{err.detail}; {more}" if err.detail else more,
    )


# ------------------------------------------------------------------------------------------------
# Announcing arrivals on the job's store, and naming who never announced


def _store() -> Any:
    return _dist.distributed_c10d._get_default_store()


def _key(info: GroupInfo, seq: int, rank: int) -> str:
    name = _dist.distributed_c10d._get_process_group_name(info.pg)
    return f"{_KEY_PREFIX}/{name}/{seq}/{rank}"


def _announce(info: GroupInfo, seq: int, op: str) -> str | None:
    """Tell the other ranks that this one reached call ``seq`` of the group (slow path only)."""
    try:
        key = _key(info, seq, _dist.get_rank())
        _store().set(key, op)
    except Exception as exc:  # noqa: BLE001 - the diagnosis degrades, the call goes on
        log.debug("collectives: could not announce arrival: %s", exc)
        return None
    return key


def _withdraw(key: str | None) -> None:
    if key is None:
        return
    try:
        _store().delete_key(key)
    except Exception as exc:  # noqa: BLE001 - a leftover key is harmless
        log.debug("collectives: could not delete %s: %s", key, exc)


def _grace() -> float:
    """How long to keep reading announcements after the timeout.

    A rank that arrived just before the deadline announces at most one probe later.
    """
    return min(PROBE, STATE.probe) + 0.3


def _read_arrivals(info: GroupInfo, seq: int, ranks: Sequence[int]) -> dict[int, str]:
    """The announcements of call ``seq``: rank -> operation, read for :func:`_grace` seconds."""
    store = _store()
    keys = {r: _key(info, seq, r) for r in ranks}
    seen: dict[int, str] = {}
    deadline = time.monotonic() + _grace()
    while True:
        for r, k in keys.items():
            if r not in seen and store.check([k]):
                seen[r] = store.get(k).decode(errors="replace")
        if len(seen) == len(ranks) or time.monotonic() >= deadline:
            return seen
        time.sleep(0.02)


def _broken(info: GroupInfo) -> None:
    """Mark the group of a timed-out call broken, so that neither ``destroy()`` nor exit waits for it."""
    try:
        pg = info.pg
    except Exception as exc:  # noqa: BLE001 - the default group is gone: nothing to wait for
        log.debug("collectives: no process group to mark broken: %s", exc)
        return
    mark_broken(pg)


def _diagnose(op: str, info: GroupInfo, seq: int, timeout: float) -> CollectiveTimeout:
    """Read the arrival announcements of call ``seq`` and name the ranks that never made one.

    The group is marked broken (see :mod:`rallypoint.collectives.broken`) by :func:`_expire`,
    when the call gives up.
    """
    rank = _dist.get_rank()
    name = info.name()
    try:
        ranks = info.ranks()
    except Exception:  # noqa: BLE001 - should not happen; report what we can
        ranks = []
    fields: dict[str, Any] = {"op": op, "group": name, "group_ranks": ranks, "rank": rank, "timeout": timeout}
    try:
        seen = _read_arrivals(info, seq, ranks)
    except Exception as exc:  # noqa: BLE001 - the store itself may be gone
        detail = f"the store could not be read to find them: {type(exc).__name__}: {exc}"
        return CollectiveTimeout(missing=[], arrived=[rank], detail=detail, **fields)
    missing = [r for r in ranks if r not in seen]
    detail = f"call #{seq} on this group; arrival announced on the job's store by ranks {format_ranks(sorted(seen))}"
    others = {r: o for r, o in seen.items() if o != op}
    if others:
        detail += "; ranks in a different call: " + ", ".join(f"{r} in {o}" for r, o in sorted(others.items()))
    if not missing:
        detail += "; every rank arrived, so the call itself is stuck (mismatched calls or a network problem)"
    return CollectiveTimeout(missing=missing, arrived=sorted(seen), detail=detail, **fields)


def _p2p_timeout(op: str, info: GroupInfo, peer: int, timeout: float) -> CollectiveTimeout:
    rank = _dist.get_rank()
    try:
        ranks = info.ranks()
        name = info.name()
    except Exception:  # noqa: BLE001 - report what we can
        ranks, name = [], "?"
    missing = list(ranks) if peer < 0 else [peer]
    missing = [r for r in missing if r != rank]
    what = "any sender" if peer < 0 else f"rank {peer}"
    return CollectiveTimeout(
        op=op,
        group=name,
        group_ranks=ranks,
        missing=missing,
        arrived=[rank],
        rank=rank,
        timeout=timeout,
        detail=f"point-to-point with {what}: the peer never posted the matching call",
    )
