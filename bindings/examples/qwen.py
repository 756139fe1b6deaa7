"""Qwen2 (transformers, a small random-weight config): training steps with
AdamW, then greedy generation with the KV cache, on `tpu` against CPU eager.
The model and the checks are `llama.py`'s, with Qwen2's architecture.

    python bindings/examples/qwen.py [--size tiny|small] [--steps 5] [--compile]
"""

from __future__ import annotations

from _runner import main
from llama import trainer

train = trainer("qwen2")

if __name__ == "__main__":
    main("Qwen2", train, tolerance=1e-4)
