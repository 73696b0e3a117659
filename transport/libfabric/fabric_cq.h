// A NIC's completion queue: local completions of our writes/sends and the
// arrivals of remote writes-with-immediate and messages. Polled only by the
// DomainGroup worker.
#pragma once

#include <rdma/fi_eq.h>

#include "common/status.h"
#include "transport/libfabric/fi_handles.h"

namespace wsync::transport::fabric {

class FabricCq {
 public:
  static StatusOr<FabricCq> Open(fid_domain* domain, size_t size);

  fid_cq* cq() const { return cq_.get(); }

  // Reads up to `max` entries: returns the count (0 if none), or -FI_EAVAIL
  // when an error entry is next (then call ReadError), or another negative
  // fi errno.
  long Read(fi_cq_data_entry* entries, size_t max) {
    ssize_t n = fi_cq_read(cq_.get(), entries, max);
    return n == -FI_EAGAIN ? 0 : n;
  }
  // Takes the next error entry; `message` gets the provider's text.
  Status ReadError(fi_cq_err_entry* entry, std::string* message);

 private:
  CqPtr cq_;
};

}  // namespace wsync::transport::fabric
