"""Several Linear layers that read the same input as one matrix product at decoding time.

`FusedLinearWeights(modules).get()` returns their weights concatenated along the output dimension and their
biases likewise (zeros for a layer without bias: the same sums), built on first use and rebuilt when any
parameter's storage, in-place version, dtype or device changes. Writes through .data (what
fairseq's optimizers do) keep the version: an owner whose weights may be trained between uses drops it on
train()/eval() (CAN's fused input projection, q, k, v and X·W1); the fast decoding path's fused Q/K/V
lives in a generator built for decoding. The copy costs one more set of those weights in memory.
"""
from typing import Sequence, Tuple

import torch
from torch import Tensor, nn


class FusedLinearWeights:
    def __init__(self, modules: Sequence[nn.Linear]):
        self.modules = tuple(modules)
        self.sizes = [m.out_features for m in self.modules]
        self._key, self._fused = None, None

    def get(self) -> Tuple[Tensor, Tensor]:
        params = [p for m in self.modules for p in (m.weight, m.bias) if p is not None]
        key = tuple((p.data_ptr(), p._version, p.dtype, p.device) for p in params)
        if key != self._key:
            with torch.no_grad():
                weight = torch.cat([m.weight for m in self.modules]).detach()
                bias = torch.cat([m.bias if m.bias is not None else m.weight.new_zeros(m.out_features)
                                  for m in self.modules]).detach()
            self._fused, self._key = (weight, bias), key
        return self._fused
