// wsync.mapping/v1 <-> MappingSpec.
#include "routing/json_reader.h"
#include "routing/spec_io.h"
#include "routing/validate.h"

namespace wsync {

using nlohmann::json;

namespace {

constexpr char kMappingSchema[] = "wsync.mapping/v1";

// `key` (shards, rope_interleaved_heads) is an integer or "{config_key}"
// looked up in the model config.
bool ReadCount(JsonObjectReader& r, const char* key, const json* config, std::optional<int64_t>* out) {
  const std::string k = std::string("'") + key + "'";
  const json* v = r.Raw(key, false);
  if (!v) return true;
  if (v->is_number_integer()) {
    *out = v->get<int64_t>();
    return true;
  }
  if (v->is_string()) {
    const std::string s = v->get<std::string>();
    if (s.size() > 2 && s.front() == '{' && s.back() == '}') {
      const std::string name = s.substr(1, s.size() - 2);
      if (!config) {
        r.Fail(k + " is '" + s + "' but no model config was given to resolve it");
        return false;
      }
      if (!config->is_object() || !config->contains(name) ||
          !(*config)[name].is_number_integer()) {
        r.Fail(k + " is '" + s + "' but the model config has no integer '" + name + "'");
        return false;
      }
      *out = (*config)[name].get<int64_t>();
      return true;
    }
  }
  r.Fail(k + " must be an integer or \"{config_key}\", got " + v->dump());
  return false;
}

// "chunk": {"dim": d, "index": i, "count": n}, all three required; ranges
// are checked by ValidateMapping, divisibility when planning.
Status ReadChunk(JsonObjectReader& r, std::optional<MappingPart::Chunk>* out) {
  const nlohmann::json* v = r.Object("chunk", false);
  if (!v) return Status::Ok();
  JsonObjectReader c(*v, r.where() + ": chunk");
  MappingPart::Chunk chunk;
  c.Int32("dim", &chunk.dim);
  c.Int("index", &chunk.index);
  c.Int("count", &chunk.count);
  WSYNC_RETURN_IF_ERROR(c.Finish());
  *out = chunk;
  return Status::Ok();
}

Status ParseParts(const json& j, const std::string& where, const json* config,
                  bool allow_expert_dim, std::vector<MappingPart>* parts) {
  if (!j.is_array() || j.empty())
    return InvalidArgument(where + ": 'parts' must be a non-empty array");
  for (size_t i = 0; i < j.size(); ++i) {
    JsonObjectReader r(j[i], where + ": parts[" + std::to_string(i) + "]");
    MappingPart p;
    r.Str("source", &p.source);
    if (allow_expert_dim) {
      int32_t d = 0;
      if (r.Int32("expert_dim", &d, false)) p.expert_dim = d;
    }
    ReadCount(r, "shards", config, &p.shards);
    if (!allow_expert_dim) ReadCount(r, "rope_interleaved_heads", config, &p.rope_interleaved_heads);
    WSYNC_RETURN_IF_ERROR(ReadChunk(r, &p.chunk));
    WSYNC_RETURN_IF_ERROR(r.Finish());
    parts->push_back(std::move(p));
  }
  return Status::Ok();
}

Status ParseRule(const json& j, const std::string& where_in, const json* config,
                 MappingRule* rule) {
  std::string where = where_in;
  if (j.is_object() && j.contains("engine") && j["engine"].is_string())
    where += ": rule '" + j["engine"].get<std::string>() + "'";
  JsonObjectReader r(j, where);
  if (r.Has("skip")) {
    rule->kind = MappingRule::Kind::kSkip;
    r.Str("skip", &rule->engine);
    return r.Finish();
  }
  r.Str("engine", &rule->engine);
  int kinds = r.Has("source") + r.Has("concat") + r.Has("stack_experts") + r.Has("tied");
  if (kinds != 1) {
    r.Fail("needs exactly one of 'source', 'concat', 'stack_experts', 'tied'");
    return r.Finish();
  }
  MappingPart part;
  if (r.Str("source", &part.source, false)) {
    rule->kind = MappingRule::Kind::kDirect;
    WSYNC_RETURN_IF_ERROR(ReadChunk(r, &part.chunk));
    ReadCount(r, "rope_interleaved_heads", config, &part.rope_interleaved_heads);
    rule->parts.push_back(part);
  } else if (r.Str("tied", &part.source, false)) {
    rule->kind = MappingRule::Kind::kTied;
    rule->parts.push_back(part);
  } else {
    const bool stack = r.Has("stack_experts");
    const json* body = r.Object(stack ? "stack_experts" : "concat");
    if (!body) return r.Finish();
    rule->kind = stack ? MappingRule::Kind::kStackExperts : MappingRule::Kind::kConcat;
    JsonObjectReader b(*body, where + (stack ? ": stack_experts" : ": concat"));
    rule->concat_dim = 0;
    b.Int32("dim", &rule->concat_dim, /*required=*/!stack);
    const json* parts = b.Array("parts");
    WSYNC_RETURN_IF_ERROR(b.Finish());
    WSYNC_RETURN_IF_ERROR(ParseParts(*parts, b.where(), config, stack, &rule->parts));
  }
  return r.Finish();
}

json ChunkToJson(const MappingPart::Chunk& c) {
  return {{"dim", c.dim}, {"index", c.index}, {"count", c.count}};
}

json PartToJson(const MappingPart& p) {
  json j = {{"source", p.source}};
  if (p.expert_dim) j["expert_dim"] = *p.expert_dim;
  if (p.shards) j["shards"] = *p.shards;
  if (p.chunk) j["chunk"] = ChunkToJson(*p.chunk);
  if (p.rope_interleaved_heads) j["rope_interleaved_heads"] = *p.rope_interleaved_heads;
  return j;
}

}  // namespace

StatusOr<MappingSpec> ParseMappingSpec(const json& j, const std::string& source,
                                       const json* model_config) {
  MappingSpec spec;
  JsonObjectReader r(j, source);
  std::string schema;
  if (r.Str("schema", &schema, false) && schema != kMappingSchema)
    r.Fail("schema is '" + schema + "', expected '" + kMappingSchema + "'");
  r.Str("name", &spec.name, false);
  const json* rules = r.Array("rules");
  const json* quant = r.Array("quantize", false);
  WSYNC_RETURN_IF_ERROR(r.Finish());
  spec.rules.resize(rules->size());
  for (size_t i = 0; i < rules->size(); ++i)
    WSYNC_RETURN_IF_ERROR(ParseRule((*rules)[i], source + ": rules[" + std::to_string(i) + "]",
                                    model_config, &spec.rules[i]));
  if (quant) {
    for (size_t i = 0; i < quant->size(); ++i) {
      JsonObjectReader q((*quant)[i], source + ": quantize[" + std::to_string(i) + "]");
      QuantRule qr;
      q.Dtype("dtype", &qr.dtype);
      std::vector<int64_t> block;
      if (q.IntArray("block", &block, false)) {
        if (block.size() != 2) {
          q.Fail("'block' must be [rows, cols]");
        } else {
          qr.block_rows = block[0];
          qr.block_cols = block[1];
        }
      }
      q.Dtype("scale_dtype", &qr.scale_dtype, false);
      q.Str("scale_suffix", &qr.scale_suffix, false);
      WSYNC_RETURN_IF_ERROR(q.Finish());
      spec.quant.push_back(std::move(qr));
    }
  }
  WSYNC_RETURN_IF_ERROR(ValidateMapping(spec, source));
  return spec;
}

StatusOr<MappingSpec> ParseMappingSpecFromFile(const std::string& path, const json* model_config) {
  WSYNC_ASSIGN_OR_RETURN(json j, ReadJsonFile(path));
  return ParseMappingSpec(j, path, model_config);
}

json ToJson(const MappingSpec& spec) {
  json rules = json::array();
  for (const MappingRule& rule : spec.rules) {
    switch (rule.kind) {
      case MappingRule::Kind::kSkip:
        rules.push_back({{"skip", rule.engine}});
        break;
      case MappingRule::Kind::kDirect: {
        json r = {{"engine", rule.engine}, {"source", rule.parts.empty() ? "" : rule.parts[0].source}};
        if (!rule.parts.empty() && rule.parts[0].chunk) r["chunk"] = ChunkToJson(*rule.parts[0].chunk);
        if (!rule.parts.empty() && rule.parts[0].rope_interleaved_heads)
          r["rope_interleaved_heads"] = *rule.parts[0].rope_interleaved_heads;
        rules.push_back(std::move(r));
        break;
      }
      case MappingRule::Kind::kTied:
        rules.push_back({{"engine", rule.engine},
                         {"tied", rule.parts.empty() ? "" : rule.parts[0].source}});
        break;
      case MappingRule::Kind::kConcat:
      case MappingRule::Kind::kStackExperts: {
        json parts = json::array();
        for (const MappingPart& p : rule.parts) parts.push_back(PartToJson(p));
        const bool stack = rule.kind == MappingRule::Kind::kStackExperts;
        rules.push_back({{"engine", rule.engine},
                         {stack ? "stack_experts" : "concat",
                          {{"dim", rule.concat_dim}, {"parts", std::move(parts)}}}});
        break;
      }
    }
  }
  json quant = json::array();
  for (const QuantRule& q : spec.quant)
    quant.push_back({{"dtype", std::string(DTypeName(q.dtype))},
                     {"block", {q.block_rows, q.block_cols}},
                     {"scale_dtype", std::string(DTypeName(q.scale_dtype))},
                     {"scale_suffix", q.scale_suffix}});
  return {{"schema", kMappingSchema}, {"name", spec.name}, {"rules", std::move(rules)},
          {"quantize", std::move(quant)}};
}

}  // namespace wsync
