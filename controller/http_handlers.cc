#include "controller/http_handlers.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <optional>

#include "routing/json_reader.h"

namespace wsync::controller {

using nlohmann::json;

namespace {

constexpr int64_t kMaxWaitMs = 60000;

StatusOr<json> ParseBody(const std::string& path, const std::string& text) {
  StatusOr<json> j = ParseJsonText(text, path + ": request body");
  if (!j.ok()) return j.status();
  if (!j->is_object()) return InvalidArgument(path + ": request body is not a JSON object");
  return j;
}

// Ranks are int32 everywhere; a larger number must not wrap onto a real rank.
StatusOr<int32_t> RankField(const json& body, const std::string& where) {
  if (!body.contains("rank") || !body["rank"].is_number_integer())
    return InvalidArgument(where + ": body needs an integer 'rank'");
  const json& rank = body["rank"];
  if (rank.is_number_unsigned() ? rank.get<uint64_t>() > INT32_MAX
                                : rank.get<int64_t>() < INT32_MIN || rank.get<int64_t>() > INT32_MAX)
    return InvalidArgument(where + ": 'rank' " + rank.dump() + " is not a rank");
  return rank.get<int32_t>();
}

// An optional string member; json::value() would throw on another type.
StatusOr<std::string> StringField(const json& body, const char* key, const std::string& fallback,
                                  const std::string& where) {
  if (!body.contains(key)) return fallback;
  if (!body[key].is_string()) return InvalidArgument(where + ": '" + key + "' must be a string");
  return body[key].get<std::string>();
}

// A rank in a query parameter: decimal, within int32.
std::optional<int32_t> RankText(const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const long rank = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE || rank < INT32_MIN || rank > INT32_MAX) return std::nullopt;
  return static_cast<int32_t>(rank);
}

}  // namespace

// Messages quote what the client sent (paths, keys, version text), which
// need not be UTF-8; dump() throws on such bytes, so they are replaced.
std::string ReplyText(const json& body) { return body.dump(-1, ' ', false, json::error_handler_t::replace); }

std::chrono::milliseconds WaitParam(const std::optional<std::string>& wait_ms, int64_t fallback) {
  int64_t ms = fallback;
  if (wait_ms) ms = std::strtoll(wait_ms->c_str(), nullptr, 10);
  return std::chrono::milliseconds(std::clamp<int64_t>(ms, 0, kMaxWaitMs));
}

// Digits only: strtoull alone takes "-1" as 2^64-1 (a version no real one
// could ever follow) and skips leading blanks and signs. Versions start at 1.
StatusOr<uint64_t> ParseVersion(const std::string& s) {
  const bool digits = !s.empty() && s.size() <= 20 &&
                      std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = digits ? std::strtoull(s.c_str(), &end, 10) : 0;
  if (!digits || *end != '\0' || errno == ERANGE || v == 0)
    return InvalidArgument("version '" + s.substr(0, 32) + (s.size() > 32 ? "...'" : "'") +
                           " is not a version number (digits only, 1 to 2^64-1)");
  return static_cast<uint64_t>(v);
}

StatusOr<json> HandleRegister(Controller& c, Role role, const std::string& path, const std::string& text) {
  WSYNC_ASSIGN_OR_RETURN(json body, ParseBody(path, text));
  return role == Role::kTrainer ? c.RegisterTrainer(std::move(body)) : c.RegisterInference(std::move(body));
}

StatusOr<json> HandlePlan(Controller& c, const std::string& role_text, const std::string& rank_text,
                          std::chrono::milliseconds wait) {
  WSYNC_ASSIGN_OR_RETURN(std::shared_ptr<const std::string> text, HandlePlanText(c, role_text, rank_text, wait));
  return json::parse(*text);
}

StatusOr<std::shared_ptr<const std::string>> HandlePlanText(Controller& c, const std::string& role_text,
                                                            const std::string& rank_text,
                                                            std::chrono::milliseconds wait) {
  std::optional<Role> role = ParseRole(role_text);
  std::optional<int32_t> rank = RankText(rank_text);
  if (!role || !rank) return InvalidArgument("/v1/plan needs ?role=trainer|inference&rank=R");
  return c.PlanSliceText(*role, *rank, wait);
}

StatusOr<json> HandleHeartbeat(Controller& c, const std::string& path, const std::string& text) {
  WSYNC_ASSIGN_OR_RETURN(json body, ParseBody(path, text));
  WSYNC_ASSIGN_OR_RETURN(std::string role_text, StringField(body, "role", "", "heartbeat"));
  std::optional<Role> role = ParseRole(role_text);
  StatusOr<int32_t> rank = RankField(body, path);
  if (!role) return InvalidArgument("heartbeat: 'role' must be trainer or inference");
  if (!rank.ok()) return rank.status();
  return c.Heartbeat(*role, *rank);
}

StatusOr<json> HandleKvAdd(Controller& c, const std::string& key, const std::string& path,
                           const std::string& text) {
  WSYNC_ASSIGN_OR_RETURN(json body, ParseBody(path, text));
  const json delta = body.value("delta", json());
  if (!delta.is_number_integer() || (delta.is_number_unsigned() && delta.get<uint64_t>() > INT64_MAX))
    return InvalidArgument("kv add: body needs an integer 'delta' (64-bit signed)");
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
  if (action == "start") {
    const json epoch = body.value("epoch", json(0));
    if (!epoch.is_number_unsigned() && !(epoch.is_number_integer() && epoch.get<int64_t>() == 0))
      return InvalidArgument("start: 'epoch' must be a non-negative integer (the plan slice's)");
    return c.StartVersion(v, rank, epoch.get<uint64_t>());
  }
  if (action == "fail") {
    WSYNC_ASSIGN_OR_RETURN(std::string role_text, StringField(body, "role", "trainer", "fail"));
    std::optional<Role> role = ParseRole(role_text);
    if (!role) return InvalidArgument("fail: 'role' must be trainer or inference");
    return c.ReportFailure(v, *role, rank, error);
  }
  if (action == "inference_committed") return c.ReportCommitted(v, rank);
  if (action != "trainer_done" && action != "inference_done")
    return NotFound(path + ": no such version action '" + action + "'");
  const Role role = action == "trainer_done" ? Role::kTrainer : Role::kInference;
  const json ok = body.value("ok", json(true));
  if (!ok.is_boolean()) return InvalidArgument(action + ": 'ok' must be true or false");
  const json commit = body.value("commit", json(false));
  if (!commit.is_boolean()) return InvalidArgument(action + ": 'commit' must be true or false");
  return c.ReportDone(v, role, rank, ok.get<bool>(), error, body.value("stats", json()), commit.get<bool>());
}

StatusOr<json> HandleGetChecksums(Controller& c, const std::string& version, const std::string& rank_text,
                                  std::chrono::milliseconds wait) {
  WSYNC_ASSIGN_OR_RETURN(uint64_t v, ParseVersion(version));
  std::optional<int32_t> rank = RankText(rank_text);
  if (!rank) return InvalidArgument("/v1/versions/" + version + "/checksums needs ?rank=R (an inference rank)");
  return c.VersionChecksums(v, *rank, wait);
}

StatusOr<json> HandleGetVersion(Controller& c, const std::string& version, std::chrono::milliseconds wait,
                                const std::string& until) {
  WSYNC_ASSIGN_OR_RETURN(uint64_t v, ParseVersion(version));
  if (!until.empty() && until != "landed" && until != "admitted")
    return InvalidArgument("/v1/versions/" + version + ": 'until' must be 'landed' or 'admitted' (or absent: finished)");
  return c.GetVersion(v, wait,
                      until == "landed"     ? Controller::Until::kLanded
                      : until == "admitted" ? Controller::Until::kAdmitted
                                            : Controller::Until::kFinished);
}

StatusOr<json> HandleGate(Controller& c, const std::string& path, const std::string& text) {
  WSYNC_ASSIGN_OR_RETURN(json body, ParseBody(path, text));
  WSYNC_ASSIGN_OR_RETURN(int32_t rank, RankField(body, path));
  WSYNC_ASSIGN_OR_RETURN(std::string move_text, StringField(body, "move", "", "gate"));
  static const std::pair<const char*, GateMove> kMoves[] = {
      {"open", GateMove::kOpen}, {"newest", GateMove::kNewest}, {"upto", GateMove::kUpto}, {"close", GateMove::kClose}};
  std::optional<GateMove> move;
  for (const auto& [name, m] : kMoves)
    if (move_text == name) move = m;
  if (!move) return InvalidArgument("gate: 'move' must be open, newest, upto or close");
  uint64_t version = 0;
  if (*move == GateMove::kUpto) {
    const json v = body.value("version", json());
    if (!v.is_number_unsigned() || v.get<uint64_t>() == 0)
      return InvalidArgument("gate: move 'upto' needs a positive integer 'version'");
    version = v.get<uint64_t>();
  }
  return c.Gate(rank, *move, version);
}

}  // namespace wsync::controller
