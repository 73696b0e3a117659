#include "transport/libfabric/callback_thread.h"

namespace wsync::transport::fabric {

CallbackThread::CallbackThread() : thread_([this] { Loop(); }) {}

CallbackThread::~CallbackThread() {
  stop_.store(true);
  parker_.Unpark();
  thread_.join();
}

void CallbackThread::Loop() {
  while (true) {
    if (QueueNode* node = queue_.Pop()) {
      Notice* notice = static_cast<Notice*>(node);
      notice->Run();
      delete notice;
      continue;
    }
    if (stop_.load()) {
      if (queue_.Empty()) return;
      continue;
    }
    parker_.PrepareToPark();
    if (!queue_.Empty() || stop_.load()) {
      parker_.CancelPark();
      continue;
    }
    parker_.Park(std::chrono::microseconds(10000));
  }
}

}  // namespace wsync::transport::fabric
