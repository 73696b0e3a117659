#include "models/torchtitan_names.h"

#include <cstring>

namespace wsync {
namespace {

// Per-layer names, after "model.layers.N." (HF) and "layers.N." (torchtitan).
// Stacked experts use the generator's HF-style stacked names.
struct Rename {
  const char* hf;
  const char* tt;
};
constexpr Rename kLayer[] = {
    {"self_attn.q_proj.weight", "attention.wq.weight"},
    {"self_attn.k_proj.weight", "attention.wk.weight"},
    {"self_attn.v_proj.weight", "attention.wv.weight"},
    {"self_attn.o_proj.weight", "attention.wo.weight"},
    {"self_attn.q_norm.weight", "attention.q_norm.weight"},  // qwen3
    {"self_attn.k_norm.weight", "attention.k_norm.weight"},
    {"self_attn.q_a_proj.weight", "attention.wq_a.weight"},  // deepseek_v3 MLA
    {"self_attn.q_a_layernorm.weight", "attention.q_norm.weight"},
    {"self_attn.q_b_proj.weight", "attention.wq_b.weight"},
    {"self_attn.kv_a_proj_with_mqa.weight", "attention.wkv_a.weight"},
    {"self_attn.kv_a_layernorm.weight", "attention.kv_norm.weight"},
    {"self_attn.kv_b_proj.weight", "attention.wkv_b.weight"},
    {"mlp.gate_proj.weight", "feed_forward.w1.weight"},
    {"mlp.up_proj.weight", "feed_forward.w3.weight"},
    {"mlp.down_proj.weight", "feed_forward.w2.weight"},
    {"input_layernorm.weight", "attention_norm.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"mlp.gate.weight", "moe.router.gate.weight"},
    {"mlp.gate.e_score_correction_bias", "moe.expert_bias"},
    {"mlp.experts.gate_proj", "moe.experts.w1"},
    {"mlp.experts.up_proj", "moe.experts.w3"},
    {"mlp.experts.down_proj", "moe.experts.w2"},
    {"mlp.shared_experts.gate_proj.weight", "moe.shared_experts.w1.weight"},
    {"mlp.shared_experts.up_proj.weight", "moe.shared_experts.w3.weight"},
    {"mlp.shared_experts.down_proj.weight", "moe.shared_experts.w2.weight"},
};
constexpr Rename kTop[] = {
    {"model.embed_tokens.weight", "tok_embeddings.weight"},
    {"model.norm.weight", "norm.weight"},
    {"lm_head.weight", "output.weight"},
};

}  // namespace

std::string TorchtitanName(const std::string& hf) {
  for (const Rename& r : kTop) {
    if (hf == r.hf) return r.tt;
  }
  constexpr char kPrefix[] = "model.layers.";
  if (hf.compare(0, sizeof(kPrefix) - 1, kPrefix) != 0) return hf;
  const size_t dot = hf.find('.', sizeof(kPrefix) - 1);
  if (dot == std::string::npos) return hf;
  const std::string layer = hf.substr(sizeof(kPrefix) - 1, dot - (sizeof(kPrefix) - 1));
  const std::string rest = hf.substr(dot + 1);
  for (const Rename& r : kLayer) {
    if (rest == r.hf) return "layers." + layer + "." + r.tt;
  }
  return hf;
}

}  // namespace wsync
