"""The self-attention key/value cache of incremental decoding, shared by the attention modules of this
package (compressed, sparse QKV, shaped). fairseq's own MultiheadAttention keeps its cache the same way.
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
