"""Fast decoding path (issue 9): fairseq's SequenceGenerator with a lean decoder step.

The beam search is fairseq's own (`FastSequenceGenerator` subclasses SequenceGenerator: same length
penalty, min/max length, no-repeat-ngram, unk penalty, prefix tokens, output), so hypotheses are the
same by construction as long as the step gives the same log-probabilities. The step replaces fairseq's
generic incremental decoding for decoders built from fairseq's Transformer layers:

- keys/values of self-attention written in place into preallocated buffers that double when full
  (fairseq concatenates the whole cache every step) and read as strided views;
- cross-attention keys/values computed once per sentence, stored per sentence (not per beam row) and
  re-indexed only when finished sentences leave the batch;
- no incremental-state dictionaries (fairseq builds a string key and looks it up per module per step),
  no alignment / mask plumbing; the encoder output is not re-indexed every step (nothing reads it after
  the first step);
- the arithmetic is fairseq's (same projections in the same order, the same einsum for the beamable
  cross-attention, float32 softmax); the caches' memory layouts differ, so BLAS may sum in another
  order: scores agree to ~1e-6 and hypotheses are token-identical (tests/test_fast_generator.py).

Measured so far (Transformer Base, batch 1, beam 5, 2 cores shared with a training run): 1.03x fairseq's
step; a profile of the fast path puts 57% of the time in the linear layers (at ~10 GB/s, near this
machine's bandwidth), 15% in Python around the step, 5% in beam search's topk: the remaining gains are
in fewer bytes per step (int8) and less per-op overhead, not in the caches (issue 9 note).

Supported: one model whose decoder is fairseq's TransformerDecoderBase with TransformerDecoderLayerBase
layers (stock transformer, transformer_balanced, every One Wide FFN placement incl. layers without FFN,
the sparse FFN of scaling_sparse_ff / one_wide_sparse_ffn), fairseq MultiheadAttention without
bias_kv / zero_attn, no cross-self-attention, head scaling, attention LayerNorm or adaptive softmax.
Anything else falls back to fairseq's step with a one-line notice (`unsupported_reason`).
"""
import logging
import warnings
from typing import Dict, List, Optional

import torch
from fairseq import utils
from fairseq.models.transformer import TransformerDecoderBase
from fairseq.modules import MultiheadAttention
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase
from fairseq.sequence_generator import EnsembleModel, SequenceGenerator
from torch import Tensor, nn

from ..modules.kv_cache import write_to_cache

logger = logging.getLogger(__name__)


def unsupported_reason(models) -> Optional[str]:
    """None when the fast step serves these models, else why not (one line)."""
    if len(models) != 1:
        return "ensembles of several models"
    model = models[0]
    dec = getattr(model, "decoder", None)
    if not isinstance(dec, TransformerDecoderBase) or not hasattr(model, "encoder"):
        return f"decoder {type(dec).__name__} (only fairseq Transformer decoders)"
    if dec.adaptive_softmax is not None or dec.cross_self_attention or dec.quant_noise is not None:
        return "adaptive softmax / cross-self-attention / quant noise"
    for i, layer in enumerate(dec.layers):
        if not isinstance(layer, TransformerDecoderLayerBase):
            return f"decoder layer {i} is {type(layer).__name__}"
        attns = [layer.self_attn] + ([layer.encoder_attn] if layer.encoder_attn is not None else [])
        for att in attns:
            if type(att) is not MultiheadAttention or att.bias_k is not None or att.add_zero_attn:
                return f"decoder layer {i} attention {type(att).__name__}"
        if (layer.cross_self_attention or layer.c_attn is not None or layer.attn_ln is not None
                or layer.ffn_layernorm is not None or layer.w_resid is not None):
            return f"decoder layer {i} uses head scaling / attention or FFN LayerNorm / residual weights"
        if layer.encoder_attn is None:
            return f"decoder layer {i} has no cross-attention"
    return None


def _reorder_cache(state: Dict[str, Tensor], order: Tensor):
    """Beam reordering of a write_to_cache state: the valid prefix of each buffer, and the length."""
    n = int(state["len"][0])
    for name in ("kbuf", "vbuf"):
        buf = state[name]
        new = buf.new_empty(order.numel(), *buf.shape[1:])
        new[:, :, :n] = buf[:, :, :n].index_select(0, order)
        state[name] = new
    state["len"] = state["len"].index_select(0, order)


class TransformerStepper:
    """One incremental decoding step of a fairseq Transformer decoder (see module docstring)."""

    def __init__(self, model, beam_size: int):
        self.model, self.dec, self.beam = model, model.decoder, max(1, beam_size)
        self.caches: List[Dict[str, Tensor]] = []  # per layer: kv_cache.write_to_cache's buffers
        self.cross: List[Dict[str, Optional[Tensor]]] = []

    def start(self, encoder_out: Dict[str, List[Tensor]]):
        """Cross-attention keys/values of every layer, per sentence, from the beam-expanded encoder output."""
        enc = encoder_out["encoder_out"][0]  # (S, B*beam, d)
        pad = encoder_out["encoder_padding_mask"][0] if encoder_out["encoder_padding_mask"] else None
        if self.beam > 1 and enc.size(1) % self.beam == 0:  # fairseq's beamable cross-attention
            enc = enc.view(enc.size(0), -1, self.beam, enc.size(2))[:, :, 0, :]
            if pad is not None:
                pad = pad.view(-1, self.beam, pad.size(1))[:, 0, :]
        self.caches = [{} for _ in self.dec.layers]
        self.cross = []
        for layer in self.dec.layers:
            att = layer.encoder_attn
            s, kv_bsz = enc.size(0), enc.size(1)
            k = att.k_proj(enc).contiguous().view(s, kv_bsz * att.num_heads, att.head_dim).transpose(0, 1)
            v = att.v_proj(enc).contiguous().view(s, kv_bsz * att.num_heads, att.head_dim).transpose(0, 1)
            self.cross.append({"k": k, "v": v,  # fairseq's (strided) layout
                               "pad": pad if pad is not None and pad.any() else None})

    def _self_attention(self, att: MultiheadAttention, x: Tensor, cache: Dict[str, Tensor]) -> Tensor:
        bsz = x.size(1)
        q = att.q_proj(x)
        k = att.k_proj(x)
        v = att.v_proj(x)
        q *= att.scaling
        q = q.contiguous().view(1, bsz * att.num_heads, att.head_dim).transpose(0, 1)  # (B*H, 1, d_h)
        kbuf, vbuf, n = write_to_cache(cache, k.view(bsz, att.num_heads, att.head_dim),
                                       v.view(bsz, att.num_heads, att.head_dim))
        keys = kbuf[:, :, :n].reshape(bsz * att.num_heads, n, att.head_dim)
        values = vbuf[:, :, :n].reshape(bsz * att.num_heads, n, att.head_dim)
        probs = utils.softmax(torch.bmm(q, keys.transpose(1, 2)), dim=-1).type_as(q)
        out = torch.bmm(probs, values)  # (B*H, 1, d_h)
        return att.out_proj(out.transpose(0, 1).contiguous().view(1, bsz, att.embed_dim))

    def _cross_attention(self, att: MultiheadAttention, x: Tensor, cross) -> Tensor:
        bsz = x.size(1)
        q = att.q_proj(x)
        q *= att.scaling
        q = q.contiguous().view(1, bsz * att.num_heads, att.head_dim).transpose(0, 1)
        k, v, pad = cross["k"], cross["v"], cross["pad"]
        kv_bsz, src_len = k.size(0) // att.num_heads, k.size(1)
        if bsz != kv_bsz:
            w = torch.einsum("bxhtd,bhsd->bxhts", q.view((kv_bsz, -1, att.num_heads) + q.size()[1:]),
                             k.view((kv_bsz, att.num_heads) + k.size()[1:]))
            w = w.reshape((-1,) + w.size()[-2:])
        else:
            w = torch.bmm(q, k.transpose(1, 2))
        if pad is not None:
            w = w.view(kv_bsz, -1, att.num_heads, 1, src_len)
            w = w.masked_fill(pad.unsqueeze(1).unsqueeze(2).unsqueeze(3).to(torch.bool), float("-inf"))
            w = w.view(bsz * att.num_heads, 1, src_len)
        probs = utils.softmax(w, dim=-1).type_as(w)
        if bsz != kv_bsz:
            out = torch.einsum("bxhts,bhsd->bxhtd", probs.view((kv_bsz, -1, att.num_heads) + probs.size()[1:]),
                               v.view((kv_bsz, att.num_heads) + v.size()[1:]))
            out = out.reshape((-1,) + out.size()[-2:])
        else:
            out = torch.bmm(probs, v)
        return att.out_proj(out.transpose(0, 1).contiguous().view(1, bsz, att.embed_dim))

    @torch.no_grad()
    def step(self, tokens: Tensor) -> Tensor:
        """tokens (B, t+1): the logits (B, 1, V) of the next token."""
        dec = self.dec
        positions = None
        if dec.embed_positions is not None:
            positions = dec.embed_positions(tokens, incremental_state={})[:, -1:]  # fairseq's position rule
        x = dec.embed_scale * dec.embed_tokens(tokens[:, -1:].contiguous())
        if dec.project_in_dim is not None:
            x = dec.project_in_dim(x)
        if positions is not None:
            x += positions
        if dec.layernorm_embedding is not None:
            x = dec.layernorm_embedding(x)
        x = x.transpose(0, 1)  # (1, B, d)
        for layer, cache, cross in zip(dec.layers, self.caches, self.cross):
            pre = layer.normalize_before
            residual = x
            h = layer.self_attn_layer_norm(x) if pre else x
            x = residual + self._self_attention(layer.self_attn, h, cache)
            if not pre:
                x = layer.self_attn_layer_norm(x)
            residual = x
            h = layer.encoder_attn_layer_norm(x) if pre else x
            x = residual + self._cross_attention(layer.encoder_attn, h, cross)
            if not pre:
                x = layer.encoder_attn_layer_norm(x)
            if hasattr(layer, "fc1"):  # One Wide FFN layers may have none
                residual = x
                h = layer.final_layer_norm(x) if pre else x
                x = residual + layer.fc2(layer.activation_fn(layer.fc1(h)))
                if not pre:
                    x = layer.final_layer_norm(x)
        if dec.layer_norm is not None:
            x = dec.layer_norm(x)
        x = x.transpose(0, 1)
        if dec.project_out_dim is not None:
            x = dec.project_out_dim(x)
        return dec.output_layer(x)

    def reorder(self, order: Tensor):
        for cache in self.caches:
            _reorder_cache(cache, order)
        for cross in self.cross:  # per sentence: re-indexed only when sentences leave the batch
            kv_bsz = cross["k"].size(0) // self.dec.layers[0].encoder_attn.num_heads
            if kv_bsz * self.beam == order.numel():
                continue
            keep = order.reshape(-1, self.beam)[:, 0] // self.beam if self.beam > 1 else order
            h = cross["k"].size(0) // kv_bsz
            for name in ("k", "v"):
                t = cross[name]
                cross[name] = t.view(kv_bsz, h, *t.shape[1:]).index_select(0, keep).view(-1, *t.shape[1:])
            if cross["pad"] is not None:
                cross["pad"] = cross["pad"].index_select(0, keep)


class FastEnsembleModel(EnsembleModel):
    """EnsembleModel whose decoder step and reordering go through a TransformerStepper."""

    def __init__(self, models, beam_size: int):
        super().__init__(models)
        self.stepper = TransformerStepper(models[0], beam_size)
        self.started = False

    def reorder_encoder_out(self, encoder_outs, new_order):
        if self.started:  # after the first step only the stepper's own cross-attention cache is read
            return encoder_outs
        return super().reorder_encoder_out(encoder_outs, new_order)

    def forward_decoder(self, tokens, encoder_outs: List[Dict[str, List[Tensor]]],
                        incremental_states: List[Dict[str, Dict[str, Optional[Tensor]]]], temperature: float = 1.0):
        if tokens.size(1) == 1:
            self.stepper.start(encoder_outs[0])
            self.started = True
        logits = self.stepper.step(tokens)
        probs = self.models[0].get_normalized_probs((logits.div_(temperature), None), log_probs=True, sample=None)
        return probs[:, -1, :], None

    def reorder_incremental_state(self, incremental_states, new_order):
        self.stepper.reorder(new_order)


def quantize_decoder_int8(model):
    """torch's dynamic int8 quantization of the decoder's Linear layers, in place: int8 weights (per
    tensor), activations quantized on the fly each step. The encoder (run once per sentence) stays fp32."""
    with warnings.catch_warnings():  # torch.ao.quantization is deprecated in favour of torchao (not a dependency)
        warnings.simplefilter("ignore")
        torch.ao.quantization.quantize_dynamic(model.decoder, {nn.Linear}, dtype=torch.qint8, inplace=True)
    return model


class FastSequenceGenerator(SequenceGenerator):
    """fairseq's SequenceGenerator (same arguments, same search) with the fast step when supported.
    int8=True (or the class attribute, which fairseq-ext-generate --int8 sets) quantizes the decoder's
    Linear layers of the given models in place (quantize_decoder_int8)."""

    int8 = False

    def __init__(self, models, tgt_dict, int8=None, **kwargs):
        super().__init__(models, tgt_dict, **kwargs)
        models = list(self.model.models)
        self.fast_reason = unsupported_reason(models)
        if self.fast_reason is None:
            if self.int8 if int8 is None else int8:
                quantize_decoder_int8(models[0])
            self.model = FastEnsembleModel(models, self.beam_size)
            self.model.eval()
        else:
            logger.info(f"fast decoding path not used ({self.fast_reason}): fairseq's SequenceGenerator step"
                        + (" in fp32 (int8 needs the fast path)" if (self.int8 if int8 is None else int8) else ""))

    def _generate(self, sample, prefix_tokens=None, constraints=None, bos_token=None):
        if isinstance(self.model, FastEnsembleModel):
            self.model.started = False
        return super()._generate(sample, prefix_tokens=prefix_tokens, constraints=constraints, bos_token=bos_token)
