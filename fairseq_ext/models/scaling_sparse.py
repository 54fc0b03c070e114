"""Scaling Transformers (Jaszczur et al. 2021, §3): sparse FFN, sparse QKV and sparse loss layer on
fairseq's Transformer, with every One Wide FFN placement option (the model subclasses it).

  --sparse-ffn-block-size N   every FFN becomes a top-1-of-N SparseFeedForward (§3.1): d_ff/N units
                              active per token; a shared FFN stays shared, so `--encoder-ffn-sharing
                              shared --encoder-shared-ffn-dim 49152 --decoder-ffn-sharing none` is a
                              "one wide sparse FFN" (arch one_wide_sparse_ffn_big)
  --sparse-qkv-modules S      every attention (encoder self, decoder self, cross) becomes
                              SparseQKVAttention (§3.2): shared multiplicative layer, Q/K/V convolutions,
                              no output dense layer
  --sparse-loss S             the output projection becomes a multiplicative layer (§3.3)
The layers stay fairseq's own (fc1/fc2 and the attention modules are replaced in place), so fairseq's
beam search, incremental decoding, checkpoints and DDP are unchanged. Decoding reads only the chosen
d_ff/N rows of W1 and W2 per token (the csrc kernel, or its PyTorch reference: modules/sparse_feedforward.py).
"""
from fairseq.models.transformer.transformer_legacy import transformer_wmt_en_de_big

from ..compat import register_model, register_model_architecture
from ..modules.multiplicative import SparseOutputProjection, SparseQKVAttention
from ..modules.sparse_feedforward import SparseFeedForward, check_block_size, install_sparse_ffn
from .common import DIM, Range, tiny_dims
from .one_wide_ffn import FLAG_RANGES as OWF_RANGES
from .one_wide_ffn import OneWideFFNModel, _one_wide, one_wide_ffn_base_architecture, one_wide_ffn_defaults

SPARSE_RANGES = {
    "sparse_ffn_block_size": Range(low=2, integer=True, special={0: "a dense FFN"}),
    "sparse_ffn_lowrank": DIM, "sparse_ffn_temperature": Range(low=0.0), "sparse_ffn_quant_prob": Range(low=0.0, high=1.0),
    "sparse_qkv_modules": Range(low=1, integer=True, special={0: "dense attention"}),
    "sparse_qkv_kernel": DIM, "sparse_qkv_module_kernel": Range(low=1, integer=True, odd=True),
    "sparse_loss": Range(low=2, integer=True, special={0: "a dense output layer"}),
}
FLAG_RANGES = {**OWF_RANGES, **SPARSE_RANGES}

BASELINES = {
    "scaling_sparse": "transformer_wmt_en_de_big",
    "scaling_sparse_ff": "transformer_wmt_en_de_big",
    "scaling_sparse_qkv": "transformer_wmt_en_de_big",
    "one_wide_sparse_ffn_big": "one_wide_ffn_big",
    "scaling_sparse_tiny": "transformer_tiny",
}

# d_ff that keeps a Big-dims model with sparse QKV (S = 16 modules, F = 3) at the dense model's
# parameter count (paper §3.2: 4096 -> 6144 for its T5-large-sized decoder); a multiple of N = 64
# (tests/test_scaling_sparse.py checks the match).
BIG_QKV_FFN_DIM = 7040
BIG_FF_QKV_FFN_DIM = 6656  # the same with the sparse FFN's controller (d_lowrank = d_ff/N) counted


QKV_SCOPES = ("all", "decoder-self")


def sparse_defaults(args):
    """Unset Scaling Transformer flags: off (0) or None (= the module's default)."""
    args.sparse_ffn_block_size = getattr(args, "sparse_ffn_block_size", None) or 0
    args.sparse_ffn_lowrank = getattr(args, "sparse_ffn_lowrank", None)
    args.sparse_ffn_temperature = getattr(args, "sparse_ffn_temperature", None)
    args.sparse_ffn_quant_prob = getattr(args, "sparse_ffn_quant_prob", None)
    args.sparse_qkv_modules = getattr(args, "sparse_qkv_modules", None) or 0
    args.sparse_qkv_scope = getattr(args, "sparse_qkv_scope", None)
    args.sparse_qkv_kernel = getattr(args, "sparse_qkv_kernel", None)
    args.sparse_qkv_module_kernel = getattr(args, "sparse_qkv_module_kernel", None)
    args.sparse_loss = getattr(args, "sparse_loss", None) or 0


def scaling_sparse_defaults(args):
    one_wide_ffn_defaults(args)
    sparse_defaults(args)


def _ffn_widths(args):
    """(width, flag) of every kept FFN, per the One Wide FFN placement flags."""
    widths = []
    for side in ("encoder", "decoder"):
        mode = getattr(args, f"{side}_ffn_sharing")
        if mode == "none" or (side == "decoder" and mode == "encoder"):
            continue
        shared = getattr(args, f"{side}_shared_ffn_dim", None)
        if mode != "independent" and shared:
            widths.append((shared, f"--{side}-shared-ffn-dim"))
        else:
            widths.append((getattr(args, f"{side}_ffn_embed_dim"), f"--{side}-ffn-embed-dim"))
    return widths


def validate_sparse_args(args, widths=None, require_sparse=True):
    """Build-time checks of the Scaling Transformer flags (errors name the flags and the fix). `widths`:
    (width, flag) of every FFN (default: per the One Wide FFN placement flags)."""
    n = args.sparse_ffn_block_size  # the ranges of the numeric flags: SPARSE_RANGES, checked with the arch
    if n:
        for width, flag in (widths if widths is not None else _ffn_widths(args)):
            check_block_size(width, n, width_flag=flag)
        if getattr(args, "activation_fn", "relu") != "relu":
            raise ValueError(f"--sparse-ffn-block-size needs --activation-fn relu (the controller's mask "
                             f"multiplies ReLU outputs, §3.1), got '{args.activation_fn}'")
        if getattr(args, "quant_noise_pq", 0):
            raise ValueError("--quant-noise-pq cannot be combined with --sparse-ffn-block-size")
    else:
        for name in ("lowrank", "temperature", "quant_prob"):
            if getattr(args, f"sparse_ffn_{name}") is not None:
                raise ValueError(f"--sparse-ffn-{name.replace('_', '-')} applies to a sparse FFN: "
                                 f"add --sparse-ffn-block-size N")
    s = args.sparse_qkv_modules
    if s:
        for side in ("encoder", "decoder"):
            d = getattr(args, f"{side}_embed_dim")
            if d % s:
                raise ValueError(f"--sparse-qkv-modules {s} must divide --{side}-embed-dim {d} "
                                 f"(modules of M = d/S dims; the paper takes S = the number of heads)")
        if args.encoder_embed_dim != args.decoder_embed_dim:
            raise ValueError("--sparse-qkv-modules needs --encoder-embed-dim == --decoder-embed-dim (the "
                             "cross-attention's multiplicative layer reads both sides)")
        for flag in ("share_encoder_self_attn", "share_decoder_self_attn", "share_decoder_cross_attn",
                     "cross_self_attention"):
            if getattr(args, flag, False):
                raise ValueError(f"--{flag.replace('_', '-')} cannot be combined with --sparse-qkv-modules")
    else:
        for name in ("kernel", "module_kernel", "scope"):
            if getattr(args, f"sparse_qkv_{name}", None) is not None:
                raise ValueError(f"--sparse-qkv-{name.replace('_', '-')} applies to sparse QKV: "
                                 f"add --sparse-qkv-modules S")
    if args.sparse_loss and getattr(args, "adaptive_softmax_cutoff", None):
        raise ValueError("--sparse-loss cannot be combined with --adaptive-softmax-cutoff")
    if require_sparse and not (n or s or args.sparse_loss):
        raise ValueError("scaling_sparse: nothing is sparse; set --sparse-ffn-block-size, --sparse-qkv-modules "
                         "and/or --sparse-loss (or use a dense arch)")


def sparsify(model, args):
    """Replace the FFNs, attentions and output projection in place, per the flags."""
    n = args.sparse_ffn_block_size
    if n:
        ffns = {}  # one SparseFeedForward per distinct FFN (sharing is kept)
        for layer in list(model.encoder.layers) + list(model.decoder.layers):
            if not hasattr(layer, "fc1"):
                continue  # a layer without FFN (--*-ffn-sharing none)
            key = id(layer.fc1)
            if key not in ffns:
                ffns[key] = SparseFeedForward(
                    layer.fc1.in_features, layer.fc1.out_features, n, args.sparse_ffn_lowrank,
                    0.1 if args.sparse_ffn_temperature is None else args.sparse_ffn_temperature,
                    0.3 if args.sparse_ffn_quant_prob is None else args.sparse_ffn_quant_prob)
            install_sparse_ffn(layer, ffns[key])
    s = args.sparse_qkv_modules
    if s:
        f = 3 if args.sparse_qkv_kernel is None else args.sparse_qkv_kernel
        k = 3 if args.sparse_qkv_module_kernel is None else args.sparse_qkv_module_kernel
        common = dict(num_modules=s, length_kernel=f, module_kernel=k, dropout=args.attention_dropout)
        everywhere = (args.sparse_qkv_scope or "all") == "all"  # else decoder-self: trax's placement
        for layer in model.encoder.layers if everywhere else []:
            layer.self_attn = SparseQKVAttention(args.encoder_embed_dim, args.encoder_attention_heads,
                                                 causal=False, **common)
        for layer in model.decoder.layers:
            d, heads = args.decoder_embed_dim, args.decoder_attention_heads
            layer.self_attn = SparseQKVAttention(d, heads, causal=True, **common)
            if everywhere and getattr(layer, "encoder_attn", None) is not None:
                layer.encoder_attn = SparseQKVAttention(d, heads, causal=True, encoder_decoder_attention=True,
                                                        kdim=args.encoder_embed_dim, **common)
    if args.sparse_loss:
        dec = model.decoder
        dec.output_projection = SparseOutputProjection(dec.output_embed_dim, len(dec.dictionary), args.sparse_loss)
        dec.share_input_output_embed = False  # no longer tied to the embeddings


@register_model("scaling_sparse")
class ScalingSparseModel(OneWideFFNModel):
    """fairseq's Transformer with the sparse layers of Scaling Transformers (see module docstring)."""

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        add_sparse_args(parser)

    @classmethod
    def build_model(cls, args, task):
        scaling_sparse_defaults(args)
        validate_sparse_args(args)
        model = super().build_model(args, task)
        sparsify(model, args)
        return model


def add_sparse_args(parser):
    """The Scaling Transformer flags (also the Terraformer's)."""
    g = parser.add_argument_group("Scaling Transformer: sparse FFN, sparse QKV, sparse loss layer")
    g.add_argument("--sparse-ffn-block-size", type=int, metavar="N",
                   help="top-1-of-N sparse FFN: one active unit per block of N (0: dense FFN)")
    g.add_argument("--sparse-ffn-lowrank", type=int, metavar="D",
                   help="controller bottleneck d_lowrank (default: d_ff / N, as trax)")
    g.add_argument("--sparse-ffn-temperature", type=float, metavar="T",
                   help="Gumbel noise temperature of the controller in training (default 0.1)")
    g.add_argument("--sparse-ffn-quant-prob", type=float, metavar="P",
                   help="probability per training batch of the straight-through one-hot mask, else the "
                        "softmax mask (default 0.3)")
    g.add_argument("--sparse-qkv-modules", type=int, metavar="S",
                   help="sparse QKV attention with S modules of d/S dims (0: dense; paper: S = heads)")
    g.add_argument("--sparse-qkv-scope", choices=QKV_SCOPES,
                   help="which attentions sparse QKV replaces: all (default: encoder self-attention with a "
                        "centred length kernel, decoder self- and cross-attention) or decoder-self (only the "
                        "causal decoder self-attention, as trax's encoder-decoder Scaling Transformer; "
                        "encoder self-attention and cross-attention stay dense)")
    g.add_argument("--sparse-qkv-kernel", type=int, metavar="F",
                   help="length kernel F of the sparse QKV convolutions (default 3)")
    g.add_argument("--sparse-qkv-module-kernel", type=int, metavar="K",
                   help="module kernel of the Q and K convolutions (default 3; V uses 1, as trax)")
    g.add_argument("--sparse-loss", type=int, metavar="S",
                   help="output projection as a multiplicative layer with loss sparsity S (0: dense, "
                        "default; the vocabulary must be divisible by S)")


def _sparse_big(args, ffn_dim, block_size, qkv):
    if block_size:
        args.sparse_ffn_block_size = getattr(args, "sparse_ffn_block_size", block_size)
    if qkv:
        args.sparse_qkv_modules = getattr(args, "sparse_qkv_modules", 16)  # S = heads
    args.encoder_ffn_embed_dim = getattr(args, "encoder_ffn_embed_dim", ffn_dim)
    args.decoder_ffn_embed_dim = getattr(args, "decoder_ffn_embed_dim", ffn_dim)
    args.dropout = getattr(args, "dropout", 0.1)
    one_wide_ffn_defaults(args)
    transformer_wmt_en_de_big(args)
    scaling_sparse_defaults(args)


@register_model_architecture("scaling_sparse", "scaling_sparse")
def scaling_sparse(args):
    """Big dims (6/6, 1024, 16 heads): sparse FFN N = 64 + sparse QKV S = 16, F = 3, d_ff raised to 6,656
    to keep Transformer Big's parameter count (the paper's 4096 -> 6144 at T5-large size)."""
    _sparse_big(args, BIG_FF_QKV_FFN_DIM, 64, qkv=True)


@register_model_architecture("scaling_sparse", "scaling_sparse_ff")
def scaling_sparse_ff(args):
    """Big dims with the sparse FFN only (N = 64, d_ff 4096)."""
    _sparse_big(args, 4096, 64, qkv=False)


@register_model_architecture("scaling_sparse", "scaling_sparse_qkv")
def scaling_sparse_qkv(args):
    """Big dims with sparse QKV only (S = 16, F = 3), dense FFN raised to d_ff 7,040 (parameter-matched)."""
    _sparse_big(args, BIG_QKV_FFN_DIM, 0, qkv=True)


@register_model_architecture("scaling_sparse", "one_wide_sparse_ffn_big")
def one_wide_sparse_ffn_big(args):
    """one_wide_ffn_big (SharedEncNoDec, d_ff' = 49,152) whose shared FFN is top-1-of-64 sparse:
    768 of the 49,152 units active per token; controller bottleneck 64 (the paper's ablation value)."""
    args.sparse_ffn_block_size = getattr(args, "sparse_ffn_block_size", 64)
    args.sparse_ffn_lowrank = getattr(args, "sparse_ffn_lowrank", 64)
    args.dropout = getattr(args, "dropout", 0.1)
    _one_wide(args, 49152)
    one_wide_ffn_defaults(args)
    transformer_wmt_en_de_big(args)
    scaling_sparse_defaults(args)


@register_model_architecture("scaling_sparse", "scaling_sparse_tiny")
def scaling_sparse_tiny(args):
    """Test size: d=64, 4 heads, 2/2 layers, sparse FFN (d_ff 128, N = 8) + sparse QKV (S = 4, F = 3),
    pre-norm."""
    args.sparse_ffn_block_size = getattr(args, "sparse_ffn_block_size", 8)
    args.sparse_qkv_modules = getattr(args, "sparse_qkv_modules", 4)
    args.encoder_normalize_before = getattr(args, "encoder_normalize_before", True)
    args.decoder_normalize_before = getattr(args, "decoder_normalize_before", True)
    tiny_dims(args, ffn_dim=128, encoder_layers=2, decoder_layers=2)
    one_wide_ffn_base_architecture(args)
    scaling_sparse_defaults(args)


@register_model_architecture("scaling_sparse", "scaling_sparse_ff_tiny")
def scaling_sparse_ff_tiny(args):
    """Test size of scaling_sparse_ff: the sparse FFN (d_ff 128, N = 8) with dense attention."""
    args.sparse_qkv_modules = getattr(args, "sparse_qkv_modules", 0)
    scaling_sparse_tiny(args)


@register_model_architecture("scaling_sparse", "scaling_sparse_qkv_tiny")
def scaling_sparse_qkv_tiny(args):
    """Test size of scaling_sparse_qkv: sparse QKV (S = 4, F = 3) in the decoder self-attention only
    (--sparse-qkv-scope decoder-self) with a dense FFN (d_ff 128)."""
    args.sparse_ffn_block_size = getattr(args, "sparse_ffn_block_size", 0)
    args.sparse_qkv_scope = getattr(args, "sparse_qkv_scope", "decoder-self")
    scaling_sparse_tiny(args)


@register_model_architecture("scaling_sparse", "scaling_sparse_loss_tiny")
def scaling_sparse_loss_tiny(args):
    """Test size of the fully sparse model: sparse FFN + QKV + sparse loss layer (S = 4), post-norm,
    F = 2 (even length kernel)."""
    args.sparse_loss = getattr(args, "sparse_loss", 4)
    args.sparse_qkv_kernel = getattr(args, "sparse_qkv_kernel", 2)
    args.encoder_normalize_before = getattr(args, "encoder_normalize_before", False)
    args.decoder_normalize_before = getattr(args, "decoder_normalize_before", False)
    scaling_sparse_tiny(args)


@register_model_architecture("scaling_sparse", "one_wide_sparse_ffn_tiny")
def one_wide_sparse_ffn_tiny(args):
    """Test size of the one wide sparse FFN: SharedEncNoDec, d_ff' = 512, N = 16, dense attention."""
    args.sparse_ffn_block_size = getattr(args, "sparse_ffn_block_size", 16)
    tiny_dims(args, ffn_dim=128, encoder_layers=2, decoder_layers=2)
    _one_wide(args, 512)
    one_wide_ffn_base_architecture(args)
    scaling_sparse_defaults(args)


# Bad flags the shared test matrix checks (arch, flags, text the build-time error must contain).
BAD_FLAGS = [
    ("scaling_sparse_tiny", ["--sparse-ffn-block-size", "7"], "--sparse-ffn-block-size 7 must divide --encoder-ffn-embed-dim"),
    ("one_wide_sparse_ffn_tiny", ["--sparse-ffn-block-size", "24"], "must divide --encoder-shared-ffn-dim"),
    ("scaling_sparse_tiny", ["--activation-fn", "gelu"], "--activation-fn relu"),
    ("scaling_sparse_tiny", ["--sparse-qkv-modules", "3"], "--sparse-qkv-modules 3 must divide"),
    ("scaling_sparse_tiny", ["--sparse-qkv-module-kernel", "2"], "--sparse-qkv-module-kernel 2 (given, or set by --arch scaling_sparse_tiny): must be an odd integer >= 1"),
    ("scaling_sparse_tiny", ["--sparse-loss", "5"], "--sparse-loss 5: the output vocabulary"),
    ("scaling_sparse_tiny", ["--share-decoder-self-attn"], "cannot be combined with --sparse-qkv-modules"),
    ("scaling_sparse_tiny", ["--sparse-ffn-block-size", "0", "--sparse-ffn-lowrank", "4"],
     "--sparse-ffn-lowrank applies to a sparse FFN"),
    ("scaling_sparse_tiny", ["--sparse-ffn-block-size", "0", "--sparse-qkv-modules", "0"], "nothing is sparse"),
    ("scaling_sparse_ff_tiny", ["--sparse-qkv-scope", "decoder-self"], "--sparse-qkv-scope applies to sparse QKV"),
]
