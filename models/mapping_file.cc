#include "models/mapping_file.h"

#include <fstream>
#include <set>
#include <sstream>

namespace wsync {
namespace {

// Rejects keys outside `allowed`; typos in a mapping must not pass silently.
Status CheckKeys(const nlohmann::json& j, const std::set<std::string>& allowed,
                 const std::string& where) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!allowed.count(it.key())) {
      return InvalidArgument(where + ": unknown key \"" + it.key() + "\"");
    }
  }
  return Status::Ok();
}

StatusOr<std::string> ReqString(const nlohmann::json& j, const char* key,
                                const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) {
    return InvalidArgument(where + ": \"" + key + "\" must be a string");
  }
  return it->get<std::string>();
}

StatusOr<int32_t> OptInt(const nlohmann::json& j, const char* key, int32_t fallback,
                         const std::string& where) {
  auto it = j.find(key);
  if (it == j.end()) return fallback;
  if (!it->is_number_integer() || it->get<int64_t>() < 0) {
    return InvalidArgument(where + ": \"" + key + "\" must be a non-negative integer");
  }
  return static_cast<int32_t>(it->get<int64_t>());
}

StatusOr<MappingPart> ParsePart(const nlohmann::json& j, const nlohmann::json& config,
                                const std::string& where) {
  if (!j.is_object()) return InvalidArgument(where + ": a part must be an object");
  WSYNC_RETURN_IF_ERROR(CheckKeys(j, {"source", "shards", "expert_dim"}, where));
  MappingPart part;
  WSYNC_ASSIGN_OR_RETURN(part.source, ReqString(j, "source", where));
  if (auto it = j.find("expert_dim"); it != j.end()) {
    WSYNC_ASSIGN_OR_RETURN(int32_t dim, OptInt(j, "expert_dim", 0, where));
    part.expert_dim = dim;
  }
  if (auto it = j.find("shards"); it != j.end()) {
    if (it->is_number_integer() && it->get<int64_t>() > 0) {
      part.shards = it->get<int64_t>();
    } else if (it->is_string() && it->get<std::string>().size() > 2 &&
               it->get<std::string>().front() == '{' && it->get<std::string>().back() == '}') {
      const std::string s = it->get<std::string>();
      const std::string key = s.substr(1, s.size() - 2);
      auto v = config.find(key);
      if (v == config.end() || !v->is_number_integer() || v->get<int64_t>() <= 0) {
        return InvalidArgument(where + ": shards \"" + s + "\" names \"" + key +
                               "\", which the model config lacks or is not a positive integer");
      }
      part.shards = v->get<int64_t>();
    } else {
      return InvalidArgument(where + ": shards must be a positive integer or \"{config_key}\"");
    }
  }
  return part;
}

StatusOr<MappingRule> ParseRule(const nlohmann::json& j, const nlohmann::json& config,
                                const std::string& where) {
  if (!j.is_object()) return InvalidArgument(where + ": a rule must be an object");
  MappingRule rule;
  if (j.contains("skip")) {
    WSYNC_RETURN_IF_ERROR(CheckKeys(j, {"skip"}, where));
    rule.kind = MappingRule::Kind::kSkip;
    WSYNC_ASSIGN_OR_RETURN(rule.engine, ReqString(j, "skip", where));
    return rule;
  }
  WSYNC_ASSIGN_OR_RETURN(rule.engine, ReqString(j, "engine", where));
  const std::string at = where + " ('" + rule.engine + "')";
  const char* forms[] = {"source", "concat", "stack_experts", "tied"};
  int found = 0;
  for (const char* f : forms) found += j.contains(f) ? 1 : 0;
  if (found != 1) {
    return InvalidArgument(at + ": needs exactly one of source, concat, stack_experts, tied");
  }
  WSYNC_RETURN_IF_ERROR(
      CheckKeys(j, {"engine", "source", "concat", "stack_experts", "tied"}, at));
  if (j.contains("source") || j.contains("tied")) {
    const bool tied = j.contains("tied");
    rule.kind = tied ? MappingRule::Kind::kTied : MappingRule::Kind::kDirect;
    MappingPart part;
    WSYNC_ASSIGN_OR_RETURN(part.source, ReqString(j, tied ? "tied" : "source", at));
    rule.parts.push_back(std::move(part));
    return rule;
  }
  const bool concat = j.contains("concat");
  const nlohmann::json& body = j.at(concat ? "concat" : "stack_experts");
  const std::string bat = at + (concat ? ": concat" : ": stack_experts");
  if (!body.is_object()) return InvalidArgument(bat + " must be an object");
  WSYNC_RETURN_IF_ERROR(CheckKeys(body, {"dim", "parts"}, bat));
  rule.kind = concat ? MappingRule::Kind::kConcat : MappingRule::Kind::kStackExperts;
  WSYNC_ASSIGN_OR_RETURN(rule.concat_dim, OptInt(body, "dim", 0, bat));
  auto parts = body.find("parts");
  if (parts == body.end() || !parts->is_array() || parts->empty()) {
    return InvalidArgument(bat + ": \"parts\" must be a non-empty array");
  }
  for (size_t i = 0; i < parts->size(); ++i) {
    WSYNC_ASSIGN_OR_RETURN(MappingPart part,
                           ParsePart((*parts)[i], config, bat + " part " + std::to_string(i)));
    rule.parts.push_back(std::move(part));
  }
  return rule;
}

StatusOr<QuantRule> ParseQuant(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) return InvalidArgument(where + ": must be an object");
  WSYNC_RETURN_IF_ERROR(CheckKeys(j, {"dtype", "block", "scale_dtype", "scale_suffix"}, where));
  QuantRule q;
  WSYNC_ASSIGN_OR_RETURN(std::string dtype, ReqString(j, "dtype", where));
  auto dt = ParseDType(dtype);
  if (!dt) return InvalidArgument(where + ": unknown dtype \"" + dtype + "\"");
  q.dtype = *dt;
  if (auto it = j.find("block"); it != j.end()) {
    if (!it->is_array() || it->size() != 2 || !(*it)[0].is_number_integer() ||
        !(*it)[1].is_number_integer() || (*it)[0].get<int64_t>() <= 0 ||
        (*it)[1].get<int64_t>() <= 0) {
      return InvalidArgument(where + ": block must be two positive integers");
    }
    q.block_rows = (*it)[0].get<int64_t>();
    q.block_cols = (*it)[1].get<int64_t>();
  }
  if (j.contains("scale_dtype")) {
    WSYNC_ASSIGN_OR_RETURN(std::string s, ReqString(j, "scale_dtype", where));
    auto sd = ParseDType(s);
    if (!sd) return InvalidArgument(where + ": unknown scale_dtype \"" + s + "\"");
    q.scale_dtype = *sd;
  }
  if (j.contains("scale_suffix")) {
    WSYNC_ASSIGN_OR_RETURN(q.scale_suffix, ReqString(j, "scale_suffix", where));
  }
  return q;
}

}  // namespace

StatusOr<MappingSpec> ParseMappingDocument(const nlohmann::json& doc,
                                           const nlohmann::json& config,
                                           const std::string& origin) {
  if (!doc.is_object()) return InvalidArgument(origin + ": must be a JSON object");
  WSYNC_RETURN_IF_ERROR(CheckKeys(doc, {"schema", "name", "rules", "quantize"}, origin));
  WSYNC_ASSIGN_OR_RETURN(std::string schema, ReqString(doc, "schema", origin));
  if (schema != "wsync.mapping/v1") {
    return InvalidArgument(origin + ": schema is \"" + schema + "\", expected \"wsync.mapping/v1\"");
  }
  MappingSpec spec;
  WSYNC_ASSIGN_OR_RETURN(spec.name, ReqString(doc, "name", origin));
  auto rules = doc.find("rules");
  if (rules == doc.end() || !rules->is_array()) {
    return InvalidArgument(origin + ": \"rules\" must be an array");
  }
  for (size_t i = 0; i < rules->size(); ++i) {
    WSYNC_ASSIGN_OR_RETURN(MappingRule rule,
                           ParseRule((*rules)[i], config, origin + ": rule " + std::to_string(i)));
    spec.rules.push_back(std::move(rule));
  }
  if (auto q = doc.find("quantize"); q != doc.end()) {
    if (!q->is_array()) return InvalidArgument(origin + ": \"quantize\" must be an array");
    for (size_t i = 0; i < q->size(); ++i) {
      WSYNC_ASSIGN_OR_RETURN(QuantRule rule,
                             ParseQuant((*q)[i], origin + ": quantize " + std::to_string(i)));
      spec.quant.push_back(rule);
    }
  }
  return spec;
}

StatusOr<nlohmann::json> ReadJsonDocument(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound(path + ": cannot open file");
  std::stringstream buf;
  buf << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(buf.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument(path + ": not valid JSON");
  return j;
}

StatusOr<MappingSpec> LoadMappingFile(const std::string& path, const nlohmann::json& config) {
  WSYNC_ASSIGN_OR_RETURN(nlohmann::json doc, ReadJsonDocument(path));
  return ParseMappingDocument(doc, config, path);
}

}  // namespace wsync
