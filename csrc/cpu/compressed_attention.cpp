// CPU kernel of compressed_attention_decode (schema and maths: csrc/compressed_attention.cpp).
// Parallel over (batch, head): the scores over the encoder keys and the valid cached decoder keys go to
// a per-task scratch row (the caches are never concatenated), one max / exp / sum over both (Eq. 11),
// then ctx = Σ p_j v_j accumulated straight into the (batch, head) slice of the hidden row, and
// ReLU(xw1 + ctx) there (Eq. 13). The FFN's second layer is one product over all rows: few_rows_linear's
// kernel at 3-16 rows (a beam search step: W2 read once for all rows), else ATen's GEMM (BLAS).
// Row b reads the encoder keys/values of its sentence (entry b / (B / B_s)). Padded encoder positions (bias
// -inf) and cache positions from self_len on are not read. With self_rows,
// position j of row b's history is read from cache row self_rows[b, j] (beam search reorders the table).
// Deterministic: fixed summation order, no atomics.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <limits>
#include <vector>

#include "compressed_attention.h"
#include "cpu/vec.h"
#include "few_rows_linear.h"

namespace fairseq_ext {
namespace {

template <typename T>
void attend_rows(const T* q, const T* k_enc, const T* v_enc, const T* bias, const T* k_self, const T* v_self,
                 const T* xw1, int64_t xw1_stride, T* hidden, int64_t batch, int64_t heads, int64_t dh, int64_t dvh,
                 int64_t src, int64_t cap, int64_t self_len, const int64_t* rows, int64_t rows_stride, int64_t group) {
  const int64_t keys = src + self_len, dv = heads * dvh;
  at::parallel_for(0, batch * heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> p(keys);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / heads, h = bh % heads;
      const T* qr = q + bh * dh;
      const int64_t e = b / group;  // the sentence of this row: its encoder keys/values and padding
      const T* ke = k_enc + (e * heads + h) * src * dh;
      const T* ve = v_enc + (e * heads + h) * src * dvh;
      // cache position j of this row's history: row rows[b, j] of the caches (self_rows), else row b
      const int64_t* rb = rows ? rows + b * rows_stride : nullptr;
      auto ks = [&](int64_t j) { return k_self + (((rb ? rb[j] : b) * heads + h) * cap + j) * dh; };
      auto vs = [&](int64_t j) { return v_self + (((rb ? rb[j] : b) * heads + h) * cap + j) * dvh; };
      const T neg_inf = -std::numeric_limits<T>::infinity();
      T m = neg_inf;
      for (int64_t j = 0; j < src; ++j) {
        const T bj = bias ? bias[e * src + j] : T(0);
        p[j] = bj == neg_inf ? neg_inf : dot(qr, ke + j * dh, dh) + bj;
        m = std::max(m, p[j]);
      }
      for (int64_t j = 0; j < self_len; ++j) {
        p[src + j] = dot(qr, ks(j), dh);
        m = std::max(m, p[src + j]);
      }
      T sum = 0;
      for (int64_t j = 0; j < keys; ++j) {
        p[j] = p[j] == neg_inf ? T(0) : std::exp(p[j] - m);
        sum += p[j];
      }
      T* out = hidden + b * dv + h * dvh;
      for (int64_t i = 0; i < dvh; ++i) out[i] = 0;
      for (int64_t j = 0; j < src; ++j)
        if (p[j] != T(0)) axpy(p[j] / sum, ve + j * dvh, out, dvh);
      for (int64_t j = 0; j < self_len; ++j)
        if (p[src + j] != T(0)) axpy(p[src + j] / sum, vs(j), out, dvh);
      const T* xr = xw1 + b * xw1_stride + h * dvh;
      for (int64_t i = 0; i < dvh; ++i) {
        const T v = xr[i] + out[i];
        out[i] = v > T(0) ? v : T(0);
      }
    }
  });
}

at::Tensor compressed_attention_decode_cpu(const at::Tensor& q, const at::Tensor& k_enc, const at::Tensor& v_enc,
                                           const std::optional<at::Tensor>& enc_bias, const at::Tensor& k_self,
                                           const at::Tensor& v_self, int64_t self_len, const at::Tensor& xw1,
                                           const at::Tensor& w2, const at::Tensor& b2,
                                           const std::optional<at::Tensor>& self_rows) {
  check_compressed_attention_args(q, k_enc, v_enc, enc_bias, k_self, v_self, self_len, xw1, w2, b2, self_rows);
  at::Tensor rc = self_rows.has_value() ? self_rows->contiguous() : at::Tensor();
  if (rc.defined() && self_len > 0 && q.size(0) > 0) {  // every row the table points to is in the caches
    const auto used = rc.narrow(1, 0, self_len);
    const auto range = at::aminmax(used);
    TORCH_CHECK(std::get<0>(range).item<int64_t>() >= 0 && std::get<1>(range).item<int64_t>() < k_self.size(0),
                "compressed_attention_decode: self_rows must point to rows of the caches (0 to ", k_self.size(0) - 1,
                ")");
  }
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble,
              "compressed_attention_decode (CPU): float32 or float64, got ", q.scalar_type());
  auto qc = q.contiguous(), kec = k_enc.contiguous(), vec = v_enc.contiguous(), ksc = k_self.contiguous();
  // xw1 is read in place when its rows are contiguous (a slice of the fused q/k/v/X·W1 projection's output)
  auto vsc = v_self.contiguous(), xc = xw1.stride(1) == 1 ? xw1 : xw1.contiguous();
  at::Tensor bc = enc_bias.has_value() ? enc_bias->contiguous() : at::Tensor();
  auto hidden = at::empty(xc.sizes(), xc.options());  // (B, d_v): ReLU(xw1 + ctx)
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "compressed_attention_decode_cpu", [&] {
    attend_rows<scalar_t>(qc.data_ptr<scalar_t>(), kec.data_ptr<scalar_t>(), vec.data_ptr<scalar_t>(),
                          bc.defined() ? bc.data_ptr<scalar_t>() : nullptr, ksc.data_ptr<scalar_t>(),
                          vsc.data_ptr<scalar_t>(), xc.data_ptr<scalar_t>(), xc.size(0) > 1 ? xc.stride(0) : xc.size(1),
                          hidden.data_ptr<scalar_t>(),
                          qc.size(0), qc.size(1), qc.size(2), vec.size(3), kec.size(2), ksc.size(2), self_len,
                          rc.defined() ? rc.data_ptr<int64_t>() : nullptr, rc.defined() ? rc.size(1) : 0,
                          kec.size(0) ? qc.size(0) / kec.size(0) : 1);
  });
  const int64_t low = w2.scalar_type() == at::kBFloat16 ? 1 : kFewRowsMin;  // bf16 W2: the kernel from 1 row
  if (hidden.size(0) >= low && hidden.size(0) <= kFewRowsMax)  // a beam's few rows: W2 read once
    return few_rows_linear_cpu(hidden, w2, b2);
  return at::addmm(b2, hidden, w2.to(hidden.scalar_type()).t());  // (B, d)
}

}  // namespace
}  // namespace fairseq_ext

TORCH_LIBRARY_IMPL(fairseq_ext, CPU, m) {
  m.impl("compressed_attention_decode", &fairseq_ext::compressed_attention_decode_cpu);
}
