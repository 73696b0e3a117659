#include "inference_agent/weight_memory.h"

#include <cstring>
#include <utility>

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

 private:
  WeightStore store_;
  std::vector<Region> regions_;
};

}  // namespace

std::unique_ptr<WeightMemory> MakeShmWeightMemory(WeightStore store) {
  return std::make_unique<ShmWeightMemory>(std::move(store));
}

}  // namespace wsync::inference
