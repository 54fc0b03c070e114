"""Prefix-LM Transformer layer (decoder-only translation of One Wide FFN §3, after Raffel et al. 2020).

One stack of layers reads [source; target]: source positions attend to all source positions
(bidirectional), target positions attend to the whole source and causally to the target. The source
part never looks at the target, so it is computed once per sentence (the "encoder pass" over the
same layers); each layer keeps its self-attention input over the source (`prefix`, normalised in
pre-norm) for the target positions to attend to. Incremental decoding stores the prefix's keys and
values in the layer's attention cache at the first step.
"""
from typing import Dict, Optional

import torch
from fairseq.modules import LayerNorm, MultiheadAttention
from fairseq.modules.fairseq_dropout import FairseqDropout
from fairseq import utils
from torch import Tensor, nn


class PrefixLMLayer(nn.Module):
    """Self-attention over [prefix; x] + an optional (possibly shared) FFN. fc1/fc2 = None drops the
    FFN together with its residual connection and LayerNorm (One Wide FFN footnote on d_ff' = 0)."""

    def __init__(self, embed_dim, heads, fc1: Optional[nn.Module], fc2: Optional[nn.Module], normalize_before,
                 dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, activation_fn="relu"):
        super().__init__()
        self.embed_dim = embed_dim
        self.normalize_before = normalize_before
        self.self_attn = MultiheadAttention(embed_dim, heads, dropout=attention_dropout, self_attention=False,
                                            encoder_decoder_attention=False)
        self.self_attn_layer_norm = LayerNorm(embed_dim)
        self.dropout_module = FairseqDropout(dropout, module_name=self.__class__.__name__)
        self.fc1, self.fc2 = fc1, fc2
        if fc1 is not None:
            self.final_layer_norm = LayerNorm(embed_dim)
            self.activation_fn = utils.get_activation_fn(activation_fn)
            self.activation_dropout_module = FairseqDropout(activation_dropout, module_name=self.__class__.__name__)

    def attention_input(self, x):
        """What the self-attention reads from x: its LayerNorm in pre-norm, x itself in post-norm."""
        return self.self_attn_layer_norm(x) if self.normalize_before else x

    def forward(self, x, padding_mask: Optional[Tensor] = None, attn_mask: Optional[Tensor] = None,
                prefix: Optional[Tensor] = None, prefix_padding_mask: Optional[Tensor] = None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None):
        """x: (T, B, C); prefix: (S, B, C) attention inputs of the source for this layer, or None.
        padding_mask: (B, T) True at padding; attn_mask: (T, T) additive (causal) or None."""
        residual = x
        h = self.attention_input(x)
        kv, key_padding_mask = h, padding_mask
        cached = incremental_state is not None and self.self_attn._get_input_buffer(incremental_state).get("prev_key") is not None
        if prefix is not None and not cached:  # first step / full forward: keys = [prefix; x]
            kv = torch.cat([prefix, h], dim=0)
            if attn_mask is not None:
                attn_mask = torch.cat([attn_mask.new_zeros(attn_mask.size(0), prefix.size(0)), attn_mask], dim=1)
            if prefix_padding_mask is not None or padding_mask is not None:
                s, (t, b) = prefix.size(0), h.shape[:2]
                pm = prefix_padding_mask if prefix_padding_mask is not None else h.new_zeros(b, s, dtype=torch.bool)
                tm = padding_mask if padding_mask is not None else h.new_zeros(b, t, dtype=torch.bool)
                key_padding_mask = torch.cat([pm, tm], dim=1)
        out, _ = self.self_attn(query=h, key=kv, value=kv, key_padding_mask=key_padding_mask,
                                incremental_state=incremental_state, need_weights=False, attn_mask=attn_mask)
        x = residual + self.dropout_module(out)
        if not self.normalize_before:
            x = self.self_attn_layer_norm(x)
        if self.fc1 is None:
            return x
        residual = x
        if self.normalize_before:
            x = self.final_layer_norm(x)
        x = self.fc2(self.activation_dropout_module(self.activation_fn(self.fc1(x))))  # FFN, Eq. 1
        x = residual + self.dropout_module(x)
        if not self.normalize_before:
            x = self.final_layer_norm(x)
        return x
