// The cluster spec (wsync.cluster/v1): which model, how the trainers shard it
// and how the inference engines lay it out. See docs/SCHEMA.md.
//
// Read by the model generator (generate.h) and by `wsync plan` when it is
// pointed at an example folder. Paths inside the file are relative to the
// folder that holds the file; the loader turns them into usable paths.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "routing/dtype.h"

namespace wsync {

// Trainer side: FSDP2 (+EP, +PP) over gpus = fsdp * pp * ep ranks.
struct TrainerLayout {
  int32_t gpus = 0;
  int32_t gpus_per_node = 8;
  int32_t nics_per_node = 8;
  int32_t fsdp = 1;
  int32_t pp = 1;
  int32_t ep = 1;                     // expert parallel inside each PP stage
  DType dtype = DType::kBF16;
  // How routed experts are stored per layer: "stacked" (gate_proj, up_proj,
  // down_proj, each [E, ...]) or "hf_fused" (transformers 5.x:
  // experts.gate_up_proj [E, 2I, H] and experts.down_proj [E, H, I]).
  std::string expert_layout = "stacked";
  // Parameter names: "hf" (transformers) or "torchtitan" (v0.2.2 FQNs;
  // experts "stacked" as its GroupedExperts w1/w3/w2).
  std::string param_names = "hf";
  // Order of ranks inside a PP stage: "ep_inner" (i = f*E + e, torchtitan's
  // default: an EP group shares a node, FSDP crosses nodes) or "fsdp_inner"
  // (i = e*F + f: FSDP groups share nodes, so full_tensor stays on NVLink).
  std::string rank_order = "ep_inner";
};

// Inference side: `gpus / gpus_per_instance` engine replicas, each one TP
// group of `tp` ranks; MoE experts are split over the instance by expert
// parallel (ep == tp) or TP-sharded like dense layers (ep == 1).
struct InferenceLayout {
  int32_t gpus = 0;
  int32_t gpus_per_node = 8;
  int32_t nics_per_node = 8;
  int32_t gpus_per_instance = 1;
  int32_t tp = 1;
  int32_t ep = 1;
  DType dtype = DType::kBF16;         // bf16 | fp8_e4m3 for the linear weights
};

struct ClusterSpec {
  std::string name;
  std::string model_path;    // HF config.json, resolved against the spec's folder
  std::string mapping_path;  // wsync.mapping/v1 file, resolved likewise
  TrainerLayout trainer;
  InferenceLayout inference;
};

// Parses and checks a wsync.cluster/v1 document. `base_dir` resolves the
// relative paths inside; `origin` names the document in error messages.
StatusOr<ClusterSpec> ParseClusterSpec(const nlohmann::json& j,
                                       const std::string& base_dir,
                                       const std::string& origin);

// Reads `path` and parses it, paths resolved against the file's folder.
StatusOr<ClusterSpec> LoadClusterSpec(const std::string& path);

// The document form of `spec` (paths written as given).
nlohmann::json ClusterSpecToJson(const ClusterSpec& spec);

}  // namespace wsync
