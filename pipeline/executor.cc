#include "pipeline/executor.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "pipeline/box_pack.h"
#include "pipeline/executor_impl.h"

namespace wsync {

using namespace executor_detail;  // NOLINT: this file's own private helpers

// ----------------------------------------------------------- collectives --

Status PlanExecutor::Impl::EnsureGroups(uint64_t version) {
  if (groups_ready) return Status::Ok();
  gather_groups.clear();
  mesh_groups.clear();
  gather_groups.resize(gather_sets.size());
  const std::string gen = options.rendezvous_prefix + "/gen" + std::to_string(version);
  auto index_of = [&](const std::vector<int32_t>& ranks) {
    return static_cast<int>(std::find(ranks.begin(), ranks.end(), plan->rank) - ranks.begin());
  };
  // Every rank makes its groups in the same global order (MeshGroup by
  // MeshGroup, sources in plan order), so no two ranks wait on each other
  // crosswise during rendezvous.
  for (size_t g = 0; g < plan->groups.size(); ++g) {
    const RankMeshGroup& group = plan->groups[g];
    StatusOr<std::unique_ptr<CollectiveGroup>> mesh =
        group_factory->Join(gen + "/mesh/" + group.name, group.ranks, index_of(group.ranks));
    if (!mesh.ok()) {
      return mesh.status().WithContext("trainer rank " + std::to_string(plan->rank) + ": mesh group '" + group.name +
                                       "': joining its collective group");
    }
    mesh_groups.push_back(std::move(mesh).value());
    for (size_t i = group_work[g].first; i < group_work[g].second; ++i) {
      const SourceWork& sw = work[i];
      if (sw.gather_group < 0 || gather_groups[sw.gather_group]) continue;
      const std::vector<int32_t>& ranks = gather_sets[sw.gather_group];
      std::string name = gen + "/gather/";
      for (size_t k = 0; k < ranks.size(); ++k) name += (k ? "-" : "") + std::to_string(ranks[k]);
      StatusOr<std::unique_ptr<CollectiveGroup>> gather = group_factory->Join(name, ranks, index_of(ranks));
      if (!gather.ok()) return gather.status().WithContext(Where(sw) + ": joining its all-gather group");
      gather_groups[sw.gather_group] = std::move(gather).value();
    }
  }
  groups_ready = true;
  return Status::Ok();
}

Status PlanExecutor::Impl::CheckVersion(size_t g, uint64_t version) {
  // Mixing versions in one all-gather would write a blend of two steps:
  // every rank shows its version first (8 bytes as two fp32 slots per rank).
  CollectiveGroup& group = *mesh_groups[g];
  const int size = group.size();
  std::vector<uint64_t> all(static_cast<size_t>(size));
  const int64_t shape[1] = {2 * static_cast<int64_t>(size)};
  const std::string where = "trainer rank " + std::to_string(plan->rank) + ": mesh group '" + plan->groups[g].name + "'";
  Status s = group.AllGatherShards(&version, all.data(), shape, 0, DType::kFP32);
  if (!s.ok()) return s.WithContext(where + ": version check");
  for (int r = 0; r < size; ++r) {
    if (all[r] != version) {
      return FailedPrecondition(where + ": trainer rank " + std::to_string(plan->groups[g].ranks[r]) +
                                " runs version " + std::to_string(all[r]) + " while this rank runs " +
                                std::to_string(version) + "; every trainer agent must run the same versions");
    }
  }
  return Status::Ok();
}

// ------------------------------------------------------------------- run --

void PlanExecutor::Impl::OnWriteDone(const SourceWork& sw, const WriteWork& ww, uint64_t offset, const Status& s) {
  if (!s.ok()) RecordError(s.WithContext(WriteWhere(sw, *ww.write)));
  arena->Free(offset, ww.staging_bytes);  // also wakes a watermark wait
  std::lock_guard<std::mutex> lock(mu);
  if (--inflight == 0) idle.notify_all();
}

Status PlanExecutor::Impl::WaitWrites(Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu);
  if (!idle.wait_until(lock, deadline, [&] { return inflight == 0; })) {
    return DeadlineExceeded("trainer rank " + std::to_string(plan->rank) + ": " + std::to_string(inflight) +
                            " writes still in flight after " + std::to_string(options.write_timeout.count()) + " ms");
  }
  return write_error;
}

void PlanExecutor::Impl::RecordError(const Status& s) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (write_error.ok()) write_error = s;
  }
  write_failed.store(true, std::memory_order_release);
}

// Returns non-OK only for a failed collective (the group is then unusable and
// the peers have failed too). Any other failure is recorded and the source's
// collectives still run with whatever data there is, writing nothing, so the
// peers finish the version quickly instead of waiting for a Gloo timeout.
Status PlanExecutor::Impl::RunSource(SourceWork& sw, uint64_t version, ShardSource& shards, VersionReport* report) {
  const RankSource& src = *sw.src;
  StageSeconds& t = report->seconds;

  if (sw.need == 0) {
    if (&sw == &work.back()) {
      shards.ReadsDone(version);
      report->reads_done_after = Since(run_start);
    }
    return Status::Ok();
  }

  // 1. watermark
  auto t0 = Clock::now();
  bool waited = false;
  StatusOr<uint64_t> chunk = arena->Allocate(sw.need, t0 + options.write_timeout, [] { return false; }, &waited);
  t.watermark_wait += Since(t0);
  if (!chunk.ok()) return chunk.status().WithContext(Where(sw) + ": waiting for temporary memory");
  report->watermark_waits += waited ? 1 : 0;
  uint8_t* base = arena->data() + *chunk;
  uint8_t* held = base;
  size_t posted = 0;
  auto give_back = [&] {
    arena->Free(*chunk, sw.transient_bytes);
    for (size_t i = posted; i < sw.writes.size(); ++i) {
      arena->Free(*chunk + sw.writes[i].staging_at, sw.writes[i].staging_bytes);
    }
  };

  // 2. copy
  t0 = Clock::now();
  uint64_t bytes = 0;
  const uint8_t* local = shards.Shard(src.name, &bytes);
  if ((local == nullptr && sw.local_bytes > 0) || bytes != sw.local_bytes) {
    RecordError(FailedPrecondition(Where(sw) + ": the trainer exports " + std::to_string(bytes) +
                                   " bytes for it, but the plan's local shard " + BoxStr(src.local) + " is " +
                                   std::to_string(sw.local_bytes) + " bytes"));
    Status z = Zero(held + sw.local_at, sw.local_bytes);
    if (!z.ok()) RecordError(z.WithContext(Where(sw) + ": copy"));
  } else if (sw.local_bytes > 0) {
    Status c = Copy(held + sw.local_at, local, sw.local_bytes);
    if (!c.ok()) RecordError(c.WithContext(Where(sw) + ": copy"));
  }
  t.copy += Since(t0);
  report->copied_bytes += sw.local_bytes;

  // 3. all-gather
  if (sw.gather_group >= 0) {
    t0 = Clock::now();
    // A device group's collective runs on a stream of its own: the shard
    // copied above must be in place first.
    if (options.device != nullptr) {
      Status synced = options.device->Synchronize();
      if (!synced.ok()) RecordError(synced.WithContext(Where(sw) + ": copy"));
    }
    Status s = gather_groups[sw.gather_group]->AllGatherShards(held + sw.local_at, held, sw.held_shape,
                                                               src.gather_dim, src.dtype);
    t.all_gather += Since(t0);
    if (!s.ok()) {
      give_back();
      return s.WithContext(Where(sw) + ": all-gather");
    }
  }
  report->gathered_bytes += sw.held_bytes;
  if (&sw == &work.back()) {
    // The copies out of the shards are asynchronous on a device: they must
    // have finished before the trainer may change its weights.
    if (options.device != nullptr) {
      Status s = options.device->Synchronize();
      if (!s.ok()) RecordError(s.WithContext(Where(sw) + ": copy"));
    }
    shards.ReadsDone(version);
    report->reads_done_after = Since(run_start);
  }
  if (write_failed.load(std::memory_order_acquire)) {
    give_back();
    return Status::Ok();
  }

  // 4. quantize
  t0 = Clock::now();
  if (sw.quantize) {
    const auto* bf16 = reinterpret_cast<const uint16_t*>(held);
    auto* scales = reinterpret_cast<float*>(base + sw.scale_at);
    Status s = options.device != nullptr ? options.device->QuantizeHeld(bf16, src.held, base + sw.q_at, scales)
                                         : QuantizeHeld(bf16, src.held, base + sw.q_at, scales);
    if (!s.ok()) {
      RecordError(s.WithContext(Where(sw) + ": fp8 quantize"));
      give_back();
      return Status::Ok();
    }
  }

  // 5. pack + post. On a device every write's box is packed first and the
  // stream drained once, since a write may only be posted once its staging
  // is final; on the host each write is packed just before it is posted.
  const Box grid = sw.quantize ? HeldScaleGrid(src.held) : Box{};
  const uint32_t imm = static_cast<uint32_t>(version);
  auto pack = [&](const WriteWork& ww) -> Status {
    const RankWrite& w = *ww.write;
    uint8_t* out = base + ww.staging_at;
    if (w.kind == WriteKind::kScale) return Pack(base + sw.scale_at, grid, DType::kFP32, w.src_box, DType::kFP32, out);
    if (w.dst_dtype == DType::kFP8E4M3) {
      return Pack(base + sw.q_at, src.held, DType::kFP8E4M3, w.src_box, DType::kFP8E4M3, out);
    }
    return Pack(held, src.held, src.dtype, w.src_box, w.dst_dtype, out);
  };
  const bool prepack = options.device != nullptr;
  if (prepack) {
    Status packed;
    for (size_t i = 0; i < sw.writes.size() && packed.ok(); ++i) {
      packed = pack(sw.writes[i]);
      if (!packed.ok()) packed = packed.WithContext(WriteWhere(sw, *sw.writes[i].write) + ": pack");
    }
    if (packed.ok()) packed = options.device->Synchronize().WithContext(Where(sw) + ": pack");
    if (!packed.ok()) {
      RecordError(packed);
      give_back();
      return Status::Ok();
    }
  }
  for (; posted < sw.writes.size(); ++posted) {
    const WriteWork& ww = sw.writes[posted];
    const RankWrite& w = *ww.write;
    if (!prepack) {
      Status packed = pack(ww);
      if (!packed.ok()) {
        RecordError(packed.WithContext(WriteWhere(sw, w) + ": pack"));
        break;
      }
    }
    const auto tp = Clock::now();
    t.quantize_pack += std::chrono::duration<double>(tp - t0).count();
    transport::SingleWrite req;
    req.src = arena->region();
    req.src_offset = *chunk + ww.staging_at;
    req.dst = remotes[ww.remote];
    req.dst_offset = w.region_offset;
    req.length = w.bytes;
    req.imm = imm;
    {
      std::lock_guard<std::mutex> lock(mu);
      ++inflight;
    }
    const uint64_t offset = req.src_offset;
    Status s = engine->Write(req, [this, &sw, &ww, offset](const Status& st) { OnWriteDone(sw, ww, offset, st); });
    t0 = Clock::now();
    t.post += std::chrono::duration<double>(t0 - tp).count();
    if (!s.ok()) {
      {
        std::lock_guard<std::mutex> lock(mu);
        --inflight;
      }
      RecordError(s.WithContext(WriteWhere(sw, w)));
      break;
    }
    report->written_bytes += w.bytes;
    ++report->writes;
  }
  give_back();  // the transient part, and the staging of writes not posted
  return Status::Ok();
}

// ------------------------------------------------------------ PlanExecutor --

StatusOr<std::unique_ptr<PlanExecutor>> PlanExecutor::Create(TrainerRankPlan plan, transport::Engine* engine,
                                                             GroupFactory* groups, ExecutorOptions options) {
  if (engine == nullptr || groups == nullptr) return InvalidArgument("plan executor: engine and groups are required");
  std::unique_ptr<PlanExecutor> executor(new PlanExecutor(std::move(plan)));
  executor->impl_ = std::make_unique<Impl>();
  Impl& impl = *executor->impl_;
  impl.plan = &executor->plan_;
  impl.engine = engine;
  impl.group_factory = groups;
  impl.options = std::move(options);
  WSYNC_RETURN_IF_ERROR(impl.Resolve());
  return executor;
}

PlanExecutor::PlanExecutor(TrainerRankPlan plan) : plan_(std::move(plan)) {}

PlanExecutor::~PlanExecutor() {
  if (!impl_) return;
  // Callbacks of writes still in flight point into impl_ and the arena.
  std::unique_lock<std::mutex> lock(impl_->mu);
  impl_->idle.wait(lock, [&] { return impl_->inflight == 0; });
}

uint64_t PlanExecutor::max_source_need() const {
  uint64_t need = 0;
  for (const SourceWork& sw : impl_->work) need = std::max(need, sw.need);
  return need;
}

uint64_t PlanExecutor::arena_bytes() const { return impl_->arena ? impl_->arena->capacity() : 0; }

void PlanExecutor::ResetGroups() { impl_->groups_ready = false; }

StatusOr<VersionReport> PlanExecutor::Run(uint64_t version, ShardSource& shards) {
  Impl& impl = *impl_;
  VersionReport report;
  report.version = version;
  report.sources = impl.work.size();
  report.watermark_bytes = impl.options.watermark_bytes;
  impl.run_start = Clock::now();
  {
    std::lock_guard<std::mutex> lock(impl.mu);
    impl.write_error = Status::Ok();
    impl.write_failed.store(false);
  }
  if (impl.arena) impl.arena->ResetPeak();

  auto t0 = Clock::now();
  Status failure = impl.EnsureGroups(version);
  report.seconds.rendezvous += Since(t0);
  if (impl.work.empty() && failure.ok()) shards.ReadsDone(version);
  for (size_t g = 0; g < plan_.groups.size() && failure.ok(); ++g) {
    t0 = Clock::now();
    failure = impl.CheckVersion(g, version);
    report.seconds.barrier += Since(t0);
    if (!failure.ok()) {
      if (failure.code() != StatusCode::kFailedPrecondition) impl.groups_ready = false;
      break;
    }
    for (size_t i = impl.group_work[g].first; i < impl.group_work[g].second && failure.ok(); ++i) {
      failure = impl.RunSource(impl.work[i], version, shards, &report);
      if (!failure.ok()) impl.groups_ready = false;
    }
    if (!failure.ok()) break;
    t0 = Clock::now();
    Status s = impl.mesh_groups[g]->Barrier();
    report.seconds.barrier += Since(t0);
    if (!s.ok()) {
      impl.groups_ready = false;
      failure = s.WithContext("trainer rank " + std::to_string(plan_.rank) + ": mesh group '" + plan_.groups[g].name +
                              "': barrier");
    }
  }
  if (!failure.ok() && !impl.groups_ready) {
    impl.gather_groups.clear();  // broken; the next Run rebuilds under a new generation
    impl.mesh_groups.clear();
  }

  t0 = Clock::now();
  Status writes = impl.WaitWrites(Clock::now() + impl.options.write_timeout);
  report.seconds.wait_writes += Since(t0);
  report.seconds.total = Since(impl.run_start);
  if (impl.arena) report.peak_temp_bytes = impl.arena->peak();
  if (!failure.ok()) return failure;
  if (!writes.ok()) return writes;
  return report;
}

std::string VersionReport::Summary() const {
  const double mib = static_cast<double>(written_bytes) / (1 << 20);
  const double gbps = seconds.total > 0 ? static_cast<double>(written_bytes) / seconds.total / 1e9 : 0.0;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "version %llu: %.3f s, %.1f MiB in %llu writes (%.2f GB/s); copy %.3f, all-gather %.3f, "
                "quantize+pack %.3f, post %.3f, watermark wait %.3f (%llu of %llu sources waited), wait writes %.3f, "
                "barrier %.3f, rendezvous %.3f s; reads done after %.3f s; peak temp %.1f of %.1f MiB",
                static_cast<unsigned long long>(version), seconds.total, mib,
                static_cast<unsigned long long>(writes), gbps, seconds.copy, seconds.all_gather,
                seconds.quantize_pack, seconds.post, seconds.watermark_wait,
                static_cast<unsigned long long>(watermark_waits), static_cast<unsigned long long>(sources),
                seconds.wait_writes, seconds.barrier, seconds.rendezvous,
                reads_done_after, static_cast<double>(peak_temp_bytes) / (1 << 20),
                static_cast<double>(watermark_bytes) / (1 << 20));
  return buf;
}

}  // namespace wsync