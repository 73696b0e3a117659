// PlanExecutor::Create's half: resolving a TrainerRankPlan into per-source
// work (boxes checked, peers imported, temporary memory sized) before
// anything runs.
#include <algorithm>

#include "delta/codec.h"
#include "delta/inbox.h"
#include "pipeline/box_pack.h"
#include "pipeline/executor_impl.h"

namespace wsync {

using namespace executor_detail;  // NOLINT: this file's own private helpers

Status PlanExecutor::Impl::ResolveSource(size_t g, const RankSource& src,
                                         std::map<std::pair<int32_t, std::string>, size_t>* regions) {
  SourceWork sw;
  sw.mesh_group = g;
  sw.src = &src;
  const std::string where = Where(sw);
  const int n = static_cast<int>(src.global_shape.size());
  if (n < 1 || n > kMaxDims || src.local.ndim != n || src.held.ndim != n) {
    return InvalidArgument(where + ": plan boxes do not match its " + std::to_string(n) + "-d global shape");
  }
  const int64_t esize = DTypeSize(src.dtype);
  sw.held_shape.assign(src.held.size.begin(), src.held.size.begin() + n);
  sw.local_bytes = Elements(src.local) * esize;
  sw.held_bytes = Elements(src.held) * esize;
  if (!src.exchange() && !BoxWithin(src.local, src.held)) {
    return InvalidArgument(where + ": local shard " + BoxText(src.local) + " is not inside the held box " +
                           BoxText(src.held));
  }

  const bool gathers = src.gather_dim >= 0 && src.gather_ranks.size() > 1 && !src.exchange();
  if (src.exchange()) {
    WSYNC_RETURN_IF_ERROR(ResolveExchange(src, where, &sw));
  } else if (gathers) {
    const int gd = src.gather_dim;
    auto me = std::find(src.gather_ranks.begin(), src.gather_ranks.end(), plan->rank);
    if (gd >= n || me == src.gather_ranks.end()) {
      return InvalidArgument(where + ": gather dim " + std::to_string(gd) + " / ranks do not include rank " +
                             std::to_string(plan->rank));
    }
    const int index = static_cast<int>(me - src.gather_ranks.begin());
    const int size = static_cast<int>(src.gather_ranks.size());
    // CollectiveGroup::AllGatherShards gathers torch.chunk pieces of the held box.
    const ChunkRange chunk = TorchChunk(src.held.size[gd], size, index);
    for (int d = 0; d < n; ++d) {
      const bool ok = d == gd ? (src.local.offset[d] == src.held.offset[d] + chunk.begin || chunk.size == 0) &&
                                    src.local.size[d] == chunk.size
                              : src.local.offset[d] == src.held.offset[d] && src.local.size[d] == src.held.size[d];
      if (!ok) {
        return InvalidArgument(where + ": local shard " + BoxText(src.local) + " is not piece " +
                               std::to_string(index) + " of " + std::to_string(size) + " of the held box " +
                               BoxText(src.held) + " along dim " + std::to_string(gd));
      }
    }
    int64_t outer = 1, inner = esize;
    for (int d = 0; d < n; ++d) {
      if (d < gd) outer *= src.held.size[d];
      if (d > gd) inner *= src.held.size[d];
    }
    // Gather in place where the piece already sits in the full tensor.
    sw.local_at = outer == 1 ? static_cast<uint64_t>(chunk.begin * inner) : 0;
    auto found = std::find(gather_sets.begin(), gather_sets.end(), src.gather_ranks);
    sw.gather_group = static_cast<int>(found - gather_sets.begin());
    if (found == gather_sets.end()) gather_sets.push_back(src.gather_ranks);
    // A gather along an inner dim is staged in a buffer of its own; count it.
    sw.transient_bytes = AlignTemp(sw.held_bytes) + (outer > 1 ? AlignTemp(sw.held_bytes) : 0);
  } else {
    if (src.local != src.held) {
      return InvalidArgument(where + ": holds " + BoxText(src.held) + " after unshard but has no all-gather for its " +
                             "local shard " + BoxText(src.local));
    }
    sw.transient_bytes = AlignTemp(sw.held_bytes);
  }

  bool all_fp8 = !src.writes.empty();
  for (const RankWrite& w : src.writes) {
    const bool fp8 = w.kind == WriteKind::kScale || w.dst_dtype == DType::kFP8E4M3;
    sw.quantize = sw.quantize || fp8;
    all_fp8 = all_fp8 && fp8;
  }
  if (!gathers && !sw.exchange && all_fp8) {
    // Quantized straight from the shard: no held copy to stage.
    sw.in_place = true;
    sw.transient_bytes = 0;
    // A device may not reach the shard where it is (pageable host memory).
    sw.fallback_bytes = options.device != nullptr ? AlignTemp(sw.held_bytes) : 0;
  }
  Box grid;
  if (sw.quantize) {
    if ((src.dtype != DType::kBF16 && src.dtype != DType::kFP32) || n < 2) {
      return InvalidArgument(where + ": fp8 destinations need a bf16 or fp32 source of at least 2 dims (got " +
                             std::string(DTypeName(src.dtype)) + ", " + std::to_string(n) + "-d)");
    }
    if (src.block_rows != 128 || src.block_cols != 128) {
      return InvalidArgument(where + ": fp8 block " + std::to_string(src.block_rows) + "x" +
                             std::to_string(src.block_cols) + " is not supported (128x128 only)");
    }
    if (!WholeBlocks(src.held, src.global_shape, src.block_rows, src.block_cols)) {
      return InvalidArgument(where + ": fp8 blocks need whole 128x128 blocks of the last two dims, but the rank holds " +
                             BoxText(src.held));
    }
    grid = HeldScaleGrid(src.held);
    if (src.dtype == DType::kFP32) {
      sw.bf16_at = sw.transient_bytes;
      sw.transient_bytes += AlignTemp(Elements(src.held) * DTypeSize(DType::kBF16));
    }
    sw.q_at = sw.transient_bytes;
    sw.transient_bytes += AlignTemp(Elements(src.held));
    sw.scale_at = sw.transient_bytes;
    sw.transient_bytes += AlignTemp(Elements(grid) * sizeof(float));
  }

  uint64_t at = sw.transient_bytes;
  for (const RankWrite& w : src.writes) {
    const std::string wwhere = WriteWhere(sw, w);
    const bool scale = w.kind == WriteKind::kScale;
    if (w.src_box.ndim != n || !BoxWithin(w.src_box, scale ? grid : src.held)) {
      return InvalidArgument(wwhere + ": box " + BoxText(w.src_box) + " is outside what the rank holds (" +
                             BoxText(scale ? grid : src.held) + (scale ? " in the block grid)" : ")"));
    }
    if (scale && w.dst_dtype != DType::kFP32) {
      return InvalidArgument(wwhere + ": scales are fp32, the plan says " + std::string(DTypeName(w.dst_dtype)));
    }
    if (!scale && w.dst_dtype != DType::kFP8E4M3 && !CanCast(src.dtype, w.dst_dtype)) {
      return InvalidArgument(wwhere + ": cannot convert " + std::string(DTypeName(src.dtype)) + " to " +
                             std::string(DTypeName(w.dst_dtype)));
    }
    const uint64_t want = Elements(w.src_box) * DTypeSize(w.dst_dtype);
    if (w.bytes != want) {
      return InvalidArgument(wwhere + ": box " + BoxText(w.src_box) + " is " + std::to_string(want) +
                             " bytes of " + std::string(DTypeName(w.dst_dtype)) + ", the plan says " +
                             std::to_string(w.bytes));
    }
    size_t region_index = 0;
    StatusOr<transport::RemoteMemory> imported = ImportRegion(w.dst_rank, w.region, wwhere, regions, &region_index);
    if (!imported.ok()) return imported.status();
    const transport::RemoteMemory& remote = remotes[region_index];
    if (w.region_offset + w.bytes > remote.length) {
      return OutOfRange(wwhere + ": ends at byte " + std::to_string(w.region_offset + w.bytes) + " of a " +
                        std::to_string(remote.length) + "-byte region");
    }
    WriteWork ww;
    ww.write = &w;
    ww.remote = region_index;
    // Cut from the scales, the codes or the held tensor (at 0 of the chunk).
    const bool codes = !scale && w.dst_dtype == DType::kFP8E4M3;
    const uint64_t from_at = scale ? sw.scale_at : codes ? sw.q_at : 0;
    const int64_t from_size = scale ? 4 : codes ? 1 : esize;
    int64_t first = 0;
    WSYNC_RETURN_IF_ERROR(ResolveInbox(w, wwhere, &ww, regions));
    if (ww.slot_bytes == 0 && (scale || codes || w.dst_dtype == src.dtype) &&
        ContiguousIn(w.src_box, scale ? grid : src.held, &first)) {
      ww.direct = true;
      ww.staging_at = from_at + static_cast<uint64_t>(first * from_size);
    } else {
      // A write that may go as a delta is packed even where it could go
      // direct: its delta is encoded beside the packed bytes.
      ww.staging_at = at;
      ww.staging_bytes = AlignTemp(std::max<uint64_t>(w.bytes, 1));
      ww.delta_at = ww.staging_bytes;
      ww.staging_bytes += AlignTemp(ww.slot_bytes);
      at += ww.staging_bytes;
    }
    sw.writes.push_back(ww);
  }
  sw.need = at;
  // Held whole with nothing to gather and nothing to send from here (a
  // replicated tensor another rank writes): this rank has no work for it.
  // (An exchange is a collective: every rank of the group takes part.)
  if (sw.gather_group < 0 && sw.writes.empty()) sw.need = sw.transient_bytes = sw.fallback_bytes = 0;
  const uint64_t most = sw.need + sw.fallback_bytes;
  if (most > options.watermark_bytes) {
    return InvalidArgument(where + " needs " + std::to_string(most) + " bytes of temporary memory (held " +
                           std::to_string(sw.held_bytes) + ", staging " + std::to_string(sw.need - sw.transient_bytes) +
                           "), above the watermark of " + std::to_string(options.watermark_bytes) +
                           " bytes; raise the watermark to at least " + std::to_string(most));
  }
  work.push_back(std::move(sw));
  return Status::Ok();
}

// A planned exchange: the peers' pieces must tile the held rows in group
// order (they land there back to back), and what this rank sends must lie
// inside its own shard.
const InferencePeer* PlanExecutor::Impl::FindPeer(int32_t rank) const {
  const InferencePeer* peer = nullptr;
  for (const InferencePeer& p : plan->peers) {
    if (p.rank == rank) peer = &p;
  }
  return peer;
}

const std::string* PlanExecutor::Impl::PeerDescriptor(int32_t rank, const std::string& region) const {
  const InferencePeer* peer = FindPeer(rank);
  if (peer == nullptr) return nullptr;
  auto d = peer->region_descriptors.find(region);
  return d == peer->region_descriptors.end() || d->second.empty() ? nullptr : &d->second;
}

StatusOr<transport::RemoteMemory> PlanExecutor::Impl::ImportRegion(
    int32_t dst_rank, const std::string& region, const std::string& where,
    std::map<std::pair<int32_t, std::string>, size_t>* regions, size_t* index) {
  auto key = std::make_pair(dst_rank, region);
  auto it = regions->find(key);
  if (it == regions->end()) {
    if (FindPeer(dst_rank) == nullptr)
      return NotFound(where + ": inference rank " + std::to_string(dst_rank) + " is not in the plan's peers");
    const std::string* d = PeerDescriptor(dst_rank, region);
    if (d == nullptr) {
      return NotFound(where + ": inference rank " + std::to_string(dst_rank) + " has no transport descriptor for region '" +
                      region + "' (has its inference agent registered memory?)");
    }
    StatusOr<transport::MemoryDescriptor> desc = ParseDescriptorText(*d);
    if (!desc.ok()) return desc.status().WithContext(where);
    StatusOr<transport::RemoteMemory> remote = engine->Import(*desc);
    if (!remote.ok()) return remote.status().WithContext(where);
    it = regions->emplace(key, remotes.size()).first;
    remotes.push_back(*remote);
  }
  *index = it->second;
  return remotes[it->second];
}

Status PlanExecutor::Impl::ResolveInbox(const RankWrite& w, const std::string& where, WriteWork* ww,
                                        std::map<std::pair<int32_t, std::string>, size_t>* regions) {
  if (!options.deltas || (options.device != nullptr && !options.device->EncodesDeltas())) return Status::Ok();
  const uint64_t elem = w.kind == WriteKind::kScale ? 4 : static_cast<uint64_t>(DTypeSize(w.dst_dtype));
  if (elem != 1 && elem != 2 && elem != 4) return Status::Ok();
  const delta::Slot slot = delta::SlotOf(w.region_offset, w.bytes);
  // A slot too small for the headers and a few changes is not worth a copy.
  if (slot.bytes < delta::kSlotHeaderBytes + delta::HeadBytes(w.bytes / elem) + 64) return Status::Ok();
  // A receiver without an inbox for this region takes the write whole.
  const std::string inbox_id = delta::InboxRegionId(w.region);
  if (regions->count({w.dst_rank, inbox_id}) == 0 && PeerDescriptor(w.dst_rank, inbox_id) == nullptr)
    return Status::Ok();
  size_t index = 0;
  StatusOr<transport::RemoteMemory> inbox = ImportRegion(w.dst_rank, inbox_id, where, regions, &index);
  if (!inbox.ok()) return inbox.status().WithContext("its delta inbox");
  if (slot.at + slot.bytes > inbox->length) {
    return OutOfRange(where + ": its delta slot ends at byte " + std::to_string(slot.at + slot.bytes) + " of a " +
                      std::to_string(inbox->length) + "-byte inbox (the receiver's inbox is not the size " +
                      "delta/inbox.h gives its region)");
  }
  ww->inbox = index;
  ww->slot_at = slot.at;
  ww->slot_bytes = slot.bytes;
  ww->elem_bytes = static_cast<uint32_t>(elem);
  return Status::Ok();
}

Status PlanExecutor::Impl::AssignCopies(uint64_t arena_floor) {
  uint64_t budget = options.watermark_bytes > arena_floor ? options.watermark_bytes - arena_floor : 0;
  uint64_t used = 0;
  for (SourceWork& sw : work) {
    for (WriteWork& ww : sw.writes) {
      if (ww.slot_bytes == 0) continue;
      const uint64_t bytes = AlignTemp(ww.write->bytes);
      if (bytes > budget - used) continue;  // past the watermark: this write always goes whole
      ww.copy = static_cast<int64_t>(copies.size());
      copies.push_back({used, ww.write->bytes});
      used += bytes;
    }
  }
  if (used == 0) return Status::Ok();
  DeviceOps* device = options.device;
  if (device == nullptr) {
    copy_memory = {new uint8_t[used], [](uint8_t* p) { delete[] p; }};
    return Status::Ok();
  }
  StatusOr<void*> p = device->Allocate(used);
  if (!p.ok()) {
    return p.status().WithContext("trainer rank " + std::to_string(plan->rank) + ": the " + std::to_string(used) +
                                  "-byte delta copies on " + device->name());
  }
  copy_memory = {static_cast<uint8_t*>(*p), [device](uint8_t* q) { device->Free(q); }};
  return Status::Ok();
}

Status PlanExecutor::Impl::ResolveExchange(const RankSource& src, const std::string& where, SourceWork* sw) {
  const int n = static_cast<int>(src.global_shape.size());
  const int gd = src.gather_dim;
  const size_t parts = src.gather_ranks.size();
  auto me = std::find(src.gather_ranks.begin(), src.gather_ranks.end(), plan->rank);
  if (gd < 0 || gd >= n || me == src.gather_ranks.end() || src.recv_rows.size() != parts ||
      src.send_rows.size() != parts) {
    return InvalidArgument(where + ": exchange over dim " + std::to_string(gd) + " needs one received and one sent " +
                           "piece per rank of a group that includes rank " + std::to_string(plan->rank));
  }
  // The dim the pieces may narrow (the last one, right after gd), or -1.
  const int cd = src.exchange_col_dim();
  if (cd >= 0 && (cd != n - 1 || src.send_cols.size() != parts)) {
    return InvalidArgument(where + ": sent pieces narrow dim " + std::to_string(cd) + ", which is not the last one " +
                           "after the exchanged dim " + std::to_string(gd) + ", or not one per rank of the group");
  }
  const int64_t esize = DTypeSize(src.dtype);
  int64_t inner = esize, local_inner = esize, planes = 1;
  for (int d = 0; d < n; ++d) {
    const int64_t lo = src.local.offset[d], hi = lo + src.local.size[d];
    const bool same = lo == src.held.offset[d] && src.local.size[d] == src.held.size[d];
    const bool inside = src.held.offset[d] >= lo && src.held.offset[d] + src.held.size[d] <= hi;
    if (d != gd && !(same || (d == cd && inside))) {
      return InvalidArgument(where + ": local shard " + BoxText(src.local) + " and held rows " + BoxText(src.held) +
                             " differ outside the exchanged dim " + std::to_string(gd) +
                             (cd >= 0 ? " and the narrowed dim " + std::to_string(cd) : std::string()));
    }
    if (d < gd) planes *= src.held.size[d];
    if (d > gd) {
      inner *= src.held.size[d];
      local_inner *= src.local.size[d];
    }
  }
  sw->planes = static_cast<uint64_t>(planes);
  sw->local_row = static_cast<uint64_t>(local_inner);
  sw->local_pitch = static_cast<uint64_t>(src.local.size[gd] * local_inner);
  sw->held_pitch = static_cast<uint64_t>(src.held.size[gd] * inner);
  const int64_t local_lo = src.local.offset[gd], local_hi = local_lo + src.local.size[gd];
  int64_t at = src.held.offset[gd], sent = 0;
  for (size_t i = 0; i < parts; ++i) {
    const Rows& r = src.recv_rows[i];
    const Rows& s = src.send_rows[i];
    if (r.size < 0 || (r.size > 0 && r.offset != at)) {
      return InvalidArgument(where + ": piece from rank " + std::to_string(src.gather_ranks[i]) + " (rows " +
                             std::to_string(r.offset) + "+" + std::to_string(r.size) + ") does not follow row " +
                             std::to_string(at) + " of the held rows " + BoxText(src.held));
    }
    at += r.size;
    const Rows c = cd >= 0 ? src.send_cols[i] : Rows{};
    const bool cols_outside = cd >= 0 && s.size > 0 &&
                              (c.size < 0 || c.offset < src.local.offset[cd] ||
                               c.offset + c.size > src.local.offset[cd] + src.local.size[cd]);
    if (s.size < 0 || (s.size > 0 && (s.offset < local_lo || s.offset + s.size > local_hi)) || cols_outside) {
      return InvalidArgument(where + ": piece for rank " + std::to_string(src.gather_ranks[i]) + " (rows " +
                             std::to_string(s.offset) + "+" + std::to_string(s.size) +
                             (cd >= 0 ? ", cols " + std::to_string(c.offset) + "+" + std::to_string(c.size) : "") +
                             ") is outside the local shard " + BoxText(src.local));
    }
    const int64_t row = cd >= 0 ? c.size * esize : local_inner;
    sw->recv_bytes.push_back(planes * r.size * inner);
    sw->send_bytes.push_back(planes * s.size * row);
    sw->send_row.push_back(static_cast<uint64_t>(row));
    sw->send_from.push_back(
        static_cast<uint64_t>((s.offset - local_lo) * local_inner + (cd >= 0 ? (c.offset - src.local.offset[cd]) * esize : 0)));
    sw->recv_into.push_back(static_cast<uint64_t>((r.offset - src.held.offset[gd]) * inner));
    sent += planes * s.size * row;
  }
  if (at != src.held.offset[gd] + src.held.size[gd]) {
    return InvalidArgument(where + ": the received pieces end at row " + std::to_string(at) + ", the held rows " +
                           BoxText(src.held) + " do not");
  }
  const size_t mine = static_cast<size_t>(me - src.gather_ranks.begin());
  if (cd >= 0 && src.send_rows[mine].size > 0 &&
      !(src.send_cols[mine] == Rows{src.held.offset[cd], src.held.size[cd]})) {
    return InvalidArgument(where + ": keeps cols " + std::to_string(src.send_cols[mine].offset) + "+" +
                           std::to_string(src.send_cols[mine].size) + " of its shard but holds " + BoxText(src.held));
  }
  if (sw->recv_bytes[mine] != sw->send_bytes[mine]) {
    return InvalidArgument(where + ": keeps " + std::to_string(sw->send_bytes[mine]) + " bytes of its shard but places " +
                           std::to_string(sw->recv_bytes[mine]));
  }
  sw->exchange = true;
  auto found = std::find(gather_sets.begin(), gather_sets.end(), src.gather_ranks);
  sw->gather_group = static_cast<int>(found - gather_sets.begin());
  if (found == gather_sets.end()) gather_sets.push_back(src.gather_ranks);
  sw->send_at = AlignTemp(sw->held_bytes);
  sw->recv_at = sw->send_at + AlignTemp(static_cast<uint64_t>(sent));
  // At least a little: a rank with nothing to keep or send still takes part.
  // Pieces of several planes need a landing area before the unpack.
  sw->transient_bytes = std::max(sw->recv_at + (planes > 1 ? AlignTemp(sw->held_bytes) : 0), AlignTemp(1));
  return Status::Ok();
}

Status PlanExecutor::Impl::Resolve() {
  if (plan->rank < 0) return InvalidArgument("trainer plan: rank is not set");
  std::map<std::pair<int32_t, std::string>, size_t> regions;
  for (size_t g = 0; g < plan->groups.size(); ++g) {
    const RankMeshGroup& group = plan->groups[g];
    if (std::find(group.ranks.begin(), group.ranks.end(), plan->rank) == group.ranks.end()) {
      return InvalidArgument("trainer rank " + std::to_string(plan->rank) + ": mesh group '" + group.name +
                             "' does not list this rank");
    }
    const size_t begin = work.size();
    for (const RankSource& src : group.sources) WSYNC_RETURN_IF_ERROR(ResolveSource(g, src, &regions));
    group_work.emplace_back(begin, work.size());
  }
  uint64_t staging = 0, largest = 0;
  for (const SourceWork& sw : work) {
    const bool direct = std::any_of(sw.writes.begin(), sw.writes.end(), [](const WriteWork& w) { return w.direct; });
    staging += direct ? sw.need : sw.need - sw.transient_bytes;  // what writes in flight hold
    largest = std::max(largest, sw.need + sw.fallback_bytes);
  }
  // Room for every write of the version in flight plus two sources' worth, so
  // fragmentation rarely makes a source wait when the watermark would not.
  // Delta copies take what the watermark leaves above the arena's floor:
  // twice the largest source (one being filled while one's writes drain).
  WSYNC_RETURN_IF_ERROR(AssignCopies(2 * largest));
  uint64_t copies_bytes = 0;
  for (const DeltaCopy& c : copies) copies_bytes += AlignTemp(c.bytes);
  const uint64_t capacity = std::min(options.watermark_bytes - copies_bytes, staging + 2 * largest);
  if (capacity > 0) {
    WSYNC_ASSIGN_OR_RETURN(arena, TempArena::Create(capacity, engine, options.device, options.stage_through_host));
  }
  return Status::Ok();
}

}  // namespace wsync
