// A request as it travels caller -> worker -> callback thread. The caller
// allocates it (one allocation per request, none per operation), the worker
// posts its operations and counts their completions, and the callback
// thread runs its callback and deletes it (Notice). A request that fails
// early (timeout) while operations are still in flight hands a separate
// Notice to the callback thread and is deleted by the worker once drained.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "transport/engine.h"
#include "transport/libfabric/mpsc_queue.h"

namespace wsync::transport::fabric {

struct Notice : QueueNode {
  virtual ~Notice() = default;
  Callback done;
  RecvCallback recv_done;
  Status status;
  std::string message;  // for recv_done
  void Run() {
    if (recv_done) {
      if (status.ok()) recv_done(std::move(message));
      else recv_done(status);
    } else if (done) {
      done(status);
    }
  }
};

enum class RequestKind : uint8_t { kWrite, kPaged, kScatter, kBarrier, kSend, kRecv, kExpect, kControl };

struct Request : Notice {
  RequestKind kind = RequestKind::kControl;
  // Payload (only the one matching `kind` is used).
  SingleWrite write;
  PagedWrite paged;
  ScatterWrite scatter;
  BarrierWrite barrier;
  PeerId peer = 0;                     // kSend
  uint32_t imm = 0, count = 0;         // kExpect
  Clock::time_point expect_deadline;   // kExpect, kRecv
  std::function<void()> control;       // kControl: runs on the worker

  // Worker state.
  uint32_t total_ops = 0;
  uint32_t posted_ops = 0;
  uint32_t completed_ops = 0;
  uint64_t eagain = 0;  // posts the provider answered FI_EAGAIN (for the timeout's message)
  uint32_t send_slot = UINT32_MAX;
  uint64_t op_charge = 0;  // bytes each op counts against the in-flight cap
  uint32_t base_nic = 0;  // first NIC used; ops go round-robin from it
  bool finished = false;  // callback already handed off (timeout/error)
  bool released = false;  // timed out: its ops no longer count against NIC caps
  std::array<uint32_t, kMaxNics> nic_ops{};  // posted, not completed, per NIC
  Clock::time_point deadline;
  Request* next_pending = nullptr;  // partly-posted FIFO
  Request* prev_active = nullptr;   // in-flight list (deadline scan)
  Request* next_active = nullptr;
};

}  // namespace wsync::transport::fabric
