"""What each rank of a TP vLLM-style engine holds, built in plain torch.

From the full trainer tensors (HF transformers names, as
fsdp_setup.full_state returns them) and the HF config dict, build every
TP rank's engine tensors and their layout entries (docs/SCHEMA.md,
wsync.inference/v1):

    tensors, layout = engine_layout(state, config, tp=2, ep=1, dtype="fp8_e4m3")
    tensors[r]["model.layers.0.self_attn.qkv_proj.weight"]          # float8_e4m3fn
    tensors[r]["model.layers.0.self_attn.qkv_proj.weight_scale_inv"]  # fp32
    layout[r]   # [{"name", "shape", "dtype", "tp" | "experts", "scale"}, ...] in engine order

This is the independent reference a sync is checked against (full weights
-> fuse -> slice -> quantize), and the same entries are what an inference
rank registers. inference_v1() adds the region and offsets
(one region "weights", each tensor and its scale 256-byte aligned, in
engine order, as wsync's own generator places them).

vLLM layouts (TP rank r of tp):
- embed_tokens, lm_head: rows chunked over TP (vocab parallel), bf16.
- qkv_proj: q, k, v each chunked along dim 0, rank r holds piece r of
  each, concatenated; when num_key_value_heads < tp, k and v are cut into
  num_key_value_heads pieces and rank r holds piece r * kv // tp
  (replicated over tp / kv ranks).
- o_proj: dim 1.  gate_up_proj: gate, up chunked along dim 0.  down_proj: dim 1.
- Qwen3-MoE experts (transformers 5 keeps them stacked:
  mlp.experts.gate_up_proj [E, 2I, H], gate rows first; down_proj [E, H, I]):
  w13_weight [E_local, 2I, H] and w2_weight [E_local, H, I].
  ep == tp: rank r holds a contiguous range of whole experts (vLLM's linear
  placement, the first E % ep ranks one extra), "experts": {"start", "end"}.
  ep == 1: every expert, each one's gate half and up half chunked along
  dim 1 ("tp" dim 1), down along dim 2 ("tp" dim 2).
- router mlp.gate.weight, norms (incl. q_norm/k_norm): replicated, bf16.
- With dtype "fp8_e4m3" every attention / MLP / expert projection is block
  fp8 (fp8_reference) with `<name>_scale_inv`. Blocks are defined on the
  trainer tensors before fusion; since every TP cut and fused seam must
  fall on a multiple of 128 (checked; a ValueError names the tensor and
  rank otherwise), quantizing the assembled local tensor gives the same
  bytes.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fp8_reference  # noqa: E402

BLOCK = fp8_reference.BLOCK
ALIGN = 256

_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
                torch.float8_e4m3fn: "fp8_e4m3"}
_NAME_DTYPES = {v: k for k, v in _DTYPE_NAMES.items()}


def dtype_name(dtype):
    """The schema's spelling of a torch dtype ("bf16", "fp8_e4m3", ...)."""
    return _DTYPE_NAMES[dtype]


def torch_dtype(name):
    return _NAME_DTYPES[name]


def tp_piece(t, dim, tp, rank, shards=None):
    """(piece, start) of rank's piece of t along dim: torch.chunk into tp
    pieces, or, with shards < tp, into `shards` pieces of which rank holds
    number rank * shards // tp."""
    n = shards if shards is not None and shards < tp else tp
    index = rank * n // tp if n < tp else rank
    size = -(-t.shape[dim] // n)  # torch.chunk: ceil, the last one shorter
    start = min(index * size, t.shape[dim])
    return t.narrow(dim, start, min(size, t.shape[dim] - start)), start


def expert_range(num_experts, ep, rank):
    """[start, end) of the experts on EP rank `rank` (first E % ep ranks one extra)."""
    base, rem = divmod(num_experts, ep)
    start = rank * base + min(rank, rem)
    return start, start + base + (1 if rank < rem else 0)


class _Def:
    """One engine tensor: its fused parts (source tensors) and how it splits."""

    def __init__(self, name, parts, split=None, dim=0, quantize=False, concat_dim=0):
        self.name = name
        self.parts = parts          # [(tensor, shards or None)], concatenated along concat_dim
        self.split = split          # None (replicated), "tp", or "experts"
        self.dim = dim              # tp dim on the engine tensor
        self.quantize = quantize
        self.concat_dim = concat_dim


def _engine_defs(state, config, tp):
    arch = (config.get("architectures") or [""])[0]
    model_type = config.get("model_type", "")
    moe = arch == "Qwen3MoeForCausalLM" or model_type == "qwen3_moe"
    dense = arch in ("LlamaForCausalLM", "Qwen3ForCausalLM") or model_type in ("llama", "qwen3")
    if not moe and not dense:
        raise ValueError(f"engine_layout knows llama, qwen3 and qwen3_moe, not {arch or model_type!r}")
    kv = int(config["num_key_value_heads"])
    layers = int(config["num_hidden_layers"])
    defs = [_Def("model.embed_tokens.weight", [(state["model.embed_tokens.weight"], None)], "tp", 0)]
    for L in range(layers):
        p = f"model.layers.{L}."
        a = p + "self_attn."
        defs.append(_Def(p + "input_layernorm.weight", [(state[p + "input_layernorm.weight"], None)]))
        defs.append(_Def(a + "qkv_proj.weight", [(state[a + "q_proj.weight"], None),
                                                 (state[a + "k_proj.weight"], kv),
                                                 (state[a + "v_proj.weight"], kv)],
                         "tp", 0, quantize=True))
        defs.append(_Def(a + "o_proj.weight", [(state[a + "o_proj.weight"], None)], "tp", 1,
                         quantize=True))
        for norm in ("q_norm", "k_norm"):
            if a + norm + ".weight" in state:
                defs.append(_Def(a + norm + ".weight", [(state[a + norm + ".weight"], None)]))
        defs.append(_Def(p + "post_attention_layernorm.weight",
                         [(state[p + "post_attention_layernorm.weight"], None)]))
        m = p + "mlp."
        if m + "experts.gate_up_proj" in state:
            defs.append(_Def(m + "gate.weight", [(state[m + "gate.weight"], None)]))
            gate_up = state[m + "experts.gate_up_proj"]
            inter = gate_up.shape[1] // 2
            defs.append(_Def(m + "experts.w13_weight",
                             [(gate_up[:, :inter], None), (gate_up[:, inter:], None)],
                             "experts", 1, quantize=True, concat_dim=1))
            defs.append(_Def(m + "experts.w2_weight", [(state[m + "experts.down_proj"], None)],
                             "experts", 2, quantize=True))
        else:
            defs.append(_Def(m + "gate_up_proj.weight", [(state[m + "gate_proj.weight"], None),
                                                         (state[m + "up_proj.weight"], None)],
                             "tp", 0, quantize=True))
            defs.append(_Def(m + "down_proj.weight", [(state[m + "down_proj.weight"], None)],
                             "tp", 1, quantize=True))
    defs.append(_Def("model.norm.weight", [(state["model.norm.weight"], None)]))
    lm_head = state.get("lm_head.weight", state["model.embed_tokens.weight"])  # tied: a copy
    defs.append(_Def("lm_head.weight", [(lm_head, None)], "tp", 0))
    return defs


def _check_fp8_cuts(d, rank, cuts):
    """cuts: [(start in the source, length)] of each part, in order."""
    seam = 0
    for i, (start, length) in enumerate(cuts):
        if start % BLOCK or (i + 1 < len(cuts) and (seam + length) % BLOCK):
            raise ValueError(f"fp8 tensor {d.name!r} on TP rank {rank}: part {i} is cut at "
                             f"{start} ({length} long), not on a {BLOCK} boundary")
        seam += length


def engine_layout(state, config, tp=2, ep=1, dtype="fp8_e4m3", ranks=None):
    """({rank: {engine name: tensor}}, {rank: [layout entry]}) of a TP engine.

    state: {HF name: full tensor}; config: the HF config.json dict;
    ep: 1 (experts TP-split) or tp (experts split by range);
    dtype: "fp8_e4m3" (projections block fp8, the rest bf16) or "bf16".
    Layout entries: {"name", "shape", "dtype", optional "tp": {"dim",
    "rank", "size"} or "experts": {"start", "end"}, and for fp8 "scale":
    {"name", "shape", "dtype": "fp32"}}, in engine order.
    """
    if ep not in (1, tp):
        raise ValueError(f"ep must be 1 or tp ({tp}), got {ep}")
    if dtype not in ("fp8_e4m3", "bf16"):
        raise ValueError(f"dtype must be fp8_e4m3 or bf16, got {dtype!r}")
    defs = _engine_defs(state, config, tp)
    tensors, layout = {}, {}
    for r in (range(tp) if ranks is None else ranks):
        tensors[r], layout[r] = {}, []
        for d in defs:
            entry = {"name": d.name}
            by_experts = d.split == "experts" and ep > 1
            by_tp = tp > 1 and (d.split == "tp" or (d.split == "experts" and ep == 1))
            pieces, cuts = [], []
            for t, shards in d.parts:
                if by_experts:
                    start, end = expert_range(t.shape[0], ep, r)
                    pieces.append(t[start:end])
                    cuts.append((0, t.shape[d.concat_dim]))
                elif by_tp:
                    piece, start = tp_piece(t, d.dim, tp, r, shards)
                    pieces.append(piece)
                    cuts.append((start, piece.shape[d.dim]))
                else:
                    pieces.append(t)
                    cuts.append((0, t.shape[d.concat_dim]))
            local = torch.cat(pieces, dim=d.concat_dim) if len(pieces) > 1 else pieces[0]
            local = local.to(torch.bfloat16).contiguous()
            if by_experts:
                start, end = expert_range(d.parts[0][0].shape[0], ep, r)
                entry["experts"] = {"start": start, "end": end}
            elif by_tp:
                entry["tp"] = {"dim": d.dim, "rank": r, "size": tp}
            if d.quantize and dtype == "fp8_e4m3":
                if by_tp:
                    _check_fp8_cuts(d, r, cuts)
                q, scale_inv = fp8_reference.quantize_block_fp8(local)
                tensors[r][d.name] = q
                tensors[r][d.name + "_scale_inv"] = scale_inv
                entry.update(shape=list(q.shape), dtype="fp8_e4m3",
                             scale={"name": d.name + "_scale_inv",
                                    "shape": list(scale_inv.shape), "dtype": "fp32"})
            else:
                tensors[r][d.name] = local
                entry.update(shape=list(local.shape), dtype="bf16")
            layout[r].append(_ordered(entry))
    return tensors, layout


def _ordered(entry):
    keys = ["name", "shape", "dtype", "tp", "experts", "scale"]
    return {k: entry[k] for k in keys if k in entry}


def _nbytes(shape, dtype):
    n = 1
    for s in shape:
        n *= s
    return n * torch.empty((), dtype=torch_dtype(dtype)).element_size()


def _align(v):
    return (v + ALIGN - 1) // ALIGN * ALIGN


def place(entries):
    """Entries with "region": "weights" and 256-byte aligned offsets (each
    scale right after its tensor), and the region's size."""
    out, offset = [], 0
    for e in entries:
        e = dict(e, region="weights", offset=offset)
        offset = _align(offset + _nbytes(e["shape"], e["dtype"]))
        if "scale" in e:
            e["scale"] = dict(e["scale"], region="weights", offset=offset)
            offset = _align(offset + _nbytes(e["scale"]["shape"], "fp32"))
        out.append(e)
    return out, offset


def inference_v1(layout, instances=1, host="infer-0"):
    """A wsync.inference/v1 document for `instances` engine replicas of the
    layout (rank = instance * tp + TP rank), dry-run descriptors."""
    tp = len(layout)
    ranks = []
    for i in range(instances):
        for r in range(tp):
            placed, size = place(layout[r])
            ranks.append({"rank": i * tp + r, "instance": i, "host": host, "gpu": i * tp + r,
                          "nic": 0, "regions": [{"id": "weights", "size": size, "descriptor": ""}],
                          "tensors": placed})
    return {"schema": "wsync.inference/v1", "ranks": ranks}


def allocate(entries):
    """{name: zero tensor} per layout entry (and its scale): empty engine
    memory an inference rank registers before the first sync."""
    out = {}
    for e in entries:
        out[e["name"]] = torch.zeros(e["shape"], dtype=torch_dtype(e["dtype"]))
        if "scale" in e:
            out[e["scale"]["name"]] = torch.zeros(e["scale"]["shape"], dtype=torch.float32)
    return out
