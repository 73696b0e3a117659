// The torch-free CUDA device (pipeline/cuda_device.h) against the CPU stages
// (box_pack.h) on a GPU, byte for byte: boxes packed with and without a cast
// (bf16 <-> fp32, pitched runs and the gather kernel), pitched copies, host
// copies in and out, and the fp8 quantize with its NaN flag. Compiles and
// links wherever CUDA is (CI); runs on a GPU machine:
//   build/tests/pipeline/cuda_device_check        (exit 0: every check equal)
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "pipeline/box_pack.h"
#include "pipeline/cuda_device.h"
#include "pipeline/fp8.h"

namespace wsync {
namespace {

int failures = 0;

void Expect(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++failures;
}

Box MakeBox(std::vector<int64_t> offset, std::vector<int64_t> size) {
  Box b;
  b.ndim = static_cast<int8_t>(size.size());
  for (size_t d = 0; d < size.size(); ++d) {
    b.offset[d] = offset[d];
    b.size[d] = size[d];
  }
  return b;
}

// Device memory filled from `host`, read back by the caller.
struct OnDevice {
  DeviceOps& dev;
  void* p = nullptr;
  OnDevice(DeviceOps& d, const std::vector<uint8_t>& host, uint64_t bytes) : dev(d) {
    p = dev.Allocate(bytes).value();
    if (!host.empty()) (void)dev.CopyFromHost(p, host.data(), host.size());
  }
  ~OnDevice() { dev.Free(p); }
  uint8_t* data() const { return static_cast<uint8_t*>(p); }
  std::vector<uint8_t> Read(uint64_t bytes) const {
    std::vector<uint8_t> out(bytes);
    std::vector<bool> nonfinite;
    (void)dev.Synchronize(&nonfinite);
    (void)dev.ReadBack(out.data(), p, bytes);
    return out;
  }
};

std::vector<uint8_t> RandomValues(DType t, int64_t n, std::mt19937& rng) {
  std::vector<uint8_t> out(static_cast<size_t>(n * DTypeSize(t)));
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int64_t i = 0; i < n; ++i) {
    float f = normal(rng);
    if (i % 97 == 0) f = 0x1.fffffep+127f * (i % 2 ? 1 : -1);  // rounds up to infinity in bf16
    if (i % 89 == 0) f = std::numeric_limits<float>::quiet_NaN();
    if (t == DType::kFP32) {
      std::memcpy(out.data() + 4 * i, &f, 4);
    } else {
      const uint16_t b = Fp32ToBf16(f);
      std::memcpy(out.data() + 2 * i, &b, 2);
    }
  }
  return out;
}

void CheckPack(DeviceOps& dev, const Box& held, const Box& box, DType from, DType to, std::mt19937& rng) {
  const std::vector<uint8_t> data = RandomValues(from, held.NumElements(), rng);
  std::vector<uint8_t> want(static_cast<size_t>(box.NumElements() * DTypeSize(to)));
  PackBox(data.data(), held, from, box, to, want.data());
  OnDevice in(dev, data, data.size());
  OnDevice out(dev, {}, want.size());
  Status s = dev.PackBox(in.data(), held, from, box, to, out.data());
  std::string what = "pack " + std::string(DTypeName(from)) + "->" + std::string(DTypeName(to)) + " box of " +
                     std::to_string(box.NumElements()) + " in " + std::to_string(held.ndim) + " dims";
  Expect(s.ok() && out.Read(want.size()) == want, what + (s.ok() ? "" : ": " + s.message()));
}

int Run() {
  StatusOr<std::unique_ptr<DeviceOps>> made = MakeCudaDevice(0);
  if (!made.ok()) {
    std::printf("FAIL %s\n", made.status().ToString().c_str());
    return 1;
  }
  DeviceOps& dev = **made;
  std::mt19937 rng(42);
  const Box held3 = MakeBox({0, 256, 0}, {6, 384, 520});
  for (DType from : {DType::kBF16, DType::kFP32}) {
    for (DType to : {DType::kBF16, DType::kFP32}) {
      CheckPack(dev, held3, MakeBox({1, 300, 8}, {4, 61, 333}), from, to, rng);   // cut in every dim
      CheckPack(dev, held3, MakeBox({2, 256, 0}, {3, 384, 520}), from, to, rng);  // whole rows
    }
  }
  CheckPack(dev, MakeBox({0, 0, 0, 0}, {3, 4, 10, 12}), MakeBox({1, 1, 2, 3}, {2, 2, 5, 7}), DType::kBF16,
            DType::kBF16, rng);  // four dims cut: the kernel, not pitched runs
  CheckPack(dev, MakeBox({0, 0, 0, 0}, {3, 4, 10, 12}), MakeBox({1, 1, 2, 3}, {2, 2, 5, 7}), DType::kFP32,
            DType::kBF16, rng);

  {  // Copy2D: rows out of a wider pitch, into another
    std::vector<uint8_t> src(64 * 1000);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 3);
    std::vector<uint8_t> want(48 * 600, 0);
    for (int r = 0; r < 48; ++r) std::memcpy(want.data() + r * 600, src.data() + r * 1000 + 17, 555);
    OnDevice in(dev, src, src.size());
    OnDevice out(dev, std::vector<uint8_t>(want.size(), 0), want.size());
    Status s = dev.Copy2D(out.data(), 600, in.data() + 17, 1000, 555, 48);
    Expect(s.ok() && out.Read(want.size()) == want, "Copy2D of 48 rows of 555 bytes");
  }
  {  // fp8 quantize: the CPU reference's codes and scales; a NaN flags only its own call
    const Box held = MakeBox({0, 0, 0}, {2, 300, 260});
    std::vector<uint8_t> x = RandomValues(DType::kBF16, held.NumElements(), rng);
    for (size_t i = 0; i < x.size() / 2; ++i) {  // finite values only for the first call
      uint16_t b;
      std::memcpy(&b, x.data() + 2 * i, 2);
      if ((b & 0x7F80) == 0x7F80) b = static_cast<uint16_t>(b & 0x807F);
      std::memcpy(x.data() + 2 * i, &b, 2);
    }
    const int64_t grid = HeldScaleGrid(held).NumElements();
    std::vector<uint8_t> q_want(static_cast<size_t>(held.NumElements()));
    std::vector<float> s_want(static_cast<size_t>(grid));
    Status cpu = QuantizeHeld(reinterpret_cast<const uint16_t*>(x.data()), held, q_want.data(), s_want.data());
    OnDevice in(dev, x, x.size());
    OnDevice q(dev, {}, q_want.size());
    OnDevice sc(dev, {}, s_want.size() * 4);
    Status s = dev.QuantizeHeld(reinterpret_cast<const uint16_t*>(in.data()), held, q.data(),
                                reinterpret_cast<float*>(sc.data()));
    std::vector<uint8_t> s_bytes(s_want.size() * 4);
    std::memcpy(s_bytes.data(), s_want.data(), s_bytes.size());
    std::vector<bool> nonfinite;
    Status sync = dev.Synchronize(&nonfinite);
    Expect(cpu.ok() && s.ok() && sync.ok() && nonfinite == std::vector<bool>{false} &&
               q.Read(q_want.size()) == q_want && sc.Read(s_bytes.size()) == s_bytes,
           "fp8 quantize of 2 x [300, 260]: codes and scales equal the CPU reference, no NaN flag");
    std::vector<uint8_t> nan = x;
    const uint16_t qnan = 0x7FC0;
    std::memcpy(nan.data() + 2 * 1000, &qnan, 2);
    OnDevice in2(dev, nan, nan.size());
    Status a = dev.QuantizeHeld(reinterpret_cast<const uint16_t*>(in.data()), held, q.data(),
                                reinterpret_cast<float*>(sc.data()));
    Status b = dev.QuantizeHeld(reinterpret_cast<const uint16_t*>(in2.data()), held, q.data(),
                                reinterpret_cast<float*>(sc.data()));
    sync = dev.Synchronize(&nonfinite);
    Expect(a.ok() && b.ok() && sync.ok() && nonfinite == std::vector<bool>{false, true},
           "a NaN flags its own quantize only");
    a = dev.QuantizeHeld(reinterpret_cast<const uint16_t*>(in.data()), held, q.data(),
                         reinterpret_cast<float*>(sc.data()));
    sync = dev.Synchronize(&nonfinite);
    Expect(a.ok() && sync.ok() && nonfinite == std::vector<bool>{false}, "the flag is cleared after it was read");
  }
  {  // host staging: CopyToHost into pinned memory, settled by Synchronize
    std::vector<uint8_t> src(1 << 20);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 13 + 1);
    OnDevice in(dev, src, src.size());
    void* pinned = dev.AllocateHost(src.size()).value();
    Status s = dev.CopyToHost(pinned, in.data(), src.size());
    std::vector<bool> nonfinite;
    Status sync = dev.Synchronize(&nonfinite);
    Expect(s.ok() && sync.ok() && std::memcmp(pinned, src.data(), src.size()) == 0,
           "CopyToHost of 1 MiB into pinned memory");
    dev.FreeHost(pinned);
    Expect(dev.CanRead(in.data()) && !dev.CanRead(src.data()), "CanRead: device memory yes, pageable host no");
  }
  std::printf("%s: %d failed\n", failures == 0 ? "PASS" : "FAIL", failures);
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace wsync

int main() { return wsync::Run(); }
