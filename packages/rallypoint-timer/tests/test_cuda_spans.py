"""CUDA-event spans (only where a CUDA GPU is visible)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rallypoint.timer import Recorder, TimelineConfig
from rallypoint.timer.merge import load_log


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible")
def test_cuda_spans_are_recorded_next_to_cpu_spans(tmp_path: Path) -> None:
    torch.cuda.init()
    x = torch.randn(2048, 2048, device="cuda")
    rec = Recorder(tmp_path / "rank_0.jsonl", config=TimelineConfig(cuda=True), autoflush=False)
    rec.start("matmul")
    for _ in range(5):
        x = x @ x / 2048
    rec.end("matmul")
    torch.cuda.synchronize()
    rec.close()
    spans = load_log(tmp_path / "rank_0.jsonl").spans
    kinds = {(s.name, s.kind) for s in spans}
    assert kinds == {("matmul", "cpu"), ("matmul", "cuda")}
    gpu = next(s for s in spans if s.kind == "cuda")
    assert gpu.duration_ns > 0
