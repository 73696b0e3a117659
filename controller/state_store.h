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
//   versions.json   latest complete version and its update time.
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
};

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

  const std::string& dir() const { return dir_; }

 private:
  Status SaveWorldFile(const WorldToSave& world) const;  // world.json alone
  std::string Path(const char* name) const;
  std::string dir_;
};

}  // namespace wsync::controller
