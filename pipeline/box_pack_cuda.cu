#include "pipeline/box_pack_cuda.h"

#include <algorithm>

namespace wsync {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ uint16_t ToBf16(float v) {
  const uint32_t bits = __float_as_uint(v);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFF;  // the CPU code's canonical NaN
  const uint32_t lsb = (bits >> 16) & 1u;
  return static_cast<uint16_t>((bits + 0x7FFFu + lsb) >> 16);
}

// One thread per element of the box, in its row-major order.
template <typename In, typename Out>
__global__ void PackKernel(const In* in, PackGeometry g, int64_t n, Out* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t rest = i, at = g.first;
    for (int d = g.ndim - 1; d >= 0; --d) {
      at += (rest % g.size[d]) * g.held_stride[d];
      rest /= g.size[d];
    }
    const In v = in[at];
    if constexpr (sizeof(In) == sizeof(Out)) {
      out[i] = v;
    } else if constexpr (sizeof(In) == 2) {  // bf16 -> fp32
      out[i] = __uint_as_float(static_cast<uint32_t>(v) << 16);
    } else {  // fp32 -> bf16
      out[i] = ToBf16(v);
    }
  }
}

template <typename In, typename Out>
cudaError_t Launch(const uint8_t* data, const PackGeometry& g, int64_t n, uint8_t* out, cudaStream_t stream) {
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 65535 * 8);
  PackKernel<In, Out><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(reinterpret_cast<const In*>(data), g, n,
                                                                              reinterpret_cast<Out*>(out));
  return cudaGetLastError();
}

}  // namespace

cudaError_t PackBoxCuda(const uint8_t* data, const PackGeometry& g, int in_size, int out_size, uint8_t* out,
                        cudaStream_t stream) {
  int64_t n = g.ndim > 0 ? 1 : 0;
  for (int d = 0; d < g.ndim; ++d) n *= g.size[d];
  if (n == 0) return cudaSuccess;
  if (in_size == out_size) {
    switch (in_size) {
      case 1: return Launch<uint8_t, uint8_t>(data, g, n, out, stream);
      case 2: return Launch<uint16_t, uint16_t>(data, g, n, out, stream);
      case 4: return Launch<uint32_t, uint32_t>(data, g, n, out, stream);
      default: return cudaErrorInvalidValue;
    }
  }
  if (in_size == 2 && out_size == 4) return Launch<uint16_t, float>(data, g, n, out, stream);
  if (in_size == 4 && out_size == 2) return Launch<float, uint16_t>(data, g, n, out, stream);
  return cudaErrorInvalidValue;
}

}  // namespace wsync
