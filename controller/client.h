// Typed calls to the controller's HTTP API (docs/CONTROL_PLANE.md), for the
// trainer and inference agents, the Gloo store over HTTP and tests.
//
// Every call opens its own connection, so one ControllerClient may be shared
// by threads. A refused connection (controller not up yet, or restarting),
// or a 503 with Retry-After (the controller at its connection cap, before it
// read the request) is retried until `retry_for_s` passes; other transport
// errors are returned at
// once as Unavailable. Controller answers become Status codes:
// 400 InvalidArgument, 401 Unauthenticated, 404 NotFound, 409
// FailedPrecondition, 413 ResourceExhausted, 503 Unavailable/Aborted, 504
// DeadlineExceeded; the message is the controller's one line.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/checksum.h"
#include "common/status.h"
#include "controller/auth.h"
#include "controller/role.h"
#include "routing/metadata.h"
#include "routing/rank_plan.h"

namespace wsync::controller {

struct ClientOptions {
  double connect_timeout_s = 2;   // per connection attempt
  double request_timeout_s = 30;  // per request, on top of any long-poll wait
  double retry_for_s = 30;        // keep retrying refused connections this long
  // Signs every request (controller/auth.h); none: unsigned, for a
  // controller started without a secret.
  std::optional<JobSecret> secret;
  // TLS: the CA certificate (PEM) that signed the controller's certificate;
  // the controller's name (its address' host) must be in it. Empty: plain
  // HTTP. Connect() takes $WSYNC_TLS_CA_FILE when this is empty.
  std::string tls_ca_file;
};

// The environment variable naming the CA file of a TLS controller.
inline constexpr const char* kTlsCaFileEnv = "WSYNC_TLS_CA_FILE";

struct VersionFailure {
  std::string role;
  int32_t rank = -1;
  std::string error;
};

// A version as the controller reports it.
struct VersionStatus {
  uint64_t version = 0;
  std::string state;  // "started", "complete", "failed"
  std::vector<int32_t> trainer_done;
  std::vector<int32_t> inference_done;
  std::vector<VersionFailure> failures;
  double seconds = 0;  // start to finish, once finished
  nlohmann::json raw;

  bool landed = false;  // every inference rank done (shadow ranks copy it out next)
  bool admitted = false;  // trainers may write it (every engine-paced rank let it in)
  // Delta versions: the inference ranks that take only what changed since
  // `delta_base` (empty: every write goes whole).
  uint64_t delta_base = 0;
  std::vector<int32_t> delta_ranks;
  bool complete() const { return state == "complete"; }
  bool failed() const { return state == "failed"; }
  bool finished() const { return complete() || failed(); }
};

struct TrainerPlanSlice {
  std::string plan_id;
  uint64_t epoch = 0;  // registration epoch of its descriptors (0: a controller before epochs)
  TrainerRankPlan plan;
  nlohmann::json raw;
};

struct InferencePlanSlice {
  std::string plan_id;
  uint64_t expected_writes = 0;  // immediates per version
  uint64_t expected_bytes = 0;
  InferenceRankPlan plan;
  nlohmann::json raw;
};

class ControllerClient {
 public:
  using Clock = std::chrono::steady_clock;

  ControllerClient(std::string host, int port, ClientOptions options = {});
  // "host:port".
  static StatusOr<ControllerClient> FromAddress(const std::string& address, ClientOptions options = {});
  // FromAddress, signing with the job secret of `secret_file`, else of
  // $WSYNC_SECRET_FILE, else unsigned (controller/auth.h: LoadJobSecret).
  static StatusOr<ControllerClient> Connect(const std::string& address, const std::string& secret_file,
                                            ClientOptions options = {});

  // Registration; the answer is the controller's registration reply.
  StatusOr<nlohmann::json> RegisterTrainer(const TrainerRank& rank,
                                           const std::vector<MeshGroupSpec>& mesh_groups);
  StatusOr<nlohmann::json> RegisterTrainerJson(const nlohmann::json& body);
  StatusOr<nlohmann::json> RegisterInference(const InferenceRank& rank);
  StatusOr<nlohmann::json> RegisterInferenceJson(const nlohmann::json& body);
  // A body already serialized (what RegisterTrainerJson/RegisterInferenceJson
  // send); the controller checks it like any other.
  StatusOr<nlohmann::json> RegisterText(Role role, const std::string& body);

  // Polls until the world is planned or `deadline` passes (then
  // DeadlineExceeded naming the missing ranks).
  StatusOr<nlohmann::json> FetchPlan(Role role, int32_t rank, Clock::time_point deadline);
  // The slice as the controller wrote it (ParseTrainerPlanSlice and
  // ParseInferencePlanSlice read it).
  StatusOr<std::string> FetchPlanText(Role role, int32_t rank, Clock::time_point deadline);
  StatusOr<TrainerPlanSlice> FetchTrainerPlan(int32_t rank, Clock::time_point deadline);
  StatusOr<InferencePlanSlice> FetchInferencePlan(int32_t rank, Clock::time_point deadline);

  // Gloo rendezvous store. KvGet waits up to `timeout` for the key
  // (NotFound after); longer timeouts are split into several long polls.
  Status KvSet(const std::string& key, const std::string& value);
  StatusOr<std::string> KvGet(const std::string& key, std::chrono::milliseconds timeout);
  StatusOr<int64_t> KvAdd(const std::string& key, int64_t delta);

  // Versions.
  // `epoch`: the trainer's plan slice's (TrainerPlanSlice::epoch); a stale
  // one is refused (FailedPrecondition starting with kStaleEpochPrefix).
  StatusOr<VersionStatus> StartVersion(uint64_t version, int32_t trainer_rank, uint64_t epoch = 0);
  // `result` OK: reads done and writes posted; else the version fails with
  // its message.
  // `stats`: the executor's report (stage seconds, bytes, peak temporary memory).
  StatusOr<VersionStatus> ReportTrainerDone(uint64_t version, int32_t rank, const Status& result,
                                            const nlohmann::json& stats = nullptr);
  // `result` OK: every expected immediate of `version` landed on this rank.
  // `commit`: in shadow mode; ReportCommitted once it is copied out.
  // `stats`: what the rank did at commit (deltas applied, their time).
  StatusOr<VersionStatus> ReportInferenceDone(uint64_t version, int32_t rank, const Status& result,
                                              bool commit = false, const nlohmann::json& stats = nullptr);
  StatusOr<VersionStatus> ReportCommitted(uint64_t version, int32_t rank);
  StatusOr<VersionStatus> ReportFailure(uint64_t version, Role role, int32_t rank, const std::string& error);
  StatusOr<VersionStatus> GetVersion(uint64_t version);
  // What the trainers hashed of every write inference rank `rank` receives
  // in `version` (GET /v1/versions/<v>/checksums), once all of them have
  // reported done, waiting until `deadline` for that (then DeadlineExceeded
  // naming the trainer ranks still out). FailedPrecondition when the version
  // failed or a trainer runs without checksums.
  StatusOr<std::vector<WriteChecksum>> FetchChecksums(uint64_t version, int32_t rank, Clock::time_point deadline);
  // Until the version is complete or failed (returned as a VersionStatus,
  // check failed()), or `deadline` (DeadlineExceeded). A version not yet
  // started is waited for too.
  StatusOr<VersionStatus> WaitVersion(uint64_t version, Clock::time_point deadline);
  // The same, also answering once the version has landed (every inference
  // rank done; shadow ranks then copy it out): check `landed`. NotFound at
  // once for a version the controller does not know.
  StatusOr<VersionStatus> WaitVersionLanded(uint64_t version, Clock::time_point deadline);
  // The same, also answering once trainers may write the version (every
  // engine-paced inference rank let it in): check `admitted`. NotFound at
  // once for a version the controller does not know (its caller started it:
  // the controller lost it, e.g. a restart).
  StatusOr<VersionStatus> WaitVersionAdmitted(uint64_t version, Clock::time_point deadline);

  // An engine-paced inference rank moves its gate (POST /v1/gate): "open",
  // "newest", "upto" (with `version`) or "close". The answer: {"rank",
  // "pacing", "open", "upto", "admitted", "admitted_running", "newest"}.
  StatusOr<nlohmann::json> Gate(int32_t rank, const std::string& move, uint64_t version = 0);

  // Liveness: once a rank has sent one, the controller expects one at least
  // every heartbeat_timeout_s (default 10 s) and otherwise fails the
  // versions it has not finished, naming it. Not retried.
  Status Heartbeat(Role role, int32_t rank);

  StatusOr<nlohmann::json> GetStatus();
  // Waits up to `wait` for `since` (a `versions_fingerprint`) to change.
  StatusOr<nlohmann::json> GetStatus(const std::string& since, std::chrono::milliseconds wait);
  StatusOr<std::string> GetMetrics();
  bool Healthy();

  std::string address() const { return host_ + ":" + std::to_string(port_); }

 private:
  struct Reply {
    int status = 0;
    std::string body;
  };
  // One request with retries on refused connections. `extra_wait` is added
  // to the read timeout for long polls.
  StatusOr<Reply> Send(const std::string& method, const std::string& path, const std::string& body,
                       const std::string& content_type, std::chrono::milliseconds extra_wait);
  // Send + JSON answer; non-200 answers become Status.
  StatusOr<nlohmann::json> SendJson(const std::string& method, const std::string& path,
                                    const nlohmann::json& body,
                                    std::chrono::milliseconds extra_wait = std::chrono::milliseconds(0));
  StatusOr<nlohmann::json> SendText(const std::string& method, const std::string& path, const std::string& body,
                                    std::chrono::milliseconds extra_wait);
  StatusOr<nlohmann::json> AnswerJson(const std::string& method, const std::string& path, const Reply& reply) const;
  Status ErrorFrom(const std::string& method, const std::string& path, const Reply& reply) const;
  StatusOr<VersionStatus> VersionCall(uint64_t version, const std::string& action, const nlohmann::json& body);
  enum class Until { kFinished, kLanded, kAdmitted };
  StatusOr<VersionStatus> WaitVersionUntil(uint64_t version, Clock::time_point deadline, Until until);

  std::string host_;
  int port_;
  ClientOptions options_;
};

StatusOr<VersionStatus> ParseVersionStatus(const nlohmann::json& j);

// The registration bodies RegisterTrainer and RegisterInference send.
std::string TrainerRegistrationText(const TrainerRank& rank, const std::vector<MeshGroupSpec>& mesh_groups);
std::string InferenceRegistrationText(const InferenceRank& rank);

// A plan slice as GET /v1/plan answers it (the text of FetchPlanText).
StatusOr<TrainerPlanSlice> ParseTrainerPlanSlice(const std::string& text);
StatusOr<InferencePlanSlice> ParseInferencePlanSlice(const std::string& text);

// "host:port" -> (host, port); port 0..65535.
StatusOr<std::pair<std::string, int>> ParseHostPort(const std::string& address);

// Sends a heartbeat for (role, rank) every `interval` from its own thread
// until destroyed. Failed beats are ignored: the controller may be
// restarting, and a dead link is exactly what the timeout detects.
class HeartbeatSender {
 public:
  HeartbeatSender(ControllerClient client, Role role, int32_t rank,
                  std::chrono::milliseconds interval = std::chrono::milliseconds(1000));
  ~HeartbeatSender();
  HeartbeatSender(const HeartbeatSender&) = delete;
  HeartbeatSender& operator=(const HeartbeatSender&) = delete;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // guarded by mu_
  std::thread thread_;
};

}  // namespace wsync::controller
