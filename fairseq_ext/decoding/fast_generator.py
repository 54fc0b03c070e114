"""Fast decoding path: fairseq's SequenceGenerator with a lean decoder step.

The beam search is fairseq's own (`FastSequenceGenerator` subclasses SequenceGenerator: same length
penalty, min/max length, no-repeat-ngram, unk penalty, prefix tokens, output), so hypotheses are the
same by construction as long as the step gives the same log-probabilities. The step replaces fairseq's
generic incremental decoding (shown for the Transformer stepper; CAN and SAS in steppers.py):

- keys/values of self-attention written in place into preallocated buffers that double when full
  (fairseq concatenates the whole cache every step) and read as strided views;
- cross-attention keys/values computed once per sentence, stored per sentence (not per beam row) and
  re-indexed only when finished sentences leave the batch;
- no incremental-state dictionaries (fairseq builds a string key and looks it up per module per step),
  no alignment / mask plumbing; the encoder output is not re-indexed every step (nothing reads it after
  the first step);
- Q, K and V as one product (modules/fused_linear.py); every projection and the output projection
  through ops.few_rows_linear at 3-16 rows (batch x beam), which reads each weight once for all rows
  where MKL's GEMM repacks it every call; more rows (batched steps, the sources' cross-attention keys and
  values) on oneDNN-packed copies where that is faster on this CPU (encoder.py, as the encoder's
  products); the top-k of beam search in two stages (TwoStageBeamSearch);
- the arithmetic is fairseq's (the same products and float32 softmax); the kernel and the caches' memory
  layouts sum in another order, so scores agree to ~1e-6 and hypotheses are token-identical
  (tests/test_fast_generator.py).

Speed against fairseq's generator and CTranslate2, per architecture: the generated tables of
docs/decoding/README.md (`python benchmarks/run_presets.py --only decode_fast_big ...`).

Supported (steppers.py): one model whose decoder is fairseq's TransformerDecoderBase with layers of one
kind: fairseq's Transformer layers (stock transformer, transformer_balanced, every One Wide FFN placement
incl. layers without FFN, the sparse FFN of scaling_sparse_ff / one_wide_sparse_ffn, the sparse QKV of
scaling_sparse / _qkv; MultiheadAttention without bias_kv / zero_attn, no cross-self-attention, head
scaling, attention LayerNorm or adaptive softmax), CAN layers (every --can-compress) or SAS blocks; the
Terraformer's decoder (terraformer_stepper.py) unless its attention is LSH. Other incremental
encoder-decoders (the Terraformer with LSH attention) take the generic mode
(`OwnStepEnsembleModel`: their own step, the kernel output projection, the two-stage top-k) with a
one-line notice saying why (`unsupported_reason`); ensembles use fairseq's step.
"""
import logging
from typing import Dict, List, Optional

import torch
from fairseq.models import FairseqIncrementalDecoder
from fairseq.models.transformer import TransformerDecoderBase
from fairseq.search import BeamSearch
from fairseq.sequence_generator import EnsembleModel, SequenceGenerator
from torch import Tensor, nn

from ..ops.few_rows_linear import few_rows_linear, few_rows_linear_packed, pack_panels
from .encoder import EncoderMixin, bf16_encoder_reason, fp32_packed_reason
from .steppers import stepper_for

logger = logging.getLogger(__name__)


def unsupported_reason(models) -> Optional[str]:
    """None when a fast step (steppers.py) serves these models, else why not (one line)."""
    dtype = next(models[0].parameters()).dtype
    if dtype != torch.float32:  # its fused projections round differently from fairseq's step in fp16/bf16
        return f"the fast step is fp32; the model is {dtype}"
    return stepper_for(models)[1]


class FastEnsembleModel(EncoderMixin, EnsembleModel):
    """EnsembleModel whose decoder step and reordering go through the Stepper serving the model."""

    def __init__(self, models, beam_size: int, bf16: bool = False):
        super().__init__(models)
        stepper, reason = stepper_for(models)
        if stepper is None:
            raise ValueError(f"no fast decoder step for these models: {reason}")
        self.stepper = stepper(models[0], beam_size, bf16)
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


class OwnStepEnsembleModel(EncoderMixin, EnsembleModel):
    """For incremental decoders no Stepper serves (the Terraformer with LSH attention): the model's own
    incremental step (`extract_features`), then the output projection through ops.few_rows_linear when
    it is fairseq's plain Linear output layer (the largest single read of a small decoder's step:
    32,000 x d). With TwoStageBeamSearch this is the fast path's generic mode; the arithmetic is the
    model's, so hypotheses are the same as fairseq's."""

    def __init__(self, models, bf16: bool = False):
        super().__init__(models)
        dec = models[0].decoder  # fairseq's output layer is exactly its Linear output projection
        self.plain_output = (isinstance(dec, TransformerDecoderBase) and dec.adaptive_softmax is None
                             and type(dec).output_layer is TransformerDecoderBase.output_layer
                             and type(dec.output_projection) is nn.Linear)
        # --bf16: the output projection's bf16 copy (its weights are bf16-rounded: the same values), in the
        # few-rows kernel's panel layout
        self.output_weight = (pack_panels(dec.output_projection.weight.detach().to(torch.bfloat16))
                              if bf16 and self.plain_output else None)

    def forward_decoder(self, tokens, encoder_outs: List[Dict[str, List[Tensor]]],
                        incremental_states: List[Dict[str, Dict[str, Optional[Tensor]]]], temperature: float = 1.0):
        model = self.models[0]
        dec = model.decoder
        x, extra = dec.extract_features(tokens, encoder_out=encoder_outs[0], incremental_state=incremental_states[0])
        x = x[:, -1:, :]
        if self.plain_output:  # the kernel at 3-16 rows, else F.linear (= the output layer)
            out = dec.output_projection
            logits = (few_rows_linear(x, out.weight, out.bias) if self.output_weight is None
                      else few_rows_linear_packed(x, self.output_weight, out.bias, out.out_features))
        else:
            logits = dec.output_layer(x)
        attn = None  # as fairseq's EnsembleModel: the last step's attention when the decoder returns one
        if isinstance(extra, dict) and extra.get("attn") is not None:
            holder = extra["attn"]
            attn = holder if isinstance(holder, Tensor) else holder[0]
            attn = attn[:, -1, :] if attn is not None else None
        probs = model.get_normalized_probs((logits.div_(temperature), extra), log_probs=True, sample=None)
        return probs[:, -1, :], attn


def round_to_bf16(model):
    """Every float32 parameter rounded to bfloat16 in place (kept float32): the model that
    --bf16 decodes. Its steps read bf16 copies of these weights (the few-rows kernel widens them exactly),
    so the hypotheses are fairseq's on the rounded model."""
    with torch.no_grad():
        for t in model.parameters():
            if t.dtype == torch.float32:
                t.copy_(t.to(torch.bfloat16))
    logger.info("--bf16: weights rounded to bfloat16; the decoder's products read them as bfloat16, "
                "activations and sums in float32")
    return model


def quantize_decoder_int8(model):
    """The decoder's Linear layers to int8, in place (fairseq_ext.ops.int8_linear.Int8Linear): int8 weights with
    one scale per output row, each step's activations quantized per row on the fly, the sums exact in int32
    (the AVX-512 VNNI kernel where the CPU has it). The encoder (run once per sentence) stays fp32."""
    from ..ops.int8_linear import Int8Linear

    parents = [(parent, name, child) for parent in model.decoder.modules()
               for name, child in parent.named_children() if type(child) is nn.Linear]
    quantized = {id(child.weight) for _, _, child in parents}
    params = {id(p): p.numel() for p in model.decoder.parameters()}
    share = sum(n for i, n in params.items() if i in quantized) / max(1, sum(params.values()))
    with torch.no_grad():
        for parent, name, child in parents:
            setattr(parent, name, Int8Linear.from_linear(child))
    # say what was quantized: layers that are not nn.Linear (sparse FFN blocks, multiplicative dense,
    # convolutions, embeddings not tied to an output Linear) stay fp32
    logger.info(f"--int8: {len(parents)} Linear layers of the decoder quantized, {share:.0%} of its weights; "
                f"the rest stays fp32")
    if not parents:
        logger.warning("--int8: this decoder has no nn.Linear layer; nothing was quantized")
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
    Linear layers of the given models in place (quantize_decoder_int8). bf16=True (fairseq-ext-generate
    --bf16 on a CPU) rounds the model's weights to bfloat16 in place (round_to_bf16) and lets the step's
    products read them as bfloat16: half the bytes of float32, float32 arithmetic; the encoder (compute-
    bound, once per sentence) runs under bf16 autocast where this CPU's bf16 products are faster than
    fp32 (bf16_encoder_reason). The encoder's fp32 products run on weights packed once for oneDNN where
    that is faster on this CPU (fp32_packed_reason; encoder.py)."""

    int8 = False
    bf16 = False

    def __init__(self, models, tgt_dict, int8=None, bf16=None, **kwargs):
        super().__init__(models, tgt_dict, **kwargs)
        models = list(self.model.models)
        self.fast_reason = unsupported_reason(models)
        if type(self.search) is BeamSearch:  # plain beam search (not sampling, diverse, constrained, ...)
            self.search = TwoStageBeamSearch(tgt_dict)
        int8 = self.int8 if int8 is None else int8
        bf16 = self.bf16 if bf16 is None else bf16
        dtype = next(models[0].parameters()).dtype
        if int8 and dtype != torch.float32:
            raise ValueError(f"--int8 quantizes the decoder's fp32 weights, but the model is {dtype} (--fp16 or "
                             f"--bf16): use one of the two")
        if bf16 and (int8 or dtype != torch.float32):
            raise ValueError(f"bf16 decoding reads a float32 model's weights as bfloat16; the model is {dtype}"
                             + (" and int8 was asked too" if int8 else "") + ": use one of them")
        if bf16:
            for m in models:
                round_to_bf16(m)
        if self.fast_reason is None:
            if int8:
                quantize_decoder_int8(models[0])
            self.model = FastEnsembleModel(models, self.beam_size, bf16)
            self.model.eval()
        elif own_step_reason(models) is None:
            self.model = OwnStepEnsembleModel(models, bf16)
            self.model.eval()
            logger.info(f"fast decoding path, generic mode (the model's own incremental step; {self.fast_reason})"
                        + (": int8 needs the full fast path, decoding in fp32" if int8 else ""))
        else:
            logger.info(f"fast decoding path not used ({self.fast_reason}): fairseq's SequenceGenerator step"
                        + (" in fp32 (int8 needs the fast path)" if int8 else ""))
        if isinstance(self.model, EncoderMixin):
            reason = bf16_encoder_reason() if bf16 else None
            self.model.encoder_bf16 = bf16 and reason is None
            if bf16:
                logger.info("--bf16: the encoder runs under bf16 autocast" if reason is None
                            else f"--bf16: the encoder runs in float32 ({reason})")
            if all(p.device.type == "cpu" for p in models[0].parameters()):
                packed = fp32_packed_reason()  # (--bf16's weights are float32 rounded to bf16: packed as float32)
                self.model.encoder_packed = packed is None and not self.model.encoder_bf16
                if isinstance(self.model, FastEnsembleModel):
                    self.model.stepper.packed = packed is None
                logger.info("float32 products of many rows (encoder, batched steps) run on weights packed for "
                            "oneDNN" if packed is None else f"float32 products of many rows run on F.linear ({packed})")

    def _generate(self, sample, prefix_tokens=None, constraints=None, bos_token=None):
        if isinstance(self.model, FastEnsembleModel):
            self.model.started = False
        return super()._generate(sample, prefix_tokens=prefix_tokens, constraints=constraints, bos_token=bos_token)
