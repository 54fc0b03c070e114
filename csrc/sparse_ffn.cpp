// sparse_ffn_decode: the top-1-of-N sparse FFN of Scaling Transformers (§3.1) for a few tokens,
// reading only the chosen row of W1 and of W2 per block. Schema and argument checks; the kernels are
// csrc/cpu/sparse_ffn.cpp and csrc/cuda/sparse_ffn{.cu,_host.cpp}. PyTorch reference: fairseq_ext/ops/sparse_ffn.py.
//
//   logits = (x·C1ᵀ)·C2ᵀ + c            (n, d_ff), blocks of N consecutive units
//   k[t,b] = argmax_j logits[t, b·N + j]  (first maximum; NaN counts as the maximum, as torch.argmax)
//   h[t,b] = ReLU(x_t · W1[b·N + k[t,b]])
//   y_t    = b2 + Σ_b h[t,b] · W2[b·N + k[t,b]]
// W1 and W2 are stored (d_ff, d): the selected rows are contiguous.
#include <torch/extension.h>

#include "sparse_ffn.h"

namespace fairseq_ext {

void check_sparse_ffn_args(const at::Tensor& x, const at::Tensor& c1, const at::Tensor& c2, const at::Tensor& cb,
                           const at::Tensor& w1, const at::Tensor& w2, const at::Tensor& b2, int64_t block_size) {
  TORCH_CHECK(x.dim() == 2, "sparse_ffn_decode: x must be (tokens, d_model), got ", x.sizes());
  const auto d = x.size(1);
  TORCH_CHECK(w1.dim() == 2 && w1.size(1) == d, "sparse_ffn_decode: W1 must be (d_ff, ", d, "), got ", w1.sizes());
  const auto d_ff = w1.size(0);
  TORCH_CHECK(w2.sizes() == w1.sizes(), "sparse_ffn_decode: W2 must be (d_ff, d_model) like W1, got ", w2.sizes());
  TORCH_CHECK(block_size >= 1 && d_ff % block_size == 0, "sparse_ffn_decode: block_size ", block_size,
              " must divide d_ff ", d_ff);
  TORCH_CHECK(c1.dim() == 2 && c1.size(1) == d, "sparse_ffn_decode: C1 must be (d_lowrank, d_model), got ", c1.sizes());
  TORCH_CHECK(c2.dim() == 2 && c2.size(0) == d_ff && c2.size(1) == c1.size(0),
              "sparse_ffn_decode: C2 must be (d_ff, d_lowrank), got ", c2.sizes());
  TORCH_CHECK(cb.dim() == 1 && cb.size(0) == d_ff, "sparse_ffn_decode: controller bias must be (d_ff), got ", cb.sizes());
  TORCH_CHECK(b2.dim() == 1 && b2.size(0) == d, "sparse_ffn_decode: b2 must be (d_model), got ", b2.sizes());
  for (const auto* t : {&c1, &c2, &cb, &w1, &w2, &b2}) {
    TORCH_CHECK(t->scalar_type() == x.scalar_type(), "sparse_ffn_decode: all tensors must have x's dtype ",
                x.scalar_type(), ", got ", t->scalar_type());
    TORCH_CHECK(t->device() == x.device(), "sparse_ffn_decode: all tensors must be on x's device");
  }
}

}  // namespace fairseq_ext

TORCH_LIBRARY_FRAGMENT(fairseq_ext, m) {
  m.def("sparse_ffn_decode(Tensor x, Tensor c1, Tensor c2, Tensor cb, Tensor w1, Tensor w2, Tensor b2, "
        "int block_size) -> Tensor");
}
