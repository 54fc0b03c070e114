"""Several Linear layers that read the same input as one matrix product at decoding time.

`concat_linear(modules)` is their weights concatenated along the output dimension and their biases likewise
(zeros for a layer without bias: the same sums). A module that may be trained between decodes keeps it
through EvalCached (modules/eval_cache.py: CAN's fused input projection, q, k, v and X·W1).
`FusedLinearWeights(modules).get()` is the same, detached, built on first use and rebuilt when any
parameter's storage, in-place version, dtype or device changes: for the fast decoding path's fused Q/K/V,
which lives in a generator built for decoding (writes through .data, what fairseq's optimizers do, keep
the version). The copy costs one more set of those weights in memory.
"""
from typing import Sequence, Tuple

import torch
from torch import Tensor, nn

from .eval_cache import parameter_key


def linear_parameters(modules: Sequence[nn.Linear]):
    return [p for m in modules for p in (m.weight, m.bias) if p is not None]


def concat_linear(modules: Sequence[nn.Linear]) -> Tuple[Tensor, Tensor]:
    weight = torch.cat([m.weight for m in modules])
    bias = torch.cat([m.bias if m.bias is not None else m.weight.new_zeros(m.out_features) for m in modules])
    return weight, bias


class FusedLinearWeights:
    def __init__(self, modules: Sequence[nn.Linear]):
        self.modules = tuple(modules)
        self.sizes = [m.out_features for m in self.modules]
        self._key, self._fused = None, None

    def get(self) -> Tuple[Tensor, Tensor]:
        key = parameter_key(linear_parameters(self.modules))
        if key != self._key:
            with torch.no_grad():
                self._fused = concat_linear(self.modules)
            self._key = key
        return self._fused
