#include "transport/libfabric/fabric_cq.h"

#include <rdma/fi_errno.h>

namespace wsync::transport::fabric {

StatusOr<FabricCq> FabricCq::Open(fid_domain* domain, size_t size) {
  fi_cq_attr attr{};
  attr.format = FI_CQ_FORMAT_DATA;
  attr.wait_obj = FI_WAIT_NONE;  // the worker polls; no fds on the data path
  attr.size = size;
  fid_cq* cq = nullptr;
  int ret = fi_cq_open(domain, &attr, &cq, nullptr);
  if (ret != 0) return FiError("fi_cq_open", ret);
  FabricCq out;
  out.cq_.reset(cq);
  return out;
}

Status FabricCq::ReadError(fi_cq_err_entry* entry, std::string* message) {
  *entry = fi_cq_err_entry{};
  ssize_t ret = fi_cq_readerr(cq_.get(), entry, 0);
  if (ret < 0) return FiError("fi_cq_readerr", ret);
  const char* text = fi_cq_strerror(cq_.get(), entry->prov_errno, entry->err_data, nullptr, 0);
  *message = std::string(fi_strerror(entry->err)) + " (provider: " + (text ? text : "?") + ")";
  return Status::Ok();
}

}  // namespace wsync::transport::fabric
