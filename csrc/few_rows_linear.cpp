// few_rows_linear: y = x·Wᵀ + b (torch.nn.functional.linear) for a few rows of x, as in a decoding step
// (batch × beam rows), reading W once for all rows. Schema and argument checks; the kernel is
// csrc/cpu/few_rows_linear.cpp. PyTorch reference: fairseq_ext/ops/few_rows_linear.py (F.linear).
//
//   y[m, j] = b[j] + Σ_k x[m, k] · W[j, k]      x: (M, K), W: (N, K), b: (N) or none -> y: (M, N)
//
// W has x's dtype, or is bfloat16 with float32 x and b (weights stored in bf16: y as F.linear(x, W.float(), b)).
//
// few_rows_linear_packed: the same product with W in the panel layout of fairseq_ext/ops/few_rows_linear.py
// (pack_panels: rows in panels of `panel`, each panel's 16-column blocks row after row), which the kernel
// reads as one contiguous stream; the same sums in the same order as few_rows_linear.
//
// Why: at 2-16 rows a BLAS GEMM packs W on every call (it is written for many rows), which reads and
// writes the weight twice; a matrix-vector product streams it once. This kernel streams W once for up
// to 8 rows at a time (issue 9: the linear layers are most of a CPU decoding step).
#include <torch/extension.h>

#include "few_rows_linear.h"

namespace fairseq_ext {

void check_few_rows_linear_args(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2, "few_rows_linear: x must be (rows, in_features), got ", x.sizes());
  TORCH_CHECK(weight.dim() == 2 && weight.size(1) == x.size(1),
              "few_rows_linear: weight must be (out_features, ", x.size(1), "), got ", weight.sizes());
  TORCH_CHECK(weight.scalar_type() == x.scalar_type() ||
                  (weight.scalar_type() == at::kBFloat16 && x.scalar_type() == at::kFloat),
              "few_rows_linear: weight must have x's dtype ", x.scalar_type(),
              " (or be bfloat16 with float32 x), got ", weight.scalar_type());
  TORCH_CHECK(weight.device() == x.device(), "few_rows_linear: weight must be on x's device");
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == weight.size(0), "few_rows_linear: bias must be (",
                weight.size(0), "), got ", bias->sizes());
    TORCH_CHECK(bias->scalar_type() == x.scalar_type(), "few_rows_linear: bias must have x's dtype");
    TORCH_CHECK(bias->device() == x.device(), "few_rows_linear: bias must be on x's device");
  }
}

void check_few_rows_linear_packed_args(const at::Tensor& x, const at::Tensor& packed,
                                       const std::optional<at::Tensor>& bias, int64_t out_features, int64_t panel) {
  TORCH_CHECK(x.dim() == 2, "few_rows_linear_packed: x must be (rows, in_features), got ", x.sizes());
  TORCH_CHECK(out_features >= 0 && panel >= 1, "few_rows_linear_packed: out_features >= 0 and panel >= 1, got ",
              out_features, " and ", panel);
  TORCH_CHECK(packed.dim() == 1 && packed.numel() == out_features * x.size(1),
              "few_rows_linear_packed: packed must be the 1-D panels of an (", out_features, ", ", x.size(1),
              ") weight (ops.few_rows_linear.pack_panels), got ", packed.sizes());
  check_few_rows_linear_args(x, packed.view({out_features, x.size(1)}), bias);
}

}  // namespace fairseq_ext

TORCH_LIBRARY_FRAGMENT(fairseq_ext, m) {
  m.def("few_rows_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
  m.def("few_rows_linear_packed(Tensor x, Tensor packed, Tensor? bias, int out_features, int panel) -> Tensor");
}
