#include "models/mapping_file.h"

#include <fstream>
#include <sstream>

#include "routing/spec_io.h"

namespace wsync {

StatusOr<nlohmann::json> ReadJsonDocument(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound(path + ": cannot open file");
  std::stringstream buf;
  buf << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(buf.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return InvalidArgument(path + ": not valid JSON (python3 -m json.tool shows where)");
  }
  return j;
}

StatusOr<MappingSpec> LoadMappingFile(const std::string& path, const nlohmann::json& config) {
  return ParseMappingSpecFromFile(path, &config);
}

}  // namespace wsync
