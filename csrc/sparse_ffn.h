// sparse_ffn_decode: shared declarations of the schema file (csrc/sparse_ffn.cpp) and its CPU and CUDA
// kernels (csrc/cpu/sparse_ffn.cpp; csrc/cuda/sparse_ffn_host.cpp + sparse_ffn.cu).
#pragma once
#include <ATen/core/Tensor.h>

namespace fairseq_ext {

// Shapes, dtypes and devices of sparse_ffn_decode's arguments; throws with the argument's name.
void check_sparse_ffn_args(const at::Tensor& x, const at::Tensor& c1, const at::Tensor& c2, const at::Tensor& cb,
                           const at::Tensor& w1, const at::Tensor& w2, const at::Tensor& b2, int64_t block_size);

// CUDA builds only (csrc/cuda/sparse_ffn.cu): launches the kernels on x's current stream over
// arguments already checked and allocated by csrc/cuda/sparse_ffn_host.cpp (x, C1, C2, c, W1, W2, b2
// contiguous of one dtype; scratch z (n, d_lowrank) of that dtype, rows (n, blocks) int64, h (n, blocks)
// float, or double for double inputs; y like x). Throws nothing: returns nullptr, or CUDA's error text.
const char* sparse_ffn_decode_cuda_launch(const at::Tensor& x, const at::Tensor& c1, const at::Tensor& c2,
                                          const at::Tensor& cb, const at::Tensor& w1, const at::Tensor& w2,
                                          const at::Tensor& b2, at::Tensor& z, at::Tensor& rows, at::Tensor& h,
                                          at::Tensor& y, int64_t block_size);

}  // namespace fairseq_ext
