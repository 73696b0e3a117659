"""An inference process holding the same transformers Llama as train.py,
whose parameters wsync overwrites in place after every trainer step.

    python examples/torch/infer.py --controller 127.0.0.1:29600 --job llama-demo --rank 0 --versions 5

The model starts from other random weights (another seed). Its state_dict
tensors are the parameters' own storage, so registering them lets the
trainers write the new bf16 weights straight into the model:

    agent = wsync.InferenceAgent(dict(model.state_dict()), ...)
    agent.wait_version(v, timeout)   # every write of version v has landed

After each version it prints 16 greedy tokens on train.py's prompt: the
same line train.py prints for that version. --no-sync only decodes.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train import build_model, greedy_tokens  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--controller", default="127.0.0.1:29600", help="wsync controller HOST:PORT")
    ap.add_argument("--job", default="llama-demo")
    ap.add_argument("--rank", type=int, default=0, help="inference rank (0..M-1)")
    ap.add_argument("--versions", type=int, default=5, help="last version to wait for")
    ap.add_argument("--provider", default="shm")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds to wait per version")
    ap.add_argument("--no-sync", action="store_true", help="decode once without wsync")
    ap.add_argument("--paced", action="store_true",
                    help="engine-paced (asynchronous RL): decode flat out and take the newest version with "
                         "update() between decodes; the weights never change during one")
    ap.add_argument("--shadow", action="store_true", help="with --paced: writes land in a shadow copy meanwhile")
    args = ap.parse_args()

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    model = build_model(seed=1)  # not the trainer's weights until the first version lands
    print(f"rank {args.rank} before sync tokens {greedy_tokens(model)}", flush=True)
    if args.no_sync:
        return

    import wsync

    agent = wsync.InferenceAgent(dict(model.state_dict()), controller=args.controller,
                                 job=args.job, rank=args.rank, provider=args.provider,
                                 paced=args.paced, shadow=args.shadow)
    if args.paced:
        try:
            serve_paced(agent, model, args)
        finally:
            agent.close()
        return
    try:
        for v in range(1, args.versions + 1):
            agent.wait_version(v, args.timeout)
            got = agent.complete_version
            tokens = greedy_tokens(model)
            # wsync writes the next version in place, and its writes may land
            # before complete_version moves on; a real engine pauses decoding
            # during an update. Here train.py waits --interval seconds after
            # each version completes before pushing the next; the check below
            # catches only a decode that outlasted a whole update.
            moved = agent.complete_version != got
            print(f"rank {args.rank} version {got} tokens {tokens}"
                  + ("  (a newer version landed while decoding)" if moved else ""), flush=True)
    finally:
        agent.close()


def serve_paced(agent, model, args):
    """Asynchronous RL's engine: decode flat out; between decodes, update()
    takes the newest version the trainers pushed (the weights hold exactly
    that version until the next call). Prints each version it took, with
    the engine's pause for it."""
    import time
    held, decodes, start = 0, 0, time.monotonic()
    while held < args.versions and time.monotonic() - start < args.timeout:
        greedy_tokens(model)  # a decode: the weights hold version `held` throughout
        decodes += 1
        v = agent.update(timeout=args.timeout)
        if v != held:
            u = agent.last_update
            print(f"rank {args.rank} version {v} (after {decodes} decodes on version {held}): engine paused "
                  f"{u['seconds']:.3f} s (waiting {u['wait_seconds']:.3f} s, copying {u['copy_seconds']:.3f} s)",
                  flush=True)
            held, decodes = v, 0
            print(f"rank {args.rank} version {v} tokens {greedy_tokens(model)}", flush=True)
    print(f"rank {args.rank} holds version {held} after {decodes} more decodes", flush=True)


if __name__ == "__main__":
    main()
