#include "transport/libfabric/fabric_info.h"

#include <rdma/fi_errno.h>

#include <strings.h>

#include <cstdlib>
#include <cstring>

namespace wsync::transport::fabric {
namespace {

struct Requirement {
  uint64_t bit;
  const char* name;
};

// What we need from a provider, probed one at a time so the error can name
// the missing one (asking for all at once only says "no data"). Remote CQ
// data is not a capability bit providers match on (shm 1.17 refuses it in
// caps); its support shows as domain_attr->cq_data_size, checked below.
constexpr Requirement kRequired[] = {
    {FI_RMA, "FI_RMA"},
    {FI_MSG, "FI_MSG"},
};

InfoPtr MakeHints(const LibfabricOptions& options, uint64_t caps) {
  InfoPtr hints(fi_allocinfo());
  if (!hints) return hints;
  hints->caps = caps;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  hints->domain_attr->control_progress = FI_PROGRESS_AUTO;
  hints->domain_attr->data_progress = FI_PROGRESS_MANUAL;
  hints->domain_attr->resource_mgmt = FI_RM_ENABLED;
  // Every mode we can cope with: local descriptors always passed, virtual
  // or offset addressing, provider or app keys, HMEM registration.
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED |
                                FI_MR_PROV_KEY | FI_MR_ENDPOINT;
  if (options.enable_hmem) hints->domain_attr->mr_mode |= FI_MR_HMEM;
  hints->mode = 0;  // contexts are plain pointers to our requests
  hints->fabric_attr->prov_name = strdup(options.provider.c_str());
  hints->tx_attr->msg_order = FI_ORDER_NONE;  // we rely on no ordering
  hints->rx_attr->msg_order = FI_ORDER_NONE;
  return hints;
}

int GetInfo(const LibfabricOptions& options, fi_info* hints, fi_info** out) {
  const char* node = options.node.empty() ? nullptr : options.node.c_str();
  return fi_getinfo(FI_VERSION(1, 17), node, nullptr, node ? FI_SOURCE : 0, hints, out);
}

}  // namespace

StatusOr<InfoPtr> ProbeProvider(const LibfabricOptions& options) {
  const std::string where = "libfabric provider '" + options.provider + "'";
  uint64_t caps = FI_WRITE | FI_REMOTE_WRITE | FI_SEND | FI_RECV;
  // Probe capabilities one by one so a missing one is named.
  for (const Requirement& req : kRequired) {
    caps |= req.bit;
    InfoPtr hints = MakeHints(options, caps);
    fi_info* info = nullptr;
    int ret = GetInfo(options, hints.get(), &info);
    InfoPtr owned(info);
    if (ret == -FI_ENODATA) {
      if (req.bit == FI_RMA) {
        return Unavailable(where + " not found or offers no FI_EP_RDM endpoint with FI_RMA" +
                           (options.node.empty() ? "" : " on '" + options.node + "'") +
                           "; run `fi_info -l` to list providers and choose one of efa, "
                           "verbs;ofi_rxm, tcp;ofi_rxm, shm");
      }
      return Unavailable(where + " lacks " + req.name + ", which the engine needs; choose another provider");
    }
    if (ret != 0) return FiError("fi_getinfo", ret, where);
  }
  if (options.enable_hmem) {
    caps |= FI_HMEM;
    InfoPtr hints = MakeHints(options, caps);
    fi_info* info = nullptr;
    int ret = GetInfo(options, hints.get(), &info);
    InfoPtr owned(info);
    if (ret == -FI_ENODATA)
      return Unavailable(where + " lacks FI_HMEM (device memory registration); use a provider/build "
                         "with CUDA support or register host memory");
    if (ret != 0) return FiError("fi_getinfo", ret, where + " with FI_HMEM");
  }
  InfoPtr hints = MakeHints(options, caps);
  fi_info* info = nullptr;
  int ret = GetInfo(options, hints.get(), &info);
  if (ret != 0) return FiError("fi_getinfo", ret, where);
  InfoPtr owned(info);
  // fi_getinfo matches prov_name as a prefix list; insist on the exact name
  // so "tcp" never silently stands in for "tcp;ofi_rxm".
  for (fi_info* cur = owned.get(); cur != nullptr; cur = cur->next) {
    if (options.provider == cur->fabric_attr->prov_name) {
      if (cur->domain_attr->cq_data_size < 4)
        return Unavailable(where + " lacks FI_REMOTE_CQ_DATA (cq_data_size " +
                           std::to_string(cur->domain_attr->cq_data_size) +
                           "; 32-bit immediates need 4); choose another provider");
      return InfoPtr(fi_dupinfo(cur));
    }
  }
  return Unavailable(where + " not found (fi_getinfo offered only '" +
                     std::string(owned->fabric_attr->prov_name) + "')");
}

bool LibfabricDefinesParam(const char* env_name) {
  struct fi_param* params = nullptr;
  int count = 0;
  if (fi_getparams(&params, &count) != 0) return false;
  bool defined = false;
  for (int i = 0; i < count && !defined; ++i) defined = params[i].name != nullptr && std::strcmp(params[i].name, env_name) == 0;
  fi_freeparams(params);
  return defined;
}

bool EnvBoolOff(const char* env_name) {
  const char* env = std::getenv(env_name);
  if (env == nullptr) return false;
  for (const char* off : {"0", "no", "off", "false"}) {
    if (strcasecmp(env, off) == 0) return true;
  }
  return false;
}

}  // namespace wsync::transport::fabric
