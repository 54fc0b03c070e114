"""int8_linear: y ≈ x·Wᵀ + b with W stored in int8 (one scale per output row) and x quantized per row on the
fly; the sums are exact integers (kernels: csrc/int8_linear.cpp, csrc/cpu/int8_linear.cpp). The layer of the
--int8 decoding path (fairseq_ext/decoding/fast_generator.py: quantize_decoder_int8).

    wq, scale, wsum = quantize_weight(weight)         weight: (N, K) float32 -> W_q int8 (N, K), (N), (N)
    packed = pack_weight(wq)                          (⌈N/16⌉, ⌈K/4⌉, 16, 4): the kernels' layout
    y = int8_linear(x, packed, scale, wsum, bias)     x: (..., K) float32 -> (..., N)
    Int8Linear.from_linear(nn.Linear)                 the module

Quantization (symmetric, per row): s_w[j] = max_k |W[j, k]| / 127, W_q = round(W / s_w) in [-127, 127]; for x,
per row at every call, s_x[m] = max_k |x[m, k]| / 127, q = round(x · (127 / max_k |x[m, k]|)). Then
y[m, j] = float(Σ_k q[m, k] · W_q[j, k]) · (s_x[m] · s_w[j]) + b[j], float32 in that order. The integer sums
are exact, so the compiled kernel (AVX-512 VNNI or its portable loop) and this reference agree bit for bit,
at any row count and thread count: a decoding step gives the same hypotheses through either.
"""
import torch
import torch.nn as nn

from . import kernel_serves

KERNEL_DTYPES = {"cpu": (torch.float32,)}  # csrc/cpu/int8_linear.cpp; CPU only


def quantize_weight(weight):
    """(W_q int8 (N, K), s_w float32 (N), Σ_k W_q int32 (N)) of a float weight (N, K), symmetric per row; an
    all-zero row gets scale 1 (W_q = 0)."""
    w = weight.detach().float()
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    wq = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return wq.contiguous(), scale.contiguous(), wq.sum(dim=1, dtype=torch.int32)


def pack_weight(wq):
    """W_q (N, K) int8 -> tiles of 16 outputs x 4 inputs, (⌈N/16⌉, ⌈K/4⌉, 16, 4), zero padded: one 64-byte load
    of the kernel holds 4 inputs of 16 outputs, and each tile of 16 outputs is one contiguous stream."""
    n, k = wq.shape
    padded = wq.new_zeros(-(-n // 16) * 16, -(-k // 4) * 4)
    padded[:n, :k] = wq
    return padded.view(-1, 16, padded.size(1) // 4, 4).permute(0, 2, 1, 3).contiguous()


def unpack_weight(packed, n, k):
    """pack_weight's inverse: (N, K) int8."""
    t, kq = packed.shape[:2]
    return packed.permute(0, 2, 1, 3).reshape(t * 16, kq * 4)[:n, :k]


def quantize_rows_reference(x):
    """(q (M, K) as float64 integers, s_x (M)): x's rows quantized as the kernel does (module docstring); a
    row of zeros gives q = 0, s = 0; one with a NaN or infinity q = 0, s = NaN."""
    amax = x.abs().amax(dim=-1)
    finite = torch.isfinite(x).all(dim=-1)
    ok = finite & (amax > 0)
    safe = torch.where(ok, amax, torch.ones_like(amax))
    inv = 127 / safe  # float32, as the kernel's 127.f / amax
    q = torch.where(ok[:, None], torch.round(x * inv[:, None]).clamp(-127, 127), torch.zeros_like(x))
    s = torch.where(finite, amax / 127, torch.full_like(amax, float("nan")))
    return q.double(), s


def int8_linear_reference(x, weight, weight_scale, weight_sum=None, bias=None):
    """The spec: float64 products of integers (exact: |Σ| < 2^53), then the kernel's float32 scaling. weight:
    packed (pack_weight); weight_sum is not needed here (the kernels' offset)."""
    rows = x.reshape(-1, x.size(-1)).float()
    q, sx = quantize_rows_reference(rows)
    wq = unpack_weight(weight, weight_scale.numel(), x.size(-1))
    acc = (q @ wq.double().t()).float()  # exact integer sums, rounded to float32 as the kernel's int -> float
    y = acc * (sx[:, None] * weight_scale[None, :])
    if bias is not None:
        y = y + bias
    return y.view(*x.shape[:-1], weight_scale.numel())


def int8_linear(x, weight, weight_scale, weight_sum, bias=None):
    if kernel_serves("int8_linear", x, KERNEL_DTYPES):
        out = torch.ops.fairseq_ext.int8_linear(x.reshape(-1, x.size(-1)), weight, weight_scale, weight_sum, bias)
        return out.view(*x.shape[:-1], weight_scale.numel())
    return int8_linear_reference(x, weight, weight_scale, weight_sum, bias)


class Int8Linear(nn.Module):
    """nn.Linear's forward on an int8 weight (per-row scales) and x quantized per row at each call:
    int8_linear. Inference only (buffers, no gradient); `from_linear` quantizes an nn.Linear."""

    def __init__(self, in_features, out_features, bias=True):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("weight_packed", pack_weight(torch.zeros(out_features, in_features, dtype=torch.int8)))
        self.register_buffer("weight_scale", torch.ones(out_features))
        self.register_buffer("weight_sum", torch.zeros(out_features, dtype=torch.int32))
        self.register_buffer("bias", torch.zeros(out_features) if bias else None)

    @classmethod
    def from_linear(cls, linear: nn.Linear):
        m = cls(linear.in_features, linear.out_features, linear.bias is not None)
        wq, m.weight_scale, m.weight_sum = quantize_weight(linear.weight)
        m.weight_packed = pack_weight(wq)
        if linear.bias is not None:
            m.bias = linear.bias.detach().float().clone()
        return m.to(linear.weight.device)

    @classmethod
    def concat(cls, modules):
        """One Int8Linear whose outputs are the given layers' outputs side by side (layers reading the same
        input; a layer without bias gets a zero one when another has one): each output row keeps its int8 row
        and scale, and x is quantized per row as for each layer alone, so the result has the separate calls'
        values, in one pass over the weights."""
        k = modules[0].in_features
        n = sum(m.out_features for m in modules)
        out = cls(k, n, any(m.bias is not None for m in modules))
        out.weight_packed = pack_weight(torch.cat([unpack_weight(m.weight_packed, m.out_features, k) for m in modules]))
        out.weight_scale = torch.cat([m.weight_scale for m in modules])
        out.weight_sum = torch.cat([m.weight_sum for m in modules])
        if out.bias is not None:
            out.bias = torch.cat([m.bias if m.bias is not None else m.weight_scale.new_zeros(m.out_features)
                                  for m in modules])
        return out

    def forward(self, x):
        return int8_linear(x, self.weight_packed, self.weight_scale, self.weight_sum, self.bias)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


if hasattr(torch.library, "register_fake"):
    try:
        @torch.library.register_fake("fairseq_ext::int8_linear")
        def _int8_linear_fake(x, weight, weight_scale, weight_sum, bias):
            return x.new_empty(x.size(0), weight_scale.size(0))
    except (RuntimeError, ValueError):  # extension not loaded (no such op), or registered already
        pass
