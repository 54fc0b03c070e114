// AVX-512 helpers of the training kernels (cross_entropy.cpp, dropout.cpp): 16 floats per register, loaded from
// and stored to float32 or bfloat16, with masked forms for a row's tail. Every function is compiled for
// avx512f+avx512bw+avx512vl whatever the build flags (target attribute); callers take these paths only where
// avx512_training_available() says so (once per kernel call), else their portable loops (vec.h).
#pragma once
#include <cstdlib>
#include <cstring>

namespace fairseq_ext {
namespace {
// FAIRSEQ_EXT_CPU_ISA=portable (env) turns every AVX-512 intrinsics path of the CPU kernels off (these and
// few_rows_linear's): the tests run the portable loops on a machine that has AVX-512. Read at each kernel call.
inline bool cpu_isa_portable() {
  const char* e = std::getenv("FAIRSEQ_EXT_CPU_ISA");
  return e != nullptr && std::strcmp(e, "portable") == 0;
}
}  // namespace
}  // namespace fairseq_ext

#if defined(__x86_64__) && defined(__GNUC__)
#define FAIRSEQ_EXT_HAS_AVX512_PATH 1
#include <immintrin.h>

#include <cstdint>

#include <c10/util/BFloat16.h>

#define FAIRSEQ_EXT_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))

namespace fairseq_ext {
namespace {

inline bool avx512_training_available() {
  static const bool cpu = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl");
  return cpu && !cpu_isa_portable();
}

inline __mmask16 tail_mask(int64_t n) { return static_cast<__mmask16>((1u << n) - 1u); }  // 0 < n < 16

FAIRSEQ_EXT_AVX512 inline __m512 ld16(const float* p) { return _mm512_loadu_ps(p); }
FAIRSEQ_EXT_AVX512 inline __m512 ld16(const c10::BFloat16* p) {  // bf16 -> float: the 16 bits on top
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
FAIRSEQ_EXT_AVX512 inline __m512 ld16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
FAIRSEQ_EXT_AVX512 inline __m512 ld16(const c10::BFloat16* p, __mmask16 m) {  // lanes outside m: 0
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

// float -> bf16 rounding to nearest even, as vec.h's store_f and c10::BFloat16(float)
FAIRSEQ_EXT_AVX512 inline __m256i to_bf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), odd));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}
FAIRSEQ_EXT_AVX512 inline void st16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
FAIRSEQ_EXT_AVX512 inline void st16(c10::BFloat16* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), to_bf16(v));
}
FAIRSEQ_EXT_AVX512 inline void st16(float* p, __m512 v, __mmask16 m) { _mm512_mask_storeu_ps(p, m, v); }
FAIRSEQ_EXT_AVX512 inline void st16(c10::BFloat16* p, __m512 v, __mmask16 m) {
  _mm256_mask_storeu_epi16(p, m, to_bf16(v));
}

// exp(x), the algorithm of vec.h's exp_f (same clamp, ln2 split, Cephes polynomial) with fused multiply-adds
// and 2^n by scalef: relative error <= 2 ulp on [-87.3, 88.7]
FAIRSEQ_EXT_AVX512 inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.7f)), _mm512_set1_ps(-87.3f));
  const __m512 n = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
                                        _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// the 16 lanes of v summed in double, lane order fixed (deterministic)
FAIRSEQ_EXT_AVX512 inline double lanes_sum(__m512 v) {
  alignas(64) float a[16];
  _mm512_store_ps(a, v);
  double s = 0;
  for (int l = 0; l < 16; ++l) s += a[l];
  return s;
}

}  // namespace
}  // namespace fairseq_ext
#endif
#ifndef FAIRSEQ_EXT_HAS_AVX512_PATH
namespace fairseq_ext {
namespace {
inline bool avx512_training_available() { return false; }  // no intrinsics path in this build
}  // namespace
}  // namespace fairseq_ext
#endif
