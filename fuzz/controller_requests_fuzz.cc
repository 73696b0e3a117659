// The controller's request handlers (controller/http_handlers.h, the code
// behind every route of docs/CONTROL_PLANE.md) driven with fuzzed requests
// against a fresh Controller per input: the 2-trainer world of
// tests/cli/data/good, so a run can register, plan and report versions.
//
// An input is a script, one request per line:
//   trainer <body>          POST /v1/register/trainer
//   inference <body>        POST /v1/register/inference
//   plan <role> <rank>      GET /v1/plan?role=..&rank=..
//   heartbeat <body>        POST /v1/heartbeat
//   version <v> <action> <body>   POST /v1/versions/<v>/<action>
//   get <v>                 GET /v1/versions/<v>
//   checksums <v> <rank>    GET /v1/versions/<v>/checksums?rank=..
//   kvset <key> <value> / kvget <key> / kvadd <key> <body>
//   wait <text>             the wait_ms query parameter's parser alone
//   status                  GET /v1/status and /metrics
// Waits are always 0 (a long poll would only sleep). Every answer is
// encoded as the server sends it; an Internal error (a 500) is a bug.
#include <string>
#include <string_view>

#include "controller/controller.h"
#include "controller/http_handlers.h"
#include "fuzz/fuzz_support.h"
#include "routing/spec_io.h"

using namespace wsync;
using namespace wsync::controller;

namespace {

const MappingSpec& Mapping() {
  static const MappingSpec m = [] {
    StatusOr<MappingSpec> s = ParseMappingSpecFromFile(fuzz::SourcePath("tests/cli/data/good/mapping.json"));
    if (!s.ok()) fuzz::Broken("cannot load tests/cli/data/good/mapping.json: " + s.status().message());
    return *s;
  }();
  return m;
}

// Splits off the first space-separated word of `rest`.
std::string Word(std::string_view& rest) {
  const size_t sp = rest.find(' ');
  std::string w(rest.substr(0, sp));
  rest = sp == std::string_view::npos ? std::string_view() : rest.substr(sp + 1);
  return w;
}

// Encodes the answer as the server would send it; a 500 (Internal) means
// the controller failed inside, not that the request was wrong.
void Check(const StatusOr<nlohmann::json>& r, const std::string& line) {
  if (r.ok()) {
    (void)ReplyText(*r);
    return;
  }
  fuzz::CheckError(r.status(), "a handler");
  if (r.status().code() == StatusCode::kInternal)
    fuzz::Broken("internal error for request: " + line + "\nerror: " + r.status().message());
  (void)ReplyText({{"error", r.status().message()}});
}

void Run(Controller& c, std::string_view line) {
  const std::string whole(line);
  const std::chrono::milliseconds now(0);
  const std::string op = Word(line);
  const std::string rest(line);
  if (op == "trainer") return Check(HandleRegister(c, Role::kTrainer, "/v1/register/trainer", rest), whole);
  if (op == "inference") return Check(HandleRegister(c, Role::kInference, "/v1/register/inference", rest), whole);
  if (op == "heartbeat") return Check(HandleHeartbeat(c, "/v1/heartbeat", rest), whole);
  if (op == "plan") {
    const std::string role = Word(line);
    StatusOr<nlohmann::json> slice = HandlePlan(c, role, std::string(line), now);
    if (!slice.ok() && slice.status().code() == StatusCode::kFailedPrecondition) {
      nlohmann::json body = c.WorldSummary();  // the route's 409 answer
      body["error"] = slice.status().message();
      return Check(body, whole);
    }
    return Check(slice, whole);
  }
  if (op == "version") {
    const std::string v = Word(line);
    const std::string action = Word(line);
    return Check(HandleVersionReport(c, v, action, "/v1/versions/" + v + "/" + action, std::string(line)), whole);
  }
  if (op == "get") return Check(HandleGetVersion(c, rest, now), whole);
  if (op == "checksums") {
    const std::string v = Word(line);
    return Check(HandleGetChecksums(c, v, std::string(line), now), whole);
  }
  if (op == "kvset") {
    const std::string key = Word(line);
    c.KvSet(key, std::string(line));
    return;
  }
  if (op == "kvget") {
    StatusOr<std::string> v = c.KvGet(rest, now);
    if (!v.ok()) Check(v.status(), whole);
    return;
  }
  if (op == "kvadd") {
    const std::string key = Word(line);
    return Check(HandleKvAdd(c, key, "/v1/kv/" + key + "/add", std::string(line)), whole);
  }
  if (op == "wait") {
    (void)WaitParam(rest, 0);
    return;
  }
  if (op == "status") {
    Check(c.StatusJson(), whole);
    (void)c.MetricsText();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ControllerOptions options;
  options.trainers = 2;
  options.inference = 1;
  options.mapping = Mapping();
  options.heartbeat_timeout_s = 0;  // no wall-clock behaviour: runs must repeat
  StatusOr<std::unique_ptr<Controller>> c = Controller::Create(options);
  if (!c.ok()) fuzz::Broken("Controller::Create: " + c.status().message());
  std::string_view script = fuzz::Bytes(data, size);
  while (!script.empty()) {
    const size_t nl = script.find('\n');
    Run(**c, script.substr(0, nl));
    script = nl == std::string_view::npos ? std::string_view() : script.substr(nl + 1);
  }
  return 0;
}
