#include "trainer_agent/cuda_shards.h"

namespace wsync::trainer_agent {

StatusOr<std::unique_ptr<CudaIpcShards>> CudaIpcShards::Open(const std::string& path, const ShardLayout& layout,
                                                             ShardView* view) {
  std::vector<cuda_ipc::Expected> expected;
  for (const ShardSlot& s : layout.slots) expected.push_back({s.name, s.bytes});
  const std::string me = "trainer rank " + std::to_string(layout.rank);
  WSYNC_ASSIGN_OR_RETURN(cuda_ipc::Export ipc, cuda_ipc::ReadFile(path, expected, me));
  WSYNC_ASSIGN_OR_RETURN(std::unique_ptr<cuda_ipc::Mappings> mappings, cuda_ipc::Mappings::Open(ipc));
  for (const cuda_ipc::Mapped& m : mappings->regions()) {
    if (m.device != mappings->regions().front().device) {
      return InvalidArgument(path + ": " + me + "'s shards are on cuda:" +
                             std::to_string(mappings->regions().front().device) + " and cuda:" +
                             std::to_string(m.device) + " ('" + m.id + "'); a rank's pipeline runs on one GPU");
    }
  }
  return std::unique_ptr<CudaIpcShards>(new CudaIpcShards(std::move(mappings), view, ipc.pid));
}

CudaIpcShards::CudaIpcShards(std::unique_ptr<cuda_ipc::Mappings> mappings, ShardView* view, int64_t pid)
    : mappings_(std::move(mappings)), view_(view), pid_(pid) {
  if (!mappings_->regions().empty()) device_ = mappings_->regions().front().device;
  for (const cuda_ipc::Mapped& m : mappings_->regions()) by_name_.emplace(m.id, &m);
}

const uint8_t* CudaIpcShards::Shard(const std::string& name, uint64_t* bytes) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return nullptr;
  if (bytes != nullptr) *bytes = it->second->bytes;
  return it->second->data;
}

std::string CudaIpcShards::Describe() const {
  uint64_t total = 0;
  for (const cuda_ipc::Mapped& m : mappings_->regions()) total += m.bytes;
  return std::to_string(by_name_.size()) + " shards (" + std::to_string(total) + " bytes) of process " +
         std::to_string(pid_) + " on cuda:" + std::to_string(device_);
}

}  // namespace wsync::trainer_agent
