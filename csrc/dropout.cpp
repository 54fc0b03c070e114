// hashed_dropout: dropout whose mask is a hash of (seed, element index) instead of a draw from torch's
// generator, so the mask costs a few integer operations per element (torch's CPU bernoulli_ is ~5 ns per
// element on these machines, most of a dropout call) and the backward recomputes it from the seed instead
// of storing it. Schema and argument checks; the kernel is csrc/cpu/dropout.cpp. PyTorch reference:
// fairseq_ext/ops/dropout.py (the same mask bit for bit).
//
//   y_i = x_i / (1 − p)  if hash(seed, i) >> 8 >= round(p · 2^24),  else 0      (i: flat index)
// The backward is the same op on the gradient with the same seed. p is applied to 2^-24.
#include <torch/extension.h>

#include "dropout.h"

namespace fairseq_ext {

void check_hashed_dropout_args(const at::Tensor& x, double p) {
  TORCH_CHECK(p >= 0.0 && p < 1.0, "hashed_dropout: p must be in [0, 1), got ", p);
  TORCH_CHECK(x.numel() < (int64_t(1) << 32), "hashed_dropout: at most 2^32 elements, got ", x.numel());
}

}  // namespace fairseq_ext

TORCH_LIBRARY_FRAGMENT(fairseq_ext, m) {
  m.def("hashed_dropout(Tensor x, float p, int seed) -> Tensor");
}
