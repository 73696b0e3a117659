// The sidecar's GPU weights: an engine process exports its CUDA tensors by
// CUDA IPC handles (Python: wsync.export_cuda_ipc) in a file of schema
// wsync.cuda_ipc/v1, and `wsync inference-agent --cuda-ipc FILE` opens them
// in its own process and registers them with the transport in place
// (FI_HMEM). The weight store (shared memory) still carries the layout and
// the version words the engine reads; its data pages are never touched.
//
//   {"schema": "wsync.cuda_ipc/v1", "pid": 4242,
//    "regions": [{"id": "model.layers.0.mlp.down_proj.weight", "device": 0,
//                 "pci_bus_id": "0000:18:00.0",
//                 "handle": "<128 hex digits: cudaIpcMemHandle_t>",
//                 "offset": 1048576, "bytes": 58720256}, ...]}
//
// A handle names a whole cudaMalloc allocation (torch's caching allocator
// hands out pieces of larger ones); `offset` is the tensor's first byte
// inside it. Every region of the rank's layout must be there, with its
// size; the same handle is opened once however many regions share it.
// `device` is the engine process's ordinal; where `pci_bus_id` is given the
// sidecar finds the device by it instead (its CUDA_VISIBLE_DEVICES may
// differ). The engine must keep the tensors where they are while the agent
// runs (torch's _share_cuda_ also keeps their allocation from being freed).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "inference_agent/weight_memory.h"
#include "inference_agent/weight_store.h"
#include "routing/metadata.h"

namespace wsync::inference {

inline constexpr const char* kCudaIpcSchema = "wsync.cuda_ipc/v1";
inline constexpr size_t kCudaIpcHandleBytes = 64;  // sizeof(cudaIpcMemHandle_t)

struct CudaIpcRegion {
  std::string id;
  int device = 0;           // as the exporting process numbers it
  std::string pci_bus_id;   // "" where the exporter did not say
  std::array<uint8_t, kCudaIpcHandleBytes> handle{};
  uint64_t offset = 0;  // inside the allocation the handle names
  uint64_t bytes = 0;
};

struct CudaIpcExport {
  int64_t pid = 0;  // the exporting engine process (for logs)
  // In the order of `rank`'s regions.
  std::vector<CudaIpcRegion> regions;
};

// Reads and checks `path` against `rank`'s regions: one line naming the file
// and the region on any mismatch (missing, extra, other size, bad handle).
StatusOr<CudaIpcExport> ReadCudaIpcExport(const std::string& path, const InferenceRank& rank);

// The WeightMemory of an export: each region the engine's CUDA memory,
// opened here (cudaIpcOpenMemHandle, once per handle, closed on
// destruction), the version words in `store`'s header. Unimplemented when
// wsync was built without the CUDA toolkit.
StatusOr<std::unique_ptr<WeightMemory>> OpenCudaIpcWeights(const CudaIpcExport& ipc, WeightStore store);

}  // namespace wsync::inference
