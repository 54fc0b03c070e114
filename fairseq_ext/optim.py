"""Optimizers registered for fairseq-train (`--optimizer NAME`).

adam_no_decay_gains: fairseq's Adam (decoupled weight decay, i.e. AdamW) with --weight-decay applied
  to weight matrices only. Gains, norms and biases (every parameter with fewer than 2 dims, e.g. the
  shaped attention's α/β/γ, β_FF, RMSNorm weights) and any parameter marked `p.no_weight_decay = True`
  get weight decay 0, as in the Simplified Transformer blocks' official training setup. Usable with any
  arch: `--optimizer adam_no_decay_gains --weight-decay 0.1` (fp32 and --fp16-no-flatten-grads).
"""
from dataclasses import dataclass

from fairseq.optim import OPTIMIZER_REGISTRY, register_optimizer
from fairseq.optim.adam import FairseqAdam, FairseqAdamConfig


def weight_decay_groups(params):
    """[{matrices}, {gains, norms, biases: weight_decay 0}] from a flat parameter list; parameter groups
    given already are returned unchanged. Empty groups are dropped."""
    params = list(params)
    if params and isinstance(params[0], dict):
        return params
    decay = [p for p in params if p.dim() >= 2 and not getattr(p, "no_weight_decay", False)]
    ids = {id(p) for p in decay}
    no_decay = [p for p in params if id(p) not in ids]
    groups = [{"params": decay}] if decay else []
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


@dataclass
class AdamNoDecayGainsConfig(FairseqAdamConfig):
    pass


class AdamNoDecayGains(FairseqAdam):
    """fairseq's Adam, weight decay on weight matrices only (see module docstring)."""

    def __init__(self, cfg, params):
        super().__init__(cfg, weight_decay_groups(params))


if "adam_no_decay_gains" not in OPTIMIZER_REGISTRY:  # idempotent: the package may be imported twice
    register_optimizer("adam_no_decay_gains", dataclass=AdamNoDecayGainsConfig)(AdamNoDecayGains)
