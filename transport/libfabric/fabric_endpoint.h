// A NIC's RDM endpoint, bound to the NIC's AV and CQ, and the posting calls
// the worker makes on it. Posting returns the raw fi return so the worker
// can treat -FI_EAGAIN as back-pressure; other failures become a Status via
// PostError (naming the call).
#pragma once

#include <rdma/fi_endpoint.h>
#include <rdma/fi_rma.h>

#include <string>

#include "common/status.h"
#include "transport/libfabric/fabric_cq.h"
#include "transport/libfabric/fabric_domain.h"

namespace wsync::transport::fabric {

class FabricEndpoint {
 public:
  static StatusOr<FabricEndpoint> Open(const FabricDomain& domain, const FabricCq& cq);

  // The raw endpoint name peers insert into their AV.
  const std::string& name() const { return name_; }

  ssize_t PostWrite(const void* buf, size_t len, void* desc, fi_addr_t dest, uint64_t remote_addr,
                    uint64_t key, bool has_imm, uint32_t imm, void* context) {
    if (has_imm)
      return fi_writedata(ep_.get(), buf, len, desc, imm, dest, remote_addr, key, context);
    return fi_write(ep_.get(), buf, len, desc, dest, remote_addr, key, context);
  }
  // Several (local, remote) pieces in one operation (paged writes): one
  // provider call, one completion, one arrival of the immediate.
  ssize_t PostWriteV(const iovec* iov, void** desc, const fi_rma_iov* rma_iov, size_t count, fi_addr_t dest,
                     bool has_imm, uint32_t imm, void* context) {
    fi_msg_rma msg{};
    msg.msg_iov = iov;
    msg.desc = desc;
    msg.iov_count = count;
    msg.addr = dest;
    msg.rma_iov = rma_iov;
    msg.rma_iov_count = count;
    msg.context = context;
    msg.data = imm;
    return fi_writemsg(ep_.get(), &msg, has_imm ? FI_REMOTE_CQ_DATA : 0);
  }
  ssize_t PostSend(const void* buf, size_t len, void* desc, fi_addr_t dest, void* context) {
    return fi_send(ep_.get(), buf, len, desc, dest, context);
  }
  ssize_t PostRecv(void* buf, size_t len, void* desc, void* context) {
    return fi_recv(ep_.get(), buf, len, desc, FI_ADDR_UNSPEC, context);
  }

 private:
  EpPtr ep_;
  std::string name_;
};

}  // namespace wsync::transport::fabric
