"""csrc kernels against their PyTorch references (docs/architecture.md, Kernels: float64 reference, odd
shapes, NaN poisoning of what must not be read, determinism, opcheck), and models with vs without kernels.
The extension is part of the install (scripts/bootstrap.sh builds it); these tests fail, not skip,
when it is missing, unless the install opted out with FAIRSEQ_EXT_NO_BUILD=1.

Op tests run on every device this machine has: CPU here and in CI; CPU and CUDA on a GPU machine
(scripts/gpu_check.sh runs `-k cuda` there, with FAIRSEQ_EXT_OPS_ONLY=1 when its Python has no
fairseq). The CUDA sources are compiled with nvcc here too (test_cuda_sources_compile), so they
cannot rot on CPU-only CI."""
import functools
import glob
import os
import shutil
import subprocess

import pytest
import torch

from fairseq_ext import ops
from fairseq_ext.ops.compressed_attention import compressed_attention_decode_reference, gather_history
from fairseq_ext.ops.sparse_ffn import sparse_ffn_decode_reference

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

if os.environ.get("FAIRSEQ_EXT_NO_BUILD") == "1" and not ops.extension_loaded():
    pytest.skip("installed with FAIRSEQ_EXT_NO_BUILD=1: no compiled kernels", allow_module_level=True)


@pytest.mark.parametrize("device", DEVICES)
def test_extension_is_built_and_has_the_ops(device):
    assert ops.extension_loaded(), ops.build_info()
    assert hasattr(torch.ops.fairseq_ext, "sparse_ffn_decode")
    assert ops.has_kernel("sparse_ffn_decode", device), f"no {device} kernel in this build: {ops.build_info()}"
    assert ops.has_kernel("compressed_attention_decode", device), ops.build_info()
    if device == "cpu":  # few_rows_linear and int8_linear are CPU only (cuBLAS serves few-row products on a GPU)
        assert ops.has_kernel("few_rows_linear", device), ops.build_info()
        assert ops.has_kernel("int8_linear", device), ops.build_info()


def _weights(d, d_ff, block, lowrank, dtype, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    w = [r(lowrank, d), r(d_ff, lowrank), r(d_ff), r(d_ff, d) / d ** 0.5, r(d_ff, d) / d ** 0.5, r(d)]
    return [t.to(device=device, dtype=dtype) for t in w]


SHAPES = [(24, 96, 8, 1), (40, 120, 12, 3), (64, 192, 16, 5), (96, 288, 32, 7), (40, 120, 40, 33), (24, 48, 1, 2),
          (136, 408, 136, 6), (40, 2000, 250, 64), (200, 600, 24, 80)]  # from 32 tokens: the controller by GEMM


@pytest.mark.parametrize("d,d_ff,block,tokens", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("device", DEVICES)
def test_sparse_ffn_decode_equals_reference(d, d_ff, block, tokens, dtype, device):
    w = _weights(d, d_ff, block, max(1, d_ff // block), dtype, seed=d + tokens, device=device)
    x = torch.randn(tokens, d, dtype=torch.float64).to(device=device, dtype=dtype)
    out = torch.ops.fairseq_ext.sparse_ffn_decode(x, *w, block)
    ref = sparse_ffn_decode_reference(x.double(), *[t.double() for t in w], block)
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)
    assert torch.equal(out, torch.ops.fairseq_ext.sparse_ffn_decode(x, *w, block))  # deterministic


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d,d_ff,block,tokens", SHAPES[1:4])
def test_sparse_ffn_decode_half_precision_cuda(d, d_ff, block, tokens, dtype):
    """CUDA takes float16/bfloat16 (accumulating in float32). The controller rounds x·C1ᵀ and the logits
    to the input dtype, as the reference's F.linear does; the expected output is float64 arithmetic over
    the units those rounded logits choose."""
    if "cuda" not in DEVICES:
        pytest.skip("no CUDA device on this machine (CPU kernels take float32/float64 only)")
    w = _weights(d, d_ff, block, max(1, d_ff // block), dtype, seed=d, device="cuda")
    x = torch.randn(tokens, d, dtype=torch.float64).to(device="cuda", dtype=dtype)
    out = torch.ops.fairseq_ext.sparse_ffn_decode(x, *w, block)
    z = (x.double() @ w[0].double().T).to(dtype).double()
    logits = (z @ w[1].double().T + w[2].double()).to(dtype)
    rows = (logits.view(tokens, -1, block).argmax(-1) + torch.arange(d_ff // block, device="cuda") * block)
    xd, w1, w2 = x.double(), w[3].double()[rows], w[4].double()[rows]  # (tokens, blocks, d)
    h = torch.relu(torch.einsum("td,tbd->tb", xd, w1))
    ref = torch.einsum("tb,tbd->td", h, w2) + w[5].double()
    tol = 1e-2 if dtype == torch.float16 else 4e-2
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)
    assert torch.equal(out, torch.ops.fairseq_ext.sparse_ffn_decode(x, *w, block))


# few_rows_linear: rows 1..8 (one pass each, every R/tail split), 9..17 (two or three passes), odd
# in/out features (K % 16 tails, N % 4 and N % 2 tail rows), no bias
FEW_ROWS_SHAPES = [(1, 7, 3), (2, 16, 4), (3, 17, 5), (4, 33, 9), (5, 64, 31), (6, 100, 7), (7, 129, 13),
                   (8, 48, 66), (9, 31, 10), (13, 80, 5), (17, 65, 33), (5, 1, 6), (3, 300, 1)]


# the CPU kernels' instruction sets: what the machine has (AVX-512 intrinsics where it has them), and the portable
# loops (FAIRSEQ_EXT_CPU_ISA=portable, read by the kernels at each call)
ISAS = ["native", "portable"]


# few_rows_linear's paths: also bf16 products of bf16 weights (FAIRSEQ_EXT_BF16_PRODUCTS=1: AVX512_BF16's
# vdpbf16ps where the CPU has it, else the float32 products of "native")
FEW_ROWS_ISAS = ["native", "bf16-products", "portable"]


def _set_isa(isa, monkeypatch):
    monkeypatch.delenv("FAIRSEQ_EXT_BF16_PRODUCTS", raising=False)
    if isa == "portable":
        monkeypatch.setenv("FAIRSEQ_EXT_CPU_ISA", "portable")
    else:
        monkeypatch.delenv("FAIRSEQ_EXT_CPU_ISA", raising=False)
    if isa == "bf16-products":
        monkeypatch.setenv("FAIRSEQ_EXT_BF16_PRODUCTS", "1")


@pytest.mark.parametrize("rows,k,n", FEW_ROWS_SHAPES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, "bf16-weight"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("isa", FEW_ROWS_ISAS)
def test_few_rows_linear_equals_reference(rows, k, n, dtype, bias, isa, monkeypatch):
    """float64, float32, and float32 x against a bfloat16 weight (--bf16 decoding: the product with the
    weight widened to float32, or with FAIRSEQ_EXT_BF16_PRODUCTS=1 on a CPU with bf16 dot products, of x
    rounded to bf16); every instruction-set path."""
    from fairseq_ext.ops import few_rows_linear as frl

    _set_isa(isa, monkeypatch)
    g = torch.Generator().manual_seed(rows * 1000 + k + n)
    wdtype = torch.bfloat16 if dtype == "bf16-weight" else dtype
    dtype = torch.float32 if dtype == "bf16-weight" else dtype
    x, w = torch.randn(rows, k, generator=g, dtype=dtype), torch.randn(n, k, generator=g).to(wdtype)
    b = torch.randn(n, generator=g, dtype=dtype) if bias else None
    out = torch.ops.fairseq_ext.few_rows_linear(x, w, b)
    from fairseq_ext.tools.precision import cpu_flags

    # bf16 products exactly where asked for and the CPU has them
    assert frl.bf16_dot() == (isa == "bf16-products" and {"avx512_bf16", "avx512f"} <= cpu_flags())
    xr = x.bfloat16() if wdtype == torch.bfloat16 and frl.bf16_dot() else x
    ref = torch.nn.functional.linear(xr.double(), w.double(), None if b is None else b.double())
    tol = 1e-12 if dtype == torch.float64 else 3e-5 * max(1.0, k ** 0.5)
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)
    assert torch.equal(out, torch.ops.fairseq_ext.few_rows_linear(x, w, b))  # deterministic
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same sums in the same order whatever the thread count
    try:
        assert torch.equal(out, torch.ops.fairseq_ext.few_rows_linear(x, w, b))
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("n,k,panel", [(3, 7, 6), (6, 16, 6), (13, 33, 6), (31, 64, 6), (66, 48, 6), (7, 129, 6),
                                         (12, 20, 4), (10, 17, 5), (9, 1, 1), (16, 40, 8)])
def test_pack_panels_round_trip(n, k, panel):
    """pack_panels / unpack_panels (pure PyTorch) are inverses for any N, K and panel height; a panel's first
    16 values are its first row's first 16 columns, the next 16 its second row's."""
    from fairseq_ext.ops.few_rows_linear import pack_panels, unpack_panels

    w = torch.randn(n, k)
    packed = pack_panels(w, panel)
    assert packed.shape == (n * k,) and packed.is_contiguous()
    assert torch.equal(unpack_panels(packed, n, k, panel), w)
    if n >= panel and k >= 16 and panel > 1:
        assert torch.equal(packed[:16], w[0, :16]) and torch.equal(packed[16:32], w[1, :16])


@pytest.mark.parametrize("rows,k,n", FEW_ROWS_SHAPES + [(5, 1024, 60), (16, 70, 12)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, "bf16-weight"])
@pytest.mark.parametrize("panel", [6, 4, 1, 7])
@pytest.mark.parametrize("isa", FEW_ROWS_ISAS)
def test_few_rows_linear_packed_equals_the_row_major_kernel(rows, k, n, dtype, panel, isa, monkeypatch):
    """On pack_panels' layout the kernel makes F.linear's outputs to rounding for any panel height (7: no group
    size divides it but 1 and 7), and few_rows_linear's bit for bit where the AVX-512 intrinsics run (float32 x
    on an AVX-512 CPU: the same sums in the same order; the portable loops are vectorised by the compiler, per
    group size)."""
    from fairseq_ext.ops.few_rows_linear import bf16_dot, pack_panels
    from fairseq_ext.tools.precision import cpu_flags

    _set_isa(isa, monkeypatch)
    g = torch.Generator().manual_seed(rows * 1000 + k + n + panel)
    wdtype = torch.bfloat16 if dtype == "bf16-weight" else dtype
    dtype = torch.float32 if dtype == "bf16-weight" else dtype
    x, w = torch.randn(rows, k, generator=g, dtype=dtype), torch.randn(n, k, generator=g).to(wdtype)
    b = torch.randn(n, generator=g, dtype=dtype)
    out = torch.ops.fairseq_ext.few_rows_linear_packed(x, pack_panels(w, panel), b, n, panel)
    if isa != "portable" and dtype == torch.float32 and "avx512f" in cpu_flags():
        assert torch.equal(out, torch.ops.fairseq_ext.few_rows_linear(x, w, b))
    xr = x.bfloat16() if wdtype == torch.bfloat16 and bf16_dot() else x
    ref = torch.nn.functional.linear(xr.double(), w.double(), b.double())
    tol = 1e-12 if dtype == torch.float64 else 3e-5 * max(1.0, k ** 0.5)
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same sums in the same order whatever the thread count
    try:
        assert torch.equal(out, torch.ops.fairseq_ext.few_rows_linear_packed(x, pack_panels(w, panel), b, n, panel))
    finally:
        torch.set_num_threads(threads)


def test_few_rows_linear_packed_entry_point_and_errors(monkeypatch):
    """The Python entry point keeps leading dims and falls back to F.linear on the unpacked weight (40 rows,
    kernels off); bad arguments are named."""
    from fairseq_ext.ops import few_rows_linear as frl

    w, b = torch.randn(13, 20).bfloat16(), torch.randn(13)
    packed = frl.pack_panels(w)
    with torch.no_grad():
        for shape in [(1, 5, 20), (5, 20), (40, 20)]:
            x = torch.randn(*shape)
            ref = frl.kernel_reference if frl.kernel_applies(x, True, "few_rows_linear_packed") else \
                frl.few_rows_linear_reference
            torch.testing.assert_close(frl.few_rows_linear_packed(x, packed, b, 13), ref(x, w, b),
                                       rtol=2e-5, atol=2e-5)
        monkeypatch.setenv("FAIRSEQ_EXT_NO_KERNELS", "1")
        x = torch.randn(5, 20)
        torch.testing.assert_close(frl.few_rows_linear_packed(x, packed, b, 13),
                                   torch.nn.functional.linear(x, w.float(), b), rtol=2e-5, atol=2e-5)
    with pytest.raises(RuntimeError, match="packed must be the 1-D panels"):
        torch.ops.fairseq_ext.few_rows_linear_packed(torch.randn(3, 8), torch.randn(4, 8), None, 4, 6)
    with pytest.raises(RuntimeError, match="packed must be the 1-D panels"):
        torch.ops.fairseq_ext.few_rows_linear_packed(torch.randn(3, 8), torch.randn(33), None, 4, 6)
    with pytest.raises(RuntimeError, match="panel >= 1"):
        torch.ops.fairseq_ext.few_rows_linear_packed(torch.randn(3, 8), torch.randn(32), None, 4, 0)
    with pytest.raises(RuntimeError, match="bias must be"):
        torch.ops.fairseq_ext.few_rows_linear_packed(torch.randn(3, 8), torch.randn(32), torch.randn(5), 4, 6)
    torch.library.opcheck(torch.ops.fairseq_ext.few_rows_linear_packed.default,
                          (torch.randn(5, 40), frl.pack_panels(torch.randn(13, 40).bfloat16()), torch.randn(13), 13, 6))
    torch.library.opcheck(torch.ops.fairseq_ext.few_rows_linear_packed.default,
                          (torch.randn(3, 17), frl.pack_panels(torch.randn(9, 17)), None, 9, 6))


def test_few_rows_linear_reads_only_its_operands():
    """NaN around the operands (views into larger poisoned buffers) must not leak: the kernel reads x and
    W through their own strides (non-contiguous inputs are made contiguous first)."""
    big_x = torch.full((6, 40), float("nan"))
    big_w = torch.full((30, 50), float("nan"))
    x, w = big_x[1:6, 3:35], big_w[2:25, 5:37]
    x.copy_(torch.randn(5, 32))
    w.copy_(torch.randn(23, 32))
    b = torch.randn(23)
    torch.testing.assert_close(torch.ops.fairseq_ext.few_rows_linear(x, w, b),
                               torch.nn.functional.linear(x, w, b), rtol=2e-5, atol=2e-5)


def test_few_rows_linear_entry_point_shapes_and_fallback(monkeypatch):
    """The Python entry point keeps leading dims, uses the op for 3-16 rows and F.linear otherwise."""
    from fairseq_ext.ops import few_rows_linear as frl

    w, b = torch.randn(12, 20), torch.randn(12)
    for shape in [(1, 5, 20), (5, 20), (2, 4, 20), (1, 20), (40, 20)]:
        x = torch.randn(*shape)
        torch.testing.assert_close(frl.few_rows_linear(x, w, b), torch.nn.functional.linear(x, w, b),
                                   rtol=2e-5, atol=2e-5)
    for shape in [(1, 1, 20), (2, 20), (5, 20), (40, 20)]:  # bf16 weight: the kernel from one row up
        x = torch.randn(*shape)
        with torch.no_grad():  # the kernel's bf16 products where it runs on a CPU with them, else F.linear's
            ref = (frl.kernel_reference if frl.kernel_applies(x, True) else frl.few_rows_linear_reference)
            torch.testing.assert_close(frl.few_rows_linear(x, w.bfloat16(), b), ref(x, w.bfloat16(), b),
                                       rtol=2e-5, atol=2e-5)
    x = torch.randn(1, 5, 20)
    with torch.no_grad():
        assert frl.kernel_applies(x) and not frl.kernel_applies(x[:, :2]) and not frl.kernel_applies(torch.randn(40, 20))
        assert frl.kernel_applies(x[:, :1], bf16_weight=True) and not frl.kernel_applies(torch.randn(40, 20), True)
        monkeypatch.setenv("FAIRSEQ_EXT_NO_KERNELS", "1")
        assert not frl.kernel_applies(x)
    assert not frl.kernel_applies(x.requires_grad_())  # no backward: autograd keeps F.linear


def test_few_rows_linear_clear_errors():
    with pytest.raises(RuntimeError, match="weight must be"):
        torch.ops.fairseq_ext.few_rows_linear(torch.randn(3, 8), torch.randn(4, 9), None)
    with pytest.raises(RuntimeError, match="bias must be"):
        torch.ops.fairseq_ext.few_rows_linear(torch.randn(3, 8), torch.randn(4, 8), torch.randn(5))
    with pytest.raises(RuntimeError, match="x must be"):
        torch.ops.fairseq_ext.few_rows_linear(torch.randn(3), torch.randn(4, 3), None)
    with pytest.raises(RuntimeError, match="float32 or float64"):
        torch.ops.fairseq_ext.few_rows_linear(torch.randn(3, 8).half(), torch.randn(4, 8).half(), None)
    with pytest.raises(RuntimeError, match="bfloat16 with float32 x"):  # bf16 weights only under float32 x
        torch.ops.fairseq_ext.few_rows_linear(torch.randn(3, 8).double(), torch.randn(4, 8).bfloat16(), None)


def test_few_rows_linear_opcheck():
    torch.library.opcheck(torch.ops.fairseq_ext.few_rows_linear.default, (torch.randn(5, 24), torch.randn(7, 24),
                                                                         torch.randn(7)))
    torch.library.opcheck(torch.ops.fairseq_ext.few_rows_linear.default, (torch.randn(3, 17), torch.randn(9, 17), None))
    torch.library.opcheck(torch.ops.fairseq_ext.few_rows_linear.default,
                          (torch.randn(4, 33), torch.randn(9, 33).bfloat16(), torch.randn(9)))


# int8_linear: the few-rows shapes plus a row count past two passes, K % 4 and N % 16 tails, and a Big-sized layer
INT8_SHAPES = FEW_ROWS_SHAPES + [(25, 67, 17), (5, 1024, 1027), (1, 4, 16)]


def _int8_operands(rows, k, n, seed):
    from fairseq_ext.ops.int8_linear import pack_weight, quantize_weight

    g = torch.Generator().manual_seed(seed)
    x, w, b = torch.randn(rows, k, generator=g), torch.randn(n, k, generator=g), torch.randn(n, generator=g)
    wq, scale, wsum = quantize_weight(w)
    return x, w, pack_weight(wq), scale, wsum, b


@pytest.mark.parametrize("rows,k,n", INT8_SHAPES)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("isa", ISAS)
def test_int8_linear_equals_reference_bit_for_bit(rows, k, n, bias, isa, monkeypatch):
    """The integer sums are exact, so the kernel (VNNI or portable) equals the reference exactly, whatever the
    thread count; and the result is close to the float product (int8 rounding of both operands)."""
    from fairseq_ext.ops.int8_linear import int8_linear_reference

    _set_isa(isa, monkeypatch)
    x, w, wp, scale, wsum, b = _int8_operands(rows, k, n, rows * 1000 + k + n)
    b = b if bias else None
    out = torch.ops.fairseq_ext.int8_linear(x, wp, scale, wsum, b)
    assert torch.equal(out, int8_linear_reference(x, wp, scale, wsum, b))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert torch.equal(out, torch.ops.fairseq_ext.int8_linear(x, wp, scale, wsum, b))
    finally:
        torch.set_num_threads(threads)
    ref = torch.nn.functional.linear(x, w, b)  # 8-bit rounding of x and W: about 1% of the scale of a sum
    err = (out - ref).abs().max() / (x.abs().amax() * w.abs().amax() * k ** 0.5)
    assert err < 0.02, err


def test_int8_linear_special_rows_packing_and_entry_point(monkeypatch):
    """A row of zeros gives the bias, a row with a NaN or infinity NaN (kernel and reference alike); the packing
    round-trips; the entry point keeps leading dims and falls back to the reference without kernels."""
    from fairseq_ext.ops import int8_linear as i8

    x, w, wp, scale, wsum, b = _int8_operands(6, 37, 21, 7)
    x[1] = 0
    x[2, 5], x[3, 0] = float("nan"), float("inf")
    for isa in ISAS:
        _set_isa(isa, monkeypatch)
        out = torch.ops.fairseq_ext.int8_linear(x, wp, scale, wsum, b)
        assert torch.equal(out[1], b) and out[2].isnan().all() and out[3].isnan().all()
        torch.testing.assert_close(out, i8.int8_linear_reference(x, wp, scale, wsum, b), rtol=0, atol=0,
                                   equal_nan=True)
    wq = i8.quantize_weight(w)[0]
    assert torch.equal(i8.unpack_weight(wp, 21, 37), wq) and wp.shape == (2, 10, 16, 4)
    assert wq.abs().max() == 127 and torch.equal(wsum, wq.sum(1, dtype=torch.int32))
    lin = torch.nn.Linear(37, 21)
    m = i8.Int8Linear.from_linear(lin)
    xs = torch.randn(2, 3, 37)
    with torch.no_grad():
        y = m(xs)
        assert y.shape == (2, 3, 21)
        monkeypatch.setenv("FAIRSEQ_EXT_NO_KERNELS", "1")
        assert torch.equal(m(xs), y)  # the reference: the same bits
        torch.testing.assert_close(y, lin(xs), rtol=0.05, atol=0.05)
        monkeypatch.delenv("FAIRSEQ_EXT_NO_KERNELS")
        parts = [m, i8.Int8Linear.from_linear(torch.nn.Linear(37, 19, bias=False)), m]  # as a fused Q/K/V
        both = i8.Int8Linear.concat(parts)  # the separate calls' values in one pass
        assert torch.equal(both(xs), torch.cat([p(xs) for p in parts], dim=-1))


def test_int8_linear_clear_errors():
    x, w, wp, scale, wsum, b = _int8_operands(3, 8, 5, 1)
    with pytest.raises(RuntimeError, match="weight must be packed in tiles, \\(1, 2, 16, 4\\)"):
        torch.ops.fairseq_ext.int8_linear(x, wp.view(-1)[:5 * 8].view(5, 8), scale, wsum, b)
    with pytest.raises(RuntimeError, match="weight must be int8"):
        torch.ops.fairseq_ext.int8_linear(x, wp.float(), scale, wsum, b)
    with pytest.raises(RuntimeError, match="x must be float32"):
        torch.ops.fairseq_ext.int8_linear(x.double(), wp, scale, wsum, b)
    with pytest.raises(RuntimeError, match="weight_sum must be int32"):
        torch.ops.fairseq_ext.int8_linear(x, wp, scale, wsum.long(), b)
    with pytest.raises(RuntimeError, match="bias must be float32 \\(5\\)"):
        torch.ops.fairseq_ext.int8_linear(x, wp, scale, wsum, torch.randn(4))


def test_int8_linear_opcheck():
    for rows, k, n in [(5, 24, 7), (3, 17, 33)]:
        x, _, wp, scale, wsum, b = _int8_operands(rows, k, n, 3)
        torch.library.opcheck(torch.ops.fairseq_ext.int8_linear.default, (x, wp, scale, wsum, b))
        torch.library.opcheck(torch.ops.fairseq_ext.int8_linear.default, (x, wp, scale, wsum, None))


@pytest.mark.parametrize("tokens", [31, 32, 80])
def test_sparse_ffn_decode_many_tokens_equal_each_token_alone(tokens):
    """CPU: many tokens (batched steps; from 32 the controller's logits are BLAS products, not the fused
    pass) give each token what the op gives it alone: the same units chosen, so bit for bit the same
    output (each token's sums in the same order), with units chosen by several tokens (N = 4)."""
    d, d_ff, block = 136, 4 * 70, 4
    w = _weights(d, d_ff, block, 12, torch.float32, seed=tokens)
    x = torch.randn(tokens, d)
    out = torch.ops.fairseq_ext.sparse_ffn_decode(x, *w, block)
    alone = torch.cat([torch.ops.fairseq_ext.sparse_ffn_decode(x[t:t + 1], *w, block) for t in range(tokens)])
    assert torch.equal(out, alone)
    torch.testing.assert_close(out, sparse_ffn_decode_reference(x, *w, block), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tokens", [5, 40])
def test_sparse_ffn_decode_reads_only_the_chosen_rows(device, tokens):
    d, d_ff, block = 40, 160, 16
    w = _weights(d, d_ff, block, 10, torch.float32, seed=1, device=device)
    x = torch.randn(tokens, d).to(device)
    expect = sparse_ffn_decode_reference(x, *w, block)
    logits = (x @ w[0].T) @ w[1].T + w[2]
    rows = (logits.view(tokens, -1, block).argmax(-1) + torch.arange(d_ff // block, device=device) * block).view(-1)
    keep = torch.zeros(d_ff, dtype=torch.bool, device=device)
    keep[rows] = True
    w[3][~keep] = float("nan")
    w[4][~keep] = float("nan")
    torch.testing.assert_close(torch.ops.fairseq_ext.sparse_ffn_decode(x, *w, block), expect, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_sparse_ffn_decode_ties_and_nan_logits_choose_as_argmax(device):
    """First maximum on ties, NaN beats every number (torch.argmax's rule), on every device."""
    d, d_ff, block = 8, 32, 8
    w = _weights(d, d_ff, block, 4, torch.float64, seed=4, device=device)
    w[1].zero_()  # logits = controller bias alone
    w[2].copy_(torch.tensor([1., 3, 3, 0, 0, 0, 0, 0, 5, 1, float("nan"), 2, float("nan"), 0, 0, 0,
                             0, 0, 0, 0, 0, 0, 0, 0, -1, -1, -1, -1, -1, -1, -1, -1], dtype=torch.float64))
    x = torch.randn(3, d, dtype=torch.float64).to(device)
    torch.testing.assert_close(torch.ops.fairseq_ext.sparse_ffn_decode(x, *w, block),
                               sparse_ffn_decode_reference(x, *w, block), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
def test_sparse_ffn_decode_clear_errors(device):
    w = _weights(16, 64, 8, 8, torch.float32, seed=2, device=device)
    with pytest.raises(RuntimeError, match="block_size 7 must divide d_ff 64"):
        torch.ops.fairseq_ext.sparse_ffn_decode(torch.randn(2, 16, device=device), *w, 7)
    with pytest.raises(RuntimeError, match="W1 must be"):
        torch.ops.fairseq_ext.sparse_ffn_decode(torch.randn(2, 15, device=device), *w, 8)


@pytest.mark.parametrize("device", DEVICES)
def test_sparse_ffn_decode_opcheck(device):
    w = _weights(24, 96, 8, 12, torch.float32, seed=3, device=device)
    torch.library.opcheck(torch.ops.fairseq_ext.sparse_ffn_decode.default, (torch.randn(3, 24, device=device), *w, 8))


# compressed_attention_decode (CAN's decoding step): kernels against the reference
def _can_args(b, h, dh, dvh, src, cap, self_len, d, dtype, seed, pad=(), device="cpu"):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(dtype)
    bias = None
    if pad:  # (row, first padded position): left-aligned sources padded on the right for those rows
        bias = torch.zeros(b, src, dtype=dtype)
        for row, start in pad:
            bias[row, start:] = float("-inf")
    args = [r(b, h, dh) / dh ** 0.5, r(b, h, src, dh), r(b, h, src, dvh), bias, r(b, h, cap, dh), r(b, h, cap, dvh),
            self_len, r(b, h * dvh), r(d, h * dvh) / (h * dvh) ** 0.5, r(d)]
    return [a.to(device) if torch.is_tensor(a) else a for a in args]


CAN_SHAPES = [  # b, h, dh, dvh, src, cap, self_len, d
    (1, 1, 8, 16, 1, 1, 1, 8), (3, 2, 12, 20, 7, 9, 7, 24), (5, 4, 10, 6, 33, 40, 33, 40), (2, 3, 16, 24, 0, 8, 5, 48),
    (4, 2, 8, 12, 13, 16, 1, 16), (3, 5, 7, 9, 5, 64, 37, 35), (17, 2, 8, 8, 6, 8, 3, 20)]  # b 3-16: W2 through few_rows_linear; 1, 2, 17: GEMM


# (device, dtype): the CPU kernel takes float32/float64 (its TORCH_CHECK is tested below), CUDA also halves
CAN_CASES = [(dev, dt) for dev in DEVICES
             for dt in [torch.float64, torch.float32] + ([torch.float16, torch.bfloat16] if dev == "cuda" else [])]


@pytest.mark.parametrize("b,h,dh,dvh,src,cap,self_len,d", CAN_SHAPES)
@pytest.mark.parametrize("device,dtype", CAN_CASES)
def test_compressed_attention_decode_equals_reference(b, h, dh, dvh, src, cap, self_len, d, device, dtype):
    pad = [(0, max(1, src - 2))] if src > 2 else ()
    args = _can_args(b, h, dh, dvh, src, cap, self_len, d, dtype, seed=b * 7 + src, pad=pad, device=device)
    out = torch.ops.fairseq_ext.compressed_attention_decode(*args)
    ref = compressed_attention_decode_reference(*[a.double() if torch.is_tensor(a) else a for a in args])
    tol = {torch.float64: 1e-12, torch.float32: 2e-5, torch.float16: 2e-2, torch.bfloat16: 6e-2}[dtype]
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)
    assert torch.equal(out, torch.ops.fairseq_ext.compressed_attention_decode(*args))  # deterministic


@pytest.mark.parametrize("b,h,dh,dvh,src,cap,self_len,d", CAN_SHAPES)
def test_compressed_attention_decode_bf16_w2_equals_reference(b, h, dh, dvh, src, cap, self_len, d):
    """CPU, float32 with a bfloat16 W2 (the fast path's --bf16): the product with W2 widened to float32,
    the kernel for 1-16 rows and a GEMM on the widened W2 above."""
    pad = [(0, max(1, src - 2))] if src > 2 else ()
    args = _can_args(b, h, dh, dvh, src, cap, self_len, d, torch.float32, seed=b * 5 + src, pad=pad)
    args[8] = args[8].bfloat16()
    out = torch.ops.fairseq_ext.compressed_attention_decode(*args)
    ref = compressed_attention_decode_reference(*[a.double() if torch.is_tensor(a) else a for a in args])
    torch.testing.assert_close(out.double(), ref, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("b,h,dh,dvh,src,cap,self_len,d", CAN_SHAPES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_compressed_attention_decode_follows_the_row_table(b, h, dh, dvh, src, cap, self_len, d, dtype):
    """self_rows (CPU): position j of row b's history read from cache row self_rows[b, j] of caches with
    more rows than queries; equal to the op on the histories gathered into caches of their own, and the
    reference's gather is that gathering. Cache entries the table does not point to are never read (NaN)."""
    pad = [(0, max(1, src - 2))] if src > 2 else ()
    args = _can_args(b, h, dh, dvh, src, cap, self_len, d, dtype, seed=b * 3 + cap, pad=pad)
    g = torch.Generator().manual_seed(cap)
    cache_rows = b + 2
    k_self, v_self = (torch.randn(cache_rows, h, cap, n, generator=g, dtype=torch.float64).to(dtype) for n in (dh, dvh))
    rows = torch.randint(0, cache_rows, (b, cap), generator=g)
    used = torch.zeros(cache_rows, cap, dtype=torch.bool)
    used[rows[:, :self_len], torch.arange(self_len)] = True
    for c in (k_self, v_self):  # (cache row, position) pairs no history reads
        c.transpose(1, 2)[~used] = float("nan")
    own_k, own_v = (gather_history(c, self_len, rows) for c in (k_self, v_self))
    dbl = [a.double() if torch.is_tensor(a) else a for a in args]
    expect = compressed_attention_decode_reference(*dbl[:4], own_k.double(), own_v.double(), self_len, *dbl[7:])
    out = torch.ops.fairseq_ext.compressed_attention_decode(*args[:4], k_self, v_self, self_len, *args[7:], rows)
    tol = {torch.float64: 1e-12, torch.float32: 2e-5}[dtype]
    torch.testing.assert_close(out.double(), expect, rtol=tol, atol=tol)
    ref = compressed_attention_decode_reference(*args[:4], k_self, v_self, self_len, *args[7:], self_rows=rows)
    torch.testing.assert_close(ref.double(), expect, rtol=tol, atol=tol)
    if self_len:
        assert torch.equal(own_k[0, :, 0], k_self[rows[0, 0], :, 0])


@pytest.mark.parametrize("sentences,beam", [(1, 5), (3, 4), (2, 1), (4, 3)])
def test_compressed_attention_decode_reads_each_sentences_encoder_once(sentences, beam):
    """Encoder keys/values (and padding) with one entry per sentence: each beam row reads its sentence's;
    the same numbers, bit for bit, as with the entries repeated for every row, and the reference agrees."""
    b = sentences * beam
    args = _can_args(b, 3, 8, 12, 9, 10, 6, 20, torch.float32, seed=b, pad=[(0, 5)])
    g = torch.Generator().manual_seed(beam)
    k_enc, v_enc = torch.randn(sentences, 3, 9, 8, generator=g), torch.randn(sentences, 3, 9, 12, generator=g)
    bias = torch.zeros(sentences, 9)
    bias[-1, 4:] = float("-inf")
    per_sentence = [args[0], k_enc, v_enc, bias, *args[4:]]
    per_row = [args[0], *(t.repeat_interleave(beam, 0) for t in (k_enc, v_enc, bias)), *args[4:]]
    out = torch.ops.fairseq_ext.compressed_attention_decode(*per_sentence)
    assert torch.equal(out, torch.ops.fairseq_ext.compressed_attention_decode(*per_row))
    torch.testing.assert_close(compressed_attention_decode_reference(*per_sentence), out, rtol=2e-5, atol=2e-5)
    with pytest.raises(RuntimeError, match="k_enc must be \\(sentences dividing the batch"):
        torch.ops.fairseq_ext.compressed_attention_decode(args[0], k_enc[:1].expand(b + 1, -1, -1, -1), *per_row[2:])


@pytest.mark.parametrize("b,h,dh,dvh,src,cap,self_len,d", CAN_SHAPES)
def test_compressed_attention_decode_reads_xw1_rows_in_place(b, h, dh, dvh, src, cap, self_len, d):
    """CPU: xw1 as a slice of a wider row (the fused q/k/v/X·W1 projection's output, read without a copy):
    the same numbers, bit for bit, as a contiguous xw1."""
    args = _can_args(b, h, dh, dvh, src, cap, self_len, d, torch.float32, seed=b + cap)
    wide = torch.randn(b, h * dvh + 11)
    wide[:, 11:] = args[7]
    sliced = wide[:, 11:]
    assert not sliced.is_contiguous() or b == 1
    out = torch.ops.fairseq_ext.compressed_attention_decode(*args[:7], sliced, *args[8:])
    assert torch.equal(out, torch.ops.fairseq_ext.compressed_attention_decode(*args))


def test_compressed_attention_decode_row_table_errors():
    args = _can_args(2, 2, 8, 12, 5, 6, 3, 16, torch.float32, seed=6)
    k_self, v_self = torch.randn(4, 2, 6, 8), torch.randn(4, 2, 6, 12)
    call = lambda rows: torch.ops.fairseq_ext.compressed_attention_decode(*args[:4], k_self, v_self, 3, *args[7:], rows)
    with pytest.raises(RuntimeError, match="self_rows must point to rows of the caches \\(0 to 3\\)"):
        call(torch.tensor([[0, 1, 4], [0, 0, 0]]))
    with pytest.raises(RuntimeError, match="self_rows must be \\(2, >= self_len 3\\)"):
        call(torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(RuntimeError, match="self_rows must be int64"):
        call(torch.zeros(2, 3, dtype=torch.int32))
    with pytest.raises(RuntimeError, match="k_self must be \\(2, 2, capacity, 8\\)"):  # no table: a row per query
        torch.ops.fairseq_ext.compressed_attention_decode(*args[:4], k_self, v_self, 3, *args[7:])


@pytest.mark.parametrize("device", DEVICES)
def test_compressed_attention_decode_reads_no_padding_and_no_free_cache(device):
    """Padded source positions (bias -inf) and cache positions from self_len on are not read: NaN there
    leaves the output equal to the reference on clean values."""
    args = _can_args(3, 2, 8, 12, 11, 20, 6, 16, torch.float32, seed=5, pad=[(0, 7), (2, 3)], device=device)
    expect = compressed_attention_decode_reference(*args)
    k_enc, v_enc, k_self, v_self = (a.clone() for a in (args[1], args[2], args[4], args[5]))
    for row, start in [(0, 7), (2, 3)]:
        k_enc[row, :, start:] = float("nan")
        v_enc[row, :, start:] = float("nan")
    k_self[:, :, 6:] = float("nan")
    v_self[:, :, 6:] = float("nan")
    poisoned = [args[0], k_enc, v_enc, args[3], k_self, v_self, *args[6:]]
    torch.testing.assert_close(torch.ops.fairseq_ext.compressed_attention_decode(*poisoned), expect,
                               rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_compressed_attention_decode_clear_errors(device):
    args = _can_args(2, 2, 8, 12, 5, 6, 3, 16, torch.float32, seed=6, device=device)
    with pytest.raises(RuntimeError, match="self_len 7 must be within the cache capacity 6"):
        torch.ops.fairseq_ext.compressed_attention_decode(*args[:6], 7, *args[7:])
    with pytest.raises(RuntimeError, match="W2 must be"):
        torch.ops.fairseq_ext.compressed_attention_decode(*args[:8], torch.randn(16, 23, device=device), args[9])
    with pytest.raises(RuntimeError, match="all tensors must have q's dtype"):
        torch.ops.fairseq_ext.compressed_attention_decode(*args[:7], args[7].double(), *args[8:])
    with pytest.raises(RuntimeError, match="or be bfloat16 with float32 q on a CPU"):
        torch.ops.fairseq_ext.compressed_attention_decode(*args[:8], args[8].half(), args[9])
    if device == "cpu":
        half = [a.half() if torch.is_tensor(a) else a for a in args]
        with pytest.raises(RuntimeError, match="float32 or float64"):
            torch.ops.fairseq_ext.compressed_attention_decode(*half)


@pytest.mark.parametrize("device", DEVICES)
def test_compressed_attention_decode_opcheck(device):
    args = _can_args(3, 2, 8, 12, 5, 8, 4, 16, torch.float32, seed=7, pad=[(1, 3)], device=device)
    torch.library.opcheck(torch.ops.fairseq_ext.compressed_attention_decode.default, tuple(args))


def _nvcc():
    return shutil.which("nvcc") or next((p for p in ("/usr/local/cuda/bin/nvcc",) if os.path.exists(p)), None)


@pytest.mark.heavy
def test_cuda_sources_compile(tmp_path):
    """`nvcc -c` every csrc/cuda/*.cu, and `c++ -fsyntax-only` their host sides csrc/cuda/*.cpp, against
    this torch's headers (CI has nvcc and a CPU torch), so the CUDA build keeps compiling where no GPU
    runs it. A CPU torch wheel lacks one generated header of c10/cuda (cuda_cmake_macros.h, two macros);
    the check writes it into a scratch include folder."""
    if os.environ.get("FAIRSEQ_EXT_NO_NVCC") == "1":
        pytest.skip("FAIRSEQ_EXT_NO_NVCC=1: this machine has no CUDA compiler")
    nvcc = _nvcc()
    assert nvcc, "nvcc not found (PATH, /usr/local/cuda/bin): install the CUDA toolkit or set FAIRSEQ_EXT_NO_NVCC=1"
    from torch.utils.cpp_extension import include_paths

    extra = tmp_path / "include"
    macros = "c10/cuda/impl/cuda_cmake_macros.h"
    if not any(os.path.exists(os.path.join(p, macros)) for p in include_paths()):
        (extra / os.path.dirname(macros)).mkdir(parents=True)
        (extra / macros).write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
    flags = ["-std=c++17", f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
             "-DFAIRSEQ_EXT_WITH_CUDA=1", "-I" + os.path.join(REPO, "csrc"), "-I" + str(extra)]
    flags += ["-I" + p for p in include_paths()]
    kernels = sorted(glob.glob(os.path.join(REPO, "csrc", "cuda", "*.cu")))
    hosts = sorted(glob.glob(os.path.join(REPO, "csrc", "cuda", "*.cpp")))
    assert kernels and hosts, "no CUDA sources found in csrc/cuda"
    jobs = [[nvcc, "-c", "-O3", "-arch=sm_90", *flags, src, "-o", str(tmp_path / (os.path.basename(src) + ".o"))]
            for src in kernels]
    jobs += [[os.environ.get("CXX", "c++"), "-fsyntax-only", *flags, src] for src in hosts]
    procs = [(cmd, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)) for cmd in jobs]
    for cmd, p in procs:  # all at once: CI's two cores compile two files at a time
        _, err = p.communicate(timeout=900)
        assert p.returncode == 0, f"compile failed: {' '.join(cmd[:3])} ... {cmd[-1]}\n{err[-6000:]}"


@pytest.mark.parametrize("arch", ["scaling_sparse_tiny", "one_wide_sparse_ffn_tiny", "can_decoder_tiny",
                                  "can_decoder_ffn_tiny"])
def test_generation_with_kernels_equals_reference(arch, tiny_data, monkeypatch):
    """Beam search with the kernels (sparse FFNs on <= N tokens; CAN's decoding step) gives the
    reference path's tokens."""
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


# ---- training kernels: label_smoothed_ce (fused criterion) and hashed_dropout (--bf16 on CPU) ----

CE_SHAPES = [(1, 2), (5, 7), (3, 16), (37, 33), (16, 1003), (9, 8008)]  # V % 16: 2, 7, 0, 1, 11, 8
CE_TOL = {torch.float32: 2e-6, torch.bfloat16: 8e-3, torch.float16: 1e-3}  # gradient, relative to max |grad|


def _ce_case(n, v, dtype, seed=0, pad=1):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, v, generator=g) * 4).to(dtype)
    t = torch.randint(0, v, (n,), generator=g)
    t[::3] = pad  # ignored rows
    if n > 1:
        t[1] = 0 if pad != 0 else 1
    return x, t


@pytest.mark.parametrize("n,v", CE_SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kernels", [*ISAS, False])
def test_label_smoothed_ce_equals_fairseq_criterion(n, v, dtype, kernels, monkeypatch):
    """Value and gradient of fairseq's label_smoothed_nll_loss(log_softmax(x)) computed in float64 on the same
    (rounded) logits; the compiled op (both instruction-set paths) and the PyTorch chunked path (kernels off)."""
    from fairseq_ext.ops import cross_entropy as ce

    if kernels:
        _set_isa(kernels, monkeypatch)
    if not kernels:
        monkeypatch.setenv("FAIRSEQ_EXT_NO_KERNELS", "1")
        monkeypatch.setattr(ce, "CHUNK_ROWS", 4)  # several chunks even at these sizes
    x, t = _ce_case(n, v, dtype)
    pad = 1
    xr = x.detach().double().requires_grad_()
    loss_r, nll_r = ce.label_smoothed_ce_reference(xr, t, 0.1, pad)
    loss_r.backward()
    xk = x.detach().requires_grad_()
    loss, nll = ce.label_smoothed_ce(xk, t, 0.1, pad)
    (loss * 0.5).backward()
    assert loss.dtype == torch.float32 and not nll.requires_grad
    torch.testing.assert_close(loss.double(), loss_r, rtol=2e-6, atol=1e-5)
    torch.testing.assert_close(nll.double(), nll_r, rtol=2e-6, atol=1e-5)
    assert xk.grad.dtype == dtype
    scale = xr.grad.abs().max().item() or 1.0
    err = (xk.grad.double() - 0.5 * xr.grad).abs().max().item() / scale
    assert err <= CE_TOL[dtype], f"gradient differs by {err} of its maximum"
    assert torch.all(xk.grad[t == pad] == 0)


def test_label_smoothed_ce_ignored_rows_are_not_read_and_deterministic():
    x, t = _ce_case(37, 1003, torch.bfloat16)
    x[t == 1] = float("nan")  # rows whose target is ignored: never read
    xk = x.clone().requires_grad_()
    loss, nll = torch.ops.fairseq_ext.label_smoothed_ce_fwd(x, t, 0.1, 1), None
    assert torch.isfinite(loss).all()
    from fairseq_ext.ops.cross_entropy import label_smoothed_ce

    out, _ = label_smoothed_ce(xk, t, 0.1, 1)
    out.backward()
    assert torch.isfinite(out) and torch.isfinite(xk.grad).all()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same sums in the same order whatever the thread count
    try:
        assert torch.equal(torch.ops.fairseq_ext.label_smoothed_ce_fwd(x, t, 0.1, 1), loss)
        lse = loss[:, 2].contiguous()
        g1 = torch.ops.fairseq_ext.label_smoothed_ce_bwd(x, t, lse, torch.ones(37), 0.1, 1)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(torch.ops.fairseq_ext.label_smoothed_ce_bwd(x, t, lse, torch.ones(37), 0.1, 1), g1)


def test_label_smoothed_ce_clear_errors():
    x = torch.randn(4, 10)
    with pytest.raises(RuntimeError, match="outside"):
        torch.ops.fairseq_ext.label_smoothed_ce_fwd(x, torch.tensor([0, 1, 10, 2]), 0.1, 1)
    with pytest.raises(RuntimeError, match="target must be"):
        torch.ops.fairseq_ext.label_smoothed_ce_fwd(x, torch.tensor([0, 1]), 0.1, 1)
    with pytest.raises(RuntimeError, match="float32, bfloat16 or float16"):
        torch.ops.fairseq_ext.label_smoothed_ce_fwd(x.double(), torch.tensor([0, 1, 2, 3]), 0.1, 1)
    with pytest.raises(RuntimeError, match="lse and row_scale"):
        torch.ops.fairseq_ext.label_smoothed_ce_bwd(x, torch.tensor([0, 1, 2, 3]), torch.zeros(3), torch.ones(4), 0.1, 1)


def test_label_smoothed_ce_opcheck():
    x, t = _ce_case(5, 7, torch.float32)
    torch.library.opcheck(torch.ops.fairseq_ext.label_smoothed_ce_fwd.default, (x, t, 0.1, 1))
    torch.library.opcheck(torch.ops.fairseq_ext.label_smoothed_ce_bwd.default,
                          (x, t, torch.randn(5), torch.rand(5), 0.1, 1))


@pytest.mark.parametrize("shape", [(1,), (7,), (33, 5), (3, 17, 40), (1000, 37)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("p", [0.1, 0.3, 0.999])
@pytest.mark.parametrize("isa", ISAS)
def test_hashed_dropout_equals_reference(shape, dtype, p, isa, monkeypatch):
    from fairseq_ext.ops.dropout import hashed_dropout_reference

    _set_isa(isa, monkeypatch)
    x = torch.randn(*shape).to(dtype)
    seed = 0x1234_5678_9ABC_DEF
    out = torch.ops.fairseq_ext.hashed_dropout(x, p, seed)
    assert torch.equal(out, hashed_dropout_reference(x, p, seed))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert torch.equal(out, torch.ops.fairseq_ext.hashed_dropout(x, p, seed))
    finally:
        torch.set_num_threads(threads)
    t = x[:, 1::2] if x.dim() > 1 and x.size(1) > 1 else x  # non-contiguous input: made contiguous first
    assert torch.equal(torch.ops.fairseq_ext.hashed_dropout(t, p, seed), hashed_dropout_reference(t.contiguous(), p, seed))


def test_hashed_dropout_statistics_gradient_and_seeding():
    from fairseq_ext.ops.dropout import hashed_dropout

    x = torch.ones(200_000, requires_grad=True)
    torch.manual_seed(3)
    y = hashed_dropout(x, 0.1)
    kept = (y != 0).double().mean().item()
    assert abs(kept - 0.9) < 0.003, kept  # 4.7 standard deviations
    torch.testing.assert_close(y[y != 0], torch.full_like(y[y != 0], 1 / 0.9))
    y.backward(torch.arange(200_000, dtype=torch.float32))
    torch.testing.assert_close(x.grad, torch.where(y != 0, torch.arange(200_000) / 0.9, 0.0))  # the same mask
    torch.manual_seed(3)
    assert torch.equal(hashed_dropout(x, 0.1), y)  # reproducible from torch's seed
    assert not torch.equal(hashed_dropout(x, 0.1), y)  # a new mask each call
    # neighbouring elements are independent (no stripes): keep pairs occur as often as p^2 predicts
    k = (y != 0).double()
    assert abs((k[1:] * k[:-1]).mean().item() - 0.81) < 0.004


def test_hashed_dropout_clear_errors_and_opcheck():
    with pytest.raises(RuntimeError, match=r"p must be in \[0, 1\)"):
        torch.ops.fairseq_ext.hashed_dropout(torch.randn(4), 1.0, 1)
    torch.library.opcheck(torch.ops.fairseq_ext.hashed_dropout.default, (torch.randn(5, 7), 0.2, 77))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_decoding_ops_take_half_precision_inputs(dtype, caplog):
    """The decoding ops' entry points on CPU tensors of a dtype their CPU kernel does not take: the PyTorch
    reference computes it (a log line names the dtype), close to float32, never a crash."""
    import logging

    from fairseq_ext.ops import few_rows_linear as frl, ops_logger_name
    from fairseq_ext.ops.compressed_attention import compressed_attention_decode
    from fairseq_ext.ops.sparse_ffn import sparse_ffn_decode

    tol = {torch.float16: 2e-2, torch.bfloat16: 8e-2}[dtype]
    ops._FALLBACKS_LOGGED.clear()  # the line is logged once per process: make this test see it
    caplog.set_level(logging.INFO, logger=ops_logger_name)
    with torch.no_grad():
        x, w, b = torch.randn(5, 40), torch.randn(17, 40) / 6, torch.randn(17)
        out = frl.few_rows_linear(x.to(dtype), w.to(dtype), b.to(dtype))
        assert out.dtype == dtype
        torch.testing.assert_close(out.float(), torch.nn.functional.linear(x, w, b), rtol=tol, atol=tol)
        # the reference on the same rounded inputs: the controller runs in float32 in both, so the choices agree
        weights = [t.to(dtype).float() for t in _weights(40, 120, 12, 8, torch.float32, seed=4)]
        x = torch.randn(3, 40).to(dtype).float()
        out = sparse_ffn_decode(x.to(dtype), *[t.to(dtype) for t in weights], 12)
        ref = sparse_ffn_decode_reference(x, *weights, 12)
        assert out.dtype == dtype
        torch.testing.assert_close(out.float(), ref, rtol=tol, atol=tol * ref.abs().max().item())
        args = _can_args(3, 2, 12, 20, 7, 9, 7, 24, torch.float32, seed=5, pad=[(0, 4)])
        out = compressed_attention_decode(*[a.to(dtype) if torch.is_tensor(a) else a for a in args])
        ref = compressed_attention_decode_reference(*args)
        assert out.dtype == dtype
        torch.testing.assert_close(out.float(), ref, rtol=tol, atol=tol * ref.abs().max().item())
    logged = caplog.text
    for op in ("few_rows_linear", "sparse_ffn_decode", "compressed_attention_decode"):
        assert f"{op}: no cpu kernel for {dtype}" in logged, logged


# every product Bf16ProductsInFp32 computes, at odd sizes (a transposed operand, a long sum among them)
PRODUCT_CASES = [("mm", [(7, 33), (33, 13)]), ("mm", [(7, 1031), (13, 1031, "t")]),
                 ("addmm", [(13,), (7, 33), (33, 13)]), ("bmm", [(3, 5, 17), (3, 17, 9)]),
                 ("baddbmm", [(3, 5, 9), (3, 5, 17), (3, 17, 9)]), ("addbmm", [(5, 9), (3, 5, 17), (3, 17, 9)]),
                 ("mv", [(7, 33), (33,)]), ("addmv", [(7,), (7, 33), (33,)]), ("dot", [(33,), (33,)]),
                 ("conv1d", [(2, 6, 11), (4, 3, 5), (4,)], {"groups": 2, "padding": 2})]


@pytest.mark.parametrize("case", PRODUCT_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(PRODUCT_CASES)])
def test_bf16_products_in_fp32_equal_the_rounded_exact_product(case):
    """A bf16 product computed in fp32 (fairseq_ext/precision.py's mode for CPUs without native bf16) is the
    exact product of the bf16 values rounded to bf16, as a native bf16 kernel's (exact products, fp32 sums):
    within half a bf16 unit in the last place of the exact value (float64), equal to its rounding almost
    everywhere (the fp32 sum may land on the other side of a tie); bf16 out; fp32 products pass untouched."""
    from fairseq_ext.precision import Bf16ProductsInFp32

    op, shapes, kwargs = case if len(case) == 3 else (*case, {})
    g = torch.Generator().manual_seed(len(shapes))
    xs = [torch.randn(s[:2] if s[-1] == "t" else s, generator=g).bfloat16() for s in shapes]
    xs = [x.t() if s[-1] == "t" else x for x, s in zip(xs, shapes)]
    fn = functools.partial(getattr(torch, op), **kwargs)
    with Bf16ProductsInFp32():
        y = fn(*xs)
        y32 = fn(*[x.float() for x in xs])
    exact = fn(*[x.double() for x in xs])
    assert y.dtype == torch.bfloat16 and y.shape == exact.shape
    rel = ((y.double() - exact).abs() / exact.abs().clamp_min(1e-30)).max().item()
    assert rel <= 2.0 ** -8 * 1.001, f"{op}: off the exact product by {rel:.2e} of it (half a bf16 ulp: {2 ** -8:.2e})"
    assert (y == exact.bfloat16()).double().mean().item() >= 0.98
    assert y32.dtype == torch.float32 and torch.equal(y32, fn(*[x.float() for x in xs]))
