#!/usr/bin/env python3
"""Run public programs written for torch.distributed.rpc on torch and on rallypoint, side by side.

    python tools/torch_rpc_examples.py --examples PATH [--only NAME ...] [--timeout S] [--json FILE]

PATH is a checkout of https://github.com/pytorch/examples (nothing of it is kept in this
repository). Each program under ``distributed/rpc`` is copied to a scratch folder twice and run
with the interpreter running this script: once as torch's program and once with its imports
switched to rallypoint's. Both runs get the same edits for this machine (no GPU: ``.cuda()`` and
device choices; a data set that would be downloaded becomes torchvision's ``FakeData``; a seed
where the program has none, so the two runs can be compared; a smaller workload where ResNet-50
on two cores would outlast torch's own 60 s RPC timeout or take an hour). Only the rallypoint run
gets the import switch (and "api" edits, for a line that only torch's API would allow: none of
these programs needs one). Every edit must match the program's text exactly once, so a changed
upstream program fails loudly instead of being run half-edited.

The rallypoint run sets ``RALLYPOINT_RPC_MODE=torch`` (no ``@rpc.expose``) and
``RALLYPOINT_RPC_SERIALIZER=pickle`` (the programs send modules and optimizers), as docs/rpc.md
describes. The interpreter needs torch, rallypoint and, for some programs, torchvision and
gymnasium; a program whose module is missing is reported as not run, with the reason.

The table printed at the end (and ``--json``) gives, per program: the lines changed of each kind,
exit status, wall time and the figure the program prints (loss, accuracy, reward, epochs) for
both runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

#: The import switch: torch's line -> rallypoint's, applied to every line that is exactly this.
IMPORTS = {
    "import torch.distributed.rpc as rpc": "from rallypoint import rpc",
    "import torch.distributed.autograd as dist_autograd": "import rallypoint.rpc.autograd as dist_autograd",
    "from torch.distributed.optim import DistributedOptimizer": "from rallypoint.rpc import DistributedOptimizer",
    "from torch.distributed.nn import RemoteModule": "from rallypoint.rpc.nn import RemoteModule",
    "from torch.distributed.rpc import RRef": "from rallypoint.rpc import RRef",
    "from torch.distributed.rpc import RRef, rpc_sync, rpc_async, remote": (
        "from rallypoint.rpc import RRef, rpc_sync, rpc_async, remote"
    ),
    "from torch.distributed.rpc import TensorPipeRpcBackendOptions": (
        "from rallypoint.rpc import TensorPipeRpcBackendOptions"
    ),
}

#: Edit kinds: these go to both runs (this machine's needs), "api" edits only to rallypoint's.
MACHINE_KINDS = ("device", "data", "seed", "size")


@dataclass(frozen=True)
class Edit:
    """Replace ``old`` (which must occur exactly once in ``file``) with ``new``."""

    file: str
    old: str
    new: str
    kind: str  # "device", "data", "seed", "size" (both runs) or "api" (rallypoint's run only)


@dataclass(frozen=True)
class Program:
    """One example: its folder, how it is started, its edits and the figure it prints."""

    name: str
    folder: str
    files: tuple[str, ...]
    commands: tuple[tuple[str, ...], ...]  # one process per tuple (arguments after the interpreter)
    edits: tuple[Edit, ...] = ()
    needs: tuple[str, ...] = ()
    figure: str = ""  # regex; its last match is the program's figure
    env: dict[str, str] = field(default_factory=dict)


_FAKE_MNIST = (
    "datasets.FakeData(size={n}, image_size=(1, 28, 28), num_classes=10, random_offset={o},\n"
    "                           transform=transforms.Compose(["
)

PROGRAMS = (
    Program(
        name="rnn",
        folder="distributed/rpc/rnn",
        files=("main.py", "rnn.py"),
        commands=(("main.py",),),
        figure=r"Training epoch (\d+)",
    ),
    Program(
        name="ddp_rpc",
        folder="distributed/rpc/ddp_rpc",
        files=("main.py",),
        commands=(("main.py",),),
        edits=(
            Edit("main.py", "    if not verify_min_gpu_count(min_gpus=_min_gpu_count):", "    if False:", "device"),
            Edit(
                "main.py",
                "        acc = torch.accelerator.current_accelerator()\n"
                "        device = torch.device(acc)\n"
                "        backend = torch.distributed.get_default_backend_for_device(device)\n"
                "        torch.accelerator.device_index(rank)\n",
                '        backend = "gloo"\n',
                "device",
            ),
            Edit("main.py", "DDP(torch.nn.Linear(16, 8).to(rank))", "DDP(torch.nn.Linear(16, 8))", "device"),
            Edit("main.py", "self.fc(emb_lookup.to(self.rank))", "self.fc(emb_lookup)", "device"),
            Edit("main.py", ".random_(8).to(rank)", ".random_(8)", "device"),
        ),
        figure=r"Training done for epoch (\d+)",
    ),
    Program(
        name="parameter_server",
        folder="distributed/rpc/parameter_server",
        files=("rpc_parameter_server.py",),
        commands=(
            ("rpc_parameter_server.py", "--world_size=2", "--rank=0"),
            ("rpc_parameter_server.py", "--world_size=2", "--rank=1"),
        ),
        needs=("torchvision",),
        edits=(
            Edit(
                "rpc_parameter_server.py",
                "datasets.MNIST('../data', train=True, download=True,\n"
                "                           transform=transforms.Compose([",
                _FAKE_MNIST.format(n=3200, o=0),
                "data",
            ),
            Edit(
                "rpc_parameter_server.py",
                "datasets.MNIST('../data', train=False,\n                           transform=transforms.Compose([",
                _FAKE_MNIST.format(n=640, o=10_000),
                "data",
            ),
            Edit(
                "rpc_parameter_server.py",
                "from torchvision import datasets, transforms\n",
                "from torchvision import datasets, transforms\ntorch.manual_seed(0)\n",
                "seed",
            ),
        ),
        figure=r"Accuracy ([0-9.]+)",
    ),
    Program(
        name="batch_parameter_server",
        folder="distributed/rpc/batch",
        files=("parameter_server.py",),
        commands=(("parameter_server.py",),),
        needs=("torchvision",),
        edits=(
            Edit("parameter_server.py", "batch_update_size = 5", "batch_update_size = 2", "size"),
            Edit("parameter_server.py", "num_batches = 6", "num_batches = 2", "size"),
            Edit("parameter_server.py", "yield inputs.cuda(), labels.cuda()", "yield inputs, labels", "device"),
            Edit("parameter_server.py", "get_model().cuda()", "get_model()", "device"),
            Edit(
                "parameter_server.py",
                '            ).cuda()\n            timed_log(f"{name} got updated model")',
                '            )\n            timed_log(f"{name} got updated model")',
                "device",
            ),
        ),
        figure=r"(Finish training)",
    ),
    Program(
        name="pipeline",
        folder="distributed/rpc/pipeline",
        files=("main.py",),
        commands=(("main.py",),),
        needs=("torchvision",),
        edits=(
            Edit("main.py", "num_batches = 3", "num_batches = 1", "size"),
            Edit("main.py", "for num_split in [1, 2, 4, 8]:", "for num_split in [1, 4]:", "size"),
            Edit("main.py", 'args = ("cuda:0",) + args', 'args = ("cpu",) + args', "device"),
            Edit("main.py", 'args = ("cuda:1",) + args', 'args = ("cpu",) + args', "device"),
        ),
        figure=r"number of splits = (4), execution time",
    ),
    Program(
        name="batch_reinforce",
        folder="distributed/rpc/batch",
        files=("reinforce.py",),
        commands=(("reinforce.py",),),
        needs=("gymnasium",),
        edits=(
            Edit("reinforce.py", "self.policy = Policy(batch).cuda()", "self.policy = Policy(batch)", "device"),
            Edit("reinforce.py", "self.policy(self.states.cuda())", "self.policy(self.states)", "device"),
            Edit("reinforce.py", "self.policy(state.cuda())", "self.policy(state)", "device"),
            Edit("reinforce.py", "for ret in rets]).cuda().t()", "for ret in rets]).t()", "device"),
        ),
        figure=r"Episode 9\tLast reward: ([0-9.]+)\tAverage reward: ([0-9.]+)",
    ),
    Program(
        name="rl",
        folder="distributed/rpc/rl",
        files=("main.py",),
        commands=(("main.py",),),
        needs=("gymnasium",),
        figure=r"Solved! Running reward is now ([0-9.]+)",
    ),
)


@dataclass
class Run:
    """One side's outcome."""

    status: str  # "ok", "exit N", "timeout", "not run: ..."
    wall_s: float | None = None
    figure: str | None = None
    tail: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)


def _edit(text: str, edit: Edit, where: Path) -> str:
    count = text.count(edit.old)
    if count != 1:
        raise SystemExit(f"{where}: the {edit.kind} edit expects its text once, found {count}: {edit.old!r}")
    return text.replace(edit.old, edit.new)


def _switch_imports(text: str) -> tuple[str, int]:
    out, changed = [], 0
    for line in text.splitlines(keepends=True):
        new = IMPORTS.get(line.strip())
        if new is not None:
            line = line[: len(line) - len(line.lstrip())] + new + "\n"
            changed += 1
        out.append(line)
    return "".join(out), changed


def prepare(program: Program, source: Path, dest: Path, rallypoint: bool) -> dict[str, int]:
    """Copy the program to ``dest`` with its edits; return the lines changed per kind."""
    shutil.copytree(source / program.folder, dest)
    changed: dict[str, int] = {}
    for name in program.files:
        path = dest / name
        text = path.read_text()
        for edit in program.edits:
            if edit.file == name and (edit.kind in MACHINE_KINDS or rallypoint):
                text = _edit(text, edit, path)
                changed[edit.kind] = changed.get(edit.kind, 0) + max(edit.old.count("\n"), 1)
        if rallypoint:
            text, n = _switch_imports(text)
            changed["import"] = changed.get("import", 0) + n
        path.write_text(text)
    return changed


def run(program: Program, folder: Path, rallypoint: bool, timeout: float) -> Run:
    """Start the program's processes in ``folder`` and wait for all of them."""
    env = {**os.environ, **program.env, "PYTHONUNBUFFERED": "1"}
    if rallypoint:
        env |= {"RALLYPOINT_RPC_MODE": "torch", "RALLYPOINT_RPC_SERIALIZER": "pickle"}
    logs = [folder / f"out{i}.txt" for i in range(len(program.commands))]
    start = time.monotonic()
    procs = []
    for command, log in zip(program.commands, logs, strict=True):
        with log.open("w") as out:
            procs.append(
                subprocess.Popen([sys.executable, *command], cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT)
            )
    status = "ok"
    for proc in procs:
        try:
            rc = proc.wait(timeout=max(1.0, timeout - (time.monotonic() - start)))
        except subprocess.TimeoutExpired:
            status = "timeout"
            break
        if rc != 0 and status == "ok":
            status = f"exit {rc}"
    wall = time.monotonic() - start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = [line for log in logs for line in log.read_text(errors="replace").splitlines()]
    matches = [m for line in lines for m in re.findall(program.figure, line)] if program.figure else []
    return Run(status, round(wall, 1), matches[-1] if matches else None, lines[-15:], lines)


def compare(program: Program, examples: Path, timeout: float) -> dict[str, object]:
    """Both runs of one program, and the lines each run changed."""
    missing = [name for name in program.needs if importlib.util.find_spec(name) is None]
    if missing:
        reason = f"not run: needs {', '.join(missing)}"
        return {"program": program.name, "torch": Run(reason).__dict__, "rallypoint": Run(reason).__dict__}
    row: dict[str, object] = {"program": program.name}
    for side in ("torch", "rallypoint"):
        with tempfile.TemporaryDirectory(prefix=f"rpcex-{program.name}-") as tmp:
            folder = Path(tmp) / "program"
            changed = prepare(program, examples, folder, side == "rallypoint")
            result = run(program, folder, side == "rallypoint", timeout)
        row[side] = result.__dict__ | {"changed": changed}
        print(f"{program.name} on {side}: {result.status} in {result.wall_s} s, figure {result.figure}", flush=True)
        if result.status != "ok":
            print("\n".join("    " + line for line in result.tail), flush=True)
    return row


def table(rows: list[dict[str, object]]) -> str:
    """The markdown table of the results."""
    out = [
        "| program | lines changed (rallypoint only / both runs) | torch | rallypoint | same figure |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        t, r = row["torch"], row["rallypoint"]
        assert isinstance(t, dict)
        assert isinstance(r, dict)
        changed = r.get("changed", {})
        own = sum(v for k, v in changed.items() if k not in MACHINE_KINDS)
        both = ", ".join(f"{v} {k}" for k, v in changed.items() if k in MACHINE_KINDS) or "none"

        def cell(side: dict[str, object]) -> str:
            return f"{side['status']}, {side['wall_s']} s, figure {side['figure']}"

        same = "yes" if t["status"] == r["status"] == "ok" and t["figure"] == r["figure"] else "no"
        out.append(f"| {row['program']} | {own} / {both} | {cell(t)} | {cell(r)} | {same} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=Path, required=True, help="a checkout of pytorch/examples")
    parser.add_argument("--only", nargs="*", default=None, help="program names (default: all)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run (default 900)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    if not (args.examples / "distributed" / "rpc").is_dir():
        parser.error(f"--examples {args.examples}: no distributed/rpc folder; pass a pytorch/examples checkout")
    names = {p.name for p in PROGRAMS}
    unknown = sorted(set(args.only or ()) - names)
    if unknown:
        parser.error(f"--only: unknown program(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}")
    rows = [compare(p, args.examples, args.timeout) for p in PROGRAMS if not args.only or p.name in args.only]
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0 if all(r["torch"]["status"] == r["rallypoint"]["status"] == "ok" for r in rows) else 1  # type: ignore[index]


if __name__ == "__main__":
    sys.exit(main())
