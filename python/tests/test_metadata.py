"""The metadata wsync reads from real FSDP2 DTensors equals what the model
generator (models/, `wsync plan --write-specs`) makes for the same model and
mesh, so a dry-run plan describes a real run."""

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import torch_models  # noqa: E402
from test_torch_sync import torchrun, wsync_binary  # noqa: E402

CASES = {
    "llama": ({"gpus": 4, "gpus_per_node": 4, "nics_per_node": 4, "fsdp": 4}, "llama.json"),
    "qwen3_moe": ({"gpus": 4, "gpus_per_node": 4, "nics_per_node": 4, "fsdp": 2, "ep": 2,
                   "expert_layout": "hf_fused"}, "hf_qwen3_moe.json"),
}


def normalized(spec):
    """Per rank and tensor, everything but mesh ids, hosts and devices; mesh
    ids replaced by the structure they stand for."""
    groups = {g["mesh"]: g for g in spec["mesh_groups"]}
    out = {}
    for r in spec["ranks"]:
        meshes = {m["mesh"]: m for m in r["meshes"]}
        for p in r["params"]:
            m = meshes[p["mesh"]]
            out[(r["rank"], p["name"])] = (
                tuple(p["global_shape"]), p["dtype"], tuple(p["placements"]), tuple(p["local_shape"]),
                tuple(p["local_offset"]) if 0 not in p["local_shape"] else None,
                tuple(m["shape"]), tuple(m["dim_names"]), tuple(m["coord"]),
                tuple(groups[p["mesh"]]["gather_dims"]))
    return out


@pytest.mark.parametrize("model", ["llama", "qwen3_moe"])
def test_dtensor_metadata_equals_the_generator(tmp_path, model):
    real = tmp_path / "real.json"
    subprocess.run([torchrun(), "--standalone", "--nproc-per-node", "4", os.path.join(HERE, "describe_job.py"),
                    "--model", model, "--out", str(real)], check=True, cwd=ROOT, timeout=300,
                   env=dict(os.environ, OMP_NUM_THREADS="1"))
    builder = torch_models.small_llama if model == "llama" else torch_models.small_qwen3_moe
    _, m = builder()
    (tmp_path / "config.json").write_text(json.dumps(torch_models.config_dict(m)))
    trainer, mapping = CASES[model]
    cluster = {"schema": "wsync.cluster/v1", "name": f"small-{model}", "model": "config.json",
               "mapping": os.path.join(ROOT, "configs", "mappings", mapping),
               "trainer": dict(trainer, dtype="bf16"),
               "inference": {"gpus": 2, "gpus_per_node": 2, "nics_per_node": 2, "gpus_per_instance": 2, "tp": 2,
                             "ep": 2 if model == "qwen3_moe" else 1, "dtype": "bf16"}}
    (tmp_path / "cluster.json").write_text(json.dumps(cluster))
    subprocess.run([wsync_binary(), "plan", "--cluster", str(tmp_path / "cluster.json"), "--write-specs",
                    str(tmp_path / "gen"), "-q"], check=True, stdout=subprocess.DEVNULL, timeout=120)
    got = normalized(json.loads(real.read_text()))
    want = normalized(json.loads((tmp_path / "gen" / "trainer.json").read_text()))
    assert sorted(got) == sorted(want), (sorted(set(got) ^ set(want)))[:10]
    for key in want:
        assert got[key] == want[key], f"rank {key[0]} tensor '{key[1]}': read {got[key]}, generated {want[key]}"


def test_pipeline_device_follows_the_shards_or_the_device_asked_for():
    """Where TrainerAgent runs the pipeline (FSDP2 CPU offload: shards in host
    memory, the pipeline on the GPU asked for). Meta tensors stand in for
    another device kind; the GPU run itself is python/tests/gpu/gpu_sync.py
    --offload."""
    import torch
    from wsync._trainer import _pipeline_device
    host = {"a": torch.zeros(2), "b": torch.zeros(3)}
    assert _pipeline_device(host) == (-1, False)
    assert _pipeline_device(host, "cpu") == (-1, False)
    assert _pipeline_device(host, "cuda:1") == (1, True)
    assert _pipeline_device(host, 2) == (2, True)
    with pytest.raises(ValueError, match="runs on the host or a CUDA device"):
        _pipeline_device(host, "meta")
    with pytest.raises(ValueError, match="must all live on one device; found cpu, meta"):
        _pipeline_device({"a": torch.zeros(2), "b": torch.zeros(2, device="meta")}, "cuda:0")
