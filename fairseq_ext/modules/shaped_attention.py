"""Shaped attention and the simplified Transformer blocks of He & Hofmann 2024 ("Simplifying Transformer
Blocks"), with the details of the authors' official code
(docs/architecture.md, "Papers and their official code").

Shaped attention, per head h (the paper's shaped-attention equation):
    A_h = α_h·I + β_h·softmax(Q Kᵀ/√d_h + mask) − γ_h·C
C is the softmax of zero logits under the same mask: the causal uniform matrix (row i: 1/(i+1) on its
first i+1 keys) for the decoder, uniform over the non-padded keys for the encoder. α, β, γ are
trainable per head, initialised 1, 1, 1, and W_Q is zero-initialised, so at initialisation
softmax(...) = C and A = I: the attention sub-block is the identity map. Values and output projection
are the identity (no W_V, no W_O): the output of head h is A_h times its d/H slice of the input.
Optionally (the official first layer) W_V = I + W with W zero-initialised.

The identity sits on the diagonal of the *absolute* positions: when decoding with a cache, query t
(0-based) of a step sits at key position (cache length + t) — the official code's generation slices I
without this offset; ours passes the incremental == full test.
"""
from typing import Dict, Optional

import torch
import torch.nn.functional as F
from fairseq.incremental_decoding_utils import with_incremental_state
from fairseq.modules.fairseq_dropout import FairseqDropout
from torch import Tensor, nn

from .kv_cache import append_to_cache


class RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + eps) · g (eps 1e-8 as the official code)."""

    def __init__(self, dim, eps=1e-8):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return F.rms_norm(x, (x.size(-1),), self.weight, self.eps)


@with_incremental_state
class ShapedAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, causal, value_matrix=False, dropout=0.0):
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"embedding dim {embed_dim} must be divisible by the number of heads {num_heads}")
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.causal = causal
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=False)
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=False)
        nn.init.zeros_(self.q_proj.weight)  # W_Q = 0: A = I at initialisation
        nn.init.xavier_uniform_(self.k_proj.weight)
        self.alpha = nn.Parameter(torch.ones(num_heads))
        self.beta = nn.Parameter(torch.ones(num_heads))
        self.gamma = nn.Parameter(torch.ones(num_heads))
        self.value = nn.Parameter(torch.zeros(embed_dim, embed_dim)) if value_matrix else None  # W_V = I + W
        self.dropout_module = FairseqDropout(dropout, module_name=self.__class__.__name__)

    def _heads(self, x):
        """(L, B, C) -> (B, H, L, d_h)"""
        return x.view(x.size(0), x.size(1), self.num_heads, self.head_dim).permute(1, 2, 0, 3)

    def values(self, x):
        """The values: x itself (identity W_V), or x·(I + W) with the first layer's value matrix."""
        return x if self.value is None else x + torch.matmul(x, self.value)

    def _allowed(self, t, s, offset, key_padding_mask, device):
        """(1|B, 1, T, S) bool: the keys query offset+i may see; and the (T, S) positions."""
        qpos = torch.arange(offset, offset + t, device=device).unsqueeze(1)
        kpos = torch.arange(s, device=device).unsqueeze(0)
        allowed = (kpos <= qpos) if self.causal else torch.ones(t, s, dtype=torch.bool, device=device)
        allowed = allowed.view(1, 1, t, s)
        if key_padding_mask is not None:
            allowed = allowed & ~key_padding_mask.view(key_padding_mask.size(0), 1, 1, s).to(torch.bool)
        return allowed, qpos, kpos

    def _softmax(self, q, k, allowed):
        logits = torch.matmul(q * self.head_dim ** -0.5, k.transpose(2, 3))
        logits = logits.float().masked_fill(~allowed, torch.finfo(torch.float32).min)
        return torch.softmax(logits, dim=-1).to(q.dtype)  # (a row with no allowed key: a padded query)

    def attention_matrix(self, q, k, key_padding_mask: Optional[Tensor], offset: int):
        """A = α·I + β·softmax − γ·C explicitly, (B, H, T, S), for queries at absolute positions
        offset..offset+T−1 and keys 0..S−1 (the specification; `forward` computes A·V without forming A)."""
        t, s = q.size(2), k.size(2)
        allowed, qpos, kpos = self._allowed(t, s, offset, key_padding_mask, q.device)
        probs = self._softmax(q, k, allowed)
        uniform = allowed.to(q.dtype) / allowed.sum(-1, keepdim=True).clamp(min=1).to(q.dtype)  # C
        eye = (kpos == qpos).to(q.dtype).view(1, 1, t, s)  # I on absolute positions
        shape = (1, self.num_heads, 1, 1)
        return self.alpha.view(shape) * eye + self.beta.view(shape) * probs - self.gamma.view(shape) * uniform

    def _uniform_times_values(self, v, key_padding_mask, t, offset):
        """C·V without forming C: a running mean of the allowed values (causal) or their mean."""
        if key_padding_mask is not None:
            keep = (~key_padding_mask.to(torch.bool)).to(v.dtype).view(v.size(0), 1, -1, 1)  # (B, 1, S, 1)
            v = v * keep
        else:
            keep = v.new_ones(1, 1, v.size(2), 1)
        if self.causal:
            sums = v.cumsum(dim=2)[:, :, offset:offset + t]
            counts = keep.cumsum(dim=2)[:, :, offset:offset + t]
        else:
            sums = v.sum(dim=2, keepdim=True)
            counts = keep.sum(dim=2, keepdim=True)
        return sums / counts.clamp(min=1)

    def forward(self, x, key_padding_mask: Optional[Tensor] = None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                need_weights: bool = False):
        """x: (T, B, C) (the normalised block input); key_padding_mask: (B, T) True at padding.
        Returns ((T, B, C), A averaged over heads if need_weights else None). A·V is computed as
        α·V_self + β·softmax·V − γ·C·V (the same numbers as attention_matrix(...) @ V)."""
        t, b, _ = x.shape
        q, k, v = self._heads(self.q_proj(x)), self._heads(self.k_proj(x)), self._heads(self.values(x))
        pad = key_padding_mask
        offset = 0
        if incremental_state is not None:
            if not self.causal:
                raise ValueError("incremental decoding needs a causal ShapedAttention")
            state = self.get_incremental_state(incremental_state, "state") or {}
            k, v, pad = append_to_cache(state, k, v, pad)
            offset = k.size(2) - t  # absolute position of this step's first query
            self.set_incremental_state(incremental_state, "state", state)
        allowed, _, _ = self._allowed(t, k.size(2), offset, pad, x.device)
        probs = self._softmax(q, k, allowed)
        shape = (1, self.num_heads, 1, 1)
        out = (self.alpha.view(shape) * v[:, :, offset:offset + t]
               + self.beta.view(shape) * torch.matmul(self.dropout_module(probs), v)
               - self.gamma.view(shape) * self._uniform_times_values(v, pad, t, offset))  # (B, H, T, d_h)
        out = out.permute(2, 0, 1, 3).reshape(t, b, self.embed_dim)  # identity W_O
        weights = self.attention_matrix(q, k, pad, offset).mean(dim=1) if need_weights else None
        return out, weights

    @torch.jit.export
    def reorder_incremental_state(self, incremental_state: Dict[str, Dict[str, Optional[Tensor]]], new_order: Tensor):
        state = self.get_incremental_state(incremental_state, "state")
        if state is not None:
            for name, value in state.items():
                state[name] = value.index_select(0, new_order)
            self.set_incremental_state(incremental_state, "state", state)
        return incremental_state


class SimplifiedBlock(nn.Module):
    """SAS / SAS-P block (He & Hofmann 2024, Fig. 1), optionally with a pre-norm cross-attention sub-block:
      SAS    h = ShapedAttn(Norm(x)) [+ CrossAttn(Norm(h)) with skip];  out = h + β_FF·MLP(Norm(h))
      SAS-P  n = Norm(x);  out = ShapedAttn(n) + β_FF·MLP(n)                  (no skip at all)
    MLP: two bias-free linear layers with ReLU; β_FF trainable, initialised 0.1. `norm=False`: the
    no-normalisation variant (the caller keeps norms in the first layer)."""

    def __init__(self, embed_dim, num_heads, ffn_dim, parallel, causal, norm=True, value_matrix=False,
                 beta_ff_init=0.1, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                 cross_attention: Optional[nn.Module] = None):
        super().__init__()
        if parallel and cross_attention is not None:
            raise ValueError("the parallel SAS-P block has no place for cross-attention: use the sequential "
                             "SAS block in an encoder-decoder decoder (--sas-decoder-block sas)")
        self.parallel = parallel
        self.attn = ShapedAttention(embed_dim, num_heads, causal, value_matrix, attention_dropout)
        self.attn_norm = RMSNorm(embed_dim) if norm else None
        self.mlp_norm = RMSNorm(embed_dim) if (norm and not parallel) else None
        self.encoder_attn = cross_attention
        self.encoder_attn_norm = RMSNorm(embed_dim) if cross_attention is not None else None
        self.fc1 = nn.Linear(embed_dim, ffn_dim, bias=False)
        self.fc2 = nn.Linear(ffn_dim, embed_dim, bias=False)
        self.beta_ff = nn.Parameter(torch.tensor(float(beta_ff_init)))
        self.dropout_module = FairseqDropout(dropout, module_name=self.__class__.__name__)
        self.activation_dropout_module = FairseqDropout(activation_dropout, module_name=self.__class__.__name__)

    def mlp(self, x):
        return self.dropout_module(self.fc2(self.activation_dropout_module(F.relu(self.fc1(x)))))

    def forward(self, x, key_padding_mask=None, incremental_state=None, encoder_out=None,
                encoder_padding_mask=None, need_attn=False, need_head_weights=False):
        n = self.attn_norm(x) if self.attn_norm is not None else x
        h, _ = self.attn(n, key_padding_mask=key_padding_mask, incremental_state=incremental_state)
        if self.parallel:
            return h + self.beta_ff * self.mlp(n), None
        attn = None
        if self.encoder_attn is not None and encoder_out is not None:
            c, attn = self.encoder_attn(query=self.encoder_attn_norm(h), key=encoder_out, value=encoder_out,
                                        key_padding_mask=encoder_padding_mask, incremental_state=incremental_state,
                                        static_kv=True, need_weights=need_attn or need_head_weights,
                                        need_head_weights=need_head_weights)
            h = h + self.dropout_module(c)
        m = self.mlp_norm(h) if self.mlp_norm is not None else h
        return h + self.beta_ff * self.mlp(m), attn
