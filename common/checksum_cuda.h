// Checksum64 (common/checksum.h) of bytes in GPU memory, computed by kernels
// where the bytes are instead of copying them to the host: a thread per
// 4 KiB leaf, then a launch per level of the tree above the leaves, for
// many pieces at once (every write of a version in one batch). The result
// is the host's, bit for bit (tests/common/gpu/checksum_bench.cu checks it
// and times it beside a device-to-device copy).
//
// Callers: the torch binding's trainer device and engine memory
// (python/src/torch_device.cc, inference_binding.cc) and the sidecar's CUDA
// device (pipeline/cuda_device.cc). Built into wsync_common_cuda where the
// CUDA toolkit is found. Not thread-safe: one per stream.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/checksum.h"
#include "common/status.h"

namespace wsync {

class DeviceChecksums {
 public:
  DeviceChecksums() = default;
  ~DeviceChecksums();
  DeviceChecksums(const DeviceChecksums&) = delete;
  DeviceChecksums& operator=(const DeviceChecksums&) = delete;

  // Queues on `stream`, after the work already there, the hashes of
  // `pieces` (device memory of the current device, any alignment, left
  // unchanged until the hashes have run); out[i] (host memory) is
  // pieces[i]'s once Collect returns. May wait for the stream when it must
  // grow its buffers.
  Status Enqueue(const ChecksumPiece* pieces, size_t count, uint64_t* out, cudaStream_t stream);
  // Waits for `stream` and fills every `out` queued since the last Collect.
  Status Collect(cudaStream_t stream);
  // Enqueue then Collect.
  Status Compute(const ChecksumPiece* pieces, size_t count, uint64_t* out, cudaStream_t stream);
  size_t pending() const { return waiting_.size(); }

  // One row of a level: `leaves` hashes of `src` (`bytes`) into `out`.
  struct Row {
    const uint8_t* src;
    uint64_t bytes;
    uint64_t first_leaf;  // this row's first thread in its level's launch
    uint64_t* out;
  };

 private:
  Status Grow(uint64_t rows, uint64_t scratch_words, uint64_t results, cudaStream_t stream);
  Status Flush();  // the pinned results into their `out`s (after the stream has finished)

  Row* rows_dev_ = nullptr;
  uint64_t rows_cap_ = 0;
  Row* rows_host_ = nullptr;  // pinned: the rows' copy in runs asynchronously
  uint64_t rows_host_cap_ = 0;
  cudaEvent_t rows_copied_ = nullptr;  // the last Enqueue's rows are on the device
  uint64_t* scratch_ = nullptr;  // the levels' leaf hashes
  uint64_t scratch_cap_ = 0;
  uint64_t* results_dev_ = nullptr;
  uint64_t results_dev_cap_ = 0;
  uint64_t* results_host_ = nullptr;  // pinned, one slot per waiting out
  uint64_t results_host_cap_ = 0;
  std::vector<uint64_t*> waiting_;  // out pointers, by pinned slot
};

}  // namespace wsync
