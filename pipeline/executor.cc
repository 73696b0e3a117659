#include "pipeline/executor.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <tuple>

#include "delta/codec.h"
#include "delta/inbox.h"
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
  if (size == 1) return Status::Ok();  // nobody to be out of step with
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

void PlanExecutor::Impl::Unpin(SourceWork& sw) {
  bool last;
  {
    std::lock_guard<std::mutex> lock(mu);
    last = --sw.pins == 0;
  }
  if (last && sw.transient_bytes > 0) arena->Free(sw.chunk, sw.transient_bytes);  // also wakes a watermark wait
}

void PlanExecutor::Impl::OnWriteDone(SourceWork& sw, const WriteWork& ww, uint64_t offset, const Status& s) {
  if (!s.ok()) RecordError(s.WithContext(WriteWhere(sw, *ww.write)));
  if (ww.direct) {
    Unpin(sw);
  } else {
    arena->Free(offset, ww.staging_bytes);
  }
  std::lock_guard<std::mutex> lock(mu);
  if (--inflight == 0) idle.notify_all();
}

void PlanExecutor::Impl::GiveBack(SourceWork& sw, size_t posted) {
  if (sw.fallback) arena->Free(*sw.fallback, sw.fallback_bytes);
  sw.fallback.reset();
  for (size_t i = posted; i < sw.writes.size(); ++i) {
    if (!sw.writes[i].direct) arena->Free(sw.chunk + sw.writes[i].staging_at, sw.writes[i].staging_bytes);
  }
  Unpin(sw);
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

void PlanExecutor::Impl::PostWrites(SourceWork& sw, std::optional<uint32_t> imm,
                                    const std::function<Status(const WriteWork&)>& pack, size_t* posted,
                                    VersionReport* report, Clock::time_point* t0) {
  StageSeconds& t = report->seconds;
  for (; *posted < sw.writes.size(); ++*posted) {
    const WriteWork& ww = sw.writes[*posted];
    const RankWrite& w = *ww.write;
    if (pack && !ww.direct) {
      Status packed = pack(ww);
      if (!packed.ok()) {
        RecordError(packed.WithContext(WriteWhere(sw, w) + ": pack"));
        return;
      }
    }
    if (imm.has_value() && options.checksums && sw.hashes != nullptr) {
      report->checksums.push_back(WriteChecksum{w.dst_rank, w.region, w.region_offset, w.bytes, 0});
      hash_fills.emplace_back(report->checksums.size() - 1, sw.hashes + *posted);
    } else if (imm.has_value() && options.checksums) {
      const auto tc = Clock::now();
      t.quantize_pack += std::chrono::duration<double>(tc - *t0).count();
      StatusOr<uint64_t> h = ChecksumArena(sw.chunk + ww.staging_at, w.bytes);
      if (!h.ok()) {
        RecordError(h.status().WithContext(WriteWhere(sw, w) + ": checksum"));
        return;
      }
      report->checksums.push_back(WriteChecksum{w.dst_rank, w.region, w.region_offset, w.bytes, *h});
      *t0 = Clock::now();
      t.checksum += std::chrono::duration<double>(*t0 - tc).count();
    }
    uint64_t delta_length = 0;
    if (imm.has_value() && ww.copy >= 0) {
      const auto td = Clock::now();
      t.quantize_pack += std::chrono::duration<double>(td - *t0).count();
      const bool as_delta = EncodeDelta(sw, ww, &delta_length);
      if (!as_delta) delta_length = 0;
      *t0 = Clock::now();
      t.delta += std::chrono::duration<double>(*t0 - td).count();
    }
    const auto tp = Clock::now();
    t.quantize_pack += std::chrono::duration<double>(tp - *t0).count();
    transport::SingleWrite req;
    req.src = arena->region();
    req.src_offset = sw.chunk + ww.staging_at;
    req.dst = remotes[ww.remote];
    req.dst_offset = w.region_offset;
    req.length = w.bytes;
    req.imm = imm;
    if (delta_length > 0) {  // the same one write, into the write's inbox slot
      req.src_offset += ww.delta_at;
      req.dst = remotes[ww.inbox];
      req.dst_offset = ww.slot_at;
      req.length = delta_length;
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      ++inflight;
      if (ww.direct) ++sw.pins;
    }
    const uint64_t offset = sw.chunk + ww.staging_at;
    Status s = engine->Write(req, [this, &sw, &ww, offset](const Status& st) { OnWriteDone(sw, ww, offset, st); });
    *t0 = Clock::now();
    t.post += std::chrono::duration<double>(*t0 - tp).count();
    if (!s.ok()) {
      {
        std::lock_guard<std::mutex> lock(mu);
        --inflight;
        if (ww.direct) --sw.pins;  // never the last: the poster holds one
      }
      RecordError(s.WithContext(WriteWhere(sw, w)));
      return;
    }
    report->written_bytes += req.length;
    report->write_bytes += w.bytes;
    if (delta_length > 0) {
      ++report->delta_writes;
      report->delta_covered_bytes += w.bytes;
    }
    ++report->writes;
  }
}

bool PlanExecutor::Impl::EncodeDelta(SourceWork& sw, const WriteWork& ww, uint64_t* length) {
  DeltaCopy& c = copies[static_cast<size_t>(ww.copy)];
  const RankWrite& w = *ww.write;
  DeviceOps* device = options.device;
  uint8_t* next = arena->data() + sw.chunk + ww.staging_at;
  uint8_t* copy = copy_memory.get() + c.at;
  const bool wanted = run_delta != nullptr && c.holds == run_delta->base &&
                      std::find(run_delta->ranks.begin(), run_delta->ranks.end(), w.dst_rank) != run_delta->ranks.end();
  c.holds = run_version;
  auto failed = [&](const Status& s) {  // a device error: this copy is unknown, the version fails
    c.holds = ~0ull;
    RecordError(s.WithContext(WriteWhere(sw, w) + ": delta on " + device->name()));
    return false;
  };
  if (!wanted) {
    if (device == nullptr) {
      std::memcpy(copy, next, w.bytes);
      return false;
    }
    Status s = device->Copy(copy, next, w.bytes);  // on the stream: before anything reuses the staging
    return s.ok() ? false : failed(s);
  }
  uint8_t* out = next + ww.delta_at;
  const uint64_t capacity = ww.slot_bytes - delta::kSlotHeaderBytes;
  StatusOr<delta::Encoded> e =
      device == nullptr
          ? delta::EncodeAndAdvance(copy, next, w.bytes, ww.elem_bytes, out + delta::kSlotHeaderBytes, capacity)
          : device->EncodeDelta(copy, next, w.bytes, ww.elem_bytes, out + delta::kSlotHeaderBytes, capacity);
  if (!e.ok() && device != nullptr) return failed(e.status());
  if (!e.ok() || !e->fits) return false;  // the copy has advanced all the same; the write goes whole
  const delta::SlotHeader header{run_version, run_delta->base, e->bytes};
  *length = delta::kSlotHeaderBytes + e->bytes;
  if (device == nullptr) {
    delta::WriteSlotHeader(header, out);
    return true;
  }
  uint8_t head[delta::kSlotHeaderBytes];
  delta::WriteSlotHeader(header, head);
  if (arena->mirror() != nullptr) {  // host staging: the engine sends the mirror's bytes
    uint8_t* mirrored = arena->mirror() + (out - arena->data());
    std::memcpy(mirrored, head, sizeof head);
    Status s = device->ReadBack(mirrored + delta::kSlotHeaderBytes, out + delta::kSlotHeaderBytes, e->bytes);
    if (!s.ok()) return failed(s);
    run_report->staged_bytes += e->bytes;
    return true;
  }
  Status s = device->CopyFromHost(out, head, sizeof head);
  return s.ok() ? true : failed(s);
}

StatusOr<uint64_t> PlanExecutor::Impl::ChecksumArena(uint64_t at, uint64_t bytes) {
  if (arena->mirror() != nullptr) return Checksum64(arena->mirror() + at, bytes);  // what the engine sends
  const uint8_t* p = arena->data() + at;
  if (options.device == nullptr) return Checksum64(p, bytes);
  constexpr uint64_t kPiece = 16ull << 20;
  readback.resize(static_cast<size_t>(std::min(bytes, kPiece)));
  Checksum64Stream h;
  for (uint64_t done = 0; done < bytes;) {
    const uint64_t n = std::min(kPiece, bytes - done);
    WSYNC_RETURN_IF_ERROR(options.device->ReadBack(readback.data(), p + done, n));
    h.Update(readback.data(), n);
    done += n;
  }
  return h.Final();
}

void PlanExecutor::Impl::ReadsDoneAfter(const SourceWork& sw) {
  if (reads_reported || &sw != &work.back()) return;
  reads_reported = true;
  run_shards->ReadsDone(run_version);
  run_report->reads_done_after = Since(run_start);
}

void PlanExecutor::Impl::Settle(const SourceWork& sw, const char* stage) {
  if (options.device == nullptr) return;
  std::vector<bool> nonfinite;
  Status s = options.device->Synchronize(&nonfinite);
  if (!s.ok()) RecordError(s.WithContext(Where(sw) + ": " + stage));
  for (size_t i = 0; i < quantized.size() && i < nonfinite.size(); ++i) {
    if (nonfinite[i]) {
      RecordError(InvalidArgument(Where(*quantized[i]) + ": fp8 quantize: NaN or infinite weight: not quantized (never sent)"));
    }
  }
  quantized.clear();
}

Status PlanExecutor::Impl::TakeChunk(SourceWork& sw, VersionReport* report) {
  const auto t0 = Clock::now();
  bool waited = false;
  StatusOr<uint64_t> chunk = AllocateTemp(sw.need, &waited);
  report->seconds.watermark_wait += Since(t0);
  if (!chunk.ok()) return chunk.status().WithContext(Where(sw) + ": waiting for temporary memory");
  report->watermark_waits += waited ? 1 : 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    sw.chunk = *chunk;
    sw.pins = 1;
  }
  sw.fallback.reset();
  return Status::Ok();
}

void PlanExecutor::Impl::Begin(VersionReport* report) {
  report->sources = work.size();
  report->watermark_bytes = options.watermark_bytes;
  run_start = Clock::now();
  hash_fills.clear();
  hash_batches.clear();
  {
    std::lock_guard<std::mutex> lock(mu);
    write_error = Status::Ok();
    write_failed.store(false);
  }
  if (arena) arena->ResetPeak();
}

Status PlanExecutor::Impl::Finish(VersionReport* report) {
  const auto t0 = Clock::now();
  Status writes = WaitWrites(Clock::now() + options.write_timeout);
  report->seconds.wait_writes += Since(t0);
  if (!hash_fills.empty()) {  // the device's hashes, queued while the writes were in flight
    const auto tc = Clock::now();
    std::vector<bool> nonfinite;  // none: every quantize was settled before its writes were posted
    Status s = options.device->Synchronize(&nonfinite);
    if (s.ok()) {
      for (const auto& [i, h] : hash_fills) report->checksums[i].hash = *h;
    } else if (writes.ok()) {
      writes = s.WithContext("trainer rank " + std::to_string(plan->rank) + ": reading the checksums");
    }
    report->seconds.checksum += Since(tc);
  }
  hash_fills.clear();
  hash_batches.clear();
  report->seconds.total = Since(run_start);
  if (arena) report->peak_temp_bytes = arena->peak();
  return writes;
}

StatusOr<uint64_t> PlanExecutor::Impl::AllocateTemp(uint64_t bytes, bool* waited) {
  if (!pending.empty()) {
    // Memory held by pending sources comes back only once they are posted.
    StatusOr<uint64_t> at = arena->Allocate(bytes, Clock::time_point::min(), [] { return false; }, waited);
    if (at.ok()) return at;
    FlushPending();
  }
  return arena->Allocate(bytes, Clock::now() + options.write_timeout, [] { return false; }, waited);
}

void PlanExecutor::Impl::FlushPending(bool post) {
  if (pending.empty()) return;
  auto t0 = Clock::now();
  Settle(*pending.back(), "quantize and pack");
  if (post) {
    for (SourceWork* sw : pending) ReadsDoneAfter(*sw);
  }
  if (post && options.checksums && arena->mirror() == nullptr && !write_failed.load(std::memory_order_acquire)) {
    HashPendingOnDevice(run_report);
    t0 = Clock::now();
  }
  for (SourceWork* sw : pending) {
    size_t posted = 0;
    if (post && !write_failed.load(std::memory_order_acquire)) {
      PostWrites(*sw, static_cast<uint32_t>(run_version), nullptr, &posted, run_report, &t0);
    }
    GiveBack(*sw, posted);
    sw->hashes = nullptr;
  }
  pending.clear();
}

// Every pending write's hash, queued on the device after the wait that made
// their bytes final (a write's bytes stay put until it completes, and its
// chunk is reused only by work issued after these hashes); read in Finish.
void PlanExecutor::Impl::HashPendingOnDevice(VersionReport* report) {
  const auto t0 = Clock::now();
  std::vector<ChecksumPiece> pieces;
  for (const SourceWork* sw : pending) {
    for (const WriteWork& ww : sw->writes) pieces.push_back({arena->data() + sw->chunk + ww.staging_at, ww.write->bytes});
  }
  std::vector<uint64_t>& batch = hash_batches.emplace_back(pieces.size(), 0);
  Status s = options.device->Checksums(pieces.data(), pieces.size(), batch.data());
  if (!s.ok()) {
    RecordError(s.WithContext("trainer rank " + std::to_string(plan->rank) + ": checksums on " +
                              options.device->name()));
  } else {
    const uint64_t* at = batch.data();
    for (SourceWork* sw : pending) {
      sw->hashes = at;
      at += sw->writes.size();
    }
  }
  report->seconds.checksum += Since(t0);
}

// Host staging: every write's bytes, device-to-host into the arena's mirror
// at the same offsets (writes whose bytes touch as one copy), on the device's
// stream: the wait before posting (FlushPending) covers them.
Status PlanExecutor::Impl::StageToHost(const SourceWork& sw, VersionReport* report) {
  std::vector<std::pair<uint64_t, uint64_t>> runs;  // [offset, end) in the arena
  for (const WriteWork& ww : sw.writes) {
    const uint64_t at = sw.chunk + ww.staging_at, end = at + ww.write->bytes;
    if (!runs.empty() && runs.back().second == at) runs.back().second = end;
    else runs.emplace_back(at, end);
    report->staged_bytes += ww.write->bytes;
  }
  for (const auto& [at, end] : runs) {
    WSYNC_RETURN_IF_ERROR(options.device->CopyToHost(arena->mirror() + at, arena->data() + at, end - at));
  }
  return Status::Ok();
}

// The received pieces of a stacked tensor, each `planes` runs back to back
// at `landing`, spread into their rows of every held plane.
Status PlanExecutor::Impl::UnpackPlanes(const SourceWork& sw, const uint8_t* landing, uint8_t* held) {
  uint64_t at = 0;
  for (size_t i = 0; i < sw.recv_bytes.size(); ++i) {
    const uint64_t n = static_cast<uint64_t>(sw.recv_bytes[i]);
    if (n == 0) continue;
    WSYNC_RETURN_IF_ERROR(
        Copy2D(held + sw.recv_into[i], sw.held_pitch, landing + at, n / sw.planes, n / sw.planes, sw.planes));
    at += n;
  }
  return Status::Ok();
}

// Returns non-OK only for a failed collective (the group is then unusable and
// the peers have failed too). Any other failure is recorded and the source's
// collectives still run with whatever data there is, writing nothing, so the
// peers finish the version quickly instead of waiting for a Gloo timeout.
Status PlanExecutor::Impl::RunSource(SourceWork& sw) {
  const RankSource& src = *sw.src;
  VersionReport* report = run_report;
  StageSeconds& t = report->seconds;
  DeviceOps* device = options.device;

  if (sw.need == 0) {
    if (&sw == &work.back()) FlushPending();  // the pending sources' reads are the version's last
    ReadsDoneAfter(sw);
    return Status::Ok();
  }

  // 1. watermark
  WSYNC_RETURN_IF_ERROR(TakeChunk(sw, report));
  uint8_t* base = arena->data() + sw.chunk;
  uint8_t* held = base;
  // Gives back what the source holds once the device is done with it.
  auto give_up = [&](const char* stage) {
    Settle(sw, stage);
    ReadsDoneAfter(sw);
    GiveBack(sw, 0);
    return Status::Ok();
  };

  // 2. copy (none for a source quantized in place, if the device reaches it)
  auto t0 = Clock::now();
  uint64_t bytes = 0;
  const uint8_t* local = run_shards->Shard(src.name, &bytes);
  const uint8_t* quantize_from = held;
  if ((local == nullptr && sw.local_bytes > 0) || bytes != sw.local_bytes) {
    RecordError(FailedPrecondition(Where(sw) + ": the trainer exports " + std::to_string(bytes) +
                                   " bytes for it, but the plan's local shard " + BoxText(src.local) + " is " +
                                   std::to_string(sw.local_bytes) + " bytes"));
    if (sw.exchange) {  // the exchange still runs, on zeros
      Status z = Zero(base + sw.send_at, sw.transient_bytes - sw.send_at);
      if (!z.ok()) RecordError(z.WithContext(Where(sw) + ": copy"));
    } else if (!sw.in_place) {  // the all-gather still runs, on zeros
      Status z = Zero(held + sw.local_at, sw.local_bytes);
      if (!z.ok()) RecordError(z.WithContext(Where(sw) + ": copy"));
    }
  } else if (sw.exchange) {
    // Each peer's piece of the shard, back to back in group order (a
    // stacked tensor's piece: its rows of every plane, packed; a narrowed
    // piece: its part of each row, packed).
    uint64_t at = sw.send_at;
    for (size_t i = 0; i < sw.send_bytes.size(); ++i) {
      const uint64_t n = static_cast<uint64_t>(sw.send_bytes[i]);
      if (n == 0) continue;
      const uint64_t row = sw.send_row[i], plane = n / sw.planes;
      Status c;
      if (row == sw.local_row) {
        c = sw.planes == 1 ? Copy(base + at, local + sw.send_from[i], n)
                           : Copy2D(base + at, plane, local + sw.send_from[i], sw.local_pitch, plane, sw.planes);
      } else {
        for (uint64_t p = 0; p < sw.planes && c.ok(); ++p)
          c = Copy2D(base + at + p * plane, row, local + sw.send_from[i] + p * sw.local_pitch, sw.local_row, row,
                     plane / row);
      }
      if (!c.ok()) RecordError(c.WithContext(Where(sw) + ": copy"));
      at += n;
    }
  } else if (sw.in_place) {
    quantize_from = local;
    if (device != nullptr && !device->CanRead(local)) {
      bool also_waited = false;
      StatusOr<uint64_t> staged = AllocateTemp(sw.fallback_bytes, &also_waited);
      if (!staged.ok()) {
        RecordError(staged.status().WithContext(Where(sw) + ": waiting for temporary memory"));
      } else {
        sw.fallback = *staged;
        quantize_from = arena->data() + *staged;
        Status c = Copy(arena->data() + *staged, local, sw.local_bytes);
        if (!c.ok()) RecordError(c.WithContext(Where(sw) + ": copy"));
      }
    }
  } else if (sw.local_bytes > 0) {
    Status c = Copy(held + sw.local_at, local, sw.local_bytes);
    if (!c.ok()) RecordError(c.WithContext(Where(sw) + ": copy"));
  }
  t.copy += Since(t0);
  report->copied_bytes += sw.local_bytes;

  // 3. unshard: the planned exchange, or the all-gather
  if (sw.exchange) {
    t0 = Clock::now();
    Settle(sw, "copy");
    uint8_t* landing = sw.planes == 1 ? held : base + sw.recv_at;
    Status s = gather_groups[sw.gather_group]->Exchange(base + sw.send_at, sw.send_bytes, landing, sw.recv_bytes);
    if (s.ok() && sw.planes > 1) s = UnpackPlanes(sw, landing, held);
    t.unshard += Since(t0);
    if (!s.ok()) {
      GiveBack(sw, 0);
      return s.WithContext(Where(sw) + ": exchange");
    }
    const size_t me = static_cast<size_t>(
        std::find(src.gather_ranks.begin(), src.gather_ranks.end(), plan->rank) - src.gather_ranks.begin());
    for (size_t i = 0; i < sw.recv_bytes.size(); ++i)
      if (i != me) report->exchanged_bytes += static_cast<uint64_t>(sw.recv_bytes[i]);
  } else if (sw.gather_group >= 0) {
    t0 = Clock::now();
    // A device group's collective runs on a stream of its own: the shard
    // copied above must be in place first.
    Settle(sw, "copy");
    Status s = gather_groups[sw.gather_group]->AllGatherShards(held + sw.local_at, held, sw.held_shape,
                                                               src.gather_dim, src.dtype);
    t.unshard += Since(t0);
    if (!s.ok()) {
      GiveBack(sw, 0);
      return s.WithContext(Where(sw) + ": all-gather");
    }
    report->exchanged_bytes += sw.held_bytes - sw.local_bytes;
  }
  report->gathered_bytes += sw.held_bytes;
  if (!sw.in_place && &sw == &work.back()) {
    Settle(sw, "copy");  // the copies out of the shards are asynchronous on a device
    FlushPending();
    ReadsDoneAfter(sw);
  }
  if (write_failed.load(std::memory_order_acquire)) return give_up("copy");

  // 4. quantize
  t0 = Clock::now();
  if (sw.quantize) {
    Status s;
    if (sw.bf16_at) {  // fp32 master weights: rounded to bf16 first
      s = Pack(quantize_from, src.held, DType::kFP32, src.held, DType::kBF16, base + *sw.bf16_at);
      quantize_from = base + *sw.bf16_at;
    }
    const auto* bf16 = reinterpret_cast<const uint16_t*>(quantize_from);
    auto* scales = reinterpret_cast<float*>(base + sw.scale_at);
    if (s.ok()) {
      s = device != nullptr ? device->QuantizeHeld(bf16, src.held, base + sw.q_at, scales)
                            : QuantizeHeld(bf16, src.held, base + sw.q_at, scales);
    }
    if (!s.ok()) {
      RecordError(s.WithContext(Where(sw) + ": fp8 quantize"));
      return give_up("fp8 quantize");
    }
    if (device != nullptr) quantized.push_back(&sw);
  }

  // 5. pack + post. Direct writes need no pack. On a device the other boxes
  // are packed now and the source waits in `pending`: a write may only be
  // posted once its bytes are final, and one wait for the device covers many
  // sources. On the host each write is packed just before it is posted.
  const Box grid = sw.quantize ? HeldScaleGrid(src.held) : Box{};
  auto pack = [&](const WriteWork& ww) -> Status {
    const RankWrite& w = *ww.write;
    uint8_t* out = base + ww.staging_at;
    if (w.kind == WriteKind::kScale) return Pack(base + sw.scale_at, grid, DType::kFP32, w.src_box, DType::kFP32, out);
    if (w.dst_dtype == DType::kFP8E4M3) {
      return Pack(base + sw.q_at, src.held, DType::kFP8E4M3, w.src_box, DType::kFP8E4M3, out);
    }
    return Pack(held, src.held, src.dtype, w.src_box, w.dst_dtype, out);
  };
  if (device == nullptr) {
    ReadsDoneAfter(sw);  // the quantize above has read the shard
    size_t posted = 0;
    PostWrites(sw, static_cast<uint32_t>(run_version), pack, &posted, report, &t0);
    GiveBack(sw, posted);  // the staging of writes not posted, and the poster's hold on the transient part
    return Status::Ok();
  }
  for (const WriteWork& ww : sw.writes) {
    if (ww.direct) continue;
    Status packed = pack(ww);
    if (!packed.ok()) {
      RecordError(packed.WithContext(WriteWhere(sw, *ww.write) + ": pack"));
      return give_up("pack");
    }
  }
  if (arena->mirror() != nullptr) {
    Status staged = StageToHost(sw, report);
    if (!staged.ok()) {
      RecordError(staged.WithContext(Where(sw) + ": host staging"));
      return give_up("host staging");
    }
  }
  t.quantize_pack += Since(t0);
  pending.push_back(&sw);
  if (pending.size() >= kMaxPending || &sw == &work.back()) FlushPending();
  return Status::Ok();
}

// ------------------------------------------------------------ PlanExecutor --

StatusOr<std::unique_ptr<PlanExecutor>> PlanExecutor::Create(TrainerRankPlan plan, transport::Engine* engine,
                                                             GroupFactory* groups, ExecutorOptions options) {
  if (engine == nullptr || groups == nullptr) return InvalidArgument("plan executor: engine and groups are required");
  if (options.stage_through_host && options.device == nullptr) {
    return InvalidArgument("plan executor: host staging (stage_through_host) needs a device pipeline");
  }
  ExpandPlanes(&plan);  // a write per plane: each has its own pack, post and checksum
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
  for (const SourceWork& sw : impl_->work) need = std::max(need, sw.need + sw.fallback_bytes);
  return need;
}

uint64_t PlanExecutor::delta_copy_bytes() const {
  uint64_t bytes = 0;
  for (const DeltaCopy& c : impl_->copies) bytes += c.bytes;
  return bytes;
}

HeldCopies PlanExecutor::TakeHeldCopies() {
  HeldCopies held;
  for (const SourceWork& sw : impl_->work) {
    for (const WriteWork& ww : sw.writes) {
      if (ww.copy < 0) continue;
      const DeltaCopy& c = impl_->copies[static_cast<size_t>(ww.copy)];
      const RankWrite& w = *ww.write;
      held.entries.push_back({w.dst_rank, w.region, w.region_offset, w.bytes, c.at, c.holds});
    }
  }
  held.memory = std::move(impl_->copy_memory);
  for (DeltaCopy& c : impl_->copies) c.holds = ~0ull;
  impl_->copies.clear();
  for (SourceWork& sw : impl_->work)
    for (WriteWork& ww : sw.writes) ww.copy = -1;
  return held;
}

void PlanExecutor::AdoptHeldCopies(HeldCopies held) {
  Impl& impl = *impl_;
  if (held.memory == nullptr || impl.copies.empty()) return;
  std::vector<std::pair<const WriteWork*, DeltaCopy*>> mine;
  for (const SourceWork& sw : impl.work)
    for (const WriteWork& ww : sw.writes)
      if (ww.copy >= 0) mine.emplace_back(&ww, &impl.copies[static_cast<size_t>(ww.copy)]);
  auto same = [](const HeldCopies::Entry& e, const WriteWork& ww, const DeltaCopy& c) {
    const RankWrite& w = *ww.write;
    return e.dst_rank == w.dst_rank && e.region == w.region && e.offset == w.region_offset && e.bytes == w.bytes &&
           e.at == c.at;
  };
  bool identical = mine.size() == held.entries.size();
  for (size_t i = 0; identical && i < mine.size(); ++i) identical = same(held.entries[i], *mine[i].first, *mine[i].second);
  if (identical) {  // the usual case: the same routing, so the same layout; no copy of the copies
    impl.copy_memory = std::move(held.memory);
    for (size_t i = 0; i < mine.size(); ++i) mine[i].second->holds = held.entries[i].holds;
    return;
  }
  // Another layout (some routing changed): each write's copy moves over, on
  // a device by copies that must finish before `held` is freed below.
  std::map<std::tuple<int32_t, std::string, uint64_t, uint64_t>, const HeldCopies::Entry*> by_write;
  for (const HeldCopies::Entry& e : held.entries) by_write[{e.dst_rank, e.region, e.offset, e.bytes}] = &e;
  for (auto& [ww, c] : mine) {
    auto it = by_write.find({ww->write->dst_rank, ww->write->region, ww->write->region_offset, ww->write->bytes});
    if (it == by_write.end()) continue;
    uint8_t* to = impl.copy_memory.get() + c->at;
    const uint8_t* from = held.memory.get() + it->second->at;
    if (impl.options.device == nullptr) {
      std::memcpy(to, from, c->bytes);
    } else if (!impl.options.device->Copy(to, from, c->bytes).ok()) {
      continue;  // not copied: this write's copy holds nothing, so it goes whole
    }
    c->holds = it->second->holds;
  }
  std::vector<bool> nonfinite;
  if (impl.options.device != nullptr && !impl.options.device->Synchronize(&nonfinite).ok()) {
    for (auto& [ww, c] : mine) c->holds = ~0ull;
  }
}

uint64_t PlanExecutor::arena_bytes() const { return impl_->arena ? impl_->arena->capacity() : 0; }

void PlanExecutor::ResetGroups() { impl_->groups_ready = false; }

bool PlanExecutor::writes_timed_out() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->writes_timed_out;
}

StatusOr<VersionReport> PlanExecutor::Run(uint64_t version, ShardSource& shards, const DeltaTarget* delta) {
  Impl& impl = *impl_;
  VersionReport report;
  report.version = version;
  impl.Begin(&report);
  report.delta_copy_bytes = delta_copy_bytes();
  impl.run_delta = delta;
  impl.run_version = version;
  impl.run_shards = &shards;
  impl.run_report = &report;
  impl.reads_reported = false;

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
      failure = impl.RunSource(impl.work[i]);
      if (!failure.ok()) impl.groups_ready = false;
    }
    if (!failure.ok()) break;
    impl.FlushPending();  // every write of the group is posted before its barrier
    t0 = Clock::now();
    // A group of one rank has nobody to wait for (on a GPU its collective
    // would still queue behind the device's work).
    Status s = impl.mesh_groups[g]->size() > 1 ? impl.mesh_groups[g]->Barrier() : Status::Ok();
    report.seconds.barrier += Since(t0);
    if (!s.ok()) {
      impl.groups_ready = false;
      failure = s.WithContext("trainer rank " + std::to_string(plan_.rank) + ": mesh group '" + plan_.groups[g].name +
                              "': barrier");
    }
  }
  impl.FlushPending(/*post=*/failure.ok());
  if (!failure.ok() && !impl.groups_ready) {
    impl.gather_groups.clear();  // broken; the next Run rebuilds under a new generation
    impl.mesh_groups.clear();
  }

  Status writes = impl.Finish(&report);
  impl.run_delta = nullptr;
  {
    std::lock_guard<std::mutex> lock(impl.mu);
    impl.writes_timed_out = writes.code() == StatusCode::kDeadlineExceeded;
  }
  if (!failure.ok() || !writes.ok()) {
    // Some copies advanced past what their receivers got: none is trusted.
    for (DeltaCopy& c : impl.copies) c.holds = ~0ull;
  }
  // A failed collective is often the echo of stalled writes (the peers
  // waited for this rank in their next collective): name both.
  if (!failure.ok() && !writes.ok()) return Status(failure.code(), failure.message() + "; its writes: " + writes.message());
  if (!failure.ok()) return failure;
  if (!writes.ok()) return writes;
  return report;
}

StatusOr<VersionReport> PlanExecutor::ReplayWrites() {
  Impl& impl = *impl_;
  VersionReport report;
  impl.Begin(&report);
  for (SourceWork& sw : impl.work) {
    if (sw.need == 0 || impl.write_failed.load(std::memory_order_acquire)) continue;
    Status taken = impl.TakeChunk(sw, &report);
    if (!taken.ok()) {
      impl.RecordError(taken);
      break;
    }
    size_t posted = 0;
    auto t0 = Clock::now();
    impl.PostWrites(sw, std::nullopt, nullptr, &posted, &report, &t0);
    impl.GiveBack(sw, posted);
  }
  Status writes = impl.Finish(&report);
  if (!writes.ok()) return writes.WithContext("replaying the plan's writes");
  return report;
}

std::string VersionReport::Summary() const {
  const double mib = static_cast<double>(written_bytes) / (1 << 20);
  const double gbps = seconds.total > 0 ? static_cast<double>(written_bytes) / seconds.total / 1e9 : 0.0;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "version %llu: %.3f s, %.1f MiB in %llu writes (%.2f GB/s); copy %.3f, unshard %.3f "
                "(%.2f MiB from peers), "
                "quantize+pack %.3f, post %.3f, watermark wait %.3f (%llu of %llu sources waited), wait writes %.3f, "
                "barrier %.3f, rendezvous %.3f s; reads done after %.3f s; peak temp %.1f of %.1f MiB",
                static_cast<unsigned long long>(version), seconds.total, mib,
                static_cast<unsigned long long>(writes), gbps, seconds.copy, seconds.unshard,
                static_cast<double>(exchanged_bytes) / (1 << 20),
                seconds.quantize_pack, seconds.post, seconds.watermark_wait,
                static_cast<unsigned long long>(watermark_waits), static_cast<unsigned long long>(sources),
                seconds.wait_writes, seconds.barrier, seconds.rendezvous,
                reads_done_after, static_cast<double>(peak_temp_bytes) / (1 << 20),
                static_cast<double>(watermark_bytes) / (1 << 20));
  std::string line = buf;
  if (seconds.engine_wait > 0) {
    std::snprintf(buf, sizeof buf, "; waited %.3f s for engine-paced ranks first", seconds.engine_wait);
    line += buf;
  }
  if (staged_bytes > 0) {
    std::snprintf(buf, sizeof buf, "; %.1f MiB staged through pinned host memory", static_cast<double>(staged_bytes) / (1 << 20));
    line += buf;
  }
  if (!checksums.empty()) {
    std::snprintf(buf, sizeof buf, "; %zu checksums in %.3f s", checksums.size(), seconds.checksum);
    line += buf;
  }
  if (delta_copy_bytes > 0) {
    std::snprintf(buf, sizeof buf,
                  "; deltas: %llu of %llu writes, %.2f MiB on the wire for %.2f MiB of weights (%.1f%% of %.2f MiB "
                  "whole), found in %.3f s; copies %.1f MiB",
                  static_cast<unsigned long long>(delta_writes), static_cast<unsigned long long>(writes),
                  static_cast<double>(written_bytes) / (1 << 20), static_cast<double>(write_bytes) / (1 << 20),
                  write_bytes > 0 ? 100.0 * static_cast<double>(written_bytes) / static_cast<double>(write_bytes) : 0.0,
                  static_cast<double>(write_bytes) / (1 << 20), seconds.delta,
                  static_cast<double>(delta_copy_bytes) / (1 << 20));
    line += buf;
  }
  return line;
}

}  // namespace wsync