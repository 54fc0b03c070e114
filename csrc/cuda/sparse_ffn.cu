// CUDA kernel of sparse_ffn_decode (schema and maths: csrc/sparse_ffn.cpp; CPU twin: csrc/cpu/sparse_ffn.cpp).
//
// Three launches, no cuBLAS and no (n, d_ff) logits tensor: a decoding step on a GPU is bound by launch
// and dispatch overhead long before bandwidth, so the controller is fused into the choice.
//   controller_lowrank  z = x·C1ᵀ (n, d_lowrank), one warp per output, rounded to the input dtype as
//                       the reference's F.linear rounds it.
//   choose_and_hidden   one thread block per (token, block of N units): one thread per unit computes its
//                       logit z_t·C2[j] + c[j] (rounded to the input dtype, as the reference's), a tree
//                       takes the argmax (first maximum, NaN wins, as torch.argmax), then h =
//                       ReLU(x_t · W1[row]) as a block-wide dot product over d_model: the only W1 row
//                       this (token, block) reads.
//   gather_output       one thread block per (token, 32 output columns); its 8 warps split the blocks of
//                       units (warp g takes b = g, g+8, ...) and each lane owns one column, so every warp
//                       reads 128 contiguous bytes of a chosen W2 row at a time (coalesced); the 8 partial
//                       sums are added in shared memory in a fixed order.
// Accumulation in float for half/bfloat16 (at::opmath_type), in the input type otherwise; the summation
// order differs from cuBLAS, so a logit tie within rounding error may choose differently from the
// reference (the tests compare against float64). No atomics: repeated runs are bit-identical.
// This file only launches: argument checks and allocation are host C++ in csrc/cuda/sparse_ffn_host.cpp,
// so no exception ever unwinds through nvcc-compiled frames (the launcher returns CUDA's error text).
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAStream.h>

#include "cuda/warp.cuh"
#include "sparse_ffn.h"

namespace fairseq_ext {
namespace {

constexpr int kLowrankWarps = 8;  // warps per thread block of controller_lowrank
constexpr int kChooseThreads = 128;
constexpr int kColumns = 32;      // output columns per thread block of gather_output (one per lane)
constexpr int kGroups = 8;        // warps per thread block of gather_output

// a is better than b: NaN beats numbers, then the larger value, then the smaller index (first maximum).
template <typename acc_t>
__device__ __forceinline__ bool better(acc_t a, int ia, acc_t b, int ib) {
  const bool na = isnan(a), nb = isnan(b);
  if (na || nb) return na && (!nb || ia < ib);
  return a > b || (a == b && ia < ib);
}

template <typename scalar_t, typename acc_t>
__global__ void controller_lowrank(const scalar_t* __restrict__ x, const scalar_t* __restrict__ c1,
                                   scalar_t* __restrict__ z, int64_t d, int64_t lowrank) {
  const int lane = threadIdx.x % kWarp;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kLowrankWarps + threadIdx.x / kWarp, t = blockIdx.y;
  if (r >= lowrank) return;  // whole warps leave together
  const acc_t v = warp_dot<scalar_t, acc_t>(x + t * d, c1 + r * d, d, lane);
  if (lane == 0) z[t * lowrank + r] = static_cast<scalar_t>(v);
}

template <typename scalar_t, typename acc_t>
__global__ void choose_and_hidden(const scalar_t* __restrict__ x, const scalar_t* __restrict__ z,
                                  const scalar_t* __restrict__ c2, const scalar_t* __restrict__ cb,
                                  const scalar_t* __restrict__ w1, int64_t* __restrict__ rows,
                                  acc_t* __restrict__ h, int64_t d, int64_t lowrank, int block) {
  const int b = blockIdx.x, blocks = gridDim.x;
  const int64_t t = blockIdx.y;
  __shared__ acc_t best_v[kChooseThreads];
  __shared__ int best_i[kChooseThreads];
  __shared__ acc_t part[kChooseThreads];

  // the controller's logits z_t·C2[j] + c[j] of this block's N units, one unit per thread (z_t is read
  // by all threads at once: a broadcast), then the argmax: strided local best, then a tree
  const scalar_t* zt = z + t * lowrank;
  acc_t bv = 0;
  int bi = -1;
  for (int j = threadIdx.x; j < block; j += blockDim.x) {
    const int64_t unit = static_cast<int64_t>(b) * block + j;
    const scalar_t* c = c2 + unit * lowrank;
    acc_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    int64_t r = 0;
    for (; r + 4 <= lowrank; r += 4) {
      a0 += static_cast<acc_t>(zt[r]) * static_cast<acc_t>(c[r]);
      a1 += static_cast<acc_t>(zt[r + 1]) * static_cast<acc_t>(c[r + 1]);
      a2 += static_cast<acc_t>(zt[r + 2]) * static_cast<acc_t>(c[r + 2]);
      a3 += static_cast<acc_t>(zt[r + 3]) * static_cast<acc_t>(c[r + 3]);
    }
    for (; r < lowrank; ++r) a0 += static_cast<acc_t>(zt[r]) * static_cast<acc_t>(c[r]);
    const acc_t v = static_cast<acc_t>(static_cast<scalar_t>((a0 + a1) + (a2 + a3) + static_cast<acc_t>(cb[unit])));
    if (bi < 0 || better(v, j, bv, bi)) { bv = v; bi = j; }
  }
  best_v[threadIdx.x] = bv;
  best_i[threadIdx.x] = bi;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      const int oi = best_i[threadIdx.x + s];
      if (oi >= 0 && (best_i[threadIdx.x] < 0 || better(best_v[threadIdx.x + s], oi, best_v[threadIdx.x], best_i[threadIdx.x]))) {
        best_v[threadIdx.x] = best_v[threadIdx.x + s];
        best_i[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
  const int64_t row = static_cast<int64_t>(b) * block + best_i[0];

  // h = ReLU(x_t · W1[row]): the only W1 row this (token, block) reads
  const scalar_t* xr = x + t * d;
  const scalar_t* wr = w1 + row * d;
  acc_t s = 0;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) s += static_cast<acc_t>(xr[i]) * static_cast<acc_t>(wr[i]);
  part[threadIdx.x] = s;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k >>= 1) {
    if (threadIdx.x < k) part[threadIdx.x] += part[threadIdx.x + k];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    rows[t * blocks + b] = row;
    h[t * blocks + b] = part[0] > acc_t(0) ? part[0] : acc_t(0);
  }
}

template <typename scalar_t, typename acc_t>
__global__ void gather_output(const int64_t* __restrict__ rows, const acc_t* __restrict__ h,
                              const scalar_t* __restrict__ w2, const scalar_t* __restrict__ b2,
                              scalar_t* __restrict__ y, int64_t d, int blocks) {
  const int lane = threadIdx.x, g = threadIdx.y;
  const int64_t t = blockIdx.y;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kColumns + lane;
  __shared__ acc_t part[kGroups][kColumns];
  acc_t s = 0;
  if (col < d) {
    for (int b = g; b < blocks; b += kGroups) {
      const acc_t hv = h[t * blocks + b];
      if (hv != acc_t(0)) s += hv * static_cast<acc_t>(w2[rows[t * blocks + b] * d + col]);
    }
  }
  part[g][lane] = s;
  __syncthreads();
  if (g == 0 && col < d) {
    acc_t out = static_cast<acc_t>(b2[col]);
    for (int k = 0; k < kGroups; ++k) out += part[k][lane];
    y[t * d + col] = static_cast<scalar_t>(out);
  }
}

template <typename scalar_t>
void launch(const at::Tensor& x, const at::Tensor& c1, const at::Tensor& c2, const at::Tensor& cb,
            const at::Tensor& w1, const at::Tensor& w2, const at::Tensor& b2, at::Tensor& z, at::Tensor& rows,
            at::Tensor& h, at::Tensor& y, int64_t block_size, cudaStream_t stream) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t n = x.size(0), d = x.size(1), d_ff = w1.size(0), lowrank = c1.size(0);
  const int blocks = static_cast<int>(d_ff / block_size);
  controller_lowrank<scalar_t, acc_t><<<dim3((lowrank + kLowrankWarps - 1) / kLowrankWarps, n),
                                        kLowrankWarps * kWarp, 0, stream>>>(
      x.data_ptr<scalar_t>(), c1.data_ptr<scalar_t>(), z.data_ptr<scalar_t>(), d, lowrank);
  choose_and_hidden<scalar_t, acc_t><<<dim3(blocks, n), kChooseThreads, 0, stream>>>(
      x.data_ptr<scalar_t>(), z.data_ptr<scalar_t>(), c2.data_ptr<scalar_t>(), cb.data_ptr<scalar_t>(),
      w1.data_ptr<scalar_t>(), rows.data_ptr<int64_t>(), h.data_ptr<acc_t>(), d, lowrank,
      static_cast<int>(block_size));
  gather_output<scalar_t, acc_t><<<dim3((d + kColumns - 1) / kColumns, n), dim3(kColumns, kGroups), 0, stream>>>(
      rows.data_ptr<int64_t>(), h.data_ptr<acc_t>(), w2.data_ptr<scalar_t>(), b2.data_ptr<scalar_t>(),
      y.data_ptr<scalar_t>(), d, blocks);
}

}  // namespace

const char* sparse_ffn_decode_cuda_launch(const at::Tensor& x, const at::Tensor& c1, const at::Tensor& c2,
                                          const at::Tensor& cb, const at::Tensor& w1, const at::Tensor& w2,
                                          const at::Tensor& b2, at::Tensor& z, at::Tensor& rows, at::Tensor& h,
                                          at::Tensor& y, int64_t block_size) {
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.get_device());
  switch (x.scalar_type()) {
    case at::kFloat: launch<float>(x, c1, c2, cb, w1, w2, b2, z, rows, h, y, block_size, stream); break;
    case at::kDouble: launch<double>(x, c1, c2, cb, w1, w2, b2, z, rows, h, y, block_size, stream); break;
    case at::kHalf: launch<at::Half>(x, c1, c2, cb, w1, w2, b2, z, rows, h, y, block_size, stream); break;
    case at::kBFloat16: launch<at::BFloat16>(x, c1, c2, cb, w1, w2, b2, z, rows, h, y, block_size, stream); break;
    default: return "sparse_ffn_decode (CUDA): unsupported dtype";
  }
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

}  // namespace fairseq_ext
