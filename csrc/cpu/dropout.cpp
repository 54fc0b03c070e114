// CPU kernel of hashed_dropout (schema and maths: csrc/dropout.cpp). Parallel over chunks of the flat
// tensor; the hash is 32-bit integer arithmetic: AVX-512 intrinsics for float32 and bfloat16 where the CPU has
// AVX-512F/BW/VL (avx512.h, checked at run time), else a loop the compiler vectorises (target_clones: AVX-512 and
// AVX2 versions beside the portable one). Both compute the same bits (one multiply per kept element). The mask depends only on (seed, index):
// the result is the same for any thread count.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "dropout.h"
#include "cpu/vec.h"
#include "cpu/avx512.h"

#include <type_traits>

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

#ifdef FAIRSEQ_EXT_HAS_AVX512_PATH
FAIRSEQ_EXT_AVX512 inline __m512i fmix32_16(__m512i h) {  // dropout_fmix32 on 16 lanes
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
  h = _mm512_mullo_epi32(h, _mm512_set1_epi32(static_cast<int>(0x85EBCA6Bu)));
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 13));
  h = _mm512_mullo_epi32(h, _mm512_set1_epi32(static_cast<int>(0xC2B2AE35u)));
  return _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
}

template <typename T>
FAIRSEQ_EXT_AVX512 void dropout_range_avx512(const T* x, T* y, int64_t begin, int64_t end, uint64_t seed,
                                             uint32_t threshold, float scale) {
  const __m512i lo = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(seed)));
  const __m512i hi = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(seed >> 32)));
  const __m512i thr = _mm512_set1_epi32(static_cast<int>(threshold));
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512 sc = _mm512_set1_ps(scale);
  for (int64_t i = begin; i < end; i += 16) {
    const __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(i))), iota);
    const __m512i h = fmix32_16(_mm512_xor_si512(fmix32_16(_mm512_xor_si512(idx, lo)), hi));
    const __mmask16 keep = _mm512_cmpge_epu32_mask(_mm512_srli_epi32(h, 8), thr);
    if (end - i >= 16) {
      st16(y + i, _mm512_maskz_mul_ps(keep, ld16(x + i), sc));
    } else {
      const __mmask16 m = tail_mask(end - i);
      st16(y + i, _mm512_maskz_mul_ps(keep, ld16(x + i, m), sc), m);
    }
  }
}
#endif

template <typename T>
void dropout_range_any(const T* x, T* y, int64_t begin, int64_t end, uint64_t seed, uint32_t threshold, float scale,
                       bool avx512) {
#ifdef FAIRSEQ_EXT_HAS_AVX512_PATH
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16>) {
    if (avx512) return dropout_range_avx512(x, y, begin, end, seed, threshold, scale);
  }
#endif
  dropout_range(x, y, begin, end, seed, threshold, scale);
}

}  // namespace

at::Tensor hashed_dropout_cpu(const at::Tensor& x, double p, int64_t seed) {
  check_hashed_dropout_args(x, p);
  auto xc = x.contiguous();
  auto y = at::empty_like(xc);
  const uint32_t threshold = dropout_threshold(p);
  const float scale = static_cast<float>(1.0 / (1.0 - p));
  const int64_t n = xc.numel();
  const bool avx512 = avx512_training_available();
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
        dropout_range_any(xp, yp, b, e, static_cast<uint64_t>(seed), threshold, scale, avx512);
      });
    }
  });
  return y;
}

}  // namespace fairseq_ext

TORCH_LIBRARY_IMPL(fairseq_ext, CPU, m) {
  m.impl("hashed_dropout", &fairseq_ext::hashed_dropout_cpu);
}
