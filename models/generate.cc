#include "models/generate.h"

#include "models/layout_builders.h"
#include "models/mapping_file.h"
#include "models/model_config.h"

namespace wsync {

StatusOr<GeneratedSpecs> GenerateSpecs(const nlohmann::json& model_config,
                                       const ClusterSpec& cluster) {
  const std::string origin = cluster.model_path.empty() ? "model config" : cluster.model_path;
  WSYNC_ASSIGN_OR_RETURN(ModelDims dims, ParseModelConfig(model_config, origin));
  GeneratedSpecs out;
  out.family = ModelFamilyName(dims.family);
  const std::string where = cluster.name.empty() ? "cluster" : "cluster '" + cluster.name + "'";
  if (Status s = BuildTrainerSpec(dims, cluster.trainer, &out.trainer); !s.ok()) {
    return s.WithContext(where);
  }
  if (Status s = BuildInferenceSpec(dims, cluster.inference, &out.inference); !s.ok()) {
    return s.WithContext(where);
  }
  if (cluster.mapping_path.empty()) {
    return InvalidArgument(where + ": no mapping file given (\"mapping\")");
  }
  WSYNC_ASSIGN_OR_RETURN(out.mapping, LoadMappingFile(cluster.mapping_path, model_config));
  return out;
}

StatusOr<GeneratedSpecs> GenerateFromClusterFile(const std::string& cluster_path) {
  WSYNC_ASSIGN_OR_RETURN(ClusterSpec cluster, LoadClusterSpec(cluster_path));
  WSYNC_ASSIGN_OR_RETURN(nlohmann::json config, ReadJsonDocument(cluster.model_path));
  return GenerateSpecs(config, cluster);
}

}  // namespace wsync
