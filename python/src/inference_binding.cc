#include "python/src/inference_binding.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include <ATen/ATen.h>

#ifdef WSYNC_FP8_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "common/checksum_cuda.h"
#include "delta/codec_cuda.h"
#endif
#include "inference_agent/agent_runner.h"
#include "python/src/torch_device.h"
#include "routing/spec_io.h"
#include "transport/libfabric/libfabric_engine.h"

namespace wsync::python {

using Clock = std::chrono::steady_clock;

// ------------------------------------------------------- InProcessWeights --

std::string InProcessWeights::name() const {
  return std::to_string(regions_.size()) + " tensors of process " + std::to_string(getpid());
}

bool InProcessWeights::MarkComplete(uint64_t v) {
  std::lock_guard<std::mutex> lock(mu_);
  if (v < complete_.load(std::memory_order_relaxed)) return false;
  complete_.store(v, std::memory_order_release);
  cv_.notify_all();
  return true;
}

Status InProcessWeights::Read(const Region& r, uint64_t offset, uint64_t bytes, uint8_t* out) const {
  if (r.kind == transport::MemoryKind::kHost) return WeightMemory::Read(r, offset, bytes, out);
  if (offset > r.size || bytes > r.size - offset) return WeightMemory::Read(r, offset, bytes, out);  // its error
  try {
    const auto device = at::TensorOptions().dtype(at::kByte).device(c10::DeviceType::CUDA,
                                                                    static_cast<c10::DeviceIndex>(r.device));
    at::from_blob(out, {static_cast<int64_t>(bytes)}, at::TensorOptions().dtype(at::kByte))
        .copy_(at::from_blob(r.data + offset, {static_cast<int64_t>(bytes)}, device));
  } catch (const std::exception& e) {
    std::string m = e.what();
    m.resize(std::min(m.size(), m.find('\n')));
    return Internal(name() + ": reading region '" + r.id + "' back from cuda:" + std::to_string(r.device) + ": " + m);
  }
  return Status::Ok();
}

#ifdef WSYNC_FP8_CUDA
struct InProcessWeights::Hasher {
  Hasher(int d, c10::cuda::CUDAStream s) : device(d), stream(s) {}
  int device;
  c10::cuda::CUDAStream stream;
  DeviceChecksums sums;
};
#else
struct InProcessWeights::Hasher {};
#endif

Status InProcessWeights::Checksums(const std::vector<Range>& ranges, uint64_t* out) const {
#ifdef WSYNC_FP8_CUDA
  // The CUDA ranges (of one GPU, as an engine's tensors are) in one batch
  // on a stream of their own; host ranges as the base class does.
  std::vector<size_t> on_device;
  std::vector<Range> on_host;
  std::vector<size_t> host_at;
  int device = -1;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const Region& r = *ranges[i].region;
    if (r.kind == transport::MemoryKind::kHost) {
      on_host.push_back(ranges[i]);
      host_at.push_back(i);
      continue;
    }
    if (ranges[i].offset > r.size || ranges[i].bytes > r.size - ranges[i].offset || (device >= 0 && r.device != device))
      return WeightMemory::Checksums(ranges, out);  // its error, or several GPUs: read back
    device = r.device;
    on_device.push_back(i);
  }
  if (!on_device.empty()) {
    std::vector<ChecksumPiece> pieces;
    for (size_t i : on_device) pieces.push_back({ranges[i].region->data + ranges[i].offset, ranges[i].bytes});
    std::vector<uint64_t> got(pieces.size());
    try {
      std::lock_guard<std::mutex> lock(hash_mu_);
      c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
      if (hasher_ == nullptr || hasher_->device != device) {
        hasher_ = std::make_shared<Hasher>(device,
                                           c10::cuda::getStreamFromPool(false, static_cast<c10::DeviceIndex>(device)));
      }
      Status s = hasher_->sums.Compute(pieces.data(), pieces.size(), got.data(), hasher_->stream.stream());
      if (!s.ok()) return s.WithContext(name() + ": cuda:" + std::to_string(device));
    } catch (const std::exception& e) {
      std::string m = e.what();
      m.resize(std::min(m.size(), m.find('\n')));
      return Internal(name() + ": checksums on cuda:" + std::to_string(device) + ": " + m);
    }
    for (size_t k = 0; k < on_device.size(); ++k) out[on_device[k]] = got[k];
  }
  if (on_host.empty()) return Status::Ok();
  std::vector<uint64_t> host(on_host.size());
  WSYNC_RETURN_IF_ERROR(WeightMemory::Checksums(on_host, host.data()));
  for (size_t k = 0; k < host_at.size(); ++k) out[host_at[k]] = host[k];
  return Status::Ok();
#else
  return WeightMemory::Checksums(ranges, out);
#endif
}

#ifdef WSYNC_FP8_CUDA
struct InProcessWeights::Applier {
  Applier(int d, c10::cuda::CUDAStream s) : device(d), stream(s) {}
  int device;
  c10::cuda::CUDAStream stream;
  delta::CudaWorkspace ws;
};

StatusOr<uint8_t*> InProcessWeights::AllocateInbox(const Region& r, uint64_t bytes) {
  if (r.kind != transport::MemoryKind::kCuda) return WeightMemory::AllocateInbox(r, bytes);
  // An allocation of its own (not a block of torch's caching allocator):
  // registered with the engine for as long as the agent lives.
  const std::string where = name() + ": the delta inbox of region '" + r.id + "' on cuda:" + std::to_string(r.device);
  void* p = nullptr;
  cudaError_t e = cudaSetDevice(r.device);
  if (e == cudaSuccess) e = cudaMalloc(&p, bytes);
  if (e == cudaSuccess) e = cudaMemset(p, 0, bytes);  // no slot header before a trainer writes one
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    if (p != nullptr) (void)cudaFree(p);
    return ResourceExhausted(where + " (" + std::to_string(bytes) + " bytes): " + cudaGetErrorString(e));
  }
  return static_cast<uint8_t*>(p);
}

void InProcessWeights::FreeInbox(const Region& r, uint8_t* inbox) {
  if (cudaSetDevice(r.device) == cudaSuccess) (void)cudaFree(inbox);
}

Status InProcessWeights::ApplyDelta(const Region& r, const uint8_t* delta, uint64_t delta_bytes, uint8_t* target,
                                    uint64_t size, const char* what) const {
  if (r.kind != transport::MemoryKind::kCuda) return WeightMemory::ApplyDelta(r, delta, delta_bytes, target, size, what);
  try {
    std::lock_guard<std::mutex> lock(apply_mu_);
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(r.device));
    if (applier_ == nullptr || applier_->device != r.device) {
      applier_ = std::make_shared<Applier>(r.device,
                                           c10::cuda::getStreamFromPool(false, static_cast<c10::DeviceIndex>(r.device)));
    }
    return delta::ApplyCuda(delta, delta_bytes, target, size, what, applier_->ws, applier_->stream.stream());
  } catch (const std::exception& e) {
    std::string m = e.what();
    m.resize(std::min(m.size(), m.find('\n')));
    return Internal(name() + ": applying a delta on cuda:" + std::to_string(r.device) + ": " + m);
  }
}
#else
struct InProcessWeights::Applier {};

StatusOr<uint8_t*> InProcessWeights::AllocateInbox(const Region& r, uint64_t bytes) {
  return WeightMemory::AllocateInbox(r, bytes);
}
void InProcessWeights::FreeInbox(const Region&, uint8_t*) {}
Status InProcessWeights::ApplyDelta(const Region& r, const uint8_t* delta, uint64_t delta_bytes, uint8_t* target,
                                    uint64_t size, const char* what) const {
  return WeightMemory::ApplyDelta(r, delta, delta_bytes, target, size, what);
}
#endif

void InProcessWeights::MarkFailed(uint64_t v) {
  std::lock_guard<std::mutex> lock(mu_);
  if (v > failed_.load(std::memory_order_relaxed)) failed_.store(v, std::memory_order_release);
  cv_.notify_all();
}

void InProcessWeights::WaitFor(uint64_t v, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return stopped_ || complete_version() >= v || failed_version() >= v; });
}

void InProcessWeights::Stop() {
  std::lock_guard<std::mutex> lock(mu_);
  stopped_ = true;
  cv_.notify_all();
}

// ----------------------------------------------------------- TorchShadow --

// Shadow mode for an engine's own tensors: a shadow tensor beside each (on
// its device), or in pinned host memory for a GPU tensor (host staging),
// copied out on the current stream and waited for before the version word
// moves.
class TorchShadow : public inference::ShadowMemory {
 public:
  // Allocates the shadow of every region of `live`; `staging`: GPU
  // regions' shadows in pinned host memory.
  static StatusOr<std::unique_ptr<TorchShadow>> Create(const std::vector<inference::WeightMemory::Region>& live,
                                                       bool staging) {
    auto shadow = std::unique_ptr<TorchShadow>(new TorchShadow);
    Status s = Torch("allocating the shadow", [&] {
      // The pinned (staging) shadows are one allocation of their size.
      uint64_t pinned = 0;
      for (const inference::WeightMemory::Region& r : live) {
        if (staging && r.kind != transport::MemoryKind::kHost) pinned += (std::max<uint64_t>(r.size, 1) + 4095) / 4096 * 4096;
      }
      uint8_t* next_pinned = nullptr;
      if (pinned > 0) {
        StatusOr<std::unique_ptr<PinnedHostMemory>> m = PinnedHostMemory::Allocate(pinned);
        if (!m.ok()) throw std::runtime_error(m.status().message());
        shadow->pinned_ = std::move(m).value();
        next_pinned = shadow->pinned_->data();
      }
      for (const inference::WeightMemory::Region& r : live) {
        inference::WeightMemory::Region copy = r;
        if (staging && r.kind != transport::MemoryKind::kHost) {
          copy.data = next_pinned;
          copy.kind = transport::MemoryKind::kHost;
          next_pinned += (std::max<uint64_t>(r.size, 1) + 4095) / 4096 * 4096;
        } else {
          auto options = at::TensorOptions().dtype(at::kByte);
          if (r.kind != transport::MemoryKind::kHost) {
            options = options.device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(r.device));
          }
          shadow->tensors_.push_back(at::empty({static_cast<int64_t>(std::max<uint64_t>(r.size, 1))}, options));
          copy.data = static_cast<uint8_t*>(shadow->tensors_.back().data_ptr());
        }
        shadow->regions_.push_back(copy);
      }
    });
    if (!s.ok()) return s;
    return shadow;
  }
  const std::vector<inference::WeightMemory::Region>& regions() const override { return regions_; }
  Status CopyOut(const inference::WeightMemory::Region& from, const inference::WeightMemory::Region& to,
                 uint64_t offset, uint64_t bytes) override {
    if (to.kind == transport::MemoryKind::kHost) {
      std::memcpy(to.data + offset, from.data + offset, bytes);
      return Status::Ok();
    }
    return Torch("copy out of the shadow", [&] {
      // From pinned host memory (staging) the copy is asynchronous too.
      Bytes(to, offset, bytes).copy_(Bytes(from, offset, bytes), /*non_blocking=*/true);
      last_ = &to;
    });
  }
  Status Finish() override {
    if (last_ == nullptr) return Status::Ok();
    const inference::WeightMemory::Region* r = last_;
    last_ = nullptr;
    // A copy to the host waits for the stream, and so for every copy out before it.
    uint8_t byte = 0;
    return Torch("waiting for the copies out of the shadow", [&] {
      at::from_blob(&byte, {1}, at::TensorOptions().dtype(at::kByte)).copy_(Bytes(*r, 0, 1));
    });
  }

 private:
  TorchShadow() = default;
  static at::Tensor Bytes(const inference::WeightMemory::Region& r, uint64_t offset, uint64_t bytes) {
    auto options = at::TensorOptions().dtype(at::kByte);
    if (r.kind != transport::MemoryKind::kHost) {
      options = options.device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(r.device));
    }
    return at::from_blob(r.data + offset, {static_cast<int64_t>(bytes)}, options);
  }
  template <typename Fn>
  static Status Torch(const char* what, Fn&& fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      std::string m = e.what();
      m.resize(std::min(m.size(), m.find('\n')));
      return Internal(std::string(what) + ": " + m);
    }
    return Status::Ok();
  }

  std::vector<inference::WeightMemory::Region> regions_;
  std::vector<at::Tensor> tensors_;  // regions_' memory, kept alive
  std::unique_ptr<PinnedHostMemory> pinned_;  // the staging shadows
  const inference::WeightMemory::Region* last_ = nullptr;
};

// ------------------------------------------------------- InferenceSession --

StatusOr<std::unique_ptr<InferenceSession>> InferenceSession::Create(
    InferenceConfig config, std::vector<inference::WeightMemory::Region> regions) {
  // The strict loader checks the entry alone, numbered 0 (as the controller does).
  nlohmann::json alone = config.rank;
  const int32_t rank = alone.value("rank", -1);
  const std::string me = "inference rank " + std::to_string(rank);
  alone["rank"] = 0;
  StatusOr<InferenceSpec> spec =
      ParseInferenceSpec({{"schema", "wsync.inference/v1"}, {"ranks", {alone}}}, "wsync.InferenceAgent layout");
  if (!spec.ok()) return spec.status().WithContext(me);
  InferenceRank layout = spec->ranks[0];
  layout.rank = rank;

  controller::ClientOptions client_options;
  client_options.tls_ca_file = config.tls_ca_file;
  client_options.retry_for_s = std::chrono::duration<double>(config.timeout).count();
  WSYNC_ASSIGN_OR_RETURN(controller::ControllerClient client,
                         controller::ControllerClient::Connect(config.controller, config.secret_file,
                                                                              client_options));
  std::unique_ptr<InferenceSession> s(new InferenceSession(std::move(config), std::move(client)));

  transport::fabric::LibfabricOptions fabric;
  fabric.provider = s->config_.provider;
  fabric.num_nics = s->config_.nics;
  fabric.node = s->config_.node;
  StatusOr<transport::fabric::GpuMemory> want = transport::fabric::GpuMemoryForStaging(s->config_.staging);
  if (!want.ok()) return want.status().WithContext(me);
  const bool gpu = std::any_of(regions.begin(), regions.end(),
                               [](const auto& r) { return r.kind == transport::MemoryKind::kCuda; });
  std::unique_ptr<transport::Engine> engine;
  std::string why_staged;
  if (gpu) {
    StatusOr<transport::fabric::GpuEngine> made =
        transport::fabric::CreateLibfabricEngineForGpu(fabric, *want);
    if (!made.ok()) return made.status().WithContext(me + ": the tensors are in GPU memory");
    s->staged_ = !made->cuda_memory;
    why_staged = made->why_not;
    engine = std::move(made->engine);
  } else {
    StatusOr<std::unique_ptr<transport::Engine>> made = transport::fabric::CreateLibfabricEngine(fabric);
    if (!made.ok()) return made.status().WithContext(me + ": starting the transport");
    engine = std::move(made).value();
  }
  const auto log = [](const std::string& line) { std::fprintf(stderr, "wsync %s\n", line.c_str()); };
  if (s->staged_) {
    log(me + ": writes land in pinned host memory and are copied into the GPU tensors once a version landed on "
        "every rank (host staging: " + why_staged +
        "); the slower path: as much pinned host memory as the tensors, and one more copy of every byte");
  }

  if (s->config_.paced) {
    // With a shadow (or host staging, which is one) writes land apart from
    // the tensors whenever trainers push; without, only inside update().
    s->pacing_ = s->config_.shadow || s->staged_ ? Pacing::kShadow : Pacing::kLive;
    layout.pacing = s->pacing_;
    log(me + ": engine-paced (" + PacingName(s->pacing_) + "): the tensors change only inside update()" +
        (s->pacing_ == Pacing::kLive ? "; trainers' pushes wait for it" : "; pushes land in the shadow meanwhile"));
  }

  inference::InferenceAgentOptions agent_options;
  agent_options.log = log;
  agent_options.hold = s->config_.verify_checksums;
  agent_options.deltas = s->config_.deltas;
  if (s->config_.shadow || s->staged_) {
    StatusOr<std::unique_ptr<TorchShadow>> shadow = TorchShadow::Create(regions, s->staged_);
    if (!shadow.ok()) return shadow.status().WithContext(me);
    agent_options.shadow = std::move(shadow).value();
  }
  auto weights = std::make_unique<InProcessWeights>(std::move(regions));
  s->weights_ = weights.get();
  WSYNC_ASSIGN_OR_RETURN(s->agent_, inference::InferenceAgent::Create(std::move(engine), std::move(weights),
                                                                      std::move(layout), agent_options));

  if (s->pacing_ != Pacing::kPush)
    s->pacer_ = std::make_unique<inference::Pacer>(*s->agent_, s->client_, s->pacing_);

  inference::AgentRunnerOptions run;
  run.pacer = s->pacer_.get();
  run.version_timeout = s->config_.timeout;
  run.verify_checksums = s->config_.verify_checksums;
  run.log = agent_options.log;
  run.on_registered = [raw = s.get()] {
    std::lock_guard<std::mutex> lock(raw->mu_);
    raw->registered_ = true;
    raw->cv_.notify_all();
  };
  s->loop_ = std::thread([raw = s.get(), run] {
    Status st = inference::RunInferenceAgent(*raw->agent_, raw->client_, run, raw->stop_);
    std::lock_guard<std::mutex> lock(raw->mu_);
    raw->loop_status_ = st;
    raw->ended_ = true;
    raw->cv_.notify_all();
    raw->weights_->Stop();  // wakes wait_version()
  });
  std::unique_lock<std::mutex> lock(s->mu_);
  s->cv_.wait(lock, [&] { return s->registered_ || s->ended_; });
  if (!s->registered_) {
    Status st = s->loop_status_;
    lock.unlock();
    s->Close();
    return st;
  }
  return s;
}

InferenceSession::~InferenceSession() { Close(); }

Status InferenceSession::loop_status() {
  std::lock_guard<std::mutex> lock(mu_);
  return loop_status_;
}

Status InferenceSession::WaitVersion(uint64_t v, std::chrono::milliseconds timeout) {
  const std::string me = "inference rank " + std::to_string(agent_->rank().rank) + ": version " + std::to_string(v);
  weights_->WaitFor(v, timeout);
  if (weights_->complete_version() >= v) return Status::Ok();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ended_) {
      return loop_status_.ok() ? Aborted(me + ": the agent was closed")
                               : loop_status_.WithContext(me + ": the agent stopped");
    }
  }
  if (weights_->failed_version() < v) {
    return DeadlineExceeded(me + " not complete after " + std::to_string(timeout.count()) + " ms (complete: " +
                            std::to_string(weights_->complete_version()) + ")");
  }
  // Failed: say who failed it, as the controller recorded.
  std::string why;
  StatusOr<controller::VersionStatus> state = client_.GetVersion(v);
  if (state.ok()) {
    for (const controller::VersionFailure& f : state->failures) {
      why += (why.empty() ? "" : "; ") + f.role + " rank " + std::to_string(f.rank) + ": " + f.error;
    }
  }
  return Aborted(me + " failed" + (why.empty() ? std::string() : ": " + why) +
                 (agent_->shadowed() ? "; the tensors stay at version " + std::to_string(weights_->complete_version()) +
                                           " (shadow mode)"
                                     : "; the weights are a mix of versions until the next complete one"));
}

Status InferenceSession::Verify(uint64_t v, std::chrono::milliseconds timeout) {
  if (v == 0) v = weights_->complete_version();
  if (v == 0) return FailedPrecondition("inference rank " + std::to_string(agent_->rank().rank) + ": no complete version to verify");
  StatusOr<std::vector<WriteChecksum>> want = client_.FetchChecksums(v, agent_->rank().rank, Clock::now() + timeout);
  if (!want.ok()) return want.status();
  return agent_->Verify(v, *want, /*landed=*/false);  // the engine's tensors
}

StatusOr<inference::UpdateReport> InferenceSession::Update(std::optional<uint64_t> version,
                                                          std::chrono::milliseconds timeout) {
  const std::string me = "inference rank " + std::to_string(agent_->rank().rank);
  if (pacer_ == nullptr)
    return FailedPrecondition(me + ": update() needs an engine-paced agent (InferenceAgent(paced=True)); this one's "
                              "tensors change whenever trainers push: use wait_version()");
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ended_) return loop_status_.ok() ? Aborted(me + ": update(): the agent was closed")
                                         : loop_status_.WithContext(me + ": update(): the agent stopped");
  }
  const Clock::time_point deadline =
      timeout.count() >= 1000LL * 1000 * 1000 * 1000 ? Clock::time_point::max() : Clock::now() + timeout;
  return pacer_->Update(version, deadline);
}

void InferenceSession::Close() {
  stop_.store(true, std::memory_order_release);
  if (loop_.joinable()) loop_.join();
  pacer_.reset();
  agent_.reset();  // deregisters, then stops the engine
}

}  // namespace wsync::python
