"""A real vLLM engine taking wsync versions through its weight-transfer API,
then fresh vLLM engines loaded from the trainer's checkpoints, for
test_vllm.py.

    python vllm_engine.py --model DIR --controller HOST:PORT --job J --tp 2
                          --versions 3 --out OUT [--secret-file F]

Phase 1 (wsync): an LLM with weight_transfer_config {"backend": "wsync"}
(the package's vllm.general_plugins entry point registers it); its workers
register through init_weight_transfer_engine. It serves the prompts, then
for each version v: start_weight_update, update_weights({"version": v}),
finish_weight_update, reset_prefix_cache (vLLM's own calls, between
steps), and serves again. Recorded per version: the greedy tokens, every
tensor each worker computes from (collective_rpc), the backend's figures.

Phase 2 (reference, wsync not involved): for each version a fresh LLM with
the same TP loaded from OUT/ckpt_v<v> (the trainer's full state, written by
vllm_trainer.py), vLLM's own loader; the same records.

Then a version failed by a trainer before any write: update_weights must
raise with the controller's recorded cause, and the engine must still
serve the last complete version.

Writes OUT/engine.json (tokens, figures, whether each worker's tensors equal
the reference's bit for bit, naming the first that differs) and prints
progress as it goes.
"""

import argparse
import gc
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

# Fixed prompts as token ids (the engine has no tokenizer), distinct lengths.
PROMPTS = [[1, 17, 42, 99, 250], [3, 500, 7], [12, 12, 12, 12, 301, 64, 5, 88]]
NEW_TOKENS = 12


def say(*args):
    print("vllm_engine:", *args, flush=True)


def make_llm(model, tp, wsync):
    from vllm import LLM

    kwargs = dict(model=model, skip_tokenizer_init=True, enforce_eager=True, dtype="bfloat16",
                  tensor_parallel_size=tp, gpu_memory_utilization=0.1, max_model_len=256, seed=0)
    if wsync:
        kwargs["weight_transfer_config"] = {"backend": "wsync"}
    t = time.time()
    llm = LLM(**kwargs)
    say(f"engine up ({'wsync' if wsync else 'reference'}, TP {tp}) in {time.time() - t:.1f} s")
    return llm


def tokens(llm):
    from vllm import SamplingParams

    sp = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, detokenize=False)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], sp, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def model_digests(model):
    """{name: (dtype, shape, sha256 of the bytes)} of every parameter and
    persistent buffer `model` computes from."""
    import hashlib

    import torch

    def digest(t):
        t = t.detach().cpu().contiguous()
        return str(t.dtype), list(t.shape), hashlib.sha256(t.reshape(-1).view(torch.uint8).numpy()).hexdigest()

    named = list(model.named_parameters()) + list(model.named_buffers())
    return {n: digest(t) for n, t in named}


def worker_digests(worker):
    """For `collective_rpc`: model_digests of the worker's model. Digests, not
    the tensors: shipping a model's worth of tensors back through vLLM's
    message queues once aborted an engine process in CI (std::terminate in a
    tensor's deleter, freed inside vLLM's msgspec hooks on another thread)."""
    return model_digests(worker.model_runner.get_model())


def first_difference(got, want):
    """None if every worker's digests equal the reference's, else a line
    naming the first tensor that differs."""
    for rank, (g, w) in enumerate(zip(got, want)):
        if set(g) != set(w):
            return f"worker {rank}: names differ: {sorted(set(g) ^ set(w))[:5]}"
        for name in sorted(w):
            (gd, gs, gh), (wd, ws, wh) = g[name], w[name]
            if gd != wd or gs != ws:
                return f"worker {rank}: {name}: {gd} {tuple(gs)} vs {wd} {tuple(ws)}"
            if gh != wh:
                return f"worker {rank}: {name}: bytes differ"
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--controller", required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--versions", type=int, default=3)
    ap.add_argument("--out", required=True)
    ap.add_argument("--secret-file", default=os.environ.get("WSYNC_SECRET_FILE"))
    ap.add_argument("--delta", action="store_true", help="init_info delta=True (delta inboxes beside the weights)")
    a = ap.parse_args()
    # vLLM's CPU backend binds each TP worker's threads to a NUMA node of
    # its own unless told which cores to use; this machine has one node.
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(str(i % os.cpu_count()) for i in range(a.tp)))

    from wsync.vllm import last_update

    result = {"tokens": {}, "updates": {}, "reference_tokens": {}, "tensors_equal": {}}
    llm = make_llm(a.model, a.tp, wsync=True)
    t = time.time()
    llm.collective_rpc("init_weight_transfer_engine",
                       kwargs={"init_info": {"controller": a.controller, "job": a.job, "secret_file": a.secret_file,
                                                 "delta": a.delta}})
    say(f"wsync backend initialized on {a.tp} workers in {time.time() - t:.2f} s")
    result["tokens"]["0"] = tokens(llm)
    figures = llm.collective_rpc(last_update)
    result["paths"] = figures[0]["paths"]
    result["extra_bytes"] = [f["extra_bytes"] for f in figures]
    got = {}
    for v in range(1, a.versions + 1):
        t = time.time()
        llm.collective_rpc("start_weight_update")
        llm.collective_rpc("update_weights", kwargs={"update_info": {"version": v}})
        llm.collective_rpc("finish_weight_update")
        t_reset = time.time()
        llm.reset_prefix_cache()
        reset = time.time() - t_reset
        took = time.time() - t
        result["updates"][str(v)] = {"seconds": took, "reset_seconds": reset,
                                     "workers": [f["update"] for f in llm.collective_rpc(last_update)]}
        result["tokens"][str(v)] = tokens(llm)
        got[v] = llm.collective_rpc(worker_digests)
        say(f"version {v} taken in {took:.3f} s; tokens {result['tokens'][str(v)][0][:6]}...")
    # A version that fails (here: failed by a trainer before any write):
    # update_weights raises with the controller's recorded cause, and the
    # engine goes on serving the last complete version.
    from control import signed

    bad = a.versions + 1
    # Started, as a trainer rank would, then failed (a report never starts a version).
    signed(a.controller, a.secret_file, "POST", f"/v1/versions/{bad}/start", {"rank": 0})
    signed(a.controller, a.secret_file, "POST", f"/v1/versions/{bad}/fail",
           {"role": "trainer", "rank": 0, "error": "injected by the test: the optimizer step diverged"})
    try:
        llm.collective_rpc("start_weight_update")
        llm.collective_rpc("update_weights", kwargs={"update_info": {"version": bad}})
        result["failed_update"] = None
    except Exception as e:  # noqa: BLE001 - what vLLM raises to its caller is the check
        result["failed_update"] = str(e)
    result["tokens_after_failed"] = tokens(llm)
    say(f"version {bad} (failed): update_weights raised: {str(result['failed_update'])[:300]}")
    del llm
    gc.collect()

    for v in range(1, a.versions + 1):
        ref = make_llm(os.path.join(a.out, f"ckpt_v{v}"), a.tp, wsync=False)
        result["reference_tokens"][str(v)] = tokens(ref)
        result["tensors_equal"][str(v)] = first_difference(got[v], ref.collective_rpc(worker_digests)) or "equal"
        say(f"version {v}: reference tokens {result['reference_tokens'][str(v)][0][:6]}...; "
            f"tensors {result['tensors_equal'][str(v)]}")
        del ref
        gc.collect()
    with open(os.path.join(a.out, "engine.json"), "w") as f:
        json.dump(result, f, indent=1)
    say("done")


if __name__ == "__main__":
    main()
