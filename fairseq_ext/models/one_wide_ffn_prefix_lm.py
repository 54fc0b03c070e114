"""Decoder-only (prefix-LM) translation model of One Wide FFN §3, with its shared / wide FFN variants.

All layers form one stack over [source; target] (fairseq_ext/modules/prefix_lm.py): bidirectional
over the source, causal over the target. For fairseq's tools it is an encoder-decoder model whose
"encoder" is the source pass over the same layers (run once per sentence, its per-layer attention
inputs cached for the target), so fairseq-train / fairseq-generate / beam search work unchanged.
Only the decoder FFN options apply (the paper defines SharedDec and NoDec for decoder-only models):
--decoder-ffn-sharing, --decoder-num-shared-ffns, --decoder-shared-ffn-dim, --share-decoder-self-attn.
Positions restart at the target (sinusoidal, per segment): the paper does not specify this.
"""
import math
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F
from fairseq.models import FairseqEncoder, FairseqEncoderDecoderModel, FairseqIncrementalDecoder
from fairseq.models.transformer.transformer_legacy import base_architecture, transformer_wmt_en_de_big
from fairseq.modules import PositionalEmbedding
from fairseq.modules.fairseq_dropout import FairseqDropout
from fairseq.modules.quant_noise import quant_noise
from fairseq.models.transformer import Embedding
from torch import Tensor, nn

from ..compat import register_model, register_model_architecture
from ..modules.feedforward import ffn_sharing_plan
from ..modules.prefix_lm import PrefixLMLayer
from .common import Range
from .one_wide_ffn import FLAG_RANGES as OWF_RANGES
from .one_wide_ffn import OneWideFFNModel, _tie_attention, one_wide_ffn_defaults

FLAG_RANGES = {**OWF_RANGES, "encoder_layers": Range(low=1, integer=True, special={0: "decoder-only (this family's own)"})}

BASELINES = {
    "one_wide_ffn_prefix_lm_big": "one_wide_ffn_prefix_lm_vanilla_big",
    "one_wide_ffn_prefix_lm_tiny": "one_wide_ffn_prefix_lm_vanilla_tiny",
}


class PrefixLMDecoder(FairseqIncrementalDecoder):
    """The layer stack, embeddings and output projection (tied to the embeddings)."""

    def __init__(self, args, dictionary, embed_tokens):
        super().__init__(dictionary)
        d = args.decoder_embed_dim
        self.embed_dim = d
        self.embed_tokens = embed_tokens
        self.padding_idx = embed_tokens.padding_idx
        self.embed_scale = 1.0 if args.no_scale_embedding else math.sqrt(d)
        self.max_target_positions = args.max_target_positions
        self.embed_positions = PositionalEmbedding(
            max(args.max_source_positions, args.max_target_positions), d, self.padding_idx,
            learned=args.decoder_learned_pos)
        self.dropout_module = FairseqDropout(args.dropout, module_name=self.__class__.__name__)
        plan = ffn_sharing_plan(args.decoder_layers, args.decoder_ffn_sharing, args.decoder_num_shared_ffns,
                                flag="--decoder-ffn-sharing", num_flag="--decoder-num-shared-ffns")
        width = args.decoder_shared_ffn_dim or args.decoder_ffn_embed_dim
        pool = {}
        self.layers = nn.ModuleList()
        for m in plan:
            if m is not None and m not in pool:
                pool[m] = (quant_noise(nn.Linear(d, width), args.quant_noise_pq, args.quant_noise_pq_block_size),
                           quant_noise(nn.Linear(width, d), args.quant_noise_pq, args.quant_noise_pq_block_size))
            fc1, fc2 = pool[m] if m is not None else (None, None)
            self.layers.append(PrefixLMLayer(
                d, args.decoder_attention_heads, fc1, fc2, args.decoder_normalize_before, dropout=args.dropout,
                attention_dropout=args.attention_dropout, activation_dropout=args.activation_dropout,
                activation_fn=args.activation_fn))
        _tie_attention(self.layers, "self_attn", args.share_decoder_self_attn)
        self.layer_norm = nn.LayerNorm(d) if args.decoder_normalize_before else None

    def embed(self, tokens, incremental_state=None):
        positions = self.embed_positions(tokens, incremental_state=incremental_state)
        if incremental_state is not None:
            tokens, positions = tokens[:, -1:], positions[:, -1:]
        x = self.embed_scale * self.embed_tokens(tokens) + positions
        return self.dropout_module(x).transpose(0, 1), tokens.eq(self.padding_idx)  # (T, B, C), (B, T)

    def forward(self, prev_output_tokens, encoder_out: Optional[Dict[str, List[Tensor]]] = None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                features_only: bool = False, **unused):
        x, extra = self.extract_features(prev_output_tokens, encoder_out, incremental_state)
        return (x if features_only else self.output_layer(x)), extra

    def extract_features(self, prev_output_tokens, encoder_out=None, incremental_state=None, **unused):
        x, padding = self.embed(prev_output_tokens, incremental_state)
        padding = padding if padding.any() else None
        attn_mask = None
        if incremental_state is None:  # causal over the target
            t = x.size(0)
            attn_mask = torch.triu(x.new_full((t, t), float("-inf")), 1)
        prefixes = encoder_out["prefix_states"] if encoder_out is not None else [None] * len(self.layers)
        src_pad = encoder_out["encoder_padding_mask"][0] if encoder_out is not None else None
        for layer, prefix in zip(self.layers, prefixes):
            x = layer(x, padding_mask=padding, attn_mask=attn_mask, prefix=prefix, prefix_padding_mask=src_pad,
                      incremental_state=incremental_state)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        return x.transpose(0, 1), {"attn": [None], "inner_states": None}  # (B, T, C)

    def output_layer(self, features):
        return F.linear(features, self.embed_tokens.weight)

    def max_positions(self):
        return self.max_target_positions


class PrefixLMEncoder(FairseqEncoder):
    """The source pass: the decoder's layers over the source with bidirectional attention. Holds no
    parameters of its own; returns each layer's attention input over the source."""

    def __init__(self, decoder: PrefixLMDecoder, max_source_positions):
        super().__init__(decoder.dictionary)
        object.__setattr__(self, "_decoder", decoder)  # a reference, not a submodule (no duplicate params)
        self.max_source_positions = max_source_positions

    def forward(self, src_tokens, src_lengths=None, **unused):
        dec = self._decoder
        x, padding = dec.embed(src_tokens)
        mask = padding if padding.any() else None
        states = []
        for i, layer in enumerate(dec.layers):
            states.append(layer.attention_input(x))  # (S, B, C)
            if i + 1 < len(dec.layers):  # the last layer's source output is never read
                x = layer(x, padding_mask=mask)
        return {"prefix_states": states, "encoder_padding_mask": [padding], "encoder_out": [],
                "encoder_embedding": [], "encoder_states": [], "src_tokens": [], "src_lengths": []}

    def reorder_encoder_out(self, encoder_out: Dict[str, List[Tensor]], new_order):
        return {"prefix_states": [s.index_select(1, new_order) for s in encoder_out["prefix_states"]],
                "encoder_padding_mask": [encoder_out["encoder_padding_mask"][0].index_select(0, new_order)],
                "encoder_out": [], "encoder_embedding": [], "encoder_states": [], "src_tokens": [], "src_lengths": []}

    def max_positions(self):
        return self.max_source_positions


@register_model("one_wide_ffn_prefix_lm")
class PrefixLMTranslationModel(FairseqEncoderDecoderModel):
    """Decoder-only translation (prefix LM) with One Wide FFN's decoder FFN options."""
    no_alignment = ("is a prefix language model over source and target as one sequence (no "
                    "encoder-decoder attention to read an alignment from)")
    # One Wide FFN's encoder and cross-attention options: a decoder-only model has neither
    REFUSED_FLAGS = ("encoder_ffn_sharing", "encoder_num_shared_ffns", "encoder_shared_ffn_dim",
                     "share_encoder_self_attn", "share_decoder_cross_attn", "shared_ffn_lr_scale")

    @classmethod
    def add_args(cls, parser):
        OneWideFFNModel.add_args(parser)

    @classmethod
    def build_model(cls, args, task):
        one_wide_ffn_defaults(args)
        base_architecture(args)
        if getattr(args, "shared_ffn_lr_scale", None) not in (None, 1):
            raise ValueError("--shared-ffn-lr-scale: not implemented for the prefix LM (models one_wide_ffn, can, "
                             "scaling_sparse have it)")
        for flag in ("encoder_num_shared_ffns", "encoder_shared_ffn_dim", "share_encoder_self_attn",
                     "share_decoder_cross_attn"):
            if getattr(args, flag):
                raise ValueError(f"--{flag.replace('_', '-')}: a decoder-only model has no encoder/cross-attention "
                                 "(only --decoder-ffn-sharing / --decoder-shared-ffn-dim / --share-decoder-self-attn apply)")
        if args.encoder_ffn_sharing != "independent":
            raise ValueError("--encoder-ffn-sharing: a decoder-only model has no encoder (use --decoder-ffn-sharing)")
        if args.decoder_ffn_sharing == "encoder":
            raise ValueError("--decoder-ffn-sharing encoder: a decoder-only model has no encoder FFN")
        if args.decoder_shared_ffn_dim is not None and args.decoder_shared_ffn_dim <= 0:
            raise ValueError(f"--decoder-shared-ffn-dim {args.decoder_shared_ffn_dim}: must be > 0 "
                             "(to drop the FFN use --decoder-ffn-sharing none)")
        if task.source_dictionary != task.target_dictionary:
            raise ValueError("one_wide_ffn_prefix_lm reads source and target with one embedding: "
                             "binarize with fairseq-preprocess --joined-dictionary")
        args.max_source_positions = getattr(args, "max_source_positions", None) or 1024
        args.max_target_positions = getattr(args, "max_target_positions", None) or 1024
        d = task.target_dictionary
        embed = Embedding(len(d), args.decoder_embed_dim, d.pad())
        decoder = PrefixLMDecoder(args, d, embed)
        return cls(PrefixLMEncoder(decoder, args.max_source_positions), decoder)

    def max_positions(self):
        return (self.encoder.max_positions(), self.decoder.max_positions())


def _prefix_lm_defaults(args):
    args.encoder_layers = 0
    args.decoder_layers = getattr(args, "decoder_layers", 12)
    args.decoder_normalize_before = getattr(args, "decoder_normalize_before", False)


@register_model_architecture("one_wide_ffn_prefix_lm", "one_wide_ffn_prefix_lm")
def prefix_lm_base_architecture(args):
    """12-layer prefix LM at Transformer Base dims, vanilla FFNs."""
    _prefix_lm_defaults(args)
    one_wide_ffn_defaults(args)
    base_architecture(args)


@register_model_architecture("one_wide_ffn_prefix_lm", "one_wide_ffn_prefix_lm_vanilla_big")
def prefix_lm_vanilla_big(args):
    """The paper's decoder-only baseline: Transformer Big dims, 12 layers (202M parameters at 50,408 vocab)."""
    args.dropout = getattr(args, "dropout", 0.1)
    _prefix_lm_defaults(args)
    one_wide_ffn_defaults(args)
    transformer_wmt_en_de_big(args)


@register_model_architecture("one_wide_ffn_prefix_lm", "one_wide_ffn_prefix_lm_big")
def prefix_lm_big(args):
    """Decoder-only One Wide FFN: ShareDec with d_ff' = 12 x 4096 = 49,152 (202M at 50,408 vocab)."""
    args.decoder_ffn_sharing = getattr(args, "decoder_ffn_sharing", None) or "shared"
    if args.decoder_ffn_sharing != "independent" and getattr(args, "decoder_shared_ffn_dim", None) is None:
        args.decoder_shared_ffn_dim = 49152
    prefix_lm_vanilla_big(args)


def _tiny(args):
    args.decoder_embed_dim = getattr(args, "decoder_embed_dim", 64)
    args.encoder_embed_dim = args.decoder_embed_dim
    args.decoder_ffn_embed_dim = getattr(args, "decoder_ffn_embed_dim", 128)
    args.decoder_attention_heads = getattr(args, "decoder_attention_heads", 4)
    args.decoder_layers = getattr(args, "decoder_layers", 3)


@register_model_architecture("one_wide_ffn_prefix_lm", "one_wide_ffn_prefix_lm_vanilla_tiny")
def prefix_lm_vanilla_tiny(args):
    """Test size, vanilla FFNs, post-norm: d=64, 3 layers."""
    _tiny(args)
    prefix_lm_base_architecture(args)


@register_model_architecture("one_wide_ffn_prefix_lm", "one_wide_ffn_prefix_lm_tiny")
def prefix_lm_tiny(args):
    """Test size of the decoder-only One Wide FFN: ShareDec, d_ff' = 3 x 128 = 384, pre-norm."""
    _tiny(args)
    args.decoder_ffn_sharing = getattr(args, "decoder_ffn_sharing", None) or "shared"
    if args.decoder_ffn_sharing != "independent" and getattr(args, "decoder_shared_ffn_dim", None) is None:
        args.decoder_shared_ffn_dim = args.decoder_layers * args.decoder_ffn_embed_dim
    args.decoder_normalize_before = getattr(args, "decoder_normalize_before", True)
    prefix_lm_base_architecture(args)


BAD_FLAGS = [
    ("one_wide_ffn_prefix_lm_tiny", ["--encoder-ffn-sharing", "shared"], "a decoder-only model has no encoder"),
    ("one_wide_ffn_prefix_lm_tiny", ["--decoder-ffn-sharing", "cycle_rev", "--decoder-num-shared-ffns", "1"],
     "cycle_rev is defined only for M = N/2"),
    ("one_wide_ffn_prefix_lm_tiny", ["--share-decoder-cross-attn"], "no encoder/cross-attention"),
]
