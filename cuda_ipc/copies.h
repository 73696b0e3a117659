// Memory of a sidecar's own beside the mapped handles, and copies into
// them: what the inference sidecar's shadow needs (a private copy of the
// engine's weights where the writes land, copied into the engine's tensors
// once a version is complete everywhere), and its delta inboxes with the
// apply of their deltas (delta/codec_cuda.h). For host staging the copy is
// pinned host memory, which any libfabric registers; otherwise it is device
// memory on the weights' GPU.
//
// CUDA runtime where the toolkit is (copies_cuda.cc); Unimplemented in one
// line where it is not (copies_none.cc).
#pragma once

#include <cstdint>
#include <memory>

#include "common/status.h"

namespace wsync::cuda_ipc {

class Buffer {
 public:
  enum class Kind { kPinnedHost, kDevice };
  // ResourceExhausted naming the bytes and the device where CUDA cannot
  // allocate them.
  static StatusOr<std::unique_ptr<Buffer>> Allocate(Kind kind, int device, uint64_t bytes);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  Kind kind() const { return kind_; }
  int device() const { return device_; }
  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  Buffer(Kind kind, int device, uint8_t* data, uint64_t size)
      : kind_(kind), device_(device), data_(data), size_(size) {}
  Kind kind_;
  int device_;
  uint8_t* data_;
  uint64_t size_;
};

// Copies between any two of host, pinned host and device memory, issued in
// order on one stream of `device` and asynchronous until Finish.
class CopyStream {
 public:
  static StatusOr<std::unique_ptr<CopyStream>> Create(int device);
  ~CopyStream();
  CopyStream(const CopyStream&) = delete;
  CopyStream& operator=(const CopyStream&) = delete;

  int device() const { return device_; }
  Status Copy(void* dst, const void* src, uint64_t bytes);
  // Returns once every Copy issued so far is in place, visible to kernels
  // launched after it on any stream of the device, with the first error of
  // any of them.
  Status Finish();
  // Delta versions: delta/codec_cuda.h's ApplyCuda of the delta at `delta`
  // (device memory, `delta_bytes`) onto `target` (`size` bytes of device
  // memory) on this stream, after the copies issued before it; returns once
  // applied, or with the codec's error naming `what` and nothing changed.
  Status ApplyDelta(const uint8_t* delta, uint64_t delta_bytes, uint8_t* target, uint64_t size, const char* what);

 private:
  CopyStream(int device, void* stream) : device_(device), stream_(stream) {}
  int device_;
  void* stream_;  // cudaStream_t
  std::shared_ptr<void> workspace_;  // delta::CudaWorkspace, made by the first ApplyDelta
};

}  // namespace wsync::cuda_ipc
