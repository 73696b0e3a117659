// Pins the calling thread to one core near a GPU, found with hwloc, so the
// DomainGroup worker and everything it allocates afterwards (first touch)
// live on the GPU's NUMA node. Called by the worker before it opens NICs.
#pragma once

#include <string>

#include "common/status.h"

namespace wsync::transport::fabric {

// gpu >= 0: first core of the GPU's locality (hwloc OS device "cuda<gpu>"
// or "nvml<gpu>"); when that GPU is unknown to hwloc, falls back to `core`.
// core >= 0: that core. Both < 0: no pinning. `*where` describes the choice.
Status PinCurrentThread(int gpu, int core, std::string* where);

}  // namespace wsync::transport::fabric
