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


class Range:
    """The valid values of a numeric model flag: an interval (bounds inclusive unless `above`/`below`),
    integers only if `integer`, plus `special` values with a documented meaning outside it (e.g. 0 = off).
    NaN and infinities are never valid."""

    def __init__(self, low=None, high=None, above=None, below=None, integer=False, special=None, odd=False,
                 hint=None):
        self.low, self.high, self.above, self.below = low, high, above, below
        self.integer, self.special, self.odd, self.hint = integer, dict(special or {}), odd, hint

    def describe(self):
        parts = []
        if self.low is not None:
            parts.append(f">= {self.low}")
        if self.above is not None:
            parts.append(f"> {self.above}")
        if self.high is not None:
            parts.append(f"<= {self.high}")
        if self.below is not None:
            parts.append(f"< {self.below}")
        text = ("an odd integer " if self.odd else "an integer " if self.integer else "a finite number ") + " and ".join(parts)
        for value, meaning in self.special.items():
            text += f", or {value} ({meaning})"
        return text + (f"; {self.hint}" if self.hint else "")

    def valid(self, v):
        import math

        if v in self.special:
            return True
        if isinstance(v, float) and not math.isfinite(v):
            return False
        return ((self.low is None or v >= self.low) and (self.high is None or v <= self.high)
                and (self.above is None or v > self.above) and (self.below is None or v < self.below)
                and (not self.odd or int(v) % 2 == 1))


# fairseq's Transformer flags every family takes: checked for every arch of this package
DIM = Range(low=1, integer=True)
RATE = Range(low=0.0, below=1.0)
COMMON_RANGES = {
    "encoder_layers": DIM, "decoder_layers": DIM, "encoder_embed_dim": DIM, "decoder_embed_dim": DIM,
    "encoder_ffn_embed_dim": DIM, "decoder_ffn_embed_dim": DIM, "encoder_attention_heads": DIM,
    "decoder_attention_heads": DIM, "dropout": RATE, "attention_dropout": RATE, "activation_dropout": RATE,
}


def check_flags(args, ranges, arch=None):
    """Build-time check of numeric flags: every flag of `ranges` (and COMMON_RANGES) that is set must be in its
    Range; heads must divide their embedding width. Errors name the flag, the value (given, or set by the
    arch) and the valid values."""
    arch = arch or getattr(args, "arch", "?")
    for name, rng in {**COMMON_RANGES, **ranges}.items():
        value = getattr(args, name, None)
        if value is None or isinstance(value, bool):
            continue
        if not rng.valid(value):
            raise ValueError(f"--{name.replace('_', '-')} {value} (given, or set by --arch {arch}): must be "
                             f"{rng.describe()}")
    for side in ("encoder", "decoder"):
        d, heads = getattr(args, f"{side}_embed_dim", None), getattr(args, f"{side}_attention_heads", None)
        if d and heads and d % heads:
            raise ValueError(f"--{side}-embed-dim {d} must be divisible by --{side}-attention-heads {heads} "
                             f"(each head takes d / heads dimensions)")
