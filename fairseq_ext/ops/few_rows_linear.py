"""few_rows_linear: y = x·Wᵀ + b (F.linear) for the few rows of a CPU decoding step (batch × beam), reading
the weight once for all rows (kernels: csrc/few_rows_linear.cpp, csrc/cpu/few_rows_linear.cpp).

    y = few_rows_linear(x, weight, bias)      x: (..., K), weight: (N, K), bias: (N) or None -> (..., N)

At 3-16 rows MKL's GEMM packs the weight on every call, so it reads the weights more slowly than a kernel
that streams each weight row once for all rows (its effect on whole decoding steps: the tables of
docs/decoding/README.md). One or two rows stay on F.linear (MKL is as fast there).

The weight may be bfloat16 with float32 x (the fast path's --bf16): half the bytes streamed, each weight
widened exactly to float32 and summed in float32, so y equals F.linear(x, weight.float(), bias) up to the
order of the sums; the kernel serves every row count up to MAX_ROWS then (F.linear would need the weight
converted to float32 on every call).
`F.linear` (on the weight converted to x's dtype) is the reference and the fallback.
"""
import torch
import torch.nn.functional as F

from . import kernel_serves

KERNEL_DTYPES = {"cpu": (torch.float32, torch.float64)}  # csrc/cpu/few_rows_linear.cpp; CPU only
# the rows the kernel is used for (2 rows: MKL is as fast; above 8: one pass per 8 rows); the CPU CAN op
# uses the same range (kFewRowsMin / kFewRowsMax in csrc/few_rows_linear.h)
MIN_ROWS, MAX_ROWS = 3, 16


def few_rows_linear_reference(x, weight, bias=None):
    return F.linear(x, weight.to(x.dtype), bias)


def kernel_applies(x, bf16_weight=False):
    """Whether the kernel serves x's rows (MIN_ROWS..MAX_ROWS; 1..MAX_ROWS against a bf16 weight)."""
    rows = x.numel() // max(1, x.size(-1))
    low = 1 if bf16_weight and x.dtype == torch.float32 else MIN_ROWS
    return low <= rows <= MAX_ROWS and kernel_serves("few_rows_linear", x, KERNEL_DTYPES)


def few_rows_linear(x, weight, bias=None):
    if kernel_applies(x, weight.dtype == torch.bfloat16):
        out = torch.ops.fairseq_ext.few_rows_linear(x.reshape(-1, x.size(-1)), weight, bias)
        return out.view(*x.shape[:-1], weight.size(0))
    return few_rows_linear_reference(x, weight, bias)


if hasattr(torch.library, "register_fake"):
    try:
        @torch.library.register_fake("fairseq_ext::few_rows_linear")
        def _few_rows_linear_fake(x, weight, bias):
            return x.new_empty(x.size(0), weight.size(0))
    except (RuntimeError, ValueError):  # extension not loaded (no such op), or registered already
        pass
