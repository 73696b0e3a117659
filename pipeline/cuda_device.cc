#include "pipeline/cuda_device.h"

#include <cuda_runtime.h>

#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/checksum_cuda.h"
#include "delta/codec_cuda.h"
#include "pipeline/box_pack.h"
#include "pipeline/box_pack_cuda.h"
#include "pipeline/fp8_cuda.h"

namespace wsync {
namespace {

std::string CudaError(cudaError_t e) { return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e); }

class CudaDevice : public DeviceOps {
 public:
  static StatusOr<std::unique_ptr<DeviceOps>> Create(int ordinal) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return Unavailable("cuda:" + std::to_string(ordinal) + ": the CUDA runtime finds no usable GPU: " +
                         CudaError(e));
    }
    if (ordinal < 0 || ordinal >= count) {
      return InvalidArgument("cuda:" + std::to_string(ordinal) + ": this process sees " + std::to_string(count) +
                             " CUDA devices");
    }
    std::unique_ptr<CudaDevice> d(new CudaDevice(ordinal));
    e = cudaSetDevice(ordinal);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&d->stream_, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaMalloc(reinterpret_cast<void**>(&d->flags_), kFlagSlots * sizeof(int));
    if (e == cudaSuccess) e = cudaMemset(d->flags_, 0, kFlagSlots * sizeof(int));
    if (e == cudaSuccess) e = cudaMallocHost(reinterpret_cast<void**>(&d->flags_host_), kFlagSlots * sizeof(int));
    if (e != cudaSuccess) return Unavailable(d->name() + ": setting up its stream: " + CudaError(e));
    return std::unique_ptr<DeviceOps>(std::move(d));
  }

  ~CudaDevice() override {
    if (cudaSetDevice(ordinal_) != cudaSuccess) return;
    if (stream_ != nullptr) {
      (void)cudaStreamSynchronize(stream_);
      (void)cudaStreamDestroy(stream_);
    }
    if (flags_ != nullptr) (void)cudaFree(flags_);
    if (flags_host_ != nullptr) (void)cudaFreeHost(flags_host_);
  }

  std::string name() const override { return "cuda:" + std::to_string(ordinal_); }
  transport::MemoryKind kind() const override { return transport::MemoryKind::kCuda; }
  int ordinal() const override { return ordinal_; }

  StatusOr<void*> Allocate(uint64_t bytes) override {
    void* p = nullptr;
    WSYNC_RETURN_IF_ERROR(Check("allocate " + std::to_string(bytes) + " bytes", [&] { return cudaMalloc(&p, bytes); }));
    return p;
  }
  void Free(void* p) override {
    if (cudaSetDevice(ordinal_) == cudaSuccess) (void)cudaFree(p);
  }

  // cudaMemcpyDefault: the shards may be this device's memory, another
  // process's opened by IPC, or host memory.
  Status Copy(void* dst, const void* src, uint64_t bytes) override {
    return Check("copy", [&] { return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_); });
  }
  Status Zero(void* dst, uint64_t bytes) override {
    return Check("zero", [&] { return cudaMemsetAsync(dst, 0, bytes, stream_); });
  }
  Status Copy2D(void* dst, uint64_t dst_pitch, const void* src, uint64_t src_pitch, uint64_t width,
                uint64_t rows) override {
    return Check("copy", [&] {
      return cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDefault, stream_);
    });
  }

  Status PackBox(const uint8_t* data, const Box& held, DType from, const Box& box, DType to, uint8_t* out) override {
    // Without a cast a box is a pitched 2D copy per plane: one driver call,
    // no kernel (a source of a TP row shard has hundreds of them).
    PitchedRuns r;
    if (from == to && AsPitchedRuns(box, held, &r)) {
      const size_t e = DTypeSize(from);
      return Check("pack", [&] {
        cudaError_t err = cudaSuccess;
        for (int64_t p = 0; p < r.planes && err == cudaSuccess; ++p) {
          const uint8_t* src = data + (r.first + p * r.plane_pitch) * e;
          uint8_t* dst = out + p * r.rows * r.run * e;
          err = cudaMemcpy2DAsync(dst, r.run * e, src, (r.rows > 1 ? r.pitch : r.run) * e, r.run * e, r.rows,
                                  cudaMemcpyDeviceToDevice, stream_);
        }
        return err;
      });
    }
    if (!CanCast(from, to) || box.ndim > kPackMaxDims) {
      return InvalidArgument(name() + ": pack: no cast from " + std::string(DTypeName(from)) + " to " +
                             std::string(DTypeName(to)));
    }
    PackGeometry g;
    g.ndim = box.ndim;
    int64_t stride = 1;
    for (int d = held.ndim - 1; d >= 0; --d) {
      g.held_stride[d] = stride;
      stride *= held.size[d];
    }
    for (int d = 0; d < box.ndim; ++d) {
      g.size[d] = box.size[d];
      g.first += (box.offset[d] - held.offset[d]) * g.held_stride[d];
    }
    return Check("pack", [&] {
      return PackBoxCuda(data, g, static_cast<int>(DTypeSize(from)), static_cast<int>(DTypeSize(to)), out, stream_);
    });
  }

  bool CanRead(const void* p) override {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      (void)cudaGetLastError();  // not a pointer CUDA knows: plain host memory
      return false;
    }
    return (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged) && a.device == ordinal_;
  }

  // pipeline/fp8_cuda.cu: one pass, no temporaries. A NaN or an infinity
  // raises this call's flag on the device, which the next Synchronize reads
  // back with the stream's own work.
  Status QuantizeHeld(const uint16_t* data, const Box& held, uint8_t* q, float* scales) override {
    if (!kernel_check_.has_value()) {
      WSYNC_RETURN_IF_ERROR(Check("fp8 kernel check", [] { return cudaSuccess; }));  // selects the device
      kernel_check_ = Fp8KernelDisagreement(stream_);
    }
    if (!kernel_check_->empty()) {
      return FailedPrecondition(name() + ": the fp8 quantize kernel disagrees with the CPU reference on this GPU (" +
                                *kernel_check_ + "); nothing is quantized, rather than send other bytes");
    }
    if (slots_ == kFlagSlots) {
      return Internal(name() + ": more than " + std::to_string(kFlagSlots) + " quantizes between two synchronizes");
    }
    const int n = held.ndim;
    int64_t batch = 1;
    for (int d = 0; d + 2 < n; ++d) batch *= held.size[d];
    WSYNC_RETURN_IF_ERROR(Check("fp8 quantize", [&] {
      return QuantizeFp8BlocksCuda(data, batch, held.size[n - 2], held.size[n - 1], q, scales, stream_,
                                   flags_ + slots_);
    }));
    ++slots_;
    return Status::Ok();
  }

  Status Synchronize(std::vector<bool>* nonfinite) override {
    const int used = slots_;
    slots_ = 0;
    nonfinite->assign(static_cast<size_t>(used), false);
    Status s = Check("synchronize", [&] {
      cudaError_t e = cudaSuccess;
      if (used > 0) {
        e = cudaMemcpyAsync(flags_host_, flags_, used * sizeof(int), cudaMemcpyDeviceToHost, stream_);
      }
      if (e == cudaSuccess) e = cudaStreamSynchronize(stream_);
      return e;
    });
    if (!s.ok()) return s;
    Status c = checksums_.Collect(stream_);  // the stream has finished: fills the hashes queued
    if (!c.ok()) return c.WithContext(name());
    bool any = false;
    for (int i = 0; i < used; ++i) {
      (*nonfinite)[static_cast<size_t>(i)] = flags_host_[i] != 0;
      any = any || flags_host_[i] != 0;
    }
    if (any) return Check("synchronize", [&] { return cudaMemsetAsync(flags_, 0, used * sizeof(int), stream_); });
    return Status::Ok();
  }

  // By common/checksum_cuda.h's kernels on the stream, read at the next
  // Synchronize.
  Status Checksums(const ChecksumPiece* pieces, size_t count, uint64_t* hashes) override {
    WSYNC_RETURN_IF_ERROR(Check("checksums", [] { return cudaSuccess; }));  // this device current
    Status s = checksums_.Enqueue(pieces, count, hashes, stream_);
    return s.ok() ? s : s.WithContext(name());
  }

  // delta/codec_cuda.h's kernels on the stream, after the stages issued
  // before; they wait for the stream themselves (the delta's length comes
  // back to the host).
  bool EncodesDeltas() const override { return true; }
  StatusOr<delta::Encoded> EncodeDelta(uint8_t* base, const uint8_t* next, uint64_t size, uint32_t elem_bytes,
                                       uint8_t* out, uint64_t capacity) override {
    WSYNC_RETURN_IF_ERROR(Check("delta encode", [] { return cudaSuccess; }));  // this device current
    return delta::EncodeAndAdvanceCuda(base, next, size, elem_bytes, out, capacity, delta_ws_, stream_);
  }

  Status ReadBack(void* host, const void* src, uint64_t bytes) override {
    return Check("read back", [&] {
      cudaError_t e = cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, stream_);
      return e == cudaSuccess ? cudaStreamSynchronize(stream_) : e;
    });
  }

  Status CopyFromHost(void* dst, const void* host, uint64_t bytes) override {
    return Check("copy from host", [&] {
      cudaError_t e = cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, stream_);
      return e == cudaSuccess ? cudaStreamSynchronize(stream_) : e;
    });
  }

  StatusOr<void*> AllocateHost(uint64_t bytes) override {
    void* p = nullptr;
    WSYNC_RETURN_IF_ERROR(Check("pinned host memory of " + std::to_string(bytes) + " bytes",
                                [&] { return cudaHostAlloc(&p, bytes, cudaHostAllocDefault); }));
    return p;
  }
  void FreeHost(void* p) override { (void)cudaFreeHost(p); }
  Status CopyToHost(void* host, const void* src, uint64_t bytes) override {
    return Check("copy to host staging",
                 [&] { return cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, stream_); });
  }

 private:
  explicit CudaDevice(int ordinal) : ordinal_(ordinal) {}

  // Runs `call` with this device current on the calling thread (the
  // executor calls from several); a CUDA error becomes one line naming the
  // device and the stage.
  template <typename Call>
  Status Check(const std::string& what, Call&& call) {
    cudaError_t e = cudaSetDevice(ordinal_);
    if (e == cudaSuccess) e = call();
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return Internal(name() + ": " + what + ": " + CudaError(e));
    }
    return Status::Ok();
  }

  static constexpr int kFlagSlots = 64;
  int ordinal_;
  cudaStream_t stream_ = nullptr;
  int* flags_ = nullptr;       // device: one non-finite flag per quantize since the last Synchronize
  int* flags_host_ = nullptr;  // pinned: where Synchronize reads them back
  int slots_ = 0;
  std::optional<std::string> kernel_check_;  // Fp8KernelDisagreement, once
  DeviceChecksums checksums_;                 // its buffers: this device's memory
  delta::CudaWorkspace delta_ws_;             // likewise
};

}  // namespace

StatusOr<std::unique_ptr<DeviceOps>> MakeCudaDevice(int ordinal) { return CudaDevice::Create(ordinal); }

}  // namespace wsync
