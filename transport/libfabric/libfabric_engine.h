// The libfabric Engine: validates requests on the caller's thread (so a bad
// one is refused before anything is posted) and hands them to its
// DomainGroup worker; callbacks run on its CallbackThread. Created by
// agents, tests and `wsync bench transport`.
#pragma once

#include <memory>
#include <string>

#include "transport/engine.h"
#include "transport/libfabric/libfabric_options.h"

namespace wsync::transport::fabric {

// Opens `options.num_nics` endpoints of `options.provider` and starts the
// worker and callback threads.
StatusOr<std::unique_ptr<Engine>> CreateLibfabricEngine(const LibfabricOptions& options);

// For GPU memory: how the caller's GPU bytes may travel.
enum class GpuMemory {
  kDirect,        // straight from/to GPU memory (FI_HMEM), or FailedPrecondition saying why not
  kDirectOrHost,  // straight where this libfabric can, else a host engine (the caller stages)
  kHost,          // a host engine: the caller stages through host memory
};
struct GpuEngine {
  std::unique_ptr<Engine> engine;
  bool cuda_memory = false;  // false: the caller must stage through host memory
  std::string why_not;       // why not cuda_memory: the provider has no FI_HMEM, this
                             // libfabric cannot register CUDA memory (its Describe()), or not asked for
};
StatusOr<GpuEngine> CreateLibfabricEngineForGpu(LibfabricOptions options, GpuMemory want);

// The user's word for it (Python's staging=, the sidecar's --staging):
// "auto" kDirectOrHost, "on" kHost, "off" kDirect; else one InvalidArgument.
StatusOr<GpuMemory> GpuMemoryForStaging(const std::string& staging);

}  // namespace wsync::transport::fabric
