"""FSDP2 training of a small Llama that pushes its weights with wsync after
every optimizer step.

    torchrun --standalone --nproc-per-node 4 examples/torch/train.py \
        --controller 127.0.0.1:29600 --job llama-demo --steps 5

Runs on CPU with Gloo (no GPU needed). Each rank trains on its own random
tokens; after optimizer step s the weights are version s:

    h = sync.push(s)            # returns at once; wsync reads the shards in the background
    ...forward/backward of the next step (reads the weights, never writes them)...
    h.wait_reads_done(timeout)  # before optimizer.step() writes them again
    report = h.wait(timeout)    # version s complete on every inference rank

Every step, rank 0 also prints 16 greedy tokens of the trained model on a
fixed prompt; examples/torch/infer.py prints the same line for the version it
received, so the two can be compared. --no-sync runs the torch parts alone.
"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from transformers import LlamaConfig, LlamaForCausalLM

PROMPT = [1, 17, 42, 99, 250]
VOCAB = 512


def build_model(seed=1234):
    """A 1.8M-parameter bf16 Llama (2 layers, hidden 256, 8 q / 4 kv heads of
    64, untied embeddings), eager attention: the same arithmetic everywhere."""
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=4, head_dim=64,
        max_position_embeddings=256, tie_word_embeddings=False, initializer_range=0.1,
        attn_implementation="eager", dtype="bfloat16")
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.eval()
    return model


@torch.no_grad()
def greedy_tokens(model, prompt=PROMPT, n=16):
    """n greedy tokens after prompt (full recompute, no KV cache). On an FSDP
    model every rank must call it: each forward all-gathers the weights."""
    ids = torch.tensor([prompt])
    out = []
    for _ in range(n):
        nxt = int(model(input_ids=ids, use_cache=False).logits[0, -1].argmax())
        out.append(nxt)
        ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    return out


def forward_backward(model, step, rank, batch=2, seq=32):
    gen = torch.Generator().manual_seed(1000 * step + rank)
    ids = torch.randint(0, VOCAB, (batch, seq), generator=gen)
    model.train()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    model.eval()
    return float(loss.detach())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--controller", default="127.0.0.1:29600", help="wsync controller HOST:PORT")
    ap.add_argument("--job", default="llama-demo")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--provider", default="shm", help='libfabric provider ("shm", "tcp;ofi_rxm")')
    ap.add_argument("--watermark-mb", type=int, default=256)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per wait")
    ap.add_argument("--interval", type=float, default=1.0,
                    help="seconds between a version's completion and the next push, "
                         "so that infer.py can decode each version before it is overwritten")
    # bf16 params: AdamW moves a weight by about lr; near 1.0 (norms) one ulp
    # is 2**-7, so a smaller lr leaves the norms unchanged.
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--async", dest="asynchronous", action="store_true",
                    help="asynchronous RL with an engine-paced infer.py (--paced): push after every step without "
                         "waiting for any engine; print how long each push held training (the stall until its "
                         "reads are done)")
    ap.add_argument("--no-sync", action="store_true", help="train without wsync (torch parts only)")
    args = ap.parse_args()

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    model = build_model()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    sync = None
    if not args.no_sync:
        import wsync

        sync = wsync.TrainerAgent(model, controller=args.controller, job=args.job,
                                  provider=args.provider,
                                  watermark_bytes=args.watermark_mb << 20,
                                  timeout_s=args.timeout)

    def log(*a):
        if rank == 0:
            print(*a, flush=True)

    pending = None  # the push of the previous version, still reading or writing
    try:
        for step in range(1, args.steps + 1):
            t0 = time.perf_counter()
            loss = forward_backward(model, step, rank)
            t_fb = time.perf_counter() - t0
            if pending is not None:
                t_stall = time.perf_counter()
                pending.wait_reads_done(args.timeout)  # wsync no longer reads the shards
                if args.asynchronous:
                    log(f"version {step - 1}: training held {time.perf_counter() - t_stall:.3f} s by the push")
            t1 = time.perf_counter()
            optimizer.step()  # the weights are now version `step`
            optimizer.zero_grad(set_to_none=True)
            t_opt = time.perf_counter() - t1
            if pending is not None and not args.asynchronous:
                report = pending.wait(args.timeout)
                log(f"version {step - 1} complete: {json.dumps(report)}")
                time.sleep(args.interval)
            if sync is not None:
                pending = sync.push(step)
            tokens = greedy_tokens(model)  # reads only: overlaps the push
            log(f"step {step} loss {loss:.4f} (fwd+bwd {t_fb:.3f}s, optimizer {t_opt:.3f}s) "
                f"version {step} tokens {tokens}")
        if pending is not None:
            report = pending.wait(args.timeout)
            log(f"version {args.steps} complete: {json.dumps(report)}")
    finally:
        if sync is not None:
            sync.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
