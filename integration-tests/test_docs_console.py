"""Every ``console`` block of the docs and the README runs, and prints what it quotes (#41).

The notation (docs/contributing.md, "Writing docs that run"):

* ``$ COMMAND`` is a command (a trailing ``\\`` continues it on the next line); the lines after it,
  up to the next ``$`` line, are its output (stdout and stderr together).
* In the output, a line ``...`` stands for any number of lines (none included), and ``<any>`` in
  a line for any text within that line (times, pids, paths).
* A command quoted without output has its output unchecked; its exit status must be 0 unless
  the next command is ``echo $?`` (which then prints it).
* Lines starting with ``#`` before the first command are comments.
* HTML comments on the lines right before the block (not shown on the page):
  ``<!-- docs-test: skip: REASON -->`` keeps a block that cannot run here (a GPU, a real cluster)
  out, with the reason; ``<!-- docs-test: setup: SHELL -->`` runs SHELL first in the block's
  directory (``$ROOT`` is the repository; ``.venv`` there is the repository's).

Each block runs in a fresh temporary directory, its commands one after the other in one shell,
with the repository's ``.venv/bin`` first on ``PATH``.
"""

from __future__ import annotations

import difflib
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from doc_blocks import ROOT, Block, blocks

#: The longest a block may take, in seconds.
BLOCK_TIMEOUT = 120
_END = "@@docs-test-end {rc}@@"
_END_RE = re.compile(r"^@@docs-test-end (\d+)@@$", re.M)


@dataclass
class Step:
    """One command of a block, with the output it quotes."""

    line: int  #: its line in the page
    command: str
    expected: list[str] = field(default_factory=list)


def parse_console(block: Block) -> list[Step]:
    """The commands of a ``console`` block and the output each quotes."""
    steps: list[Step] = []
    lines = block.text.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        number = block.line + 1 + index
        index += 1
        if line.startswith("$ "):
            command = line[2:]
            while command.endswith("\\") and index < len(lines):
                command = command[:-1] + " " + lines[index].strip()
                index += 1
            steps.append(Step(number, command))
        elif not steps and (line.startswith("#") or not line.strip()):
            continue
        elif not steps:
            raise AssertionError(f"{block.where}: output before the first '$ ' command: {line!r}")
        else:
            steps[-1].expected.append(line.rstrip())
    while steps and steps[-1].expected and not steps[-1].expected[-1]:
        steps[-1].expected.pop()
    return steps


def output_pattern(expected: list[str]) -> re.Pattern[str]:
    """A pattern for quoted output: ``...`` lines are any lines, ``<any>`` any text in a line."""
    parts = []
    for line in expected:
        if line.strip() == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            parts.append(".*?".join(re.escape(piece) for piece in line.split("<any>")) + r"\n")
    return re.compile("".join(parts))


def output_matches(expected: list[str], actual: str) -> bool:
    """Whether ``actual`` (lines, trailing blanks ignored) is what ``expected`` quotes."""
    lines = [line.rstrip() for line in actual.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    text = "".join(line + "\n" for line in lines)
    return output_pattern(expected).fullmatch(text) is not None


def _setup(block: Block) -> list[str]:
    source = block.page.read_text().splitlines()
    found = []
    index = block.line - 2
    while index >= 0 and source[index].strip().startswith("<!--"):
        marked = re.match(r"\s*<!--\s*docs-test:\s*setup:\s*(.+?)\s*-->\s*$", source[index])
        if marked:
            found.insert(0, marked.group(1))
        index -= 1
    return found


def run_block(block: Block, workdir: Path) -> list[tuple[Step, int, str]]:
    """Run the block's commands in one shell in ``workdir``: ``(step, exit status, output)`` each."""
    steps = parse_console(block)
    (workdir / ".venv").symlink_to(ROOT / ".venv")
    script = ["set +e", *_setup(block)]
    for step in steps:
        script += [step.command, "__rc=$?", f"printf '\\n{_END}\\n' \"$__rc\"".replace("{rc}", "%d"), "(exit $__rc)"]
    env = {
        **os.environ,
        "ROOT": str(ROOT),
        "PATH": f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        "NO_COLOR": "1",
        "COLUMNS": "100",
    }
    env.pop("VIRTUAL_ENV", None)
    done = subprocess.run(
        ["bash", "-c", "\n".join(script)],
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=BLOCK_TIMEOUT,
        check=False,
    )
    results = []
    rest = done.stdout
    for step in steps:
        match = _END_RE.search(rest)
        if match is None:
            results.append((step, -1, rest))
            break
        output = rest[: match.start()]
        output = output[:-1] if output.endswith("\n") else output  # the newline printf added
        results.append((step, int(match.group(1)), output))
        rest = rest[match.end() + 1 :]
    return results


CONSOLE = blocks("console")
#: The blocks run here; a marked block (a real cluster, a server that runs until stopped) is not a
#: test at all: it is only checked to carry a reason.
RUNNABLE = [block for block in CONSOLE if not block.skip]


def test_the_docs_have_console_blocks_to_run() -> None:
    assert len(RUNNABLE) >= 2


def test_every_block_not_run_says_why() -> None:
    marked = [block for block in CONSOLE if block.skip]
    assert all(len(block.skip.strip()) >= 10 for block in marked), [block.where for block in marked]


@pytest.mark.parametrize("block", RUNNABLE, ids=[block.where for block in RUNNABLE])
def test_console_block_prints_what_it_quotes(block: Block, tmp_path: Path) -> None:
    results = run_block(block, tmp_path)
    steps = parse_console(block)
    assert len(results) == len(steps), f"{block.where}: the block stopped early: {results[-1][2] if results else ''}"
    for index, (step, rc, output) in enumerate(results):
        where = f"{block.page.relative_to(ROOT)}:{step.line}"
        checked_next = index + 1 < len(steps) and steps[index + 1].command.strip() == "echo $?"
        if rc != 0 and not checked_next:
            pytest.fail(f"{where}: `{step.command}` exited {rc}:\n{output}")
        if step.expected and not output_matches(step.expected, output):
            diff = "\n".join(difflib.unified_diff(step.expected, output.splitlines(), "quoted", "printed", lineterm=""))
            pytest.fail(f"{where}: `{step.command}` printed something else than the page quotes:\n{diff}")


#: Languages of blocks that quote commands or output without being run.
_QUOTING = ("text", "bash", "shell", "sh", "")


def quotes_a_session(block: Block) -> bool:
    """Whether a block that is not ``console`` quotes a session: a ``$ `` command or an error line first."""
    first = next((line for line in block.text.splitlines() if line.strip()), "")
    return first.startswith(("$ ", "error:", "Error:"))


def test_quoted_sessions_are_console_blocks() -> None:
    # A command with its output, or what a command printed, in a `text` block is not run: it
    # drifts unseen. It belongs in a `console` block, or is marked with the reason it cannot run.
    unrun = [block.where for lang in _QUOTING for block in blocks(lang) if not block.skip and quotes_a_session(block)]
    assert not unrun, f"quoted output that no test runs: make these console blocks, or mark them skipped: {unrun}"


def test_the_notation() -> None:
    quoted = ["start <any> ms", "...", "done"]
    assert output_matches(quoted, "start 12.5 ms\nline\nline\ndone\n")
    assert output_matches(quoted, "start 1 ms\ndone")
    assert not output_matches(quoted, "start 1 ms\ndone\nextra\n")
    assert not output_matches(["exact"], "exactly\n")
    assert not output_matches(["a <any> b"], "a x\ny b\n")
