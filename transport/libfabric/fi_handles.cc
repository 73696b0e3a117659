#include "transport/libfabric/fi_handles.h"

#include <rdma/fi_errno.h>

#include <cstdio>

namespace wsync::transport::fabric {

Status FiError(const char* call, long ret, const std::string& what) {
  std::string message = std::string(call) + ": " + fi_strerror(static_cast<int>(-ret)) +
                        " (" + std::to_string(ret) + ")";
  if (!what.empty()) message += ": " + what;
  StatusCode code = StatusCode::kInternal;
  if (ret == -FI_ENODATA || ret == -FI_ENOSYS) code = StatusCode::kUnavailable;
  if (ret == -FI_EINVAL) code = StatusCode::kInvalidArgument;
  return Status(code, message);
}

namespace {

const char* ClassName(size_t fclass) {
  switch (fclass) {
    case FI_CLASS_FABRIC: return "fabric";
    case FI_CLASS_DOMAIN: return "domain";
    case FI_CLASS_EP: return "endpoint";
    case FI_CLASS_AV: return "address vector";
    case FI_CLASS_CQ: return "completion queue";
    case FI_CLASS_MR: return "memory registration";
    default: return "libfabric object";
  }
}

}  // namespace

void FidCloser::operator()(fid* f) const noexcept {
  if (f == nullptr) return;
  const size_t fclass = f->fclass;
  const int ret = fi_close(f);
  // Nothing more can be done at teardown, but what the provider could not
  // free (a registration still in use, an endpoint with operations
  // outstanding) is said, not dropped.
  if (ret != 0) {
    std::fprintf(stderr, "wsync transport: fi_close of a %s failed: %s (%d); the provider may keep it\n",
                 ClassName(fclass), fi_strerror(-ret), ret);
  }
}

}  // namespace wsync::transport::fabric
