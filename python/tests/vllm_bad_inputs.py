"""Bad input against a real vLLM engine with the wsync backend, for
test_vllm.py. Each case is what a user would do wrong; each must end in one
clear error, and no version may be reported complete.

    python vllm_bad_inputs.py --controller HOST:PORT --secret-file F
                              --torchrun TORCHRUN --out OUT

The controller expects 1 trainer and 1 inference rank. Cases, in order:

1. unmappable: an engine (TP 1) of a Qwen3 whose vocabulary (500) vLLM pads
   to 512 rows: init_weight_transfer_engine must refuse it, naming the layer.
2. wrong secret: an engine (TP 1) of the small Qwen3; init with a secret
   file holding another job's secret must be refused.
3. trainer lacks engine tensors: the same engine, initialized with the right
   secret; a trainer of a small Llama (no q_norm / k_norm) registers
   (vllm_trainer.py --model llama on 1 torchrun rank): planning must fail
   naming the tensor, the engine's update_weights must raise with it instead
   of waiting on, and the trainer must exit non-zero with it.

Writes OUT/bad_inputs.json: per case, the error text (or None).
"""

import argparse
import copy
import gc
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch_models  # noqa: E402
from vllm_engine import make_llm, say  # noqa: E402


def error_of(fn):
    """str of what fn() raises, None if it returns."""
    try:
        fn()
        return None
    except Exception as e:  # noqa: BLE001 - what vLLM hands its caller is the check
        return str(e)


def init(llm, controller, secret_file, timeout_s=300.0):
    llm.collective_rpc("init_weight_transfer_engine",
                       kwargs={"init_info": {"controller": controller, "job": "bad", "secret_file": secret_file,
                                             "timeout_s": timeout_s}})


def unmappable(a, config, model, out):
    odd = copy.deepcopy(config)
    odd.vocab_size = 500
    padded = type(model)(odd).to(model.dtype)
    padded.save_pretrained(os.path.join(a.out, "padded"))
    llm = make_llm(os.path.join(a.out, "padded"), 1, wsync=True)
    out["unmappable"] = error_of(lambda: init(llm, a.controller, a.secret_file))
    say(f"unmappable model: {str(out['unmappable'])[-300:]}")
    del llm
    gc.collect()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--controller", required=True)
    ap.add_argument("--secret-file", required=True)
    ap.add_argument("--torchrun", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--skip-unmappable", action="store_true", help="cases 2 and 3 only")
    a = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0")
    out = {}

    # 1. A model wsync cannot map.
    config, model = torch_models.small_qwen3()
    if a.skip_unmappable:
        out["unmappable"] = None
    else:
        unmappable(a, config, model, out)

    # 2. The wrong secret.
    model.save_pretrained(os.path.join(a.out, "qwen3"))
    llm = make_llm(os.path.join(a.out, "qwen3"), 1, wsync=True)
    wrong = os.path.join(a.out, "other.secret")
    with open(os.open(wrong, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write("0" * 64 + "\n")  # a well-formed secret of another job
    out["wrong_secret"] = error_of(lambda: init(llm, a.controller, wrong, timeout_s=20))
    say(f"wrong secret: {str(out['wrong_secret'])[-300:]}")

    # 3. A trainer whose model lacks tensors the engine has. Planning drops
    # the rank whose tensor has no source (the engine, so that it can come
    # back fixed): its update_weights raises at once; the trainer waits for
    # a fixed engine up to its timeout (30 s here), then fails with the
    # assembly error.
    init(llm, a.controller, a.secret_file, timeout_s=60)
    log = os.path.join(a.out, "llama_trainer.log")
    t = time.time()
    trainer = subprocess.Popen([a.torchrun, "--standalone", "--nproc-per-node", "1",
                                os.path.join(HERE, "vllm_trainer.py"), "--controller", a.controller, "--job", "bad",
                                "--versions", "1", "--out", a.out, "--model", "llama", "--timeout-s", "30"],
                               stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    try:
        out["update_after_failed_plan"] = error_of(
            lambda: (llm.collective_rpc("start_weight_update"),
                     llm.collective_rpc("update_weights", kwargs={"update_info": {"version": 1}})))
        out["update_seconds"] = time.time() - t
        say(f"update_weights with the trainer lacking tensors ({out['update_seconds']:.1f} s): "
            f"{str(out['update_after_failed_plan'])[-300:]}")
        out["trainer_exit"] = trainer.wait(timeout=300)
    finally:
        if trainer.poll() is None:
            trainer.kill()
    with open(log) as f:
        out["trainer_log"] = f.read()[-6000:]
    say(f"llama trainer exited {out['trainer_exit']} after {time.time() - t:.1f} s")
    del llm
    gc.collect()
    with open(os.path.join(a.out, "bad_inputs.json"), "w") as f:
        json.dump(out, f, indent=1)
    say("done")


if __name__ == "__main__":
    main()
