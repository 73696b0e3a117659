// The sidecar's GPU weights: an engine process exports its CUDA tensors by
// CUDA IPC handles (Python: wsync.export_cuda_ipc) in a wsync.cuda_ipc/v1
// file (cuda_ipc/ipc_file.h), and `wsync inference-agent --cuda-ipc FILE`
// opens them in its own process (cuda_ipc/mappings.h) and registers them
// with the transport in place (FI_HMEM). The weight store (shared memory)
// still carries the layout and the version words the engine reads; its data
// pages are never touched.
//
// Where the transport cannot register CUDA memory (no FI_HMEM), or with
// --staging on, the writes land in pinned host memory instead and are copied
// into the tensors once a version is complete everywhere (MakeCudaShadow:
// the shadow mode of weight_memory.h with host staging); with --shadow and
// FI_HMEM the shadow is device memory on the same GPU.
//
// Every region of the rank's layout must be in the file, with its size. The
// engine must keep the tensors where they are while the agent runs (torch's
// _share_cuda_ also keeps their allocation from being freed).
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "cuda_ipc/ipc_file.h"
#include "inference_agent/weight_memory.h"
#include "inference_agent/weight_store.h"
#include "routing/metadata.h"

namespace wsync::inference {

// Reads and checks `path` against `rank`'s regions: one line naming the file
// and the region on any mismatch (missing, extra, other size, bad handle).
StatusOr<cuda_ipc::Export> ReadCudaIpcExport(const std::string& path, const InferenceRank& rank);

// The WeightMemory of an export: each region the engine's CUDA memory,
// opened here (once per handle, closed on destruction), the version words
// in `store`'s header. Unimplemented when wsync was built without the CUDA
// toolkit.
StatusOr<std::unique_ptr<WeightMemory>> OpenCudaIpcWeights(const cuda_ipc::Export& ipc, WeightStore store);

// The shadow of `live`'s GPU regions: pinned host memory (`staging`) or
// device memory on each region's GPU, as much as the regions; copied out on
// one stream per GPU, and Finish returns once the bytes are in the engine's
// tensors, visible to any kernel it launches after reading the version word.
// Host regions (none from an export) are shadowed in host memory.
StatusOr<std::unique_ptr<ShadowMemory>> MakeCudaShadow(const WeightMemory& live, bool staging);

}  // namespace wsync::inference
