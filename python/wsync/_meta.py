"""What a trainer rank holds, read from the model's own DTensors.

Builds the wsync.trainer/v1 entry of this rank (docs/SCHEMA.md) and the
MeshGroups from the meshes the parameters live on. Called by TrainerAgent
and export_shards on every rank of the job; it is collective (one
all_gather_object), because the MeshGroups must be the same list on every
rank while a rank only sees its own meshes (pipeline stages).

Rules:
- A DTensor parameter keeps its mesh, placements and local box. The mesh dims
  FSDP2 manages are gathered (full_tensor over them); the others (EP, TP)
  stay sharded and the planner picks writers among the holders.
- FSDP2 shards a dim that TP/EP already shards as _StridedShard: its pieces
  are taken after the later mesh dims' pieces. wsync's schema applies mesh
  dims in order, so such a mesh is described with its dims reordered.
- Plain tensors (unsharded params, persistent buffers) are Replicate() over
  the ranks that hold them.
- Every local box is checked against DTensor's own answer
  (compute_local_shape_and_global_offset); a layout wsync would describe
  differently raises, naming the tensor.
"""

import os
import socket

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate, Shard

try:
    from torch.distributed.tensor.placement_types import _StridedShard
except ImportError:  # older torch
    _StridedShard = None

_DTYPES = {
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float32: "fp32",
    torch.float8_e4m3fn: "fp8_e4m3",
}


def dtype_name(dtype, what):
    if dtype not in _DTYPES:
        raise TypeError(f"wsync: {what}: dtype {dtype} is not one wsync moves (bf16, fp16, fp32, fp8_e4m3)")
    return _DTYPES[dtype]


def _chunk(n, count, index):
    size = -(-n // count) if count else n
    begin = min(n, size * index)
    return begin, min(n, size * (index + 1)) - begin


def _is_strided(p):
    return _StridedShard is not None and isinstance(p, _StridedShard)


def _mesh_order(name, placements, mesh_shape):
    """Mesh dims in the order wsync applies them: a _StridedShard dim moves
    after the later dims that shard the same tensor dim (whose sizes
    multiply to its split factor)."""
    order = list(range(len(placements)))
    for i, p in enumerate(placements):
        if not _is_strided(p):
            continue
        later = [j for j in range(i + 1, len(placements))
                 if isinstance(placements[j], Shard) and placements[j].dim == p.dim]
        factor = 1
        for j in later:
            factor *= mesh_shape[j]
        if not later or factor != p.split_factor:
            raise ValueError(f"wsync: tensor '{name}': {p} on mesh dim {i} is not FSDP2's sharding of a dim "
                             f"sharded further by later mesh dims (split factor {p.split_factor}, later "
                             f"Shard({p.dim}) sizes multiply to {factor})")
        order.remove(i)
        order.insert(order.index(max(later)) + 1, i)
    return order


def _placement_text(p, name):
    if isinstance(p, Replicate):
        return "Replicate()"
    if isinstance(p, Shard) or _is_strided(p):
        return f"Shard({p.dim})"
    raise ValueError(f"wsync: tensor '{name}': placement {p} cannot be sent (only Shard and Replicate; "
                     f"a Partial tensor must be reduced first)")


def _local_box(global_shape, mesh_shape, coord, placements):
    """torch.chunk in mesh-dim order: what the schema (and the validator) say."""
    offset = [0] * len(global_shape)
    size = list(global_shape)
    for m, p in enumerate(placements):
        if p == "Replicate()":
            continue
        d = int(p[6:-1])
        begin, n = _chunk(size[d], mesh_shape[m], coord[m])
        offset[d] += begin
        size[d] = n
    return size, offset


def _fsdp_dims(model):
    """id(param) -> names of the mesh dims FSDP2 manages for it."""
    dims = {}
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return dims
    for module in model.modules():
        if not isinstance(module, FSDPModule):
            continue
        group = getattr(module._get_fsdp_state(), "_fsdp_param_group", None)
        for fp in getattr(group, "fsdp_params", []) if group is not None else []:
            names = fp.mesh_info.mesh.mesh_dim_names
            if names:
                dims[id(fp.sharded_param)] = set(names)
    return dims


def _persistent_buffers(model):
    keys = set(model.state_dict().keys())
    return [(n, b) for n, b in model.named_buffers() if n in keys and b is not None]


def describe(model, keep_sharded=(), host=None, gpu=None, nic=0):
    """This rank's wsync.trainer/v1 entry plus the MeshGroups, and the local
    tensors in param order: returns (rank_entry, mesh_groups, local_tensors)
    where local_tensors maps name -> the tensor whose bytes are the shard."""
    rank, world = dist.get_rank(), dist.get_world_size()
    fsdp_dims = _fsdp_dims(model)
    meshes = {}    # key -> mesh description (this rank)
    params = []    # (entry without mesh id, mesh key)
    local = {}
    seen = set()
    items = [(n, p, True) for n, p in model.named_parameters()] + \
            [(n, b, False) for n, b in _persistent_buffers(model)]
    for name, t, is_param in items:
        if id(t) in seen:
            continue  # tied: sent once under its first name
        seen.add(id(t))
        dtype = dtype_name(t.dtype, f"tensor '{name}'")
        if isinstance(t, DTensor):
            mesh = t.device_mesh
            names = list(mesh.mesh_dim_names or [f"dim{i}" for i in range(mesh.ndim)])
            shape = list(mesh.shape)
            coord = list(mesh.get_coordinate())
            placements = list(t.placements)
            order = _mesh_order(name, placements, shape)
            names = [names[i] for i in order]
            shape = [shape[i] for i in order]
            coord = [coord[i] for i in order]
            texts = [_placement_text(placements[i], name) for i in order]
            ranks = mesh.mesh.permute(*order).flatten().tolist()
            managed = fsdp_dims.get(id(t))
            if managed is None:
                gather = [n for n in names if n not in keep_sharded]
            else:
                gather = [n for n in names if n in managed and n not in keep_sharded]
            key = (tuple(names), tuple(shape), tuple(ranks))
            local_tensor = t.to_local()
            size, offset = _local_box(list(t.shape), shape, coord, texts)
            from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
            want_size, want_offset = compute_local_shape_and_global_offset(t.shape, mesh, t.placements)
            if list(want_size) != size or list(local_tensor.shape) != size or \
                    any(s > 0 and o != w for s, o, w in zip(size, offset, want_offset)):
                raise ValueError(f"wsync: tensor '{name}': DTensor holds {list(want_size)} at {list(want_offset)} "
                                 f"on rank {rank}, wsync's reading of {texts} on mesh {names} gives {size} at "
                                 f"{offset}: this sharding cannot be described yet")
        else:
            names, shape, coord, texts, gather = ["replica"], None, None, ["Replicate()"], ["replica"]
            key = ("replica", name)  # its holders are known only after the exchange below
            local_tensor = t.detach()
            size, offset = list(t.shape), [0] * t.dim()
            ranks = None
        if local_tensor.device.type not in ("cpu", "cuda"):
            raise NotImplementedError(
                f"wsync: tensor '{name}' lives on {local_tensor.device}; wsync reads host and CUDA memory only")
        meshes.setdefault(key, {"names": names, "shape": shape, "coord": coord, "ranks": ranks,
                                "gather": gather, "first": len(meshes)})
        params.append(({"name": name, "global_shape": list(t.shape), "dtype": dtype, "placements": texts,
                        "local_shape": size, "local_offset": offset}, key))
        local[name] = local_tensor

    # Every rank's meshes, so the MeshGroups are one list everywhere.
    mine = {"rank": rank, "meshes": [(k, m) for k, m in meshes.items() if k[0] != "replica"],
            "replicas": [k[1] for k in meshes if k[0] == "replica"]}
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    holders = {}
    for r in everyone:
        for n in r["replicas"]:
            holders.setdefault(n, []).append(r["rank"])
    catalog = {}  # key -> (min rank, first index, names, shape, ranks, gather)
    for r in everyone:
        for k, m in r["meshes"]:
            k = tuple(tuple(x) if isinstance(x, list) else x for x in k)
            catalog.setdefault(k, (min(m["ranks"]), m["first"], m["names"], m["shape"], m["ranks"], m["gather"]))
    for n, hs in holders.items():
        k = ("replica", tuple(hs))
        catalog.setdefault(k, (min(hs), 1 << 30, ["replica"], [len(hs)], hs, ["replica"]))
    ordered = sorted(catalog.items(), key=lambda kv: (kv[1][0], kv[1][1], kv[1][2], kv[1][4]))
    ids, used = {}, {}
    for k, (_, _, names, _, _, _) in ordered:
        base = "replicated" if k[0] == "replica" else ",".join(names)
        used[base] = used.get(base, 0) + 1
        ids[k] = base if used[base] == 1 else f"{base}@{used[base] - 1}"
    mesh_groups = [{"name": ids[k], "mesh": ids[k], "gather_dims": v[5]} for k, v in ordered]

    entry_meshes, entry_params = {}, []
    for p, key in params:
        if key[0] == "replica":
            hs = tuple(holders[key[1]])
            gkey = ("replica", hs)
            mesh = {"mesh": ids[gkey], "shape": [len(hs)], "dim_names": ["replica"], "coord": [hs.index(rank)]}
        else:
            gkey = key
            m = meshes[key]
            mesh = {"mesh": ids[gkey], "shape": m["shape"], "dim_names": m["names"], "coord": m["coord"]}
        entry_meshes[mesh["mesh"]] = mesh
        entry_params.append(dict(p, mesh=ids[gkey], mesh_group=ids[gkey]))
    entry = {"rank": rank, "host": host or socket.gethostname(),
             "gpu": int(os.environ.get("LOCAL_RANK", 0)) if gpu is None else gpu, "nic": nic,
             "meshes": list(entry_meshes.values()), "params": entry_params}
    group_ranks = [(ids[k], v[4]) for k, v in ordered]
    return entry, mesh_groups, local, group_ranks, ordered


def process_group_rank_sets(ordered):
    """The rank sets the executor may ask for: every mesh whole, and every
    slice along each of its dims, in one order every rank computes alike."""
    sets = []
    for _, (_, _, names, shape, ranks, _) in ordered:
        grid = torch.tensor(ranks).reshape(shape)
        candidates = [sorted(ranks)]
        for d in range(len(shape)):
            moved = grid.movedim(d, -1).reshape(-1, shape[d])
            candidates += [sorted(row.tolist()) for row in moved]
        for c in candidates:
            if c not in sets:
                sets.append(c)
    return sets
