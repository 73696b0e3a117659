"""FSDP2 setups of the small test models, for torchrun jobs on CPU with Gloo.

    torchrun --standalone --nproc-per-node 4 python/tests/fsdp_setup.py

runs the self-check in `main()`: 3 AdamW steps on the dense Llama
(FSDP over 4) and on the Qwen3-MoE (dense params FSDP over 4, experts
FSDP 2 x EP 2), checking on every rank that the weights changed, that the
expert gradients equal a plain model's, and that the sharded model's greedy
tokens equal those of a plain model loaded with full_state().

Layouts (what wsync's trainer agent reads from the DTensors):

- dense params: mesh ("dp_shard",) of all ranks, placements (Shard(0),).
- experts (mlp.experts.gate_up_proj [E, 2I, H], mlp.experts.down_proj
  [E, H, I]): mesh ("fsdp", "ep") of shape (world/ep, ep), rank =
  f * ep + e (EP innermost, torchtitan's order), placements
  (Shard(1), Shard(0)): EP splits the experts, FSDP the next dim.

Found on torch 2.15 (CPU, Gloo):
- fully_shard accepts params that are DTensors on mesh["ep"] with
  mesh=mesh["fsdp"] (both children of one init_device_mesh) and makes them
  DTensors on the 2-D ("fsdp", "ep") mesh. With shard_placement_fn Shard(1)
  the placements are (Shard(dim=1), Shard(dim=0)); with the default
  (Shard(0) on both) they are (_StridedShard(dim=0, sf=2), Shard(dim=0)),
  and rank (f=0, e=1) then holds expert 2, not 1.
- During forward FSDP's unsharded param is a DTensor (Shard(0),) on ("ep",).
- set_gradient_divide_factor alone fails on Gloo (ReduceOp.PREMUL_SUM);
  set_force_sum_reduction_for_comms(True) fixes it.
- FSDP modules: the root, each decoder layer, and each layer's mlp.experts.
"""

import os
import sys
import time
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Partial, Shard, distribute_tensor

# Greedy decoding prompts: fixed token ids (vocab 512), distinct lengths.
PROMPTS = [[1, 17, 42, 99, 250], [3, 500, 7], [12, 12, 12, 12, 301, 64, 5, 88]]

BATCH, SEQ = 2, 32  # training batch per rank
VOCAB = 512
# AdamW moves each weight by about lr per step. The params are bf16: near
# 1.0 (norm weights) one ulp is 2**-7, so lr 1e-3 rounds back to the old
# value and the norms never change; 1e-2 changes every tensor every step.
LR = 1e-2


# ---------------------------------------------------------------- sharding --


def shard_dense(model, world_mesh_1d, **fsdp_kwargs):
    """FSDP2 over a 1-D mesh ("dp_shard",): one FSDP unit per decoder layer
    plus the root (embed_tokens, final norm, lm_head). `fsdp_kwargs` go to
    every fully_shard (e.g. offload_policy=CPUOffloadPolicy())."""
    assert world_mesh_1d.mesh_dim_names == ("dp_shard",), world_mesh_1d.mesh_dim_names
    for layer in model.model.layers:
        fully_shard(layer, mesh=world_mesh_1d, **fsdp_kwargs)
    fully_shard(model, mesh=world_mesh_1d, **fsdp_kwargs)
    return model


def _gather_ep(param):
    """The full stacked expert tensor from its EP shards, differentiably.

    After FSDP's all-gather over "fsdp" the param is a DTensor Shard(0) on
    the "ep" mesh. grad_placements=[Partial()] declares this rank's gradient
    of the full tensor a partial sum, so backward reduce-scatters it over
    "ep": each EP shard gets the sum of every EP rank's contribution (the
    default, Replicate, would keep only the local one, silently dropping the
    other EP ranks' tokens).
    """
    if isinstance(param, DTensor):
        return param.full_tensor(grad_placements=[Partial()])
    return param


def _ep_experts_forward(experts, hidden_states, top_k_index, top_k_weights):
    """Qwen3MoeExperts' own eager forward on the gathered expert weights.

    Real EP would dispatch tokens to the ranks holding their experts; here
    every rank computes all experts on its own tokens (exactly the plain
    model's arithmetic), so only the stored layout is EP.
    """
    eager_forward = type(experts).forward.__wrapped__  # under HF's dispatch wrapper
    full = SimpleNamespace(
        num_experts=experts.num_experts,
        act_fn=experts.act_fn,
        gate_up_proj=_gather_ep(experts.gate_up_proj),
        down_proj=_gather_ep(experts.down_proj),
    )
    return eager_forward(full, hidden_states, top_k_index, top_k_weights)


def shard_moe_with_ep(model, ep=2, expert_fsdp_dim=1):
    """Experts FSDP x EP, everything else FSDP over all ranks.

    expert_fsdp_dim: the tensor dim FSDP shards the experts on. 1 gives
    placements (Shard(1), Shard(0)); 0 (FSDP's default) shards the dim EP
    already shards, which FSDP2 writes as (_StridedShard(0, sf=ep), Shard(0)).

    Returns (dense_mesh, expert_mesh): ("dp_shard",) of world ranks and
    ("fsdp", "ep") of shape (world/ep, ep), both from one init_device_mesh.

    Gradients: dense params get FSDP's mean over all ranks. Expert params:
    the EP reduce-scatter (see _gather_ep) sums over the ep ranks, FSDP's
    reduce-scatter over "fsdp" sums over the fsdp ranks and divides by the
    divide factor, set to world: the same mean over all ranks.
    """
    world = dist.get_world_size()
    assert world % ep == 0, (world, ep)
    mesh = init_device_mesh("cpu", (world // ep, ep), mesh_dim_names=("fsdp", "ep"))
    # All ranks, in rank order, as a child of the same root mesh (DeviceMesh
    # has no public flatten on torch 2.15; _flatten is what torchtitan uses).
    dense_mesh = mesh["fsdp", "ep"]._flatten("dp_shard")

    for layer in model.model.layers:
        experts = layer.mlp.experts
        assert type(experts).__name__ == "Qwen3MoeExperts", type(experts)
        assert hasattr(type(experts).forward, "__wrapped__"), "HF's experts dispatch changed"
        for name in ("gate_up_proj", "down_proj"):
            full = getattr(experts, name)
            assert full.shape[0] % ep == 0, (name, full.shape)
            # Every rank holds the same seeded init, so the scatter from the
            # EP group's first rank gives each rank its own experts.
            dt = distribute_tensor(full.detach(), mesh["ep"], [Shard(0)])
            experts.register_parameter(name, torch.nn.Parameter(dt))
        experts.forward = _ep_experts_forward.__get__(experts)
        fully_shard(experts, mesh=mesh["fsdp"], shard_placement_fn=lambda p: Shard(expert_fsdp_dim))
        experts.set_gradient_divide_factor(float(world))
        # A custom factor makes FSDP reduce with ReduceOp.PREMUL_SUM, which
        # Gloo lacks ("Cannot use ReduceOp.PREMUL_SUM with Gloo"); SUM plus
        # a separate scaling works on every backend.
        experts.set_force_sum_reduction_for_comms(True)
        fully_shard(layer, mesh=dense_mesh)
    fully_shard(model, mesh=dense_mesh)
    return dense_mesh, mesh


# ------------------------------------------------------------- train/infer --


def batch(step, rank, batch=BATCH, seq=SEQ, vocab=VOCAB):
    """The random token batch of (step, rank): differs per rank and step."""
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randint(0, vocab, (batch, seq), generator=gen)


def make_optimizer(model, lr=LR):
    """AdamW over the model's (sharded) params."""
    return torch.optim.AdamW(model.parameters(), lr=lr)


def train_step(model, optimizer, step, rank):
    """One AdamW step on batch(step, rank); returns the local loss (float)."""
    model.train()
    ids = batch(step, rank)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model.eval()
    return float(loss.detach())


@torch.no_grad()
def greedy_tokens(model, prompts=PROMPTS, n=16):
    """n greedy tokens after each prompt: list of lists of ints.

    Full recompute per token (no KV cache, no padding), one prompt at a
    time. On an FSDP2 model every rank must call it (collectives per
    forward); every rank decodes the same tokens, so the forward counts
    match.
    """
    model.eval()
    out = []
    for prompt in prompts:
        ids = torch.tensor([prompt], dtype=torch.long, device=next(model.parameters()).device)
        new = []
        for _ in range(n):
            logits = model(input_ids=ids, use_cache=False).logits
            nxt = int(logits[0, -1].argmax())
            new.append(nxt)
            ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
        out.append(new)
    return out


@torch.no_grad()
def full_logits(model, prompts=PROMPTS):
    """Last-position logits per prompt (float32 copies), for exact comparisons."""
    model.eval()
    return [model(input_ids=torch.tensor([p]), use_cache=False).logits[0, -1].float() for p in prompts]


def full_state(model):
    """{name: full tensor} of every parameter and persistent buffer, on every
    rank (DTensor params are all-gathered: collective)."""
    out = {}
    for name, p in model.named_parameters():
        t = p.detach()
        out[name] = t.full_tensor() if isinstance(t, DTensor) else t.clone()
    persistent = set(model.state_dict().keys())
    for name, b in model.named_buffers():
        if name in persistent:
            b = b.detach()
            out[name] = b.full_tensor() if isinstance(b, DTensor) else b.clone()
    return out


def leave_job():
    """Ends a torchrun job's process: every rank meets at a barrier (no rank
    tears its Gloo pairs down while another still talks on them), destroys
    the process group and leaves without Python's finalization, since
    torch's ProcessGroupGloo worker thread can still drop a tensor's last
    reference then and abort the process ("terminate called without an
    active exception" from PyEval_AcquireThread in ProcessGroupGloo::runLoop,
    seen on torch 2.15)."""
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def plain_copy(builder, state):
    """A fresh unsharded model from `builder` (torch_models) loaded with state."""
    _, plain = builder()
    plain.load_state_dict(state, strict=True)
    return plain


def describe_params(model):
    """[(name, mesh dim names, placements, local shape, global shape)]."""
    rows = []
    for name, p in model.named_parameters():
        if isinstance(p, DTensor):
            rows.append((name, p.device_mesh.mesh_dim_names, tuple(p.placements),
                         tuple(p.to_local().shape), tuple(p.shape)))
        else:
            rows.append((name, None, None, tuple(p.shape), tuple(p.shape)))
    return rows


# -------------------------------------------------------------- self-check --


def _log(rank, *args):
    print(f"[rank {rank}]", *args, flush=True)


def _check_expert_grads(model, builder, rank, world):
    """Backward once on batch(99, rank); compare every gradient with a plain
    model's gradient of the mean loss over all ranks' batches."""
    model.train()
    ids = batch(99, rank)
    model(input_ids=ids, labels=ids).loss.backward()
    got = {n: p.grad.full_tensor().float() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)

    plain = plain_copy(builder, full_state(model))
    plain.train()
    for r in range(world):
        ids = batch(99, r)
        (plain(input_ids=ids, labels=ids).loss / world).backward()
    worst = 0.0
    for n, p in plain.named_parameters():
        ref = p.grad.float()
        err = float((got[n] - ref).norm() / ref.norm().clamp_min(1e-30))
        worst = max(worst, err)
        assert err < 2e-2, f"gradient of {n}: relative error {err:.3g}"
    model.eval()
    return worst


def _check(name, builder, shard, rank, world):
    torch.manual_seed(0)
    _, model = builder()
    meshes = shard(model)
    if rank == 0:
        for row in describe_params(model):
            if row[0].startswith("model.layers.0.") or "layers" not in row[0]:
                _log(rank, name, *row)
        _log(rank, name, "FSDP modules:",
             [n or "<root>" for n, m in model.named_modules() if "FSDP" in type(m).__name__])
    optimizer = make_optimizer(model)
    before = full_state(model)

    if "moe" in name:
        worst = _check_expert_grads(model, builder, rank, world)
        _log(rank, name, f"grads match a plain model (worst relative error {worst:.2e})")

    for step in range(3):
        t0 = time.perf_counter()
        loss = train_step(model, optimizer, step, rank)
        dt = time.perf_counter() - t0
        after = full_state(model)
        same = [n for n in before if torch.equal(before[n], after[n])]
        assert not same, f"step {step} left unchanged: {same}"
        before = after
        if rank == 0:
            _log(rank, name, f"step {step} loss {loss:.4f} {dt:.3f}s, all {len(after)} tensors changed")

    t0 = time.perf_counter()
    sharded_tokens = greedy_tokens(model)
    t_sharded = time.perf_counter() - t0
    sharded_logits = full_logits(model)
    plain = plain_copy(builder, after)
    t0 = time.perf_counter()
    plain_tokens = greedy_tokens(plain)
    t_plain = time.perf_counter() - t0
    plain_logits = full_logits(plain)
    assert sharded_tokens == plain_tokens, (sharded_tokens, plain_tokens)
    for a, b in zip(sharded_logits, plain_logits):
        assert torch.equal(a, b), float((a - b).abs().max())
    # every rank decodes the same tokens (same weights, same prompts)
    gathered = [None] * world
    dist.all_gather_object(gathered, sharded_tokens)
    assert all(g == sharded_tokens for g in gathered)
    if rank == 0:
        _log(rank, name, f"greedy tokens and logits equal "
             f"(sharded {t_sharded:.2f}s, plain {t_plain:.2f}s): {sharded_tokens[0]}")


def main():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch_models

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dense_mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",))
    _check("llama", torch_models.small_llama, lambda m: shard_dense(m, dense_mesh), rank, world)
    _check("qwen3_moe", torch_models.small_qwen3_moe, lambda m: shard_moe_with_ep(m, ep=2),
           rank, world)
    dist.barrier()
    if rank == 0:
        _log(rank, "OK")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
