"""Tests of the torch test scaffolding itself (models, FSDP setups, the fp8
and engine-layout references), so that wsync's tests can trust them.

    build/venv/bin/python -m pytest -q python/tests/test_scaffolding.py   (venv: scripts/python_env.sh)
"""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import engine_layout  # noqa: E402
import torch_models  # noqa: E402
from fp8_reference import dequantize_block_fp8, fp8_bytes, quantize_block_fp8  # noqa: E402

# ------------------------------------------------------------------ models --


@pytest.mark.parametrize("build", [torch_models.small_llama, torch_models.small_qwen3_moe])
def test_models_are_seeded_bf16_and_untied(build):
    config, a = build()
    _, b = build()
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert p.dtype == torch.bfloat16, name
        assert torch.equal(p, q), name
    assert a.lm_head.weight.data_ptr() != a.model.embed_tokens.weight.data_ptr()
    d = torch_models.config_dict(a)
    assert d["architectures"] == [type(a).__name__]
    assert d["tie_word_embeddings"] is False
    assert json.loads(json.dumps(d)) == d


def test_qwen3_moe_config_has_published_keys():
    _, model = torch_models.small_qwen3_moe()
    d = torch_models.config_dict(model)
    assert d["num_experts"] == 4 and d["num_experts_per_tok"] == 2
    assert d["moe_intermediate_size"] == 256 and d["head_dim"] == 64
    gate_up = model.model.layers[0].mlp.experts.gate_up_proj
    assert list(gate_up.shape) == [4, 512, 256]


# --------------------------------------------------------------------- fp8 --

# Every finite e4m3fn value, by code (0x7F / 0xFF are NaN).
_CODES = torch.arange(256, dtype=torch.uint8)
_VALUES = _CODES.view(torch.float8_e4m3fn).float()


def _nearest_even_code(v):
    """Brute force: the e4m3fn code nearest to fp32 v (ties to the even
    code), saturated to +-448; independent of torch's cast. (+0 and -0
    compare equal below, so the sign of a zero is not checked.)"""
    v = max(-448.0, min(448.0, v))
    finite = ~torch.isnan(_VALUES)
    dist = (_VALUES - v).abs()
    dist[~finite] = float("inf")
    best = dist.min()
    ties = [int(c) for c in _CODES[dist == best]]
    even = [c for c in ties if c % 2 == 0]
    return (even or ties)[0]


def test_torch_cast_rounds_to_nearest_even_and_saturates():
    gen = torch.Generator().manual_seed(0)
    vals = torch.cat([
        torch.randn(2000, generator=gen) * 100,
        torch.randn(500, generator=gen) * 1e-3,  # subnormal range (< 2**-6)
        _VALUES[~torch.isnan(_VALUES)],  # every exact value
        # midpoints between neighbours: the ties
        (_VALUES[1:126] + _VALUES[0:125]) / 2,
        torch.tensor([448.0, 449.0, 463.9, 464.0, 465.0, 479.0, 480.0, 1e4, -1e4, -470.0]),
    ])
    got = vals.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    for v, g in zip(vals.tolist(), got.tolist()):
        want = _nearest_even_code(v)
        assert _VALUES[g] == _VALUES[want], (v, g, want)
    # without the clamp this torch saturates as well (documented in fp8_reference)
    raw = torch.tensor([449.0, 480.0, 1e4, float("inf")]).to(torch.float8_e4m3fn)
    assert fp8_bytes(raw).tolist() in ([126] * 4, [127] * 4)


def test_fp8_zero_blocks_get_scale_one():
    x = torch.zeros(256, 384, dtype=torch.bfloat16)
    x[:128, 128:256] = 3.0
    q, s = quantize_block_fp8(x)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32
    assert list(s.shape) == [2, 3]
    third = (torch.tensor(3.0) / 448).item()  # the fp32 quotient
    assert s.tolist() == [[1.0, third, 1.0], [1.0, 1.0, 1.0]]
    assert (fp8_bytes(q)[:, :128] == 0).all()
    assert (q[:128, 128:256].float() == 448).all()


def test_fp8_partial_blocks_use_ceil_grid():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(130, 200, generator=gen).to(torch.bfloat16)
    q, s = quantize_block_fp8(x)
    assert list(q.shape) == [130, 200] and list(s.shape) == [2, 2]
    for bi in range(2):
        for bj in range(2):
            block = x[bi * 128:(bi + 1) * 128, bj * 128:(bj + 1) * 128].float()
            assert s[bi, bj] == block.abs().max() / 448
    # the corner block (2 x 72) is quantized on its own amax
    corner = x[128:, 128:].float()
    assert q[128:, 128:].float().abs().max() == 448
    torch.testing.assert_close(dequantize_block_fp8(q, s)[128:, 128:], corner,
                               rtol=0.07, atol=0)


def test_fp8_negative_and_exact_amax():
    x = torch.full((128, 128), 0.5, dtype=torch.bfloat16)
    x[5, 7] = -2.0  # the amax is negative
    x[9, 9] = 2.0
    q, s = quantize_block_fp8(x)
    assert s.item() == torch.tensor(2.0 / 448, dtype=torch.float32).item()
    assert q[5, 7].float() == -448 and q[9, 9].float() == 448
    assert fp8_bytes(q)[5, 7] == 0xFE and fp8_bytes(q)[9, 9] == 0x7E
    assert q[0, 0].float() == 112  # 0.5 / (2 / 448)


def test_fp8_tiny_values_and_subnormal_scale():
    x = torch.zeros(128, 128, dtype=torch.bfloat16)
    x[0, 0] = 1e-39  # bf16 subnormal; scale ~2e-42 is an fp32 subnormal
    x[0, 1] = -5e-40
    q, s = quantize_block_fp8(x)
    assert 0 < s.item() < torch.finfo(torch.float32).tiny
    assert q[0, 0].float() == 448  # clamped: x / subnormal scale rounds above 448
    assert q[0, 1].float() < 0
    deq = dequantize_block_fp8(q, s)
    assert deq[0, 0].item() == pytest.approx(x[0, 0].float().item(), rel=0.05)
    # tiny values beside a large one underflow to 0 or an e4m3 subnormal
    y = torch.zeros(128, 128, dtype=torch.bfloat16)
    y[0, 0], y[0, 1], y[0, 2] = 448.0, 2.0 ** -9, 2.0 ** -10  # scale 1
    qy, sy = quantize_block_fp8(y)
    assert sy.item() == 1.0
    assert fp8_bytes(qy)[0, 1:3].tolist() == [1, 0]  # 2**-9 smallest subnormal; 2**-10 tie -> 0


def test_fp8_leading_dims_have_own_grids_and_rejects_nonfinite():
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(3, 256, 128, generator=gen).to(torch.bfloat16)
    x[1] *= 100
    q, s = quantize_block_fp8(x)
    assert list(s.shape) == [3, 2, 1]
    for e in range(3):
        qe, se = quantize_block_fp8(x[e])
        assert torch.equal(fp8_bytes(q[e]), fp8_bytes(qe)) and torch.equal(s[e], se)
    x[2, 3, 4] = float("nan")
    with pytest.raises(ValueError):
        quantize_block_fp8(x)
    with pytest.raises(ValueError):
        quantize_block_fp8(torch.ones(5))


# ----------------------------------------------------------- engine layout --


def _state(build):
    _, model = build()
    return {n: p.detach() for n, p in model.named_parameters()}, torch_models.config_dict(model)


def test_llama_bf16_pieces_rebuild_the_trainer_tensors():
    state, config = _state(torch_models.small_llama)
    tensors, layout = engine_layout.engine_layout(state, config, tp=2, dtype="bf16")
    a = "model.layers.1.self_attn."
    q, k, v = state[a + "q_proj.weight"], state[a + "k_proj.weight"], state[a + "v_proj.weight"]
    for r in range(2):
        qkv = tensors[r][a + "qkv_proj.weight"]
        assert torch.equal(qkv, torch.cat([q[256 * r:256 * (r + 1)], k[128 * r:128 * (r + 1)],
                                           v[128 * r:128 * (r + 1)]]))
        assert torch.equal(tensors[r][a + "o_proj.weight"],
                           state[a + "o_proj.weight"][:, 256 * r:256 * (r + 1)])
        m = "model.layers.0.mlp."
        assert torch.equal(tensors[r][m + "gate_up_proj.weight"],
                           torch.cat([state[m + "gate_proj.weight"][256 * r:256 * (r + 1)],
                                      state[m + "up_proj.weight"][256 * r:256 * (r + 1)]]))
        assert torch.equal(tensors[r][m + "down_proj.weight"],
                           state[m + "down_proj.weight"][:, 256 * r:256 * (r + 1)])
        assert torch.equal(tensors[r]["lm_head.weight"], state["lm_head.weight"][256 * r:256 * (r + 1)])
        assert torch.equal(tensors[r]["model.norm.weight"], state["model.norm.weight"])
    by_name = {e["name"]: e for e in layout[1]}
    assert by_name[a + "qkv_proj.weight"] == {"name": a + "qkv_proj.weight", "shape": [512, 256],
                                              "dtype": "bf16", "tp": {"dim": 0, "rank": 1, "size": 2}}
    assert "tp" not in by_name["model.norm.weight"]
    names = [e["name"] for e in layout[0]]
    assert names[0] == "model.embed_tokens.weight" and names[-1] == "lm_head.weight"


def test_kv_heads_below_tp_are_replicated():
    state, config = _state(torch_models.small_llama)  # 4 kv heads
    tensors, _ = engine_layout.engine_layout(state, config, tp=8, dtype="bf16")
    k = state["model.layers.0.self_attn.k_proj.weight"]
    for r in range(8):
        qkv = tensors[r]["model.layers.0.self_attn.qkv_proj.weight"]
        assert qkv.shape[0] == 64 + 64 + 64  # q 512/8, k and v one 64-row head each
        piece = r * 4 // 8
        assert torch.equal(qkv[64:128], k[64 * piece:64 * (piece + 1)])
    with pytest.raises(ValueError, match="qkv_proj.*not on a 128 boundary"):
        engine_layout.engine_layout(state, config, tp=4)  # k/v cut into 64-row pieces


def _quantize_then_slice(src, dim, r, tp):
    """Blocks on the whole trainer tensor (SCHEMA: before fusion), then TP-slice."""
    q, s = quantize_block_fp8(src)
    n = src.shape[dim] // tp
    nb = n // 128
    return (fp8_bytes(q).narrow(dim, n * r, n),
            s.narrow(dim - src.dim() + s.dim(), nb * r, nb))


def test_fp8_engine_tensors_equal_quantize_before_fusion():
    state, config = _state(torch_models.small_llama)
    tensors, layout = engine_layout.engine_layout(state, config, tp=2)
    a = "model.layers.0.self_attn."
    for r in range(2):
        parts = [_quantize_then_slice(state[a + n + "_proj.weight"], 0, r, 2) for n in "qkv"]
        qkv, qkv_scale = tensors[r][a + "qkv_proj.weight"], tensors[r][a + "qkv_proj.weight_scale_inv"]
        assert torch.equal(fp8_bytes(qkv), torch.cat([p[0] for p in parts]))
        assert torch.equal(qkv_scale, torch.cat([p[1] for p in parts]))
        qo, so = _quantize_then_slice(state[a + "o_proj.weight"], 1, r, 2)
        assert torch.equal(fp8_bytes(tensors[r][a + "o_proj.weight"]), qo)
        assert torch.equal(tensors[r][a + "o_proj.weight_scale_inv"], so)
    e = {x["name"]: x for x in layout[0]}[a + "qkv_proj.weight"]
    assert e["dtype"] == "fp8_e4m3" and e["scale"] == {"name": a + "qkv_proj.weight_scale_inv",
                                                       "shape": [4, 2], "dtype": "fp32"}
    assert tensors[0]["model.embed_tokens.weight"].dtype == torch.bfloat16


def test_qwen3_moe_experts_ep_and_tp():
    state, config = _state(torch_models.small_qwen3_moe)
    gate_up = state["model.layers.1.mlp.experts.gate_up_proj"]  # [4, 512, 256]
    down = state["model.layers.1.mlp.experts.down_proj"]  # [4, 256, 256]
    m = "model.layers.1.mlp.experts."
    t_ep, l_ep = engine_layout.engine_layout(state, config, tp=2, ep=2, dtype="bf16")
    t_tp, l_tp = engine_layout.engine_layout(state, config, tp=2, ep=1, dtype="bf16")
    for r in range(2):
        assert torch.equal(t_ep[r][m + "w13_weight"], gate_up[2 * r:2 * r + 2])
        assert torch.equal(t_ep[r][m + "w2_weight"], down[2 * r:2 * r + 2])
        w13 = t_tp[r][m + "w13_weight"]
        assert list(w13.shape) == [4, 256, 256]
        assert torch.equal(w13[:, :128], gate_up[:, 128 * r:128 * (r + 1)])  # gate half
        assert torch.equal(w13[:, 128:], gate_up[:, 256 + 128 * r:256 + 128 * (r + 1)])  # up half
        assert torch.equal(t_tp[r][m + "w2_weight"], down[:, :, 128 * r:128 * (r + 1)])
        router = "model.layers.1.mlp.gate.weight"
        assert torch.equal(t_tp[r][router], state[router])
        assert torch.equal(t_tp[r]["model.layers.1.self_attn.q_norm.weight"],
                           state["model.layers.1.self_attn.q_norm.weight"])
    e_ep = {x["name"]: x for x in l_ep[1]}[m + "w13_weight"]
    assert e_ep == {"name": m + "w13_weight", "shape": [2, 512, 256], "dtype": "bf16",
                    "experts": {"start": 2, "end": 4}}
    e_tp = {x["name"]: x for x in l_tp[1]}[m + "w2_weight"]
    assert e_tp["tp"] == {"dim": 2, "rank": 1, "size": 2} and "experts" not in e_tp
    assert [engine_layout.expert_range(5, 2, r) for r in (0, 1)] == [(0, 3), (3, 5)]
    # fp8: one scale grid per expert
    t8, l8 = engine_layout.engine_layout(state, config, tp=2, ep=1)
    assert list(t8[0][m + "w13_weight_scale_inv"].shape) == [4, 2, 2]
    q, s = quantize_block_fp8(gate_up)
    assert torch.equal(t8[0][m + "w13_weight_scale_inv"][:, 0], s[:, 0])  # gate rows 0..127
    assert torch.equal(t8[0][m + "w13_weight_scale_inv"][:, 1], s[:, 2])  # up rows 0..127


def test_inference_v1_places_tensors_aligned():
    state, config = _state(torch_models.small_qwen3_moe)
    _, layout = engine_layout.engine_layout(state, config, tp=2, ep=2)
    doc = engine_layout.inference_v1(layout, instances=2)
    assert [r["rank"] for r in doc["ranks"]] == [0, 1, 2, 3]
    for rank in doc["ranks"]:
        end = 0
        for t in rank["tensors"]:
            for x in [t] + ([t["scale"]] if "scale" in t else []):
                assert x["offset"] % 256 == 0 and x["offset"] >= end
                end = x["offset"] + engine_layout._nbytes(x["shape"], x["dtype"])
        assert end <= rank["regions"][0]["size"]
    allocated = engine_layout.allocate(layout[0])
    assert allocated["model.layers.0.mlp.experts.w13_weight"].dtype == torch.float8_e4m3fn


WSYNC = os.path.join(ROOT, "build", "cli", "wsync")


@pytest.mark.skipif(not os.access(WSYNC, os.X_OK), reason="build/cli/wsync not built")
@pytest.mark.parametrize("build,mapping,ep", [
    (torch_models.small_llama, "llama.json", 1),
    (torch_models.small_qwen3_moe, "qwen3_moe.json", 1),
    (torch_models.small_qwen3_moe, "qwen3_moe.json", 2),
])
def test_layout_matches_wsync_generator(tmp_path, build, mapping, ep):
    """The C++ spec generator's engine tensors (names, shapes, dtypes,
    offsets, scales) for this model equal engine_layout's."""
    state, config = _state(build)
    (tmp_path / "config.json").write_text(json.dumps(config))
    cluster = {
        "schema": "wsync.cluster/v1", "name": "scaffolding",
        "model": str(tmp_path / "config.json"),
        "mapping": os.path.join(ROOT, "configs", "mappings", mapping),
        "trainer": {"gpus": 4, "gpus_per_node": 4, "nics_per_node": 1, "fsdp": 4 // ep, "ep": ep},
        "inference": {"gpus": 2, "gpus_per_node": 2, "nics_per_node": 1, "gpus_per_instance": 2,
                      "tp": 2, "ep": ep, "dtype": "fp8_e4m3"},
    }
    (tmp_path / "cluster.json").write_text(json.dumps(cluster))
    out = tmp_path / "plan.json"
    subprocess.run([WSYNC, "plan", "--cluster", str(tmp_path / "cluster.json"),
                    "--out", str(out), "-q"], check=True, capture_output=True)
    plan = json.loads(out.read_text())
    _, layout = engine_layout.engine_layout(state, config, tp=2, ep=ep)
    doc = engine_layout.inference_v1(layout)
    for rank in doc["ranks"]:
        want = {t["name"]: t for t in rank["tensors"]}
        got = {d["name"]: d for d in plan["destinations"] if d["rank"] == rank["rank"]}
        assert set(got) == set(want)
        for name, d in got.items():
            w = want[name]
            assert (d["shape"], d["dtype"], d["offset"]) == (w["shape"], w["dtype"], w["offset"]), name
            if "scale" in w:
                ds, ws = d["scale"], w["scale"]
                assert (ds["shape"], ds["offset"]) == (ws["shape"], ws["offset"]), name


# ------------------------------------------------------------------- FSDP2 --


def test_fsdp_setups_under_torchrun():
    """4 Gloo ranks: 3 AdamW steps change every tensor, expert gradients
    equal a plain model's, greedy tokens and logits of the sharded models
    equal those of plain models loaded with full_state()."""
    torchrun = shutil.which("torchrun") or os.path.join(os.path.dirname(sys.executable), "torchrun")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "4",
                           os.path.join(HERE, "fsdp_setup.py")],
                          capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "[rank 0] OK" in proc.stdout
    assert "(Shard(dim=1), Shard(dim=0))" in proc.stdout
