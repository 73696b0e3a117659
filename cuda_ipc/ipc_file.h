// CUDA memory handed from one process to another on the same host: the file
// a process that owns CUDA tensors writes (Python: wsync.export_cuda_ipc for
// an engine's weights, wsync.export_shards for a trainer's shards) and a
// sidecar reads, schema wsync.cuda_ipc/v1:
//
//   {"schema": "wsync.cuda_ipc/v1", "pid": 4242,
//    "regions": [{"id": "model.layers.0.mlp.down_proj.weight", "device": 0,
//                 "pci_bus_id": "0000:18:00.0",
//                 "handle": "<128 hex digits: cudaIpcMemHandle_t>",
//                 "offset": 1048576, "bytes": 58720256}, ...]}
//
// A handle names a whole cudaMalloc allocation (torch's caching allocator
// hands out pieces of larger ones); `offset` is the tensor's first byte
// inside it. `device` is the exporting process's ordinal; where
// `pci_bus_id` is given the sidecar finds the device by it instead (its
// CUDA_VISIBLE_DEVICES may differ).
//
// Users: inference_agent/cuda_ipc.h (an engine's weights, written in place)
// and trainer_agent/cuda_shards.h (a trainer's shards, read in place). This
// file only reads and checks; mappings.h opens the handles.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace wsync::cuda_ipc {

inline constexpr const char* kSchema = "wsync.cuda_ipc/v1";
inline constexpr size_t kHandleBytes = 64;  // sizeof(cudaIpcMemHandle_t)

struct Region {
  std::string id;
  int device = 0;           // as the exporting process numbers it
  std::string pci_bus_id;   // "" where the exporter did not say
  std::array<uint8_t, kHandleBytes> handle{};
  uint64_t offset = 0;  // inside the allocation the handle names
  uint64_t bytes = 0;
};

struct Export {
  int64_t pid = 0;  // the exporting process (for logs)
  // In the order of the expected regions.
  std::vector<Region> regions;
};

// A region the reader's layout says must be there, with its size.
struct Expected {
  std::string id;
  uint64_t bytes = 0;
};

// Reads `path` and checks it against `expected`: one line naming the file
// and the region on any mismatch (missing, extra, other size, bad handle,
// malformed field). `owner` names whose layout it is ("inference rank 3").
StatusOr<Export> ReadFile(const std::string& path, const std::vector<Expected>& expected, const std::string& owner);

}  // namespace wsync::cuda_ipc
