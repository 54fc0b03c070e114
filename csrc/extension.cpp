// fairseq_ext._C: the library namespace of all fairseq_ext kernels.
// Each op lives in its own file trio (schema + checks here in csrc/, CPU kernel in csrc/cpu/,
// CUDA kernel in csrc/cuda/) and adds itself with TORCH_LIBRARY_FRAGMENT(fairseq_ext, m).
// The Python side loads this module from fairseq_ext/ops/__init__.py and falls back to the PyTorch
// references when it is absent.
#include <torch/extension.h>

#include "few_rows_linear.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace fairseq_ext {

// What this binary was built with; the benchmarks record it beside their figures.
static std::string build_info() {
  std::string s = "torch " TORCH_VERSION;
#ifdef _OPENMP
  s += ", openmp " + std::to_string(_OPENMP);
#else
  s += ", no openmp";
#endif
#ifdef FAIRSEQ_EXT_WITH_CUDA
  s += ", cuda";
#else
  s += ", cpu only";
#endif
#if defined(__AVX2__)
  s += ", avx2 at compile time";
#endif
  return s;
}

}  // namespace fairseq_ext

TORCH_LIBRARY(fairseq_ext, m) {
  // ops register into this namespace from their own files (TORCH_LIBRARY_FRAGMENT)
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("build_info", &fairseq_ext::build_info, "How fairseq_ext._C was compiled");
  m.def("few_rows_bf16_dot", &fairseq_ext::few_rows_bf16_dot,
        "Whether few_rows_linear computes bf16-weight products in bf16 (AVX512_BF16, FAIRSEQ_EXT_BF16_PRODUCTS=1)");
}
