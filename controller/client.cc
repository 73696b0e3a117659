#include "controller/client.h"

#include <httplib.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "routing/spec_io.h"

namespace wsync::controller {

using nlohmann::json;
using std::chrono::milliseconds;

namespace {

// Longest single long poll; longer waits are split so a lost connection
// costs at most this much.
constexpr milliseconds kPollSlice(10000);

std::string EscapeKey(const std::string& key) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : key) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || c == '/') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

StatusCode CodeFor(int http) {
  switch (http) {
    case 400: return StatusCode::kInvalidArgument;
    case 401: return StatusCode::kUnauthenticated;
    case 404: return StatusCode::kNotFound;
    case 413: return StatusCode::kResourceExhausted;
    case 409: return StatusCode::kFailedPrecondition;
    case 503: return StatusCode::kUnavailable;
    case 504: return StatusCode::kDeadlineExceeded;
    default: return StatusCode::kInternal;
  }
}

milliseconds Remaining(ControllerClient::Clock::time_point deadline) {
  return std::max(milliseconds(0),
                  std::chrono::duration_cast<milliseconds>(deadline - ControllerClient::Clock::now()));
}

}  // namespace

StatusOr<std::pair<std::string, int>> ParseHostPort(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size())
    return InvalidArgument("address '" + address + "' is not HOST:PORT (e.g. 127.0.0.1:7070)");
  const std::string port_text = address.substr(colon + 1);
  char* end = nullptr;
  const long port = std::strtol(port_text.c_str(), &end, 10);
  if (*end != '\0' || port < 0 || port > 65535)
    return InvalidArgument("address '" + address + "': port '" + port_text + "' is not 0..65535");
  return std::make_pair(address.substr(0, colon), static_cast<int>(port));
}

ControllerClient::ControllerClient(std::string host, int port, ClientOptions options)
    : host_(std::move(host)), port_(port), options_(options) {}

StatusOr<ControllerClient> ControllerClient::FromAddress(const std::string& address, ClientOptions options) {
  WSYNC_ASSIGN_OR_RETURN(auto hp, ParseHostPort(address));
  if (hp.second == 0) return InvalidArgument("controller address '" + address + "' needs a port");
  return ControllerClient(hp.first, hp.second, options);
}

StatusOr<ControllerClient> ControllerClient::Connect(const std::string& address, const std::string& secret_file,
                                                     ClientOptions options) {
  WSYNC_ASSIGN_OR_RETURN(std::optional<JobSecret> secret, LoadJobSecret(secret_file));
  options.secret = std::move(secret);
  if (options.tls_ca_file.empty()) {
    const char* ca = std::getenv(kTlsCaFileEnv);
    if (ca != nullptr) options.tls_ca_file = ca;
  }
  return FromAddress(address, std::move(options));
}

StatusOr<ControllerClient::Reply> ControllerClient::Send(const std::string& method, const std::string& path,
                                                         const std::string& body,
                                                         const std::string& content_type,
                                                         milliseconds extra_wait) {
  const Clock::time_point give_up =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options_.retry_for_s));
  milliseconds backoff(20);
  while (true) {
    std::unique_ptr<httplib::ClientImpl> made;
    if (options_.tls_ca_file.empty()) {
      made = std::make_unique<httplib::ClientImpl>(host_, port_);
    } else {
      auto tls = std::make_unique<httplib::SSLClient>(host_, port_);
      tls->set_ca_cert_path(options_.tls_ca_file.c_str());
      tls->enable_server_certificate_verification(true);
      made = std::move(tls);
    }
    httplib::ClientImpl& cli = *made;
    cli.set_connection_timeout(std::chrono::duration<double>(options_.connect_timeout_s));
    cli.set_read_timeout(std::chrono::duration<double>(options_.request_timeout_s) + extra_wait);
    cli.set_write_timeout(std::chrono::duration<double>(options_.request_timeout_s));
    // Signed afresh on every attempt: a retried request is a new request,
    // never a replay of the refused one.
    httplib::Headers headers;
    if (options_.secret.has_value()) {
      const RequestSignature sig = SignRequest(*options_.secret, method, path, body);
      headers = {{kTimestampHeader, sig.timestamp},
                 {kNonceHeader, sig.nonce},
                 {kSignatureHeader, sig.signature},
                 {kContentHashHeader, sig.content_sha256}};
    }
    httplib::Result r = method == "GET"   ? cli.Get(path, headers)
                        : method == "PUT" ? cli.Put(path, headers, body, content_type)
                                          : cli.Post(path, headers, body, content_type);
    // A server at its connection cap answers 503 with Retry-After before it
    // reads anything: the request never ran, so it is sent again.
    if (r && r->status == 503 && r->has_header("Retry-After") && Clock::now() + backoff < give_up) {
      std::this_thread::sleep_for(std::max(backoff, milliseconds(200)));
      backoff = std::min(backoff * 2, milliseconds(1000));
      continue;
    }
    if (r) return Reply{r->status, r->body};
    const httplib::Error err = r.error();
    if (err == httplib::Error::SSLServerVerification || err == httplib::Error::SSLConnection) {
      // Never retried: a certificate that does not verify will not start to.
      std::string why = httplib::to_string(err);
      if (!options_.tls_ca_file.empty() && made != nullptr) {
        const long v = static_cast<httplib::SSLClient&>(cli).get_openssl_verify_result();
        if (v != X509_V_OK) why += ": " + std::string(X509_verify_cert_error_string(v));
      }
      return Unavailable("controller " + address() + ": TLS: " + why +
                         (options_.tls_ca_file.empty() ? std::string(" (a plain-HTTP client of a TLS controller?)")
                                                       : " (CA file '" + options_.tls_ca_file + "')"));
    }
    // Refused or timed-out connects mean the request never arrived: safe to
    // send again, also for POSTs.
    const bool retry = err == httplib::Error::Connection || err == httplib::Error::ConnectionTimeout;
    if (!retry || Clock::now() + backoff >= give_up) {
      // A TLS server closes a plain-HTTP connection without an answer.
      const std::string hint = err == httplib::Error::Read && options_.tls_ca_file.empty()
                                   ? std::string(" (closed without an answer: a TLS controller? then pass --tls-ca or $") +
                                         kTlsCaFileEnv + ")"
                                   : "";
      return Unavailable("controller " + address() + ": " + method + " " + path + ": " +
                         httplib::to_string(err) + (retry ? " (gave up retrying)" : "") + hint);
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, milliseconds(1000));
  }
}

Status ControllerClient::ErrorFrom(const std::string& method, const std::string& path, const Reply& reply) const {
  json j = json::parse(reply.body, nullptr, false);
  std::string msg = !j.is_discarded() && j.is_object() && j.value("error", json()).is_string()
                        ? j["error"].get<std::string>()
                        : "HTTP " + std::to_string(reply.status) + " " + reply.body;
  return Status(CodeFor(reply.status), msg);
}

StatusOr<json> ControllerClient::SendJson(const std::string& method, const std::string& path, const json& body,
                                          milliseconds extra_wait) {
  return SendText(method, path, body.is_null() ? "" : body.dump(), extra_wait);
}

StatusOr<json> ControllerClient::SendText(const std::string& method, const std::string& path,
                                          const std::string& body, milliseconds extra_wait) {
  WSYNC_ASSIGN_OR_RETURN(Reply reply, Send(method, path, body, "application/json", extra_wait));
  return AnswerJson(method, path, reply);
}

StatusOr<json> ControllerClient::AnswerJson(const std::string& method, const std::string& path,
                                            const Reply& reply) const {
  if (reply.status != 200) return ErrorFrom(method, path, reply);
  json j = json::parse(reply.body, nullptr, false);
  if (j.is_discarded())
    return Internal("controller " + address() + ": " + method + " " + path + ": answer is not JSON");
  return j;
}

std::string TrainerRegistrationText(const TrainerRank& rank, const std::vector<MeshGroupSpec>& mesh_groups) {
  TrainerSpec one;
  one.mesh_groups = mesh_groups;
  one.ranks.push_back(rank);
  json doc = ToJson(one);
  json body = std::move(doc["ranks"][0]);
  body["mesh_groups"] = std::move(doc["mesh_groups"]);
  return body.dump();
}

std::string InferenceRegistrationText(const InferenceRank& rank) {
  InferenceSpec one;
  one.ranks.push_back(rank);
  return ToJson(one)["ranks"][0].dump();
}

StatusOr<json> ControllerClient::RegisterTrainer(const TrainerRank& rank,
                                                 const std::vector<MeshGroupSpec>& mesh_groups) {
  return RegisterText(Role::kTrainer, TrainerRegistrationText(rank, mesh_groups));
}

StatusOr<json> ControllerClient::RegisterTrainerJson(const json& body) {
  return RegisterText(Role::kTrainer, body.dump());
}

StatusOr<json> ControllerClient::RegisterInference(const InferenceRank& rank) {
  return RegisterText(Role::kInference, InferenceRegistrationText(rank));
}

StatusOr<json> ControllerClient::RegisterInferenceJson(const json& body) {
  return RegisterText(Role::kInference, body.dump());
}

StatusOr<json> ControllerClient::RegisterText(Role role, const std::string& body) {
  return SendText("POST", std::string("/v1/register/") + RoleName(role), body, milliseconds(0));
}

StatusOr<std::string> ControllerClient::FetchPlanText(Role role, int32_t rank, Clock::time_point deadline) {
  while (true) {
    const milliseconds wait = std::min(Remaining(deadline), kPollSlice);
    const std::string path = "/v1/plan?role=" + std::string(RoleName(role)) + "&rank=" + std::to_string(rank) +
                             "&wait_ms=" + std::to_string(wait.count());
    WSYNC_ASSIGN_OR_RETURN(Reply reply, Send("GET", path, "", "application/json", wait));
    if (reply.status == 200) return std::move(reply.body);
    Status refused = ErrorFrom("GET", path, reply);
    if (refused.code() != StatusCode::kFailedPrecondition) return refused;
    if (Clock::now() >= deadline)
      return DeadlineExceeded(std::string(RoleName(role)) + " rank " + std::to_string(rank) +
                              ": no plan before the deadline: " + refused.message());
  }
}

StatusOr<json> ControllerClient::FetchPlan(Role role, int32_t rank, Clock::time_point deadline) {
  WSYNC_ASSIGN_OR_RETURN(std::string text, FetchPlanText(role, rank, deadline));
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) return Internal("controller " + address() + ": GET /v1/plan: answer is not JSON");
  return j;
}

StatusOr<TrainerPlanSlice> ControllerClient::FetchTrainerPlan(int32_t rank, Clock::time_point deadline) {
  WSYNC_ASSIGN_OR_RETURN(std::string text, FetchPlanText(Role::kTrainer, rank, deadline));
  return ParseTrainerPlanSlice(text);
}

StatusOr<InferencePlanSlice> ControllerClient::FetchInferencePlan(int32_t rank, Clock::time_point deadline) {
  WSYNC_ASSIGN_OR_RETURN(std::string text, FetchPlanText(Role::kInference, rank, deadline));
  return ParseInferencePlanSlice(text);
}

StatusOr<TrainerPlanSlice> ParseTrainerPlanSlice(const std::string& text) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Internal("trainer plan slice: not a JSON object");
  TrainerPlanSlice slice;
  slice.plan_id = j.value("plan_id", "");
  if (j.contains("epoch") && j["epoch"].is_number_unsigned()) slice.epoch = j["epoch"].get<uint64_t>();
  WSYNC_ASSIGN_OR_RETURN(slice.plan, ParseTrainerRankPlan(j.value("plan", json())));
  slice.raw = std::move(j);
  return slice;
}

StatusOr<InferencePlanSlice> ParseInferencePlanSlice(const std::string& text) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Internal("inference plan slice: not a JSON object");
  InferencePlanSlice slice;
  slice.plan_id = j.value("plan_id", "");
  slice.expected_writes = j.value("expected_writes", uint64_t{0});
  slice.expected_bytes = j.value("expected_bytes", uint64_t{0});
  WSYNC_ASSIGN_OR_RETURN(slice.plan, ParseInferenceRankPlan(j.value("plan", json())));
  slice.raw = std::move(j);
  return slice;
}

Status ControllerClient::KvSet(const std::string& key, const std::string& value) {
  const std::string path = "/v1/kv/" + EscapeKey(key);
  WSYNC_ASSIGN_OR_RETURN(Reply reply, Send("PUT", path, value, "application/octet-stream", milliseconds(0)));
  if (reply.status != 200) return ErrorFrom("PUT", path, reply);
  return Status::Ok();
}

StatusOr<std::string> ControllerClient::KvGet(const std::string& key, milliseconds timeout) {
  const Clock::time_point deadline = Clock::now() + timeout;
  const std::string path = "/v1/kv/" + EscapeKey(key);
  while (true) {
    const milliseconds wait = std::min(Remaining(deadline), kPollSlice);
    WSYNC_ASSIGN_OR_RETURN(Reply reply,
                           Send("GET", path + "?wait_ms=" + std::to_string(wait.count()), "", "", wait));
    if (reply.status == 200) return reply.body;
    if (reply.status != 404 || Clock::now() >= deadline) return ErrorFrom("GET", path, reply);
  }
}

StatusOr<int64_t> ControllerClient::KvAdd(const std::string& key, int64_t delta) {
  WSYNC_ASSIGN_OR_RETURN(json j, SendJson("POST", "/v1/kv/" + EscapeKey(key) + "/add", {{"delta", delta}}));
  return j.value("value", int64_t{0});
}

StatusOr<VersionStatus> ParseVersionStatus(const json& j) {
  if (!j.is_object() || !j.value("version", json()).is_number_unsigned() || !j.value("state", json()).is_string())
    return Internal("controller answered a version without 'version'/'state': " + j.dump());
  VersionStatus v;
  v.version = j["version"].get<uint64_t>();
  v.state = j["state"].get<std::string>();
  v.trainer_done = j.value("trainer_done", std::vector<int32_t>());
  v.inference_done = j.value("inference_done", std::vector<int32_t>());
  for (const json& f : j.value("failures", json::array()))
    v.failures.push_back({f.value("role", ""), f.value("rank", -1), f.value("error", "")});
  v.seconds = j.value("seconds", 0.0);
  v.landed = j.value("landed", false) == true;
  // A controller from before engine pacing admits every version it starts.
  v.admitted = j.value("admitted", true) == true;
  if (const json d = j.value("delta", json()); d.is_object()) {
    if (!d.value("base", json()).is_number_unsigned() || !d.value("ranks", json()).is_array())
      return Internal("controller answered a version with a malformed 'delta': " + d.dump());
    v.delta_base = d["base"].get<uint64_t>();
    for (const json& r : d["ranks"]) {
      if (!r.is_number_integer()) return Internal("controller answered a version with a malformed 'delta': " + d.dump());
      v.delta_ranks.push_back(r.get<int32_t>());
    }
  }
  v.raw = j;
  return v;
}

StatusOr<VersionStatus> ControllerClient::VersionCall(uint64_t version, const std::string& action,
                                                      const json& body) {
  WSYNC_ASSIGN_OR_RETURN(json j, SendJson("POST", "/v1/versions/" + std::to_string(version) + "/" + action, body));
  return ParseVersionStatus(j);
}

StatusOr<VersionStatus> ControllerClient::StartVersion(uint64_t version, int32_t trainer_rank, uint64_t epoch) {
  json body = {{"rank", trainer_rank}};
  if (epoch != 0) body["epoch"] = epoch;
  return VersionCall(version, "start", body);
}

StatusOr<VersionStatus> ControllerClient::ReportTrainerDone(uint64_t version, int32_t rank, const Status& result,
                                                            const nlohmann::json& stats) {
  json body = {{"rank", rank}, {"ok", result.ok()}, {"error", result.message()}};
  if (stats.is_object()) body["stats"] = stats;
  return VersionCall(version, "trainer_done", body);
}

StatusOr<VersionStatus> ControllerClient::ReportInferenceDone(uint64_t version, int32_t rank,
                                                              const Status& result, bool commit,
                                                              const nlohmann::json& stats) {
  json body = {{"rank", rank}, {"ok", result.ok()}, {"error", result.message()}};
  if (commit) body["commit"] = true;
  if (stats.is_object()) body["stats"] = stats;
  return VersionCall(version, "inference_done", body);
}

StatusOr<VersionStatus> ControllerClient::ReportCommitted(uint64_t version, int32_t rank) {
  return VersionCall(version, "inference_committed", {{"rank", rank}});
}

StatusOr<VersionStatus> ControllerClient::ReportFailure(uint64_t version, Role role, int32_t rank,
                                                        const std::string& error) {
  return VersionCall(version, "fail", {{"role", RoleName(role)}, {"rank", rank}, {"error", error}});
}

StatusOr<VersionStatus> ControllerClient::GetVersion(uint64_t version) {
  WSYNC_ASSIGN_OR_RETURN(json j, SendJson("GET", "/v1/versions/" + std::to_string(version), nullptr));
  return ParseVersionStatus(j);
}

StatusOr<std::vector<WriteChecksum>> ControllerClient::FetchChecksums(uint64_t version, int32_t rank,
                                                                     Clock::time_point deadline) {
  const std::string path = "/v1/versions/" + std::to_string(version) + "/checksums?rank=" + std::to_string(rank);
  StatusOr<json> j = InvalidArgument("unreached");
  do {
    const milliseconds wait = std::min(Remaining(deadline), kPollSlice);
    j = SendJson("GET", path + "&wait_ms=" + std::to_string(wait.count()), nullptr, wait);
  } while (!j.ok() && j.status().code() == StatusCode::kDeadlineExceeded && Clock::now() < deadline);
  if (!j.ok()) return j.status();
  const std::string where = "controller " + address() + ": " + path + ": ";
  const json regions = j->value("checksums", json());
  if (!regions.is_object()) return Internal(where + "no 'checksums' object in the answer");
  std::vector<WriteChecksum> out;
  for (const auto& [region, list] : regions.items()) {
    if (!list.is_array()) return Internal(where + "region '" + region + "': not a list");
    for (const json& e : list) {
      std::optional<uint64_t> h;
      if (e.is_array() && e.size() == 3 && e[0].is_number_unsigned() && e[1].is_number_unsigned() && e[2].is_string())
        h = ParseChecksumText(e[2].get<std::string>());
      if (!h) return Internal(where + "region '" + region + "': entry " + e.dump() + " is not [offset, bytes, hash]");
      out.push_back(WriteChecksum{rank, region, e[0].get<uint64_t>(), e[1].get<uint64_t>(), *h});
    }
  }
  return out;
}

StatusOr<VersionStatus> ControllerClient::WaitVersion(uint64_t version, Clock::time_point deadline) {
  return WaitVersionUntil(version, deadline, Until::kFinished);
}

StatusOr<VersionStatus> ControllerClient::WaitVersionLanded(uint64_t version, Clock::time_point deadline) {
  return WaitVersionUntil(version, deadline, Until::kLanded);
}

StatusOr<VersionStatus> ControllerClient::WaitVersionAdmitted(uint64_t version, Clock::time_point deadline) {
  return WaitVersionUntil(version, deadline, Until::kAdmitted);
}

StatusOr<json> ControllerClient::Gate(int32_t rank, const std::string& move, uint64_t version) {
  json body = {{"rank", rank}, {"move", move}};
  if (move == "upto") body["version"] = version;
  return SendJson("POST", "/v1/gate", body);
}

StatusOr<VersionStatus> ControllerClient::WaitVersionUntil(uint64_t version, Clock::time_point deadline, Until until) {
  const bool landed = until == Until::kLanded;
  const char* param = landed ? "&until=landed" : until == Until::kAdmitted ? "&until=admitted" : "";
  while (true) {
    const milliseconds wait = std::min(Remaining(deadline), kPollSlice);
    StatusOr<json> j = SendJson("GET",
                                "/v1/versions/" + std::to_string(version) + "?wait_ms=" + std::to_string(wait.count()) +
                                    param,
                                nullptr, wait);
    if (j.ok()) {
      WSYNC_ASSIGN_OR_RETURN(VersionStatus v, ParseVersionStatus(*j));
      if (v.finished() || (landed && v.landed) || (until == Until::kAdmitted && v.admitted)) return v;
      if (Clock::now() >= deadline)
        return DeadlineExceeded("version " + std::to_string(version) + " still " + v.state +
                                " at the deadline: " + j->dump());
      continue;
    }
    // A version waited for to land is one its caller reported: unknown, the
    // controller lost it (a restart without it), and waiting cannot help.
    if (j.status().code() != StatusCode::kNotFound || until != Until::kFinished) return j.status();
    if (Clock::now() >= deadline)
      return DeadlineExceeded("version " + std::to_string(version) + " was not started before the deadline");
    std::this_thread::sleep_for(std::min(Remaining(deadline), milliseconds(50)));
  }
}

Status ControllerClient::Heartbeat(Role role, int32_t rank) {
  ClientOptions quick = options_;
  quick.retry_for_s = 0;
  ControllerClient once(host_, port_, quick);
  StatusOr<json> reply = once.SendJson("POST", "/v1/heartbeat", {{"role", RoleName(role)}, {"rank", rank}});
  return reply.ok() ? Status::Ok() : reply.status();
}

HeartbeatSender::HeartbeatSender(ControllerClient client, Role role, int32_t rank, milliseconds interval) {
  thread_ = std::thread([this, c = std::move(client), role, rank, interval]() mutable {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      lock.unlock();
      c.Heartbeat(role, rank).IgnoreError();
      lock.lock();
      cv_.wait_for(lock, interval, [this] { return stop_; });
    }
  });
}

HeartbeatSender::~HeartbeatSender() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

StatusOr<json> ControllerClient::GetStatus() { return SendJson("GET", "/v1/status", nullptr); }

StatusOr<json> ControllerClient::GetStatus(const std::string& since, milliseconds wait) {
  return SendJson("GET", "/v1/status?since=" + since + "&wait_ms=" + std::to_string(wait.count()), nullptr, wait);
}

StatusOr<std::string> ControllerClient::GetMetrics() {
  WSYNC_ASSIGN_OR_RETURN(Reply reply, Send("GET", "/metrics", "", "", milliseconds(0)));
  if (reply.status != 200) return ErrorFrom("GET", "/metrics", reply);
  return reply.body;
}

bool ControllerClient::Healthy() {
  ClientOptions quick = options_;
  quick.retry_for_s = 0;
  ControllerClient once(host_, port_, quick);
  StatusOr<Reply> r = once.Send("GET", "/healthz", "", "", milliseconds(0));
  return r.ok() && r->status == 200;
}

}  // namespace wsync::controller
