// One NIC's fabric, domain and address vector: the objects everything else
// on that NIC is opened from. Owned by Nic (fabric_nic.h).
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "transport/libfabric/fi_handles.h"

namespace wsync::transport::fabric {

class FabricDomain {
 public:
  static StatusOr<FabricDomain> Open(const fi_info& info);

  fid_domain* domain() const { return domain_.get(); }
  fid_av* av() const { return av_.get(); }
  const fi_info& info() const { return *info_; }

  // Resolves one raw endpoint name into an fi_addr_t of this NIC's AV.
  StatusOr<fi_addr_t> InsertAddress(const std::string& name);

 private:
  // Creation order; destroyed in reverse.
  InfoPtr info_;
  FabricPtr fabric_;
  DomainPtr domain_;
  AvPtr av_;
};

}  // namespace wsync::transport::fabric
