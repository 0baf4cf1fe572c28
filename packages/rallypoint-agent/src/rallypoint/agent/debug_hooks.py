"""What a worker installs at start so that the agent can see what it is doing (issue #40).

:mod:`rallypoint.agent.worker_main` loads this file by path (it imports nothing of rallypoint)
when the agent gives the worker ``RALLYPOINT_WORKER_DEBUG_DIR``. Two things are set up:

* **Stacks on request**: :func:`faulthandler.register` for :data:`DUMP_SIGNAL` (a real-time
  signal nothing else uses), writing into ``<dir>/rank_<RANK>.stacks`` (started anew by each worker:
  a later round with the same attempt number reuses the directory).
  The dump is written by the signal handler in C: it needs no GIL, so a worker whose threads are
  all stuck in C code (a collective, a blocking read, ``time.sleep``) still answers with every
  thread's Python frames. While nobody asks it costs nothing: a handler is registered, no
  thread runs, no timer ticks.
* **A collective flight record**: the collectives of ``torch.distributed`` (and so of the
  rallypoint facade, which calls them) are wrapped when ``torch.distributed`` is imported,
  and each call is written into a ring of :data:`SLOTS` fixed-size slots of a memory-mapped file
  ``<dir>/rank_<RANK>.flight``: sequence number per group, op, dtype, shape, group, start and end
  time. The agent reads the file without the worker's help, whatever the worker is doing.

The file layout (shared with :mod:`rallypoint.agent.debug_flight`): a header of
:data:`HEADER_SIZE` bytes (``<q`` at 0: how many records were ever written; ``<q`` at
:data:`ASYNC_DONE`: how many asynchronous calls ever completed), then :data:`SLOTS` slots of
:data:`SLOT.size` bytes. A record's end time is ``0.0`` until the call completes: a call started
with ``async_op=True`` completes when its work is seen complete (its ``wait()`` returns or its
``is_completed()`` says so, see :meth:`FlightRecorder.end_with`). Its end is ``-1.0`` when that
cannot be seen.
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import mmap
import os
import signal
import struct
import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["ASYNC_DONE", "DUMP_SIGNAL", "HEADER_SIZE", "SLOT", "SLOTS", "install", "open_stacks"]

#: The signal a worker dumps its threads' stacks on (SIGRTMIN+5: no library here uses it).
DUMP_SIGNAL = signal.SIGRTMIN + 5
#: Collectives kept per worker.
SLOTS = 64
#: One record: seq, start, end, op, dtype, group, ndim, up to 6 dims.
SLOT = struct.Struct("<qdd16s16s24sq6q")
HEADER = struct.Struct("<q")
HEADER_SIZE = 64
#: Where the header counts the asynchronous calls that completed (the agent's progress check reads it).
ASYNC_DONE = 8

#: torch.distributed calls recorded (those that exist in the installed torch).
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "send",
    "recv",
)

_state: dict[str, Any] = {}


def open_stacks(path: str, header: str) -> Any:
    """Dump every thread's stack into ``path`` on :data:`DUMP_SIGNAL`; the open file (kept for the handler).

    The file is private (``0600``, as the logs) and never opened through a link; ``header`` is written
    after the handler is registered (the agent signals only a process whose header it has read).
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    f = open(fd, "w", buffering=1)  # noqa: SIM115 - kept open for the process's life: the handler writes into it
    faulthandler.register(DUMP_SIGNAL, file=f, all_threads=True, chain=False)
    f.write(header)
    return f


def _stacks(directory: str, rank: str) -> None:
    path = os.path.join(directory, f"rank_{rank}.stacks")
    _state["stacks"] = open_stacks(path, f"# rallypoint stacks pid={os.getpid()}\n")


class FlightRecorder:
    """The ring of collective records in a memory-mapped file (one per worker).

    :meth:`begin` and :meth:`end` record one call; the wrappers of :func:`patch_distributed` do the
    same work inline (one Python call less each, every name a local: about 2 us less per
    collective than the methods on a loaded machine, see ``tools/bench/debug_overhead.py``).
    """

    def __init__(self, path: str) -> None:
        size = HEADER_SIZE + SLOTS * SLOT.size
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, size)
            self.buf = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.counter = [0]  # records ever written (a list: the wrappers share and update it in place)
        self.completed = [0]  # asynchronous calls that completed (likewise)
        self.pending: dict[int, int] = {}  # id(work) -> its record's index, until the work is seen complete
        self.watched: dict[type, bool] = {}  # work classes: whether their wait and is_completed end records
        self.groups: dict[int, list[Any]] = {}  # id(group) -> [name bytes, next seq]

    @property
    def count(self) -> int:
        """Records ever written."""
        return self.counter[0]

    def begin(self, op: bytes, group: Any, tensor: Any) -> int:
        """Record a call that starts now; the slot's offset (for :meth:`end`)."""
        g = self.groups.get(id(group))
        if g is None:
            g = self.groups[id(group)] = [_group_name(group), 0]
        seq = g[1]
        g[1] = seq + 1
        t = tensor[0] if type(tensor) is list and tensor else tensor
        shape, dtype = _signature(t) if t is not None else ((), b"")
        counter = self.counter
        count = counter[0]
        counter[0] = count + 1
        offset = HEADER_SIZE + (count & _MASK) * _SLOT_SIZE
        _pack_slot(self.buf, offset, seq, time.time(), op, dtype, g[0], shape)
        _pack_header(self.buf, 0, count + 1)
        return offset

    def end(self, offset: int, issued: bool) -> None:
        """The call at ``offset`` returned (``issued``: it started asynchronous work whose end is not seen)."""
        _pack_time(self.buf, offset + _END, -1.0 if issued else time.time())

    def end_with(self, work: Any, count: int) -> None:
        """The asynchronous call of record ``count`` (its index) returned ``work``: it completes with the work.

        The record completes when the work is seen complete in this process: its ``wait()``
        returns, or its ``is_completed()`` answers ``True`` (the facade's waits included). The
        work's class gets both methods wrapped once (:func:`_watch_work_class`); nothing runs on
        the thread that completes the work (a Python callback there would make Gloo's thread
        take the GIL: about 7 us more per call, measured). A rank outside the group got no work
        (nothing was issued): completed now. A work whose class cannot be wrapped is marked
        ``-1.0``, issued with its end unseen.
        """
        if work is None:
            _pack_time(self.buf, HEADER_SIZE + (count & _MASK) * _SLOT_SIZE + _END, time.time())
            return
        cls = type(work)
        watched = self.watched.get(cls)
        if watched is None:
            try:
                _watch_work_class(cls, self)
                watched = True
            except (AttributeError, TypeError):  # a built-in or frozen class: the end is not seen
                watched = False
            self.watched[cls] = watched
        if not watched:
            _pack_time(self.buf, HEADER_SIZE + (count & _MASK) * _SLOT_SIZE + _END, -1.0)
            return
        pending = self.pending
        replaced = pending.pop(id(work), None)
        if replaced is not None:  # that work was freed unwaited (its id is reused): its end is not seen
            self.finish(replaced, -1.0)
        elif len(pending) >= _MAX_PENDING:  # works kept and never waited for: forget the oldest
            with contextlib.suppress(RuntimeError, KeyError, StopIteration):  # another thread changed it meanwhile
                self.finish(pending.pop(next(iter(pending))), -1.0)
        pending[id(work)] = count

    def finish(self, count: int, end: float) -> None:
        """Stamp record ``count``'s end (unless the ring gave its slot to a newer call), and count it done."""
        if self.counter[0] - count <= SLOTS:
            _pack_time(self.buf, HEADER_SIZE + (count & _MASK) * _SLOT_SIZE + _END, end)
        if end > 0:
            completed = self.completed
            completed[0] += 1
            _pack_header(self.buf, ASYNC_DONE, completed[0])


def _watch_work_class(cls: type, recorder: FlightRecorder) -> None:
    """Wrap ``cls.wait`` and ``cls.is_completed`` so that a recorded work seen complete ends its record.

    Raises:
        AttributeError, TypeError: the class has no such methods, or cannot be changed.
    """
    wait, is_completed = cls.wait, cls.is_completed  # type: ignore[attr-defined]
    pending, finish, now = recorder.pending, recorder.finish, time.time

    @functools.wraps(wait)
    def watched_wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = wait(self, *args, **kwargs)  # raises on a timeout or an error: still in flight
        if pending:
            count = pending.pop(id(self), None)
            if count is not None:
                finish(count, now())
        return result

    @functools.wraps(is_completed)
    def watched_is_completed(self: Any) -> Any:
        done = is_completed(self)
        if done and pending:
            count = pending.pop(id(self), None)
            if count is not None:
                finish(count, now())
        return done

    cls.wait = watched_wait  # type: ignore[attr-defined]
    try:
        cls.is_completed = watched_is_completed  # type: ignore[attr-defined]
    except (AttributeError, TypeError):
        cls.wait = wait  # type: ignore[attr-defined]
        raise


_pack = SLOT.pack_into
_pack_header = HEADER.pack_into
_pack_time = struct.Struct("<d").pack_into
_PADS = [(0,) * (6 - n) for n in range(7)]
_DTYPES: dict[Any, bytes] = {}
_MASK = SLOTS - 1  # SLOTS is a power of two
_SLOT_SIZE = SLOT.size
_END = 16  # a record's end time, from the start of its slot
_MAX_PENDING = 1024  # asynchronous works followed at most (kept and never waited for: the oldest is forgotten)
#: What the first argument of each call is: 0 no tensor (a group, objects), 2 a list of tensors, else 1 a tensor.
_FIRST = {"barrier": 0, "all_gather_object": 0, "broadcast_object_list": 0, "all_gather": 2, "all_to_all": 2}


def _signature(t: Any) -> tuple[Any, bytes]:
    """``(shape, dtype name)`` of a tensor; ``((), b"")`` for anything else (never raises)."""
    try:
        shape = t.shape
        dtype = t.dtype
    except Exception:  # noqa: BLE001 - not a tensor: torch reports it, the record just has no shape
        return (), b""
    return shape, _DTYPES.get(dtype) or _dtype_name(dtype)


def _pack_slot(buf: Any, offset: int, seq: int, start: float, op: bytes, dtype: bytes, grp: bytes, shape: Any) -> None:
    n = len(shape)
    if n == 1:  # the common case, without building the padded tuple
        _pack(buf, offset, seq, start, 0.0, op, dtype, grp, 1, shape[0], 0, 0, 0, 0, 0)
    else:
        dims = tuple(shape[:6]) if n > 6 else (*shape, *_PADS[n])
        _pack(buf, offset, seq, start, 0.0, op, dtype, grp, min(n, 6), *dims)


def _dtype_name(dtype: Any) -> bytes:
    name = _DTYPES[dtype] = str(dtype).removeprefix("torch.").encode()[:16]
    return name


def _group_name(group: Any) -> bytes:
    if group is None:
        return b"default"
    name = getattr(group, "group_name", None) or f"pg{id(group):x}"
    return str(name).encode()[:24]


def _wrap(recorder: FlightRecorder, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` recording each call in ``recorder``: :meth:`FlightRecorder.begin` and ``end`` inline."""
    import inspect

    op = name.encode()
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        params = []
    gi = params.index("group") if "group" in params else 99
    ai = params.index("async_op") if "async_op" in params else 99
    first = _FIRST.get(name, 1)
    buf, groups, counter, now = recorder.buf, recorder.groups, recorder.counter, time.time
    pack, pack_header, pack_time, dtypes = _pack, _pack_header, _pack_time, _DTYPES
    end_with, watched, pending = recorder.end_with, recorder.watched, recorder.pending

    @functools.wraps(fn)
    def recorded(*args: Any, **kwargs: Any) -> Any:
        n = len(args)
        group = args[gi] if n > gi else kwargs.get("group") if kwargs else None
        g = groups.get(id(group))
        if g is None:
            g = groups[id(group)] = [_group_name(group), 0]
        seq = g[1]
        g[1] = seq + 1
        count = counter[0]
        counter[0] = count + 1
        offset = HEADER_SIZE + (count & _MASK) * _SLOT_SIZE
        t = args[0] if n and first else kwargs.get("tensor") if first else None
        if first == 2:
            t = t[0] if type(t) is list and t else None
        if t is None:
            _pack_slot(buf, offset, seq, now(), op, b"", g[0], ())
        else:
            try:
                shape = t.shape
                dtype = dtypes.get(t.dtype) or _dtype_name(t.dtype)
            except Exception:  # noqa: BLE001 - not a tensor: torch reports it, the record has no shape
                shape, dtype = (), b""
            if len(shape) == 1:  # the common case: one pack, no padded tuple
                pack(buf, offset, seq, now(), 0.0, op, dtype, g[0], 1, shape[0], 0, 0, 0, 0, 0)
            else:
                _pack_slot(buf, offset, seq, now(), op, dtype, g[0], shape)
        pack_header(buf, 0, count + 1)
        result = fn(*args, **kwargs)
        if args[ai] if n > ai else kwargs.get("async_op"):
            if watched.get(type(result)) and id(result) not in pending and len(pending) < _MAX_PENDING:
                pending[id(result)] = count  # the common case, as end_with does it
            else:
                end_with(result, count)
        else:
            pack_time(buf, offset + _END, now())
        return result

    recorded.__rallypoint_recorded__ = True  # type: ignore[attr-defined]
    return recorded


def patch_distributed(module: Any, recorder: FlightRecorder) -> None:
    """Wrap ``module``'s (``torch.distributed``'s) collectives so that each call is recorded."""
    for name in COLLECTIVES:
        fn = getattr(module, name, None)
        if fn is None or getattr(fn, "__rallypoint_recorded__", False):
            continue
        setattr(module, name, _wrap(recorder, name, fn))


class _DistributedFinder:
    """A meta path finder that patches ``torch.distributed`` once it has been imported."""

    def __init__(self, recorder: FlightRecorder) -> None:
        self.recorder = recorder

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "torch.distributed":
            return None
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        loader, recorder = spec.loader, self.recorder
        exec_module = loader.exec_module

        def exec_and_patch(module: Any) -> None:
            exec_module(module)
            patch_distributed(module, recorder)

        loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


def install(directory: str, rank: str) -> None:
    """Set up stacks on request and the flight record for this worker (never raises)."""
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        _stacks(directory, rank)
        recorder = FlightRecorder(os.path.join(directory, f"rank_{rank}.flight"))
        _state["flight"] = recorder
        dist = sys.modules.get("torch.distributed")
        if dist is not None:  # a warm worker may have imported it already
            patch_distributed(dist, recorder)
        else:
            sys.meta_path.insert(0, _DistributedFinder(recorder))
    except Exception as exc:  # noqa: BLE001 - the worker runs on, without being debuggable
        print(f"rallypoint: debugging hooks not installed: {type(exc).__name__}: {exc}", file=sys.stderr)
