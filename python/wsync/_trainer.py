"""The trainer side: wsync.TrainerAgent (in-process) and wsync.export_shards
(for the `wsync trainer-agent` sidecar). See docs/PYTHON.md."""

import datetime
import json
import os

import torch
import torch.distributed as dist

from . import _C
from ._cuda_ipc import ipc_regions, write_ipc_file
from ._meta import describe, process_group_rank_sets
from ._session import SessionOwner


class PushError(RuntimeError):
    """A version that did not land: the text names the rank, stage and tensor."""


class Push:
    """What sync.push(v) returns; the pipeline runs on a thread of its own."""

    def __init__(self, handle, staged):
        self._h = handle
        self._staged = staged  # copies of non-contiguous shards, alive until the push ends
        self.version = handle.version

    def wait_reads_done(self, timeout=None):
        """Returns once the trainer may modify its weights again (every local
        shard has been read). False after `timeout` seconds."""
        return self._h.wait_reads_done(_seconds(timeout))

    def wait(self, timeout=None, complete=True):
        """This rank's report of the version, as a dict: seconds per stage,
        bytes, writes, peak temporary memory against the watermark. With
        `complete` (the default) it returns only once the version is complete
        at every inference rank. Raises PushError if it failed anywhere."""
        try:
            return json.loads(self._h.wait(_seconds(timeout), complete))
        except RuntimeError as e:
            raise PushError(str(e)) from None

    def done(self):
        """True once this rank's part has ended (ok or not)."""
        return self._h.done()


def _seconds(timeout):
    return 1e9 if timeout is None else float(timeout)


# Where GPU writes go through pinned host memory (TrainerAgent/InferenceAgent staging=).
_STAGING = ("auto", "on", "off")

class TrainerAgent(SessionOwner):
    """Pushes a model's weights after each optimizer step.

    Construct on every rank of the job alike (it is collective: it makes
    wsync's own process groups and exchanges mesh descriptions); it returns
    once the controller has planned the world, i.e. once every trainer and
    inference rank has registered (bounded by `timeout_s`).

        sync = wsync.TrainerAgent(model, controller="host:port", job="run1")
        for step in ...:
            ...; optimizer.step()
            h = sync.push(step)       # returns at once
            h.wait_reads_done()       # before the next optimizer.step()
        sync.close()

    Every rank must push the same versions in the same order, as with any
    collective. The pipeline's all-gathers and barriers run on process
    groups made here for wsync alone, so they never interleave with the
    training loop's collectives.

    The pipeline runs where the shards are: in host memory, or on the one
    CUDA device they are on. `device` (a CUDA device: "cuda:1", 1) runs it on
    that GPU while the shards stay in host memory, as FSDP2's
    CPUOffloadPolicy keeps them: each push copies them host-to-device into
    the temporary arena (asynchronously from pinned memory) and unshards,
    quantizes and writes there.

    `staging` (a pipeline on a GPU): "auto" writes straight from GPU memory
    where the transport can register it (a libfabric with FI_HMEM) and
    otherwise stages every write through pinned host memory (a mirror of
    the temporary arena, one more device-to-host copy per written byte; the
    log says so); "on" always stages, "off" refuses a transport without
    FI_HMEM.

    delta=True (docs/DELTAS.md): keep a copy of the bytes each write last
    sent, counted against `watermark_bytes`, and send inference ranks made
    with InferenceAgent(delta=True) only what changed, where the controller
    (which fixes every --full-every K-th version whole) says they hold the
    version it changed from. On a GPU the copies are GPU memory and the
    changes are found by a kernel.
    """

    def __init__(self, model, controller, job, provider="shm", watermark_bytes=1 << 30, timeout_s=300.0,
                 nics=1, node="", keep_sharded=(), host=None, backend=None, secret_file=None,
                 tls_ca_file=None, checksums=False, device=None, staging="auto", delta=False):
        if staging not in _STAGING:
            raise ValueError(f"wsync.TrainerAgent: staging={staging!r}: expected one of {', '.join(map(repr, _STAGING))}")
        if not dist.is_initialized():
            raise RuntimeError("wsync.TrainerAgent: torch.distributed is not initialized (init_process_group first)")
        self.rank = dist.get_rank()
        self._model = model
        entry, mesh_groups, self._local, _, ordered = describe(model, keep_sharded=keep_sharded, host=host)
        self.registration = dict(entry, mesh_groups=mesh_groups)
        timeout = datetime.timedelta(seconds=timeout_s)
        self._cuda_device, host_shards = _pipeline_device(self._local, device)
        backend = backend or ("nccl" if self._cuda_device >= 0 else "gloo")
        groups = []
        for ranks in process_group_rank_sets(ordered):
            pg = dist.new_group(ranks=ranks, backend=backend, timeout=timeout)
            if self.rank in ranks:
                groups.append((dist.get_process_group_ranks(pg), pg))
        config = {"registration": self.registration, "controller": controller, "job": job, "provider": provider,
                  "secret_file": secret_file or "", "tls_ca_file": tls_ca_file or "", "nics": nics, "node": node,
                  "watermark_bytes": int(watermark_bytes), "timeout_s": float(timeout_s),
                  "cuda_device": self._cuda_device, "host_shards": host_shards, "checksums": bool(checksums),
                  "staging": str(staging), "delta": bool(delta)}
        self._opened(_C.TrainerSession(json.dumps(config), groups))
        self._groups = groups  # the process groups outlive the session
        self._last = None

    def describe(self):
        """This rank's part of the plan: mesh groups, sources, writes, bytes."""
        return json.loads(self._session.describe())

    def replay_writes(self):
        """For benches: this rank's writes of the plan again, as the last push
        posted them but without quantize or packing and without counting at
        the inference ranks: the transfer engine alone on the same bytes.
        Returns its report (the same keys as a push's). The inference weights
        are garbage after it until the next push lands."""
        try:
            return json.loads(self._session.replay_writes())
        except RuntimeError as e:
            raise PushError(str(e)) from None

    def push(self, version):
        """Starts sending the weights as they are now as `version` (an integer
        that grows, e.g. the optimizer step) and returns a Push at once. Do
        not modify the weights until its wait_reads_done() returns."""
        shards, staged = [], []
        for name, t in self._local.items():
            if not t.is_contiguous():
                t = t.contiguous()  # a copy, read by the pipeline instead
                staged.append(t)
            shards.append((name, t.data_ptr(), t.numel() * t.element_size()))
        if self._cuda_device >= 0:
            # The pipeline reads on a stream of its own: the optimizer's
            # updates (and the copies above) must have landed first.
            torch.cuda.current_stream(self._cuda_device).synchronize()
        try:
            self._last = Push(self._session.push(int(version), shards), staged)
        except RuntimeError as e:
            raise PushError(str(e)) from None
        return self._last



def _pipeline_device(local, device=None):
    """(CUDA device the pipeline runs on or -1 for the host, whether the
    shards are in host memory while it runs on a GPU).

    Without `device`: where the shards are, all in host memory or all on
    one CUDA device. With a CUDA `device` the shards may also all be in host
    memory, as FSDP2's CPUOffloadPolicy keeps them: the pipeline then runs
    on that GPU and its copy stage brings them host-to-device."""
    devices = {t.device for t in local.values()}
    names = {f"cuda:{d.index or 0}" if d.type == "cuda" else str(d) for d in devices}
    if len(names) > 1:
        raise ValueError("wsync.TrainerAgent: a rank's parameters must all live on one device; found "
                         + ", ".join(sorted(names)))
    cuda = sorted({d.index or 0 for d in devices if d.type == "cuda"})
    if device is None:
        return (cuda[0] if cuda else -1), False
    dev = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    if dev.type == "cpu":
        if cuda:
            raise ValueError(f"wsync.TrainerAgent: device='cpu', but the parameters are on cuda:{cuda[0]}")
        return -1, False
    if dev.type != "cuda":
        raise ValueError(f"wsync.TrainerAgent: device {dev}: the pipeline runs on the host or a CUDA device")
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    if cuda and cuda[0] != index:
        raise ValueError(f"wsync.TrainerAgent: device cuda:{index}, but the parameters are on cuda:{cuda[0]}")
    return index, not cuda


class ShardExporter:
    """The trainer side of the sidecar route, for `wsync trainer-agent
    --layout <layout_path> --job <job> --rank R`: host shards are copied
    into shared memory at each publish; shards on a GPU stay where they are
    and the agent reads them by CUDA IPC (add `--cuda-ipc <cuda_ipc_path>`)."""

    def __init__(self, local, export, layout_path, cuda_ipc_path=None, device=None):
        self._local = local
        self._export = export
        self.layout_path = layout_path
        self.cuda_ipc_path = cuda_ipc_path
        self._device = device
        self.region_name = export.region_name

    def publish(self, version):
        """Announces `version` to the sidecar: host shards are copied into
        shared memory first; on a GPU this waits for the device, so that the
        optimizer step's kernels have written the shards before the agent
        reads them."""
        if self.cuda_ipc_path is not None:
            torch.cuda.synchronize(self._device)
        else:
            for name, t in self._local.items():
                t = t.contiguous()
                self._export.copy_in(name, t.data_ptr(), t.numel() * t.element_size())
        self._export.publish(int(version))

    def wait_reads_done(self, version, timeout=None):
        self._export.wait_reads_done(int(version), _seconds(timeout))

    @property
    def failed_version(self):
        return self._export.failed_version


def export_shards(model, job, layout_path=None, keep_sharded=(), host=None, cuda_ipc_path=None):
    """Exports this rank's shards for a `wsync trainer-agent` sidecar
    (collective, like TrainerAgent). Writes the job's wsync.trainer/v1 spec
    to `layout_path` (rank 0; default /tmp/wsync-<job>-trainer.json) for the
    sidecars' --layout, and returns a ShardExporter.

    Shards on a GPU are not copied: this rank writes their CUDA IPC handles
    to `cuda_ipc_path` (default /tmp/wsync-<job>-train-<rank>.cuda_ipc.json)
    for the agent's --cuda-ipc. Keep the parameters where they are (FSDP2
    updates its sharded parameters in place) while the agent runs."""
    entry, mesh_groups, local, _, _ = describe(model, keep_sharded=keep_sharded, host=host)
    devices = {t.device.type for t in local.values()}
    if len(devices) > 1:
        raise ValueError("wsync.export_shards: a rank's shards must all be in host memory or all on one GPU; found "
                         + ", ".join(sorted({str(t.device) for t in local.values()})))
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, entry)
    spec = {"schema": "wsync.trainer/v1", "mesh_groups": mesh_groups, "ranks": everyone}
    layout_path = layout_path or f"/tmp/wsync-{job}-trainer.json"
    if dist.get_rank() == 0:
        tmp = layout_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(spec, f)
        os.replace(tmp, layout_path)
    dist.barrier()
    device = None
    on_gpu = devices == {"cuda"}
    if on_gpu:
        device = next(iter(local.values())).device
        cuda_ipc_path = cuda_ipc_path or f"/tmp/wsync-{job}-train-{dist.get_rank()}.cuda_ipc.json"
        # Before the export's region exists: the agent reads this file once
        # it finds the region.
        write_ipc_file(cuda_ipc_path, ipc_regions(local, f"wsync.export_shards rank {dist.get_rank()}"))
    export = _C.ShardExport(job, json.dumps(spec), dist.get_rank(), cuda_ipc=on_gpu)
    return ShardExporter(local, export, layout_path, cuda_ipc_path if on_gpu else None, device)
