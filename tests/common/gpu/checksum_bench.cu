// GPU checksums (common/checksum_cuda.h): the same value as the host's
// Checksum64 for every piece, then their speed beside this GPU's
// device-to-device copy of the same bytes, measured in the same run.
//
//   checksum_bench [mib=3500] [iters=10]
//
// Correct: pieces of 0 bytes to 10 MiB (one leaf, exactly 512 leaves, a
// third level), starting at any byte, in one batch and over several
// Enqueues collected once: each hash equals Checksum64 of the same bytes
// copied to the host; one flipped byte changes its piece's hash and no
// other. Fast: `mib` MiB (about the trainer's 3.67 GB of a Llama-3-8B-shaped
// job's writes) cut into pieces of 28 MiB, 1 MiB and 64 KiB, hashed as one
// batch (Compute: the kernels, the rows' copy in, the results' copy out and
// the wait), median of `iters`, beside cudaMemcpy device-to-device of the
// same bytes (which reads them and writes them: twice the hash's traffic);
// then the old way, the bytes read back to the host and hashed there.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/checksum.h"
#include "common/checksum_cuda.h"
#include "tests/pipeline/gpu/cuda_check.h"

namespace {

using Clock = std::chrono::steady_clock;
using wsync::ChecksumPiece;

int failures = 0;
void Check(bool ok, const std::string& what) {
  if (!ok) {
    ++failures;
    std::printf("  FAIL: %s\n", what.c_str());
  }
}

std::vector<uint8_t> Random(size_t n, uint64_t seed) {
  std::vector<uint8_t> b(n);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; i += 8) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    std::memcpy(&b[i], &s, std::min<size_t>(8, n - i));
  }
  return b;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void Correctness(cudaStream_t stream) {
  const size_t total = 64u << 20;
  std::vector<uint8_t> host = Random(total, 1);
  uint8_t* dev;
  CUDA_OK(cudaMalloc(&dev, total));
  CUDA_OK(cudaMemcpy(dev, host.data(), total, cudaMemcpyHostToDevice));
  std::vector<std::pair<size_t, size_t>> spans;  // (offset, bytes)
  size_t at = 0;
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{31}, size_t{32}, size_t{100}, size_t{4095}, size_t{4096},
                       size_t{4097}, size_t{65536}, size_t{(1u << 20) + 13}, size_t{512 * 4096},
                       size_t{512 * 4096 + 1}, size_t{(10u << 20) + 7}}) {
    for (size_t misalign : {size_t{0}, size_t{1}, size_t{8}, size_t{16}}) {
      at = (at + 255) / 256 * 256 + misalign;
      spans.emplace_back(at, bytes);
      at += bytes;
    }
  }
  if (at > total) {
    std::printf("checksum_bench: the correctness spans need %zu bytes\n", at);
    std::exit(2);
  }
  std::vector<ChecksumPiece> pieces;
  std::vector<uint64_t> want;
  for (auto [o, n] : spans) {
    pieces.push_back({dev + o, n});
    want.push_back(wsync::Checksum64(host.data() + o, n));
  }
  wsync::DeviceChecksums sums;
  std::vector<uint64_t> got(pieces.size(), 0);
  wsync::Status s = sums.Compute(pieces.data(), pieces.size(), got.data(), stream);
  Check(s.ok(), "one batch ran: " + s.message());
  size_t same = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (got[i] == want[i]) ++same;
    else if (same + 5 > i) std::printf("  piece %zu (%zu bytes at +%zu): GPU %016llx, host %016llx\n", i,
                                       spans[i].second, spans[i].first, (unsigned long long)got[i],
                                       (unsigned long long)want[i]);
  }
  Check(same == pieces.size(), "one batch: " + std::to_string(same) + " of " + std::to_string(pieces.size()) +
                                   " pieces equal the host's Checksum64");
  // Several Enqueues (smaller buffers first, so they grow between), one Collect.
  wsync::DeviceChecksums sums2;
  std::vector<uint64_t> got2(pieces.size(), 0);
  for (size_t i = 0; i < pieces.size(); i += 7) {
    s = sums2.Enqueue(pieces.data() + i, std::min<size_t>(7, pieces.size() - i), got2.data() + i, stream);
    Check(s.ok(), "enqueue ran: " + s.message());
  }
  s = sums2.Collect(stream);
  Check(s.ok() && got2 == want, "several Enqueues collected once equal the host's");
  // One byte flipped in the 10 MiB piece: its hash changes, no other's.
  const size_t victim = pieces.size() - 3;
  const size_t flip = spans[victim].first + 7777777;
  uint8_t b = host[flip] ^ 0x10;
  CUDA_OK(cudaMemcpy(dev + flip, &b, 1, cudaMemcpyHostToDevice));
  s = sums.Compute(pieces.data(), pieces.size(), got.data(), stream);
  size_t changed = 0;
  for (size_t i = 0; i < pieces.size(); ++i) changed += got[i] != want[i];
  Check(s.ok() && got[victim] != want[victim] && changed == 1, "a flipped byte changes its piece's hash and no other");
  CUDA_OK(cudaFree(dev));
  std::printf("correctness: %s (%zu pieces, 0 B to 10 MiB, 4 alignments)\n",
              failures == 0 ? "every GPU hash equals the host's Checksum64" : "FAILED", pieces.size());
}

void Speed(size_t mib, int iters, cudaStream_t stream) {
  const size_t size = mib << 20;
  uint8_t *src, *dst;
  CUDA_OK(cudaMalloc(&src, size));
  CUDA_OK(cudaMalloc(&dst, size));
  {
    std::vector<uint8_t> chunk = Random(64u << 20, 2);
    for (size_t at = 0; at < size; at += chunk.size())
      CUDA_OK(cudaMemcpy(src + at, chunk.data(), std::min(chunk.size(), size - at), cudaMemcpyHostToDevice));
  }
  std::printf("\nspeed over %zu MiB (GB/s of the hashed bytes; ratio = the copy's time / the hash's)\n", mib);
  std::printf("%10s %7s %10s %10s %10s %8s\n", "piece", "pieces", "copy_ms", "hash_ms", "hash_GBps", "ratio");
  wsync::DeviceChecksums sums;
  for (size_t piece : {size_t{28} << 20, size_t{1} << 20, size_t{64} << 10}) {
    std::vector<ChecksumPiece> pieces;
    for (size_t at = 0; at < size; at += piece) pieces.push_back({src + at, std::min(piece, size - at)});
    std::vector<uint64_t> out(pieces.size());
    std::vector<double> c, h;
    for (int i = 0; i < iters + 1; ++i) {  // the first round warms up
      auto t0 = Clock::now();
      CUDA_OK(cudaMemcpyAsync(dst, src, size, cudaMemcpyDeviceToDevice, stream));
      CUDA_OK(cudaStreamSynchronize(stream));
      auto t1 = Clock::now();
      wsync::Status s = sums.Compute(pieces.data(), pieces.size(), out.data(), stream);
      auto t2 = Clock::now();
      if (!s.ok()) {
        std::printf("hash failed: %s\n", s.message().c_str());
        std::exit(1);
      }
      if (i == 0) continue;
      c.push_back(std::chrono::duration<double>(t1 - t0).count());
      h.push_back(std::chrono::duration<double>(t2 - t1).count());
    }
    Check(out[0] == wsync::Checksum64(Random(64u << 20, 2).data(), std::min(piece, size_t{64} << 20)),
          "the first piece's hash is the host's");
    const double cm = Median(c), hm = Median(h);
    std::printf("%10zu %7zu %10.3f %10.3f %10.1f %8.2f\n", piece, pieces.size(), cm * 1e3, hm * 1e3, size / hm / 1e9,
                cm / hm);
  }
  // The old way, once: 16 MiB pieces read back and hashed on one host core.
  std::vector<uint8_t> back(16u << 20);
  auto t0 = Clock::now();
  wsync::Checksum64Stream stream_hash;
  for (size_t at = 0; at < size; at += back.size()) {
    const size_t n = std::min(back.size(), size - at);
    CUDA_OK(cudaMemcpy(back.data(), src + at, n, cudaMemcpyDeviceToHost));
    stream_hash.Update(back.data(), n);
  }
  const uint64_t old_way = stream_hash.Final();
  const double old_s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("the host way (read back in 16 MiB pieces, hashed on one core): %.3f s, %.2f GB/s\n", old_s,
              size / old_s / 1e9);
  ChecksumPiece whole{src, size};
  uint64_t gpu_whole = 0;
  Check(sums.Compute(&whole, 1, &gpu_whole, stream).ok() && gpu_whole == old_way,
        "the whole buffer hashed on the GPU equals the host's");
  CUDA_OK(cudaFree(src));
  CUDA_OK(cudaFree(dst));
}

}  // namespace

int main(int argc, char** argv) {
  const size_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 3500;
  const int iters = argc > 2 ? std::atoi(argv[2]) : 10;
  cudaDeviceProp prop;
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  std::printf("checksum_bench on %s\n", prop.name);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  Correctness(stream);
  Speed(mib, iters, stream);
  std::printf("%s\n", failures == 0 ? "checksum_bench: ok" : "checksum_bench: FAILED");
  return failures == 0 ? 0 : 1;
}
