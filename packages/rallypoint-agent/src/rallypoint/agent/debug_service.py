"""The agent's side of ``rallypoint debug stacks``: answer debug requests with this node's workers.

A thread watches ``debug/request`` in the run's key space (generic ``watch``/``get``/``set``
only, see :mod:`rallypoint.rendezvous.keyspace`); for each new request it collects this node's
workers (:func:`~rallypoint.agent.debug_collect.collect_workers`) and writes them under
``debug/reply/<request>/<node>``. :func:`request` and :func:`gather` are the asking side: the
command line and an agent that saw a hang use them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from rallypoint.agent.debug_collect import collect_workers
from rallypoint.rendezvous.keyspace import DEBUG_REQUEST_KEY, debug_reply_key, debug_reply_prefix

if TYPE_CHECKING:
    from rallypoint.agent.workers import WorkerGroup
    from rallypoint.rendezvous.backend import RendezvousBackend

__all__ = ["DebugService", "alive_nodes", "gather", "request"]

log = logging.getLogger("rallypoint.agent.debug")

#: Answers are kept this long where the backend can expire keys.
REPLY_TTL = 120.0


class DebugService:
    """The thread that answers debug requests for one node.

    Args:
        backend: the run's key space.
        node_id: this node's id (names its answer).
        host: this node's host name (in its answer).
    """

    def __init__(self, backend: RendezvousBackend, node_id: str, host: str) -> None:
        self.backend = backend
        self.node_id = node_id
        self.host = host
        self._group: WorkerGroup | None = None
        self._local: dict[int, int] = {}
        self._dir: Path | None = None
        #: The diagnosis line of the last hang this node reported or was told of (``None``: none yet).
        self.diagnosis: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="rallypoint-debug", daemon=True)
        self._answered: str | None = None
        #: when :meth:`start` was called (wall clock, as requests are dated): older requests are not answered
        self._started = float("inf")
        #: The agent's own stacks file while registered: the open file, its path, its header's size.
        self._stacks: tuple[TextIO, Path, int] | None = None

    def start(self, log_dir: Path | None = None) -> None:
        """Start answering in a thread (a request dated before this call is not answered).

        Nothing here touches the backend: the agent's first contact with the rendezvous is its join,
        which waits for a server that starts later and says so (a read here blocked for the
        client's retry time, and the join then found the server up and never said it waited).

        With ``log_dir``, the agent itself dumps every thread's stack into
        ``<log_dir>/agent_<node>.stacks`` on the workers' signal (``kill -s RTMIN+5 <agent pid>``):
        that shows where an agent that does not end waits.
        """
        if log_dir is not None:
            self._own_stacks(log_dir / f"agent_{self.node_id}.stacks")
        self._started = time.time()
        self._thread.start()

    def _own_stacks(self, path: Path) -> None:
        from rallypoint.agent.debug_hooks import open_stacks

        header = f"# rallypoint agent stacks pid={os.getpid()}\n"
        try:
            f = open_stacks(str(path), header)
        except OSError as exc:
            log.debug("agent stacks file %s: %s", path, exc)
            return
        self._stacks = (f, path, len(header.encode()))

    def stop(self, timeout: float = 3.0) -> None:
        """Stop the thread and wait for it (up to ``timeout``: its calls wait one second at most).

        Waited for, so that the process does not exit while the thread is inside a backend call
        (a gRPC call of a daemon thread at interpreter exit can hang the exit).
        """
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self._stacks is not None:
            import faulthandler

            from rallypoint.agent.debug_hooks import DUMP_SIGNAL

            f, path, header = self._stacks
            self._stacks = None
            faulthandler.unregister(DUMP_SIGNAL)
            f.close()
            with contextlib.suppress(OSError):  # never dumped: no file left (a refused run leaves no log directory)
                if os.path.getsize(path) == header:
                    os.unlink(path)

    def follow(self, group: WorkerGroup, local_ranks: dict[int, int], directory: Path) -> None:
        """Answer with ``group``'s running workers (``rank -> local rank``), whose hooks write into ``directory``."""
        self._group, self._local, self._dir = group, dict(local_ranks), directory

    def workers(self) -> dict[int, tuple[int, int]]:
        """``rank -> (pid, local rank)`` of the workers running now."""
        group = self._group
        if group is None:
            return {}
        pids = group.pids
        return {r: (pids[r], self._local.get(r, 0)) for r in group.running() if r in pids}

    def collect(self) -> list[dict[str, Any]]:
        """Stacks, flight records and process states of the workers running on this node now."""
        running = self.workers()
        return collect_workers(running, self._dir) if running and self._dir is not None else []

    def answer(self, request_id: str) -> dict[str, Any]:
        """Collect this node's workers and publish them as the answer to ``request_id``."""
        workers = self.collect()
        reply = {"node": self.node_id, "host": self.host, "agent_pid": os.getpid(), "time": time.time()}
        reply["workers"] = workers
        ttl = REPLY_TTL if getattr(self.backend, "supports_ttl", False) else None
        self.backend.set(debug_reply_key(request_id, self.node_id), reply, ttl=ttl)
        return reply

    def _log_dir(self) -> Path | None:
        """The log directory (the workers' debug directory is ``<log dir>/attempt_N/debug``)."""
        return self._dir.parent.parent if self._dir is not None else None

    def report_hang(self, why: str, say: Callable[[str], None], *, timeout: float = 3.0) -> str:
        """Gather every node's workers now, write the hang report, publish it; the diagnosis line."""
        from rallypoint.agent.debug_hang import make_report, write_report

        started = time.monotonic()
        try:
            rid = request(self.backend, why, hang_of=self.node_id)
            answers, missing = gather(self.backend, rid, timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - the backend is away: this node's workers only
            rid, missing = "local", [f"every other node ({type(exc).__name__}: {exc})"]
            answers = [{"node": self.node_id, "host": self.host, "workers": self.collect()}]
        report = make_report(self.backend, rid, why, answers, missing)
        self.diagnosis = report["diagnosis"]
        log_dir = self._log_dir()
        path = write_report(log_dir, report) if log_dir is not None else None
        say(f"{self.diagnosis} (gathered in {time.monotonic() - started:.1f}s; report: {path})")
        return self.diagnosis

    def _keep(self, rid: str) -> None:
        """Another node saw a hang: keep its report next to this node's failure.json (in a thread)."""
        from rallypoint.agent.debug_hang import keep_report

        log_dir = self._log_dir()
        if log_dir is None:
            return

        def keep() -> None:
            with contextlib.suppress(Exception):
                self.diagnosis = keep_report(self.backend, rid, log_dir) or self.diagnosis

        threading.Thread(target=keep, name="rallypoint-debug-keep", daemon=True).start()

    def _serve(self) -> None:
        version = None
        first = True
        while not self._stop.is_set():
            try:
                entry = self.backend.get(DEBUG_REQUEST_KEY)
                if entry is not None:
                    version = entry.version
                    rid = str(entry.value.get("id")) if isinstance(entry.value, dict) else None
                    if first and _dated_before(entry.value, self._started):  # asked before this agent started
                        self._answered = rid
                    elif rid and rid != self._answered:
                        self._answered = rid
                        self.answer(rid)
                        if entry.value.get("hang") and entry.value.get("node") != self.node_id:
                            self._keep(rid)
                first = False
                self.backend.watch(DEBUG_REQUEST_KEY, version=version, timeout=1.0)
            except Exception as exc:  # noqa: BLE001 - the backend may be away for a while: retry
                log.debug("debug service: %s", exc)
                self._stop.wait(1.0)


def _dated_before(value: Any, moment: float) -> bool:
    """Whether request ``value`` was made before ``moment`` (an undated request counts as old)."""
    when = value.get("time") if isinstance(value, dict) else None
    return not isinstance(when, int | float) or when < moment


def request(backend: RendezvousBackend, by: str, *, hang_of: str | None = None) -> str:
    """Ask every agent of the run for its workers; the request's id.

    ``hang_of``: the node that saw a hang and will publish the report (the others keep it).
    """
    rid = uuid.uuid4().hex[:12]
    ttl = REPLY_TTL if getattr(backend, "supports_ttl", False) else None
    value: dict[str, Any] = {"id": rid, "by": by, "time": time.time()}
    if hang_of is not None:
        value.update(hang=True, node=hang_of)
    backend.set(DEBUG_REQUEST_KEY, value, ttl=ttl)
    return rid


def alive_nodes(backend: RendezvousBackend) -> set[str]:
    """The nodes whose heartbeat is in the key space (those expected to answer)."""
    return {key.split("/", 1)[1] for key in backend.list("hb/")}


def gather(
    backend: RendezvousBackend, rid: str, *, timeout: float = 4.0, expect: set[str] | None = None
) -> tuple[list[dict[str, Any]], list[str]]:
    """The answers to request ``rid``, once every expected node answered or ``timeout`` passed.

    Returns:
        the answers (sorted by host, node) and the expected nodes that did not answer.
    """
    expect = alive_nodes(backend) if expect is None else expect
    deadline = time.monotonic() + timeout
    prefix = debug_reply_prefix(rid)
    while True:
        entries = backend.list(prefix)
        replies = {key[len(prefix) :]: e for key, e in entries.items()}
        missing = sorted(expect - set(replies))
        left = deadline - time.monotonic()
        if (not missing and replies) or left <= 0:
            break
        backend.watch_prefix(prefix, versions={k: e.version for k, e in entries.items()}, timeout=min(left, 0.5))
    answers = [e.value for e in replies.values() if isinstance(e.value, dict)]
    answers.sort(key=lambda a: (str(a.get("host")), str(a.get("node"))))
    return answers, missing
