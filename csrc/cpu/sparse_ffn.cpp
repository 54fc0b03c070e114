// CPU kernel of sparse_ffn_decode (schema and maths: csrc/sparse_ffn.cpp).
// The controller is two small GEMMs (ATen/BLAS). The selected rows are read once each: phase 1 computes
// h[t,b] (one dot product of length d per token and block, parallel over blocks), phase 2 accumulates
// y_t over the selected rows of W2 (parallel over chunks of the output dimension, so each thread
// streams its slice of every selected row). Inner loops are csrc/cpu/vec.h's dot and axpy (AVX2+FMA
// clone picked at run time). Deterministic: fixed summation order, no atomics.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <vector>

#include "cpu/vec.h"
#include "sparse_ffn.h"

namespace fairseq_ext {

namespace {

template <typename T>
void sparse_ffn_kernel(const T* x, const T* logits, const T* w1, const T* w2, const T* b2, T* y, int64_t n,
                       int64_t d, int64_t d_ff, int64_t block) {
  const int64_t blocks = d_ff / block;
  std::vector<int64_t> rows(n * blocks);
  std::vector<T> h(n * blocks);
  // phase 1: choice per block (first maximum; NaN wins, as torch.argmax) and h = ReLU(x · W1[row])
  at::parallel_for(0, n * blocks, 64, [&](int64_t begin, int64_t end) {
    for (int64_t tb = begin; tb < end; ++tb) {
      const int64_t t = tb / blocks, b = tb % blocks;
      const T* l = logits + t * d_ff + b * block;
      int64_t best = 0;
      for (int64_t j = 1; j < block && !std::isnan(l[best]); ++j)
        if (std::isnan(l[j]) || l[j] > l[best]) best = j;
      const int64_t row = b * block + best;
      rows[tb] = row;
      const T v = dot(x + t * d, w1 + row * d, d);
      h[tb] = v > T(0) ? v : T(0);
    }
  });
  // phase 2: y_t = b2 + Σ_b h[t,b] · W2[row], each thread owning a slice of the output dimension
  const int64_t chunk = 64;
  const int64_t slices = (d + chunk - 1) / chunk;
  at::parallel_for(0, n * slices, 1, [&](int64_t begin, int64_t end) {
    for (int64_t ts = begin; ts < end; ++ts) {
      const int64_t t = ts / slices, lo = (ts % slices) * chunk, len = std::min(chunk, d - lo);
      T* out = y + t * d + lo;
      for (int64_t i = 0; i < len; ++i) out[i] = b2[lo + i];
      for (int64_t b = 0; b < blocks; ++b) {
        const T hv = h[t * blocks + b];
        if (hv != T(0)) axpy(hv, w2 + rows[t * blocks + b] * d + lo, out, len);
      }
    }
  });
}

at::Tensor sparse_ffn_decode_cpu(const at::Tensor& x, const at::Tensor& c1, const at::Tensor& c2,
                                 const at::Tensor& cb, const at::Tensor& w1, const at::Tensor& w2,
                                 const at::Tensor& b2, int64_t block_size) {
  check_sparse_ffn_args(x, c1, c2, cb, w1, w2, b2, block_size);
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble,
              "sparse_ffn_decode (CPU): float32 or float64, got ", x.scalar_type());
  auto xc = x.contiguous(), w1c = w1.contiguous(), w2c = w2.contiguous(), b2c = b2.contiguous();
  auto logits = at::addmm(cb, at::mm(xc, c1.t()), c2.t()).contiguous();  // (n, d_ff)
  auto y = at::empty_like(xc);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "sparse_ffn_decode_cpu", [&] {
    sparse_ffn_kernel<scalar_t>(xc.data_ptr<scalar_t>(), logits.data_ptr<scalar_t>(), w1c.data_ptr<scalar_t>(),
                                w2c.data_ptr<scalar_t>(), b2c.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(),
                                xc.size(0), xc.size(1), w1c.size(0), block_size);
  });
  return y;
}

}  // namespace

}  // namespace fairseq_ext

TORCH_LIBRARY_IMPL(fairseq_ext, CPU, m) {
  m.impl("sparse_ffn_decode", &fairseq_ext::sparse_ffn_decode_cpu);
}
