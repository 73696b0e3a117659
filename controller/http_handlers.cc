#include "controller/http_handlers.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

namespace wsync::controller {

using nlohmann::json;

namespace {

constexpr int64_t kMaxWaitMs = 60000;

StatusOr<json> ParseBody(const std::string& path, const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return InvalidArgument(path + ": request body is not a JSON object");
  return j;
}

StatusOr<int32_t> RankField(const json& body, const std::string& where) {
  if (!body.contains("rank") || !body["rank"].is_number_integer())
    return InvalidArgument(where + ": body needs an integer 'rank'");
  return body["rank"].get<int32_t>();
}

}  // namespace

std::string ReplyText(const json& body) { return body.dump(); }

std::chrono::milliseconds WaitParam(const std::optional<std::string>& wait_ms, int64_t fallback) {
  int64_t ms = fallback;
  if (wait_ms) ms = std::strtoll(wait_ms->c_str(), nullptr, 10);
  return std::chrono::milliseconds(std::clamp<int64_t>(ms, 0, kMaxWaitMs));
}

StatusOr<uint64_t> ParseVersion(const std::string& s) {
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno == ERANGE)
    return InvalidArgument("version '" + s + "' is not an unsigned 64-bit integer");
  return static_cast<uint64_t>(v);
}

StatusOr<json> HandleRegister(Controller& c, Role role, const std::string& path, const std::string& text) {
  WSYNC_ASSIGN_OR_RETURN(json body, ParseBody(path, text));
  return role == Role::kTrainer ? c.RegisterTrainer(body) : c.RegisterInference(body);
}

StatusOr<json> HandlePlan(Controller& c, const std::string& role_text, const std::string& rank_text,
                          std::chrono::milliseconds wait) {
  std::optional<Role> role = ParseRole(role_text);
  char* end = nullptr;
  const long rank = std::strtol(rank_text.c_str(), &end, 10);
  if (!role || rank_text.empty() || *end != '\0')
    return InvalidArgument("/v1/plan needs ?role=trainer|inference&rank=R");
  return c.PlanSlice(*role, static_cast<int32_t>(rank), wait);
}

StatusOr<json> HandleHeartbeat(Controller& c, const std::string& path, const std::string& text) {
  WSYNC_ASSIGN_OR_RETURN(json body, ParseBody(path, text));
  std::optional<Role> role = ParseRole(body.value("role", std::string()));
  StatusOr<int32_t> rank = RankField(body, path);
  if (!role) return InvalidArgument("heartbeat: 'role' must be trainer or inference");
  if (!rank.ok()) return rank.status();
  return c.Heartbeat(*role, *rank);
}

StatusOr<json> HandleKvAdd(Controller& c, const std::string& key, const std::string& path,
                           const std::string& text) {
  WSYNC_ASSIGN_OR_RETURN(json body, ParseBody(path, text));
  if (!body.value("delta", json()).is_number_integer())
    return InvalidArgument("kv add: body needs an integer 'delta'");
  WSYNC_ASSIGN_OR_RETURN(int64_t value, c.KvAdd(key, body["delta"].get<int64_t>()));
  return json{{"value", value}};
}

StatusOr<json> HandleVersionReport(Controller& c, const std::string& version, const std::string& action,
                                   const std::string& path, const std::string& text) {
  WSYNC_ASSIGN_OR_RETURN(uint64_t v, ParseVersion(version));
  WSYNC_ASSIGN_OR_RETURN(json body, ParseBody(path, text));
  WSYNC_ASSIGN_OR_RETURN(int32_t rank, RankField(body, path));
  const std::string error = body.value("error", json("")).is_string()
                                ? body.value("error", std::string()) : body.value("error", json()).dump();
  if (action == "start") return c.StartVersion(v, rank);
  if (action == "fail") {
    std::optional<Role> role = ParseRole(body.value("role", std::string("trainer")));
    if (!role) return InvalidArgument("fail: 'role' must be trainer or inference");
    return c.ReportFailure(v, *role, rank, error);
  }
  if (action != "trainer_done" && action != "inference_done")
    return NotFound(path + ": no such version action '" + action + "'");
  const Role role = action == "trainer_done" ? Role::kTrainer : Role::kInference;
  const json ok = body.value("ok", json(true));
  if (!ok.is_boolean()) return InvalidArgument(action + ": 'ok' must be true or false");
  return c.ReportDone(v, role, rank, ok.get<bool>(), error, body.value("stats", json()));
}

StatusOr<json> HandleGetVersion(Controller& c, const std::string& version, std::chrono::milliseconds wait) {
  WSYNC_ASSIGN_OR_RETURN(uint64_t v, ParseVersion(version));
  return c.GetVersion(v, wait);
}

}  // namespace wsync::controller
