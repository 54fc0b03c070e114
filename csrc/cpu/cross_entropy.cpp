// CPU kernel of label_smoothed_ce_fwd / _bwd (schema and maths: csrc/cross_entropy.cpp).
// Parallel over rows; each row is read twice by the forward (max and Σx, then Σexp) and once by the backward,
// in float32 whatever the storage type (float32, bfloat16, float16), with the
// vectorisable exp of vec.h. Per-row sums in a fixed order: deterministic, independent of the thread count.
// target_clones: an AVX-512 and an AVX2+FMA version beside the portable one, picked at run time.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>

#include "cross_entropy.h"
#include "cpu/vec.h"

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

template <typename T>
void forward_rows(const T* x, const int64_t* t, float* out, int64_t n, int64_t v, double eps, int64_t ignore) {
  const double eps_i = eps / (v - 1), c_t = 1.0 - eps - eps_i;
  at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float* o = out + 3 * i;
      if (t[i] == ignore) { o[0] = o[1] = o[2] = 0.f; continue; }
      const T* row = x + i * v;
      float mx;
      double sum;
      row_max_sum(row, v, &mx, &sum);
      const double lse = static_cast<double>(mx) + std::log(static_cast<double>(row_sum_exp(row, v, mx)));
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
  at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      T* gr = g + i * v;
      if (t[i] == ignore || scale[i] == 0.f) {
        for (int64_t j = 0; j < v; ++j) store_f(gr + j, 0.f);
        continue;
      }
      const T* row = x + i * v;
      row_grad(row, gr, v, lse[i], scale[i], static_cast<float>(scale[i] * eps_i));
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
