// File reading for the generator: the model's config.json and the family's
// wsync.mapping/v1 file (configs/mappings/), whose "{name}" shard counts are
// resolved from that config by routing's strict loader (routing/spec_io.h).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "routing/metadata.h"

namespace wsync {

// ParseMappingSpecFromFile with `model_config` for the placeholders.
StatusOr<MappingSpec> LoadMappingFile(const std::string& path,
                                      const nlohmann::json& model_config);

// Reads a JSON file; errors name the file and say what is wrong.
StatusOr<nlohmann::json> ReadJsonDocument(const std::string& path);

}  // namespace wsync
