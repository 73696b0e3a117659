// Lock-free hand-off between threads: an intrusive multi-producer,
// single-consumer queue (Vyukov's) and a futex Parker that lets an idle
// consumer sleep without a lock. Used for callers -> worker (requests) and
// worker -> callback thread (notices). Pushing never blocks and never
// allocates; the queue is unbounded so a callback that submits can never
// deadlock against a full queue.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <ctime>

namespace wsync::transport::fabric {

struct QueueNode {
  std::atomic<QueueNode*> next{nullptr};
};

class MpscQueue {
 public:
  MpscQueue() : head_(&stub_), tail_(&stub_) {}
  MpscQueue(const MpscQueue&) = delete;
  MpscQueue& operator=(const MpscQueue&) = delete;

  // Any thread.
  void Push(QueueNode* node) {
    node->next.store(nullptr, std::memory_order_relaxed);
    QueueNode* prev = head_.exchange(node, std::memory_order_acq_rel);
    prev->next.store(node, std::memory_order_release);
  }

  // Consumer only. nullptr when empty (or when a producer is mid-push; the
  // node then shows up on a later call).
  QueueNode* Pop() {
    QueueNode* tail = tail_;
    QueueNode* next = tail->next.load(std::memory_order_acquire);
    if (tail == &stub_) {
      if (next == nullptr) return nullptr;
      tail_ = next;
      tail = next;
      next = next->next.load(std::memory_order_acquire);
    }
    if (next != nullptr) {
      tail_ = next;
      return tail;
    }
    if (tail != head_.load(std::memory_order_acquire)) return nullptr;
    Push(&stub_);
    next = tail->next.load(std::memory_order_acquire);
    if (next != nullptr) {
      tail_ = next;
      return tail;
    }
    return nullptr;
  }

  // Consumer only; may say "empty" while a push is half done (see Parker).
  bool Empty() const {
    return tail_ == &stub_ && stub_.next.load(std::memory_order_acquire) == nullptr;
  }

 private:
  std::atomic<QueueNode*> head_;
  QueueNode* tail_;
  QueueNode stub_;
};

// Sleep/wake for one consumer. Protocol (Dekker with seq_cst fences):
//   consumer: PrepareToPark(); if (!queue.Empty()) CancelPark(); else Park(t);
//   producer: queue.Push(n); Unpark();
class Parker {
 public:
  void PrepareToPark() {
    state_.store(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  void CancelPark() { state_.store(0, std::memory_order_relaxed); }
  void Park(std::chrono::microseconds timeout) {
    timespec ts{static_cast<time_t>(timeout.count() / 1000000),
                static_cast<long>((timeout.count() % 1000000) * 1000)};
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&state_), FUTEX_WAIT_PRIVATE, 1, &ts, nullptr, 0);
    state_.store(0, std::memory_order_relaxed);
  }
  void Unpark() {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (state_.load(std::memory_order_relaxed) == 1 && state_.exchange(0) == 1)
      syscall(SYS_futex, reinterpret_cast<uint32_t*>(&state_), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
  }

 private:
  std::atomic<uint32_t> state_{0};
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
};

}  // namespace wsync::transport::fabric
