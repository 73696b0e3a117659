#include "pipeline/fp8_cuda.h"

#include <cuda_fp8.h>

namespace wsync {
namespace {

constexpr int kBlock = 128;
constexpr int kThreads = 256;
// A tile row is 128 bf16 = 16 loads of 16 bytes; 256 threads cover 16 rows
// per pass, 8 passes per tile: every thread keeps its 64 values in registers
// between the amax and the quantize, so x is read once.
constexpr int kVec = 8;                        // bf16 per 16-byte load
constexpr int kLanesPerRow = kBlock / kVec;    // 16
constexpr int kRowsPerPass = kThreads / kLanesPerRow;  // 16
constexpr int kPasses = kBlock / kRowsPerPass;         // 8

__device__ __forceinline__ float Bf16(uint32_t bits) { return __uint_as_float(bits << 16); }

__device__ __forceinline__ float BlockMax(float v, float* shared) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < kThreads / 32 ? shared[lane] : 0.0f;
  for (int o = 4; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return __shfl_sync(0xffffffffu, v, 0);  // lanes 8..31 reduced only zeros
}

__device__ __forceinline__ uint8_t E4M3(float v, float s) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(__fdiv_rn(v, s), __NV_SATFINITE, __NV_E4M3));
}

// One thread block per 128x128 tile; blockIdx.z is the matrix (expert).
// Vector path: cols % 8 == 0 (16-byte rows), any rows; tiles may be partial.
__global__ void __launch_bounds__(kThreads) QuantizeVec(const uint16_t* __restrict__ x, int64_t rows, int64_t cols,
                                                        uint8_t* __restrict__ q, float* __restrict__ scale_inv) {
  __shared__ float warp_max[kThreads / 32];
  const int64_t grid_rows = gridDim.y, grid_cols = gridDim.x;
  const int64_t m = blockIdx.z;
  const uint16_t* xm = x + m * rows * cols;
  uint8_t* qm = q + m * rows * cols;
  const int64_t r0 = int64_t(blockIdx.y) * kBlock;
  const int64_t c = int64_t(blockIdx.x) * kBlock + (threadIdx.x % kLanesPerRow) * kVec;
  const int row_in_pass = threadIdx.x / kLanesPerRow;
  const bool col_ok = c < cols;  // cols % 8 == 0: a vector is all in or all out
  uint4 v[kPasses];
  float amax = 0.0f;
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    const int64_t r = r0 + p * kRowsPerPass + row_in_pass;
    if (col_ok && r < rows) {
      v[p] = __ldg(reinterpret_cast<const uint4*>(xm + r * cols + c));
    } else {
      v[p] = make_uint4(0, 0, 0, 0);
    }
    const uint32_t w[4] = {v[p].x, v[p].y, v[p].z, v[p].w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      amax = fmaxf(amax, fabsf(Bf16(w[k] & 0xFFFFu)));
      amax = fmaxf(amax, fabsf(Bf16(w[k] >> 16)));
    }
  }
  const float a = BlockMax(amax, warp_max);
  const float s = a == 0.0f ? 1.0f : __fdiv_rn(a, 448.0f);
  if (threadIdx.x == 0) scale_inv[(m * grid_rows + blockIdx.y) * grid_cols + blockIdx.x] = s;
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    const int64_t r = r0 + p * kRowsPerPass + row_in_pass;
    if (!col_ok || r >= rows) continue;
    const uint32_t w[4] = {v[p].x, v[p].y, v[p].z, v[p].w};
    uint32_t out[2] = {0, 0};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t lo = E4M3(Bf16(w[k] & 0xFFFFu), s), hi = E4M3(Bf16(w[k] >> 16), s);
      out[k / 2] |= (lo | (hi << 8)) << (16 * (k % 2));
    }
    *reinterpret_cast<uint2*>(qm + r * cols + c) = make_uint2(out[0], out[1]);
  }
}

// Any shape: one element at a time (columns not a multiple of 8).
__global__ void __launch_bounds__(kThreads) QuantizeScalar(const uint16_t* __restrict__ x, int64_t rows, int64_t cols,
                                                           uint8_t* __restrict__ q, float* __restrict__ scale_inv) {
  __shared__ float warp_max[kThreads / 32];
  const int64_t m = blockIdx.z;
  const uint16_t* xm = x + m * rows * cols;
  uint8_t* qm = q + m * rows * cols;
  const int64_t r0 = int64_t(blockIdx.y) * kBlock, c0 = int64_t(blockIdx.x) * kBlock;
  float amax = 0.0f;
  for (int i = threadIdx.x; i < kBlock * kBlock; i += kThreads) {
    const int64_t r = r0 + i / kBlock, c = c0 + i % kBlock;
    if (r < rows && c < cols) amax = fmaxf(amax, fabsf(Bf16(xm[r * cols + c])));
  }
  const float a = BlockMax(amax, warp_max);
  const float s = a == 0.0f ? 1.0f : __fdiv_rn(a, 448.0f);
  if (threadIdx.x == 0) scale_inv[(m * gridDim.y + blockIdx.y) * int64_t(gridDim.x) + blockIdx.x] = s;
  for (int i = threadIdx.x; i < kBlock * kBlock; i += kThreads) {
    const int64_t r = r0 + i / kBlock, c = c0 + i % kBlock;
    if (r < rows && c < cols) qm[r * cols + c] = E4M3(Bf16(xm[r * cols + c]), s);
  }
}

}  // namespace

cudaError_t QuantizeFp8BlocksCuda(const uint16_t* x, int64_t batch, int64_t rows, int64_t cols, uint8_t* q,
                                  float* scale_inv, cudaStream_t stream) {
  if (batch <= 0 || rows <= 0 || cols <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((cols + kBlock - 1) / kBlock),
                  static_cast<unsigned>((rows + kBlock - 1) / kBlock), static_cast<unsigned>(batch));
  const bool aligned = cols % kVec == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(q) % 8 == 0;
  if (aligned) {
    QuantizeVec<<<grid, kThreads, 0, stream>>>(x, rows, cols, q, scale_inv);
  } else {
    QuantizeScalar<<<grid, kThreads, 0, stream>>>(x, rows, cols, q, scale_inv);
  }
  return cudaGetLastError();
}

}  // namespace wsync
