"""wsync: after each optimizer step, every trainer rank writes the weight
slices it owns straight into inference memory (one-sided RDMA writes over
libfabric), following a routing table a controller computed once.

    sync = wsync.TrainerAgent(model, controller="host:port", job="run1")
    h = sync.push(step); h.wait_reads_done(); report = h.wait()

    agent = wsync.InferenceAgent(dict(model.state_dict()), controller=..., job="run1", rank=r)
    agent.wait_version(step)

See docs/PYTHON.md.
"""

import os

# Before _C loads libfabric: Debian's and Ubuntu's link libinfinipath, whose
# constructor would otherwise take SIGINT and SIGTERM and answer them with
# exit() from inside a signal handler (no KeyboardInterrupt, atexit handlers
# run under live threads: transport/libfabric/foreign_signals.h).
os.environ.setdefault("IPATH_NO_BACKTRACE", "1")

from ._inference import ChecksumError, InferenceAgent, StoreVersions, VersionError, export_cuda_ipc
from ._trainer import Push, PushError, ShardExporter, TrainerAgent, export_shards

__all__ = ["TrainerAgent", "Push", "PushError", "InferenceAgent", "VersionError", "ChecksumError", "export_shards", "ShardExporter",
           "export_cuda_ipc", "StoreVersions"]
