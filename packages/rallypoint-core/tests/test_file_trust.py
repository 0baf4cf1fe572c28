"""FileTrust.path_problem: the directories on the way to a private one let no other user replace it.

The tests run as root (as CI does); uid/gid 65534 (``nobody``/``nogroup``) is the other user.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rallypoint.core.file_trust import FileTrust

NOBODY = 65534


@pytest.fixture
def top() -> Iterator[Path]:
    """A root-owned directory under /tmp (a sticky directory every user may write)."""
    path = Path(tempfile.mkdtemp(prefix="rallypoint-trust-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)


def trust() -> FileTrust:
    return FileTrust(os.geteuid())


def test_a_path_of_private_directories_is_trusted_even_where_it_does_not_exist_yet(top: Path) -> None:
    (top / "a").mkdir(mode=0o700)
    assert trust().path_problem(top / "a" / "logs") is None
    assert trust().path_problem(top / "a" / "not" / "there" / "logs") is None


@pytest.mark.parametrize(("mode", "who"), [(0o777, "every user"), (0o775, "group gid 65534 (nogroup)")])
def test_a_directory_others_may_write_without_the_sticky_bit_is_named(top: Path, mode: int, who: str) -> None:
    (top / "open" / "deep").mkdir(parents=True)
    os.chown(top / "open", -1, NOBODY)
    (top / "open").chmod(mode)
    assert trust().path_problem(top / "open" / "deep" / "logs") == (
        top / "open",
        f"is writable by {who} (mode {mode:04o}) and has no sticky bit",
    )
    (top / "open").chmod(mode | 0o1000)  # sticky: only an entry's owner may replace it
    assert trust().path_problem(top / "open" / "deep" / "logs") is None


def test_an_entry_of_another_user_in_a_sticky_directory_is_named(top: Path) -> None:
    (top / "tmp").mkdir()
    (top / "tmp").chmod(0o1777)
    (top / "tmp" / "theirs").mkdir(mode=0o755)
    os.chown(top / "tmp" / "theirs", NOBODY, NOBODY)
    problem = trust().path_problem(top / "tmp" / "theirs" / "logs")
    assert problem == (top / "tmp" / "theirs", "is owned by uid 65534 (nobody) in a directory every user may write to")


def test_a_link_another_user_planted_in_a_sticky_directory_is_named(top: Path) -> None:
    (top / "tmp").mkdir()
    (top / "tmp").chmod(0o1777)
    (top / "mine").mkdir(mode=0o700)
    link = top / "tmp" / "link"
    link.symlink_to(top / "mine")
    os.lchown(link, NOBODY, NOBODY)
    assert trust().path_problem(link / "logs") == (
        link,
        "is owned by uid 65534 (nobody) in a directory every user may write to",
    )
    os.lchown(link, os.geteuid(), -1)  # a link of yours there is followed, and its target checked
    assert trust().path_problem(link / "logs") is None


def test_a_group_that_is_yours_alone_may_write_a_directory_on_the_way(top: Path) -> None:
    (top / "upg").mkdir()
    os.chown(top / "upg", -1, os.getegid())  # root's group is named like root and has no other member
    (top / "upg").chmod(0o775)
    assert trust().path_problem(top / "upg" / "logs") is None
