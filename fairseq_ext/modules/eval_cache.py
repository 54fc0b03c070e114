"""EvalCached: a module whose decoding reads matrices derived from its parameters at every step
(the multiplicative layer's W, the module convolution's patch matrix, CAN's fused input projection)
and computes them once for the eval-mode forwards without autograd.

`self._cached(name, params, compute)` returns compute() fresh in training mode and whenever autograd
may reach one of `params` (so gradients flow as through the plain layers); otherwise it returns the
value computed the last time, recomputed when a parameter's storage, in-place version or dtype changed.
The version alone is not enough: fairseq's optimizers write parameters through .data, which keeps it.
So the cache is also dropped on every train()/eval() call, which fairseq makes around every training
step, validation and generation. A train-mode forward without autograd (a reversible layer's
recomputation) never reads the cache.
"""
import torch
from torch import nn


def parameter_key(params):
    """What a matrix derived from `params` is checked against: storage, in-place version, dtype and device
    of each (a write through .data changes none of them, hence the drop on train()/eval())."""
    return tuple((p.data_ptr(), p._version, p.dtype, p.device) for p in params)


class EvalCached(nn.Module):
    def train(self, mode: bool = True):
        self.__dict__["_eval_cache"] = {}
        return super().train(mode)

    def _cached(self, name, params, compute):
        if self.training or (torch.is_grad_enabled() and any(p.requires_grad for p in params)):
            return compute()
        key = parameter_key(params)
        cache = self.__dict__.setdefault("_eval_cache", {})
        if name not in cache or cache[name][0] != key:
            cache[name] = (key, compute())
        return cache[name][1]
