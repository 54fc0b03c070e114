"""Optimizers registered for fairseq-train (`--optimizer NAME`).

adam_no_decay_gains: fairseq's Adam (decoupled weight decay, i.e. AdamW) with --weight-decay applied
  to weight matrices only. Gains, norms and biases (every parameter with fewer than 2 dims, e.g. the
  shaped attention's α/β/γ, β_FF, RMSNorm weights) and any parameter marked `p.no_weight_decay = True`
  get weight decay 0, as in the Simplified Transformer blocks' official training setup. Usable with any
  arch: `--optimizer adam_no_decay_gains --weight-decay 0.1` (fp32 and --fp16-no-flatten-grads).
  A parameter with an `lr_scale` attribute (One Wide FFN's --shared-ffn-lr-scale) is put in a group whose
  learning rate is the scheduler's times that scale.
"""
from dataclasses import dataclass

from fairseq.optim import OPTIMIZER_REGISTRY, register_optimizer
from fairseq.optim.adam import FairseqAdam, FairseqAdamConfig


def weight_decay_groups(params):
    """[{matrices}, {gains, norms, biases: weight_decay 0}] from a flat parameter list, each split again by
    the parameters' `lr_scale` (groups with scale 1 first, so that group 0 carries the scheduler's rate);
    parameter groups given already are returned unchanged. Empty groups are dropped."""
    params = list(params)
    if params and isinstance(params[0], dict):
        return params
    groups = {}
    for p in params:
        decay = p.dim() >= 2 and not getattr(p, "no_weight_decay", False)
        scale = float(getattr(p, "lr_scale", 1.0))
        groups.setdefault((scale != 1.0, not decay, scale), []).append(p)
    out = []
    for (_, no_decay, scale), ps in sorted(groups.items()):
        g = {"params": ps}
        if no_decay:
            g["weight_decay"] = 0.0
        if scale != 1.0:
            g["lr_scale"] = scale
        out.append(g)
    return out


@dataclass
class AdamNoDecayGainsConfig(FairseqAdamConfig):
    pass


class AdamNoDecayGains(FairseqAdam):
    """fairseq's Adam, weight decay on weight matrices only (see module docstring)."""

    def __init__(self, cfg, params):
        super().__init__(cfg, weight_decay_groups(params))
        self.set_lr(self.param_groups[0]["lr"])

    def set_lr(self, lr):
        """The scheduler's rate for every group, times the group's lr_scale."""
        for group in self.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)


if "adam_no_decay_gains" not in OPTIMIZER_REGISTRY:  # idempotent: the package may be imported twice
    register_optimizer("adam_no_decay_gains", dataclass=AdamNoDecayGainsConfig)(AdamNoDecayGains)
