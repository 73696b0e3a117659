#include "pipeline/staged_group.h"

#include <numeric>
#include <vector>

namespace wsync {
namespace {

class HostStagedGroup : public CollectiveGroup {
 public:
  HostStagedGroup(std::unique_ptr<CollectiveGroup> inner, DeviceOps* device)
      : inner_(std::move(inner)), device_(device) {}

  const std::string& name() const override { return inner_->name(); }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  Status Barrier() override { return inner_->Barrier(); }

  Status AllGatherShards(const void* shard, void* full, std::span<const int64_t> full_shape, int dim,
                         DType dtype) override {
    if (!device_->CanRead(full)) return inner_->AllGatherShards(shard, full, full_shape, dim, dtype);
    int64_t elements = 1;
    for (int64_t d : full_shape) elements *= d;
    const int64_t along = full_shape[static_cast<size_t>(dim)];
    const ChunkRange mine = TorchChunk(along, size(), rank());
    const uint64_t full_bytes = static_cast<uint64_t>(elements * DTypeSize(dtype));
    const uint64_t shard_bytes = along == 0 ? 0 : full_bytes / static_cast<uint64_t>(along) * mine.size;
    host_in_.resize(shard_bytes);
    host_out_.resize(full_bytes);
    if (shard_bytes > 0) WSYNC_RETURN_IF_ERROR(Staged("read back", device_->ReadBack(host_in_.data(), shard, shard_bytes)));
    WSYNC_RETURN_IF_ERROR(inner_->AllGatherShards(shard_bytes > 0 ? host_in_.data() : nullptr, host_out_.data(),
                                                  full_shape, dim, dtype));
    return Staged("copy in", device_->CopyFromHost(full, host_out_.data(), full_bytes));
  }

  Status Exchange(const void* input, std::span<const int64_t> send_bytes, void* output,
                  std::span<const int64_t> recv_bytes) override {
    if (!device_->CanRead(output)) return inner_->Exchange(input, send_bytes, output, recv_bytes);
    const auto in = static_cast<uint64_t>(std::accumulate(send_bytes.begin(), send_bytes.end(), int64_t{0}));
    const auto out = static_cast<uint64_t>(std::accumulate(recv_bytes.begin(), recv_bytes.end(), int64_t{0}));
    host_in_.resize(in);
    host_out_.resize(out);
    if (in > 0) WSYNC_RETURN_IF_ERROR(Staged("read back", device_->ReadBack(host_in_.data(), input, in)));
    WSYNC_RETURN_IF_ERROR(inner_->Exchange(host_in_.data(), send_bytes, host_out_.data(), recv_bytes));
    return out > 0 ? Staged("copy in", device_->CopyFromHost(output, host_out_.data(), out)) : Status::Ok();
  }

 private:
  Status Staged(const char* what, Status s) const {
    if (s.ok()) return s;
    return s.WithContext("group '" + name() + "' through host memory: " + what);
  }

  std::unique_ptr<CollectiveGroup> inner_;
  DeviceOps* device_;
  // Host copies of the last call's input and output (CopyFromHost returns
  // once the bytes have left them).
  std::vector<uint8_t> host_in_;
  std::vector<uint8_t> host_out_;
};

class HostStagedGroupFactory : public GroupFactory {
 public:
  HostStagedGroupFactory(std::unique_ptr<GroupFactory> inner, DeviceOps* device)
      : inner_(std::move(inner)), device_(device) {}
  StatusOr<std::unique_ptr<CollectiveGroup>> Join(const std::string& name, const std::vector<int32_t>& ranks,
                                                  int index) override {
    WSYNC_ASSIGN_OR_RETURN(std::unique_ptr<CollectiveGroup> g, inner_->Join(name, ranks, index));
    return std::unique_ptr<CollectiveGroup>(new HostStagedGroup(std::move(g), device_));
  }

 private:
  std::unique_ptr<GroupFactory> inner_;
  DeviceOps* device_;
};

}  // namespace

std::unique_ptr<GroupFactory> MakeHostStagedGroupFactory(std::unique_ptr<GroupFactory> inner, DeviceOps* device) {
  return std::make_unique<HostStagedGroupFactory>(std::move(inner), device);
}

}  // namespace wsync
