#include "delta/codec_cuda.h"

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <climits>
#include <string>
#include <vector>

namespace wsync::delta {
namespace {

constexpr int kThreads = 1024;

Status CudaError(cudaError_t e, const char* what) {
  return Internal(std::string("delta on the GPU: ") + what + ": " + cudaGetErrorString(e));
}

#define DELTA_CUDA(call, what)                           \
  do {                                                   \
    cudaError_t e_ = (call);                             \
    if (e_ != cudaSuccess) return CudaError(e_, what);   \
  } while (0)

// Which of the 16/e elements of a 16-byte vector differ, bit l for lane l.
__device__ uint32_t LaneMask(uint4 a, uint4 b, uint32_t e) {
  const uint32_t wa[4] = {a.x, a.y, a.z, a.w}, wb[4] = {b.x, b.y, b.z, b.w};
  uint32_t mask = 0;
  for (int w = 0; w < 4; ++w) {
    const uint32_t d = wa[w] ^ wb[w];
    if (e == 1) {
      for (int l = 0; l < 4; ++l) mask |= ((d >> (8 * l)) & 0xffu ? 1u : 0u) << (4 * w + l);
    } else if (e == 2) {
      mask |= ((d & 0xffffu) ? 1u : 0u) << (2 * w);
      mask |= ((d >> 16) ? 1u : 0u) << (2 * w + 1);
    } else {
      mask |= (d ? 1u : 0u) << w;
    }
  }
  return mask;
}

__device__ bool ElementDiffers(const uint8_t* a, const uint8_t* b, uint32_t e) {
  for (uint32_t i = 0; i < e; ++i)
    if (a[i] != b[i]) return true;
  return false;
}

// One block per chunk: how many of its elements differ.
__global__ void CountKernel(const uint8_t* base, const uint8_t* next, uint64_t elements, uint32_t e,
                            uint32_t* counts) {
  using Reduce = cub::BlockReduce<uint32_t, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  const uint64_t first = blockIdx.x * kChunkElements;
  const uint64_t n = min(kChunkElements, elements - first);
  const uint8_t* b = base + first * e;
  const uint8_t* x = next + first * e;
  const uint64_t vectors = n * e / 16;
  uint32_t mine = 0;
  for (uint64_t v = threadIdx.x; v < vectors; v += kThreads) {
    mine += __popc(LaneMask(reinterpret_cast<const uint4*>(b)[v], reinterpret_cast<const uint4*>(x)[v], e));
  }
  if (threadIdx.x == 0) {
    for (uint64_t i = vectors * 16 / e; i < n; ++i) mine += ElementDiffers(b + i * e, x + i * e, e);
  }
  const uint32_t total = Reduce(temp).Sum(mine);
  if (threadIdx.x == 0) counts[blockIdx.x] = total;
}

__device__ void PutElement(uint8_t* dst, const uint8_t* src, uint32_t e) {
  if (e == 1) {
    *dst = *src;
  } else if (e == 2) {
    *reinterpret_cast<uint16_t*>(dst) = *reinterpret_cast<const uint16_t*>(src);
  } else {
    *reinterpret_cast<uint32_t*>(dst) = *reinterpret_cast<const uint32_t*>(src);
  }
}

// One block per chunk: writes its where-area (indices or bitmap) and its
// values, in element order, and advances base to next where they differ.
__global__ void WriteKernel(uint8_t* base, const uint8_t* next, uint64_t elements, uint32_t e, uint8_t* out,
                            const uint32_t* counts, const uint64_t* where_at, const uint64_t* first_value,
                            uint64_t values_at) {
  using Scan = cub::BlockScan<uint32_t, kThreads>;
  __shared__ typename Scan::TempStorage temp;
  __shared__ uint32_t bitmap[kChunkElements / 32];
  __shared__ uint32_t running;
  const uint64_t c = blockIdx.x;
  const uint64_t first = c * kChunkElements;
  const uint64_t n = min(kChunkElements, elements - first);
  const uint32_t k = counts[c];
  const uint64_t words16 = (n + 15) / 16;
  const bool use_bitmap = k > words16;
  uint8_t* b = base + first * e;
  const uint8_t* x = next + first * e;
  uint8_t* where = out + where_at[c];
  uint8_t* values = out + values_at + first_value[c] * e;
  if (use_bitmap) {
    for (uint64_t w = threadIdx.x; w < kChunkElements / 32; w += kThreads) bitmap[w] = 0;
  }
  if (threadIdx.x == 0) running = 0;
  __syncthreads();
  const uint32_t lanes = 16 / e;
  const uint64_t vectors = n * e / 16;
  for (uint64_t tile = 0; tile < vectors; tile += kThreads) {
    const uint64_t v = tile + threadIdx.x;
    uint32_t mask = 0;
    uint4 xv;
    if (v < vectors) {
      xv = reinterpret_cast<const uint4*>(x)[v];
      mask = LaneMask(reinterpret_cast<const uint4*>(b)[v], xv, e);
    }
    uint32_t pos, tile_total;
    Scan(temp).ExclusiveSum(static_cast<uint32_t>(__popc(mask)), pos, tile_total);
    if (mask != 0) {
      uint32_t p = running + pos;
      for (uint32_t l = 0; l < lanes; ++l) {
        if (!((mask >> l) & 1)) continue;
        const uint32_t i = static_cast<uint32_t>(v * lanes + l);
        if (use_bitmap) {
          atomicOr(&bitmap[i / 32], 1u << (i % 32));
        } else {
          reinterpret_cast<uint16_t*>(where)[p] = static_cast<uint16_t>(i);
        }
        PutElement(values + uint64_t{p} * e, x + uint64_t{i} * e, e);
        ++p;
      }
      reinterpret_cast<uint4*>(b)[v] = xv;
    }
    __syncthreads();  // every thread has read `running`
    if (threadIdx.x == 0) running += tile_total;
    __syncthreads();
  }
  if (threadIdx.x == 0) {  // the elements past the last whole vector (last chunk only)
    uint32_t p = running;
    for (uint64_t i = vectors * lanes; i < n; ++i) {
      if (!ElementDiffers(b + i * e, x + i * e, e)) continue;
      if (use_bitmap) {
        bitmap[i / 32] |= 1u << (i % 32);
      } else {
        reinterpret_cast<uint16_t*>(where)[p] = static_cast<uint16_t>(i);
      }
      PutElement(values + uint64_t{p} * e, x + i * e, e);
      PutElement(b + i * e, x + i * e, e);
      ++p;
    }
  }
  if (use_bitmap) {
    __syncthreads();
    for (uint64_t w = threadIdx.x; w < words16; w += kThreads) {
      reinterpret_cast<uint16_t*>(where)[w] = static_cast<uint16_t>(bitmap[w / 2] >> (16 * (w % 2)));
    }
  }
}

// One block per chunk: its indices ascend and stay inside it, or its bitmap
// marks exactly its count of elements inside it; else `bad` gets the
// lowest bad chunk + 1.
__global__ void ValidateKernel(const uint8_t* delta, uint64_t elements, const uint32_t* counts,
                               const uint64_t* where_at, int* bad) {
  using Reduce = cub::BlockReduce<uint32_t, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  const uint64_t c = blockIdx.x;
  const uint64_t n = min(kChunkElements, elements - c * kChunkElements);
  const uint32_t k = counts[c];
  const uint64_t words16 = (n + 15) / 16;
  const uint16_t* where = reinterpret_cast<const uint16_t*>(delta + where_at[c]);
  uint32_t wrong = 0;
  if (k > words16) {
    uint32_t set = 0;
    for (uint64_t w = threadIdx.x; w < words16; w += kThreads) {
      uint32_t bits = where[w];
      const uint64_t past = n - min(n, w * 16);  // elements of this word inside the chunk
      if (past < 16 && (bits >> past) != 0) ++wrong;
      set += __popc(bits);
    }
    const uint32_t total = Reduce(temp).Sum(set);
    if (threadIdx.x == 0 && total != k) ++wrong;
  } else {
    for (uint64_t j = threadIdx.x; j < k; j += kThreads) {
      if (where[j] >= n || (j > 0 && where[j - 1] >= where[j])) ++wrong;
    }
  }
  if (__syncthreads_or(wrong != 0) && threadIdx.x == 0) atomicMin(bad, static_cast<int>(c) + 1);
}

// One block per chunk: each changed element's value into the target.
__global__ void ScatterKernel(const uint8_t* delta, uint64_t elements, uint32_t e, uint8_t* target,
                              const uint32_t* counts, const uint64_t* where_at, const uint64_t* first_value,
                              uint64_t values_at) {
  using Scan = cub::BlockScan<uint32_t, kThreads>;
  __shared__ typename Scan::TempStorage temp;
  const uint64_t c = blockIdx.x;
  const uint64_t n = min(kChunkElements, elements - c * kChunkElements);
  const uint32_t k = counts[c];
  const uint64_t words16 = (n + 15) / 16;
  const uint16_t* where = reinterpret_cast<const uint16_t*>(delta + where_at[c]);
  const uint8_t* values = delta + values_at + first_value[c] * e;
  uint8_t* chunk = target + c * kChunkElements * e;
  if (k <= words16) {
    for (uint64_t j = threadIdx.x; j < k; j += kThreads) PutElement(chunk + uint64_t{where[j]} * e, values + j * e, e);
    return;
  }
  uint32_t running = 0;  // the same in every thread: tile totals come from the scan
  for (uint64_t tile = 0; tile < words16; tile += kThreads) {
    const uint64_t w = tile + threadIdx.x;
    const uint32_t bits = w < words16 ? where[w] : 0;
    uint32_t pos, tile_total;
    Scan(temp).ExclusiveSum(static_cast<uint32_t>(__popc(bits)), pos, tile_total);
    uint32_t p = running + pos;
    for (uint32_t l = 0; l < 16; ++l) {
      if ((bits >> l) & 1) PutElement(chunk + (w * 16 + l) * e, values + uint64_t{p++} * e, e);
    }
    running += tile_total;
    __syncthreads();  // temp is reused by the next tile's scan
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

CudaWorkspace::~CudaWorkspace() {
  cudaFree(counts);
  cudaFree(where_at);
  cudaFree(values_at);
  cudaFree(bad);
}

Status CudaWorkspace::Reserve(uint64_t chunks) {
  if (chunks <= capacity && bad != nullptr) return Status::Ok();
  cudaFree(counts);
  cudaFree(where_at);
  cudaFree(values_at);
  cudaFree(bad);
  counts = nullptr, where_at = values_at = nullptr, bad = nullptr, capacity = 0;
  DELTA_CUDA(cudaMalloc(&counts, chunks * sizeof(uint32_t)), "workspace");
  DELTA_CUDA(cudaMalloc(&where_at, chunks * sizeof(uint64_t)), "workspace");
  DELTA_CUDA(cudaMalloc(&values_at, chunks * sizeof(uint64_t)), "workspace");
  DELTA_CUDA(cudaMalloc(&bad, sizeof(int)), "workspace");
  capacity = chunks;
  return Status::Ok();
}

StatusOr<Encoded> EncodeAndAdvanceCuda(uint8_t* base, const uint8_t* next, uint64_t size, uint32_t elem_bytes,
                                       uint8_t* out, uint64_t capacity, CudaWorkspace& ws, cudaStream_t stream) {
  if ((elem_bytes != 1 && elem_bytes != 2 && elem_bytes != 4) || size % elem_bytes != 0) {
    return InvalidArgument("delta encode: " + std::to_string(size) + " bytes are not whole elements of " +
                           std::to_string(elem_bytes) + " bytes (1, 2 or 4)");
  }
  if (!Aligned16(base) || !Aligned16(next) || !Aligned16(out)) {
    return InvalidArgument("delta encode on the GPU: base, next and out must be 16-byte aligned");
  }
  const uint64_t elements = size / elem_bytes;
  const uint64_t chunks = (elements + kChunkElements - 1) / kChunkElements;
  Encoded r;
  if (chunks == 0) return r;
  WSYNC_RETURN_IF_ERROR(ws.Reserve(chunks));
  CountKernel<<<chunks, kThreads, 0, stream>>>(base, next, elements, elem_bytes, ws.counts);
  std::vector<uint32_t> counts(chunks);
  DELTA_CUDA(cudaMemcpyAsync(counts.data(), ws.counts, chunks * 4, cudaMemcpyDeviceToHost, stream), "counts");
  DELTA_CUDA(cudaStreamSynchronize(stream), "count kernel");
  const Layout l = LayoutOf(elements, elem_bytes, std::move(counts));
  r.changes = l.changes;
  if (l.bytes > capacity) {  // sent whole: base still becomes next
    DELTA_CUDA(cudaMemcpyAsync(base, next, size, cudaMemcpyDeviceToDevice, stream), "advance");
    DELTA_CUDA(cudaStreamSynchronize(stream), "advance");
    return r;
  }
  std::vector<uint8_t> head(HeadBytes(elements));
  WriteHead(l, head.data());
  DELTA_CUDA(cudaMemcpyAsync(out, head.data(), head.size(), cudaMemcpyHostToDevice, stream), "head");
  const uint64_t pad_at = l.where_at[chunks - 1] + l.where_bytes(chunks - 1);
  if (l.values_at > pad_at) DELTA_CUDA(cudaMemsetAsync(out + pad_at, 0, l.values_at - pad_at, stream), "pad");
  DELTA_CUDA(cudaMemcpyAsync(ws.where_at, l.where_at.data(), chunks * 8, cudaMemcpyHostToDevice, stream), "offsets");
  DELTA_CUDA(cudaMemcpyAsync(ws.values_at, l.first_value.data(), chunks * 8, cudaMemcpyHostToDevice, stream),
             "offsets");
  WriteKernel<<<chunks, kThreads, 0, stream>>>(base, next, elements, elem_bytes, out, ws.counts, ws.where_at,
                                               ws.values_at, l.values_at);
  DELTA_CUDA(cudaStreamSynchronize(stream), "write kernel");
  r.fits = true;
  r.bytes = l.bytes;
  return r;
}

Status ApplyCuda(const uint8_t* delta, uint64_t delta_bytes, uint8_t* target, uint64_t size, const char* what,
                 CudaWorkspace& ws, cudaStream_t stream) {
  // Apply reads the where-areas as u16 and the values as whole elements and
  // writes whole elements: a delta 4-byte aligned (an inbox slot is 8-byte
  // aligned) and a target aligned to its elements (a tensor's bytes at any
  // element of a region) will do.
  if (reinterpret_cast<uintptr_t>(delta) % 4 != 0) {
    return InvalidArgument(std::string("delta for ") + what + ": on the GPU a delta must be 4-byte aligned");
  }
  uint8_t header[kHeaderBytes] = {};
  DELTA_CUDA(cudaMemcpyAsync(header, delta, std::min<uint64_t>(kHeaderBytes, delta_bytes), cudaMemcpyDeviceToHost,
                             stream),
             "header");
  DELTA_CUDA(cudaStreamSynchronize(stream), "header");
  std::vector<uint8_t> head(std::min(HeadBytes(ElementsOf(header)), delta_bytes));
  if (head.size() > kHeaderBytes) {
    DELTA_CUDA(cudaMemcpyAsync(head.data(), delta, head.size(), cudaMemcpyDeviceToHost, stream), "counts");
    DELTA_CUDA(cudaStreamSynchronize(stream), "counts");
  } else {
    head.assign(header, header + std::min<uint64_t>(kHeaderBytes, delta_bytes));
  }
  WSYNC_ASSIGN_OR_RETURN(Layout l, ReadLayout(head.data(), head.size(), delta_bytes, size, what));
  if (reinterpret_cast<uintptr_t>(target) % l.elem_bytes != 0) {
    return InvalidArgument(std::string("delta for ") + what + ": on the GPU its target must be aligned to its " +
                           std::to_string(l.elem_bytes) + "-byte elements");
  }
  const uint64_t chunks = l.chunks();
  if (chunks == 0) return Status::Ok();
  WSYNC_RETURN_IF_ERROR(ws.Reserve(chunks));
  const int none = INT_MAX;
  DELTA_CUDA(cudaMemcpyAsync(ws.bad, &none, sizeof(int), cudaMemcpyHostToDevice, stream), "flag");
  DELTA_CUDA(cudaMemcpyAsync(ws.counts, l.counts.data(), chunks * 4, cudaMemcpyHostToDevice, stream), "counts");
  DELTA_CUDA(cudaMemcpyAsync(ws.where_at, l.where_at.data(), chunks * 8, cudaMemcpyHostToDevice, stream), "offsets");
  DELTA_CUDA(cudaMemcpyAsync(ws.values_at, l.first_value.data(), chunks * 8, cudaMemcpyHostToDevice, stream),
             "offsets");
  ValidateKernel<<<chunks, kThreads, 0, stream>>>(delta, l.elements, ws.counts, ws.where_at, ws.bad);
  int bad = none;
  DELTA_CUDA(cudaMemcpyAsync(&bad, ws.bad, sizeof(int), cudaMemcpyDeviceToHost, stream), "flag");
  DELTA_CUDA(cudaStreamSynchronize(stream), "validate kernel");
  if (bad != none) {
    return DataLoss(std::string("delta for ") + what + " (" + std::to_string(delta_bytes) + " bytes onto " +
                    std::to_string(size) + "): chunk " + std::to_string(bad - 1) +
                    " says where its changes are wrongly (indices out of order or past it, or a bitmap not of its "
                    "count); nothing applied");
  }
  ScatterKernel<<<chunks, kThreads, 0, stream>>>(delta, l.elements, l.elem_bytes, target, ws.counts, ws.where_at,
                                                 ws.values_at, l.values_at);
  DELTA_CUDA(cudaStreamSynchronize(stream), "scatter kernel");
  return Status::Ok();
}

}  // namespace wsync::delta
