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

// The block's largest |x| as bf16 bits: for non-negative floats the integer
// order is the float order, so two halves at a time cost one integer max,
// and a NaN or infinity (exponent all ones, 0x7F80 and up) stays visible.
constexpr uint32_t kBf16AbsMask2 = 0x7FFF7FFFu;
constexpr uint32_t kBf16Inf = 0x7F80u;

__device__ __forceinline__ uint32_t WarpMax(uint32_t v) {
#if __CUDA_ARCH__ >= 800
  return __reduce_max_sync(0xffffffffu, v);
#else
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
#endif
}

__device__ __forceinline__ uint32_t BlockMaxBits(uint32_t pair_max, uint32_t* shared) {
  uint32_t v = WarpMax(max(pair_max & 0xFFFFu, pair_max >> 16));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  return WarpMax(lane < kThreads / 32 ? shared[lane] : 0u);
}

// The block's scale (1 for an all-zero block), its code in `scale_inv`, and
// the non-finite flag: such a block is quantized to garbage and the caller
// must not send it.
__device__ __forceinline__ float BlockScale(uint32_t amax_bits, float* scale_out, int* nonfinite) {
  if (amax_bits >= kBf16Inf && nonfinite != nullptr && threadIdx.x == 0) atomicOr(nonfinite, 1);
  const float a = Bf16(amax_bits);
  const float s = a == 0.0f ? 1.0f : __fdiv_rn(a, 448.0f);
  if (threadIdx.x == 0) *scale_out = s;
  return s;
}

// v / s rounded to nearest, as IEEE division. One division per element
// makes the kernel compute bound (about 0.78 of a copy on an H200), so where
// the block's scale allows it the reciprocal is taken once per block and each
// quotient is q0 = v * (1/s) with one FMA correction, which is the correctly
// rounded quotient whenever the remainder v - q0 * s is exact (checked for
// every bf16 significand against every fp32 significand of s: identical).
// The remainder stays a normal number, hence exact, for s in [2^-88, 2^100]
// and any quotient that fp8 can tell from zero; outside that range (a block
// of near-zero or near-overflow values) the block divides. The choice is made
// once per block (a template argument), not per element.
struct Divider {
  float s, r;
  __device__ __forceinline__ static bool Hoistable(float s) { return s >= 0x1p-88f && s <= 0x1p100f; }
  template <bool kHoisted>
  __device__ __forceinline__ float Quotient(float v) const {
    if (!kHoisted) return __fdiv_rn(v, s);
    const float q0 = __fmul_rn(v, r);
    const float q1 = __fmaf_rn(__fmaf_rn(-s, q0, v), r, q0);
    return copysignf(q1, v);  // -0 / s is -0; the correction would make it +0
  }
};

__device__ __forceinline__ Divider MakeDivider(float s) { return {s, __frcp_rn(s)}; }

__device__ __forceinline__ uint8_t E4M3(float q) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(q, __NV_SATFINITE, __NV_E4M3));
}

// Two codes from one conversion instruction: lo in the low byte.
__device__ __forceinline__ uint32_t E4M3x2(float lo, float hi) {
  return __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3);
}

// This thread's share of a tile: kPasses 16-byte vectors, rows
// r0 + p * kRowsPerPass + row_in_pass, columns [c, c + 8). All of them are
// loaded before the first is used, as streaming loads (each byte of x is
// read once), and the codes go out as streaming stores. Measured on an H200
// against a device-to-device copy (tests/pipeline/gpu/fp8_bench.cu): 0.75
// before (loads as __ldg, plain stores, the divide-or-not choice per
// element), 0.946 now, each timed in its own steady state (0.953 on
// [28672, 4096], 0.916 on [4096, 14336]). A one-file experiment timed this
// same kernel at 1.006 after other quantize kernels and at 0.951 straight
// after a copy, in one process; what the preceding work changes is not
// known yet.
__device__ __forceinline__ void LoadShare(const uint16_t* __restrict__ xm, int64_t rows, int64_t cols, int64_t r0,
                                          int64_t c, int row_in_pass, uint4 (&v)[kPasses]) {
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    const int64_t r = r0 + p * kRowsPerPass + row_in_pass;
    v[p] = c < cols && r < rows ? __ldcs(reinterpret_cast<const uint4*>(xm + r * cols + c)) : make_uint4(0, 0, 0, 0);
  }
}

template <bool kHoisted>
__device__ __forceinline__ void StoreCodes(const uint4 (&v)[kPasses], const Divider& div, int64_t rows, int64_t cols,
                                           int64_t r0, int64_t c, int row_in_pass, uint8_t* __restrict__ qm) {
  if (c >= cols) return;  // cols % 8 == 0: a vector is all in or all out
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    const int64_t r = r0 + p * kRowsPerPass + row_in_pass;
    if (r >= rows) continue;
    const uint32_t w[4] = {v[p].x, v[p].y, v[p].z, v[p].w};
    uint32_t out[2] = {0, 0};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      out[k / 2] |= E4M3x2(div.Quotient<kHoisted>(Bf16(w[k] & 0xFFFFu)), div.Quotient<kHoisted>(Bf16(w[k] >> 16)))
                    << (16 * (k % 2));
    }
    __stcs(reinterpret_cast<uint2*>(qm + r * cols + c), make_uint2(out[0], out[1]));
  }
}

// One thread block per 128x128 tile; blockIdx.z is the matrix (expert).
// Vector path: cols % 8 == 0 (16-byte rows), any rows; tiles may be partial.
// kWaitPrior: launched as a programmatic dependent of the stream's previous
// kernel, whose end it waits for here, before its first load: its CTAs are
// then on the SMs as the previous grid drains, instead of after it.
template <bool kWaitPrior>
__global__ void __launch_bounds__(kThreads) QuantizeVec(const uint16_t* __restrict__ x, int64_t rows, int64_t cols,
                                                        uint8_t* __restrict__ q, float* __restrict__ scale_inv,
                                                        int* nonfinite) {
#if __CUDA_ARCH__ >= 900
  if (kWaitPrior) asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  __shared__ uint32_t warp_max[kThreads / 32];
  const int64_t m = blockIdx.z;
  const int64_t r0 = int64_t(blockIdx.y) * kBlock;
  const int64_t c = int64_t(blockIdx.x) * kBlock + (threadIdx.x % kLanesPerRow) * kVec;
  const int row_in_pass = threadIdx.x / kLanesPerRow;
  uint4 v[kPasses];
  LoadShare(x + m * rows * cols, rows, cols, r0, c, row_in_pass, v);
  uint32_t amax2 = 0;  // two halves
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    amax2 = __vmaxu2(amax2, __vmaxu2(__vmaxu2(v[p].x & kBf16AbsMask2, v[p].y & kBf16AbsMask2),
                                     __vmaxu2(v[p].z & kBf16AbsMask2, v[p].w & kBf16AbsMask2)));
  }
  const float s = BlockScale(BlockMaxBits(amax2, warp_max),
                             &scale_inv[(m * gridDim.y + blockIdx.y) * int64_t(gridDim.x) + blockIdx.x], nonfinite);
  const Divider div = MakeDivider(s);
  uint8_t* qm = q + m * rows * cols;
  if (Divider::Hoistable(s)) {
    StoreCodes<true>(v, div, rows, cols, r0, c, row_in_pass, qm);
  } else {
    StoreCodes<false>(v, div, rows, cols, r0, c, row_in_pass, qm);
  }
}

// Any shape: one element at a time (columns not a multiple of 8).
__global__ void __launch_bounds__(kThreads) QuantizeScalar(const uint16_t* __restrict__ x, int64_t rows, int64_t cols,
                                                           uint8_t* __restrict__ q, float* __restrict__ scale_inv,
                                                           int* nonfinite) {
  __shared__ uint32_t warp_max[kThreads / 32];
  const int64_t m = blockIdx.z;
  const uint16_t* xm = x + m * rows * cols;
  uint8_t* qm = q + m * rows * cols;
  const int64_t r0 = int64_t(blockIdx.y) * kBlock, c0 = int64_t(blockIdx.x) * kBlock;
  uint32_t amax = 0;
  for (int i = threadIdx.x; i < kBlock * kBlock; i += kThreads) {
    const int64_t r = r0 + i / kBlock, c = c0 + i % kBlock;
    if (r < rows && c < cols) amax = max(amax, uint32_t(xm[r * cols + c] & 0x7FFFu));
  }
  const float s = BlockScale(BlockMaxBits(amax, warp_max),
                             &scale_inv[(m * gridDim.y + blockIdx.y) * int64_t(gridDim.x) + blockIdx.x], nonfinite);
  const Divider div = MakeDivider(s);
  const bool hoisted = Divider::Hoistable(s);
  for (int i = threadIdx.x; i < kBlock * kBlock; i += kThreads) {
    const int64_t r = r0 + i / kBlock, c = c0 + i % kBlock;
    if (r < rows && c < cols) {
      const float v = Bf16(xm[r * cols + c]);
      qm[r * cols + c] = E4M3(hoisted ? div.Quotient<true>(v) : div.Quotient<false>(v));
    }
  }
}

}  // namespace

cudaError_t QuantizeFp8BlocksCuda(const uint16_t* x, int64_t batch, int64_t rows, int64_t cols, uint8_t* q,
                                  float* scale_inv, cudaStream_t stream, int* nonfinite, Fp8Launch launch) {
  if (batch <= 0 || rows <= 0 || cols <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((cols + kBlock - 1) / kBlock),
                  static_cast<unsigned>((rows + kBlock - 1) / kBlock), static_cast<unsigned>(batch));
  const bool aligned = cols % kVec == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(q) % 8 == 0;
  if (!aligned) {
    QuantizeScalar<<<grid, kThreads, 0, stream>>>(x, rows, cols, q, scale_inv, nonfinite);
    return cudaGetLastError();
  }
  if (launch == Fp8Launch::kAuto) launch = Fp8Launch::kOverlapped;
  if (launch == Fp8Launch::kPlain) {
    QuantizeVec<false><<<grid, kThreads, 0, stream>>>(x, rows, cols, q, scale_inv, nonfinite);
    return cudaGetLastError();
  }
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(kThreads);
  config.stream = stream;
  config.attrs = &attr;
  config.numAttrs = 1;
  const cudaError_t e = cudaLaunchKernelEx(&config, QuantizeVec<true>, x, rows, cols, q, scale_inv, nonfinite);
  if (e != cudaSuccess) return e;
  return cudaGetLastError();
}

}  // namespace wsync
