// compressed_attention_decode: one decoding step of the Compressed Attention Network's sub-layer
// (Li et al. 2021, Eq. 11 and 13) after the fused input projection. Schema and argument checks; the
// kernels are csrc/cpu/compressed_attention.cpp and csrc/cuda/compressed_attention{.cu,_host.cpp}.
// PyTorch reference: fairseq_ext/ops/compressed_attention.py.
//
//   q (B, H, dh), already scaled by dh^-1/2;  encoder keys/values k_enc (B_s, H, S, dh), v_enc (B_s, H, S, dvh)
//   with an additive padding bias enc_bias (B_s, S) (0 or -inf) or none, B_s dividing B: row b reads entry
//   b / (B / B_s) (one entry per sentence for its B / B_s consecutive beam rows); the decoder's own keys/values in
//   a preallocated cache k_self (B, H, cap, dh), v_self (B, H, cap, dvh) of which the first self_len
//   positions are valid; xw1 = X·W1 + b1 (B, H·dvh); W2 (d, H·dvh) (fc2.weight), b2 (d).
//   self_rows (B, >= self_len) int64, optional (CPU): position j of row b's history is at row self_rows[b, j]
//   of the caches, which then may have any number of rows (beam search reorders this table, not the caches).
//   p     = softmax over [q·k_enc + enc_bias ; q·k_self[:self_len]]     (one softmax, Eq. 11)
//   ctx_h = Σ_j p_j v_j                                                  (values in FFN-hidden space)
//   y     = ReLU(xw1 + ctx)·W2ᵀ + b2                                      (Eq. 13)
// Positions with bias -inf and cache positions from self_len on are never read.
#include <torch/extension.h>

#include "compressed_attention.h"

namespace fairseq_ext {

void check_compressed_attention_args(const at::Tensor& q, const at::Tensor& k_enc, const at::Tensor& v_enc,
                                     const std::optional<at::Tensor>& enc_bias, const at::Tensor& k_self,
                                     const at::Tensor& v_self, int64_t self_len, const at::Tensor& xw1,
                                     const at::Tensor& w2, const at::Tensor& b2,
                                     const std::optional<at::Tensor>& self_rows) {
  const char* op = "compressed_attention_decode";
  TORCH_CHECK(q.dim() == 3, op, ": q must be (batch, heads, head_dim), got ", q.sizes());
  const auto b = q.size(0), h = q.size(1), dh = q.size(2);
  // the encoder's keys/values: one entry per query row, or one per group of b / sentences consecutive rows
  const auto sentences = k_enc.dim() == 4 ? k_enc.size(0) : -1;
  TORCH_CHECK(k_enc.dim() == 4 && (b == 0 ? sentences == 0 : sentences > 0 && b % sentences == 0) &&
              k_enc.size(1) == h && k_enc.size(3) == dh, op, ": k_enc must be (sentences dividing the batch ", b,
              ", ", h, ", src_len, ", dh, "), got ", k_enc.sizes());
  const auto s = k_enc.size(2);
  TORCH_CHECK(v_enc.dim() == 4 && v_enc.size(0) == sentences && v_enc.size(1) == h && v_enc.size(2) == s, op,
              ": v_enc must be (", sentences, ", ", h, ", ", s, ", value_head_dim), got ", v_enc.sizes());
  const auto dvh = v_enc.size(3);
  // with self_rows the caches' rows are any rows the table points to; without, one per query row
  const auto cache_rows = self_rows.has_value() ? k_self.size(0) : b;
  TORCH_CHECK(k_self.dim() == 4 && k_self.size(0) == cache_rows && k_self.size(1) == h && k_self.size(3) == dh, op,
              ": k_self must be (", cache_rows, ", ", h, ", capacity, ", dh, "), got ", k_self.sizes());
  TORCH_CHECK(v_self.dim() == 4 && v_self.size(0) == cache_rows && v_self.size(1) == h &&
              v_self.size(2) == k_self.size(2) && v_self.size(3) == dvh, op, ": v_self must be (", cache_rows, ", ", h,
              ", ", k_self.size(2), ", ", dvh, "), got ", v_self.sizes());
  if (self_rows.has_value()) {
    TORCH_CHECK(self_rows->dim() == 2 && self_rows->size(0) == b && self_rows->size(1) >= self_len, op,
                ": self_rows must be (", b, ", >= self_len ", self_len, "), got ", self_rows->sizes());
    TORCH_CHECK(self_rows->scalar_type() == at::kLong && self_rows->device() == q.device(), op,
                ": self_rows must be int64 on q's device, got ", self_rows->scalar_type(), " on ", self_rows->device());
  }
  TORCH_CHECK(self_len >= 0 && self_len <= k_self.size(2), op, ": self_len ", self_len,
              " must be within the cache capacity ", k_self.size(2));
  TORCH_CHECK(s + self_len > 0, op, ": no keys to attend to (src_len 0 and self_len 0)");
  TORCH_CHECK(xw1.dim() == 2 && xw1.size(0) == b && xw1.size(1) == h * dvh, op, ": xw1 must be (", b, ", ",
              h * dvh, "), got ", xw1.sizes());
  TORCH_CHECK(w2.dim() == 2 && w2.size(1) == h * dvh, op, ": W2 must be (d_model, ", h * dvh, "), got ", w2.sizes());
  TORCH_CHECK(b2.dim() == 1 && b2.size(0) == w2.size(0), op, ": b2 must be (", w2.size(0), "), got ", b2.sizes());
  // W2 may be bf16 with float32 q on a CPU (fast-path --bf16: read as bf16 by few_rows_linear's kernel)
  const bool bf16_w2 = w2.scalar_type() == at::kBFloat16 && q.scalar_type() == at::kFloat && q.device().is_cpu();
  TORCH_CHECK(w2.scalar_type() == q.scalar_type() || bf16_w2, op, ": W2 must have q's dtype ", q.scalar_type(),
              " (or be bfloat16 with float32 q on a CPU), got ", w2.scalar_type());
  std::vector<const at::Tensor*> all = {&k_enc, &v_enc, &k_self, &v_self, &xw1, &b2};
  if (enc_bias.has_value()) {
    TORCH_CHECK(enc_bias->dim() == 2 && enc_bias->size(0) == sentences && enc_bias->size(1) == s, op,
                ": enc_bias must be (", sentences, ", ", s, "), got ", enc_bias->sizes());
    all.push_back(&*enc_bias);
  }
  TORCH_CHECK(w2.device() == q.device(), op, ": all tensors must be on q's device");
  for (const auto* t : all) {
    TORCH_CHECK(t->scalar_type() == q.scalar_type(), op, ": all tensors must have q's dtype ", q.scalar_type(),
                ", got ", t->scalar_type());
    TORCH_CHECK(t->device() == q.device(), op, ": all tensors must be on q's device");
  }
}

}  // namespace fairseq_ext

TORCH_LIBRARY_FRAGMENT(fairseq_ext, m) {
  m.def("compressed_attention_decode(Tensor q, Tensor k_enc, Tensor v_enc, Tensor? enc_bias, Tensor k_self, "
        "Tensor v_self, int self_len, Tensor xw1, Tensor w2, Tensor b2, Tensor? self_rows=None) -> Tensor");
}
