// Buffers and copies where wsync was built without the CUDA toolkit.
#include "cuda_ipc/copies.h"

namespace wsync::cuda_ipc {

StatusOr<std::unique_ptr<Buffer>> Buffer::Allocate(Kind, int device, uint64_t bytes) {
  return Unimplemented("CUDA memory: this wsync was built without the CUDA toolkit, so it cannot allocate " +
                       std::to_string(bytes) + " bytes for cuda:" + std::to_string(device) +
                       " (rebuild where nvcc is found)");
}

Buffer::~Buffer() = default;

StatusOr<std::unique_ptr<CopyStream>> CopyStream::Create(int device) {
  return Unimplemented("CUDA copies: this wsync was built without the CUDA toolkit (cuda:" + std::to_string(device) +
                       ")");
}

CopyStream::~CopyStream() = default;

Status CopyStream::Copy(void*, const void*, uint64_t) { return Unimplemented("CUDA copies: no CUDA toolkit"); }

Status CopyStream::Finish() { return Status::Ok(); }

}  // namespace wsync::cuda_ipc
