// MakeCudaDevice where wsync was built without the CUDA toolkit.
#include "pipeline/cuda_device.h"

namespace wsync {

StatusOr<std::unique_ptr<DeviceOps>> MakeCudaDevice(int ordinal) {
  return Unimplemented("cuda:" + std::to_string(ordinal) +
                       ": this wsync was built without the CUDA toolkit, so its pipeline runs on the host only "
                       "(rebuild where nvcc is found)");
}

}  // namespace wsync
