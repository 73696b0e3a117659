"""Writes a small random-init Qwen3 (bf16, 2 layers, hidden 256, vocab 512)
as a transformers checkpoint, for the example to serve (nothing is
downloaded). The trainer starts from the same weights (same seed).

    python examples/vllm/make_model.py DIR
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "tests"))
import torch_models  # noqa: E402

if __name__ == "__main__":
    _, model = torch_models.small_qwen3()
    model.save_pretrained(sys.argv[1])
    print(f"make_model: wrote a small Qwen3 to {sys.argv[1]}")
