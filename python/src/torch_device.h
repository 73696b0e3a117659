// The executor's GPU stages over ATen (pipeline/device.h): temporary memory
// from torch's caching allocator (so torch's memory statistics count it),
// copies, box packing and fp8 block quantization as ATen ops on one stream
// of the trainer's CUDA device. No CUDA header is needed: only c10's
// device-generic stream API, so this builds wherever torch does.
#pragma once

#include <memory>

#include "pipeline/device.h"

namespace wsync::python {

// A DeviceOps for CUDA device `ordinal`; Unavailable when torch has no CUDA.
// `host_shards`: the trainer's shards are in host memory (FSDP2 CPU
// offload), so the copy stage is host-to-device.
StatusOr<std::unique_ptr<DeviceOps>> MakeTorchCudaDevice(int ordinal, bool host_shards = false);

}  // namespace wsync::python
