#include "inference_agent/weight_memory.h"

#include <utility>

namespace wsync::inference {
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
