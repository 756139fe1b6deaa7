"""Llama (transformers, a small random-weight config): training steps with
AdamW, then greedy generation with the KV cache, on `tpu` against CPU eager.
`qwen.py` runs the same for Qwen2.

    python bindings/examples/llama.py [--size tiny|small] [--steps 5] [--compile]

A run records the losses, then the generated token ids. Tolerance: 1e-4
relative on each loss (float32, sums in another order compounded over the
steps); the generated tokens of a greedy decode must be equal.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from _runner import Timer, main  # noqa: E402

SIZES = {"tiny": (2, 64, 4, 4, 16), "small": (4, 256, 8, 8, 128)}  # (layers, hidden, heads, batch, length)
VOCAB = 256


def config(arch: str, size: str) -> transformers.PretrainedConfig:
    layers, hidden, heads, _, _ = SIZES[size]
    common = dict(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads // 2,
        max_position_embeddings=256,
        attn_implementation="sdpa",
    )
    cls = transformers.LlamaConfig if arch == "llama" else transformers.Qwen2Config
    return cls(**common)


def trainer(arch: str):
    """`train` for the architecture `arch` ("llama" or "qwen2")."""

    def train(device: str, steps: int, size: str, compiled: bool, timer: Timer) -> list[float]:
        _, _, _, batch, length = SIZES[size]
        model = transformers.AutoModelForCausalLM.from_config(config(arch, size)).to(device)
        run = torch.compile(model, backend="tpu" if device == "tpu" else "inductor") if compiled else model
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        data = torch.randint(0, VOCAB, (steps, batch, length), generator=torch.Generator().manual_seed(1))
        out = []
        for tokens in data:
            x = tokens.to(device)
            with timer:
                opt.zero_grad()
                loss = run(input_ids=x, labels=x).loss
                loss.backward()
                opt.step()
                out.append(loss.item())
        model.eval()
        prompt = data[0, :1, :8].to(device)
        with torch.no_grad():
            generated = model.generate(prompt, max_new_tokens=8, do_sample=False, pad_token_id=0)
        return out + [float(t) for t in generated[0, 8:].cpu()]

    return train


train = trainer("llama")


if __name__ == "__main__":
    main("Llama", train, tolerance=1e-4)
