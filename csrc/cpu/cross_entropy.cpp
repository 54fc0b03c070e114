// CPU kernel of label_smoothed_ce_fwd / _bwd (schema and maths: csrc/cross_entropy.cpp).
// Parallel over rows; each row is read twice by the forward (max and Σx, then Σexp) and once by the backward,
// in float32 whatever the storage type (float32, bfloat16, float16). Per-row sums in a fixed order: deterministic,
// independent of the thread count. float32 and bfloat16 rows take AVX-512 intrinsics (avx512.h) where the CPU
// has AVX-512F/BW/VL (checked at run time); otherwise, and for float16, portable loops with the vectorisable exp
// of vec.h, compiled by target_clones with an AVX-512 and an AVX2+FMA version beside the default one.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>

#include "cross_entropy.h"
#include "cpu/vec.h"
#include "cpu/avx512.h"

#include <type_traits>

namespace fairseq_ext {

namespace {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CE_CLONES __attribute__((target_clones("avx512f", "avx2,fma", "default")))
#else
#define CE_CLONES
#endif

constexpr int kLanes = 16;

// max and sum of a row (sum in 16 float partial sums, then in double)
template <typename T>
CE_CLONES void row_max_sum(const T* x, int64_t v, float* max_out, double* sum_out) {
  float m[kLanes], s[kLanes];
  for (int l = 0; l < kLanes; ++l) { m[l] = -INFINITY; s[l] = 0.f; }
  int64_t j = 0;
  for (; j + kLanes <= v; j += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const float a = load_f(x + j + l);
      m[l] = a > m[l] ? a : m[l];
      s[l] += a;
    }
  float mx = -INFINITY;
  double sum = 0;
  for (int l = 0; l < kLanes; ++l) { mx = m[l] > mx ? m[l] : mx; sum += s[l]; }
  for (; j < v; ++j) {
    const float a = load_f(x + j);
    mx = a > mx ? a : mx;
    sum += a;
  }
  *max_out = mx;
  *sum_out = sum;
}

template <typename T>
CE_CLONES float row_sum_exp(const T* x, int64_t v, float shift) {
  float s[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= v; j += kLanes)
    for (int l = 0; l < kLanes; ++l) s[l] += exp_f(load_f(x + j + l) - shift);
  double sum = 0;
  for (int l = 0; l < kLanes; ++l) sum += s[l];
  for (; j < v; ++j) sum += exp_f(load_f(x + j) - shift);
  return static_cast<float>(sum);
}

template <typename T>
CE_CLONES void row_grad(const T* x, T* g, int64_t v, float lse, float scale, float minus) {
  // g_j = scale · exp(x_j − lse) − minus   (minus = scale · ε')
  for (int64_t j = 0; j < v; ++j) store_f(g + j, scale * exp_f(load_f(x + j) - lse) - minus);
}

#ifdef FAIRSEQ_EXT_HAS_AVX512_PATH
template <typename T>
constexpr bool kAvx512Type = std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16>;

// a row's max and sum (double), then sum exp(x - max) (double): 16 lanes, lane sums in a fixed order
template <typename T>
FAIRSEQ_EXT_AVX512 void row_stats_avx512(const T* x, int64_t v, float* max_out, double* sum_out, float* sexp_out) {
  __m512 m = _mm512_set1_ps(-INFINITY), s = _mm512_setzero_ps();
  const int64_t full = v & ~int64_t{15};
  const __mmask16 tail = full < v ? tail_mask(v - full) : 0;
  for (int64_t j = 0; j < full; j += 16) {
    const __m512 a = ld16(x + j);
    m = _mm512_max_ps(m, a);
    s = _mm512_add_ps(s, a);
  }
  if (tail) {
    const __m512 a = ld16(x + full, tail);
    m = _mm512_mask_max_ps(m, tail, m, a);
    s = _mm512_add_ps(s, a);  // lanes outside the tail add 0
  }
  const float mx = _mm512_reduce_max_ps(m);
  const __m512 shift = _mm512_set1_ps(mx);
  __m512 e = _mm512_setzero_ps();
  for (int64_t j = 0; j < full; j += 16) e = _mm512_add_ps(e, exp16(_mm512_sub_ps(ld16(x + j), shift)));
  if (tail) e = _mm512_mask_add_ps(e, tail, e, exp16(_mm512_sub_ps(ld16(x + full, tail), shift)));
  *max_out = mx;
  *sum_out = lanes_sum(s);
  *sexp_out = static_cast<float>(lanes_sum(e));
}

// g_j = scale · exp(x_j − lse) − minus, as row_grad
template <typename T>
FAIRSEQ_EXT_AVX512 void row_grad_avx512(const T* x, T* g, int64_t v, float lse, float scale, float minus) {
  const __m512 l = _mm512_set1_ps(lse), sc = _mm512_set1_ps(scale), mi = _mm512_set1_ps(minus);
  const int64_t full = v & ~int64_t{15};
  for (int64_t j = 0; j < full; j += 16)
    st16(g + j, _mm512_fmsub_ps(sc, exp16(_mm512_sub_ps(ld16(x + j), l)), mi));
  if (full < v) {
    const __mmask16 tail = tail_mask(v - full);
    st16(g + full, _mm512_fmsub_ps(sc, exp16(_mm512_sub_ps(ld16(x + full, tail), l)), mi), tail);
  }
}
#endif

// max, sum and sum of exp(x - max) of one row: AVX-512 where available for float32 / bfloat16
template <typename T>
void row_stats(const T* x, int64_t v, float* mx, double* sum, float* sexp, bool avx512) {
#ifdef FAIRSEQ_EXT_HAS_AVX512_PATH
  if constexpr (kAvx512Type<T>) {
    if (avx512) return row_stats_avx512(x, v, mx, sum, sexp);
  }
#endif
  row_max_sum(x, v, mx, sum);
  *sexp = row_sum_exp(x, v, *mx);
}

template <typename T>
void row_grad_any(const T* x, T* g, int64_t v, float lse, float scale, float minus, bool avx512) {
#ifdef FAIRSEQ_EXT_HAS_AVX512_PATH
  if constexpr (kAvx512Type<T>) {
    if (avx512) return row_grad_avx512(x, g, v, lse, scale, minus);
  }
#endif
  row_grad(x, g, v, lse, scale, minus);
}

template <typename T>
void forward_rows(const T* x, const int64_t* t, float* out, int64_t n, int64_t v, double eps, int64_t ignore) {
  const double eps_i = eps / (v - 1), c_t = 1.0 - eps - eps_i;
  const bool avx512 = avx512_training_available();
  at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float* o = out + 3 * i;
      if (t[i] == ignore) { o[0] = o[1] = o[2] = 0.f; continue; }
      const T* row = x + i * v;
      float mx, sexp;
      double sum;
      row_stats(row, v, &mx, &sum, &sexp, avx512);
      const double lse = static_cast<double>(mx) + std::log(static_cast<double>(sexp));
      const double nll = lse - static_cast<double>(load_f(row + t[i]));
      o[0] = static_cast<float>(c_t * nll + eps_i * (v * lse - sum));
      o[1] = static_cast<float>(nll);
      o[2] = static_cast<float>(lse);
    }
  });
}

template <typename T>
void backward_rows(const T* x, const int64_t* t, const float* lse, const float* scale, T* g, int64_t n, int64_t v,
                   double eps, int64_t ignore) {
  const double eps_i = eps / (v - 1), c_t = 1.0 - eps - eps_i;
  const bool avx512 = avx512_training_available();
  at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      T* gr = g + i * v;
      if (t[i] == ignore || scale[i] == 0.f) {
        for (int64_t j = 0; j < v; ++j) store_f(gr + j, 0.f);
        continue;
      }
      const T* row = x + i * v;
      row_grad_any(row, gr, v, lse[i], scale[i], static_cast<float>(scale[i] * eps_i), avx512);
      const float p_t = exp_f(load_f(row + t[i]) - lse[i]);
      store_f(gr + t[i], scale[i] * p_t - static_cast<float>(scale[i] * eps_i) - static_cast<float>(scale[i] * c_t));
    }
  });
}

#define CE_DISPATCH(TYPE, NAME, ...)                                                              \
  switch (TYPE) {                                                                                \
    case at::kFloat: { using scalar_t = float; __VA_ARGS__(); break; }                           \
    case at::kBFloat16: { using scalar_t = c10::BFloat16; __VA_ARGS__(); break; }                \
    case at::kHalf: { using scalar_t = c10::Half; __VA_ARGS__(); break; }                        \
    default: TORCH_CHECK(false, NAME ": float32, bfloat16 or float16 logits, got ", TYPE);       \
  }

void check_targets(const at::Tensor& target, int64_t v, int64_t ignore) {
  const auto bad = (target.ne(ignore) & (target.lt(0) | target.ge(v))).any().item<bool>();
  TORCH_CHECK(!bad, "label_smoothed_ce: a target is outside [0, ", v, ") and is not ignore_index ", ignore);
}

}  // namespace

at::Tensor label_smoothed_ce_fwd_cpu(const at::Tensor& logits, const at::Tensor& target, double epsilon,
                                     int64_t ignore_index) {
  check_label_smoothed_ce_args(logits, target);
  auto x = logits.contiguous();
  auto t = target.contiguous();
  const int64_t n = x.size(0), v = x.size(1);
  check_targets(t, v, ignore_index);
  auto out = at::empty({n, 3}, x.options().dtype(at::kFloat));
  CE_DISPATCH(x.scalar_type(), "label_smoothed_ce_fwd (CPU)", [&] {
    forward_rows<scalar_t>(x.data_ptr<scalar_t>(), t.data_ptr<int64_t>(), out.data_ptr<float>(), n, v, epsilon,
                           ignore_index);
  });
  return out;
}

at::Tensor label_smoothed_ce_bwd_cpu(const at::Tensor& logits, const at::Tensor& target, const at::Tensor& lse,
                                     const at::Tensor& row_scale, double epsilon, int64_t ignore_index) {
  check_label_smoothed_ce_args(logits, target);
  const int64_t n = logits.size(0), v = logits.size(1);
  for (const auto* a : {&lse, &row_scale}) {
    TORCH_CHECK(a->dim() == 1 && a->size(0) == n && a->scalar_type() == at::kFloat,
                "label_smoothed_ce_bwd: lse and row_scale must be float32 (", n, "), got ", a->sizes(), " ",
                a->scalar_type());
  }
  auto x = logits.contiguous();
  auto t = target.contiguous();
  check_targets(t, v, ignore_index);
  auto l = lse.contiguous(), s = row_scale.contiguous();
  auto g = at::empty_like(x);
  CE_DISPATCH(x.scalar_type(), "label_smoothed_ce_bwd (CPU)", [&] {
    backward_rows<scalar_t>(x.data_ptr<scalar_t>(), t.data_ptr<int64_t>(), l.data_ptr<float>(), s.data_ptr<float>(),
                            g.data_ptr<scalar_t>(), n, v, epsilon, ignore_index);
  });
  return g;
}

}  // namespace fairseq_ext

TORCH_LIBRARY_IMPL(fairseq_ext, CPU, m) {
  m.impl("label_smoothed_ce_fwd", &fairseq_ext::label_smoothed_ce_fwd_cpu);
  m.impl("label_smoothed_ce_bwd", &fairseq_ext::label_smoothed_ce_bwd_cpu);
}
