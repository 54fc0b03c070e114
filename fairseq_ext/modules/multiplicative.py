"""Multiplicative dense layer, sparse QKV attention and sparse loss layer of Scaling Transformers
(Jaszczur et al. 2021, §3.2-3.3, Fig. 4), with the details of the official trax code (docs/architecture.md,
"Papers and their official code").

MultiplicativeDense:  y[s, m] = Σ_i x_i D[i, s] E[i, m]    (§3.2; D: d×S, E: d×M, M = d/S outputs per module)
ModuleConv:           a 2-D convolution over (length, modules) of the (T, B, S, M) tensor with M input and
                      M output channels, kernel F (length) × K (modules, zero-padded), weights shared by
                      all modules (§3.2 "Convolutional layer"; 9M² + M parameters for F = K = 3).
SparseQKVAttention:   Q = conv_Q(mult(x)), K = conv_K(mult(x)), V = conv_V(mult(x)) with ONE multiplicative
                      layer shared by Q, K, V, and no output dense layer (§3.2 "Combining ..."). As in trax,
                      Q/K convolve over F steps × K modules, V over F steps × 1 module.
  Our choices where the paper (a decoder-only LM) is silent:
  - decoder self-attention: causal length kernel (the current and F−1 previous steps); decoding keeps
    the last F−1 multiplicative outputs as conv state beside the key/value cache;
  - encoder self-attention: centred length kernel ((F−1)/2 steps on each side), padded positions zeroed
    before the convolution so a padded batch gives the numbers of the unpadded sentences;
  - cross-attention: the same multiplicative layer maps the decoder input (query path: causal conv with
    state) and the encoder output (key/value path: centred conv over the source, computed once per
    sentence and cached, like fairseq's static_kv).
SparseOutputProjection: the final dense layer before the softmax as a multiplicative layer with S = the
                      loss sparsity, V = S·M logits (§3.3); needs a vocabulary divisible by S.
"""
import math
from typing import Dict, Optional

import torch
import torch.nn.functional as F
from fairseq.incremental_decoding_utils import with_incremental_state
from fairseq.modules.fairseq_dropout import FairseqDropout
from torch import Tensor, nn

from .eval_cache import EvalCached
from .kv_cache import append_to_cache, attention_softmax, mask_scores


FACTORED_MAX_ROWS = 64  # eval forwards of at most this many rows (decoding steps) use the factored form


class MultiplicativeDense(EvalCached):
    """y[s, m] = Σ_i x_i D[i, s] E[i, m] (§3.2). (…, d) -> (…, S, M). d·S + d·M parameters; the
    layer can represent any permutation of its input (Theorem 1)."""

    def __init__(self, in_dim, num_modules, module_dim):
        super().__init__()
        self.in_dim, self.num_modules, self.module_dim = in_dim, num_modules, module_dim
        self.D = nn.Parameter(torch.empty(in_dim, num_modules))
        self.E = nn.Parameter(torch.empty(in_dim, module_dim))
        nn.init.normal_(self.D, std=0.5)  # trax
        nn.init.xavier_uniform_(self.E)

    def extra_repr(self):
        return f"{self.in_dim} -> {self.num_modules} x {self.module_dim}"

    def weight(self) -> Tensor:
        """W[i, s·M + m] = D[i, s] E[i, m], (d, S·M): the layer as one matrix, so the forward is one
        product with no (…, S, d) intermediate (a training step of the recipe's small FF+QKV model is
        1.07x faster than scaling x per module first). Computed once for decoding (EvalCached)."""
        return self._cached("W", (self.D, self.E), lambda: (self.D.unsqueeze(2) * self.E.unsqueeze(1)).flatten(1))

    def forward(self, x):
        if not self.training and x.numel() <= FACTORED_MAX_ROWS * x.size(-1):
            return self.factored(x)
        # y[s, m] = Σ_i x_i D[i, s] E[i, m] = (x W)[s·M + m]  (§3.2)
        return torch.matmul(x, self.weight()).unflatten(-1, (self.num_modules, self.module_dim))  # (…, S, M)

    def factored(self, x):
        """The same y from D and E themselves (§3.2, as trax's einsum '...d,ds,dm->...sm'): per row, x scaled
        by each module's column of D, then one product with E. Reads d·(S + M) weights instead of W's d·S·M
        (d² for sparse QKV, d·V for the sparse loss layer): what a decoding step with few rows is bound by."""
        scaled = (x.unsqueeze(-1) * self.D).transpose(-1, -2)  # (…, S, d): x_i D[i, s]
        return torch.matmul(scaled, self.E)  # (…, S, M)


def conv_patch_matrix(weight: Tensor) -> Tensor:
    """A module convolution's (C, M, F, K) weight as the (F·K·M, C) matrix that maps the (F steps × K
    modules × M) patch around a module to its C outputs."""
    return weight.detach().permute(2, 3, 1, 0).reshape(-1, weight.size(0)).contiguous()


def conv_last_step(window: Tensor, matrix: Tensor, bias: Tensor, module_kernel: int) -> Tensor:
    """A causal module convolution's output at the last of F steps, (F, B, S, M) -> (B, S, C): each
    module's (F steps × K modules) patch, zero-padded at the ends, times conv_patch_matrix (one product
    for all rows and modules; what a decoding step needs, 2.5x faster than F.conv2d at these sizes)."""
    f, b, mods, m = window.shape
    x = window.permute(1, 2, 0, 3)  # (B, S, F, M)
    half = module_kernel // 2
    if half:
        x = F.pad(x, (0, 0, 0, 0, half, half))
    patches = x.unfold(1, module_kernel, 1).permute(0, 1, 2, 4, 3)  # (B, S, F, K, M)
    out = torch.addmm(bias, patches.reshape(b * mods, f * module_kernel * m), matrix)
    return out.view(b, mods, -1)


class ModuleConv(EvalCached):
    """Convolution over (length, modules) of a (T, B, S, M) tensor, M -> M channels (§3.2)."""

    def __init__(self, module_dim, length_kernel=3, module_kernel=3, causal=True):
        super().__init__()
        if length_kernel < 1 or module_kernel < 1 or module_kernel % 2 == 0:
            raise ValueError(f"--sparse-qkv-kernel {length_kernel} must be >= 1 and the module kernel "
                             f"{module_kernel} odd (zero-padded on both sides)")
        self.length_kernel, self.module_kernel, self.causal = length_kernel, module_kernel, causal
        self.weight = nn.Parameter(torch.empty(module_dim, module_dim, length_kernel, module_kernel))
        self.bias = nn.Parameter(torch.zeros(module_dim))
        fan = module_dim * length_kernel * module_kernel
        nn.init.uniform_(self.weight, -math.sqrt(3.0 / fan), math.sqrt(3.0 / fan))  # unit gain

    def extra_repr(self):
        return f"kernel={self.length_kernel}x{self.module_kernel}, causal={self.causal}"

    def patch_matrix(self) -> Tensor:
        """conv_patch_matrix of the weight, computed once for decoding (EvalCached)."""
        return self._cached("patch", (self.weight,), lambda: conv_patch_matrix(self.weight))

    def last_step(self, window: Tensor) -> Tensor:
        """Causal decoding: the output at the last of the window's F steps, (F, B, S, M) -> (1, B, S, M)."""
        return conv_last_step(window, self.patch_matrix(), self.bias, self.module_kernel).unsqueeze(0)

    def forward(self, x, prev: Optional[Tensor] = None):
        """x: (T, B, S, M). prev: (F−1, B, S, M) inputs before x (causal decoding state) or None
        (zeros: the sequence starts here). Returns (T, B, S, M)."""
        f = self.length_kernel
        if self.causal:
            if f > 1:
                left = prev if prev is not None else x.new_zeros(f - 1, *x.shape[1:])
                x = torch.cat([left, x], dim=0)
        elif f > 1:
            x = F.pad(x, (0, 0, 0, 0, 0, 0, (f - 1) // 2, f // 2))
        out = F.conv2d(x.permute(1, 3, 0, 2), self.weight, self.bias, padding=(0, self.module_kernel // 2))
        return out.permute(2, 0, 3, 1)  # (B, M, T, S) -> (T, B, S, M)


@with_incremental_state
class SparseQKVAttention(nn.Module):
    """Sparse QKV attention (§3.2), called like fairseq's MultiheadAttention (see module docstring)."""

    def __init__(self, embed_dim, num_heads, num_modules, length_kernel=3, module_kernel=3, causal=True,
                 encoder_decoder_attention=False, kdim=None, dropout=0.0):
        super().__init__()
        if embed_dim % num_modules:
            raise ValueError(f"--sparse-qkv-modules {num_modules} must divide the embedding dim {embed_dim}")
        if embed_dim % num_heads:
            raise ValueError(f"embedding dim {embed_dim} must be divisible by the number of heads {num_heads}")
        if encoder_decoder_attention and kdim not in (None, embed_dim):
            raise ValueError(f"sparse QKV cross-attention shares its multiplicative layer between decoder "
                             f"and encoder states: their dims must match ({embed_dim} vs {kdim})")
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.num_modules, self.module_dim = num_modules, embed_dim // num_modules
        self.scaling = self.head_dim ** -0.5
        self.encoder_decoder_attention, self.causal = encoder_decoder_attention, causal
        self.mult = MultiplicativeDense(embed_dim, num_modules, self.module_dim)  # shared by Q, K, V
        kv_causal = causal and not encoder_decoder_attention
        self.conv_q = ModuleConv(self.module_dim, length_kernel, module_kernel, causal=causal)
        self.conv_k = ModuleConv(self.module_dim, length_kernel, module_kernel, causal=kv_causal)
        self.conv_v = ModuleConv(self.module_dim, length_kernel, 1, causal=kv_causal)
        self.dropout_module = FairseqDropout(dropout, module_name=self.__class__.__name__)

    def _heads(self, x):
        """(L, B, S, M) -> (B, h, L, d/h)"""
        return x.reshape(x.size(0), x.size(1), self.num_heads, self.head_dim).permute(1, 2, 0, 3)

    @staticmethod
    def _zero_padding(m, padding_mask):
        if padding_mask is None or not padding_mask.any():
            return m
        return m.masked_fill(padding_mask.t().reshape(m.size(0), m.size(1), 1, 1), 0.0)

    def encoder_kv(self, key: Tensor, key_padding_mask: Optional[Tensor]):
        """Cross-attention keys and values of the encoder output key (S, B, C): the shared multiplicative
        layer, padded positions zeroed, the non-causal K and V convolutions; each (B, h, S, d/h)."""
        m = self._zero_padding(self.mult(key), key_padding_mask)
        return self._heads(self.conv_k(m)), self._heads(self.conv_v(m))

    def _one_step(self, t: int, state) -> bool:
        """An incremental decoding step of one token through causal convolutions (conv_last_step)."""
        return state is not None and t == 1 and self.causal and self.conv_q.causal and not self.training

    def _window(self, prev: Optional[Tensor], m: Tensor) -> Tensor:
        """The F multiplicative outputs a causal step's convolutions read: the F−1 kept (zeros at the start)
        and this step's m (1, B, S, M)."""
        f = self.conv_q.length_kernel
        if f == 1:
            return m
        return torch.cat([prev if prev is not None else m.new_zeros(f - 1, *m.shape[1:]), m], dim=0)

    def _advance(self, state, name, m, window: Optional[Tensor] = None):
        """Keep the last F−1 multiplicative outputs (the causal conv state) after this step's m; `window`:
        this step's _window when the one-step path built it already."""
        f = self.conv_q.length_kernel
        if state is None or f == 1:
            return
        hist = window if window is not None else self._window(state.get(name), m)
        state[name] = hist[-(f - 1):]

    def forward(self, query, key: Optional[Tensor], value: Optional[Tensor], key_padding_mask: Optional[Tensor] = None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                need_weights: bool = True, static_kv: bool = False, attn_mask: Optional[Tensor] = None,
                before_softmax: bool = False, need_head_weights: bool = False):
        """query: (T, B, C); key/value: (S, B, C) (the query itself for self-attention); key_padding_mask:
        (B, S) True at padding; attn_mask: (T, S) additive. Returns ((T, B, C), weights or None)."""
        if before_softmax:
            raise NotImplementedError("SparseQKVAttention does not return pre-softmax scores")
        t, b, _ = query.shape
        state = None
        if incremental_state is not None:
            state = self.get_incremental_state(incremental_state, "state")
            state = state if state is not None else {}
        if self.encoder_decoder_attention:
            m_q = self.mult(query)
            prev = state.get("conv_q") if state is not None else None
            window = self._window(prev, m_q) if self._one_step(t, state) else None
            q = self.conv_q.last_step(window) if window is not None else self.conv_q(m_q, prev)
            self._advance(state, "conv_q", m_q, window)
            if state is not None and "enc_k" in state:
                k, v, pad = state["enc_k"], state["enc_v"], state.get("enc_pad")
            else:
                (k, v), pad = self.encoder_kv(key, key_padding_mask), key_padding_mask
                if state is not None:
                    state.update(enc_k=k, enc_v=v)
                    if pad is not None:
                        state["enc_pad"] = pad
        else:
            m = self._zero_padding(self.mult(query), key_padding_mask)
            prev = state.get("conv") if (state is not None and self.causal) else None
            window = self._window(prev, m) if self._one_step(t, state) else None
            if window is not None:
                q, k, v = (c.last_step(window) for c in (self.conv_q, self.conv_k, self.conv_v))
            else:
                q, k, v = self.conv_q(m, prev), self.conv_k(m, prev), self.conv_v(m, prev)
            if self.causal:
                self._advance(state, "conv", m, window)
            k, v, pad = self._heads(k), self._heads(v), key_padding_mask
            if state is not None:  # append this step's key/value to the cache
                k, v, pad = append_to_cache(state, k, v, pad)
        if state is not None:
            self.set_incremental_state(incremental_state, "state", state)
        q = self._heads(q) * self.scaling  # (B, h, T, dh)
        scores = torch.matmul(q, k.transpose(2, 3))  # (B, h, T, S)
        scores = mask_scores(scores, pad, attn_mask)
        probs = attention_softmax(scores)
        ctx = torch.matmul(self.dropout_module(probs), v)  # (B, h, T, dh)
        out = ctx.permute(2, 0, 1, 3).reshape(t, b, self.embed_dim)  # no output dense layer (§3.2)
        weights = None
        if need_weights or need_head_weights:
            weights = probs.transpose(0, 1) if need_head_weights else probs.mean(dim=1)
        return out, weights

    def _get_input_buffer(self, incremental_state):
        """fairseq's decoder layer reads this for its cross_self_attention option (unsupported here)."""
        state = self.get_incremental_state(incremental_state, "state") if incremental_state is not None else None
        return state if state is not None else {}

    def _set_input_buffer(self, incremental_state, buffer):
        return self.set_incremental_state(incremental_state, "state", buffer)

    @torch.jit.export
    def reorder_incremental_state(self, incremental_state: Dict[str, Dict[str, Optional[Tensor]]], new_order: Tensor):
        state = self.get_incremental_state(incremental_state, "state")
        if state is not None:
            for name, value in state.items():
                if name.startswith("enc_"):  # encoder side: as fairseq, re-indexed only when the batch shrinks
                    if value.size(0) != new_order.size(0):
                        state[name] = value.index_select(0, new_order)
                elif name.startswith("conv"):  # (F−1, B, S, M)
                    state[name] = value.index_select(1, new_order)
                else:  # k, v (B, h, L, dh), pad (B, L)
                    state[name] = value.index_select(0, new_order)
            self.set_incremental_state(incremental_state, "state", state)
        return incremental_state


class SparseOutputProjection(nn.Module):
    """The final dense layer before the softmax as a multiplicative layer (§3.3): logits of a vocabulary
    of V = S·M entries, entry s·M + m = y[s, m]."""

    def __init__(self, embed_dim, vocab_size, sparsity, flag="--sparse-loss"):
        super().__init__()
        if sparsity < 1 or vocab_size % sparsity:
            divisors = [s for s in range(2, 17) if vocab_size % s == 0]
            raise ValueError(f"{flag} {sparsity}: the output vocabulary ({vocab_size} entries) must be divisible "
                             f"by the loss sparsity; use one of {divisors or 'none <= 16'} (fairseq pads "
                             f"dictionaries to a multiple of 8 with --padding-factor, default 8)")
        self.sparsity = sparsity
        self.mult = MultiplicativeDense(embed_dim, sparsity, vocab_size // sparsity)
        self.out_features = vocab_size

    def forward(self, x):
        return self.mult(x).flatten(-2)  # (…, V)
