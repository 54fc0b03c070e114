"""One Wide FFN (Pires et al. 2023): FFN sharing / dropping / widening on fairseq's Transformer.

Every configuration of the paper is a command line (nomenclature of its Table 1):
  SharedEnc            --encoder-ffn-sharing shared
  SharedDec            --decoder-ffn-sharing shared
  SharedEncSharedDec   both of the above
  SharedEncDec         --encoder-ffn-sharing shared --decoder-ffn-sharing encoder (one FFN for both)
  NoEnc / NoDec        --encoder-ffn-sharing none / --decoder-ffn-sharing none
  SharedEncNoDec       --encoder-ffn-sharing shared --decoder-ffn-sharing none (+ wide: the One Wide FFN)
  multiple FFNs        --encoder-ffn-sharing sequence|cycle|cycle_rev --encoder-num-shared-ffns M (appendix)
  d_ff'                --encoder-shared-ffn-dim / --decoder-shared-ffn-dim (width of the shared FFNs)
  attention sharing    --share-encoder-self-attn, --share-decoder-self-attn, --share-decoder-cross-attn
                       (appendix table: one set of attention weights for all layers of that kind)
Layers with an FFN are fairseq's own Transformer layers whose fc1/fc2 are tied to the shared
instances, so fairseq's beam search, incremental decoding and checkpoints are unchanged; layers
without an FFN drop its residual connection and LayerNorm (paper footnote on d_ff' = 0).
Source/target embeddings and the output projection are shared (joined dictionary), as in the paper.
"""
from typing import Dict, List, Optional

import torch
from fairseq.models.transformer import TransformerConfig, TransformerModel
from fairseq.models.transformer.transformer_legacy import base_architecture, transformer_wmt_en_de_big
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase
from torch import Tensor

from ..compat import register_model, register_model_architecture
from ..modules.feedforward import SHARING_MODES, ffn_sharing_plan
from .common import DIM, Range, tiny_dims

# numeric flags of this family and their valid values (checked for every arch: compat.register_model_architecture)
FLAG_RANGES = {"encoder_num_shared_ffns": DIM, "decoder_num_shared_ffns": DIM,
               "shared_ffn_lr_scale": Range(above=0.0, hint="1 = the learning rate of every other weight"), **{
    f"{side}_shared_ffn_dim": Range(low=1, integer=True, hint=f"to drop the {side} FFNs use --{side}-ffn-sharing none")
    for side in ("encoder", "decoder")}}

BASELINES = {  # arch -> the paper's baseline at the same dimensions (tools/params.py, benchmarks)
    "one_wide_ffn_big": "transformer_wmt_en_de_big",
    "one_wide_ffn_base": "transformer",
    "one_wide_ffn_deep_shallow": "transformer_balanced_big",
    "one_wide_ffn_tiny": "transformer_tiny",
}


class NoFFNEncoderLayer(TransformerEncoderLayerBase):
    """Encoder layer without FFN: self-attention sub-layer only (no FFN residual / LayerNorm)."""

    def __init__(self, cfg):
        super().__init__(cfg)
        del self.fc1, self.fc2, self.final_layer_norm

    def forward(self, x, encoder_padding_mask: Optional[Tensor], attn_mask: Optional[Tensor] = None):
        if attn_mask is not None:  # as fairseq: 1 -> large negative (not -inf: fully padded rows)
            attn_mask = attn_mask.masked_fill(attn_mask.to(torch.bool), -1e8 if x.dtype == torch.float32 else -1e4)
        residual = x  # (T, B, C)
        if self.normalize_before:
            x = self.self_attn_layer_norm(x)
        x, _ = self.self_attn(query=x, key=x, value=x, key_padding_mask=encoder_padding_mask,
                              need_weights=False, attn_mask=attn_mask)
        x = self.residual_connection(self.dropout_module(x), residual)
        if not self.normalize_before:
            x = self.self_attn_layer_norm(x)
        return x


class NoFFNDecoderLayer(TransformerDecoderLayerBase):
    """Decoder layer without FFN: self-attention and cross-attention sub-layers only."""

    def __init__(self, cfg, no_encoder_attn=False):
        super().__init__(cfg, no_encoder_attn=no_encoder_attn)
        del self.fc1, self.fc2, self.final_layer_norm

    def forward(
        self,
        x,
        encoder_out: Optional[Tensor] = None,
        encoder_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        prev_self_attn_state: Optional[List[Tensor]] = None,
        prev_attn_state: Optional[List[Tensor]] = None,
        self_attn_mask: Optional[Tensor] = None,
        self_attn_padding_mask: Optional[Tensor] = None,
        need_attn: bool = False,
        need_head_weights: bool = False,
    ):
        if prev_self_attn_state is not None or prev_attn_state is not None:
            raise NotImplementedError("NoFFNDecoderLayer does not take prev_*_attn_state (ONNX export path)")
        need_attn = need_attn or need_head_weights
        residual = x  # (T, B, C)
        if self.normalize_before:
            x = self.self_attn_layer_norm(x)
        x, attn = self.self_attn(query=x, key=x, value=x, key_padding_mask=self_attn_padding_mask,
                                 incremental_state=incremental_state, need_weights=False, attn_mask=self_attn_mask)
        x = self.residual_connection(self.dropout_module(x), residual)
        if not self.normalize_before:
            x = self.self_attn_layer_norm(x)
        if self.encoder_attn is not None and encoder_out is not None:
            residual = x
            if self.normalize_before:
                x = self.encoder_attn_layer_norm(x)
            x, attn = self.encoder_attn(query=x, key=encoder_out, value=encoder_out,
                                        key_padding_mask=encoder_padding_mask, incremental_state=incremental_state,
                                        static_kv=True, need_weights=need_attn or (not self.training and self.need_attn),
                                        need_head_weights=need_head_weights)
            x = self.residual_connection(self.dropout_module(x), residual)
            if not self.normalize_before:
                x = self.encoder_attn_layer_norm(x)
        return x, attn, None


def _side_plan(args, side):
    n = getattr(args, f"{side}_layers")
    mode = getattr(args, f"{side}_ffn_sharing")
    if side == "decoder" and mode == "encoder":
        return [0] * n
    return ffn_sharing_plan(n, mode, getattr(args, f"{side}_num_shared_ffns", None),
                            flag=f"--{side}-ffn-sharing", num_flag=f"--{side}-num-shared-ffns")


def validate_args(args):
    """Build-time checks of the FFN/attention sharing flags (errors name the flags and the fix)."""
    enc_mode, dec_mode = args.encoder_ffn_sharing, args.decoder_ffn_sharing
    plans = {"encoder": _side_plan(args, "encoder"), "decoder": _side_plan(args, "decoder")}
    for side, mode in (("encoder", enc_mode), ("decoder", dec_mode)):
        width = getattr(args, f"{side}_shared_ffn_dim", None)
        if width is None:
            continue
        if mode in ("independent", "none", "encoder"):
            raise ValueError(f"--{side}-shared-ffn-dim applies to shared FFNs, but --{side}-ffn-sharing is "
                             f"'{mode}' (use --{side}-ffn-embed-dim for independent FFNs)")
    if dec_mode == "encoder":
        if enc_mode != "shared":
            raise ValueError("--decoder-ffn-sharing encoder (SharedEncDec) needs --encoder-ffn-sharing shared "
                             f"(got '{enc_mode}')")
        if args.encoder_embed_dim != args.decoder_embed_dim:
            raise ValueError("--decoder-ffn-sharing encoder needs --encoder-embed-dim == --decoder-embed-dim")
    if getattr(args, "checkpoint_activations", False) or getattr(args, "offload_activations", False):
        raise ValueError("one_wide_ffn models do not support --checkpoint-activations / --offload-activations")
    dropped = any(p is None for p in plans["encoder"] + plans["decoder"])
    if dropped and (getattr(args, "cross_self_attention", False) or
                    any(getattr(args, f, False) for f in ("scale_attn", "scale_fc", "scale_heads", "scale_resids"))):
        raise ValueError("--encoder/decoder-ffn-sharing none cannot be combined with --cross-self-attention or "
                         "the NormFormer --scale-* flags")
    return plans


@register_model("one_wide_ffn")
class OneWideFFNModel(TransformerModel):
    """fairseq's Transformer with the FFN placement of the One Wide FFN paper (see module docstring)."""

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        g = parser.add_argument_group("One Wide FFN: FFN sharing, dropping and width")
        g.add_argument("--encoder-ffn-sharing", choices=SHARING_MODES,
                       help="FFN placement over the encoder layers (default: independent)")
        g.add_argument("--decoder-ffn-sharing", choices=SHARING_MODES + ("encoder",),
                       help="FFN placement over the decoder layers; 'encoder' = the encoder's shared FFN (SharedEncDec)")
        g.add_argument("--encoder-num-shared-ffns", type=int, metavar="M",
                       help="number of encoder FFNs for sequence / cycle / cycle_rev sharing")
        g.add_argument("--decoder-num-shared-ffns", type=int, metavar="M",
                       help="number of decoder FFNs for sequence / cycle / cycle_rev sharing")
        g.add_argument("--encoder-shared-ffn-dim", type=int, metavar="D",
                       help="width d_ff' of the shared encoder FFN(s) (default: --encoder-ffn-embed-dim)")
        g.add_argument("--decoder-shared-ffn-dim", type=int, metavar="D",
                       help="width d_ff' of the shared decoder FFN(s) (default: --decoder-ffn-embed-dim)")
        g.add_argument("--shared-ffn-lr-scale", type=float, metavar="S",
                       help="learning rate of every FFN used by more than one layer = S × --lr (default 1; needs "
                            "--optimizer adam_no_decay_gains). Adam moves each weight by about lr per update "
                            "whatever the gradient's size, and a shared weight acts in every layer that uses "
                            "it: S = 1/layers gives the shared FFN the per-layer step of unshared FFNs")
        g.add_argument("--share-encoder-self-attn", action="store_true",
                       help="one set of encoder self-attention weights for all encoder layers")
        g.add_argument("--share-decoder-self-attn", action="store_true",
                       help="one set of decoder self-attention weights for all decoder layers")
        g.add_argument("--share-decoder-cross-attn", action="store_true",
                       help="one set of cross-attention weights for all decoder layers")

    @classmethod
    def build_model(cls, args, task):
        one_wide_ffn_defaults(args)
        plans = validate_args(args)
        model = super().build_model(args, task)
        apply_sharing(model, args, plans)
        return model


def apply_sharing(model, args, plans):
    """Tie / drop the FFNs per plan and tie attention weights, in place."""
    enc_cfg = TransformerConfig.from_namespace(args)
    sides = {"encoder": model.encoder, "decoder": model.decoder}
    pools = {"encoder": {}, "decoder": {}}
    for side, module in sides.items():
        mode = getattr(args, f"{side}_ffn_sharing")
        width = getattr(args, f"{side}_shared_ffn_dim", None) or getattr(args, f"{side}_ffn_embed_dim")
        for i, m in enumerate(plans[side]):
            layer = module.layers[i]
            if m is None:
                module.layers[i] = (NoFFNEncoderLayer(enc_cfg) if side == "encoder"
                                    else NoFFNDecoderLayer(enc_cfg, no_encoder_attn=layer.encoder_attn is None))
                continue
            if mode == "independent":
                continue  # fairseq's own per-layer FFN
            pool = pools["encoder"] if (side == "decoder" and mode == "encoder") else pools[side]
            if m not in pool:
                d = layer.embed_dim
                pool[m] = (layer.build_fc1(d, width, layer.quant_noise, layer.quant_noise_block_size),
                           layer.build_fc2(width, d, layer.quant_noise, layer.quant_noise_block_size))
            layer.fc1, layer.fc2 = pool[m]
    _scale_shared_lr(model, args)
    _tie_attention(model.encoder.layers, "self_attn", args.share_encoder_self_attn)
    _tie_attention(model.decoder.layers, "self_attn", args.share_decoder_self_attn)
    _tie_attention(model.decoder.layers, "encoder_attn", args.share_decoder_cross_attn)


def _scale_shared_lr(model, args):
    """Mark the parameters of every FFN used by more than one layer with `lr_scale` (--shared-ffn-lr-scale),
    which adam_no_decay_gains turns into a parameter group with lr × scale."""
    scale = getattr(args, "shared_ffn_lr_scale", None)
    if scale is None or scale == 1:
        return
    if getattr(args, "optimizer", None) not in (None, "adam_no_decay_gains"):
        raise ValueError(f"--shared-ffn-lr-scale {scale} needs --optimizer adam_no_decay_gains (the optimizer "
                         f"that gives the shared FFN its own learning rate); got --optimizer {args.optimizer}")
    uses = {}
    for side in (model.encoder, model.decoder):
        for layer in side.layers:
            fc1 = getattr(layer, "fc1", None)
            if fc1 is not None:
                uses[id(fc1)] = uses.get(id(fc1), 0) + 1
    shared = [layer for side in (model.encoder, model.decoder) for layer in side.layers
              if getattr(layer, "fc1", None) is not None and uses[id(layer.fc1)] > 1]
    if not shared:
        raise ValueError(f"--shared-ffn-lr-scale {scale}: no FFN is shared by two layers "
                         "(use it with --encoder-ffn-sharing / --decoder-ffn-sharing shared, sequence, cycle ...)")
    for layer in shared:
        for p in (*layer.fc1.parameters(), *layer.fc2.parameters()):
            p.lr_scale = scale


def _tie_attention(layers, name, share):
    """Share the projection weights of one attention kind across layers. The MultiheadAttention
    modules stay distinct: each keeps its own incremental-decoding state."""
    if not share:
        return
    first = getattr(layers[0], name)
    for layer in layers[1:]:
        attn = getattr(layer, name)
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            setattr(attn, proj, getattr(first, proj))


def one_wide_ffn_defaults(args):
    args.encoder_ffn_sharing = getattr(args, "encoder_ffn_sharing", None) or "independent"
    args.decoder_ffn_sharing = getattr(args, "decoder_ffn_sharing", None) or "independent"
    for name in ("encoder_num_shared_ffns", "decoder_num_shared_ffns", "encoder_shared_ffn_dim",
                 "decoder_shared_ffn_dim", "shared_ffn_lr_scale"):
        setattr(args, name, getattr(args, name, None))
    for name in ("share_encoder_self_attn", "share_decoder_self_attn", "share_decoder_cross_attn"):
        setattr(args, name, getattr(args, name, False))
    args.share_all_embeddings = getattr(args, "share_all_embeddings", True)


def _one_wide(args, width):
    """SharedEncNoDec with d_ff' = width: the One Wide FFN configuration."""
    args.encoder_ffn_sharing = getattr(args, "encoder_ffn_sharing", None) or "shared"
    args.decoder_ffn_sharing = getattr(args, "decoder_ffn_sharing", None) or "none"
    # the arch's d_ff' only where the encoder shares FFNs (--encoder-ffn-sharing none gives NoEnc, independent
    # the vanilla encoder: neither takes a shared width)
    if args.encoder_ffn_sharing not in ("independent", "none") and getattr(args, "encoder_shared_ffn_dim", None) is None:
        args.encoder_shared_ffn_dim = width


@register_model_architecture("one_wide_ffn", "one_wide_ffn")
def one_wide_ffn_base_architecture(args):
    """Plain Transformer base with every FFN/attention option at its vanilla default."""
    one_wide_ffn_defaults(args)
    base_architecture(args)


@register_model_architecture("one_wide_ffn", "one_wide_ffn_big")
def one_wide_ffn_big(args):
    """Transformer Big (6/6, 1024/4096/16 heads), SharedEncNoDec, d_ff' = 12 x 4096 = 49,152."""
    args.dropout = getattr(args, "dropout", 0.1)  # paper: 0.1 on WMT22
    _one_wide(args, 49152)
    one_wide_ffn_defaults(args)
    transformer_wmt_en_de_big(args)


@register_model_architecture("one_wide_ffn", "one_wide_ffn_base")
def one_wide_ffn_base(args):
    """Transformer Base (6/6, 512/2048/8 heads), SharedEncNoDec, d_ff' = 12 x 2048 = 24,576."""
    _one_wide(args, 24576)
    one_wide_ffn_base_architecture(args)


@register_model_architecture("one_wide_ffn", "one_wide_ffn_deep_shallow")
def one_wide_ffn_deep_shallow(args):
    """Deep encoder / shallow decoder Big (12/2), SharedEncNoDec, d_ff' = 14 x 4096 = 57,344."""
    args.encoder_layers = getattr(args, "encoder_layers", 12)
    args.decoder_layers = getattr(args, "decoder_layers", 2)
    _one_wide(args, 57344)
    one_wide_ffn_big(args)


@register_model_architecture("one_wide_ffn", "one_wide_ffn_tiny")
def one_wide_ffn_tiny(args):
    """Test size of the One Wide FFN: d=64, 2/2 layers, SharedEncNoDec, d_ff' = 4 x 128 = 512."""
    tiny_dims(args, ffn_dim=128, encoder_layers=2, decoder_layers=2)
    _one_wide(args, (args.encoder_layers + args.decoder_layers) * args.encoder_ffn_embed_dim)
    one_wide_ffn_base_architecture(args)


@register_model_architecture("one_wide_ffn", "one_wide_ffn_cycle_tiny")
def one_wide_ffn_cycle_tiny(args):
    """Test size exercising multi-FFN sharing: 4 encoder layers Cycle(Rev) M=2, decoder SharedDec
    with a narrower d_ff', shared decoder self-attention, pre-norm."""
    args.encoder_layers = getattr(args, "encoder_layers", 4)
    args.encoder_ffn_sharing = getattr(args, "encoder_ffn_sharing", "cycle_rev")
    args.encoder_num_shared_ffns = getattr(args, "encoder_num_shared_ffns", 2)
    args.decoder_ffn_sharing = getattr(args, "decoder_ffn_sharing", "shared")
    args.decoder_shared_ffn_dim = getattr(args, "decoder_shared_ffn_dim", 96)
    args.share_decoder_self_attn = getattr(args, "share_decoder_self_attn", True)
    args.encoder_normalize_before = getattr(args, "encoder_normalize_before", True)
    args.decoder_normalize_before = getattr(args, "decoder_normalize_before", True)
    tiny_dims(args, ffn_dim=128, encoder_layers=2, decoder_layers=2)
    one_wide_ffn_base_architecture(args)


@register_model_architecture("one_wide_ffn", "one_wide_ffn_shared_enc_dec_tiny")
def one_wide_ffn_shared_enc_dec_tiny(args):
    """Test size exercising SharedEncDec (one FFN for both sides) with shared encoder self-attention
    and shared cross-attention, post-norm."""
    args.encoder_ffn_sharing = getattr(args, "encoder_ffn_sharing", "shared")
    args.decoder_ffn_sharing = getattr(args, "decoder_ffn_sharing", "encoder")
    args.share_encoder_self_attn = getattr(args, "share_encoder_self_attn", True)
    args.share_decoder_cross_attn = getattr(args, "share_decoder_cross_attn", True)
    tiny_dims(args, ffn_dim=128, encoder_layers=2, decoder_layers=2)
    one_wide_ffn_base_architecture(args)


# Bad flags the shared test matrix checks (arch, flags, text the build-time error must contain).
BAD_FLAGS = [
    ("one_wide_ffn_cycle_tiny", ["--encoder-num-shared-ffns", "3"], "--encoder-num-shared-ffns 3 must divide"),
    ("one_wide_ffn_cycle_tiny", ["--encoder-num-shared-ffns", "1"], "cycle_rev is defined only for M = N/2"),
    ("one_wide_ffn_tiny", ["--encoder-shared-ffn-dim", "0"], "--encoder-ffn-sharing none"),
    ("one_wide_ffn_tiny", ["--decoder-ffn-sharing", "encoder", "--encoder-ffn-sharing", "cycle",
                           "--encoder-num-shared-ffns", "2"], "SharedEncDec"),
    ("one_wide_ffn_tiny", ["--encoder-ffn-sharing", "shared", "--encoder-num-shared-ffns", "2"],
     "--encoder-num-shared-ffns applies only to"),
    ("one_wide_ffn_tiny", ["--encoder-ffn-sharing", "independent", "--encoder-shared-ffn-dim", "256"],
     "--encoder-shared-ffn-dim applies to shared"),
    ("one_wide_ffn_tiny", ["--decoder-ffn-sharing", "sequence"], "needs --decoder-num-shared-ffns"),
]
