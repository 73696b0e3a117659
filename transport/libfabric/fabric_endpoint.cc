#include "transport/libfabric/fabric_endpoint.h"

#include <rdma/fi_cm.h>
#include <rdma/fi_errno.h>
#include <unistd.h>

#include <cstring>
#include <random>

namespace wsync::transport::fabric {

StatusOr<FabricEndpoint> FabricEndpoint::Open(const FabricDomain& domain, const FabricCq& cq) {
  FabricEndpoint out;
  fid_ep* ep = nullptr;
  int ret = fi_endpoint(domain.domain(), const_cast<fi_info*>(&domain.info()), &ep, nullptr);
  if (ret != 0) return FiError("fi_endpoint", ret);
  out.ep_.reset(ep);
  ret = fi_ep_bind(ep, &domain.av()->fid, 0);
  if (ret != 0) return FiError("fi_ep_bind", ret, "address vector");
  ret = fi_ep_bind(ep, &cq.cq()->fid, FI_TRANSMIT | FI_RECV);
  if (ret != 0) return FiError("fi_ep_bind", ret, "completion queue");
  // shm names its shared region "<pid>:<domain>:<ep>" by default; a process
  // killed with SIGKILL leaves that file in /dev/shm, and a later process
  // that gets the same pid then fails fi_enable with EBUSY. A random name
  // cannot collide with such leftovers.
  if (std::strcmp(domain.info().fabric_attr->prov_name, "shm") == 0) {
    std::random_device rd;
    const std::string unique = "wsync-" + std::to_string(getpid()) + "-" + std::to_string(rd()) +
                               std::to_string(rd());
    ret = fi_setname(&ep->fid, const_cast<char*>(unique.c_str()), unique.size() + 1);
    if (ret != 0) return FiError("fi_setname", ret, unique);
  }
  ret = fi_enable(ep);
  if (ret != 0) return FiError("fi_enable", ret);
  char name[256];
  size_t len = sizeof(name);
  ret = fi_getname(&ep->fid, name, &len);
  if (ret != 0) return FiError("fi_getname", ret);
  out.name_.assign(name, len);
  return out;
}

}  // namespace wsync::transport::fabric
