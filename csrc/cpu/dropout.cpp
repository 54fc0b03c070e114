// CPU kernel of hashed_dropout (schema and maths: csrc/dropout.cpp). Parallel over chunks of the flat
// tensor; the hash is 32-bit integer arithmetic the compiler vectorises (target_clones: AVX-512 and
// AVX2 versions beside the portable one, picked at run time). The mask depends only on (seed, index):
// the result is the same for any thread count.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "dropout.h"
#include "cpu/vec.h"

namespace fairseq_ext {

namespace {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DROPOUT_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DROPOUT_CLONES
#endif

template <typename T>
DROPOUT_CLONES void dropout_range(const T* x, T* y, int64_t begin, int64_t end, uint64_t seed, uint32_t threshold,
                                  float scale) {
  for (int64_t i = begin; i < end; ++i) {
    const uint32_t h = dropout_hash(seed, static_cast<uint32_t>(i));
    store_f(y + i, (h >> 8) >= threshold ? load_f(x + i) * scale : 0.f);
  }
}

}  // namespace

at::Tensor hashed_dropout_cpu(const at::Tensor& x, double p, int64_t seed) {
  check_hashed_dropout_args(x, p);
  auto xc = x.contiguous();
  auto y = at::empty_like(xc);
  const uint32_t threshold = dropout_threshold(p);
  const float scale = static_cast<float>(1.0 / (1.0 - p));
  const int64_t n = xc.numel();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, xc.scalar_type(), "hashed_dropout_cpu", [&] {
    const scalar_t* xp = xc.data_ptr<scalar_t>();
    scalar_t* yp = y.data_ptr<scalar_t>();
    if (std::is_same<scalar_t, double>::value) {  // float64: scale in double
      at::parallel_for(0, n, 1 << 15, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          const uint32_t h = dropout_hash(static_cast<uint64_t>(seed), static_cast<uint32_t>(i));
          yp[i] = (h >> 8) >= threshold ? static_cast<scalar_t>(static_cast<double>(xp[i]) / (1.0 - p)) : scalar_t(0);
        }
      });
    } else {
      at::parallel_for(0, n, 1 << 15, [&](int64_t b, int64_t e) {
        dropout_range(xp, yp, b, e, static_cast<uint64_t>(seed), threshold, scale);
      });
    }
  });
  return y;
}

}  // namespace fairseq_ext

TORCH_LIBRARY_IMPL(fairseq_ext, CPU, m) {
  m.impl("hashed_dropout", &fairseq_ext::hashed_dropout_cpu);
}
