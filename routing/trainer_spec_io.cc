// wsync.trainer/v1 <-> TrainerSpec, plus the shared helpers of spec_io.h.
#include <algorithm>
#include <cstdlib>

#include "routing/json_reader.h"
#include "routing/json_text.h"
#include "routing/spec_io.h"
#include "routing/validate.h"

namespace wsync {

using nlohmann::json;

namespace {
constexpr char kTrainerSchema[] = "wsync.trainer/v1";
}  // namespace

std::string PlacementToString(const Placement& p) {
  if (p.kind == Placement::Kind::kShard) return "Shard(" + std::to_string(p.dim) + ")";
  return "Replicate()";
}

bool ParsePlacement(const std::string& s, Placement* out) {
  if (s == "Replicate()" || s == "Replicate") {
    *out = Placement::Replicate();
    return true;
  }
  if (s.size() > 7 && s.compare(0, 6, "Shard(") == 0 && s.back() == ')') {
    const std::string num = s.substr(6, s.size() - 7);
    if (num.empty() || num.size() > 2 ||
        !std::all_of(num.begin(), num.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return false;
    *out = Placement::Shard(std::atoi(num.c_str()));
    return true;
  }
  return false;
}

Status WriteJsonFile(const json& j, const std::string& path, int indent) {
  return WriteJsonFileAtomic(j, path, indent);
}

namespace {

Status CheckSchema(JsonObjectReader& r, const char* expected) {
  std::string schema;
  if (r.Str("schema", &schema, /*required=*/false) && schema != expected)
    r.Fail("schema is '" + schema + "', expected '" + expected + "'");
  return Status::Ok();
}

Status ParseMeshCoord(const json& j, const std::string& where, MeshCoord* m) {
  JsonObjectReader r(j, where);
  r.Str("mesh", &m->mesh);
  r.IntArray("shape", &m->shape);
  r.StrArray("dim_names", &m->dim_names);
  r.IntArray("coord", &m->coord);
  return r.Finish();
}

Status ParseParam(const json& j, const std::string& rank_where, TrainerParam* p) {
  std::string where = rank_where;
  if (j.is_object() && j.contains("name") && j["name"].is_string())
    where += ": tensor '" + Excerpt(j["name"].get<std::string>(), 128) + "'";
  JsonObjectReader r(j, where);
  r.Name("name", &p->name);
  r.IntArray("global_shape", &p->global_shape);
  r.Dtype("dtype", &p->dtype);
  r.Str("mesh", &p->mesh);
  std::vector<std::string> placements;
  if (r.StrArray("placements", &placements)) {
    p->placements.clear();
    for (const std::string& s : placements) {
      Placement pl;
      if (!ParsePlacement(s, &pl)) {
        r.Fail("placement '" + s + "' is not Shard(d) or Replicate()");
        break;
      }
      p->placements.push_back(pl);
    }
  }
  r.IntArray("local_shape", &p->local_shape);
  r.IntArray("local_offset", &p->local_offset);
  r.Str("mesh_group", &p->mesh_group);
  return r.Finish();
}

Status ParseTrainerRank(const json& j, const std::string& source, size_t index,
                        TrainerRank* rank) {
  std::string where = source + ": ranks[" + std::to_string(index) + "]";
  if (j.is_object() && j.contains("rank") && j["rank"].is_number_integer())
    where = source + ": rank " + std::to_string(j["rank"].get<int64_t>());
  JsonObjectReader r(j, where);
  r.Int32("rank", &rank->rank);
  r.Str("host", &rank->host);
  r.Int32("gpu", &rank->gpu, false);
  r.Int32("nic", &rank->nic, false);
  const json* meshes = r.Array("meshes");
  const json* params = r.Array("params");
  WSYNC_RETURN_IF_ERROR(r.Finish());
  rank->meshes.resize(meshes->size());
  for (size_t i = 0; i < meshes->size(); ++i)
    WSYNC_RETURN_IF_ERROR(ParseMeshCoord((*meshes)[i], where + ": meshes[" + std::to_string(i) + "]",
                                         &rank->meshes[i]));
  rank->params.resize(params->size());
  for (size_t i = 0; i < params->size(); ++i)
    WSYNC_RETURN_IF_ERROR(ParseParam((*params)[i], where, &rank->params[i]));
  return Status::Ok();
}

}  // namespace

StatusOr<TrainerSpec> ParseTrainerSpec(const json& j, const std::string& source) {
  JsonObjectReader r(j, source);
  WSYNC_RETURN_IF_ERROR(CheckSchema(r, kTrainerSchema));
  const json* groups = r.Array("mesh_groups");
  const json* ranks = r.Array("ranks");
  WSYNC_RETURN_IF_ERROR(r.Finish());
  std::vector<const json*> each;
  for (const json& rank : *ranks) each.push_back(&rank);
  return ParseTrainerSpec(*groups, each, source);
}

StatusOr<TrainerSpec> ParseTrainerSpec(const json& groups, const std::vector<const json*>& ranks,
                                       const std::string& source) {
  TrainerSpec spec;
  if (!groups.is_array()) return InvalidArgument(source + ": 'mesh_groups' must be an array");
  for (size_t i = 0; i < groups.size(); ++i) {
    JsonObjectReader g(groups[i], source + ": mesh_groups[" + std::to_string(i) + "]");
    MeshGroupSpec mg;
    g.Str("name", &mg.name);
    g.Str("mesh", &mg.mesh);
    g.StrArray("gather_dims", &mg.gather_dims);
    WSYNC_RETURN_IF_ERROR(g.Finish());
    spec.mesh_groups.push_back(std::move(mg));
  }
  spec.ranks.resize(ranks.size());
  for (size_t i = 0; i < ranks.size(); ++i)
    WSYNC_RETURN_IF_ERROR(ParseTrainerRank(*ranks[i], source, i, &spec.ranks[i]));
  std::stable_sort(spec.ranks.begin(), spec.ranks.end(),
                   [](const TrainerRank& a, const TrainerRank& b) { return a.rank < b.rank; });
  WSYNC_RETURN_IF_ERROR(ValidateTrainerSpec(spec, source));
  return spec;
}

StatusOr<TrainerSpec> ParseTrainerSpecFromFile(const std::string& path) {
  WSYNC_ASSIGN_OR_RETURN(json j, ReadJsonFile(path));
  return ParseTrainerSpec(j, path);
}

json ToJson(const TrainerSpec& spec) {
  json groups = json::array();
  for (const MeshGroupSpec& g : spec.mesh_groups)
    groups.push_back({{"name", g.name}, {"mesh", g.mesh}, {"gather_dims", g.gather_dims}});
  json ranks = json::array();
  for (const TrainerRank& rank : spec.ranks) {
    json meshes = json::array();
    for (const MeshCoord& m : rank.meshes)
      meshes.push_back({{"mesh", m.mesh}, {"shape", m.shape}, {"dim_names", m.dim_names},
                        {"coord", m.coord}});
    json params = json::array();
    for (const TrainerParam& p : rank.params) {
      json placements = json::array();
      for (const Placement& pl : p.placements) placements.push_back(PlacementToString(pl));
      params.push_back({{"name", p.name},
                        {"global_shape", p.global_shape},
                        {"dtype", std::string(DTypeName(p.dtype))},
                        {"mesh", p.mesh},
                        {"placements", std::move(placements)},
                        {"local_shape", p.local_shape},
                        {"local_offset", p.local_offset},
                        {"mesh_group", p.mesh_group}});
    }
    ranks.push_back({{"rank", rank.rank}, {"host", rank.host}, {"gpu", rank.gpu},
                     {"nic", rank.nic}, {"meshes", std::move(meshes)},
                     {"params", std::move(params)}});
  }
  return {{"schema", kTrainerSchema}, {"mesh_groups", std::move(groups)},
          {"ranks", std::move(ranks)}};
}

std::string ToJsonText(const TrainerSpec& spec) {
  std::string out;
  out += "{\"mesh_groups\":[";
  for (size_t i = 0; i < spec.mesh_groups.size(); ++i) {
    const MeshGroupSpec& g = spec.mesh_groups[i];
    if (i > 0) out += ',';
    out += "{\"gather_dims\":";
    AppendJsonStringArray(&out, g.gather_dims);
    out += ",\"mesh\":";
    AppendJsonString(&out, g.mesh);
    out += ",\"name\":";
    AppendJsonString(&out, g.name);
    out += '}';
  }
  out += "],\"ranks\":[";
  for (size_t ri = 0; ri < spec.ranks.size(); ++ri) {
    const TrainerRank& rank = spec.ranks[ri];
    if (ri > 0) out += ',';
    out += "{\"gpu\":";
    AppendJsonInt(&out, rank.gpu);
    out += ",\"host\":";
    AppendJsonString(&out, rank.host);
    out += ",\"meshes\":[";
    for (size_t i = 0; i < rank.meshes.size(); ++i) {
      const MeshCoord& m = rank.meshes[i];
      if (i > 0) out += ',';
      out += "{\"coord\":";
      AppendJsonIntArray(&out, m.coord);
      out += ",\"dim_names\":";
      AppendJsonStringArray(&out, m.dim_names);
      out += ",\"mesh\":";
      AppendJsonString(&out, m.mesh);
      out += ",\"shape\":";
      AppendJsonIntArray(&out, m.shape);
      out += '}';
    }
    out += "],\"nic\":";
    AppendJsonInt(&out, rank.nic);
    out += ",\"params\":[";
    for (size_t i = 0; i < rank.params.size(); ++i) {
      const TrainerParam& p = rank.params[i];
      if (i > 0) out += ',';
      out += "{\"dtype\":";
      AppendJsonString(&out, DTypeName(p.dtype));
      out += ",\"global_shape\":";
      AppendJsonIntArray(&out, p.global_shape);
      out += ",\"local_offset\":";
      AppendJsonIntArray(&out, p.local_offset);
      out += ",\"local_shape\":";
      AppendJsonIntArray(&out, p.local_shape);
      out += ",\"mesh\":";
      AppendJsonString(&out, p.mesh);
      out += ",\"mesh_group\":";
      AppendJsonString(&out, p.mesh_group);
      out += ",\"name\":";
      AppendJsonString(&out, p.name);
      out += ",\"placements\":[";
      for (size_t k = 0; k < p.placements.size(); ++k) {
        if (k > 0) out += ',';
        AppendJsonString(&out, PlacementToString(p.placements[k]));
      }
      out += "]}";
    }
    out += "],\"rank\":";
    AppendJsonInt(&out, rank.rank);
    out += '}';
  }
  out += "],\"schema\":";
  AppendJsonString(&out, kTrainerSchema);
  out += '}';
  return out;
}

}  // namespace wsync
