"""Colour of agent messages and errors: on a terminal only, never with ``NO_COLOR``."""

from __future__ import annotations

import io
import os
import pty
import subprocess
import sys

from rallypoint.agent.colour import agent_line, colour_enabled


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_agent_messages_are_coloured_on_a_terminal_only() -> None:
    failed = "job 'x' failed: rank 1 exited with exit code 1"
    assert agent_line("h", failed, io.StringIO(), {}) == f"[rallypoint h] {failed}"
    coloured = agent_line("h", failed, Terminal(), {})
    assert coloured == f"\x1b[1;36m[rallypoint h]\x1b[0m \x1b[31m{failed}\x1b[0m"
    assert "\x1b[32m" in agent_line("h", "job 'x' succeeded", Terminal(), {})
    assert agent_line("h", "round 0, attempt 0", Terminal(), {}).endswith("\x1b[0m round 0, attempt 0")


def test_no_color_and_dumb_terminals_turn_colour_off() -> None:
    assert colour_enabled(Terminal(), {})
    assert not colour_enabled(Terminal(), {"NO_COLOR": "1"})
    assert colour_enabled(Terminal(), {"NO_COLOR": ""})  # no-color.org: only a non-empty value counts
    assert not colour_enabled(Terminal(), {"TERM": "dumb"})
    assert agent_line("h", "job failed", Terminal(), {"NO_COLOR": "1"}) == "[rallypoint h] job failed"


def _stderr_on_a_terminal(args: list[str], env: dict[str, str]) -> str:
    """Run the CLI with stderr on a pseudo-terminal; return what it wrote there."""
    main_fd, child_fd = pty.openpty()
    code = "from rallypoint.core.cli import entrypoint; entrypoint()"
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stderr=child_fd, stdout=subprocess.DEVNULL, env=env)
    os.close(child_fd)
    chunks = []
    while True:
        try:
            data = os.read(main_fd, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=60)
    os.close(main_fd)
    return b"".join(chunks).decode()


def test_errors_are_red_on_a_terminal_and_plain_with_no_color(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RALLYPOINT_", "NO_COLOR"))}
    env.pop("TERM", None)
    missing = str(tmp_path / "missing.toml")
    assert "\x1b[31m\x1b[1merror:\x1b[0m" in _stderr_on_a_terminal(["config", "check", missing], env)
    plain = _stderr_on_a_terminal(["config", "check", missing], {**env, "NO_COLOR": "1"})
    assert plain.startswith("error: ")
    assert "\x1b[" not in plain
