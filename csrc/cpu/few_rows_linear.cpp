// CPU kernel of few_rows_linear (schema and maths: csrc/few_rows_linear.cpp). The weight may be bf16 with
// float32 x (the fast path's --bf16: half the bytes streamed; each weight widened exactly to float32, so
// the sums are those of float32 x against the bf16-rounded weights).
// Parallel over groups of R output features (W rows); each task streams its R W rows once (prefetching
// 512 bytes ahead) and keeps, for each of up to 8 rows of x (x stays in L1), 16 partial sums per W row in
// vector registers. Where the CPU has AVX-512F (checked at run time) an intrinsics version runs
// (dot_rows_avx512); elsewhere a portable loop, compiled by GCC's target_clones with an AVX-512 and an
// AVX2+FMA version picked at run time (the AVX2 one spills; it is there for older machines). More than 8
// rows: one pass per group of 8. Deterministic: a fixed summation order per output, independent of the
// thread count.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <type_traits>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "few_rows_linear.h"
#include "cpu/avx512.h"  // cpu_isa_portable
#include "cpu/vec.h"  // load_f: bf16 -> float32 (a shift the compiler vectorises)

namespace fairseq_ext {

namespace {

constexpr int kLanes = 16;     // partial sums per (x row, W row)
constexpr int kMaxRows = 8;    // x rows per pass over W
constexpr int kPrefetch = 128; // float32 elements ahead of each W row stream (512 bytes; 128-1,024 measured)

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FEW_ROWS_CLONES __attribute__((target_clones("avx512f", "avx2,fma", "default")))
#else
#define FEW_ROWS_CLONES
#endif

inline float widen(float v) { return v; }
inline double widen(double v) { return v; }
inline float widen(c10::BFloat16 v) { return load_f(&v); }  // exact: bf16 is the top half of a float32

// out[r * M + m] = x_m · w_r for the M rows of x (stride K) and R consecutive rows of W (stride K); W is
// x's type, or bf16 with float32 x (weights stored in bf16, widened exactly, sums in float32)
template <typename T, typename WT, int M, int R>
FEW_ROWS_CLONES void dot_rows(const T* x, int64_t K, const WT* w, T* out) {
  T acc[R][M][kLanes] = {};
  int64_t k = 0;
  for (; k + kLanes <= K; k += kLanes) {
    for (int r = 0; r < R; ++r) __builtin_prefetch(w + r * K + k + kPrefetch * sizeof(T) / sizeof(WT));
    for (int m = 0; m < M; ++m)
      for (int r = 0; r < R; ++r)
        for (int l = 0; l < kLanes; ++l) acc[r][m][l] += x[m * K + k + l] * widen(w[r * K + k + l]);
  }
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) {
      T s = 0;
      for (int l = 0; l < kLanes; ++l) s += acc[r][m][l];
      for (int64_t kk = k; kk < K; ++kk) s += x[m * K + kk] * widen(w[r * K + kk]);
      out[r * M + m] = s;
    }
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FEW_ROWS_AVX512 1
// 16 weights as float32: loaded, or (bf16) loaded and widened exactly: zero-extend to 32 bits, shift left by 16
__attribute__((target("avx512f"))) inline __m512 load16(const float* w) { return _mm512_loadu_ps(w); }
__attribute__((target("avx512f"))) inline __m512 load16(const c10::BFloat16* w) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// dot_rows for float32 x with AVX-512F intrinsics (W float32 or bf16): the compiler neither vectorises
// the bf16 widening well nor keeps the accumulators in registers. One fused multiply-add per (W row,
// x row) per 16 weights, the same lanes as the portable dot_rows, the 16 lanes summed by a fixed tree
// (deterministic); picked at run time where the CPU has AVX-512F (avx512_available).
template <typename WT, int M, int R>
__attribute__((target("avx512f"))) void dot_rows_avx512(const float* x, int64_t K, const WT* w, float* out) {
  __m512 acc[R][M];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) acc[r][m] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + kLanes <= K; k += kLanes) {
    for (int r = 0; r < R; ++r) {  // x rows read from L1 by the multiply-add itself: R x M + 1 registers
      __builtin_prefetch(w + r * K + k + kPrefetch * sizeof(float) / sizeof(WT));
      const __m512 wf = load16(w + r * K + k);
      for (int m = 0; m < M; ++m) acc[r][m] = _mm512_fmadd_ps(_mm512_loadu_ps(x + m * K + k), wf, acc[r][m]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) {
      float s = _mm512_reduce_add_ps(acc[r][m]);  // a fixed tree over the 16 lanes
      for (int64_t kk = k; kk < K; ++kk) s += x[m * K + kk] * widen(w[r * K + kk]);
      out[r * M + m] = s;
    }
}

bool avx512_available() {  // FAIRSEQ_EXT_CPU_ISA=portable (env) turns it off (cpu/avx512.h)
  static const bool ok = __builtin_cpu_supports("avx512f");
  return ok && !cpu_isa_portable();
}
#endif

// y rows [0, M) (row stride N) from x rows [0, M): W read once, R rows at a time (R streams per
// thread: more memory-level parallelism than one; as many as keep R x M accumulators in AVX-512's 32
// registers: 8 streams for up to 3 rows of x, 6 for 5, 4 for 7, 3 for 8), the last N % R rows one at a time
template <typename T, typename WT, int M>
void rows_pass(const T* x, const WT* w, const T* b, T* y, int64_t K, int64_t N) {
  constexpr int R = M <= 3 ? 8 : M <= 5 ? 6 : M <= 7 ? 4 : 3;
  const int64_t groups = N / R;
#ifdef FEW_ROWS_AVX512
  const bool avx512 = std::is_same_v<T, float> && avx512_available();
#endif
  at::parallel_for(0, groups + N % R, 8, [&](int64_t begin, int64_t end) {
    T o[R * M];
    for (int64_t g = begin; g < end; ++g) {
      const int64_t j0 = g < groups ? g * R : groups * R + (g - groups);
      const int rows = g < groups ? R : 1;
      bool done = false;
#ifdef FEW_ROWS_AVX512
      if constexpr (std::is_same_v<T, float>) {
        if (avx512) {
          if (rows == R)
            dot_rows_avx512<WT, M, R>(x, K, w + j0 * K, o);
          else
            dot_rows_avx512<WT, M, 1>(x, K, w + j0 * K, o);
          done = true;
        }
      }
#endif
      if (!done && rows == R)
        dot_rows<T, WT, M, R>(x, K, w + j0 * K, o);
      else if (!done)
        dot_rows<T, WT, M, 1>(x, K, w + j0 * K, o);
      for (int r = 0; r < rows; ++r) {
        const T bias = b ? b[j0 + r] : T(0);
        for (int m = 0; m < M; ++m) y[m * N + j0 + r] = o[r * M + m] + bias;
      }
    }
  });
}

template <typename T, typename WT>
void few_rows_kernel(const T* x, const WT* w, const T* b, T* y, int64_t rows, int64_t K, int64_t N) {
  for (int64_t r = 0; r < rows; r += kMaxRows) {
    const T* xr = x + r * K;
    T* yr = y + r * N;
    switch (std::min<int64_t>(kMaxRows, rows - r)) {
      case 1: rows_pass<T, WT, 1>(xr, w, b, yr, K, N); break;
      case 2: rows_pass<T, WT, 2>(xr, w, b, yr, K, N); break;
      case 3: rows_pass<T, WT, 3>(xr, w, b, yr, K, N); break;
      case 4: rows_pass<T, WT, 4>(xr, w, b, yr, K, N); break;
      case 5: rows_pass<T, WT, 5>(xr, w, b, yr, K, N); break;
      case 6: rows_pass<T, WT, 6>(xr, w, b, yr, K, N); break;
      case 7: rows_pass<T, WT, 7>(xr, w, b, yr, K, N); break;
      default: rows_pass<T, WT, 8>(xr, w, b, yr, K, N); break;
    }
  }
}

}  // namespace

at::Tensor few_rows_linear_cpu(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  check_few_rows_linear_args(x, weight, bias);
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble,
              "few_rows_linear (CPU): float32 or float64, got ", x.scalar_type());
  const bool has_bias = bias.has_value() && bias->defined();
  auto xc = x.contiguous(), wc = weight.contiguous();
  at::Tensor bc = has_bias ? bias->contiguous() : at::Tensor();
  auto y = at::empty({xc.size(0), wc.size(0)}, xc.options());
  if (xc.size(0) == 0 || wc.size(0) == 0) return y;
  if (wc.scalar_type() == at::kBFloat16) {  // bf16 weights, float32 x (check_few_rows_linear_args)
    few_rows_kernel<float, c10::BFloat16>(xc.data_ptr<float>(), wc.data_ptr<c10::BFloat16>(),
                                          has_bias ? bc.data_ptr<float>() : nullptr, y.data_ptr<float>(),
                                          xc.size(0), xc.size(1), wc.size(0));
    return y;
  }
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "few_rows_linear_cpu", [&] {
    few_rows_kernel<scalar_t, scalar_t>(xc.data_ptr<scalar_t>(), wc.data_ptr<scalar_t>(),
                              has_bias ? bc.data_ptr<scalar_t>() : nullptr, y.data_ptr<scalar_t>(), xc.size(0),
                              xc.size(1), wc.size(0));
  });
  return y;
}

}  // namespace fairseq_ext

TORCH_LIBRARY_IMPL(fairseq_ext, CPU, m) {
  m.impl("few_rows_linear", &fairseq_ext::few_rows_linear_cpu);
}
