// The few numbers of a HuggingFace config.json that decide every weight
// shape, read into one struct per model. Internal to models/.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace wsync {

enum class ModelFamily { kLlama, kQwen3Moe, kDeepseekV3 };

const char* ModelFamilyName(ModelFamily f);

struct ModelDims {
  ModelFamily family = ModelFamily::kLlama;
  int64_t hidden = 0;
  int64_t vocab = 0;
  int64_t layers = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t intermediate = 0;       // dense MLP width
  bool tie_embeddings = false;

  // MoE (qwen3_moe, deepseek_v3). layer_is_moe has `layers` entries.
  int64_t experts = 0;
  int64_t moe_intermediate = 0;
  int64_t shared_experts = 0;     // deepseek_v3: n_shared_experts
  bool router_bias = false;       // deepseek_v3 noaux_tc: e_score_correction_bias
  std::vector<bool> layer_is_moe;

  bool qk_norm = false;           // qwen3: per-head q_norm / k_norm

  // MLA (deepseek_v3). q_lora_rank 0 means a plain q_proj.
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;

  bool has_experts() const { return experts > 0; }
};

// Reads the fields the family needs; a missing or non-positive field is one
// error line naming the key. `origin` names the config in messages.
StatusOr<ModelDims> ParseModelConfig(const nlohmann::json& config,
                                     const std::string& origin);

}  // namespace wsync
