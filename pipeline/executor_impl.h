// Private to the executor (pipeline/executor*.cc): what Create resolves a
// TrainerRankPlan into (executor_setup.cc) and what Run walks
// (executor.cc). Not for other callers.
#pragma once

#include <cstring>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <optional>
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
  size_t remote = 0;  // index into Impl::remotes
  // A box that is one contiguous run of the buffer it is cut from (held, q
  // or the scales), with no cast, is written straight from that buffer: no
  // staging slot, no pack.
  bool direct = false;
  uint64_t staging_at = 0;     // offset inside the source's chunk: its staging slot, or a direct write's bytes
  uint64_t staging_bytes = 0;  // 0 for a direct write
  // Delta versions: the index of its copy in Impl::copies (-1: always
  // whole), where its delta goes in its staging slot (after the bytes), and
  // its inbox slot on the receiver.
  int64_t copy = -1;
  uint64_t delta_at = 0;
  size_t inbox = 0;  // index into Impl::remotes
  uint64_t slot_at = 0, slot_bytes = 0;
  uint32_t elem_bytes = 1;
};

// The bytes of one write as last sent (ExecutorOptions::deltas).
struct DeltaCopy {
  uint64_t at = 0;  // in Impl::copy_memory
  uint64_t bytes = 0;
  uint64_t holds = ~0ull;  // the version they are; ~0: none
};

// One source, resolved at Create. Its temporary memory is one chunk of the
// arena: [held | gloo reserve | q | scales] (transient), then one staging
// slot per packed write (given back per write). The transient part is given
// back once the source's writes are posted and its direct writes (which read
// it) have completed.
struct SourceWork {
  size_t mesh_group = 0;
  const RankSource* src = nullptr;
  int gather_group = -1;  // index into Impl::gather_sets; -1: nothing to gather
  std::vector<int64_t> held_shape;
  uint64_t local_bytes = 0;
  uint64_t held_bytes = 0;
  uint64_t local_at = 0;  // where the local shard goes inside the held buffer
  // Planned exchange (RankSource::exchange()): the pieces of the local shard
  // for each peer, in group order, are copied to `send_at` and exchanged;
  // what the peers send lands in the held buffer, in group order.
  bool exchange = false;
  uint64_t send_at = 0;
  std::vector<int64_t> send_bytes, recv_bytes;
  std::vector<uint64_t> send_from;  // each piece's byte offset in the local shard
  // Bytes of one row of each piece (RankSource::send_cols narrows a piece to
  // part of each row of the shard: `local_row` bytes); packed row after row.
  std::vector<uint64_t> send_row;
  uint64_t local_row = 0;
  // Stacked tensors (a dim before the exchanged one spans several indices,
  // as experts do): a piece is one run of rows per leading index ("plane").
  // It is sent packed, received at `recv_at` and spread into the held
  // planes from there; with one plane it lands in place.
  uint64_t planes = 1;
  uint64_t local_pitch = 0, held_pitch = 0;  // bytes of one plane, in the shard and held
  uint64_t recv_at = 0;
  std::vector<uint64_t> recv_into;  // each received piece's byte offset inside a held plane
  bool quantize = false;
  // Quantized straight out of the trainer's shard: nothing to gather and
  // every write fp8 codes or scales, so the chunk has no held part. Where the
  // device cannot read the shard in place, it is first copied into
  // `fallback_bytes` of the arena of its own.
  bool in_place = false;
  uint64_t fallback_bytes = 0;
  std::optional<uint64_t> fallback;  // this version's copy of the shard, if made
  uint64_t q_at = 0;
  uint64_t scale_at = 0;
  // An fp32 source (fp32 master weights) quantized to fp8: first rounded to
  // bf16 here, as the engine would see its bf16 checkpoint.
  std::optional<uint64_t> bf16_at;
  uint64_t transient_bytes = 0;
  uint64_t need = 0;  // the chunk
  std::vector<WriteWork> writes;
  // This version's chunk and the holds on its transient part: the poster's
  // own until it has posted, plus one per direct write in flight. Under
  // Impl::mu.
  uint64_t chunk = 0;
  uint32_t pins = 0;
  // On a device with checksums: where its writes' hashes will be, one per
  // write (Impl::hash_batches); null: hashed as each is posted.
  const uint64_t* hashes = nullptr;
};

}  // namespace executor_detail

struct PlanExecutor::Impl {
  using Clock = executor_detail::Clock;
  using SourceWork = executor_detail::SourceWork;
  using WriteWork = executor_detail::WriteWork;
  using DeltaCopy = executor_detail::DeltaCopy;

  const TrainerRankPlan* plan = nullptr;
  transport::Engine* engine = nullptr;
  GroupFactory* group_factory = nullptr;
  ExecutorOptions options;

  std::vector<transport::RemoteMemory> remotes;
  std::vector<std::vector<int32_t>> gather_sets;  // distinct gather_ranks sets, first-use order
  std::vector<SourceWork> work;                   // every source, plan order
  std::vector<std::pair<size_t, size_t>> group_work;  // per MeshGroup: [begin, end) of work
  std::unique_ptr<TempArena> arena;
  std::vector<DeltaCopy> copies;
  decltype(HeldCopies::memory) copy_memory;  // host memory, or the device's
  const DeltaTarget* run_delta = nullptr;  // the Run's, if any

  std::vector<std::unique_ptr<CollectiveGroup>> gather_groups;  // index = gather_sets
  std::vector<std::unique_ptr<CollectiveGroup>> mesh_groups;    // index = plan.groups
  bool groups_ready = false;

  // Writes in flight; completions arrive on the engine's callback thread.
  std::mutex mu;
  std::condition_variable idle;
  uint64_t inflight = 0;  // guarded by mu
  Status write_error;     // first failed write of the version; guarded by mu
  std::atomic<bool> write_failed{false};
  bool writes_timed_out = false;  // under mu: the last Run's, for writes_timed_out()
  Clock::time_point run_start;

  // The version Run is in (executor thread only).
  uint64_t run_version = 0;
  ShardSource* run_shards = nullptr;
  VersionReport* run_report = nullptr;
  bool reads_reported = false;
  // On a device, sources whose stages are issued but whose writes are not
  // posted yet, in plan order: one wait for the device covers them all
  // (FlushPending), not one per source. Each issued at most one quantize;
  // `quantized` lists those in issue order, for the NaN/Inf flags.
  static constexpr size_t kMaxPending = 32;
  std::vector<SourceWork*> pending;
  std::vector<SourceWork*> quantized;
  // Checksums on a device (DeviceOps::Checksums): queued for every write of
  // the pending sources once they are settled, read after the version's
  // writes (Finish). A batch per flush, in a list so that the slots
  // SourceWork::hashes and hash_fills point at stay put; hash_fills: which
  // entry of the report's checksums each slot fills.
  std::list<std::vector<uint64_t>> hash_batches;
  std::vector<std::pair<size_t, const uint64_t*>> hash_fills;
  void HashPendingOnDevice(VersionReport* report);

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
  // ExecutorOptions::deltas: the write's inbox slot, if its receiver has one
  // it fits (staging grows to hold the delta); the copies come later.
  Status ResolveInbox(const RankWrite& w, const std::string& where, WriteWork* ww,
                      std::map<std::pair<int32_t, std::string>, size_t>* regions);
  // The copies, within what the watermark leaves above `arena_floor`: host
  // memory, or the device's.
  Status AssignCopies(uint64_t arena_floor);
  // Whether ww goes as a delta this version; if so encodes it after its
  // bytes in staging (header first) and says how long it is. Either way
  // the write's copy advances to the new bytes. On a device, called once
  // the write's bytes are final (after the wait that precedes posting); a
  // device error is recorded against the write and drops the copy.
  bool EncodeDelta(SourceWork& sw, const WriteWork& ww, uint64_t* length);
  // The plan's entry for inference rank `rank`, and its descriptor of
  // `region` (null: none, or an empty one).
  const InferencePeer* FindPeer(int32_t rank) const;
  const std::string* PeerDescriptor(int32_t rank, const std::string& region) const;
  StatusOr<transport::RemoteMemory> ImportRegion(int32_t dst_rank, const std::string& region,
                                                 const std::string& where,
                                                 std::map<std::pair<int32_t, std::string>, size_t>* regions,
                                                 size_t* index);
  Status ResolveSource(size_t g, const RankSource& src, std::map<std::pair<int32_t, std::string>, size_t>* regions);
  Status ResolveExchange(const RankSource& src, const std::string& where, SourceWork* sw);
  Status UnpackPlanes(const SourceWork& sw, const uint8_t* landing, uint8_t* held);
  Status StageToHost(const SourceWork& sw, VersionReport* report);
  Status EnsureGroups(uint64_t version);
  Status CheckVersion(size_t g, uint64_t version);
  // The start and the end of a Run or a replay: the report's fixed fields
  // and last errors reset; then the wait for writes in flight and the totals.
  void Begin(VersionReport* report);
  Status Finish(VersionReport* report);
  // The watermark step: sw's chunk of temporary memory, and its hold on it.
  Status TakeChunk(SourceWork& sw, VersionReport* report);
  Status RunSource(SourceWork& sw);
  // Tells the trainer it may go on, if `sw` is the version's last source.
  void ReadsDoneAfter(const SourceWork& sw);
  // Waits for the device's work, recording a NaN/Inf a quantize met against
  // its source (as its error; the version then posts nothing more).
  void Settle(const SourceWork& sw, const char* stage);
  // Temporary memory, posting what is pending first where waiting is needed.
  StatusOr<uint64_t> AllocateTemp(uint64_t bytes, bool* waited);
  // Settles and posts every pending source; without `post` (the version
  // failed in a collective), or once a failure has stopped this rank's
  // writes, only gives their memory back.
  void FlushPending(bool post = true);
  // Posts sw's writes from `posted` on (staging packed by `pack` just before,
  // where given), with `imm`; stops at the first refused one.
  void PostWrites(SourceWork& sw, std::optional<uint32_t> imm, const std::function<Status(const WriteWork&)>& pack,
                  size_t* posted, VersionReport* report, Clock::time_point* t0);
  // Gives back what sw still holds after posting: the staging of writes not
  // posted, and the poster's hold on the transient part.
  void GiveBack(SourceWork& sw, size_t posted);
  void Unpin(SourceWork& sw);
  void OnWriteDone(SourceWork& sw, const WriteWork& ww, uint64_t offset, const Status& s);
  void RecordError(const Status& s);
  // The copy and pack stages on the device, or on the host without one.
  Status Copy(uint8_t* dst, const uint8_t* src, uint64_t bytes) {
    if (options.device != nullptr) return options.device->Copy(dst, src, bytes);
    std::memcpy(dst, src, bytes);
    return Status::Ok();
  }
  Status Copy2D(uint8_t* dst, uint64_t dst_pitch, const uint8_t* src, uint64_t src_pitch, uint64_t width,
                uint64_t rows) {
    if (options.device != nullptr) return options.device->Copy2D(dst, dst_pitch, src, src_pitch, width, rows);
    for (uint64_t i = 0; i < rows; ++i) std::memcpy(dst + i * dst_pitch, src + i * src_pitch, width);
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
  // ExecutorOptions::checksums: the hash of the `bytes` at `at` in the arena
  // (final: packed, or settled on the device), read back in pieces on a device.
  StatusOr<uint64_t> ChecksumArena(uint64_t at, uint64_t bytes);
  std::vector<uint8_t> readback;  // a device's bytes on the host, a piece at a time
};

}  // namespace wsync
