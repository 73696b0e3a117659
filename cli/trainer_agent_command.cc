// `wsync trainer-agent`: flags only; the command itself is
// trainer_agent/agent_command.h (shared with the tests).
#include <CLI/CLI.hpp>

#include "trainer_agent/agent_command.h"

namespace wsync::cli {

void AddTrainerAgentCommand(CLI::App& app) {
  auto flags = std::make_shared<trainer_agent::TrainerAgentFlags>();
  CLI::App* cmd = app.add_subcommand(
      "trainer-agent",
      "Sidecar of one trainer rank: read its shards from the trainer's shared-memory export and, for every "
      "version the trainer publishes, all-gather, fuse, quantize and write them into the inference ranks "
      "(RDMA) under a memory watermark. Runs until SIGTERM/SIGINT; prints \"ready\" once registered and "
      "each version's stage times on stderr.");
  cmd->add_option("--controller", flags->controller, "controller address HOST:PORT")->required();
  cmd->add_option("--secret-file", flags->secret_file,
                  "the job secret the controller was started with (default: $WSYNC_SECRET_FILE)");
  cmd->add_option("--tls-ca", flags->tls_ca_file,
                  "TLS: the CA that signed the controller's --tls-cert (default: $WSYNC_TLS_CA_FILE; none: plain HTTP)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--rank", flags->rank, "trainer rank")->required();
  auto* layout = cmd->add_option("--layout", flags->layout, "wsync.trainer/v1 file; this rank's entry is used");
  auto* cluster = cmd->add_option("--cluster", flags->cluster,
                                  "cluster spec: generate the trainer layout from the model (instead of --layout)");
  layout->excludes(cluster);
  cmd->add_option("--job", flags->job, "job name for the default shared-memory name /wsync-<job>-train-<rank>")
      ->capture_default_str();
  cmd->add_option("--shm-name", flags->shm_name, "shared-memory name of the trainer's shard export (overrides --job)");
  cmd->add_option("--provider", flags->provider, "libfabric provider: shm, tcp;ofi_rxm, verbs;ofi_rxm, efa")
      ->capture_default_str();
  cmd->add_option("--nics", flags->nics, "NICs (endpoints) per rank; every inference rank must use the same count")
      ->capture_default_str();
  cmd->add_option("--node", flags->node, "local address to bind the transport to (e.g. this host's IP for tcp)");
  cmd->add_option("--watermark", flags->watermark,
                  "bound on temporary memory in flight, bytes (suffixes KiB/MiB/GiB or KB/MB/GB accepted)")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  cmd->add_flag("--delta", flags->deltas,
                "delta versions (docs/DELTAS.md): keep a copy of what each write last sent (counted against "
                "--watermark) and, for inference agents started with --delta, send only what changed where the "
                "controller says their weights hold the version it was computed against");
  cmd->add_flag("--checksums", flags->checksums,
                "send the controller a checksum of every write, for the inference agents' --verify-checksums "
                "(a pass over the written bytes per version)");
  cmd->add_option("--gloo-host", flags->gloo_host, "address the other trainer ranks reach this rank's Gloo at")
      ->capture_default_str();
  cmd->add_option("--gloo-iface", flags->gloo_iface, "network interface for Gloo (instead of --gloo-host)");
  cmd->add_option("--gloo-timeout", flags->gloo_timeout_s,
                  "seconds a rendezvous or collective waits for a peer before the version fails")
      ->capture_default_str();
  cmd->add_option("--plan-timeout", flags->plan_timeout_s,
                  "seconds to wait for every rank to register (0: until stopped)")
      ->capture_default_str();
  cmd->add_option("--shm-timeout", flags->shm_timeout_s,
                  "seconds to wait for the trainer to export its shards (0: until stopped)")
      ->capture_default_str();
  cmd->add_option("--cuda-ipc", flags->cuda_ipc,
                  "wsync.cuda_ipc/v1 file from the trainer (wsync.export_shards of shards on a GPU): the shards are "
                  "read in place on that GPU and the pipeline runs there");
  cmd->add_option("--staging", flags->staging,
                  "with --cuda-ipc: auto (writes straight from GPU memory where libfabric can register it, else "
                  "through pinned host memory), on (always through host memory), off (directly or refuse)")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  cmd->callback([flags] {
    const int rc = trainer_agent::RunTrainerAgentCommand(*flags);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace wsync::cli
