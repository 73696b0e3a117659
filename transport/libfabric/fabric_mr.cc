#include "transport/libfabric/fabric_mr.h"

#include <rdma/fi_domain.h>
#include <rdma/fi_errno.h>
#include <sys/uio.h>

namespace wsync::transport::fabric {

StatusOr<FabricMr> FabricMr::Register(const FabricDomain& domain, void* data, uint64_t length,
                                      MemoryKind kind, int device, uint64_t requested_key) {
  iovec iov{data, length};
  fi_mr_attr attr{};
  attr.mr_iov = &iov;
  attr.iov_count = 1;
  // Local write/read for our own ops, remote write for peers' writes.
  attr.access = FI_READ | FI_WRITE | FI_SEND | FI_RECV | FI_REMOTE_WRITE | FI_REMOTE_READ;
  attr.requested_key = requested_key;
  if (kind == MemoryKind::kCuda) {
    if (!(domain.info().caps & FI_HMEM))
      return FailedPrecondition("registering CUDA memory needs an engine created with enable_hmem");
    attr.iface = FI_HMEM_CUDA;
    attr.device.cuda = device;
  } else {
    attr.iface = FI_HMEM_SYSTEM;
  }
  fid_mr* mr = nullptr;
  // Device-only memory: lets shm move it GPU to GPU (CUDA IPC) instead of
  // staging through host bounce buffers.
  const uint64_t flags = kind == MemoryKind::kCuda ? FI_HMEM_DEVICE_ONLY : 0;
  int ret = fi_mr_regattr(domain.domain(), &attr, flags, &mr);
  if (ret == -FI_ENOSYS && kind == MemoryKind::kCuda)
    return FiError("fi_mr_regattr", ret,
                   "CUDA memory: this libfabric was built without CUDA support (its FI_HMEM_CUDA interface is "
                   "uninitialized); use a libfabric configured --with-cuda, e.g. the AWS EFA installer's");
  if (ret != 0)
    return FiError("fi_mr_regattr", ret,
                   std::to_string(length) + " bytes of " + (kind == MemoryKind::kCuda ? "CUDA" : "host") + " memory");
  FabricMr out;
  out.mr_.reset(mr);
  out.desc_ = fi_mr_desc(mr);
  out.key_ = fi_mr_key(mr);
  if (out.key_ == FI_KEY_NOTAVAIL) return FiError("fi_mr_key", -FI_ENOKEY);
  return out;
}

}  // namespace wsync::transport::fabric
