#include "python/src/torch_groups.h"

#include <algorithm>

#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <cstring>
#include <exception>
#include <string>

namespace wsync::python {
namespace {

std::string RanksText(const std::vector<int32_t>& ranks) {
  std::string s = "[";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s + "]";
}

at::TensorOptions ByteOptions(const c10::Device& device) { return at::TensorOptions().dtype(at::kByte).device(device); }

at::Tensor Bytes(void* data, int64_t n, const c10::Device& device) {
  return at::from_blob(data, {n}, ByteOptions(device));
}

// dst[0, n) = src[0, n), on the host or, ordered on the current stream, on a device.
void CopyBytes(void* dst, const void* src, int64_t n, const c10::Device& device) {
  if (device.is_cpu()) {
    std::memmove(dst, src, static_cast<size_t>(n));
  } else {
    Bytes(dst, n, device).copy_(Bytes(const_cast<void*>(src), n, device));
  }
}

class TorchGroup : public CollectiveGroup {
 public:
  TorchGroup(std::string name, c10::intrusive_ptr<c10d::ProcessGroup> group, std::vector<int> group_rank_of_index,
             int index, std::chrono::milliseconds timeout, c10::Device device)
      : name_(std::move(name)), group_(std::move(group)), group_rank_of_index_(std::move(group_rank_of_index)),
        index_(index), timeout_(timeout), device_(device) {}

  const std::string& name() const override { return name_; }
  int rank() const override { return index_; }
  int size() const override { return static_cast<int>(group_rank_of_index_.size()); }

  Status Barrier() override {
    return Call("barrier", [&] { return group_->barrier(); });
  }

  Status AllGatherShards(const void* shard, void* full, std::span<const int64_t> full_shape, int dim,
                         DType dtype) override {
    try {
      // A device group (NCCL) takes device memory only: host buffers (the
      // executor's version check) go through device copies.
      if (!device_.is_cpu() && !OnDevice(full)) {
        int64_t total = DTypeSize(dtype);
        for (int64_t d : full_shape) total *= d;
        int64_t mine = total / std::max<int64_t>(full_shape[dim], 1) *
                       TorchChunk(full_shape[dim], size(), index_).size;
        at::Tensor dshard = at::empty({std::max<int64_t>(mine, 1)}, ByteOptions(device_));
        at::Tensor dfull = at::empty({total}, ByteOptions(device_));
        if (mine > 0) dshard.narrow(0, 0, mine).copy_(Bytes(const_cast<void*>(shard), mine, c10::Device(c10::kCPU)));
        WSYNC_RETURN_IF_ERROR(GatherOnDevice(dshard.data_ptr(), dfull.data_ptr(), full_shape, dim, dtype));
        Bytes(full, total, c10::Device(c10::kCPU)).copy_(dfull);
        return Status::Ok();
      }
      return GatherOnDevice(shard, full, full_shape, dim, dtype);
    } catch (const std::exception& e) {
      broken_ = true;
      std::string m = e.what();
      m.resize(std::min(m.size(), m.find('\n')));
      return Internal(Where("all-gather") + ": " + m);
    }
  }

  Status Exchange(const void* input, std::span<const int64_t> send_bytes, void* output,
                  std::span<const int64_t> recv_bytes) override {
    try {
      const int parts = size();
      if (static_cast<int>(send_bytes.size()) != parts || static_cast<int>(recv_bytes.size()) != parts)
        return InvalidArgument(Where("exchange") + ": one send and one receive size per rank");
      // torch orders the pieces by group rank, the executor by index.
      std::vector<int> index_of_group_rank(parts);
      for (int i = 0; i < parts; ++i) index_of_group_rank[group_rank_of_index_[i]] = i;
      std::vector<int64_t> send_at(parts + 1, 0), recv_at(parts + 1, 0);  // by index
      for (int i = 0; i < parts; ++i) {
        send_at[i + 1] = send_at[i] + send_bytes[i];
        recv_at[i + 1] = recv_at[i] + recv_bytes[i];
      }
      bool identity = true;
      for (int i = 0; i < parts; ++i) identity = identity && group_rank_of_index_[i] == i;
      auto view = [&](void* p, int64_t n) { return n > 0 ? Bytes(p, n, device_) : at::empty({0}, ByteOptions(device_)); };
      std::vector<int64_t> in_splits(parts), out_splits(parts);
      for (int g = 0; g < parts; ++g) {
        in_splits[g] = send_bytes[index_of_group_rank[g]];
        out_splits[g] = recv_bytes[index_of_group_rank[g]];
      }
      if (identity) {
        at::Tensor in = view(const_cast<void*>(input), send_at[parts]);
        at::Tensor out = view(output, recv_at[parts]);
        return Call("exchange", [&] { return group_->alltoall_base(out, in, out_splits, in_splits); });
      }
      at::Tensor in = at::empty({send_at[parts]}, ByteOptions(device_));
      at::Tensor out = at::empty({recv_at[parts]}, ByteOptions(device_));
      int64_t at_in = 0;
      for (int g = 0; g < parts; ++g) {
        const int i = index_of_group_rank[g];
        if (send_bytes[i] > 0)
          CopyBytes(static_cast<uint8_t*>(in.data_ptr()) + at_in, static_cast<const uint8_t*>(input) + send_at[i],
                    send_bytes[i], device_);
        at_in += send_bytes[i];
      }
      WSYNC_RETURN_IF_ERROR(Call("exchange", [&] { return group_->alltoall_base(out, in, out_splits, in_splits); }));
      int64_t at_out = 0;
      for (int g = 0; g < parts; ++g) {
        const int i = index_of_group_rank[g];
        if (recv_bytes[i] > 0)
          CopyBytes(static_cast<uint8_t*>(output) + recv_at[i], static_cast<const uint8_t*>(out.data_ptr()) + at_out,
                    recv_bytes[i], device_);
        at_out += recv_bytes[i];
      }
      if (!device_.is_cpu()) return Synchronize();
      return Status::Ok();
    } catch (const std::exception& e) {
      broken_ = true;
      std::string m = e.what();
      m.resize(std::min(m.size(), m.find('\n')));
      return Internal(Where("exchange") + ": " + m);
    }
  }

 private:
  // True if torch's CUDA runtime knows `p` as device memory.
  static bool OnDevice(const void* p) {
    try {
      return at::detail::getCUDAHooks().getDeviceFromPtr(const_cast<void*>(p)).is_cuda();
    } catch (const std::exception&) {
      return false;
    }
  }

  // The gather itself, on buffers where device_ says they are.
  Status GatherOnDevice(const void* shard, void* full, std::span<const int64_t> full_shape, int dim, DType dtype) {
    const int n_dims = static_cast<int>(full_shape.size());
    if (dim < 0 || dim >= n_dims) return InvalidArgument(Where("all-gather") + ": dim " + std::to_string(dim) + " out of range");
    const int64_t n = full_shape[dim];
    int64_t outer = 1, inner = DTypeSize(dtype);
    for (int d = 0; d < n_dims; ++d) {
      if (d < dim) outer *= full_shape[d];
      if (d > dim) inner *= full_shape[d];
    }
    const int parts = size();
    const int64_t chunk = (n + parts - 1) / parts;
    const int64_t piece = outer * chunk * inner;  // every rank's padded contribution
    const ChunkRange mine = TorchChunk(n, parts, index_);
    const int64_t my_bytes = outer * mine.size * inner;
    auto* out = static_cast<uint8_t*>(full);
    bool identity = true;
    for (int r = 0; r < parts; ++r) identity = identity && group_rank_of_index_[r] == r;

    // Fast path: a gather along the outermost dim in equal pieces lands in
    // `full` as it is, rank-major, straight from torch's all-gather.
    if (outer == 1 && identity && n % parts == 0) {
      uint8_t* slot = out + mine.begin * inner;
      if (shard != slot && my_bytes > 0) CopyBytes(slot, shard, my_bytes, device_);
      at::Tensor input = Bytes(slot, piece, device_);
      at::Tensor output = Bytes(out, piece * parts, device_);
      return Call("all-gather", [&] { return group_->_allgather_base(output, input); });
    }
    // General path: padded pieces in group-rank order, then placed.
    at::Tensor input = at::zeros({piece}, ByteOptions(device_));
    if (my_bytes > 0) CopyBytes(input.data_ptr(), shard, my_bytes, device_);
    at::Tensor output = at::empty({piece * parts}, ByteOptions(device_));
    WSYNC_RETURN_IF_ERROR(Call("all-gather", [&] { return group_->_allgather_base(output, input); }));
    const uint8_t* gathered = static_cast<const uint8_t*>(output.data_ptr());
    for (int r = 0; r < parts; ++r) {
      const ChunkRange c = TorchChunk(n, parts, r);
      if (c.size == 0) continue;
      const uint8_t* src = gathered + static_cast<int64_t>(group_rank_of_index_[r]) * piece;
      if (device_.is_cpu()) {
        for (int64_t o = 0; o < outer; ++o) {
          std::memcpy(out + (o * n + c.begin) * inner, src + o * c.size * inner, static_cast<size_t>(c.size * inner));
        }
      } else {  // one strided copy per rank: [outer, c.size * inner] into rows of n * inner
        at::from_blob(out + c.begin * inner, {outer, c.size * inner}, {n * inner, 1}, ByteOptions(device_))
            .copy_(at::from_blob(const_cast<uint8_t*>(src), {outer, c.size * inner}, ByteOptions(device_)));
      }
    }
    if (!device_.is_cpu()) return Synchronize();
    return Status::Ok();
  }

  std::string Where(const char* what) const {
    return std::string("torch process group '") + name_ + "' (index " + std::to_string(index_) + " of " +
           std::to_string(size()) + "): " + what;
  }

  template <typename Fn>
  Status Call(const char* what, Fn&& start) {
    if (broken_) return FailedPrecondition(Where(what) + ": an earlier collective of this group failed");
    try {
      c10::intrusive_ptr<c10d::Work> work = start();
      if (!work->wait(timeout_)) {
        broken_ = true;
        return DeadlineExceeded(Where(what) + ": not done after " + std::to_string(timeout_.count()) + " ms");
      }
      // On a device, wait() only orders the current stream after the
      // collective; the executor's own stream reads the result next.
      if (!device_.is_cpu()) return Synchronize();
      return Status::Ok();
    } catch (const std::exception& e) {
      broken_ = true;
      // c10::Error carries a backtrace after the first line; keep the line.
      std::string m = e.what();
      const size_t nl = m.find('\n');
      if (nl != std::string::npos) m.resize(nl);
      const bool timeout = m.find("imed out") != std::string::npos || m.find("imeout") != std::string::npos;
      return timeout ? DeadlineExceeded(Where(what) + ": " + m) : Unavailable(Where(what) + ": " + m);
    }
  }

  Status Synchronize() {
    try {
      c10::impl::VirtualGuardImpl impl(device_.type());
      impl.getStream(device_).synchronize();
      return Status::Ok();
    } catch (const std::exception& e) {
      broken_ = true;
      std::string m = e.what();
      m.resize(std::min(m.size(), m.find('\n')));
      return Unavailable(Where("synchronize") + ": " + m);
    }
  }

  std::string name_;
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  std::vector<int> group_rank_of_index_;
  int index_;
  std::chrono::milliseconds timeout_;
  c10::Device device_;  // where the executor's buffers are (CPU, or the CUDA device for NCCL)
  bool broken_ = false;
};

class TorchGroupFactory : public GroupFactory {
 public:
  TorchGroupFactory(std::vector<TorchProcessGroup> groups, std::chrono::milliseconds timeout, c10::Device device)
      : groups_(std::move(groups)), timeout_(timeout), device_(device) {}

  StatusOr<std::unique_ptr<CollectiveGroup>> Join(const std::string& name, const std::vector<int32_t>& ranks,
                                                  int index) override {
    std::vector<int32_t> want = ranks;
    std::sort(want.begin(), want.end());
    for (const TorchProcessGroup& g : groups_) {
      std::vector<int32_t> have = g.ranks;
      std::sort(have.begin(), have.end());
      if (have != want) continue;
      std::vector<int> order;
      for (int32_t r : ranks) {
        order.push_back(static_cast<int>(std::find(g.ranks.begin(), g.ranks.end(), r) - g.ranks.begin()));
      }
      return std::unique_ptr<CollectiveGroup>(new TorchGroup(name, g.group, std::move(order), index, timeout_, device_));
    }
    return NotFound("group '" + name + "': no torch process group of trainer ranks " + RanksText(ranks) +
                    "; wsync.TrainerAgent makes one per mesh dim of every mesh its parameters live on, and the "
                    "plan asks for another set (a layout wsync does not support yet)");
  }

 private:
  std::vector<TorchProcessGroup> groups_;
  std::chrono::milliseconds timeout_;
  c10::Device device_;
};

}  // namespace

std::unique_ptr<GroupFactory> MakeTorchGroupFactory(std::vector<TorchProcessGroup> groups,
                                                    std::chrono::milliseconds timeout, int cuda_device) {
  const c10::Device device = cuda_device < 0 ? c10::Device(c10::kCPU)
                                             : c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(cuda_device));
  return std::make_unique<TorchGroupFactory>(std::move(groups), timeout, device);
}

}  // namespace wsync::python
