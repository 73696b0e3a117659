#include "transport/libfabric/imm_counter.h"

#include <algorithm>

namespace wsync::transport::fabric {

void* ImmCounter::Fire(Entry& e) {
  void* waiter = e.waiter;
  // Arrivals beyond the expected count belong to the next round of this imm.
  e.arrived -= e.expected;
  e.expected = 0;
  e.waiter = nullptr;
  return waiter;
}

bool ImmCounter::Expect(uint32_t imm, uint32_t count, void* waiter, TimePoint deadline, void** fired) {
  *fired = nullptr;
  Entry& e = entries_[imm];
  if (e.waiter != nullptr) return false;
  e.expected = count;
  e.waiter = waiter;
  e.deadline = deadline;
  if (e.arrived >= e.expected) {
    *fired = Fire(e);
    return true;
  }
  waiting_.push_back(imm);
  return true;
}

void* ImmCounter::OnArrival(uint32_t imm) {
  Entry& e = entries_[imm];
  ++e.arrived;
  if (e.waiter == nullptr || e.arrived < e.expected) return nullptr;
  waiting_.erase(std::find(waiting_.begin(), waiting_.end(), imm));
  return Fire(e);
}

void ImmCounter::ExpireBefore(TimePoint now, std::vector<Expired>* expired) {
  for (size_t i = 0; i < waiting_.size();) {
    Entry& e = entries_[waiting_[i]];
    if (e.deadline > now) {
      ++i;
      continue;
    }
    expired->push_back({e.waiter, waiting_[i], e.arrived, e.expected});
    e.waiter = nullptr;
    e.expected = 0;
    waiting_[i] = waiting_.back();
    waiting_.pop_back();
  }
}

}  // namespace wsync::transport::fabric
