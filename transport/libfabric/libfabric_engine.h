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

}  // namespace wsync::transport::fabric
