// OpenCudaIpcWeights with the CUDA runtime (built where the toolkit is).
#include <cuda_runtime.h>

#include <cstring>
#include <map>

#include "inference_agent/cuda_ipc.h"

namespace wsync::inference {
namespace {

std::string CudaError(cudaError_t e) { return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e); }

class CudaIpcWeights : public WeightMemory {
 public:
  CudaIpcWeights(WeightStore store, int64_t pid) : store_(std::move(store)), pid_(pid) {}
  ~CudaIpcWeights() override {
    for (const auto& [device, base] : opened_) {
      if (cudaSetDevice(device) == cudaSuccess) (void)cudaIpcCloseMemHandle(base);
    }
  }

  Status Open(const CudaIpcExport& ipc) {
    std::map<std::pair<int, std::string>, uint8_t*> bases;  // (device, handle bytes) -> mapping
    for (const CudaIpcRegion& r : ipc.regions) {
      const std::string where = "CUDA IPC region '" + r.id + "' of process " + std::to_string(pid_) + " on cuda:" +
                                std::to_string(r.device);
      int device = r.device;
      if (!r.pci_bus_id.empty()) {
        const cudaError_t e = cudaDeviceGetByPCIBusId(&device, r.pci_bus_id.c_str());
        if (e != cudaSuccess) {
          return Unavailable(where + ": its GPU " + r.pci_bus_id + " is not visible here: " + CudaError(e));
        }
      }
      const auto key = std::make_pair(device, std::string(r.handle.begin(), r.handle.end()));
      auto it = bases.find(key);
      if (it == bases.end()) {
        cudaError_t e = cudaSetDevice(device);
        cudaIpcMemHandle_t handle;
        std::memcpy(&handle, r.handle.data(), sizeof handle);
        void* base = nullptr;
        if (e == cudaSuccess) e = cudaIpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess);
        if (e != cudaSuccess) return Unavailable(where + ": cudaIpcOpenMemHandle: " + CudaError(e));
        opened_.emplace_back(device, base);
        it = bases.emplace(key, static_cast<uint8_t*>(base)).first;
      }
      regions_.push_back(Region{r.id, it->second + r.offset, r.bytes, transport::MemoryKind::kCuda, device});
    }
    return Status::Ok();
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
    cudaError_t e = cudaSetDevice(r.device);
    if (e == cudaSuccess) e = cudaMemcpy(out, r.data + offset, bytes, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) return Internal(name() + ": reading region '" + r.id + "' back: " + CudaError(e));
    return Status::Ok();
  }

 private:
  WeightStore store_;
  int64_t pid_;
  std::vector<Region> regions_;
  std::vector<std::pair<int, void*>> opened_;
};

}  // namespace

StatusOr<std::unique_ptr<WeightMemory>> OpenCudaIpcWeights(const CudaIpcExport& ipc, WeightStore store) {
  auto weights = std::make_unique<CudaIpcWeights>(std::move(store), ipc.pid);
  WSYNC_RETURN_IF_ERROR(weights->Open(ipc));
  return std::unique_ptr<WeightMemory>(std::move(weights));
}

}  // namespace wsync::inference
