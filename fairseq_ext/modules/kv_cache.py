"""The self-attention key/value caches of incremental decoding, shared by the attention modules of this
package (compressed, sparse QKV, shaped). `append_to_cache` grows the cache by concatenation, as fairseq's
own MultiheadAttention does; `write_to_cache` writes one step in place into a preallocated buffer that
doubles when full (the decoding ops read its valid prefix; `reorder_written_cache` reorders it in place
for beam search); `write_to_row_cache` keeps beside such buffers a table of which buffer row holds each
position of each hypothesis's history, so beam search reorders the table instead of the buffers
(`reorder_caches` reorders both kinds). `mask_scores` applies key padding and an additive mask for the sparse QKV and Terraformer
attentions.
"""
from typing import Dict, Optional

import torch
from torch import Tensor


def append_to_cache(state: Dict[str, Tensor], k: Tensor, v: Tensor, pad: Optional[Tensor], prefix: str = ""):
    """Append one step's keys and values (B, H, T, d_h) and key padding mask (B, T) or None to those
    cached in `state` under prefix + "k" / "v" / "pad"; stores and returns the full (k, v, pad). A mask
    is kept once any step had one (the steps without one are all real tokens)."""
    kk, vk, pk = prefix + "k", prefix + "v", prefix + "pad"
    if kk in state:
        cached = state[kk].size(2)
        k, v = torch.cat([state[kk], k], dim=2), torch.cat([state[vk], v], dim=2)
        prev_pad = state.get(pk)
        if prev_pad is not None or pad is not None:
            b, t = k.size(0), k.size(2) - cached
            prev_pad = prev_pad if prev_pad is not None else k.new_zeros(b, cached, dtype=torch.bool)
            pad = torch.cat([prev_pad, pad if pad is not None else k.new_zeros(b, t, dtype=torch.bool)], 1)
    state[kk], state[vk] = k, v
    if pad is not None:
        state[pk] = pad
    return k, v, pad


def _grow_if_full(state: Dict[str, Tensor], entries, n: int) -> bool:
    """For each (name, step) of `entries`: a first buffer (rows, H, 16, d), or, when its n positions fill it, one
    of twice the capacity holding them (rows: the step's, or the old buffer's when it has more). True when
    the buffers were (re)made."""
    name0 = entries[0][0]
    if name0 in state and n < state[name0].size(2):
        return False
    cap = max(16, 2 * n)
    for name, new in entries:
        old = state.get(name)
        buf = new.new_empty(max(new.size(0), old.size(0) if old is not None else 0), new.size(1), cap, new.size(2))
        if n:
            buf[: old.size(0), :, :n] = old[:, :, :n]
        state[name] = buf
    return True


def write_to_cache(state: Dict[str, Tensor], k: Tensor, v: Tensor, prefix: str = ""):
    """Write one step's key and value (B, H, d) at position n of the buffers (B, H, cap, d) kept in `state`
    under prefix + "kbuf" / "vbuf" (length under prefix + "len", a (B,) tensor, so beam reordering
    index-selects it like the buffers), doubling the capacity (16 at first) when full. Returns the
    buffers and the new length n + 1; positions from n + 1 on are unwritten."""
    kk, vk, lk = prefix + "kbuf", prefix + "vbuf", prefix + "len"
    n = int(state[lk][0]) if lk in state else 0
    _grow_if_full(state, ((kk, k), (vk, v)), n)
    state[kk][:, :, n] = k
    state[vk][:, :, n] = v
    state[lk] = torch.full((k.size(0),), n + 1, dtype=torch.long, device=k.device)
    return state[kk], state[vk], n + 1


def reorder_written_cache(state: Dict[str, Tensor], order: Tensor, prefix: str = ""):
    """Beam reordering of a write_to_cache state, in place: the valid prefix of each buffer is gathered
    and written back into the same buffer (its first len(order) entries: finished sentences leave the batch),
    and the length index-selected: no new buffer per step (the buffers' memory stays allocated and touched)."""
    kk, vk, lk = prefix + "kbuf", prefix + "vbuf", prefix + "len"
    n = int(state[lk][0])
    for name in (kk, vk):
        buf = state[name]
        moved = buf[:, :, :n].index_select(0, order)
        if order.numel() > buf.size(0):  # (beam search only shrinks the batch)
            buf = buf.new_empty(order.numel(), *buf.shape[1:])
        buf = buf[: order.numel()]
        buf[:, :, :n] = moved
        state[name] = buf
    state[lk] = state[lk].index_select(0, order)


def write_to_row_cache(state: Dict[str, Tensor], k: Tensor, v: Tensor, prefix: str = ""):
    """write_to_cache for a reader that follows a row table (ops.compressed_attention_decode's self_rows):
    one step's key and value (B, H, d) written at position n of buffer rows 0..B-1, and the table
    prefix + "rows" (B, cap) int64, whose entry [b, j] is the buffer row holding position j of row b's
    history, set to b at position n. Beam search reorders the table (reorder_caches), not the buffers: a new
    position is never in anyone's history, so writing it into rows other histories read at earlier
    positions is safe. Returns the buffers, the table and n + 1."""
    kk, vk, rk, nk = prefix + "kbuf", prefix + "vbuf", prefix + "rows", prefix + "n"
    b, n = k.size(0), state.get(nk, 0)
    if _grow_if_full(state, ((kk, k), (vk, v)), n):
        table = torch.empty(b, state[kk].size(2), dtype=torch.long, device=k.device)
        if n:
            table[:, :n] = state[rk][:, :n]
        state[rk] = table
    state[kk][:b, :, n] = k
    state[vk][:b, :, n] = v
    state[rk][:, n] = torch.arange(b, device=k.device)
    state[nk] = n + 1
    return state[kk], state[vk], state[rk], n + 1


def reorder_caches(state: Dict[str, Tensor], order: Tensor):
    """Beam reordering of every cache kept in `state`: write_to_cache's buffers in place
    (reorder_written_cache), write_to_row_cache's row table."""
    for key in [key for key in state if key.endswith("len")]:
        reorder_written_cache(state, order, key[: -len("len")])
    for key in [key for key in state if key.endswith("rows")]:
        state[key] = state[key].index_select(0, order)


def mask_scores(scores: Tensor, pad: Optional[Tensor], attn_mask: Optional[Tensor]) -> Tensor:
    """Attention scores (B, H, T, S) of the last T of S positions with key padding (B, S) and an additive
    mask over all positions (L, L) or None (its last T rows and S columns are used). Padded keys get the
    dtype's lowest finite value, then the additive mask is added: a query whose allowed keys are all
    padding (a padded position itself, in a sequence with padding before the real tokens) attends among
    those instead of producing NaN, and every other query gives exactly zero weight to padding."""
    if pad is not None and pad.any():
        lowest = max(torch.finfo(scores.dtype).min, torch.finfo(torch.float32).min)  # finite in a float32 softmax
        scores = scores.masked_fill(pad.view(pad.size(0), 1, 1, -1).to(torch.bool), lowest)
    if attn_mask is not None:
        t, s = scores.shape[-2:]
        scores = scores + attn_mask[-t:, -s:].to(scores.dtype)
    return scores


def attention_softmax(scores: Tensor) -> Tensor:
    """Softmax over the keys: in float32 for half-precision scores (as fairseq), in their own dtype
    otherwise (float64 stays float64, so float64 tests compare at float64 precision)."""
    half = scores.dtype in (torch.float16, torch.bfloat16)
    return torch.softmax(scores, dim=-1, dtype=torch.float32 if half else None).type_as(scores)


def reorder_batch_state(module, incremental_state, new_order: Tensor):
    """Beam reordering of a module whose incremental state "state" holds only batch-first tensors."""
    state = module.get_incremental_state(incremental_state, "state")
    if state is not None:
        module.set_incremental_state(incremental_state, "state",
                                     {name: value.index_select(0, new_order) for name, value in state.items()})
    return incremental_state
