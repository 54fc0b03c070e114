// CPU kernel of sparse_ffn_decode (schema and maths: csrc/sparse_ffn.cpp).
// The controller is fused (below kControllerGemmTokens tokens; from there its logits are two BLAS products
// first): z = x·C1ᵀ in one parallel pass, then phase 1, parallel over blocks, scores the
// block's N units for every token from z and the block's rows of C2, takes each token's argmax and
// h[t,b] (one dot product of length d with the chosen W1 row) — so C2, the largest read at N >= 64,
// streams once on every thread instead of inside small GEMM calls. Phase 2 accumulates
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

// From this many tokens (batched steps) the controller's logits are two GEMMs before the kernel (scoring
// every unit for every token is n·d_ff·d_lowrank multiply-adds, which BLAS does several times faster than
// dot products of length d_lowrank) and phase 2 runs a task per token; below it, the fused pass streams C2
// once for the few tokens and phase 2 splits the output dimension.
constexpr int64_t kControllerGemmTokens = 32;

template <typename T>
void sparse_ffn_kernel(const T* x, const T* c1, const T* c2, const T* cb, const T* w1, const T* w2, const T* b2, T* y,
                       int64_t n, int64_t d, int64_t d_ff, int64_t lowrank, int64_t block, const T* logits) {
  const int64_t blocks = d_ff / block;
  std::vector<int64_t> rows(n * blocks);
  std::vector<T> h(n * blocks), z(logits ? 0 : n * lowrank);
  // controller, first factor: z = x·C1ᵀ (n, d_lowrank), parallel over C1's rows, each row read once for
  // all tokens (unless the logits (n, d_ff) are given)
  if (!logits)
    at::parallel_for(0, lowrank, 1, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r)
        for (int64_t t = 0; t < n; ++t) z[t * lowrank + r] = dot(x + t * d, c1 + r * d, d);
    });
  // phase 1, parallel over blocks of N units: each unit's C2 row is read once and scored for every token
  // (z_t·C2[j] + c[j]); then per token the choice (first maximum; NaN wins, as torch.argmax) and
  // h = ReLU(x_t · W1[row]). C2, the largest read at N >= 64, streams on every thread.
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> best(n);
    std::vector<T> best_v(n);
    for (int64_t b = begin; b < end; ++b) {
      std::fill(best.begin(), best.end(), -1);
      for (int64_t j = 0; j < block; ++j) {
        const int64_t unit = b * block + j;
        const T* c = c2 + unit * lowrank;
        for (int64_t t = 0; t < n; ++t) {
          const T v = logits ? logits[t * d_ff + unit] : dot(z.data() + t * lowrank, c, lowrank) + cb[unit];
          const T bv = best_v[t];
          if (best[t] < 0 || (std::isnan(v) && !std::isnan(bv)) || (!std::isnan(bv) && v > bv)) {
            best[t] = j;
            best_v[t] = v;
          }
        }
      }
      for (int64_t t = 0; t < n; ++t) {
        const int64_t row = b * block + best[t];
        rows[t * blocks + b] = row;
        const T v = dot(x + t * d, w1 + row * d, d);
        h[t * blocks + b] = v > T(0) ? v : T(0);
      }
    }
  });
  // phase 2: y_t = b2 + Σ_b h[t,b] · W2[row], a task per (token, slice of the output dimension). A few
  // tokens: slices of 64, so the threads share every token; many tokens: one slice, a task per token, each
  // chosen row read whole (contiguous d floats the prefetcher streams). Either way each output element sums
  // its blocks in the same order.
  const int64_t chunk = n >= kControllerGemmTokens ? std::max<int64_t>(d, 1) : 64;
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
  auto c1c = c1.contiguous(), c2c = c2.contiguous(), cbc = cb.contiguous();
  auto y = at::empty_like(xc);
  at::Tensor logits;  // (n, d_ff) = (x·C1ᵀ)·C2ᵀ + c, many tokens only
  if (xc.size(0) >= kControllerGemmTokens) logits = at::addmm(cbc, at::mm(xc, c1c.t()), c2c.t());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "sparse_ffn_decode_cpu", [&] {
    sparse_ffn_kernel<scalar_t>(xc.data_ptr<scalar_t>(), c1c.data_ptr<scalar_t>(), c2c.data_ptr<scalar_t>(),
                                cbc.data_ptr<scalar_t>(), w1c.data_ptr<scalar_t>(), w2c.data_ptr<scalar_t>(),
                                b2c.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), xc.size(0), xc.size(1), w1c.size(0),
                                c1c.size(0), block_size, logits.defined() ? logits.data_ptr<scalar_t>() : nullptr);
  });
  return y;
}

}  // namespace

}  // namespace fairseq_ext

TORCH_LIBRARY_IMPL(fairseq_ext, CPU, m) {
  m.impl("sparse_ffn_decode", &fairseq_ext::sparse_ffn_decode_cpu);
}
