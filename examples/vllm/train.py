"""FSDP2 trainer pushing into `vllm serve` through vLLM's own trainer-side
weight-transfer API, with wsync as the backend (docs/VLLM.md).

    torchrun --standalone --nproc-per-node 2 examples/vllm/train.py \
        --controller 127.0.0.1:29600 --job qwen3-demo --server http://127.0.0.1:8000 --steps 3

Every rank: WeightTransferTrainerFactory.trainer_init(WsyncTrainerInitInfo(...),
client=HTTPVLLMWeightSyncClient(server), source=ModuleSource(model)); rank 0
(the sender) has the server initialize its workers' wsync backend. Per
step: one AdamW step, then send_weights() on every rank: each rank writes
its own shards (nothing is gathered), rank 0 drives the server's
/pause, /start_weight_update, /update_weights, /finish_weight_update,
/resume. Rank 0 then asks the server for greedy tokens on a fixed prompt.
"""

import argparse
import json
import os
import sys
import time
import urllib.request

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from vllm.distributed.weight_transfer.base import ModuleSource
from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "tests"))
import fsdp_setup  # noqa: E402
import torch_models  # noqa: E402

import wsync._vllm_plugin  # noqa: E402
from wsync.vllm import WsyncTrainerInitInfo  # noqa: E402

PROMPT = [1, 17, 42, 99, 250]


def served_tokens(server, model):
    body = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "return_token_ids": True}).encode()
    req = urllib.request.Request(f"{server}/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        choice = json.load(r)["choices"][0]
    return choice.get("token_ids") or choice["text"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--controller", required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--server", required=True, help="vllm serve's URL")
    ap.add_argument("--model", default=None, help="the served model's name (default: the server's first)")
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    _, model = torch_models.small_qwen3()
    fsdp_setup.shard_dense(model, init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",)))
    optimizer = fsdp_setup.make_optimizer(model)
    served = a.model
    if served is None:
        with urllib.request.urlopen(f"{a.server}/v1/models", timeout=60) as r:
            served = json.load(r)["data"][0]["id"]

    wsync._vllm_plugin.register()  # the trainer process is not vLLM: register the backend here
    engine = WeightTransferTrainerFactory.trainer_init(
        WsyncTrainerInitInfo(rank=rank, controller=a.controller, job=a.job),
        client=HTTPVLLMWeightSyncClient(a.server), source=ModuleSource(model))
    if rank == 0:
        print(f"train: step 0 served tokens {served_tokens(a.server, served)}", flush=True)
    for step in range(1, a.steps + 1):
        loss = fsdp_setup.train_step(model, optimizer, step, rank)
        t = time.perf_counter()
        report = engine.send_weights()
        took = time.perf_counter() - t
        if rank == 0:
            print(f"train: step {step} loss {loss:.4f}; version {engine.version} in vLLM after {took:.3f} s "
                  f"(push {report['stages']['total']:.3f} s); served tokens {served_tokens(a.server, served)}", flush=True)
    engine.shutdown()
    fsdp_setup.leave_job()


if __name__ == "__main__":
    main()
