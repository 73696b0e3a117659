#include "models/cluster_spec.h"

#include <filesystem>
#include <set>

#include "models/mapping_file.h"

namespace wsync {
namespace {

// Strict field reading for one object: every read key is remembered so that
// Finish() can reject the rest.
class Fields {
 public:
  Fields(const nlohmann::json& j, std::string where) : j_(j), where_(std::move(where)) {}

  void Int(const char* key, int32_t* out, bool required) {
    known_.insert(key);
    auto it = j_.find(key);
    if (it == j_.end()) {
      if (required) Fail(std::string("missing \"") + key + "\"");
      return;
    }
    if (!it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > (1 << 24)) {
      Fail(std::string("\"") + key + "\" must be a positive integer, got " + it->dump());
      return;
    }
    *out = static_cast<int32_t>(it->get<int64_t>());
  }
  void Str(const char* key, std::string* out, bool required) {
    known_.insert(key);
    auto it = j_.find(key);
    if (it == j_.end()) {
      if (required) Fail(std::string("missing \"") + key + "\"");
      return;
    }
    if (!it->is_string()) {
      Fail(std::string("\"") + key + "\" must be a string");
      return;
    }
    *out = it->get<std::string>();
  }
  void Dtype(const char* key, DType* out, bool required) {
    std::string s;
    Str(key, &s, required);
    if (s.empty()) return;
    auto dt = ParseDType(s);
    if (!dt) {
      Fail(std::string("\"") + key + "\" is \"" + s + "\"; use bf16, fp16, fp32 or fp8_e4m3");
      return;
    }
    *out = *dt;
  }
  const nlohmann::json* Object(const char* key) {
    known_.insert(key);
    auto it = j_.find(key);
    if (it == j_.end() || !it->is_object()) {
      Fail(std::string("\"") + key + "\" must be an object");
      return nullptr;
    }
    return &*it;
  }
  void Fail(const std::string& what) {
    if (status_.ok()) status_ = InvalidArgument(where_ + ": " + what);
  }
  Status Finish() {
    if (!status_.ok()) return status_;
    for (auto it = j_.begin(); it != j_.end(); ++it) {
      if (!known_.count(it.key())) {
        return InvalidArgument(where_ + ": unknown key \"" + it.key() + "\"");
      }
    }
    return Status::Ok();
  }

 private:
  const nlohmann::json& j_;
  std::string where_;
  std::set<std::string> known_;
  Status status_;
};

std::string Resolve(const std::string& base_dir, const std::string& p) {
  if (p.empty() || base_dir.empty() || std::filesystem::path(p).is_absolute()) return p;
  return (std::filesystem::path(base_dir) / p).lexically_normal().string();
}

}  // namespace

StatusOr<ClusterSpec> ParseClusterSpec(const nlohmann::json& j, const std::string& base_dir,
                                       const std::string& origin) {
  if (!j.is_object()) return InvalidArgument(origin + ": must be a JSON object");
  ClusterSpec spec;
  std::string schema;
  Fields top(j, origin);
  top.Str("schema", &schema, true);
  top.Str("name", &spec.name, false);
  top.Str("model", &spec.model_path, true);
  top.Str("mapping", &spec.mapping_path, true);
  const nlohmann::json* tj = top.Object("trainer");
  const nlohmann::json* ij = top.Object("inference");
  WSYNC_RETURN_IF_ERROR(top.Finish());
  if (schema != "wsync.cluster/v1") {
    return InvalidArgument(origin + ": schema is \"" + schema +
                           "\", expected \"wsync.cluster/v1\"");
  }

  Fields t(*tj, origin + ": trainer");
  TrainerLayout& tl = spec.trainer;
  t.Int("gpus", &tl.gpus, true);
  t.Int("gpus_per_node", &tl.gpus_per_node, true);
  t.Int("nics_per_node", &tl.nics_per_node, true);
  t.Int("fsdp", &tl.fsdp, true);
  t.Int("pp", &tl.pp, false);
  t.Int("ep", &tl.ep, false);
  t.Dtype("dtype", &tl.dtype, false);
  t.Str("expert_layout", &tl.expert_layout, false);
  t.Str("param_names", &tl.param_names, false);
  t.Str("rank_order", &tl.rank_order, false);
  WSYNC_RETURN_IF_ERROR(t.Finish());

  Fields i(*ij, origin + ": inference");
  InferenceLayout& il = spec.inference;
  i.Int("gpus", &il.gpus, true);
  i.Int("gpus_per_node", &il.gpus_per_node, true);
  i.Int("nics_per_node", &il.nics_per_node, true);
  i.Int("gpus_per_instance", &il.gpus_per_instance, true);
  i.Int("tp", &il.tp, true);
  i.Int("ep", &il.ep, false);
  i.Dtype("dtype", &il.dtype, false);
  WSYNC_RETURN_IF_ERROR(i.Finish());

  spec.model_path = Resolve(base_dir, spec.model_path);
  spec.mapping_path = Resolve(base_dir, spec.mapping_path);
  return spec;
}

StatusOr<ClusterSpec> LoadClusterSpec(const std::string& path) {
  WSYNC_ASSIGN_OR_RETURN(nlohmann::json j, ReadJsonDocument(path));
  const std::string dir = std::filesystem::path(path).parent_path().string();
  return ParseClusterSpec(j, dir.empty() ? "." : dir, path);
}

nlohmann::json ClusterSpecToJson(const ClusterSpec& s) {
  const TrainerLayout& t = s.trainer;
  const InferenceLayout& i = s.inference;
  return {
      {"schema", "wsync.cluster/v1"},
      {"name", s.name},
      {"model", s.model_path},
      {"mapping", s.mapping_path},
      {"trainer",
       {{"gpus", t.gpus}, {"gpus_per_node", t.gpus_per_node}, {"nics_per_node", t.nics_per_node},
        {"fsdp", t.fsdp}, {"pp", t.pp}, {"ep", t.ep}, {"dtype", std::string(DTypeName(t.dtype))},
        {"expert_layout", t.expert_layout}, {"param_names", t.param_names},
        {"rank_order", t.rank_order}}},
      {"inference",
       {{"gpus", i.gpus}, {"gpus_per_node", i.gpus_per_node}, {"nics_per_node", i.nics_per_node},
        {"gpus_per_instance", i.gpus_per_instance}, {"tp", i.tp}, {"ep", i.ep},
        {"dtype", std::string(DTypeName(i.dtype))}}},
  };
}

}  // namespace wsync
