"""How much of an engine's copy changes per optimizer step, and what each
delta encoding would send (#30's design input).

    build/venv/bin/python scripts/delta_measure.py [--steps 5] [--hidden 1024]

A Qwen3-shaped transformers model (2 layers), fp32 master weights, AdamW,
a real LM loss on a fixed token stream; after each step the engine copy is
the bf16 cast and its block-fp8 quantization (e4m3, 128x128 blocks, the
independent reference in python/tests/fp8_reference.py). For each learning
rate and format: the fraction of elements that changed, and the bytes each
candidate encoding would send as a fraction of the full copy.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "tests"))
from fp8_reference import quantize_block_fp8  # noqa: E402

CHUNK = 1 << 16  # elements per chunk of the chunked encoding (u16 index)


def encodings(changed, elem):
    """{encoding: bytes} for a flat bool mask of changed elements of `elem` bytes."""
    n = changed.numel()
    idx = changed.nonzero().flatten()
    k = idx.numel()
    gaps = torch.diff(idx, prepend=torch.tensor([-1])) if k else idx
    varint = int(((gaps >= 128).long() + (gaps >= 1 << 14).long() + (gaps >= 1 << 21).long() + 1).sum()) if k else 0
    chunks = changed[: n - n % CHUNK].reshape(-1, CHUNK).sum(dim=1).tolist() + ([int(changed[n - n % CHUNK:].sum())] if n % CHUNK else [])
    lengths = [CHUNK] * (n // CHUNK) + ([n % CHUNK] if n % CHUNK else [])
    hybrid = 32 + sum(4 + 2 * (-(-m // 16) if c > -(-m // 16) else c) for c, m in zip(chunks, lengths)) + k * elem
    rows = changed[: n - n % (128 // elem)].reshape(-1, 128 // elem).any(dim=1).sum().item() if n >= 128 // elem else 0
    return {
        "full": n * elem,
        "u32 index + value": k * (4 + elem),
        "chunked u16 index + value": k * (2 + elem) + 4 * ((n + CHUNK - 1) // CHUNK),
        "wsync delta v1 (per chunk indices or bitmap)": hybrid,
        "varint gap + value": varint + k * elem,
        "bitmap + values": (n + 7) // 8 + k * elem,
        "changed 128 B rows": rows * (128 + 8),
    }


def engine_copy(model):
    """{name: (bf16 bytes, fp8 codes, fp8 scales)} of every weight; like vLLM's
    block-fp8 models, only the layers' linear weights are quantized (embeddings,
    lm_head and norms stay bf16, fp8 codes and scales are None)."""
    out = {}
    for name, p in model.named_parameters():
        b = p.detach().to(torch.bfloat16)
        if b.dim() == 2 and ".layers." in name and not name.endswith("norm.weight"):  # as vLLM quantizes
            q, s = quantize_block_fp8(b)
            out[name] = (b.view(torch.int16).flatten(), q.view(torch.uint8).flatten(), s.flatten())
        else:
            out[name] = (b.view(torch.int16).flatten(), None, None)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--lrs", default="1e-6,1e-5")
    a = ap.parse_args()
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.set_num_threads(max(1, os.cpu_count()))
    for lr in (float(x) for x in a.lrs.split(",")):
        torch.manual_seed(0)
        h = a.hidden
        config = Qwen3Config(vocab_size=8192, hidden_size=h, intermediate_size=3 * h, num_hidden_layers=2,
                             num_attention_heads=h // 64, num_key_value_heads=h // 128, head_dim=64,
                             tie_word_embeddings=False, attn_implementation="eager")
        model = Qwen3ForCausalLM(config).float()
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
        gen = torch.Generator().manual_seed(1)
        # A fixed token stream with structure (a noisy walk), so the loss is learnable.
        base = torch.cumsum(torch.randint(-3, 4, (8, 257), generator=gen), dim=1) % config.vocab_size
        before = engine_copy(model)
        print(f"lr {lr:g}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters", flush=True)
        for step in range(1, a.steps + 1):
            loss = model(input_ids=base[:, :-1], labels=base[:, 1:]).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            after = engine_copy(model)
            totals = {"bf16": {}, "fp8 codes": {}, "fp8 copy": {}}
            counts = {"bf16": [0, 0], "fp8 codes": [0, 0], "fp8 scales": [0, 0]}
            for name, (b1, q1, s1) in after.items():
                b0, q0, s0 = before[name]
                # The fp8 copy: codes and scales of quantized weights, the rest in bf16.
                parts = [("bf16", b0, b1, 2)] + ([("fp8 codes", q0, q1, 1), ("fp8 scales", s0, s1, 4)]
                                                 if q0 is not None else [("fp8 rest", b0, b1, 2)])
                for fmt, x0, x1, elem in parts:
                    changed = (x0 != x1).flatten()
                    if fmt in counts:
                        counts[fmt][0] += int(changed.sum())
                        counts[fmt][1] += changed.numel()
                    for enc, nbytes in encodings(changed, elem).items():
                        for key in ("fp8 copy",) if fmt.startswith("fp8") else ():
                            totals[key][enc] = totals[key].get(enc, 0) + nbytes
                        if fmt in totals:
                            totals[fmt][enc] = totals[fmt].get(enc, 0) + nbytes
            before = after
            print(f"lr {lr:g} step {step}: loss {loss.item():.4f}; changed: "
                  + ", ".join(f"{k} {c / max(n, 1):.4%}" for k, (c, n) in counts.items()), flush=True)
            for fmt, t in totals.items():
                full = t["full"]
                print(f"    {fmt:9s} of {full / 1e6:.1f} MB: "
                      + "; ".join(f"{enc} {v / full:.2%}" for enc, v in t.items() if enc != "full"), flush=True)


if __name__ == "__main__":
    main()
