#include "models/architecture.h"

#include <string>

#include "models/torchtitan_names.h"

namespace wsync {
namespace {

std::string LayerPrefix(int64_t l) { return "model.layers." + std::to_string(l) + "."; }

// Appends trainer params; one helper per block keeps the families readable.
class TrainerList {
 public:
  TrainerList(std::vector<TrainerParamDef>* out, const TrainerFlavor& flavor)
      : out_(out), flavor_(flavor) {}
  TrainerParamDef& Add(std::string name, Shape shape, int32_t layer, bool expert = false) {
    TrainerParamDef p;
    p.name = std::move(name);
    p.shape = std::move(shape);
    p.layer = layer;
    p.expert = expert;
    out_->push_back(std::move(p));
    return out_->back();
  }
  const TrainerFlavor& flavor() const { return flavor_; }

 private:
  std::vector<TrainerParamDef>* out_;
  TrainerFlavor flavor_;
};

class EngineList {
 public:
  explicit EngineList(std::vector<EngineTensorDef>* out) : out_(out) {}
  // Replicated on every rank of the instance.
  EngineTensorDef& Replicated(std::string name, Shape shape, int32_t layer) {
    EngineTensorDef t;
    t.name = std::move(name);
    t.shape = std::move(shape);
    t.layer = layer;
    t.parts = {{t.shape[0], 0}};
    out_->push_back(std::move(t));
    return out_->back();
  }
  // Chunked over TP along `dim`, each part separately.
  EngineTensorDef& Tp(std::string name, Shape shape, int32_t layer, int32_t dim,
                      std::vector<EnginePartDef> parts, bool quantizable) {
    EngineTensorDef t;
    t.name = std::move(name);
    t.shape = std::move(shape);
    t.layer = layer;
    t.tp_split = true;
    t.tp_dim = dim;
    t.parts = std::move(parts);
    t.quantizable = quantizable;
    out_->push_back(std::move(t));
    return out_->back();
  }

 private:
  std::vector<EngineTensorDef>* out_;
};

// ------------------------------------------------------------- trainer ----

void TrainerEmbed(const ModelDims& d, TrainerList* t) {
  t->Add("model.embed_tokens.weight", {d.vocab, d.hidden}, kEmbedLayer);
}

void TrainerFinal(const ModelDims& d, TrainerList* t) {
  t->Add("model.norm.weight", {d.hidden}, kFinalLayer);
  if (!d.tie_embeddings) t->Add("lm_head.weight", {d.vocab, d.hidden}, kFinalLayer);
}

void TrainerGqaAttention(const ModelDims& d, int32_t l, TrainerList* t) {
  const std::string p = LayerPrefix(l);
  const int64_t q = d.heads * d.head_dim, kv = d.kv_heads * d.head_dim;
  t->Add(p + "input_layernorm.weight", {d.hidden}, l);
  t->Add(p + "self_attn.q_proj.weight", {q, d.hidden}, l);
  t->Add(p + "self_attn.k_proj.weight", {kv, d.hidden}, l);
  t->Add(p + "self_attn.v_proj.weight", {kv, d.hidden}, l);
  t->Add(p + "self_attn.o_proj.weight", {d.hidden, q}, l);
  if (d.qk_norm) {
    t->Add(p + "self_attn.q_norm.weight", {d.head_dim}, l);
    t->Add(p + "self_attn.k_norm.weight", {d.head_dim}, l);
  }
  t->Add(p + "post_attention_layernorm.weight", {d.hidden}, l);
}

void TrainerMlaAttention(const ModelDims& d, int32_t l, TrainerList* t) {
  const std::string p = LayerPrefix(l);
  const int64_t qk = d.qk_nope_head_dim + d.qk_rope_head_dim;
  t->Add(p + "input_layernorm.weight", {d.hidden}, l);
  if (d.q_lora_rank > 0) {
    t->Add(p + "self_attn.q_a_proj.weight", {d.q_lora_rank, d.hidden}, l);
    t->Add(p + "self_attn.q_a_layernorm.weight", {d.q_lora_rank}, l);
    t->Add(p + "self_attn.q_b_proj.weight", {d.heads * qk, d.q_lora_rank}, l);
  } else {
    t->Add(p + "self_attn.q_proj.weight", {d.heads * qk, d.hidden}, l);
  }
  t->Add(p + "self_attn.kv_a_proj_with_mqa.weight",
         {d.kv_lora_rank + d.qk_rope_head_dim, d.hidden}, l);
  t->Add(p + "self_attn.kv_a_layernorm.weight", {d.kv_lora_rank}, l);
  t->Add(p + "self_attn.kv_b_proj.weight",
         {d.heads * (d.qk_nope_head_dim + d.v_head_dim), d.kv_lora_rank}, l);
  t->Add(p + "self_attn.o_proj.weight", {d.hidden, d.heads * d.v_head_dim}, l);
  t->Add(p + "post_attention_layernorm.weight", {d.hidden}, l);
}

void TrainerDenseMlp(const std::string& p, int64_t hidden, int64_t inter, int32_t l,
                     TrainerList* t) {
  t->Add(p + "gate_proj.weight", {inter, hidden}, l);
  t->Add(p + "up_proj.weight", {inter, hidden}, l);
  t->Add(p + "down_proj.weight", {hidden, inter}, l);
}

void TrainerMoe(const ModelDims& d, int32_t l, TrainerList* t) {
  const std::string p = LayerPrefix(l) + "mlp.";
  const int64_t e = d.experts, i = d.moe_intermediate, h = d.hidden;
  const TrainerFlavor& f = t->flavor();
  TrainerParamDef& router = t->Add(p + "gate.weight", {e, h}, l);
  // transformers 5.x keeps DeepSeek-V3's router in fp32
  // (_keep_in_fp32_modules_strict = ["e_score_correction_bias", "gate.weight"]).
  router.fp32 = f.hf_fused_experts && d.family == ModelFamily::kDeepseekV3;
  if (d.router_bias || f.torchtitan_names) {
    // A persistent fp32 buffer in transformers 5.x and torchtitan
    // (moe.expert_bias, there on every MoE layer: MoEArgs.load_balance_coeff
    // defaults to 1e-3, so Qwen3 has one that vLLM does not use); the
    // stacked HF-name layout keeps the older assumption of a parameter.
    TrainerParamDef& bias = t->Add(p + "gate.e_score_correction_bias", {e}, l);
    bias.buffer = bias.fp32 = f.hf_fused_experts || f.torchtitan_names;
  }
  if (f.hf_fused_experts) {
    t->Add(p + "experts.gate_up_proj", {e, 2 * i, h}, l, /*expert=*/true);
  } else {
    t->Add(p + "experts.gate_proj", {e, i, h}, l, /*expert=*/true);
    t->Add(p + "experts.up_proj", {e, i, h}, l, true);
  }
  t->Add(p + "experts.down_proj", {e, h, i}, l, true);
  if (d.shared_experts > 0) {
    TrainerDenseMlp(p + "shared_experts.", h, i * d.shared_experts, l, t);
  }
}

// -------------------------------------------------------------- engine ----

void EngineEmbed(const ModelDims& d, EngineList* e) {
  // VocabParallelEmbedding: rows split over TP.
  e->Tp("model.embed_tokens.weight", {d.vocab, d.hidden}, kEmbedLayer, 0, {{d.vocab, 0}},
        /*quantizable=*/false);
}

void EngineFinal(const ModelDims& d, EngineList* e) {
  e->Replicated("model.norm.weight", {d.hidden}, kFinalLayer);
  if (!d.tie_embeddings) {
    e->Tp("lm_head.weight", {d.vocab, d.hidden}, kFinalLayer, 0, {{d.vocab, 0}}, false);
  }
}

void EngineGqaAttention(const ModelDims& d, int32_t l, EngineList* e) {
  const std::string p = LayerPrefix(l);
  const int64_t q = d.heads * d.head_dim, kv = d.kv_heads * d.head_dim;
  e->Replicated(p + "input_layernorm.weight", {d.hidden}, l);
  // QKVParallelLinear: q, k, v chunked over TP separately; k/v heads
  // replicated once TP exceeds num_key_value_heads.
  e->Tp(p + "self_attn.qkv_proj.weight", {q + 2 * kv, d.hidden}, l, 0,
        {{q, 0}, {kv, d.kv_heads}, {kv, d.kv_heads}}, true);
  e->Tp(p + "self_attn.o_proj.weight", {d.hidden, q}, l, 1, {{q, 0}}, true);
  if (d.qk_norm) {
    e->Replicated(p + "self_attn.q_norm.weight", {d.head_dim}, l);
    e->Replicated(p + "self_attn.k_norm.weight", {d.head_dim}, l);
  }
  e->Replicated(p + "post_attention_layernorm.weight", {d.hidden}, l);
}

void EngineMlaAttention(const ModelDims& d, int32_t l, EngineList* e) {
  const std::string p = LayerPrefix(l);
  const int64_t qk = d.qk_nope_head_dim + d.qk_rope_head_dim;
  const int64_t kv_a = d.kv_lora_rank + d.qk_rope_head_dim;
  e->Replicated(p + "input_layernorm.weight", {d.hidden}, l);
  if (d.q_lora_rank > 0) {
    // vLLM fuses q_a_proj and kv_a_proj_with_mqa into one replicated GEMM.
    EngineTensorDef& t = e->Replicated(p + "self_attn.fused_qkv_a_proj.weight",
                                       {d.q_lora_rank + kv_a, d.hidden}, l);
    t.parts = {{d.q_lora_rank, 0}, {kv_a, 0}};
    t.quantizable = true;
    e->Replicated(p + "self_attn.q_a_layernorm.weight", {d.q_lora_rank}, l);
    e->Tp(p + "self_attn.q_b_proj.weight", {d.heads * qk, d.q_lora_rank}, l, 0,
          {{d.heads * qk, 0}}, true);
  } else {
    e->Tp(p + "self_attn.q_proj.weight", {d.heads * qk, d.hidden}, l, 0,
          {{d.heads * qk, 0}}, true);
    e->Replicated(p + "self_attn.kv_a_proj_with_mqa.weight", {kv_a, d.hidden}, l)
        .quantizable = true;
  }
  e->Replicated(p + "self_attn.kv_a_layernorm.weight", {d.kv_lora_rank}, l);
  const int64_t kv_b = d.heads * (d.qk_nope_head_dim + d.v_head_dim);
  e->Tp(p + "self_attn.kv_b_proj.weight", {kv_b, d.kv_lora_rank}, l, 0, {{kv_b, 0}}, true);
  const int64_t o = d.heads * d.v_head_dim;
  e->Tp(p + "self_attn.o_proj.weight", {d.hidden, o}, l, 1, {{o, 0}}, true);
  e->Replicated(p + "post_attention_layernorm.weight", {d.hidden}, l);
}

void EngineDenseMlp(const std::string& p, int64_t hidden, int64_t inter, int32_t l,
                    EngineList* e) {
  // MergedColumnParallelLinear gate_up (each half chunked), RowParallel down.
  e->Tp(p + "gate_up_proj.weight", {2 * inter, hidden}, l, 0, {{inter, 0}, {inter, 0}}, true);
  e->Tp(p + "down_proj.weight", {hidden, inter}, l, 1, {{inter, 0}}, true);
}

void EngineMoe(const ModelDims& d, int32_t l, EngineList* e) {
  const std::string p = LayerPrefix(l) + "mlp.";
  const int64_t n = d.experts, i = d.moe_intermediate, h = d.hidden;
  e->Replicated(p + "gate.weight", {n, h}, l);  // router: ReplicatedLinear, never fp8
  if (d.router_bias) e->Replicated(p + "gate.e_score_correction_bias", {n}, l).fp32 = true;
  // FusedMoE: w13 = [E, gate;up, hidden], w2 = [E, hidden, inter]. Without
  // expert parallel, TP splits the intermediate dim (each of gate/up apart).
  EngineTensorDef& w13 = e->Tp(p + "experts.w13_weight", {n, 2 * i, h}, l, 1,
                               {{i, 0}, {i, 0}}, true);
  w13.expert_stacked = true;
  EngineTensorDef& w2 = e->Tp(p + "experts.w2_weight", {n, h, i}, l, 2, {{i, 0}}, true);
  w2.expert_stacked = true;
  if (d.shared_experts > 0) {
    EngineDenseMlp(p + "shared_experts.", h, i * d.shared_experts, l, e);
  }
}

}  // namespace

std::vector<TrainerParamDef> TrainerParams(const ModelDims& d, const TrainerFlavor& flavor) {
  std::vector<TrainerParamDef> out;
  out.reserve(static_cast<size_t>(d.layers) * 20 + 3);
  TrainerList t(&out, flavor);
  TrainerEmbed(d, &t);
  for (int32_t l = 0; l < d.layers; ++l) {
    if (d.family == ModelFamily::kDeepseekV3) {
      TrainerMlaAttention(d, l, &t);
    } else {
      TrainerGqaAttention(d, l, &t);
    }
    if (d.layer_is_moe[l]) {
      TrainerMoe(d, l, &t);
    } else {
      TrainerDenseMlp(LayerPrefix(l) + "mlp.", d.hidden, d.intermediate, l, &t);
    }
  }
  TrainerFinal(d, &t);
  if (flavor.torchtitan_names) {
    for (TrainerParamDef& p : out) p.name = TorchtitanName(p.name);
  }
  return out;
}

std::vector<EngineTensorDef> EngineTensors(const ModelDims& d) {
  std::vector<EngineTensorDef> out;
  out.reserve(static_cast<size_t>(d.layers) * 16 + 3);
  EngineList e(&out);
  EngineEmbed(d, &e);
  for (int32_t l = 0; l < d.layers; ++l) {
    if (d.family == ModelFamily::kDeepseekV3) {
      EngineMlaAttention(d, l, &e);
    } else {
      EngineGqaAttention(d, l, &e);
    }
    if (d.layer_is_moe[l]) {
      EngineMoe(d, l, &e);
    } else {
      EngineDenseMlp(LayerPrefix(l) + "mlp.", d.hidden, d.intermediate, l, &e);
    }
  }
  EngineFinal(d, &e);
  return out;
}

}  // namespace wsync
