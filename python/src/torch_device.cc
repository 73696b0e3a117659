#include "python/src/torch_device.h"

#include <ATen/ATen.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <sys/mman.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <unordered_map>

#ifdef WSYNC_FP8_CUDA
#include <c10/cuda/CUDAStream.h>

#include "common/checksum_cuda.h"
#include "delta/codec_cuda.h"
#include "pipeline/box_pack.h"
#include "pipeline/fp8_cuda.h"
#endif

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
  TorchCudaDevice(int ordinal, c10::Stream stream, bool host_shards)
      : ordinal_(ordinal),
        device_(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(ordinal)),
        stream_(stream),
        host_shards_(host_shards) {}

  std::string name() const override { return "cuda:" + std::to_string(ordinal_); }
  transport::MemoryKind kind() const override { return transport::MemoryKind::kCuda; }
  int ordinal() const override { return ordinal_; }

  StatusOr<void*> Allocate(uint64_t bytes) override {
    return Run("allocate", [&] { return Keep(&owned_, at::empty({static_cast<int64_t>(bytes)}, Options(at::kByte))); });
  }
  void Free(void* p) override { Forget(&owned_, p); }
  // Whether `p` lies in memory Allocate handed out (the arena), as opposed
  // to the trainer's shards.
  bool Owns(const void* p) {
    const auto* b = static_cast<const uint8_t*>(p);
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [start, t] : owned_) {
      const auto* s = static_cast<const uint8_t*>(start);
      if (b >= s && b < s + t.numel()) return true;
    }
    return false;
  }

  // The executor copies only out of the trainer's shards. Offloaded ones
  // (host_shards) come host-to-device, asynchronously from pinned memory
  // (FSDP2's CPUOffloadPolicy pins by default), a blocking copy otherwise.
  Status Copy(void* dst, const void* src, uint64_t bytes) override {
    return Run("copy", [&] {
      at::Tensor from = host_shards_ ? at::from_blob(const_cast<void*>(src), {static_cast<int64_t>(bytes)},
                                                     at::TensorOptions().dtype(at::kByte).device(at::kCPU))
                                     : Bytes(const_cast<void*>(src), bytes);
      Bytes(dst, bytes).copy_(from, /*non_blocking=*/true);
      return nullptr;
    }).status();
  }
  // One strided copy: the source as a [rows, width] view with its pitch,
  // from the host (an offloaded shard) or the device, into the device.
  Status Copy2D(void* dst, uint64_t dst_pitch, const void* src, uint64_t src_pitch, uint64_t width,
                uint64_t rows) override {
    return Run("copy", [&] {
      const std::vector<int64_t> sizes = {static_cast<int64_t>(rows), static_cast<int64_t>(width)};
      at::Tensor from = at::from_blob(const_cast<void*>(src), sizes, {static_cast<int64_t>(src_pitch), 1},
                                      host_shards_ && !Owns(src)
                                          ? at::TensorOptions().dtype(at::kByte).device(at::kCPU)
                                          : Options(at::kByte));
      at::from_blob(dst, sizes, {static_cast<int64_t>(dst_pitch), 1}, Options(at::kByte))
          .copy_(from, /*non_blocking=*/true);
      return nullptr;
    }).status();
  }
  Status Zero(void* dst, uint64_t bytes) override {
    return Run("zero", [&] {
      Bytes(dst, bytes).zero_();
      return nullptr;
    }).status();
  }

  bool CanRead(const void* p) override {
#ifdef WSYNC_FP8_CUDA
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      (void)cudaGetLastError();  // not a pointer CUDA knows: plain host memory
      return false;
    }
    return a.type == cudaMemoryTypeDevice && a.device == ordinal_;
#else
    (void)p;
    return false;
#endif
  }

  Status PackBox(const uint8_t* data, const Box& held, DType from, const Box& box, DType to, uint8_t* out) override {
#ifdef WSYNC_FP8_CUDA
    // Without a cast a box is a pitched 2D copy per plane: one driver call,
    // no ATen dispatch (a source of a TP row shard has hundreds of them).
    PitchedRuns r;
    if (from == to && AsPitchedRuns(box, held, &r)) {
      const size_t e = DTypeSize(from);
      const cudaStream_t stream = c10::cuda::CUDAStream(stream_).stream();
      for (int64_t p = 0; p < r.planes; ++p) {
        const uint8_t* src = data + (r.first + p * r.plane_pitch) * e;
        uint8_t* dst = out + p * r.rows * r.run * e;
        const cudaError_t err = cudaMemcpy2DAsync(dst, r.run * e, src, (r.rows > 1 ? r.pitch : r.run) * e, r.run * e,
                                                  r.rows, cudaMemcpyDeviceToDevice, stream);
        if (err != cudaSuccess) return Internal(name() + ": pack: " + cudaGetErrorString(err));
      }
      return Status::Ok();
    }
#endif
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
#ifdef WSYNC_FP8_CUDA
    if (!kernel_agrees_.has_value()) kernel_agrees_ = KernelAgreesWithReference();
    if (*kernel_agrees_) return KernelQuantize(data, held, q, scales);
#endif
    Status s = AtenQuantize(data, held, q, scales);  // checks for NaN/Inf itself
    if (s.ok()) issued_.push_back(-1);
    return s;
  }

#ifdef WSYNC_FP8_CUDA
  // pipeline/fp8_cuda.cu: one pass, no temporaries (the watermark bounds all
  // the memory it touches). A NaN or an infinity raises this call's flag on
  // the device, which the next Synchronize reads back with the stream's own
  // work; the executor calls it before posting any write of the source.
  Status KernelQuantize(const uint16_t* data, const Box& held, uint8_t* q, float* scales) {
    return Run("fp8 quantize", [&]() -> void* {
      const int n = held.ndim;
      int64_t batch = 1;
      for (int d = 0; d + 2 < n; ++d) batch *= held.size[d];
      if (!nonfinite_.defined()) {
        nonfinite_ = at::zeros({kFlagSlots}, Options(at::kInt));
        flags_host_ = at::empty({kFlagSlots}, at::TensorOptions().dtype(at::kInt).pinned_memory(true));
      }
      if (slots_ == kFlagSlots) {
        throw std::runtime_error("more than " + std::to_string(kFlagSlots) + " quantizes between two synchronizes");
      }
      const cudaError_t e = QuantizeFp8BlocksCuda(data, batch, held.size[n - 2], held.size[n - 1], q, scales,
                                                  c10::cuda::CUDAStream(stream_).stream(),
                                                  nonfinite_.data_ptr<int>() + slots_);
      if (e != cudaSuccess) throw std::runtime_error(std::string("kernel launch: ") + cudaGetErrorString(e));
      issued_.push_back(slots_++);
      return nullptr;
    }).status();
  }

  // Once per device, before the kernel quantizes any weight: the kernel on
  // this GPU against pipeline/fp8.h's CPU reference, byte for byte
  // (fp8_cuda.h). Should they differ (a GPU or toolkit the kernel was never
  // checked on), the slower ATen ops quantize instead, and the log says so
  // once.
  bool KernelAgreesWithReference() {
    std::string why;
    StatusOr<void*> r = Run("fp8 kernel check", [&]() -> void* {
      why = Fp8KernelDisagreement(c10::cuda::CUDAStream(stream_).stream());
      return nullptr;
    });
    if (!r.ok()) why = r.status().message();
    if (why.empty()) return true;
    std::fprintf(stderr, "wsync %s: the fp8 quantize kernel disagrees with the CPU reference on this GPU (%s); "
                 "quantizing with ATen ops instead (slower, and their temporaries are not bounded by the watermark)\n",
                 name().c_str(), why.c_str());
    return false;
  }
#endif

  Status AtenQuantize(const uint16_t* data, const Box& held, uint8_t* q, float* scales) {
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

  Status Synchronize(std::vector<bool>* nonfinite) override {
    nonfinite->assign(issued_.size(), false);
    Status r = Run("synchronize", [&]() -> void* {
      const int used = slots_;
      slots_ = 0;
#ifdef WSYNC_FP8_CUDA
      if (used > 0) {
        // The flags come back with the stream's own work: one wait, not a
        // wait and then a device-to-host read.
        const cudaStream_t stream = c10::cuda::CUDAStream(stream_).stream();
        cudaError_t e = cudaMemcpyAsync(flags_host_.data_ptr<int>(), nonfinite_.data_ptr<int>(), used * sizeof(int),
                                        cudaMemcpyDeviceToHost, stream);
        if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
        if (e != cudaSuccess) throw std::runtime_error(std::string("stream: ") + cudaGetErrorString(e));
        bool any = false;
        for (size_t i = 0; i < issued_.size(); ++i) {
          const bool flagged = issued_[i] >= 0 && flags_host_.data_ptr<int>()[issued_[i]] != 0;
          (*nonfinite)[i] = flagged;
          any = any || flagged;
        }
        if (any) nonfinite_.zero_();
        CollectChecksums(stream);
        return nullptr;
      }
#endif
      (void)used;
      stream_.synchronize();
#ifdef WSYNC_FP8_CUDA
      CollectChecksums(c10::cuda::CUDAStream(stream_).stream());
#endif
      return nullptr;
    }).status();
    issued_.clear();
    return r;
  }

#ifdef WSYNC_FP8_CUDA
  // By common/checksum_cuda.h's kernels on the executor's stream, read at
  // the next Synchronize.
  Status Checksums(const ChecksumPiece* pieces, size_t count, uint64_t* hashes) override {
    return Run("checksums", [&]() -> void* {
      Status s = checksums_.Enqueue(pieces, count, hashes, c10::cuda::CUDAStream(stream_).stream());
      if (!s.ok()) throw std::runtime_error(s.message());
      return nullptr;
    }).status();
  }

  // delta/codec_cuda.h's kernels on the executor's stream, after the stages
  // issued before; they wait for the stream themselves (the delta's length
  // comes back to the host).
  bool EncodesDeltas() const override { return true; }
  StatusOr<delta::Encoded> EncodeDelta(uint8_t* base, const uint8_t* next, uint64_t size, uint32_t elem_bytes,
                                       uint8_t* out, uint64_t capacity) override {
    StatusOr<delta::Encoded> e = Internal("unreached");
    Status ran = Run("delta encode", [&]() -> void* {
      e = delta::EncodeAndAdvanceCuda(base, next, size, elem_bytes, out, capacity, delta_ws_,
                                      c10::cuda::CUDAStream(stream_).stream());
      return nullptr;
    }).status();
    if (!ran.ok()) return ran;
    return e;
  }
#endif

  // Host staging: pinned memory of exactly the arena's size, copied into on
  // the stream.
  StatusOr<void*> AllocateHost(uint64_t bytes) override {
    WSYNC_ASSIGN_OR_RETURN(std::unique_ptr<PinnedHostMemory> m, PinnedHostMemory::Allocate(bytes));
    void* p = m->data();
    std::lock_guard<std::mutex> lock(mu_);
    pinned_.emplace(p, std::move(m));
    return p;
  }
  void FreeHost(void* p) override {
    std::lock_guard<std::mutex> lock(mu_);
    pinned_.erase(p);
  }
  Status CopyToHost(void* host, const void* src, uint64_t bytes) override {
    return Run("copy to host staging", [&] {
      at::from_blob(host, {static_cast<int64_t>(bytes)}, at::TensorOptions().dtype(at::kByte).device(at::kCPU))
          .copy_(Bytes(const_cast<void*>(src), bytes), /*non_blocking=*/true);
      return nullptr;
    }).status();
  }

  Status CopyFromHost(void* dst, const void* host, uint64_t bytes) override {
    return Run("copy from host", [&] {
      Bytes(dst, bytes).copy_(at::from_blob(const_cast<void*>(host), {static_cast<int64_t>(bytes)},
                                            at::TensorOptions().dtype(at::kByte).device(at::kCPU)));
      stream_.synchronize();  // blocking: `host` may be reused on return
      return nullptr;
    }).status();
  }

  Status ReadBack(void* host, const void* src, uint64_t bytes) override {
    return Run("read back", [&] {
      at::from_blob(host, {static_cast<int64_t>(bytes)}, at::TensorOptions().dtype(at::kByte))
          .copy_(Bytes(const_cast<void*>(src), bytes));  // blocking: the bytes are on the host on return
      return nullptr;
    }).status();
  }

 private:
  // Keeps `t` alive until Forget(its data pointer).
  void* Keep(std::unordered_map<void*, at::Tensor>* into, at::Tensor t) {
    void* p = t.data_ptr();
    std::lock_guard<std::mutex> lock(mu_);
    into->emplace(p, std::move(t));
    return p;
  }
  void Forget(std::unordered_map<void*, at::Tensor>* from, void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    from->erase(p);
  }
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
  const bool host_shards_;  // the shards the executor copies from are in host memory
  std::mutex mu_;
  std::unordered_map<void*, at::Tensor> owned_;   // arena allocations, kept alive
  std::unordered_map<void*, std::unique_ptr<PinnedHostMemory>> pinned_;  // host staging
  // Per kernel quantize since the last Synchronize, one int32 slot on the
  // device that it sets on a NaN/Inf; the pinned copy is what Synchronize
  // read back.
  static constexpr int kFlagSlots = 64;
  at::Tensor nonfinite_;
  at::Tensor flags_host_;
  int slots_ = 0;
  std::vector<int> issued_;  // per OK QuantizeHeld since the last Synchronize: its slot, -1 for ATen's
  std::optional<bool> kernel_agrees_;  // the fp8 kernel's check, once
#ifdef WSYNC_FP8_CUDA
  void CollectChecksums(cudaStream_t stream) {
    Status s = checksums_.Collect(stream);
    if (!s.ok()) throw std::runtime_error(s.message());
  }
  DeviceChecksums checksums_;
  delta::CudaWorkspace delta_ws_;  // this device's memory, reused by every encode
#endif
};

}  // namespace

StatusOr<std::unique_ptr<PinnedHostMemory>> PinnedHostMemory::Allocate(uint64_t bytes) {
  std::unique_ptr<PinnedHostMemory> m(new PinnedHostMemory);
  const uint64_t page = 4096;
  m->mapped_ = (std::max<uint64_t>(bytes, 1) + page - 1) / page * page;
#ifdef WSYNC_FP8_CUDA
  void* p = mmap(nullptr, m->mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return Internal("pinned host memory: mmap of " + std::to_string(m->mapped_) + " bytes: " + std::strerror(errno));
  }
  const cudaError_t e = cudaHostRegister(p, m->mapped_, cudaHostRegisterDefault);
  if (e != cudaSuccess) {
    munmap(p, m->mapped_);
    return Internal("pinned host memory: cudaHostRegister of " + std::to_string(m->mapped_) + " bytes: " +
                    cudaGetErrorString(e));
  }
  m->data_ = static_cast<uint8_t*>(p);
#else
  try {
    auto t = std::make_shared<at::Tensor>(
        at::empty({static_cast<int64_t>(m->mapped_)}, at::TensorOptions().dtype(at::kByte).pinned_memory(true)));
    m->data_ = static_cast<uint8_t*>(t->data_ptr());
    m->keep_ = std::move(t);
  } catch (const std::exception& e) {
    std::string msg = e.what();
    msg.resize(std::min(msg.size(), msg.find('\n')));
    return Internal("pinned host memory of " + std::to_string(m->mapped_) + " bytes: " + msg);
  }
#endif
  return m;
}

PinnedHostMemory::~PinnedHostMemory() {
#ifdef WSYNC_FP8_CUDA
  if (data_ != nullptr) {
    (void)cudaHostUnregister(data_);
    munmap(data_, mapped_);
  }
#endif
}

StatusOr<std::unique_ptr<DeviceOps>> MakeTorchCudaDevice(int ordinal, bool host_shards) {
  try {
    c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
    if (ordinal < 0 || ordinal >= impl.deviceCount()) {
      return InvalidArgument("cuda:" + std::to_string(ordinal) + ": this process sees " +
                             std::to_string(impl.deviceCount()) + " CUDA devices");
    }
    c10::Stream stream = impl.getStreamFromGlobalPool(c10::Device(c10::DeviceType::CUDA, ordinal));
    return std::unique_ptr<DeviceOps>(new TorchCudaDevice(ordinal, stream, host_shards));
  } catch (const std::exception& e) {
    std::string m = e.what();
    const size_t nl = m.find('\n');
    if (nl != std::string::npos) m.resize(nl);
    return Unavailable("cuda:" + std::to_string(ordinal) + ": torch cannot use CUDA here: " + m);
  }
}

}  // namespace wsync::python
