// Fp8KernelDisagreement (fp8_cuda.h): the kernel against the CPU reference.
#include <cstring>
#include <vector>

#include "pipeline/fp8.h"
#include "pipeline/fp8_cuda.h"

namespace wsync {
namespace {

// Device memory for the check, freed however it ends.
struct DeviceBuffer {
  void* p = nullptr;
  ~DeviceBuffer() {
    if (p != nullptr) (void)cudaFree(p);
  }
};

std::string Why(const char* what, cudaError_t e) { return std::string(what) + ": " + cudaGetErrorString(e); }

}  // namespace

std::string Fp8KernelDisagreement(cudaStream_t stream) {
  constexpr int64_t kRows = 200, kCols = 264, kBatch = 2, kPer = kRows * kCols;
  std::vector<uint16_t> x(kBatch * kPer);
  uint32_t state = 12345;
  for (size_t i = 0; i < x.size(); ++i) {
    state = state * 1664525u + 1013904223u;
    const uint16_t sign = (state >> 31) << 15;
    const int64_t r = (i % kPer) / kCols, c = i % kCols;
    uint16_t magnitude = static_cast<uint16_t>(0x3000 + (state >> 8) % 0x1400);  // 4e-10 .. 16
    if (r < 128 && c < 128) magnitude = (i % 3 == 0) ? 0 : magnitude;                 // zeros, -0
    if (r < 128 && c >= 128) magnitude = static_cast<uint16_t>(0x0080 + (state >> 8) % 0x100);  // ~1e-38
    if (r >= 128 && c < 128 && i % 2 == 0) magnitude = static_cast<uint16_t>(1 + (state >> 8) % 0x7F);
    if (r >= 128 && c >= 128 && i >= static_cast<size_t>(kPer)) {
      magnitude = static_cast<uint16_t>(0x7E00 + (state >> 8) % 0x17F);  // up to the bf16 maximum
    }
    x[i] = sign | magnitude;
  }
  const int64_t grid = Fp8BlockCount(kRows) * Fp8BlockCount(kCols);
  DeviceBuffer dx, dq, ds;
  cudaError_t e = cudaMalloc(&dx.p, x.size() * sizeof(uint16_t));
  if (e == cudaSuccess) e = cudaMalloc(&dq.p, kBatch * kPer);
  if (e == cudaSuccess) e = cudaMalloc(&ds.p, kBatch * grid * sizeof(float));
  if (e != cudaSuccess) return Why("allocating the check's memory", e);
  e = cudaMemcpyAsync(dx.p, x.data(), x.size() * sizeof(uint16_t), cudaMemcpyHostToDevice, stream);
  if (e == cudaSuccess) {
    e = QuantizeFp8BlocksCuda(static_cast<const uint16_t*>(dx.p), kBatch, kRows, kCols, static_cast<uint8_t*>(dq.p),
                              static_cast<float*>(ds.p), stream, nullptr);
  }
  std::vector<uint8_t> q(kBatch * kPer);
  std::vector<float> scales(kBatch * grid);
  if (e == cudaSuccess) e = cudaMemcpyAsync(q.data(), dq.p, q.size(), cudaMemcpyDeviceToHost, stream);
  if (e == cudaSuccess) {
    e = cudaMemcpyAsync(scales.data(), ds.p, scales.size() * sizeof(float), cudaMemcpyDeviceToHost, stream);
  }
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) return Why("running the kernel", e);
  for (int64_t m = 0; m < kBatch; ++m) {
    StatusOr<Fp8BlockTensor> want = QuantizeFp8Blocks({x.data() + m * kPer, kRows, kCols, kCols});
    if (!want.ok()) return want.status().message();
    if (std::memcmp(q.data() + m * kPer, want->q.data(), kPer) != 0) return "fp8 codes differ";
    if (std::memcmp(scales.data() + m * grid, want->scale_inv.data(), grid * sizeof(float)) != 0) {
      return "scales differ";
    }
  }
  return "";
}

}  // namespace wsync
