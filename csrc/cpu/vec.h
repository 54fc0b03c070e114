// Inner loops of the CPU kernels: plain loops the compiler vectorises. With GCC on x86-64,
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
  T s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  for (; i < n; ++i) s0 += a[i] * b[i];
  return (s0 + s1) + (s2 + s3);
}

template <typename T>
FAIRSEQ_EXT_CLONES void axpy(T alpha, const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

}  // namespace
}  // namespace fairseq_ext
