// CUDA kernel of compressed_attention_decode (schema and maths: csrc/compressed_attention.cpp; CPU twin:
// csrc/cpu/compressed_attention.cpp). One thread block per (batch, head):
//   scores  each warp takes keys j = warp, warp + warps, ... (encoder keys first, then the valid cached
//           decoder keys; never a concatenated copy): a lane-strided dot with q and a shuffle reduction;
//           padded encoder positions (bias -inf) are not read. Scores sit in shared memory.
//   softmax one max and one sum over all keys (Eq. 11), tree reductions in a fixed order.
//   values  thread i accumulates output dims i, i + threads, ... over the keys, so a warp reads 32
//           consecutive values of a row at a time (coalesced); then ReLU(xw1 + ctx) (Eq. 13).
// W2 (the FFN's second layer) is a cuBLAS GEMM on the host side. Accumulation in float for half/bfloat16,
// in the input type otherwise; no atomics, so repeated runs are bit-identical. This file only launches
// and throws nothing (csrc/cuda/compressed_attention_host.cpp checks, allocates and registers).
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAStream.h>

#include <cmath>

#include "compressed_attention.h"
#include "cuda/warp.cuh"

namespace fairseq_ext {
namespace {

constexpr int kThreads = 128;

template <typename scalar_t, typename acc_t>
__global__ void attend(const scalar_t* __restrict__ q, const scalar_t* __restrict__ k_enc,
                       const scalar_t* __restrict__ v_enc, const scalar_t* __restrict__ bias,
                       const scalar_t* __restrict__ k_self, const scalar_t* __restrict__ v_self,
                       const scalar_t* __restrict__ xw1, scalar_t* __restrict__ hidden, int heads, int64_t dh,
                       int64_t dvh, int64_t src, int64_t cap, int64_t self_len) {
  extern __shared__ unsigned char smem_raw[];
  acc_t* p = reinterpret_cast<acc_t*>(smem_raw);  // (src + self_len) scores, then probabilities
  __shared__ acc_t red[kThreads];
  const int64_t bh = blockIdx.x, b = bh / heads, h = bh % heads, keys = src + self_len;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = kThreads / kWarp;
  const acc_t neg_inf = -INFINITY;
  const scalar_t* qr = q + bh * dh;

  for (int64_t j = warp; j < keys; j += warps) {
    const bool enc = j < src;
    const acc_t bj = (enc && bias) ? static_cast<acc_t>(bias[b * src + j]) : acc_t(0);
    acc_t s = neg_inf;
    if (!(bj == neg_inf)) {  // warp-uniform: the whole warp skips a padded position
      const scalar_t* kr = enc ? k_enc + (bh * src + j) * dh : k_self + (bh * cap + (j - src)) * dh;
      s = warp_dot<scalar_t, acc_t>(qr, kr, dh, lane) + bj;
    }
    if (lane == 0) p[j] = s;
  }
  __syncthreads();

  // max, then exp and sum: strided partials, tree in a fixed order
  acc_t m = neg_inf;
  for (int64_t j = threadIdx.x; j < keys; j += kThreads) m = p[j] > m ? p[j] : m;
  red[threadIdx.x] = m;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s && red[threadIdx.x + s] > red[threadIdx.x]) red[threadIdx.x] = red[threadIdx.x + s];
    __syncthreads();
  }
  m = red[0];
  __syncthreads();
  acc_t sum = 0;
  for (int64_t j = threadIdx.x; j < keys; j += kThreads) {
    const acc_t e = p[j] == neg_inf ? acc_t(0) : exp(p[j] - m);
    p[j] = e;
    sum += e;
  }
  red[threadIdx.x] = sum;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
    __syncthreads();
  }
  const acc_t inv = acc_t(1) / red[0];

  // ctx = Σ_j p_j v_j over both value sets, then ReLU(xw1 + ctx)
  const scalar_t* ve = v_enc + bh * src * dvh;
  const scalar_t* vs = v_self + bh * cap * dvh;
  const int64_t dv = static_cast<int64_t>(heads) * dvh;
  for (int64_t i = threadIdx.x; i < dvh; i += kThreads) {
    acc_t c = 0;
    for (int64_t j = 0; j < src; ++j)
      if (p[j] != acc_t(0)) c += p[j] * static_cast<acc_t>(ve[j * dvh + i]);
    for (int64_t j = 0; j < self_len; ++j)
      if (p[src + j] != acc_t(0)) c += p[src + j] * static_cast<acc_t>(vs[j * dvh + i]);
    const acc_t v = static_cast<acc_t>(xw1[b * dv + h * dvh + i]) + c * inv;
    hidden[b * dv + h * dvh + i] = static_cast<scalar_t>(v > acc_t(0) ? v : acc_t(0));
  }
}

template <typename scalar_t>
void launch(const at::Tensor& q, const at::Tensor& k_enc, const at::Tensor& v_enc, const at::Tensor& bias,
            const at::Tensor& k_self, const at::Tensor& v_self, int64_t self_len, const at::Tensor& xw1,
            at::Tensor& hidden, cudaStream_t stream) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t batch = q.size(0), heads = q.size(1), src = k_enc.size(2);
  const size_t smem = static_cast<size_t>(src + self_len) * sizeof(acc_t);
  attend<scalar_t, acc_t><<<batch * heads, kThreads, smem, stream>>>(
      q.data_ptr<scalar_t>(), k_enc.data_ptr<scalar_t>(), v_enc.data_ptr<scalar_t>(),
      bias.defined() ? bias.data_ptr<scalar_t>() : nullptr, k_self.data_ptr<scalar_t>(), v_self.data_ptr<scalar_t>(),
      xw1.data_ptr<scalar_t>(), hidden.data_ptr<scalar_t>(), static_cast<int>(heads), q.size(2), v_enc.size(3),
      src, k_self.size(2), self_len);
}

}  // namespace

const char* compressed_attention_cuda_launch(const at::Tensor& q, const at::Tensor& k_enc, const at::Tensor& v_enc,
                                             const at::Tensor& enc_bias, const at::Tensor& k_self,
                                             const at::Tensor& v_self, int64_t self_len, const at::Tensor& xw1,
                                             at::Tensor& hidden) {
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(q.get_device());
  const int64_t acc_bytes = q.scalar_type() == at::kDouble ? 8 : 4;
  if ((k_enc.size(2) + self_len) * acc_bytes > kCompressedAttentionScoreBytesCuda)
    return "compressed_attention_decode (CUDA): too many keys for shared memory";
  switch (q.scalar_type()) {
    case at::kFloat: launch<float>(q, k_enc, v_enc, enc_bias, k_self, v_self, self_len, xw1, hidden, stream); break;
    case at::kDouble: launch<double>(q, k_enc, v_enc, enc_bias, k_self, v_self, self_len, xw1, hidden, stream); break;
    case at::kHalf: launch<at::Half>(q, k_enc, v_enc, enc_bias, k_self, v_self, self_len, xw1, hidden, stream); break;
    case at::kBFloat16:
      launch<at::BFloat16>(q, k_enc, v_enc, enc_bias, k_self, v_self, self_len, xw1, hidden, stream);
      break;
    default: return "compressed_attention_decode (CUDA): unsupported dtype";
  }
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

}  // namespace fairseq_ext
