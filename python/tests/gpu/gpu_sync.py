"""GPU end to end on one CUDA machine (issue 8): a trainer process with its
FSDP2 shards on the GPU pushes a Llama-3-8B-shaped model (random bf16) into
2 inference processes holding a TP-2 fused block-fp8 layout in GPU memory,
over libfabric's shm provider with FI_HMEM (a libfabric built with CUDA).
Every version's bytes are checked on the CPU against plain torch
(engine_layout.py / fp8_reference.py), apart from wsync's code. Not part of
CI (no GPU there).

    python python/tests/gpu/gpu_sync.py job --wsync PATH/wsync [--layers 4] [--versions 3] [--delta]

Prints one line per version (update seconds, GB/s, stages, peak device
memory against the watermark) and exits non-zero on any mismatch.

--delta: delta versions (docs/DELTAS.md) on the GPU: TrainerAgent(delta=True)
and InferenceAgent(delta=True), and each version is a real AdamW step at a
small lr (a language-model loss on fixed random tokens), so most bytes stay
as they were and versions after the first go as deltas. Per version the
trainer prints the writes sent as deltas, bytes on the wire against whole,
and the delta stage beside a device-to-device copy of the same bytes in the
same run; the engines print the deltas applied and their time; every byte
is still checked against plain torch.
"""

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
ROOT = os.path.dirname(os.path.dirname(TESTS))
sys.path.insert(0, TESTS)


def llama3_8b_config(layers):
    from transformers import LlamaConfig
    # meta-llama/Meta-Llama-3-8B's published config.json, with fewer layers when asked.
    config = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
                         num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                         rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, dtype="bfloat16")
    config.architectures = ["LlamaForCausalLM"]
    return config


def config_dict(config):
    d = config.to_dict()
    d["architectures"] = ["LlamaForCausalLM"]
    return d


def shapes_state(config):
    """{name: zeros on the CPU} of the model's tensors: what the layout needs."""
    import torch
    from transformers import LlamaForCausalLM
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    return {n: torch.zeros(t.shape, dtype=torch.bfloat16) for n, t in model.state_dict().items()}


def wait_file(path, timeout):
    deadline = time.time() + timeout
    while not os.path.exists(path):
        if time.time() > deadline:
            raise TimeoutError(f"{path} did not appear in {timeout} s")
        time.sleep(0.05)


def wait_any(paths, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in paths:
            if os.path.exists(p):
                return p
        time.sleep(0.05)
    raise TimeoutError(f"none of {paths} within {timeout} s")


def describe_difference(got, want):
    """Where a wrong tensor differs: how many bytes, the first, and whether
    they are the poison (never written) or other bytes (stale or wrong)."""
    import torch
    g, w = got.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)
    diff = (g != w).nonzero().reshape(-1)
    first = int(diff[0]) if diff.numel() else -1
    poison = int((g[diff] == 0xFF).sum())
    return f"{diff.numel()} of {g.numel()} bytes differ, first at byte {first}, {poison} of them still poison"


def best_copy_seconds(total, dst, src):
    """Best of 3: `total` bytes from `src` into `dst` (uint8 tensors of one
    piece, reused) by plain torch copies."""
    import torch
    piece = dst.numel()
    best = None
    for _ in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        left = total
        while left > 0:
            n = min(piece, left)
            dst[:n].copy_(src[:n], non_blocking=True)
            left -= n
        torch.cuda.synchronize()
        t = time.perf_counter() - t0
        best = t if best is None else min(best, t)
    return best


def pinned_copy_seconds(total, to_device):
    """`total` bytes between pinned host memory and the GPU, one direction
    (pieces of at most 1 GiB)."""
    import torch
    piece = min(total, 1 << 30)
    host = torch.ones(piece, dtype=torch.uint8, pin_memory=True)
    dev = torch.ones(piece, dtype=torch.uint8, device="cuda")
    return best_copy_seconds(total, dev, host) if to_device else best_copy_seconds(total, host, dev)


def device_copy_seconds(total):
    """`total` bytes device-to-device (pieces of at most 1 GiB)."""
    import torch
    piece = max(1, min(total, 1 << 30))
    src = torch.ones(piece, dtype=torch.uint8, device="cuda")
    return best_copy_seconds(total, torch.empty_like(src), src)


class AdamWStep:
    """--delta: a real optimizer step, AdamW at a small lr on the bf16
    parameters, with a language-model loss on fixed random tokens: most
    bf16 elements round back to what they were, the rest move a little."""

    def __init__(self, model, config, device, lr):
        import torch
        self.model = model
        self.opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
        gen = torch.Generator(device="cpu").manual_seed(11)
        self.tokens = torch.randint(0, config.vocab_size, (1, 64), generator=gen).to(device)

    def __call__(self):
        out = self.model(input_ids=self.tokens, labels=self.tokens)
        out.loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return float(out.loss)


def trainer(args):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import LlamaForCausalLM
    import fsdp_setup
    import wsync

    torch.cuda.set_device(0)
    dist.init_process_group("nccl")
    config = llama3_8b_config(args.layers)
    torch.manual_seed(1234)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    mesh = init_device_mesh("cuda", (1,), mesh_dim_names=("dp_shard",))
    if args.offload:  # the shards in pinned host memory; the pipeline on the GPU all the same
        from torch.distributed.fsdp import CPUOffloadPolicy
        fsdp_setup.shard_dense(model, mesh, offload_policy=CPUOffloadPolicy(pin_memory=True))
    else:
        fsdp_setup.shard_dense(model, mesh)
    shard_device = next(model.parameters()).to_local().device
    params = sum(p.numel() for p in model.parameters())
    print(f"trainer: {params / 1e9:.2f} B parameters, shards on {shard_device} "
          f"(FSDP2, bf16{', CPUOffloadPolicy' if args.offload else ''})", flush=True)
    if args.trainer_sidecar:
        return sidecar_trainer(args, model, shard_device)
    sync = wsync.TrainerAgent(model, controller=args.controller, job="gpu", watermark_bytes=args.watermark_mb << 20,
                              timeout_s=args.timeout, checksums=args.checksums,
                              device="cuda:0" if args.offload else None, staging=args.staging, delta=args.delta)
    print(f"trainer: writes {'through pinned host memory (host staging)' if sync.describe()['host_staging'] else 'straight from GPU memory'}",
          flush=True)
    gen = torch.Generator(device=shard_device).manual_seed(7)
    adamw = AdamWStep(model, config, shard_device, args.lr) if args.delta else None
    updates, replays = [], []
    for v in range(1, args.versions + 1):
        if adamw is not None:
            loss = adamw()
            print(f"trainer: version {v}: AdamW step at lr {args.lr:g}, loss {loss:.4f}", flush=True)
        else:
            with torch.no_grad():  # a stand-in optimizer step: every weight changes
                for p in model.parameters():
                    p = p.to_local() if hasattr(p, "to_local") else p
                    p.add_(torch.randn(p.shape, generator=gen, device=shard_device, dtype=torch.float32).to(p.dtype),
                           alpha=0.01)
        torch.cuda.synchronize()
        free_before, total = torch.cuda.mem_get_info()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        prof = None
        if args.profile and v == args.versions:  # every CUDA call and kernel of this process, the pipeline's too
            from torch.profiler import ProfilerActivity, profile
            prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            prof.__enter__()
        t0 = time.perf_counter()
        h = sync.push(v)
        h.wait_reads_done(args.timeout)
        reads_done = time.perf_counter() - t0
        report = h.wait(args.timeout)
        report["push_to_complete_seconds"] = time.perf_counter() - t0
        if prof is not None:
            prof.__exit__(None, None, None)
            averages = prof.key_averages()
            print("trainer: profile of version", v, flush=True)
            print(averages.table(sort_by="self_cpu_time_total", row_limit=14), flush=True)
            print(averages.table(sort_by="self_device_time_total", row_limit=10), flush=True)
            prof.export_chrome_trace(os.path.join(args.work, "trace.json"))
        report["reads_done_seconds"] = reads_done
        report["torch_peak_above_model_bytes"] = torch.cuda.max_memory_allocated() - base
        report["device_free_bytes_before"] = free_before
        report["device_free_bytes_after"] = torch.cuda.mem_get_info()[0]
        # One rank: its shard is the whole tensor (full_tensor of offloaded
        # shards would need a CPU collective).
        state = {n: t.detach().to_local().cpu().clone() for n, t in model.state_dict().items()}
        torch.save(state, os.path.join(args.work, "trainer.pt"))
        del state
        with open(os.path.join(args.work, f"trainer-v{v}.json"), "w") as f:
            json.dump(report, f)
        print(f"trainer: version {v}: {json.dumps(report)}", flush=True)
        if args.delta:
            delta_line(v, report)
        for r in range(2):  # each engine checks what it got; a wrong version ends the run
            done = wait_any([os.path.join(args.work, f"engine-{r}-v{v}.{x}") for x in ("done", "bad")], args.timeout)
            if done.endswith(".bad"):
                sys.exit(f"trainer: engine {r} got wrong bytes in version {v}")
        updates.append(report["stages"]["total"])
        if v < args.versions and not args.delta:  # a replay would leave the engines off the version deltas build on
            # The engine alone on the same writes (the next version restores
            # the bytes this leaves behind); best of two.
            replay = min((sync.replay_writes() for _ in range(2)), key=lambda r: r["stages"]["total"])
            replays.append(replay["stages"]["total"])
            print(f"trainer: after version {v}: the engine alone on its {replay['writes']} writes: "
                  f"{replay['stages']['total']:.4f} s ({replay['written_bytes'] / replay['stages']['total'] / 1e9:.1f} GB/s)",
                  flush=True)
    if replays:
        update, alone = min(updates[1:] or updates), min(replays)
        print(f"trainer: UPDATE_VS_ENGINE {alone / update:.3f} (best update {update:.4f} s, the engine alone on the "
              f"same writes {alone:.4f} s)", flush=True)
    update = min(updates[1:] or updates)
    if sync.describe()["host_staging"]:
        # The staged path's own limit here: every written byte device-to-host
        # (the trainer's mirror) and host-to-device (the engines' copy in),
        # by plain torch copies from and into pinned memory, in this run.
        written = report["written_bytes"]
        d2h = pinned_copy_seconds(written, to_device=False)
        h2d = pinned_copy_seconds(written, to_device=True)
        print(f"trainer: UPDATE_VS_COPIES {(d2h + h2d) / update:.3f} (best update {update:.4f} s; the same "
              f"{written / 1e6:.0f} MB device-to-host {d2h:.4f} s ({written / d2h / 1e9:.1f} GB/s) plus host-to-device "
              f"{h2d:.4f} s ({written / h2d / 1e9:.1f} GB/s) by torch alone)", flush=True)
    if args.offload:
        # The update's own limit here: the same bytes host-to-device from
        # pinned memory by a plain torch copy, in this process and run.
        copied = report["copied_bytes"]
        best = pinned_copy_seconds(copied, to_device=True)
        print(f"trainer: UPDATE_VS_H2D {best / update:.3f} (best update {update:.4f} s; the same {copied / 1e6:.0f} MB "
              f"host-to-device from pinned memory by torch alone {best:.4f} s, {copied / best / 1e9:.1f} GB/s)",
              flush=True)
    sync.close()
    dist.destroy_process_group()


def delta_line(v, report):
    """--delta: what went as deltas in this version, and the delta stage
    (finding the changes, encoding, advancing the copies: every write with a
    copy) in ms per GB of those writes' bytes, beside a device-to-device copy
    of the same bytes by torch in this run."""
    copies = report["delta_copy_bytes"]
    delta_s = report["stages"]["delta"]
    line = (f"trainer: DELTA version {v}: {report['delta_writes']} of {report['writes']} writes as deltas, "
            f"{report['written_bytes'] / 1e6:.2f} MB on the wire for {report['write_bytes'] / 1e6:.2f} MB whole "
            f"({100.0 * report['written_bytes'] / max(report['write_bytes'], 1):.2f}%); copies {copies / 1e6:.1f} MB")
    if copies > 0 and delta_s > 0:
        copy_s = device_copy_seconds(copies)
        line += (f"; delta stage {delta_s * 1e3:.2f} ms ({delta_s * 1e3 / (copies / 1e9):.2f} ms/GB of the writes with "
                 f"copies), a device-to-device copy of the same bytes {copy_s * 1e3:.2f} ms "
                 f"({copy_s * 1e3 / (copies / 1e9):.3f} ms/GB; stage/copy {delta_s / copy_s:.1f}x)")
    print(line, flush=True)


def step(model, gen, device):
    """A stand-in optimizer step: every weight changes, in place."""
    import torch
    with torch.no_grad():
        for p in model.parameters():
            p = p.to_local() if hasattr(p, "to_local") else p
            p.add_(torch.randn(p.shape, generator=gen, device=device, dtype=torch.float32).to(p.dtype), alpha=0.01)


def save_and_wait_engines(args, model, v):
    """The trainer's weights of version `v` for the engines' check (one rank:
    its shard is the whole tensor), then each engine's verdict."""
    import torch
    state = {n: t.detach().to_local().cpu().clone() for n, t in model.state_dict().items()}
    torch.save(state, os.path.join(args.work, "trainer.pt"))
    del state
    with open(os.path.join(args.work, f"trainer-v{v}.json"), "w") as f:
        json.dump({"version": v}, f)
    for r in range(2):
        done = wait_any([os.path.join(args.work, f"engine-{r}-v{v}.{x}") for x in ("done", "bad")], args.timeout)
        if done.endswith(".bad"):
            sys.exit(f"trainer: engine {r} got wrong bytes in version {v}")


def sidecar_trainer(args, model, shard_device):
    """The trainer's side of the sidecar route on a GPU: its FSDP2 shards
    stay on the GPU, exported by CUDA IPC (wsync.export_shards) to a
    `wsync trainer-agent --cuda-ipc` process that runs the pipeline there."""
    import torch
    import torch.distributed as dist
    import wsync
    exporter = wsync.export_shards(model, job="gpu", layout_path=os.path.join(args.work, "trainer-layout.json"))
    print(f"trainer: shards exported by CUDA IPC to {exporter.cuda_ipc_path}", flush=True)
    log = open(os.path.join(args.work, "trainer-agent.log"), "w")
    agent = subprocess.Popen([args.wsync, "trainer-agent", "--controller", args.controller, "--rank", "0",
                              "--layout", exporter.layout_path, "--job", "gpu", "--cuda-ipc", exporter.cuda_ipc_path,
                              "--staging", args.staging, "--watermark", str(args.watermark_mb << 20),
                              *(["--checksums"] if args.checksums else []), *(["--delta"] if args.delta else [])],
                             stdout=subprocess.PIPE, stderr=log)
    if agent.stdout.readline().decode().strip() != "ready":
        agent.wait(timeout=30)
        with open(os.path.join(args.work, "trainer-agent.log")) as f:
            sys.exit(f"trainer: `wsync trainer-agent --cuda-ipc` did not start:\n{f.read()[-3000:]}")
    gen = torch.Generator(device=shard_device).manual_seed(7)
    adamw = AdamWStep(model, llama3_8b_config(args.layers), shard_device, args.lr) if args.delta else None
    try:
        for v in range(1, args.versions + 1):
            if adamw is not None:
                print(f"trainer: version {v}: AdamW step at lr {args.lr:g}, loss {adamw():.4f}", flush=True)
            else:
                step(model, gen, shard_device)
            torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            exporter.publish(v)
            exporter.wait_reads_done(v, args.timeout)
            reads_done = time.perf_counter() - t0
            if exporter.failed_version >= v:
                sys.exit(f"trainer: the agent failed version {v}; see trainer-agent.log")
            print(f"trainer: version {v}: reads done {reads_done:.4f} s after publish", flush=True)
            save_and_wait_engines(args, model, v)
    finally:
        agent.terminate()
        agent.wait(timeout=30)
        with open(os.path.join(args.work, "trainer-agent.log")) as f:
            lines = f.read().splitlines()
        for line in lines:  # the agent's report of each version's deltas
            if "; deltas: " in line:
                print("trainer: DELTA (trainer-agent) " + line[line.index("version "):], flush=True)
        print("trainer: --- trainer-agent.log (last lines)\n" + "\n".join(lines[-20:]), flush=True)
    dist.destroy_process_group()


def engine(args):
    import torch
    import engine_layout
    import wsync

    config = llama3_8b_config(args.layers)
    cfg = config_dict(config)
    zeros, entries = engine_layout.engine_layout(shapes_state(config), cfg, tp=2, ranks=[args.rank])
    tensors = {}
    for name, t in zeros[args.rank].items():  # poisoned: an unwritten byte shows
        tensors[name] = torch.full((t.numel() * t.element_size(),), 0xFF, dtype=torch.uint8,
                                   device="cuda").view(t.dtype).view(t.shape)
    del zeros
    layout = {e["name"]: {k: e[k] for k in ("tp", "experts") if k in e} for e in entries[args.rank]}
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    if args.sidecar:
        agent = sidecar_engine(args, tensors, layout)
        print(f"engine {args.rank}: {len(tensors)} tensors, {nbytes / 2**30:.2f} GiB on cuda:0, exported by CUDA IPC "
              f"to `wsync inference-agent --cuda-ipc` (pid {agent.process.pid}), registered; the writes land "
              f"{'in pinned host memory (host staging)' if agent.staged else 'in GPU memory'}", flush=True)
    else:
        agent = wsync.InferenceAgent(tensors, controller=args.controller, job="gpu", rank=args.rank, instance=0,
                                     layout=layout, timeout_s=args.timeout, verify_checksums=args.checksums,
                                     shadow=args.shadow, staging=args.staging, paced=args.paced, delta=args.delta)
        print(f"engine {args.rank}: {len(tensors)} tensors, {nbytes / 2**30:.2f} GiB on cuda:0, registered; the writes "
              f"land {'in pinned host memory (host staging)' if agent.staged else 'in GPU memory'}", flush=True)
    with agent:
        for v in range(1, args.versions + 1):
            if args.paced:  # engine-paced: the tensors change only inside update()
                t0 = time.perf_counter()
                assert agent.update(v, args.timeout) == v
                u = agent.last_update
                print(f"engine {args.rank}: update({v}) ({agent._session.pacing}): pause {u['seconds']:.4f} s "
                      f"(wait {u['wait_seconds']:.4f}, copy {u['copy_seconds']:.4f}) of {time.perf_counter() - t0:.4f} s",
                      flush=True)
            else:
                agent.wait_version(v, args.timeout)
            got = {n: t.cpu() for n, t in tensors.items()}
            # the trainer saves what it pushed once its push has returned
            wait_file(os.path.join(args.work, f"trainer-v{v}.json"), args.timeout)
            state = torch.load(os.path.join(args.work, "trainer.pt"), mmap=True)
            want, _ = engine_layout.engine_layout(state, cfg, tp=2, ranks=[args.rank])
            bad = [n for n, w in want[args.rank].items()
                   if got[n].shape != w.shape or not torch.equal(got[n].view(torch.uint8), w.view(torch.uint8))]
            line = (f"engine {args.rank}: version {v}: {len(want[args.rank]) - len(bad)} of {len(want[args.rank])} "
                    f"tensors ({nbytes} bytes) equal plain torch on the CPU" + (f"; differ: {bad[:5]}" if bad else ""))
            for n in bad[:3]:  # a late copy shows as bytes that are right when read again
                again = tensors[n].cpu()
                line += (f"\n  {n}: {describe_difference(got[n], want[args.rank][n])}; read again after the check: "
                         f"{'now equal' if torch.equal(again.view(torch.uint8), want[args.rank][n].view(torch.uint8)) else describe_difference(again, want[args.rank][n])}")
            if args.checksums and not bad:  # on request too, against the engine's tensors
                t0 = time.perf_counter()
                agent.verify(v)
                line += f"; verify() on request: OK in {time.perf_counter() - t0:.4f} s"
                if v == args.versions:  # one byte flipped in GPU memory must be named by its tensor
                    line += "; " + flipped_byte_named(agent, tensors, v)
            print(line, flush=True)
            with open(os.path.join(args.work, f"engine-{args.rank}-v{v}.{'done' if not bad else 'bad'}"), "w") as f:
                f.write(line + "\n")
            if bad:
                sys.exit(1)


def flipped_byte_named(agent, tensors, v):
    """Flips one byte in the middle of the largest tensor (GPU memory),
    checks that verify() fails naming that tensor, and flips it back."""
    import torch
    import wsync
    name = max(tensors, key=lambda n: tensors[n].numel() * tensors[n].element_size())
    raw = tensors[name].view(-1).view(torch.uint8)
    at = raw.numel() // 2 + 12345
    raw[at] ^= 0x20
    torch.cuda.synchronize()
    try:
        agent.verify(v)
        said = None
    except wsync.ChecksumError as e:
        said = str(e)
    finally:
        raw[at] ^= 0x20
        torch.cuda.synchronize()
    if said is None or f"'{name}'" not in said:
        raise SystemExit(f"verify() after a flipped byte in '{name}' (byte {at}): "
                         f"{'no error' if said is None else 'does not name it: ' + said}")
    agent.verify(v)  # flipped back: equal again
    return f"a flipped byte in '{name}' (byte {at}) named: {said[:160]}"


class SidecarEngine:
    """The engine's side of the sidecar route on a GPU: its tensors exported
    by CUDA IPC to a `wsync inference-agent --cuda-ipc` process, the version
    read from that agent's weight store."""

    def __init__(self, process, versions):
        self.process, self.versions = process, versions

    def wait_version(self, v, timeout):
        self.versions.wait_version(v, timeout)

    def verify(self, v):
        pass  # checksums are the in-process agent's (--checksums is not used with --sidecar)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.process.terminate()
        self.process.wait(timeout=30)


def sidecar_engine(args, tensors, layout):
    import wsync
    ipc = os.path.join(args.work, f"engine-{args.rank}.ipc.json")
    spec = os.path.join(args.work, f"engine-{args.rank}.layout.json")
    wsync.export_cuda_ipc(tensors, ipc, spec, rank=args.rank, layout=layout)
    log = open(os.path.join(args.work, f"agent{args.rank}.log"), "w")
    p = subprocess.Popen([args.wsync, "inference-agent", "--controller", args.controller, "--rank", str(args.rank),
                          "--layout", spec, "--cuda-ipc", ipc, "--job", "gpu",
                          "--version-timeout", str(int(args.timeout)), "--staging", args.staging,
                          *(["--shadow"] if args.shadow else []), *(["--delta"] if args.delta else [])],
                         stdout=subprocess.PIPE, stderr=log)
    line = p.stdout.readline().decode().strip()
    if line != "ready":
        p.wait(timeout=30)
        with open(os.path.join(args.work, f"agent{args.rank}.log")) as f:
            sys.exit(f"engine {args.rank}: `wsync inference-agent --cuda-ipc` did not start:\n{f.read()[-3000:]}")
    with open(os.path.join(args.work, f"agent{args.rank}.log")) as f:
        staged = "host staging" in f.read()
    engine = SidecarEngine(p, wsync.StoreVersions(f"/wsync-gpu-infer-{args.rank}"))
    engine.staged = staged
    return engine


def job(args):
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    secret = os.path.join(args.work, "job.secret")
    subprocess.run([args.wsync, "secret", secret], check=True)
    cfg_path = os.path.join(args.work, "config.json")
    with open(cfg_path, "w") as f:
        json.dump(config_dict(llama3_8b_config(args.layers)), f)
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1", WSYNC_SECRET_FILE=secret)
    procs = []

    def start(name, cmd, extra_env=None):
        if os.environ.get("WSYNC_GDB") and name != "controller":  # a native backtrace if it crashes
            cmd = ["cuda-gdb", "-q", "-batch", "-ex", "run", "-ex", "bt 30", "-ex", "info threads", "--args", *cmd]
        log = open(os.path.join(args.work, f"{name}.log"), "w")
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE if name == "controller" else log, stderr=log,
                             env=dict(env, **(extra_env or {})), cwd=ROOT)
        procs.append((name, p))
        return p

    ctl = start("controller", [args.wsync, "controller", "--secret-file", secret, "--listen", "127.0.0.1:0",
                               "--state-dir", os.path.join(args.work, "state"), "--trainers", "1", "--inference", "2",
                               "--mapping", os.path.join(ROOT, "configs", "mappings", "llama.json"),
                               "--model-config", cfg_path, "--version-timeout", str(int(args.timeout))])
    address = ctl.stdout.readline().decode().strip()
    print(f"job: controller at {address}; {args.layers} layers of Llama-3-8B, {args.versions} versions", flush=True)
    common = ["--controller", address, "--work", args.work, "--layers", str(args.layers),
              "--versions", str(args.versions), "--timeout", str(args.timeout),
              "--staging", args.staging, *(["--sidecar"] if args.sidecar else []),
              *(["--trainer-sidecar"] if args.trainer_sidecar else []),
              *(["--checksums"] if args.checksums else []), *(["--shadow"] if args.shadow else []),
              *(["--paced"] if args.paced else []), *(["--delta", "--lr", str(args.lr)] if args.delta else [])]
    me = os.path.abspath(__file__)
    engines = [start(f"engine{r}", [sys.executable, me, "engine", "--rank", str(r), *common]) for r in range(2)]
    port = 29500 + secrets.randbelow(1000)
    tr = start("trainer", [sys.executable, me, "trainer", "--watermark-mb", str(args.watermark_mb), *common,
                           *(["--profile"] if args.profile else []), *(["--offload"] if args.offload else [])],
               {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    rc = 0
    try:
        for name, p in [("trainer", tr), ("engine0", engines[0]), ("engine1", engines[1])]:
            try:
                code = p.wait(timeout=args.timeout * (args.versions + 2))
                if code != 0:
                    print(f"job: {name} exited with {code}", flush=True)
                rc |= code != 0
            except subprocess.TimeoutExpired:
                print(f"job: {name} still running; stopping", flush=True)
                rc |= 1
    finally:
        for _, p in procs:
            if p.poll() is None:
                p.terminate()
        for _, p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
    for name in ("trainer", "engine0", "engine1"):
        with open(os.path.join(args.work, f"{name}.log")) as f:
            lines = f.read().splitlines()
        for line in lines:  # the agents' own verification before each version completes
            if "checksums verified in" in line or "deltas applied in" in line:
                print(f"{name}: {line.strip()}", flush=True)
        print(f"--- {name}.log (last lines)\n" + "\n".join(lines[-25:]), flush=True)
    for r in range(2):  # the inference sidecars' own logs (--sidecar)
        path = os.path.join(args.work, f"agent{r}.log")
        if os.path.exists(path):
            with open(path) as f:
                for line in f:
                    if "deltas applied in" in line or "checksums verified in" in line:
                        print(f"agent{r}: {line.strip()}", flush=True)
    print(f"job: {'PASS' if rc == 0 else 'FAIL'}", flush=True)
    return rc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["job", "trainer", "engine"])
    ap.add_argument("--wsync", default="wsync")
    ap.add_argument("--controller")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--work", default="/tmp/wsync-gpu-sync")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--versions", type=int, default=3)
    ap.add_argument("--watermark-mb", type=int, default=None,
                    help="the trainer's watermark; 2048 MB, or with --delta 12288 MB (packed writes with their delta "
                         "slots and the copies of what was sent need more)")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--profile", action="store_true", help="torch.profiler over the trainer's last version")
    ap.add_argument("--checksums", action="store_true",
                    help="trainer checksums=True; engines verify_checksums=True and verify() after each version")
    ap.add_argument("--shadow", action="store_true", help="engines in shadow mode (InferenceAgent(shadow=True))")
    ap.add_argument("--paced", action="store_true",
                    help="engines engine-paced (InferenceAgent(paced=True)): each version taken with update(v)")
    ap.add_argument("--staging", choices=["auto", "on", "off"], default="auto",
                    help="TrainerAgent/InferenceAgent(staging=...): on sends through pinned host memory on both sides")
    ap.add_argument("--trainer-sidecar", action="store_true",
                    help="the trainer's shards by CUDA IPC to a `wsync trainer-agent --cuda-ipc` process")
    ap.add_argument("--sidecar", action="store_true",
                    help="engines export their tensors by CUDA IPC to `wsync inference-agent --cuda-ipc` processes")
    ap.add_argument("--offload", action="store_true",
                    help="FSDP2 CPUOffloadPolicy: shards in pinned host memory, TrainerAgent(device='cuda:0')")
    ap.add_argument("--delta", action="store_true",
                    help="delta versions: TrainerAgent/InferenceAgent(delta=True), each version a real AdamW step")
    ap.add_argument("--lr", type=float, default=1e-5, help="--delta: the AdamW step's learning rate")
    args = ap.parse_args()
    if args.watermark_mb is None:
        args.watermark_mb = 12288 if args.delta else 2048
    if args.role == "job":
        sys.exit(job(args))
    (trainer if args.role == "trainer" else engine)(args)


if __name__ == "__main__":
    main()
