"""Compressed Attention Network (Li et al. 2021): a decoder layer with ONE sub-layer doing
self-attention, cross-attention and the FFN at once (fairseq_ext/modules/compressed_attention.py).

Encoder: fairseq's Transformer encoder, with every One Wide FFN encoder option (--encoder-ffn-sharing,
--encoder-shared-ffn-dim, --share-encoder-self-attn, ...), so e.g. a One Wide FFN encoder can feed a CAN
decoder. Decoder layer, by --can-compress (paper Table 5):
  all        x + Dropout(CAN(LN(x)))                                  (Eq. 11 + 13; the paper's CAN)
  attention  compressed self+cross attention (shared query, one softmax, values width d, output
             projection), then fairseq's FFN sub-layer
  ffn        fairseq's self-attention sub-layer, then cross-attention folded into the FFN
             (Eq. 13 with the encoder part only)
Pre-norm or post-norm by --decoder-normalize-before; final decoder LayerNorm in pre-norm (fairseq's).
--can-value-dim sets d_v (default: --decoder-ffn-embed-dim; the paper's 2048 for base).
"""
from typing import Dict, List, Optional

from fairseq.models.transformer import TransformerConfig, TransformerDecoderBase
from fairseq.models.transformer.transformer_legacy import base_architecture, transformer_wmt_en_de_big
from fairseq.modules import LayerNorm
from fairseq.modules.fairseq_dropout import FairseqDropout
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase
from torch import Tensor, nn

from ..compat import register_model, register_model_architecture
from ..modules.compressed_attention import CompressedAttention
from .common import DIM, deep_shallow_prenorm, tiny_dims
from .one_wide_ffn import FLAG_RANGES as OWF_RANGES
from .one_wide_ffn import OneWideFFNModel, apply_sharing, one_wide_ffn_defaults, validate_args

FLAG_RANGES = {**OWF_RANGES, "can_value_dim": DIM}

COMPRESS_MODES = ("all", "attention", "ffn")
BASELINES = {"can_decoder": "transformer_balanced", "can_decoder_big": "transformer_balanced_big",
             "can_decoder_tiny": "transformer_balanced_tiny"}


class CANDecoderLayer(nn.Module):
    """One CAN decoder layer (see module docstring for the three --can-compress layouts)."""

    def __init__(self, cfg, args):
        super().__init__()
        d, heads = cfg.decoder.embed_dim, cfg.decoder.attention_heads
        self.mode = args.can_compress
        self.normalize_before = cfg.decoder.normalize_before
        self.dropout_module = FairseqDropout(cfg.dropout, module_name=self.__class__.__name__)
        self.need_attn = False
        common = dict(encoder_dim=cfg.encoder.embed_dim, attention_dropout=cfg.attention_dropout,
                      activation_dropout=cfg.activation_dropout, activation_fn=cfg.activation_fn)
        self.fairseq_layer = None
        if self.mode == "all":
            self.can = CompressedAttention(d, heads, args.can_value_dim, **common)
        elif self.mode == "attention":
            self.can = CompressedAttention(d, heads, d, ffn=False, **common)
        else:
            self.can = CompressedAttention(d, heads, args.can_value_dim, self_attention=False, **common)
        self.can_layer_norm = LayerNorm(d)
        if self.mode != "all":
            # the uncompressed sub-layer comes from fairseq's own decoder layer (FFN, or self-attention)
            self.fairseq_layer = TransformerDecoderLayerBase(cfg, no_encoder_attn=True)
            if self.mode == "attention":
                del self.fairseq_layer.self_attn, self.fairseq_layer.self_attn_layer_norm
            else:
                del self.fairseq_layer.fc1, self.fairseq_layer.fc2, self.fairseq_layer.final_layer_norm

    def make_generation_fast_(self, need_attn: bool = False, **kwargs):
        self.need_attn = need_attn  # fairseq's prepare_for_inference_: --print-alignment

    def _sublayer(self, x, norm, fn):
        residual = x
        if self.normalize_before:
            x = norm(x)
        x = residual + self.dropout_module(fn(x))
        return x if self.normalize_before else norm(x)

    def forward(self, x, encoder_out: Optional[Tensor] = None, encoder_padding_mask: Optional[Tensor] = None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                prev_self_attn_state: Optional[List[Tensor]] = None, prev_attn_state: Optional[List[Tensor]] = None,
                self_attn_mask: Optional[Tensor] = None, self_attn_padding_mask: Optional[Tensor] = None,
                need_attn: bool = False, need_head_weights: bool = False):
        if prev_self_attn_state is not None or prev_attn_state is not None:
            raise NotImplementedError("CAN layers do not take prev_*_attn_state (ONNX export path)")
        f = self.fairseq_layer
        if self.mode == "ffn":  # fairseq's self-attention sub-layer first
            x = self._sublayer(x, f.self_attn_layer_norm, lambda h: f.self_attn(
                query=h, key=h, value=h, key_padding_mask=self_attn_padding_mask, incremental_state=incremental_state,
                need_weights=False, attn_mask=self_attn_mask)[0])
        attn: List[Optional[Tensor]] = [None]

        def can(h):
            out, attn[0] = self.can(h, encoder_out, encoder_padding_mask, self_attn_mask=self_attn_mask,
                                    self_padding_mask=self_attn_padding_mask, incremental_state=incremental_state,
                                    need_weights=True)
            return out

        # source attention where fairseq asks for it at this layer: full-sequence passes, and decoding steps
        # when generation was prepared with --print-alignment (make_generation_fast_); other decoding steps
        # skip it and keep the one-token kernel
        need = (need_attn or need_head_weights) and (incremental_state is None or self.need_attn)
        x = self._sublayer(x, self.can_layer_norm, can if need else lambda h: self.can(
            h, encoder_out, encoder_padding_mask, self_attn_mask=self_attn_mask,
            self_padding_mask=self_attn_padding_mask, incremental_state=incremental_state))
        if self.mode == "attention":  # then fairseq's FFN sub-layer
            x = self._sublayer(x, f.final_layer_norm, lambda h: f.fc2(
                f.activation_dropout_module(f.activation_fn(f.fc1(h)))))
        weights = attn[0]
        if weights is not None and not need_head_weights:
            weights = weights.mean(dim=0)
        return x, weights, None


class CANDecoder(TransformerDecoderBase):
    """fairseq's Transformer decoder (embeddings, positions, final norm, output projection, incremental
    decoding plumbing) with CAN layers."""

    def __init__(self, cfg, args, dictionary, embed_tokens):
        self.can_args = args  # read by build_decoder_layer during the base constructor
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=False)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return CANDecoderLayer(cfg, self.can_args)


@register_model("can")
class CANModel(OneWideFFNModel):
    """Deep encoder (any One Wide FFN encoder option) + CAN decoder."""

    # One Wide FFN decoder options: a CAN layer has no separate decoder FFN or attention to share
    REFUSED_FLAGS = ("decoder_ffn_sharing", "decoder_num_shared_ffns", "decoder_shared_ffn_dim",
                     "share_decoder_self_attn", "share_decoder_cross_attn")

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        g = parser.add_argument_group("Compressed Attention Network")
        g.add_argument("--can-compress", choices=COMPRESS_MODES,
                       help="what the decoder layer compresses (Table 5): all (default), attention, ffn")
        g.add_argument("--can-value-dim", type=int, metavar="D",
                       help="value width d_v in FFN-hidden space (default: --decoder-ffn-embed-dim)")

    @classmethod
    def build_model(cls, args, task):
        can_defaults(args)
        for flag in cls.REFUSED_FLAGS:
            if getattr(args, flag) not in (None, False, "independent"):
                raise ValueError(f"--{flag.replace('_', '-')}: CAN decoder layers have no separate FFN or attention "
                                 "to share (the encoder options --encoder-ffn-sharing etc. apply)")
        heads = args.decoder_attention_heads
        if args.can_value_dim % heads or args.decoder_embed_dim % heads:
            raise ValueError(f"--can-value-dim {args.can_value_dim} and --decoder-embed-dim {args.decoder_embed_dim} "
                             f"must be divisible by --decoder-attention-heads {heads}")
        if getattr(args, "cross_self_attention", False) or getattr(args, "no_cross_attention", False):
            raise ValueError("--cross-self-attention / --no-cross-attention do not apply to CAN decoders")
        plans = validate_args(args)
        model = super(OneWideFFNModel, cls).build_model(args, task)  # fairseq's TransformerModel.build_model
        apply_sharing(model, args, {"encoder": plans["encoder"], "decoder": []})
        return model

    def decode_bytes_per_step(self, bsz, beam, src_len, tgt_len):
        """Roofline bytes of one decoding step (benchmarks/decode_speed.py): distinct decoder weights,
        the caches (keys of width d, values of width d_v; encoder and decoder side), and the encoder's
        weights amortised over the steps with the projections of the encoder output (computed once per
        sentence: the encoder keys/values)."""
        from ..tools.params import decode_weight_split

        dec_params, enc_only = decode_weight_split(self)
        rows, d = bsz * beam, self.decoder.embed_dim
        kv = 0
        for layer in self.decoder.layers:
            can = layer.can
            width = d + can.value_dim
            kv += rows * width * ((src_len if can.encoder_attention else 0)
                                  + ((tgt_len + 2) / 2 if can.self_attention else 0))
            if layer.mode == "ffn":  # fairseq's self-attention cache
                kv += rows * 2 * d * (tgt_len + 2) / 2
        return 4 * (sum(dec_params.values()) + kv + enc_only / (tgt_len + 1))

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        return CANDecoder(TransformerConfig.from_namespace(args), args, tgt_dict, embed_tokens)


def can_defaults(args):
    one_wide_ffn_defaults(args)
    args.can_compress = getattr(args, "can_compress", None) or "all"
    if getattr(args, "can_value_dim", None) is None:  # (0 is an error, not "unset")
        args.can_value_dim = getattr(args, "decoder_ffn_embed_dim", 2048)


@register_model_architecture("can", "can_decoder")
def can_decoder(args):
    """The paper's CAN: 12 encoder / 2 CAN decoder layers, base dims, pre-norm, d_v = 2048, dropout 0.1,
    shared embeddings (joined dictionary, as the paper's WMT setup and every arch here)."""
    args.share_all_embeddings = getattr(args, "share_all_embeddings", True)
    deep_shallow_prenorm(args)
    base_architecture(args)
    can_defaults(args)


@register_model_architecture("can", "can_decoder_big")
def can_decoder_big(args):
    """CAN at Big dims (1024 / 4096 / 16 heads, d_v = 4096), 12 / 2 layers, pre-norm, shared embeddings."""
    args.share_all_embeddings = getattr(args, "share_all_embeddings", True)
    deep_shallow_prenorm(args)
    transformer_wmt_en_de_big(args)
    can_defaults(args)


@register_model_architecture("can", "can_decoder_tiny")
def can_decoder_tiny(args):
    """Test size: d=64, 4 heads, d_v = 128, 3 encoder / 2 CAN decoder layers, pre-norm."""
    tiny_dims(args, ffn_dim=128, encoder_layers=3, decoder_layers=2)
    can_decoder(args)


@register_model_architecture("can", "can_decoder_attention_tiny")
def can_decoder_attention_tiny(args):
    """Test size of the 'compress attention' ablation, post-norm."""
    args.can_compress = getattr(args, "can_compress", "attention")
    args.decoder_normalize_before = getattr(args, "decoder_normalize_before", False)
    can_decoder_tiny(args)


@register_model_architecture("can", "can_decoder_ffn_tiny")
def can_decoder_ffn_tiny(args):
    """Test size of the 'compress cross-attention + FFN' ablation, on a One Wide FFN encoder
    (shared encoder FFN of width 384): the families compose."""
    args.can_compress = getattr(args, "can_compress", "ffn")
    args.encoder_ffn_sharing = getattr(args, "encoder_ffn_sharing", "shared")
    args.encoder_shared_ffn_dim = getattr(args, "encoder_shared_ffn_dim", 384)
    can_decoder_tiny(args)


BAD_FLAGS = [
    ("can_decoder_tiny", ["--can-value-dim", "130"], "must be divisible by --decoder-attention-heads"),
    ("can_decoder_tiny", ["--decoder-ffn-sharing", "shared"], "CAN decoder layers have no separate FFN"),
    ("can_decoder_tiny", ["--can-value-dim", "-4"], "--can-value-dim -4 (given, or set by --arch can_decoder_tiny): must be an integer >= 1"),
]
