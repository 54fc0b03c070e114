// CPU kernel of int8_linear (schema, packed layout and maths: csrc/int8_linear.cpp). x is quantized per row to
// q + 128 (unsigned bytes, padded to the tiles' 4-input groups, kept in L1); then the weight is streamed once
// per group of up to 8 rows of x, G tiles of 16 outputs per task:
//   AVX-512 VNNI (vpdpbusd: 64 unsigned x signed byte products into 16 int32 lanes, one output per lane),
//   chosen at run time where the CPU has it (with AVX-512F/BW/VL), x's quantization and y's scaling in 16-lane
//   intrinsics too; elsewhere portable loops (GCC target_clones: an AVX-512F, an AVX2 and a plain version).
// Both give the exact integer sums, so y is the same bit for bit on every path and thread count. The float
// steps (x's scale and rounding, y's scaling) are compiled with contraction off (NO_FP_CONTRACT): no fused
// multiply-add, the same float32 operations in the same order as the reference.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "int8_linear.h"
#include "cpu/avx512.h"  // cpu_isa_portable

namespace fairseq_ext {

namespace {

constexpr int kMaxRows = 8;     // x rows per pass over W
constexpr int kPrefetch = 1024; // bytes ahead of each tile stream

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define INT8_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define INT8_CLONES
#endif

// acc[g][m][c] = Σ_k xu[m, k] · W[(t0 + g) · 16 + c, k] for G tiles from t0 (packed layout: csrc/int8_linear.cpp),
// xu: M rows of Kq · 4 bytes (q + 128, padded with 128), exact int32
template <int M, int G>
INT8_CLONES void tiles_dot(const uint8_t* xu, int64_t Kq, const int8_t* wp, int32_t* acc) {
  int32_t a[G][M][16] = {};
  for (int64_t kq = 0; kq < Kq; ++kq)
    for (int g = 0; g < G; ++g) {
      const int8_t* w = wp + (g * Kq + kq) * 64;
      for (int m = 0; m < M; ++m) {
        const uint8_t* x = xu + m * Kq * 4 + kq * 4;
        for (int c = 0; c < 16; ++c)
          a[g][m][c] += int32_t(x[0]) * w[c * 4] + int32_t(x[1]) * w[c * 4 + 1] + int32_t(x[2]) * w[c * 4 + 2] +
                        int32_t(x[3]) * w[c * 4 + 3];
      }
    }
  for (int g = 0; g < G; ++g)
    for (int m = 0; m < M; ++m)
      for (int c = 0; c < 16; ++c) acc[(g * M + m) * 16 + c] = a[g][m][c];
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define INT8_VNNI 1
// tiles_dot with vpdpbusd: per 64 bytes of a tile (16 outputs x 4 k), one instruction per x row, its 4 bytes
// broadcast; every lane is one output, so no horizontal sums
template <int M, int G>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void tiles_dot_vnni(const uint8_t* xu, int64_t Kq,
                                                                            const int8_t* wp, int32_t* acc) {
  __m512i a[G][M];
  for (int g = 0; g < G; ++g)
    for (int m = 0; m < M; ++m) a[g][m] = _mm512_setzero_si512();
  const int32_t* x32 = reinterpret_cast<const int32_t*>(xu);
  for (int64_t kq = 0; kq < Kq; ++kq) {
    __m512i xb[M];  // x's 4 bytes at kq, broadcast once for the G tiles
    for (int m = 0; m < M; ++m) xb[m] = _mm512_set1_epi32(x32[m * Kq + kq]);
    for (int g = 0; g < G; ++g) {
      const int8_t* w = wp + (g * Kq + kq) * 64;
      __builtin_prefetch(w + kPrefetch);
      const __m512i wv = _mm512_loadu_si512(w);
      for (int m = 0; m < M; ++m) a[g][m] = _mm512_dpbusd_epi32(a[g][m], xb[m], wv);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int m = 0; m < M; ++m) _mm512_storeu_si512(acc + (g * M + m) * 16, a[g][m]);
}

bool vnni_available() {  // AVX-512F/BW/VL as the training kernels, and VNNI; FAIRSEQ_EXT_CPU_ISA=portable: off
  static const bool vnni = __builtin_cpu_supports("avx512vnni");
  return vnni && avx512_training_available();
}
#endif

#if defined(__GNUC__) && !defined(__clang__)
#define NO_FP_CONTRACT __attribute__((optimize("-ffp-contract=off")))
#else
#define NO_FP_CONTRACT
#endif

// y[m, j] for the outputs of G tiles from t0: the exact sums minus the 128 · Σ W_q of xu's offset, then
// float(sum) · (s_x · s_w) + b, each a float32 operation of its own (no fused multiply-add, as the reference)
NO_FP_CONTRACT void scale_out(const int32_t* acc, int G, int M, int64_t t0, const float* sx, const float* sw,
                              const int32_t* wsum, const float* b, float* y, int64_t N) {
  for (int g = 0; g < G; ++g)
    for (int m = 0; m < M; ++m) {
      const int32_t* a = acc + (g * M + m) * 16;
      const int64_t j0 = (t0 + g) * 16;
      for (int c = 0; c < 16 && j0 + c < N; ++c) {
        const int64_t j = j0 + c;
        float v = static_cast<float>(a[c] - 128 * wsum[j]) * (sx[m] * sw[j]);
        if (b) v = v + b[j];
        y[m * N + j] = v;
      }
    }
}

#ifdef INT8_VNNI
// scale_out with AVX-512, 16 outputs at a time: the same float32 operations in the same order (a product, then
// a separate sum: contraction off)
__attribute__((target("avx512f"), optimize("-ffp-contract=off"))) void scale_out_avx512(
    const int32_t* acc, int G, int M, int64_t t0, const float* sx, const float* sw, const int32_t* wsum,
    const float* b, float* y, int64_t N) {
  for (int g = 0; g < G; ++g) {
    const int64_t j0 = (t0 + g) * 16;
    const __mmask16 m16 = N - j0 >= 16 ? __mmask16(0xFFFF) : tail_mask(N - j0);
    const __m512i off = _mm512_slli_epi32(_mm512_maskz_loadu_epi32(m16, wsum + j0), 7);  // 128 · Σ W_q
    const __m512 swv = _mm512_maskz_loadu_ps(m16, sw + j0);
    const __m512 bv = b ? _mm512_maskz_loadu_ps(m16, b + j0) : _mm512_setzero_ps();
    for (int m = 0; m < M; ++m) {
      const __m512i a = _mm512_sub_epi32(_mm512_loadu_si512(acc + (g * M + m) * 16), off);
      __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(a), _mm512_mul_ps(_mm512_set1_ps(sx[m]), swv));
      if (b) v = _mm512_add_ps(v, bv);
      _mm512_mask_storeu_ps(y + m * N + j0, m16, v);
    }
  }
}
#endif

// y rows [0, M) from the quantized rows xu: W read once, G tiles of 16 outputs at a time (G streams per task:
// as many as keep G x M accumulators in AVX-512's 32 registers), the last tiles one at a time
template <int M>
void rows_pass(bool vnni, const uint8_t* xu, const float* sx, const int8_t* wp, const float* sw,
               const int32_t* wsum, const float* b, float* y, int64_t Kq, int64_t N) {
  constexpr int G = M <= 2 ? 8 : M <= 3 ? 6 : M <= 4 ? 5 : M <= 6 ? 4 : 3;
  const int64_t tiles = (N + 15) / 16, groups = tiles / G;
  (void)vnni;  // (no VNNI path in this build)
  at::parallel_for(0, groups + tiles % G, 4, [&](int64_t begin, int64_t end) {
    int32_t acc[G * M * 16];
    for (int64_t i = begin; i < end; ++i) {
      const int64_t t0 = i < groups ? i * G : groups * G + (i - groups);
      const int n = i < groups ? G : 1;
      const int8_t* w = wp + t0 * Kq * 64;
#ifdef INT8_VNNI
      if (vnni) {
        if (n == G)
          tiles_dot_vnni<M, G>(xu, Kq, w, acc);
        else
          tiles_dot_vnni<M, 1>(xu, Kq, w, acc);
        scale_out_avx512(acc, n, M, t0, sx, sw, wsum, b, y, N);
        continue;
      }
#endif
      if (n == G)
        tiles_dot<M, G>(xu, Kq, w, acc);
      else
        tiles_dot<M, 1>(xu, Kq, w, acc);
      scale_out(acc, n, M, t0, sx, sw, wsum, b, y, N);
    }
  });
}

// row m of x -> xu (q + 128) and its scale, as the reference: s = max|x| / 127, q = round(x · (127 / max|x|));
// a row that is all zero gives q = 0, s = 0 (y = b); one with a NaN or infinity q = 0, s = NaN (y = NaN)
NO_FP_CONTRACT void quantize_row(const float* x, int64_t K, int64_t Kp, uint8_t* xu, float* s) {
  for (int64_t k = K; k < Kp; ++k) xu[k] = 128;  // padding: q = 0 against the weight's zero padding
  float amax = 0.f;
  bool finite = true;
  for (int64_t k = 0; k < K; ++k) {
    finite = finite && std::isfinite(x[k]);
    amax = std::fmax(amax, std::fabs(x[k]));
  }
  if (!finite || amax == 0.f) {
    *s = finite ? 0.f : std::nanf("");
    for (int64_t k = 0; k < K; ++k) xu[k] = 128;
    return;
  }
  const float inv = 127.f / amax;
  *s = amax / 127.f;
  for (int64_t k = 0; k < K; ++k) {
    float q = std::nearbyint(x[k] * inv);  // to nearest, ties to even (the default rounding mode), as torch.round
    q = std::fmin(127.f, std::fmax(-127.f, q));
    xu[k] = static_cast<uint8_t>(static_cast<int32_t>(q) + 128);
  }
}

#ifdef INT8_VNNI
// quantize_row with AVX-512: the same float32 operations (max |x|, one product x · inv, rounding to nearest even,
// the clamp), 16 at a time; no multiply is followed by an add, so nothing can be fused
__attribute__((target("avx512f,avx512bw,avx512vl"))) void quantize_row_avx512(const float* x, int64_t K, int64_t Kp,
                                                                      uint8_t* xu, float* s) {
  for (int64_t k = K; k < Kp; ++k) xu[k] = 128;
  __m512 amax = _mm512_setzero_ps();
  __mmask16 finite = 0xFFFF;
  const __m512 zero = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k < K; k += 16) {
    const __mmask16 m = K - k >= 16 ? __mmask16(0xFFFF) : tail_mask(K - k);
    const __m512 v = _mm512_maskz_loadu_ps(m, x + k);
    finite &= _mm512_cmp_ps_mask(_mm512_sub_ps(v, v), zero, _CMP_EQ_OQ);  // x - x is 0 unless NaN or infinite
    amax = _mm512_max_ps(amax, _mm512_abs_ps(v));
  }
  const float a = _mm512_reduce_max_ps(amax);
  if (finite != 0xFFFF || a == 0.f) {
    *s = finite != 0xFFFF ? std::nanf("") : 0.f;
    std::memset(xu, 128, static_cast<size_t>(K));
    return;
  }
  const float invs = 127.f / a;
  *s = a / 127.f;
  const __m512 inv = _mm512_set1_ps(invs), hi = _mm512_set1_ps(127.f), lo = _mm512_set1_ps(-127.f);
  const __m512i off = _mm512_set1_epi32(128);
  for (k = 0; k < K; k += 16) {
    const __mmask16 m = K - k >= 16 ? __mmask16(0xFFFF) : tail_mask(K - k);
    __m512 q = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + k), inv),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q = _mm512_min_ps(hi, _mm512_max_ps(lo, q));
    _mm_mask_storeu_epi8(xu + k, m, _mm512_cvtepi32_epi8(_mm512_add_epi32(_mm512_cvtps_epi32(q), off)));
  }
}
#endif

}  // namespace

at::Tensor int8_linear_cpu(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& weight_scale,
                           const at::Tensor& weight_sum, const std::optional<at::Tensor>& bias) {
  check_int8_linear_args(x, weight, weight_scale, weight_sum, bias);
  const bool has_bias = bias.has_value() && bias->defined();
  auto xc = x.contiguous(), wc = weight.contiguous(), sc = weight_scale.contiguous(), ws = weight_sum.contiguous();
  at::Tensor bc = has_bias ? bias->contiguous() : at::Tensor();
  const int64_t M = xc.size(0), K = xc.size(1), N = weight_scale.size(0), Kq = wc.size(1);
  auto y = at::empty({M, N}, xc.options());
  if (M == 0 || N == 0) return y;
  std::vector<uint8_t> xu(static_cast<size_t>(M * Kq * 4));
  std::vector<float> sx(static_cast<size_t>(M));
  const float* xp = xc.data_ptr<float>();
#ifdef INT8_VNNI
  const bool vnni = vnni_available();  // once per call: every row and pass takes the same path
#else
  const bool vnni = false;
#endif
  for (int64_t m = 0; m < M; ++m) {
#ifdef INT8_VNNI
    if (vnni) {
      quantize_row_avx512(xp + m * K, K, Kq * 4, xu.data() + m * Kq * 4, sx.data() + m);
      continue;
    }
#endif
    quantize_row(xp + m * K, K, Kq * 4, xu.data() + m * Kq * 4, sx.data() + m);
  }
  const int8_t* w = wc.data_ptr<int8_t>();
  const float* swp = sc.data_ptr<float>();
  const int32_t* wsp = ws.data_ptr<int32_t>();
  const float* bp = has_bias ? bc.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  for (int64_t r = 0; r < M; r += kMaxRows) {
    const uint8_t* xr = xu.data() + r * Kq * 4;
    const float* sr = sx.data() + r;
    float* yr = yp + r * N;
    switch (std::min<int64_t>(kMaxRows, M - r)) {
      case 1: rows_pass<1>(vnni, xr, sr, w, swp, wsp, bp, yr, Kq, N); break;
      case 2: rows_pass<2>(vnni, xr, sr, w, swp, wsp, bp, yr, Kq, N); break;
      case 3: rows_pass<3>(vnni, xr, sr, w, swp, wsp, bp, yr, Kq, N); break;
      case 4: rows_pass<4>(vnni, xr, sr, w, swp, wsp, bp, yr, Kq, N); break;
      case 5: rows_pass<5>(vnni, xr, sr, w, swp, wsp, bp, yr, Kq, N); break;
      case 6: rows_pass<6>(vnni, xr, sr, w, swp, wsp, bp, yr, Kq, N); break;
      case 7: rows_pass<7>(vnni, xr, sr, w, swp, wsp, bp, yr, Kq, N); break;
      default: rows_pass<8>(vnni, xr, sr, w, swp, wsp, bp, yr, Kq, N); break;
    }
  }
  return y;
}

}  // namespace fairseq_ext

TORCH_LIBRARY_IMPL(fairseq_ext, CPU, m) {
  m.impl("int8_linear", &fairseq_ext::int8_linear_cpu);
}
