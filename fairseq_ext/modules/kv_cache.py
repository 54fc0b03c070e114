"""The self-attention key/value caches of incremental decoding, shared by the attention modules of this
package (compressed, sparse QKV, shaped). `append_to_cache` grows the cache by concatenation, as fairseq's
own MultiheadAttention does; `write_to_cache` writes one step in place into a preallocated buffer that
doubles when full (the decoding ops read its valid prefix).
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


def write_to_cache(state: Dict[str, Tensor], k: Tensor, v: Tensor, prefix: str = ""):
    """Write one step's key and value (B, H, d) at position n of the buffers (B, H, cap, d) kept in `state`
    under prefix + "kbuf" / "vbuf" (length under prefix + "len", a (B,) tensor, so beam reordering
    index-selects it like the buffers), doubling the capacity (16 at first) when full. Returns the
    buffers and the new length n + 1; positions from n + 1 on are unwritten."""
    kk, vk, lk = prefix + "kbuf", prefix + "vbuf", prefix + "len"
    n = int(state[lk][0]) if lk in state else 0
    if kk not in state or n == state[kk].size(2):
        cap = max(16, 2 * n)
        for name, new in ((kk, k), (vk, v)):
            buf = new.new_empty(new.size(0), new.size(1), cap, new.size(2))
            if n:
                buf[:, :, :n] = state[name][:, :, :n]
            state[name] = buf
    state[kk][:, :, n] = k
    state[vk][:, :, n] = v
    state[lk] = torch.full((k.size(0),), n + 1, dtype=torch.long, device=k.device)
    return state[kk], state[vk], n + 1
