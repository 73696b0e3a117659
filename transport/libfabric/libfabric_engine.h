// The libfabric Engine: validates requests on the caller's thread (so a bad
// one is refused before anything is posted) and hands them to its
// DomainGroup worker; callbacks run on its CallbackThread. Created by
// agents, tests and `wsync bench transport`.
#pragma once

#include <memory>

#include "transport/engine.h"
#include "transport/libfabric/libfabric_options.h"

namespace wsync::transport::fabric {

// Opens `options.num_nics` endpoints of `options.provider` and starts the
// worker and callback threads.
StatusOr<std::unique_ptr<Engine>> CreateLibfabricEngine(const LibfabricOptions& options);

// For GPU memory where host staging is the fallback: an engine with FI_HMEM
// (options.enable_hmem forced on) when the provider offers it and can
// register CUDA memory; otherwise a host-memory engine, and `why_not` says
// why (the provider has no FI_HMEM, or this libfabric cannot register CUDA
// memory: its Describe()).
struct GpuEngine {
  std::unique_ptr<Engine> engine;
  bool cuda_memory = false;
  std::string why_not;
};
StatusOr<GpuEngine> CreateLibfabricEngineForGpu(LibfabricOptions options);

}  // namespace wsync::transport::fabric
