#include "pipeline/temp_arena.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace wsync {

StatusOr<std::unique_ptr<TempArena>> TempArena::Create(uint64_t capacity, transport::Engine* engine,
                                                       DeviceOps* device, bool host_mirror) {
  if (capacity == 0) return InvalidArgument("temporary memory: capacity must be positive");
  if (host_mirror && device == nullptr) return InvalidArgument("temporary memory: a host mirror needs a device");
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  std::unique_ptr<TempArena> arena(new TempArena);
  arena->capacity_ = AlignTemp(capacity);
  arena->mapped_ = (arena->capacity_ + page - 1) / page * page;
  if (device != nullptr) {
    StatusOr<void*> p = device->Allocate(arena->mapped_);
    if (!p.ok()) {
      return p.status().WithContext("temporary memory: " + std::to_string(arena->mapped_) + " bytes on " +
                                    device->name());
    }
    arena->data_ = static_cast<uint8_t*>(*p);
    arena->device_ = device;
    if (host_mirror) {
      StatusOr<void*> m = device->AllocateHost(arena->mapped_);
      if (!m.ok()) {
        return m.status().WithContext("temporary memory: a host mirror of " + std::to_string(arena->mapped_) +
                                      " pinned bytes for " + device->name());
      }
      arena->mirror_ = static_cast<uint8_t*>(*m);
      WSYNC_ASSIGN_OR_RETURN(arena->region_, engine->Register(arena->mirror_, arena->mapped_));
    } else {
      WSYNC_ASSIGN_OR_RETURN(arena->region_,
                             engine->Register(arena->data_, arena->mapped_, device->kind(), device->ordinal()));
    }
  } else {
    void* p = mmap(nullptr, arena->mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      return Internal("mmap of " + std::to_string(arena->mapped_) + " bytes of temporary memory failed: " +
                      std::strerror(errno));
    }
    arena->data_ = static_cast<uint8_t*>(p);
    WSYNC_ASSIGN_OR_RETURN(arena->region_, engine->Register(arena->data_, arena->mapped_));
  }
  arena->free_.emplace(0, arena->capacity_);
  return arena;
}

TempArena::~TempArena() {
  region_.reset();  // deregister before freeing
  if (data_ == nullptr) return;
  if (device_ != nullptr) {
    device_->Free(data_);
    if (mirror_ != nullptr) device_->FreeHost(mirror_);
  } else {
    munmap(data_, mapped_);
  }
}

bool TempArena::TryTake(uint64_t bytes, uint64_t* offset) {
  for (auto it = free_.begin(); it != free_.end(); ++it) {  // first fit
    if (it->second < bytes) continue;
    *offset = it->first;
    const uint64_t rest = it->second - bytes;
    const uint64_t rest_at = it->first + bytes;
    free_.erase(it);
    if (rest > 0) free_.emplace(rest_at, rest);
    used_ += bytes;
    if (used_ > peak_) peak_ = used_;
    return true;
  }
  return false;
}

StatusOr<uint64_t> TempArena::Allocate(uint64_t bytes, std::chrono::steady_clock::time_point deadline,
                                       const std::function<bool()>& abort, bool* waited) {
  bytes = AlignTemp(bytes == 0 ? 1 : bytes);
  *waited = false;
  if (bytes > capacity_) {
    return InvalidArgument("temporary memory: " + std::to_string(bytes) + " bytes requested, capacity is " +
                           std::to_string(capacity_));
  }
  std::unique_lock<std::mutex> lock(mu_);
  uint64_t offset = 0;
  while (!TryTake(bytes, &offset)) {
    *waited = true;
    if (abort()) return Aborted("temporary memory: wait abandoned");
    if (std::chrono::steady_clock::now() >= deadline) {
      return DeadlineExceeded("temporary memory: " + std::to_string(bytes) +
                              " bytes did not become free in time (" + std::to_string(used_) + " of " +
                              std::to_string(capacity_) + " in use)");
    }
    freed_.wait_until(lock, deadline);
  }
  return offset;
}

void TempArena::Free(uint64_t offset, uint64_t bytes) {
  bytes = AlignTemp(bytes == 0 ? 1 : bytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    used_ -= bytes;
    auto next = free_.lower_bound(offset);
    uint64_t start = offset, size = bytes;
    if (next != free_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == start) {
        start = prev->first;
        size += prev->second;
        free_.erase(prev);
      }
    }
    if (next != free_.end() && next->first == offset + bytes) {
      size += next->second;
      free_.erase(next);
    }
    free_.emplace(start, size);
  }
  freed_.notify_all();
}

void TempArena::Poke() {
  { std::lock_guard<std::mutex> lock(mu_); }
  freed_.notify_all();
}

uint64_t TempArena::used() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_;
}

uint64_t TempArena::peak() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_;
}

void TempArena::ResetPeak() {
  std::lock_guard<std::mutex> lock(mu_);
  peak_ = used_;
}

}  // namespace wsync
