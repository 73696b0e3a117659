"""Block fp8 (e4m3) quantization in plain torch, independent of wsync's code.

The DeepSeek-V3 checkpoint format, as docs/SCHEMA.md pins it:

- 128 x 128 blocks over the last two dims of a tensor [..., R, C]; each
  leading index (e.g. an expert) has its own block grid; partial blocks at
  the right and bottom edges are blocks too (ceil(R/128) x ceil(C/128)).
- scale = amax(|block|) / 448 in fp32; an all-zero block gets scale 1.0.
- q = x.float() / scale (IEEE fp32 division), rounded to nearest even,
  saturated to +-448, as float8_e4m3fn.
- scale_inv (what the engine stores as `<name>_scale_inv`, the
  dequantization multiplier) = scale, fp32 [..., ceil(R/128), ceil(C/128)].

torch's own cast `.to(torch.float8_e4m3fn)` does the rounding (nearest even,
subnormals included). Observed on torch 2.15 (CPU): it also saturates,
i.e. 449, 480, 1e4 and even inf become 448, and NaN becomes 0x7F. Older
torch builds and other backends do not all saturate (some give NaN above
464), so we clamp to +-448 before the cast; for finite inputs the clamp
cannot change a result that saturates anyway. A NaN or infinite weight is
an error here (the schema says it is never sent).
"""

import torch

BLOCK = 128
FP8_MAX = 448.0  # largest finite float8_e4m3fn


def _ceil_div(a, b):
    return (a + b - 1) // b


def _blocked(x, block):
    """x [..., R, C] zero-padded to whole blocks, viewed [..., nr, block, nc, block]."""
    rows, cols = x.shape[-2:]
    nr, nc = _ceil_div(rows, block), _ceil_div(cols, block)
    padded = torch.nn.functional.pad(x, (0, nc * block - cols, 0, nr * block - rows))
    return padded.reshape(*x.shape[:-2], nr, block, nc, block)


def block_scales(x, block=BLOCK):
    """fp32 scale per block, [..., ceil(R/block), ceil(C/block)]."""
    amax = _blocked(x.float().abs(), block).amax(dim=(-3, -1))
    scale = amax / FP8_MAX
    return torch.where(amax == 0, torch.ones_like(scale), scale)


def quantize_block_fp8(x, block=BLOCK):
    """(q float8_e4m3fn [..., R, C], scale_inv fp32 [..., ceil(R/128), ceil(C/128)]).

    x is usually bf16; any float dtype is taken through fp32.
    """
    if x.dim() < 2:
        raise ValueError(f"block fp8 needs at least 2 dims, got shape {list(x.shape)}")
    xf = x.float()
    if not bool(torch.isfinite(xf).all()):
        raise ValueError("NaN or infinite value: not quantized (never sent)")
    rows, cols = x.shape[-2:]
    scale = block_scales(xf, block)
    blocks = _blocked(xf, block)
    scaled = blocks / scale[..., :, None, :, None]
    q = scaled.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    nr, nc = scale.shape[-2:]
    q = q.reshape(*x.shape[:-2], nr * block, nc * block)[..., :rows, :cols].contiguous()
    return q, scale


def dequantize_block_fp8(q, scale_inv, block=BLOCK):
    """fp32 x ~= q * scale_inv (each block times its scale)."""
    rows, cols = q.shape[-2:]
    full = scale_inv.repeat_interleave(block, dim=-2).repeat_interleave(block, dim=-1)
    return q.float() * full[..., :rows, :cols]


def fp8_bytes(q):
    """The raw e4m3 codes of a float8_e4m3fn tensor, as uint8 (same storage)."""
    return q.view(torch.uint8)
