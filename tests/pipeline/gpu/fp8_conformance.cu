// GPU conformance of the fp8 reference kernels (pipeline/fp8.h).
//
// The reference says the GPU quantize kernel can match it bit for bit if it
// uses CUDA's saturating e4m3 conversion, IEEE division and no subnormal
// flushing. This program checks that claim on a real GPU: every fp32 bit
// pattern through __nv_cvt_float_to_fp8(__NV_SATFINITE, __NV_E4M3) and
// __float2bfloat16_rn against Fp32ToE4M3 / Fp32ToBf16, the 256 e4m3 codes
// through the hardware decode, and a straightforward block-quantize kernel
// against QuantizeFp8Blocks. Not part of the CPU test suite (CI has no GPU);
// run it with tests/pipeline/gpu/run_fp8_conformance.sh on a CUDA machine.
// Exit status 0 means every comparison matched.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "pipeline/fp8.h"
#include "tests/pipeline/gpu/cuda_check.h"


namespace {

__global__ void EncodeRange(uint64_t base, uint64_t n, uint8_t* out) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n;
       i += uint64_t(gridDim.x) * blockDim.x) {
    const float f = __uint_as_float(static_cast<uint32_t>(base + i));
    out[i] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3));
  }
}

__global__ void Bf16Range(uint64_t base, uint64_t n, uint16_t* out) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n;
       i += uint64_t(gridDim.x) * blockDim.x) {
    const float f = __uint_as_float(static_cast<uint32_t>(base + i));
    out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(f));
  }
}

__global__ void DecodeAll(float* out) {
  const __half_raw h =
      __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(threadIdx.x), __NV_E4M3);
  out[threadIdx.x] = __half2float(__half(h));
}

// The conventions of pipeline/fp8.h written as a plain CUDA kernel: one
// thread block per 128x128 block; amax; scale_inv = amax / 448 (1 for a zero
// block); q = satfinite_e4m3(x / scale_inv) with IEEE division.
__global__ void QuantizeBlocks(const uint16_t* x, int64_t rows, int64_t cols, uint8_t* q,
                               float* scale_inv) {
  __shared__ float partial[256];
  const int64_t r0 = blockIdx.y * 128LL, c0 = blockIdx.x * 128LL;
  const int64_t r1 = r0 + 128 < rows ? r0 + 128 : rows;
  const int64_t c1 = c0 + 128 < cols ? c0 + 128 : cols;
  float amax = 0.0f;
  for (int i = threadIdx.x; i < 128 * 128; i += blockDim.x) {
    const int64_t r = r0 + i / 128, c = c0 + i % 128;
    if (r < r1 && c < c1) {
      amax = fmaxf(amax, fabsf(__uint_as_float(uint32_t(x[r * cols + c]) << 16)));
    }
  }
  partial[threadIdx.x] = amax;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] = fmaxf(partial[threadIdx.x], partial[threadIdx.x + s]);
    __syncthreads();
  }
  const float a = partial[0];
  const float s = a == 0.0f ? 1.0f : __fdiv_rn(a, 448.0f);
  if (threadIdx.x == 0) scale_inv[blockIdx.y * int64_t(gridDim.x) + blockIdx.x] = s;
  for (int i = threadIdx.x; i < 128 * 128; i += blockDim.x) {
    const int64_t r = r0 + i / 128, c = c0 + i % 128;
    if (r < r1 && c < c1) {
      const float v = __fdiv_rn(__uint_as_float(uint32_t(x[r * cols + c]) << 16), s);
      q[r * cols + c] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
    }
  }
}

bool IsNaNBits(uint32_t b) { return (b & 0x7FFFFFFFu) > 0x7F800000u; }

struct Mismatches {
  std::atomic<uint64_t> finite{0}, nan{0};
  std::atomic<uint32_t> example{0};
  std::atomic<bool> have_example{false};
};

// Compares GPU results for inputs [base, base + n) with the host function,
// split over the host's cores.
template <typename T, typename HostFn>
void CompareRange(uint64_t base, const std::vector<T>& gpu, HostFn host, Mismatches& mm) {
  const unsigned workers = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  const uint64_t n = gpu.size();
  for (unsigned w = 0; w < workers; ++w) {
    pool.emplace_back([&, w] {
      uint64_t finite = 0, nan = 0;
      for (uint64_t i = n * w / workers; i < n * (w + 1) / workers; ++i) {
        const uint32_t bits = static_cast<uint32_t>(base + i);
        float f;
        std::memcpy(&f, &bits, 4);
        if (host(f) == gpu[i]) continue;
        if (IsNaNBits(bits)) {
          ++nan;
        } else {
          ++finite;
          if (!mm.have_example.exchange(true)) mm.example = bits;
        }
      }
      mm.finite += finite;
      mm.nan += nan;
    });
  }
  for (auto& t : pool) t.join();
}

template <typename T, typename Kernel, typename HostFn>
bool SweepAllFloats(const char* what, Kernel kernel, HostFn host) {
  const uint64_t chunk = 1ull << 30;
  T* dev = nullptr;
  CUDA_OK(cudaMalloc(&dev, chunk * sizeof(T)));
  std::vector<T> got(chunk);
  Mismatches mm;
  for (uint64_t base = 0; base < (1ull << 32); base += chunk) {
    kernel<<<132 * 8, 256>>>(base, chunk, dev);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaMemcpy(got.data(), dev, chunk * sizeof(T), cudaMemcpyDeviceToHost));
    CompareRange(base, got, host, mm);
  }
  CUDA_OK(cudaFree(dev));
  std::printf("%-44s all 2^32 fp32 inputs: %llu finite mismatches, %llu NaN-input mismatches",
              what, (unsigned long long)mm.finite.load(), (unsigned long long)mm.nan.load());
  if (mm.have_example) std::printf(" (first finite: bits 0x%08x)", mm.example.load());
  std::printf("\n");
  return mm.finite == 0 && mm.nan == 0;
}

bool CheckDecode() {
  float* dev = nullptr;
  CUDA_OK(cudaMalloc(&dev, 256 * sizeof(float)));
  DecodeAll<<<1, 256>>>(dev);
  CUDA_OK(cudaGetLastError());
  std::vector<float> got(256);
  CUDA_OK(cudaMemcpy(got.data(), dev, 256 * sizeof(float), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaFree(dev));
  int bad = 0;
  for (int c = 0; c < 256; ++c) {
    const float want = wsync::E4M3ToFp32(static_cast<uint8_t>(c));
    const bool same = (std::isnan(want) && std::isnan(got[c])) ||
                      std::memcmp(&want, &got[c], 4) == 0;
    if (!same) {
      ++bad;
      std::printf("  decode code 0x%02x: gpu %g, reference %g\n", c, got[c], want);
    }
  }
  std::printf("%-44s 256 codes: %d mismatches\n", "e4m3 decode (__nv_cvt_fp8_to_halfraw)", bad);
  return bad == 0;
}

bool CheckBlockQuantize(int64_t rows, int64_t cols, uint32_t seed) {
  std::vector<uint16_t> x(rows * cols);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t block = (r / 128) * 131 + c / 128;
      float v = normal(rng);
      switch (block % 6) {
        case 0: break;
        case 1: v *= 1e-20f; break;
        case 2: v = 0.0f; break;
        case 3: v *= 3e4f; break;
        case 4: v = (r + c) % 3 ? -0.0f : std::ldexp(1.0f, -133) * float(c % 5); break;
        case 5: v *= (c % 17 == 0) ? 1000.0f : 0.01f; break;
      }
      x[r * cols + c] = wsync::Fp32ToBf16(v);
    }
  }
  auto ref = wsync::QuantizeFp8Blocks({x.data(), rows, cols, cols});
  if (!ref.ok()) {
    std::printf("reference failed: %s\n", ref.status().ToString().c_str());
    return false;
  }
  const int64_t br = wsync::Fp8BlockCount(rows), bc = wsync::Fp8BlockCount(cols);
  uint16_t* dx = nullptr;
  uint8_t* dq = nullptr;
  float* ds = nullptr;
  CUDA_OK(cudaMalloc(&dx, x.size() * 2));
  CUDA_OK(cudaMalloc(&dq, x.size()));
  CUDA_OK(cudaMalloc(&ds, br * bc * 4));
  CUDA_OK(cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
  QuantizeBlocks<<<dim3(bc, br), 256>>>(dx, rows, cols, dq, ds);
  CUDA_OK(cudaGetLastError());
  std::vector<uint8_t> q(x.size());
  std::vector<float> s(br * bc);
  CUDA_OK(cudaMemcpy(q.data(), dq, q.size(), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(s.data(), ds, s.size() * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaFree(dx));
  CUDA_OK(cudaFree(dq));
  CUDA_OK(cudaFree(ds));
  int64_t bad_q = 0, bad_s = 0;
  for (size_t i = 0; i < q.size(); ++i) bad_q += q[i] != ref->q[i];
  for (size_t i = 0; i < s.size(); ++i) bad_s += std::memcmp(&s[i], &ref->scale_inv[i], 4) != 0;
  std::printf("block quantize kernel [%lld x %lld]: %lld/%zu byte mismatches, %lld/%zu scale mismatches\n",
              (long long)rows, (long long)cols, (long long)bad_q, q.size(), (long long)bad_s, s.size());
  return bad_q == 0 && bad_s == 0;
}

}  // namespace

int main() {
  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
  bool ok = true;
  ok &= CheckDecode();
  ok &= SweepAllFloats<uint8_t>("e4m3 encode (__nv_cvt_float_to_fp8 SATFINITE)", EncodeRange,
                                [](float f) { return wsync::Fp32ToE4M3(f); });
  ok &= SweepAllFloats<uint16_t>("bf16 encode (__float2bfloat16_rn)", Bf16Range,
                                 [](float f) { return wsync::Fp32ToBf16(f); });
  ok &= CheckBlockQuantize(1000, 3000, 1);
  ok &= CheckBlockQuantize(7168, 2048, 2);
  std::printf(ok ? "CONFORMS\n" : "DIFFERS\n");
  return ok ? 0 : 1;
}
