#!/usr/bin/env python3
"""Writes the small llama-ish fixture used by routing_test (and the CLI tests).

2 layers, hidden 256, GQA with one kv head (k/v replicated across TP 2 via
"shards": "{num_key_value_heads}"), fused qkv and gate_up, tied lm_head, fp8
down_proj with 128x128 block scales, a skipped rotary buffer.
Trainer: 4 ranks, FSDP mesh [4], Shard(0). Inference: 2 ranks, TP 2.
Sharding here is torch.chunk written out by hand, independent of the C++.
Run: python3 make_fixtures.py (writes next to itself).
"""
import json
import math
import os

HERE = os.path.dirname(os.path.abspath(__file__))
H, I, V, KV = 256, 512, 1003, 128
LAYERS = 2


def torch_chunk(n, k):
    c = math.ceil(n / k) if n else 0
    pieces = [(s, min(c, n - s)) for s in range(0, n, c)] if c else []
    while len(pieces) < k:
        pieces.append((n, 0))
    return pieces


def trainer_params():
    p = [("model.embed_tokens.weight", [V, H])]
    for l in range(LAYERS):
        a = f"model.layers.{l}."
        p += [(a + "self_attn.q_proj.weight", [H, H]),
              (a + "self_attn.k_proj.weight", [KV, H]),
              (a + "self_attn.v_proj.weight", [KV, H]),
              (a + "self_attn.o_proj.weight", [H, H]),
              (a + "self_attn.rotary_emb.inv_freq", [64]),
              (a + "mlp.gate_proj.weight", [I, H]),
              (a + "mlp.up_proj.weight", [I, H]),
              (a + "mlp.down_proj.weight", [H, I]),
              (a + "input_layernorm.weight", [H]),
              (a + "post_attention_layernorm.weight", [H])]
    p.append(("model.norm.weight", [H]))
    return p


def trainer():
    ranks = []
    for r in range(4):
        params = []
        for name, shape in trainer_params():
            off, size = torch_chunk(shape[0], 4)[r]
            params.append({"name": name, "global_shape": shape, "dtype": "bf16", "mesh": "dense",
                           "placements": ["Shard(0)"], "local_shape": [size] + shape[1:],
                           "local_offset": [off] + [0] * (len(shape) - 1), "mesh_group": "dense"})
        ranks.append({"rank": r, "host": f"trainer-{r // 2}", "gpu": r % 2, "nic": r % 2,
                      "meshes": [{"mesh": "dense", "shape": [4], "dim_names": ["fsdp"], "coord": [r]}],
                      "params": params})
    return {"schema": "wsync.trainer/v1",
            "mesh_groups": [{"name": "dense", "mesh": "dense", "gather_dims": ["fsdp"]}],
            "ranks": ranks}


def inference():
    ranks = []
    for r in range(2):
        vocab = torch_chunk(V, 2)[r][1]
        tensors = [("model.embed_tokens.weight", [vocab, H], "bf16", 0),
                   ("lm_head.weight", [vocab, H], "bf16", 0)]
        for l in range(LAYERS):
            a = f"model.layers.{l}."
            tensors += [(a + "self_attn.qkv_proj.weight", [H // 2 + 2 * KV, H], "bf16", 0),
                        (a + "self_attn.o_proj.weight", [H, H // 2], "bf16", 1),
                        (a + "mlp.gate_up_proj.weight", [I, H], "bf16", 0),
                        (a + "mlp.down_proj.weight", [H, I // 2], "fp8_e4m3", 1),
                        (a + "input_layernorm.weight", [H], "bf16", None),
                        (a + "post_attention_layernorm.weight", [H], "bf16", None)]
        tensors.append(("model.norm.weight", [H], "bf16", None))
        offset = 0
        out = []
        for name, shape, dtype, tp_dim in tensors:
            esize = {"bf16": 2, "fp8_e4m3": 1}[dtype]
            t = {"name": name, "shape": shape, "dtype": dtype, "region": "weights", "offset": offset}
            offset += math.prod(shape) * esize
            if tp_dim is not None:
                t["tp"] = {"dim": tp_dim, "rank": r, "size": 2}
            if dtype == "fp8_e4m3":
                grid = [math.ceil(shape[0] / 128), math.ceil(shape[1] / 128)]
                t["scale"] = {"name": name + "_scale_inv", "shape": grid, "dtype": "fp32",
                              "region": "weights", "offset": offset}
                offset += math.prod(grid) * 4
            out.append(t)
        ranks.append({"rank": r, "instance": 0, "host": "infer-0", "gpu": r, "nic": r,
                      "regions": [{"id": "weights", "size": offset, "descriptor": ""}],
                      "tensors": out})
    return {"schema": "wsync.inference/v1", "ranks": ranks}


MAPPING = {
    "schema": "wsync.mapping/v1",
    "name": "tiny-llama",
    "rules": [
        {"engine": "model.layers.{L}.self_attn.qkv_proj.weight",
         "concat": {"dim": 0, "parts": [
             {"source": "model.layers.{L}.self_attn.q_proj.weight"},
             {"source": "model.layers.{L}.self_attn.k_proj.weight", "shards": "{num_key_value_heads}"},
             {"source": "model.layers.{L}.self_attn.v_proj.weight", "shards": "{num_key_value_heads}"}]}},
        {"engine": "model.layers.{L}.mlp.gate_up_proj.weight",
         "concat": {"dim": 0, "parts": [
             {"source": "model.layers.{L}.mlp.gate_proj.weight"},
             {"source": "model.layers.{L}.mlp.up_proj.weight"}]}},
        {"engine": "lm_head.weight", "tied": "model.embed_tokens.weight"},
        {"skip": "model.layers.{L}.self_attn.rotary_emb.inv_freq"},
        {"engine": "{*}", "source": "{*}"},
    ],
    "quantize": [{"dtype": "fp8_e4m3", "block": [128, 128], "scale_dtype": "fp32",
                  "scale_suffix": "_scale_inv"}],
}

CONFIG = {"hidden_size": H, "intermediate_size": I, "vocab_size": V, "num_hidden_layers": LAYERS,
          "num_attention_heads": 2, "num_key_value_heads": 1, "tie_word_embeddings": True}


def write(name, doc):
    with open(os.path.join(HERE, name), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    write("tiny_trainer.json", trainer())
    write("tiny_inference.json", inference())
    write("tiny_mapping.json", MAPPING)
    write("tiny_config.json", CONFIG)
