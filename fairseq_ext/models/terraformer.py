"""Terraformer (Jaszczur et al. 2021, §4): a Scaling Transformer with reversible layers, a decoder over
the concatenation [encoder output; target embeddings] without cross-attention, and low-rank recurrence.

Encoder: embeddings + positions, pair (x, x), reversible blocks [AttentionSwap, FeedForwardSwap]
(non-causal self-attention, padding masked), mean of the pair, Dense, LayerNorm (trax's encoder end).
Decoder (§4.1): per sentence the sequence [encoder output; target embeddings] (LengthConcat), pair (x, x),
reversible blocks of --decoder-attention-layers AttentionSwaps (default 2: three swaps per block, Fig. 6)
then a FeedForwardSwap, mean of the pair, LayerNorm, the target part only to the output projection.
Attention in the decoder is causal over the whole concatenation, as in trax (a target position sees every
source position and the earlier targets; the source part sees the earlier source positions).
Padding: fairseq pads sources on the left (or right with --left-pad-source False); the decoder moves a
sentence's source padding to the front of its concatenation, so the result is that of trax's
ConcatWithPadding (padding removed) for any padding side: padded keys are masked, padded positions are
zeroed before sparse QKV convolutions and leave the recurrent state unchanged.

Parts, each on/off by flags: reversibility (--no-reversible: store activations instead, same maths),
low-rank SRU recurrence in every FFN sub-layer (--sru-dim, 0 = off; §4.3), sparse FFN / sparse QKV /
sparse loss layer (the Scaling Transformer flags, §3), LSH attention for long inputs (--lsh-attention
encoder|decoder|both, modules/lsh_attention.py; full attention for inputs of at most one chunk), random
position offsets in training (--position-offset-max / --position-offset-prob, trax's PositionalEncoding
start_from_zero_prob / max_offset_to_add, for length generalisation; off by default).

Incremental decoding: the first step runs the source part and the first target token through the decoder
(its keys/values, convolution and recurrent states cached), later steps one token; beam reordering
index-selects every cache. Rows that repeat at the first step (a sentence's beam copies) run once and their
caches are copied to every row.
"""
from typing import Dict, List, Optional

import torch
from fairseq import utils
from fairseq.models import FairseqEncoder, FairseqEncoderDecoderModel, FairseqIncrementalDecoder
from fairseq.models.transformer import TransformerEncoderBase, TransformerModel
from fairseq.models.transformer.transformer_legacy import base_architecture, transformer_wmt_en_de_big
from fairseq.modules import LayerNorm, PositionalEmbedding
from fairseq.modules.fairseq_dropout import FairseqDropout
from torch import Tensor, nn

from ..compat import register_model, register_model_architecture
from ..modules.lsh_attention import LSHSelfAttention
from ..modules.multiplicative import SparseOutputProjection, SparseQKVAttention
from ..modules.reversible import ReversibleStack
from ..modules.sparse_feedforward import SparseFeedForward
from ..modules.sru import LowRankRecurrence
from ..modules.terraformer_blocks import (AttentionSwap, DenseFeedForward, FeedForwardSwap, IncrementalState,
                                          SelfAttention)
from .common import DIM, Range, tiny_dims
from .scaling_sparse import SPARSE_RANGES, BIG_FF_QKV_FFN_DIM, add_sparse_args, sparse_defaults, validate_sparse_args

FLAG_RANGES = {**SPARSE_RANGES, "decoder_attention_layers": DIM, "sru_layers": DIM,
               "sru_dim": Range(low=1, integer=True, special={0: "no recurrence"}), "lsh_chunk": DIM,
               "lsh_buckets": Range(low=2, integer=True), "lsh_hashes": DIM,
               "position_offset_max": Range(low=1, integer=True, special={0: "positions always from 0"}),
               "position_offset_prob": Range(low=0.0, high=1.0)}
LSH_DEFAULTS = {"lsh_chunk": 64, "lsh_buckets": 16, "lsh_hashes": 2}
LSH_FLAGS = tuple(LSH_DEFAULTS)

BASE_FF_QKV_FFN_DIM = 3200  # Transformer Base's count (101%) at a 32k vocabulary; a multiple of N = 64

BASELINES = {"terraformer": "transformer_wmt_en_de_big", "terraformer_base": "transformer",
             "terraformer_tiny": "transformer_tiny",
             "terraformer_dense_tiny": "transformer_tiny"}


def _attention(args, embed_dim, heads, causal, side, index):
    if args.lsh_attention in (side, "both"):
        return LSHSelfAttention(embed_dim, heads, causal, args.lsh_chunk, args.lsh_buckets, args.lsh_hashes,
                                args.attention_dropout, seed=index)
    if args.sparse_qkv_modules:
        return SparseQKVAttention(
            embed_dim, heads, args.sparse_qkv_modules, 3 if args.sparse_qkv_kernel is None else args.sparse_qkv_kernel,
            3 if args.sparse_qkv_module_kernel is None else args.sparse_qkv_module_kernel, causal=causal,
            dropout=args.attention_dropout)
    return SelfAttention(embed_dim, heads, args.attention_dropout)


def _ffn_swap(args, embed_dim, ffn_dim):
    if args.sparse_ffn_block_size:
        ffn = SparseFeedForward(embed_dim, ffn_dim, args.sparse_ffn_block_size, args.sparse_ffn_lowrank,
                                0.1 if args.sparse_ffn_temperature is None else args.sparse_ffn_temperature,
                                0.3 if args.sparse_ffn_quant_prob is None else args.sparse_ffn_quant_prob,
                                activation_dropout=args.activation_dropout)
    else:
        ffn = DenseFeedForward(embed_dim, ffn_dim, args.activation_dropout)
    recurrence = LowRankRecurrence(embed_dim, args.sru_dim, args.sru_layers) if args.sru_dim else None
    return FeedForwardSwap(embed_dim, ffn, args.dropout, recurrence)


def _stack(args, side):
    """The reversible stack of one side: per layer K attention swaps (encoder: K = 1, non-causal; decoder:
    K = --decoder-attention-layers, causal) then the FFN swap."""
    d, heads = getattr(args, f"{side}_embed_dim"), getattr(args, f"{side}_attention_heads")
    decoder = side == "decoder"
    swaps = []
    for i in range(getattr(args, f"{side}_layers")):
        for j in range(args.decoder_attention_layers if decoder else 1):
            seed = 100 + 10 * i + j if decoder else i  # the LSH rotations of each attention layer (eval)
            swaps.append(AttentionSwap(d, _attention(args, d, heads, decoder, side, seed), args.dropout))
        swaps.append(_ffn_swap(args, d, getattr(args, f"{side}_ffn_embed_dim")))
    return ReversibleStack(swaps, reversible=not args.no_reversible)


class _Embedder(nn.Module):
    """Scaled token embeddings + positions + dropout, (B, T) -> (T, B, d)."""

    def __init__(self, args, embed_tokens, max_positions, learned_pos):
        super().__init__()
        d = embed_tokens.embedding_dim
        self.embed_tokens = embed_tokens
        self.padding_idx = embed_tokens.padding_idx
        self.embed_scale = 1.0 if args.no_scale_embedding else d ** 0.5
        self.embed_positions = (None if args.no_token_positional_embeddings else
                                PositionalEmbedding(max_positions, d, self.padding_idx, learned=learned_pos))
        self.dropout_module = FairseqDropout(args.dropout, module_name=self.__class__.__name__)
        # trax's PositionalEncoding in training: with probability 1 - start_from_zero_prob a batch's positions
        # start at an offset uniform in [0, max_offset_to_add) (its addition configuration, the Table 4 tasks)
        self.offset_max = getattr(args, "position_offset_max", 0) or 0
        self.offset_prob = getattr(args, "position_offset_prob", None) or 0.0
        if self.offset_max and self.embed_positions is not None:  # the table covers every offset position
            self._grow_table(self.padding_idx + 1 + max_positions + self.offset_max)

    def _grow_table(self, rows):
        ep = self.embed_positions
        if rows > ep.weights.size(0):
            ep.weights = type(ep).get_embedding(rows, ep.embedding_dim, self.padding_idx).to(ep.weights)

    def offset_positions(self, tokens, start):
        """Sinusoidal embeddings of `tokens`' positions counted from `start` (padding stays padding), (B, T, d)."""
        ep = self.embed_positions
        positions = utils.make_positions(tokens, self.padding_idx)
        positions = positions + start * tokens.ne(self.padding_idx).long()
        self._grow_table(self.padding_idx + 1 + tokens.size(1) + start)  # a bound known without reading positions
        return ep.weights.index_select(0, positions.view(-1)).view(*tokens.shape, -1).detach()

    def forward(self, tokens, incremental_state=None):
        """All of `tokens`, or with an incremental state only the last one (its position from the length)."""
        pos = None
        if self.embed_positions is not None:
            if self.training and self.offset_max and incremental_state is None and (
                    float(torch.rand(())) < self.offset_prob):
                pos = self.offset_positions(tokens, int(torch.randint(0, self.offset_max, ())))
            else:
                pos = self.embed_positions(tokens, incremental_state=incremental_state)
        if incremental_state is not None:
            tokens = tokens[:, -1:]
        x = self.embed_scale * self.embed_tokens(tokens)
        if pos is not None:
            x = x + pos
        return self.dropout_module(x).transpose(0, 1)


class TerraformerEncoder(FairseqEncoder):
    def __init__(self, args, dictionary, embed_tokens):
        super().__init__(dictionary)
        d = args.encoder_embed_dim
        self.max_source_positions = args.max_source_positions
        self.embed = _Embedder(args, embed_tokens, args.max_source_positions, args.encoder_learned_pos)
        self.stack = _stack(args, "encoder")
        self.out_proj = nn.Linear(d, d)  # trax: mean of the pair, Dense, LayerNorm
        self.layer_norm = LayerNorm(d)

    def forward(self, src_tokens, src_lengths: Optional[Tensor] = None, return_all_hiddens: bool = False,
                token_embeddings: Optional[Tensor] = None):
        pad = src_tokens.eq(self.embed.padding_idx)
        x = self.embed(src_tokens)
        if pad.any():
            x = x.masked_fill(pad.t().unsqueeze(-1), 0.0)
        a, b = self.stack(x, x, padding_mask=pad)
        x = self.layer_norm(self.out_proj((a + b) / 2))
        return {"encoder_out": [x], "encoder_padding_mask": [pad], "encoder_embedding": [], "encoder_states": [],
                "src_tokens": [], "src_lengths": [src_lengths] if src_lengths is not None else []}

    @torch.jit.export
    def reorder_encoder_out(self, encoder_out: Dict[str, List[Tensor]], new_order):
        return TransformerEncoderBase.reorder_encoder_out(self, encoder_out, new_order)

    def max_positions(self):
        return self.max_source_positions


def pads_first(x: Tensor, pad: Optional[Tensor]):
    """Move each sentence's padding (B, S) to the front of x (S, B, d), keeping token order."""
    if pad is None or not pad.any():
        return x, None
    order = torch.sort(pad.to(torch.uint8), dim=1, descending=True, stable=True).indices  # (B, S)
    x = x.gather(0, order.t().unsqueeze(-1).expand(-1, -1, x.size(-1)))
    return x, pad.gather(1, order)


def _repeated_rows(encoder_out, tokens):
    """When consecutive rows repeat (encoder output, padding, target tokens), as beam search's rows of one
    sentence do at the first step: (index of each run's first row, row -> run index); else None."""
    enc = encoder_out["encoder_out"][0]
    if enc.size(1) < 2:
        return None
    same = (enc[:, 1:] == enc[:, :-1]).all(dim=2).all(dim=0) & (tokens[1:] == tokens[:-1]).all(dim=1)
    if encoder_out["encoder_padding_mask"]:
        pad = encoder_out["encoder_padding_mask"][0]
        same &= (pad[1:] == pad[:-1]).all(dim=1)
    if not same.any():
        return None
    new = torch.cat([same.new_ones(1), ~same])  # row starts a run
    return new.nonzero().squeeze(1), new.long().cumsum(0) - 1


class TerraformerDecoder(FairseqIncrementalDecoder):
    def __init__(self, args, dictionary, embed_tokens):
        super().__init__(dictionary)
        d = args.decoder_embed_dim
        self.max_target_positions = args.max_target_positions
        self.embed = _Embedder(args, embed_tokens, args.max_target_positions, args.decoder_learned_pos)
        self.stack = _stack(args, "decoder")
        self.layer_norm = LayerNorm(d)
        if args.sparse_loss:
            self.output_projection = SparseOutputProjection(d, len(dictionary), args.sparse_loss)
        elif args.share_decoder_input_output_embed:
            self.output_projection = nn.Linear(d, len(dictionary), bias=False)
            self.output_projection.weight = embed_tokens.weight
        else:
            self.output_projection = nn.Linear(d, len(dictionary), bias=False)
            nn.init.normal_(self.output_projection.weight, mean=0, std=d ** -0.5)
        self._causal = torch.empty(0)

    def _causal_mask(self, n: int, like: Tensor) -> Tensor:
        if self._causal.size(0) < n or self._causal.device != like.device:
            self._causal = torch.triu(utils.fill_with_neg_inf(torch.zeros(max(n, 64), max(n, 64))), 1).to(like.device)
        return self._causal[:n, :n]

    def forward(self, prev_output_tokens, encoder_out: Optional[Dict[str, List[Tensor]]] = None,
                incremental_state: IncrementalState = None, features_only: bool = False,
                full_context_alignment: bool = False, alignment_layer: Optional[int] = None,
                alignment_heads: Optional[int] = None, src_lengths: Optional[Tensor] = None,
                return_all_hiddens: bool = False):
        x, extra = self.extract_features(prev_output_tokens, encoder_out, incremental_state)
        return (x if features_only else self.output_layer(x)), extra

    def extract_features(self, prev_output_tokens, encoder_out: Optional[Dict[str, List[Tensor]]] = None,
                         incremental_state: IncrementalState = None, **unused):
        if encoder_out is None or not encoder_out["encoder_out"]:
            raise ValueError("the Terraformer decoder reads the encoder output (it is the start of its sequence)")
        started = (incremental_state is not None
                   and self.get_incremental_state(incremental_state, "prefix") is not None)
        if incremental_state is not None and not started:
            groups = _repeated_rows(encoder_out, prev_output_tokens)
            if groups is not None:  # beam search's first step: each sentence's rows are copies
                first, expand = groups
                sub = {"encoder_out": [encoder_out["encoder_out"][0].index_select(1, first)],
                       "encoder_padding_mask": [m.index_select(0, first) for m in encoder_out["encoder_padding_mask"]]}
                h, extra = self.extract_features(prev_output_tokens.index_select(0, first), sub, incremental_state)
                self.reorder_incremental_state_scripting(incremental_state, expand)  # every cache to all rows
                return h.index_select(0, expand), {"attn": [None], "inner_states": [extra["inner_states"][0]
                                                                                     .index_select(1, expand)]}
        y = self.embed(prev_output_tokens, incremental_state)  # (T, B, d)
        pad, mask = None, None
        if started:  # one new target position: it sees every cached position
            x = y
        else:  # LengthConcat(v_enc, v_dec) (§4.1), the source padding first
            src_pad = encoder_out["encoder_padding_mask"][0] if encoder_out["encoder_padding_mask"] else None
            enc, src_pad = pads_first(encoder_out["encoder_out"][0], src_pad)
            x = torch.cat([enc, y], dim=0)
            if src_pad is not None:
                pad = torch.cat([src_pad, src_pad.new_zeros(src_pad.size(0), y.size(0))], dim=1)
            mask = self._causal_mask(x.size(0), x)
            if incremental_state is not None:
                self.set_incremental_state(incremental_state, "prefix", {"len": torch.tensor(enc.size(0))})
        a, b = self.stack(x, x, padding_mask=pad, attn_mask=mask, incremental_state=incremental_state)
        h = self.layer_norm((a[-y.size(0):] + b[-y.size(0):]) / 2)  # the target part
        return h.transpose(0, 1), {"attn": [None], "inner_states": [h]}

    def output_layer(self, features):
        return self.output_projection(features)

    def max_positions(self):
        return self.max_target_positions


@register_model("terraformer")
class TerraformerModel(FairseqEncoderDecoderModel):
    """Terraformer encoder-decoder (see module docstring)."""
    no_alignment = ("attends over encoder output and target as one sequence (no encoder-decoder attention "
                    "to read an alignment from)")

    @classmethod
    def add_args(cls, parser):
        TransformerModel.add_args(parser)
        add_sparse_args(parser)
        g = parser.add_argument_group("Terraformer: concatenated decoder, reversibility, recurrence")
        g.add_argument("--decoder-attention-layers", type=int, metavar="K",
                       help="attention sub-layers per decoder block before its FFN (default 2, §4.1)")
        g.add_argument("--sru-dim", type=int, metavar="R",
                       help="width of the low-rank SRU recurrence added to every FFN sub-layer (default 32, "
                            "§4.3; 0: no recurrence)")
        g.add_argument("--sru-layers", type=int, metavar="L", help="SRU layers in each recurrence (default 1)")
        g.add_argument("--lsh-attention", choices=LSH_SIDES,
                       help="LSH self-attention (Reformer; Terraformer §4) in the encoder, the decoder or both "
                            "(default none; inputs of at most one chunk take full attention)")
        g.add_argument("--lsh-chunk", type=int, metavar="C", help="LSH chunk length (default 64)")
        g.add_argument("--lsh-buckets", type=int, metavar="B", help="LSH buckets per hash round (even; default 16)")
        g.add_argument("--lsh-hashes", type=int, metavar="N", help="LSH hash rounds (default 2)")
        g.add_argument("--position-offset-max", type=int, metavar="M",
                       help="in training, start a batch's positions at an offset uniform in [0, M), so that "
                            "positions past the trained lengths occur (trax's pos_max_offset_to_add; sinusoidal "
                            "positions only; default 0: always from 0)")
        g.add_argument("--position-offset-prob", type=float, metavar="P",
                       help="with --position-offset-max, the share of batches (of encoder and of decoder inputs, "
                            "drawn apart) whose positions are offset (trax's 1 - pos_start_from_zero_prob; "
                            "default 0.05, trax's Terraformer addition setting)")
        g.add_argument("--no-reversible", action="store_true",
                       help="store activations for the backward pass instead of recomputing them through the "
                            "reversible layers (same model and gradients, more memory)")

    @classmethod
    def build_model(cls, args, task):
        terraformer_defaults(args)
        validate_args(args)
        src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
        if args.share_all_embeddings:
            if src_dict != tgt_dict:
                raise ValueError("--share-all-embeddings requires a joined dictionary")
            args.share_decoder_input_output_embed = True
            enc_emb = TransformerModel.build_embedding(args, src_dict, args.encoder_embed_dim, args.encoder_embed_path)
            dec_emb = enc_emb
        else:
            enc_emb = TransformerModel.build_embedding(args, src_dict, args.encoder_embed_dim, args.encoder_embed_path)
            dec_emb = TransformerModel.build_embedding(args, tgt_dict, args.decoder_embed_dim, args.decoder_embed_path)
        if args.sparse_loss and len(tgt_dict) % args.sparse_loss:
            raise ValueError(f"--sparse-loss {args.sparse_loss}: the output vocabulary ({len(tgt_dict)}) must be "
                             f"divisible by S (pad the dictionary with --padding-factor, or choose another S)")
        encoder = TerraformerEncoder(args, src_dict, enc_emb)
        decoder = TerraformerDecoder(args, tgt_dict, dec_emb)
        return cls(encoder, decoder)

    def max_positions(self):
        return self.encoder.max_positions(), self.decoder.max_positions()


def terraformer_defaults(args):
    if (getattr(args, "lsh_attention", None) or "none") == "none":  # an LSH setting other than the default
        given = [n for n in LSH_FLAGS if getattr(args, n, None) not in (None, LSH_DEFAULTS[n])]
        if given:
            raise ValueError(f"--{given[0].replace('_', '-')} {getattr(args, given[0])} does nothing without LSH "
                             f"attention: add --lsh-attention encoder|decoder|both, or drop it")
    for name, default in (("decoder_attention_layers", 2), ("sru_dim", 32), ("sru_layers", 1), ("lsh_attention", "none"),
                          *LSH_DEFAULTS.items()):
        if getattr(args, name, None) is None:
            setattr(args, name, default)
    args.no_reversible = getattr(args, "no_reversible", False)
    offset_max, offset_prob = getattr(args, "position_offset_max", None) or 0, getattr(args, "position_offset_prob", None)
    if offset_max:
        given = [f"--{n.replace('_', '-')}" for n in ("no_token_positional_embeddings", "encoder_learned_pos",
                                                      "decoder_learned_pos") if getattr(args, n, False)]
        if given:
            raise ValueError(f"--position-offset-max {offset_max} offsets sinusoidal positions: drop {given[0]}, or "
                             f"drop --position-offset-max")
        args.position_offset_prob = 0.05 if offset_prob is None else offset_prob
    elif offset_prob is not None:
        raise ValueError(f"--position-offset-prob {offset_prob} does nothing without --position-offset-max: add "
                         f"--position-offset-max M (e.g. 300), or drop it")
    args.position_offset_max = offset_max
    args.share_all_embeddings = getattr(args, "share_all_embeddings", True)  # one embedding matrix (joined dict)
    sparse_defaults(args)
    base_architecture(args)
    for side in ("source", "target"):
        if getattr(args, f"max_{side}_positions", None) is None:
            setattr(args, f"max_{side}_positions", 1024)


LSH_SIDES = ("none", "encoder", "decoder", "both")
UNSUPPORTED = ("cross_self_attention", "no_cross_attention", "layernorm_embedding", "adaptive_input",
               "checkpoint_activations", "offload_activations", "encoder_layers_to_keep", "decoder_layers_to_keep")


def validate_args(args):
    """Build-time checks (errors name the flags and the fix)."""
    if args.encoder_embed_dim != args.decoder_embed_dim:
        raise ValueError(f"--encoder-embed-dim {args.encoder_embed_dim} and --decoder-embed-dim "
                         f"{args.decoder_embed_dim} must match: the Terraformer decoder runs over the "
                         f"concatenation of the encoder output and the target embeddings (§4.1)")
    # numeric ranges (layers, widths, LSH sizes, heads dividing widths): FLAG_RANGES, checked with the arch
    if args.lsh_attention != "none":
        if args.sparse_qkv_modules:
            raise ValueError(f"--lsh-attention {args.lsh_attention} and --sparse-qkv-modules both replace the "
                             f"attention: choose one (--sparse-qkv-modules 0 for LSH)")
        if args.lsh_buckets % 2:
            raise ValueError(f"--lsh-buckets {args.lsh_buckets} must be even and >= 2")
    if getattr(args, "sparse_qkv_scope", None) not in (None, "all"):
        raise ValueError(f"--sparse-qkv-scope {args.sparse_qkv_scope}: the Terraformer has no cross-attention "
                         f"and --sparse-qkv-modules makes each of its attention layers sparse; drop the flag")
    if getattr(args, "activation_fn", "relu") != "relu":
        raise ValueError(f"--activation-fn {args.activation_fn}: the Terraformer FFN is ReLU (trax's default)")
    for flag in UNSUPPORTED:
        if getattr(args, flag, None) not in (None, False, 0):
            raise ValueError(f"--{flag.replace('_', '-')} does not apply to the Terraformer (no cross-attention, "
                             f"reversible layers recompute activations already)")
    if getattr(args, "adaptive_softmax_cutoff", None):
        raise ValueError("--adaptive-softmax-cutoff does not apply to the Terraformer")
    validate_sparse_args(args, widths=[(args.encoder_ffn_embed_dim, "--encoder-ffn-embed-dim"),
                                       (args.decoder_ffn_embed_dim, "--decoder-ffn-embed-dim")],
                         require_sparse=False)


@register_model_architecture("terraformer", "terraformer")
def terraformer(args):
    """Big dims (6/6, d 1024, 16 heads, dropout 0.1) with the paper's parts: sparse FFN N = 64, sparse QKV
    S = 16 (F = 3), d_ff 6,656 (scaling_sparse's parameter-matched width), SRU recurrence of width 32,
    two attention layers per decoder block, reversible encoder and decoder."""
    args.sparse_ffn_block_size = getattr(args, "sparse_ffn_block_size", 64)
    args.sparse_qkv_modules = getattr(args, "sparse_qkv_modules", 16)
    args.encoder_ffn_embed_dim = getattr(args, "encoder_ffn_embed_dim", BIG_FF_QKV_FFN_DIM)
    args.decoder_ffn_embed_dim = getattr(args, "decoder_ffn_embed_dim", BIG_FF_QKV_FFN_DIM)
    args.dropout = getattr(args, "dropout", 0.1)
    transformer_wmt_en_de_big(args)
    terraformer_defaults(args)


@register_model_architecture("terraformer", "terraformer_base")
def terraformer_base(args):
    """Base dims (6/6, d 512, 8 heads, dropout 0.1), sparse FFN N = 64 + sparse QKV S = 8, d_ff 3,200
    (101% of Transformer Base's parameters at a 32k vocabulary, as `terraformer` for Big), SRU width 32."""
    args.sparse_ffn_block_size = getattr(args, "sparse_ffn_block_size", 64)
    args.sparse_qkv_modules = getattr(args, "sparse_qkv_modules", 8)
    args.encoder_ffn_embed_dim = getattr(args, "encoder_ffn_embed_dim", BASE_FF_QKV_FFN_DIM)
    args.decoder_ffn_embed_dim = getattr(args, "decoder_ffn_embed_dim", BASE_FF_QKV_FFN_DIM)
    terraformer_defaults(args)


@register_model_architecture("terraformer", "terraformer_tiny")
def terraformer_tiny(args):
    """Test size of the full model: d 64, 4 heads, 2/2 layers, sparse FFN (d_ff 128, N = 8), sparse QKV
    (S = 4), SRU width 16, reversible."""
    args.sparse_ffn_block_size = getattr(args, "sparse_ffn_block_size", 8)
    args.sparse_qkv_modules = getattr(args, "sparse_qkv_modules", 4)
    args.sru_dim = getattr(args, "sru_dim", 16)
    tiny_dims(args, ffn_dim=128, encoder_layers=2, decoder_layers=2)
    terraformer_defaults(args)


@register_model_architecture("terraformer", "terraformer_dense_tiny")
def terraformer_dense_tiny(args):
    """Test size with dense FFN and attention (concatenated decoder, reversibility, SRU only), 3 attention
    layers per decoder block."""
    args.decoder_attention_layers = getattr(args, "decoder_attention_layers", 3)
    args.sru_dim = getattr(args, "sru_dim", 16)
    tiny_dims(args, ffn_dim=128, encoder_layers=2, decoder_layers=2)
    terraformer_defaults(args)


@register_model_architecture("terraformer", "terraformer_lsh_tiny")
def terraformer_lsh_tiny(args):
    """Test size with LSH attention in encoder and decoder (chunk 64, 8 buckets, 2 rounds), sparse FFN, SRU.
    The matrix's sequences fit in one chunk (full-attention fallback, exact when decoding); the LSH path
    itself, where decoding approximates the chunked forward, is tested in tests/test_lsh_attention.py."""
    args.lsh_attention = getattr(args, "lsh_attention", "both")
    args.lsh_buckets = getattr(args, "lsh_buckets", 8)
    args.sparse_ffn_block_size = getattr(args, "sparse_ffn_block_size", 8)
    args.sru_dim = getattr(args, "sru_dim", 16)
    tiny_dims(args, ffn_dim=128, encoder_layers=2, decoder_layers=2)
    terraformer_defaults(args)


# Bad flags the shared test matrix checks (arch, flags, text the build-time error must contain).
BAD_FLAGS = [
    ("terraformer_tiny", ["--decoder-embed-dim", "32"], "must match: the Terraformer decoder runs over"),
    ("terraformer_tiny", ["--decoder-attention-layers", "-1"], "--decoder-attention-layers -1"),
    ("terraformer_tiny", ["--sru-dim", "-4"], "--sru-dim -4"),
    ("terraformer_tiny", ["--sparse-ffn-block-size", "24"], "must divide --encoder-ffn-embed-dim"),
    ("terraformer_dense_tiny", ["--cross-self-attention"], "--cross-self-attention does not apply"),
    ("terraformer_dense_tiny", ["--encoder-attention-heads", "5"], "divisible by --encoder-attention-heads 5"),
    ("terraformer_tiny", ["--lsh-attention", "both"], "--lsh-attention both and --sparse-qkv-modules"),
    ("terraformer_lsh_tiny", ["--lsh-buckets", "5"], "--lsh-buckets 5 must be even"),
    ("terraformer_tiny", ["--sparse-qkv-scope", "decoder-self"], "the Terraformer has no cross-attention"),
]
