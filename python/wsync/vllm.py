"""wsync as a vLLM weight-transfer backend named "wsync" (docs/VLLM.md).

Worker side, `WsyncWeightTransferEngine`: vLLM creates it in every worker
of an engine started with `weight_transfer_config={"backend": "wsync"}`
(`vllm serve --weight-transfer-config '{"backend": "wsync"}'`); the
package's `vllm.general_plugins` entry point registers it, nothing in vLLM
is changed.

- `init_transfer_engine({"controller": "HOST:PORT", "job": ..., [secret_file,
  provider, timeout_s]})` registers the worker as an engine-paced inference
  rank. Its layout is read off the model vLLM built (names, shapes, dtypes,
  each rank's TP piece) and the name mapping from the model's own
  `packed_modules_mapping` (fused qkv_proj, gate_up_proj) and, for
  fused-MoE layers, their own declaration of the fused expert layout
  (transformers 5's stacked experts.gate_up_proj / down_proj): the
  controller, started without --mapping, plans with it.
- `update_weights({"version": v})` returns once every write of v landed
  here and the model computes from it; a failed version raises with the
  controller's recorded cause.

Two ways weights land, chosen per layer by what vLLM computes from (the log
names them):
- in place: the parameter vLLM computes from is the loading-format tensor
  (norms; linear layers whose weight vLLM uses as loaded). Trainers write
  into it, nothing is copied. Writes happen only inside update_weights
  (engine-paced, "live"), between vLLM's steps.
- processed: vLLM derives its runtime tensors after loading (the CPU
  backend's oneDNN repack, quantized kernels' reorders). Writes land in
  loading-format buffers registered in the layer's place; update_weights
  then rebuilds the layer in loading format from them, runs the layer's own
  quant method (`process_weights_after_loading`) and copies the result into
  the tensors the engine computes from (their storage is kept, as vLLM's
  layerwise reload keeps it). The buffers are extra memory, logged at init.

Trainer side, `WsyncTrainerWeightTransferEngine`: vLLM's trainer engine API
over wsync.TrainerAgent, for frameworks that already drive vLLM's
handshake through a `VLLMWeightSyncClient`.
"""

import dataclasses
import json
import sys
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from vllm.distributed.weight_transfer.base import (
    ModuleSource,
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.model_executor.model_loader.reload.layerwise import get_layerwise_info
from vllm.model_executor.model_loader.reload.meta import materialize_layer, restore_layer_on_meta
from vllm.platforms import current_platform

from ._inference import InferenceAgent, VersionError
from ._meta import dtype_name



def _say(line):
    """One line on stderr, as wsync's C++ side writes its own."""
    print(f"wsync {line}", file=sys.stderr, flush=True)


IN_PLACE = "in place"
PROCESSED = "processed"


@dataclass
class WsyncInitInfo(WeightTransferInitInfo):
    controller: str
    job: str
    secret_file: str | None = None
    provider: str = "shm"
    timeout_s: float = 300.0
    delta: bool = False  # InferenceAgent(delta=True): take delta versions (docs/DELTAS.md)


@dataclass
class WsyncUpdateInfo(WeightTransferUpdateInfo):
    version: int


def _typed(cls, given, what):
    """cls(**given), with one ValueError naming an unknown or missing key."""
    if not isinstance(given, dict):
        raise ValueError(f"wsync vLLM backend: {what} must be a dict, not {type(given).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(given) - set(fields))
    if unknown:
        raise ValueError(f"wsync vLLM backend: {what} key {unknown[0]!r} is unknown; "
                         f"expected {', '.join(sorted(fields))}")
    missing = [n for n, f in fields.items()
               if n not in given and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ValueError(f"wsync vLLM backend: {what} lacks key {missing[0]!r}")
    return cls(**given)


# ------------------------------------------------------------------ layout --

@dataclass
class EngineTensor:
    """One tensor of the engine as wsync registers it."""
    name: str                 # vLLM's parameter name
    module: str               # its module's name
    param: str                # its name on the module
    path: str                 # IN_PLACE or PROCESSED
    tensor: torch.Tensor      # where the writes land
    tp: dict | None           # {"dim", "rank", "size"} or None (replicated)


def _tp_of(module, meta, name):
    """The TP piece this rank holds of `meta` (a loading-format parameter of
    `module`), as the layout's {"dim", "rank", "size"}, or None."""
    from vllm.model_executor.layers.linear import ColumnParallelLinear, ReplicatedLinear, RowParallelLinear
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    size = int(getattr(module, "tp_size", 1) or 1)
    rank = int(getattr(module, "tp_rank", 0) or 0)
    if isinstance(module, VocabParallelEmbedding):
        if module.num_embeddings_padded != module.org_vocab_size or module.num_added_embeddings:
            raise ValueError(f"wsync vLLM backend cannot map '{name}': vocabulary {module.org_vocab_size} is padded "
                             f"to {module.num_embeddings_padded} rows (wsync writes whole TP pieces; a vocabulary "
                             f"divisible by 64 x TP is not padded)")
        if size == 1:
            return None
        dim = getattr(meta, "output_dim", 0)
    elif isinstance(module, RowParallelLinear):
        dim = getattr(meta, "input_dim", None)
    elif isinstance(module, ColumnParallelLinear):
        dim = getattr(meta, "output_dim", None)
    elif isinstance(module, ReplicatedLinear):
        return None
    else:
        if getattr(meta, "output_dim", None) is not None or getattr(meta, "input_dim", None) is not None:
            raise ValueError(f"wsync vLLM backend cannot map '{name}': {type(module).__name__} shards it over TP "
                             f"in a way wsync does not know")
        return None
    if dim is None or size == 1:
        return None
    return {"dim": int(dim), "rank": rank, "size": size}


def _computes_from_loading_format(module, quant_method, loading):
    """Whether vLLM computes `module` from its loading-format parameters as
    they are (then trainers may write them in place)."""
    kind = type(quant_method).__name__
    current = dict(module.named_parameters(recurse=False))
    same = set(current) == set(loading) and all(
        tuple(current[n].shape) == tuple(loading[n].shape) and current[n].dtype == loading[n].dtype for n in loading)
    if kind == "UnquantizedLinearMethod":
        # On CPU every repacked GEMM drops `weight` (remove_weight=True);
        # one that kept it computes with torch's linear from it.
        return same
    if kind == "UnquantizedEmbeddingMethod":
        # The lookup reads `weight`; on CPU the logits may come from a
        # packed copy of it (remove_weight=False), so it is reprocessed.
        return same and not current_platform.is_cpu()
    return False


def _packed_parts(model, module_name, module):
    """The trainer-side modules fused into `module` (packed_modules_mapping)."""
    short = module_name.rsplit(".", 1)[-1]
    packed = getattr(model, "packed_modules_mapping", None) or {}
    return packed.get(short)


def _layer_pattern(name):
    """`name` with its layer index replaced by {L} (one rule per layer kind)."""
    parts = name.split(".")
    for i, p in enumerate(parts):
        if p.isdigit() and i > 0 and parts[i - 1] in ("layers", "h", "blocks"):
            parts[i] = "{L}"
            break
    return ".".join(parts)


def describe_model(model):
    """(engine tensors, mapping rules, quantize rules) of the model vLLM built
    on this rank.

    Raises ValueError naming the first layer wsync cannot map."""
    from vllm.model_executor.layers.fused_moe import FusedMoEMethodBase

    mapper = getattr(model, "hf_to_vllm_mapper", None)
    if mapper is not None and any(getattr(mapper, f, None) for f in
                                  ("orig_to_new_substr", "orig_to_new_prefix", "orig_to_new_suffix",
                                   "orig_to_new_regex")):
        raise ValueError(f"wsync vLLM backend cannot map {type(model).__name__}: vLLM renames its checkpoint's "
                         f"tensors (hf_to_vllm_mapper), which wsync's mapping does not follow yet")
    tensors, rules, seen, quantize = [], [], set(), []

    def add_rule(rule):  # one rule per layer kind, however many layers share it
        key = json.dumps(rule, sort_keys=True)
        if key not in seen:
            seen.add(key)
            rules.append(rule)

    for mname, module in model.named_modules():
        own = dict(module.named_parameters(recurse=False))
        if not own:
            continue
        quant_method = getattr(module, "quant_method", None)
        loading = dict(get_layerwise_info(module).restore_metadata[0]) if quant_method is not None else own
        if not loading:
            raise ValueError(f"wsync vLLM backend cannot map layer '{mname}' ({type(module).__name__}): vLLM kept "
                             f"no loading-format metadata for it")
        if isinstance(quant_method, FusedMoEMethodBase):
            for t, rule in _experts(mname, module, loading, own):
                tensors.append(t)
                add_rule(rule)
            continue
        in_place = quant_method is None or _computes_from_loading_format(module, quant_method, loading)
        parts = _packed_parts(model, mname, module)
        scales = _block_scales(mname, module, loading, quantize)
        for pname, meta in loading.items():
            name = f"{mname}.{pname}" if mname else pname
            if in_place:
                t = own[pname]
            else:
                t = torch.empty(tuple(meta.shape), dtype=meta.dtype, device=next(iter(own.values())).device)
            if pname in scales:  # written with its fp8 weight, cut as the weight is
                tensors.append(EngineTensor(name, mname, pname, IN_PLACE if in_place else PROCESSED, t, None))
                continue
            tp = _tp_of(module, meta, name)
            tensors.append(EngineTensor(name, mname, pname, IN_PLACE if in_place else PROCESSED, t, tp))
            if parts:
                add_rule(_concat_rule(module, name, mname, pname, parts, tp))
    return tensors, rules, quantize


def _block_scales(mname, module, loading, quantize):
    """The block-scale parameters of a block-fp8 layer (vLLM's fp8 method:
    `weight` float8_e4m3fn, `weight_scale_inv` fp32, one per block), adding
    the layer's quantize rule to `quantize`. Trainers quantize their bf16
    weights into it as the checkpoint format has it (docs/SCHEMA.md)."""
    fp8 = [p for p, m in loading.items() if m.dtype == torch.float8_e4m3fn]
    if not fp8:
        return set()
    what = f"wsync vLLM backend cannot map layer '{mname}' ({type(module).__name__})"
    block = getattr(module, "weight_block_size", None)
    if block is None:
        raise ValueError(f"{what}: fp8 without block scales (per-tensor 'weight_scale') is not mapped; "
                         f"block fp8 ('weight_block_size') is")
    scales = set()
    for p in fp8:
        scale = loading.get(f"{p}_scale_inv")
        if scale is None:
            raise ValueError(f"{what}: fp8 '{p}' has no '{p}_scale_inv'")
        if scale.dtype != torch.float32:
            raise ValueError(f"{what}: '{p}_scale_inv' is {scale.dtype}; wsync writes fp32 block scales")
        scales.add(f"{p}_scale_inv")
    rule = {"dtype": "fp8_e4m3", "block": [int(b) for b in block], "scale_dtype": "fp32", "scale_suffix": "_scale_inv"}
    if quantize and quantize[0] != rule:
        raise ValueError(f"{what}: fp8 blocks {rule['block']}, where other layers have {quantize[0]['block']}")
    if not quantize:
        quantize.append(rule)
    return scales


def _experts(mname, module, loading, own):
    """(EngineTensor, rule) of each stacked-expert parameter of a fused-MoE
    layer: w13 [E, 2I/tp, H] (gate then up piece of each expert), w2
    [E, H, I/tp]. Their sources are the layer's own fused declaration
    (vLLM's get_expert_mapping(include_fused=True): `experts.gate_up_proj`
    cut in gate and up along dim 1, `experts.down_proj`), which is how a
    transformers 5 model holds its experts. Writes land in loading-format
    buffers: fused-MoE kernels repack their weights after loading."""
    what = f"wsync vLLM backend cannot map layer '{mname}' ({type(module).__name__})"
    config = getattr(module, "moe_config", None)
    parallel = getattr(config, "moe_parallel_config", None)
    if config is None or parallel is None or not hasattr(module, "get_expert_mapping"):
        raise ValueError(f"{what}: a fused-MoE layer without vLLM's moe_config or get_expert_mapping")
    if int(parallel.ep_size) > 1:
        raise ValueError(f"{what}: expert parallelism (ep {parallel.ep_size}) is not mapped yet; serve with "
                         f"tensor parallelism over experts (no --enable-expert-parallel)")
    if int(config.num_experts) != int(config.num_logical_experts):
        raise ValueError(f"{what}: {config.num_experts - config.num_logical_experts} redundant experts (EPLB) are "
                         f"not mapped")
    if getattr(module, "is_fused_checkpoint_transposed", False):
        raise ValueError(f"{what}: its fused checkpoint tensors are transposed ([E, H, 2I]); wsync's mapping does "
                         f"not transpose")
    extra = sorted(set(loading) - {"w13_weight", "w2_weight"})
    if extra:
        raise ValueError(f"{what}: expert parameter '{extra[0]}' is not mapped (only w13_weight and w2_weight)")
    sources = {}  # engine param -> [(chunk, fused source)]
    for param, source, chunk, _shard in module.get_expert_mapping(include_fused=True):
        short = param.rsplit(".", 1)[-1]
        if short in loading and "." not in source.removeprefix("experts."):  # the fused entries
            sources.setdefault(short, []).append((int(chunk), source))
    if set(sources) != set(loading):
        raise ValueError(f"{what}: vLLM declares no fused checkpoint source for "
                         f"{sorted(set(loading) - set(sources))[0]}")
    if ".experts." not in f".{mname}.":
        raise ValueError(f"{what}: its name has no 'experts' module to anchor the checkpoint names on")
    base = f".{mname}".rsplit(".experts.", 1)[0].lstrip(".")  # the MoE block: model.layers.N.mlp
    tp_size, tp_rank = int(parallel.tp_size), int(parallel.tp_rank)
    device = next(iter(own.values())).device
    out = []
    for pname, meta in loading.items():
        name = f"{mname}.{pname}"
        cut = 1 if pname == "w13_weight" else 2  # the intermediate dim
        tp = {"dim": cut, "rank": tp_rank, "size": tp_size} if tp_size > 1 else None
        chunks = sorted(sources[pname])
        parts = []
        for index, source in chunks:
            part = {"source": _layer_pattern(f"{base}.{source}"), "expert_dim": 0}
            if len(chunks) > 1:
                part["chunk"] = {"dim": 1, "index": index, "count": len(chunks)}
            parts.append(part)
        tensor = torch.empty(tuple(meta.shape), dtype=meta.dtype, device=device)
        out.append((EngineTensor(name, mname, pname, PROCESSED, tensor, tp),
                    {"engine": _layer_pattern(name), "stack_experts": {"dim": 0, "parts": parts}}))
    return out


def _concat_rule(module, name, mname, pname, parts, tp):
    """The mapping rule of a fused parameter: its parts, concatenated along
    the dim TP splits (q, k, v; gate, up), k and v cut by KV heads."""
    if tp is not None and tp["dim"] != 0:
        raise ValueError(f"wsync vLLM backend cannot map '{name}': fused along dim {tp['dim']}, expected 0")
    prefix = mname.rsplit(".", 1)[0] + "." if "." in mname else ""
    kv_heads = getattr(module, "total_num_kv_heads", None)
    out = []
    for i, part in enumerate(parts):
        p = {"source": _layer_pattern(f"{prefix}{part}.{pname}")}
        if kv_heads is not None and i > 0:  # QKVParallelLinear: k, v replicate when TP > KV heads
            p["shards"] = int(kv_heads)
        out.append(p)
    return {"engine": _layer_pattern(name), "concat": {"dim": 0, "parts": out}}


def mapping_for(model, rules, quantize=()):
    mapping = {"schema": "wsync.mapping/v1", "name": f"vllm:{type(model).__name__}",
               "rules": rules + [{"engine": "{*}", "source": "{*}"}]}
    if quantize:
        mapping["quantize"] = list(quantize)
    return mapping


# ------------------------------------------------------------- worker side --

class WsyncWeightTransferEngine(WeightTransferEngine[WsyncInitInfo, WsyncUpdateInfo]):
    """vLLM worker side of wsync (module docstring)."""

    init_info_cls = WsyncInitInfo
    update_info_cls = WsyncUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config, vllm_config, device, model):
        super().__init__(config, vllm_config, device, model)
        self.agent = None
        self.tensors = []
        self.last_update = None
        self.version = 0

    def parse_init_info(self, init_dict: dict[str, Any]) -> WsyncInitInfo:
        return _typed(WsyncInitInfo, init_dict, "init_info")

    def parse_update_info(self, update_dict: dict[str, Any]) -> WsyncUpdateInfo:
        info = _typed(WsyncUpdateInfo, update_dict, "update_info")
        if isinstance(info.version, bool) or not isinstance(info.version, int) or info.version < 1:
            raise ValueError(f"wsync vLLM backend: update_info 'version' is {info.version!r}; expected an int >= 1")
        return info

    def _where(self):
        pc = self.parallel_config
        tp = pc.tensor_parallel_size
        pp = pc.pipeline_parallel_size
        from vllm.distributed import get_pp_group, get_tensor_model_parallel_rank
        dp = int(getattr(pc, "data_parallel_index", 0) or 0)
        rank_in_dp = get_pp_group().rank_in_group * tp + get_tensor_model_parallel_rank()
        return dp * tp * pp + rank_in_dp, dp

    def init_transfer_engine(self, init_info: WsyncInitInfo) -> None:
        if self.agent is not None:
            raise RuntimeError("wsync vLLM backend: init_transfer_engine called twice; shutdown first")
        rank, instance = self._where()
        t0 = time.perf_counter()
        self.tensors, rules, quantize = describe_model(self.model)
        mapping = mapping_for(self.model, rules, quantize)
        regions = {t.name: t.tensor for t in self.tensors}
        layout = {t.name: {"tp": t.tp} for t in self.tensors if t.tp is not None}
        extra = sum(t.tensor.numel() * t.tensor.element_size() for t in self.tensors if t.path == PROCESSED)
        by_path = {IN_PLACE: [], PROCESSED: []}
        for t in self.tensors:
            by_path[t.path].append(t.name)
        for path, names in by_path.items():
            _say(f"vLLM rank {rank}: {len(names)} tensors land {path}"
                 + (f": {', '.join(names[:6])}{' ...' if len(names) > 6 else ''}" if names else ""))
        _say(f"vLLM rank {rank}: loading-format buffers of the processed layers: {extra / 1e6:.1f} MB more memory")
        self.extra_bytes = extra
        self.agent = InferenceAgent(regions, controller=init_info.controller, job=init_info.job, rank=rank,
                                    provider=init_info.provider, instance=instance, layout=layout,
                                    timeout_s=init_info.timeout_s, secret_file=init_info.secret_file,
                                    paced=True, mapping=mapping, delta=init_info.delta)
        self.rank = rank
        self.timeout_s = init_info.timeout_s  # update_weights waits at most this for its version
        self.init_seconds = time.perf_counter() - t0

    def start_weight_update(self) -> None:
        if self.agent is None:
            raise RuntimeError("wsync vLLM backend: start_weight_update before init_weight_transfer_engine")

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self.receive_weights(self.parse_update_info(update_info))
        if self.device.type != "cpu":
            torch.accelerator.synchronize()

    def receive_weights(self, update_info: WsyncUpdateInfo) -> None:
        if self.agent is None:
            raise RuntimeError("wsync vLLM backend: update_weights before init_weight_transfer_engine")
        v = update_info.version
        t0 = time.perf_counter()
        try:
            got = self.agent.update(v, timeout=self.timeout_s)
        except (VersionError, TimeoutError) as e:
            # Names the rank, the version and the cause (for a world that was
            # never planned: what the controller says is missing, and why).
            raise RuntimeError(f"wsync vLLM backend: {e}") from None
        landed = time.perf_counter()
        processed = self._process()
        done = time.perf_counter()
        self.version = got
        self.last_update = {"version": got, "seconds": done - t0, "land_seconds": landed - t0,
                            "process_seconds": done - landed, "processed_layers": processed,
                            "wait_seconds": (self.agent.last_update or {}).get("wait_seconds")}
        _say(f"vLLM rank {self.rank}: version {got} in {done - t0:.3f} s (landing {landed - t0:.3f} s, "
             f"vLLM's processing of {processed} layers {done - landed:.3f} s)")

    def _process(self):
        """Runs vLLM's processing on every layer whose writes landed in
        loading-format buffers; returns how many."""
        by_module = {}
        for t in self.tensors:
            if t.path == PROCESSED:
                by_module.setdefault(t.module, {})[t.param] = t.tensor
        modules = dict(self.model.named_modules())
        for mname, buffers in by_module.items():
            _reprocess(modules[mname], buffers)
        return len(by_module)

    def finish_weight_update(self) -> None:
        pass

    def shutdown(self) -> None:
        if self.agent is not None:
            self.agent.close()
            self.agent = None


@torch.no_grad()
def _reprocess(module, buffers):
    """Rebuilds `module` in loading format from `buffers`, runs its quant
    method's processing, and copies the result into the tensors the engine
    computes from (kept in their storage, as CUDA graphs captured them)."""
    # Every entry, None ones included (e.g. a fused-MoE layer's expert_map
    # without expert parallelism): they are put back as they were.
    kernel_params = dict(module._parameters)
    kernel_buffers = dict(module._buffers)
    non_persistent = set(module._non_persistent_buffers_set)
    info = get_layerwise_info(module)
    restore_layer_on_meta(module, info)
    materialize_layer(module, info)
    for pname, buf in buffers.items():
        getattr(module, pname).data.copy_(buf)
    if hasattr(module, "_already_called_process_weights_after_loading"):
        delattr(module, "_already_called_process_weights_after_loading")
    # A fused-MoE method runs its kernel's own processing (on CPU: the
    # prepack into the grouped-GEMM layout) only while it has no kernel; a
    # second run would leave the weights unpacked. So the layer is processed
    # as at load, and the engine keeps the kernel it runs with.
    method = module.quant_method
    moe_kernel = getattr(method, "moe_kernel", None)
    if moe_kernel is not None:
        method.moe_kernel = None
    try:
        method.process_weights_after_loading(module)
    finally:
        if moe_kernel is not None:
            method.moe_kernel = moe_kernel
    for pname, kernel in kernel_params.items():
        if kernel is None:
            continue
        new = getattr(module, pname)
        if new.shape != kernel.shape or new.dtype != kernel.dtype:
            raise RuntimeError(f"wsync vLLM backend: processing '{pname}' of {type(module).__name__} gave "
                               f"{tuple(new.shape)} {new.dtype}, not the engine's {tuple(kernel.shape)} {kernel.dtype}")
        kernel.data.copy_(new)
    for bname, kernel in kernel_buffers.items():
        if kernel is not None and module._buffers.get(bname) is not None:
            kernel.data.copy_(module._buffers[bname])
    for name in list(module._parameters):
        delattr(module, name)
    for name in list(module._buffers):
        delattr(module, name)
    module._parameters.update(kernel_params)
    module._buffers.update(kernel_buffers)
    module._non_persistent_buffers_set.clear()
    module._non_persistent_buffers_set.update(non_persistent)


def last_update(worker):
    """For `collective_rpc`: the backend's figures of its last update."""
    engine = getattr(worker, "weight_transfer_engine", None)
    return None if engine is None else {"update": engine.last_update, "extra_bytes": getattr(engine, "extra_bytes", 0),
                                        "paths": {t.name: t.path for t in engine.tensors}}


# ------------------------------------------------------------ trainer side --

@dataclass
class WsyncTrainerInitInfo(TrainerInitInfo):
    backend: ClassVar[str] = "wsync"
    controller: str = ""
    job: str = ""
    secret_file: str | None = None
    provider: str = "shm"
    timeout_s: float = 300.0
    delta: bool = False  # both sides take part in delta versions (docs/DELTAS.md)


def _post(base, path):
    import urllib.request

    with urllib.request.urlopen(urllib.request.Request(f"{base}/{path}", data=b"", method="POST"), timeout=600):
        pass


class WsyncTrainerWeightTransferEngine(TrainerWeightTransferEngine[WsyncTrainerInitInfo]):
    """vLLM's trainer-side engine over wsync.TrainerAgent: every trainer rank
    pushes its own shards (no gather); the sender (rank 0) drives vLLM's
    start / update / finish calls through the client."""

    init_info_cls = WsyncTrainerInitInfo

    @classmethod
    def trainer_init(cls, init_info, *, client, source=None):
        from ._trainer import TrainerAgent

        if not init_info.controller or not init_info.job:
            raise ValueError("wsync vLLM trainer engine: init_info needs 'controller' and 'job'")
        module = getattr(source, "_module", None) if isinstance(source, ModuleSource) else getattr(source, "module",
                                                                                                   None)
        if not isinstance(module, torch.nn.Module):
            raise ValueError("wsync vLLM trainer engine: source must be a ModuleSource over the (FSDP) model: wsync "
                             "writes each rank's own shards, it does not iterate full tensors")
        self = cls(client=client, source=source, is_sender=init_info.is_sender)
        if self.is_sender:
            client.init_weight_transfer_engine({"controller": init_info.controller, "job": init_info.job,
                                                "secret_file": init_info.secret_file,
                                                "provider": init_info.provider, "timeout_s": init_info.timeout_s,
                                                "delta": init_info.delta})
        self.agent = TrainerAgent(module, controller=init_info.controller, job=init_info.job,
                                  provider=init_info.provider, timeout_s=init_info.timeout_s,
                                  secret_file=init_info.secret_file, delta=init_info.delta)
        self.version = 0
        return self

    def send_weights(self, version=None):
        """Pushes `version` (default: the last one + 1) and, on the sender,
        has vLLM take it between steps (start / update / finish); returns
        this rank's push report. Against `vllm serve` (a client with a
        `base_url`) the sender pauses the server first (`/pause?mode=wait`:
        running requests finish, the prefix cache is cleared) and resumes
        it after, so no request spans two versions or reuses KV computed
        with the old weights."""
        v = int(version) if version is not None else self.version + 1
        push = self.agent.push(v)
        failed = None
        if self.is_sender:
            base = getattr(self.client, "base_url", None)
            try:
                if base:
                    _post(base, "pause?mode=wait")
                self.client.start_weight_update()
                self.client.update_weights({"version": v})
                self.client.finish_weight_update(weight_version=str(v))
            except Exception as e:  # noqa: BLE001 - the push's own error names the cause first
                failed = e
            finally:
                if base:
                    _post(base, "resume")
        report = push.wait()
        if failed is not None:
            raise failed
        self.version = v
        return report

    def shutdown(self):
        self.agent.close()
