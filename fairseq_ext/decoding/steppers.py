"""The fast path's decoder steps (fast_generator.py): one incremental step of a decoder, without fairseq's
incremental-state dictionaries, for the decoders this package knows.

- `TransformerStepper`: fairseq's TransformerDecoderLayerBase layers (stock Transformer, every One Wide
  FFN placement, the sparse FFN of scaling_sparse_ff / one_wide_sparse_ffn, the sparse QKV attention of
  scaling_sparse / _qkv: the multiplicative layer, then Q, K and V of the last F steps as one convolution,
  the causal conv state kept beside the key/value cache; cross-attention keys/values once per sentence).
- `CANStepper`: Compressed Attention Network layers (models/can.py): the fused input projection (q, k, v,
  X·W1) as one product, the decoder's keys/values written in place, and the attention, ReLU and second FFN
  layer as one call of ops.compressed_attention_decode (Eq. 11 + 13). The ablations: --can-compress ffn
  (fairseq's self-attention sub-layer, then cross-attention and FFN in one call with no decoder keys),
  --can-compress attention (self- and cross-attention under one softmax, then the output projection and
  fairseq's FFN sub-layer).
- `SASStepper`: simplified SAS / SAS-P blocks (models/sas.py): the shaped attention of one query over the
  written cache, α·v_t + Σ_j (β·p_j − γ/n)·v_j as one weighted sum (the identity, softmax and uniform
  parts of A = α·I + β·softmax − γ·C in one product), then fairseq's cross-attention and the MLP.

Shared (`Stepper`): embeddings and positions as fairseq's TransformerDecoderBase; every projection and the
output projection through ops.few_rows_linear at 3-16 rows (weights read once for all rows; with --bf16 at
1-16 rows, reading bf16 copies of the bf16-rounded weights in the kernel's panel layout, made once per
weight: `_bf16_panels`, ops.few_rows_linear_packed); keys/values
of self-attention written in place into buffers that double when full (modules/kv_cache.py);
cross-attention keys/values of fairseq's MultiheadAttention computed once per sentence, stored per
sentence and re-indexed only when finished sentences leave the batch. Decoders whose Linear layers were
quantized to int8 (fast_generator.quantize_decoder_int8) run the same steps with the quantized modules.
The Terraformer's step (its decoder is not fairseq's TransformerDecoderBase) is terraformer_stepper.py's,
built on `Stepper`. `stepper_for(models)` picks the class, or says in one line why none serves the models.
"""
from typing import Dict, List, Optional, Tuple, Type

import torch
import torch.nn.functional as F
from fairseq import utils
from fairseq.models.transformer import TransformerDecoderBase
from fairseq.modules import MultiheadAttention
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase
from torch import Tensor, nn

from ..models.can import CANDecoderLayer
from ..models.sas import SASDecoderLayer
from ..models.terraformer import TerraformerDecoder
from ..modules.fused_linear import FusedLinearWeights
from ..modules.kv_cache import reorder_caches, write_to_cache, write_to_row_cache
from ..modules.multiplicative import SparseQKVAttention, conv_last_step, conv_patch_matrix
from ..ops.compressed_attention import (compressed_attention_decode, compressed_attention_hidden_reference,
                                       gather_history, per_row)
from ..ops.few_rows_linear import PANEL, pack_panels
from ..ops.few_rows_linear import kernel_applies as few_rows_linear_applies
from ..ops.int8_linear import Int8Linear
from .encoder import pack_weight, packed_linear


def _fusable(modules) -> bool:
    """Whether Linear layers reading the same input can run as one product: plain Linear layers with biases
    alike, or --int8's Int8Linear layers (a missing bias becomes zeros), all of one kind and input width."""
    kinds = {type(m) for m in modules}
    return (kinds == {Int8Linear} or (kinds == {nn.Linear} and len({m.bias is None for m in modules}) == 1)) \
        and len({m.in_features for m in modules}) == 1


def _fuse(modules):
    """Layers reading the same input as one product, or None: FusedLinearWeights (concatenated float weights,
    rebuilt when a weight changes) for Linear layers, one concatenated Int8Linear for --int8's layers (the
    separate calls' values); Stepper._fused_linear runs either."""
    if not _fusable(modules):
        return None
    return Int8Linear.concat(modules) if type(modules[0]) is Int8Linear else FusedLinearWeights(modules)


def _fused_qkv(att):
    """The Q, K and V projections of a fairseq MultiheadAttention as one product, when they can run as one."""
    if type(att) is not MultiheadAttention:
        return None
    parts = (att.q_proj, att.k_proj, att.v_proj)
    return _fuse(parts) if len({m.out_features for m in parts}) == 1 else None


def _attention_reason(att, i) -> Optional[str]:
    """None when the steppers can run this fairseq MultiheadAttention, else why not."""
    if type(att) is not MultiheadAttention or att.bias_k is not None or att.add_zero_attn:
        return f"decoder layer {i} attention {type(att).__name__}"
    return None


class Stepper:
    """Shared parts of a decoder step (see module docstring); subclasses define `_start_layers`,
    `_layer` and `_reorder_layers`."""

    def __init__(self, model, beam_size: int, bf16: bool = False):
        self.model, self.dec, self.beam = model, model.decoder, max(1, beam_size)
        self.bf16 = bf16  # the kernel reads bf16 copies of the (bf16-rounded) weights: --bf16
        # id(weight) -> (weight, version, bf16 copy): in the few-rows kernel's panel layout (what _linear reads),
        # and row-major (CAN's second FFN layer, read by ops.compressed_attention_decode)
        self._bf16: Dict[int, Tuple[Tensor, int, Tensor]] = {}
        self._bf16_rows: Dict[int, Tuple[Tensor, int, Tensor]] = {}
        self.packed = False  # products of more than 16 rows on oneDNN-packed copies (_many_rows_linear)
        self._packs: Dict[int, Tuple[Tensor, int, Tensor]] = {}  # id(weight) -> (weight, version, packed copy)
        self.caches: List[Dict[str, Tensor]] = []  # per layer: kv_cache.write_to_cache's buffers
        self.cross: List[Optional[Dict[str, Optional[Tensor]]]] = []  # per layer: cross K/V per sentence
        self.kernel = False  # this step's projections through ops.few_rows_linear's kernel
        self.rows = self.beam  # hypotheses per sentence (per row of the encoder output start() keeps)

    @classmethod
    def layer_reason(cls, i: int, layer: nn.Module) -> Optional[str]:
        raise NotImplementedError

    # ---- start of a batch ----
    def start(self, encoder_out: Dict[str, List[Tensor]]):
        """The per-sentence encoder output (fairseq expands it to every beam row) and every layer's
        cross-attention cache."""
        enc, pad = self._per_sentence(encoder_out)
        self.caches = [{} for _ in self.dec.layers]
        self._start_layers(enc, pad)

    def _per_sentence(self, encoder_out: Dict[str, List[Tensor]]) -> Tuple[Tensor, Optional[Tensor]]:
        """The encoder output (S, sentences, d) and padding (sentences, S) or None, one copy per sentence
        (fairseq expands them to every beam row); sets `rows`, the hypotheses per sentence."""
        enc = encoder_out["encoder_out"][0]  # (S, B*beam, d)
        pad = encoder_out["encoder_padding_mask"][0] if encoder_out["encoder_padding_mask"] else None
        self.rows = self.beam if enc.size(1) % self.beam == 0 else 1  # hypotheses per encoder row
        if self.rows > 1:  # one copy per sentence
            enc = enc.view(enc.size(0), -1, self.rows, enc.size(2))[:, :, 0, :]
            if pad is not None:
                pad = pad.view(-1, self.rows, pad.size(1))[:, 0, :]
        return enc, (pad if pad is not None and pad.any() else None)

    def _start_layers(self, enc: Tensor, pad: Optional[Tensor]):
        raise NotImplementedError

    def _mha_cross_cache(self, att: MultiheadAttention, enc: Tensor, pad: Optional[Tensor]):
        """fairseq MultiheadAttention keys/values of the encoder output, per sentence (fairseq's layout)."""
        s, kv_bsz = enc.size(0), enc.size(1)
        rows = enc.reshape(s * kv_bsz, enc.size(2))
        k, v = (self._many_rows_linear(rows, m.weight, m.bias) if type(m) is nn.Linear else m(rows)
                for m in (att.k_proj, att.v_proj))
        k = k.view(s, kv_bsz * att.num_heads, att.head_dim).transpose(0, 1)
        v = v.view(s, kv_bsz * att.num_heads, att.head_dim).transpose(0, 1)
        return {"k": k, "v": v, "pad": pad, "heads": att.num_heads}

    # ---- pieces of a step ----
    def _linear(self, x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
        """x (rows, in) -> (rows, out): ops.few_rows_linear's kernel when step() found it applies (weights
        read once for all rows), else F.linear."""
        if self.kernel and self.bf16:
            return torch.ops.fairseq_ext.few_rows_linear_packed.default(x, self._bf16_panels(weight), bias,
                                                                        weight.size(0), PANEL)
        if self.kernel:
            return torch.ops.fairseq_ext.few_rows_linear.default(x, weight, bias)
        return self._many_rows_linear(x, weight, bias)

    def _many_rows_linear(self, x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
        """x (rows, in) -> (rows, out) where the few-rows kernel does not apply (batched steps, the
        cross-attention keys/values of a batch's sources): oneDNN on a copy of the weight packed once, where
        FastSequenceGenerator found that faster on this CPU (`packed`: encoder.fp32_packed_reason), else
        F.linear (which repacks the weight on every call)."""
        if self.packed and x.dtype == weight.dtype == torch.float32 and x.device.type == "cpu" and x.dim() == 2:
            return packed_linear(x, self._weight_copy(self._packs, weight, pack_weight), bias)
        return F.linear(x, weight, bias)

    def _fused_linear(self, fused, x: Tensor) -> Tensor:
        """x through _fuse's product: the concatenated Int8Linear, or the concatenated weights by _linear."""
        return fused(x) if isinstance(fused, Int8Linear) else self._linear(x, *fused.get())

    def _bf16_copy(self, weight: Tensor) -> Tensor:
        """The bf16 copy of a float32 weight whose values are bf16-rounded (exact), row-major."""
        return self._weight_copy(self._bf16_rows, weight, lambda w: w.detach().to(torch.bfloat16))

    def _bf16_panels(self, weight: Tensor) -> Tensor:
        """The bf16 copy of a bf16-rounded float32 weight in the few-rows kernel's panel layout."""
        return self._weight_copy(self._bf16, weight, lambda w: pack_panels(w.detach().to(torch.bfloat16)))

    @staticmethod
    def _weight_copy(store: Dict[int, Tuple[Tensor, int, Tensor]], weight: Tensor, make) -> Tensor:
        """make(weight), kept in store and made on first use and again when the weight changes in place."""
        version = 0 if weight.is_inference() else weight._version  # (inference tensors keep no version)
        entry = store.get(id(weight))
        if entry is None or entry[0] is not weight or entry[1] != version:
            entry = (weight, version, make(weight))
            store[id(weight)] = entry
        return entry[2]

    def _module(self, module: nn.Module, x: Tensor) -> Tensor:
        """A Linear layer through _linear; any other module (an --int8 Int8Linear) as is."""
        if type(module) is nn.Linear:
            return self._linear(x, module.weight, module.bias)
        return module(x)

    def _cross_attention(self, att: MultiheadAttention, x: Tensor, cross) -> Tensor:
        """fairseq's encoder-decoder attention of one query row per hypothesis over the per-sentence cache."""
        q = self._module(att.q_proj, x) * att.scaling  # (B, d)
        return self._module(att.out_proj, self._attend_encoder(q, cross))

    @staticmethod
    def _attend_encoder(q: Tensor, cross) -> Tensor:
        """Scaled queries q (B, d), one row per hypothesis, over a per-sentence encoder cache: (B, d)."""
        bsz, d, heads = q.size(0), q.size(1), cross["heads"]
        dh = d // heads
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
        return out.view(kv_bsz, heads, rows, dh).transpose(1, 2).reshape(bsz, d)

    def _self_attention(self, att: MultiheadAttention, fused: Optional[FusedLinearWeights], x: Tensor,
                        cache: Dict[str, Tensor]) -> Tensor:
        bsz, d, heads, dh = x.size(0), att.embed_dim, att.num_heads, att.head_dim
        if fused is not None:
            qkv = self._fused_linear(fused, x)  # (B, 3d)
            q, k, v = qkv[:, :d], qkv[:, d:2 * d], qkv[:, 2 * d:]
        else:
            q, k, v = self._module(att.q_proj, x), self._module(att.k_proj, x), self._module(att.v_proj, x)
        q = (q * att.scaling).view(bsz, heads, dh)  # fairseq scales q after the projection
        return self._module(att.out_proj, self._attend_cache(q, k.view(bsz, heads, dh), v.view(bsz, heads, dh), cache))

    @staticmethod
    def _attend_cache(q: Tensor, k: Tensor, v: Tensor, cache: Dict[str, Tensor]) -> Tensor:
        """This step's key/value (B, H, d_h) written into the cache, then the scaled queries q (B, H, d_h)
        over all cached keys: (B, H·d_h)."""
        bsz, heads, dh = q.shape
        kbuf, vbuf, n = write_to_cache(cache, k, v)
        keys = kbuf[:, :, :n].reshape(bsz * heads, n, dh)  # views: (B, H) merge without a copy
        values = vbuf[:, :, :n].reshape(bsz * heads, n, dh)
        scores = torch.bmm(q.reshape(bsz * heads, 1, dh), keys.transpose(1, 2))
        probs = utils.softmax(scores, dim=-1).type_as(q)  # fairseq's float32 softmax
        return torch.bmm(probs, values).view(bsz, heads * dh)

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
        self.kernel = few_rows_linear_applies(x, self.bf16)  # decided once per step for every projection
        if dec.project_in_dim is not None:
            x = self._module(dec.project_in_dim, x)
        if positions is not None:
            x += positions
        if dec.layernorm_embedding is not None:
            x = dec.layernorm_embedding(x)
        for i, layer in enumerate(dec.layers):
            x = self._layer(i, layer, x)
        if dec.layer_norm is not None:
            x = dec.layer_norm(x)
        if dec.project_out_dim is not None:
            x = self._module(dec.project_out_dim, x)
        return self._module(dec.output_projection, x).unsqueeze(1)

    def _layer(self, i: int, layer: nn.Module, x: Tensor) -> Tensor:
        raise NotImplementedError

    # ---- beam reordering ----
    def reorder(self, order: Tensor):
        for cache in self.caches:
            reorder_caches(cache, order)
        for cross in self.cross:  # per sentence: re-indexed only when sentences leave the batch
            if cross is None:
                continue
            heads = cross["heads"]
            kv_bsz = cross["k"].size(0) // heads
            keep = self._kept_sentences(kv_bsz, order)
            if keep is None:
                continue
            for name in ("k", "v"):
                t = cross[name]
                cross[name] = t.view(kv_bsz, heads, *t.shape[1:]).index_select(0, keep).view(-1, *t.shape[1:])
            if cross["pad"] is not None:
                cross["pad"] = cross["pad"].index_select(0, keep)
        self._reorder_layers(order)

    def _reorder_layers(self, order: Tensor):
        pass

    def _kept_sentences(self, sentences: int, order: Tensor) -> Optional[Tensor]:
        """The old indices of the sentences a beam order keeps, or None when none left the batch (per-sentence
        caches of `sentences` entries stay as they are)."""
        if sentences * self.rows == order.numel():
            return None
        return order.reshape(-1, self.rows)[:, 0] // self.rows


def _sparse_convs(att: SparseQKVAttention) -> Tuple[Tensor, Tensor, int]:
    """The Q, K and V convolutions of a sparse QKV self-attention as one matrix (V's module kernel of 1
    zero-padded to K: the same products), its bias, and K."""
    kq = att.conv_q.weight.size(-1)
    weights = [F.pad(c.weight, ((kq - c.weight.size(-1)) // 2,) * 2) for c in (att.conv_q, att.conv_k, att.conv_v)]
    if any(w.shape != weights[0].shape for w in weights):
        raise ValueError("sparse QKV convolutions of different kernels cannot be stacked")
    bias = torch.cat([att.conv_q.bias, att.conv_k.bias, att.conv_v.bias]).detach()
    return conv_patch_matrix(torch.cat(weights)), bias, kq


class TransformerStepper(Stepper):
    """fairseq's TransformerDecoderLayerBase layers: pre- or post-norm self-attention (Q, K, V as one
    product), cross-attention, FFN (absent in One Wide FFN layers without one; a sparse FFN as its module)."""

    @classmethod
    def layer_reason(cls, i, layer):
        if layer.encoder_attn is None:
            return f"decoder layer {i} has no cross-attention"
        for att in (layer.self_attn, layer.encoder_attn):
            if type(att) is SparseQKVAttention:
                if not att.conv_q.causal:
                    return f"decoder layer {i} sparse QKV attention is not causal"
            elif _attention_reason(att, i):
                return _attention_reason(att, i)
        if (layer.cross_self_attention or layer.c_attn is not None or layer.attn_ln is not None
                or layer.ffn_layernorm is not None or layer.w_resid is not None):
            return f"decoder layer {i} uses head scaling / attention or FFN LayerNorm / residual weights"
        return None

    def __init__(self, model, beam_size, bf16=False):
        super().__init__(model, beam_size, bf16)
        # per layer: fused Q/K/V weights (rebuilt by get() when a weight changes)
        self.qkv = [_fused_qkv(l.self_attn) for l in self.dec.layers]
        # sparse QKV layers: per layer, the last F-1 multiplicative outputs of the self-attention and of
        # the cross-attention's query path (the causal convolutions' state), and the self-attention's
        # Q/K/V convolutions stacked into one
        self.conv_state: List[Dict[str, Tensor]] = []
        self.qkv_conv: List[Optional[Tuple[Tensor, Tensor, int]]] = []

    def _start_layers(self, enc, pad):
        self.cross, self.conv_state, self.qkv_conv = [], [], []
        for layer in self.dec.layers:
            att = layer.encoder_attn
            self.cross.append(self._sparse_cross_cache(att, enc, pad) if type(att) is SparseQKVAttention
                              else self._mha_cross_cache(att, enc, pad))
            self.conv_state.append({})
            att = layer.self_attn
            self.qkv_conv.append(_sparse_convs(att) if type(att) is SparseQKVAttention else None)

    @staticmethod
    def _sparse_cross_cache(att: SparseQKVAttention, enc: Tensor, pad: Optional[Tensor]):
        """Sparse QKV cross-attention keys/values of the encoder output, per sentence (the module's own)."""
        k, v = att.encoder_kv(enc, pad)  # (kv_bsz, H, S, d_h)
        return {"k": k.flatten(0, 1), "v": v.flatten(0, 1), "pad": pad, "heads": att.num_heads}

    def _causal_window(self, i: int, name: str, att: SparseQKVAttention, x: Tensor) -> Tensor:
        """The F multiplicative outputs this step's causal convolutions read, (F, B, modules, M): the F-1
        kept (the module's own window rule) and this step's; keeps the last F-1 for the next step."""
        state = self.conv_state[i]
        window = att._window(state.get(name), att.mult(x).unsqueeze(0))
        if window.size(0) > 1:
            state[name] = window[1:]
        return window

    def _sparse_self_attention(self, i: int, att: SparseQKVAttention, x: Tensor) -> Tensor:
        """Sparse QKV self-attention of one step (§3.2): Q, K, V of the last F multiplicative outputs as one
        convolution, this step's key/value written in place, no output dense layer."""
        bsz, heads, dh, mods = x.size(0), att.num_heads, att.head_dim, att.num_modules
        window = self._causal_window(i, "self", att, x)
        qkv = conv_last_step(window, *self.qkv_conv[i]).view(bsz, mods, 3, att.module_dim)
        q, k, v = (qkv[:, :, j].reshape(bsz, heads, dh) for j in range(3))  # (modules, M) order
        return self._attend_cache(q * att.scaling, k, v, self.caches[i])

    def _sparse_cross_attention(self, i: int, att: SparseQKVAttention, x: Tensor) -> Tensor:
        """Sparse QKV cross-attention of one step: the query through the shared multiplicative layer and
        the causal Q convolution (its own state), over the per-sentence encoder keys/values."""
        window = self._causal_window(i, "cross", att, x)
        q = att.conv_q.last_step(window).reshape(x.size(0), att.embed_dim)
        return self._attend_encoder(q * att.scaling, self.cross[i])

    def _reorder_layers(self, order):
        for state in self.conv_state:
            for name, t in state.items():
                state[name] = t.index_select(1, order)

    def _layer(self, i, layer, x):
        pre = layer.normalize_before
        residual = x
        h = layer.self_attn_layer_norm(x) if pre else x
        if self.qkv_conv[i] is not None:
            x = residual + self._sparse_self_attention(i, layer.self_attn, h)
        else:
            x = residual + self._self_attention(layer.self_attn, self.qkv[i], h, self.caches[i])
        if not pre:
            x = layer.self_attn_layer_norm(x)
        residual = x
        h = layer.encoder_attn_layer_norm(x) if pre else x
        if type(layer.encoder_attn) is SparseQKVAttention:
            x = residual + self._sparse_cross_attention(i, layer.encoder_attn, h)
        else:
            x = residual + self._cross_attention(layer.encoder_attn, h, self.cross[i])
        if not pre:
            x = layer.encoder_attn_layer_norm(x)
        if hasattr(layer, "fc1"):  # One Wide FFN layers may have none
            residual = x
            h = layer.final_layer_norm(x) if pre else x
            x = residual + self._ffn(layer, h)
            if not pre:
                x = layer.final_layer_norm(x)
        return x


class CANStepper(Stepper):
    """Compressed Attention Network layers: per layer x + CAN(LN(x)) (pre-norm) or LN(x + CAN(x)), CAN = Eq. 11
    + 13 through ops.compressed_attention_decode; the ablations' uncompressed sub-layer (fairseq's
    self-attention before it with --can-compress ffn, fairseq's FFN after it with --can-compress attention)
    as the Transformer stepper runs it. The encoder keys/values (values in the FFN-hidden space, or the model
    space without FFN) are stored once per sentence (the op reads a sentence's for each of its beam rows) and
    re-indexed only when finished sentences leave the batch. The decoder's own keys/values (values FFN-wide: the largest cache of any
    stepper) stay where they were written; the op reads them through a row table (kv_cache.write_to_row_cache)
    that beam search reorders instead of the buffers."""

    @classmethod
    def layer_reason(cls, i, layer):
        can = layer.can
        if layer.mode not in ("all", "ffn", "attention"):
            return f"CAN decoder layer {i} compresses '{layer.mode}'"
        if can.ffn and can.activation_name != "relu":
            return f"CAN decoder layer {i} activation {can.activation_name} (the fused step is ReLU's)"
        if layer.mode == "ffn":
            return _attention_reason(layer.fairseq_layer.self_attn, i)
        return None

    def __init__(self, model, beam_size, bf16=False):
        super().__init__(model, beam_size, bf16)
        # --can-compress ffn: fairseq's self-attention Q/K/V as one product; its cache is the layer's entry of
        # self.caches (the CAN sub-layer of these layers has no decoder keys of its own)
        self.qkv = [_fused_qkv(l.fairseq_layer.self_attn) if l.mode == "ffn" else None for l in self.dec.layers]
        # --int8: each CAN module's input projections (q, k, v, X·W1) as one concatenated Int8Linear
        self.x_int8 = [_fuse(l.can._x_modules()) if type(l.can.q_proj) is Int8Linear else None
                       for l in self.dec.layers]

    def _start_layers(self, enc, pad):
        self.enc_kv = []  # per layer: (k (B_s, H, S, dh), v (B_s, H, S, dvh), bias (B_s, S) or None) per sentence
        for layer in self.dec.layers:
            k, v, bias = layer.can._encoder_kv(enc, pad, {}, cache=False)
            # contiguous once here (views of the (S, B_s, ·) projections): the op would copy them every step
            self.enc_kv.append((k.contiguous(), v.contiguous(), bias.view(bias.size(0), -1) if bias is not None else None))

    def _can(self, i: int, can, h: Tensor) -> Tensor:
        b, heads = h.size(0), can.num_heads
        # the module's own decoding projection: q, k, v, X·W1 (those it has) as one product through _linear
        # (few-rows kernel at 3-16 rows, reading its bf16 copy with --bf16; oneDNN-packed at more rows where
        # that is faster), one by one for int8-quantized layers
        mods = can._x_modules()
        if all(type(m) is nn.Linear for m in mods):
            proj = list(self._linear(h, *can._x_weights()).split([m.out_features for m in mods], dim=-1))
        elif self.x_int8[i] is not None:
            proj = list(self.x_int8[i](h).split([m.out_features for m in mods], dim=-1))
        else:
            proj = [p[0] for p in can._x_projections(h.unsqueeze(0))]
        q = (proj.pop(0) * can.scaling).view(b, heads, can.head_dim)
        rows = None  # the decoder's keys/values: buffers beam search leaves in place, read through a row table
        if can.self_attention:
            k_s, v_s, rows, n = write_to_row_cache(self.caches[i], proj.pop(0).view(b, heads, can.head_dim),
                                                   proj.pop(0).view(b, heads, can.value_head_dim), prefix="can_")
        else:  # --can-compress ffn: no decoder keys in this softmax
            k_s, v_s, n = q.new_zeros(b, heads, 0, can.head_dim), q.new_zeros(b, heads, 0, can.value_head_dim), 0
        k_e, v_e, bias = self.enc_kv[i]
        if not can.ffn:  # --can-compress attention: one softmax over both parts, then the output projection
            k_e, v_e, bias = (per_row(t, b) for t in (k_e, v_e, bias))
            return self._module(can.out_proj, _attend_two(q, k_e, v_e, bias, gather_history(k_s, n, rows),
                                                          gather_history(v_s, n, rows)))
        xw1 = proj.pop(0)
        if type(can.fc2) is nn.Linear:  # Eq. 11 + 13 in one call (the csrc kernel when built)
            w2 = self._bf16_copy(can.fc2.weight) if self.bf16 and self.kernel else can.fc2.weight
            return compressed_attention_decode(q, k_e, v_e, bias, k_s, v_s, n, xw1, w2, can.fc2.bias, rows)
        hidden = compressed_attention_hidden_reference(q, k_e, v_e, bias, k_s, v_s, n, xw1, rows)
        return can.fc2(hidden)  # an int8-quantized second FFN layer

    @staticmethod
    def _sublayer(x, norm, pre, fn):
        return x + fn(norm(x)) if pre else norm(x + fn(x))

    def _layer(self, i, layer, x):
        pre, f = layer.normalize_before, layer.fairseq_layer
        if layer.mode == "ffn":  # fairseq's self-attention sub-layer first
            x = self._sublayer(x, f.self_attn_layer_norm, pre,
                               lambda h: self._self_attention(f.self_attn, self.qkv[i], h, self.caches[i]))
        x = self._sublayer(x, layer.can_layer_norm, pre, lambda h: self._can(i, layer.can, h))
        if layer.mode == "attention":  # then fairseq's FFN sub-layer
            x = self._sublayer(x, f.final_layer_norm, pre, lambda h: self._ffn(f, h))
        return x

    def _reorder_layers(self, order):
        keep = self._kept_sentences(self.enc_kv[0][0].size(0), order) if self.enc_kv else None
        if keep is not None:  # sentences left the batch
            self.enc_kv = [tuple(t.index_select(0, keep) if t is not None else None for t in kv)
                           for kv in self.enc_kv]


def _attend_two(q: Tensor, k_e: Tensor, v_e: Tensor, bias: Optional[Tensor], k_s: Tensor, v_s: Tensor) -> Tensor:
    """One query per row (B, H, dh), scaled, over the encoder keys (B, H, S, dh) with their padding bias (B, S)
    and the decoder's own n keys under ONE softmax (CAN's Eq. 11 without the FFN), values summed: (B, H·dv)."""
    b, heads = q.shape[:2]
    q4 = q.unsqueeze(2)  # (B, H, 1, dh): the products CompressedAttention.forward computes, in its shapes
    s_e = torch.matmul(q4, k_e.transpose(2, 3))
    if bias is not None:
        s_e = s_e + bias.view(b, 1, 1, -1)
    logits = torch.cat([s_e, torch.matmul(q4, k_s.transpose(2, 3))], dim=3)
    p_e, p_s = utils.softmax(logits, dim=-1).type_as(logits).split([k_e.size(2), k_s.size(2)], dim=3)
    ctx = torch.matmul(p_e, v_e) + torch.matmul(p_s, v_s)  # (B, H, 1, dv/h)
    return ctx.reshape(b, -1)


class SASStepper(Stepper):
    """Simplified blocks (models/sas.py): shaped self-attention with identity values (first layer:
    W_V = I + W) and no attention skip, the pre-norm cross-attention sub-block, the MLP (SAS: sequential
    with skip β_FF; SAS-P: parallel, no skip)."""

    @classmethod
    def layer_reason(cls, i, layer):
        block = layer.block
        if not block.attn.causal:
            return f"SAS decoder layer {i} attention is not causal"
        if block.encoder_attn is not None:
            return _attention_reason(block.encoder_attn, i)
        return None

    def __init__(self, model, beam_size, bf16=False):
        super().__init__(model, beam_size, bf16)
        parts = [(l.block.attn.q_proj, l.block.attn.k_proj) for l in self.dec.layers]
        self.fused = [_fuse(p) for p in parts]

    def _start_layers(self, enc, pad):
        blocks = [l.block for l in self.dec.layers]
        self.cross = [self._mha_cross_cache(b.encoder_attn, enc, pad) if b.encoder_attn is not None else None
                      for b in blocks]

    def _shaped_attention(self, i: int, att, n_in: Tensor) -> Tensor:
        """The shaped attention of this step's query (at position n-1) over the n cached keys (all allowed:
        causal, no padding among hypotheses): α·v_t + Σ_j (β·p_j − γ/n)·v_j (A = α·I + β·softmax − γ·C)."""
        b, heads, dh = n_in.size(0), att.num_heads, att.head_dim
        values = att.values(n_in)  # identity, or W_V = I + W in the first layer
        fused = self.fused[i]
        if fused is not None:
            q, k = self._fused_linear(fused, n_in).split([att.q_proj.out_features, att.k_proj.out_features], dim=-1)
        else:
            q, k = self._module(att.q_proj, n_in), self._module(att.k_proj, n_in)
        v_t = values.view(b, heads, dh)
        kbuf, vbuf, n = write_to_cache(self.caches[i], k.view(b, heads, dh), v_t)
        keys = kbuf[:, :, :n].reshape(b * heads, n, dh)
        vals = vbuf[:, :, :n].reshape(b * heads, n, dh)
        logits = torch.bmm((q * dh ** -0.5).view(b * heads, 1, dh), keys.transpose(1, 2))
        probs = torch.softmax(logits.float(), dim=-1).to(q.dtype).view(b, heads, n)
        weights = att.beta.view(1, heads, 1) * probs - (att.gamma / n).view(1, heads, 1)
        ctx = torch.bmm(weights.view(b * heads, 1, n), vals).view(b, heads, dh)
        return (att.alpha.view(1, heads, 1) * v_t + ctx).reshape(b, heads * dh)  # identity W_O

    def _mlp(self, block, x: Tensor) -> Tensor:
        return self._module(block.fc2, F.relu(self._module(block.fc1, x)))

    def _layer(self, i, layer, x):
        block = layer.block
        n_in = block.attn_norm(x) if block.attn_norm is not None else x
        h = self._shaped_attention(i, block.attn, n_in)  # no attention skip
        if block.parallel:
            return h + block.beta_ff * self._mlp(block, n_in)
        if block.encoder_attn is not None:
            h = h + self._cross_attention(block.encoder_attn, block.encoder_attn_norm(h), self.cross[i])
        m = block.mlp_norm(h) if block.mlp_norm is not None else h
        return h + block.beta_ff * self._mlp(block, m)


LAYER_STEPPERS = ((TransformerDecoderLayerBase, TransformerStepper), (CANDecoderLayer, CANStepper),
                  (SASDecoderLayer, SASStepper))


def stepper_for(models) -> Tuple[Optional[Type[Stepper]], Optional[str]]:
    """(the Stepper class serving these models, None) or (None, why none does: one line)."""
    if len(models) != 1:
        return None, "ensembles of several models"
    model = models[0]
    dec = getattr(model, "decoder", None)
    if isinstance(dec, TerraformerDecoder) and hasattr(model, "encoder"):
        from .terraformer_stepper import TerraformerStepper  # (it builds on Stepper, defined here)

        reason = TerraformerStepper.model_reason(model)
        return (TerraformerStepper, None) if reason is None else (None, reason)
    if not isinstance(dec, TransformerDecoderBase) or not hasattr(model, "encoder"):
        return None, f"decoder {type(dec).__name__} (only encoder-decoders with fairseq Transformer decoders)"
    if dec.adaptive_softmax is not None or dec.cross_self_attention or dec.quant_noise is not None:
        return None, "adaptive softmax / cross-self-attention / quant noise"
    kinds = []
    for i, layer in enumerate(dec.layers):
        kind = next((cls for base, cls in LAYER_STEPPERS if isinstance(layer, base)), None)
        if kind is None:
            return None, f"decoder layer {i} is {type(layer).__name__}"
        kinds.append(kind)
    if len(set(kinds)) > 1:
        return None, "decoder layers of several kinds"
    cls = kinds[0] if kinds else TransformerStepper
    for i, layer in enumerate(dec.layers):
        reason = cls.layer_reason(i, layer)
        if reason:
            return None, reason
    return cls, None
