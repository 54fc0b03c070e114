// Warp-level helpers of the CUDA kernels (the CUDA side's csrc/cpu/vec.h). Fixed reduction order, so
// results are deterministic.
#pragma once
#include <cstdint>

namespace fairseq_ext {
namespace {  // one copy per kernel file

constexpr int kWarp = 32;

// Sum of v over the 32 lanes of a full warp (xor butterfly: every lane gets the sum).
template <typename acc_t>
__device__ __forceinline__ acc_t warp_sum(acc_t v) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// a·b over `len` elements by a full warp: lane-strided partial sums (coalesced reads), then warp_sum.
template <typename scalar_t, typename acc_t>
__device__ __forceinline__ acc_t warp_dot(const scalar_t* __restrict__ a, const scalar_t* __restrict__ b,
                                          int64_t len, int lane) {
  acc_t s = 0;
  for (int64_t i = lane; i < len; i += kWarp) s += static_cast<acc_t>(a[i]) * static_cast<acc_t>(b[i]);
  return warp_sum(s);
}

}  // namespace
}  // namespace fairseq_ext
