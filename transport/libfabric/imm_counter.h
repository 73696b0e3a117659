// IMMCOUNTER: counts arrivals of write-with-immediate values and fires a
// waiter exactly once when the expected count is reached, whatever order
// the arrivals came in (and whether they came before or after the Expect).
// Owned and driven by the DomainGroup worker only (single-threaded).
#pragma once

#include <chrono>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace wsync::transport::fabric {

class ImmCounter {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  ImmCounter() { entries_.reserve(1024); }

  // Returns false (and registers nothing) if `imm` already has a waiter.
  // If the arrivals already seen satisfy it, `*fired` is set to waiter.
  bool Expect(uint32_t imm, uint32_t count, void* waiter, TimePoint deadline, void** fired);

  // Counts one arrival; returns the waiter it completes, or nullptr.
  void* OnArrival(uint32_t imm);

  // Removes waiters whose deadline is <= now, appending them (and the
  // arrivals seen so far) to `expired`.
  struct Expired {
    void* waiter;
    uint32_t imm;
    uint64_t seen;
    uint32_t expected;
  };
  void ExpireBefore(TimePoint now, std::vector<Expired>* expired);

  // Removes every waiter (shutdown).
  void TakeAllWaiters(std::vector<Expired>* out) { ExpireBefore(TimePoint::max(), out); }

  size_t waiters() const { return waiting_.size(); }
  uint64_t arrivals(uint32_t imm) const {
    auto it = entries_.find(imm);
    return it == entries_.end() ? 0 : it->second.arrived;
  }

 private:
  struct Entry {
    uint64_t arrived = 0;
    uint32_t expected = 0;
    void* waiter = nullptr;
    TimePoint deadline;
  };
  void* Fire(Entry& e);

  std::unordered_map<uint32_t, Entry> entries_;
  std::vector<uint32_t> waiting_;  // imms with a waiter; scanned for deadlines
};

}  // namespace wsync::transport::fabric
