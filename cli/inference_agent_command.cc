// `wsync inference-agent`: flags only; the command itself is
// inference_agent/agent_command.h (shared with the tests).
#include <CLI/CLI.hpp>

#include "inference_agent/agent_command.h"

namespace wsync::cli {

void AddInferenceAgentCommand(CLI::App& app) {
  auto flags = std::make_shared<inference::InferenceAgentFlags>();
  CLI::App* cmd = app.add_subcommand(
      "inference-agent",
      "Hold one inference rank's weights in shared memory, register them for RDMA writes, and mark each "
      "version complete only once every write of it landed. Runs until SIGTERM/SIGINT; prints \"ready\" once "
      "registered.");
  cmd->add_option("--controller", flags->controller, "controller address HOST:PORT")->required();
  cmd->add_option("--secret-file", flags->secret_file,
                  "the job secret the controller was started with (default: $WSYNC_SECRET_FILE)");
  cmd->add_option("--tls-ca", flags->tls_ca_file,
                  "TLS: the CA that signed the controller's --tls-cert (default: $WSYNC_TLS_CA_FILE; none: plain HTTP)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--rank", flags->rank, "inference rank")->required();
  auto* layout = cmd->add_option("--layout", flags->layout, "wsync.inference/v1 file; this rank's entry is used");
  auto* cluster = cmd->add_option("--cluster", flags->cluster,
                                  "cluster spec: generate the inference layout from the model (instead of --layout)");
  layout->excludes(cluster);
  cmd->add_option("--provider", flags->provider, "libfabric provider: shm, tcp;ofi_rxm, verbs;ofi_rxm, efa")
      ->capture_default_str();
  cmd->add_option("--nics", flags->nics, "NICs (endpoints) per rank; every trainer must use the same count")
      ->capture_default_str();
  cmd->add_option("--node", flags->node, "local address to bind (e.g. this host's IP for tcp)");
  cmd->add_option("--job", flags->job, "job name for the default shared-memory name /wsync-<job>-infer-<rank>")
      ->capture_default_str();
  cmd->add_option("--shm-name", flags->shm_name, "shared-memory name of the weight store (overrides --job)");
  cmd->add_flag("--attach", flags->attach, "map an existing weight store (same layout) instead of creating one");
  cmd->add_flag("--keep-shm", flags->keep_shm, "leave the weight store in place at exit, for a later --attach");
  cmd->add_option("--version-timeout", flags->version_timeout_s,
                  "seconds one version may take before it is reported failed")
      ->capture_default_str();
  cmd->add_option("--plan-timeout", flags->plan_timeout_s,
                  "seconds to wait for every rank to register (0: until stopped)")
      ->capture_default_str();
  cmd->add_option("--poll-ms", flags->poll_ms,
                  "started versions come by a long poll; this is the pause after a failed poll, and the poll interval "
                  "against a controller without the long poll, ms")
      ->capture_default_str();
  cmd->add_flag("--verify-checksums", flags->verify_checksums,
                "before a version is complete here, hash what landed and compare with the trainers' checksums "
                "(trainers run with --checksums); a mismatch fails the version, naming the tensor");
  cmd->add_option("--cuda-ipc", flags->cuda_ipc,
                  "wsync.cuda_ipc/v1 file from the engine (wsync.export_cuda_ipc): its CUDA tensors are written in "
                  "place where libfabric can register CUDA memory (FI_HMEM); the shared-memory store keeps the layout "
                  "and version words");
  cmd->add_option("--staging", flags->staging,
                  "with --cuda-ipc: auto (in place where libfabric can register GPU memory, else through pinned "
                  "host memory, copied into the tensors once a version landed everywhere), on (always through host "
                  "memory), off (in place or refuse)")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  cmd->add_flag("--shadow", flags->shadow,
                "shadow mode: writes land in a private copy of the weights (as much memory again), copied into "
                "the store only once a version is complete on every rank, so a failed version leaves the last "
                "complete one intact");
  cmd->add_flag("--delta", flags->deltas,
                "take delta versions (docs/DELTAS.md): an inbox of a third of the weights' size beside "
                "them (GPU memory beside --cuda-ipc tensors, applied there by a kernel), where trainers running with --delta write only what changed; applied here before a version is "
                "complete. The controller decides which versions go as deltas (--full-every)");
  cmd->add_flag("--paced", flags->paced,
                "engine-paced: the weights change only when the engine asks (StoreVersions.update() in Python, "
                "the store's update words); without --shadow trainers write only while it asks, with --shadow "
                "they write into the shadow whenever they push and the ask copies the newest complete version in");
  cmd->callback([flags] {
    const int rc = inference::RunInferenceAgentCommand(*flags);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace wsync::cli
