// Mappings with the CUDA runtime (built where the toolkit is).
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstring>
#include <map>

#include "cuda_ipc/mappings.h"

namespace wsync::cuda_ipc {
namespace {

std::string CudaError(cudaError_t e) { return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e); }

// cuMemGetAddressRange through the runtime's driver entry point, so that
// nothing links libcuda itself: the allocation a device pointer lies in.
using AddressRangeFn = CUresult (*)(CUdeviceptr* base, size_t* size, CUdeviceptr ptr);

AddressRangeFn AddressRange() {
  static const AddressRangeFn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &p, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return static_cast<AddressRangeFn>(nullptr);
    }
    return reinterpret_cast<AddressRangeFn>(p);
  }();
  return fn;
}

}  // namespace

StatusOr<std::unique_ptr<Mappings>> Mappings::Open(const Export& ipc) {
  std::unique_ptr<Mappings> m(new Mappings);
  struct Opened {
    uint8_t* base;
    uint64_t size;  // of the allocation; 0 where the driver would not say
  };
  std::map<std::pair<int, std::string>, Opened> bases;  // (device, handle bytes)
  for (const Region& r : ipc.regions) {
    const std::string where =
        "CUDA IPC region '" + r.id + "' of process " + std::to_string(ipc.pid) + " on cuda:" + std::to_string(r.device);
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
      m->opened_.emplace_back(device, base);
      uint64_t size = 0;
      if (AddressRangeFn range = AddressRange()) {
        CUdeviceptr start = 0;
        size_t bytes = 0;
        if (range(&start, &bytes, reinterpret_cast<CUdeviceptr>(base)) == CUDA_SUCCESS) {
          size = bytes - (reinterpret_cast<CUdeviceptr>(base) - start);
        }
      }
      it = bases.emplace(key, Opened{static_cast<uint8_t*>(base), size}).first;
    }
    const Opened& o = it->second;
    if (o.size > 0 && (r.offset > o.size || r.bytes > o.size - r.offset)) {
      return OutOfRange(where + ": bytes [" + std::to_string(r.offset) + ", " + std::to_string(r.offset + r.bytes) +
                        ") reach past the end of its allocation (" + std::to_string(o.size) +
                        " bytes); the exporter's offset or size is wrong");
    }
    m->regions_.push_back(Mapped{r.id, device, o.base + r.offset, r.bytes});
  }
  return m;
}

Mappings::~Mappings() {
  for (const auto& [device, base] : opened_) {
    if (cudaSetDevice(device) == cudaSuccess) (void)cudaIpcCloseMemHandle(base);
  }
}

Status Mappings::CopyToHost(int device, const void* src, uint64_t bytes, void* out) {
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaMemcpy(out, src, bytes, cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) return Internal("reading cuda:" + std::to_string(device) + " memory back: " + CudaError(e));
  return Status::Ok();
}

}  // namespace wsync::cuda_ipc
