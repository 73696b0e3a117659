// A named POSIX shared-memory region (shm_open + mmap), owned RAII-style.
//
// The inference agent keeps the engine's weights in one (the engine process
// maps the same name), and the trainer-side client exports a rank's local
// shards through one to the trainer agent sidecar.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace wsync {

class ShmRegion {
 public:
  ShmRegion() = default;
  ~ShmRegion();
  ShmRegion(ShmRegion&& other) noexcept;
  ShmRegion& operator=(ShmRegion&& other) noexcept;
  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;

  // Creates (or truncates) `name` (e.g. "/wsync-infer-0") with `size` bytes,
  // zero-filled. The creator unlinks the name when destroyed unless
  // Release()d.
  static StatusOr<ShmRegion> Create(const std::string& name, size_t size);
  // Maps an existing region read-write; its size is taken from the object.
  static StatusOr<ShmRegion> Open(const std::string& name);

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }
  // Keep the name alive after this object goes away.
  void KeepName() { owner_ = false; }

 private:
  void Reset();

  std::string name_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool owner_ = false;
};

}  // namespace wsync
