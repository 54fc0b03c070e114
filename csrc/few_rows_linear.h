// few_rows_linear: shared declarations of the schema file (csrc/few_rows_linear.cpp) and its CPU kernel
// (csrc/cpu/few_rows_linear.cpp). CPU only: on a GPU cuBLAS serves few-row products well.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

namespace fairseq_ext {

// Shapes, dtypes and devices of few_rows_linear's arguments; throws naming the argument.
void check_few_rows_linear_args(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias);

// few_rows_linear_packed's: packed is 1-D with out_features x in_features values, panel >= 1, and the
// rest as few_rows_linear's with packed viewed as (out_features, in_features).
void check_few_rows_linear_packed_args(const at::Tensor& x, const at::Tensor& packed,
                                       const std::optional<at::Tensor>& bias, int64_t out_features, int64_t panel);

// Whether the CPU kernel computes bf16-weight products in bf16 (x rounded to bf16, float32 sums): AVX512_BF16,
// FAIRSEQ_EXT_BF16_PRODUCTS=1 and not FAIRSEQ_EXT_CPU_ISA=portable; else x stays float32 and W is widened.
bool few_rows_bf16_dot();

// The CPU kernel (float32 / float64), also called by other CPU kernels for their last product at the row
// counts it serves (fairseq_ext/ops/few_rows_linear.py: MIN_ROWS..MAX_ROWS).
at::Tensor few_rows_linear_cpu(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias);
constexpr int64_t kFewRowsMin = 3, kFewRowsMax = 16;

}  // namespace fairseq_ext
