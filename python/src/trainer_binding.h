// The in-process trainer route (wsync.TrainerAgent): one trainer rank of an
// ordinary torch.distributed job pushes its shards after each optimizer
// step, the pipeline running on a thread of its own.
//
// TrainerSession registers the rank's metadata (built in Python from the
// model's DTensors, python/wsync/_meta.py) with the controller, waits for
// the plan, and builds a PlanExecutor whose collectives are torch process
// groups made for wsync alone (torch_groups.h). Push(v) hands the shard
// pointers to a new pipeline thread and returns; the PushState tells when
// the trainer may change its weights again (reads done) and how the version
// ended. No Python is touched off the caller's thread: the binding layer
// (module.cc) releases the GIL around every blocking call.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "controller/client.h"
#include "pipeline/device.h"
#include "pipeline/executor.h"
#include "pipeline/group.h"
#include "pipeline/shard_source.h"
#include "transport/engine.h"
#include "transport/libfabric/libfabric_options.h"

namespace wsync::python {

struct TrainerConfig {
  nlohmann::json registration;  // POST /v1/register/trainer body (rank + mesh_groups)
  std::string controller;       // HOST:PORT
  std::string secret_file;  // job secret ("": $WSYNC_SECRET_FILE, else unsigned)
  std::string tls_ca_file;  // CA of a TLS controller ("": $WSYNC_TLS_CA_FILE, else plain HTTP)
  std::string job;
  std::string provider = "shm";
  uint32_t nics = 1;
  std::string node;             // local address for the transport (tcp)
  uint64_t watermark_bytes = 1ull << 30;
  bool checksums = false;  // ExecutorOptions::checksums
  bool deltas = false;     // ExecutorOptions::deltas
  std::chrono::milliseconds timeout{300000};  // registration/plan, each version
  // The trainer's shards are on this CUDA device (-1: host memory): the
  // pipeline's temporary memory and stages go there (pipeline/device.h) and
  // the engine registers device memory (FI_HMEM).
  int cuda_device = -1;
  // With cuda_device: the shards are in host memory all the same (FSDP2's
  // CPUOffloadPolicy keeps them pinned there); the copy stage brings them
  // host-to-device into the arena.
  bool host_shards = false;
  // Writes from GPU memory: "auto" sends straight from the device where the
  // transport can register device memory (FI_HMEM) and stages them through
  // pinned host memory otherwise; "on" always stages, "off" never (a
  // transport without FI_HMEM is then refused).
  std::string staging = "auto";
};

// One local shard as the trainer holds it now: row-major bytes of the
// DTensor's local tensor.
struct ShardPointer {
  std::string name;
  const uint8_t* data = nullptr;
  uint64_t bytes = 0;
};

// What one push() became. Shared by the pipeline thread and the handle.
class PushState {
 public:
  explicit PushState(uint64_t version) : version_(version) {}
  uint64_t version() const { return version_; }

  // True once the trainer may modify its weights (all shards read, or the
  // version ended without reading them).
  bool WaitReadsDone(std::chrono::milliseconds timeout);
  // The version's report once this rank's part ended; DeadlineExceeded
  // before.
  StatusOr<VersionReport> Wait(std::chrono::milliseconds timeout);
  bool done();

  void MarkReadsDone();
  void Finish(StatusOr<VersionReport> result);

 private:
  const uint64_t version_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool reads_done_ = false;                      // guarded by mu_
  std::optional<StatusOr<VersionReport>> result_;  // guarded by mu_
};

class TrainerSession {
 public:
  // Blocks until the world is planned (config.timeout) and the executor is
  // ready. `groups` must outlive the session.
  static StatusOr<std::unique_ptr<TrainerSession>> Create(TrainerConfig config,
                                                          std::unique_ptr<GroupFactory> groups);
  ~TrainerSession();  // Close()

  // Starts version `v` over `shards` on a pipeline thread and returns.
  // FailedPrecondition while the previous version's reads are not done (its
  // handle's wait_reads_done() first) or after Close(); a previous version
  // still writing is waited for first.
  StatusOr<std::shared_ptr<PushState>> Push(uint64_t v, std::vector<ShardPointer> shards);

  // PlanExecutor::ReplayWrites after the last push has ended: the engine
  // alone on this rank's writes, for benches. The next push restores the
  // inference weights.
  StatusOr<VersionReport> ReplayWrites();

  // Waits for the last push, then deregisters and stops the transport.
  void Close();

  int32_t rank() const { return rank_; }
  const std::string& plan_id() const { return plan_id_; }
  controller::ControllerClient& client() { return client_; }
  // The plan's shape for this rank: groups, sources, writes, bytes.
  nlohmann::json Describe() const;

 private:
  TrainerSession(TrainerConfig config, controller::ControllerClient client, int32_t rank)
      : config_(std::move(config)), client_(std::move(client)), rank_(rank) {}
  void JoinPrevious();
  // On the pipeline thread, when the controller serves a newer registration
  // epoch: fetch the slice again and rebuild the executor (new descriptors);
  // with `new_engine`, on a new engine too (after writes that timed out: a
  // provider can be left unable to complete any write).
  Status Replan(bool new_engine = false);

  // Members in creation order; teardown runs in reverse (the executor before
  // the groups and the engine it uses).
  TrainerConfig config_;
  controller::ControllerClient client_;
  const int32_t rank_;
  std::string plan_id_;
  uint64_t epoch_ = 0;                // registration epoch of the plan slice the executor runs
  ExecutorOptions executor_options_;  // kept for Replan()
  transport::fabric::LibfabricOptions fabric_options_;  // kept for Replan(true)
  std::unique_ptr<DeviceOps> device_;  // before engine_ and executor_: the arena is its memory
  // engine_ and executor_ are replaced only by Replan() (the push thread) and
  // Close(), under plan_mu_; Describe() reads them under it. The push
  // thread's own uses need no lock: nothing else replaces them meanwhile.
  mutable std::mutex plan_mu_;
  std::unique_ptr<transport::Engine> engine_;
  std::unique_ptr<GroupFactory> groups_;
  std::unique_ptr<controller::HeartbeatSender> heartbeat_;
  std::unique_ptr<PlanExecutor> executor_;
  std::mutex mu_;
  std::shared_ptr<PushState> last_;  // guarded by mu_
  std::thread pipeline_;             // the last push's thread; joined by the caller's thread only
  bool closed_ = false;              // guarded by mu_
};

}  // namespace wsync::python
