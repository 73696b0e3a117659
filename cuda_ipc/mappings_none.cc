// Mappings where wsync was built without the CUDA toolkit.
#include "cuda_ipc/mappings.h"

namespace wsync::cuda_ipc {

StatusOr<std::unique_ptr<Mappings>> Mappings::Open(const Export& ipc) {
  return Unimplemented("CUDA IPC: this wsync was built without the CUDA toolkit, so it cannot open the " +
                       std::to_string(ipc.regions.size()) + " CUDA IPC handles of process " +
                       std::to_string(ipc.pid) + " (rebuild where nvcc is found)");
}

Mappings::~Mappings() = default;

Status Mappings::CopyToHost(int, const void*, uint64_t, void*) {
  return Unimplemented("CUDA IPC: this wsync was built without the CUDA toolkit");
}

}  // namespace wsync::cuda_ipc
