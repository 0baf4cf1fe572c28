"""How a Python worker runs its script, and how it ends.

The agent starts a Python worker as ``python -u /.../rallypoint/agent/worker_main.py train.py ARGS``
(``... worker_main.py -m package.module ARGS`` for ``-m``) rather than ``python -u train.py ARGS``.
This file runs the script as ``__main__`` the way ``python`` does (``sys.argv``, ``sys.path[0]``,
the exit status, the traceback of an uncaught exception, exit by ``SIGINT`` after an uncaught
``KeyboardInterrupt``); warm workers (:mod:`rallypoint.agent.warm`) run theirs through the same code.

What differs is the end. After the script, the worker does what the interpreter does first when
it exits (join the threads that are not daemons, run the ``atexit`` handlers), flushes what
finalization would have written out (files left open, stdout and stderr, Python's and C's
buffers both) and then ends with :func:`os._exit`, skipping the interpreter's finalization, as
Python's own ``multiprocessing`` children do. Finalization races
torch's background threads: once it has begun, a thread that asks for the GIL is ended on the spot
(``pthread_exit``), and when that thread is inside a C++ destructor the C++ runtime aborts the
whole process. A Gloo process group's worker thread does exactly that when it drops the last
reference to a collective that has just finished: the tensors' Python objects need the GIL. A
worker that finished its work and printed its result then dies of ``SIGABRT`` with ``terminate
called without an active exception``: measured here, in 3 to 18 of 50 starts of a group of two
workers that end right after a collective without ``destroy_process_group()`` (issue #35;
torchrun's workers abort the same way). Without finalization, nothing ends that thread early.

The price: objects still alive at the end are not finalized. ``__del__`` methods of objects alive
at exit do not run, and a file left open is flushed but not closed, so a compressed file (``gzip``,
``bz2``) the script never closed misses its end. Python promises neither at exit: close files, or
use ``with``.

Run by path: it imports nothing of rallypoint, so a worker's :data:`sys.modules` holds what its
script imported, plus the few standard modules this file needs. Its own directory is taken off
:data:`sys.path`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import traceback
from collections.abc import Sequence
from types import ModuleType, TracebackType
from typing import NoReturn

__all__ = ["PATH", "command", "main", "parse_argv", "run_main"]

#: This file, as Python workers' command lines name it.
PATH = os.path.realpath(__file__)
#: Python's status when it cannot open the script (``python missing.py``).
EXIT_NO_SCRIPT = 2


def command(executable: str, target: str, args: Sequence[str] = (), *, module: bool = False) -> list[str]:
    """The command line of a worker that runs the script (or, with ``module``, the module) ``target``.

    Example:
        >>> command("/usr/bin/python3", "train.py", ["--lr", "0.1"])[2:] == [PATH, "train.py", "--lr", "0.1"]
        True
        >>> command("/usr/bin/python3", "pkg.train", module=True)[3:]
        ['-m', 'pkg.train']
    """
    return [executable, "-u", PATH, *(["-m", target] if module else [target]), *args]


def parse_argv(argv: Sequence[str]) -> tuple[str, str, list[str]]:
    """What a Python command line runs, as ``(kind, target, args)``; ``kind`` is ``script`` or ``module``.

    Takes ``[python, -u, script, args...]`` and ``[python, -u, -m, module, args...]``, with or
    without this file before the script (as :func:`command` writes them).

    Raises:
        ValueError: ``argv`` does not run a Python script or module.

    Example:
        >>> parse_argv(command("python", "pkg.train", ["-x"], module=True))
        ('module', 'pkg.train', ['-x'])
    """
    rest = list(argv[1:])
    while rest and rest[0] == "-u":
        rest.pop(0)
    if rest and rest[0] == PATH:
        rest.pop(0)
    if len(rest) >= 2 and rest[0] == "-m":
        return "module", rest[1], rest[2:]
    if rest and not rest[0].startswith("-"):
        return "script", rest[0], rest[1:]
    raise ValueError(f"not a Python script or module command line: {list(argv)}")


def _visible_traceback(exc: BaseException) -> TracebackType | None:
    """The traceback without the frames of this file and of runpy, as ``python script.py`` shows it."""
    import runpy

    hidden = {PATH, os.path.abspath(__file__), runpy.run_path.__code__.co_filename, os.path.abspath(runpy.__file__)}
    tb = exc.__traceback__
    while tb is not None and {tb.tb_frame.f_code.co_filename, os.path.abspath(tb.tb_frame.f_code.co_filename)} & hidden:
        tb = tb.tb_next
    return tb


def _exit_status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    with contextlib.suppress(Exception):
        print(code, file=sys.stderr)
    return 1


def _fresh_main() -> ModuleType:
    """A new, empty ``__main__`` module in :data:`sys.modules`, where the script's code will run."""
    import builtins

    module = ModuleType("__main__")
    module.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = module
    return module


def _run_script(target: str) -> int:
    """Run the script ``target`` as ``python target`` does; ``2`` when there is no such file."""
    import importlib.machinery
    import io

    path = os.path.abspath(target)
    if not os.path.isfile(path):
        err = FileNotFoundError(2, "No such file or directory")
        print(f"{sys.executable}: can't open file {path!r}: [Errno 2] {err.strerror}", file=sys.stderr)
        return EXIT_NO_SCRIPT
    sys.path.insert(0, os.path.dirname(os.path.realpath(path)))
    with io.open_code(path) as f:
        source = f.read()
    module = _fresh_main()
    module.__dict__.update(
        __file__=path,  # absolute, as Python (3.9 and later) gives it to __main__
        __cached__=None,
        __loader__=importlib.machinery.SourceFileLoader("__main__", path),
        __spec__=None,
        __package__=None,
    )
    # dont_inherit: the script gets none of this file's __future__ imports
    exec(compile(source, path, "exec", dont_inherit=True), module.__dict__)
    return 0


def _run_module(name: str) -> None:
    """Run the module ``name`` as ``python -m name`` does."""
    import runpy

    sys.path.insert(0, os.getcwd())
    _fresh_main()
    # what the interpreter itself calls for -m: the module runs in the __main__ module's namespace
    # and stays there for the atexit handlers (run_module would put this file's module back)
    runpy._run_module_as_main(name, alter_argv=True)  # type: ignore[attr-defined]


def run_main(kind: str, target: str, args: list[str]) -> NoReturn:
    """Run the script or module ``target`` as ``__main__`` with ``args``, then end the process.

    Never returns: the process ends with the script's exit status (see the module docstring for
    how it ends).
    """
    status = 0
    interrupted = False
    _install_debug_hooks()
    sys.argv = [target, *args]
    try:
        if kind == "module":
            _run_module(target)
        else:
            status = _run_script(target)
    except SystemExit as exc:
        status = _exit_status(exc.code)
    except BaseException as exc:  # noqa: BLE001 - reported the way the interpreter reports it
        interrupted = isinstance(exc, KeyboardInterrupt)
        tb = _visible_traceback(exc)
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        status = 1
    _finish(status, interrupted)


def _install_debug_hooks() -> None:
    """With ``RALLYPOINT_WORKER_DEBUG_DIR``: stacks on request and the collective flight record (``debug_hooks.py``)."""
    directory = os.environ.get("RALLYPOINT_WORKER_DEBUG_DIR")
    if not directory:
        return
    import importlib.util

    path = os.path.join(os.path.dirname(PATH), "debug_hooks.py")
    spec = importlib.util.spec_from_file_location("_rallypoint_debug_hooks", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    module.install(directory, os.environ.get("RANK", str(os.getpid())))


def _flush_open_files() -> None:
    """Flush the files the script left open, whose buffers finalization would have written out.

    Text and buffered binary files (what ``open()`` returns) are found among the objects the
    garbage collector tracks: one pass over the heap, about half the time of the collection
    that finalization itself runs. They are flushed, not closed: daemon threads may still use them.
    """
    import gc
    import io

    kinds = (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom)
    # type(), not isinstance(): isinstance reads an object's __class__, and some objects warn when
    # it is read (torch.distributed.reduce_op's deprecation FutureWarning, in every worker at exit)
    found = [obj for obj in gc.get_objects() if issubclass(type(obj), kinds)]
    found.sort(key=lambda obj: not isinstance(obj, io.TextIOWrapper))  # text first: it writes into its buffer
    for obj in found:
        with contextlib.suppress(Exception):
            if not obj.closed:
                obj.flush()


def _flush_c_stdio() -> None:
    """Flush every C stream (``stdout``, files that C and C++ code opened), as ``exit()`` would."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).fflush(None)


def _finish(status: int, interrupted: bool) -> NoReturn:
    import atexit

    try:
        getattr(threading, "_shutdown", lambda: None)()  # join non-daemon threads, as at interpreter exit
        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
    _flush_open_files()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    _flush_c_stdio()
    if interrupted:  # an uncaught KeyboardInterrupt ends the interpreter by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        status = 128 + int(signal.SIGINT)
    os._exit(status)


def main(argv: list[str]) -> NoReturn:
    """``python -u worker_main.py SCRIPT ARGS...`` or ``... worker_main.py -m MODULE ARGS...``."""
    here = os.path.dirname(PATH)
    if sys.path and os.path.realpath(sys.path[0] or ".") == here:
        del sys.path[0]  # the script's directory (or, for -m, the working directory) takes its place
    try:
        kind, target, args = parse_argv([sys.executable, *argv[1:]])
    except ValueError:
        print(f"usage: {argv[0]} SCRIPT [ARGS...] | -m MODULE [ARGS...]", file=sys.stderr)
        os._exit(EXIT_NO_SCRIPT)
    run_main(kind, target, args)


if __name__ == "__main__":
    main(sys.argv)
