// Model generator: trainer, inference and mapping specs for a real model
// architecture, built from its published HuggingFace config.json and a
// cluster spec, without any hand-written tensor lists.
//
// Called by `wsync plan` (example folders hold only a cluster.json), by the
// benchmarks and by tests. Produces the routing/metadata.h structs directly:
// the Kimi-K2 reference case has ~130k trainer parameter entries, which must
// be generated and planned in well under two seconds, so no JSON detour.
//
// Families (keyed off "architectures" / "model_type"):
//   llama        LlamaForCausalLM
//   qwen3_moe    Qwen3MoeForCausalLM (q/k norms, stacked routed experts)
//   deepseek_v3  DeepseekV3ForCausalLM (MLA, dense first layers, shared
//                experts, router bias); Kimi-K2 is this family.
// Trainer names are HF names, experts stacked per layer (torchtitan style);
// engine names and fused layouts are vLLM's. docs/SCHEMA.md has the details.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "models/cluster_spec.h"
#include "routing/metadata.h"

namespace wsync {

struct GeneratedSpecs {
  std::string family;       // "llama" | "qwen3_moe" | "deepseek_v3"
  TrainerSpec trainer;
  InferenceSpec inference;
  MappingSpec mapping;      // loaded from cluster.mapping_path
};

// Builds all three specs. The mapping file named by the cluster spec is read
// here; "{name}" shard counts in it are resolved from `model_config`.
StatusOr<GeneratedSpecs> GenerateSpecs(const nlohmann::json& model_config,
                                       const ClusterSpec& cluster);

// LoadClusterSpec + read its model config + GenerateSpecs.
StatusOr<GeneratedSpecs> GenerateFromClusterFile(const std::string& cluster_path);

}  // namespace wsync
