"""The trainer side of test_vllm.py: a real FSDP2 Qwen3 or Qwen3-MoE on the torchrun
ranks (Gloo, CPU) pushing versions into a vLLM engine through wsync.

    torchrun --standalone --nproc-per-node 2 vllm_trainer.py
        --controller HOST:PORT --job J --versions 3 --out OUT [--model NAME of BUILDERS]

For each version v: one AdamW step, the full state saved as a transformers
checkpoint in OUT/ckpt_v<v> (rank 0; what the test's fresh reference engine
loads), then TrainerAgent.push(v) and its wait (the engine is engine-paced:
the push lands when the engine's update_weights takes it); every rank's
push report goes to OUT/push-v<v>.json.

--fp32 keeps fp32 master weights (the checkpoints, like the engine, are
bf16); --rl-from V --rl-lr LR takes the steps from version V on at an RL
learning rate, which changes a few percent of the bytes: with --delta,
those versions go as deltas.
"""

import argparse
import json
import os
import shutil
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fsdp_setup  # noqa: E402
import torch_models  # noqa: E402

import wsync  # noqa: E402


# The trainer's model; its stacked experts (qwen3_moe) stay as transformers 5
# holds them: the engine maps vLLM's fused experts onto them.
def _qwen3_with(**changes):
    """The small Qwen3 with `changes` to its config (vllm_bad_inputs.py)."""
    def build():
        from transformers import Qwen3ForCausalLM

        config, _ = torch_models.small_qwen3()
        for key, value in changes.items():
            setattr(config, key, value)
        return torch_models._build(Qwen3ForCausalLM, config, torch_models.SEED)
    return build


# Models a Qwen3 engine cannot take (vllm_bad_inputs.py): llama lacks its
# q_norm / k_norm; qwen3_bias has attention biases it lacks; qwen3_wide has
# another MLP width.
BUILDERS = {"qwen3": torch_models.small_qwen3, "qwen3_moe": torch_models.small_qwen3_moe,
            "llama": torch_models.small_llama, "qwen3_bias": _qwen3_with(attention_bias=True),
            "qwen3_wide": _qwen3_with(intermediate_size=384)}


def save_checkpoint(builder, state, path):
    """A transformers checkpoint of `state` (full tensors) in `path`."""
    _, plain = builder()
    plain.load_state_dict(state, strict=True)
    tmp = path + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    plain.save_pretrained(tmp)
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--controller", required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--versions", type=int, default=3)
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="qwen3", choices=sorted(BUILDERS))
    ap.add_argument("--timeout-s", type=float, default=300.0, help="TrainerAgent's timeout (the plan included)")
    ap.add_argument("--delta", action="store_true", help="TrainerAgent(delta=True)")
    ap.add_argument("--fp32", action="store_true", help="fp32 master weights (qwen3, qwen3_moe)")
    ap.add_argument("--rl-from", type=int, default=0, help="from this version on, AdamW steps at --rl-lr")
    ap.add_argument("--rl-lr", type=float, default=1e-5)
    a = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    builder = BUILDERS[a.model]
    _, model = builder(dtype=torch.float32) if a.fp32 else builder()
    fsdp_setup.shard_dense(model, init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",)))
    optimizer = fsdp_setup.make_optimizer(model)
    agent = wsync.TrainerAgent(model, controller=a.controller, job=a.job, timeout_s=a.timeout_s, delta=a.delta)
    print(f"vllm_trainer rank {rank}: registered; the world is planned", flush=True)
    for v in range(1, a.versions + 1):
        if v == a.rl_from:
            for group in optimizer.param_groups:
                group["lr"] = a.rl_lr
        loss = fsdp_setup.train_step(model, optimizer, v, rank)
        state = fsdp_setup.full_state(model)
        if rank == 0:
            save_checkpoint(builder, state, os.path.join(a.out, f"ckpt_v{v}"))
        push = agent.push(v)
        push.wait_reads_done()
        report = push.wait()
        print(f"vllm_trainer rank {rank}: version {v} (loss {loss:.3f}) pushed: {report['stages']['total']:.3f} s; "
              f"{report['delta_writes']} of {report['writes']} writes as deltas, {report['written_bytes']} of "
              f"{report['write_bytes']} bytes on the wire", flush=True)
        reports = [None] * world
        dist.all_gather_object(reports, report)
        if rank == 0:
            with open(os.path.join(a.out, f"push-v{v}.json"), "w") as f:
                json.dump(reports, f)
    agent.close()
    fsdp_setup.leave_job()


if __name__ == "__main__":
    main()
