// JSON <-> metadata structs for the three spec documents of docs/SCHEMA.md
// (wsync.trainer/v1, wsync.inference/v1, wsync.mapping/v1).
//
// Called by the CLI (`wsync plan` reads files) and the controller (agent
// registrations arrive as JSON). Parsers are strict: unknown keys, wrong
// types and unknown dtypes are errors, reported as one line that starts with
// `source` (usually the file name) and names the rank and tensor. Parsing
// also runs the matching Validate* function (validate.h), so a parsed spec is
// ready for the planner. Structs built in code (the model generator) skip
// JSON and call Validate* themselves (Plan() does by default).
#pragma once

#include <string>

#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "routing/metadata.h"

namespace wsync {

StatusOr<TrainerSpec> ParseTrainerSpec(const nlohmann::json& j, const std::string& source);
StatusOr<InferenceSpec> ParseInferenceSpec(const nlohmann::json& j, const std::string& source);
// The same, from the parts of a document that is not built: "mesh_groups"
// and each entry of "ranks" where they lie (the controller's registrations,
// tens of MB at Kimi-K2 scale, are not copied into one document to be read).
StatusOr<TrainerSpec> ParseTrainerSpec(const nlohmann::json& mesh_groups, const std::vector<const nlohmann::json*>& ranks,
                                       const std::string& source);
StatusOr<InferenceSpec> ParseInferenceSpec(const std::vector<const nlohmann::json*>& ranks, const std::string& source);
// One entry of "ranks" read and checked on its own, whatever its number (a
// registration; an engine's layout of only its own rank). Errors name it as
// "<source>: rank N".
StatusOr<InferenceRank> ParseOneInferenceRank(const nlohmann::json& entry, const std::string& source);
// `model_config` (may be null) resolves "{name}" placeholders in a part's
// `shards` (e.g. "shards": "{num_key_value_heads}") from the HF config.json
// keys of the same name; without it such placeholders are errors.
StatusOr<MappingSpec> ParseMappingSpec(const nlohmann::json& j, const std::string& source,
                                       const nlohmann::json* model_config = nullptr);

// File variants: `source` is the path. Malformed JSON is one line naming the
// file and the parser's position.
StatusOr<TrainerSpec> ParseTrainerSpecFromFile(const std::string& path);
StatusOr<InferenceSpec> ParseInferenceSpecFromFile(const std::string& path);
StatusOr<MappingSpec> ParseMappingSpecFromFile(const std::string& path,
                                               const nlohmann::json* model_config = nullptr);

// Inverse of the parsers: Parse(ToJson(x)) == x.
nlohmann::json ToJson(const TrainerSpec& spec);
nlohmann::json ToJson(const InferenceSpec& spec);
// ToJson(spec).dump(), written without the tree (the controller persists
// and compares worlds of tens of MB; routing/json_text.h).
std::string ToJsonText(const TrainerSpec& spec);
std::string ToJsonText(const InferenceSpec& spec);
nlohmann::json ToJson(const MappingSpec& spec);

// Writes through a temp file and rename (nothing half-written). indent < 0
// writes one compact line.
Status WriteJsonFile(const nlohmann::json& j, const std::string& path, int indent = 1);

// Placement spellings: "Shard(d)" / "Replicate()".
std::string PlacementToString(const Placement& p);
bool ParsePlacement(const std::string& s, Placement* out);

}  // namespace wsync
