// Private to the executor (pipeline/executor*.cc): what Create resolves a
// TrainerRankPlan into (executor_setup.cc) and what Run walks
// (executor.cc). Not for other callers.
#pragma once

#include <cstring>

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "pipeline/box_pack.h"
#include "pipeline/executor.h"

namespace wsync {
namespace executor_detail {

using Clock = std::chrono::steady_clock;

inline double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

inline uint64_t Elements(const Box& b) { return static_cast<uint64_t>(b.NumElements()); }

inline std::string BoxStr(const Box& b) {
  std::string s = "[";
  for (int d = 0; d < b.ndim; ++d) {
    if (d > 0) s += ", ";
    s += std::to_string(b.offset[d]) + ":" + std::to_string(b.offset[d] + b.size[d]);
  }
  return s + "]";
}

// Descriptors travel as hex text in JSON documents (MemoryDescriptor::ToText);
// raw Serialize() bytes are accepted too.
inline StatusOr<transport::MemoryDescriptor> ParseDescriptorText(const std::string& text) {
  StatusOr<transport::MemoryDescriptor> d = transport::MemoryDescriptor::FromText(text);
  if (d.ok()) return d;
  return transport::MemoryDescriptor::Parse(text);
}

// One write of one source, resolved at Create.
struct WriteWork {
  const RankWrite* write = nullptr;
  size_t remote = 0;        // index into Impl::remotes
  uint64_t staging_at = 0;  // offset of its staging inside the source's chunk
  uint64_t staging_bytes = 0;
};

// One source, resolved at Create. Its temporary memory is one chunk of the
// arena: [held | gloo reserve | q | scales] (transient, given back after
// packing) followed by one staging slot per write (given back per write).
struct SourceWork {
  size_t mesh_group = 0;
  const RankSource* src = nullptr;
  int gather_group = -1;  // index into Impl::gather_sets; -1: nothing to gather
  std::vector<int64_t> held_shape;
  uint64_t local_bytes = 0;
  uint64_t held_bytes = 0;
  uint64_t local_at = 0;  // where the local shard goes inside the held buffer
  bool quantize = false;
  uint64_t q_at = 0;
  uint64_t scale_at = 0;
  uint64_t transient_bytes = 0;
  uint64_t need = 0;
  std::vector<WriteWork> writes;
};


}  // namespace executor_detail

struct PlanExecutor::Impl {
  using Clock = executor_detail::Clock;
  using SourceWork = executor_detail::SourceWork;
  using WriteWork = executor_detail::WriteWork;

  const TrainerRankPlan* plan = nullptr;
  transport::Engine* engine = nullptr;
  GroupFactory* group_factory = nullptr;
  ExecutorOptions options;

  std::vector<transport::RemoteMemory> remotes;
  std::vector<std::vector<int32_t>> gather_sets;  // distinct gather_ranks sets, first-use order
  std::vector<SourceWork> work;                   // every source, plan order
  std::vector<std::pair<size_t, size_t>> group_work;  // per MeshGroup: [begin, end) of work
  std::unique_ptr<TempArena> arena;

  std::vector<std::unique_ptr<CollectiveGroup>> gather_groups;  // index = gather_sets
  std::vector<std::unique_ptr<CollectiveGroup>> mesh_groups;    // index = plan.groups
  bool groups_ready = false;

  // Writes in flight; completions arrive on the engine's callback thread.
  std::mutex mu;
  std::condition_variable idle;
  uint64_t inflight = 0;  // guarded by mu
  Status write_error;     // first failed write of the version; guarded by mu
  std::atomic<bool> write_failed{false};
  Clock::time_point run_start;

  std::string Where(const SourceWork& sw) const {
    return "trainer rank " + std::to_string(plan->rank) + ": mesh group '" + plan->groups[sw.mesh_group].name +
           "': tensor '" + sw.src->name + "'";
  }
  std::string WriteWhere(const SourceWork& sw, const RankWrite& w) const {
    return Where(sw) + ": write to inference rank " + std::to_string(w.dst_rank) + " '" + w.dst_name +
           "' (region '" + w.region + "' offset " + std::to_string(w.region_offset) + ", " +
           std::to_string(w.bytes) + " bytes)";
  }

  Status Resolve();
  Status ResolveSource(size_t g, const RankSource& src, std::map<std::pair<int32_t, std::string>, size_t>* regions);
  Status EnsureGroups(uint64_t version);
  Status CheckVersion(size_t g, uint64_t version);
  Status RunSource(SourceWork& sw, uint64_t version, ShardSource& shards, VersionReport* report);
  void OnWriteDone(const SourceWork& sw, const WriteWork& ww, uint64_t offset, const Status& s);
  void RecordError(const Status& s);
  // The copy and pack stages on the device, or on the host without one.
  Status Copy(uint8_t* dst, const uint8_t* src, uint64_t bytes) {
    if (options.device != nullptr) return options.device->Copy(dst, src, bytes);
    std::memcpy(dst, src, bytes);
    return Status::Ok();
  }
  Status Zero(uint8_t* dst, uint64_t bytes) {
    if (options.device != nullptr) return options.device->Zero(dst, bytes);
    std::memset(dst, 0, bytes);
    return Status::Ok();
  }
  Status Pack(const uint8_t* data, const Box& held, DType from, const Box& box, DType to, uint8_t* out) {
    if (options.device != nullptr) return options.device->PackBox(data, held, from, box, to, out);
    PackBox(data, held, from, box, to, out);
    return Status::Ok();
  }
  Status WaitWrites(Clock::time_point deadline);
};

}  // namespace wsync
