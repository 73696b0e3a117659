// The handles of a cuda_ipc::Export, opened in this process.
//
// Each allocation is opened once (cudaIpcOpenMemHandle) however many
// regions share it, and closed when the Mappings go. Every region must lie
// inside the allocation its handle names (cuMemGetAddressRange on the
// mapping): an `offset + bytes` past its end is refused by name, before any
// byte is read or written, instead of reaching another allocation.
//
// Built with the CUDA runtime where the toolkit is (mappings_cuda.cc); a
// build without it refuses in one line (mappings_none.cc). This target is
// the only one of the sidecars' that links the CUDA runtime for IPC.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "cuda_ipc/ipc_file.h"

namespace wsync::cuda_ipc {

struct Mapped {
  std::string id;
  int device = 0;           // this process's ordinal
  uint8_t* data = nullptr;  // device memory
  uint64_t bytes = 0;
};

class Mappings {
 public:
  // Unavailable (one line naming the region and the process) where a handle
  // cannot be opened or its GPU is not visible; OutOfRange where a region
  // reaches past its allocation; Unimplemented without the CUDA toolkit.
  static StatusOr<std::unique_ptr<Mappings>> Open(const Export& ipc);
  ~Mappings();
  Mappings(const Mappings&) = delete;
  Mappings& operator=(const Mappings&) = delete;

  // In the order of the export's regions.
  const std::vector<Mapped>& regions() const { return regions_; }

  // `bytes` of device memory at `src` (on `device`) into host memory `out`,
  // returning once they are there: for checks that read written bytes back.
  static Status CopyToHost(int device, const void* src, uint64_t bytes, void* out);

 private:
  Mappings() = default;
  std::vector<Mapped> regions_;
  std::vector<std::pair<int, void*>> opened_;  // (device, mapping) to close
};

}  // namespace wsync::cuda_ipc
