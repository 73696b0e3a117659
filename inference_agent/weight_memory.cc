#include "inference_agent/weight_memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "common/checksum.h"

namespace wsync::inference {

Status WeightMemory::Read(const Region& r, uint64_t offset, uint64_t bytes, uint8_t* out) const {
  if (offset > r.size || bytes > r.size - offset)
    return OutOfRange(name() + ": region '" + r.id + "': bytes [" + std::to_string(offset) + ", " +
                      std::to_string(offset + bytes) + ") are outside its " + std::to_string(r.size));
  if (r.kind != transport::MemoryKind::kHost)
    return Unimplemented(name() + ": region '" + r.id + "' is device memory, which this owner cannot read back");
  std::memcpy(out, r.data + offset, bytes);
  return Status::Ok();
}

Status WeightMemory::Checksums(const std::vector<Range>& ranges, uint64_t* out) const {
  constexpr uint64_t kPiece = 16ull << 20;
  std::vector<uint8_t> piece;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const Range& g = ranges[i];
    const Region& r = *g.region;
    if (g.offset > r.size || g.bytes > r.size - g.offset) return Read(r, g.offset, g.bytes, nullptr);  // its error
    if (r.kind == transport::MemoryKind::kHost) {
      out[i] = Checksum64(r.data + g.offset, g.bytes);
      continue;
    }
    Checksum64Stream h;
    for (uint64_t done = 0; done < g.bytes;) {
      const uint64_t n = std::min(kPiece, g.bytes - done);
      piece.resize(static_cast<size_t>(n));
      WSYNC_RETURN_IF_ERROR(Read(r, g.offset + done, n, piece.data()));
      h.Update(piece.data(), n);
      done += n;
    }
    out[i] = h.Final();
  }
  return Status::Ok();
}

StatusOr<uint8_t*> WeightMemory::AllocateInbox(const Region& r, uint64_t) {
  return Unimplemented(name() + ": region '" + r.id + "' is device memory, and this owner keeps no delta inbox there");
}

Status WeightMemory::ApplyDelta(const Region& r, const uint8_t*, uint64_t, uint8_t*, uint64_t, const char* what) const {
  return Unimplemented(name() + ": " + what + ": region '" + r.id +
                       "' is device memory, and this owner applies no delta there");
}

namespace {

class ShmWeightMemory : public WeightMemory {
 public:
  explicit ShmWeightMemory(WeightStore store) : store_(std::move(store)) {
    for (const WeightStore::Region& r : store_.regions()) {
      regions_.push_back(Region{r.id, r.data, r.size, transport::MemoryKind::kHost, 0});
    }
  }
  std::string name() const override { return store_.name(); }
  const std::vector<Region>& regions() const override { return regions_; }
  uint64_t complete_version() const override { return store_.complete_version(); }
  uint64_t failed_version() const override { return store_.failed_version(); }
  bool MarkComplete(uint64_t v) override { return store_.MarkComplete(v); }
  void MarkFailed(uint64_t v) override { store_.MarkFailed(v); }
  void MarkCommitting(uint64_t v) override { store_.MarkCommitting(v); }

 private:
  WeightStore store_;
  std::vector<Region> regions_;
};

class HostShadow : public ShadowMemory {
 public:
  ~HostShadow() override {
    for (const WeightMemory::Region& r : regions_) munmap(r.data, std::max<uint64_t>(r.size, 1));
  }
  const std::vector<WeightMemory::Region>& regions() const override { return regions_; }
  Status CopyOut(const WeightMemory::Region& from, const WeightMemory::Region& to, uint64_t offset,
                 uint64_t bytes) override {
    std::memcpy(to.data + offset, from.data + offset, bytes);
    return Status::Ok();
  }
  Status Finish() override { return Status::Ok(); }
  std::vector<WeightMemory::Region> regions_;
};

}  // namespace

StatusOr<std::unique_ptr<ShadowMemory>> MakeHostShadow(const WeightMemory& live) {
  auto shadow = std::make_unique<HostShadow>();
  for (const WeightMemory::Region& r : live.regions()) {
    if (r.kind != transport::MemoryKind::kHost)
      return InvalidArgument(live.name() + ": region '" + r.id + "' is device memory: a host shadow cannot hold it");
    void* p = mmap(nullptr, std::max<uint64_t>(r.size, 1), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      return Internal(live.name() + ": shadow of region '" + r.id + "' (" + std::to_string(r.size) +
                      " bytes): mmap: " + std::strerror(errno));
    shadow->regions_.push_back({r.id, static_cast<uint8_t*>(p), r.size, r.kind, r.device});
  }
  return std::unique_ptr<ShadowMemory>(std::move(shadow));
}

std::unique_ptr<WeightMemory> MakeShmWeightMemory(WeightStore store) {
  return std::make_unique<ShmWeightMemory>(std::move(store));
}

}  // namespace wsync::inference
