"""The fast path's decoder step for the Terraformer (models/terraformer.py; Jaszczur et al. 2021, §4.1-4.3).

The Terraformer decoder runs over the concatenation [encoder output; target embeddings] with causal
attention (§4.1), so the source part of every attention layer's keys and values, and of its convolution
and recurrent states, depends on the sentence only, not on the hypothesis. `TerraformerStepper`:

- at a batch's start runs the source part once per sentence through the model's own decoder stack
  (its incremental state: keys/values, the sparse QKV convolutions' last F-1 inputs, the SRU state c), and
  keeps the keys/values per sentence (re-indexed only when finished sentences leave the batch, as the
  other steppers' cross-attention caches) and the convolution and recurrent states per hypothesis;
- then, per step, one token through the reversible swaps (a, b) -> (b, a + f(b)) (modules/reversible.py)
  with no incremental-state dictionaries: f = an attention swap (LayerNorm; the dense attention's fused
  Q/K/V projection, or the sparse QKV attention's multiplicative layer and Q/K/V convolutions as one
  product, §3.2) attending under one softmax over the sentence's source keys and the hypothesis' own
  target keys (written in place, modules/kv_cache.py), or an FFN swap (LayerNorm, dense or top-1-of-N
  sparse FFN, plus the low-rank SRU recurrence, §4.3, one step); the pair's mean, LayerNorm, output
  projection.
Every Linear layer reads through Stepper._linear (ops.few_rows_linear at 3-16 rows, bf16 copies with
--bf16; --int8's quantized layers as they are). The arithmetic is the model's: hypotheses are fairseq's
(tests/test_fast_generator.py). LSH attention keeps the generic mode (its decoding step is the model's).
"""
from typing import Dict, List, Optional

import torch
from fairseq import utils
from torch import Tensor

from ..models.terraformer import pads_first
from ..modules.kv_cache import write_to_cache
from ..modules.multiplicative import SparseQKVAttention, conv_last_step
from ..modules.sru import SQRT3
from ..modules.terraformer_blocks import AttentionSwap, DenseFeedForward, FeedForwardSwap, SelfAttention
from ..ops.few_rows_linear import kernel_applies as few_rows_linear_applies
from .steppers import Stepper, _sparse_convs


class TerraformerStepper(Stepper):
    """One step of the Terraformer decoder (see module docstring). `caches` and `cross` hold, per attention
    swap, the target keys/values (write_to_cache) and the source part's keys/values per sentence."""

    @classmethod
    def model_reason(cls, model) -> Optional[str]:
        """None when this stepper runs the model's decoder, else why not (one line)."""
        for i, swap in enumerate(model.decoder.stack.blocks):
            if isinstance(swap, AttentionSwap):
                att = swap.attn
                if type(att) is SparseQKVAttention:
                    if not (att.conv_q.causal and att.conv_k.causal and att.conv_v.causal):
                        return f"Terraformer decoder swap {i}: sparse QKV attention is not causal"
                elif type(att) is not SelfAttention:
                    return f"Terraformer decoder swap {i} attention {type(att).__name__} (its own decoding step)"
            elif not isinstance(swap, FeedForwardSwap):
                return f"Terraformer decoder swap {i} is {type(swap).__name__}"
        return None

    def __init__(self, model, beam_size, bf16=False):
        super().__init__(model, beam_size, bf16)
        self.swaps = list(self.dec.stack.blocks)
        self.attn_index = {}  # swap index -> its entry of caches / cross
        for j, swap in enumerate(self.swaps):
            if isinstance(swap, AttentionSwap):
                self.attn_index[j] = len(self.attn_index)
        # sparse QKV swaps: the Q/K/V convolutions stacked into one matrix (conv_last_step)
        self.qkv_conv = {j: _sparse_convs(s.attn) for j, s in enumerate(self.swaps)
                         if isinstance(s, AttentionSwap) and type(s.attn) is SparseQKVAttention}
        self.conv: Dict[int, Tensor] = {}  # swap -> last F-1 multiplicative outputs (F-1, B, S, M)
        self.sru: Dict[int, List[Tensor]] = {}  # FFN swap -> the state c (B, rank) of each SRU layer

    @torch.no_grad()
    def start(self, encoder_out: Dict[str, List[Tensor]]):
        enc, pad = self._per_sentence(encoder_out)
        x, pad = pads_first(enc, pad)  # the model's LengthConcat: each sentence's padding first
        state: Dict[str, Dict[str, Optional[Tensor]]] = {}
        self.dec.stack(x, x, padding_mask=pad, attn_mask=self.dec._causal_mask(x.size(0), x), incremental_state=state)
        self.caches = [{} for _ in self.attn_index]
        self.cross, self.conv, self.sru = [], {}, {}
        for j, swap in enumerate(self.swaps):
            if isinstance(swap, AttentionSwap):
                kept = swap.attn.get_incremental_state(state, "state")
                heads = swap.attn.num_heads
                k, v = (kept[name].flatten(0, 1).contiguous() for name in ("k", "v"))  # (kv_bsz·H, S, d_h)
                self.cross.append({"k": k, "v": v, "pad": pad, "heads": heads})
                if "conv" in kept:
                    self.conv[j] = kept["conv"].repeat_interleave(self.rows, dim=1)
            elif swap.recurrence is not None:
                self.sru[j] = [sru.get_incremental_state(state, "state")["c"].repeat_interleave(self.rows, dim=0)
                               for sru in swap.recurrence.srus]

    # ---- one token ----
    def _attend(self, j: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Scaled queries q and this step's keys/values (B, H, d_h): one softmax over the sentence's source
        keys and the hypothesis' target keys (this one written in place first). (B, H·d_h)."""
        bsz, heads, dh = q.shape
        src = self.cross[self.attn_index[j]]
        kbuf, vbuf, n = write_to_cache(self.caches[self.attn_index[j]], k, v)
        kv_bsz, s = src["k"].size(0) // heads, src["k"].size(1)
        rows = bsz // kv_bsz
        q_src = q.view(kv_bsz, rows, heads, dh).transpose(1, 2).reshape(kv_bsz * heads, rows, dh)
        scores_src = torch.bmm(q_src, src["k"].transpose(1, 2))  # (kv_bsz·H, rows, S)
        if src["pad"] is not None:
            scores_src = scores_src.view(kv_bsz, heads, rows, s).masked_fill(
                src["pad"].view(kv_bsz, 1, 1, s), float("-inf")).view(kv_bsz * heads, rows, s)
        keys = kbuf[:, :, :n].reshape(bsz * heads, n, dh)
        scores_tgt = torch.bmm(q.reshape(bsz * heads, 1, dh), keys.transpose(1, 2))  # (B·H, 1, n)
        scores_tgt = scores_tgt.view(kv_bsz, rows, heads, n).transpose(1, 2).reshape(kv_bsz * heads, rows, n)
        probs = utils.softmax(torch.cat([scores_src, scores_tgt], dim=-1), dim=-1).type_as(q)
        p_src, p_tgt = probs.split([s, n], dim=-1)
        ctx = torch.bmm(p_src, src["v"]).view(kv_bsz, heads, rows, dh).transpose(1, 2).reshape(bsz, heads, dh)
        p_tgt = p_tgt.reshape(kv_bsz, heads, rows, n).transpose(1, 2).reshape(bsz * heads, 1, n)
        ctx = ctx + torch.bmm(p_tgt, vbuf[:, :, :n].reshape(bsz * heads, n, dh)).view(bsz, heads, dh)
        return ctx.reshape(bsz, heads * dh)

    def _attention_swap(self, j: int, swap: AttentionSwap, x: Tensor) -> Tensor:
        att, h = swap.attn, swap.norm(x)
        bsz, heads, dh = x.size(0), att.num_heads, att.head_dim
        if type(att) is SparseQKVAttention:  # §3.2: mult, then Q/K/V convolutions of the last F steps, no W_O
            window = att._window(self.conv.get(j), att.mult(h).unsqueeze(0))  # (F, B, S, M)
            if window.size(0) > 1:
                self.conv[j] = window[1:]
            qkv = conv_last_step(window, *self.qkv_conv[j]).view(bsz, att.num_modules, 3, att.module_dim)
            q, k, v = (qkv[:, :, i].reshape(bsz, heads, dh) for i in range(3))
            return self._attend(j, q * att.scaling, k, v)
        q, k, v = (z.reshape(bsz, heads, dh) for z in self._module(att.in_proj, h).chunk(3, dim=-1))
        return self._module(att.out_proj, self._attend(j, q * att.scaling, k, v))

    def _ffn_swap(self, j: int, swap: FeedForwardSwap, x: Tensor) -> Tensor:
        h, ffn = swap.norm(x), swap.ffn
        if type(ffn) is DenseFeedForward:
            out = self._module(ffn.fc2, torch.relu(self._module(ffn.fc1, h)))
        else:  # the sparse FFN module (its decoding kernel reads the chosen rows only)
            out = ffn(h)
        rec = swap.recurrence
        if rec is not None:  # §4.3: Up(SRU(Down(LayerNorm(x)))), one step of each SRU (SRU Eq. 1-5)
            r_in = self._module(rec.down, rec.norm(x))
            for i, sru in enumerate(rec.srus):
                y, f, r = self._module(sru.proj, r_in).chunk(3, dim=-1)
                f, r = torch.sigmoid(f), torch.sigmoid(r)
                c = torch.addcmul((1.0 - f) * y, f, self.sru[j][i])  # Eq. 4, as linear_recurrence's step
                self.sru[j][i] = c
                r_in = r * c + (1.0 - r) * r_in * SQRT3  # Eq. 5
            out = out + self._module(rec.up, r_in)
        return out

    @torch.no_grad()
    def step(self, tokens: Tensor) -> Tensor:
        """tokens (B, t+1): the logits (B, 1, V) of the next token."""
        dec = self.dec
        x = dec.embed(tokens, incremental_state={})[0]  # (B, d): the last token at its position
        self.kernel = few_rows_linear_applies(x, self.bf16)
        a = b = x
        for j, swap in enumerate(self.swaps):
            fb = self._attention_swap(j, swap, b) if j in self.attn_index else self._ffn_swap(j, swap, b)
            a, b = b, a + fb
        h = dec.layer_norm((a + b) / 2)
        return self._module(dec.output_projection, h).unsqueeze(1)

    def _reorder_layers(self, order: Tensor):
        for j, state in self.conv.items():
            self.conv[j] = state.index_select(1, order)
        for j, states in self.sru.items():
            self.sru[j] = [c.index_select(0, order) for c in states]

