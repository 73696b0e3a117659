// torchtitan's own parameter names (FQNs) for the HF names the generator
// builds, so that `trainer.param_names: "torchtitan"` describes a torchtitan
// run. Internal to models/; called by TrainerParams (architecture.cc).
//
// Read from pytorch/torchtitan v0.2.2 (2026-02-20): the from_hf_map of
// torchtitan/models/{llama3,qwen3,deepseek_v3}/model/state_dict_adapter.py
// and the modules of torchtitan/models/moe/moe.py (GroupedExperts w1/w3
// [E, hidden_dim, dim], w2 [E, dim, hidden_dim]; MoE.expert_bias buffer).
// torchtitan's main branch renamed them since (attention.qkv_linear.wq,
// moe.routed_experts.inner_experts.w1_EFD, lm_head); a mapping for that
// would be a new file.
#pragma once

#include <string>

namespace wsync {

// The torchtitan name of HF-named generator parameter `hf`; names with no
// torchtitan counterpart are returned unchanged.
std::string TorchtitanName(const std::string& hf);

}  // namespace wsync
