// compressed_attention_decode: shared declarations of the schema file (csrc/compressed_attention.cpp)
// and its kernels (csrc/cpu/compressed_attention.cpp; csrc/cuda/compressed_attention_host.cpp + .cu).
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

namespace fairseq_ext {

// Shapes, dtypes and devices of compressed_attention_decode's arguments; throws naming the argument.
void check_compressed_attention_args(const at::Tensor& q, const at::Tensor& k_enc, const at::Tensor& v_enc,
                                     const std::optional<at::Tensor>& enc_bias, const at::Tensor& k_self,
                                     const at::Tensor& v_self, int64_t self_len, const at::Tensor& xw1,
                                     const at::Tensor& w2, const at::Tensor& b2,
                                     const std::optional<at::Tensor>& self_rows);

// CUDA builds only (csrc/cuda/compressed_attention.cu): hidden = ReLU(xw1 + A·V) for every (batch, head)
// on q's current stream, over arguments already checked, made contiguous and allocated by
// csrc/cuda/compressed_attention_host.cpp (hidden like xw1; bias undefined when absent). Throws nothing:
// returns nullptr, or CUDA's error text.
const char* compressed_attention_cuda_launch(const at::Tensor& q, const at::Tensor& k_enc, const at::Tensor& v_enc,
                                             const at::Tensor& enc_bias, const at::Tensor& k_self,
                                             const at::Tensor& v_self, int64_t self_len, const at::Tensor& xw1,
                                             at::Tensor& hidden);

// Shared memory for the scores of one CUDA call (source + cached decoder keys, float, or double for
// double inputs): 40 KB, under the 48 KB a block gets without opting in. 10,240 keys (5,120 in double).
constexpr int64_t kCompressedAttentionScoreBytesCuda = 40 * 1024;

}  // namespace fairseq_ext
