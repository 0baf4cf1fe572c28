#!/usr/bin/env bash
# GPU check for the NCCL collective backend, in one prepared command.
#
# Assumes a machine with CUDA GPUs and a CUDA build of torch already installed in the Python
# environment used (it installs nothing heavy). Run from the repository root:
#
#     tools/gpu_check.sh                 # uses .venv/bin/python if present, else python3
#     PYTHON=/path/to/python tools/gpu_check.sh
#
# It (1) prints what CUDA/NCCL torch sees, (2) installs the rallypoint packages editable without
# dependencies if they are not importable yet, (3) runs the collectives tests (NCCL ones included;
# they must not skip here), and (4) runs the all_reduce/barrier benchmark with NCCL.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-}"
if [[ -z "$PYTHON" ]]; then
    if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi

echo "== torch, CUDA and NCCL"
"$PYTHON" - <<'PY'
import torch, torch.distributed as dist
print("torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())
print("nccl available:", dist.is_nccl_available(), "version", torch.cuda.nccl.version() if torch.cuda.is_available() else None)
assert torch.cuda.is_available(), "no CUDA device is visible: this script is for GPU machines"
PY

if ! "$PYTHON" -c "import rallypoint.collectives, rallypoint_nccl, rallypoint_gloo, pytest, pytest_timeout" 2>/dev/null; then
    echo "== installing rallypoint packages (editable, no dependencies)"
    "$PYTHON" -m pip install -q --no-deps -e packages/rallypoint-core -e packages/rallypoint-collectives \
        -e plugins/rallypoint-gloo -e plugins/rallypoint-nccl
    "$PYTHON" -c "import pluggy, pydantic, pytest, pytest_timeout" 2>/dev/null \
        || "$PYTHON" -m pip install -q pluggy pydantic pytest pytest-timeout
fi

echo "== NCCL tests (-rs shows any skip and its reason)"
"$PYTHON" -m pytest -p no:cacheprovider -rs -v \
    packages/rallypoint-collectives/tests/test_nccl.py packages/rallypoint-collectives/tests/test_init.py

echo "== benchmark: all_reduce 1 MB / 64 MB and barrier, NCCL, rallypoint facade vs torch"
# NCCL needs one GPU per rank: with a single GPU the benchmark runs 1 rank (the facade's overhead is
# on the CPU side, which one rank still measures).
NPROCS=$("$PYTHON" -c "import torch; print(min(torch.cuda.device_count(), 2))")
"$PYTHON" tools/bench/collectives.py --backend nccl --nprocs "$NPROCS"
