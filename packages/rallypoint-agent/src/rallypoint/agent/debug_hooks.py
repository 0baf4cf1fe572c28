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
  Point-to-point calls (``isend``, ``irecv``, so ``send``, ``recv`` and ``batch_isend_irecv``,
  which torch builds on them) are recorded too, with their peer's global rank and tag, and a
  sequence number of their own per group, direction and peer (see :func:`_wrap_p2p`).

The file layout (shared with :mod:`rallypoint.agent.debug_flight`): a header of
:data:`HEADER_SIZE` bytes (``<q`` at 0: how many records were ever written; ``<q`` at
:data:`ASYNC_DONE`: how many asynchronous calls ever completed), then :data:`SLOTS` slots of
:data:`SLOT.size` bytes. The header's counters and each record's end time are written through 8-byte
views of the map (one item store, no ``pack_into``). A record's end time is ``0.0`` until the call
completes: a call started with ``async_op=True`` completes when its work is seen complete (its
``wait()`` returns or its ``is_completed()`` says so, see :meth:`FlightRecorder.end_with`). Its
end is ``-1.0`` when that cannot be seen.
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
#: One record: seq, start, end, op, dtype, group, ndim, up to 6 dims, peer, tag (the last two:
#: point-to-point calls only; the peer's global rank, ``-1`` for a receive from any rank).
SLOT = struct.Struct("<qdd16s16s24sq6qqq")
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
)
#: torch.distributed's point-to-point calls recorded: torch's ``send``, ``recv`` and
#: ``batch_isend_irecv`` call these (looked up in ``torch.distributed.distributed_c10d``, which is
#: patched too), so wrapping them records those as well, each once.
P2P = ("isend", "irecv")

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
        if sys.byteorder != "little":  # the views write native integers and doubles; the reader reads "<"
            raise OSError("the flight record's layout is little-endian; this machine is not")
        size = HEADER_SIZE + SLOTS * SLOT.size
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, size)
            self.buf = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.words = memoryview(self.buf).cast("q")  # the header's counters, by 8-byte index
        self.times = memoryview(self.buf).cast("d")  # the records' end times, likewise (see _end_word)
        self.counter = [0]  # records ever written (a list: the wrappers share and update it in place)
        self.completed = [0]  # asynchronous calls that completed (likewise)
        self.pending: dict[int, int] = {}  # id(work) -> its record's index, until the work is seen complete
        self.watched: dict[type, bool] = {}  # work classes: whether their wait and is_completed end records
        self.groups: dict[int, list[Any]] = {}  # id(group) -> [name bytes, next seq]
        self.members: Any = None  # torch.distributed.GroupMember, once patched: its WORLD is the default group
        self.p2p: dict[tuple[int, bool, int], int] = {}  # (id(group), a send, peer) -> next point-to-point seq
        self.batches: dict[int, range] = {}  # first record of a coalesced batch -> its records (one work for all)

    def group_entry(self, group: Any) -> list[Any]:
        """``group``'s ``[name, next seq]``, made at its first call.

        The default group passed as itself (DDP and torch's own wrappers pass it, user code passes
        ``None``) shares ``None``'s entry: one sequence, named ``default``, however it is passed.
        """
        members = self.members
        if group is not None and members is not None and group is getattr(members, "WORLD", None):
            entry = self.groups.get(id(None)) or self.group_entry(None)
        else:
            entry = [_group_name(group), 0]
        self.groups[id(group)] = entry
        return entry

    @property
    def count(self) -> int:
        """Records ever written."""
        return self.counter[0]

    def begin(self, op: bytes, group: Any, tensor: Any) -> int:
        """Record a call that starts now; the slot's offset (for :meth:`end`)."""
        g = self.groups.get(id(group)) or self.group_entry(group)
        seq = g[1]
        g[1] = seq + 1
        t = tensor[0] if type(tensor) is list and tensor else tensor
        shape, dtype = _signature(t) if t is not None else ((), b"")
        counter = self.counter
        count = counter[0]
        counter[0] = count + 1
        offset = HEADER_SIZE + (count & _MASK) * _SLOT_SIZE
        _pack_slot(self.buf, offset, seq, time.time(), op, dtype, g[0], shape)
        self.words[0] = count + 1
        return offset

    def end(self, offset: int, issued: bool) -> None:
        """The call at ``offset`` returned (``issued``: it started asynchronous work whose end is not seen)."""
        self.times[(offset >> 3) + _END_WORD] = -1.0 if issued else time.time()

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
            self.finish(count, time.time())
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
            self.finish(count, -1.0)
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
        """Stamp record ``count``'s end (every record of the batch it starts), and count it done.

        A slot the ring gave to a newer call is left alone.
        """
        batch = self.batches.pop(count, None) if self.batches else None
        for n in batch or (count,):
            if self.counter[0] - n <= SLOTS:
                self.times[_end_word(n)] = end
        if end > 0:
            completed = self.completed
            completed[0] += 1
            self.words[_ASYNC_WORD] = completed[0]


def _watch_work_class(cls: type, recorder: FlightRecorder) -> None:
    """Wrap ``cls.wait`` and ``cls.is_completed`` so that a recorded work seen complete ends its record.

    The common case (the record still in the ring, no batch) is stamped inline, without a call of
    :meth:`FlightRecorder.finish`.

    Raises:
        AttributeError, TypeError: the class has no such methods, or cannot be changed.
    """
    wait, is_completed = cls.wait, cls.is_completed  # type: ignore[attr-defined]
    pending, finish, now = recorder.pending, recorder.finish, time.time
    counter, completed, batches = recorder.counter, recorder.completed, recorder.batches
    words, times = recorder.words, recorder.times

    def done(count: int) -> None:
        if batches or counter[0] - count > SLOTS:
            finish(count, now())
            return
        times[_HEADER_WORDS + (count & _MASK) * _SLOT_WORDS + _END_WORD] = now()
        n = completed[0] = completed[0] + 1
        words[_ASYNC_WORD] = n

    @functools.wraps(wait)
    def watched_wait(self: Any, timeout: Any = _UNSET, *args: Any, **kwargs: Any) -> Any:
        # raises on a timeout or an error: still in flight. The common calls (no argument, or the
        # timeout alone) are passed on without unpacking: about 0.3 us less than wait(self, *args, **kwargs)
        if args or kwargs:
            result = wait(self, timeout, *args, **kwargs) if timeout is not _UNSET else wait(self, *args, **kwargs)
        else:
            result = wait(self) if timeout is _UNSET else wait(self, timeout)
        if pending:
            count = pending.pop(id(self), None)
            if count is not None:
                if batches or counter[0] - count > SLOTS:
                    finish(count, now())
                else:  # done(count), inline
                    times[_HEADER_WORDS + (count & _MASK) * _SLOT_WORDS + _END_WORD] = now()
                    n = completed[0] = completed[0] + 1
                    words[_ASYNC_WORD] = n
        return result

    @functools.wraps(is_completed)
    def watched_is_completed(self: Any) -> Any:
        result = is_completed(self)
        if result and pending:
            count = pending.pop(id(self), None)
            if count is not None:
                done(count)
        return result

    cls.wait = watched_wait  # type: ignore[attr-defined]
    try:
        cls.is_completed = watched_is_completed  # type: ignore[attr-defined]
    except (AttributeError, TypeError):
        cls.wait = wait  # type: ignore[attr-defined]
        raise


_pack = SLOT.pack_into
_PADS = [(0,) * (6 - n) for n in range(7)]
_DTYPES: dict[Any, bytes] = {}
_MASK = SLOTS - 1  # SLOTS is a power of two
_SLOT_SIZE = SLOT.size
_SLOT_WORDS = SLOT.size // 8  # the views' items per slot (a slot's size is a multiple of 8)
_HEADER_WORDS = HEADER_SIZE // 8
_END_WORD = 2  # a record's end time, in 8-byte items from the start of its slot
_ASYNC_WORD = ASYNC_DONE // 8
#: The rallypoint facade's module of operations (its ``send`` and ``recv`` are blocking calls).
_FACADE_OPS = os.path.join("rallypoint", "collectives", "ops.py")
_UNSET: Any = object()  # an argument not given
_MAX_PENDING = 1024  # asynchronous works followed at most (kept and never waited for: the oldest is forgotten)
#: What the first argument of each call is: 0 no tensor (a group, objects), 2 a list of tensors, else 1 a tensor.
_FIRST = {"barrier": 0, "all_gather_object": 0, "broadcast_object_list": 0, "all_gather": 2, "all_to_all": 2}


def _end_word(count: int) -> int:
    """Where record ``count``'s end time is in :attr:`FlightRecorder.times`."""
    return _HEADER_WORDS + (count & _MASK) * _SLOT_WORDS + _END_WORD


def _signature(t: Any) -> tuple[Any, bytes]:
    """``(shape, dtype name)`` of a tensor; ``((), b"")`` for anything else (never raises)."""
    try:
        shape = t.shape
        dtype = t.dtype
    except Exception:  # noqa: BLE001 - not a tensor: torch reports it, the record just has no shape
        return (), b""
    return shape, _DTYPES.get(dtype) or _dtype_name(dtype)


def _pack_slot(
    buf: Any, offset: int, seq: int, start: float, op: bytes, dtype: bytes, grp: bytes, shape: Any, *peer_tag: int
) -> None:
    """Write one record (``peer_tag``: a point-to-point call's peer and tag; zeros for a collective)."""
    extra = peer_tag or (0, 0)
    n = len(shape)
    if n == 1:  # the common case, without building the padded tuple
        _pack(buf, offset, seq, start, 0.0, op, dtype, grp, 1, shape[0], 0, 0, 0, 0, 0, *extra)
    else:
        dims = tuple(shape[:6]) if n > 6 else (*shape, *_PADS[n])
        _pack(buf, offset, seq, start, 0.0, op, dtype, grp, min(n, 6), *dims, *extra)


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
    pack, words, times, dtypes = _pack, recorder.words, recorder.times, _DTYPES
    end_with, watched, pending = recorder.end_with, recorder.watched, recorder.pending

    @functools.wraps(fn)
    def recorded(*args: Any, **kwargs: Any) -> Any:
        n = len(args)
        group = args[gi] if n > gi else kwargs.get("group") if kwargs else None
        g = groups.get(id(group)) or recorder.group_entry(group)
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
                pack(buf, offset, seq, now(), 0.0, op, dtype, g[0], 1, shape[0], 0, 0, 0, 0, 0, 0, 0)
            else:
                _pack_slot(buf, offset, seq, now(), op, dtype, g[0], shape)
        words[0] = count + 1
        result = fn(*args, **kwargs)
        if args[ai] if n > ai else kwargs.get("async_op"):
            key = id(result)
            if watched.get(type(result)) and key not in pending and len(pending) < _MAX_PENDING:
                pending[key] = count  # the common case, as end_with does it
            else:
                end_with(result, count)
        else:
            times[(offset >> 3) + _END_WORD] = now()
        return result

    recorded.__rallypoint_recorded__ = True  # type: ignore[attr-defined]
    return recorded


def _caller_code(fn: Any) -> Any:
    """The code object of ``fn`` under its decorators (torch's ``send`` is wrapped by a logger), or ``None``."""
    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    return getattr(fn, "__code__", None)


def _wrap_p2p(recorder: FlightRecorder, name: str, fn: Callable[..., Any], module: Any) -> Callable[..., Any]:
    """``fn`` (``isend`` or ``irecv`` of ``module``) recording each call in ``recorder``.

    The record: op ``isend``/``irecv`` (``send``/``recv`` when torch's blocking call issued it),
    the tensor's dtype and shape, the group, the peer's *global* rank (``-1``: receive from any
    rank) and the tag; ``seq`` counts the calls per group, direction and peer, so that rank A's
    n-th receive from B pairs with B's n-th send to A. It completes with its work, as an
    asynchronous collective does (torch's ``send`` and ``recv`` wait for it).
    """
    send = name == "isend"
    op, blocking_op = name.encode(), (b"send" if send else b"recv")
    peer_key, group_peer_key = ("dst", "group_dst") if send else ("src", "group_src")
    blocking = _caller_code(getattr(module, blocking_op.decode(), None))
    facade = blocking_op.decode()  # the facade's send and recv wait for the isend and irecv they issue
    members = getattr(module, "GroupMember", None)
    global_rank = getattr(module, "get_global_rank", None)
    buf, groups, p2p, counter, now = recorder.buf, recorder.groups, recorder.p2p, recorder.counter, time.time
    words, end_with, watched, pending = recorder.words, recorder.end_with, recorder.watched, recorder.pending
    getframe = sys._getframe

    @functools.wraps(fn)
    def recorded(*args: Any, **kwargs: Any) -> Any:
        n = len(args)
        t = args[0] if n else kwargs.get("tensor")
        peer = args[1] if n > 1 else kwargs.get(peer_key)
        group = args[2] if n > 2 else kwargs.get("group")
        tag = args[3] if n > 3 else kwargs.get("tag", 0)
        if group is not None and members is not None and group is members.WORLD:
            group = None  # torch's send passes the default group itself, the facade passes None
        if peer is None:
            local = args[4] if n > 4 else kwargs.get(group_peer_key)
            peer = -1 if local is None else _global_rank(global_rank, group, local)
        key = (id(group), send, peer)
        seq = p2p.get(key, 0)
        p2p[key] = seq + 1
        g = groups.get(id(group)) or recorder.group_entry(group)
        shape, dtype = _signature(t)
        count = counter[0]
        counter[0] = count + 1
        code = getframe(1).f_code
        blocked = code is blocking or (code.co_name == facade and code.co_filename.endswith(_FACADE_OPS))
        kind = blocking_op if blocked else op
        _pack_slot(buf, HEADER_SIZE + (count & _MASK) * _SLOT_SIZE, seq, now(), kind, dtype, g[0], shape, peer, tag)
        words[0] = count + 1
        result = fn(*args, **kwargs)
        if watched.get(type(result)) and id(result) not in pending and len(pending) < _MAX_PENDING:
            pending[id(result)] = count
        else:
            end_with(result, count)
        return result

    recorded.__rallypoint_recorded__ = True  # type: ignore[attr-defined]
    return recorded


def _global_rank(global_rank: Any, group: Any, local: int) -> int:
    """The global rank of ``group``'s rank ``local`` (itself in the default group, or when it cannot be found)."""
    if group is None or global_rank is None:
        return int(local)
    try:
        return int(global_rank(group, local))
    except Exception:  # noqa: BLE001 - torch raises it itself at the call; the record keeps the group rank
        return int(local)


def _wrap_batch(recorder: FlightRecorder, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``batch_isend_irecv`` whose records (made by the ``isend``/``irecv`` wrappers it calls) end with its works.

    On a backend without coalescing (Gloo) each operation returns its own work, which the caller
    waits for: nothing to do. With coalescing (NCCL) the operations' works are not the ones
    returned: one work stands for the whole batch, so the batch's records are followed through it
    (all end when it is seen complete) and the operations' own works are forgotten.
    """
    counter, pending, batches, now = recorder.counter, recorder.pending, recorder.batches, time.time

    @functools.wraps(fn)
    def recorded(*args: Any, **kwargs: Any) -> Any:
        first = counter[0]
        works = fn(*args, **kwargs)
        last = counter[0]
        if last == first or not isinstance(works, list):
            return works
        if all(first <= pending.get(id(w), -1) < last for w in works) and len(works) == last - first:
            return works  # one work per operation, each followed by its own record
        for work_id in [k for k, v in list(pending.items()) if first <= v < last]:
            pending.pop(work_id, None)
        for count in range(first, last):  # in flight again, whatever the operation's own work said
            if counter[0] - count <= SLOTS:
                recorder.times[_end_word(count)] = 0.0
        if last - first > 1:
            batches[first] = range(first, last)
        if works:
            recorder.end_with(works[-1], first)
        else:  # nothing to wait for: done
            recorder.finish(first, now())
        return works

    recorded.__rallypoint_recorded__ = True  # type: ignore[attr-defined]
    return recorded


def patch_distributed(module: Any, recorder: FlightRecorder) -> None:
    """Wrap ``module``'s (``torch.distributed``'s) collectives and point-to-point calls so that each is recorded.

    ``isend`` and ``irecv`` are replaced in ``torch.distributed.distributed_c10d`` too, where torch's
    ``send``, ``recv`` and ``batch_isend_irecv`` (and its check of a ``P2POp``'s function) find them.
    """
    if recorder.members is None:
        recorder.members = getattr(module, "GroupMember", None)
    for name in COLLECTIVES:
        fn = getattr(module, name, None)
        if fn is None or getattr(fn, "__rallypoint_recorded__", False):
            continue
        setattr(module, name, _wrap(recorder, name, fn))
    c10d = getattr(module, "distributed_c10d", None)
    for name in P2P:
        fn = getattr(module, name, None)
        if fn is None or getattr(fn, "__rallypoint_recorded__", False):
            continue
        wrapped = _wrap_p2p(recorder, name, fn, c10d if c10d is not None else module)
        setattr(module, name, wrapped)
        if c10d is not None and getattr(c10d, name, None) is fn:
            setattr(c10d, name, wrapped)
    batch = getattr(module, "batch_isend_irecv", None)
    if batch is not None and not getattr(batch, "__rallypoint_recorded__", False):
        module.batch_isend_irecv = _wrap_batch(recorder, batch)


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
