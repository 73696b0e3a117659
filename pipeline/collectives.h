// Collectives among the trainer ranks of one MeshGroup, over Gloo.
//
// The trainer pipeline needs two things from its peers: full_tensor, i.e. an
// all-gather of a DTensor shard along the FSDP-sharded tensor dim, and a
// barrier between MeshGroups. This file wraps exactly those Gloo calls so that
// the rest of wsync sees Status, never gloo's exceptions, and never a hang:
// every call is bounded by the group's timeout. Callers: the trainer agent
// (one GlooGroup per MeshGroup it belongs to) and the tests.
//
// Rendezvous goes through RendezvousStore, a small key-value interface: today
// a directory shared by the ranks (FileRendezvousStore) or process memory
// (InMemoryRendezvousStore, for ranks as threads); later the controller hosts
// one over HTTP. Each group's keys live under its own prefix, so one store
// serves every MeshGroup.
//
// Threads: a GlooGroup is used by one thread at a time; different groups may
// be used from different threads. Calls block until every rank of the group
// makes the same call, or the timeout passes.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "pipeline/group.h"
#include "routing/dtype.h"

namespace gloo {
class Context;
}  // namespace gloo

namespace wsync {

// A key-value store that the ranks of a group reach in common. Keys are set
// once (setting an existing key is an error) and values are non-empty.
// Implementations must be safe to call from several threads.
class RendezvousStore {
 public:
  virtual ~RendezvousStore() = default;

  virtual Status Set(const std::string& key, const std::vector<char>& value) = 0;
  // Waits for the key (up to timeout), then returns its value.
  virtual StatusOr<std::vector<char>> Get(const std::string& key,
                                          std::chrono::milliseconds timeout) = 0;
  // Waits until every key is set; DeadlineExceeded after timeout.
  virtual Status Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
};

// Keys as files in a directory that every rank can read and write (a shared
// or local filesystem). The directory must exist; use a fresh one per job, as
// keys are never deleted.
StatusOr<std::unique_ptr<RendezvousStore>> MakeFileRendezvousStore(const std::string& directory);

// Keys in this process's memory: for ranks run as threads of one process.
std::unique_ptr<RendezvousStore> MakeInMemoryRendezvousStore();

struct GlooGroupOptions {
  // Address this rank listens on for its peers (Gloo tcp transport). Either a
  // hostname/IP or, if non-empty, an interface name (iface wins).
  std::string hostname = "127.0.0.1";
  std::string iface;
  // Bound on rendezvous and on each collective; a peer that does not arrive
  // in time turns into DeadlineExceeded instead of a hang.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
};

// A connected Gloo context for `size` ranks named `name` (a MeshGroup name).
// After any failed collective the group is unusable (peers may be mid-way
// through the failed call); every later call returns FailedPrecondition.
class GlooGroup : public CollectiveGroup {
 public:
  // Blocks until all `size` ranks have called Create with the same name and
  // store, or the timeout passes. `name` must be unique within the store.
  // Sets SIGPIPE to ignored if it has its default action, so that a dead
  // peer fails the collective instead of killing this process.
  static StatusOr<std::unique_ptr<GlooGroup>> Create(RendezvousStore& store,
                                                     const std::string& name, int rank, int size,
                                                     const GlooGroupOptions& options = {});
  ~GlooGroup();
  GlooGroup(const GlooGroup&) = delete;
  GlooGroup& operator=(const GlooGroup&) = delete;

  const std::string& name() const override { return name_; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  // Returns once every rank of the group has entered the barrier.
  Status Barrier() override;

  // full_tensor() for a tensor sharded along `dim` over this group: rank r
  // holds TorchChunk(full_shape[dim], size(), r) of that dim (all other dims
  // whole), row-major contiguous at `shard` (may be null when empty). Writes
  // the whole tensor, row-major contiguous, to `full`, which must hold
  // prod(full_shape) elements of `dtype`. `shard` may lie inside `full` (it
  // is read before `full` is written). Every rank passes the same
  // full_shape, dim and dtype. To gather over several mesh dims (HSDP), call
  // once per dim on that dim's group.
  Status AllGatherShards(const void* shard, void* full, std::span<const int64_t> full_shape,
                         int dim, DType dtype) override;

  // The planned exchange: gloo alltoallv over the same context.
  Status Exchange(const void* input, std::span<const int64_t> send_bytes, void* output,
                  std::span<const int64_t> recv_bytes) override;

 private:
  GlooGroup(std::string name, int rank, int size, std::chrono::milliseconds timeout,
            std::shared_ptr<gloo::Context> context);
  Status CheckUsable(const char* call) const;
  // Marks the group unusable and returns `error`.
  Status Poison(const Status& error);

  std::string name_;
  int rank_ = 0;
  int size_ = 1;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<gloo::Context> context_;  // null for a group of one
  bool broken_ = false;
  std::vector<uint8_t> staging_;  // rank-major gather buffer for dim > 0
};

// Joins GlooGroups through `store` (which must outlive the factory), the
// executor's groups for the sidecar.
std::unique_ptr<GroupFactory> MakeGlooGroupFactory(RendezvousStore* store, GlooGroupOptions options);

}  // namespace wsync
