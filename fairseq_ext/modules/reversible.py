"""Reversible residual stacks (RevNet; Reformer §3; Terraformer, Jaszczur et al. 2021, §4.2).

A stack of functions f_1 … f_k acts on a pair (a, b); each f_i is one "swap":

    (a, b) -> (b, a + f_i(b))              inverse: a = c - f_i(b) from the output (b, c)

A Terraformer decoder block is three swaps (attention, attention, FFN), an encoder block two (attention,
FFN). Training through `ReversibleStack` stores only the stack's output pair: the backward pass walks the
swaps in reverse, recomputes each f_i(b) with autograd on, rebuilds the input from the output and
back-propagates through that one swap, so activation memory does not grow with depth.

Two things make the recomputed f_i(b) the forward's f_i(b) (paper §4.2: "recalculating these decisions
on the backwards pass leads to worse results"):
- random state: each swap's CPU/CUDA RNG state is saved before it runs and restored for the
  recomputation (dropout masks, Gumbel noise, the straight-through coin are the same);
- precision: the forward pass's autocast state is restored for the recomputation. Where only the forward
  is autocast (fairseq's --amp on a GPU, whose backward also runs on autograd's device thread, where no
  autocast is set), f_i would otherwise be recomputed in fp32, a different function from the forward's
  reduced-precision one (its gradient, and the input rebuilt from it, off by bf16's rounding), and slower.
  (CPU --bf16 training, fairseq_ext/precision.py, autocasts the whole step, backward included.)
- discrete decisions: a module that makes one (the sparse FFN's chosen unit per block) passes it through
  `decision(x)`; in the forward pass the value is recorded on the swap's tape, in the recomputation the
  recorded value is returned instead of the recomputed one (whose input was rebuilt by a subtraction and
  may differ in the last bits, enough to flip an argmax).
Without grad (eval, decoding) the stack is the plain loop, with the same maths.
"""
import contextlib
import functools
from typing import Callable, List, Optional

import torch
from torch import nn

_TAPES: List["DecisionTape"] = []  # the tape of the swap running now (innermost last)


class DecisionTape:
    """Discrete decisions of one swap: recorded in the forward pass, replayed in its recomputation."""

    def __init__(self):
        self.values: List[torch.Tensor] = []
        self.replaying, self.position = False, 0

    @contextlib.contextmanager
    def active(self, replay: bool):
        self.replaying, self.position = replay, 0
        _TAPES.append(self)
        try:
            yield self
        finally:
            _TAPES.pop()
            if replay and self.position != len(self.values):
                raise RuntimeError(f"reversible recomputation made {self.position} discrete decisions, the forward "
                                   f"pass {len(self.values)}: a module's decisions depend on something else")


def decision(value: torch.Tensor) -> torch.Tensor:
    """A module's discrete decision (e.g. argmax indices). Outside a reversible swap: `value` itself. Inside
    one: recorded in the forward pass, and the recorded tensor returned in the backward recomputation
    (compute `value` there too, so random numbers are drawn in the same order)."""
    if not _TAPES:
        return value
    tape = _TAPES[-1]
    if not tape.replaying:
        tape.values.append(value.detach())
        return value
    if tape.position >= len(tape.values):
        raise RuntimeError("reversible recomputation made more discrete decisions than the forward pass")
    recorded = tape.values[tape.position]
    tape.position += 1
    return recorded


def _rng_state(x: torch.Tensor):
    return torch.get_rng_state(), (torch.cuda.get_rng_state(x.device) if x.is_cuda else None)


def _autocast_state(x: torch.Tensor):
    """(device type, enabled, dtype, cache) of autocast for x's device now."""
    dev = x.device.type
    try:
        enabled, dtype = torch.is_autocast_enabled(dev), torch.get_autocast_dtype(dev)
    except TypeError:  # torch < 2.4: per-device functions
        if dev == "cpu":
            enabled, dtype = torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype()
        else:
            enabled, dtype = torch.is_autocast_enabled(), torch.get_autocast_gpu_dtype()
    return dev, enabled, dtype, torch.is_autocast_cache_enabled()


def _restored_autocast(state):
    dev, enabled, dtype, cache = state
    return torch.autocast(device_type=dev, dtype=dtype, enabled=enabled, cache_enabled=cache)


@contextlib.contextmanager
def _restored_rng(state, x: torch.Tensor):
    devices = [x.device] if x.is_cuda else []
    with torch.random.fork_rng(devices=devices):
        torch.set_rng_state(state[0])
        if state[1] is not None:
            torch.cuda.set_rng_state(state[1], x.device)
        yield


class _ReversibleFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, anchor, fns):  # anchor: an empty tensor that requires grad (see ReversibleStack)
        ctx.fns, ctx.swaps, ctx.autocast = fns, [], _autocast_state(b)
        inputs = (a, b)
        with torch.no_grad():
            for f in fns:
                state, tape = _rng_state(b), DecisionTape()
                with tape.active(replay=False):
                    fb = f(b)
                a, b = b, a + fb
                ctx.swaps.append((state, tape))
        a, b = (t.clone() if any(t is i for i in inputs) else t for t in (a, b))  # outputs are new tensors
        ctx.save_for_backward(a, b)
        return a, b

    @staticmethod
    def backward(ctx, grad_a, grad_b):
        y1, y2 = ctx.saved_tensors  # the output pair (b, a + f(b)) of the last swap
        for f, (state, tape) in zip(reversed(ctx.fns), reversed(ctx.swaps)):
            x2 = y1.detach().requires_grad_(True)
            with torch.enable_grad(), _restored_autocast(ctx.autocast), _restored_rng(state, x2), \
                    tape.active(replay=True):
                fx2 = f(x2)
            with torch.no_grad():
                x1 = y2 - fx2  # the swap's first input, rebuilt
            # y1 = x2, y2 = x1 + f(x2): dL/dx1 = dL/dy2; dL/dx2 = dL/dy1 + f'(x2)ᵀ dL/dy2 (parameters too)
            torch.autograd.backward(fx2, grad_b.to(fx2.dtype))  # a + f(b) cast f(b) up: its gradient down
            grad_a, grad_b = grad_b, grad_a + x2.grad
            y1, y2 = x1, x2.detach()
        return grad_a, grad_b, None, None


class ReversibleStack(nn.Module):
    """Swaps (a, b) -> (b, a + f_i(b)) over `blocks` (modules called as block(x, **kwargs)). With grad
    enabled and `reversible` on, activations are recomputed in the backward pass instead of stored."""

    def __init__(self, blocks: List[nn.Module], reversible: bool = True):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.reversible = reversible
        self._anchor = None

    def forward(self, a: torch.Tensor, b: torch.Tensor, **kwargs):
        fns: List[Callable] = [functools.partial(blk, **kwargs) for blk in self.blocks]
        if not (self.reversible and torch.is_grad_enabled()):
            for f in fns:
                a, b = b, a + f(b)
            return a, b
        # the autograd Function runs its backward only if an input requires grad; the parameters of the
        # blocks are reached from inside it, so an empty anchor that requires grad is passed along
        anchor = a.new_empty(0).requires_grad_(True)
        return _ReversibleFunction.apply(a, b, anchor, fns)


def reversible_pair_init(x: torch.Tensor):
    """The Reformer convention: both halves of the pair start as the layer input."""
    return x, x


def reversible_pair_merge(a: torch.Tensor, b: torch.Tensor, how: Optional[str] = "mean"):
    """Back to one stream after the stack: the mean of the pair (trax averages; 'concat' for a projection)."""
    return (a + b) / 2 if how == "mean" else torch.cat([a, b], dim=-1)
