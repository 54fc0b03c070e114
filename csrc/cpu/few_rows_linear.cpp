// CPU kernel of few_rows_linear (schema and maths: csrc/few_rows_linear.cpp).
// Parallel over groups of R output features (W rows); each task streams its R W rows once (prefetching
// 512 bytes ahead) and keeps, for each of up to 8 rows of x (x stays in cache), 16 partial sums per W
// row, which the compiler holds in vector registers: R x M accumulators of 16 lanes fit AVX-512's 32
// registers, so GCC's target_clones adds an AVX-512 version next to an AVX2+FMA one (picked at run time;
// the AVX2 one spills and is there for older machines). More than 8 rows: one pass per group of 8. Deterministic: a fixed summation order per output, independent of the thread count.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "few_rows_linear.h"

namespace fairseq_ext {

namespace {

constexpr int kLanes = 16;     // partial sums per (x row, W row)
constexpr int kMaxRows = 8;    // x rows per pass over W
constexpr int kPrefetch = 128; // elements ahead of each W row stream (512 bytes of float32)

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FEW_ROWS_CLONES __attribute__((target_clones("avx512f", "avx2,fma", "default")))
#else
#define FEW_ROWS_CLONES
#endif

// out[r * M + m] = x_m · w_r for the M rows of x (stride K) and R consecutive rows of W (stride K)
template <typename T, int M, int R>
FEW_ROWS_CLONES void dot_rows(const T* x, int64_t K, const T* w, T* out) {
  T acc[R][M][kLanes] = {};
  int64_t k = 0;
  for (; k + kLanes <= K; k += kLanes) {
    for (int r = 0; r < R; ++r) __builtin_prefetch(w + r * K + k + kPrefetch);
    for (int m = 0; m < M; ++m)
      for (int r = 0; r < R; ++r)
        for (int l = 0; l < kLanes; ++l) acc[r][m][l] += x[m * K + k + l] * w[r * K + k + l];
  }
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) {
      T s = 0;
      for (int l = 0; l < kLanes; ++l) s += acc[r][m][l];
      for (int64_t kk = k; kk < K; ++kk) s += x[m * K + kk] * w[r * K + kk];
      out[r * M + m] = s;
    }
}

// y rows [0, M) (row stride N) from x rows [0, M): W read once, R rows at a time (R streams per
// thread: more memory-level parallelism than one; measured best at 4 for up to 6 rows of x, when
// R x M accumulators still fit the vector registers), the last N % R rows one at a time
template <typename T, int M>
void rows_pass(const T* x, const T* w, const T* b, T* y, int64_t K, int64_t N) {
  constexpr int R = M <= 6 ? 4 : 2;
  const int64_t groups = N / R;
  at::parallel_for(0, groups + N % R, 8, [&](int64_t begin, int64_t end) {
    T o[R * M];
    for (int64_t g = begin; g < end; ++g) {
      const int64_t j0 = g < groups ? g * R : groups * R + (g - groups);
      const int rows = g < groups ? R : 1;
      if (rows == R)
        dot_rows<T, M, R>(x, K, w + j0 * K, o);
      else
        dot_rows<T, M, 1>(x, K, w + j0 * K, o);
      for (int r = 0; r < rows; ++r) {
        const T bias = b ? b[j0 + r] : T(0);
        for (int m = 0; m < M; ++m) y[m * N + j0 + r] = o[r * M + m] + bias;
      }
    }
  });
}

template <typename T>
void few_rows_kernel(const T* x, const T* w, const T* b, T* y, int64_t rows, int64_t K, int64_t N) {
  for (int64_t r = 0; r < rows; r += kMaxRows) {
    const T* xr = x + r * K;
    T* yr = y + r * N;
    switch (std::min<int64_t>(kMaxRows, rows - r)) {
      case 1: rows_pass<T, 1>(xr, w, b, yr, K, N); break;
      case 2: rows_pass<T, 2>(xr, w, b, yr, K, N); break;
      case 3: rows_pass<T, 3>(xr, w, b, yr, K, N); break;
      case 4: rows_pass<T, 4>(xr, w, b, yr, K, N); break;
      case 5: rows_pass<T, 5>(xr, w, b, yr, K, N); break;
      case 6: rows_pass<T, 6>(xr, w, b, yr, K, N); break;
      case 7: rows_pass<T, 7>(xr, w, b, yr, K, N); break;
      default: rows_pass<T, 8>(xr, w, b, yr, K, N); break;
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
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "few_rows_linear_cpu", [&] {
    few_rows_kernel<scalar_t>(xc.data_ptr<scalar_t>(), wc.data_ptr<scalar_t>(),
                              has_bias ? bc.data_ptr<scalar_t>() : nullptr, y.data_ptr<scalar_t>(), xc.size(0),
                              xc.size(1), wc.size(0));
  });
  return y;
}

}  // namespace fairseq_ext

TORCH_LIBRARY_IMPL(fairseq_ext, CPU, m) {
  m.impl("few_rows_linear", &fairseq_ext::few_rows_linear_cpu);
}
