// The executor's GPU stages over ATen (pipeline/device.h): temporary memory
// from torch's caching allocator (so torch's memory statistics count it),
// copies, box packing and fp8 block quantization as ATen ops on one stream
// of the trainer's CUDA device. No CUDA header is needed: only c10's
// device-generic stream API, so this builds wherever torch does.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "pipeline/device.h"
#include "transport/libfabric/libfabric_engine.h"

namespace wsync::python {

// A DeviceOps for CUDA device `ordinal`; Unavailable when torch has no CUDA.
// `host_shards`: the trainer's shards are in host memory (FSDP2 CPU
// offload), so the copy stage is host-to-device.
StatusOr<std::unique_ptr<DeviceOps>> MakeTorchCudaDevice(int ordinal, bool host_shards = false);

// Page-locked host memory of exactly `bytes` (rounded to pages), for host
// staging: mmap + cudaHostRegister where the extension was built with the
// CUDA toolkit (torch's pinned allocator would round it up to a power of
// two and keep it cached after use), torch's pinned allocator otherwise.
class PinnedHostMemory {
 public:
  static StatusOr<std::unique_ptr<PinnedHostMemory>> Allocate(uint64_t bytes);
  ~PinnedHostMemory();
  uint8_t* data() const { return data_; }

 private:
  PinnedHostMemory() = default;
  uint8_t* data_ = nullptr;
  uint64_t mapped_ = 0;
  std::shared_ptr<void> keep_;  // the torch tensor, where torch allocated
};

}  // namespace wsync::python
