// The thread that runs user callbacks, so a slow callback never stalls the
// worker's polling. Notices arrive from the worker through a lock-free
// queue; the thread sleeps on a futex when there is nothing to run.
#pragma once

#include <atomic>
#include <thread>

#include "transport/libfabric/request.h"

namespace wsync::transport::fabric {

class CallbackThread {
 public:
  CallbackThread();
  ~CallbackThread();  // runs what is queued, then joins

  // Worker thread (or any thread). Takes ownership.
  void Push(Notice* notice) {
    queue_.Push(notice);
    parker_.Unpark();
  }

 private:
  void Loop();

  MpscQueue queue_;
  Parker parker_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace wsync::transport::fabric
