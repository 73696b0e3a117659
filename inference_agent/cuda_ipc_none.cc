// OpenCudaIpcWeights where wsync was built without the CUDA toolkit.
#include "inference_agent/cuda_ipc.h"

namespace wsync::inference {

StatusOr<std::unique_ptr<WeightMemory>> OpenCudaIpcWeights(const CudaIpcExport& ipc, WeightStore) {
  return Unimplemented("--cuda-ipc: this wsync was built without the CUDA toolkit, so it cannot open the " +
                       std::to_string(ipc.regions.size()) + " CUDA IPC handles (rebuild where nvcc is found)");
}

}  // namespace wsync::inference
