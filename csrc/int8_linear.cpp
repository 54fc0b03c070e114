// int8_linear: y ≈ x·Wᵀ + b with W stored as int8 (one scale per output row) and x quantized per row on the
// fly, the sums exact in int32: the --int8 decoding path's linear layer. Schema and argument checks; the
// kernel is csrc/cpu/int8_linear.cpp. PyTorch reference (the spec): fairseq_ext/ops/int8_linear.py.
//
//   s_x[m] = max_k |x[m, k]| / 127          q[m, k] = round_half_even(x[m, k] · (127 / max_k |x[m, k]|))
//   acc[m, j] = Σ_k q[m, k] · W_q[j, k]    (exact, int32)
//   y[m, j] = float(acc[m, j]) · (s_x[m] · s_w[j]) + b[j]     (float32, in this order)
//
// x: (M, K) float32; weight: W_q int8 (symmetric, |W_q| ≤ 127) packed in tiles of 16 outputs × 4 inputs,
// shape (⌈N/16⌉, ⌈K/4⌉, 16, 4), weight[t, kq, c, i] = W_q[16t + c, 4kq + i], zero outside W_q (pack_weight in
// the Python entry point); weight_scale: (N) float32; weight_sum: (N) int32, Σ_k W_q[j, k] (the kernels add 128
// to q to use unsigned × signed byte products, and take 128 · weight_sum off again); bias: (N) float32 or none.
// A row of x that is all zero gives y = b; one with a NaN or an infinity gives NaN.
// Tiles: one 64-byte load holds 4 inputs of 16 outputs, so each vector lane sums one output (no horizontal
// sums), and each tile is one contiguous stream.
//
// Why: a decoding step reads every weight once per token; int8 weights are a quarter of float32's bytes.
// The sums are exact integers, so every path (AVX-512 VNNI, portable loop, reference) gives the same y bit for bit.
#include <torch/extension.h>

#include "int8_linear.h"

namespace fairseq_ext {

void check_int8_linear_args(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& weight_scale,
                            const at::Tensor& weight_sum, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2, "int8_linear: x must be (rows, in_features), got ", x.sizes());
  TORCH_CHECK(x.scalar_type() == at::kFloat, "int8_linear: x must be float32, got ", x.scalar_type());
  TORCH_CHECK(weight_scale.dim() == 1 && weight_scale.scalar_type() == at::kFloat,
              "int8_linear: weight_scale must be float32 (out_features), got ", weight_scale.scalar_type(), " ",
              weight_scale.sizes());
  const int64_t n = weight_scale.size(0);
  TORCH_CHECK(weight.dim() == 4 && weight.size(0) == (n + 15) / 16 && weight.size(1) == (x.size(1) + 3) / 4 &&
                  weight.size(2) == 16 && weight.size(3) == 4,
              "int8_linear: weight must be packed in tiles, (", (n + 15) / 16, ", ", (x.size(1) + 3) / 4,
              ", 16, 4) for ", n, " outputs and ", x.size(1), " inputs (fairseq_ext.ops.int8_linear.pack_weight), got ",
              weight.sizes());
  TORCH_CHECK(weight.scalar_type() == at::kChar, "int8_linear: weight must be int8, got ", weight.scalar_type());
  TORCH_CHECK(weight_sum.dim() == 1 && weight_sum.size(0) == n && weight_sum.scalar_type() == at::kInt,
              "int8_linear: weight_sum must be int32 (", n, "), got ", weight_sum.scalar_type(), " ",
              weight_sum.sizes());
  // int32 sums: |q · W_q| ≤ 255 · 127 per product (the kernels' unsigned q + 128)
  TORCH_CHECK(x.size(1) <= (int64_t{1} << 16), "int8_linear: at most 65,536 in_features (int32 sums), got ",
              x.size(1));
  for (const at::Tensor* t : {&weight, &weight_scale, &weight_sum})
    TORCH_CHECK(t->device() == x.device(), "int8_linear: every argument must be on x's device");
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == n && bias->scalar_type() == at::kFloat,
                "int8_linear: bias must be float32 (", n, "), got ", bias->scalar_type(), " ", bias->sizes());
    TORCH_CHECK(bias->device() == x.device(), "int8_linear: bias must be on x's device");
  }
}

}  // namespace fairseq_ext

TORCH_LIBRARY_FRAGMENT(fairseq_ext, m) {
  m.def("int8_linear(Tensor x, Tensor weight, Tensor weight_scale, Tensor weight_sum, Tensor? bias) -> Tensor");
}
