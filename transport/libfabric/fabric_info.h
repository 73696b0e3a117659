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

}  // namespace wsync::transport::fabric
