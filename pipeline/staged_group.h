// Collectives on device memory through host memory: a CollectiveGroup that
// runs a host group's collectives (Gloo) on bytes the executor keeps on a
// device. Each all-gather or exchange on device buffers reads the input back
// to the host, runs the host collective, and copies the result to the
// device on the device's stream; calls on host buffers (the executor's
// version check) pass straight through.
//
// This is how `wsync trainer-agent` unshards on a GPU today: correct for any
// number of ranks on any GPUs, but every gathered byte crosses PCIe twice
// and the host network once, so it is the slower path and the agent's log
// says so. NCCL groups bootstrapped through the controller would replace it
// (the in-process binding already runs over the trainer's own NCCL groups).
//
// Relies on the executor's contract with device groups: the device's stream
// is settled before every collective (executor.cc, Settle), so the read-back
// sees final bytes.
#pragma once

#include <memory>

#include "pipeline/device.h"
#include "pipeline/group.h"

namespace wsync {

// Joins `inner`'s groups and wraps each so that its collectives take
// `device` memory. `device` must outlive the factory and its groups.
std::unique_ptr<GroupFactory> MakeHostStagedGroupFactory(std::unique_ptr<GroupFactory> inner, DeviceOps* device);

}  // namespace wsync
