// The delta codec of delta/codec.h on a GPU: the same "wsync delta v1"
// bytes, found and applied by kernels where the weights are (a trainer's
// packed writes, an engine's tensors), checked byte for byte against the
// CPU codec by tests/delta/gpu/delta_bench.cu (seen agreeing on an H100,
// 2026-12-07; docs/DELTAS.md has its speed).
//
// Encode reads base and next twice (a counting pass, then a writing pass
// once the chunk offsets are known on the host): about twice a
// device-to-device copy's traffic. Apply reads the delta and writes only
// changed elements, after a validation pass: like the CPU Apply, a delta
// that does not describe its target changes nothing.
//
// Built into wsync_delta_cuda where the CUDA toolkit is found. Buffers are
// device memory: the encode's 16-byte aligned, the apply's delta 4-byte
// aligned and its target aligned to its elements (an inbox slot onto a
// tensor's bytes); calls run on `stream` and return once their result is
// known (they synchronize the stream).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "common/status.h"
#include "delta/codec.h"

namespace wsync::delta {

// Device scratch reused across calls (per chunk counts and offsets).
class CudaWorkspace {
 public:
  CudaWorkspace() = default;
  ~CudaWorkspace();
  CudaWorkspace(const CudaWorkspace&) = delete;
  CudaWorkspace& operator=(const CudaWorkspace&) = delete;

  // Room for `chunks` chunks; grows only.
  Status Reserve(uint64_t chunks);
  uint32_t* counts = nullptr;      // [chunks]
  uint64_t* where_at = nullptr;    // [chunks] byte offset of each chunk's where-area
  uint64_t* values_at = nullptr;   // [chunks] index of each chunk's first value
  int* bad = nullptr;              // validation: first bad chunk + 1, or 0
  uint64_t capacity = 0;
};

// EncodeAndAdvance on device buffers: base (updated to next), next, out.
StatusOr<Encoded> EncodeAndAdvanceCuda(uint8_t* base, const uint8_t* next, uint64_t size, uint32_t elem_bytes,
                                       uint8_t* out, uint64_t capacity, CudaWorkspace& ws, cudaStream_t stream);

// Apply of a delta in device memory onto a device target.
Status ApplyCuda(const uint8_t* delta, uint64_t delta_bytes, uint8_t* target, uint64_t size, const char* what,
                 CudaWorkspace& ws, cudaStream_t stream);

}  // namespace wsync::delta
