"""rallypoint.agent.worker_main: a Python worker runs its script as ``python`` would, and ends without finalization."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rallypoint.agent import worker_main

PY = sys.executable

REPORT = """
import json, os, sys
with open(os.environ["OUT"], "w") as f:
    json.dump({"argv": sys.argv, "name": __name__, "file": __file__, "path": sys.path,
               "main_file": sys.modules["__main__"].__file__}, f)
"""


def run(argv: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True, timeout=60)


def test_a_script_sees_the_argv_path_and_name_python_script_py_gives_it(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    script = tmp_path / "sub" / "report.py"
    script.write_text(REPORT)
    out = tmp_path / "out.json"
    theirs = run([PY, "-u", "sub/report.py", "a", "--b"], tmp_path, OUT=str(out))
    assert theirs.returncode == 0, theirs.stderr
    python = json.loads(out.read_text())
    ours = run(worker_main.command(PY, "sub/report.py", ["a", "--b"]), tmp_path, OUT=str(out))
    assert ours.returncode == 0, ours.stderr
    seen = json.loads(out.read_text())
    for key in ("argv", "name", "file", "main_file"):
        assert seen[key] == python[key], key
    assert seen["argv"] == ["sub/report.py", "a", "--b"]
    assert seen["path"][0] == python["path"][0] == str(tmp_path / "sub")
    assert os.path.dirname(worker_main.PATH) not in seen["path"]  # rallypoint's own directory is not importable


def test_the_script_is_main_until_the_end_and_compiled_as_python_compiles_it(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        textwrap.dedent(
            """
            import atexit, sys
            marker = "the script's"
            atexit.register(lambda: print(sys.modules["__main__"].marker))
            def g(x: undefined_name): ...  # evaluated now: worker_main's __future__ import does not leak in
            """
        )
    )
    for argv in ([PY, "-u", str(tmp_path / "m.py")], worker_main.command(PY, str(tmp_path / "m.py"))):
        proc = run(argv, tmp_path)
        assert proc.returncode == 1
        assert proc.stdout == "the script's\n"
        assert "NameError: name 'undefined_name' is not defined" in proc.stderr


def test_module_mode_runs_the_module_as_main_from_the_working_directory(tmp_path: Path) -> None:
    (tmp_path / "wpkg").mkdir()
    (tmp_path / "wpkg" / "__init__.py").write_text("")
    (tmp_path / "wpkg" / "job.py").write_text(
        "import os, sys\nif __name__ == '__main__':\n    assert sys.path[0] == os.getcwd(), sys.path\n"
        "    sys.exit(len(sys.argv[1:]) + 40)\n"
    )
    proc = run(worker_main.command(PY, "wpkg.job", ["a", "b"], module=True), tmp_path)
    assert proc.returncode == 42, proc.stderr


@pytest.mark.parametrize(
    ("body", "returncode", "stderr"),
    [
        ("import sys\nsys.exit('bye')\n", 1, "bye\n"),
        ("import sys\nsys.exit(None)\n", 0, ""),
        ("import sys\nsys.exit(300)\n", 300 & 0xFF, ""),
        ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", -signal.SIGKILL, ""),
        ("import os\nos.abort()\n", -signal.SIGABRT, ""),  # a worker that really aborts still dies of SIGABRT
        ("raise KeyboardInterrupt\n", -signal.SIGINT, "KeyboardInterrupt"),
        ("def f():\n    raise ValueError('boom')\nf()\n", 1, "ValueError: boom"),
    ],
)
def test_exit_codes_signals_and_tracebacks_are_those_of_python(
    tmp_path: Path, body: str, returncode: int, stderr: str
) -> None:
    (tmp_path / "s.py").write_text(body)
    proc = run(worker_main.command(PY, str(tmp_path / "s.py")), tmp_path)
    assert proc.returncode == returncode
    assert stderr in proc.stderr
    assert "worker_main" not in proc.stderr  # the traceback shows the script only
    assert "runpy" not in proc.stderr
    if "boom" in stderr:
        assert proc.stderr.startswith("Traceback (most recent call last):\n  File ")
        assert str(tmp_path / "s.py") in proc.stderr.splitlines()[1]


def test_a_missing_script_exits_2_like_python(tmp_path: Path) -> None:
    proc = run(worker_main.command(PY, str(tmp_path / "nope.py")), tmp_path)
    assert proc.returncode == 2
    assert "can't open file" in proc.stderr


def test_the_end_joins_threads_runs_atexit_and_flushes_python_and_c_output(tmp_path: Path) -> None:
    (tmp_path / "end.py").write_text(
        textwrap.dedent(
            """
            import atexit, ctypes, sys, threading, time
            def late():
                time.sleep(0.2)
                print("thread joined")
            threading.Thread(target=late).start()
            atexit.register(lambda: print("atexit ran"))
            sys.stdout.write("no newline, python")
            libc = ctypes.CDLL(None)
            libc.fopen.restype = ctypes.c_void_p
            libc.fputs.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
            libc.fputs(b"from C, never closed", libc.fopen(sys.argv[1].encode(), b"w"))  # C's own buffer
            sys.exit(5)
            """
        )
    )
    proc = run(worker_main.command(PY, str(tmp_path / "end.py"), [str(tmp_path / "c.txt")]), tmp_path)
    assert proc.returncode == 5, proc.stderr
    assert "thread joined" in proc.stdout
    assert "atexit ran" in proc.stdout
    assert "no newline, python" in proc.stdout
    assert (tmp_path / "c.txt").read_text() == "from C, never closed"


def test_files_left_open_are_flushed_as_finalization_would(tmp_path: Path) -> None:
    (tmp_path / "files.py").write_text(
        textwrap.dedent(
            """
            import sys
            log = open(sys.argv[1] + "/log.txt", "w")
            log.write("first line\\nno newline")
            raw = open(sys.argv[1] + "/data.bin", "wb")
            raw.write(b"\\x00" * 100)
            """
        )
    )
    proc = run(worker_main.command(PY, str(tmp_path / "files.py"), [str(tmp_path)]), tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "log.txt").read_text() == "first line\nno newline"
    assert (tmp_path / "data.bin").read_bytes() == b"\x00" * 100


def test_objects_alive_at_the_end_are_not_finalized(tmp_path: Path) -> None:
    """The documented price of ending without the interpreter's finalization."""
    (tmp_path / "fin.py").write_text(
        "import sys\nclass Last:\n    def __del__(self):\n        print('finalized')\nkeep = Last()\n"
    )
    assert run([PY, "-u", str(tmp_path / "fin.py")], tmp_path).stdout == "finalized\n"
    assert run(worker_main.command(PY, str(tmp_path / "fin.py")), tmp_path).stdout == ""


def test_parse_argv_reads_both_command_lines() -> None:
    assert worker_main.parse_argv(worker_main.command(PY, "t.py", ["-x"])) == ("script", "t.py", ["-x"])
    assert worker_main.parse_argv([PY, "-u", "t.py"]) == ("script", "t.py", [])
    assert worker_main.parse_argv([PY, "-u", "-m", "pkg.t", "y"]) == ("module", "pkg.t", ["y"])
    with pytest.raises(ValueError, match="not a Python script"):
        worker_main.parse_argv(["/bin/true", "-c", "x"])


def test_the_end_reads_no_objects_class_so_nothing_warns(tmp_path: Path) -> None:
    """Objects whose ``__class__`` warns when read stay quiet at the end.

    The scan for open files used ``isinstance``, which reads ``__class__``: every worker that
    imported ``torch.distributed`` printed torch's ``reduce_op`` deprecation warning as it ended.
    """
    (tmp_path / "loud.py").write_text(
        textwrap.dedent(
            """
            import warnings
            class Loud:
                @property
                def __class__(self):
                    warnings.warn("__class__ was read", FutureWarning, stacklevel=2)
                    return Loud
            keep = Loud()
            """
        )
    )
    proc = run(worker_main.command(PY, str(tmp_path / "loud.py")), tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "__class__ was read" not in proc.stderr, proc.stderr
