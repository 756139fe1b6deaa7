"""tpu_dist against gloo on CPU tensors, side by side in one run of 2 ranks.

- allreduce bus bandwidth, 1 KiB to 64 MiB (float32): `tpu` tensors through
  tpu_dist, and CPU tensors through gloo itself, in the same processes. Bus
  bandwidth is NCCL's measure: bytes * 2 (n - 1) / n per second. Each size is
  the median of several calls.
- a DDP training step of a small transformer LM (d_model 64, 2 layers,
  batch 8x32 per rank, AdamW): `tpu` in DeferAndFuse with tpu_dist, against
  CPU tensors with gloo; median step time after warm-up steps.

    python bindings/bench/distributed.py [--steps 12] [--json]

docs/distributed.md has the numbers and what they mean.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZES = [1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 22, 1 << 24, 1 << 26]


def _median_s(run, reps: int) -> float:
    times = []
    for _ in range(reps):
        dist.barrier()
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _bandwidth(world: int, gloo: dist.ProcessGroup) -> list[dict]:
    rows = []
    for nbytes in SIZES:
        reps = 20 if nbytes <= 1 << 20 else 5
        row = {"bytes": nbytes}
        tpu_dist = dist.distributed_c10d._get_default_group()._get_backend(torch.device("tpu"))
        for name, device, group, check in (
            ("cpu", "cpu", gloo, True),
            ("tpu", "tpu", None, True),
            ("tpu_unchecked", "tpu", None, False),
        ):
            tpu_dist.impl._check_calls = check  # TORCH_TPU_DIST_CHECK_CALLS, per run
            t = torch.ones(nbytes // 4, device=device)
            dist.all_reduce(t, group=group)  # warm: connections, cache
            seconds = _median_s(lambda t=t, group=group: dist.all_reduce(t, group=group), reps)
            row[f"{name}_ms"] = seconds * 1e3
            row[f"{name}_busbw_gbs"] = nbytes * 2 * (world - 1) / world / seconds / 1e9
        tpu_dist.impl._check_calls = True
        rows.append(row)
    return rows


def _lm(device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
    model = torch.nn.Sequential(
        torch.nn.Embedding(50, 64), torch.nn.TransformerEncoder(layer, 2), torch.nn.Linear(64, 50)
    )
    return model.to(device)


def _ddp_step_ms(device: str, group: dist.ProcessGroup | None, steps: int) -> float:
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(_lm(device), process_group=group)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, 50, (8, 33), generator=torch.Generator().manual_seed(dist.get_rank()))
    x, y = data[:, :-1].to(device), data[:, 1:].to(device)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, 50), y.reshape(-1))
        loss.backward()
        opt.step()
        loss.item()
        times.append(time.perf_counter() - start)
    return statistics.median(times[3:]) * 1e3


def _rank(rank: int, world: int, store: str, steps: int, results) -> None:
    os.environ.setdefault("TORCH_TPU_EAGER_MODE", "defer_and_fuse")
    import deferfuse  # noqa: F401

    dist.init_process_group(
        "tpu_dist",
        init_method=f"file://{store}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=300),
    )
    gloo = dist.new_group(backend="gloo")
    torch.set_num_threads(1)  # the two ranks share the machine's cores
    out = {"allreduce": _bandwidth(world, gloo)}
    out["ddp_step_ms"] = {
        "cpu_gloo": _ddp_step_ms("cpu", gloo, steps),
        "tpu_dist": _ddp_step_ms("tpu", None, steps),
    }
    dist.destroy_process_group()
    results.put((rank, out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    world = 2
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [
            ctx.Process(target=_rank, args=(r, world, os.path.join(tmp, "store"), args.steps, results))
            for r in range(world)
        ]
        for p in procs:
            p.start()
        got = dict(results.get(timeout=1800) for _ in procs)
        for p in procs:
            p.join(60)
    report = got[0]
    if args.json:
        print(json.dumps(report))
        return
    print(f"allreduce, {world} ranks, float32 (median; bus bandwidth GB/s)")
    print(
        "| size | gloo, CPU tensors (ms) | tpu_dist (ms) | tpu_dist, calls unchecked (ms) | gloo bus GB/s | tpu_dist bus GB/s | tpu_dist / gloo | unchecked / gloo |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in report["allreduce"]:
        size = f"{r['bytes'] >> 10} KiB" if r["bytes"] < 1 << 20 else f"{r['bytes'] >> 20} MiB"
        print(
            f"| {size} | {r['cpu_ms']:.3f} | {r['tpu_ms']:.3f} | {r['tpu_unchecked_ms']:.3f} | {r['cpu_busbw_gbs']:.3f}"
            f" | {r['tpu_busbw_gbs']:.3f} | {r['tpu_ms'] / r['cpu_ms']:.2f} | {r['tpu_unchecked_ms'] / r['cpu_ms']:.2f} |"
        )
    d = report["ddp_step_ms"]
    print(
        f"DDP step, small LM, {world} ranks: gloo cpu {d['cpu_gloo']:.1f} ms, tpu_dist {d['tpu_dist']:.1f} ms"
    )


if __name__ == "__main__":
    sys.exit(main())
