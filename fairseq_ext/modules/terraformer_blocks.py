"""Sub-layers of the Terraformer (Jaszczur et al. 2021, §4.1-4.3), each one residual branch f of a
reversible swap (a, b) -> (b, a + f(b)) (modules/reversible.py):

    AttentionSwap    f(x) = Dropout(Attention(LayerNorm(x)))                         (§4.1, y1 and y2)
    FeedForwardSwap  f(x) = Dropout(FFN(LayerNorm(x))) + LowRankRecurrence(x)        (§4.1 y; §4.3)

A decoder block is [AttentionSwap, AttentionSwap, FeedForwardSwap] (three swaps, Fig. 6), an encoder
block [AttentionSwap, FeedForwardSwap]. The attention is `SelfAttention` below (dense) or the sparse QKV
attention (modules/multiplicative.py); the FFN dense or top-1-of-N sparse; both are called with
fairseq's MultiheadAttention signature / as (…, d) -> (…, d).

`SelfAttention` is multi-head self-attention with a fused Q/K/V projection whose incremental state takes
several new positions at once: the Terraformer decoder's first decoding step runs the whole source part
of its concatenated sequence plus the first target token, the later steps one token each.
"""
from typing import Dict, Optional

import torch
from fairseq.incremental_decoding_utils import with_incremental_state
from fairseq.modules import LayerNorm
from fairseq.modules.fairseq_dropout import FairseqDropout
from torch import Tensor, nn

from .kv_cache import append_to_cache, attention_softmax, mask_scores, reorder_batch_state

IncrementalState = Optional[Dict[str, Dict[str, Optional[Tensor]]]]


@with_incremental_state
class SelfAttention(nn.Module):
    """Dense multi-head self-attention (query = key = value) with a key/value cache."""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0):
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"embedding dim {embed_dim} must be divisible by the number of heads {num_heads}")
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.scaling = self.head_dim ** -0.5
        self.in_proj = nn.Linear(embed_dim, 3 * embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)
        nn.init.xavier_uniform_(self.in_proj.weight, gain=2 ** -0.5)  # fairseq's init of q/k/v
        nn.init.xavier_uniform_(self.out_proj.weight)
        nn.init.zeros_(self.in_proj.bias)
        nn.init.zeros_(self.out_proj.bias)
        self.dropout_module = FairseqDropout(dropout, module_name=self.__class__.__name__)

    def _heads(self, x):  # (T, B, d) -> (B, h, T, d/h)
        return x.reshape(x.size(0), x.size(1), self.num_heads, self.head_dim).permute(1, 2, 0, 3)

    def forward(self, query: Tensor, key: Optional[Tensor] = None, value: Optional[Tensor] = None,
                key_padding_mask: Optional[Tensor] = None, incremental_state: IncrementalState = None,
                need_weights: bool = False, attn_mask: Optional[Tensor] = None, **unused):
        """query: (T, B, d) (key and value are the query); key_padding_mask: (B, T) True at padding;
        attn_mask: additive (L, L) over all positions so far, or None. Returns ((T, B, d), None)."""
        t, b, _ = query.shape
        q, k, v = (self._heads(z) for z in self.in_proj(query).chunk(3, dim=-1))
        pad = key_padding_mask
        if incremental_state is not None:
            state = self.get_incremental_state(incremental_state, "state") or {}
            k, v, pad = append_to_cache(state, k, v, pad)
            self.set_incremental_state(incremental_state, "state", state)
        scores = mask_scores(torch.matmul(q * self.scaling, k.transpose(2, 3)), pad, attn_mask)  # (B, h, T, S)
        probs = attention_softmax(scores)
        ctx = torch.matmul(self.dropout_module(probs), v)  # (B, h, T, d/h)
        return self.out_proj(ctx.permute(2, 0, 1, 3).reshape(t, b, self.embed_dim)), None

    @torch.jit.export
    def reorder_incremental_state(self, incremental_state: Dict[str, Dict[str, Optional[Tensor]]], new_order: Tensor):
        return reorder_batch_state(self, incremental_state, new_order)


class DenseFeedForward(nn.Module):
    """fc2(dropout(ReLU(fc1(x)))), fairseq's FFN as one module (…, d) -> (…, d)."""

    def __init__(self, embed_dim: int, ffn_dim: int, activation_dropout: float = 0.0):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(embed_dim, ffn_dim), nn.Linear(ffn_dim, embed_dim)
        for fc in (self.fc1, self.fc2):
            nn.init.xavier_uniform_(fc.weight)
            nn.init.zeros_(fc.bias)
        self.dropout = nn.Dropout(activation_dropout)

    def forward(self, x):
        return self.fc2(self.dropout(torch.relu(self.fc1(x))))


class AttentionSwap(nn.Module):
    """f(x) = Dropout(Attention(LayerNorm(x)))   (§4.1: y1 = x + f(x), y2 = y1 + f'(y1))."""

    def __init__(self, embed_dim: int, attention: nn.Module, dropout: float):
        super().__init__()
        self.norm = LayerNorm(embed_dim)
        self.attn = attention
        self.dropout_module = FairseqDropout(dropout, module_name=self.__class__.__name__)

    def forward(self, x: Tensor, padding_mask: Optional[Tensor] = None, attn_mask: Optional[Tensor] = None,
                incremental_state: IncrementalState = None) -> Tensor:
        h = self.norm(x)
        h, _ = self.attn(h, h, h, key_padding_mask=padding_mask, incremental_state=incremental_state,
                         need_weights=False, attn_mask=attn_mask)
        return self.dropout_module(h)


class FeedForwardSwap(nn.Module):
    """f(x) = Dropout(FFN(LayerNorm(x))) + LowRankRecurrence(x)   (§4.1 y = y2 + FFN(y2); §4.3, the
    recurrence optional)."""

    def __init__(self, embed_dim: int, ffn: nn.Module, dropout: float, recurrence: Optional[nn.Module] = None):
        super().__init__()
        self.norm = LayerNorm(embed_dim)
        self.ffn = ffn
        self.dropout_module = FairseqDropout(dropout, module_name=self.__class__.__name__)
        self.recurrence = recurrence

    def forward(self, x: Tensor, padding_mask: Optional[Tensor] = None, attn_mask: Optional[Tensor] = None,
                incremental_state: IncrementalState = None) -> Tensor:
        out = self.dropout_module(self.ffn(self.norm(x)))
        if self.recurrence is not None:
            out = out + self.recurrence(x, padding_mask, incremental_state)
        return out
