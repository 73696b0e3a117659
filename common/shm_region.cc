#include "common/shm_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace wsync {
namespace {

Status Errno(const std::string& call, const std::string& name) {
  return Internal(call + "('" + name + "') failed: " + std::strerror(errno));
}

}  // namespace

ShmRegion::~ShmRegion() { Reset(); }

ShmRegion::ShmRegion(ShmRegion&& other) noexcept
    : name_(std::move(other.name_)), data_(other.data_), size_(other.size_), owner_(other.owner_) {
  other.data_ = nullptr;
  other.size_ = 0;
  other.owner_ = false;
}

ShmRegion& ShmRegion::operator=(ShmRegion&& other) noexcept {
  if (this != &other) {
    Reset();
    name_ = std::move(other.name_);
    data_ = other.data_;
    size_ = other.size_;
    owner_ = other.owner_;
    other.data_ = nullptr;
    other.size_ = 0;
    other.owner_ = false;
  }
  return *this;
}

void ShmRegion::Reset() {
  if (data_ != nullptr) munmap(data_, size_);
  if (owner_) shm_unlink(name_.c_str());
  data_ = nullptr;
  size_ = 0;
  owner_ = false;
}

StatusOr<ShmRegion> ShmRegion::Create(const std::string& name, size_t size) {
  if (size == 0) return InvalidArgument("shared memory region '" + name + "' must not be empty");
  const int fd = shm_open(name.c_str(), O_CREAT | O_RDWR | O_TRUNC, 0600);
  if (fd < 0) return Errno("shm_open", name);
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    Status s = Errno("ftruncate", name);
    close(fd);
    shm_unlink(name.c_str());
    return s;
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    Status s = Errno("mmap", name);
    shm_unlink(name.c_str());
    return s;
  }
  ShmRegion r;
  r.name_ = name;
  r.data_ = static_cast<uint8_t*>(p);
  r.size_ = size;
  r.owner_ = true;
  return r;
}

StatusOr<ShmRegion> ShmRegion::Open(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) return Errno("shm_open", name);
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    Status s = Errno("fstat", name);
    close(fd);
    return s;
  }
  if (st.st_size <= 0) {
    close(fd);
    return FailedPrecondition("shared memory region '" + name + "' is empty");
  }
  void* p = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return Errno("mmap", name);
  ShmRegion r;
  r.name_ = name;
  r.data_ = static_cast<uint8_t*>(p);
  r.size_ = static_cast<size_t>(st.st_size);
  r.owner_ = false;
  return r;
}

}  // namespace wsync
