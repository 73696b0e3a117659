"""Test harness only, not the product: this machine's CPU advertises AMX,
but a process that runs AMX tile instructions dies with SIGILL (the
hypervisor does not enable them). With WSYNC_TEST_NO_AMX=1 in the
environment, every Python process that has this folder on PYTHONPATH
(test_vllm.py sets both for the vLLM engines it starts and their workers)
tells torch, and so vLLM's CPU backend, that there is no AMX; bf16 then
runs through oneDNN's or torch's other kernels."""

import os

if os.environ.get("WSYNC_TEST_NO_AMX") == "1":
    import torch

    torch.cpu._is_amx_tile_supported = lambda: False
