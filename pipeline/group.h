// The collectives the executor needs among the trainer ranks of one
// MeshGroup, behind one small interface, so the same executor runs over
// Gloo groups of its own (the sidecar, pipeline/collectives.h) and over the
// trainer's torch process groups (the in-process binding, python/).
//
// Contract, for every implementation:
//   - A CollectiveGroup is used by one thread at a time; different groups
//     may be used from different threads at once.
//   - Every call blocks until every rank of the group has made the same call,
//     or the group's own timeout passes (DeadlineExceeded): never a hang.
//   - After a failed collective the group is unusable (peers may be mid-way
//     through the failed call); every later call returns FailedPrecondition.
//     The executor then joins fresh groups under a new name.
// Callers: pipeline/executor.cc; implementations: collectives.cc (Gloo) and
// python/src/torch_groups.cc (torch.distributed).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "routing/dtype.h"

namespace wsync {

// The range of tensor-dim indices that shard `index` of `parts` holds, as
// DTensor Shard(d) / torch.chunk split it: chunk size ceil(n/parts), the last
// nonempty chunk shorter, trailing chunks empty.
struct ChunkRange {
  int64_t begin = 0;
  int64_t size = 0;
};
ChunkRange TorchChunk(int64_t n, int64_t parts, int64_t index);

class CollectiveGroup {
 public:
  virtual ~CollectiveGroup() = default;

  virtual const std::string& name() const = 0;
  // This rank's index in the group's `ranks` (chunk order), and the size.
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Returns once every rank of the group has entered the barrier.
  virtual Status Barrier() = 0;

  // full_tensor() for a tensor sharded along `dim` over this group: the rank
  // of index r holds TorchChunk(full_shape[dim], size(), r) of that dim (all
  // other dims whole), row-major contiguous at `shard` (may be null when
  // empty). Writes the whole tensor, row-major contiguous, to `full`, which
  // holds prod(full_shape) elements of `dtype`. `shard` may lie inside
  // `full` (it is read before `full` is written). Every rank passes the same
  // full_shape, dim and dtype.
  virtual Status AllGatherShards(const void* shard, void* full, std::span<const int64_t> full_shape, int dim,
                                 DType dtype) = 0;

  // The planned exchange (all-to-all-v, in bytes): `input` holds
  // send_bytes[i] bytes for the rank of index i, back to back in index
  // order; `output` receives recv_bytes[i] bytes from each, back to back in
  // index order (this rank's own piece included, copied locally). Every rank
  // passes sizes that agree with its peers' (what i sends to j is what j
  // receives from i). Buffers are where the group's collectives read and
  // write (host memory for Gloo, the device for NCCL) and do not overlap.
  virtual Status Exchange(const void* input, std::span<const int64_t> send_bytes, void* output,
                          std::span<const int64_t> recv_bytes) = 0;
};

// Makes the executor's groups. `ranks` are global trainer ranks in chunk
// order and `index` is this rank's position in them; `name` is unique per
// group and generation (the executor puts the version that rebuilt its
// groups into it), identical on every rank of the group. Every rank joins
// its groups in the same global order, so no two ranks wait on each other
// crosswise.
class GroupFactory {
 public:
  virtual ~GroupFactory() = default;
  virtual StatusOr<std::unique_ptr<CollectiveGroup>> Join(const std::string& name,
                                                          const std::vector<int32_t>& ranks, int index) = 0;
};

}  // namespace wsync
