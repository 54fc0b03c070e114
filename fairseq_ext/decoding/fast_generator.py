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
- Q, K and V as one product (modules/fused_linear.py); every projection and the output projection
  through ops.few_rows_linear at 3-16 rows (batch x beam), which reads each weight once for all rows
  where MKL's GEMM repacks it every call; the top-k of beam search in two stages (TwoStageBeamSearch);
- the arithmetic is fairseq's (the same products and float32 softmax); the kernel and the caches' memory
  layouts sum in another order, so scores agree to ~1e-6 and hypotheses are token-identical
  (tests/test_fast_generator.py).

Transformer Big, batch 1, beam 5 on 2 cores: 1.58x fairseq's generator in fp32, 2.91x with the int8
decoder; figures, profile before/after and the CTranslate2 comparison in docs/decoding/README.md.

Supported: one model whose decoder is fairseq's TransformerDecoderBase with TransformerDecoderLayerBase
layers (stock transformer, transformer_balanced, every One Wide FFN placement incl. layers without FFN,
the sparse FFN of scaling_sparse_ff / one_wide_sparse_ffn), fairseq MultiheadAttention without
bias_kv / zero_attn, no cross-self-attention, head scaling, attention LayerNorm or adaptive softmax.
Other incremental encoder-decoders (CAN, SAS, sparse QKV, Terraformer) take the generic mode
(`OwnStepEnsembleModel`: their own step, the kernel output projection, the two-stage top-k) with a
one-line notice saying why (`unsupported_reason`); ensembles use fairseq's step.
"""
import logging
import warnings
from typing import Dict, List, Optional

import torch
from fairseq import utils
from fairseq.models import FairseqIncrementalDecoder
from fairseq.models.transformer import TransformerDecoderBase
from fairseq.modules import MultiheadAttention
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase
from fairseq.search import BeamSearch
from fairseq.sequence_generator import EnsembleModel, SequenceGenerator
import torch.nn.functional as F
from torch import Tensor, nn

from ..modules.fused_linear import FusedLinearWeights
from ..modules.kv_cache import reorder_written_cache, write_to_cache
from ..ops.few_rows_linear import kernel_applies as few_rows_linear_applies

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


def _fuses_qkv(att: MultiheadAttention) -> bool:
    """Whether the self-attention's Q, K, V projections can run as one product (plain Linear layers of
    one shape with biases alike)."""
    parts = (att.q_proj, att.k_proj, att.v_proj)
    return (all(type(m) is nn.Linear for m in parts)
            and len({m.bias is None for m in parts}) == 1 and len({m.weight.shape for m in parts}) == 1)


class TransformerStepper:
    """One incremental decoding step of a fairseq Transformer decoder (see module docstring)."""

    def __init__(self, model, beam_size: int):
        self.model, self.dec, self.beam = model, model.decoder, max(1, beam_size)
        self.caches: List[Dict[str, Tensor]] = []  # per layer: kv_cache.write_to_cache's buffers
        self.cross: List[Dict[str, Optional[Tensor]]] = []
        self.qkv: List[Optional[FusedLinearWeights]] = []  # per layer: fused Q/K/V weights, or None
        self.kernel = False  # this step's projections through ops.few_rows_linear's kernel

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
        if len(self.qkv) != len(self.dec.layers):  # built once; rebuilt by get() when a weight changes
            self.qkv = [FusedLinearWeights([l.self_attn.q_proj, l.self_attn.k_proj, l.self_attn.v_proj])
                        if _fuses_qkv(l.self_attn) else None for l in self.dec.layers]
        for layer in self.dec.layers:
            att = layer.encoder_attn
            s, kv_bsz = enc.size(0), enc.size(1)
            k = att.k_proj(enc).contiguous().view(s, kv_bsz * att.num_heads, att.head_dim).transpose(0, 1)
            v = att.v_proj(enc).contiguous().view(s, kv_bsz * att.num_heads, att.head_dim).transpose(0, 1)
            self.cross.append({"k": k, "v": v,  # fairseq's (strided) layout
                               "pad": pad if pad is not None and pad.any() else None})

    def _linear(self, x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
        """x (rows, in) -> (rows, out): ops.few_rows_linear's kernel when step() found it applies (weights
        read once for all rows), else F.linear."""
        if self.kernel:
            return torch.ops.fairseq_ext.few_rows_linear.default(x, weight, bias)
        return F.linear(x, weight, bias)

    def _module(self, module: nn.Module, x: Tensor) -> Tensor:
        """A Linear layer through _linear; any other module (an int8 dynamically quantized Linear) as is."""
        if type(module) is nn.Linear:
            return self._linear(x, module.weight, module.bias)
        return module(x)

    def _self_attention(self, att: MultiheadAttention, fused: Optional[FusedLinearWeights], x: Tensor,
                        cache: Dict[str, Tensor]) -> Tensor:
        bsz, d, heads, dh = x.size(0), att.embed_dim, att.num_heads, att.head_dim
        if fused is not None:
            qkv = self._linear(x, *fused.get())  # (B, 3d)
            q, k, v = qkv[:, :d], qkv[:, d:2 * d], qkv[:, 2 * d:]
        else:
            q, k, v = self._module(att.q_proj, x), self._module(att.k_proj, x), self._module(att.v_proj, x)
        q = (q * att.scaling).view(bsz * heads, 1, dh)  # fairseq scales q after the projection
        kbuf, vbuf, n = write_to_cache(cache, k.view(bsz, heads, dh), v.view(bsz, heads, dh))
        keys = kbuf[:, :, :n].reshape(bsz * heads, n, dh)  # views: (B, H) merge without a copy
        values = vbuf[:, :, :n].reshape(bsz * heads, n, dh)
        probs = utils.softmax(torch.bmm(q, keys.transpose(1, 2)), dim=-1).type_as(q)
        return self._module(att.out_proj, torch.bmm(probs, values).view(bsz, d))

    def _cross_attention(self, att: MultiheadAttention, x: Tensor, cross) -> Tensor:
        bsz, d, heads, dh = x.size(0), att.embed_dim, att.num_heads, att.head_dim
        q = self._module(att.q_proj, x) * att.scaling  # (B, d)
        k, v, pad = cross["k"], cross["v"], cross["pad"]  # (kv_bsz * H, S, d_h)
        kv_bsz, src_len = k.size(0) // heads, k.size(1)
        rows = bsz // kv_bsz  # beam rows per sentence: one batched product per (sentence, head)
        q = q.view(kv_bsz, rows, heads, dh).transpose(1, 2).reshape(kv_bsz * heads, rows, dh)
        w = torch.bmm(q, k.transpose(1, 2))  # (kv_bsz * H, rows, S)
        if pad is not None:
            w = w.view(kv_bsz, heads, rows, src_len).masked_fill(pad.view(kv_bsz, 1, 1, src_len).to(torch.bool),
                                                                 float("-inf")).view(kv_bsz * heads, rows, src_len)
        probs = utils.softmax(w, dim=-1).type_as(w)
        out = torch.bmm(probs, v)  # (kv_bsz * H, rows, d_h)
        return self._module(att.out_proj, out.view(kv_bsz, heads, rows, dh).transpose(1, 2).reshape(bsz, d))

    def _ffn(self, layer, h: Tensor) -> Tensor:
        if type(layer.fc1) is nn.Linear and type(layer.fc2) is nn.Linear:  # fairseq's fc2(act(fc1(h)))
            return self._module(layer.fc2, layer.activation_fn(self._module(layer.fc1, h)))
        return layer.fc2(layer.activation_fn(layer.fc1(h)))  # other FFN modules (sparse FFN) as they are

    @torch.no_grad()
    def step(self, tokens: Tensor) -> Tensor:
        """tokens (B, t+1): the logits (B, 1, V) of the next token."""
        dec = self.dec
        positions = None
        if dec.embed_positions is not None:
            positions = dec.embed_positions(tokens, incremental_state={})[:, -1]  # fairseq's position rule
        x = dec.embed_scale * dec.embed_tokens(tokens[:, -1])  # (B, d): one row per hypothesis
        self.kernel = few_rows_linear_applies(x)  # decided once per step for every projection
        if dec.project_in_dim is not None:
            x = self._module(dec.project_in_dim, x)
        if positions is not None:
            x += positions
        if dec.layernorm_embedding is not None:
            x = dec.layernorm_embedding(x)
        for layer, cache, cross, fused in zip(dec.layers, self.caches, self.cross, self.qkv):
            pre = layer.normalize_before
            residual = x
            h = layer.self_attn_layer_norm(x) if pre else x
            x = residual + self._self_attention(layer.self_attn, fused, h, cache)
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
                x = residual + self._ffn(layer, h)
                if not pre:
                    x = layer.final_layer_norm(x)
        if dec.layer_norm is not None:
            x = dec.layer_norm(x)
        if dec.project_out_dim is not None:
            x = self._module(dec.project_out_dim, x)
        out = self._module(dec.output_projection, x) if dec.adaptive_softmax is None else dec.output_layer(x)
        return out.unsqueeze(1)

    def reorder(self, order: Tensor):
        for cache in self.caches:
            reorder_written_cache(cache, order)
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


def own_step_reason(models) -> Optional[str]:
    """None when the model's own incremental step can run under OwnStepEnsembleModel (one model whose
    decoder is a fairseq incremental decoder with extract_features), else why not."""
    if len(models) != 1:
        return "ensembles of several models"
    dec = getattr(models[0], "decoder", None)
    if not isinstance(dec, FairseqIncrementalDecoder) or not hasattr(models[0], "encoder"):
        return f"decoder {type(dec).__name__} (not an incremental encoder-decoder)"
    return None


class OwnStepEnsembleModel(EnsembleModel):
    """For decoders the TransformerStepper does not know (CAN with its compressed-attention op, SAS,
    sparse QKV, Terraformer): the model's own incremental step (`extract_features`), then the output
    projection through ops.few_rows_linear when it is fairseq's plain Linear output layer (the largest
    single read of a small decoder's step: 32,000 x d). With TwoStageBeamSearch this is the fast path's
    generic mode; the arithmetic is the model's, so hypotheses are the same as fairseq's."""

    def __init__(self, models):
        super().__init__(models)
        dec = models[0].decoder  # fairseq's output layer is exactly its Linear output projection
        self.plain_output = (isinstance(dec, TransformerDecoderBase) and dec.adaptive_softmax is None
                             and type(dec).output_layer is TransformerDecoderBase.output_layer
                             and type(dec.output_projection) is nn.Linear)

    def forward_decoder(self, tokens, encoder_outs: List[Dict[str, List[Tensor]]],
                        incremental_states: List[Dict[str, Dict[str, Optional[Tensor]]]], temperature: float = 1.0):
        model = self.models[0]
        dec = model.decoder
        x, extra = dec.extract_features(tokens, encoder_out=encoder_outs[0], incremental_state=incremental_states[0])
        x = x[:, -1:, :]
        if self.plain_output and few_rows_linear_applies(x):
            proj = dec.output_projection
            logits = torch.ops.fairseq_ext.few_rows_linear.default(x[:, 0], proj.weight, proj.bias).unsqueeze(1)
        else:
            logits = dec.output_layer(x)
        attn = None  # as fairseq's EnsembleModel: the last step's attention when the decoder returns one
        if isinstance(extra, dict) and extra.get("attn") is not None:
            holder = extra["attn"]
            attn = holder if isinstance(holder, Tensor) else holder[0]
            attn = attn[:, -1, :] if attn is not None else None
        probs = model.get_normalized_probs((logits.div_(temperature), extra), log_probs=True, sample=None)
        return probs[:, -1, :], attn


def quantize_decoder_int8(model):
    """torch's dynamic int8 quantization of the decoder's Linear layers, in place: int8 weights (per
    tensor), activations quantized on the fly each step. The encoder (run once per sentence) stays fp32."""
    with warnings.catch_warnings():  # torch.ao.quantization is deprecated in favour of torchao (not a dependency)
        warnings.simplefilter("ignore")
        torch.ao.quantization.quantize_dynamic(model.decoder, {nn.Linear}, dtype=torch.qint8, inplace=True)
    return model


class TwoStageBeamSearch(BeamSearch):
    """fairseq's BeamSearch with its top-k over (hypotheses × vocabulary) scores taken in two stages: the
    best k of each hypothesis, then the best k of those (k = 2 × beam). Same candidates in the same
    order whenever scores are distinct (the global best k are among their rows' best k); 2.5x less time
    than one top-k over beam × vocabulary scores (160,000 at beam 5) on this machine."""

    def step(self, step: int, lprobs, scores: Optional[Tensor], prev_output_tokens: Optional[Tensor] = None,
             original_batch_idxs: Optional[Tensor] = None, candidate_multiple: int = 2):
        bsz, beam_size, vocab_size = lprobs.size()
        rows = 1 if step == 0 else beam_size  # step 0: all hypotheses equally likely, the first one only
        k = min(candidate_multiple * beam_size, rows * vocab_size - 1)  # -1: never pad, as fairseq
        if k > vocab_size:  # tiny vocabularies: one top-k
            return super().step(step, lprobs, scores, prev_output_tokens, original_batch_idxs, candidate_multiple)
        if step == 0:
            lprobs = lprobs[:, ::beam_size, :].contiguous()
        else:
            lprobs = lprobs + scores[:, :, step - 1].unsqueeze(-1)
        row_scores, row_tokens = torch.topk(lprobs, k)  # (bsz, rows, k)
        scores_buf, pick = torch.topk(row_scores.view(bsz, -1), k)  # (bsz, k) among rows * k
        beams_buf = torch.div(pick, k, rounding_mode="trunc")
        return scores_buf, row_tokens.view(bsz, -1).gather(1, pick), beams_buf


class FastSequenceGenerator(SequenceGenerator):
    """fairseq's SequenceGenerator (same arguments, same search) with the fast step when supported.
    int8=True (or the class attribute, which fairseq-ext-generate --int8 sets) quantizes the decoder's
    Linear layers of the given models in place (quantize_decoder_int8)."""

    int8 = False

    def __init__(self, models, tgt_dict, int8=None, **kwargs):
        super().__init__(models, tgt_dict, **kwargs)
        models = list(self.model.models)
        self.fast_reason = unsupported_reason(models)
        if type(self.search) is BeamSearch:  # plain beam search (not sampling, diverse, constrained, ...)
            self.search = TwoStageBeamSearch(tgt_dict)
        int8 = self.int8 if int8 is None else int8
        if self.fast_reason is None:
            if int8:
                quantize_decoder_int8(models[0])
            self.model = FastEnsembleModel(models, self.beam_size)
            self.model.eval()
        elif own_step_reason(models) is None:
            self.model = OwnStepEnsembleModel(models)
            self.model.eval()
            logger.info(f"fast decoding path, generic mode (the model's own incremental step; {self.fast_reason})"
                        + (": int8 needs the full fast path, decoding in fp32" if int8 else ""))
        else:
            logger.info(f"fast decoding path not used ({self.fast_reason}): fairseq's SequenceGenerator step"
                        + (" in fp32 (int8 needs the fast path)" if int8 else ""))

    def _generate(self, sample, prefix_tokens=None, constraints=None, bos_token=None):
        if isinstance(self.model, FastEnsembleModel):
            self.model.started = False
        return super()._generate(sample, prefix_tokens=prefix_tokens, constraints=constraints, bos_token=bos_token)
