// TempArena: the trainer pipeline's temporary memory, one block registered
// with the transport engine once, sized to the memory watermark (or less).
//
// Every temporary buffer of the executor (gathered tensors, quantized bytes
// and scales, write staging) is carved out of it, so "in-flight temporary
// memory never exceeds the watermark" holds by construction and the data
// path never registers memory. Allocation waits until enough contiguous
// space is free: writes in flight give their staging back from the engine's
// callback thread. Owned by the executor (pipeline/executor.h).
//
// Threads: Allocate from one thread at a time (the executor's); Free from
// any thread. A mutex guards the free list: a few lock operations per write
// posted, against microseconds of wire time per write.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>

#include "common/status.h"
#include "pipeline/device.h"
#include "transport/engine.h"

namespace wsync {

inline constexpr uint64_t kTempAlignment = 256;
constexpr uint64_t AlignTemp(uint64_t n) { return (n + kTempAlignment - 1) / kTempAlignment * kTempAlignment; }

class TempArena {
 public:
  // Maps `capacity` bytes (rounded up to pages) and registers them with
  // `engine`, which must outlive the arena. With `device`, the bytes are
  // that device's memory (DeviceOps::Allocate), registered as such; with
  // `host_mirror` too, a mirror of the same size in pinned host memory
  // (DeviceOps::AllocateHost) is registered instead (host staging).
  static StatusOr<std::unique_ptr<TempArena>> Create(uint64_t capacity, transport::Engine* engine,
                                                     DeviceOps* device = nullptr, bool host_mirror = false);
  ~TempArena();
  TempArena(const TempArena&) = delete;
  TempArena& operator=(const TempArena&) = delete;

  // Offset of `bytes` (kTempAlignment-rounded) contiguous bytes. Waits while
  // they do not fit; `abort()` is checked at every wake-up and ends the wait
  // with Aborted; DeadlineExceeded at `deadline`. `waited` is set to whether
  // it had to wait at all.
  StatusOr<uint64_t> Allocate(uint64_t bytes, std::chrono::steady_clock::time_point deadline,
                              const std::function<bool()>& abort, bool* waited);
  // Gives back [offset, offset + bytes) of an allocation (any sub-range,
  // kTempAlignment-aligned, in any order).
  void Free(uint64_t offset, uint64_t bytes);
  // Wakes a waiting Allocate so it re-checks abort().
  void Poke();

  uint8_t* data() const { return data_; }
  // The host mirror (nullptr without one): byte i of it stages byte i of data().
  uint8_t* mirror() const { return mirror_; }
  // What the engine writes from: data(), or the mirror where there is one.
  const transport::MemoryRegion* region() const { return region_.get(); }
  uint64_t capacity() const { return capacity_; }
  uint64_t used() const;
  // Highest used() since the last ResetPeak.
  uint64_t peak() const;
  void ResetPeak();

 private:
  TempArena() = default;
  bool TryTake(uint64_t bytes, uint64_t* offset);  // under mu_

  uint8_t* data_ = nullptr;
  DeviceOps* device_ = nullptr;  // owns data_ (and mirror_) when set
  uint8_t* mirror_ = nullptr;
  uint64_t mapped_ = 0;
  uint64_t capacity_ = 0;
  std::unique_ptr<transport::MemoryRegion> region_;

  mutable std::mutex mu_;
  std::condition_variable freed_;
  std::map<uint64_t, uint64_t> free_;  // offset -> size, coalesced; guarded by mu_
  uint64_t used_ = 0;                  // guarded by mu_
  uint64_t peak_ = 0;                  // guarded by mu_
};

}  // namespace wsync
