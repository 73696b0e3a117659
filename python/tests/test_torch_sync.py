"""Real FSDP2 trainers push into real transformers models through the wsync
package, end to end, as separate processes: a `wsync controller`, 4 trainer
ranks under torchrun (Gloo on CPU) and 2 inference processes, over
libfabric's shm provider.

Every check computes its expected values apart from wsync: the trainer's
own full_tensor() state and greedy tokens, and (fp8) a block quantization
written in plain torch (fp8_reference.py, torch's own float8 cast).
"""

import hashlib
import hmac
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import engine_layout  # noqa: E402
import torch_models  # noqa: E402

TRAINERS, ENGINES, STEPS = 4, 2, 3
TIMEOUT = 240


def wsync_binary():
    """The `wsync` command the package installed beside this interpreter."""
    beside = os.path.join(os.path.dirname(sys.executable), "wsync")
    return beside if os.path.exists(beside) else shutil.which("wsync")


def torchrun():
    return shutil.which("torchrun") or os.path.join(os.path.dirname(sys.executable), "torchrun")


class Job:
    """One deployment: controller, engines, trainers; everything it started
    is stopped when the test ends."""

    def __init__(self, tmp_path, mapping=None, model_config=None, heartbeat=5, version_timeout=120,
                 trainers=TRAINERS, engines=ENGINES):
        self.out = str(tmp_path)
        self.ntrainers, self.nengines = trainers, engines
        self.procs = []
        self.logs = {}
        # Every job runs signed: the controller with --secret-file, everything
        # else it starts through $WSYNC_SECRET_FILE (the Python binding's and
        # the sidecars' default).
        self.secret_file = str(tmp_path / "job.secret")
        subprocess.run([wsync_binary(), "secret", self.secret_file], check=True)
        cmd = [wsync_binary(), "controller", "--secret-file", self.secret_file, "--listen", "127.0.0.1:0", "--state-dir", str(tmp_path / "state"),
               "--trainers", str(trainers), "--inference", str(engines), "--heartbeat-timeout", str(heartbeat),
               "--version-timeout", str(version_timeout), "--world-timeout", "120"]
        if mapping:
            cmd += ["--mapping", os.path.join(ROOT, "configs", "mappings", mapping)]
        if model_config is not None:
            path = tmp_path / "config.json"
            path.write_text(json.dumps(model_config))
            cmd += ["--model-config", str(path)]
        self.controller = self.start("controller", cmd, stdout=subprocess.PIPE)
        self.address = self.controller.stdout.readline().decode().strip()
        assert self.address, "the controller printed no address"

    def start(self, name, cmd, stdout=None, secret=True):
        log = open(os.path.join(self.out, f"{name}.log"), "w")
        self.logs[name] = log.name
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
                   WSYNC_SECRET_FILE=self.secret_file if secret else "")
        p = subprocess.Popen(cmd, stdout=stdout or log, stderr=log, env=env, cwd=ROOT)
        self.procs.append(p)
        return p

    def engine(self, rank, *extra, secret=True):
        return self.start(f"engine{rank}", [sys.executable, os.path.join(HERE, "sync_engine.py"), "--controller",
                                            self.address, "--rank", str(rank), "--out", self.out, *extra],
                          secret=secret)

    def trainers(self, *extra):
        return self.start("trainers", [torchrun(), "--standalone", "--nproc-per-node", str(self.ntrainers),
                                       os.path.join(HERE, "sync_trainer.py"), "--controller", self.address,
                                       "--out", self.out, *extra])

    def log(self, name):
        with open(self.logs[name]) as f:
            return f.read()

    def wait(self, proc, name, timeout=TIMEOUT):
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{name} still running after {timeout} s; its log:\n{self.log(name)[-4000:]}")

    def get(self, target):
        """A signed GET, signed here by its own few lines (controller/auth.h
        states the canonical request) rather than by wsync's code."""
        with open(self.secret_file, "rb") as f:
            key = f.read().rstrip()
        ts, nonce = str(int(time.time())), secrets.token_hex(16)
        canonical = "\n".join(["wsync-hmac-sha256-v1", "GET", target, ts, nonce, hashlib.sha256(b"").hexdigest()])
        req = urllib.request.Request(f"http://{self.address}{target}", headers={
            "X-Wsync-Timestamp": ts, "X-Wsync-Nonce": nonce,
            "X-Wsync-Content-Sha256": hashlib.sha256(b"").hexdigest(),
            "X-Wsync-Signature": hmac.new(key, canonical.encode(), hashlib.sha256).hexdigest()})
        with urllib.request.urlopen(req) as r:
            return json.loads(r.read())

    def version(self, v):
        return self.get(f"/v1/versions/{v}")

    def stop(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()


@pytest.fixture
def job(tmp_path):
    jobs = []

    def make(**kw):
        jobs.append(Job(tmp_path, **kw))
        return jobs[-1]

    yield make
    for j in jobs:
        j.stop()


def run_clean(job, trainer_args, engine_args):
    engines = [job.engine(r, *engine_args) for r in range(ENGINES)]
    trainers = job.trainers(*trainer_args)
    assert job.wait(trainers, "trainers") == 0, job.log("trainers")[-6000:]
    for r, e in enumerate(engines):
        assert job.wait(e, f"engine{r}") == 0, job.log(f"engine{r}")[-4000:]


def load(job, name):
    return torch.load(os.path.join(job.out, name), weights_only=False)


def assert_engine_holds(job, rank, v, want, what):
    """Engine `rank` saved exactly `want` ({name: tensor}) for version v,
    byte for byte."""
    got = load(job, f"engine-{rank}-v{v}.pt")["tensors"]
    assert set(got) == set(want)
    for name, w in want.items():
        g = got[name]
        assert g.dtype == w.dtype and g.shape == w.shape, name
        assert torch.equal(g.view(torch.uint8), w.view(torch.uint8)), \
            f"engine rank {rank} version {v}: '{name}' differs from {what}"


def print_figures(job, label):
    rows = []
    for v in range(1, STEPS + 1):
        t = load(job, f"trainer-v{v}.pt")
        reps = [r for r in t["reports"] if r.get("stages")]
        if reps:
            slow = max(reps, key=lambda r: r["stages"]["total"])
            st = {k: round(x, 4) for k, x in slow["stages"].items()}
            rows.append(f"{label} v{v}: update {job.version(v)['seconds']:.3f} s, push->complete "
                        f"{slow['push_to_return_seconds']:.3f} s, reads done {slow['reads_done_seconds']:.3f} s, "
                        f"written {sum(r['written_bytes'] for r in reps)} B in {sum(r['writes'] for r in reps)} writes,"
                        f" peak temp {max(r['peak_temp_bytes'] for r in reps)} of {slow['watermark_bytes']} B; "
                        f"slowest rank stages {st}")
        else:
            rows.append(f"{label} v{v}: update {job.version(v)['seconds']:.3f} s")
    print("\n".join(rows))
    with open(os.path.join(ROOT, "build", f"torch-sync-{label}.txt"), "w") as f:
        f.write("\n".join(rows) + "\n")


@pytest.mark.parametrize("model", ["llama", "qwen3_moe"])
def test_fsdp2_trainers_push_into_transformers_models_bit_for_bit(job, model):
    j = job()
    # Engine-paced: each engine saves version v and only then lets v+1 in
    # (update()), so nothing but wsync's API paces trainer and engines.
    run_clean(j, ["--model", model, "--paced-engines"], ["--model", model, "--layout", "identity", "--paced"])
    for v in range(1, STEPS + 1):
        t = load(j, f"trainer-v{v}.pt")
        for r in range(ENGINES):
            e = load(j, f"engine-{r}-v{v}.pt")
            assert e["complete_version"] == v
            assert set(e["tensors"]) == set(t["state"]), "the engine holds other tensors than the trainer"
            for name, want in t["state"].items():
                assert torch.equal(e["tensors"][name], want), f"engine {r} version {v}: tensor '{name}' differs"
            # Static fire: the inference model decodes what the trainer's does.
            assert e["tokens"] == t["tokens"], f"engine {r} version {v}: greedy tokens differ"
        if v > 1:
            prev = load(j, f"trainer-v{v - 1}.pt")["state"]
            assert any(not torch.equal(prev[n], t["state"][n]) for n in prev), "the optimizer step changed nothing"
        assert j.version(v)["state"] == "complete"
    print_figures(j, f"{model}-inprocess")


def test_checksums_are_verified_before_complete_and_name_a_changed_tensor(job):
    """Trainers hash every write (checksums=True); each engine holds a landed
    version until its bytes match (verify_checksums=True) and asks verify()
    again after it. One bit flipped in an engine's tensor afterwards: verify()
    names that tensor; put back, it passes."""
    j = job()
    tampered = "model.layers.1.mlp.down_proj.weight"
    run_clean(j, ["--model", "llama", "--no-tokens", "--checksums"],
              ["--model", "llama", "--layout", "identity", "--verify-checksums", "--tamper", tampered])
    for v in range(1, STEPS + 1):
        t = load(j, f"trainer-v{v}.pt")
        assert all(r["stages"]["checksum"] > 0 for r in t["reports"] if r.get("writes")), t["reports"]
        for r in range(ENGINES):
            got = load(j, f"engine-{r}-v{v}.pt")["tensors"]
            for name, want in t["state"].items():
                assert torch.equal(got[name], want), f"engine {r} version {v}: tensor '{name}' differs"
            assert f"version {v}: " in j.log(f"engine{r}") and " checksums verified in " in j.log(f"engine{r}")
    for r in range(ENGINES):
        with open(os.path.join(j.out, f"engine-{r}-tamper.txt")) as f:
            said = f.read()
        assert f"inference rank {r}: version {STEPS}: tensor '{tampered}'" in said, said
        assert "differs from what the trainers sent" in said, said


def test_shadow_mode_keeps_the_last_complete_version_when_the_next_fails(job):
    """InferenceAgent(shadow=True): versions land in a shadow and are copied
    into the engine's tensors once complete everywhere (bit for bit, as
    without it). Engine 1 then vanishes: version 2 fails, and engine 0's
    tensors are still exactly version 1, whatever of version 2 reached it."""
    j = job(heartbeat=3, version_timeout=30)
    engines = [j.engine(0, "--model", "llama", "--layout", "identity", "--shadow"),
               j.engine(1, "--model", "llama", "--layout", "identity", "--shadow", "--exit-after", "1")]
    trainers = j.trainers("--model", "llama", "--timeout", "60", "--no-tokens")
    assert j.wait(trainers, "trainers") != 0, "version 2 should have failed"
    assert j.wait(engines[0], "engine0") == 0, j.log("engine0")[-4000:]
    v1 = load(j, "trainer-v1.pt")["state"]
    for r in range(ENGINES):
        got = load(j, f"engine-{r}-v1.pt")["tensors"]
        for name, want in v1.items():
            assert torch.equal(got[name], want), f"engine {r} version 1: tensor '{name}' differs"
    assert j.version(1)["state"] == "complete"
    assert j.version(2)["state"] == "failed"
    after = load(j, "engine-0-failed-v2.pt")
    assert after["complete_version"] == 1
    assert "stay at version 1 (shadow mode)" in after["error"], after["error"]
    for name, want in v1.items():
        assert torch.equal(after["tensors"][name], want), f"engine 0 after the failed version 2: '{name}' changed"
    assert "bytes copied out of the shadow" in j.log("engine0")


def test_strided_shards_of_fsdp2_under_ep_land_bit_for_bit(job):
    """FSDP2 sharding the experts on the dim EP already shards writes
    (_StridedShard(0, sf=2), Shard(0)): rank (fsdp f, ep e) holds a piece
    inside its EP range, which wsync describes with the mesh dims reordered."""
    j = job()
    run_clean(j, ["--model", "qwen3_moe", "--strided", "--no-tokens"], ["--model", "qwen3_moe", "--layout", "identity"])
    with open(os.path.join(j.out, "registration.json")) as f:
        reg = json.load(f)
    experts = [p for p in reg["params"] if ".mlp.experts." in p["name"]]
    assert experts and all(p["mesh"] == "ep,fsdp" and p["placements"] == ["Shard(0)", "Shard(0)"] for p in experts), \
        "the experts were not described as strided shards (mesh dims reordered)"
    for v in range(1, STEPS + 1):
        t = load(j, f"trainer-v{v}.pt")
        for r in range(ENGINES):
            got = load(j, f"engine-{r}-v{v}.pt")["tensors"]
            for name, want in t["state"].items():
                assert torch.equal(got[name], want), f"engine {r} version {v}: tensor '{name}' differs"


@pytest.mark.parametrize("ep", [1, 2])
def test_fused_fp8_engine_layout_matches_plain_torch_quantization(job, ep):
    _, model = torch_models.small_qwen3_moe()
    config = torch_models.config_dict(model)
    j = job(mapping="hf_qwen3_moe.json", model_config=config)
    # With EP 2 the trainers also replay their writes (the engine alone, no
    # quantize or pack) after each version but the last: the same writes and
    # bytes as the push, and the next version still lands exactly.
    replay = ["--replay"] if ep == 2 else []
    run_clean(j, ["--model", "qwen3_moe", "--no-tokens", *replay],
              ["--model", "qwen3_moe", "--layout", "fp8", "--ep", str(ep)])
    for v in range(1, STEPS if replay else 1):
        with open(os.path.join(j.out, f"replay-v{v}.json")) as f:
            ranks = json.load(f)
        for r in ranks:
            assert r["replay"]["writes"] == r["push"]["writes"] > 0, r
            assert r["replay"]["written_bytes"] == r["push"]["written_bytes"], r
    for v in range(1, STEPS + 1):
        t = load(j, f"trainer-v{v}.pt")
        want, _ = engine_layout.engine_layout(t["state"], config, tp=2, ep=ep)
        for r in range(ENGINES):
            assert_engine_holds(j, r, v, want[r], "torch's own quantization")


DELTA_VERSIONS = 10
DELTA_LAYOUTS = {"fp8": (0, 1), "bf16": (2, 3)}  # engine dtype: inference ranks (a TP-2 instance each)


@pytest.mark.parametrize("model", ["qwen3", "qwen3_moe"])
@pytest.mark.parametrize("lr", ["1e-6", "1e-5"])
def test_delta_versions_of_real_adamw_steps_land_bit_for_bit(job, model, lr):
    """FSDP2 trainers on 2 ranks (fp32 master weights, real AdamW steps at
    RL learning rates) push 10 versions with delta=True into two vLLM-style
    TP-2 engines with delta=True: one fused and block-fp8, one fused bf16.
    Every version on every rank is compared with the engine layout plain
    torch computes from the trainer's own state (bf16 cast, then block
    quantize); after the first (whole) version only what changed goes on
    the wire, and the receivers say so too."""
    builder = torch_models.small_qwen3 if model == "qwen3" else torch_models.small_qwen3_moe
    config = torch_models.config_dict(builder()[1])
    # Nothing here kills a rank: a generous heartbeat keeps a loaded machine
    # from declaring live ranks lost.
    engines = sum(len(r) for r in DELTA_LAYOUTS.values())
    j = job(heartbeat=60, trainers=2, engines=engines, mapping="hf_qwen3_moe.json", model_config=config)
    procs = [j.engine(r, "--model", model, "--layout", dtype, "--instance", str(ranks[0] // 2),
                      "--versions", str(DELTA_VERSIONS), "--delta")
             for dtype, ranks in DELTA_LAYOUTS.items() for r in ranks]
    trainers = j.trainers("--model", model, "--fp32", "--no-tokens", "--steps", str(DELTA_VERSIONS), "--lr", lr,
                          "--delta", "--engines", str(engines))
    assert j.wait(trainers, "trainers") == 0, j.log("trainers")[-6000:]
    for r, e in enumerate(procs):
        assert j.wait(e, f"engine{r}") == 0, j.log(f"engine{r}")[-4000:]
    rows, fractions = [], {dtype: [] for dtype in DELTA_LAYOUTS}
    for v in range(1, DELTA_VERSIONS + 1):
        t = load(j, f"trainer-v{v}.pt")
        state = t["state"]
        assert all(x.dtype == torch.float32 for x in state.values()), "the trainer's masters are fp32"
        record = j.version(v)
        got_stats = record.get("inference_stats", {})
        delta = record.get("delta")
        sent = sum(r["written_bytes"] for r in t["reports"])
        for dtype, ranks in DELTA_LAYOUTS.items():
            want = engine_layout.engine_layout(state, config, tp=2, ep=1,
                                               dtype="bf16" if dtype == "bf16" else "fp8_e4m3")[0]
            for tp_rank, r in enumerate(ranks):
                assert_engine_holds(j, r, v, want[tp_rank], f"plain torch's {dtype} engine layout")
            st = [got_stats[str(r)] for r in ranks]
            wire, whole = sum(s["wire_bytes"] for s in st), sum(s["write_bytes"] for s in st)
            fractions[dtype].append(wire / whole)
            rows.append(f"{model} lr {lr} {dtype} v{v}: {sum(s['delta_writes'] for s in st)} deltas applied, "
                        f"{wire} of {whole} bytes on the wire ({100 * wire / whole:.2f}%), "
                        f"apply {max(s['apply_seconds'] for s in st):.4f} s (slowest rank)")
            if v == 1:
                assert wire == whole, rows[-1]
            else:
                # Real AdamW steps at these rates change a few percent of
                # the bytes (docs/DELTAS.md): far less goes on the wire.
                assert wire < whole / 3, rows[-1]
        assert sent == sum(s["wire_bytes"] for s in got_stats.values()), \
            f"version {v}: the trainers put {sent} bytes on the wire, the engines took {got_stats}"
        finding = max(r["stages"]["delta"] for r in t["reports"])
        rows.append(f"{model} lr {lr} v{v}: controller's delta {delta}; finding changes {finding:.4f} s (slowest rank)")
        if v == 1:
            assert delta is None
        else:
            assert delta == {"base": v - 1, "ranks": list(range(engines))}, delta
    for dtype, f in fractions.items():
        rows.append(f"{model} lr {lr} {dtype}: versions 2-{DELTA_VERSIONS} sent {100 * min(f[1:]):.2f}-"
                    f"{100 * max(f[1:]):.2f}% of the whole bytes")
    print("\n".join(rows))
    with open(os.path.join(ROOT, "build", f"torch-sync-delta-{model}-{lr}.txt"), "w") as f:
        f.write("\n".join(rows) + "\n")


def test_sidecar_route_moves_the_same_bytes(job):
    """wsync.export_shards + `wsync trainer-agent` processes: the same model,
    the same bytes, checked the same way (and timed beside the in-process
    route of the first test)."""
    j = job()
    engines = [j.engine(r, "--model", "llama") for r in range(ENGINES)]
    trainers = j.trainers("--model", "llama", "--route", "sidecar")
    deadline = time.time() + TIMEOUT
    while not os.path.exists(os.path.join(j.out, "exported")):
        assert trainers.poll() is None, j.log("trainers")[-4000:]
        assert time.time() < deadline
        time.sleep(0.1)
    for r in range(TRAINERS):
        j.start(f"agent{r}", [wsync_binary(), "trainer-agent", "--controller", j.address, "--rank", str(r),
                              "--layout", os.path.join(j.out, "trainer.json"), "--job", "torch-sync",
                              "--watermark", str(64 << 20)])
    assert j.wait(trainers, "trainers") == 0, j.log("trainers")[-6000:]
    for r, e in enumerate(engines):
        assert j.wait(e, f"engine{r}") == 0, j.log(f"engine{r}")[-4000:]
    for v in range(1, STEPS + 1):
        t = load(j, f"trainer-v{v}.pt")
        for r in range(ENGINES):
            e = load(j, f"engine-{r}-v{v}.pt")
            for name, want in t["state"].items():
                assert torch.equal(e["tensors"][name], want), f"engine {r} version {v}: '{name}' differs"
            assert e["tokens"] == t["tokens"]
    print_figures(j, "llama-sidecar")


# ---------------------------------------------------------------- bad input --


def run_failing(job, trainer_args, engine_args_of):
    engines = [job.engine(r, *engine_args_of(r)) for r in range(ENGINES)]
    trainers = job.trainers(*trainer_args)
    rc = job.wait(trainers, "trainers")
    return rc, engines


def nothing_complete(job):
    return job.get("/v1/status")


@pytest.mark.parametrize("flag,name,needle", [
    ("--drop", "model.norm.weight", "lacks tensor"),   # a trainer tensor one engine replica lacks
    ("--extra", "model.extra.weight", "extra"),        # an engine tensor no trainer holds
])
def test_tensor_on_one_side_only_is_one_clear_error(job, flag, name, needle):
    j = job()
    rc, _ = run_failing(j, ["--model", "llama", "--timeout", "15"],
                        lambda r: ["--model", "llama", flag, name] if r == 1 else ["--model", "llama"])
    assert rc != 0
    text = j.log("trainers")
    assert name in text and needle in text, text[-4000:]
    assert not os.path.exists(os.path.join(j.out, "engine-0-v1.done")), "a version completed without a plan"


@pytest.mark.parametrize("flag,needle", [("--cast", "fp8"), ("--reshape", "shape")])
def test_dtype_or_shape_mismatch_is_one_clear_error_naming_the_tensor(job, flag, needle):
    j = job()
    rc, _ = run_failing(j, ["--model", "llama", "--timeout", "15"],
                        lambda r: ["--model", "llama", flag, "lm_head.weight"] if r == 0 else ["--model", "llama"])
    assert rc != 0
    text = j.log("trainers")
    assert "lm_head.weight" in text and needle in text, text[-4000:]
    assert not os.path.exists(os.path.join(j.out, "engine-1-v1.done")), "a version completed without a plan"


def test_engine_without_the_job_secret_is_refused_with_one_clear_error(job):
    j = job()
    rogue = j.engine(0, "--model", "llama", secret=False)
    rc = j.wait(rogue, "engine0")
    assert rc != 0
    text = j.log("engine0")
    assert "unsigned request" in text and "--secret-file" in text, text[-2000:]
    assert j.get("/v1/status")["registered"]["inference"] == []


def test_second_push_before_reads_done_is_refused(job):
    j = job()
    run_clean(j, ["--model", "llama", "--double-push", "--no-tokens", "--steps", "1"],
              ["--model", "llama", "--versions", "1"])
    with open(os.path.join(j.out, "double-push.txt")) as f:
        text = f.read()
    assert "still reading the weights" in text and "trainer rank 0" in text, text


def test_killed_inference_process_fails_the_version_and_nothing_is_marked_complete(job):
    j = job(heartbeat=3, version_timeout=30)
    engines = [j.engine(r, "--model", "llama") for r in range(ENGINES)]
    go = os.path.join(j.out, "go")
    trainers = j.trainers("--model", "llama", "--timeout", "60", "--no-tokens", "--hold", go)
    # Kill engine 1 once the job is planned and before version 1 is pushed.
    # (Killed before the plan, the controller drops it from the world and the
    # trainers wait for it to come back: another case, another error.)
    deadline = time.time() + TIMEOUT
    while not os.path.exists(os.path.join(j.out, "planned")):
        assert time.time() < deadline and trainers.poll() is None, j.log("trainers")
        time.sleep(0.05)
    engines[1].send_signal(signal.SIGKILL)
    engines[1].wait()
    open(go, "w").close()
    rc = j.wait(trainers, "trainers")
    assert rc != 0
    text = j.log("trainers")
    # Every rank's error leads with the cause, whichever way it failed (a
    # write to the dead engine, a start refused because the version already
    # failed, a collective its peers left).
    errors = [line for line in text.splitlines() if "PushError:" in line]
    assert errors, text[-4000:]
    for line in errors:
        assert "inference rank 1" in line, "\n".join(errors)
    assert not os.path.exists(os.path.join(j.out, "engine-0-v1.done")) or \
        j.version(1)["state"] != "complete"


def test_unknown_staging_mode_is_one_clear_error():
    """staging= takes 'auto', 'on' or 'off'; anything else is refused before
    any process group, engine or controller connection is made."""
    import wsync
    tensors = {"w": torch.zeros(4, 4, dtype=torch.bfloat16)}
    with pytest.raises(ValueError, match=r"InferenceAgent rank 0: staging='sometimes': expected one of 'auto', 'on', 'off'"):
        wsync.InferenceAgent(tensors, controller="127.0.0.1:1", job="j", rank=0, staging="sometimes")
    with pytest.raises(ValueError, match=r"TrainerAgent: staging='always'"):
        wsync.TrainerAgent(torch.nn.Linear(4, 4), controller="127.0.0.1:1", job="j", staging="always")


def test_a_config_key_the_core_does_not_know_is_one_clear_error():
    """The Python layer hands its settings to the C++ core as JSON: a key the
    core does not read (a misspelling on either side) is refused, never left
    to its default in silence (issue #32)."""
    from wsync import _C
    with pytest.raises(ValueError, match=r"inference config: unknown key 'controler'"):
        _C.InferenceSession(json.dumps({"rank": {}, "controler": "127.0.0.1:1"}), [])
    with pytest.raises(ValueError, match=r"trainer config: unknown key 'watermark'"):
        _C.TrainerSession(json.dumps({"registration": {}, "controller": "127.0.0.1:1", "job": "j", "watermark": 1}), [])


@pytest.mark.parametrize("sig, after", [(signal.SIGINT, "interrupted"), (signal.SIGTERM, None)])
def test_a_process_that_imported_wsync_still_takes_ctrl_c_and_sigterm_as_python_does(tmp_path, sig, after):
    """Debian's libfabric (which wsync._C loads) links libinfinipath, whose
    constructor took SIGINT and SIGTERM and answered them with a backtrace
    file and exit() from inside the handler: no KeyboardInterrupt, and exit
    handlers run under live threads (the crash dumps of issue #28's CI).
    Importing wsync must leave both signals to Python."""
    script = ("import time, wsync\nprint('ready', flush=True)\n"
              "try:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n    print('interrupted', flush=True)\n")
    # As a terminal starts it: no IPATH_NO_BACKTRACE, SIGINT at its default
    # (a test runner started in the background inherits it ignored).
    env = {k: v for k, v in os.environ.items() if k != "IPATH_NO_BACKTRACE"}
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, cwd=tmp_path, env=env,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert p.stdout.readline() == b"ready\n"
    p.send_signal(sig)
    out, _ = p.communicate(timeout=60)
    if after:
        assert (out.decode().strip(), p.returncode) == (after, 0)
    else:
        assert p.returncode == -sig, out
    assert not list(tmp_path.glob("*.btr")), "a backtrace file: libinfinipath's handler ran"
