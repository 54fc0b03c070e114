// int8_linear: shared declarations of the schema file (csrc/int8_linear.cpp) and its CPU kernel
// (csrc/cpu/int8_linear.cpp). CPU only: the --int8 decoding path is a CPU feature.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

namespace fairseq_ext {

// Shapes, dtypes and devices of int8_linear's arguments; throws naming the argument.
void check_int8_linear_args(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& weight_scale,
                            const at::Tensor& weight_sum, const std::optional<at::Tensor>& bias);

}  // namespace fairseq_ext
