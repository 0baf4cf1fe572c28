"""file_problem / variable_problem: what a plugin's options model checks of the files and variables it names."""

from __future__ import annotations

import os
from pathlib import Path

from rallypoint.core.config import file_problem, variable_problem


def test_a_readable_file_passes(tmp_path: Path) -> None:
    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\nx\n")
    assert file_problem(str(tmp_path / "ca.pem"), "CA certificate", pem=True) is None
    assert file_problem(str(tmp_path / "ca.pem"), "token file") is None


def test_what_cannot_serve_is_said(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")  # never opened: a read would wait for a writer
    (tmp_path / "big").write_bytes(b"x" * 2048)
    (tmp_path / "blank").write_text("\n \n")
    (tmp_path / "text").write_text("hello")
    cases = {
        "/nonexistent/x": "cannot read the CA certificate /nonexistent/x: No such file or directory",
        str(tmp_path): f"the CA certificate {tmp_path} is a directory, not a file",
        str(tmp_path / "fifo"): f"the CA certificate {tmp_path / 'fifo'} is a named pipe (FIFO), not a file",
        "/dev/zero": "the CA certificate /dev/zero is a device, not a file",
        str(tmp_path / "big"): f"the CA certificate {tmp_path / 'big'} is larger than 1 KiB; is it the right file?",
        str(tmp_path / "blank"): f"the CA certificate {tmp_path / 'blank'} is empty",
        str(tmp_path / "text"): f"the CA certificate {tmp_path / 'text'} is not a PEM file (no '-----BEGIN' line)",
    }
    for path, said in cases.items():
        assert file_problem(path, "CA certificate", pem=True, max_bytes=1024) == said


def test_a_variable_must_be_set_and_not_blank_unless_allowed() -> None:
    assert variable_problem("X", "token", environ={}) == "the variable X (token) is not set in this environment"
    assert variable_problem("X", "token", environ={"X": " "}) == "the variable X (token) is empty"
    assert variable_problem("X", "password", allow_empty=True, environ={"X": ""}) is None
    assert variable_problem("X", "token", environ={"X": "s3cret"}) is None
