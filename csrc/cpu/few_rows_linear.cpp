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
// bf16 W with FAIRSEQ_EXT_BF16_PRODUCTS=1 on a CPU with AVX512_BF16 (few_rows_bf16_dot): x is rounded to
// bf16 once per call and each 32 weights of a row meet it in one vdpbf16ps per row of x (bf16 products,
// float32 sums): twice the multiply-adds per instruction of widening W to float32, which bounds a 5-row step.
// few_rows_linear_packed reads W in the panel layout of ops/few_rows_linear.py (pack_panels): rows in
// panels of P, each panel's 16-column blocks stored row after row, so a task streams one contiguous run of
// memory (one hardware-prefetch stream) instead of R interleaved rows; dot_rows / dot_rows_avx512 serve both
// layouts, so the sums are the same in the same order (bit for bit on the intrinsics path; the compiler may
// vectorise the portable loop differently per group size).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cstdlib>
#include <cstring>
#include <type_traits>
#if defined(__x86_64__)
#include <cpuid.h>
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
constexpr int kPanelPrefetch = 4096;  // bytes ahead in a panel's one stream (512-8,192 measured: 2-4 KB best)

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FEW_ROWS_CLONES __attribute__((target_clones("avx512f", "avx2,fma", "default")))
#else
#define FEW_ROWS_CLONES
#endif

inline float widen(float v) { return v; }
inline double widen(double v) { return v; }
inline float widen(c10::BFloat16 v) { return load_f(&v); }  // exact: bf16 is the top half of a float32

// The W rows a dot product reads, in either layout: the 16 weights of row r for column block b at
// w + r·row_step + b·block_step, the K % 16 last ones at tail + r·tail_step; prefetched `ahead` elements
// ahead of each row's block. Row-major: (K, 16, K); a panel of P rows (pack_panels): (16, P·16, K % 16).
template <typename WT>
struct RowsView {
  const WT* w;
  int64_t row_step, block_step;
  const WT* tail;
  int64_t tail_step, ahead;
};

template <typename WT>
RowsView<WT> row_major(const WT* w, int64_t K, int64_t ahead) {
  return {w, K, kLanes, w + K / kLanes * kLanes, K, ahead};
}

// R rows [r0, r0 + R) of the panel of P rows at `panel` (pack_panels' layout)
template <typename WT>
RowsView<WT> panel_rows(const WT* panel, int64_t K, int64_t P, int64_t r0, int64_t ahead) {
  const int64_t tail = K % kLanes;
  return {panel + r0 * kLanes, kLanes, P * kLanes, panel + K / kLanes * P * kLanes + r0 * tail, tail, ahead};
}

// out[r * M + m] = x_m · w_r for the M rows of x (stride K) and R rows of W (view v); W is x's type, or
// bf16 with float32 x (weights stored in bf16, widened exactly, sums in float32). One body for both layouts,
// so both give the same sums in the same order.
template <typename T, typename WT, int M, int R>
FEW_ROWS_CLONES void dot_rows(const T* x, int64_t K, RowsView<WT> v, T* out) {
  T acc[R][M][kLanes] = {};
  const int64_t blocks = K / kLanes;
  for (int64_t b = 0; b < blocks; ++b) {
    for (int r = 0; r < R; ++r) __builtin_prefetch(v.w + r * v.row_step + b * v.block_step + v.ahead);
    for (int m = 0; m < M; ++m)
      for (int r = 0; r < R; ++r)
        for (int l = 0; l < kLanes; ++l)
          acc[r][m][l] += x[m * K + b * kLanes + l] * widen(v.w[r * v.row_step + b * v.block_step + l]);
  }
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) {
      T s = 0;
      for (int l = 0; l < kLanes; ++l) s += acc[r][m][l];
      for (int64_t t = 0; t < K - blocks * kLanes; ++t) s += x[m * K + blocks * kLanes + t] * widen(v.tail[r * v.tail_step + t]);
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
__attribute__((target("avx512f"))) void dot_rows_avx512(const float* x, int64_t K, RowsView<WT> v, float* out) {
  __m512 acc[R][M];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) acc[r][m] = _mm512_setzero_ps();
  const int64_t blocks = K / kLanes;
  // one prefetch per 64-byte line: every row of row-major W, every 64 / (16 sizeof(WT)) rows of a panel
  const int every = v.row_step * sizeof(WT) >= 64 ? 1 : 64 / (v.row_step * sizeof(WT));
  for (int64_t b = 0; b < blocks; ++b) {
    for (int r = 0; r < R; ++r) {  // x rows read from L1 by the multiply-add itself: R x M + 1 registers
      const WT* w = v.w + r * v.row_step + b * v.block_step;
      if (r % every == 0) __builtin_prefetch(w + v.ahead);
      const __m512 wf = load16(w);
      for (int m = 0; m < M; ++m)
        acc[r][m] = _mm512_fmadd_ps(_mm512_loadu_ps(x + m * K + b * kLanes), wf, acc[r][m]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) {
      float s = _mm512_reduce_add_ps(acc[r][m]);  // a fixed tree over the 16 lanes
      for (int64_t t = 0; t < K - blocks * kLanes; ++t) s += x[m * K + blocks * kLanes + t] * widen(v.tail[r * v.tail_step + t]);
      out[r * M + m] = s;
    }
}

bool avx512_available() {  // FAIRSEQ_EXT_CPU_ISA=portable (env) turns it off (cpu/avx512.h)
  static const bool ok = __builtin_cpu_supports("avx512f");
  return ok && !cpu_isa_portable();
}

// AVX512_BF16's vdpbf16ps: 32 bf16 x bf16 products summed in pairs into 16 float32 lanes per instruction,
// twice the multiply-adds of a float32 FMA. CPUID leaf 7 sub-leaf 1, EAX bit 5. Opt-in: with
// FAIRSEQ_EXT_BF16_PRODUCTS=1 (env, read at each call), since rounding x to bf16 changes results (float32
// products of the bf16 weights otherwise, as on CPUs without it).
bool bf16_dot_available() {
  static const bool cpu = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid_count(7, 1, &a, &b, &c, &d) && ((a >> 5) & 1u);
  }();
  const char* e = std::getenv("FAIRSEQ_EXT_BF16_PRODUCTS");
  return cpu && avx512_available() && e != nullptr && std::strcmp(e, "1") == 0;
}

// dot_rows for bf16 W against x rounded to bf16 (xb, M rows of stride K): per 32 weights of a W row one
// vdpbf16ps per row of x, the 32 being two 16-column blocks of the view side by side (blocks b and b + 1, at
// w and w + block_step: either layout); a last lone block as its 16 weights with zeros above; the 16 lanes
// summed by the fixed tree, then the K % 16 last columns in float32 (from the rounded x).
template <int M, int R>
__attribute__((target("avx512f,avx512bf16"))) void dot_rows_bf16dot(const c10::BFloat16* xb, int64_t K,
                                                                    RowsView<c10::BFloat16> v, float* out) {
  __m512 acc[R][M];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) acc[r][m] = _mm512_setzero_ps();
  const int64_t blocks = K / kLanes;
  const int every = v.row_step * 2 >= 64 ? 1 : 64 / (v.row_step * 2);  // one prefetch per 64-byte line
  int64_t b = 0;
  for (; b + 2 <= blocks; b += 2) {
    for (int r = 0; r < R; ++r) {
      const c10::BFloat16* w = v.w + r * v.row_step + b * v.block_step;
      if (r % every == 0) {
        __builtin_prefetch(w + v.ahead);
        __builtin_prefetch(w + v.block_step + v.ahead);
      }
      const __m512i w32 = _mm512_inserti64x4(
          _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w))),
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + v.block_step)), 1);
      for (int m = 0; m < M; ++m)
        acc[r][m] = _mm512_dpbf16_ps(acc[r][m], (__m512bh)_mm512_loadu_si512(xb + m * K + b * kLanes), (__m512bh)w32);
    }
  }
  if (b < blocks) {
    for (int r = 0; r < R; ++r) {
      const c10::BFloat16* w = v.w + r * v.row_step + b * v.block_step;
      const __m512i w16 = _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)));
      for (int m = 0; m < M; ++m) {
        const __m512i x16 = _mm512_zextsi256_si512(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + m * K + b * kLanes)));
        acc[r][m] = _mm512_dpbf16_ps(acc[r][m], (__m512bh)x16, (__m512bh)w16);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) {
      float s = _mm512_reduce_add_ps(acc[r][m]);
      for (int64_t t = 0; t < K - blocks * kLanes; ++t)
        s += widen(xb[m * K + blocks * kLanes + t]) * widen(v.tail[r * v.tail_step + t]);
      out[r * M + m] = s;
    }
}
#endif

// dot_rows on this CPU's path: bf16 dot products where the caller rounded x to bf16 (xb: bf16 W on a CPU
// with AVX512_BF16), AVX-512 intrinsics for float32 x where available, else the portable loops
template <typename T, typename WT, int M, int R>
void dot(const T* x, int64_t K, RowsView<WT> v, T* out, const c10::BFloat16* xb) {
#ifdef FEW_ROWS_AVX512
  if constexpr (std::is_same_v<WT, c10::BFloat16>) {
    if (xb) return dot_rows_bf16dot<M, R>(xb, K, v, out);
  }
  if constexpr (std::is_same_v<T, float>) {
    if (avx512_available()) return dot_rows_avx512<WT, M, R>(x, K, v, out);
  }
#endif
  dot_rows<T, WT, M, R>(x, K, v, out);
}

// y rows [0, M) (row stride N) from x rows [0, M): W read once, R rows at a time (R streams per
// thread: more memory-level parallelism than one; as many as keep R x M accumulators in AVX-512's 32
// registers: 8 streams for up to 3 rows of x, 6 for 5, 4 for 7, 3 for 8), the last N % R rows one at a time
template <typename T, typename WT, int M>
void rows_pass(const T* x, const WT* w, const T* b, T* y, int64_t K, int64_t N, const c10::BFloat16* xb) {
  constexpr int R = M <= 3 ? 8 : M <= 5 ? 6 : M <= 7 ? 4 : 3;
  constexpr int64_t ahead = kPrefetch * sizeof(T) / sizeof(WT);
  const int64_t groups = N / R;
  at::parallel_for(0, groups + N % R, 8, [&](int64_t begin, int64_t end) {
    T o[R * M];
    for (int64_t g = begin; g < end; ++g) {
      const int64_t j0 = g < groups ? g * R : groups * R + (g - groups);
      const int rows = g < groups ? R : 1;
      if (rows == R)
        dot<T, WT, M, R>(x, K, row_major(w + j0 * K, K, ahead), o, xb);
      else
        dot<T, WT, M, 1>(x, K, row_major(w + j0 * K, K, ahead), o, xb);
      for (int r = 0; r < rows; ++r) {
        const T bias = b ? b[j0 + r] : T(0);
        for (int m = 0; m < M; ++m) y[m * N + j0 + r] = o[r * M + m] + bias;
      }
    }
  });
}

// The rows of a panel one group of R at a time (R: the largest of 8, 6, 4, 3, 2, 1 that divides P and keeps
// R x M accumulators in registers, as rows_pass).
template <int M>
int panel_group(int64_t P) {
  for (int r : {8, 6, 4, 3, 2}) {
    if (P % r == 0 && r * M <= 30) return r;
  }
  return 1;
}

// rows_pass on W packed in panels of P rows (rows [G·P, N) row-major after them): parallel over panels,
// each read as one stream (prefetched kPanelPrefetch bytes ahead)
template <typename T, typename WT, int M>
void packed_pass(const T* x, const WT* w, const T* b, T* y, int64_t K, int64_t N, int64_t P,
                 const c10::BFloat16* xb) {
  const int64_t panels = N / P, rest = N % P;
  const int R = panel_group<M>(P);
  const int64_t ahead = kPanelPrefetch / sizeof(WT), row_ahead = kPrefetch * sizeof(T) / sizeof(WT);
  at::parallel_for(0, panels + rest, 1, [&](int64_t begin, int64_t end) {
    T o[8 * M];
    for (int64_t g = begin; g < end; ++g) {
      if (g >= panels) {  // a row after the panels, row-major
        const int64_t j = panels * P + (g - panels);
        dot<T, WT, M, 1>(x, K, row_major(w + j * K, K, row_ahead), o, xb);
        for (int m = 0; m < M; ++m) y[m * N + j] = o[m] + (b ? b[j] : T(0));
        continue;
      }
      const WT* panel = w + g * P * K;
      for (int64_t r0 = 0; r0 < P; r0 += R) {
        const RowsView<WT> v = panel_rows(panel, K, P, r0, ahead);
        switch (R) {
          case 8: if constexpr (8 * M <= 30) dot<T, WT, M, 8>(x, K, v, o, xb); break;
          case 6: if constexpr (6 * M <= 30) dot<T, WT, M, 6>(x, K, v, o, xb); break;
          case 4: if constexpr (4 * M <= 30) dot<T, WT, M, 4>(x, K, v, o, xb); break;
          case 3: dot<T, WT, M, 3>(x, K, v, o, xb); break;
          case 2: dot<T, WT, M, 2>(x, K, v, o, xb); break;
          default: dot<T, WT, M, 1>(x, K, v, o, xb); break;
        }
        for (int r = 0; r < R; ++r) {
          const int64_t j = g * P + r0 + r;
          for (int m = 0; m < M; ++m) y[m * N + j] = o[r * M + m] + (b ? b[j] : T(0));
        }
      }
    }
  });
}

// The rows of x in passes of up to kMaxRows: pass(std::integral_constant<int, M>, first row) for each, M the
// pass's row count as a compile-time constant (rows_pass and packed_pass are templates on it)
template <typename Pass>
void row_passes(int64_t rows, Pass&& pass) {
  for (int64_t r = 0; r < rows; r += kMaxRows) {
    switch (std::min<int64_t>(kMaxRows, rows - r)) {
      case 1: pass(std::integral_constant<int, 1>{}, r); break;
      case 2: pass(std::integral_constant<int, 2>{}, r); break;
      case 3: pass(std::integral_constant<int, 3>{}, r); break;
      case 4: pass(std::integral_constant<int, 4>{}, r); break;
      case 5: pass(std::integral_constant<int, 5>{}, r); break;
      case 6: pass(std::integral_constant<int, 6>{}, r); break;
      case 7: pass(std::integral_constant<int, 7>{}, r); break;
      default: pass(std::integral_constant<int, 8>{}, r); break;
    }
  }
}

template <typename T, typename WT>
void few_rows_kernel(const T* x, const WT* w, const T* b, T* y, int64_t rows, int64_t K, int64_t N,
                     const c10::BFloat16* xb) {
  row_passes(rows, [&](auto m, int64_t r) {
    rows_pass<T, WT, decltype(m)::value>(x + r * K, w, b, y + r * N, K, N, xb ? xb + r * K : nullptr);
  });
}

template <typename T, typename WT>
void packed_kernel(const T* x, const WT* w, const T* b, T* y, int64_t rows, int64_t K, int64_t N, int64_t P,
                   const c10::BFloat16* xb) {
  row_passes(rows, [&](auto m, int64_t r) {
    packed_pass<T, WT, decltype(m)::value>(x + r * K, w, b, y + r * N, K, N, P, xb ? xb + r * K : nullptr);
  });
}

// Both ops' common part: contiguous operands, the (rows, N) output, x rounded to bf16 once where a bf16
// weight's products are bf16 (few_rows_bf16_dot), then kernel(x, w, b, y, rows, K, xb) on typed pointers
// (float32 x with a bf16 weight, else x's dtype for all).
template <typename Kernel>
at::Tensor few_rows_call(const char* op, const at::Tensor& x, const at::Tensor& weight,
                         const std::optional<at::Tensor>& bias, int64_t N, Kernel kernel) {
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble, op,
              " (CPU): float32 or float64, got ", x.scalar_type());
  const bool has_bias = bias.has_value() && bias->defined();
  auto xc = x.contiguous(), wc = weight.contiguous();
  at::Tensor bc = has_bias ? bias->contiguous() : at::Tensor();
  auto y = at::empty({xc.size(0), N}, xc.options());
  if (xc.size(0) == 0 || N == 0) return y;
  if (wc.scalar_type() == at::kBFloat16) {  // bf16 weights, float32 x (the argument checks)
    const at::Tensor xb = few_rows_bf16_dot() ? xc.to(at::kBFloat16) : at::Tensor();  // bf16 products
    kernel(xc.data_ptr<float>(), wc.data_ptr<c10::BFloat16>(), has_bias ? bc.data_ptr<float>() : nullptr,
           y.data_ptr<float>(), xc.size(0), xc.size(1), xb.defined() ? xb.data_ptr<c10::BFloat16>() : nullptr);
    return y;
  }
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "few_rows_call", [&] {
    kernel(xc.data_ptr<scalar_t>(), wc.data_ptr<scalar_t>(), has_bias ? bc.data_ptr<scalar_t>() : nullptr,
           y.data_ptr<scalar_t>(), xc.size(0), xc.size(1), static_cast<const c10::BFloat16*>(nullptr));
  });
  return y;
}

}  // namespace

bool few_rows_bf16_dot() {
#ifdef FEW_ROWS_AVX512
  return bf16_dot_available();
#else
  return false;
#endif
}

at::Tensor few_rows_linear_cpu(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  check_few_rows_linear_args(x, weight, bias);
  return few_rows_call("few_rows_linear", x, weight, bias, weight.size(0),
                       [&](auto xp, auto wp, auto bp, auto yp, int64_t rows, int64_t K, const c10::BFloat16* xb) {
                         few_rows_kernel(xp, wp, bp, yp, rows, K, weight.size(0), xb);
                       });
}

at::Tensor few_rows_linear_packed_cpu(const at::Tensor& x, const at::Tensor& packed,
                                      const std::optional<at::Tensor>& bias, int64_t out_features, int64_t panel) {
  check_few_rows_linear_packed_args(x, packed, bias, out_features, panel);
  return few_rows_call("few_rows_linear_packed", x, packed, bias, out_features,
                       [&](auto xp, auto wp, auto bp, auto yp, int64_t rows, int64_t K, const c10::BFloat16* xb) {
                         packed_kernel(xp, wp, bp, yp, rows, K, out_features, panel, xb);
                       });
}

}  // namespace fairseq_ext

TORCH_LIBRARY_IMPL(fairseq_ext, CPU, m) {
  m.impl("few_rows_linear", &fairseq_ext::few_rows_linear_cpu);
  m.impl("few_rows_linear_packed", &fairseq_ext::few_rows_linear_packed_cpu);
}
