// The CPU delta codec's speed beside memcpy of the same bytes, measured in
// the same run (one core), at the change rates measured per AdamW step
// (docs/DELTAS.md).
//
//   build/tests/delta/delta_bench [mib=256] [iters=5]
//
// GB/s of the region's bytes for EncodeAndAdvance (find the changes, write
// the delta, advance the copy) and Apply (check, then scatter), medians;
// ratio = memcpy's time / ours. Each run's applied bytes are compared with
// the new version's.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "delta/codec.h"

namespace {

using Bytes = std::vector<uint8_t>;
using Clock = std::chrono::steady_clock;

uint64_t state = 88172645463325252ull;
uint64_t Next64() {
  state ^= state << 13;
  state ^= state >> 7;
  state ^= state << 17;
  return state;
}

Bytes Changed(const Bytes& held, uint32_t e, double rate) {
  Bytes next = held;
  const size_t elements = held.size() / e;
  for (size_t j = 0; j < static_cast<size_t>(rate * static_cast<double>(elements)); ++j) {
    next[(Next64() % elements) * e + Next64() % e] ^= static_cast<uint8_t>(1 + Next64() % 255);
  }
  return next;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

}  // namespace

int main(int argc, char** argv) {
  const size_t size = (argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 256) << 20;
  const int iters = argc > 2 ? std::atoi(argv[2]) : 5;
  Bytes held(size);
  for (size_t i = 0; i < size; i += 8) {
    const uint64_t r = Next64();
    std::memcpy(&held[i], &r, 8);
  }
  std::printf("delta_bench: CPU codec, one core, over %zu MiB (GB/s of the region's bytes; ratio = memcpy's time / ours)\n",
              size >> 20);
  std::printf("%-5s %8s %7s %8s %8s %8s %8s %8s\n", "elem", "changed", "delta", "memcpy", "encode", "apply", "enc/cpy",
              "app/cpy");
  int bad = 0;
  for (auto [e, rate] : {std::pair{1u, 0.004}, std::pair{1u, 0.029}, std::pair{2u, 0.034}, std::pair{2u, 0.2}}) {
    const Bytes next = Changed(held, e, rate);
    Bytes copy(size), dst(size), delta(size / 2), target(size);
    std::vector<double> cp, en, ap;
    uint64_t bytes = 0;
    for (int i = 0; i < iters; ++i) {
      copy = held;
      target = held;
      const auto t0 = Clock::now();
      std::memcpy(dst.data(), next.data(), size);
      const auto t1 = Clock::now();
      auto r = wsync::delta::EncodeAndAdvance(copy.data(), next.data(), size, e, delta.data(), delta.size());
      const auto t2 = Clock::now();
      if (!r.ok() || !r->fits) {
        std::printf("encode: %s\n", r.ok() ? "does not fit" : r.status().message().c_str());
        return 1;
      }
      wsync::Status st = wsync::delta::Apply(delta.data(), r->bytes, target.data(), size, "bench");
      const auto t3 = Clock::now();
      if (!st.ok()) {
        std::printf("apply: %s\n", st.message().c_str());
        return 1;
      }
      bytes = r->bytes;
      cp.push_back(Seconds(t0, t1));
      en.push_back(Seconds(t1, t2));
      ap.push_back(Seconds(t2, t3));
    }
    bad += target != next || copy != next;
    const double c = Median(cp), x = Median(en), a = Median(ap);
    std::printf("%-5u %7.2f%% %6.2f%% %8.2f %8.2f %8.2f %8.2f %8.2f\n", e, 100 * rate,
                100.0 * static_cast<double>(bytes) / static_cast<double>(size), size / c / 1e9, size / x / 1e9,
                size / a / 1e9, c / x, c / a);
  }
  std::printf("%s\n", bad == 0 ? "delta_bench: every applied region equals its new version" : "delta_bench: MISMATCH");
  return bad == 0 ? 0 : 1;
}
