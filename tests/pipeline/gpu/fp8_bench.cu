// GPU fp8 quantize: correctness against the CPU reference, then its
// bandwidth beside this GPU's device-to-device copy, measured in the same
// run (issue 8: at least 95%).
//
//   fp8_bench [rows=16384] [cols=8192] [iters=50]
//
// Correct: QuantizeFp8BlocksCuda (pipeline/fp8_cuda.cu) on random bf16 of
// several shapes (partial blocks, stacked experts, columns not a multiple
// of 8 for the scalar path, zero blocks, large and tiny magnitudes) equals
// QuantizeFp8Blocks (pipeline/fp8.cc, the CPU reference) byte for byte, q
// and scale_inv. Fast: bytes the kernel must move (bf16 read + fp8 and
// scales written) per second, beside cudaMemcpyAsync device-to-device of the
// bf16 tensor (read + write), both timed with CUDA events, median of
// `iters`, over a tensor several times the L2.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "pipeline/fp8.h"
#include "tests/pipeline/gpu/cuda_check.h"
#include "pipeline/fp8_cuda.h"


namespace {

using wsync::Fp8BlockCount;

std::vector<uint16_t> RandomBf16(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-30, 10);
  std::vector<uint16_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    const float v = normal(rng) * std::ldexp(1.0f, exponent(rng) / 4);
    out[i] = wsync::Fp32ToBf16(v);
  }
  return out;
}

// One shape through the GPU and the CPU reference; returns mismatches.
size_t Check(int64_t batch, int64_t rows, int64_t cols, uint32_t seed, bool zero_first_block) {
  const size_t per = static_cast<size_t>(rows * cols);
  std::vector<uint16_t> x = RandomBf16(per * batch, seed);
  if (zero_first_block) {
    for (int64_t r = 0; r < std::min<int64_t>(rows, 128); ++r)
      for (int64_t c = 0; c < std::min<int64_t>(cols, 128); ++c) x[r * cols + c] = 0;
  }
  const size_t grid = static_cast<size_t>(Fp8BlockCount(rows) * Fp8BlockCount(cols));
  uint16_t* dx;
  uint8_t* dq;
  float* ds;
  CUDA_OK(cudaMalloc(&dx, x.size() * 2));
  CUDA_OK(cudaMalloc(&dq, x.size()));
  CUDA_OK(cudaMalloc(&ds, grid * batch * 4));
  CUDA_OK(cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(dq, 0xAB, x.size()));
  CUDA_OK(wsync::QuantizeFp8BlocksCuda(dx, batch, rows, cols, dq, ds, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint8_t> q(x.size());
  std::vector<float> s(grid * batch);
  CUDA_OK(cudaMemcpy(q.data(), dq, q.size(), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(s.data(), ds, s.size() * 4, cudaMemcpyDeviceToHost));
  size_t bad = 0;
  for (int64_t m = 0; m < batch; ++m) {
    auto ref = wsync::QuantizeFp8Blocks({x.data() + m * per, rows, cols, cols});
    if (!ref.ok()) {
      std::fprintf(stderr, "reference: %s\n", ref.status().ToString().c_str());
      std::exit(2);
    }
    for (size_t i = 0; i < grid; ++i) {
      if (std::memcmp(&s[m * grid + i], &ref->scale_inv[i], 4) != 0 && bad++ < 3) {
        std::printf("  matrix %lld scale %zu: gpu %a, reference %a\n", static_cast<long long>(m), i, s[m * grid + i],
                    ref->scale_inv[i]);
      }
    }
    for (size_t i = 0; i < per; ++i) {
      if (q[m * per + i] != ref->q[i] && bad++ < 6) {
        std::printf("  matrix %lld element %zu (row %zu col %zu): gpu 0x%02x, reference 0x%02x (x = %a)\n",
                    static_cast<long long>(m), i, i / cols, i % cols, q[m * per + i], ref->q[i],
                    wsync::Bf16ToFp32(x[m * per + i]));
      }
    }
  }
  std::printf("check %lldx[%lld, %lld]: %zu mismatching bytes/scales\n", static_cast<long long>(batch),
              static_cast<long long>(rows), static_cast<long long>(cols), bad);
  CUDA_OK(cudaFree(dx));
  CUDA_OK(cudaFree(dq));
  CUDA_OK(cudaFree(ds));
  return bad;
}

template <typename Fn>
float MedianMs(int iters, Fn&& fn) {
  cudaEvent_t a, b;
  CUDA_OK(cudaEventCreate(&a));
  CUDA_OK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) fn();  // warm-up
  std::vector<float> ms;
  for (int i = 0; i < iters; ++i) {
    CUDA_OK(cudaEventRecord(a));
    fn();
    CUDA_OK(cudaEventRecord(b));
    CUDA_OK(cudaEventSynchronize(b));
    float t = 0;
    CUDA_OK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 16384;
  const int64_t cols = argc > 2 ? std::atoll(argv[2]) : 8192;
  const int iters = argc > 3 ? std::atoi(argv[3]) : 50;
  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MiB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);

  size_t bad = 0;
  bad += Check(1, 1000, 1032, 1, true);    // partial blocks both ways, a zero block
  bad += Check(3, 300, 264, 2, false);     // stacked experts, partial blocks
  bad += Check(2, 257, 130, 3, true);      // cols % 8 != 0: the scalar path
  bad += Check(1, 2048, 7168, 4, false);   // a real projection shape
  if (bad != 0) {
    std::printf("FAIL: GPU quantize differs from the CPU reference\n");
    return 1;
  }

  const size_t n = static_cast<size_t>(rows * cols);
  const size_t grid = static_cast<size_t>(Fp8BlockCount(rows) * Fp8BlockCount(cols));
  std::vector<uint16_t> x = RandomBf16(n, 7);
  uint16_t *dx, *dcopy;
  uint8_t* dq;
  float* ds;
  CUDA_OK(cudaMalloc(&dx, n * 2));
  CUDA_OK(cudaMalloc(&dcopy, n * 2));
  CUDA_OK(cudaMalloc(&dq, n));
  CUDA_OK(cudaMalloc(&ds, grid * 4));
  CUDA_OK(cudaMemcpy(dx, x.data(), n * 2, cudaMemcpyHostToDevice));
  const float q_ms = MedianMs(iters, [&] { CUDA_OK(wsync::QuantizeFp8BlocksCuda(dx, 1, rows, cols, dq, ds, nullptr)); });
  const float c_ms = MedianMs(iters, [&] { CUDA_OK(cudaMemcpyAsync(dcopy, dx, n * 2, cudaMemcpyDeviceToDevice)); });
  const double q_bytes = static_cast<double>(n) * 3 + grid * 4.0;  // bf16 in, fp8 + scales out
  const double c_bytes = static_cast<double>(n) * 4;               // bf16 in + bf16 out
  const double q_gbs = q_bytes / (q_ms * 1e6), c_gbs = c_bytes / (c_ms * 1e6);
  std::printf("quantize [%lld, %lld] bf16 -> fp8 e4m3 128x128: %.3f ms, %.0f GB/s (bf16 read + fp8/scales written)\n",
              static_cast<long long>(rows), static_cast<long long>(cols), q_ms, q_gbs);
  std::printf("device-to-device copy of the same %.0f MiB: %.3f ms, %.0f GB/s (read + write)\n", n * 2 / 1048576.0, c_ms,
              c_gbs);
  std::printf("RATIO quantize / copy bandwidth: %.3f (target >= 0.95)\n", q_gbs / c_gbs);
  std::printf("PASS: bit-identical to the CPU reference on every checked shape\n");
  return 0;
}
