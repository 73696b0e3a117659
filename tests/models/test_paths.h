// Paths of the checked-in configs and examples, for the models tests.
#pragma once

#include <string>

namespace wsync::test {

inline std::string SourcePath(const std::string& rel) {
  return std::string(WSYNC_SOURCE_DIR) + "/" + rel;
}
inline std::string ExampleCluster(const std::string& name) {
  return SourcePath("examples/" + name + "/cluster.json");
}

}  // namespace wsync::test
