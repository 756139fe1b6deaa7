"""Training and decoding loops in DeferAndFuse against CPU eager (issue 15's models).

A `nn.TransformerEncoder` language model (AdamW, vocabulary 50): the small
one has d_model 64, 2 layers, batch 8 x 32; the medium one d_model 256, 4
layers, batch 8 x 128. Each row is one loop run in this process on the CPU
and on `tpu`, the mean step time after the warm-up steps, the ratio, and
the tier-1 cache misses after warm-up. Rows run `--repeats` times and
print the median ratio. The decoding row is a tiny Llama (transformers,
random weights, 2 layers of width 64) generating 32 tokens greedily from
16, timed per token after one warm-up call; its misses are those of the
first, cold call after its third token (the KV cache grows every token).
The last column says where `tpu`'s step went, from
`deferfuse.stats()["backend"]["kernels"]` over the timed steps (medians):
milliseconds per step in matrix products (at their GFLOP/s), fused loops
and single ops; the rest of the step is recording, rewriting and Python.

Run: TORCH_TPU_EAGER_MODE=defer_and_fuse TORCH_TPU_CACHE_DIR=off \\
     .venv/bin/python bindings/bench/train_loop.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import deferfuse
import torch
from torch import nn

VOCAB = 50


def misses() -> int:
    return int(deferfuse.stats()["cache"]["tier1"]["misses"])


def kernels() -> dict:
    return deferfuse.stats()["backend"]["kernels"]


def kernel_time(before: dict, after: dict, steps: int) -> dict[str, float]:
    """Per step: milliseconds of each kernel kind, and the products' GFLOP/s."""
    ms = {k: (after[k]["ns"] - before[k]["ns"]) / steps / 1e6 for k in ("matmul", "loops", "single")}
    ns = after["matmul"]["ns"] - before["matmul"]["ns"]
    ms["gflops"] = (after["matmul_flops"] - before["matmul_flops"]) / ns if ns else 0.0
    return ms


def loop(
    device: str, d: int, layers: int, seq: int, steps: int, read: bool, warm: int
) -> tuple[float, int, dict[str, float]]:
    """Mean seconds per step after `warm` steps, the tier-1 misses in them,
    and their kernel time (`kernel_time`; empty on the CPU)."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d, 4, 2 * d, dropout=0.0, batch_first=True)
    model = nn.Sequential(nn.Embedding(VOCAB, d), nn.TransformerEncoder(layer, layers), nn.Linear(d, VOCAB))
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, VOCAB, (8, seq + 1), generator=torch.Generator().manual_seed(1))
    x, y = data[:, :-1].to(device), data[:, 1:].to(device)
    t0, m0, k0 = 0.0, 0, {}
    for i in range(steps):
        if i == warm:
            if device == "tpu":
                deferfuse.sync()
                m0, k0 = misses(), kernels()
            t0 = time.perf_counter()
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))
        loss.backward()
        opt.step()
        if read:
            loss.item()
    loss.item()
    dt = (time.perf_counter() - t0) / (steps - warm)
    if device != "tpu":
        return dt, 0, {}
    return dt, misses() - m0, kernel_time(k0, kernels(), steps - warm)


def decode(device: str, steps: int, warm: int) -> tuple[float, int, dict[str, float]]:
    """Seconds per generated token after a warm-up call, the tier-1 misses
    of the cold call after its `warm`-th token, and the kernel time per
    token of the timed call (empty on the CPU)."""
    from transformers import LlamaConfig, LlamaForCausalLM, LogitsProcessorList

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    model = LlamaForCausalLM(config).eval().to(device)
    prompt = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(1)).to(device)
    seen: list[int] = []

    def count(ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        seen.append(misses() if device == "tpu" else 0)
        return scores

    def generate(processors: list) -> None:
        with torch.no_grad():
            model.generate(
                prompt,
                max_new_tokens=steps,
                min_new_tokens=steps,
                do_sample=False,
                pad_token_id=0,
                logits_processor=LogitsProcessorList(processors),
            ).cpu()

    generate([count])
    k0 = kernels() if device == "tpu" else {}
    t0 = time.perf_counter()
    generate([])
    dt = (time.perf_counter() - t0) / steps
    spent = kernel_time(k0, kernels(), steps) if device == "tpu" else {}
    return dt, seen[-1] - seen[warm - 1], spent


ROWS = {
    "small, no reads (40 steps)": dict(d=64, layers=2, seq=32, steps=40, read=False, warm=3),
    "small, read each step (40 steps)": dict(d=64, layers=2, seq=32, steps=40, read=True, warm=3),
    "medium, read each step (12 steps)": dict(d=256, layers=4, seq=128, steps=12, read=True, warm=4),
    "decoding, tiny Llama (32 tokens)": dict(steps=32, warm=3),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print(
        "| loop | CPU eager ms/step | tpu ms/step | tpu / CPU (median) | tier-1 misses after warm-up "
        "| tpu kernels ms/step: matmul (GFLOP/s), loops, single ops |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, cfg in ROWS.items():
        ratios, cpu, tpu, late, spent = [], [], [], 0, []
        for _ in range(args.repeats):
            run = decode if name.startswith("decoding") else loop
            c, _, _ = run("cpu", **cfg)
            t, m, k = run("tpu", **cfg)
            cpu.append(c)
            tpu.append(t)
            ratios.append(t / c)
            late = max(late, m)
            spent.append(k)
        ms = statistics.median
        k = {key: ms(s[key] for s in spent) for key in spent[0]}
        where = f"{k['matmul']:.2f} ({k['gflops']:.0f}), {k['loops']:.2f}, {k['single']:.2f}"
        print(f"| {name} | {ms(cpu) * 1e3:.2f} | {ms(tpu) * 1e3:.2f} | {ms(ratios):.2f} | {late} | {where} |")


if __name__ == "__main__":
    main()
