// Buffers and copies with the CUDA runtime (built where the toolkit is).
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "cuda_ipc/copies.h"
#include "delta/codec_cuda.h"

namespace wsync::cuda_ipc {
namespace {

std::string CudaError(cudaError_t e) { return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e); }

}  // namespace

StatusOr<std::unique_ptr<Buffer>> Buffer::Allocate(Kind kind, int device, uint64_t bytes) {
  const std::string what = std::to_string(bytes) + " bytes of " +
                           (kind == Kind::kPinnedHost ? "pinned host memory" : "device memory") + " for cuda:" +
                           std::to_string(device);
  void* p = nullptr;
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) {
    e = kind == Kind::kPinnedHost ? cudaHostAlloc(&p, std::max<uint64_t>(bytes, 1), cudaHostAllocPortable)
                                  : cudaMalloc(&p, std::max<uint64_t>(bytes, 1));
  }
  if (e == cudaSuccess && kind == Kind::kDevice) e = cudaMemset(p, 0, std::max<uint64_t>(bytes, 1));
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return ResourceExhausted("allocating " + what + ": " + CudaError(e));
  }
  return std::unique_ptr<Buffer>(new Buffer(kind, device, static_cast<uint8_t*>(p), bytes));
}

Buffer::~Buffer() {
  if (cudaSetDevice(device_) != cudaSuccess) return;
  if (kind_ == Kind::kPinnedHost) {
    (void)cudaFreeHost(data_);
  } else {
    (void)cudaFree(data_);
  }
}

StatusOr<std::unique_ptr<CopyStream>> CopyStream::Create(int device) {
  cudaStream_t stream = nullptr;
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (e != cudaSuccess) return Unavailable("a copy stream on cuda:" + std::to_string(device) + ": " + CudaError(e));
  return std::unique_ptr<CopyStream>(new CopyStream(device, stream));
}

CopyStream::~CopyStream() {
  if (cudaSetDevice(device_) != cudaSuccess) return;
  (void)cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
  (void)cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

Status CopyStream::Copy(void* dst, const void* src, uint64_t bytes) {
  if (bytes == 0) return Status::Ok();
  cudaError_t e = cudaSetDevice(device_);
  if (e == cudaSuccess) e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream_));
  if (e != cudaSuccess) {
    return Internal("copying " + std::to_string(bytes) + " bytes on cuda:" + std::to_string(device_) + ": " +
                    CudaError(e));
  }
  return Status::Ok();
}

Status CopyStream::Finish() {
  cudaError_t e = cudaSetDevice(device_);
  if (e == cudaSuccess) e = cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
  if (e != cudaSuccess) return Internal("copies on cuda:" + std::to_string(device_) + ": " + CudaError(e));
  return Status::Ok();
}

Status CopyStream::ApplyDelta(const uint8_t* delta, uint64_t delta_bytes, uint8_t* target, uint64_t size,
                              const char* what) {
  cudaError_t e = cudaSetDevice(device_);
  if (e != cudaSuccess) return Internal("applying a delta on cuda:" + std::to_string(device_) + ": " + CudaError(e));
  if (workspace_ == nullptr) workspace_ = std::make_shared<delta::CudaWorkspace>();
  return delta::ApplyCuda(delta, delta_bytes, target, size, what, *static_cast<delta::CudaWorkspace*>(workspace_.get()),
                          static_cast<cudaStream_t>(stream_));
}

}  // namespace wsync::cuda_ipc
