// The CUDA context libfabric's device calls need on the engine's worker.
//
// libfabric makes its CUDA calls (IPC handles at registration, the shm
// target's device copies and their events) on the thread that progresses
// the endpoint: the engine's worker, which CUDA has never seen. The worker
// takes on the context current on the thread that created the engine (the
// trainer's or engine's thread that holds the tensors), or else the primary
// context of the GPU the options name. Reached through the driver API loaded
// at run time, so the transport builds and runs where CUDA is absent (then
// this does nothing).
#pragma once

namespace wsync::transport::fabric {

class CudaContextCarrier {
 public:
  // On the creating thread: remembers its current context, or the primary
  // context of `gpu` (>= 0) when none is current.
  static CudaContextCarrier Capture(int gpu);
  // On the worker: makes that context current. True if there was one.
  bool Apply() const;

 private:
  void* context_ = nullptr;
};

}  // namespace wsync::transport::fabric
