"""bf16 and f32 matmul throughput on one core: PyTorch's CPU eager against the engine.

Run: TORCH_TPU_EAGER_MODE=defer_and_fuse RAYON_NUM_THREADS=1 taskset -c 0 \
    .venv/bin/python bindings/bench/bf16_matmul.py
"""

import time

import deferfuse
import torch

M, K, N = 1024, 256, 768
FLOPS = 2 * M * K * N


def median_seconds(step, runs=10):
    for _ in range(3):
        step()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return sorted(times)[runs // 2]


def main():
    torch.set_num_threads(1)
    a, b = torch.randn(M, K).bfloat16(), torch.randn(K, N).bfloat16()
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        ca, cb = a.to(dtype), b.to(dtype)
        ta, tb = ca.to("tpu"), cb.to("tpu")
        eager = median_seconds(lambda ca=ca, cb=cb: ca @ cb)
        engine = median_seconds(lambda ta=ta, tb=tb: (ta @ tb).cpu())
        rows.append((dtype, eager, engine))
    exact = a.double() @ b.double()
    err = ((a.to("tpu") @ b.to("tpu")).cpu().double() - exact).abs().max() / exact.abs().max()
    deferfuse.sync()
    print(f"{M}x{K} by {K}x{N}, one core (GFLOP/s; the engine's figure includes the copy back)")
    print("| dtype | PyTorch eager | deferfuse |")
    print("| --- | ---: | ---: |")
    for dtype, eager, engine in rows:
        print(
            f"| {str(dtype).removeprefix('torch.')} | {FLOPS / eager / 1e9:.1f} | {FLOPS / engine / 1e9:.1f} |"
        )
    print(f"bf16 result against an f64 product: max error {err.item():.1e} of max |value|")


if __name__ == "__main__":
    main()
