// Ownership and errors for raw libfabric objects, used by every file of the
// libfabric backend. Each fi_* object is held by a unique_ptr whose deleter
// closes it; each fi_* call's failure becomes one Status naming the call and
// fi_strerror's text (FiError), made in one place.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

#include <memory>
#include <string>

#include "common/status.h"

namespace wsync::transport::fabric {

// Status for a failed fi_* call: "<call>: <fi_strerror> (<ret>)[: <what>]".
Status FiError(const char* call, long ret, const std::string& what = "");

// Closes any fid; destructors never throw and never report (close errors at
// teardown have no one to act on them).
struct FidCloser {
  void operator()(fid* f) const noexcept;
  template <typename T>
  void operator()(T* object) const noexcept {
    if (object != nullptr) (*this)(&object->fid);
  }
};
struct InfoFreer {
  void operator()(fi_info* info) const noexcept { fi_freeinfo(info); }
};

using InfoPtr = std::unique_ptr<fi_info, InfoFreer>;
using FabricPtr = std::unique_ptr<fid_fabric, FidCloser>;
using DomainPtr = std::unique_ptr<fid_domain, FidCloser>;
using AvPtr = std::unique_ptr<fid_av, FidCloser>;
using CqPtr = std::unique_ptr<fid_cq, FidCloser>;
using EpPtr = std::unique_ptr<fid_ep, FidCloser>;
using MrPtr = std::unique_ptr<fid_mr, FidCloser>;

}  // namespace wsync::transport::fabric
