// A trainer's shards on its GPU, read in place by the `wsync trainer-agent`
// sidecar: the trainer process writes a wsync.cuda_ipc/v1 file with one
// region per local shard (Python: wsync.export_shards, for shards on a CUDA
// device), and the agent opens its handles (cuda_ipc/mappings.h). The
// shard export's region (shard_export.h, placement kCudaIpc) is the header
// alone and still carries the version words: after its optimizer step the
// trainer waits for its stream, then publishes; the agent reads the shards
// and marks reads done, after which the trainer may step again.
//
// Every shard of the rank's layout must be in the file with its size, each
// lies inside its allocation, and all on one GPU: the pipeline runs there.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>

#include "common/status.h"
#include "cuda_ipc/mappings.h"
#include "pipeline/shard_source.h"
#include "trainer_agent/shard_export.h"

namespace wsync::trainer_agent {

class CudaIpcShards : public ShardSource {
 public:
  // Reads `path` against `layout` (its slots' names and sizes) and opens the
  // handles. `view` (placement kCudaIpc) keeps the version words and must
  // outlive this.
  static StatusOr<std::unique_ptr<CudaIpcShards>> Open(const std::string& path, const ShardLayout& layout,
                                                       ShardView* view);

  const uint8_t* Shard(const std::string& name, uint64_t* bytes) const override;
  void ReadsDone(uint64_t version) override { view_->MarkReadsDone(version); }

  // This process's ordinal of the GPU the shards are on.
  int device() const { return device_; }
  // "N shards (B bytes) of process P on cuda:D".
  std::string Describe() const;

 private:
  CudaIpcShards(std::unique_ptr<cuda_ipc::Mappings> mappings, ShardView* view, int64_t pid);

  std::unique_ptr<cuda_ipc::Mappings> mappings_;
  ShardView* view_;
  int64_t pid_;
  int device_ = 0;
  std::unordered_map<std::string, const cuda_ipc::Mapped*> by_name_;
};

}  // namespace wsync::trainer_agent
