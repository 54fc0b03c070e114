"""sparse_ffn_decode: the top-1-of-N sparse FFN (Scaling Transformers §3.1) for a few tokens, reading
only the chosen row of W1 and of W2 per block (kernels: csrc/sparse_ffn.cpp, csrc/cpu/sparse_ffn.cpp,
csrc/cuda/sparse_ffn.cu).

    y = sparse_ffn_decode(x, c1, c2, cb, w1, w2, b2, block_size)     x: (n, d) -> y: (n, d)

c1: (d_lowrank, d), c2: (d_ff, d_lowrank), cb: (d_ff) the controller; w1, w2: (d_ff, d) one row per
hidden unit; b2: (d). `sparse_ffn_decode_reference` is the PyTorch spec and the fallback.
"""
import torch
import torch.nn.functional as F

from . import kernel_serves

# dtypes each compiled implementation takes (csrc/cpu/sparse_ffn.cpp, csrc/cuda/sparse_ffn.cu)
KERNEL_DTYPES = {"cpu": (torch.float32, torch.float64),
                 "cuda": (torch.float32, torch.float64, torch.float16, torch.bfloat16)}


def sparse_ffn_decode_reference(x, c1, c2, cb, w1, w2, b2, block_size):
    n, blocks = x.size(0), w1.size(0) // block_size
    # the controller in float32 at least, as the model's training forward (SparseFFNInput.controller_logits)
    up = torch.promote_types(x.dtype, torch.float32)
    logits = F.linear(F.linear(x.to(up), c1.to(up)), c2.to(up), cb.to(up)).view(n, blocks, block_size)
    rows = logits.argmax(-1) + torch.arange(blocks, device=x.device) * block_size  # (n, blocks)
    h = F.relu(torch.bmm(w1.index_select(0, rows.view(-1)).view(n, blocks, -1), x.unsqueeze(-1)).squeeze(-1))
    return torch.bmm(h.unsqueeze(1), w2.index_select(0, rows.view(-1)).view(n, blocks, -1)).squeeze(1) + b2


# The CUDA kernel computes each unit's logit with one thread (a serial loop over d_lowrank): faster than
# the dense FFN up to d_lowrank 256 (H200, d 1024: 1.4-1.9x per call), slower at 768 (one_wide widths:
# 0.56x). Above this the model keeps its dense path on CUDA (docs/benchmarks/sparse_ffn_speed_cuda*.md).
CUDA_MAX_LOWRANK = 512


def kernel_applies(x, lowrank=0):
    """The compiled op serves this call (ops.kernel_serves with KERNEL_DTYPES) and, on CUDA, the
    controller rank (C1's rows) is one it is fast for."""
    if x.device.type == "cuda" and lowrank > CUDA_MAX_LOWRANK:
        return False
    return kernel_serves("sparse_ffn_decode", x, KERNEL_DTYPES)


def sparse_ffn_decode(x, c1, c2, cb, w1, w2, b2, block_size):
    if kernel_applies(x, c1.size(0)):
        return torch.ops.fairseq_ext.sparse_ffn_decode(x, c1, c2, cb, w1, w2, b2, block_size)
    return sparse_ffn_decode_reference(x, c1, c2, cb, w1, w2, b2, block_size)


if hasattr(torch.library, "register_fake"):
    try:
        @torch.library.register_fake("fairseq_ext::sparse_ffn_decode")
        def _sparse_ffn_decode_fake(x, c1, c2, cb, w1, w2, b2, block_size):
            return x.new_empty(x.shape)
    except (RuntimeError, ValueError):  # extension not loaded (no such op), or registered already
        pass
