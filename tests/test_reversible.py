"""Reversible residual stacks (fairseq_ext/modules/reversible.py; Terraformer §4.2): gradients equal the
plain (storing) stack's in float64, with dropout and with the sparse FFN's discrete choices."""
import pytest
import torch
from torch import nn

from fairseq_ext.modules.reversible import ReversibleStack, decision
from fairseq_ext.modules.sparse_feedforward import SparseFeedForward


class Block(nn.Module):
    """LayerNorm -> Linear -> tanh -> dropout: a stand-in for an attention or FFN sub-layer."""

    def __init__(self, d, p=0.0):
        super().__init__()
        self.norm, self.lin, self.drop = nn.LayerNorm(d), nn.Linear(d, d), nn.Dropout(p)

    def forward(self, x, scale=1.0):
        return self.drop(torch.tanh(self.lin(self.norm(x)))) * scale


class SparseBlock(nn.Module):
    def __init__(self, d, d_ff, n):
        super().__init__()
        self.ffn = SparseFeedForward(d, d_ff, n, quant_prob=0.5)

    def forward(self, x):
        return self.ffn(x)


def _grads(stack, a, b, seed, **kwargs):
    for p in stack.parameters():
        p.grad = None
    a, b = a.clone().requires_grad_(True), b.clone().requires_grad_(True)
    torch.manual_seed(seed)
    ya, yb = stack(a, b, **kwargs)
    loss = (ya * torch.linspace(-1, 1, ya.numel(), dtype=ya.dtype).view_as(ya)).sum() + (yb ** 2).sum()
    loss.backward()
    return [ya.detach(), yb.detach(), a.grad, b.grad] + [p.grad.clone() for p in stack.parameters()]


def _compare(blocks, shape, seed=3, **kwargs):
    torch.manual_seed(0)
    stack = ReversibleStack(blocks).double().train()
    a, b = torch.randn(*shape, dtype=torch.float64), torch.randn(*shape, dtype=torch.float64)
    stack.reversible = False
    plain = _grads(stack, a, b, seed, **kwargs)
    stack.reversible = True
    rev = _grads(stack, a, b, seed, **kwargs)
    assert len(plain) == len(rev)
    for x, y in zip(plain, rev):
        torch.testing.assert_close(y, x, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("swaps", [1, 2, 3, 6])
def test_gradients_equal_the_plain_stack(swaps):
    _compare([Block(12) for _ in range(swaps)], (5, 3, 12), scale=0.7)


def test_dropout_masks_are_replayed():
    _compare([Block(12, p=0.3) for _ in range(3)], (7, 2, 12))


def test_sparse_ffn_choices_are_replayed():
    """Terraformer's decoder block with sparse FFNs in training mode (Gumbel noise, straight-through with
    probability 0.5): the recomputation reuses the forward pass's choices and random numbers."""
    _compare([Block(16, p=0.1), Block(16, p=0.1), SparseBlock(16, 48, 8)] * 2, (6, 2, 16))


def test_decisions_come_from_the_tape_not_the_recomputation():
    calls = []

    class Chooser(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            idx = decision(torch.full((1,), len(calls)))  # a different "decision" every call
            calls.append(int(idx))
            return self.lin(x) * (idx.to(x.dtype) + 1)

    stack = ReversibleStack([Chooser()])
    a, b = torch.randn(2, 4, requires_grad=True), torch.randn(2, 4, requires_grad=True)
    ya, yb = stack(a, b)
    yb.sum().backward()
    assert calls == [0, 0]  # the backward recomputation got the recorded 0, not its own 1


def test_eval_and_no_grad_are_the_plain_loop():
    torch.manual_seed(0)
    stack = ReversibleStack([Block(8) for _ in range(3)]).eval()
    a, b = torch.randn(2, 8), torch.randn(2, 8)
    with torch.no_grad():
        ya, yb = stack(a, b)
    x1, x2 = a, b
    for blk in stack.blocks:
        x1, x2 = x2, x1 + blk(x2)
    assert torch.equal(ya, x1) and torch.equal(yb, x2)


@pytest.mark.parametrize("swaps", [2, 8])
def test_saved_activations_do_not_grow_with_depth(swaps):
    """What autograd keeps for the backward pass: the plain stack saves every block's activations, the
    reversible one only its output pair."""
    def saved_bytes(reversible):
        stack = ReversibleStack([Block(32) for _ in range(swaps)], reversible=reversible).train()
        a, b = torch.randn(64, 32, requires_grad=True), torch.randn(64, 32, requires_grad=True)
        total = [0]

        def pack(t):
            if not isinstance(t, nn.Parameter):
                total[0] += t.numel() * t.element_size()
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            ya, yb = stack(a, b)
        return total[0]

    pair = 2 * 64 * 32 * 4
    assert saved_bytes(True) <= pair
    assert saved_bytes(False) >= swaps * 64 * 32 * 4
