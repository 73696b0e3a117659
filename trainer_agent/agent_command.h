// `wsync trainer-agent`: the sidecar next to one trainer rank. It reads the
// rank's shards from the trainer's shared-memory export
// (trainer_agent/shard_export.h), and runs each published version through
// the pipeline against the controller until SIGTERM/SIGINT. The CLI file
// (cli/trainer_agent_command.cc) only declares the flags; everything else is
// here so tests run the same code as a real process.
//
// Output: one line per event on stderr, including every version's stage
// times; "ready" on stdout (flushed) once registered with the controller.
#pragma once

#include <chrono>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "routing/metadata.h"

namespace wsync::trainer_agent {

struct TrainerAgentFlags {
  std::string controller;        // HOST:PORT
  std::string secret_file;       // job secret ("" = $WSYNC_SECRET_FILE, else unsigned)
  std::string tls_ca_file;       // CA of a TLS controller ("" = $WSYNC_TLS_CA_FILE, else plain HTTP)
  int32_t rank = 0;
  std::string layout;            // wsync.trainer/v1 file, or
  std::string cluster;           // cluster spec for the model generator
  std::string job = "wsync";     // default shm name: /wsync-<job>-train-<rank>
  std::string shm_name;          // overrides the default name
  std::string provider = "shm";  // libfabric provider
  uint32_t nics = 1;
  std::string node;              // local address for the transport ("" = provider default)
  uint64_t watermark = 1ull << 30;
  bool checksums = false;        // hash every write for the inference ranks' check
  bool deltas = false;           // send only what changed where the controller says (ExecutorOptions::deltas)
  std::string gloo_host = "127.0.0.1";  // address peers reach this rank's Gloo at
  std::string gloo_iface;        // or an interface name (wins over gloo_host)
  double gloo_timeout_s = 60;    // bound on every rendezvous and collective
  double plan_timeout_s = 0;     // 0: wait for the world until stopped
  double shm_timeout_s = 0;      // 0: wait for the trainer's export until stopped
  // The GPU route (cuda_shards.h): the trainer's wsync.cuda_ipc/v1 file of
  // its shards ("" = shards in shared memory), and whether writes leave the
  // GPU directly ("auto": where the libfabric can register CUDA memory,
  // "on": always through pinned host memory, "off": directly or not at all).
  std::string cuda_ipc;
  std::string staging = "auto";
};

struct TrainerRankSpec {
  TrainerRank rank;
  std::vector<MeshGroupSpec> mesh_groups;
};

// This rank's entry of the layout file or of the generated specs, with the
// trainer's MeshGroups. One line naming the file and the rank on error.
StatusOr<TrainerRankSpec> LoadTrainerRank(const TrainerAgentFlags& flags);

// How long one write may stay incomplete on a rank whose collectives wait
// `gloo_timeout`: at most half of it. A rank that waits out a write to a
// dead inference agent must still reach the next rendezvous before its
// peers give up on it; with the engine's 30 s against a 20 s Gloo timeout
// the next version never formed (chaos, docs/CONTROL_PLANE.md).
std::chrono::milliseconds WriteTimeoutWithin(std::chrono::milliseconds engine_default,
                                             std::chrono::milliseconds gloo_timeout);

// Runs the agent until SIGTERM/SIGINT; returns the process exit code
// (0 after a signal, 1 with one line on stderr on error).
int RunTrainerAgentCommand(const TrainerAgentFlags& flags);

}  // namespace wsync::trainer_agent
