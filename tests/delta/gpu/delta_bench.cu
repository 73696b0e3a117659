// The delta codec on a GPU (delta/codec_cuda.cu): correct against the CPU
// codec, then its speed beside this GPU's device-to-device copy of the same
// bytes, and the CPU codec's beside memcpy, measured in the same run.
//
//   delta_bench [mib=1024] [iters=10]
//
// Correct, for elements of 1, 2 and 4 bytes, change rates 0 to 100%, a
// region of 3 chunks and a partial one (a tail past the last 16-byte
// vector): the kernels' delta is byte for byte the CPU codec's, base
// advances to next, applying it (or the CPU's) to the old bytes gives the
// new ones, a capacity too small says so, and a damaged delta changes
// nothing. Fast: for fp8 (1 byte) and bf16 (2 bytes) at the change rates
// measured per AdamW step (docs/DELTAS.md), GB/s of the region's bytes for
// encode and apply (each call as a caller sees it: kernels, the counts'
// round trip, synchronization), median of `iters`, beside cudaMemcpy
// device-to-device of the same bytes; then the CPU codec (one core) beside
// memcpy on a quarter of the bytes.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "delta/codec.h"
#include "delta/codec_cuda.h"
#include "tests/pipeline/gpu/cuda_check.h"

namespace {

using namespace wsync::delta;  // NOLINT: a test program
using wsync::Status;
using Bytes = std::vector<uint8_t>;
using Clock = std::chrono::steady_clock;

uint64_t state = 88172645463325252ull;
uint64_t Next64() {
  state ^= state << 13;
  state ^= state >> 7;
  state ^= state << 17;
  return state;
}

Bytes Random(size_t n) {
  Bytes b(n);
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t r = Next64();
    std::memcpy(&b[i], &r, std::min<size_t>(8, n - i));
  }
  return b;
}

// About rate * elements elements of `held` changed (at random places).
Bytes Changed(const Bytes& held, uint32_t e, double rate) {
  Bytes next = held;
  const size_t elements = held.size() / e;
  const size_t k = static_cast<size_t>(rate * static_cast<double>(elements));
  for (size_t j = 0; j < k; ++j) {
    const size_t i = Next64() % elements;
    next[i * e + Next64() % e] ^= static_cast<uint8_t>(1 + Next64() % 255);
  }
  return next;
}

struct Device {
  uint8_t* p = nullptr;
  size_t n = 0;
  explicit Device(size_t bytes) : n(bytes) { CUDA_OK(cudaMalloc(&p, std::max<size_t>(bytes, 16))); }
  Device(const Bytes& b) : Device(b.size()) { Put(b); }
  ~Device() { cudaFree(p); }
  void Put(const Bytes& b) { CUDA_OK(cudaMemcpy(p, b.data(), b.size(), cudaMemcpyHostToDevice)); }
  Bytes Get(size_t bytes) const {
    Bytes b(bytes);
    CUDA_OK(cudaMemcpy(b.data(), p, bytes, cudaMemcpyDeviceToHost));
    return b;
  }
};

int failures = 0;
void Check(bool ok, const std::string& what) {
  if (!ok) {
    ++failures;
    std::printf("  FAIL: %s\n", what.c_str());
  }
}

void Correctness(cudaStream_t stream) {
  CudaWorkspace ws;
  for (uint32_t e : {1u, 2u, 4u}) {
    for (double rate : {0.0, 0.0005, 0.004, 0.034, 0.2, 1.0}) {
      const std::string name = "elem " + std::to_string(e) + " rate " + std::to_string(rate);
      const size_t elements = 3 * kChunkElements + 1001;
      const Bytes held = Random(elements * e);
      const Bytes next = Changed(held, e, rate);
      Bytes cpu_base = held;
      Bytes cpu_delta(2 * held.size() + 1024);
      auto cpu = EncodeAndAdvance(cpu_base.data(), next.data(), next.size(), e, cpu_delta.data(), cpu_delta.size());
      Device base(held), nx(next), out(cpu_delta.size());
      auto gpu = EncodeAndAdvanceCuda(base.p, nx.p, next.size(), e, out.p, cpu_delta.size(), ws, stream);
      Check(cpu.ok() && gpu.ok() && cpu->fits && gpu->fits, name + ": encode ran");
      if (!cpu.ok() || !gpu.ok()) continue;
      Check(gpu->changes == cpu->changes && gpu->bytes == cpu->bytes, name + ": same counts and length");
      Check(out.Get(gpu->bytes) == Bytes(cpu_delta.begin(), cpu_delta.begin() + cpu->bytes),
            name + ": the kernels' delta is the CPU codec's, byte for byte");
      Check(base.Get(held.size()) == next, name + ": base advanced to next");
      Device target(held);
      Status st = ApplyCuda(out.p, gpu->bytes, target.p, held.size(), "w", ws, stream);
      Check(st.ok() && target.Get(held.size()) == next, name + ": applied on the GPU gives next " + st.message());
      Bytes host_target = held;
      Bytes gpu_delta = out.Get(gpu->bytes);
      st = Apply(gpu_delta.data(), gpu_delta.size(), host_target.data(), host_target.size(), "w");
      Check(st.ok() && host_target == next, name + ": the GPU's delta applied on the CPU gives next");
      // Too small: says so, base still advances.
      if (cpu->changes > 0) {
        Device base2(held);
        auto small = EncodeAndAdvanceCuda(base2.p, nx.p, next.size(), e, out.p, cpu->bytes - 1, ws, stream);
        Check(small.ok() && !small->fits && base2.Get(held.size()) == next, name + ": a delta too big says so");
      }
      // Damaged (two indices swapped, or a bitmap bit cleared): nothing changes.
      if (cpu->changes > 2) {
        Bytes bad = gpu_delta;
        const uint64_t where = HeadBytes(elements);
        uint32_t k0;
        std::memcpy(&k0, &bad[kHeaderBytes], 4);
        if (k0 > kChunkElements / 16) {
          bad[where] ^= 0x1;  // chunk 0 has a bitmap: one bit more or less than its count
        } else if (k0 >= 2) {
          std::swap(bad[where], bad[where + 2]);  // its first two indices out of order
          std::swap(bad[where + 1], bad[where + 3]);
        }
        Device d(bad), t(held);
        Status refused = ApplyCuda(d.p, bad.size(), t.p, held.size(), "w", ws, stream);
        Check(!refused.ok() && t.Get(held.size()) == held, name + ": a damaged delta changes nothing (" +
                                                               refused.message() + ")");
      }
    }
  }
  std::printf("correctness: %s\n", failures == 0 ? "the kernels agree with the CPU codec in every case" : "FAILED");
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void Speed(size_t mib, int iters, cudaStream_t stream) {
  CudaWorkspace ws;
  const size_t size = mib << 20;
  std::printf("\nspeed over %zu MiB (GB/s of the region's bytes; ratio = the copy's time / ours):\n", mib);
  std::printf("%-6s %7s %9s %10s %10s %10s %8s %8s\n", "elem", "changed", "delta", "copy_GBps", "encode", "apply",
              "enc/copy", "app/copy");
  const Bytes held = Random(size);
  Device copy_dst(size), base(size), out(size / 2), target(size);
  for (auto [e, rate] : {std::pair{1u, 0.004}, std::pair{1u, 0.029}, std::pair{2u, 0.034}, std::pair{2u, 0.2}}) {
    const Bytes next = Changed(held, e, rate);
    Device nx(next), h(held);
    std::vector<double> copy_s, enc_s, app_s;
    uint64_t bytes = 0;
    for (int i = 0; i < iters; ++i) {
      CUDA_OK(cudaMemcpy(base.p, h.p, size, cudaMemcpyDeviceToDevice));
      CUDA_OK(cudaMemcpy(target.p, h.p, size, cudaMemcpyDeviceToDevice));
      CUDA_OK(cudaDeviceSynchronize());
      auto t0 = Clock::now();
      CUDA_OK(cudaMemcpyAsync(copy_dst.p, nx.p, size, cudaMemcpyDeviceToDevice, stream));
      CUDA_OK(cudaStreamSynchronize(stream));
      auto t1 = Clock::now();
      auto enc = EncodeAndAdvanceCuda(base.p, nx.p, size, e, out.p, size / 2, ws, stream);
      auto t2 = Clock::now();
      if (!enc.ok() || !enc->fits) {
        std::printf("encode failed: %s\n", enc.ok() ? "does not fit" : enc.status().message().c_str());
        std::exit(1);
      }
      Status st = ApplyCuda(out.p, enc->bytes, target.p, size, "bench", ws, stream);
      auto t3 = Clock::now();
      if (!st.ok()) {
        std::printf("apply failed: %s\n", st.message().c_str());
        std::exit(1);
      }
      bytes = enc->bytes;
      copy_s.push_back(std::chrono::duration<double>(t1 - t0).count());
      enc_s.push_back(std::chrono::duration<double>(t2 - t1).count());
      app_s.push_back(std::chrono::duration<double>(t3 - t2).count());
    }
    Check(target.Get(size) == next, "bench: the applied region equals next");
    const double c = Median(copy_s), en = Median(enc_s), ap = Median(app_s);
    std::printf("%-6u %6.2f%% %8.2f%% %10.1f %10.1f %10.1f %8.2f %8.2f\n", e, 100 * rate,
                100.0 * static_cast<double>(bytes) / static_cast<double>(size), size / c / 1e9, size / en / 1e9,
                size / ap / 1e9, c / en, c / ap);
  }

  const size_t host_size = size / 4;
  std::printf("\nCPU codec, one core, over %zu MiB (GB/s of the region's bytes; ratio = memcpy's time / ours):\n",
              host_size >> 20);
  std::printf("%-6s %7s %10s %10s %10s %8s %8s\n", "elem", "changed", "memcpy", "encode", "apply", "enc/cpy", "app/cpy");
  const Bytes hheld(held.begin(), held.begin() + host_size);
  for (auto [e, rate] : {std::pair{1u, 0.004}, std::pair{1u, 0.029}, std::pair{2u, 0.034}, std::pair{2u, 0.2}}) {
    const Bytes next = Changed(hheld, e, rate);
    Bytes b = hheld, dst(host_size), delta(host_size / 2), target = hheld;
    std::vector<double> cp, en, ap;
    for (int i = 0; i < std::max(3, iters / 3); ++i) {
      b = hheld;
      target = hheld;
      auto t0 = Clock::now();
      std::memcpy(dst.data(), next.data(), host_size);
      auto t1 = Clock::now();
      auto r = EncodeAndAdvance(b.data(), next.data(), host_size, e, delta.data(), delta.size());
      auto t2 = Clock::now();
      Status st = Apply(delta.data(), r->bytes, target.data(), host_size, "bench");
      auto t3 = Clock::now();
      Check(r.ok() && r->fits && st.ok(), "cpu bench ran");
      cp.push_back(std::chrono::duration<double>(t1 - t0).count());
      en.push_back(std::chrono::duration<double>(t2 - t1).count());
      ap.push_back(std::chrono::duration<double>(t3 - t2).count());
    }
    Check(target == next, "cpu bench: the applied region equals next");
    const double c = Median(cp), e2 = Median(en), a = Median(ap);
    std::printf("%-6u %6.2f%% %10.2f %10.2f %10.2f %8.2f %8.2f\n", e, 100 * rate, host_size / c / 1e9,
                host_size / e2 / 1e9, host_size / a / 1e9, c / e2, c / a);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const size_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1024;
  const int iters = argc > 2 ? std::atoi(argv[2]) : 10;
  cudaDeviceProp prop;
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  std::printf("delta_bench on %s\n", prop.name);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  Correctness(stream);
  Speed(mib, iters, stream);
  std::printf("%s\n", failures == 0 ? "delta_bench: ok" : "delta_bench: FAILED");
  return failures == 0 ? 0 : 1;
}
