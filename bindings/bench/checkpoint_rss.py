"""Peak host memory (RSS) of saving and loading a 1 GiB state dict on `tpu`,
each way in a process of its own; `tpu` values live in host memory, so the
question is how many copies of the checkpoint the host holds at once.

The state dict is a model's: bias-free Linear(4096, 4096) layers in
float32, 64 MiB per weight, 16 of them for 1 GiB (`--gib` sets the layer
count, `--side` the layer width: 2048 makes 16 MiB weights, which glibc's
malloc serves from its heap instead of fresh mappings). For every way
the script prints the RSS before (imports done, and the model made where
the way has one), the peak (the process's high-water mark) and the RSS at
the end, in MiB, with the loaded tensors still alive and each read once (a
first read is when bytes that `torch.load` copied untyped take their dtype).

    python bindings/bench/checkpoint_rss.py [--gib 1.0] [--side 4096] [--mmap-threshold BYTES] [--json]

docs/checkpoints.md has the numbers and what they mean.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

SIDE = 4096  # the default layer: 64 MiB

#: name -> (what it does, whether a model on tpu exists before loading)
WAYS = {
    "save": ("torch.save(model.state_dict(), f) of the model on tpu", True),
    "load_cpu": ("torch.load(f, map_location='cpu'): PyTorch alone, for reference", False),
    "load_tpu": ("torch.load(f) to tpu (the location it was saved from)", False),
    "load_tpu_mmap": ("torch.load(f, mmap=True) to tpu", False),
    "load_cpu_then_move": ("torch.load(f, map_location='cpu'), then each tensor .to('tpu')", False),
    "model_load_state_dict": ("model on tpu; model.load_state_dict(torch.load(f))", True),
    "model_load_state_dict_mmap": ("model on tpu; model.load_state_dict(torch.load(f, mmap=True))", True),
}


def _status(key: str) -> int:
    """A /proc/self/status figure in MiB (VmRSS: now; VmHWM: the peak)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) // 1024
    raise KeyError(key)


def _reset_peak() -> None:
    """Makes VmHWM start again from the current RSS (Linux: clear_refs 5)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _model(torch, layers: int, side: int):
    model = torch.nn.Sequential(
        *(torch.nn.Linear(side, side, bias=False, device="tpu") for _ in range(layers))
    )
    torch.tpu.synchronize()
    return model


def _touch(torch, tensors) -> None:
    """Reads every tensor once (a sum of each, run together)."""
    total = sum(t.sum() for t in tensors)
    float(total)


def child(way: str, path: str, layers: int, side: int) -> dict:
    import deferfuse  # noqa: F401
    import torch

    model = _model(torch, layers, side) if WAYS[way][1] else None
    before = _status("VmRSS")
    _reset_peak()
    if way == "save":
        torch.save(model.state_dict(), path)
        kept = []
    elif way == "load_cpu":
        kept = list(torch.load(path, map_location="cpu", weights_only=True).values())
    elif way == "load_tpu":
        kept = list(torch.load(path, weights_only=True).values())
    elif way == "load_tpu_mmap":
        kept = list(torch.load(path, mmap=True, weights_only=True).values())
    elif way == "load_cpu_then_move":
        state = torch.load(path, map_location="cpu", weights_only=True)
        kept = [state.pop(k).to("tpu") for k in list(state)]
    elif way in ("model_load_state_dict", "model_load_state_dict_mmap"):
        mmap = way.endswith("_mmap")
        model.load_state_dict(torch.load(path, mmap=mmap, weights_only=True))
        kept = list(model.parameters())
    else:
        raise ValueError(way)
    _touch(torch, kept)
    return {"way": way, "before": before, "peak": _status("VmHWM"), "after": _status("VmRSS")}


def _run(way: str, path: str, layers: int, side: int, mmap_threshold: int | None) -> dict:
    command = [sys.executable, __file__, "--child", way, path, str(layers), str(side)]
    env = dict(os.environ)
    if mmap_threshold is not None:
        env["MALLOC_MMAP_THRESHOLD_"] = str(mmap_threshold)
    out = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{way} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=1.0, help="state dict size in GiB (default 1)")
    parser.add_argument(
        "--side", type=int, default=SIDE, help=f"layer width (default {SIDE}: 64 MiB weights)"
    )
    parser.add_argument(
        "--mmap-threshold",
        type=int,
        help="run the children with MALLOC_MMAP_THRESHOLD_ set to this many bytes (glibc then maps "
        "every larger buffer afresh and unmaps it when freed, instead of keeping freed ones in its heap)",
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        way, path, layers, side = args.child
        print(json.dumps(child(way, path, int(layers), int(side))))
        return
    layer_bytes = args.side * args.side * 4
    layers = max(1, round(args.gib * (1 << 30) / layer_bytes))
    size_mib = layers * layer_bytes >> 20
    with tempfile.TemporaryDirectory() as d:
        # The `save` way writes the checkpoint that every other way loads.
        path = os.path.join(d, "state.pt")
        rows = [_run("save", path, layers, args.side, args.mmap_threshold)]
        rows += [_run(way, path, layers, args.side, args.mmap_threshold) for way in WAYS if way != "save"]
    if args.json:
        print(
            json.dumps(
                {"state_dict_mib": size_mib, "mmap_threshold": args.mmap_threshold, "ways": rows}, indent=2
            )
        )
        return
    malloc = "default" if args.mmap_threshold is None else f"MALLOC_MMAP_THRESHOLD_={args.mmap_threshold}"
    print(
        f"state dict: {size_mib} MiB ({layers} x Linear({args.side}, {args.side}) float32); malloc {malloc}; RSS in MiB"
    )
    print(f"{'way':<28} {'before':>7} {'peak':>7} {'after':>7} {'peak-before':>12}  what")
    for r in rows:
        print(
            f"{r['way']:<28} {r['before']:>7} {r['peak']:>7} {r['after']:>7} "
            f"{r['peak'] - r['before']:>12}  {WAYS[r['way']][0]}"
        )


if __name__ == "__main__":
    main()
