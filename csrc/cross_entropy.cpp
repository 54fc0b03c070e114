// label_smoothed_ce_fwd / _bwd: fairseq's label-smoothed cross-entropy (criterion
// label_smoothed_cross_entropy) straight from the logits, one pass over each row, so a training step never
// materialises the (rows, vocabulary) float32 log-probabilities. Schema and argument checks; the kernel is
// csrc/cpu/cross_entropy.cpp. PyTorch reference: fairseq_ext/ops/cross_entropy.py.
//
//   lse_i  = log Σ_j exp(x_ij)                     x: (N, V) logits, t: (N) targets
//   nll_i  = lse_i − x_i,t_i                       rows whose target is ignore_index give 0
//   loss_i = (1 − ε − ε')·nll_i + ε'·(V·lse_i − Σ_j x_ij),   ε' = ε / (V − 1)
//   forward returns (N, 3) float32 [loss_i, nll_i, lse_i]
//   backward: dx_ij = s_i · (exp(x_ij − lse_i) − ε' − (1 − ε − ε')·[j = t_i]),  s: (N) row scales
#include <torch/extension.h>

#include "cross_entropy.h"

namespace fairseq_ext {

void check_label_smoothed_ce_args(const at::Tensor& logits, const at::Tensor& target) {
  TORCH_CHECK(logits.dim() == 2 && logits.size(1) >= 2, "label_smoothed_ce: logits must be (rows, vocabulary >= 2), got ",
              logits.sizes());
  TORCH_CHECK(target.dim() == 1 && target.size(0) == logits.size(0), "label_smoothed_ce: target must be (",
              logits.size(0), "), got ", target.sizes());
  TORCH_CHECK(target.scalar_type() == at::kLong, "label_smoothed_ce: target must be int64, got ", target.scalar_type());
  TORCH_CHECK(target.device() == logits.device(), "label_smoothed_ce: target must be on the logits' device");
}

}  // namespace fairseq_ext

TORCH_LIBRARY_FRAGMENT(fairseq_ext, m) {
  m.def("label_smoothed_ce_fwd(Tensor logits, Tensor target, float epsilon, int ignore_index) -> Tensor");
  m.def("label_smoothed_ce_bwd(Tensor logits, Tensor target, Tensor lse, Tensor row_scale, float epsilon, "
        "int ignore_index) -> Tensor");
}
