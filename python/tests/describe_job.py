"""Writes what wsync reads from real FSDP2 DTensors (every rank's
wsync.trainer/v1 entry and the MeshGroups) to OUT, for test_metadata.py.

    torchrun --standalone --nproc-per-node 4 python/tests/describe_job.py --model qwen3_moe --out OUT
"""

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
import fsdp_setup  # noqa: E402
from sync_trainer import build  # noqa: E402

from wsync._meta import describe  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["llama", "qwen3_moe"], required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    model = build(args.model, dist.get_world_size())
    entry, mesh_groups, _, _, _ = describe(model)
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, entry)
    if dist.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump({"schema": "wsync.trainer/v1", "mesh_groups": mesh_groups, "ranks": everyone}, f)
    fsdp_setup.leave_job()


if __name__ == "__main__":
    main()
