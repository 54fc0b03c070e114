"""csrc kernels against their PyTorch references (DESIGN.md §3: float64 reference, odd shapes, NaN
poisoning of what must not be read, determinism, opcheck), and models with vs without kernels.
The extension is part of the install (scripts/bootstrap.sh builds it); these tests fail, not skip,
when it is missing, unless the install opted out with FAIRSEQ_EXT_NO_BUILD=1."""
import os

import pytest
import torch

from fairseq_ext import ops
from fairseq_ext.ops.sparse_ffn import sparse_ffn_decode_reference

if os.environ.get("FAIRSEQ_EXT_NO_BUILD") == "1" and not ops.extension_loaded():
    pytest.skip("installed with FAIRSEQ_EXT_NO_BUILD=1: no compiled kernels", allow_module_level=True)


def test_extension_is_built_and_has_the_ops():
    assert ops.extension_loaded(), ops.build_info()
    assert hasattr(torch.ops.fairseq_ext, "sparse_ffn_decode")


def _weights(d, d_ff, block, lowrank, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=dtype)
    return [r(lowrank, d), r(d_ff, lowrank), r(d_ff), r(d_ff, d) / d ** 0.5, r(d_ff, d) / d ** 0.5, r(d)]


SHAPES = [(24, 96, 8, 1), (40, 120, 12, 3), (64, 192, 16, 5), (96, 288, 32, 7), (40, 120, 40, 33), (24, 48, 1, 2)]


@pytest.mark.parametrize("d,d_ff,block,tokens", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_sparse_ffn_decode_equals_reference(d, d_ff, block, tokens, dtype):
    w = _weights(d, d_ff, block, max(1, d_ff // block), dtype, seed=d + tokens)
    x = torch.randn(tokens, d, dtype=dtype)
    out = torch.ops.fairseq_ext.sparse_ffn_decode(x, *w, block)
    ref = sparse_ffn_decode_reference(x.double(), *[t.double() for t in w], block)
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)
    assert torch.equal(out, torch.ops.fairseq_ext.sparse_ffn_decode(x, *w, block))  # deterministic


def test_sparse_ffn_decode_reads_only_the_chosen_rows():
    d, d_ff, block = 40, 160, 16
    w = _weights(d, d_ff, block, 10, torch.float32, seed=1)
    x = torch.randn(5, d)
    expect = sparse_ffn_decode_reference(x, *w, block)
    logits = (x @ w[0].T) @ w[1].T + w[2]
    rows = (logits.view(5, -1, block).argmax(-1) + torch.arange(d_ff // block) * block).view(-1)
    keep = torch.zeros(d_ff, dtype=torch.bool)
    keep[rows] = True
    w[3][~keep] = float("nan")
    w[4][~keep] = float("nan")
    torch.testing.assert_close(torch.ops.fairseq_ext.sparse_ffn_decode(x, *w, block), expect, rtol=2e-5, atol=2e-5)


def test_sparse_ffn_decode_clear_errors():
    w = _weights(16, 64, 8, 8, torch.float32, seed=2)
    with pytest.raises(RuntimeError, match="block_size 7 must divide d_ff 64"):
        torch.ops.fairseq_ext.sparse_ffn_decode(torch.randn(2, 16), *w, 7)
    with pytest.raises(RuntimeError, match="W1 must be"):
        torch.ops.fairseq_ext.sparse_ffn_decode(torch.randn(2, 15), *w, 8)


def test_sparse_ffn_decode_opcheck():
    w = _weights(24, 96, 8, 12, torch.float32, seed=3)
    torch.library.opcheck(torch.ops.fairseq_ext.sparse_ffn_decode.default, (torch.randn(3, 24), *w, 8))


@pytest.mark.parametrize("arch", ["scaling_sparse_tiny", "one_wide_sparse_ffn_tiny"])
def test_generation_with_kernels_equals_reference(arch, tiny_data, monkeypatch):
    """Beam search with the kernel (sparse FFNs on <= N tokens) gives the reference path's tokens."""
    from fairseq.sequence_generator import SequenceGenerator
    from matrix import build, fixed_batch

    from fairseq_ext.modules.sparse_feedforward import SparseFFNInput

    _, task, model, _ = build(tiny_data, arch)
    model.eval()
    for m in model.modules():
        if isinstance(m, SparseFFNInput):
            m.mode = "gather"  # every step through the kernel (or the reference gather)
    sample = fixed_batch(task, n=4)
    gen = SequenceGenerator([model], task.target_dictionary, beam_size=3, max_len_b=12)
    outs = []
    for no_kernels in ("1", "0"):
        monkeypatch.setenv("FAIRSEQ_EXT_NO_KERNELS", no_kernels)
        with torch.no_grad():
            outs.append([[h["tokens"].tolist() for h in hyps] for hyps in gen.generate([model], sample)])
    assert outs[0] == outs[1]
