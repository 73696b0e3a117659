// PlanExecutor: runs one trainer rank's part of a weight update, version
// after version, from its TrainerRankPlan (routing/rank_plan.h).
//
// Per version, for each MeshGroup in plan order and each of its sources in
// plan order (the same order on every rank of the group):
//   1. watermark: wait until temporary memory in flight plus this source's
//      needs fit under the watermark (writes in flight give theirs back);
//   2. copy: the local shard out of the ShardSource into temporary memory
//      (host-to-device on GPU; a plain copy on host);
//   3. unshard along gather_dim over gather_ranks: the planned exchange
//      (each peer sends only the rows this rank's writes read; what the
//      planner makes by default), or for a plan made without it an
//      all-gather of the whole held box (full_tensor);
//   4. quantize to fp8 e4m3 128x128 blocks when a write wants fp8 or scales;
//   5. pack each write's src_box row-major into registered staging and post
//      it as a one-sided write with immediate = version (low 32 bits); the
//      staging goes back when the engine reports the write done. A box that
//      is one contiguous run of its buffer is written from there, unpacked;
//      a source that gathers nothing and writes only fp8 is quantized
//      straight from the shard (no copy in step 2). On a device, stages are
//      asynchronous: sources wait in a pending list and one device wait
//      covers up to 32 of them before their writes are posted;
// then a Gloo barrier over the MeshGroup. After the last all-gather of the
// version the ShardSource hears ReadsDone(version): the trainer may change its
// weights while the last writes are still on the wire. Run returns once every
// write has completed.
//
// Temporary memory is one arena registered once (pipeline/temp_arena.h), at
// most the watermark; collective groups (pipeline/group.h: Gloo for the
// sidecar, torch's process groups in-process) (one per distinct gather_ranks set, one per
// MeshGroup for its barrier and a version check) are made on the first Run
// and reused; rendezvous names carry a generation (the version that built
// them), so after a failed collective the next Run rebuilds them on every
// rank alike.
//
// Region descriptors in the plan are the hex text of
// transport::MemoryDescriptor::Serialize() (the wsync.inference/v1
// convention, MemoryDescriptor::ToText); raw bytes are accepted too.
//
// Errors: Create refuses a plan it cannot run (a source needing more than the
// watermark, a box outside what the rank holds, an unknown region, a dtype it
// cannot produce) before anything starts. Run's failures (dead peer = Gloo
// timeout, transport error, a non-finite weight, ranks on different
// versions) are one Status naming the rank, MeshGroup and tensor; the
// version is not done then. A local failure (a write, a quantize) stops this
// rank's writes but not its collectives, so its peers finish the version at
// once instead of at a Gloo timeout, and ReadsDone still comes after the
// last all-gather; a failed collective ends the version without ReadsDone
// (trainer_agent then marks the version failed, which also releases the
// trainer). Callers: `wsync trainer-agent` and the tests.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/checksum.h"
#include "common/status.h"
#include "pipeline/device.h"
#include "pipeline/group.h"
#include "pipeline/shard_source.h"
#include "pipeline/temp_arena.h"
#include "routing/rank_plan.h"
#include "transport/engine.h"

namespace wsync {

struct ExecutorOptions {
  // Bound on temporary memory (gathered tensors, quantized bytes, write
  // staging) at any moment. The arena is min(watermark, one version's needs).
  uint64_t watermark_bytes = 1ull << 30;
  // Prefix of every group name (Gloo rendezvous keys), e.g. the job name or
  // plan id: one store may serve several jobs.
  std::string rendezvous_prefix = "wsync";
  // Bound on waiting for temporary memory and for the last writes. The
  // engine's own per-operation timeout normally ends a dead write sooner.
  std::chrono::milliseconds write_timeout{std::chrono::seconds(120)};
  // Where temporary memory lives and the copy/pack/quantize stages run
  // (pipeline/device.h); nullptr: host memory and the CPU stages. Must
  // outlive the executor; the engine must have been made for its memory.
  DeviceOps* device = nullptr;
  // Hash every write's bytes as posted (common/checksum.h), for the
  // inference ranks' integrity check: VersionReport::checksums. Costs a
  // pass over the written bytes on the host (read back first from a
  // device), so it is off unless asked for.
  bool checksums = false;
  // With a device: the writes leave from pinned host memory, each one's
  // bytes copied device-to-host first (pipeline/device.h, host staging).
  // For an engine that cannot register device memory; slower than writes
  // straight from the device by one copy of every written byte.
  bool stage_through_host = false;
  // Delta versions (docs/DELTAS.md): keep a copy of the bytes last sent for
  // each write that can take a delta (its receiver registered an inbox for
  // its region, delta/inbox.h), and where Run is given a DeltaTarget send
  // only what changed into the write's inbox slot. The copies count against
  // the watermark: they take what is left of it above twice the largest
  // source's need (writes past that always go whole; the report says how
  // much is covered). With a device the copies are its memory (Allocate)
  // and the encode its (DeviceOps::EncodeDelta), once a write's staged bytes
  // are final; a device without EncodesDeltas() sends every write whole.
  bool deltas = false;
};

// The copies of what receivers hold (ExecutorOptions::deltas), handed from
// an executor to its successor for a new registration epoch: the routing is
// the same, only descriptors moved, so the bytes each write last sent are
// still what its receiver holds (or the controller says otherwise).
struct HeldCopies {
  struct Entry {
    int32_t dst_rank = -1;
    std::string region;
    uint64_t offset = 0, bytes = 0;  // the write's
    uint64_t at = 0;                 // in memory
    uint64_t holds = ~0ull;
  };
  std::vector<Entry> entries;
  // Host memory, or the device's (ExecutorOptions::device, which must then
  // outlive it): the deleter gives it back to whichever it is.
  std::unique_ptr<uint8_t[], std::function<void(uint8_t*)>> memory;
};

// What the controller decided for one version (controller::VersionStatus):
// writes to inference ranks in `ranks` may go as deltas against `base`.
struct DeltaTarget {
  uint64_t base = 0;
  std::vector<int32_t> ranks;
};

// Seconds spent per stage in one Run.
struct StageSeconds {
  double copy = 0;            // local shard -> temporary memory
  double unshard = 0;         // planned exchanges, or all-gathers (full_tensor)
  double quantize_pack = 0;   // fp8 quantize + packing boxes into staging
  double post = 0;            // handing writes to the engine
  double watermark_wait = 0;  // waiting for temporary memory
  double wait_writes = 0;     // waiting for the last writes after posting all
  double barrier = 0;         // MeshGroup barriers and version checks
  double rendezvous = 0;      // building Gloo groups (first version, after a failure)
  double checksum = 0;        // hashing the written bytes (ExecutorOptions::checksums)
  double delta = 0;           // finding what changed and encoding it (ExecutorOptions::deltas)
  // Before the executor ran: waiting for engine-paced inference ranks to let
  // the version in (trainer_agent::RunAndReport); not part of `total`.
  double engine_wait = 0;
  double total = 0;
};

struct VersionReport {
  uint64_t version = 0;
  StageSeconds seconds;
  double reads_done_after = 0;   // seconds from start until ReadsDone
  uint64_t copied_bytes = 0;     // local shards read
  uint64_t gathered_bytes = 0;   // held tensors after all-gather or exchange
  uint64_t exchanged_bytes = 0;  // of those, bytes received from peers (exchange or all-gather)
  uint64_t written_bytes = 0;     // on the wire: a delta write counts its delta
  // ExecutorOptions::deltas: writes sent as deltas, the weight bytes they
  // stand for (the rest of written_bytes went whole), and the memory the
  // copies of what receivers hold take, for how many of this rank's write
  // bytes.
  uint64_t delta_writes = 0;
  uint64_t delta_covered_bytes = 0;
  uint64_t delta_copy_bytes = 0;
  uint64_t write_bytes = 0;       // every write's weight bytes, whole
  uint64_t staged_bytes = 0;     // of those, copied device-to-host first (stage_through_host)
  uint64_t writes = 0;
  uint64_t sources = 0;
  uint64_t watermark_waits = 0;  // sources that had to wait for memory
  uint64_t peak_temp_bytes = 0;  // never above watermark_bytes
  uint64_t watermark_bytes = 0;
  // With ExecutorOptions::checksums: one per write posted, in posting order.
  std::vector<WriteChecksum> checksums;

  // One line: "version 7: 1.23 s, 512.0 MiB written (0.43 GB/s), copy ..."
  std::string Summary() const;
};

class PlanExecutor {
 public:
  // `engine` and `groups` must outlive the executor. Imports every peer
  // region of the plan and registers the temporary memory; no collectives
  // (groups are joined on the first Run).
  static StatusOr<std::unique_ptr<PlanExecutor>> Create(TrainerRankPlan plan, transport::Engine* engine,
                                                        GroupFactory* groups, ExecutorOptions options);
  ~PlanExecutor();
  PlanExecutor(const PlanExecutor&) = delete;
  PlanExecutor& operator=(const PlanExecutor&) = delete;

  // Runs one version. Every rank of the plan must run the same versions in
  // the same order. Not reentrant.
  // With ExecutorOptions::deltas and a `delta` target, a write to a rank of
  // the target whose copy holds exactly `delta->base` goes as a delta when
  // that fits its slot; every other write goes whole. A failed Run drops
  // every copy (the next version goes whole).
  StatusOr<VersionReport> Run(uint64_t version, ShardSource& shards, const DeltaTarget* delta = nullptr);

  // For benches: posts every write of the plan as Run does (same sizes,
  // destinations, order and watermark) straight from the arena, with no
  // immediate and none of the stages before the write, and waits for them:
  // what the engine alone takes for this plan's writes. The bytes are
  // whatever the arena holds, so the inference weights are garbage after it
  // until the next version lands (the inference ranks count nothing).
  StatusOr<VersionReport> ReplayWrites();

  const TrainerRankPlan& plan() const { return plan_; }
  // Temporary memory actually mapped (<= watermark).
  uint64_t arena_bytes() const;
  // The most temporary memory one source needs: the smallest watermark this
  // plan runs under (then sources run one at a time).
  uint64_t max_source_need() const;
  // ExecutorOptions::deltas: bytes of the copies kept, and of the writes
  // they cover (of plan().write_bytes).
  uint64_t delta_copy_bytes() const;
  // Hands the copies over (this executor keeps none after it) / takes over
  // those of writes this plan has too (same receiver, region, offset and
  // length), each still holding the version it held.
  HeldCopies TakeHeldCopies();
  void AdoptHeldCopies(HeldCopies held);
  // Drops the collective groups; the next Run rebuilds them (generation = its
  // version). Run does this by itself after a failed collective.
  void ResetGroups();
  // Whether a write of the last Run did not complete in time. The engine may
  // then be unable to complete writes to anyone (libfabric's shm after a
  // peer died with writes outstanding: docs/transport.md), so the agents
  // replace it, with a new executor, before the next version.
  bool writes_timed_out() const;

 private:
  struct Impl;
  explicit PlanExecutor(TrainerRankPlan plan);

  TrainerRankPlan plan_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace wsync
