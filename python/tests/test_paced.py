"""Engine-paced updates (InferenceAgent(paced=True), update()): real FSDP2
trainers on 4 torchrun ranks push back to back while 2 engine processes run
forward passes flat out and call update() between some of them. No file,
barrier or message coordinates the two except wsync's own API.

Each forward pass's tensors, digested before and after the pass, must be
exactly one version's trainer state (the trainer's own full_tensor(),
saved by it per version: a path apart from wsync).
"""

import hashlib
import json
import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_torch_sync import ENGINES, ROOT, job, load  # noqa: E402,F401  (the fixture)

STEPS = 3


def digest(state):
    return {n: hashlib.sha256(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
            for n, t in state.items()}


def start_engines(j, *extra):
    return [j.start(f"engine{r}", [sys.executable, os.path.join(HERE, "paced_engine.py"), "--controller", j.address,
                                   "--rank", str(r), "--out", j.out, *extra]) for r in range(ENGINES)]


def engine_record(j, r):
    with open(os.path.join(j.out, f"paced-engine-{r}.json")) as f:
        return json.load(f)


def push_outcomes(j):
    with open(os.path.join(j.out, "push-outcomes.json")) as f:
        return json.load(f)


@pytest.mark.parametrize("shadow", [False, True], ids=["live", "shadow"])
def test_every_forward_pass_computes_from_exactly_one_version(job, shadow):
    j = job()
    engines = start_engines(j, "--until", str(STEPS), *(["--shadow"] if shadow else []))
    trainers = j.trainers("--back-to-back", "--steps", str(STEPS), "--no-tokens")
    assert j.wait(trainers, "trainers") == 0, j.log("trainers")[-6000:]
    for r, e in enumerate(engines):
        assert j.wait(e, f"engine{r}") == 0, j.log(f"engine{r}")[-4000:]

    rows = check_passes(j, "shadow" if shadow else "live")
    for per_rank in push_outcomes(j):
        for o in per_rank:
            assert o["ok"], o
    for o in push_outcomes(j)[0]:
        rows.append(f"{'shadow' if shadow else 'live'} trainer rank 0 v{o['version']}: stall until reads done "
                    f"{o['stall_seconds']:.3f} s, waited for engines {o['engine_wait'] or 0:.3f} s")
    print("\n".join(rows))
    with open(os.path.join(ROOT, "build", f"torch-paced-{'shadow' if shadow else 'live'}.txt"), "w") as f:
        f.write("\n".join(rows) + "\n")


def check_passes(j, label, steps=STEPS, engines=range(ENGINES), complete=True):
    """Every pass of every engine read exactly the trainer's state of the
    version update() had returned (and the same before and after the pass);
    with `complete`, each engine reached the last version without an error.
    Returns the update() figures."""
    want = {v: digest(load(j, f"trainer-v{v}.pt")["state"]) for v in range(1, steps + 1)}
    assert len({json.dumps(d, sort_keys=True) for d in want.values()}) == steps, "the optimizer steps changed nothing"
    rows = []
    for r in engines:
        rec = engine_record(j, r)
        if complete:
            assert rec["held"] == steps and not rec["errors"], rec["errors"]
        seen = set()
        for i, p in enumerate(rec["passes"]):
            assert p["before"] == p["after"], f"engine {r} pass {i}: the tensors changed during a forward pass"
            v, got = p["version"], rec["states"][p["before"]]
            assert got and set(got) <= set(want[1]), f"engine {r}: tensors the trainer lacks: {set(got) - set(want[1])}"
            if v == 0:
                assert all(got[n] != want[u][n] for u in want for n in got), \
                    f"engine {r} pass {i}: new bytes before any update()"
                continue
            wrong = sorted(n for n in got if got[n] != want[v][n])
            assert not wrong, f"engine {r} pass {i}: update() said version {v}, but {len(wrong)} tensors differ " \
                              f"from the trainer's version {v} (first: {wrong[0]})"
            seen.add(v)
        assert not complete or steps in seen, f"engine {r} never computed from the last version"
        for u in rec["updates"]:
            rows.append(f"{label} engine {r}: update() -> v{u['version']}: pause "
                        f"{u['seconds']:.3f} s (wait {u['wait_seconds']:.3f}, copy {u['copy_seconds']:.3f})")
    return rows


@pytest.mark.parametrize("shadow", [False, True], ids=["live", "shadow"])
def test_the_sidecar_is_engine_paced_through_store_versions(job, shadow):
    """`wsync inference-agent --paced` with the weights in its shared-memory
    store; the engine reads them and asks StoreVersions.update() between
    reads. The same check: every read is exactly one version."""
    import torch_models
    from test_torch_sync import wsync_binary
    from wsync._inference import _rank_entry
    j = job()
    _, model = torch_models.small_llama(seed=99)
    engines = []
    for r in range(ENGINES):
        entry, _, _ = _rank_entry(dict(model.state_dict()), r, r, None, "_scale_inv", None)
        layout = os.path.join(j.out, f"layout-{r}.json")
        with open(layout, "w") as f:
            json.dump({"schema": "wsync.inference/v1", "ranks": [entry]}, f)
        store = f"/wsync-paced-{os.getpid()}-{r}"
        j.start(f"agent{r}", [wsync_binary(), "inference-agent", "--controller", j.address, "--rank", str(r),
                              "--layout", layout, "--shm-name", store, "--paced", *(["--shadow"] if shadow else [])])
        engines.append(j.start(f"engine{r}", [sys.executable, os.path.join(HERE, "paced_store_engine.py"),
                                              "--store", store, "--rank", str(r), "--out", j.out,
                                              "--until", str(STEPS)]))
    trainers = j.trainers("--back-to-back", "--steps", str(STEPS), "--no-tokens")
    assert j.wait(trainers, "trainers") == 0, j.log("trainers")[-6000:]
    for r, e in enumerate(engines):
        assert j.wait(e, f"engine{r}") == 0, j.log(f"engine{r}")[-4000:] + j.log(f"agent{r}")[-4000:]
    print("\n".join(check_passes(j, f"sidecar-{'shadow' if shadow else 'live'}")))
    for o in push_outcomes(j)[0]:
        assert o["ok"], o


def test_an_engine_that_never_calls_update_times_the_push_out_naming_it(job):
    """Live pacing: nothing is written into an engine outside update(), so a
    push it never lets in fails at the version's deadline, naming the rank;
    its tensors are untouched, and training goes on to the next version."""
    j = job(version_timeout=6)
    engines = start_engines(j, "--never-update", "--seconds", "40", "--until", "99")
    trainers = j.trainers("--back-to-back", "--steps", "2", "--no-tokens", "--timeout", "30")
    assert j.wait(trainers, "trainers") == 0, j.log("trainers")[-6000:]
    for o in push_outcomes(j)[0]:
        assert not o["ok"], o
        assert "did not call update()" in o["error"] and "[0, 1]" in o["error"], o["error"]
        assert "untouched" in o["error"], o["error"]
    for v in (1, 2):
        assert j.version(v)["state"] == "failed"
    for r, e in enumerate(engines):
        assert j.wait(e, f"engine{r}") == 0, j.log(f"engine{r}")[-4000:]
        rec = engine_record(j, r)
        assert rec["held"] == 0
        initial = rec["passes"][0]["before"]
        assert all(p["before"] == initial and p["after"] == initial for p in rec["passes"]), \
            f"engine {r}: its tensors changed although it never called update()"


def test_an_engine_killed_inside_update_fails_that_version_naming_it(job):
    """Engine 1 dies inside the update() that lets version 2 in: version 2
    fails naming inference rank 1, and version 1 stays complete."""
    j = job(heartbeat=3, version_timeout=30)
    engines = [j.start(f"engine{r}", [sys.executable, os.path.join(HERE, "paced_engine.py"), "--controller", j.address,
                                      "--rank", str(r), "--out", j.out, "--until", "2", "--seconds", "60",
                                      "--stop-on-error", *(["--exit-in-update", "2"] if r == 1 else [])])
               for r in range(ENGINES)]
    trainers = j.trainers("--back-to-back", "--steps", "2", "--no-tokens", "--timeout", "40")
    assert j.wait(trainers, "trainers") == 0, j.log("trainers")[-6000:]
    assert engines[1].wait(timeout=120) == 3
    outcomes = push_outcomes(j)[0]
    assert outcomes[0]["ok"], outcomes[0]
    assert not outcomes[1]["ok"] and "inference rank 1" in outcomes[1]["error"], outcomes[1]
    assert j.version(1)["state"] == "complete" and j.version(2)["state"] == "failed"
    # The survivor: its update() said why version 2 failed, or every write
    # of 2 had landed on it before the failure and it holds 2 whole (a rank
    # may be ahead of a failed version, as without pacing); either way each
    # of its passes computed from exactly one version.
    assert j.wait(engines[0], "engine0") == 0, j.log("engine0")[-4000:]
    rec = engine_record(j, 0)
    assert (rec["errors"] and "inference rank 1" in rec["errors"][0]["error"]) or \
        (rec["held"] == 2 and not rec["errors"]), rec["errors"]
    check_passes(j, "killed", steps=2, engines=[0], complete=False)


def test_a_version_failing_while_the_engine_waits_in_update_raises_its_cause(job):
    """Engine 1 is lost right after version 1, so version 2 is never let in
    (its gate stays at 1) and fails when the controller declares it lost.
    Engine 0, waiting inside update() for version 2, raises with that cause
    and says its tensors are untouched: still exactly version 1."""
    j = job(heartbeat=3, version_timeout=30)
    engines = [j.start(f"engine{r}", [sys.executable, os.path.join(HERE, "paced_engine.py"), "--controller", j.address,
                                      "--rank", str(r), "--out", j.out, "--until", "2", "--seconds", "60",
                                      *(["--stop-on-error"] if r == 0 else ["--exit-after", "1"])])
               for r in range(ENGINES)]
    trainers = j.trainers("--back-to-back", "--steps", "2", "--no-tokens", "--timeout", "40")
    assert j.wait(trainers, "trainers") == 0, j.log("trainers")[-6000:]
    assert engines[1].wait(timeout=120) == 3
    assert j.wait(engines[0], "engine0") == 0, j.log("engine0")[-4000:]
    rec = engine_record(j, 0)
    assert rec["held"] == 1 and rec["errors"], rec
    why = rec["errors"][0]["error"]
    assert rec["errors"][0]["type"] == "VersionError" and "inference rank 1" in why and "untouched" in why, why
    check_passes(j, "failing", steps=2, engines=[0], complete=False)
    assert j.version(2)["state"] == "failed"
