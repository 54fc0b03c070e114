"""Arch-default helpers shared by the model families (not a family: registers nothing)."""


def tiny_dims(args, ffn_dim, encoder_layers, decoder_layers, embed_dim=64, heads=4):
    """The *_tiny test sizes: d=64, 4 heads; every value stays overridable from the command line."""
    args.encoder_embed_dim = getattr(args, "encoder_embed_dim", embed_dim)
    args.encoder_ffn_embed_dim = getattr(args, "encoder_ffn_embed_dim", ffn_dim)
    args.encoder_attention_heads = getattr(args, "encoder_attention_heads", heads)
    args.decoder_embed_dim = getattr(args, "decoder_embed_dim", args.encoder_embed_dim)
    args.decoder_ffn_embed_dim = getattr(args, "decoder_ffn_embed_dim", args.encoder_ffn_embed_dim)
    args.decoder_attention_heads = getattr(args, "decoder_attention_heads", args.encoder_attention_heads)
    args.encoder_layers = getattr(args, "encoder_layers", encoder_layers)
    args.decoder_layers = getattr(args, "decoder_layers", decoder_layers)


def deep_shallow_prenorm(args):
    """The balanced layout of CAN / Kasai et al.: 12 encoder / 2 decoder layers, pre-norm (overridable)."""
    args.encoder_layers = getattr(args, "encoder_layers", 12)
    args.decoder_layers = getattr(args, "decoder_layers", 2)
    args.encoder_normalize_before = getattr(args, "encoder_normalize_before", True)
    args.decoder_normalize_before = getattr(args, "decoder_normalize_before", True)
