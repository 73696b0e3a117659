// Registration of one buffer on one NIC's domain (host or CUDA memory via
// FI_HMEM). LibfabricMemoryRegion (memory_region.h) holds one of
// these per NIC.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "transport/engine.h"
#include "transport/libfabric/fabric_domain.h"

namespace wsync::transport::fabric {

class FabricMr {
 public:
  // `requested_key` is used only by providers without FI_MR_PROV_KEY and
  // must be unique within the domain.
  static StatusOr<FabricMr> Register(const FabricDomain& domain, void* data, uint64_t length,
                                     MemoryKind kind, int device, uint64_t requested_key);

  void* desc() const { return desc_; }
  uint64_t key() const { return key_; }
  // Forgets the registration without closing it: for when its domain is
  // already gone (a region that outlived its engine).
  void Abandon() { (void)mr_.release(); }

 private:
  MrPtr mr_;
  void* desc_ = nullptr;
  uint64_t key_ = 0;
};

}  // namespace wsync::transport::fabric
