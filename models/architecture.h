// What each supported architecture stores, on both sides of a weight sync:
// the trainer's parameters (HF names with experts stacked per projection,
// transformers 5.x's fused experts, or torchtitan's own names) and the
// inference engine's tensors (vLLM names and fused layouts), all in their
// logical, unsharded form.
//
// Internal to models/: the generators (trainer_gen.cc, inference_gen.cc)
// shard these per rank. The names here must agree with the family's mapping
// file in configs/mappings/, which says how one side is built from the other.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/model_config.h"
#include "routing/metadata.h"

namespace wsync {

// Pseudo layer indices: the embedding lives on the first PP stage, the final
// norm and lm_head on the last.
inline constexpr int32_t kEmbedLayer = -1;
inline constexpr int32_t kFinalLayer = -2;

struct TrainerParamDef {
  std::string name;
  Shape shape;
  int32_t layer = 0;
  // A stacked expert tensor [E, ...]: Shard(0) over ep, Shard(1) over fsdp.
  bool expert = false;
  // A module buffer, not a parameter: FSDP2 leaves it whole on every rank
  // (Replicate) and it keeps its own dtype, fp32 (router score bias).
  bool buffer = false;
  bool fp32 = false;  // kept in fp32 whatever the training dtype
};

// How the trainer's model names and stores its weights.
struct TrainerFlavor {
  // transformers 5.x fused experts: one experts.gate_up_proj [E, 2I, H]
  // (gate rows, then up rows) and one experts.down_proj [E, H, I] per layer,
  // instead of gate_proj / up_proj / down_proj stacked apart.
  bool hf_fused_experts = false;
  // torchtitan v0.2.2 FQNs (tok_embeddings, layers.N.attention.wq, ...,
  // moe.experts.w1/w2/w3) instead of HF names; see torchtitan_names.h.
  bool torchtitan_names = false;
};

// One part of a fused engine tensor along its split dim (q, k, v of qkv_proj;
// gate, up of gate_up_proj). shards > 0 replicates the part across TP ranks
// once TP exceeds it (GQA k/v heads), as MappingPart::shards does.
struct EnginePartDef {
  int64_t size = 0;
  int64_t shards = 0;
};

struct EngineTensorDef {
  std::string name;
  Shape shape;               // logical shape of the whole engine tensor
  int32_t layer = 0;
  bool tp_split = false;     // chunked over the TP group along tp_dim
  int32_t tp_dim = 0;
  std::vector<EnginePartDef> parts;  // along tp_dim (or dim 0 if replicated)
  // Dim 0 indexes experts (vLLM FusedMoE w13/w2): with inference ep > 1 the
  // instance splits dim 0 by expert ranges instead of TP-splitting tp_dim.
  bool expert_stacked = false;
  bool quantizable = false;  // a linear weight the fp8 checkpoint stores in fp8
  bool fp32 = false;         // kept in fp32 by the engine (router bias)
};

// In execution order: embedding, layers 0..L-1, final norm, lm_head.
std::vector<TrainerParamDef> TrainerParams(const ModelDims& dims, const TrainerFlavor& flavor = {});
std::vector<EngineTensorDef> EngineTensors(const ModelDims& dims);

}  // namespace wsync
