// Inner loops of the CPU kernels: plain loops the compiler vectorises (dot keeps eight partial sums). With GCC on x86-64,
// target_clones adds an AVX2+FMA version picked at run time, so a build without -march still runs on any
// x86-64 and uses AVX2 where the machine has it. Fixed summation order: results are deterministic.
#pragma once
#include <cstdint>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FAIRSEQ_EXT_CLONES __attribute__((target_clones("avx2,fma", "default")))
#else
#define FAIRSEQ_EXT_CLONES
#endif

namespace fairseq_ext {
namespace {  // one copy (and one run-time resolver) per kernel file

template <typename T>
FAIRSEQ_EXT_CLONES T dot(const T* a, const T* b, int64_t n) {
  // eight independent partial sums, so the compiler can keep them in one vector register (a float
  // reduction may not be reordered otherwise); the order is fixed, so results are deterministic
  T s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) s[k] += a[i + k] * b[i + k];
  for (; i < n; ++i) s[0] += a[i] * b[i];
  return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

template <typename T>
FAIRSEQ_EXT_CLONES void axpy(T alpha, const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

}  // namespace
}  // namespace fairseq_ext

// ---- elementwise helpers of the training kernels (cross_entropy.cpp, dropout.cpp) ----
#include <cstring>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

namespace fairseq_ext {
namespace {

// float <-> storage type, written so the compiler vectorises loops over them (bf16: a shift; float32: a
// copy; fp16: c10's scalar conversion, correct but not vectorised)
inline float load_f(const float* p) { return *p; }
inline float load_f(const double* p) { return static_cast<float>(*p); }
inline float load_f(const c10::Half* p) { return static_cast<float>(*p); }
inline float load_f(const c10::BFloat16* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline void store_f(float* p, float v) { *p = v; }
inline void store_f(double* p, float v) { *p = v; }
inline void store_f(c10::Half* p, float v) { *p = c10::Half(v); }
inline void store_f(c10::BFloat16* p, float v) {  // round to nearest even, as c10::BFloat16(float)
  uint32_t u;
  std::memcpy(&u, &v, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  const uint16_t h = static_cast<uint16_t>(u >> 16);
  std::memcpy(p, &h, 2);
}

// exp(x) for float32 in plain arithmetic the compiler vectorises (no libm call): x = n·ln2 + r with
// |r| <= ln2/2 (ln2 split in two constants), exp(r) by Cephes' degree-6 polynomial, 2^n from the
// exponent bits. Relative error <= 2 ulp on [-87.3, 88.7]; below that it returns ~1e-38, not 0.
inline float exp_f(float x) {
  x = x < -87.3f ? -87.3f : (x > 88.7f ? 88.7f : x);
  const float n = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}

}  // namespace
}  // namespace fairseq_ext
