#include "trainer_agent/shard_export.h"

#include <cinttypes>
#include <cstdio>
#include <new>
#include <thread>

namespace wsync::trainer_agent {
namespace {

constexpr uint64_t kMagic = 0x3152545f434e5953ull;  // "SYNC_TR1" little-endian
constexpr uint32_t kFormat = 2;  // 2: the placement word

uint64_t AlignUp(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

// FNV-1a, 64 bit: stable across processes and builds (std::hash is not).
struct Fnv {
  uint64_t h = 0xcbf29ce484222325ull;
  void Bytes(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  }
  void U64(uint64_t v) { Bytes(&v, sizeof v); }
  void Str(const std::string& s) {
    U64(s.size());
    Bytes(s.data(), s.size());
  }
};

std::string Hex(uint64_t v) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

// Waits with short sleeps: the trainer and agent are separate processes and
// these waits happen once per version, so a futex buys nothing.
template <typename Pred>
bool PollUntil(Pred done, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto nap = std::chrono::microseconds(50);
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(nap);
    if (nap < std::chrono::microseconds(2000)) nap *= 2;
  }
  return true;
}

void RaiseTo(std::atomic<uint64_t>& word, uint64_t v) {
  uint64_t cur = word.load(std::memory_order_relaxed);
  while (cur < v && !word.compare_exchange_weak(cur, v, std::memory_order_release,
                                                std::memory_order_relaxed)) {
  }
}

}  // namespace

const ShardSlot* ShardLayout::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &slots[it->second];
}

StatusOr<ShardLayout> ComputeShardLayout(const TrainerRank& rank, ShardPlacement placement) {
  ShardLayout layout;
  layout.rank = rank.rank;
  layout.placement = placement;
  const bool in_region = placement == ShardPlacement::kInRegion;
  Fnv fnv;
  fnv.U64(kFormat);
  fnv.U64(static_cast<uint64_t>(static_cast<int64_t>(rank.rank)));
  fnv.U64(static_cast<uint64_t>(placement));
  uint64_t offset = kShardHeaderBytes;
  for (const TrainerParam& p : rank.params) {
    ShardSlot slot;
    slot.name = p.name;
    slot.dtype = p.dtype;
    slot.local_shape = p.local_shape;
    uint64_t elems = 1;
    for (int64_t d : p.local_shape) {
      if (d < 0) {
        return InvalidArgument("trainer rank " + std::to_string(rank.rank) + ": tensor '" + p.name +
                               "': negative local_shape dim");
      }
      elems *= static_cast<uint64_t>(d);
    }
    slot.bytes = elems * static_cast<uint64_t>(DTypeSize(p.dtype));
    if (in_region) {
      slot.offset = AlignUp(offset, kShardAlignment);
      offset = slot.offset + slot.bytes;
    }
    if (!layout.index_.emplace(p.name, layout.slots.size()).second) {
      return InvalidArgument("trainer rank " + std::to_string(rank.rank) + ": tensor '" + p.name +
                             "' is listed twice");
    }
    fnv.Str(slot.name);
    fnv.U64(static_cast<uint64_t>(slot.dtype));
    fnv.U64(slot.local_shape.size());
    for (int64_t d : slot.local_shape) fnv.U64(static_cast<uint64_t>(d));
    fnv.U64(slot.offset);
    layout.slots.push_back(std::move(slot));
  }
  layout.total_bytes = AlignUp(offset, kShardAlignment);
  fnv.U64(layout.total_bytes);
  layout.hash = fnv.h;
  return layout;
}

StatusOr<std::string> ShardRegionName(const std::string& job, int32_t rank) {
  if (job.empty() || job.find('/') != std::string::npos) {
    return InvalidArgument("shard export: job name '" + job + "' must be non-empty and contain no '/'");
  }
  if (rank < 0) return InvalidArgument("shard export: rank must be >= 0");
  return "/wsync-" + job + "-train-" + std::to_string(rank);
}

// ------------------------------------------------------------ ShardExport --

StatusOr<std::unique_ptr<ShardExport>> ShardExport::Create(const std::string& region_name,
                                                           const TrainerRank& rank, ShardPlacement placement) {
  WSYNC_ASSIGN_OR_RETURN(ShardLayout layout, ComputeShardLayout(rank, placement));
  WSYNC_ASSIGN_OR_RETURN(ShmRegion region, ShmRegion::Create(region_name, layout.total_bytes));
  // The header goes in last-field-last: an agent that opens the region early
  // sees a wrong magic until then and retries.
  auto* h = new (region.data()) ShardHeader{};
  h->format = kFormat;
  h->rank = rank.rank;
  h->placement = static_cast<uint32_t>(placement);
  h->layout_hash = layout.hash;
  h->total_bytes = layout.total_bytes;
  h->published_version.store(0, std::memory_order_relaxed);
  h->reads_done_version.store(0, std::memory_order_relaxed);
  h->failed_version.store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  reinterpret_cast<std::atomic<uint64_t>*>(&h->magic)->store(kMagic, std::memory_order_release);
  return std::unique_ptr<ShardExport>(new ShardExport(std::move(region), std::move(layout)));
}

StatusOr<ShardTensor> ShardExport::Tensor(const std::string& name) const {
  const ShardSlot* slot = layout_.Find(name);
  if (slot == nullptr) {
    return NotFound("shard export " + region_.name() + ": trainer rank " + std::to_string(layout_.rank) +
                    " has no tensor '" + name + "' in its spec");
  }
  if (layout_.placement != ShardPlacement::kInRegion) {
    return FailedPrecondition("shard export " + region_.name() + ": trainer rank " + std::to_string(layout_.rank) +
                              " exports its shards by CUDA IPC; they are read where they are, not copied in");
  }
  return ShardTensor{region_.data() + slot->offset, slot->bytes, slot->dtype, slot->local_shape};
}

Status ShardExport::Publish(uint64_t v) {
  const uint64_t last = header()->published_version.load(std::memory_order_relaxed);
  if (v == 0 || v <= last) {
    return InvalidArgument("shard export " + region_.name() + ": version " + std::to_string(v) +
                           " must be above the last published version " + std::to_string(last));
  }
  // Release: the agent that sees v also sees every weight byte written before.
  header()->published_version.store(v, std::memory_order_release);
  return Status::Ok();
}

Status ShardExport::WaitReadsDone(uint64_t v, std::chrono::milliseconds timeout) const {
  const ShardHeader* h = header();
  if (!PollUntil([&] { return h->reads_done_version.load(std::memory_order_acquire) >= v; }, timeout)) {
    return DeadlineExceeded("shard export " + region_.name() + ": the trainer agent did not finish reading version " +
                            std::to_string(v) + " within " + std::to_string(timeout.count()) +
                            " ms (last done: " + std::to_string(reads_done_version()) +
                            "); is `wsync trainer-agent` running for this rank?");
  }
  return Status::Ok();
}

uint64_t ShardExport::published_version() const {
  return header()->published_version.load(std::memory_order_acquire);
}
uint64_t ShardExport::reads_done_version() const {
  return header()->reads_done_version.load(std::memory_order_acquire);
}
uint64_t ShardExport::failed_version() const {
  return header()->failed_version.load(std::memory_order_acquire);
}

// -------------------------------------------------------------- ShardView --

StatusOr<std::unique_ptr<ShardView>> ShardView::Open(const std::string& region_name,
                                                     const TrainerRank& rank, ShardPlacement placement) {
  WSYNC_ASSIGN_OR_RETURN(ShardLayout layout, ComputeShardLayout(rank, placement));
  WSYNC_ASSIGN_OR_RETURN(ShmRegion region, ShmRegion::Open(region_name));
  const std::string where = "shard view " + region_name + ": ";
  if (region.size() < sizeof(ShardHeader)) {
    return FailedPrecondition(where + "region is " + std::to_string(region.size()) +
                              " bytes, too small for a shard export header");
  }
  const auto* h = reinterpret_cast<const ShardHeader*>(region.data());
  const uint64_t magic =
      reinterpret_cast<const std::atomic<uint64_t>*>(&h->magic)->load(std::memory_order_acquire);
  if (magic != kMagic || h->format != kFormat) {
    return FailedPrecondition(where + "not a wsync shard export (or not initialized yet)");
  }
  if (h->rank != rank.rank) {
    return FailedPrecondition(where + "exported by trainer rank " + std::to_string(h->rank) +
                              ", but this agent is rank " + std::to_string(rank.rank));
  }
  if (h->placement != static_cast<uint32_t>(placement)) {
    return FailedPrecondition(
        where + (h->placement == static_cast<uint32_t>(ShardPlacement::kCudaIpc)
                     ? "the trainer exports its shards by CUDA IPC (they are on its GPU); start the agent with "
                       "--cuda-ipc and the file wsync.export_shards wrote"
                     : "the trainer copies its shards into this region (they are in host memory); start the agent "
                       "without --cuda-ipc"));
  }
  if (h->layout_hash != layout.hash || h->total_bytes != layout.total_bytes ||
      region.size() < layout.total_bytes) {
    return FailedPrecondition(where + "layout hash " + Hex(h->layout_hash) + " (" +
                              std::to_string(h->total_bytes) + " bytes) differs from the agent's " +
                              Hex(layout.hash) + " (" + std::to_string(layout.total_bytes) +
                              " bytes) for rank " + std::to_string(rank.rank) +
                              "; trainer and agent must use the same TrainerRank spec");
  }
  return std::unique_ptr<ShardView>(new ShardView(std::move(region), std::move(layout)));
}

const uint8_t* ShardView::Shard(const std::string& name, uint64_t* bytes) const {
  const ShardSlot* slot = layout_.Find(name);
  if (slot == nullptr || layout_.placement != ShardPlacement::kInRegion) return nullptr;
  if (bytes != nullptr) *bytes = slot->bytes;
  return region_.data() + slot->offset;
}

uint64_t ShardView::published_version() const {
  return header()->published_version.load(std::memory_order_acquire);
}

uint64_t ShardView::reads_done_version() const {
  return header()->reads_done_version.load(std::memory_order_acquire);
}

StatusOr<uint64_t> ShardView::WaitPublished(uint64_t after, std::chrono::milliseconds timeout) const {
  uint64_t v = 0;
  if (!PollUntil([&] { return (v = published_version()) > after; }, timeout)) {
    return DeadlineExceeded("shard view " + region_.name() + ": no version above " + std::to_string(after) +
                            " published within " + std::to_string(timeout.count()) + " ms");
  }
  return v;
}

void ShardView::MarkReadsDone(uint64_t v) { RaiseTo(header()->reads_done_version, v); }

void ShardView::MarkFailed(uint64_t v) {
  RaiseTo(header()->failed_version, v);
  RaiseTo(header()->reads_done_version, v);
}

}  // namespace wsync::trainer_agent
