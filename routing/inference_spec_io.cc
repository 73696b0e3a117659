// wsync.inference/v1 <-> InferenceSpec.
#include <algorithm>

#include "routing/json_reader.h"
#include "routing/json_text.h"
#include "routing/spec_io.h"
#include "routing/validate.h"

namespace wsync {

using nlohmann::json;

namespace {

constexpr char kInferenceSchema[] = "wsync.inference/v1";

Status ParseTensor(const json& j, const std::string& rank_where, InferenceTensor* t) {
  std::string where = rank_where;
  if (j.is_object() && j.contains("name") && j["name"].is_string())
    where += ": tensor '" + Excerpt(j["name"].get<std::string>(), 128) + "'";
  JsonObjectReader r(j, where);
  r.Name("name", &t->name);
  r.IntArray("shape", &t->shape);
  r.Dtype("dtype", &t->dtype);
  r.Str("region", &t->where.region);
  r.Uint("offset", &t->where.offset);
  if (const json* tp = r.Object("tp", false)) {
    JsonObjectReader tr(*tp, where + ": tp");
    TpSlice s;
    tr.Int32("dim", &s.dim);
    tr.Int32("rank", &s.rank);
    tr.Int32("size", &s.size);
    WSYNC_RETURN_IF_ERROR(tr.Finish());
    t->tp = s;
  }
  if (const json* ex = r.Object("experts", false)) {
    JsonObjectReader er(*ex, where + ": experts");
    ExpertRange e;
    er.Int("start", &e.start);
    er.Int("end", &e.end);
    WSYNC_RETURN_IF_ERROR(er.Finish());
    t->experts = e;
  }
  if (const json* sc = r.Object("scale", false)) {
    JsonObjectReader sr(*sc, where + ": scale");
    ScaleTensor s;
    sr.Name("name", &s.name);
    sr.IntArray("shape", &s.shape);
    sr.Dtype("dtype", &s.dtype, false);
    sr.Str("region", &s.where.region);
    sr.Uint("offset", &s.where.offset);
    WSYNC_RETURN_IF_ERROR(sr.Finish());
    t->scale = std::move(s);
  }
  return r.Finish();
}

Status ParseRank(const json& j, const std::string& source, size_t index, InferenceRank* rank) {
  std::string where = source + ": ranks[" + std::to_string(index) + "]";
  if (j.is_object() && j.contains("rank") && j["rank"].is_number_integer())
    where = source + ": rank " + std::to_string(j["rank"].get<int64_t>());
  JsonObjectReader r(j, where);
  r.Int32("rank", &rank->rank);
  r.Int32("instance", &rank->instance, false);
  r.Str("host", &rank->host);
  r.Int32("gpu", &rank->gpu, false);
  r.Int32("nic", &rank->nic, false);
  std::string pacing = PacingName(Pacing::kPush);
  r.Str("pacing", &pacing, false);
  const json* mapping = r.Object("mapping", false);
  const json* regions = r.Array("regions");
  const json* tensors = r.Array("tensors");
  WSYNC_RETURN_IF_ERROR(r.Finish());
  std::optional<Pacing> paced = ParsePacing(pacing);
  if (!paced) return InvalidArgument(where + ": 'pacing' is '" + pacing + "'; expected push, live or shadow");
  rank->pacing = *paced;
  if (mapping) {
    WSYNC_ASSIGN_OR_RETURN(MappingSpec spec, ParseMappingSpec(*mapping, where + ": mapping"));
    rank->mapping = std::move(spec);
  }
  for (size_t i = 0; i < regions->size(); ++i) {
    JsonObjectReader rr((*regions)[i], where + ": regions[" + std::to_string(i) + "]");
    MemoryRegion m;
    rr.Name("id", &m.id);
    rr.Uint("size", &m.size);
    rr.Str("descriptor", &m.descriptor, false);
    WSYNC_RETURN_IF_ERROR(rr.Finish());
    rank->regions.push_back(std::move(m));
  }
  rank->tensors.resize(tensors->size());
  for (size_t i = 0; i < tensors->size(); ++i)
    WSYNC_RETURN_IF_ERROR(ParseTensor((*tensors)[i], where, &rank->tensors[i]));
  return Status::Ok();
}

json RegionFields(json j, const RegionRef& where) {
  j["region"] = where.region;
  j["offset"] = where.offset;
  return j;
}

}  // namespace

StatusOr<InferenceSpec> ParseInferenceSpec(const json& j, const std::string& source) {
  JsonObjectReader r(j, source);
  std::string schema;
  if (r.Str("schema", &schema, false) && schema != kInferenceSchema)
    r.Fail("schema is '" + schema + "', expected '" + kInferenceSchema + "'");
  const json* ranks = r.Array("ranks");
  WSYNC_RETURN_IF_ERROR(r.Finish());
  std::vector<const json*> each;
  for (const json& rank : *ranks) each.push_back(&rank);
  return ParseInferenceSpec(each, source);
}

StatusOr<InferenceSpec> ParseInferenceSpec(const std::vector<const json*>& ranks, const std::string& source) {
  InferenceSpec spec;
  spec.ranks.resize(ranks.size());
  for (size_t i = 0; i < ranks.size(); ++i)
    WSYNC_RETURN_IF_ERROR(ParseRank(*ranks[i], source, i, &spec.ranks[i]));
  std::stable_sort(spec.ranks.begin(), spec.ranks.end(),
                   [](const InferenceRank& a, const InferenceRank& b) { return a.rank < b.rank; });
  WSYNC_RETURN_IF_ERROR(ValidateInferenceSpec(spec, source));
  return spec;
}

StatusOr<InferenceRank> ParseOneInferenceRank(const json& entry, const std::string& source) {
  if (!entry.is_object() || !entry.contains("rank") || !entry["rank"].is_number_integer())
    return InvalidArgument(source + ": a rank entry needs an integer 'rank'");
  const int64_t rank = entry["rank"].get<int64_t>();
  if (rank < 0 || rank > INT32_MAX) return InvalidArgument(source + ": rank " + std::to_string(rank) + " is negative or too large");
  // Read where it is (a registration is ~200 KB at Kimi-K2 scale), validated
  // as a one-rank world numbered 0, then given its number back (in the rank
  // and in the message).
  StatusOr<InferenceSpec> spec = InferenceSpec{};
  spec->ranks.resize(1);
  Status read = ParseRank(entry, source, 0, &spec->ranks[0]);
  if (read.ok()) {
    spec->ranks[0].rank = 0;
    read = ValidateInferenceSpec(*spec, source);
  }
  if (!read.ok()) spec = read;
  if (!spec.ok()) {
    std::string msg = spec.status().message();
    const std::string as_zero = source + ": rank 0";
    if (msg.compare(0, as_zero.size(), as_zero) == 0)
      msg = source + ": rank " + std::to_string(rank) + msg.substr(as_zero.size());
    return InvalidArgument(msg);
  }
  InferenceRank r = std::move(spec->ranks[0]);
  r.rank = static_cast<int32_t>(rank);
  return r;
}

StatusOr<InferenceSpec> ParseInferenceSpecFromFile(const std::string& path) {
  WSYNC_ASSIGN_OR_RETURN(json j, ReadJsonFile(path));
  return ParseInferenceSpec(j, path);
}

json ToJson(const InferenceSpec& spec) {
  json ranks = json::array();
  for (const InferenceRank& rank : spec.ranks) {
    json regions = json::array();
    for (const MemoryRegion& m : rank.regions)
      regions.push_back({{"id", m.id}, {"size", m.size}, {"descriptor", m.descriptor}});
    json tensors = json::array();
    for (const InferenceTensor& t : rank.tensors) {
      json jt = RegionFields({{"name", t.name}, {"shape", t.shape},
                              {"dtype", std::string(DTypeName(t.dtype))}},
                             t.where);
      if (t.tp) jt["tp"] = {{"dim", t.tp->dim}, {"rank", t.tp->rank}, {"size", t.tp->size}};
      if (t.experts) jt["experts"] = {{"start", t.experts->start}, {"end", t.experts->end}};
      if (t.scale)
        jt["scale"] = RegionFields({{"name", t.scale->name}, {"shape", t.scale->shape},
                                    {"dtype", std::string(DTypeName(t.scale->dtype))}},
                                   t.scale->where);
      tensors.push_back(std::move(jt));
    }
    json jr = {{"rank", rank.rank}, {"instance", rank.instance}, {"host", rank.host},
               {"gpu", rank.gpu}, {"nic", rank.nic}, {"regions", std::move(regions)},
               {"tensors", std::move(tensors)}};
    if (rank.pacing != Pacing::kPush) jr["pacing"] = PacingName(rank.pacing);
    if (rank.mapping) jr["mapping"] = ToJson(*rank.mapping);
    ranks.push_back(std::move(jr));
  }
  return {{"schema", kInferenceSchema}, {"ranks", std::move(ranks)}};
}

std::string ToJsonText(const InferenceSpec& spec) {
  std::string out;
  out += "{\"ranks\":[";
  auto where = [&out](const RegionRef& w) {
    out += ",\"offset\":";
    AppendJsonInt(&out, w.offset);
    out += ",\"region\":";
    AppendJsonString(&out, w.region);
  };
  for (size_t ri = 0; ri < spec.ranks.size(); ++ri) {
    const InferenceRank& rank = spec.ranks[ri];
    if (ri > 0) out += ',';
    out += "{\"gpu\":";
    AppendJsonInt(&out, rank.gpu);
    out += ",\"host\":";
    AppendJsonString(&out, rank.host);
    out += ",\"instance\":";
    AppendJsonInt(&out, rank.instance);
    if (rank.mapping) {
      out += ",\"mapping\":";
      out += ToJson(*rank.mapping).dump();  // keys sorted, as ToJson(spec).dump() writes them
    }
    out += ",\"nic\":";
    AppendJsonInt(&out, rank.nic);
    if (rank.pacing != Pacing::kPush) {
      out += ",\"pacing\":";
      AppendJsonString(&out, PacingName(rank.pacing));
    }
    out += ",\"rank\":";
    AppendJsonInt(&out, rank.rank);
    out += ",\"regions\":[";
    for (size_t i = 0; i < rank.regions.size(); ++i) {
      const MemoryRegion& m = rank.regions[i];
      if (i > 0) out += ',';
      out += "{\"descriptor\":";
      AppendJsonString(&out, m.descriptor);
      out += ",\"id\":";
      AppendJsonString(&out, m.id);
      out += ",\"size\":";
      AppendJsonInt(&out, m.size);
      out += '}';
    }
    out += "],\"tensors\":[";
    for (size_t i = 0; i < rank.tensors.size(); ++i) {
      const InferenceTensor& t = rank.tensors[i];
      if (i > 0) out += ',';
      out += "{\"dtype\":";
      AppendJsonString(&out, DTypeName(t.dtype));
      if (t.experts) {
        out += ",\"experts\":{\"end\":";
        AppendJsonInt(&out, t.experts->end);
        out += ",\"start\":";
        AppendJsonInt(&out, t.experts->start);
        out += '}';
      }
      out += ",\"name\":";
      AppendJsonString(&out, t.name);
      where(t.where);
      if (t.scale) {
        out += ",\"scale\":{\"dtype\":";
        AppendJsonString(&out, DTypeName(t.scale->dtype));
        out += ",\"name\":";
        AppendJsonString(&out, t.scale->name);
        where(t.scale->where);
        out += ",\"shape\":";
        AppendJsonIntArray(&out, t.scale->shape);
        out += '}';
      }
      out += ",\"shape\":";
      AppendJsonIntArray(&out, t.shape);
      if (t.tp) {
        out += ",\"tp\":{\"dim\":";
        AppendJsonInt(&out, t.tp->dim);
        out += ",\"rank\":";
        AppendJsonInt(&out, t.tp->rank);
        out += ",\"size\":";
        AppendJsonInt(&out, t.tp->size);
        out += '}';
      }
      out += '}';
    }
    out += "]}";
  }
  out += "],\"schema\":";
  AppendJsonString(&out, kInferenceSchema);
  out += '}';
  return out;
}

}  // namespace wsync
