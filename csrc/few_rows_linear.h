// few_rows_linear: shared declarations of the schema file (csrc/few_rows_linear.cpp) and its CPU kernel
// (csrc/cpu/few_rows_linear.cpp). CPU only: on a GPU cuBLAS serves few-row products well.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

namespace fairseq_ext {

// Shapes, dtypes and devices of few_rows_linear's arguments; throws naming the argument.
void check_few_rows_linear_args(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias);

}  // namespace fairseq_ext
