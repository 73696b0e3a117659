"""A trainer job for the torch sync tests: FSDP2 over torchrun ranks on CPU
(Gloo), three real optimizer steps, a wsync push after each.

    torchrun --standalone --nproc-per-node 4 python/tests/sync_trainer.py \
        --controller HOST:PORT --model llama --out DIR [--route sidecar]

After version v is complete, rank 0 saves what an independent check needs
(DIR/trainer-v<v>.pt: the full_tensor() state, the model's own greedy
tokens, every rank's push report), then waits for every engine's
DIR/engine-<r>-v<v>.done before the next optimizer step, so an engine can
snapshot v before v+1 overwrites it.
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

sys.path.insert(0, os.path.dirname(__file__))
import fsdp_setup  # noqa: E402
import torch_models  # noqa: E402

import wsync  # noqa: E402


def build(model_name, world, strided=False, dtype=torch.bfloat16):
    if model_name in ("llama", "qwen3"):
        builder = torch_models.small_llama if model_name == "llama" else torch_models.small_qwen3
        config, model = builder(dtype=dtype)
        fsdp_setup.shard_dense(model, init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",)))
    else:
        config, model = torch_models.small_qwen3_moe(dtype=dtype)
        fsdp_setup.shard_moe_with_ep(model, ep=2, expert_fsdp_dim=0 if strided else 1)
    return model


def wait_for_engines(out, engines, v, timeout):
    deadline = time.time() + timeout
    for r in range(engines):
        path = os.path.join(out, f"engine-{r}-v{v}.done")
        while not os.path.exists(path):
            if time.time() > deadline:
                raise TimeoutError(f"engine {r} never saved version {v}")
            time.sleep(0.05)


def back_to_back(sync, model, optimizer, args, rank, world):
    """Asynchronous RL's trainer: step, push, step again as soon as the push
    no longer reads the weights; the engines decide when they take a version
    (engine-paced) and nothing else coordinates the two. A push that fails
    (an engine that never calls update()) is recorded and training goes on."""
    outcomes, handles = [], []
    for v in range(1, args.steps + 1):
        fsdp_setup.train_step(model, optimizer, v, rank)
        t0 = time.perf_counter()
        h = sync.push(v)
        h.wait_reads_done(args.timeout + 60)
        stall = time.perf_counter() - t0
        state = fsdp_setup.full_state(model)
        if rank == 0:
            torch.save({"state": state}, os.path.join(args.out, f"trainer-v{v}.pt"))
        handles.append((v, h, stall))
    for v, h, stall in handles:
        try:
            report = h.wait(args.timeout + 60)
            outcomes.append({"version": v, "ok": True, "stall_seconds": stall,
                             "engine_wait": report.get("stages", {}).get("engine_wait")})
        except wsync.PushError as e:
            outcomes.append({"version": v, "ok": False, "stall_seconds": stall, "error": str(e)})
        print(f"rank {rank}: version {v}: {outcomes[-1]}", flush=True)
    everyone = [None] * world
    dist.all_gather_object(everyone, outcomes)
    if rank == 0:
        with open(os.path.join(args.out, "push-outcomes.json"), "w") as f:
            json.dump(everyone, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--controller", required=True)
    ap.add_argument("--job", default="torch-sync")
    ap.add_argument("--model", choices=["llama", "qwen3", "qwen3_moe"], default="llama")
    ap.add_argument("--fp32", action="store_true",
                    help="fp32 master weights (the params and AdamW in fp32; the engines hold bf16 or fp8)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--engines", type=int, default=2)
    ap.add_argument("--out", required=True)
    ap.add_argument("--route", choices=["inprocess", "sidecar"], default="inprocess")
    ap.add_argument("--watermark-mb", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--strided", action="store_true",
                    help="experts FSDP-sharded on the EP dim: FSDP2's _StridedShard placements")
    ap.add_argument("--no-tokens", action="store_true", help="skip the static fire (bad-input cases)")
    ap.add_argument("--double-push", action="store_true", help="push twice without waiting (a bad-input case)")
    ap.add_argument("--checksums", action="store_true", help="TrainerAgent(checksums=True)")
    ap.add_argument("--hold", metavar="FILE",
                    help="once planned, wait for FILE before the first push (a test acts on a planned job)")
    ap.add_argument("--paced-engines", action="store_true",
                    help="the engines take each version with update() (engine-paced): no waiting for their files")
    ap.add_argument("--back-to-back", action="store_true",
                    help="engine-paced engines: push after every step without waiting for any engine; save each "
                         "version's state once its reads are done, and every push's outcome (push-outcomes.json)")
    ap.add_argument("--lr", type=float, default=fsdp_setup.LR, help="AdamW learning rate")
    ap.add_argument("--delta", action="store_true", help="TrainerAgent(delta=True)")
    ap.add_argument("--replay", action="store_true",
                    help="after every version but the last, replay_writes() (the next version restores the bytes)")
    args = ap.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = build(args.model, world, args.strided, torch.float32 if args.fp32 else torch.bfloat16)
    optimizer = fsdp_setup.make_optimizer(model, lr=args.lr)

    if args.route == "inprocess":
        sync = wsync.TrainerAgent(model, controller=args.controller, job=args.job,
                                  watermark_bytes=args.watermark_mb << 20, timeout_s=args.timeout,
                                  checksums=args.checksums, delta=args.delta)
        if rank == 0:
            with open(os.path.join(args.out, "registration.json"), "w") as f:
                json.dump(sync.registration, f)
    else:
        exporter = wsync.export_shards(model, job=args.job, layout_path=os.path.join(args.out, "trainer.json"))
        if rank == 0:
            open(os.path.join(args.out, "exported"), "w").close()
    if args.hold:
        if rank == 0:
            open(os.path.join(args.out, "planned"), "w").close()
        deadline = time.time() + args.timeout
        while not os.path.exists(args.hold):
            if time.time() > deadline:
                raise TimeoutError(f"{args.hold} never appeared")
            time.sleep(0.05)
    if args.back_to_back:
        try:
            back_to_back(sync, model, optimizer, args, rank, world)
        finally:
            sync.close()
        fsdp_setup.leave_job()
        return
    try:
        for v in range(1, args.steps + 1):
            fsdp_setup.train_step(model, optimizer, v, rank)
            t0 = time.perf_counter()
            if args.route == "inprocess":
                h = sync.push(v)
                if args.double_push:
                    try:
                        sync.push(v + 1)
                    except wsync.PushError as e:
                        print(f"rank {rank}: second push refused: {e}", flush=True)
                        if rank == 0:
                            with open(os.path.join(args.out, "double-push.txt"), "w") as f:
                                f.write(str(e))
                h.wait_reads_done(args.timeout)
                reads_done = time.perf_counter() - t0
                report = h.wait(args.timeout)
            else:
                exporter.publish(v)
                exporter.wait_reads_done(v, args.timeout)
                reads_done = time.perf_counter() - t0
                report = {}
                wait_for_engines(args.out, 0, v, args.timeout)
            report["push_to_return_seconds"] = time.perf_counter() - t0
            report["reads_done_seconds"] = reads_done
            reports = [None] * world
            dist.all_gather_object(reports, report)
            state = fsdp_setup.full_state(model)
            tokens = None if args.no_tokens else fsdp_setup.greedy_tokens(model)
            if rank == 0:
                torch.save({"state": state, "tokens": tokens, "reports": reports},
                           os.path.join(args.out, f"trainer-v{v}.pt"))
                print(f"version {v}: {json.dumps(reports[0])}", flush=True)
                if not args.paced_engines:
                    wait_for_engines(args.out, args.engines, v, args.timeout)
            dist.barrier()
            if args.replay and args.route == "inprocess" and v < args.steps:
                replay = sync.replay_writes()
                replays = [None] * world
                dist.all_gather_object(replays, {"push": reports[rank], "replay": replay})
                if rank == 0:
                    with open(os.path.join(args.out, f"replay-v{v}.json"), "w") as f:
                        json.dump(replays, f)
    finally:
        if args.route == "inprocess":
            sync.close()
    fsdp_setup.leave_job()


if __name__ == "__main__":
    main()
