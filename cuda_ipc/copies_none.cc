// Buffers and copies where wsync was built without the CUDA toolkit.
#include "cuda_ipc/copies.h"

#include <string>

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

Status CopyStream::ApplyDelta(const uint8_t*, uint64_t, uint8_t*, uint64_t, const char* what) {
  return Unimplemented(std::string("a delta for ") + what + " on the GPU: no CUDA toolkit");
}

}  // namespace wsync::cuda_ipc
