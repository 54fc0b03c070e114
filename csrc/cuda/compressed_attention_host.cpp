// CUDA implementation of compressed_attention_decode, host side (C++ compiler, CUDA builds only):
// argument checks and allocation, the attention kernel of csrc/cuda/compressed_attention.cu, then the
// FFN's second layer as one cuBLAS GEMM. Every error is raised here, never from nvcc-compiled code.
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "compressed_attention.h"

namespace fairseq_ext {
namespace {

at::Tensor compressed_attention_decode_cuda(const at::Tensor& q, const at::Tensor& k_enc, const at::Tensor& v_enc,
                                            const std::optional<at::Tensor>& enc_bias, const at::Tensor& k_self,
                                            const at::Tensor& v_self, int64_t self_len, const at::Tensor& xw1,
                                            const at::Tensor& w2, const at::Tensor& b2,
                                            const std::optional<at::Tensor>& self_rows) {
  check_compressed_attention_args(q, k_enc, v_enc, enc_bias, k_self, v_self, self_len, xw1, w2, b2, self_rows);
  TORCH_CHECK(!self_rows.has_value(), "compressed_attention_decode (CUDA): self_rows is CPU-only; reorder the "
              "caches and pass none");
  TORCH_CHECK(k_enc.size(0) == q.size(0), "compressed_attention_decode (CUDA): the encoder keys/values one entry "
              "per query row (one per sentence is CPU-only), got ", k_enc.size(0), " for ", q.size(0), " rows");
  const auto dtype = q.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble || dtype == at::kHalf || dtype == at::kBFloat16,
              "compressed_attention_decode (CUDA): float32, float64, float16 or bfloat16, got ", dtype);
  const int64_t keys = k_enc.size(2) + self_len;
  const int64_t max_keys = kCompressedAttentionScoreBytesCuda / (dtype == at::kDouble ? 8 : 4);
  TORCH_CHECK(keys <= max_keys, "compressed_attention_decode (CUDA): at most ", max_keys,
              " keys (source + decoded positions) per call, got ", keys, "; use the PyTorch reference");
  const c10::DeviceGuard guard(q.device());
  auto qc = q.contiguous(), kec = k_enc.contiguous(), vec = v_enc.contiguous(), ksc = k_self.contiguous();
  auto vsc = v_self.contiguous(), xc = xw1.contiguous();
  at::Tensor bc = enc_bias.has_value() ? enc_bias->contiguous() : at::Tensor();
  auto hidden = at::empty_like(xc);
  if (qc.size(0) > 0) {
    const char* err = compressed_attention_cuda_launch(qc, kec, vec, bc, ksc, vsc, self_len, xc, hidden);
    TORCH_CHECK(err == nullptr, "compressed_attention_decode (CUDA): ", err);
  }
  return at::addmm(b2, hidden, w2.t());
}

}  // namespace
}  // namespace fairseq_ext

TORCH_LIBRARY_IMPL(fairseq_ext, CUDA, m) {
  m.impl("compressed_attention_decode", &fairseq_ext::compressed_attention_decode_cuda);
}
