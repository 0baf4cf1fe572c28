"""tools/torch_rpc_examples.py: the import switch, edits that must match once, and a real side-by-side run."""

from __future__ import annotations

import socket
import textwrap
from pathlib import Path

import pytest

from tools import torch_rpc_examples as ex

TINY = textwrap.dedent(
    """\
    import os
    import torch
    import torch.multiprocessing as mp
    import torch.distributed.rpc as rpc
    from torch.distributed.rpc import RRef


    def double(t):
        return t * 2


    def worker(rank, world_size):
        os.environ["MASTER_ADDR"] = "localhost"
        os.environ["MASTER_PORT"] = str(__PORT__)
        rpc.init_rpc(f"w{rank}", rank=rank, world_size=world_size)
        if rank == 0:
            total = rpc.rpc_sync("w1", double, args=(torch.ones(3),)).sum().item()
            owner = rpc.remote("w1", double, args=(torch.ones(2),)).owner().name
            print(f"total {total:.1f} owner {owner}")
        rpc.shutdown()


    if __name__ == "__main__":
        mp.spawn(worker, args=(2,), nprocs=2, join=True)
    """
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _examples(tmp_path: Path, port: int = 0) -> Path:
    folder = tmp_path / "examples" / "distributed" / "rpc" / "tiny"
    folder.mkdir(parents=True)
    (folder / "main.py").write_text(TINY.replace("__PORT__", str(port)))
    return tmp_path / "examples"


def _program(**kw: object) -> ex.Program:
    base: dict[str, object] = {
        "name": "tiny",
        "folder": "distributed/rpc/tiny",
        "files": ("main.py",),
        "commands": (("main.py",),),
        "figure": r"total ([0-9.]+) owner (\w+)",
    }
    return ex.Program(**(base | kw))  # type: ignore[arg-type]


def test_only_the_rallypoint_copy_gets_the_import_switch_and_api_edits(tmp_path: Path) -> None:
    examples = _examples(tmp_path)
    program = _program(
        edits=(
            ex.Edit("main.py", "torch.ones(3)", "torch.ones(4)", "device"),
            ex.Edit("main.py", "owner().name", "owner().name ", "api"),
        )
    )
    changed = ex.prepare(program, examples, tmp_path / "torch", rallypoint=False)
    text = (tmp_path / "torch" / "main.py").read_text()
    assert changed == {"device": 1}
    assert "import torch.distributed.rpc as rpc" in text
    assert "torch.ones(4)" in text
    assert "name \n" not in text

    changed = ex.prepare(program, examples, tmp_path / "rp", rallypoint=True)
    text = (tmp_path / "rp" / "main.py").read_text()
    assert changed == {"device": 1, "api": 1, "import": 2}
    assert "from rallypoint import rpc\n" in text
    assert "from rallypoint.rpc import RRef\n" in text
    assert "torch.distributed" not in text
    assert "torch.ones(4)" in text


@pytest.mark.parametrize("old", ["no such text", "torch"])
def test_an_edit_that_does_not_match_exactly_once_stops_the_run(tmp_path: Path, old: str) -> None:
    program = _program(edits=(ex.Edit("main.py", old, "x", "device"),))
    with pytest.raises(SystemExit, match=r"main\.py: the device edit expects its text once, found \d+"):
        ex.prepare(program, _examples(tmp_path), tmp_path / "out", rallypoint=False)


def test_a_program_missing_a_module_is_reported_not_run(tmp_path: Path) -> None:
    row = ex.compare(_program(needs=("no_such_module_here",)), _examples(tmp_path), timeout=10)
    assert row["torch"]["status"] == row["rallypoint"]["status"] == "not run: needs no_such_module_here"  # type: ignore[index]


def test_a_torch_rpc_program_runs_on_both_and_gives_the_same_figure(tmp_path: Path) -> None:
    rows = [ex.compare(_program(), _examples(tmp_path, _free_port()), timeout=120)]
    torch_side, rp_side = rows[0]["torch"], rows[0]["rallypoint"]
    assert isinstance(torch_side, dict)
    assert isinstance(rp_side, dict)
    assert (torch_side["status"], rp_side["status"]) == ("ok", "ok"), (torch_side["tail"], rp_side["tail"])
    assert torch_side["figure"] == rp_side["figure"] == ("6.0", "w1")
    assert rp_side["changed"] == {"import": 2}
    assert "| tiny | 2 / none | ok," in ex.table(rows)


def test_the_command_line_refuses_a_folder_without_the_examples(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        ex.main(["--examples", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "no distributed/rpc folder" in capsys.readouterr().err
