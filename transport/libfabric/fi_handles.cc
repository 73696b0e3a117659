#include "transport/libfabric/fi_handles.h"

#include <rdma/fi_errno.h>

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

void FidCloser::operator()(fid* f) const noexcept {
  if (f != nullptr) fi_close(f);
}

}  // namespace wsync::transport::fabric
