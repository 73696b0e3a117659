// Chooses the libfabric provider by name and checks that it has what the
// engine needs (RDM endpoints, RMA, remote CQ data, HMEM when asked).
// Called by DomainGroup once per NIC at startup.
#pragma once

#include "common/status.h"
#include "transport/libfabric/fi_handles.h"
#include "transport/libfabric/libfabric_options.h"

namespace wsync::transport::fabric {

// The fi_info for `options.provider` (first match), or a one-line error that
// names the missing capability and what to do.
StatusOr<InfoPtr> ProbeProvider(const LibfabricOptions& options);

// Whether the loaded libfabric defines the parameter whose environment
// variable is `env_name` (fi_getparams lists parameters by that name, e.g.
// "FI_HMEM_CUDA_ENABLE_ASYNC_COPY", not by the name the library defines them
// with); core parameters are defined once fi_getinfo has run.
bool LibfabricDefinesParam(const char* env_name);

// A libfabric boolean set to off in the environment ("0", "no", "off",
// "false", any case), as fi_param_get_bool reads it.
bool EnvBoolOff(const char* env_name);

}  // namespace wsync::transport::fabric
