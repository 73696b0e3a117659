#include "inference_agent/cuda_ipc.h"

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
  Status Read(const Region& r, uint64_t offset, uint64_t bytes, uint8_t* out) const override {
    if (offset > r.size || bytes > r.size - offset) return WeightMemory::Read(r, offset, bytes, out);  // its error
    Status s = cuda_ipc::Mappings::CopyToHost(r.device, r.data + offset, bytes, out);
    if (!s.ok()) return s.WithContext(name() + ": region '" + r.id + "'");
    return Status::Ok();
  }

 private:
  WeightStore store_;
  int64_t pid_;
  std::unique_ptr<cuda_ipc::Mappings> mappings_;
  std::vector<Region> regions_;
};

}  // namespace

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
