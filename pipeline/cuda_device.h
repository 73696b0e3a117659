// A DeviceOps (device.h) on one CUDA device with the CUDA runtime alone, no
// torch: the `wsync trainer-agent` sidecar's, whose shards are the trainer
// process's CUDA memory opened by IPC (trainer_agent/cuda_shards.h).
//
// Stages: copies and pitched copies as cudaMemcpy(2D)Async, box packing as
// pitched copies or the kernel of box_pack_cuda.h, the fp8 quantize as the
// kernel of fp8_cuda.h (checked against the CPU reference on this GPU before
// its first use; should they differ it refuses to quantize rather than send
// other bytes), all on one stream of its own. The arena is cudaMalloc'd,
// the host staging mirror cudaHostAlloc'd, both exactly their size.
//
// The torch binding keeps its own DeviceOps over ATen (python/src/
// torch_device.cc), which runs on the trainer's current stream; both give
// the CPU stages' bytes.
#pragma once

#include <memory>

#include "common/status.h"
#include "pipeline/device.h"

namespace wsync {

// InvalidArgument for an ordinal this process does not see; Unimplemented
// where wsync was built without the CUDA toolkit (cuda_device_none.cc).
StatusOr<std::unique_ptr<DeviceOps>> MakeCudaDevice(int ordinal);

}  // namespace wsync
