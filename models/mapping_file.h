// Reads a wsync.mapping/v1 file (configs/mappings/) into a MappingSpec,
// resolving "{name}" shard counts from the model's config.json.
//
// Used by GenerateSpecs. A stand-in until routing/spec_io.h's loader lands;
// it accepts exactly the format docs/SCHEMA.md describes, unknown keys
// included as errors, so the two cannot drift silently.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "routing/metadata.h"

namespace wsync {

StatusOr<MappingSpec> ParseMappingDocument(const nlohmann::json& doc,
                                           const nlohmann::json& model_config,
                                           const std::string& origin);

StatusOr<MappingSpec> LoadMappingFile(const std::string& path,
                                      const nlohmann::json& model_config);

// Reads a JSON file; errors name the file and the parser's message.
StatusOr<nlohmann::json> ReadJsonDocument(const std::string& path);

}  // namespace wsync
