#include "transport/libfabric/fabric_domain.h"

#include <rdma/fi_domain.h>

namespace wsync::transport::fabric {

StatusOr<FabricDomain> FabricDomain::Open(const fi_info& info) {
  FabricDomain d;
  d.info_.reset(fi_dupinfo(&info));
  if (!d.info_) return Internal("fi_dupinfo: out of memory");
  fid_fabric* fabric = nullptr;
  int ret = fi_fabric(d.info_->fabric_attr, &fabric, nullptr);
  if (ret != 0) return FiError("fi_fabric", ret, d.info_->fabric_attr->prov_name);
  d.fabric_.reset(fabric);
  fid_domain* domain = nullptr;
  ret = fi_domain(fabric, d.info_.get(), &domain, nullptr);
  if (ret != 0) return FiError("fi_domain", ret, d.info_->domain_attr->name);
  d.domain_.reset(domain);
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  fid_av* av = nullptr;
  ret = fi_av_open(domain, &av_attr, &av, nullptr);
  if (ret != 0) return FiError("fi_av_open", ret);
  d.av_.reset(av);
  return d;
}

StatusOr<fi_addr_t> FabricDomain::InsertAddress(const std::string& name) {
  fi_addr_t addr = FI_ADDR_UNSPEC;
  int ret = fi_av_insert(av_.get(), name.data(), 1, &addr, 0, nullptr);
  if (ret != 1) return FiError("fi_av_insert", ret < 0 ? ret : -FI_EINVAL, "peer address not accepted by this provider");
  return addr;
}

}  // namespace wsync::transport::fabric
