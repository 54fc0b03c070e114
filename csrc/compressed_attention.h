// compressed_attention_decode: shared declarations of the schema file (csrc/compressed_attention.cpp)
// and its kernels (csrc/cpu/compressed_attention.cpp).
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

namespace fairseq_ext {

// Shapes, dtypes and devices of compressed_attention_decode's arguments; throws naming the argument.
void check_compressed_attention_args(const at::Tensor& q, const at::Tensor& k_enc, const at::Tensor& v_enc,
                                     const std::optional<at::Tensor>& enc_bias, const at::Tensor& k_self,
                                     const at::Tensor& v_self, int64_t self_len, const at::Tensor& xw1,
                                     const at::Tensor& w2, const at::Tensor& b2);

}  // namespace fairseq_ext
