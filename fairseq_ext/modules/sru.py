"""Simple recurrent unit (Lei et al. 2017) and Terraformer's low-rank recurrence (Jaszczur et al. 2021,
§4.3), as in the official trax code (docs/architecture.md, "Papers and their official code"):

    y_t, f_t, r_t = W x_t + b   split in three; f_t = σ(.), r_t = σ(.)          (SRU Eq. 1-3)
    c_t = f_t ⊙ c_{t-1} + (1 − f_t) ⊙ y_t                                      (SRU Eq. 4)
    h_t = r_t ⊙ c_t + (1 − r_t) ⊙ x_t · √3                                     (SRU Eq. 5; trax: no
                                                                               activation on c, √3 on x)
    LowRankRecurrence(x) = Up(SRU(Down(LayerNorm(x))))                          (§4.3: d_model -> 32 -> d_model)

The Terraformer adds LowRankRecurrence(x) to its FFN sub-layer's output (trax: Residual(block,
shortcut=ffn)). Padded positions (a padding mask) leave the state unchanged (f = 1, no input), so a
sequence gives the same states wherever its padding is, as trax's predict-mode mask does.
Training runs the c_t recurrence as a loop over time on (batch, width) tensors, in fp32 whatever the
autocast: the width is small (32), so each step is a few cheap elementwise ops. Its backward is written out
(`linear_recurrence`) instead of autograd recording and replaying the loop's per-step ops.
Incremental decoding keeps c in the incremental state.
"""
import math
from typing import Dict, Optional

import torch
from fairseq.incremental_decoding_utils import with_incremental_state
from fairseq.modules import LayerNorm
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from .kv_cache import reorder_batch_state

SQRT3 = math.sqrt(3.0)


def _recurrence(f: Tensor, u: Tensor, c0: Tensor) -> Tensor:
    cs = torch.empty_like(u)
    c = c0
    for t in range(u.size(0)):
        c = torch.addcmul(u[t], f[t], c)
        cs[t] = c
    return cs


class _LinearRecurrence(torch.autograd.Function):
    """c_t = f_t ⊙ c_{t-1} + u_t over t (SRU Eq. 4). Backward, with g_t the gradient reaching c_t from the
    output and from c_{t+1}: g_t = dL/dc_t + f_{t+1} ⊙ g_{t+1}; dL/df_t = g_t ⊙ c_{t-1}, dL/du_t = g_t,
    dL/dc_0 = f_1 ⊙ g_1."""

    @staticmethod
    def forward(ctx, f, u, c0):
        cs = _recurrence(f, u, c0)
        ctx.save_for_backward(f, cs, c0)
        return cs

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        f, cs, c0 = ctx.saved_tensors
        grad_f, grad_u = torch.empty_like(f), torch.empty_like(f)
        g = torch.zeros_like(c0)
        for t in range(f.size(0) - 1, -1, -1):
            g = g + grad[t]  # dL/dc_t + f_{t+1} g_{t+1} (the second term carried from step t+1)
            grad_u[t] = g
            torch.mul(g, cs[t - 1] if t > 0 else c0, out=grad_f[t])
            g = g * f[t]
        return grad_f, grad_u, g


def linear_recurrence(f: Tensor, u: Tensor, c0: Tensor) -> Tensor:
    """(T, B, D) states c_t = f_t ⊙ c_{t-1} + u_t from c0 (B, D), at least in fp32 (bf16 / fp16 inputs are
    promoted: the state accumulates over the whole sequence); the backward in O(T)."""
    dtype = torch.promote_types(torch.promote_types(f.dtype, u.dtype), torch.float32)
    f, u, c0 = f.to(dtype), u.to(dtype), c0.to(dtype)
    if torch.is_grad_enabled() and (f.requires_grad or u.requires_grad or c0.requires_grad):
        return _LinearRecurrence.apply(f, u, c0)
    return _recurrence(f, u, c0)


@with_incremental_state
class SRU(nn.Module):
    """One SRU layer of width `dim` over (T, B, dim) inputs (see module docstring)."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim
        self.proj = nn.Linear(dim, 3 * dim)
        nn.init.xavier_uniform_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, x: Tensor, padding_mask: Optional[Tensor] = None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None) -> Tensor:
        """x: (T, B, dim); padding_mask: (B, T) True at padding, or None."""
        y, f, r = self.proj(x).chunk(3, dim=-1)  # Eq. 1-3 (trax's order after the split: r, f, y is ours y, f, r)
        f, r = torch.sigmoid(f), torch.sigmoid(r)
        u = (1.0 - f) * y
        if padding_mask is not None and padding_mask.any():
            pad = padding_mask.t().unsqueeze(-1).to(torch.bool)  # (T, B, 1)
            f = f.masked_fill(pad, 1.0)
            u = u.masked_fill(pad, 0.0)
        state = self.get_incremental_state(incremental_state, "state") if incremental_state is not None else None
        c0 = state["c"] if state is not None else x.new_zeros(x.size(1), self.dim)
        cs = linear_recurrence(f, u, c0)  # Eq. 4, fp32
        if incremental_state is not None:
            self.set_incremental_state(incremental_state, "state", {"c": cs[-1].clone()})  # not a view of cs
        return r * cs.to(r.dtype) + (1.0 - r) * x * SQRT3  # Eq. 5

    @torch.jit.export
    def reorder_incremental_state(self, incremental_state: Dict[str, Dict[str, Optional[Tensor]]], new_order: Tensor):
        return reorder_batch_state(self, incremental_state, new_order)


class LowRankRecurrence(nn.Module):
    """Terraformer §4.3: LayerNorm, project d_model -> rank, `layers` SRUs, project back to d_model."""

    def __init__(self, embed_dim: int, rank: int = 32, layers: int = 1):
        super().__init__()
        self.norm = LayerNorm(embed_dim)
        self.down = nn.Linear(embed_dim, rank)
        self.srus = nn.ModuleList(SRU(rank) for _ in range(layers))
        self.up = nn.Linear(rank, embed_dim)

    def forward(self, x: Tensor, padding_mask: Optional[Tensor] = None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None) -> Tensor:
        h = self.down(self.norm(x))
        for sru in self.srus:
            h = sru(h, padding_mask, incremental_state)
        return self.up(h)
