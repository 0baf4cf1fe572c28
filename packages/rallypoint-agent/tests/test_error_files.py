"""Tests of rallypoint.agent.error_files: error files written by real crashing scripts, and read back."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from rallypoint.agent.error_files import (
    ERROR_FILE_ENV,
    error_payload,
    install_excepthook,
    read_error_file,
    record,
    write_error_file,
)

PY = sys.executable


def run_script(code: str, error_file, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k not in (ERROR_FILE_ENV, "RANK", "LOCAL_RANK")}
    if error_file is not None:
        full_env[ERROR_FILE_ENV] = str(error_file)
    full_env.update(env)
    return subprocess.run(
        [PY, "-c", textwrap.dedent(code)], env=full_env, capture_output=True, text=True, timeout=30, check=False
    )


CRASH = """
    from rallypoint.agent.error_files import record

    def helper():
        raise ValueError("bad input 42")

    @record
    def main():
        helper()

    main()
"""


def test_crashing_script_writes_an_error_file_that_reads_back(tmp_path):
    error_file = tmp_path / "attempt_0" / "0" / "error.json"  # parent dirs are created
    proc = run_script(CRASH, error_file, RANK="3", LOCAL_RANK="1")
    assert proc.returncode == 1
    assert "ValueError: bad input 42" in proc.stderr  # the traceback still reaches stderr

    err = read_error_file(error_file)
    assert err is not None
    assert err.problem is None
    assert err.path == error_file
    assert err.message == "ValueError: bad input 42"
    assert err.exception_type == "ValueError"
    assert err.traceback is not None
    assert "in helper" in err.traceback
    assert "in main" in err.traceback
    assert err.traceback.rstrip().endswith("ValueError: bad input 42")
    assert err.rank == 3
    assert err.local_rank == 1
    assert err.host == socket.gethostname()
    assert isinstance(err.pid, int)
    assert err.pid != os.getpid()
    assert err.timestamp is not None
    assert err.timestamp > 1.6e9

    # torch's layout, so torch's reader finds what it looks for
    data = json.loads(error_file.read_text())
    assert data["message"]["message"] == "ValueError: bad input 42"
    assert data["message"]["extraInfo"]["py_callstack"] == err.traceback
    assert data["message"]["extraInfo"]["timestamp"].isdigit()
    assert data["rallypoint"]["exception_module"] == "builtins"
    assert [p.name for p in error_file.parent.iterdir()] == ["error.json"]  # no temp file left


def test_system_exit_zero_is_not_an_error(tmp_path):
    error_file = tmp_path / "error.json"
    code = "from rallypoint.agent.error_files import record\n@record\ndef main():\n    raise SystemExit(0)\nmain()\n"
    assert run_script(code, error_file).returncode == 0
    assert not error_file.exists()
    code = "import sys\nfrom rallypoint.agent.error_files import record\n"
    code += "@record()\ndef main():\n    sys.exit()\nmain()\n"
    assert run_script(code, error_file).returncode == 0
    assert not error_file.exists()


def test_nonzero_system_exit_is_recorded_and_keeps_its_code(tmp_path):
    error_file = tmp_path / "error.json"
    code = "import sys\nfrom rallypoint.agent.error_files import record\n"
    code += "@record\ndef main():\n    sys.exit(3)\nmain()\n"
    assert run_script(code, error_file).returncode == 3
    err = read_error_file(error_file)
    assert err is not None
    assert err.exception_type == "SystemExit"
    assert err.message == "SystemExit: 3"


def test_install_excepthook(tmp_path):
    error_file = tmp_path / "error.json"
    code = """
        from rallypoint.agent.error_files import install_excepthook
        install_excepthook()
        install_excepthook()  # idempotent
        class CustomError(RuntimeError):
            pass
        raise CustomError("from module level")
    """
    proc = run_script(code, error_file)
    assert proc.returncode == 1
    assert proc.stderr.count("CustomError: from module level") == 1  # chained hook printed it once
    err = read_error_file(error_file)
    assert err is not None
    assert err.exception_type == "CustomError"
    assert err.message == "CustomError: from module level"
    assert "<module>" in (err.traceback or "")


def test_without_error_file_env_nothing_is_written_and_the_error_propagates(tmp_path):
    proc = run_script(CRASH, None)
    assert proc.returncode == 1
    assert "ValueError: bad input 42" in proc.stderr
    assert "could not write error file" not in proc.stderr
    proc = run_script(CRASH, "")  # torch's "logs go nowhere" convention
    assert proc.returncode == 1


def test_unwritable_error_file_does_not_hide_the_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    proc = run_script(CRASH, blocker / "error.json")
    assert proc.returncode == 1
    assert f"could not write error file {blocker / 'error.json'}" in proc.stderr
    assert "ValueError: bad input 42" in proc.stderr


def test_record_in_process(tmp_path, monkeypatch):
    error_file = tmp_path / "e.json"
    monkeypatch.setenv(ERROR_FILE_ENV, str(error_file))
    monkeypatch.setenv("RANK", "not-a-number")

    @record
    def ok(x: int) -> int:
        return x + 1

    @record
    def boom() -> None:
        raise KeyError("k")

    assert ok(1) == 2
    assert ok.__name__ == "ok"
    assert not error_file.exists()
    with pytest.raises(KeyError):
        boom()
    err = read_error_file(error_file)
    assert err is not None
    assert err.exception_type == "KeyError"
    assert err.message == "KeyError: 'k'"
    assert err.rank is None


def test_write_error_file_explicit_path_and_payload(tmp_path):
    with pytest.raises(RuntimeError) as info:
        raise RuntimeError()
    assert write_error_file(info.value, tmp_path / "x.json") == tmp_path / "x.json"
    payload = error_payload(info.value, timestamp=1700000000.5)
    assert payload["message"]["message"] == "RuntimeError"
    assert payload["message"]["extraInfo"]["timestamp"] == "1700000000"
    assert payload["rallypoint"]["timestamp"] == 1700000000.5
    assert read_error_file(tmp_path / "x.json").message == "RuntimeError"


def test_install_excepthook_in_process(monkeypatch):
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    install_excepthook()
    hook = sys.excepthook
    assert hook is not sys.__excepthook__
    install_excepthook()
    assert sys.excepthook is hook


# -- reading files written by torch, and broken files -----------------------------------------------


def test_read_torch_written_file(tmp_path):
    path = tmp_path / "error.json"
    path.write_text(
        json.dumps(
            {
                "message": {
                    "message": "RuntimeError: CUDA error: out of memory",
                    "extraInfo": {"py_callstack": "Traceback ...\nRuntimeError: CUDA error", "timestamp": "1700000001"},
                    "errorCode": 1,
                }
            }
        )
    )
    err = read_error_file(path)
    assert err is not None
    assert err.problem is None
    assert err.exception_type == "RuntimeError"
    assert err.message == "RuntimeError: CUDA error: out of memory"
    assert err.traceback == "Traceback ...\nRuntimeError: CUDA error"
    assert err.timestamp == 1700000001.0
    assert err.error_code == 1
    assert err.rank is None
    assert err.host is None
    assert err.pid is None


def test_read_old_string_layout_and_dotted_type(tmp_path):
    path = tmp_path / "error.json"
    path.write_text(json.dumps({"message": "torch.distributed.DistBackendError: NCCL timeout"}))
    err = read_error_file(path)
    assert err is not None
    assert err.problem is None
    assert err.exception_type == "DistBackendError"
    assert err.traceback is None
    assert err.timestamp is None


def test_read_missing_file_is_none(tmp_path):
    assert read_error_file(tmp_path / "nope.json") is None


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("", "is empty"),
        ('{"message": {"message": "Val', "is not valid JSON"),
        ("[1, 2]", 'has no "message" field'),
        ('{"other": 1}', 'has no "message" field'),
        ('{"message": 5}', "unexpected type"),
    ],
)
def test_read_corrupt_file_names_the_file(tmp_path, content, problem):
    path = tmp_path / "error.json"
    path.write_text(content)
    err = read_error_file(path)
    assert err is not None
    assert err.problem is not None
    assert problem in err.problem
    assert str(path) in err.message
    assert problem in err.message


def test_read_unreadable_path(tmp_path):
    err = read_error_file(tmp_path)  # a directory
    assert err is not None
    assert err.problem is not None
    assert "could not be read" in err.message
    assert str(tmp_path) in err.message


def test_read_tolerates_odd_field_types(tmp_path):
    path = tmp_path / "error.json"
    path.write_text(
        json.dumps(
            {
                "message": {"message": "", "extraInfo": "nope", "errorCode": "x"},
                "rallypoint": {"rank": "2", "pid": True, "host": 7, "timestamp": "bad"},
            }
        )
    )
    err = read_error_file(path)
    assert err is not None
    assert str(path) in err.message  # empty message replaced by one that names the file
    assert err.rank == 2
    assert err.pid is None
    assert err.host is None
    assert err.timestamp is None
    assert err.error_code is None
    assert err.traceback is None


def test_an_error_file_is_never_read_through_a_link(tmp_path):
    """A link in the error file's place (issue #35, item 6) could put any JSON file of root's into the report."""
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps({"message": "SecretError: the content of a file the worker never wrote"}))
    link = tmp_path / "rank_0.error.json"
    link.symlink_to(elsewhere)
    err = read_error_file(link)
    assert err is not None
    assert err.problem == "is a symbolic link; rallypoint never reads an error file through one"
    assert "SecretError" not in err.message
    assert err.message == f"error file {link} is a symbolic link; rallypoint never reads an error file through one"
