// Pins the calling thread to one core near a GPU, found with hwloc, so the
// DomainGroup worker and everything it allocates afterwards (first touch)
// live on the GPU's NUMA node. Called by the worker before it opens NICs.
#pragma once

#include <string>

#include "common/status.h"

namespace wsync::transport::fabric {

// GPU by PCI bus id (if given) or by ordinal (hwloc OS device "cuda<gpu>"
// or "nvml<gpu>"): a core of the GPU's locality; when hwloc does not know
// the GPU, falls back to `core`. core >= 0: that core. Nothing given: no
// pinning. `*where` describes the choice.
Status PinCurrentThread(const std::string& gpu_pci_bus_id, int gpu, int core, std::string* where);

}  // namespace wsync::transport::fabric
