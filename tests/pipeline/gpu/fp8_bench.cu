// GPU fp8 quantize: correctness against the CPU reference, then its
// bandwidth beside this GPU's device-to-device copy, measured in the same
// run (issue 8: at least 95%).
//
//   fp8_bench [rows cols [iters=30]]   (no shape: three shapes)
//
// Correct: QuantizeFp8BlocksCuda (pipeline/fp8_cuda.cu), both launches, on
// random bf16 of several shapes (partial blocks, stacked experts, columns
// not a multiple of 8 for the scalar path, zero blocks, large and tiny
// magnitudes) equals QuantizeFp8Blocks (pipeline/fp8.cc, the CPU reference)
// byte for byte, q and scale_inv. Fast: bytes the kernel must move (bf16
// read + fp8 and scales written) per second, beside cudaMemcpyAsync
// device-to-device of the bf16 tensor (read + write), each timed with CUDA
// events over 20 calls queued back to back, median of `iters` rounds in
// which copy and both launches alternate (Speed says what else it prints),
// over tensors several times the L2.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
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

// Four 128x128 blocks of the values a division shortcut gets wrong first:
// signed zeros among normal values; a block so small its scale is subnormal;
// subnormal values beside large ones (quotients far below fp8's least); values
// near the bf16 maximum (a scale beyond 2^100).
std::vector<uint16_t> EdgeBf16(uint32_t seed) {
  std::vector<uint16_t> x = RandomBf16(256 * 256, seed);
  std::mt19937 rng(seed);
  auto at = [&](int block, int i) -> uint16_t& { return x[((block / 2) * 128 + i / 128) * 256 + (block % 2) * 128 + i % 128]; };
  for (int i = 0; i < 128 * 128; ++i) {
    if (i % 3 == 0) at(0, i) = (i % 2) ? 0x8000 : 0x0000;                                    // -0, +0
    at(1, i) = static_cast<uint16_t>((rng() & 0x8000) | (0x0080 + rng() % 0x0100));        // ~1e-38
    if (i % 2 == 0) at(2, i) = static_cast<uint16_t>((rng() & 0x8000) | (1 + rng() % 0x7F));  // subnormal
    at(3, i) = static_cast<uint16_t>((rng() & 0x8000) | (0x7E00 + rng() % 0x17F));         // up to 3.4e38
  }
  return x;
}

// One shape through the GPU and the CPU reference; returns mismatches.
size_t Check(wsync::Fp8Launch launch, int64_t batch, int64_t rows, int64_t cols, uint32_t seed, bool zero_first_block,
             bool edges = false) {
  const size_t per = static_cast<size_t>(rows * cols);
  std::vector<uint16_t> x = edges ? EdgeBf16(seed) : RandomBf16(per * batch, seed);
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
  int* flag;
  CUDA_OK(cudaMallocManaged(&flag, sizeof(int)));
  *flag = 0;
  CUDA_OK(wsync::QuantizeFp8BlocksCuda(dx, batch, rows, cols, dq, ds, nullptr, flag, launch));
  CUDA_OK(cudaDeviceSynchronize());
  size_t bad = *flag != 0;
  if (bad) std::printf("  finite input flagged as non-finite\n");
  CUDA_OK(cudaFree(flag));
  std::vector<uint8_t> q(x.size());
  std::vector<float> s(grid * batch);
  CUDA_OK(cudaMemcpy(q.data(), dq, q.size(), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(s.data(), ds, s.size() * 4, cudaMemcpyDeviceToHost));
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

// The kernel's division shortcut (pipeline/fp8_cuda.cu: q0 = v * RN(1/s),
// one FMA correction) against IEEE division, for every fp32 significand of s
// and every bf16 significand of v, with v's exponent spanning quotients from
// 2^-13 (below that fp8 holds only zero) to 2^10 (above 448). Exponent shifts
// of both leave the rounding unchanged inside the kernel's range of s.
__global__ void DivisionShortcutMismatches(unsigned long long* bad) {
  const uint32_t sm = blockIdx.x * blockDim.x + threadIdx.x;
  if (sm >= (1u << 23)) return;
  const float s = __uint_as_float((127u << 23) | sm), r = __frcp_rn(s);
  unsigned long long n = 0;
  for (uint32_t vm = 0; vm < 128; ++vm) {
    for (int e = -12; e <= 9; ++e) {
      const float v = __uint_as_float((uint32_t(127 + e) << 23) | (vm << 16));
      const float q0 = __fmul_rn(v, r);
      const float q1 = __fmaf_rn(__fmaf_rn(-s, q0, v), r, q0);
      n += __float_as_uint(q1) != __float_as_uint(__fdiv_rn(v, s));
    }
  }
  if (n != 0) atomicAdd(bad, n);
}

// A NaN or an infinity anywhere must raise the non-finite flag.
size_t CheckNonFinite() {
  size_t bad = 0;
  for (uint16_t poison : {uint16_t{0x7FC0}, uint16_t{0xFF80}}) {  // NaN, -inf
    for (int64_t cols : {int64_t{256}, int64_t{250}}) {            // vector and scalar kernels
      std::vector<uint16_t> x = RandomBf16(200 * cols, 9);
      x[150 * cols + 131] = poison;
      uint16_t* dx;
      uint8_t* dq;
      float* ds;
      int* flag;
      CUDA_OK(cudaMalloc(&dx, x.size() * 2));
      CUDA_OK(cudaMalloc(&dq, x.size()));
      CUDA_OK(cudaMalloc(&ds, 4 * 4));
      CUDA_OK(cudaMallocManaged(&flag, sizeof(int)));
      *flag = 0;
      CUDA_OK(cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
      CUDA_OK(wsync::QuantizeFp8BlocksCuda(dx, 1, 200, cols, dq, ds, nullptr, flag));
      CUDA_OK(cudaDeviceSynchronize());
      if (*flag == 0) {
        std::printf("  bf16 0x%04x in [200, %lld] not flagged\n", poison, static_cast<long long>(cols));
        ++bad;
      }
      CUDA_OK(cudaFree(dx));
      CUDA_OK(cudaFree(dq));
      CUDA_OK(cudaFree(ds));
      CUDA_OK(cudaFree(flag));
    }
  }
  std::printf("non-finite input: %s\n", bad == 0 ? "flagged in every case" : "MISSED");
  return bad;
}

unsigned long long CheckDivisionShortcut() {
  unsigned long long* bad;
  CUDA_OK(cudaMallocManaged(&bad, sizeof(*bad)));
  *bad = 0;
  DivisionShortcutMismatches<<<(1u << 23) / 256, 256>>>(bad);
  CUDA_OK(cudaDeviceSynchronize());
  const unsigned long long n = *bad;
  std::printf("division shortcut: %llu of %llu quotients differ from IEEE division\n", n,
              (1ull << 23) * 128 * 22);
  CUDA_OK(cudaFree(bad));
  return n;
}

// Milliseconds per call: each timing spans kBackToBack calls queued at once,
// so the GPU never idles between them waiting for the host's next launch
// (one call of ~0.1 ms timed alone carries a launch gap of several us, which
// the copy and the kernel need not share alike).
constexpr int kBackToBack = 20;

struct Timer {
  cudaEvent_t start, stop;
  Timer() {
    CUDA_OK(cudaEventCreate(&start));
    CUDA_OK(cudaEventCreate(&stop));
  }
  template <typename Fn>
  float Ms(Fn&& fn, int calls) {
    CUDA_OK(cudaEventRecord(start));
    for (int k = 0; k < calls; ++k) fn();
    CUDA_OK(cudaEventRecord(stop));
    CUDA_OK(cudaEventSynchronize(stop));
    float t = 0;
    CUDA_OK(cudaEventElapsedTime(&t, start, stop));
    return t / calls;
  }
};

float Median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The old way, kept for comparison: the median of `iters` batches of one
// function, each timed after `fn` alone has kept the GPU busy for 300 ms.
template <typename Fn>
float SteadyMs(int iters, Fn&& fn) {
  Timer t;
  const auto warm_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  while (std::chrono::steady_clock::now() < warm_until) t.Ms(fn, kBackToBack);
  std::vector<float> ms;
  for (int i = 0; i < iters; ++i) ms.push_back(t.Ms(fn, kBackToBack));
  return Median(ms);
}

// One shape: bytes per second of the copy and of each launch of the kernel,
// three ways, so what moves the ratio shows in one run:
//   interleaved: rounds of one batch of each (copy, both launches), the
//     order rotating every round, after 300 ms of all three: each kernel's
//     median beside the copy's, and the spread of the per-round ratios;
//   steady: each in its own steady state (the way of the earlier figures);
//   one call after other work: a single call timed right after a batch of
//     copies, and right after a batch of itself (the state the GPU is left
//     in by what ran before: clocks, L2 holding the other's dirty lines).
void Speed(int64_t rows, int64_t cols, int iters) {
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
  using wsync::Fp8Launch;
  auto copy = [&] { CUDA_OK(cudaMemcpyAsync(dcopy, dx, n * 2, cudaMemcpyDeviceToDevice)); };
  auto plain = [&] { CUDA_OK(wsync::QuantizeFp8BlocksCuda(dx, 1, rows, cols, dq, ds, nullptr, nullptr, Fp8Launch::kPlain)); };
  auto overlapped = [&] { CUDA_OK(wsync::QuantizeFp8BlocksCuda(dx, 1, rows, cols, dq, ds, nullptr, nullptr, Fp8Launch::kOverlapped)); };
  const double q_bytes = static_cast<double>(n) * 3 + grid * 4.0;  // bf16 in, fp8 + scales out
  const double c_bytes = static_cast<double>(n) * 4;               // bf16 in + bf16 out
  auto gbs = [](double bytes, float ms) { return bytes / (ms * 1e6); };
  std::printf("\nquantize [%lld, %lld] bf16 -> fp8 e4m3 128x128 (%.0f MiB in), GB/s moved (bf16 read + fp8/scales "
              "written; the copy: read + write); ratio = quantize GB/s / copy GB/s\n",
              static_cast<long long>(rows), static_cast<long long>(cols), n * 2 / 1048576.0);

  Timer t;
  std::vector<float> c_ms, b_ms, l_ms, b_ratio, l_ratio;
  const auto warm_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  while (std::chrono::steady_clock::now() < warm_until) {
    t.Ms(copy, kBackToBack);
    t.Ms(plain, kBackToBack);
    t.Ms(overlapped, kBackToBack);
  }
  for (int i = 0; i < iters; ++i) {
    float c = 0, b = 0, l = 0;
    for (int k = 0; k < 3; ++k) {
      switch ((i + k) % 3) {
        case 0: c = t.Ms(copy, kBackToBack); break;
        case 1: b = t.Ms(plain, kBackToBack); break;
        default: l = t.Ms(overlapped, kBackToBack); break;
      }
    }
    c_ms.push_back(c), b_ms.push_back(b), l_ms.push_back(l);
    b_ratio.push_back(gbs(q_bytes, b) / gbs(c_bytes, c));
    l_ratio.push_back(gbs(q_bytes, l) / gbs(c_bytes, c));
  }
  const float c = Median(c_ms);
  auto spread = [](std::vector<float> r) {
    std::sort(r.begin(), r.end());
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.3f-%.3f", r.front(), r.back());
    return std::string(buf);
  };
  std::printf("  interleaved, %d rounds: copy %.3f ms %.0f GB/s; plain %.3f ms %.0f GB/s; overlapped %.3f ms %.0f GB/s\n",
              iters, c, gbs(c_bytes, c), Median(b_ms), gbs(q_bytes, Median(b_ms)), Median(l_ms),
              gbs(q_bytes, Median(l_ms)));
  std::printf("  RATIO interleaved: plain %.3f (rounds %s), overlapped %.3f (rounds %s)\n",
              gbs(q_bytes, Median(b_ms)) / gbs(c_bytes, c), spread(b_ratio).c_str(),
              gbs(q_bytes, Median(l_ms)) / gbs(c_bytes, c), spread(l_ratio).c_str());

  const float sc1 = SteadyMs(iters, copy), sb = SteadyMs(iters, plain), sl = SteadyMs(iters, overlapped),
              sc2 = SteadyMs(iters, copy);
  const float sc = std::min(sc1, sc2);
  std::printf("  steady (each after 300 ms of itself; copy %.3f then %.3f ms): RATIO plain %.3f, overlapped %.3f\n",
              sc1, sc2, gbs(q_bytes, sb) / gbs(c_bytes, sc), gbs(q_bytes, sl) / gbs(c_bytes, sc));

  std::vector<float> b_after_copy, b_after_self, l_after_copy, l_after_self, c_after_copy, c_after_q;
  for (int i = 0; i < iters; ++i) {
    t.Ms(copy, kBackToBack), b_after_copy.push_back(t.Ms(plain, 1));
    t.Ms(plain, kBackToBack), b_after_self.push_back(t.Ms(plain, 1));
    t.Ms(copy, kBackToBack), l_after_copy.push_back(t.Ms(overlapped, 1));
    t.Ms(overlapped, kBackToBack), l_after_self.push_back(t.Ms(overlapped, 1));
    t.Ms(copy, kBackToBack), c_after_copy.push_back(t.Ms(copy, 1));
    t.Ms(plain, kBackToBack), c_after_q.push_back(t.Ms(copy, 1));
  }
  std::printf("  one call (ms) after 20 copies / after 20 of itself: plain %.3f / %.3f, overlapped %.3f / %.3f; "
              "the copy after 20 copies / after 20 quantizes: %.3f / %.3f\n",
              Median(b_after_copy), Median(b_after_self), Median(l_after_copy), Median(l_after_self),
              Median(c_after_copy), Median(c_after_q));
  CUDA_OK(cudaFree(dx));
  CUDA_OK(cudaFree(dcopy));
  CUDA_OK(cudaFree(dq));
  CUDA_OK(cudaFree(ds));
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 0;
  const int64_t cols = argc > 2 ? std::atoll(argv[2]) : 0;
  const int iters = argc > 3 ? std::atoi(argv[3]) : 30;
  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MiB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);

  size_t bad = 0;
  for (wsync::Fp8Launch launch : {wsync::Fp8Launch::kAuto, wsync::Fp8Launch::kPlain, wsync::Fp8Launch::kOverlapped}) {
    bad += Check(launch, 1, 1000, 1032, 1, true);    // partial blocks both ways, a zero block
    bad += Check(launch, 3, 300, 264, 2, false);     // stacked experts, partial blocks
    bad += Check(launch, 2, 257, 130, 3, true);      // cols % 8 != 0: the scalar path
    bad += Check(launch, 1, 2048, 7168, 4, false);   // a real projection shape
    bad += Check(launch, 1, 256, 256, 5, false, true);  // signed zeros, subnormals, huge values
  }
  bad += CheckDivisionShortcut();
  bad += CheckNonFinite();
  if (bad != 0) {
    std::printf("FAIL: GPU quantize differs from the CPU reference\n");
    return 1;
  }
  std::printf("PASS: bit-identical to the CPU reference on every checked shape, both launches\n");
  if (rows > 0 && cols > 0) {
    Speed(rows, cols, iters);
  } else {  // a square-ish projection, Llama-3-8B's MLP and attention output shapes
    for (auto [r, c] : {std::pair<int64_t, int64_t>{16384, 8192}, {28672, 4096}, {4096, 14336}}) Speed(r, c, iters);
  }
  return 0;
}
