"""An inference process for the torch sync tests: holds its weights as torch
tensors registered in place with wsync.InferenceAgent, and after each
version saves what it received (DIR/engine-<rank>-v<v>.pt) and, holding a
whole transformers model, its greedy tokens.

    python python/tests/sync_engine.py --controller HOST:PORT --rank R \
        --model llama --layout identity --out DIR

--layout identity: the same transformers model class as the trainer (its
own random init, so nothing matches until the first version lands), one
replica per process. --layout fp8: one TP-2 instance in the fused
block-fp8 layout of a vLLM-style engine (python/tests/engine_layout.py),
its tensors poisoned (0xFF bytes) so that an unwritten byte shows;
--layout bf16: the same fused layout in bf16. TP instance --instance I
is inference ranks 2I and 2I + 1.
"""

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
import engine_layout  # noqa: E402
import fsdp_setup  # noqa: E402
import torch_models  # noqa: E402

import wsync  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--controller", required=True)
    ap.add_argument("--job", default="torch-sync")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--model", choices=["llama", "qwen3", "qwen3_moe"], default="llama")
    ap.add_argument("--layout", choices=["identity", "fp8", "bf16"], default="identity")
    ap.add_argument("--instance", type=int, default=0, help="fp8/bf16 layouts: the TP-2 instance (ranks 2I, 2I+1)")
    ap.add_argument("--ep", type=int, default=1, help="fp8 layout: experts split by range (2) or TP (1)")
    ap.add_argument("--versions", type=int, default=3)
    ap.add_argument("--out", required=True)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--drop", default="", help="leave this tensor out of the layout (a bad-input case)")
    ap.add_argument("--cast", default="", help="hold this tensor as block fp8 with its scales (a bad-input case)")
    ap.add_argument("--extra", default="", help="also hold a tensor of this name the trainer lacks (a bad-input case)")
    ap.add_argument("--reshape", default="", help="hold this tensor one row longer (a bad-input case)")
    ap.add_argument("--verify-checksums", action="store_true",
                    help="every version checked against the trainers' checksums before it is complete, "
                         "and verify() asked again after each")
    ap.add_argument("--shadow", action="store_true", help="InferenceAgent(shadow=True)")
    ap.add_argument("--delta", action="store_true", help="InferenceAgent(delta=True)")
    ap.add_argument("--paced", action="store_true",
                    help="InferenceAgent(paced=True): take each version with update(v), so the next one waits for "
                         "this engine to have saved it (no handshake with the trainer)")
    ap.add_argument("--exit-after", type=int, default=0,
                    help="leave abruptly (no goodbye to the controller) once this version is saved")
    ap.add_argument("--tamper", default="",
                    help="after the last version, flip one bit of this tensor and save what verify() says")
    args = ap.parse_args()
    torch.set_num_threads(1)

    builder = {"llama": torch_models.small_llama, "qwen3": torch_models.small_qwen3,
               "qwen3_moe": torch_models.small_qwen3_moe}[args.model]
    config, model = builder(seed=99)
    layout, instance = None, args.rank
    if args.layout == "identity":
        tensors = dict(model.state_dict())
    else:
        instance, tp_rank = args.instance, args.rank - 2 * args.instance
        assert tp_rank in (0, 1), f"inference rank {args.rank} is not in TP-2 instance {instance}"
        per_rank, entries = engine_layout.engine_layout(dict(model.state_dict()), torch_models.config_dict(model),
                                                        tp=2, ep=args.ep,
                                                        dtype="bf16" if args.layout == "bf16" else "fp8_e4m3")
        tensors = {}
        for name, t in per_rank[tp_rank].items():
            poisoned = torch.empty(t.numel() * t.element_size(), dtype=torch.uint8).fill_(0xFF)
            tensors[name] = poisoned.view(t.dtype).view(t.shape)
        layout = {e["name"]: {k: e[k] for k in ("tp", "experts") if k in e} for e in entries[tp_rank]}
    if args.drop:
        tensors.pop(args.drop)
        if layout:
            layout.pop(args.drop, None)
    if args.cast:
        t = tensors[args.cast]
        tensors[args.cast] = torch.zeros(t.shape, dtype=torch.float8_e4m3fn)
        grid = [-(-n // 128) for n in t.shape[-2:]]
        tensors[args.cast + "_scale_inv"] = torch.ones(list(t.shape[:-2]) + grid, dtype=torch.float32)
    if args.extra:
        tensors[args.extra] = torch.zeros(8, dtype=torch.bfloat16)
    if args.reshape:
        t = tensors[args.reshape]
        tensors[args.reshape] = torch.zeros([t.shape[0] + 1] + list(t.shape[1:]), dtype=t.dtype)
    with wsync.InferenceAgent(tensors, controller=args.controller, job=args.job, rank=args.rank,
                              instance=instance, layout=layout, timeout_s=args.timeout,
                              verify_checksums=args.verify_checksums, shadow=args.shadow,
                              paced=args.paced, delta=args.delta) as agent:
        print(f"engine {args.rank}: registered {len(tensors)} tensors", flush=True)
        for v in range(1, args.versions + 1):
            t0 = time.perf_counter()
            try:
                if args.paced:
                    assert agent.update(v, args.timeout) == v
                else:
                    agent.wait_version(v, args.timeout)
            except wsync.VersionError as e:
                if not args.shadow:
                    raise
                # What the engine holds after a failed version, in shadow mode.
                torch.save({"tensors": {n: t.clone() for n, t in tensors.items()}, "error": str(e),
                            "complete_version": agent.complete_version},
                           os.path.join(args.out, f"engine-{args.rank}-failed-v{v}.pt"))
                print(f"engine {args.rank}: version {v} failed: {e}", flush=True)
                return
            if args.verify_checksums:
                agent.verify(v)  # on request too, before the trainers may push the next version
            if args.tamper and v == args.versions:
                bits = tensors[args.tamper].view(-1).view(torch.uint8)
                bits[bits.numel() // 2] ^= 0x10
                try:
                    agent.verify()
                    said = "verify() passed"
                except wsync.ChecksumError as e:
                    said = str(e)
                bits[bits.numel() // 2] ^= 0x10
                agent.verify()
                with open(os.path.join(args.out, f"engine-{args.rank}-tamper.txt"), "w") as f:
                    f.write(said)
            got = {n: t.clone() for n, t in tensors.items()}
            tokens = fsdp_setup.greedy_tokens(model) if args.layout == "identity" else None
            torch.save({"tensors": got, "tokens": tokens, "complete_version": agent.complete_version,
                        "waited_seconds": time.perf_counter() - t0},
                       os.path.join(args.out, f"engine-{args.rank}-v{v}.pt"))
            open(os.path.join(args.out, f"engine-{args.rank}-v{v}.done"), "w").close()
            print(f"engine {args.rank}: version {v} complete", flush=True)
            if v == args.exit_after:
                os._exit(0)


if __name__ == "__main__":
    main()
