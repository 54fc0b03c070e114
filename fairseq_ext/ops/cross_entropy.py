"""label_smoothed_ce: fairseq's label-smoothed cross-entropy straight from the logits (kernels:
csrc/cross_entropy.cpp, csrc/cpu/cross_entropy.cpp).

    loss, nll_loss = label_smoothed_ce(logits, target, epsilon, ignore_index)
        logits: (..., V) float32 / bfloat16 / float16; target: (...) int64 -> two scalars (float32)

The value and gradient of fairseq's `label_smoothed_nll_loss(log_softmax(logits.float()), target,
epsilon, ignore_index, reduce=True)` (`label_smoothed_ce_reference`, the spec), without its (rows, V)
float32 log-probabilities: the forward keeps each row's log-sum-exp, the backward writes
softmax − smoothed target in one pass, in the logits' dtype. The compiled op serves CPU tensors of the
dtypes in KERNEL_DTYPES; elsewhere the same function runs in PyTorch, a chunk of rows at a time.
"""
import torch

from . import kernels_enabled, has_kernel

KERNEL_DTYPES = {"cpu": (torch.float32, torch.bfloat16, torch.float16)}  # csrc/cpu/cross_entropy.cpp
CHUNK_ROWS = 1024  # rows converted to float32 at a time on the PyTorch path


def label_smoothed_ce_reference(logits, target, epsilon, ignore_index):
    from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss

    lprobs = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    return label_smoothed_nll_loss(lprobs.view(-1, lprobs.size(-1)), target.reshape(-1), epsilon,
                                   ignore_index=ignore_index, reduce=True)


def _kernel_applies(logits):
    return (kernels_enabled() and logits.dtype in KERNEL_DTYPES.get(logits.device.type, ())
            and has_kernel("label_smoothed_ce_fwd", logits.device.type))


def _rows_pytorch(logits, target, epsilon, ignore_index):
    """(N, 3) float32 [loss_i, nll_i, lse_i] as the kernel returns it."""
    n, v = logits.shape
    lse = torch.empty(n, dtype=torch.float32, device=logits.device)
    sums = torch.empty(n, dtype=torch.float64, device=logits.device)
    for s in range(0, n, CHUNK_ROWS):
        x = logits[s:s + CHUNK_ROWS].float()
        lse[s:s + CHUNK_ROWS] = torch.logsumexp(x, dim=-1)
        sums[s:s + CHUNK_ROWS] = x.sum(dim=-1, dtype=torch.float64)
    keep = target.ne(ignore_index)
    x_t = logits.gather(1, target.masked_fill(~keep, 0).unsqueeze(1)).squeeze(1).float()
    eps_i = epsilon / (v - 1)
    nll = (lse - x_t).double()
    loss = (1.0 - epsilon - eps_i) * nll + eps_i * (lse.double() * v - sums)
    out = torch.stack([loss.float(), nll.float(), lse], dim=1)
    return out.masked_fill_(~keep.unsqueeze(1), 0.0)


def _grad_pytorch(logits, target, lse, row_scale, epsilon, ignore_index):
    n, v = logits.shape
    eps_i = epsilon / (v - 1)
    c_t = 1.0 - epsilon - eps_i
    keep = target.ne(ignore_index)
    safe = target.masked_fill(~keep, 0).unsqueeze(1)
    scale = (row_scale * keep).unsqueeze(1)
    grad = torch.empty_like(logits)
    for s in range(0, n, CHUNK_ROWS):
        e = s + CHUNK_ROWS
        p = torch.exp(logits[s:e].float() - lse[s:e, None]).sub_(eps_i)
        p.scatter_add_(1, safe[s:e], torch.full_like(p[:, :1], -c_t))
        grad[s:e] = p.mul_(scale[s:e])
    return grad


class _LabelSmoothedCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, epsilon, ignore_index):
        if _kernel_applies(logits):
            rows = torch.ops.fairseq_ext.label_smoothed_ce_fwd(logits, target, epsilon, ignore_index)
        else:
            rows = _rows_pytorch(logits, target, epsilon, ignore_index)
        sums = rows[:, :2].sum(dim=0, dtype=torch.float64).float()
        ctx.save_for_backward(logits, target, rows[:, 2].contiguous())
        ctx.args = (epsilon, ignore_index)
        nll = sums[1]
        ctx.mark_non_differentiable(nll)
        return sums[0], nll

    @staticmethod
    def backward(ctx, grad_loss, _grad_nll):
        logits, target, lse = ctx.saved_tensors
        epsilon, ignore_index = ctx.args
        row_scale = grad_loss.float().expand(logits.size(0)).contiguous()
        if _kernel_applies(logits):
            grad = torch.ops.fairseq_ext.label_smoothed_ce_bwd(logits, target, lse, row_scale, epsilon, ignore_index)
        else:
            grad = _grad_pytorch(logits, target, lse, row_scale, epsilon, ignore_index)
        return grad, None, None, None


def label_smoothed_ce(logits, target, epsilon, ignore_index):
    """(loss, nll_loss) summed over the targets that are not ignore_index (see the module doc)."""
    v = logits.size(-1)
    return _LabelSmoothedCE.apply(logits.reshape(-1, v), target.reshape(-1), float(epsilon), int(ignore_index))


if hasattr(torch.library, "register_fake"):
    try:
        @torch.library.register_fake("fairseq_ext::label_smoothed_ce_fwd")
        def _ce_fwd_fake(logits, target, epsilon, ignore_index):
            return logits.new_empty(logits.size(0), 3, dtype=torch.float32)

        @torch.library.register_fake("fairseq_ext::label_smoothed_ce_bwd")
        def _ce_bwd_fake(logits, target, lse, row_scale, epsilon, ignore_index):
            return torch.empty_like(logits)
    except (RuntimeError, ValueError):  # extension not loaded (no such op), or registered already
        pass
