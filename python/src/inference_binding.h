// The in-process inference route (wsync.InferenceAgent): an engine's own
// tensors registered in place with the transport, and the passive agent's
// controller loop on a thread of its own.
//
// The engine's process keeps using its tensors; trainers write into their
// storage with one-sided writes, and only once every write of version v has
// landed does complete_version() become v (release store; the Python side
// reads it with an acquire load through this class). Nothing here touches
// Python: the binding layer releases the GIL around the blocking calls.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "controller/client.h"
#include "inference_agent/agent.h"
#include "inference_agent/pacer.h"
#include "inference_agent/weight_memory.h"

namespace wsync::python {

struct InferenceConfig {
  nlohmann::json rank;  // this rank's wsync.inference/v1 entry (regions: one per tensor)
  std::string controller;
  std::string secret_file;  // job secret ("": $WSYNC_SECRET_FILE, else unsigned)
  std::string tls_ca_file;  // CA of a TLS controller ("": $WSYNC_TLS_CA_FILE, else plain HTTP)
  std::string provider = "shm";
  uint32_t nics = 1;
  std::string node;
  std::chrono::milliseconds timeout{300000};  // registration; each version
  // Hold each landed version until checked against the trainers' checksums
  // (AgentRunnerOptions::verify_checksums).
  bool verify_checksums = false;
  // A delta inbox beside each host region (InferenceAgentOptions::deltas).
  bool deltas = false;
  // Engine-paced (InferenceAgent(paced=True)): the tensors change only inside
  // Update(); live without a shadow, shadow with one (or with host staging).
  bool paced = false;
  // Shadow mode: the writes land in a copy of every tensor (allocated here,
  // beside each), copied in once the version landed on every rank.
  bool shadow = false;
  // GPU tensors: "auto" registers them in place where the transport can
  // (FI_HMEM) and otherwise lands the writes in pinned host memory, copied
  // host-to-device once the version landed everywhere (a shadow in host
  // memory); "on" always stages, "off" refuses a transport without FI_HMEM.
  std::string staging = "auto";
};

// Version words in this process, waited on by wait_version().
class InProcessWeights : public inference::WeightMemory {
 public:
  explicit InProcessWeights(std::vector<Region> regions) : regions_(std::move(regions)) {}
  std::string name() const override;
  const std::vector<Region>& regions() const override { return regions_; }
  uint64_t complete_version() const override { return complete_.load(std::memory_order_acquire); }
  uint64_t failed_version() const override { return failed_.load(std::memory_order_acquire); }
  bool MarkComplete(uint64_t v) override;
  void MarkFailed(uint64_t v) override;
  // The engine is this process: an agent killed mid-copy takes it along.
  void MarkCommitting(uint64_t) override {}
  // wait_version() must hear that v failed; its message says the tensors stayed.
  void MarkNotApplied(uint64_t v) override { MarkFailed(v); }
  // CUDA tensors are read back through ATen on their device.
  Status Read(const Region& r, uint64_t offset, uint64_t bytes, uint8_t* out) const override;
  // CUDA tensors are hashed where they are, by common/checksum_cuda.h's
  // kernels (where the extension is built with the CUDA toolkit; else read
  // back as Read does).
  Status Checksums(const std::vector<Range>& ranges, uint64_t* out) const override;
  // Delta versions: a CUDA tensor's inbox is a cudaMalloc of its own on the
  // tensor's GPU, and deltas are applied there by delta/codec_cuda.h's
  // kernels on a stream of their own (where the extension is built with the
  // CUDA toolkit; else Unimplemented, and CUDA tensors take full writes).
  StatusOr<uint8_t*> AllocateInbox(const Region& r, uint64_t bytes) override;
  void FreeInbox(const Region& r, uint8_t* inbox) override;
  Status ApplyDelta(const Region& r, const uint8_t* delta, uint64_t delta_bytes, uint8_t* target, uint64_t size,
                    const char* what) const override;
  // Until complete_version() or failed_version() reaches v, Stop(), or
  // timeout.
  void WaitFor(uint64_t v, std::chrono::milliseconds timeout);
  // No version will complete any more (the agent's loop ended).
  void Stop();

 private:
  std::vector<Region> regions_;
  std::atomic<uint64_t> complete_{0};  // 0: none (versions start at 1)
  std::atomic<uint64_t> failed_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopped_ = false;  // guarded by mu_
  struct Hasher;  // the kernels' buffers and stream, made on first use
  mutable std::mutex hash_mu_;
  mutable std::shared_ptr<Hasher> hasher_;  // guarded by hash_mu_
  struct Applier;  // the delta kernels' workspace and stream, made on first use
  mutable std::mutex apply_mu_;
  mutable std::shared_ptr<Applier> applier_;  // guarded by apply_mu_
};

class InferenceSession {
 public:
  // Registers the regions (or their shadows) with a new engine and then
  // with the controller; returns once the controller accepted the layout
  // (the plan comes later, when every rank is there).
  static StatusOr<std::unique_ptr<InferenceSession>> Create(InferenceConfig config,
                                                            std::vector<inference::WeightMemory::Region> regions);
  // Whether the writes land in pinned host memory (host staging).
  bool staged() const { return staged_; }
  ~InferenceSession();  // Close()

  // Blocks until version v is complete here (OK), failed (the failure, with
  // the controller's account of it when it has one), or timeout.
  Status WaitVersion(uint64_t v, std::chrono::milliseconds timeout);
  uint64_t complete_version() const { return weights_->complete_version(); }
  uint64_t failed_version() const { return weights_->failed_version(); }
  // On request: this rank's tensors against the trainers' checksums of
  // version v (default: the complete one), waiting up to `timeout` for the
  // trainers' reports. DataLoss naming the first differing tensor.
  Status Verify(uint64_t v, std::chrono::milliseconds timeout);
  // Engine-paced: inference::Pacer::Update (FailedPrecondition unless paced).
  StatusOr<inference::UpdateReport> Update(std::optional<uint64_t> version, std::chrono::milliseconds timeout);
  std::string pacing() const { return PacingName(pacing_); }
  // Why the agent's loop ended, if it did (OK while it runs).
  Status loop_status();
  void Close();

 private:
  InferenceSession(InferenceConfig config, controller::ControllerClient client)
      : config_(std::move(config)), client_(std::move(client)) {}

  InferenceConfig config_;
  controller::ControllerClient client_;
  bool staged_ = false;
  InProcessWeights* weights_ = nullptr;  // owned by agent_
  std::unique_ptr<inference::InferenceAgent> agent_;
  Pacing pacing_ = Pacing::kPush;
  std::unique_ptr<inference::Pacer> pacer_;  // engine-paced only; uses agent_ and client_
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  bool registered_ = false;  // guarded by mu_
  bool ended_ = false;       // guarded by mu_
  Status loop_status_;       // guarded by mu_
  std::thread loop_;
};

}  // namespace wsync::python
