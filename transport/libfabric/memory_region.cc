#include "transport/libfabric/memory_region.h"

#include "transport/libfabric/domain_group.h"

namespace wsync::transport::fabric {

Status LibfabricMemoryRegion::RegisterOnWorker() {
  for (uint32_t i = 0; i < group_->num_nics(); ++i) {
    Nic& nic = group_->nic(i);
    StatusOr<FabricMr> mr =
        FabricMr::Register(nic.domain, data_, length_, kind_, device_, group_->NextRequestedKey());
    if (!mr.ok()) {
      mrs_.clear();  // unwind what was registered on earlier NICs
      return mr.status().WithContext("register on NIC " + std::to_string(i));
    }
    descs_[i] = mr->desc();
    descriptor_.nics.push_back({nic.endpoint.name(), mr->key()});
    mrs_.push_back(std::move(mr).value());
  }
  descriptor_.address = group_->virtual_addressing() ? reinterpret_cast<uint64_t>(data_) : 0;
  descriptor_.length = length_;
  return Status::Ok();
}

LibfabricMemoryRegion::~LibfabricMemoryRegion() {
  if (mrs_.empty()) return;
  // fi_close must run on the worker (FI_THREAD_DOMAIN). Errors at teardown
  // have no one to act on them.
  Status closed = group_->RunOnWorker([this] {
    mrs_.clear();
    return Status::Ok();
  });
  if (!closed.ok()) {
    for (FabricMr& mr : mrs_) mr.Abandon();
  }
}

}  // namespace wsync::transport::fabric
