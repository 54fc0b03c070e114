// CUDA implementation of sparse_ffn_decode, host side (compiled by the C++ compiler, in CUDA builds only):
// argument checks and allocation, then the kernels of csrc/cuda/sparse_ffn.cu. Every error is raised here, never from
// nvcc-compiled code.
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "sparse_ffn.h"

namespace fairseq_ext {
namespace {

at::Tensor sparse_ffn_decode_cuda(const at::Tensor& x, const at::Tensor& c1, const at::Tensor& c2,
                                  const at::Tensor& cb, const at::Tensor& w1, const at::Tensor& w2,
                                  const at::Tensor& b2, int64_t block_size) {
  check_sparse_ffn_args(x, c1, c2, cb, w1, w2, b2, block_size);
  const auto dtype = x.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble || dtype == at::kHalf || dtype == at::kBFloat16,
              "sparse_ffn_decode (CUDA): float32, float64, float16 or bfloat16, got ", dtype);
  const c10::DeviceGuard guard(x.device());
  auto xc = x.contiguous(), c1c = c1.contiguous(), c2c = c2.contiguous(), cbc = cb.contiguous();
  auto w1c = w1.contiguous(), w2c = w2.contiguous(), b2c = b2.contiguous();
  const int64_t n = xc.size(0), d_ff = w1c.size(0), blocks = d_ff / block_size;
  TORCH_CHECK(n <= 65535, "sparse_ffn_decode (CUDA): at most 65535 tokens per call, got ", n);
  TORCH_CHECK(blocks <= INT32_MAX && block_size <= INT32_MAX, "sparse_ffn_decode (CUDA): d_ff too large");
  auto y = at::empty_like(xc);
  if (n == 0) return y;
  auto z = at::empty({n, c1c.size(0)}, xc.options());
  auto rows = at::empty({n, blocks}, xc.options().dtype(at::kLong));
  auto h = at::empty({n, blocks}, xc.options().dtype(dtype == at::kDouble ? at::kDouble : at::kFloat));
  const char* err = sparse_ffn_decode_cuda_launch(xc, c1c, c2c, cbc, w1c, w2c, b2c, z, rows, h, y, block_size);
  TORCH_CHECK(err == nullptr, "sparse_ffn_decode (CUDA): kernel launch failed: ", err);
  return y;
}

}  // namespace
}  // namespace fairseq_ext

TORCH_LIBRARY_IMPL(fairseq_ext, CUDA, m) {
  m.impl("sparse_ffn_decode", &fairseq_ext::sparse_ffn_decode_cuda);
}
