"""Compressed attention of the Compressed Attention Network (Li et al. 2021, "An Efficient Transformer
Decoder with Compressed Sub-layers"), Eq. 11 and 13, and its ablations (Table 5).

One shared query attends, with ONE softmax, over [encoder keys; decoder keys] (Eq. 11; encoder keys
first, as in the authors' code). Values live in the FFN's hidden space (d_v = FFN width): the value and
output projections of both attentions are folded with the FFN's first layer W1, so the sub-layer is
    Y = ReLU(X·W1 + A·[H·W~v_enc ; X·W~v_self] + b1)·W2 + b2                     (Eq. 13)
Variants (flags of the module): attend to the decoder prefix (self), to the encoder output (cross),
and fold into the FFN (ffn=True) or not (ffn=False: values of width d_v followed by an output projection,
i.e. Eq. 8 with the shared query: "compress attention" of Table 5).
Incremental decoding: the encoder keys/values are computed at the first step and cached; each step
appends only the new token's key/value; `reorder_incremental_state` index-selects the cached batch.
"""
import math
from typing import Dict, Optional

import torch
import torch.nn.functional as F
from fairseq import utils
from fairseq.incremental_decoding_utils import with_incremental_state
from fairseq.modules.fairseq_dropout import FairseqDropout
from torch import Tensor, nn


def _linear(in_dim, out_dim, bias=True):
    m = nn.Linear(in_dim, out_dim, bias=bias)
    nn.init.xavier_uniform_(m.weight, gain=1 / math.sqrt(2))  # as fairseq's MultiheadAttention q/k/v
    if bias:
        nn.init.constant_(m.bias, 0.0)
    return m


@with_incremental_state
class CompressedAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, value_dim, self_attention=True, encoder_attention=True, ffn=True,
                 encoder_dim=None, attention_dropout=0.0, activation_dropout=0.0, activation_fn="relu"):
        super().__init__()
        if not (self_attention or encoder_attention):
            raise ValueError("CompressedAttention needs self and/or encoder attention")
        if embed_dim % num_heads or value_dim % num_heads:
            raise ValueError(f"embed dim {embed_dim} and value dim {value_dim} must be divisible by the "
                             f"number of heads {num_heads}")
        self.embed_dim, self.num_heads, self.value_dim = embed_dim, num_heads, value_dim
        self.head_dim, self.value_head_dim = embed_dim // num_heads, value_dim // num_heads
        self.scaling = self.head_dim ** -0.5
        self.self_attention, self.encoder_attention, self.ffn = self_attention, encoder_attention, ffn
        kdim = encoder_dim or embed_dim
        self.q_proj = _linear(embed_dim, embed_dim)  # shared query (Eq. 9/11)
        if self_attention:
            self.k_self = _linear(embed_dim, embed_dim)
            self.v_self = _linear(embed_dim, value_dim, bias=False)  # W~v_self = W_v·W1 (Eq. 13)
        if encoder_attention:
            self.k_enc = _linear(kdim, embed_dim)
            self.v_enc = _linear(kdim, value_dim, bias=False)  # W~v_enc = W_v·W1
        if ffn:
            self.fc1 = nn.Linear(embed_dim, value_dim)  # X·W1 + b1
            self.fc2 = nn.Linear(value_dim, embed_dim)  # ·W2 + b2
            self.activation_fn = utils.get_activation_fn(activation_fn)
            self.activation_dropout_module = FairseqDropout(activation_dropout, module_name=self.__class__.__name__)
        else:
            self.out_proj = _linear(value_dim, embed_dim)
        self.attention_dropout_module = FairseqDropout(attention_dropout, module_name=self.__class__.__name__)

    def _heads(self, x, head_dim):
        """(L, B, h*hd) -> (B, h, L, hd)"""
        return x.view(x.size(0), x.size(1), self.num_heads, head_dim).permute(1, 2, 0, 3)

    def forward(self, x, encoder_out: Optional[Tensor] = None, encoder_padding_mask: Optional[Tensor] = None,
                self_attn_mask: Optional[Tensor] = None, self_padding_mask: Optional[Tensor] = None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None):
        """x: (T, B, C) decoder input (after LayerNorm in pre-norm); encoder_out: (S, B, C);
        encoder_padding_mask: (B, S) True at padding; self_attn_mask: (T, T) additive causal mask or
        None; self_padding_mask: (B, T) True at padding. Returns (T, B, C)."""
        t, b, _ = x.shape
        q = self._heads(self.q_proj(x) * self.scaling, self.head_dim)  # (B, h, T, dh)
        state = self.get_incremental_state(incremental_state, "state") if incremental_state is not None else None
        state = state if state is not None else {}
        keys, values, masks = [], [], []
        if self.encoder_attention:
            if "enc_k" in state:
                k_e, v_e, pad_e = state["enc_k"], state["enc_v"], state["enc_pad"]
            else:
                k_e = self._heads(self.k_enc(encoder_out), self.head_dim)
                v_e = self._heads(self.v_enc(encoder_out), self.value_head_dim)
                pad_e = (encoder_padding_mask if encoder_padding_mask is not None
                         else k_e.new_zeros(b, k_e.size(2), dtype=torch.bool))
            keys.append(k_e), values.append(v_e)
            masks.append(pad_e.view(b, 1, 1, -1).expand(b, 1, t, pad_e.size(1)))
            if incremental_state is not None:
                state.update(enc_k=k_e, enc_v=v_e, enc_pad=pad_e)
        if self.self_attention:
            k_s = self._heads(self.k_self(x), self.head_dim)
            v_s = self._heads(self.v_self(x), self.value_head_dim)
            pad_s = self_padding_mask if self_padding_mask is not None else x.new_zeros(b, t, dtype=torch.bool)
            if "self_k" in state:  # append this step's key/value to the cache
                k_s = torch.cat([state["self_k"], k_s], dim=2)
                v_s = torch.cat([state["self_v"], v_s], dim=2)
                pad_s = torch.cat([state["self_pad"], pad_s], dim=1)
            if incremental_state is not None:
                state.update(self_k=k_s, self_v=v_s, self_pad=pad_s)
            keys.append(k_s), values.append(v_s)
            m = pad_s.view(b, 1, 1, -1).expand(b, 1, t, pad_s.size(1))
            if self_attn_mask is not None:  # causal: (T, T) with -inf above the diagonal
                m = m | torch.isinf(self_attn_mask[:, -pad_s.size(1):]).view(1, 1, t, -1)
            masks.append(m)
        if incremental_state is not None:
            self.set_incremental_state(incremental_state, "state", state)
        k, v, mask = torch.cat(keys, dim=2), torch.cat(values, dim=2), torch.cat(masks, dim=3)
        scores = torch.matmul(q, k.transpose(2, 3)).masked_fill(mask, float("-inf"))  # (B, h, T, S+T')
        probs = utils.softmax(scores, dim=-1, onnx_trace=False).type_as(scores)  # one softmax (Eq. 11)
        ctx = torch.matmul(self.attention_dropout_module(probs), v)  # (B, h, T, dv/h)
        ctx = ctx.permute(2, 0, 1, 3).reshape(t, b, self.value_dim)  # (T, B, d_v)
        if not self.ffn:
            return self.out_proj(ctx)
        h = self.activation_fn(self.fc1(x) + ctx)  # ReLU(X·W1 + A·V~ + b1), Eq. 13
        return self.fc2(self.activation_dropout_module(h))

    @torch.jit.export
    def reorder_incremental_state(self, incremental_state: Dict[str, Dict[str, Optional[Tensor]]], new_order: Tensor):
        state = self.get_incremental_state(incremental_state, "state")
        if state is not None:
            for key, value in state.items():
                # the encoder part is identical across a sentence's beams: like fairseq's cross-attention
                # cache it is only re-indexed when the batch changes size (finished sentences removed)
                if key.startswith("enc_") and value.size(0) == new_order.size(0):
                    continue
                state[key] = value.index_select(0, new_order)
            self.set_incremental_state(incremental_state, "state", state)
        return incremental_state
