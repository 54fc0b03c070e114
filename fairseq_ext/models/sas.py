"""Simplified Transformer blocks (He & Hofmann 2024): `sas_block` for translation and the paper's own
language-model setting (`sas_lm`, `sas_p_lm`, `sas_p_nonorm_lm`, baseline `preln_lm`).

Blocks (fairseq_ext/modules/shaped_attention.py): shaped attention with identity values/projection and
no attention skip; SAS = sequential with the MLP skip scaled by β_FF, SAS-P = parallel with no skip.
Per side, --sas-encoder-block / --sas-decoder-block {sas,sas_p,preln} (preln: the Pre-LN Transformer layer and
final LayerNorm of the baseline, to put simplified blocks on one side only); --sas-no-norm keeps RMSNorm only in the
first layer (and the final norm); the first layer's values are W_V = I + W (W zero-initialised), as in
the official code.

Translation (`sas_block`): SAS-P encoder (non-causal shaped attention: C uniform over the non-padded
source tokens), SAS decoder with a cross-attention sub-block. The paper has no cross-attention; we keep
fairseq's multi-head cross-attention as a standard pre-norm sub-block with its skip, between the shaped
self-attention and the MLP: the decoder must read the source through learned projections (an identity
value path cannot map encoder states into the decoder's basis), and the skip keeps the decoder's own
stream intact while it learns to attend. Positions, embeddings, output projection: fairseq's.
"""
from fairseq.models.transformer import TransformerConfig, TransformerDecoderBase, TransformerEncoderBase, \
    TransformerModel
from fairseq.models.transformer.transformer_legacy import base_architecture
from fairseq.models.transformer_lm import TransformerLanguageModel, TransformerLanguageModelConfig, \
    base_lm_architecture
from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.modules import MultiheadAttention
from torch import nn

from ..compat import register_model, register_model_architecture
from ..modules.shaped_attention import RMSNorm, SimplifiedBlock
from .common import DIM, Range, tiny_dims

# β_FF is a gain at initialisation (the paper: 0.1 for 18 layers, O(1/sqrt(depth)))
FLAG_RANGES = {"sas_beta_ff_init": Range(low=0.0, high=10.0), "decoder_input_dim": DIM,
               "character_embedding_dim": DIM, "char_embedder_highway_layers": Range(low=0, integer=True),
               "adaptive_input_factor": Range(above=0.0)}

BLOCKS = ("sas", "sas_p", "preln")  # preln: fairseq's pre-norm Transformer layer (the baseline's)
BASELINES = {"sas_block": "transformer", "sas_block_tiny": "transformer_tiny", "sas_lm": "preln_lm",
             "sas_p_lm": "preln_lm", "sas_p_nonorm_lm": "preln_lm"}


def add_sas_args(parser, encoder=True):
    """The family's flags; a decoder-only LM (encoder=False) has no --sas-encoder-block to set."""
    g = parser.add_argument_group("Simplified Transformer blocks (SAS / SAS-P)")
    if encoder:
        g.add_argument("--sas-encoder-block", choices=BLOCKS,
                       help="encoder block (default sas_p; preln: the baseline's Pre-LN layer)")
    g.add_argument("--sas-decoder-block", choices=BLOCKS,
                   help="decoder block (default sas; sas_p only for decoder-only LMs: no cross-attention; "
                        "preln: the baseline's Pre-LN layer)")
    g.add_argument("--sas-no-norm", action="store_true",
                   help="no normalisation except in the first layer and the final norm")
    g.add_argument("--sas-beta-ff-init", type=float, metavar="B", help="initial MLP branch gain β_FF (default 0.1)")


def sas_defaults(args):
    args.sas_encoder_block = getattr(args, "sas_encoder_block", None) or "sas_p"
    args.sas_decoder_block = getattr(args, "sas_decoder_block", None) or "sas"
    args.sas_no_norm = getattr(args, "sas_no_norm", False)
    args.sas_beta_ff_init = getattr(args, "sas_beta_ff_init", None)
    if args.sas_beta_ff_init is None:
        args.sas_beta_ff_init = 0.1
    args.encoder_normalize_before = True  # the final norm of each stack (the blocks carry their own)
    args.decoder_normalize_before = True


def validate_sas_args(args, encoder_decoder):
    if encoder_decoder and args.sas_decoder_block == "sas_p" and not getattr(args, "no_cross_attention", False):
        raise ValueError("--sas-decoder-block sas_p: the parallel block has no cross-attention sub-block; "
                         "use --sas-decoder-block sas for translation (sas_p is for decoder-only LMs)")
    for flag in ("checkpoint_activations", "offload_activations", "cross_self_attention",
                 "layernorm_embedding", "adaptive_input", "character_embeddings"):
        if getattr(args, flag, False):
            raise ValueError(f"--{flag.replace('_', '-')} is not supported by the SAS blocks")
    if getattr(args, "activation_fn", "relu") != "relu":
        raise ValueError(f"SAS blocks use a ReLU MLP (official code): --activation-fn {args.activation_fn} "
                         "is not supported")


def _block(cfg, args, side, index, causal, cross=None):
    kind = getattr(args, f"sas_{side}_block")
    c = getattr(cfg, side)
    return SimplifiedBlock(
        c.embed_dim, c.attention_heads, c.ffn_embed_dim, parallel=(kind == "sas_p"), causal=causal,
        norm=(index == 0 or not args.sas_no_norm), value_matrix=(index == 0), beta_ff_init=args.sas_beta_ff_init,
        dropout=cfg.dropout, attention_dropout=cfg.attention_dropout, activation_dropout=cfg.activation_dropout,
        cross_attention=cross)


def _next_layer_index(stack):
    """Index of the layer a fairseq encoder/decoder is building (its base constructor builds them in
    order, before `self.layers` exists): the first layer has its own norm / value-matrix settings."""
    index = stack.__dict__.get("_sas_built", 0)
    stack.__dict__["_sas_built"] = index + 1
    return index


class SASEncoderLayer(nn.Module):
    """fairseq encoder-layer interface around a non-causal SimplifiedBlock."""

    def __init__(self, block):
        super().__init__()
        self.block = block

    def forward(self, x, encoder_padding_mask=None, attn_mask=None):
        if attn_mask is not None:
            raise NotImplementedError("SAS encoder layers take no attn_mask")
        return self.block(x, key_padding_mask=encoder_padding_mask)[0]

    def upgrade_state_dict_named(self, state_dict, name):
        """fairseq's encoder calls this on every layer (old LayerNorm names): nothing to upgrade here."""


class SASDecoderLayer(nn.Module):
    """fairseq decoder-layer interface around a causal SimplifiedBlock (+ cross-attention)."""

    def __init__(self, block):
        super().__init__()
        self.block = block
        self.need_attn = False

    def forward(self, x, encoder_out=None, encoder_padding_mask=None, incremental_state=None,
                prev_self_attn_state=None, prev_attn_state=None, self_attn_mask=None,
                self_attn_padding_mask=None, need_attn=False, need_head_weights=False):
        if prev_self_attn_state is not None or prev_attn_state is not None:
            raise NotImplementedError("SAS decoder layers do not take prev_*_attn_state")
        # self_attn_mask (fairseq's future mask) is implied: the shaped attention is causal itself
        x, attn = self.block(x, key_padding_mask=self_attn_padding_mask, incremental_state=incremental_state,
                             encoder_out=encoder_out, encoder_padding_mask=encoder_padding_mask,
                             need_attn=need_attn or (not self.training and self.need_attn),
                             need_head_weights=need_head_weights)
        return x, attn, None

    def make_generation_fast_(self, need_attn=False, **kwargs):
        self.need_attn = need_attn


class SASEncoder(TransformerEncoderBase):
    def __init__(self, args, dictionary, embed_tokens):
        self.args = args
        super().__init__(TransformerConfig.from_namespace(args), dictionary, embed_tokens)
        if self.layer_norm is not None and args.sas_encoder_block != "preln":
            self.layer_norm = RMSNorm(embed_tokens.embedding_dim)

    def build_encoder_layer(self, cfg):
        if self.args.sas_encoder_block == "preln":
            return super().build_encoder_layer(cfg)
        index = _next_layer_index(self)
        return SASEncoderLayer(_block(cfg, self.args, "encoder", index, causal=False))


class SASDecoder(TransformerDecoderBase):
    def __init__(self, args, dictionary, embed_tokens, no_encoder_attn=False):
        self.args = args
        super().__init__(TransformerConfig.from_namespace(args), dictionary, embed_tokens,
                         no_encoder_attn=no_encoder_attn)
        if self.layer_norm is not None and args.sas_decoder_block != "preln":
            self.layer_norm = RMSNorm(self.output_embed_dim)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        if self.args.sas_decoder_block == "preln":
            return super().build_decoder_layer(cfg, no_encoder_attn)
        index = _next_layer_index(self)
        cross = None
        if not no_encoder_attn:
            cross = MultiheadAttention(cfg.decoder.embed_dim, cfg.decoder.attention_heads,
                                       kdim=cfg.encoder.embed_dim, vdim=cfg.encoder.embed_dim,
                                       dropout=cfg.attention_dropout, encoder_decoder_attention=True)
        return SASDecoderLayer(_block(cfg, self.args, "decoder", index, causal=True, cross=cross))


@register_model("sas_block")
class SASTransformerModel(TransformerModel):
    """Encoder-decoder translation model with simplified blocks (see module docstring)."""

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        add_sas_args(parser)

    @classmethod
    def build_model(cls, args, task):
        sas_defaults(args)
        validate_sas_args(args, encoder_decoder=True)
        return super().build_model(args, task)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return SASEncoder(args, src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        return SASDecoder(args, tgt_dict, embed_tokens, no_encoder_attn=getattr(args, "no_cross_attention", False))


@register_model("sas_lm")
class SASLanguageModel(TransformerLanguageModel):
    """Decoder-only language model with SAS / SAS-P blocks (`fairseq-train --task language_modeling`)."""

    @classmethod
    def add_args(cls, parser):
        # no defaults from the dataclass, so that the arch functions set them (as fairseq does)
        gen_parser_from_dataclass(parser, TransformerLanguageModelConfig(), delete_default=True)
        add_sas_args(parser, encoder=False)

    @classmethod
    def build_model(cls, args, task):
        sas_defaults(args)
        validate_sas_args(args, encoder_decoder=False)
        if getattr(args, "max_target_positions", None) is None:
            args.max_target_positions = getattr(args, "tokens_per_sample", 1024)
        embed_tokens = cls.build_embedding(args, task.source_dictionary, args.decoder_input_dim)
        return cls(SASDecoder(args, task.target_dictionary, embed_tokens, no_encoder_attn=True))


# ---- translation archs ----

@register_model_architecture("sas_block", "sas_block")
def sas_block(args):
    """Transformer Base dims (6/6, 512 / 2048 / 8 heads): SAS-P encoder, SAS decoder + cross-attention."""
    args.share_all_embeddings = getattr(args, "share_all_embeddings", True)
    sas_defaults(args)
    base_architecture(args)


@register_model_architecture("sas_block", "sas_block_tiny")
def sas_block_tiny(args):
    """Test size: d=64, 4 heads, MLP 128, 2/2 layers."""
    tiny_dims(args, ffn_dim=128, encoder_layers=2, decoder_layers=2)
    sas_block(args)


@register_model_architecture("sas_block", "sas_block_preln_decoder_tiny")
def sas_block_preln_decoder_tiny(args):
    """Test size of SAS-P encoder blocks under the baseline's Pre-LN decoder (SAS on one side only)."""
    args.sas_decoder_block = getattr(args, "sas_decoder_block", None) or "preln"
    sas_block_tiny(args)


@register_model_architecture("sas_block", "sas_block_nonorm_tiny")
def sas_block_nonorm_tiny(args):
    """Test size of the no-normalisation variant, SAS encoder blocks, 3/2 layers."""
    args.sas_no_norm = getattr(args, "sas_no_norm", True)
    args.sas_encoder_block = getattr(args, "sas_encoder_block", "sas")
    args.encoder_layers = getattr(args, "encoder_layers", 3)
    sas_block_tiny(args)


# ---- language-model archs (paper setting: 18 layers, width 768, MLP 3072, context 128) ----

def _paper_lm(args):
    args.decoder_layers = getattr(args, "decoder_layers", 18)
    args.decoder_embed_dim = getattr(args, "decoder_embed_dim", 768)
    args.decoder_ffn_embed_dim = getattr(args, "decoder_ffn_embed_dim", 3072)
    args.decoder_attention_heads = getattr(args, "decoder_attention_heads", 12)
    args.dropout = getattr(args, "dropout", 0.0)  # pre-training without dropout (rebuttal)
    args.share_decoder_input_output_embed = getattr(args, "share_decoder_input_output_embed", True)
    args.decoder_normalize_before = True


def _tiny_lm(args):
    args.decoder_layers = getattr(args, "decoder_layers", 3)
    args.decoder_embed_dim = getattr(args, "decoder_embed_dim", 64)
    args.decoder_ffn_embed_dim = getattr(args, "decoder_ffn_embed_dim", 256)
    args.decoder_attention_heads = getattr(args, "decoder_attention_heads", 4)


def _sas_lm(args, block, no_norm=False):
    args.sas_decoder_block = getattr(args, "sas_decoder_block", None) or block
    args.sas_no_norm = getattr(args, "sas_no_norm", False) or no_norm
    _paper_lm(args)
    base_lm_architecture(args)
    sas_defaults(args)


@register_model_architecture("sas_lm", "sas_lm")
def sas_lm(args):
    """Paper LM with SAS blocks (sequential, MLP skip scaled by β_FF)."""
    _sas_lm(args, "sas")


@register_model_architecture("sas_lm", "sas_p_lm")
def sas_p_lm(args):
    """Paper LM with SAS-P blocks (parallel, no skips)."""
    _sas_lm(args, "sas_p")


@register_model_architecture("sas_lm", "sas_p_nonorm_lm")
def sas_p_nonorm_lm(args):
    """SAS-P without normalisation (norm only in the first layer and the final norm)."""
    _sas_lm(args, "sas_p", no_norm=True)


@register_model_architecture("transformer_lm", "preln_lm")
def preln_lm(args):
    """The Pre-LN baseline at the paper's sizes (fairseq's transformer_lm, pre-norm)."""
    _paper_lm(args)
    base_lm_architecture(args)


@register_model_architecture("sas_lm", "sas_lm_tiny")
def sas_lm_tiny(args):
    _tiny_lm(args)
    sas_lm(args)


@register_model_architecture("sas_lm", "sas_p_lm_tiny")
def sas_p_lm_tiny(args):
    _tiny_lm(args)
    sas_p_lm(args)


@register_model_architecture("sas_lm", "sas_p_nonorm_lm_tiny")
def sas_p_nonorm_lm_tiny(args):
    _tiny_lm(args)
    sas_p_nonorm_lm(args)


@register_model_architecture("transformer_lm", "preln_lm_tiny")
def preln_lm_tiny(args):
    _tiny_lm(args)
    preln_lm(args)


BAD_FLAGS = [
    ("sas_block_tiny", ["--sas-decoder-block", "sas_p"], "the parallel block has no cross-attention"),
    ("sas_block_tiny", ["--activation-fn", "gelu"], "SAS blocks use a ReLU MLP"),
    ("sas_block_tiny", ["--sas-beta-ff-init", "-1"], "--sas-beta-ff-init -1.0 (given, or set by --arch sas_block_tiny): must be a finite number >= 0.0"),
]
