"""The inference side: wsync.InferenceAgent registers an engine's own
tensors in place and stays passive. See docs/PYTHON.md."""

import json
import os
import socket
import time

import torch

from . import _C
from ._cuda_ipc import ipc_regions, write_atomic, write_ipc_file
from ._meta import dtype_name
from ._session import SessionOwner
from ._trainer import _STAGING


class VersionError(RuntimeError):
    """A version that will not complete here: the text says who failed it."""


class ChecksumError(RuntimeError):
    """Tensors that are not what the trainers sent: the text names the first."""


class InferenceAgent(SessionOwner):
    """Registers `tensors` (name -> tensor, e.g. dict(model.state_dict()))
    with the transport in place: trainers write straight into their storage,
    and `complete_version` moves to v only once every write of v landed.

    `layout` gives, per engine tensor name, what a tensor-parallel engine
    holds: {"tp": {"dim": d, "rank": r, "size": n}} and/or
    {"experts": {"start": a, "end": b}} (docs/SCHEMA.md, wsync.inference/v1).
    An fp8 tensor NAME takes its block scales from NAME + scale_suffix.
    `instance` groups ranks into engine replicas (each holds every byte once).

    verify_checksums=True: a version whose writes all landed is checked
    against what the trainers hashed (TrainerAgent(checksums=True)) before
    it is complete here; a mismatch fails it, naming the tensor.
    shadow=True: the writes land in a copy of every tensor (as much memory
    again, on the same device); the tensors change only once a version is
    complete on every rank, by a local copy, so a version that fails leaves
    them at the last complete one (docs/PYTHON.md).
    paced=True (engine-paced, docs/PYTHON.md): the tensors change only
    inside update(), which the engine calls between batches; outside it
    they hold exactly one version. Without a shadow, trainers write into
    the tensors only while a rank is inside update() (a push waits for
    it); with shadow=True they write into the shadow whenever they push and
    update() copies the newest complete version out. The default
    (paced=False) lets trainers write whenever they push: an engine that
    computes meanwhile may read a mix of two versions.
    mapping: a wsync.mapping/v1 dict naming where each engine tensor comes
    from in the trainer's names, for engines that derive it themselves
    (wsync.vllm); every rank brings the same one and the controller,
    started without --mapping, plans with it.
    staging (GPU tensors): "auto" registers them in place where the
    transport can (a libfabric with FI_HMEM) and otherwise lands the writes
    in pinned host memory, copied host-to-device once a version landed on
    every rank (shadow mode with the shadow in host memory; the log says
    so); "on" always does that, "off" refuses a transport without FI_HMEM.
    delta=True: take delta versions (docs/DELTAS.md): an inbox a third the
    size of the tensors is registered beside them (host memory, or GPU
    memory on a GPU tensor's device); trainers with TrainerAgent(delta=True)
    write only what changed into it where the controller says this rank
    holds the version they changed from, and the changes are applied here
    (on the GPU by a kernel) before the version is complete.
    """

    def __init__(self, tensors, controller, job, rank, provider="shm", instance=0, layout=None,
                 scale_suffix="_scale_inv", timeout_s=300.0, nics=1, node="", host=None, secret_file=None,
                 tls_ca_file=None, verify_checksums=False, shadow=False, staging="auto", paced=False, mapping=None,
                 delta=False):
        if staging not in _STAGING:
            raise ValueError(f"wsync.InferenceAgent rank {rank}: staging={staging!r}: expected one of "
                             f"{', '.join(map(repr, _STAGING))}")
        self.rank = rank
        self.job = job
        rank_entry, regions, self._tensors = _rank_entry(tensors, rank, instance, layout, scale_suffix, host)
        if mapping is not None:
            rank_entry["mapping"] = mapping
        config = {"rank": rank_entry, "controller": controller, "secret_file": secret_file or "", "tls_ca_file": tls_ca_file or "",
                  "provider": provider, "nics": nics, "node": node,
                  "timeout_s": float(timeout_s), "verify_checksums": bool(verify_checksums), "delta": bool(delta),
                  "shadow": bool(shadow), "staging": str(staging), "paced": bool(paced)}
        # The shadow (shadow mode, host staging) is allocated by the session.
        self._opened(_C.InferenceSession(json.dumps(config), regions))
        self.paced = bool(paced)
        self.last_update = None

    @property
    def staged(self):
        """Whether the writes land in pinned host memory first (host staging)."""
        return self._session.staged

    @property
    def complete_version(self):
        """The latest version whose every write has landed here (0: none)."""
        return self._session.complete_version

    def verify(self, version=None, timeout=60.0):
        """Checks these tensors against the checksums the trainers sent for
        `version` (default: the complete one; trainers run with
        TrainerAgent(checksums=True)). Raises ChecksumError naming the first
        tensor whose bytes differ from what was sent. With
        verify_checksums=True every version is checked like this before it
        becomes complete here; call it on request while no update runs."""
        try:
            self._session.verify(int(version or 0), float(timeout))
        except RuntimeError as e:
            raise ChecksumError(str(e)) from None

    def update(self, version=None, timeout=None):
        """Engine-paced (paced=True): brings the tensors to `version` (None:
        the newest version trainers have pushed; with a shadow, the newest
        that landed everywhere) and returns the version they now hold, which
        stays so until the next update(). Returns at once with the current
        version when nothing newer was pushed. Raises VersionError if the
        version failed (the text says who failed it and what the tensors
        hold) and TimeoutError when it did not come within `timeout` s (the
        tensors unchanged). `last_update` then holds the call's figures:
        seconds (the engine's pause), wait_seconds, copy_seconds."""
        if not self.paced:
            raise RuntimeError(f"wsync.InferenceAgent rank {self.rank}: update() needs paced=True; "
                               f"without it the tensors change whenever trainers push (use wait_version())")
        if version is not None and int(version) < 1:
            raise ValueError(f"wsync.InferenceAgent rank {self.rank}: update(version={version}): versions start at 1")
        try:
            report = json.loads(self._session.update(int(version or 0), 1e12 if timeout is None else float(timeout)))
        except TimeoutError:
            raise
        except RuntimeError as e:
            raise VersionError(str(e)) from None
        self.last_update = report
        return report["version"]

    def wait_version(self, version, timeout=None):
        """Returns once `version` is complete here; raises VersionError if it
        failed (naming who failed it) and TimeoutError after `timeout` s."""
        try:
            self._session.wait_version(int(version), 1e9 if timeout is None else float(timeout))
        except RuntimeError as e:
            text = str(e)
            if " not complete after " in text:
                raise TimeoutError(text) from None
            raise VersionError(text) from None


def _rank_entry(tensors, rank, instance, layout, scale_suffix, host):
    """This rank's wsync.inference/v1 entry for `tensors` (one region per
    tensor, named after it; tied tensors once), the regions as
    (id, data_ptr, bytes, is_cuda, device), and the tensors by region."""
    layout = layout or {}
    unknown = sorted(set(layout) - set(tensors))
    if unknown:
        raise KeyError(f"wsync.InferenceAgent rank {rank}: layout names tensors it was not given: {unknown[:5]}")
    entries, regions, by_region = [], [], {}
    seen = {}
    scales = set()
    for name, t in tensors.items():
        if name.endswith(scale_suffix) and name[: -len(scale_suffix)] in tensors \
                and tensors[name[: -len(scale_suffix)]].dtype == torch.float8_e4m3fn:
            scales.add(name)
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"wsync.InferenceAgent rank {rank}: '{name}' is not a tensor")
        if not t.is_contiguous():
            raise ValueError(f"wsync.InferenceAgent rank {rank}: tensor '{name}' is not contiguous; "
                             f"trainers write it as one row-major block")
        where = (t.data_ptr(), t.numel() * t.element_size())
        if where in seen:
            continue  # tied to seen[where]: the same bytes, written once
        seen[where] = name
        by_region[name] = t
        regions.append((name, t.data_ptr(), where[1], t.device.type == "cuda", t.device.index or 0))
        if name in scales:
            continue
        entry = {"name": name, "shape": list(t.shape), "dtype": dtype_name(t.dtype, f"tensor '{name}'"),
                 "region": name, "offset": 0}
        entry.update(layout.get(name, {}))
        if t.dtype == torch.float8_e4m3fn:
            sname = name + scale_suffix
            if sname not in tensors:
                raise KeyError(f"wsync.InferenceAgent rank {rank}: fp8 tensor '{name}' has no '{sname}'")
            s = tensors[sname]
            entry["scale"] = {"name": sname, "shape": list(s.shape), "dtype": dtype_name(s.dtype, sname),
                              "region": sname, "offset": 0}
        entries.append(entry)
    rank_entry = {"rank": rank, "instance": instance, "host": host or socket.gethostname(), "gpu": 0, "nic": 0,
                  "regions": [{"id": r[0], "size": r[2], "descriptor": ""} for r in regions],
                  "tensors": entries}
    return rank_entry, regions, by_region


def export_cuda_ipc(tensors, path, layout_path, rank, instance=0, layout=None, scale_suffix="_scale_inv",
                    host=None):
    """For the sidecar (`wsync inference-agent --layout LAYOUT_PATH --rank R
    --cuda-ipc PATH`): writes this engine's CUDA `tensors` as CUDA IPC
    handles (PATH, schema wsync.cuda_ipc/v1) and its layout (LAYOUT_PATH,
    wsync.inference/v1, the entry InferenceAgent would register). The agent
    opens the handles in its own process and trainers write the tensors in
    place. Keep the tensors alive, and do not move them, while it runs;
    StoreVersions reads which version they hold."""
    entry, regions, by_region = _rank_entry(tensors, rank, instance, layout, scale_suffix, host)
    out = ipc_regions(by_region, f"wsync.export_cuda_ipc rank {rank}")  # refuses before anything is written
    write_atomic(layout_path, {"schema": "wsync.inference/v1", "ranks": [entry]})
    write_ipc_file(path, out)


class StoreVersions:
    """The version words of a sidecar's weight store (`wsync inference-agent`,
    shared memory /wsync-JOB-infer-RANK unless --shm-name): which version
    the weights hold. Layout: inference_agent/weight_store_format.h."""

    _MAGIC = 0x31574E4943595357
    _NONE = (1 << 64) - 1

    def __init__(self, shm_name):
        import mmap
        path = "/dev/shm/" + shm_name.lstrip("/")
        # Writable where allowed: update() asks through the store's header.
        try:
            with open(path, "r+b") as f:
                self._map = mmap.mmap(f.fileno(), 4096)
        except PermissionError:
            with open(path, "rb") as f:
                self._map = mmap.mmap(f.fileno(), 4096, prot=mmap.PROT_READ)
        if self._word(0) != self._MAGIC:
            raise ValueError(f"wsync.StoreVersions: '{shm_name}' is not a complete wsync weight store")

    def _word(self, at):
        return int.from_bytes(self._map[at:at + 8], "little")

    @property
    def complete_version(self):
        """The latest version whose every write landed (0: none yet)."""
        v = self._word(128)
        return 0 if v == self._NONE else v

    def update(self, version=None, timeout=None):
        """Engine-paced (`wsync inference-agent --paced`): asks the agent to
        bring the weights to `version` (None: the newest pushed; with
        --shadow, the newest complete) and returns the version they hold
        once it answered; they stay so until the next update(). As
        InferenceAgent.update: VersionError when the version failed,
        TimeoutError when none came within `timeout` s. Layout of the words:
        inference_agent/weight_store_format.h."""
        if version is not None and int(version) < 1:
            raise ValueError(f"wsync.StoreVersions.update(version={version}): versions start at 1")
        seq = max(self._word(192), self._word(256)) + 1
        self._map[200:208] = int(version or 0).to_bytes(8, "little")
        wait_ms = 0 if timeout is None else max(1, int(float(timeout) * 1000))
        self._map[208:216] = wait_ms.to_bytes(8, "little")
        self._map[192:200] = seq.to_bytes(8, "little")  # last: the agent reads the ask once this moves
        # The agent answers by its own deadline; a dead agent is noticed here.
        give_up = None if timeout is None else time.monotonic() + float(timeout) + 30.0
        while self._word(256) != seq:
            if give_up is not None and time.monotonic() > give_up:
                raise TimeoutError(f"wsync.StoreVersions.update(): the agent did not answer within {timeout} s "
                                   f"(is `wsync inference-agent --paced` running?)")
            time.sleep(0.0005)
        code, held = self._word(272), self._word(264)
        if code == 0:
            return held
        message = bytes(self._map[280:792]).split(b"\0", 1)[0].decode(errors="replace")
        if code == 2:
            raise TimeoutError(message)
        raise VersionError(message)

    @property
    def failed_version(self):
        v = self._word(144)
        return 0 if v == self._NONE else v

    @property
    def committing_version(self):
        """The version the agent copies in from its shadow (--shadow, or host
        staging of GPU weights); 0 when none. failed_version equals it
        meanwhile: the weights are a mix until it is complete."""
        v = self._word(160)
        return 0 if v == self._NONE else v

    def wait_version(self, version, timeout=None):
        """Returns once `version` is complete; VersionError if it failed
        first, TimeoutError after `timeout` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.complete_version < version:
            # failed first: the committing word is stored before it
            if self.failed_version >= version and self.committing_version != version:
                raise VersionError(f"version {version} failed (the weights may be a mix of versions)")
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"version {version} not complete after {timeout} s "
                                   f"(complete: {self.complete_version})")
            time.sleep(0.0005)
