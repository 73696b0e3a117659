"""Small random-init bf16 transformers models for wsync's torch tests.

The sizes suit a TP-2 block-fp8 engine: every TP cut and every fused seam
falls on a multiple of 128 (hidden 256; q 8 heads x 64 = 512; k/v 4 heads x
64 = 256, so 128 per TP rank; intermediate 512; moe_intermediate 256, so 128
per TP rank with ep = 1; vocab 512).

Both models use the "eager" attention and "eager" experts implementations:
deterministic CPU kernels, the same arithmetic in a sharded and a plain copy
of the model (fsdp_setup relies on that for bit-identical greedy tokens).

Norm weights are drawn around 1 (HF initializes them to exactly 1.0), so a
norm copied to the wrong place is visible before any training step.
"""

import json

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

SEED = 1234

_COMMON = dict(
    vocab_size=512,
    hidden_size=256,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=64,
    max_position_embeddings=256,
    tie_word_embeddings=False,
    # HF's 0.02 gives near-uniform logits: greedy decoding then repeats one
    # token, which makes a poor check that two copies of a model agree.
    initializer_range=0.1,
    attn_implementation="eager",
    dtype="bfloat16",
)


def _build(model_class, config, seed, dtype=torch.bfloat16):
    config.architectures = [model_class.__name__]  # as save_pretrained writes it
    torch.manual_seed(seed)
    model = model_class(config)  # fp32 init from the seeded global generator
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
    model = model.to(dtype)  # torch.float32: fp32 master weights, as trainers keep them
    model.eval()
    return config, model


def small_llama(seed=SEED, dtype=torch.bfloat16):
    """(LlamaConfig, LlamaForCausalLM) in bf16, 2 layers, untied embeddings."""
    config = LlamaConfig(intermediate_size=512, **_COMMON)
    return _build(LlamaForCausalLM, config, seed, dtype)


def small_qwen3(seed=SEED, dtype=torch.bfloat16):
    """(Qwen3Config, Qwen3ForCausalLM) in bf16, 2 layers, dense: Llama's
    shapes plus q_norm / k_norm (per-head RMSNorm weights [head_dim])."""
    config = Qwen3Config(intermediate_size=512, **_COMMON)
    return _build(Qwen3ForCausalLM, config, seed, dtype)


def small_qwen3_moe(seed=SEED, dtype=torch.bfloat16):
    """(Qwen3MoeConfig, Qwen3MoeForCausalLM) in bf16: 4 experts, top-2, every layer MoE.

    transformers 5 stores each layer's experts stacked:
    mlp.experts.gate_up_proj [E, 2 * moe_intermediate, hidden] (gate rows first,
    then up) and mlp.experts.down_proj [E, hidden, moe_intermediate], no
    ".weight" suffix; the router is mlp.gate.weight [E, hidden].
    """
    config = Qwen3MoeConfig(
        intermediate_size=512,
        moe_intermediate_size=256,
        num_experts=4,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=True,
        experts_implementation="eager",
        **_COMMON,
    )
    return _build(Qwen3MoeForCausalLM, config, seed, dtype)


def config_dict(model):
    """The HF config.json dict of `model` (what save_pretrained writes), plus
    the published spelling of renamed keys.

    transformers 5 writes some keys under its internal name: Qwen3-MoE's
    "num_experts" comes out as "num_local_experts" (config.attribute_map).
    Published checkpoints (and wsync's model_config reader) use
    "num_experts", so each attribute_map alias is added beside its target.
    """
    d = json.loads(model.config.to_json_string(use_diff=False))
    for published, internal in getattr(model.config, "attribute_map", {}).items():
        if internal in d and published not in d:
            d[published] = d[internal]
    return d


if __name__ == "__main__":
    for build in (small_llama, small_qwen3_moe):
        config, model = build()
        n = sum(p.numel() for p in model.parameters())
        print(type(model).__name__, f"{n} params", config_dict(model)["architectures"])
        for name, p in model.named_parameters():
            print(f"  {name} {list(p.shape)} {p.dtype}")
