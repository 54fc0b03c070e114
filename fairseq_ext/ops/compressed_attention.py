"""compressed_attention_decode: one decoding step of the Compressed Attention Network's sub-layer (Li et
al. 2021, Eq. 11 and 13) after the fused input projection (kernels: csrc/compressed_attention.cpp,
csrc/cpu/compressed_attention.cpp, csrc/cuda/compressed_attention{.cu,_host.cpp}).

    y = compressed_attention_decode(q, k_enc, v_enc, enc_bias, k_self, v_self, self_len, xw1, w2, b2,
                                    self_rows=None)

q: (B, H, dh) scaled query; k_enc, v_enc: (B_s, H, S, dh / dvh) encoder keys and values (values in the
FFN-hidden space), B_s dividing B: row b reads entry b // (B // B_s) (one entry per sentence for its beam
rows, or one per row); enc_bias: (B_s, S) additive padding bias (0 / -inf) or None; k_self, v_self: (B, H, cap,
dh / dvh) the decoder's key/value cache of which the first self_len positions are valid; xw1: (B, H·dvh)
= X·W1 + b1; w2: (d, H·dvh) fc2.weight (q's dtype, or bfloat16 with float32 q on a CPU: the fast
path's --bf16, read as bf16 and widened exactly); b2: (d); self_rows: None, or (B, >= self_len) int64:
position j of row b's history is at row self_rows[b, j] of the caches, which may then have any number of
rows (the fast path's beam search reorders this table instead of the caches). Returns ReLU(xw1 + A·V)·W2ᵀ + b2: (B, d), with A one
softmax over the encoder and decoder keys. `compressed_attention_decode_reference` is the PyTorch spec
and the fallback.
"""
import torch
import torch.nn.functional as F

from . import kernel_serves


def gather_history(cache, self_len, self_rows=None):
    """The first self_len positions of each row's history, (B, H, self_len, d): the cache's own rows, or
    position j of row b from cache row self_rows[b, j]."""
    if self_rows is None:
        return cache[:, :, :self_len]
    positions = torch.arange(self_len, device=cache.device)
    return cache[self_rows[:, :self_len], :, positions].permute(0, 2, 1, 3)  # (B, n, H, d) -> (B, H, n, d)


def per_row(t, rows):
    """An encoder tensor with one entry per sentence (or per row), one entry per each of `rows` query rows:
    each sentence's entry repeated for its rows // sentences consecutive rows."""
    if t is None or t.size(0) == rows:
        return t
    return t.repeat_interleave(rows // t.size(0), dim=0)


def compressed_attention_hidden_reference(q, k_enc, v_enc, enc_bias, k_self, v_self, self_len, xw1, self_rows=None):
    """ReLU(xw1 + A·V): (B, H·dvh), the FFN-hidden row before the second FFN layer (the fast path's int8
    step applies a quantized fc2 to it)."""
    k_enc, v_enc, enc_bias = (per_row(t, q.size(0)) for t in (k_enc, v_enc, enc_bias))
    k_s, v_s = gather_history(k_self, self_len, self_rows), gather_history(v_self, self_len, self_rows)
    s_enc = torch.einsum("bhd,bhsd->bhs", q, k_enc)
    if enc_bias is not None:
        s_enc = s_enc + enc_bias.unsqueeze(1)
    scores = torch.cat([s_enc, torch.einsum("bhd,bhsd->bhs", q, k_s)], dim=-1)  # Eq. 11: one softmax
    p_enc, p_self = torch.softmax(scores, dim=-1).split([k_enc.size(2), self_len], dim=-1)
    ctx = torch.einsum("bhs,bhsv->bhv", p_enc, v_enc) + torch.einsum("bhs,bhsv->bhv", p_self, v_s)
    return F.relu(xw1 + ctx.reshape(xw1.shape))


def compressed_attention_decode_reference(q, k_enc, v_enc, enc_bias, k_self, v_self, self_len, xw1, w2, b2,
                                          self_rows=None):
    hidden = compressed_attention_hidden_reference(q, k_enc, v_enc, enc_bias, k_self, v_self, self_len, xw1,
                                                   self_rows)
    return F.linear(hidden, w2.to(hidden.dtype), b2)  # Eq. 13


# dtypes models send to each compiled implementation, for the devices whose kernel has passed
# tests/test_kernels.py on real hardware. The CUDA kernel compiles (CI's nvcc check) but has not run on a
# GPU yet: models keep the PyTorch reference on CUDA until scripts/gpu_check.sh passes there; then add
# "cuda": (float32, float64, float16, bfloat16).
KERNEL_DTYPES = {"cpu": (torch.float32, torch.float64)}


def kernel_applies(q):
    """The compiled op serves this call (ops.kernel_serves with KERNEL_DTYPES)."""
    return kernel_serves("compressed_attention_decode", q, KERNEL_DTYPES)


def compressed_attention_decode(q, k_enc, v_enc, enc_bias, k_self, v_self, self_len, xw1, w2, b2, self_rows=None):
    if kernel_applies(q):  # (CPU: self_rows is CPU-only in the kernels)
        return torch.ops.fairseq_ext.compressed_attention_decode(q, k_enc, v_enc, enc_bias, k_self, v_self,
                                                                  self_len, xw1, w2, b2, self_rows)
    return compressed_attention_decode_reference(q, k_enc, v_enc, enc_bias, k_self, v_self, self_len, xw1, w2, b2,
                                                 self_rows)


if hasattr(torch.library, "register_fake"):
    try:
        @torch.library.register_fake("fairseq_ext::compressed_attention_decode")
        def _compressed_attention_decode_fake(q, k_enc, v_enc, enc_bias, k_self, v_self, self_len, xw1, w2, b2,
                                              self_rows=None):
            return q.new_empty(q.size(0), w2.size(0))
    except (RuntimeError, ValueError):  # extension not loaded (no such op), or registered already
        pass
