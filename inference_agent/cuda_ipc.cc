#include "inference_agent/cuda_ipc.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>

#include "cuda_ipc/copies.h"
#include "cuda_ipc/mappings.h"

namespace wsync::inference {
namespace {

class CudaIpcWeights : public WeightMemory {
 public:
  CudaIpcWeights(WeightStore store, int64_t pid, std::unique_ptr<cuda_ipc::Mappings> mappings)
      : store_(std::move(store)), pid_(pid), mappings_(std::move(mappings)) {
    for (const cuda_ipc::Mapped& m : mappings_->regions()) {
      regions_.push_back(Region{m.id, m.data, m.bytes, transport::MemoryKind::kCuda, m.device});
    }
  }

  std::string name() const override {
    return std::to_string(regions_.size()) + " CUDA tensors of process " + std::to_string(pid_) + " (versions in '" +
           store_.name() + "')";
  }
  const std::vector<Region>& regions() const override { return regions_; }
  uint64_t complete_version() const override { return store_.complete_version(); }
  uint64_t failed_version() const override { return store_.failed_version(); }
  bool MarkComplete(uint64_t v) override { return store_.MarkComplete(v); }
  void MarkFailed(uint64_t v) override { store_.MarkFailed(v); }
  void MarkCommitting(uint64_t v) override { store_.MarkCommitting(v); }
  Status Read(const Region& r, uint64_t offset, uint64_t bytes, uint8_t* out) const override {
    if (offset > r.size || bytes > r.size - offset) return WeightMemory::Read(r, offset, bytes, out);  // its error
    Status s = cuda_ipc::Mappings::CopyToHost(r.device, r.data + offset, bytes, out);
    if (!s.ok()) return s.WithContext(name() + ": region '" + r.id + "'");
    return Status::Ok();
  }

  // Delta versions: an inbox is device memory of the sidecar's own on the
  // tensor's GPU, and deltas are applied there on a stream of its own.
  StatusOr<uint8_t*> AllocateInbox(const Region& r, uint64_t bytes) override {
    StatusOr<std::unique_ptr<cuda_ipc::Buffer>> b = cuda_ipc::Buffer::Allocate(cuda_ipc::Buffer::Kind::kDevice, r.device, bytes);
    if (!b.ok()) return b.status().WithContext(name() + ": the delta inbox of region '" + r.id + "'");
    uint8_t* p = (*b)->data();
    std::lock_guard<std::mutex> lock(mu_);
    inboxes_.emplace(p, std::move(b).value());
    return p;
  }
  void FreeInbox(const Region&, uint8_t* inbox) override {
    std::lock_guard<std::mutex> lock(mu_);
    inboxes_.erase(inbox);
  }
  Status ApplyDelta(const Region& r, const uint8_t* delta, uint64_t delta_bytes, uint8_t* target, uint64_t size,
                    const char* what) const override {
    std::lock_guard<std::mutex> lock(mu_);
    std::unique_ptr<cuda_ipc::CopyStream>& stream = appliers_[r.device];
    if (stream == nullptr) {
      StatusOr<std::unique_ptr<cuda_ipc::CopyStream>> made = cuda_ipc::CopyStream::Create(r.device);
      if (!made.ok()) return made.status().WithContext(name());
      stream = std::move(made).value();
    }
    return stream->ApplyDelta(delta, delta_bytes, target, size, what);
  }

 private:
  WeightStore store_;
  int64_t pid_;
  std::unique_ptr<cuda_ipc::Mappings> mappings_;
  std::vector<Region> regions_;
  mutable std::mutex mu_;
  std::map<uint8_t*, std::unique_ptr<cuda_ipc::Buffer>> inboxes_;                 // guarded by mu_
  mutable std::map<int, std::unique_ptr<cuda_ipc::CopyStream>> appliers_;  // by device; guarded by mu_
};

// Shadow regions carved from one buffer per (kind, GPU), 4 KiB aligned.
class CudaShadow : public ShadowMemory {
 public:
  static StatusOr<std::unique_ptr<ShadowMemory>> Create(const WeightMemory& live, bool staging) {
    std::unique_ptr<CudaShadow> shadow(new CudaShadow);
    auto rounded = [](uint64_t bytes) { return (std::max<uint64_t>(bytes, 1) + 4095) / 4096 * 4096; };
    auto kind_of = [&](const WeightMemory::Region& r) {
      if (r.kind == transport::MemoryKind::kHost || staging) return cuda_ipc::Buffer::Kind::kPinnedHost;
      return cuda_ipc::Buffer::Kind::kDevice;
    };
    std::map<std::pair<cuda_ipc::Buffer::Kind, int>, uint64_t> sizes;
    for (const WeightMemory::Region& r : live.regions()) sizes[{kind_of(r), r.device}] += rounded(r.size);
    std::map<std::pair<cuda_ipc::Buffer::Kind, int>, uint8_t*> next;
    for (const auto& [key, bytes] : sizes) {
      StatusOr<std::unique_ptr<cuda_ipc::Buffer>> b = cuda_ipc::Buffer::Allocate(key.first, key.second, bytes);
      if (!b.ok()) return b.status().WithContext("the shadow of " + live.name());
      next[key] = (*b)->data();
      shadow->buffers_.push_back(std::move(b).value());
    }
    for (const WeightMemory::Region& r : live.regions()) {
      WeightMemory::Region copy = r;
      const auto key = std::make_pair(kind_of(r), r.device);
      copy.data = next[key];
      next[key] += rounded(r.size);
      copy.kind = key.first == cuda_ipc::Buffer::Kind::kDevice ? transport::MemoryKind::kCuda
                                                                : transport::MemoryKind::kHost;
      shadow->regions_.push_back(copy);
    }
    return std::unique_ptr<ShadowMemory>(std::move(shadow));
  }

  const std::vector<WeightMemory::Region>& regions() const override { return regions_; }

  Status CopyOut(const WeightMemory::Region& from, const WeightMemory::Region& to, uint64_t offset,
                 uint64_t bytes) override {
    if (to.kind == transport::MemoryKind::kHost) {
      std::memcpy(to.data + offset, from.data + offset, bytes);
      return Status::Ok();
    }
    auto it = streams_.find(to.device);
    if (it == streams_.end()) {
      StatusOr<std::unique_ptr<cuda_ipc::CopyStream>> made = cuda_ipc::CopyStream::Create(to.device);
      if (!made.ok()) return made.status();
      it = streams_.emplace(to.device, std::move(made).value()).first;
    }
    Status s = it->second->Copy(to.data + offset, from.data + offset, bytes);
    if (!s.ok()) return s.WithContext("copying region '" + to.id + "' out of the shadow");
    return Status::Ok();
  }

  Status Finish() override {
    Status first = Status::Ok();
    for (auto& [device, stream] : streams_) {
      Status s = stream->Finish();
      if (first.ok() && !s.ok()) first = s.WithContext("copies out of the shadow");
    }
    return first;
  }

 private:
  CudaShadow() = default;
  std::vector<std::unique_ptr<cuda_ipc::Buffer>> buffers_;
  std::vector<WeightMemory::Region> regions_;
  std::map<int, std::unique_ptr<cuda_ipc::CopyStream>> streams_;  // by device
};

}  // namespace

StatusOr<std::unique_ptr<ShadowMemory>> MakeCudaShadow(const WeightMemory& live, bool staging) {
  return CudaShadow::Create(live, staging);
}

StatusOr<cuda_ipc::Export> ReadCudaIpcExport(const std::string& path, const InferenceRank& rank) {
  std::vector<cuda_ipc::Expected> expected;
  for (const MemoryRegion& r : rank.regions) expected.push_back({r.id, r.size});
  return cuda_ipc::ReadFile(path, expected, "inference rank " + std::to_string(rank.rank));
}

StatusOr<std::unique_ptr<WeightMemory>> OpenCudaIpcWeights(const cuda_ipc::Export& ipc, WeightStore store) {
  WSYNC_ASSIGN_OR_RETURN(std::unique_ptr<cuda_ipc::Mappings> mappings, cuda_ipc::Mappings::Open(ipc));
  return std::unique_ptr<WeightMemory>(new CudaIpcWeights(std::move(store), ipc.pid, std::move(mappings)));
}

}  // namespace wsync::inference
