"""Where the public fp8 paths agree with pipeline/fp8.h, measured on a GPU.

1. Triton's fp32 -> tl.float8e4nv cast (what DeepSeek-V3's act_quant uses)
   against round-to-nearest-even with saturation (torch's RNE cast after
   clamping to +-448), over every fp32 bit pattern.
2. Our block convention q = e4m3(x / (amax/448)) against vLLM/DeepGEMM's
   per_block_cast_to_fp8, q = e4m3(x * (448 / max(amax, 1e-4))), on random
   bf16 weights: how many codes differ.
Informational; run by run_fp8_conformance.sh. Prints one line per finding.
"""
import torch
import triton
import triton.language as tl


@triton.jit
def _cast_e4m3(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    tl.store(y_ptr + offs, x.to(tl.float8e4nv), mask=m)


def triton_cast_sweep():
    chunk = 1 << 30
    finite_bad = nan_bad = 0
    example = None
    for base in range(0, 1 << 32, chunk):
        u = torch.arange(base, base + chunk, dtype=torch.int64, device="cuda")
        u = torch.where(u >= (1 << 31), u - (1 << 32), u).to(torch.int32)
        x = u.view(torch.float32)
        del u
        y = torch.empty(chunk, dtype=torch.float8_e4m3fn, device="cuda")
        _cast_e4m3[(chunk // 1024,)](x, y, chunk, BLOCK=1024)
        ref = x.clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        diff = y.view(torch.uint8) != ref.view(torch.uint8)
        isnan = torch.isnan(x)
        finite_bad += int((diff & ~isnan).sum())
        nan_bad += int((diff & isnan).sum())
        if example is None and bool((diff & ~isnan).any()):
            i = int(torch.nonzero(diff & ~isnan)[0])
            example = (float(x[i]), int(y.view(torch.uint8)[i]), int(ref.view(torch.uint8)[i]))
        del x, y, ref, diff, isnan
    print(f"triton fp32->float8e4nv vs RNE+saturate, all 2^32 inputs: {finite_bad} finite "
          f"mismatches, {nan_bad} NaN-input mismatches (torch keeps a NaN's sign, the GPU "
          f"returns 0x7F)" + (f", e.g. {example}" if example else ""))


def block_conventions(rows=4096, cols=7168, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(rows, cols, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    xv = x.float().view(rows // 128, 128, cols // 128, 128)
    amax = xv.abs().amax(dim=(1, 3), keepdim=True)
    ours = (xv / (amax / 448.0)).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    deepgemm = (xv * (448.0 / amax.clamp(1e-4))).to(torch.float8_e4m3fn).view(torch.uint8)
    differ = int((ours != deepgemm).sum())
    print(f"block quantize, ours (x / (amax/448)) vs vLLM/DeepGEMM per_block_cast_to_fp8 "
          f"(x * (448/amax)) on N(0, 0.02) bf16 [{rows} x {cols}]: {differ} of {x.numel()} codes "
          f"differ ({differ / x.numel():.2e})")


if __name__ == "__main__":
    print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())
    triton_cast_sweep()
    block_conventions()
