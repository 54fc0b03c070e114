"""hashed_dropout: dropout with a counter-based mask (kernels: csrc/dropout.cpp, csrc/cpu/dropout.cpp).

    y = hashed_dropout(x, p)      training-mode dropout of any float tensor, differentiable

The mask of element i is a hash of (seed, i) — two rounds of MurmurHash3's finaliser, the top 24 bits
compared with round(p·2^24) — with the seed drawn from torch's default generator, so `torch.manual_seed`
(fairseq seeds every update) makes it reproducible, and the backward recomputes the mask instead of
storing it. On CPU the compiled op computes it in a few vector integer operations per element
(torch's `bernoulli_` is most of a CPU dropout call); `hashed_dropout_reference` computes the same bits
in PyTorch (the spec, the fallback and the test oracle). p is applied to 2^-24.
"""
import torch

from . import kernels_enabled, has_kernel

KERNEL_DTYPES = {"cpu": (torch.float32, torch.bfloat16, torch.float16, torch.float64)}  # csrc/cpu/dropout.cpp
_M32 = 0xFFFFFFFF


def _fmix32(h):  # int64 tensor holding uint32 values
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & _M32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & _M32
    return h ^ (h >> 16)


def dropout_keep_mask(numel, p, seed, device="cpu"):
    """The kernel's keep mask (bool, flat) for `numel` elements: hash(seed, i) >> 8 >= round(p·2^24)."""
    i = torch.arange(numel, dtype=torch.int64, device=device)
    h = _fmix32(_fmix32(i ^ (seed & _M32)) ^ ((seed >> 32) & _M32))
    return (h >> 8) >= int(p * 16777216.0 + 0.5)


def hashed_dropout_reference(x, p, seed):
    keep = dropout_keep_mask(x.numel(), p, seed, x.device).view(x.shape)
    if x.dtype == torch.float64:
        return torch.where(keep, x / (1.0 - p), 0.0).to(x.dtype)
    return torch.where(keep, x.float() * (1.0 / (1.0 - p)), 0.0).to(x.dtype)


def _apply(x, p, seed):
    if (kernels_enabled() and x.dtype in KERNEL_DTYPES.get(x.device.type, ())
            and has_kernel("hashed_dropout", x.device.type)):
        return torch.ops.fairseq_ext.hashed_dropout(x, p, seed)
    return hashed_dropout_reference(x.contiguous(), p, seed)


class _HashedDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, p, seed):
        ctx.p, ctx.seed = p, seed
        return _apply(x, p, seed)

    @staticmethod
    def backward(ctx, grad):
        return _apply(grad, ctx.p, ctx.seed), None, None


def new_seed():
    """A 63-bit seed from torch's default CPU generator."""
    return int(torch.randint(0, 2**62, (1,), dtype=torch.int64).item())


def hashed_dropout(x, p):
    if p <= 0.0:
        return x
    if p >= 1.0:
        return x * 0.0
    return _HashedDropout.apply(x, float(p), new_seed())


if hasattr(torch.library, "register_fake"):
    try:
        @torch.library.register_fake("fairseq_ext::hashed_dropout")
        def _hashed_dropout_fake(x, p, seed):
            return torch.empty_like(x, memory_format=torch.contiguous_format)
    except (RuntimeError, ValueError):  # extension not loaded (no such op), or registered already
        pass
