"""Baselines the efficient variants are measured against.

`transformer_balanced*`: the pre-norm 12-encoder / 2-decoder Transformer ("balanced" deep-encoder,
shallow-decoder baseline of the CAN paper, and the deep-shallow setting of One Wide FFN). They are
architectures of fairseq's own `transformer` model: only the defaults differ, so checkpoints, beam
search and incremental decoding are fairseq's. Source/target embeddings and the output projection
are shared (joined dictionary), as in the papers.
"""
from fairseq.models.transformer.transformer_legacy import base_architecture, transformer_wmt_en_de_big

from ..compat import register_model_architecture
from .common import deep_shallow_prenorm, tiny_dims


def _balanced_defaults(args):
    deep_shallow_prenorm(args)
    args.share_all_embeddings = getattr(args, "share_all_embeddings", True)


@register_model_architecture("transformer", "transformer_balanced")
def transformer_balanced(args):
    """Base dims (512 / 2048 / 8 heads), pre-norm, 12 encoder / 2 decoder layers."""
    _balanced_defaults(args)
    base_architecture(args)


@register_model_architecture("transformer", "transformer_balanced_big")
def transformer_balanced_big(args):
    """Big dims (1024 / 4096 / 16 heads, dropout 0.3), pre-norm, 12 encoder / 2 decoder layers."""
    _balanced_defaults(args)
    transformer_wmt_en_de_big(args)


@register_model_architecture("transformer", "transformer_balanced_tiny")
def transformer_balanced_tiny(args):
    """Test / quick-start size: d=64, FFN 256, 4 heads, 3 encoder / 1 decoder layers, pre-norm."""
    tiny_dims(args, ffn_dim=256, encoder_layers=3, decoder_layers=1)
    transformer_balanced(args)


# Bad flags the shared test matrix checks (arch, flags, text the build-time error must contain).
BAD_FLAGS = [
    ("transformer_balanced_tiny", ["--encoder-attention-heads", "5"], "must be divisible by --encoder-attention-heads 5"),
]
