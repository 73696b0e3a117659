#include "python/src/torch_device.h"

#include <ATen/ATen.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <exception>
#include <mutex>
#include <unordered_map>

namespace wsync::python {
namespace {

constexpr double kFp8Max = 448.0;  // largest finite float8_e4m3fn
constexpr int64_t kBlock = 128;

at::ScalarType Aten(DType t) {
  switch (t) {
    case DType::kBF16: return at::kBFloat16;
    case DType::kFP16: return at::kHalf;
    case DType::kFP32: return at::kFloat;
    case DType::kFP8E4M3: return at::kFloat8_e4m3fn;
  }
  return at::kByte;
}

std::vector<int64_t> Sizes(const Box& b) { return std::vector<int64_t>(b.size.begin(), b.size.begin() + b.ndim); }

class TorchCudaDevice : public DeviceOps {
 public:
  TorchCudaDevice(int ordinal, c10::Stream stream)
      : ordinal_(ordinal), device_(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(ordinal)), stream_(stream) {}

  std::string name() const override { return "cuda:" + std::to_string(ordinal_); }
  transport::MemoryKind kind() const override { return transport::MemoryKind::kCuda; }
  int ordinal() const override { return ordinal_; }

  StatusOr<void*> Allocate(uint64_t bytes) override {
    return Run("allocate", [&]() -> void* {
      at::Tensor t = at::empty({static_cast<int64_t>(bytes)}, at::TensorOptions().dtype(at::kByte).device(device_));
      void* p = t.data_ptr();
      std::lock_guard<std::mutex> lock(mu_);
      owned_.emplace(p, std::move(t));
      return p;
    });
  }
  void Free(void* p) override {
    std::lock_guard<std::mutex> lock(mu_);
    owned_.erase(p);
  }

  Status Copy(void* dst, const void* src, uint64_t bytes) override {
    // Shards offloaded to pinned host memory are read through unified
    // addressing, like device memory.
    return Run("copy", [&] {
      Bytes(dst, bytes).copy_(Bytes(const_cast<void*>(src), bytes), /*non_blocking=*/true);
      return nullptr;
    }).status();
  }
  Status Zero(void* dst, uint64_t bytes) override {
    return Run("zero", [&] {
      Bytes(dst, bytes).zero_();
      return nullptr;
    }).status();
  }

  Status PackBox(const uint8_t* data, const Box& held, DType from, const Box& box, DType to, uint8_t* out) override {
    return Run("pack", [&] {
      at::Tensor t = View(const_cast<uint8_t*>(data), held, from);
      for (int d = 0; d < box.ndim; ++d) t = t.narrow(d, box.offset[d] - held.offset[d], box.size[d]);
      View(out, Box{box.ndim, {}, box.size}, to).copy_(t, /*non_blocking=*/true);
      return nullptr;
    }).status();
  }

  // The DeepSeek-V3 block format (docs/SCHEMA.md), as pipeline/fp8.h's
  // reference computes it: scale = amax/448 (1 for an all-zero block),
  // q = x / scale in fp32, clamped to +-448, rounded to nearest even.
  Status QuantizeHeld(const uint16_t* data, const Box& held, uint8_t* q, float* scales) override {
    StatusOr<void*> r = Run("fp8 quantize", [&]() -> void* {
      const int n = held.ndim;
      const int64_t rows = held.size[n - 2], cols = held.size[n - 1];
      const int64_t nr = (rows + kBlock - 1) / kBlock, nc = (cols + kBlock - 1) / kBlock;
      std::vector<int64_t> lead(held.size.begin(), held.size.begin() + n - 2);
      at::Tensor x = View(const_cast<uint16_t*>(data), held, DType::kBF16).to(at::kFloat);
      if (!at::isfinite(x).all().item<bool>()) return reinterpret_cast<void*>(1);
      at::Tensor padded = at::constant_pad_nd(x, {0, nc * kBlock - cols, 0, nr * kBlock - rows});
      std::vector<int64_t> blocked = lead;
      for (int64_t s : {nr, kBlock, nc, kBlock}) blocked.push_back(s);
      at::Tensor blocks = padded.reshape(blocked);
      at::Tensor amax = blocks.abs().amax({-3, -1});
      // Divide by a tensor, never by a scalar: ATen's CUDA division by a
      // scalar multiplies by its reciprocal, which rounds differently from
      // the IEEE division the format (and the CPU reference) uses.
      at::Tensor scale = at::where(amax == 0, at::ones_like(amax), amax / at::full_like(amax, kFp8Max));
      std::vector<int64_t> grid = lead;
      grid.push_back(nr);
      grid.push_back(nc);
      at::from_blob(scales, grid, Options(at::kFloat)).copy_(scale, /*non_blocking=*/true);
      at::Tensor scaled = (blocks / scale.unsqueeze(-1).unsqueeze(-3)).clamp(-kFp8Max, kFp8Max);
      std::vector<int64_t> full = lead;
      full.push_back(nr * kBlock);
      full.push_back(nc * kBlock);
      at::Tensor fp8 = scaled.reshape(full).narrow(-2, 0, rows).narrow(-1, 0, cols).to(at::kFloat8_e4m3fn);
      View(q, held, DType::kFP8E4M3).copy_(fp8, /*non_blocking=*/true);
      return nullptr;
    });
    if (!r.ok()) return r.status();
    if (*r != nullptr) return InvalidArgument("NaN or infinite weight: not quantized (never sent)");
    return Status::Ok();
  }

  Status Synchronize() override {
    return Run("synchronize", [&] {
      stream_.synchronize();
      return nullptr;
    }).status();
  }

 private:
  at::TensorOptions Options(at::ScalarType t) const { return at::TensorOptions().dtype(t).device(device_); }
  at::Tensor Bytes(void* p, uint64_t n) const { return at::from_blob(p, {static_cast<int64_t>(n)}, Options(at::kByte)); }
  at::Tensor View(void* p, const Box& b, DType t) const { return at::from_blob(p, Sizes(b), Options(Aten(t))); }

  // Runs `fn` with the executor's stream current; a torch error becomes one
  // Status line naming the device and the stage.
  template <typename Fn>
  StatusOr<void*> Run(const char* what, Fn&& fn) {
    try {
      c10::StreamGuard guard(stream_);
      return static_cast<void*>(fn());
    } catch (const std::exception& e) {
      std::string m = e.what();
      const size_t nl = m.find('\n');
      if (nl != std::string::npos) m.resize(nl);
      return Internal(name() + ": " + what + ": " + m);
    }
  }

  int ordinal_;
  c10::Device device_;
  c10::Stream stream_;
  std::mutex mu_;
  std::unordered_map<void*, at::Tensor> owned_;  // arena allocations, kept alive
};

}  // namespace

StatusOr<std::unique_ptr<DeviceOps>> MakeTorchCudaDevice(int ordinal) {
  try {
    c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
    if (ordinal < 0 || ordinal >= impl.deviceCount()) {
      return InvalidArgument("cuda:" + std::to_string(ordinal) + ": this process sees " +
                             std::to_string(impl.deviceCount()) + " CUDA devices");
    }
    c10::Stream stream = impl.getStreamFromGlobalPool(c10::Device(c10::DeviceType::CUDA, ordinal));
    return std::unique_ptr<DeviceOps>(new TorchCudaDevice(ordinal, stream));
  } catch (const std::exception& e) {
    std::string m = e.what();
    const size_t nl = m.find('\n');
    if (nl != std::string::npos) m.resize(nl);
    return Unavailable("cuda:" + std::to_string(ordinal) + ": torch cannot use CUDA here: " + m);
  }
}

}  // namespace wsync::python
