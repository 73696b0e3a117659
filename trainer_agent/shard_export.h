// Trainer shards in shared memory: the hand-off between a trainer process and
// its `wsync trainer-agent` sidecar on the same host.
//
// The trainer side (ShardExport, a few calls after each optimizer step)
// creates one region per rank, "/wsync-<job>-train-<rank>", holding a header
// and the rank's local shards (its TrainerRank spec's params, in param order,
// row-major local_shape, each at a 256-byte aligned offset). The agent side
// (ShardView) opens the same region with the same spec and refuses it unless
// the layout hash matches, so both processes agree on every byte offset
// without exchanging a table.
//
// The protocol is two version words in the header:
//   trainer: write weights of version v -> Publish(v)
//   agent:   sees published_version == v, reads the shards, MarkReadsDone(v)
//   trainer: WaitReadsDone(v) before modifying the weights again.
// The agent also marks reads done when it abandons a version (failure), so a
// trainer never waits on a dead update; failed_version says which one failed.
// Versions start at 1 (0 means "nothing yet") and only grow.
//
// Shards on a GPU are not copied into the region: the trainer exports them
// by CUDA IPC handles (placement kCudaIpc, trainer_agent/cuda_shards.h) and
// the region is the header alone, carrying the same version words. The
// placement is in the header, so an agent started for the other one is
// refused saying which flag it lacks.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/shm_region.h"
#include "common/status.h"
#include "pipeline/shard_source.h"
#include "routing/metadata.h"

namespace wsync::trainer_agent {

inline constexpr uint64_t kShardAlignment = 256;
inline constexpr uint64_t kShardHeaderBytes = 4096;

// Where the shard bytes are: in the region after the header, or the
// trainer's own CUDA memory, opened by the agent through CUDA IPC.
enum class ShardPlacement : uint32_t { kInRegion = 0, kCudaIpc = 1 };

// Where one local shard lives in the region.
struct ShardSlot {
  std::string name;
  DType dtype = DType::kBF16;
  Shape local_shape;
  uint64_t offset = 0;  // bytes from the region start, kShardAlignment-aligned; 0 for kCudaIpc
  uint64_t bytes = 0;
};

// The deterministic layout of one rank's region.
struct ShardLayout {
  int32_t rank = -1;
  ShardPlacement placement = ShardPlacement::kInRegion;
  std::vector<ShardSlot> slots;  // in param order
  uint64_t total_bytes = 0;      // region size, header included
  uint64_t hash = 0;             // over rank, names, dtypes, shapes and offsets

  // The slot of `name`, or null.
  const ShardSlot* Find(const std::string& name) const;

 private:
  friend StatusOr<ShardLayout> ComputeShardLayout(const TrainerRank& rank, ShardPlacement placement);
  std::unordered_map<std::string, size_t> index_;
};

StatusOr<ShardLayout> ComputeShardLayout(const TrainerRank& rank,
                                         ShardPlacement placement = ShardPlacement::kInRegion);

// "/wsync-<job>-train-<rank>". `job` must be non-empty and contain no '/'.
StatusOr<std::string> ShardRegionName(const std::string& job, int32_t rank);

// The header at offset 0 of the region. The atomics are lock-free, so they
// work across processes that map the same pages.
struct ShardHeader {
  uint64_t magic;
  uint32_t format;
  int32_t rank;
  uint32_t placement;  // ShardPlacement
  uint64_t layout_hash;
  uint64_t total_bytes;
  std::atomic<uint64_t> published_version;
  std::atomic<uint64_t> reads_done_version;
  std::atomic<uint64_t> failed_version;
};
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(sizeof(ShardHeader) <= kShardHeaderBytes);

// A mutable view of one shard.
struct ShardTensor {
  void* data = nullptr;
  uint64_t bytes = 0;
  DType dtype = DType::kBF16;
  Shape local_shape;
};

// Trainer side. Owns the region name: destroying it unlinks the name.
class ShardExport {
 public:
  static StatusOr<std::unique_ptr<ShardExport>> Create(const std::string& region_name,
                                                       const TrainerRank& rank,
                                                       ShardPlacement placement = ShardPlacement::kInRegion);

  // Where to write the local shard of `name` (NotFound for a tensor not in
  // this rank's spec; FailedPrecondition for kCudaIpc, whose shards stay in
  // the trainer's CUDA memory).
  StatusOr<ShardTensor> Tensor(const std::string& name) const;

  // Announces that the shards now hold version `v`. InvalidArgument unless v
  // is above the last published version.
  Status Publish(uint64_t v);

  // Blocks until the agent has finished reading version `v` (or abandoned
  // it). DeadlineExceeded after `timeout` (the agent is gone or stuck).
  Status WaitReadsDone(uint64_t v, std::chrono::milliseconds timeout) const;

  uint64_t published_version() const;
  uint64_t reads_done_version() const;
  // The last version the agent reported as failed (0: none).
  uint64_t failed_version() const;

  const ShardLayout& layout() const { return layout_; }
  const std::string& region_name() const { return region_.name(); }

 private:
  ShardExport(ShmRegion region, ShardLayout layout)
      : region_(std::move(region)), layout_(std::move(layout)) {}
  ShardHeader* header() const { return reinterpret_cast<ShardHeader*>(region_.data()); }

  ShmRegion region_;
  ShardLayout layout_;
};

// Agent side: opens a region created by ShardExport; the executor reads the
// shards through the ShardSource interface.
class ShardView : public ShardSource {
 public:
  // FailedPrecondition if the region is not a shard export, or was made for
  // another rank, another layout (the trainer and agent disagree on the
  // spec: the message names both hashes and what to check) or another
  // placement (the message names the flag).
  static StatusOr<std::unique_ptr<ShardView>> Open(const std::string& region_name,
                                                   const TrainerRank& rank,
                                                   ShardPlacement placement = ShardPlacement::kInRegion);

  // ShardSource: the shard bytes of `name` (null if not in the layout, and
  // for kCudaIpc, whose bytes cuda_shards.h reads), and ReadsDone =
  // MarkReadsDone.
  const uint8_t* Shard(const std::string& name, uint64_t* bytes) const override;
  void ReadsDone(uint64_t version) override { MarkReadsDone(version); }

  uint64_t published_version() const;
  uint64_t reads_done_version() const;
  // Blocks until published_version() > `after`, returns it; DeadlineExceeded
  // after `timeout`.
  StatusOr<uint64_t> WaitPublished(uint64_t after, std::chrono::milliseconds timeout) const;
  // The trainer may modify its weights again.
  void MarkReadsDone(uint64_t v);
  // Version `v` will not complete; also marks its reads done.
  void MarkFailed(uint64_t v);

  const ShardLayout& layout() const { return layout_; }

 private:
  ShardView(ShmRegion region, ShardLayout layout)
      : region_(std::move(region)), layout_(std::move(layout)) {}
  ShardHeader* header() const { return reinterpret_cast<ShardHeader*>(region_.data()); }

  ShmRegion region_;
  ShardLayout layout_;
};

}  // namespace wsync::trainer_agent
