// hashed_dropout: shared declarations of the schema file (csrc/dropout.cpp) and its CPU kernel (csrc/cpu/dropout.cpp).
#pragma once
#include <ATen/core/Tensor.h>
#include <cstdint>

namespace fairseq_ext {

void check_hashed_dropout_args(const at::Tensor& x, double p);

// The keep decision of element i (counter-based: a hash of the seed and i, no generator state).
// Two rounds of MurmurHash3's 32-bit finaliser, the seed's low half mixed in before the first and its
// high half before the second; the top 24 bits are compared with round(p·2^24). The PyTorch reference
// (fairseq_ext/ops/dropout.py) computes the same bits.
inline uint32_t dropout_fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  h ^= h >> 16;
  return h;
}
inline uint32_t dropout_hash(uint64_t seed, uint32_t i) {
  return dropout_fmix32(dropout_fmix32(i ^ static_cast<uint32_t>(seed)) ^ static_cast<uint32_t>(seed >> 32));
}
inline uint32_t dropout_threshold(double p) { return static_cast<uint32_t>(p * 16777216.0 + 0.5); }

}  // namespace fairseq_ext
