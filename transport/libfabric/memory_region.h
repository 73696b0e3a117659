// The libfabric MemoryRegion: one registration per NIC of a DomainGroup and
// the descriptor peers use to write into it. Built by LibfabricEngine::
// Register on the worker; deregistered on the worker when destroyed.
#pragma once

#include <array>
#include <vector>

#include "transport/engine.h"
#include "transport/libfabric/fabric_mr.h"

namespace wsync::transport::fabric {

class DomainGroup;

class LibfabricMemoryRegion final : public MemoryRegion {
 public:
  LibfabricMemoryRegion(DomainGroup* group, void* data, uint64_t length, MemoryKind kind)
      : group_(group), data_(data), length_(length), kind_(kind) {}
  ~LibfabricMemoryRegion() override;

  void* data() const override { return data_; }
  uint64_t length() const override { return length_; }
  MemoryKind kind() const override { return kind_; }
  const MemoryDescriptor& descriptor() const override { return descriptor_; }

  const DomainGroup* group() const { return group_; }
  void* desc(uint32_t nic) const { return descs_[nic]; }

  // Worker only: registers on every NIC and fills the descriptor.
  Status RegisterOnWorker();

 private:
  DomainGroup* const group_;
  void* const data_;
  const uint64_t length_;
  const MemoryKind kind_;
  int device_ = 0;
  MemoryDescriptor descriptor_;
  std::vector<FabricMr> mrs_;
  std::array<void*, kMaxNics> descs_{};

  friend class LibfabricEngine;
};

}  // namespace wsync::transport::fabric
