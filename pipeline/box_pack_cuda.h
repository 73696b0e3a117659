// box_pack.h's PackBox as a CUDA kernel, for a box that is not a few pitched
// runs or that changes dtype on the way (bf16 <-> fp32, the only casts
// CanCast admits): the same bytes as the CPU code, fp32 -> bf16 rounded to
// nearest even with NaN as 0x7FFF. Caller: pipeline/cuda_device.cc, which
// turns its Box into the geometry (nvcc here compiles C++17, the routing
// types are C++20).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace wsync {

inline constexpr int kPackMaxDims = 4;  // routing's kMaxDims

struct PackGeometry {
  int ndim = 0;
  int64_t size[kPackMaxDims] = {};         // the box's, per dim
  int64_t first = 0;                       // element of the held buffer where the box starts
  int64_t held_stride[kPackMaxDims] = {};  // elements per step of each dim in the held buffer
};

// Packs the box of `data` described by `g` row-major into `out`. Element
// sizes: equal sizes copy; 2 -> 4 is bf16 -> fp32; 4 -> 2 is fp32 -> bf16;
// anything else is cudaErrorInvalidValue. Device pointers; runs on `stream`.
cudaError_t PackBoxCuda(const uint8_t* data, const PackGeometry& g, int in_size, int out_size, uint8_t* out,
                        cudaStream_t stream);

}  // namespace wsync
