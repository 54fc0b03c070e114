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
