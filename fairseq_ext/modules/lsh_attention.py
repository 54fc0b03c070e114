"""LSH self-attention (Reformer, Kitaev et al. 2020 §2-3), the long-sequence attention of the Terraformer
(Jaszczur et al. 2021 §4), called like fairseq's MultiheadAttention (query = key = value).

Shared query/key: one projection qk; keys are the unit-normalised qk (Reformer §2 "shared-QK").
Hashing (Reformer Eq. 3 / §2 "LSH"): h(x) = argmax([xR; −xR]) with a random rotation R of d_h × b/2 per
hash round, b buckets. Per round, positions are sorted by (bucket, position) and cut in chunks of c;
each chunk attends to itself and the chunk before it (Reformer Fig. 2; trax wraps around, the first chunk
looking at the last: here the first chunk has none, so that a sequence's result does not depend on the
padding its batch gives it — padded positions are sorted after every real one). A position attends to itself only when nothing else is allowed (score −1e5, trax's mask_self);
causal: later keys masked; padded keys masked. Rounds are combined by their log-sum-exp weights
(Reformer §2 "multi-round LSH": softmax over the rounds' normalisers). Memory and time are O(n·L·2c)
instead of O(L²) (n rounds).
Rotations: fresh random numbers in training (drawn from torch's generator, so a reversible layer's
recomputation replays them); a fixed seeded R in eval, so decoding hashes as the full forward does. The
buckets are a discrete decision (modules/reversible.py): a reversible layer reuses the forward's.
Short inputs (L ≤ c: one chunk) take full attention with the same parameters and masks.
Incremental decoding: the first call (the concatenated prefix) is a full forward that also caches keys,
values and each position's buckets; a later position attends to the cached positions that share a bucket
with it in any round (the limit of the chunked approximation, which is what Reformer decodes with), or to
all of them while the sequence (its own length, not its batch's) is at most one chunk long (the
full-attention fallback).
"""
import math
from typing import Dict, Optional

import torch
import torch.nn.functional as F
from fairseq.incremental_decoding_utils import with_incremental_state
from fairseq.modules.fairseq_dropout import FairseqDropout
from torch import Tensor, nn

from .kv_cache import reorder_batch_state
from .reversible import decision

SELF_SCORE = -1e5  # a position's score for itself (used only when no other key is allowed)
MASKED = -1e9


def _float(scores):
    """Half-precision scores go to float32: the mask values (−1e5, −1e9) do not fit in float16."""
    return scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores


def unit(x: Tensor) -> Tensor:
    """x / ||x|| over the last dim, computed in float32 (F.normalize's eps 1e-12 is 0 in float16, so a
    zero vector — a padded position — would give 0/0); returned in x's dtype."""
    return F.normalize(x.float(), dim=-1).to(x.dtype)


def _rotations(gen_seed: Optional[int], head_dim, n_hashes, n_buckets, like: Tensor):
    shape = (head_dim, n_hashes, n_buckets // 2)
    if gen_seed is None:  # training: fresh rotations
        return torch.randn(shape, dtype=like.dtype, device=like.device)
    g = torch.Generator().manual_seed(gen_seed)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(like)


def hash_buckets(qk: Tensor, rot: Tensor) -> Tensor:
    """(B, H, L, D) x (D, n, b/2) -> bucket ids (B, H, n, L): argmax([xR; -xR]) of the unit vectors."""
    r = torch.einsum("bhld,dnr->bhnlr", unit(qk), rot)
    return torch.cat([r, -r], dim=-1).argmax(dim=-1)


def _scores_masks(scores, q_pos, k_pos, k_pad, causal):
    """Apply padding, causal and self masks to scores (..., Lq, Lk) with positions (..., Lq) / (..., Lk)."""
    if k_pad is not None:
        scores = scores.masked_fill(k_pad.unsqueeze(-2), MASKED)
    if causal:
        scores = scores.masked_fill(k_pos.unsqueeze(-2) > q_pos.unsqueeze(-1), MASKED)
    return scores.masked_fill(k_pos.unsqueeze(-2) == q_pos.unsqueeze(-1), SELF_SCORE)


def lsh_attention(qk: Tensor, v: Tensor, buckets: Tensor, chunk: int, causal: bool, pad: Optional[Tensor],
                  dropout=None):
    """Chunked LSH attention. qk, v: (B, H, L, D); buckets (B, H, n, L); pad (B, L) True at padding or
    None. Returns (B, H, L, D)."""
    b, h, length, d = qk.shape
    n = buckets.size(2)
    extra = (-length) % chunk  # pad the length to whole chunks with masked positions
    pos = torch.arange(length + extra, device=qk.device)
    key_pad = torch.zeros(b, length + extra, dtype=torch.bool, device=qk.device)
    if pad is not None:
        key_pad[:, :length] = pad
    key_pad[:, length:] = True
    if extra:
        qk, v = F.pad(qk, (0, 0, 0, extra)), F.pad(v, (0, 0, 0, extra))
        buckets = F.pad(buckets, (0, extra))
    # every padded position (the sequence's padding and the whole-chunk filler) after every real one: a
    # sentence's real positions fill the same chunks whatever padding its batch gives it
    buckets = buckets.masked_fill(key_pad.view(b, 1, 1, -1), int(buckets.max()) + 1)
    total = length + extra
    order = (buckets * total + pos).argsort(dim=-1)  # (B, H, n, L'): by bucket, then position
    chunks = total // chunk

    def gather(x):  # (B, H, L', D) -> sorted per round (B, H, n, C, c, D)
        idx = order.unsqueeze(-1).expand(-1, -1, -1, -1, x.size(-1))
        return x.unsqueeze(2).expand(-1, -1, n, -1, -1).gather(3, idx).view(b, h, n, chunks, chunk, x.size(-1))

    def look_back(x):  # (B, H, n, C, c, ...) -> each chunk with the one before it (wrapping), (.., C, 2c, ..)
        return torch.cat([x.roll(1, dims=3), x], dim=4)

    sq = gather(qk)
    sk = look_back(unit(sq))
    sv = look_back(gather(v))
    spos = order.view(b, h, n, chunks, chunk)
    kpos = look_back(spos)
    kpad = look_back(key_pad.view(b, 1, 1, total).expand(-1, h, n, -1).gather(3, order).view(b, h, n, chunks, chunk))
    kpad[..., 0, :chunk] = True  # the first chunk has no chunk before it (no wrap-around to the last one)
    scores = _float(torch.matmul(sq, sk.transpose(-1, -2)) / math.sqrt(d))  # (B, H, n, C, c, 2c)
    scores = _scores_masks(scores, spos, kpos, kpad, causal)
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    probs = torch.exp(scores - lse).type_as(sv)
    if dropout is not None:
        probs = dropout(probs)
    out = torch.matmul(probs, sv).view(b, h, n, total, d)  # sorted order
    undo = order.argsort(dim=-1)
    out = out.gather(3, undo.unsqueeze(-1).expand(-1, -1, -1, -1, d))
    lse = lse.view(b, h, n, total).gather(3, undo)
    weights = torch.softmax(lse, dim=2).unsqueeze(-1).type_as(out)  # rounds combined by their normalisers
    return (out * weights).sum(dim=2)[:, :, :length]


@with_incremental_state
class LSHSelfAttention(nn.Module):
    """Shared-QK multi-head self-attention with LSH bucketing for inputs longer than one chunk."""

    def __init__(self, embed_dim: int, num_heads: int, causal: bool, chunk: int = 64, n_buckets: int = 16,
                 n_hashes: int = 2, dropout: float = 0.0, seed: int = 0):
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"embedding dim {embed_dim} must be divisible by the number of heads {num_heads}")
        if n_buckets < 2 or n_buckets % 2:
            raise ValueError(f"--lsh-buckets {n_buckets}: must be even and >= 2 (argmax over [xR; -xR])")
        if chunk < 1 or n_hashes < 1:
            raise ValueError(f"--lsh-chunk {chunk} / --lsh-hashes {n_hashes}: must be >= 1")
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.causal, self.chunk, self.n_buckets, self.n_hashes, self.seed = causal, chunk, n_buckets, n_hashes, seed
        self.qk_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)
        for lin in (self.qk_proj, self.v_proj, self.out_proj):
            nn.init.xavier_uniform_(lin.weight, gain=1.0 if lin is self.out_proj else 2 ** -0.5)
            nn.init.zeros_(lin.bias)
        self.dropout_module = FairseqDropout(dropout, module_name=self.__class__.__name__)

    def extra_repr(self):
        return f"causal={self.causal}, chunk={self.chunk}, buckets={self.n_buckets}, hashes={self.n_hashes}"

    def _heads(self, x):  # (T, B, d) -> (B, h, T, d/h)
        return x.reshape(x.size(0), x.size(1), self.num_heads, self.head_dim).permute(1, 2, 0, 3)

    def _buckets(self, qk):
        rot = _rotations(None if self.training else self.seed, self.head_dim, self.n_hashes, self.n_buckets, qk)
        # a discrete decision: inside a reversible layer the forward pass's buckets are replayed (the
        # rebuilt input differs in the last bits, enough to move positions near a bucket boundary; §4.2)
        return decision(hash_buckets(qk, rot))

    def _full(self, q, k, v, q_pos, k_pos, pad, allowed=None):
        scores = _float(torch.matmul(q, unit(k).transpose(-1, -2)) / math.sqrt(self.head_dim))
        if allowed is not None:
            scores = scores.masked_fill(~allowed, MASKED)
        k_pad = pad.view(pad.size(0), 1, -1) if pad is not None else None  # (B, 1, L): heads broadcast
        scores = _scores_masks(scores, q_pos, k_pos, k_pad, self.causal)
        probs = torch.softmax(scores, dim=-1).type_as(v)
        return torch.matmul(self.dropout_module(probs), v)

    def forward(self, query: Tensor, key: Optional[Tensor] = None, value: Optional[Tensor] = None,
                key_padding_mask: Optional[Tensor] = None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                need_weights: bool = False, attn_mask: Optional[Tensor] = None, **unused):
        """query (T, B, d); key_padding_mask (B, T); attn_mask is ignored (the causal mask is built in)."""
        t, b, _ = query.shape
        qk, v = self._heads(self.qk_proj(query)), self._heads(self.v_proj(query))
        state = None
        if incremental_state is not None:
            state = self.get_incremental_state(incremental_state, "state")
        if state is not None:  # a later decoding step: the cached positions, then this one
            if t != 1:
                raise ValueError("LSH attention decodes one position per step after the first")
            k = torch.cat([state["k"], qk], dim=2)
            vv = torch.cat([state["v"], v], dim=2)
            pad = torch.cat([state["pad"], state["pad"].new_zeros(b, 1)], dim=1)
            length = k.size(2)
            k_pos = torch.arange(length, device=qk.device)
            buckets = torch.cat([state["buckets"], self._buckets(qk)], dim=3)  # (B, H, n, L)
            allowed = None
            if length > self.chunk:  # the cached positions sharing a bucket with this one in some round, in
                # the rows whose own (unpadded) length exceeds a chunk; the others attend to all positions
                allowed = (buckets == buckets[..., -1:]).any(dim=2).unsqueeze(2)  # (B, H, 1, L)
                short = (~pad).sum(dim=1) <= self.chunk  # (B,)
                allowed = allowed | short.view(b, 1, 1, 1)
            out = self._full(qk, k, vv, k_pos[-1:], k_pos, pad, allowed)
            state.update(k=k, v=vv, pad=pad, buckets=buckets)
        else:
            pad = key_padding_mask if key_padding_mask is not None else query.new_zeros(b, t, dtype=torch.bool)
            pos = torch.arange(t, device=qk.device)
            buckets = self._buckets(qk) if (t > self.chunk or incremental_state is not None) else None
            if t > self.chunk:
                out = lsh_attention(qk, v, buckets, self.chunk, self.causal, pad, self.dropout_module)
            else:
                out = self._full(qk, qk, v, pos, pos, pad)
            if incremental_state is not None:
                state = {"k": qk, "v": v, "pad": pad.to(torch.bool), "buckets": buckets}
        if incremental_state is not None:
            self.set_incremental_state(incremental_state, "state", state)
        return self.out_proj(out.permute(2, 0, 1, 3).reshape(t, b, self.embed_dim)), None

    @torch.jit.export
    def reorder_incremental_state(self, incremental_state: Dict[str, Dict[str, Optional[Tensor]]], new_order: Tensor):
        return reorder_batch_state(self, incremental_state, new_order)
