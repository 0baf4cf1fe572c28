"""``[rendezvous.options] path`` is checked with the job: the run directory must be creatable there.

An empty path used to mean the current directory, and a path where no directory can be made
(``/proc/sys``) failed after start-up with exit 1.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from rallypoint_file.backend import FileOptions


def refused(path: str, **more: object) -> str:
    with pytest.raises(ValidationError) as info:
        FileOptions.model_validate({"path": path, **more})
    return str(info.value)


@pytest.mark.parametrize("path", ["", "  "])
def test_an_empty_path_is_refused(path: str) -> None:
    assert "the path is empty; give a directory every node can reach" in refused(path)


def test_a_path_where_no_directory_can_be_made_is_refused() -> None:
    message = refused("/proc/sys/rallypoint")  # root may write there by its permissions, yet mkdir fails
    assert "cannot create a directory in /proc/sys: No such file or directory" in message
    assert "give a directory this user can write, on a file system every node shares" in message


def test_a_path_under_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    assert f"{tmp_path / 'file'} is not a directory" in refused(str(tmp_path / "file" / "rdzv"))


def test_a_creatable_path_is_accepted_and_left_as_it_was(tmp_path: Path) -> None:
    opts = FileOptions.model_validate({"path": str(tmp_path / "a" / "b")})
    assert opts.path == str(tmp_path / "a" / "b")
    assert list(tmp_path.iterdir()) == []  # checking made nothing (its probe directory is gone)


def test_read_only_creates_nothing_and_is_not_probed() -> None:
    # `rallypoint status` opens an existing run directory to read it: the backend says if it is missing
    assert FileOptions.model_validate({"path": "/proc/sys/rallypoint", "read_only": True}).read_only
