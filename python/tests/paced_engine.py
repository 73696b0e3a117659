"""An engine for the engine-paced tests: a transformers model whose tensors
are registered with wsync.InferenceAgent(paced=True), running forward passes
flat out and calling update() between some of them. Nothing else tells it
when trainers push.

For every forward pass it records which version update() said the tensors
hold and a digest of every tensor taken before and after the pass, so the
test can check, against what the trainer saved for that version, that each
pass computed from exactly one version (DIR/paced-engine-<rank>.json).

    python python/tests/paced_engine.py --controller HOST:PORT --rank R --out DIR \
        [--shadow] [--until V] [--every K] [--never-update] [--exit-in-update V]
"""

import argparse
import hashlib
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
import fsdp_setup  # noqa: E402
import torch_models  # noqa: E402

import wsync  # noqa: E402


def digest(tensors):
    return {n: hashlib.sha256(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
            for n, t in tensors.items()}


class States:
    """Per-tensor digests of each distinct state seen, by one combined key:
    a pass records two keys, not two dicts. `digest_of` maps what key() is
    given to {name: hex digest}."""

    def __init__(self, digest_of=None):
        self.by_key = {}
        self.digest_of = digest_of or digest

    def key(self, tensors):
        d = self.digest_of(tensors)
        k = hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]
        self.by_key.setdefault(k, d)
        return k


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--controller", required=True)
    ap.add_argument("--job", default="torch-sync")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--shadow", action="store_true")
    ap.add_argument("--until", type=int, default=3, help="stop once the tensors hold this version")
    ap.add_argument("--every", type=int, default=2, help="call update() after every K forward passes")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--update-timeout", type=float, default=None)
    ap.add_argument("--never-update", action="store_true", help="serve without ever calling update() (a bad case)")
    ap.add_argument("--exit-in-update", type=int, default=0,
                    help="die abruptly inside the update() that would bring this version (a bad case)")
    ap.add_argument("--seconds", type=float, default=120.0, help="give up after this long")
    ap.add_argument("--device", default=os.environ.get("WSYNC_TEST_ENGINE_DEVICE", "cpu"),
                    help="where the model's tensors live (cuda: the writes land in GPU memory; the GPU run)")
    ap.add_argument("--stop-on-error", action="store_true", help="leave the loop after a failed update()")
    ap.add_argument("--exit-after", type=int, default=0,
                    help="die abruptly once the tensors hold this version (a bad case: a lost engine)")
    args = ap.parse_args()
    torch.set_num_threads(1)

    config, model = torch_models.small_llama(seed=99)
    model.to(args.device)
    tensors = dict(model.state_dict())
    passes, updates, errors, states = [], [], [], States()
    out = os.path.join(args.out, f"paced-engine-{args.rank}.json")
    with wsync.InferenceAgent(tensors, controller=args.controller, job=args.job, rank=args.rank, instance=args.rank,
                              timeout_s=args.timeout, shadow=args.shadow, paced=True) as agent:
        print(f"engine {args.rank}: registered, paced ({'shadow' if args.shadow else 'live'}), tensors on "
              f"{args.device}; the writes land {'in pinned host memory (host staging)' if agent.staged else 'in place'}",
              flush=True)
        held = agent.complete_version
        start = time.monotonic()
        n = 0
        while time.monotonic() - start < args.seconds:
            before = states.key(tensors)
            fsdp_setup.greedy_tokens(model, n=2)  # a forward pass computing from the tensors
            after = states.key(tensors)
            passes.append({"version": held, "before": before, "after": after})
            if held >= args.until:
                break  # one pass on the last version, then done
            n += 1
            if args.never_update or n % args.every:
                continue
            want = None
            if args.exit_in_update and held + 1 == args.exit_in_update:
                # Die inside the update() that lets this version in.
                import threading
                threading.Timer(0.3, lambda: os._exit(3)).start()
                want = args.exit_in_update
            t0 = time.perf_counter()
            try:
                held = agent.update(want, timeout=args.update_timeout)
            except (wsync.VersionError, TimeoutError) as e:
                errors.append({"type": type(e).__name__, "error": str(e), "held": agent.complete_version})
                held = agent.complete_version
                print(f"engine {args.rank}: update(): {type(e).__name__}: {e}", flush=True)
                if args.stop_on_error:
                    break
                continue
            updates.append({"version": held, "pause_seconds": time.perf_counter() - t0, **(agent.last_update or {})})
            if args.exit_after and held >= args.exit_after:
                # After its done report, which the agent's own thread sends
                # right after the landing: a version complete everywhere.
                agent.wait_version(held, 10)
                time.sleep(1.0)
                os._exit(3)
            print(f"engine {args.rank}: update() -> version {held} in {time.perf_counter() - t0:.3f} s", flush=True)
        with open(out, "w") as f:
            json.dump({"passes": passes, "states": states.by_key, "updates": updates, "errors": errors,
                       "held": held}, f)
    print(f"engine {args.rank}: {len(passes)} forward passes, {len(updates)} updates, holding version {held}",
          flush=True)


if __name__ == "__main__":
    main()
