// The controller's state dir: what a restarted controller needs to serve the
// same plan and remember the latest complete version.
//
// Files (each written through temp + rename, never half-written):
//   plan.json       wsync.plan/v1 of the assembled world (for inspection and
//                   offline tools; written before world.json)
//   world.json      wsync.controller_state/v1: world sizes, the assembled
//                   trainer/inference/mapping specs and the plan_id. Its
//                   presence is the commit point: no world.json, no plan.
//                   world.json is rewritten, with the epoch, when an
//                   inference rank re-registers with new memory.
//   versions.json   latest complete version and its update time; written
//                   with the first world.json, and required from then on
//                   (world.json says so): without it a restart would forget
//                   the latest complete version.
// On restart every file is checked: read only if it is a regular file
// within its size bound (kMaxWorldBytes, kMaxVersionsBytes), world.json and
// versions.json by schema, plan.json against the world (CheckPlanFile).
// Used by Controller only, under its mutex.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace wsync::controller {

struct PersistedWorld {
  int32_t trainer_ranks = 0;
  int32_t inference_ranks = 0;
  nlohmann::json trainer;    // wsync.trainer/v1
  nlohmann::json inference;  // wsync.inference/v1
  nlohmann::json mapping;    // wsync.mapping/v1
  std::string plan_id;
  // Registration epoch: 1 at planning, +1 each time an inference rank
  // registers again with new memory (descriptors) after the plan exists.
  uint64_t epoch = 1;
  // versions.json must exist (false only in dirs written before it did).
  bool versions_required = false;
};

// Bounds on what a restart reads (world.json at Kimi-K2 scale: ~55 MB).
inline constexpr uint64_t kMaxWorldBytes = uint64_t{1} << 30;
inline constexpr uint64_t kMaxVersionsBytes = uint64_t{1} << 20;
// Epochs stop here rather than wrap (a re-registration past it is refused).
inline constexpr uint64_t kMaxEpoch = uint64_t{1} << 62;

// What SaveWorld writes, by reference: at Kimi-K2 scale the specs are tens
// of MB of JSON trees, not to be copied on their way to disk.
struct WorldToSave {
  int32_t trainer_ranks = 0;
  int32_t inference_ranks = 0;
  const std::string& trainer;    // wsync.trainer/v1 text
  const std::string& inference;  // wsync.inference/v1 text
  const nlohmann::json& mapping;
  const std::string& plan_id;
  uint64_t epoch = 1;
};

struct PersistedVersions {
  bool has_complete = false;
  uint64_t latest_complete = 0;
  double update_seconds = 0;
  double finished_unix = 0;
  // Shadow mode: a version that landed on every inference rank and waits
  // for these ranks to copy it out (0: none). A restarted controller must
  // still hold the next version back until they have.
  uint64_t landed = 0;
  std::vector<int32_t> committing;
  // The version running when this was written (0: none): a restarted
  // controller runs it on, so that its ranks' reports still count (a report
  // never starts a version).
  uint64_t running = 0;
  bool found = false;  // LoadVersions: versions.json exists
};

class StateStore {
 public:
  // An empty `dir` keeps nothing (every call succeeds, loads find nothing).
  explicit StateStore(std::string dir) : dir_(std::move(dir)) {}

  Status Init();  // creates the dir
  // `plan_text`: the wsync.plan/v1 document, already serialized.
  Status SaveWorld(const WorldToSave& world, const std::string& plan_text);
  StatusOr<std::optional<PersistedWorld>> LoadWorld() const;
  Status SaveVersions(const PersistedVersions& versions);
  StatusOr<PersistedVersions> LoadVersions() const;
  // plan.json against `plan_text`, the plan re-made from world.json: a
  // missing or different file (deleted, edited, from another world) is
  // written again from it. Returns what was wrong ("" if nothing).
  StatusOr<std::string> CheckPlanFile(const std::string& plan_text);

  const std::string& dir() const { return dir_; }

 private:
  Status SaveWorldFile(const WorldToSave& world) const;  // world.json alone
  std::string Path(const char* name) const;
  std::string dir_;
};

}  // namespace wsync::controller
