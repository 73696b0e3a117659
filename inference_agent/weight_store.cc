#include "inference_agent/weight_store.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <utility>

#include <nlohmann/json.hpp>

#include "routing/dtype.h"

namespace wsync::inference {
namespace {

uint64_t TensorBytes(const Shape& shape, DType dtype) {
  uint64_t n = static_cast<uint64_t>(DTypeSize(dtype));
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

std::atomic_ref<uint64_t> Word(uint64_t& w) { return std::atomic_ref<uint64_t>(w); }

}  // namespace

std::string WeightStoreName(const std::string& job, int32_t rank) {
  return "/wsync-" + job + "-infer-" + std::to_string(rank);
}

StatusOr<WeightStore::Layout> WeightStore::BuildLayout(const InferenceRank& rank) {
  const std::string where = "inference rank " + std::to_string(rank.rank);
  if (rank.regions.empty()) return InvalidArgument(where + ": has no memory regions");
  Layout layout;
  std::map<std::string, uint64_t> region_size;
  nlohmann::json regions = nlohmann::json::array();
  // Offsets are relative to data_offset until the layout size is known.
  uint64_t cursor = 0;
  for (const MemoryRegion& r : rank.regions) {
    if (r.size == 0) return InvalidArgument(where + ": region '" + r.id + "' has size 0");
    if (!region_size.emplace(r.id, r.size).second) {
      return InvalidArgument(where + ": region '" + r.id + "' is listed twice");
    }
    layout.region_offsets.push_back(cursor);
    cursor = AlignUp(cursor + r.size, kWeightStoreAlign);
  }
  nlohmann::json tensors = nlohmann::json::array();
  auto add = [&](const std::string& name, const Shape& shape, DType dtype, const RegionRef& at) -> Status {
    auto it = region_size.find(at.region);
    if (it == region_size.end()) {
      return InvalidArgument(where + ": tensor '" + name + "': unknown region '" + at.region + "'");
    }
    const uint64_t bytes = TensorBytes(shape, dtype);
    if (at.offset > it->second || bytes > it->second - at.offset) {
      return OutOfRange(where + ": tensor '" + name + "': bytes [" + std::to_string(at.offset) + ", " +
                        std::to_string(at.offset + bytes) + ") lie outside region '" + at.region +
                        "' of " + std::to_string(it->second) + " bytes");
    }
    tensors.push_back({{"name", name}, {"dtype", std::string(DTypeName(dtype))}, {"shape", shape},
                       {"region", at.region}, {"offset", at.offset}, {"bytes", bytes}});
    return Status::Ok();
  };
  for (const InferenceTensor& t : rank.tensors) {
    WSYNC_RETURN_IF_ERROR(add(t.name, t.shape, t.dtype, t.where));
    if (t.scale) WSYNC_RETURN_IF_ERROR(add(t.scale->name, t.scale->shape, t.scale->dtype, t.scale->where));
  }
  layout.num_tensors = static_cast<uint32_t>(tensors.size());

  // The JSON holds absolute region offsets, which depend on its own length:
  // widen the data offset until the text fits in front of it.
  layout.data_offset = AlignUp(kWeightStoreHeaderBytes + 1, kWeightStoreAlign);
  for (;;) {
    regions = nlohmann::json::array();
    for (size_t i = 0; i < rank.regions.size(); ++i) {
      regions.push_back({{"id", rank.regions[i].id},
                         {"offset", layout.data_offset + layout.region_offsets[i]},
                         {"size", rank.regions[i].size}});
    }
    nlohmann::json j = {{"schema", kWeightStoreSchema}, {"rank", rank.rank}, {"regions", regions},
                        {"tensors", tensors}};
    layout.json = j.dump();
    const uint64_t need = AlignUp(kWeightStoreHeaderBytes + layout.json.size(), kWeightStoreAlign);
    if (need <= layout.data_offset) break;
    layout.data_offset = need;
  }
  for (uint64_t& off : layout.region_offsets) off += layout.data_offset;
  layout.total_bytes = layout.data_offset + cursor;
  return layout;
}

void WeightStore::MapRegions(const InferenceRank& rank, const Layout& layout) {
  regions_.clear();
  for (size_t i = 0; i < rank.regions.size(); ++i) {
    regions_.push_back({rank.regions[i].id, shm_.data() + layout.region_offsets[i], rank.regions[i].size});
  }
}

StatusOr<WeightStore> WeightStore::Create(const std::string& shm_name, const InferenceRank& rank) {
  WSYNC_ASSIGN_OR_RETURN(Layout layout, BuildLayout(rank));
  // A new object, not the old one truncated: an engine still mapping a
  // previous store keeps valid (stale) memory instead of faulting on it.
  shm_unlink(shm_name.c_str());
  WSYNC_ASSIGN_OR_RETURN(ShmRegion shm, ShmRegion::Create(shm_name, layout.total_bytes));
  WeightStore store;
  store.shm_ = std::move(shm);
  WeightStoreHeader* h = store.header();
  std::memcpy(store.shm_.data() + kWeightStoreHeaderBytes, layout.json.data(), layout.json.size());
  h->format = kWeightStoreFormat;
  h->rank = rank.rank;
  h->layout_hash = LayoutHash(layout.json);
  h->layout_offset = kWeightStoreHeaderBytes;
  h->layout_bytes = layout.json.size();
  h->data_offset = layout.data_offset;
  h->total_bytes = layout.total_bytes;
  h->num_tensors = layout.num_tensors;
  h->num_regions = static_cast<uint32_t>(rank.regions.size());
  h->complete_version = kNoVersion;
  h->failed_version = kNoVersion;
  h->committing_version = kNoVersion;
  // Last: a reader that sees the magic sees everything above.
  Word(h->magic).store(kWeightStoreMagic, std::memory_order_release);
  store.MapRegions(rank, layout);
  return store;
}

StatusOr<WeightStore> WeightStore::Attach(const std::string& shm_name, const InferenceRank& rank) {
  WSYNC_ASSIGN_OR_RETURN(Layout layout, BuildLayout(rank));
  WSYNC_ASSIGN_OR_RETURN(ShmRegion shm, ShmRegion::Open(shm_name));
  const std::string where = "weight store '" + shm_name + "'";
  if (shm.size() < kWeightStoreHeaderBytes) {
    return FailedPrecondition(where + ": " + std::to_string(shm.size()) +
                              " bytes is too small to be a weight store; remove it or create a new one");
  }
  auto* h = reinterpret_cast<WeightStoreHeader*>(shm.data());
  if (Word(h->magic).load(std::memory_order_acquire) != kWeightStoreMagic || h->format != kWeightStoreFormat) {
    return FailedPrecondition(where + ": not a wsync weight store (format " + std::to_string(kWeightStoreFormat) +
                              "); remove it or create a new one");
  }
  const uint64_t want = LayoutHash(layout.json);
  if (h->layout_hash != want || h->total_bytes != layout.total_bytes || shm.size() < layout.total_bytes) {
    return FailedPrecondition(where + ": holds a different layout than inference rank " +
                              std::to_string(rank.rank) + " (layout hash " + std::to_string(h->layout_hash) +
                              ", expected " + std::to_string(want) + "); create a new store for this layout");
  }
  WeightStore store;
  store.shm_ = std::move(shm);
  store.MapRegions(rank, layout);
  return store;
}

uint64_t WeightStore::complete_version() const {
  return Word(header()->complete_version).load(std::memory_order_acquire);
}

uint64_t WeightStore::failed_version() const {
  return Word(header()->failed_version).load(std::memory_order_acquire);
}

bool WeightStore::MarkComplete(uint64_t v) {
  WeightStoreHeader* h = header();
  const uint64_t current = Word(h->complete_version).load(std::memory_order_relaxed);
  const bool moved = current == kNoVersion || v > current;
  // The count first: an engine that sees the new version also sees the count.
  Word(h->completed_versions).fetch_add(1, std::memory_order_relaxed);
  if (moved) Word(h->complete_version).store(v, std::memory_order_release);
  return moved;
}

uint64_t WeightStore::committing_version() const {
  return Word(header()->committing_version).load(std::memory_order_acquire);
}

void WeightStore::RaiseFailed(uint64_t v) {
  WeightStoreHeader* h = header();
  const uint64_t current = Word(h->failed_version).load(std::memory_order_relaxed);
  if (current == kNoVersion || v > current) Word(h->failed_version).store(v, std::memory_order_release);
}

void WeightStore::MarkCommitting(uint64_t v) {
  // The committing word first: a reader that sees failed_version at v (an
  // acquire load) sees that v is being copied, not failed.
  Word(header()->committing_version).store(v, std::memory_order_release);
  RaiseFailed(v);
}

void WeightStore::MarkFailed(uint64_t v) {
  WeightStoreHeader* h = header();
  Word(h->failed_versions).fetch_add(1, std::memory_order_relaxed);
  RaiseFailed(v);
  // A copy of v that failed: readers waiting for v now see it failed.
  uint64_t committing = v;
  Word(h->committing_version).compare_exchange_strong(committing, kNoVersion, std::memory_order_release,
                                                      std::memory_order_relaxed);
}

std::optional<WeightStore::UpdateChannel::Request> WeightStore::UpdateChannel::Pending() const {
  Request r;
  r.seq = Word(h_->update_request).load(std::memory_order_acquire);
  if (r.seq == 0 || r.seq == Word(h_->update_done).load(std::memory_order_relaxed)) return std::nullopt;
  r.version = Word(h_->update_version).load(std::memory_order_relaxed);
  r.timeout_ms = Word(h_->update_timeout_ms).load(std::memory_order_relaxed);
  return r;
}

void WeightStore::UpdateChannel::Answer(uint64_t seq, uint64_t version, uint64_t code, const std::string& message) {
  Word(h_->update_result).store(version, std::memory_order_relaxed);
  Word(h_->update_code).store(code, std::memory_order_relaxed);
  const size_t n = std::min(message.size(), sizeof(h_->update_message) - 1);
  std::memcpy(h_->update_message, message.data(), n);
  h_->update_message[n] = '\0';
  Word(h_->update_done).store(seq, std::memory_order_release);
}

}  // namespace wsync::inference
