"""Bad input against real vLLM engines with the wsync backend, for
test_vllm.py. Each case is what a user would do wrong; each must end in one
clear error, and no version may be reported complete.

    python vllm_bad_inputs.py --wsync WSYNC --torchrun TORCHRUN --out OUT

Each case that registers gets a controller of its own (1 trainer, 1
inference rank; secret OUT/job.secret, which the caller's
$WSYNC_SECRET_FILE names for the trainers). Cases, in order:

1. unmappable: an engine (TP 1) of a Qwen3 whose vocabulary (500) vLLM pads
   to 512 rows: init_weight_transfer_engine must refuse it, naming the layer.
2. wrong secret: an engine (TP 1) of the small Qwen3; init with a secret
   file holding another job's secret must be refused.
3-5. the same engine against a trainer whose model does not match it
   (vllm_trainer.py on 1 torchrun rank, its timeout 30 s):
   - lacks: a small Llama, without Qwen3's q_norm / k_norm;
   - extra: a Qwen3 with attention biases the engine does not have;
   - shape: a Qwen3 with another MLP width.
   Planning must fail naming the tensor, dropping the rank at fault (the
   engine when it has a tensor with no source, else the trainer). The
   engine's update_weights must raise naming it: at once when the engine was
   dropped, after its timeout (20 s) when it waits for a fixed trainer; the
   trainer must exit non-zero naming it too.

Writes OUT/bad_inputs.json: per case, the errors seen, and for 3-5 the
controller's latest complete version.
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
from control import signed  # noqa: E402
from vllm_engine import make_llm, say  # noqa: E402

MISMATCHES = {"lacks": "llama", "extra": "qwen3_bias", "shape": "qwen3_wide"}


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


class Controller:
    """A `wsync controller` for one case (1 trainer, 1 inference rank)."""

    def __init__(self, a, name):
        self.secret = os.path.join(a.out, "job.secret")
        self.proc = subprocess.Popen([a.wsync, "controller", "--secret-file", self.secret, "--listen", "127.0.0.1:0",
                                      "--state-dir", os.path.join(a.out, f"state-{name}"), "--trainers", "1",
                                      "--inference", "1", "--world-timeout", "600"],
                                     stdout=subprocess.PIPE, stderr=open(os.path.join(a.out, f"controller-{name}.log"),
                                                                         "w"))
        self.address = self.proc.stdout.readline().decode().strip()
        if not self.address:
            raise RuntimeError(f"controller for case {name} printed no address")

    def latest_complete(self):
        return signed(self.address, self.secret, "GET", "/v1/status").get("latest_complete_version")

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def unmappable(a, config, model, out):
    odd = copy.deepcopy(config)
    odd.vocab_size = 500
    padded = type(model)(odd).to(model.dtype)
    padded.save_pretrained(os.path.join(a.out, "padded"))
    llm = make_llm(os.path.join(a.out, "padded"), 1, wsync=True)
    out["unmappable"] = error_of(lambda: init(llm, "127.0.0.1:1", os.path.join(a.out, "job.secret")))
    say(f"unmappable model: {str(out['unmappable'])[-300:]}")
    del llm
    gc.collect()


def mismatch(a, llm, case, trainer_model, out):
    """A trainer of `trainer_model` against the engine, on a controller of
    their own."""
    controller = Controller(a, case)
    try:
        init(llm, controller.address, controller.secret, timeout_s=20)
        log = os.path.join(a.out, f"trainer-{case}.log")
        t = time.time()
        trainer = subprocess.Popen([a.torchrun, "--standalone", "--nproc-per-node", "1",
                                    os.path.join(HERE, "vllm_trainer.py"), "--controller", controller.address, "--job",
                                    "bad", "--versions", "1", "--out", os.path.join(a.out, case), "--model",
                                    trainer_model, "--timeout-s", "30"],
                                   stdout=subprocess.DEVNULL, stderr=open(log, "w"))
        try:
            update = error_of(lambda: (llm.collective_rpc("start_weight_update"),
                                       llm.collective_rpc("update_weights", kwargs={"update_info": {"version": 1}})))
            update_seconds = time.time() - t
            trainer_exit = trainer.wait(timeout=300)
        finally:
            if trainer.poll() is None:
                trainer.kill()
        with open(log) as f:
            trainer_log = f.read()[-6000:]
        out[case] = {"update": update, "update_seconds": update_seconds, "trainer_exit": trainer_exit,
                     "trainer_log": trainer_log, "latest_complete_version": controller.latest_complete()}
        say(f"{case} ({trainer_model} trainer): update_weights raised after {update_seconds:.1f} s: "
            f"{str(update)[-300:]}; the trainer exited {trainer_exit} after {time.time() - t:.1f} s")
    finally:
        # vLLM keeps the session of a failed update_weights open until
        # finish_weight_update; only then may the backend be shut down.
        error_of(lambda: llm.collective_rpc("finish_weight_update"))
        llm.collective_rpc("shutdown_weight_transfer_engine")
        controller.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--wsync", required=True)
    ap.add_argument("--torchrun", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--skip-unmappable", action="store_true", help="not case 1 (debugging)")
    a = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0")
    subprocess.run([a.wsync, "secret", os.path.join(a.out, "job.secret")], check=True, capture_output=True)
    out = {}

    config, model = torch_models.small_qwen3()
    if not a.skip_unmappable:
        unmappable(a, config, model, out)

    model.save_pretrained(os.path.join(a.out, "qwen3"))
    llm = make_llm(os.path.join(a.out, "qwen3"), 1, wsync=True)
    wrong = os.path.join(a.out, "other.secret")
    with open(os.open(wrong, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write("0" * 64 + "\n")  # a well-formed secret of another job
    controller = Controller(a, "secret")
    try:
        out["wrong_secret"] = error_of(lambda: init(llm, controller.address, wrong, timeout_s=20))
    finally:
        controller.stop()
    say(f"wrong secret: {str(out['wrong_secret'])[-300:]}")

    for case, trainer_model in MISMATCHES.items():
        os.makedirs(os.path.join(a.out, case), exist_ok=True)
        mismatch(a, llm, case, trainer_model, out)
    del llm
    gc.collect()
    with open(os.path.join(a.out, "bad_inputs.json"), "w") as f:
        json.dump(out, f, indent=1)
    say("done")


if __name__ == "__main__":
    main()
