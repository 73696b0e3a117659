// Trainer side of the generator: torchtitan-style FSDP2 x PP x EP.
// (Buffers such as a router's score bias are not sharded by FSDP2: every
// rank holds them whole, Replicate on the dense mesh.)
//
// Rank order is PP-major (torchtitan's mesh puts "pp" outermost): stage s owns
// ranks [s*F*E, (s+1)*F*E). Inside a stage, rank-local index i = f*E + e.
//   dense params:  mesh "pp{s}/dense"   [F*E]  ("dp_shard"),  Shard(0)
//   expert params: mesh "pp{s}/experts" [F, E] ("fsdp","ep"), Shard(1), Shard(0)
// Layers are split into contiguous stages, earlier stages taking the extra
// layer when they do not divide evenly; the embedding sits on the first
// stage, the final norm and lm_head on the last.
#include <string>
#include <vector>

#include "models/architecture.h"
#include "models/layout_builders.h"

namespace wsync {
namespace {

struct StageTemplate {
  std::string dense_mesh, expert_mesh;
  std::vector<TrainerParam> params;   // local_shape/offset filled per rank
  std::vector<bool> is_expert;
  std::vector<bool> is_buffer;
  bool has_experts = false;
};

// First layer of stage s of pp for `layers` layers.
int64_t StageBegin(int64_t layers, int64_t pp, int64_t s) {
  return s * (layers / pp) + std::min(s, layers % pp);
}

Status CheckLayout(const ModelDims& d, const TrainerLayout& t) {
  auto bad = [](const std::string& m) { return InvalidArgument("trainer: " + m); };
  if (t.fsdp < 1 || t.pp < 1 || t.ep < 1) return bad("fsdp, pp and ep must be >= 1");
  if (int64_t{t.fsdp} * t.pp * t.ep != t.gpus) {
    return bad("gpus (" + std::to_string(t.gpus) + ") must equal fsdp*pp*ep (" +
               std::to_string(int64_t{t.fsdp} * t.pp * t.ep) + ")");
  }
  if (t.gpus_per_node < 1 || t.nics_per_node < 1) {
    return bad("gpus_per_node and nics_per_node must be >= 1");
  }
  if (t.pp > d.layers) {
    return bad("pp (" + std::to_string(t.pp) + ") exceeds the model's " +
               std::to_string(d.layers) + " layers");
  }
  if (t.ep > 1 && !d.has_experts()) {
    return bad("ep is " + std::to_string(t.ep) +
               " but the model has no routed experts; set ep to 1");
  }
  if (t.expert_layout != "stacked" && t.expert_layout != "hf_fused") {
    return bad("expert_layout '" + t.expert_layout +
               "' is not one of \"stacked\", \"hf_fused\" (transformers 5.x fused experts)");
  }
  if (t.param_names != "hf" && t.param_names != "torchtitan") {
    return bad("param_names '" + t.param_names + "' is not one of \"hf\", \"torchtitan\"");
  }
  if (t.param_names == "torchtitan" && t.expert_layout != "stacked") {
    return bad("param_names \"torchtitan\" stores experts stacked (moe.experts.w1/w2/w3); "
               "set expert_layout to \"stacked\"");
  }
  if (t.rank_order != "ep_inner" && t.rank_order != "fsdp_inner") {
    return bad("rank_order '" + t.rank_order + "' is not one of \"ep_inner\", \"fsdp_inner\"");
  }
  if (t.dtype == DType::kFP8E4M3) return bad("dtype fp8_e4m3 is not a training dtype");
  return Status::Ok();
}

}  // namespace

Status BuildTrainerSpec(const ModelDims& d, const TrainerLayout& t, TrainerSpec* out) {
  WSYNC_RETURN_IF_ERROR(CheckLayout(d, t));
  TrainerFlavor flavor;
  flavor.hf_fused_experts = t.expert_layout == "hf_fused";
  flavor.torchtitan_names = t.param_names == "torchtitan";
  const std::vector<TrainerParamDef> defs = TrainerParams(d, flavor);
  const int64_t per_stage = int64_t{t.fsdp} * t.ep;

  std::vector<StageTemplate> stages(static_cast<size_t>(t.pp));
  TrainerSpec spec;
  for (int64_t s = 0; s < t.pp; ++s) {
    StageTemplate& st = stages[s];
    const std::string tag = "pp" + std::to_string(s);
    st.dense_mesh = tag + "/dense";
    st.expert_mesh = tag + "/experts";
    const int64_t lo = StageBegin(d.layers, t.pp, s), hi = StageBegin(d.layers, t.pp, s + 1);
    for (const TrainerParamDef& def : defs) {
      bool here = def.layer == kEmbedLayer   ? s == 0
                  : def.layer == kFinalLayer ? s == t.pp - 1
                                             : def.layer >= lo && def.layer < hi;
      if (!here) continue;
      TrainerParam p;
      p.name = def.name;
      p.global_shape = def.shape;
      p.dtype = def.fp32 ? DType::kFP32 : t.dtype;
      if (def.buffer) {
        p.mesh = st.dense_mesh;
        p.placements = {Placement::Replicate()};
      } else if (def.expert) {
        p.mesh = st.expert_mesh;
        p.placements = {Placement::Shard(1), Placement::Shard(0)};
        st.has_experts = true;
      } else {
        p.mesh = st.dense_mesh;
        p.placements = {Placement::Shard(0)};
      }
      p.mesh_group = p.mesh;
      st.params.push_back(std::move(p));
      st.is_expert.push_back(def.expert);
      st.is_buffer.push_back(def.buffer);
    }
    spec.mesh_groups.push_back({st.dense_mesh, st.dense_mesh, {"dp_shard"}});
    if (st.has_experts) spec.mesh_groups.push_back({st.expert_mesh, st.expert_mesh, {"fsdp"}});
  }

  spec.ranks.resize(static_cast<size_t>(t.gpus));
  for (int32_t r = 0; r < t.gpus; ++r) {
    const StageTemplate& st = stages[r / per_stage];
    const int64_t local = r % per_stage;
    const bool fsdp_inner = t.rank_order == "fsdp_inner";
    const int64_t f = fsdp_inner ? local % t.fsdp : local / t.ep;
    const int64_t e = fsdp_inner ? local / t.fsdp : local % t.ep;
    TrainerRank& rank = spec.ranks[r];
    rank.rank = r;
    rank.host = "trainer-" + std::to_string(r / t.gpus_per_node);
    rank.gpu = r % t.gpus_per_node;
    rank.nic = static_cast<int32_t>(int64_t{rank.gpu} * t.nics_per_node / t.gpus_per_node);
    rank.meshes.push_back({st.dense_mesh, {per_stage}, {"dp_shard"}, {local}});
    if (st.has_experts) {
      rank.meshes.push_back({st.expert_mesh, {t.fsdp, t.ep}, {"fsdp", "ep"}, {f, e}});
    }
    rank.params = st.params;
    for (size_t i = 0; i < rank.params.size(); ++i) {
      TrainerParam& p = rank.params[i];
      p.local_shape = p.global_shape;
      p.local_offset.assign(p.global_shape.size(), 0);
      if (st.is_buffer[i]) continue;  // whole on every rank
      if (st.is_expert[i]) {
        ChunkPiece by_fsdp = TorchChunk(p.global_shape[1], t.fsdp, f);
        ChunkPiece by_ep = TorchChunk(p.global_shape[0], t.ep, e);
        p.local_offset[1] = by_fsdp.offset;
        p.local_shape[1] = by_fsdp.size;
        p.local_offset[0] = by_ep.offset;
        p.local_shape[0] = by_ep.size;
      } else {
        ChunkPiece piece = TorchChunk(p.global_shape[0], per_stage, local);
        p.local_offset[0] = piece.offset;
        p.local_shape[0] = piece.size;
      }
    }
  }
  *out = std::move(spec);
  return Status::Ok();
}

}  // namespace wsync
