"""CUDA tensors handed to a sidecar process by CUDA IPC handles, in a
wsync.cuda_ipc/v1 file (cuda_ipc/ipc_file.h): an engine's weights
(export_cuda_ipc) and a trainer's shards (export_shards on a GPU)."""

import json
import os

import torch

SCHEMA = "wsync.cuda_ipc/v1"


def ipc_regions(tensors, who):
    """One region per (id, tensor): the handle of the tensor's allocation,
    its offset in it, its size and its GPU's PCI bus id. `who` names the
    exporter in errors. The tensors must be contiguous CUDA tensors: the
    sidecar reads or writes their bytes where they are."""
    out = []
    for name, t in tensors.items():
        if t.device.type != "cuda":
            raise ValueError(f"{who}: tensor '{name}' is on {t.device}, not a CUDA device")
        if not t.is_contiguous():
            raise ValueError(f"{who}: tensor '{name}' is not contiguous; the sidecar reads its bytes in place")
        device, handle, _, storage_offset, *_ = t.untyped_storage()._share_cuda_()
        out.append({"id": name, "device": int(device), "pci_bus_id": pci_bus_id(int(device)),
                    "handle": ipc_mem_handle(bytes(handle), name, who).hex(),
                    "offset": int(storage_offset) + t.storage_offset() * t.element_size(),
                    "bytes": t.numel() * t.element_size()})
    return out


def ipc_mem_handle(handle, name, who):
    """The cudaIpcMemHandle_t (64 bytes) in what torch's _share_cuda_()
    returns: the handle itself, or (torch 2.5 and later) a version byte, a
    type byte ('c': cudaMalloc'd) and the handle."""
    if len(handle) == 64:
        return handle
    if len(handle) == 66 and handle[1:2] == b"c":
        return handle[2:]
    kind = "expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)" \
        if len(handle) > 1 and handle[1:2] == b"e" else f"a {len(handle)}-byte handle of an unknown kind"
    raise ValueError(f"{who}: tensor '{name}' lives in {kind}, which has no cudaIpcMemHandle; "
                     f"allocate these tensors without it")


def pci_bus_id(device):
    """'0000:xx:yy.0' of CUDA device `device` as this process numbers it:
    the sidecar may see other devices, numbered otherwise."""
    p = torch.cuda.get_device_properties(device)
    try:
        return f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
    except AttributeError:  # an older torch: the sidecar takes the ordinal as it is
        return ""


def write_atomic(path, doc):
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


def write_ipc_file(path, regions):
    """`regions` from ipc_regions."""
    write_atomic(path, {"schema": SCHEMA, "pid": os.getpid(), "regions": regions})
