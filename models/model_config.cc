#include "models/model_config.h"

#include <algorithm>

namespace wsync {
namespace {

// Reads config[key] as a positive integer (or zero when allow_zero).
bool ReadDim(const nlohmann::json& c, const char* key, int64_t* out,
             const std::string& origin, Status* err, bool allow_zero = false) {
  auto it = c.find(key);
  if (it == c.end() || it->is_null()) {
    *err = InvalidArgument(origin + ": missing \"" + key +
                           "\" (needed to derive weight shapes)");
    return false;
  }
  if (!it->is_number_integer() || it->get<int64_t>() < (allow_zero ? 0 : 1)) {
    *err = InvalidArgument(origin + ": \"" + key + "\" must be a " +
                           (allow_zero ? "non-negative" : "positive") +
                           " integer, got " + it->dump());
    return false;
  }
  *out = it->get<int64_t>();
  return true;
}

int64_t OptDim(const nlohmann::json& c, const char* key, int64_t fallback) {
  auto it = c.find(key);
  if (it == c.end() || !it->is_number_integer()) return fallback;
  return it->get<int64_t>();
}

bool OptBool(const nlohmann::json& c, const char* key, bool fallback) {
  auto it = c.find(key);
  if (it == c.end() || !it->is_boolean()) return fallback;
  return it->get<bool>();
}

StatusOr<ModelFamily> DetectFamily(const nlohmann::json& c, const std::string& origin) {
  std::string arch;
  if (auto it = c.find("architectures"); it != c.end() && it->is_array() &&
                                         !it->empty() && (*it)[0].is_string()) {
    arch = (*it)[0].get<std::string>();
  }
  std::string type = c.value("model_type", std::string());
  if (arch == "LlamaForCausalLM" || (arch.empty() && type == "llama")) return ModelFamily::kLlama;
  if (arch == "Qwen3MoeForCausalLM" || (arch.empty() && type == "qwen3_moe")) {
    return ModelFamily::kQwen3Moe;
  }
  // Kimi-K2 ships model_type "kimi_k2" with the DeepseekV3 architecture.
  if (arch == "DeepseekV3ForCausalLM" ||
      (arch.empty() && (type == "deepseek_v3" || type == "kimi_k2"))) {
    return ModelFamily::kDeepseekV3;
  }
  return InvalidArgument(origin + ": unsupported architecture '" + arch +
                         "' (model_type '" + type +
                         "'); supported: LlamaForCausalLM, Qwen3MoeForCausalLM, "
                         "DeepseekV3ForCausalLM");
}

}  // namespace

const char* ModelFamilyName(ModelFamily f) {
  switch (f) {
    case ModelFamily::kLlama: return "llama";
    case ModelFamily::kQwen3Moe: return "qwen3_moe";
    case ModelFamily::kDeepseekV3: return "deepseek_v3";
  }
  return "?";
}

StatusOr<ModelDims> ParseModelConfig(const nlohmann::json& c, const std::string& origin) {
  if (!c.is_object()) return InvalidArgument(origin + ": model config must be a JSON object");
  WSYNC_ASSIGN_OR_RETURN(ModelFamily family, DetectFamily(c, origin));
  ModelDims d;
  d.family = family;
  Status err;
  if (!ReadDim(c, "hidden_size", &d.hidden, origin, &err) ||
      !ReadDim(c, "vocab_size", &d.vocab, origin, &err) ||
      !ReadDim(c, "num_hidden_layers", &d.layers, origin, &err) ||
      !ReadDim(c, "num_attention_heads", &d.heads, origin, &err) ||
      !ReadDim(c, "intermediate_size", &d.intermediate, origin, &err)) {
    return err;
  }
  d.kv_heads = OptDim(c, "num_key_value_heads", d.heads);
  d.head_dim = OptDim(c, "head_dim", d.hidden / d.heads);
  if (d.kv_heads <= 0 || d.head_dim <= 0) {
    return InvalidArgument(origin + ": num_key_value_heads and head_dim must be positive");
  }
  d.tie_embeddings = OptBool(c, "tie_word_embeddings", false);
  d.layer_is_moe.assign(static_cast<size_t>(d.layers), false);

  if (family == ModelFamily::kQwen3Moe) {
    d.qk_norm = true;
    if (!ReadDim(c, "num_experts", &d.experts, origin, &err, /*allow_zero=*/true)) return err;
    if (d.experts > 0 &&
        !ReadDim(c, "moe_intermediate_size", &d.moe_intermediate, origin, &err)) {
      return err;
    }
    // Qwen3MoeDecoderLayer: MoE unless listed in mlp_only_layers, every
    // decoder_sparse_step-th layer.
    int64_t step = OptDim(c, "decoder_sparse_step", 1);
    std::vector<int64_t> mlp_only;
    if (auto it = c.find("mlp_only_layers"); it != c.end() && it->is_array()) {
      for (const auto& v : *it) {
        if (v.is_number_integer()) mlp_only.push_back(v.get<int64_t>());
      }
    }
    for (int64_t l = 0; l < d.layers; ++l) {
      bool listed = std::find(mlp_only.begin(), mlp_only.end(), l) != mlp_only.end();
      d.layer_is_moe[l] = d.experts > 0 && !listed && step > 0 && (l + 1) % step == 0;
    }
  } else if (family == ModelFamily::kDeepseekV3) {
    if (!ReadDim(c, "n_routed_experts", &d.experts, origin, &err) ||
        !ReadDim(c, "moe_intermediate_size", &d.moe_intermediate, origin, &err) ||
        !ReadDim(c, "kv_lora_rank", &d.kv_lora_rank, origin, &err) ||
        !ReadDim(c, "qk_nope_head_dim", &d.qk_nope_head_dim, origin, &err) ||
        !ReadDim(c, "qk_rope_head_dim", &d.qk_rope_head_dim, origin, &err) ||
        !ReadDim(c, "v_head_dim", &d.v_head_dim, origin, &err)) {
      return err;
    }
    d.shared_experts = OptDim(c, "n_shared_experts", 0);
    // q_lora_rank: null (DeepSeek-V2-Lite, Moonlight) means a plain q_proj.
    d.q_lora_rank = OptDim(c, "q_lora_rank", 0);
    d.router_bias = c.value("topk_method", std::string()) == "noaux_tc";
    int64_t first_dense = OptDim(c, "first_k_dense_replace", 0);
    int64_t freq = OptDim(c, "moe_layer_freq", 1);
    for (int64_t l = 0; l < d.layers; ++l) {
      d.layer_is_moe[l] = l >= first_dense && freq > 0 && l % freq == 0;
    }
    // The MTP layers (num_nextn_predict_layers) are not part of the served
    // model and are not generated.
  }
  return d;
}

}  // namespace wsync
