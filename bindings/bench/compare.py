"""The binding side by side with PyTorch on the CPU: GELU, LayerNorm and an MLP
block written in PyTorch, run by CPU eager, torch.compile (Inductor, cold
and warm), deferfuse Strict and deferfuse DeferAndFuse on `tpu`; median time,
first-call time and peak RSS of each, every configuration in its own process.
CPU eager and Inductor run twice: with glibc's default malloc and with
MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_ raised (large temporaries then
stop page-faulting), so wins are claimed only against the faster of the two.
Then the per-op overhead of the binding (µs per tiny op) next to CPU eager.

    python bindings/bench/compare.py [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

TUNED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 31)}
CONFIGS = ["eager", "eager+malloc", "inductor", "inductor+malloc", "strict", "defer_and_fuse"]


def workloads(torch: Any) -> dict[str, tuple[Callable[..., Any], Callable[[], list[Any]]]]:
    F = torch.nn.functional

    def gelu(x: Any) -> Any:
        return F.gelu(x, approximate="tanh")

    def layer_norm(x: Any, w: Any, b: Any) -> Any:
        return F.layer_norm(x, (x.shape[-1],), w, b)

    def mlp(x: Any, w1: Any, b1: Any, w2: Any, b2: Any, g: Any) -> Any:
        h = F.gelu(F.linear(F.layer_norm(x, (x.shape[-1],), g, None), w1, b1), approximate="tanh")
        return x + F.linear(h, w2, b2)

    g = torch.Generator().manual_seed(0)

    def r(*shape: int) -> Any:
        return torch.randn(*shape, generator=g)

    return {
        "gelu_4M": (gelu, lambda: [r(4 << 20)]),
        "layer_norm_4096x1024": (layer_norm, lambda: [r(4096, 1024), r(1024), r(1024)]),
        "mlp_256x512x2048": (mlp, lambda: [r(256, 512), r(2048, 512), r(2048), r(512, 2048), r(512), r(512)]),
    }


def run_one(workload: str, config: str, reps: int) -> dict[str, Any]:
    """Runs in a child process: one workload in one configuration."""
    import warnings

    warnings.filterwarnings("ignore")
    import torch

    fn, make = workloads(torch)[workload]
    args = make()
    if config in ("strict", "defer_and_fuse"):
        import deferfuse

        deferfuse.set_mode(config)
        args = [a.to("tpu") for a in args]
        deferfuse.sync()

        def call() -> Any:
            out = fn(*args)
            deferfuse.sync()  # the step marker: the value is computed here
            return out
    elif config.startswith("inductor"):
        compiled = torch.compile(fn)

        def call() -> Any:
            return compiled(*args)
    else:

        def call() -> Any:
            return fn(*args)

    start = time.perf_counter()
    out = call()
    first = time.perf_counter() - start
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        out = call()
        times.append(time.perf_counter() - start)
    del out
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "workload": workload,
        "config": config,
        "median_ms": 1e3 * statistics.median(times),
        "min_ms": 1e3 * min(times),
        "first_call_ms": 1e3 * first,
        "peak_rss_mib": peak_kib / 1024,
    }


def per_op_overhead(n: int) -> dict[str, float]:
    """µs per tiny op (8 floats): CPU eager, and the binding in Strict and
    DeferAndFuse. DeferAndFuse is timed recording chains of 1000 ops (below
    the flush limit); the flush of each chain is reported on its own."""
    import warnings

    warnings.filterwarnings("ignore")
    import deferfuse
    import torch

    chain, rounds = 1000, max(n // 1000, 1)
    out: dict[str, float] = {}
    for label, step in (("x*y", lambda y, x: y * x), ("x+1.0", lambda y, x: y + 1.0)):
        for mode in ("cpu_eager", "strict", "defer_and_fuse"):
            device = "cpu" if mode == "cpu_eager" else "tpu"
            if device == "tpu":
                deferfuse.set_mode(mode)
            x = torch.full((8,), 1.0001).to(device)
            record = flush = 0.0
            for r in range(rounds + 1):
                y = x
                start = time.perf_counter()
                for _ in range(chain):
                    y = step(y, x)
                middle = time.perf_counter()
                if device == "tpu":
                    deferfuse.sync()
                end = time.perf_counter()
                if r:  # the first round warms the caches
                    record += middle - start
                    flush += end - middle
            out[f"{mode} {label} us/op"] = 1e6 * record / (rounds * chain)
            if mode == "defer_and_fuse":
                out[f"{mode} {label} flush us/op"] = 1e6 * flush / (rounds * chain)
    # A Python kernel that does nothing, through the same torch.library path, for scale.
    lib = torch.library.Library("deferfuse_bench", "DEF")
    lib.define("noop(Tensor x) -> Tensor")
    lib.impl("noop", lambda x: x, "CPU")
    x = torch.ones(8)
    start = time.perf_counter()
    for _ in range(n):
        torch.ops.deferfuse_bench.noop(x)
    out["python noop kernel us/op"] = 1e6 * (time.perf_counter() - start) / n
    return out


def child(args: list[str], env_extra: dict[str, str]) -> dict[str, Any]:
    env = dict(os.environ, **env_extra)
    with tempfile.TemporaryDirectory() as cache:
        # Cold means cold: no Inductor or deferfuse cache from an earlier run.
        env.update(TORCHINDUCTOR_CACHE_DIR=cache, TORCHINDUCTOR_FX_GRAPH_CACHE="0", TORCH_TPU_CACHE_DIR="off")
        out = subprocess.run([sys.executable, __file__, *args], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        return {
            "error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"
        }
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--json", action="store_true", help="one JSON object per row")
    parser.add_argument("--one", nargs=2, metavar=("WORKLOAD", "CONFIG"), help=argparse.SUPPRESS)
    parser.add_argument("--overhead", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--reps", type=int, default=None, help=argparse.SUPPRESS)
    a = parser.parse_args()
    reps = a.reps or (5 if a.quick else 20)
    if a.one:
        print(json.dumps(run_one(a.one[0], a.one[1], reps)))
        return
    if a.overhead:
        print(json.dumps(per_op_overhead(20000 if a.quick else 100000)))
        return

    import torch

    rows = []
    for workload in workloads(torch):
        for config in CONFIGS:
            env = TUNED_MALLOC if config.endswith("+malloc") else {}
            base = config.split("+")[0]
            row = child(["--one", workload, base, "--reps", str(reps)], env)
            row.update(workload=workload, config=config)
            rows.append(row)
            if a.json:
                print(json.dumps(row), flush=True)
    overhead = child(["--overhead"] + (["--quick"] if a.quick else []), {})
    print(
        f"\n{'workload':22s} {'config':16s} {'median ms':>10s} {'min ms':>8s} {'first call ms':>14s} {'peak RSS MiB':>13s}"
    )
    for r in rows:
        if "error" in r:
            print(f"{r['workload']:22s} {r['config']:16s} error: {r['error'][:80]}")
            continue
        print(
            f"{r['workload']:22s} {r['config']:16s} {r['median_ms']:10.2f} {r['min_ms']:8.2f} {r['first_call_ms']:14.1f} "
            f"{r['peak_rss_mib']:13.0f}"
        )
    print("\nper-op overhead (µs per tiny op on 8 floats, chains of 1000 ops):")
    for k, v in overhead.items():
        print(f"  {k:34s} {v:8.2f}")
    if a.json:
        print(json.dumps({"overhead": overhead}))


if __name__ == "__main__":
    main()
