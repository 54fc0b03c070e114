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
A one-token eval step of the FFN-folded layer (beam search) goes through `_decode_step`: the decoder's
keys/values live in a preallocated cache that doubles when full (written in place, never concatenated),
and the attention, the ReLU and the second FFN layer are one call of ops.compressed_attention_decode
(the csrc kernel when built, else its PyTorch reference).
"""
import math
from typing import Dict, Optional

import torch
from fairseq import utils
from fairseq.incremental_decoding_utils import with_incremental_state
from fairseq.modules.fairseq_dropout import FairseqDropout
from torch import Tensor, nn

from ..ops.compressed_attention import compressed_attention_decode
from ..ops.few_rows_linear import few_rows_linear
from .eval_cache import EvalCached
from .fused_linear import concat_linear, linear_parameters
from .kv_cache import append_to_cache, reorder_written_cache, write_to_cache


def _linear(in_dim, out_dim, bias=True):
    m = nn.Linear(in_dim, out_dim, bias=bias)
    nn.init.xavier_uniform_(m.weight, gain=1 / math.sqrt(2))  # as fairseq's MultiheadAttention q/k/v
    if bias:
        nn.init.constant_(m.bias, 0.0)
    return m


@with_incremental_state
class CompressedAttention(EvalCached):
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
        self.activation_name = activation_fn
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

    def _x_modules(self):
        """The Linear layers reading the sub-layer's input: q, k_self, v_self, fc1 (those it has)."""
        return [self.q_proj] + ([self.k_self, self.v_self] if self.self_attention else []) + \
               ([self.fc1] if self.ffn else [])

    def _x_weights(self):
        """The _x_modules' weights and biases concatenated (EvalCached: rebuilt after train()/eval() or
        when a weight changes)."""
        mods = self._x_modules()
        return self._cached("x_projections", linear_parameters(mods), lambda: concat_linear(mods))

    def _x_projections(self, x):
        """q, k_self, v_self and X·W1+b1 of x. In decoding (one step, eval mode) they are one matmul with
        the four weights concatenated (_x_weights), as the paper notes X·W1 can be computed together with
        X·W_q (through ops.few_rows_linear's kernel at 3-16 rows)."""
        mods = self._x_modules()
        if self.training or x.size(0) != 1 or any(type(m) is not nn.Linear for m in mods):  # (int8: one by one)
            return [mod(x) for mod in mods]
        weight, bias = self._x_weights()
        return few_rows_linear(x, weight, bias).split([m.out_features for m in mods], dim=-1)

    def forward(self, x, encoder_out: Optional[Tensor] = None, encoder_padding_mask: Optional[Tensor] = None,
                self_attn_mask: Optional[Tensor] = None, self_padding_mask: Optional[Tensor] = None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                need_weights: bool = False):
        """x: (T, B, C) decoder input (after LayerNorm in pre-norm); encoder_out: (S, B, C);
        encoder_padding_mask: (B, S) True at padding; self_attn_mask: (T, T) additive causal mask or
        None; self_padding_mask: (B, T) True at padding. Returns (T, B, C); with need_weights, a pair
        (output, source attention (h, B, T, S) or None): the one softmax's encoder part renormalised
        to a distribution over source positions (what fairseq's --print-alignment reads)."""
        t, b, _ = x.shape
        if (incremental_state is not None and not need_weights
                and self._decode_step_applies(x, self_padding_mask, incremental_state)):
            return self._decode_step(x, encoder_out, encoder_padding_mask, incremental_state)
        proj = list(self._x_projections(x))
        q = self._heads(proj.pop(0) * self.scaling, self.head_dim)  # (B, h, T, dh)
        state = self.get_incremental_state(incremental_state, "state") if incremental_state is not None else None
        state = state if state is not None else {}
        scores, values = [], []  # per part: no concatenation of the caches themselves
        if self.encoder_attention:
            k_e, v_e, bias_e = self._encoder_kv(encoder_out, encoder_padding_mask, state, incremental_state is not None)
            s_e = torch.matmul(q, k_e.transpose(2, 3))
            scores.append(s_e if bias_e is None else s_e + bias_e)
            values.append(v_e)
        if self.self_attention:
            k_s, v_s = self._heads(proj.pop(0), self.head_dim), self._heads(proj.pop(0), self.value_head_dim)
            # append this step's key/value to the cache (a throwaway dict without incremental_state)
            k_s, v_s, pad_s = append_to_cache(state, k_s, v_s, self_padding_mask, prefix="self_")
            s_s = torch.matmul(q, k_s.transpose(2, 3))
            if self_attn_mask is not None:  # causal: (T, T) with -inf above the diagonal
                s_s = s_s + self_attn_mask[:, -k_s.size(2):]
            if pad_s is not None and pad_s.any():
                s_s = s_s.masked_fill(pad_s.view(b, 1, 1, -1), float("-inf"))
            scores.append(s_s)
            values.append(v_s)
        if incremental_state is not None:
            self.set_incremental_state(incremental_state, "state", state)
        logits = torch.cat(scores, dim=3) if len(scores) > 1 else scores[0]  # (B, h, T, S+T')
        probs = utils.softmax(logits, dim=-1).type_as(logits)  # one softmax, Eq. 11
        weights = None
        if need_weights and self.encoder_attention:
            src = probs[..., :scores[0].size(3)].float().transpose(0, 1)  # (h, B, T, S)
            weights = src / src.sum(-1, keepdim=True).clamp_min(torch.finfo(src.dtype).tiny)
        probs = self.attention_dropout_module(probs)
        ctx = None
        for p, v in zip(probs.split([sc.size(3) for sc in scores], dim=3), values):
            part = torch.matmul(p, v)  # (B, h, T, dv/h)
            ctx = part if ctx is None else ctx + part
        ctx = ctx.permute(2, 0, 1, 3).reshape(t, b, self.value_dim)  # (T, B, d_v)
        if not self.ffn:
            out = self.out_proj(ctx)
        else:
            h = self.activation_fn(proj.pop(0) + ctx)  # ReLU(X·W1 + A·V~ + b1), Eq. 13
            out = self.fc2(self.activation_dropout_module(h))
        return (out, weights) if need_weights else out

    def _encoder_kv(self, encoder_out, encoder_padding_mask, state, cache):
        """Encoder keys (B, h, S, dh), values (B, h, S, dv/h) and additive padding bias (B, 1, 1, S) or
        None; taken from `state` when cached there, else computed (and, with `cache`, stored contiguous:
        every later decoding step reads them)."""
        if "enc_k" in state:
            return state["enc_k"], state["enc_v"], state.get("enc_bias")
        k = self._heads(self.k_enc(encoder_out), self.head_dim)
        v = self._heads(self.v_enc(encoder_out), self.value_head_dim)
        bias = None
        if encoder_padding_mask is not None and encoder_padding_mask.any():
            b = encoder_padding_mask.size(0)
            bias = k.new_zeros(b, 1, 1, k.size(2)).masked_fill(encoder_padding_mask.view(b, 1, 1, -1), float("-inf"))
        if cache:
            k, v = k.contiguous(), v.contiguous()
            state.update(enc_k=k, enc_v=v)
            if bias is not None:
                state["enc_bias"] = bias
        return k, v, bias

    def _decode_step_applies(self, x, self_padding_mask, incremental_state):
        """One token in eval mode through the FFN-folded sub-layer with ReLU, no padding among the
        decoder's own tokens, and a state this path started (not one of the general path's caches)."""
        if (self.training or x.size(0) != 1 or not self.ffn or self.activation_name != "relu"
                or type(self.fc2) is not nn.Linear):
            return False
        if self_padding_mask is not None and self_padding_mask.any():
            return False
        state = self.get_incremental_state(incremental_state, "state")
        return state is None or "self_k" not in state

    def _decode_step(self, x, encoder_out, encoder_padding_mask, incremental_state):
        """x: (1, B, C) -> (1, B, C): Eq. 11 + 13 for one decoding step (see the module docstring)."""
        b, h = x.size(1), self.num_heads
        proj = [p[0] for p in self._x_projections(x)]  # (B, ·) each
        q = (proj.pop(0) * self.scaling).view(b, h, self.head_dim)
        state = self.get_incremental_state(incremental_state, "state") or {}
        no_keys = lambda: (q.new_zeros(b, h, 0, self.head_dim), q.new_zeros(b, h, 0, self.value_head_dim))
        if self.encoder_attention:
            k_e, v_e, bias = self._encoder_kv(encoder_out, encoder_padding_mask, state, cache=True)
            bias = bias.view(b, -1) if bias is not None else None
        else:
            (k_e, v_e), bias = no_keys(), None
        if self.self_attention:
            k_s, v_s, n = write_to_cache(state, proj.pop(0).view(b, h, self.head_dim),
                                         proj.pop(0).view(b, h, self.value_head_dim), prefix="self_")
        else:
            (k_s, v_s), n = no_keys(), 0
        self.set_incremental_state(incremental_state, "state", state)
        y = compressed_attention_decode(q, k_e, v_e, bias, k_s, v_s, n, proj.pop(0), self.fc2.weight, self.fc2.bias)
        return y.unsqueeze(0)

    @torch.jit.export
    def reorder_incremental_state(self, incremental_state: Dict[str, Dict[str, Optional[Tensor]]], new_order: Tensor):
        state = self.get_incremental_state(incremental_state, "state")
        if state is not None:
            if "kbuf" in state:  # the self-attention buffers, reordered in place
                reorder_written_cache(state, new_order)
            for key, value in state.items():
                if key in ("kbuf", "vbuf", "len"):
                    continue
                # the encoder part is identical across a sentence's beams: like fairseq's cross-attention
                # cache it is only re-indexed when the batch changes size (finished sentences removed)
                if key.startswith("enc_") and value.size(0) == new_order.size(0):
                    continue
                state[key] = value.index_select(0, new_order)
            self.set_incremental_state(incremental_state, "state", state)
        return incremental_state
