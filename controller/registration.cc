#include "controller/registration.h"

#include <cstdlib>
#include <future>
#include <string_view>
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
constexpr const char* kTensorFacts[] = {"dtype", "global_shape", "mesh", "mesh_group", "placements"};

const json& EmptyArray() {
  static const json kEmpty = json::array();
  return kEmpty;
}

const json& Member(const json& obj, const char* key) {
  static const json kNull;
  auto it = obj.find(key);
  return it == obj.end() ? kNull : *it;
}

// One fact as compared; dtype spellings differ ("bfloat16" vs "bf16"):
// compare the type, not the text.
json FactOf(const json& param, const char* key) {
  const json& v = Member(param, key);
  if (std::string_view(key) == "dtype" && v.is_string())
    if (auto d = ParseDType(v.get_ref<const std::string&>())) return std::string(DTypeName(*d));
  return v;
}

bool SameFact(const json& a, const json& b, const char* key) {
  if (std::string_view(key) != "dtype") return Member(a, key) == Member(b, key);  // no copies
  return FactOf(a, key) == FactOf(b, key);
}

// Checks local_shape/local_offset against the torch.chunk shard, when the
// inputs are well formed; malformed inputs are left to the strict loader.
Status CheckLocalShard(const std::string& where, const json& param, const json& mesh) {
  if (!IsIntArray(Member(param, "global_shape")) || !IsIntArray(Member(param, "local_shape")) ||
      !IsIntArray(Member(param, "local_offset")) || !Member(param, "placements").is_array() ||
      !IsIntArray(Member(mesh, "shape")) || !IsIntArray(Member(mesh, "coord")))
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

StatusOr<TrainerRegistration> TrainerRegistry::Check(json body) const {
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
  if (!mesh_groups_.is_null() && body["mesh_groups"] != mesh_groups_)
    return InvalidArgument(where + ": mesh_groups " + body["mesh_groups"].dump() +
                           " differ from " + mesh_groups_.dump() + " registered by other ranks");
  // Absent is empty; references, never copies, of what may be 100 KB.
  const json& meshes = Member(body, "meshes").is_null() ? EmptyArray() : Member(body, "meshes");
  const json& params = Member(body, "params").is_null() ? EmptyArray() : Member(body, "params");
  if (!meshes.is_array() || !params.is_array())
    return InvalidArgument(where + ": 'meshes' and 'params' must be arrays");

  std::map<std::string, const json*> own_meshes;
  for (const json& m : meshes) {
    if (!m.is_object() || !m.contains("mesh") || !m["mesh"].is_string())
      return InvalidArgument(where + ": every entry of 'meshes' needs a string 'mesh'");
    const std::string& id = m["mesh"].get_ref<const std::string&>();
    own_meshes[id] = &m;
    auto it = meshes_.find(id);
    if (it == meshes_.end()) continue;
    const MeshFacts& f = it->second;
    const std::string mw = where + ": mesh '" + id + "'";
    if (Member(m, "shape") != f.shape)
      return InvalidArgument(mw + ": shape " + Member(m, "shape").dump() + " differs from " +
                             f.shape.dump() + " on " + TrainerWhere(f.rank));
    if (Member(m, "dim_names") != f.dim_names)
      return InvalidArgument(mw + ": dim_names " + Member(m, "dim_names").dump() + " differ from " +
                             f.dim_names.dump() + " on " + TrainerWhere(f.rank));
    auto c = f.coords.find(Member(m, "coord").dump());
    if (c != f.coords.end())
      return InvalidArgument(mw + ": coord " + Member(m, "coord").dump() + " is already taken by " +
                             TrainerWhere(c->second) + "; every rank needs its own coordinate");
  }

  for (const json& p : params) {
    if (!p.is_object() || !p.contains("name") || !p["name"].is_string())
      return InvalidArgument(where + ": every entry of 'params' needs a string 'name'");
    const std::string& name = p["name"].get_ref<const std::string&>();
    auto it = tensors_.find(name);
    if (it != tensors_.end()) {
      for (const char* key : kTensorFacts) {
        if (SameFact(p, *it->second.param, key)) continue;
        return InvalidArgument(where + ": tensor '" + name + "': " + key + " " + FactOf(p, key).dump() +
                               " differs from " + FactOf(*it->second.param, key).dump() + " on " +
                               TrainerWhere(it->second.rank) + "; every rank must report the same tensor metadata");
      }
    }
    const json& mesh = Member(p, "mesh");
    if (mesh.is_string()) {
      auto m = own_meshes.find(mesh.get_ref<const std::string&>());
      if (m == own_meshes.end())
        return InvalidArgument(where + ": tensor '" + name + "': mesh '" + mesh.get_ref<const std::string&>() +
                               "' is not among this rank's 'meshes'");
      WSYNC_RETURN_IF_ERROR(CheckLocalShard(where + ": tensor '" + name + "'", p, *m->second));
    }
  }
  reg.mesh_groups = std::move(body["mesh_groups"]);
  body.erase("mesh_groups");
  reg.rank_json = std::move(body);
  return reg;
}

void TrainerRegistry::Add(TrainerRegistration reg) {
  if (ranks_.count(reg.rank)) Remove(reg.rank);
  mesh_groups_ = std::move(reg.mesh_groups);
  auto kept = std::make_shared<const json>(std::move(reg.rank_json));
  Index(reg.rank, *kept);  // points into the kept document
  ranks_[reg.rank] = std::move(kept);
}

void TrainerRegistry::Remove(int32_t rank) {
  if (ranks_.erase(rank)) Rebuild();
}

void TrainerRegistry::Index(int32_t rank, const json& rank_json) {
  const json& meshes = Member(rank_json, "meshes").is_array() ? Member(rank_json, "meshes") : EmptyArray();
  for (const json& m : meshes) {
    const std::string id = m.value("mesh", "");
    auto [it, inserted] = meshes_.try_emplace(id);
    if (inserted) {
      it->second.rank = rank;
      it->second.shape = Member(m, "shape");
      it->second.dim_names = Member(m, "dim_names");
    }
    it->second.coords.emplace(Member(m, "coord").dump(), rank);
  }
  const json& params = Member(rank_json, "params");
  if (!params.is_array()) return;
  for (const json& p : params) {
    const json& name = Member(p, "name");
    tensors_.try_emplace(name.is_string() ? name.get_ref<const std::string&>() : std::string(), TensorFacts{rank, &p});
  }
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

  // The two sides are independent: read at once (each ~0.4 s at Kimi-K2
  // scale). Trainer errors first, as when read one after the other.
  AssembledWorld world;
  std::future<StatusOr<InferenceSpec>> inference_spec = std::async(std::launch::async, [&] {
    StatusOr<InferenceSpec> spec = ParseInferenceSpec(inference, "inference registrations");
    if (spec.ok()) world.inference_text = ToJsonText(*spec);
    return spec;
  });
  StatusOr<TrainerSpec> trainer_spec = ParseTrainerSpec(mesh_groups, trainers, "trainer registrations");
  if (trainer_spec.ok()) world.trainer_text = ToJsonText(*trainer_spec);
  StatusOr<InferenceSpec> inference_read = inference_spec.get();
  WSYNC_ASSIGN_OR_RETURN(world.trainer, std::move(trainer_spec));
  WSYNC_ASSIGN_OR_RETURN(world.inference, std::move(inference_read));
  return world;
}

}  // namespace wsync::controller
