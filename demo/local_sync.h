// A whole weight-sync deployment on one machine, from real processes: the
// controller, one inference agent per inference rank, one trainer agent per
// trainer rank, and (in this process) the trainers' side: each rank's shard
// export filled with synthetic weights per version.
//
// Used by `wsync demo` (README command one), the integration tests (which
// kill, restart and break pieces of it) and `wsync bench cluster` (which
// places ranks in network namespaces). After each version it can check every
// inference byte against demo::Reference, computed without the pipeline.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "controller/client.h"
#include "demo/process.h"
#include "models/generate.h"
#include "routing/routing_table.h"
#include "trainer_agent/shard_export.h"

namespace wsync::demo {

// Where one rank's processes run: a network namespace (empty: this one)
// and the address its transport and Gloo bind to.
struct HostPlacement {
  std::string netns;
  std::string address = "127.0.0.1";
};

struct LocalSyncOptions {
  std::string cluster = "examples/demo-moe-4x2/cluster.json";
  std::string binary;               // wsync executable; default: this one
  std::string provider = "shm";     // libfabric provider for the weight writes
  uint32_t nics = 1;
  uint64_t watermark = 256ull << 20;
  std::string job;                  // names shared memory; default "demo<pid>"
  std::string work_dir;             // logs, controller state; default /tmp/wsync-<job>
  double version_timeout_s = 120;
  double gloo_timeout_s = 30;
  std::vector<HostPlacement> trainers;   // per trainer rank; empty: loopback
  std::vector<HostPlacement> inference;  // per inference rank; empty: loopback
  HostPlacement controller;              // listens on address:0
  std::vector<std::string> extra_trainer_args;
  std::vector<std::string> extra_inference_args;
  double world_timeout_s = 120;     // controller: name missing ranks after this
  double heartbeat_timeout_s = 10;  // controller: declare a silent rank lost after this
  bool exchange = true;             // controller: plan the exchange; false: full_tensor
  // Synthetic weights: about 1/drift of the elements change per version
  // (demo/synthetic.h); 1: all of them.
  uint32_t drift = 1;
  // Delta versions: trainer and inference agents run with --delta, the
  // controller with --full-every (docs/DELTAS.md); 0: no deltas.
  uint32_t full_every = 0;
  // Fault scenarios for the integration tests.
  std::vector<int32_t> absent_inference;                // never started
  std::map<int32_t, std::string> trainer_cluster;       // rank -> another cluster spec
  bool wait_ready = true;                               // Start() waits for every "ready"
  // Start() says what it is doing here (one line each, no newline); `wsync
  // demo` prints them with the time since start.
  std::function<void(const std::string&)> progress;
};

struct StageTimes {
  nlohmann::json per_rank;  // trainer rank -> its reported stats, as sent
};

struct UpdateReport {
  uint64_t version = 0;
  uint64_t wire_bytes = 0;         // bytes written into inference memory
  double seconds = 0;              // publish on every rank -> version complete
  double gbps = 0;                 // GB/s (1e9)
  std::string state;               // "complete" or "failed"
  std::string failure;             // first failure line, if failed
  nlohmann::json trainer_stats;    // as the trainer agents reported them
  uint64_t verified_tensors = 0;
  uint64_t verified_bytes = 0;
  // The demo's own work around the update, timed so it can be told apart.
  uint64_t fill_bytes = 0;         // synthetic trainer weights written into the shard exports
  double fill_seconds = 0;         // FillShards
  double verify_seconds = 0;       // Verify
};

// Threads the demo's own CPU work (synthetic weights, the reference) uses:
// this machine's cores, at most 8 (each verifying thread holds up to ~150 MB).
size_t DemoWorkers();

class LocalSync {
 public:
  ~LocalSync();

  // Generates the specs, starts every process and waits until all are ready.
  static StatusOr<std::unique_ptr<LocalSync>> Start(const LocalSyncOptions& options);

  // One version end to end: fill every shard export, publish, wait for the
  // controller to call the version complete or failed. Does not verify.
  // `seconds` counts from publish; the fill is `fill_seconds`.
  StatusOr<UpdateReport> Update(uint64_t version);
  // Checks every tensor of every inference rank (or only `only_rank`) bit
  // for bit against the reference for `version`; fills the verified_* fields
  // and verify_seconds. Each engine tensor's reference is computed once and
  // cut for every rank that holds a part of it.
  Status Verify(uint64_t version, UpdateReport* report, int32_t only_rank = -1) const;

  // Pieces, for the integration tests.
  Status FillShards(uint64_t version, uint64_t* bytes = nullptr);
  Status Publish(uint64_t version);
  StatusOr<controller::VersionStatus> WaitVersion(uint64_t version, double timeout_s);
  void KillTrainerAgent(int32_t rank, int signal = 9);
  Status StartTrainerAgent(int32_t rank);
  void KillInferenceAgent(int32_t rank, int signal = 9);
  Status StartInferenceAgent(int32_t rank, bool attach);
  void StopController();
  Status StartController();

  controller::ControllerClient& client() { return *client_; }
  const GeneratedSpecs& specs() const { return specs_; }
  const RoutingTable& table() const { return table_; }
  const LocalSyncOptions& options() const { return options_; }
  std::string TrainerLog(int32_t rank) const;
  std::string InferenceLog(int32_t rank) const;
  ChildProcess& trainer_agent(int32_t rank) { return trainer_agents_[rank]; }
  ChildProcess& inference_agent(int32_t rank) { return inference_agents_[rank]; }
  std::string InferenceShmName(int32_t rank) const;

 private:
  explicit LocalSync(LocalSyncOptions options) : options_(std::move(options)) {}
  std::vector<std::string> Wrap(const HostPlacement& host, std::vector<std::string> argv) const;

  LocalSyncOptions options_;
  GeneratedSpecs specs_;
  RoutingTable table_;               // planned here too, for byte counts
  std::string mapping_path_;         // resolved mapping handed to the controller
  std::string controller_address_;
  int controller_port_ = 0;          // kept across restarts: agents know it
  ChildProcess controller_;
  std::vector<ChildProcess> inference_agents_;
  std::vector<ChildProcess> trainer_agents_;
  std::vector<std::unique_ptr<trainer_agent::ShardExport>> exports_;
  std::unique_ptr<controller::ControllerClient> client_;
  std::string secret_path_;  // the job secret every started process signs with
};

}  // namespace wsync::demo
