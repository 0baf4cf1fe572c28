"""Tensors travel where numpy is not installed (numpy is not a dependency of torch).

The check runs in a fresh interpreter in which ``import numpy`` fails before torch is imported,
so torch reports numpy unavailable exactly as on a clean install.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap

import torch

from rallypoint.rpc.exposure import Exposure
from rallypoint.rpc.serialization import Decoder, Encoder, dumps_tree, loads_tree
from rallypoint.rpc.wire import pack, unpack

WITHOUT_NUMPY = textwrap.dedent(
    """
    import sys
    sys.modules["numpy"] = None  # what a clean install looks like to torch
    import warnings
    warnings.simplefilter("ignore")  # torch warns that it cannot import numpy
    import torch

    try:
        torch.ones(1).numpy()
    except RuntimeError as exc:
        assert "Numpy is not available" in str(exc), exc
    else:
        raise SystemExit("numpy is importable: the check would prove nothing")

    from rallypoint.rpc.exposure import Exposure
    from rallypoint.rpc.serialization import TENSOR_DTYPES, Decoder, Encoder, dumps_tree, loads_tree
    from rallypoint.rpc.wire import pack, unpack

    base = torch.arange(20.0).reshape(4, 5)
    values = [(torch.arange(24) % 3).to(getattr(torch, name)).reshape(2, 3, 4) for name in TENSOR_DTYPES]
    values += [base.t(), base[1:3, ::2], torch.tensor(3.5), torch.empty(0, 3), torch.ones(2, requires_grad=True)]
    values += [torch.tensor(2.5).expand(30, 40), torch.tensor([1 + 2j, -5j]).conj()]
    for broadcasts in (False, True):
        enc = Encoder(broadcasts=broadcasts)
        tree = enc.add(values)
        header, buffers = unpack(pack(dumps_tree(tree), enc.out.buffers))
        out = Decoder(Exposure(), "w1").decode(loads_tree(header), buffers)
        for sent, got in zip(values, out, strict=True):
            assert got.dtype == sent.dtype and got.shape == sent.shape, (sent, got)
            assert torch.equal(got, sent.detach().resolve_conj()), (sent, got)
    print("ok", len(values))
    """
)


def test_tensors_of_every_dtype_travel_where_numpy_cannot_be_imported() -> None:
    proc = subprocess.run([sys.executable, "-c", WITHOUT_NUMPY], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.split() == ["ok", "19"]


def test_a_sent_tensor_lives_as_long_as_its_buffer() -> None:
    enc = Encoder()
    tree = enc.add(torch.full((1000,), 7.0))  # the caller keeps no reference
    gc.collect()
    for _ in range(20):  # reuse of the freed memory would show in the buffer
        torch.full((1000,), -1.0)
    header, buffers = unpack(pack(dumps_tree(tree), enc.out.buffers))
    out = Decoder(Exposure(), "w1").decode(loads_tree(header), buffers)
    assert torch.equal(out, torch.full((1000,), 7.0))
