// `wsync inference-agent`: the process that holds one inference rank's
// weights in shared memory and runs the InferenceAgent against the
// controller until SIGTERM/SIGINT. The CLI file (cli/inference_agent_command.cc)
// only declares the flags; everything else is here so tests run the same
// code as a real process.
//
// Output: one line per event on stderr; "ready" on stdout (flushed) once
// registered with the controller, so scripts can wait for it.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "routing/metadata.h"

namespace wsync::inference {

struct InferenceAgentFlags {
  std::string controller;        // HOST:PORT
  std::string secret_file;       // job secret ("" = $WSYNC_SECRET_FILE, else unsigned)
  std::string tls_ca_file;       // CA of a TLS controller ("" = $WSYNC_TLS_CA_FILE, else plain HTTP)
  int32_t rank = 0;
  std::string layout;            // wsync.inference/v1 file, or
  std::string cluster;           // cluster spec for the model generator
  std::string provider = "shm";  // libfabric provider
  uint32_t nics = 1;
  std::string node;              // local address to bind ("" = provider default)
  std::string job = "wsync";     // default shm name: /wsync-<job>-infer-<rank>
  std::string shm_name;          // overrides the default name
  bool attach = false;           // map an existing store instead of creating one
  bool keep_shm = false;         // leave a created store's name at exit (to --attach later)
  double version_timeout_s = 300;
  double plan_timeout_s = 0;     // 0: wait for the world until stopped
  int poll_ms = 100;             // how often the controller is asked for started versions
  bool verify_checksums = false; // check each version against the trainers' checksums before it is complete
  bool shadow = false;           // writes land in a private copy, copied into the store once complete
  bool deltas = false;           // a delta inbox beside each host region (InferenceAgentOptions::deltas)
  bool paced = false;            // engine-paced: weights change only when the engine asks (weight_store_format.h)
  // wsync.cuda_ipc/v1 file (cuda_ipc.h): the weights are the engine's CUDA
  // tensors, written in place; the store keeps the layout and version words.
  std::string cuda_ipc;
  // With cuda_ipc: "auto" (in place where libfabric can register CUDA
  // memory, else host staging), "on" (always staging), "off" (in place or
  // refuse). Host staging: the writes land in pinned host memory, copied
  // into the tensors once a version is complete everywhere.
  std::string staging = "auto";
};

// This rank's entry of the layout file or of the generated specs. One line
// naming the file and the rank on error.
StatusOr<InferenceRank> LoadInferenceRank(const InferenceAgentFlags& flags);

// Runs the agent until SIGTERM/SIGINT; returns the process exit code
// (0 after a signal, 1 with one line on stderr on error).
int RunInferenceAgentCommand(const InferenceAgentFlags& flags);

}  // namespace wsync::inference
