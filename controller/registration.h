// Checks on agent registrations as they arrive, and assembly of the whole
// world into validated specs once every rank is in.
//
// TrainerRegistry is used by Controller under its mutex. The per-arrival
// checks compare a new rank with the ranks already registered, so a mismatch
// is reported to the agent that brings it (HTTP 400), naming rank and tensor.
// Everything else is left to routing's strict loaders + validators
// (spec_io.h, validate.h), run once on the full world by AssembleWorld: those
// need every rank at once. Registrations are kept as shared immutable JSON,
// so the controller snapshots the world under its mutex in O(ranks) and
// assembles and plans it without the mutex.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "routing/metadata.h"

namespace wsync::controller {

// A trainer registration split into the rank document and the mesh groups.
struct TrainerRegistration {
  int32_t rank = -1;
  nlohmann::json rank_json;    // one entry of wsync.trainer/v1 "ranks"
  nlohmann::json mesh_groups;  // wsync.trainer/v1 "mesh_groups"
};

// The trainer registrations received so far, indexed so that each arrival
// is checked against earlier ranks in time linear in its own size.
// One rank's registration document, immutable once accepted.
using RankJson = std::shared_ptr<const nlohmann::json>;
using RankJsons = std::map<int32_t, RankJson>;

class TrainerRegistry {
 public:
  explicit TrainerRegistry(int32_t world) : world_(world) {}

  // Splits `body` and checks it against the ranks registered so far (a rank
  // registering again is checked against the others only). The error names
  // the rank and, for metadata, the tensor.
  // Takes the body by value: the registration keeps it (move it in).
  StatusOr<TrainerRegistration> Check(nlohmann::json body) const;
  // Adds (or replaces) a checked registration.
  void Add(TrainerRegistration reg);
  void Remove(int32_t rank);

  const RankJsons& ranks() const { return ranks_; }
  const nlohmann::json& mesh_groups() const { return mesh_groups_; }

 private:
  struct TensorFacts {
    int32_t rank;                // first registrant
    const nlohmann::json* param; // its entry, inside ranks_ (which keeps it alive)
  };
  struct MeshFacts {
    int32_t rank;             // first registrant
    nlohmann::json shape, dim_names;
    std::map<std::string, int32_t> coords;  // coord dump -> rank
  };
  void Index(int32_t rank, const nlohmann::json& rank_json);
  void Rebuild();

  int32_t world_;
  RankJsons ranks_;
  nlohmann::json mesh_groups_;  // null until the first registration
  std::map<std::string, TensorFacts> tensors_;
  std::map<std::string, MeshFacts> meshes_;
};

// Checks an inference registration on its own with routing's strict loader
// and validator (regions, overlaps, tp slices, fp8 scales are all per rank),
// so a broken rank is refused on arrival, not blamed on whoever completes
// the world. Returns the rank. Needs no other rank: called without the
// controller's mutex.
StatusOr<int32_t> CheckInferenceRegistration(const nlohmann::json& body, int32_t world);

// The rank a loader/planner error names ("trainer registrations: rank 3: ..."),
// so the controller drops the registration at fault, not the last one.
struct Culprit {
  bool trainer = true;
  int32_t rank = -1;
};
std::optional<Culprit> CulpritOf(const std::string& error);

struct AssembledWorld {
  TrainerSpec trainer;
  InferenceSpec inference;
  std::string trainer_text;    // wsync.trainer/v1, normalized (spec_io ToJsonText)
  std::string inference_text;  // wsync.inference/v1, normalized
};

// Builds the spec documents from the registrations and parses them with the
// strict loaders (which validate). Errors read
// "trainer registrations: rank R: tensor 'T': ...". Pure: the controller
// runs it on a snapshot, without its mutex.
StatusOr<AssembledWorld> AssembleWorld(const RankJsons& trainer_ranks, const nlohmann::json& mesh_groups,
                                       const RankJsons& inference_ranks);

}  // namespace wsync::controller
