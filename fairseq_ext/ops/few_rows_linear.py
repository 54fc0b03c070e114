"""few_rows_linear: y = x·Wᵀ + b (F.linear) for the few rows of a CPU decoding step (batch × beam), reading
the weight once for all rows (kernels: csrc/few_rows_linear.cpp, csrc/cpu/few_rows_linear.cpp).

    y = few_rows_linear(x, weight, bias)      x: (..., K), weight: (N, K), bias: (N) or None -> (..., N)

At 3-16 rows MKL's GEMM packs the weight on every call, so it reads the weights more slowly than a kernel
that streams each weight row once for all rows (its effect on whole decoding steps: the tables of
docs/decoding/README.md). One or two rows stay on F.linear (MKL is as fast there).

The weight may be bfloat16 with float32 x (the fast path's --bf16): half the bytes streamed, and the kernel
serves every row count up to MAX_ROWS then (F.linear would need the weight converted to float32 on every
call). Each weight is widened exactly to float32 and y equals F.linear(x, weight.float(), bias) up to the
order of the sums. With FAIRSEQ_EXT_BF16_PRODUCTS=1 (env, read at each call) on a CPU with AVX512_BF16
(`bf16_dot()`, checked at run time) the products are bf16 instead: x is rounded to bf16 once per call and
vdpbf16ps multiplies 32 weights per instruction (twice a float32 FMA's), sums in float32, so y equals
F.linear(x.bfloat16().float(), weight.float(), bias) up to the order of the sums; faster where a step is
bound by its multiply-adds (5 rows and more), but no longer the arithmetic of the float32 model.
`F.linear` (on the weight converted to x's dtype) is the reference and the fallback.

    y = few_rows_linear_packed(x, pack_panels(weight), bias, N)

The same product on the weight in the kernel's panel layout (pack_panels, made once per weight: the fast
path's --bf16 copies): rows in panels of PANEL, each panel's 16-column blocks stored row after row (then
each row's K % 16 last columns), the rows after the last whole panel as they are. The kernel then streams
one contiguous run of memory per thread instead of several interleaved rows, which the CPU's prefetchers
follow further ahead (docs/decoding/README.md); its sums and their order are few_rows_linear's (equal outputs
bit for bit where the AVX-512 intrinsics run). Reference and fallback: F.linear on unpack_panels(packed).
"""
import torch
import torch.nn.functional as F

from . import kernel_serves

KERNEL_DTYPES = {"cpu": (torch.float32, torch.float64)}  # csrc/cpu/few_rows_linear.cpp; CPU only
# the rows the kernel is used for (2 rows: MKL is as fast; above 8: one pass per 8 rows); the CPU CAN op
# uses the same range (kFewRowsMin / kFewRowsMax in csrc/few_rows_linear.h)
MIN_ROWS, MAX_ROWS = 3, 16
# W rows per panel of the packed layout: 6 W rows x 5 rows of x (beam 5) fill 30 of AVX-512's 32 registers
# with sums; the kernel takes 3 at a time for 6-8 rows of x (csrc/cpu/few_rows_linear.cpp: panel_group)
PANEL = 6
LANES = 16  # columns per block (one AVX-512 register of float32)


def few_rows_linear_reference(x, weight, bias=None):
    return F.linear(x, weight.to(x.dtype), bias)


def bf16_dot():
    """Whether the kernel computes a bf16 weight's products in bf16: FAIRSEQ_EXT_BF16_PRODUCTS=1 on a CPU with
    AVX512_BF16, not FAIRSEQ_EXT_CPU_ISA=portable (read at each call, as the kernel does)."""
    from . import _C

    return _C is not None and hasattr(_C, "few_rows_bf16_dot") and _C.few_rows_bf16_dot()


def kernel_reference(x, weight, bias=None):
    """What the kernel computes (F.linear up to the order of the sums): with a bf16 weight on a CPU with bf16
    dot products (bf16_dot), the product of x rounded to bf16."""
    if weight.dtype == torch.bfloat16 and x.dtype == torch.float32 and bf16_dot():
        x = x.bfloat16().float()
    return few_rows_linear_reference(x, weight, bias)


def kernel_applies(x, bf16_weight=False, op="few_rows_linear"):
    """Whether the kernel (op: few_rows_linear or few_rows_linear_packed) serves x's rows (MIN_ROWS..MAX_ROWS;
    1..MAX_ROWS against a bf16 weight)."""
    rows = x.numel() // max(1, x.size(-1))
    low = 1 if bf16_weight and x.dtype == torch.float32 else MIN_ROWS
    return low <= rows <= MAX_ROWS and kernel_serves(op, x, KERNEL_DTYPES)


def few_rows_linear(x, weight, bias=None):
    if kernel_applies(x, weight.dtype == torch.bfloat16):
        out = torch.ops.fairseq_ext.few_rows_linear(x.reshape(-1, x.size(-1)), weight, bias)
        return out.view(*x.shape[:-1], weight.size(0))
    return few_rows_linear_reference(x, weight, bias)


def pack_panels(weight, panel=PANEL):
    """weight (N, K) in the panel layout, 1-D (module docstring); any dtype, any N and K."""
    n, k = weight.shape
    whole, blocks = n // panel * panel, k // LANES * LANES
    w = weight.detach()
    main = w[:whole, :blocks].reshape(n // panel, panel, k // LANES, LANES).transpose(1, 2)
    tail = w[:whole, blocks:].reshape(n // panel, panel * (k - blocks))
    panels = torch.cat([main.reshape(n // panel, panel * blocks), tail], dim=1)
    return torch.cat([panels.reshape(-1), w[whole:].reshape(-1)]).contiguous()


def unpack_panels(packed, out_features, in_features, panel=PANEL):
    """The (N, K) weight of pack_panels' layout (its inverse)."""
    n, k = out_features, in_features
    whole, blocks = n // panel * panel, k // LANES * LANES
    panels = packed[:whole * k].view(n // panel, panel * k)
    main = panels[:, :panel * blocks].reshape(n // panel, k // LANES, panel, LANES).transpose(1, 2)
    tail = panels[:, panel * blocks:].reshape(n // panel, panel, k - blocks)
    top = torch.cat([main.reshape(n // panel, panel, blocks), tail], dim=2).reshape(whole, k)
    return torch.cat([top, packed[whole * k:].view(n - whole, k)])


def few_rows_linear_packed_reference(x, packed, bias, out_features, panel=PANEL):
    return F.linear(x, unpack_panels(packed, out_features, x.size(-1), panel).to(x.dtype), bias)


def few_rows_linear_packed(x, packed, bias, out_features, panel=PANEL):
    """few_rows_linear on pack_panels(weight): x (..., K) -> (..., out_features)."""
    if kernel_applies(x, packed.dtype == torch.bfloat16, "few_rows_linear_packed"):
        out = torch.ops.fairseq_ext.few_rows_linear_packed(x.reshape(-1, x.size(-1)), packed, bias, out_features,
                                                           panel)
        return out.view(*x.shape[:-1], out_features)
    return few_rows_linear_packed_reference(x, packed, bias, out_features, panel)


if hasattr(torch.library, "register_fake"):
    try:
        @torch.library.register_fake("fairseq_ext::few_rows_linear")
        def _few_rows_linear_fake(x, weight, bias):
            return x.new_empty(x.size(0), weight.size(0))
    except (RuntimeError, ValueError):  # extension not loaded (no such op), or registered already
        pass
    try:
        @torch.library.register_fake("fairseq_ext::few_rows_linear_packed")
        def _few_rows_linear_packed_fake(x, packed, bias, out_features, panel):
            return x.new_empty(x.size(0), out_features)
    except (RuntimeError, ValueError):
        pass
