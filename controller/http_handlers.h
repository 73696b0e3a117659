// What the control plane's routes (docs/CONTROL_PLANE.md) do with a request,
// apart from cpp-httplib: the pieces of a request in (path captures, query
// values, body text), the Controller's answer out as StatusOr<json>.
//
// http_server.cc binds these to its routes and maps Status codes onto HTTP
// status codes; fuzz/controller_requests_fuzz.cc calls them directly, so
// every byte an agent can send goes through the same decoding with or
// without a socket. None of them throws: bad input is InvalidArgument (400)
// naming what was wrong.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "controller/controller.h"
#include "controller/role.h"

namespace wsync::controller {

// A reply body as the server sends it.
std::string ReplyText(const nlohmann::json& body);

// `wait_ms` query parameter (absent: `fallback`), clamped to [0, 60000].
std::chrono::milliseconds WaitParam(const std::optional<std::string>& wait_ms, int64_t fallback);
// A version number in a path: decimal, unsigned 64-bit.
StatusOr<uint64_t> ParseVersion(const std::string& s);

// POST /v1/register/{trainer,inference}
StatusOr<nlohmann::json> HandleRegister(Controller& c, Role role, const std::string& path,
                                        const std::string& body);
// GET /v1/plan?role=R&rank=N. FailedPrecondition while the world is
// incomplete (the route answers 409 with WorldSummary()).
StatusOr<nlohmann::json> HandlePlan(Controller& c, const std::string& role, const std::string& rank,
                                    std::chrono::milliseconds wait);
// The same, as the slice's text (what the route sends, without re-encoding).
StatusOr<std::shared_ptr<const std::string>> HandlePlanText(Controller& c, const std::string& role,
                                                            const std::string& rank, std::chrono::milliseconds wait);
// POST /v1/heartbeat
StatusOr<nlohmann::json> HandleHeartbeat(Controller& c, const std::string& path, const std::string& body);
// POST /v1/kv/<key>/add
StatusOr<nlohmann::json> HandleKvAdd(Controller& c, const std::string& key, const std::string& path,
                                     const std::string& body);
// POST /v1/versions/<v>/<action>, action one of start, trainer_done,
// inference_done, inference_committed, fail.
StatusOr<nlohmann::json> HandleVersionReport(Controller& c, const std::string& version,
                                             const std::string& action, const std::string& path,
                                             const std::string& body);
// GET /v1/versions/<v>/checksums?rank=R[&wait_ms=T]
StatusOr<nlohmann::json> HandleGetChecksums(Controller& c, const std::string& version, const std::string& rank,
                                            std::chrono::milliseconds wait);
// GET /v1/versions/<v>
// (`until`: "landed" also answers once the version has landed, "admitted"
// once trainers may write it.)
StatusOr<nlohmann::json> HandleGetVersion(Controller& c, const std::string& version,
                                          std::chrono::milliseconds wait, const std::string& until = "");
// POST /v1/gate {"rank": R, "move": "open"|"newest"|"upto"|"close", "version": V}:
// an engine-paced inference rank lets versions in (VersionTracker::Gate).
StatusOr<nlohmann::json> HandleGate(Controller& c, const std::string& path, const std::string& body);

}  // namespace wsync::controller
