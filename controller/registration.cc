#include "controller/registration.h"

#include <cstdlib>
#include <vector>

#include "routing/chunking.h"
#include "routing/dtype.h"
#include "routing/spec_io.h"
#include "routing/validate.h"

namespace wsync::controller {

using nlohmann::json;

namespace {

std::string TrainerWhere(int32_t rank) { return "trainer rank " + std::to_string(rank); }

bool IsIntArray(const json& j) {
  if (!j.is_array()) return false;
  for (const json& e : j)
    if (!e.is_number_integer()) return false;
  return true;
}

// The facts of a tensor every rank of its mesh must report identically.
json TensorFactsOf(const json& param) {
  json facts = json::object();
  for (const char* key : {"global_shape", "mesh", "placements", "mesh_group"})
    facts[key] = param.contains(key) ? param[key] : json();
  // Spellings differ ("bfloat16" vs "bf16"); compare the type, not the text.
  facts["dtype"] = param.contains("dtype") ? param["dtype"] : json();
  if (facts["dtype"].is_string()) {
    if (auto d = ParseDType(facts["dtype"].get<std::string>()))
      facts["dtype"] = std::string(DTypeName(*d));
  }
  return facts;
}

// Checks local_shape/local_offset against the torch.chunk shard, when the
// inputs are well formed; malformed inputs are left to the strict loader.
Status CheckLocalShard(const std::string& where, const json& param, const json& mesh) {
  if (!IsIntArray(param.value("global_shape", json())) || !IsIntArray(param.value("local_shape", json())) ||
      !IsIntArray(param.value("local_offset", json())) || !param.value("placements", json()).is_array() ||
      !IsIntArray(mesh.value("shape", json())) || !IsIntArray(mesh.value("coord", json())))
    return Status::Ok();
  const Shape global = param["global_shape"].get<Shape>();
  const Shape mesh_shape = mesh["shape"].get<Shape>();
  const std::vector<int64_t> coord = mesh["coord"].get<std::vector<int64_t>>();
  std::vector<Placement> placements;
  for (const json& p : param["placements"]) {
    Placement pl;
    if (!p.is_string() || !ParsePlacement(p.get<std::string>(), &pl)) return Status::Ok();
    if (pl.kind == Placement::Kind::kShard && (pl.dim < 0 || pl.dim >= static_cast<int32_t>(global.size())))
      return Status::Ok();
    placements.push_back(pl);
  }
  if (placements.size() != mesh_shape.size() || coord.size() != mesh_shape.size()) return Status::Ok();
  for (size_t i = 0; i < coord.size(); ++i)
    if (mesh_shape[i] <= 0 || coord[i] < 0 || coord[i] >= mesh_shape[i]) return Status::Ok();
  // Sizes the strict loader refuses (too large to chunk without overflow).
  if (!ShapeBytes(global, 1) || !ShapeBytes(mesh_shape, 1)) return Status::Ok();
  std::vector<Range> ranges;
  LocalShard(global, mesh_shape, coord, placements, &ranges);
  Shape want_shape, want_offset;
  bool empty = false;
  for (const Range& r : ranges) {
    want_shape.push_back(r.size);
    want_offset.push_back(r.offset);
    empty = empty || r.size == 0;
  }
  const Shape got_shape = param["local_shape"].get<Shape>();
  const Shape got_offset = param["local_offset"].get<Shape>();
  if (got_shape != want_shape || (!empty && got_offset != want_offset))
    return InvalidArgument(where + ": local_shape " + json(got_shape).dump() + " at local_offset " +
                           json(got_offset).dump() + " does not match placements " +
                           param["placements"].dump() + " on mesh '" + mesh.value("mesh", "") +
                           "' at coord " + json(coord).dump() + " (expected local_shape " +
                           json(want_shape).dump() + " at " + json(want_offset).dump() +
                           "); report the DTensor's own local shard");
  return Status::Ok();
}

}  // namespace

StatusOr<TrainerRegistration> TrainerRegistry::Check(const json& body) const {
  if (!body.is_object()) return InvalidArgument("trainer registration: body is not a JSON object");
  if (!body.contains("rank") || !body["rank"].is_number_integer())
    return InvalidArgument("trainer registration: missing integer 'rank'");
  const int64_t rank64 = body["rank"].get<int64_t>();
  if (rank64 < 0 || rank64 >= world_)
    return InvalidArgument("trainer registration: rank " + std::to_string(rank64) + " is outside 0.." +
                           std::to_string(world_ - 1) + " (the controller expects " +
                           std::to_string(world_) + " trainer ranks)");
  TrainerRegistration reg;
  reg.rank = static_cast<int32_t>(rank64);
  const std::string where = TrainerWhere(reg.rank);
  if (!body.contains("mesh_groups") || !body["mesh_groups"].is_array())
    return InvalidArgument(where + ": missing 'mesh_groups' (the trainer's wsync.trainer/v1 mesh_groups)");
  reg.mesh_groups = body["mesh_groups"];
  reg.rank_json = body;
  reg.rank_json.erase("mesh_groups");
  if (!mesh_groups_.is_null() && reg.mesh_groups != mesh_groups_)
    return InvalidArgument(where + ": mesh_groups " + reg.mesh_groups.dump() +
                           " differ from " + mesh_groups_.dump() + " registered by other ranks");
  const json meshes = body.value("meshes", json::array());
  const json params = body.value("params", json::array());
  if (!meshes.is_array() || !params.is_array())
    return InvalidArgument(where + ": 'meshes' and 'params' must be arrays");

  std::map<std::string, const json*> own_meshes;
  for (const json& m : meshes) {
    if (!m.is_object() || !m.contains("mesh") || !m["mesh"].is_string())
      return InvalidArgument(where + ": every entry of 'meshes' needs a string 'mesh'");
    const std::string id = m["mesh"].get<std::string>();
    own_meshes[id] = &m;
    auto it = meshes_.find(id);
    if (it == meshes_.end()) continue;
    const MeshFacts& f = it->second;
    const std::string mw = where + ": mesh '" + id + "'";
    if (m.value("shape", json()) != f.shape)
      return InvalidArgument(mw + ": shape " + m.value("shape", json()).dump() + " differs from " +
                             f.shape.dump() + " on " + TrainerWhere(f.rank));
    if (m.value("dim_names", json()) != f.dim_names)
      return InvalidArgument(mw + ": dim_names " + m.value("dim_names", json()).dump() + " differ from " +
                             f.dim_names.dump() + " on " + TrainerWhere(f.rank));
    auto c = f.coords.find(m.value("coord", json()).dump());
    if (c != f.coords.end())
      return InvalidArgument(mw + ": coord " + m.value("coord", json()).dump() + " is already taken by " +
                             TrainerWhere(c->second) + "; every rank needs its own coordinate");
  }

  for (const json& p : params) {
    if (!p.is_object() || !p.contains("name") || !p["name"].is_string())
      return InvalidArgument(where + ": every entry of 'params' needs a string 'name'");
    const std::string tw = where + ": tensor '" + p["name"].get<std::string>() + "'";
    const json facts = TensorFactsOf(p);
    auto it = tensors_.find(p["name"].get<std::string>());
    if (it != tensors_.end() && facts != it->second.facts) {
      for (auto& [key, value] : facts.items()) {
        if (value != it->second.facts[key])
          return InvalidArgument(tw + ": " + key + " " + value.dump() + " differs from " +
                                 it->second.facts[key].dump() + " on " + TrainerWhere(it->second.rank) +
                                 "; every rank must report the same tensor metadata");
      }
    }
    if (p.contains("mesh") && p["mesh"].is_string()) {
      auto m = own_meshes.find(p["mesh"].get<std::string>());
      if (m == own_meshes.end())
        return InvalidArgument(tw + ": mesh '" + p["mesh"].get<std::string>() +
                               "' is not among this rank's 'meshes'");
      WSYNC_RETURN_IF_ERROR(CheckLocalShard(tw, p, *m->second));
    }
  }
  return reg;
}

void TrainerRegistry::Add(TrainerRegistration reg) {
  if (ranks_.count(reg.rank)) Remove(reg.rank);
  mesh_groups_ = reg.mesh_groups;
  Index(reg.rank, reg.rank_json);
  ranks_[reg.rank] = std::make_shared<const json>(std::move(reg.rank_json));
}

void TrainerRegistry::Remove(int32_t rank) {
  if (ranks_.erase(rank)) Rebuild();
}

void TrainerRegistry::Index(int32_t rank, const json& rank_json) {
  for (const json& m : rank_json.value("meshes", json::array())) {
    const std::string id = m.value("mesh", "");
    auto [it, inserted] = meshes_.try_emplace(id);
    if (inserted) {
      it->second.rank = rank;
      it->second.shape = m.value("shape", json());
      it->second.dim_names = m.value("dim_names", json());
    }
    it->second.coords.emplace(m.value("coord", json()).dump(), rank);
  }
  for (const json& p : rank_json.value("params", json::array()))
    tensors_.try_emplace(p.value("name", ""), TensorFacts{rank, TensorFactsOf(p)});
}

void TrainerRegistry::Rebuild() {
  tensors_.clear();
  meshes_.clear();
  if (ranks_.empty()) mesh_groups_ = json();
  for (const auto& [rank, j] : ranks_) Index(rank, *j);
}

StatusOr<int32_t> CheckInferenceRegistration(const json& body, int32_t world) {
  if (!body.is_object()) return InvalidArgument("inference registration: body is not a JSON object");
  if (!body.contains("rank") || !body["rank"].is_number_integer())
    return InvalidArgument("inference registration: missing integer 'rank'");
  const int64_t rank = body["rank"].get<int64_t>();
  if (rank < 0 || rank >= world)
    return InvalidArgument("inference registration: rank " + std::to_string(rank) + " is outside 0.." +
                           std::to_string(world - 1) + " (the controller expects " +
                           std::to_string(world) + " inference ranks)");
  WSYNC_RETURN_IF_ERROR(ParseOneInferenceRank(body, "inference registrations").status());
  return static_cast<int32_t>(rank);
}

std::optional<Culprit> CulpritOf(const std::string& error) {
  for (const bool trainer : {true, false}) {
    const std::string prefix = trainer ? "trainer registrations: rank " : "inference registrations: rank ";
    if (error.compare(0, prefix.size(), prefix) != 0) continue;
    char* end = nullptr;
    const long rank = std::strtol(error.c_str() + prefix.size(), &end, 10);
    if (end == error.c_str() + prefix.size() || *end != ':') return std::nullopt;
    return Culprit{trainer, static_cast<int32_t>(rank)};
  }
  return std::nullopt;
}

StatusOr<AssembledWorld> AssembleWorld(const RankJsons& trainer_ranks, const json& mesh_groups,
                                       const RankJsons& inference_ranks) {
  // Read where they are: copying them into one document cost seconds at
  // Kimi-K2 scale.
  std::vector<const json*> trainers, inference;
  for (const auto& [rank, j] : trainer_ranks) trainers.push_back(j.get());
  for (const auto& [rank, j] : inference_ranks) inference.push_back(j.get());

  AssembledWorld world;
  WSYNC_ASSIGN_OR_RETURN(world.trainer, ParseTrainerSpec(mesh_groups, trainers, "trainer registrations"));
  WSYNC_ASSIGN_OR_RETURN(world.inference, ParseInferenceSpec(inference, "inference registrations"));
  world.trainer_text = ToJsonText(world.trainer);
  world.inference_text = ToJsonText(world.inference);
  return world;
}

}  // namespace wsync::controller
