#include "common/checksum_cuda.h"

#include <algorithm>
#include <string>

#include "common/checksum.h"
#include "common/xxh64_steps.h"

namespace wsync {
namespace {

using xxh64::Round;
constexpr int kThreads = 128;
constexpr uint32_t kLeaf = static_cast<uint32_t>(kChecksumLeafBytes);

// Little-endian loads at any alignment (a write may start at any byte).
struct DeviceLoads {
  WSYNC_XXH64_FN static uint64_t Load64(const uint8_t* p) {
    if ((reinterpret_cast<uintptr_t>(p) & 7) == 0) return *reinterpret_cast<const uint64_t*>(p);
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
    return v;
  }
  WSYNC_XXH64_FN static uint32_t Load32(const uint8_t* p) {
    if ((reinterpret_cast<uintptr_t>(p) & 3) == 0) return *reinterpret_cast<const uint32_t*>(p);
    return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
  }
};

// XXH64 of n <= 4096 bytes at any alignment, in one piece (LeafKernel's
// path for the leaves it does not read through shared memory).
__host__ __device__ uint64_t Xxh64Leaf(const uint8_t* p, uint32_t n) {
  const uint8_t* const end = p + n;
  if (n < 32) return xxh64::Finish<DeviceLoads>(xxh64::kP5, n, p, end);
  uint64_t v1 = xxh64::kLane1, v2 = xxh64::kLane2, v3 = xxh64::kLane3, v4 = xxh64::kLane4;
  for (; end - p >= 32; p += 32) {
    v1 = Round(v1, DeviceLoads::Load64(p));
    v2 = Round(v2, DeviceLoads::Load64(p + 8));
    v3 = Round(v3, DeviceLoads::Load64(p + 16));
    v4 = Round(v4, DeviceLoads::Load64(p + 24));
  }
  return xxh64::Finish<DeviceLoads>(xxh64::Converge(v1, v2, v3, v4), n, p, end);
}

// A thread per leaf of one level (its row by binary search over the rows'
// first leaves: a row's leaves are neighbouring threads). Whole 16-byte
// aligned leaves, nearly all of them, are read through shared memory: at
// each step the CTA loads the next 128 bytes of each of its 128 leaves,
// eight threads to a leaf (whole 128-byte lines; a thread reading its own
// leaf alone would touch 32 lines per warp load, and the GPU then reads
// many of them twice), while each thread hashes its own leaf's previous
// 128 bytes out of shared memory. Any other leaf (a piece's short last
// one, or a piece that starts off 16 bytes) is hashed by its thread alone.
constexpr int kStep = 128;                     // bytes of each leaf per step
constexpr int kSteps = int(kLeaf) / kStep;     // 32
constexpr int kRow = kStep / 16 + 1;           // a leaf's row in the tile, in 16-byte words, padded against bank conflicts
constexpr int kLoaders = kStep / 16;           // threads loading one leaf's step
constexpr int kLeavesPerPass = kThreads / kLoaders;

__global__ void __launch_bounds__(kThreads) LeafKernel(const DeviceChecksums::Row* rows, uint32_t nrows,
                                                       uint64_t leaves) {
  __shared__ uint4 tile[kThreads * kRow];
  __shared__ const uint8_t* whole[kThreads];  // whole aligned leaves' bytes, else null
  const uint64_t i = uint64_t(blockIdx.x) * kThreads + threadIdx.x;
  const uint8_t* src = nullptr;
  uint64_t* out = nullptr;
  uint32_t n = 0;
  if (i < leaves) {
    uint32_t lo = 0, hi = nrows - 1;
    while (lo < hi) {
      const uint32_t mid = (lo + hi + 1) / 2;
      if (rows[mid].first_leaf <= i) lo = mid;
      else hi = mid - 1;
    }
    const DeviceChecksums::Row r = rows[lo];
    const uint64_t j = i - r.first_leaf, at = j * kLeaf;
    src = r.src + at;
    n = static_cast<uint32_t>(min(uint64_t{kLeaf}, r.bytes - at));
    out = r.out + j;
  }
  const bool mine_whole = n == kLeaf && (reinterpret_cast<uintptr_t>(src) & 15) == 0;
  whole[threadIdx.x] = mine_whole ? src : nullptr;
  __syncthreads();
  const int seg = threadIdx.x % kLoaders, lead = threadIdx.x / kLoaders;
  uint4 next[kThreads / kLeavesPerPass];
  auto load = [&](int step) {
#pragma unroll
    for (int k = 0; k < kThreads / kLeavesPerPass; ++k) {
      const uint8_t* b = whole[lead + kLeavesPerPass * k];
      next[k] = b != nullptr ? __ldcs(reinterpret_cast<const uint4*>(b + step * kStep) + seg) : make_uint4(0, 0, 0, 0);
    }
  };
  uint64_t v1 = xxh64::kLane1, v2 = xxh64::kLane2, v3 = xxh64::kLane3, v4 = xxh64::kLane4;
  load(0);
  for (int step = 0; step < kSteps; ++step) {
#pragma unroll
    for (int k = 0; k < kThreads / kLeavesPerPass; ++k) tile[(lead + kLeavesPerPass * k) * kRow + seg] = next[k];
    __syncthreads();
    if (step + 1 < kSteps) load(step + 1);
    if (mine_whole) {
      const uint4* row = tile + threadIdx.x * kRow;
#pragma unroll
      for (int s = 0; s < kStep / 32; ++s) {
        const uint4 a = row[2 * s], b = row[2 * s + 1];
        v1 = Round(v1, uint64_t(a.y) << 32 | a.x);
        v2 = Round(v2, uint64_t(a.w) << 32 | a.z);
        v3 = Round(v3, uint64_t(b.y) << 32 | b.x);
        v4 = Round(v4, uint64_t(b.w) << 32 | b.z);
      }
    }
    __syncthreads();
  }
  if (out == nullptr) return;
  if (!mine_whole) {
    *out = Xxh64Leaf(src, n);
    return;
  }
  const uint64_t h = xxh64::Finish<DeviceLoads>(xxh64::Converge(v1, v2, v3, v4), kLeaf, src + kLeaf, src + kLeaf);
  *out = h;
}

Status CudaError(cudaError_t e, const std::string& what) {
  return Internal("checksums on the GPU: " + what + ": " + cudaGetErrorString(e));
}

#define CHECKSUM_CUDA(call, what)                        \
  do {                                                   \
    const cudaError_t e_ = (call);                       \
    if (e_ != cudaSuccess) return CudaError(e_, what);   \
  } while (0)

}  // namespace

DeviceChecksums::~DeviceChecksums() {
  cudaFree(rows_dev_);
  cudaFreeHost(rows_host_);
  if (rows_copied_ != nullptr) cudaEventDestroy(rows_copied_);
  cudaFree(scratch_);
  cudaFree(results_dev_);
  cudaFreeHost(results_host_);
}

Status DeviceChecksums::Flush() {
  for (size_t k = 0; k < waiting_.size(); ++k) *waiting_[k] = results_host_[k];
  waiting_.clear();
  return Status::Ok();
}

// Buffers only grow (doubling), after the stream's work that may use them.
Status DeviceChecksums::Grow(uint64_t rows, uint64_t scratch_words, uint64_t results, cudaStream_t stream) {
  const bool device = rows > rows_cap_ || scratch_words > scratch_cap_ || results > results_dev_cap_;
  const bool host = rows > rows_host_cap_ || waiting_.size() + results > results_host_cap_;
  if (!device && !host) return Status::Ok();
  CHECKSUM_CUDA(cudaStreamSynchronize(stream), "waiting for the stream before growing buffers");
  WSYNC_RETURN_IF_ERROR(Flush());
  auto grow = [](auto** p, uint64_t* cap, uint64_t need, bool pinned) -> cudaError_t {
    if (need <= *cap) return cudaSuccess;
    const uint64_t n = std::max(need, *cap * 2);
    cudaError_t e = pinned ? cudaFreeHost(*p) : cudaFree(*p);
    *p = nullptr;
    *cap = 0;
    if (e == cudaSuccess) {
      e = pinned ? cudaMallocHost(reinterpret_cast<void**>(p), n * sizeof(**p))
                 : cudaMalloc(reinterpret_cast<void**>(p), n * sizeof(**p));
    }
    if (e == cudaSuccess) *cap = n;
    return e;
  };
  CHECKSUM_CUDA(grow(&rows_dev_, &rows_cap_, rows, false), "device memory for " + std::to_string(rows) + " rows");
  CHECKSUM_CUDA(grow(&rows_host_, &rows_host_cap_, rows, true), "pinned memory for " + std::to_string(rows) + " rows");
  CHECKSUM_CUDA(grow(&scratch_, &scratch_cap_, scratch_words, false),
                "device memory for " + std::to_string(scratch_words) + " leaf hashes");
  CHECKSUM_CUDA(grow(&results_dev_, &results_dev_cap_, results, false), "device memory for results");
  CHECKSUM_CUDA(grow(&results_host_, &results_host_cap_, results, true), "pinned memory for results");
  return Status::Ok();
}

Status DeviceChecksums::Enqueue(const ChecksumPiece* pieces, size_t count, uint64_t* out, cudaStream_t stream) {
  if (count == 0) return Status::Ok();
  if (rows_copied_ == nullptr) {
    CHECKSUM_CUDA(cudaEventCreateWithFlags(&rows_copied_, cudaEventDisableTiming), "event");
  } else {
    CHECKSUM_CUDA(cudaEventSynchronize(rows_copied_), "the last rows' copy");  // rows_host_ is free again
  }
  // The tree's rows level by level: a piece of more than one leaf passes
  // its leaf hashes (in scratch) up as the next level's bytes; a piece of
  // one leaf gets its result. Counted first (buffers sized), then written.
  struct Active {
    const uint8_t* src;
    uint64_t bytes;
    size_t idx;
  };
  struct Level {
    uint64_t first_row, rows, leaves;
  };
  std::vector<Level> levels;
  auto plan = [&](bool fill, uint64_t* nrows, uint64_t* words) {
    *nrows = 0, *words = 0;
    levels.clear();
    std::vector<Active> active(count), next;
    for (size_t i = 0; i < count; ++i) active[i] = {static_cast<const uint8_t*>(pieces[i].data), pieces[i].bytes, i};
    while (!active.empty()) {
      Level level{*nrows, 0, 0};
      next.clear();
      for (const Active& a : active) {
        const uint64_t leaves = std::max<uint64_t>(1, (a.bytes + kLeaf - 1) / kLeaf);
        if (fill) {
          uint64_t* o = leaves == 1 ? results_dev_ + a.idx : scratch_ + *words;
          rows_host_[*nrows] = Row{a.src, a.bytes, level.leaves, o};
          if (leaves > 1) next.push_back({reinterpret_cast<const uint8_t*>(o), leaves * 8, a.idx});
        } else if (leaves > 1) {
          next.push_back({nullptr, leaves * 8, a.idx});
        }
        if (leaves > 1) *words += leaves;
        ++*nrows;
        ++level.rows;
        level.leaves += leaves;
      }
      levels.push_back(level);
      active.swap(next);
    }
  };
  uint64_t nrows = 0, words = 0;
  plan(false, &nrows, &words);
  WSYNC_RETURN_IF_ERROR(Grow(nrows, words, count, stream));
  plan(true, &nrows, &words);
  CHECKSUM_CUDA(cudaMemcpyAsync(rows_dev_, rows_host_, nrows * sizeof(Row), cudaMemcpyHostToDevice, stream), "rows");
  CHECKSUM_CUDA(cudaEventRecord(rows_copied_, stream), "event");
  for (const Level& l : levels) {
    const uint64_t blocks = (l.leaves + kThreads - 1) / kThreads;
    LeafKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(rows_dev_ + l.first_row,
                                                                        static_cast<uint32_t>(l.rows), l.leaves);
    CHECKSUM_CUDA(cudaGetLastError(), "leaf kernel over " + std::to_string(l.leaves) + " leaves");
  }
  const size_t base = waiting_.size();
  CHECKSUM_CUDA(cudaMemcpyAsync(results_host_ + base, results_dev_, count * sizeof(uint64_t), cudaMemcpyDeviceToHost,
                                stream),
                "results");
  for (size_t i = 0; i < count; ++i) waiting_.push_back(out + i);
  return Status::Ok();
}

Status DeviceChecksums::Collect(cudaStream_t stream) {
  if (waiting_.empty()) return Status::Ok();
  CHECKSUM_CUDA(cudaStreamSynchronize(stream), "waiting for the checksum kernels");
  return Flush();
}

Status DeviceChecksums::Compute(const ChecksumPiece* pieces, size_t count, uint64_t* out, cudaStream_t stream) {
  WSYNC_RETURN_IF_ERROR(Enqueue(pieces, count, out, stream));
  return Collect(stream);
}

}  // namespace wsync
