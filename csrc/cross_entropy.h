// label_smoothed_ce: shared declarations of the schema file (csrc/cross_entropy.cpp) and its CPU kernel
// (csrc/cpu/cross_entropy.cpp).
#pragma once
#include <ATen/core/Tensor.h>

namespace fairseq_ext {

// Shapes, dtypes and devices of the forward's arguments; throws naming the argument.
void check_label_smoothed_ce_args(const at::Tensor& logits, const at::Tensor& target);

}  // namespace fairseq_ext
