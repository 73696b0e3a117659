#include "transport/libfabric/cuda_context.h"

#include <dlfcn.h>

namespace wsync::transport::fabric {
namespace {

// The four driver entry points needed, from libcuda.so.1 if it is present.
struct Driver {
  using Result = int;  // CUresult; 0 is CUDA_SUCCESS
  Result (*init)(unsigned) = nullptr;
  Result (*ctx_get_current)(void**) = nullptr;
  Result (*ctx_set_current)(void*) = nullptr;
  Result (*primary_ctx_retain)(void**, int) = nullptr;
  Result (*device_get)(int*, int) = nullptr;

  static const Driver* Get() {
    static const Driver* driver = [] () -> const Driver* {
      // Only a process that has already loaded CUDA (torch, the runtime) has
      // device memory to register; never load a driver into one that has not.
      void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
      if (lib == nullptr) return nullptr;
      static Driver d;
      d.init = reinterpret_cast<Result (*)(unsigned)>(dlsym(lib, "cuInit"));
      d.ctx_get_current = reinterpret_cast<Result (*)(void**)>(dlsym(lib, "cuCtxGetCurrent"));
      d.ctx_set_current = reinterpret_cast<Result (*)(void*)>(dlsym(lib, "cuCtxSetCurrent"));
      d.primary_ctx_retain = reinterpret_cast<Result (*)(void**, int)>(dlsym(lib, "cuDevicePrimaryCtxRetain"));
      d.device_get = reinterpret_cast<Result (*)(int*, int)>(dlsym(lib, "cuDeviceGet"));
      if (!d.init || !d.ctx_get_current || !d.ctx_set_current || !d.primary_ctx_retain || !d.device_get)
        return nullptr;
      return &d;
    }();
    return driver;
  }
};

}  // namespace

CudaContextCarrier CudaContextCarrier::Capture(int gpu) {
  CudaContextCarrier carrier;
  const Driver* d = Driver::Get();
  if (d == nullptr || d->init(0) != 0) return carrier;
  void* current = nullptr;
  if (d->ctx_get_current(&current) == 0 && current != nullptr) {
    carrier.context_ = current;
    return carrier;
  }
  int device = 0;
  void* primary = nullptr;
  if (gpu >= 0 && d->device_get(&device, gpu) == 0 && d->primary_ctx_retain(&primary, device) == 0) {
    carrier.context_ = primary;  // retained for the life of the process
  }
  return carrier;
}

bool CudaContextCarrier::Apply() const {
  const Driver* d = Driver::Get();
  return context_ != nullptr && d != nullptr && d->ctx_set_current(context_) == 0;
}

}  // namespace wsync::transport::fabric
