"""Runs PyTorch's own OpInfo sample inputs on `tpu` and compares each result
with CPU eager.

    python bindings/conformance/opinfo.py --mode defer_and_fuse --dtype float32 [--ops add,mul] [--json]

Prints the counts (samples tried, passed, mismatched, errored, fell back to
the CPU) and a per-op table; with --json the last line is one JSON object with
the keys samples, passed, mismatched, errored, fell_back (and the per-op
rows). A sample "fell back" when any aten op it ran used the CPU fallback; it
still counts as passed or not by its result. Tolerances: float32 rtol 1e-4,
atol 1e-5; bfloat16 rtol 1.6e-2, atol 1e-2 (fused kernels round once).

A sample whose `tpu` run drew from the device generator (dropout, `rand_like`,
`normal_`, ...; seen by its count of draws, which OpInfo's state restoring
leaves alone) is compared by dtype and shape only and counted as "random":
the device generator's numbers differ from the CPU generator's by design
(as CUDA's do); `bindings/tests/test_random.py` tests their distributions.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

os.environ.setdefault("TORCH_TPU_CACHE_DIR", "off")
warnings.filterwarnings("ignore")

import deferfuse  # noqa: E402
import torch  # noqa: E402
from deferfuse import _generator  # noqa: E402
from torch.utils._pytree import tree_flatten, tree_map  # noqa: E402

TOLERANCE = {torch.float32: (1e-4, 1e-5), torch.bfloat16: (1.6e-2, 1e-2)}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}

# Ops whose samples take minutes on the CPU fallback or need features outside
# an op test (sparse layouts, complex-only, host synchronization primitives).
# Ops whose results are uninitialized memory: only dtype and shape are compared
# (as PyTorch's own OpInfo tests do).
UNINITIALIZED = {"empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted"}
SKIP = {"nn.functional.ctc_loss", "linalg.lstsq", "to_sparse", "sparse.sampled_addmm", "sparse.mm"}


@dataclass
class OpRow:
    name: str
    samples: int = 0
    passed: int = 0
    mismatched: int = 0
    errored: int = 0
    fell_back: int = 0
    # samples that drew from the device generator: compared by dtype and shape only
    random: int = 0
    first_problem: str = ""
    fallback_ops: set[str] = field(default_factory=set)
    # aten op -> samples of this OpInfo op in which it fell back
    fallback_samples: dict[str, int] = field(default_factory=dict)


def _to_tpu(x: Any) -> Any:
    return x.to("tpu") if isinstance(x, torch.Tensor) else x


def _to_cpu(x: Any) -> Any:
    return x.cpu() if isinstance(x, torch.Tensor) else x


def _compare(expected: Any, got: Any, dtype: torch.dtype, values: bool = True) -> str | None:
    """None when `got` matches `expected`; otherwise why not."""
    exp_leaves, exp_spec = tree_flatten(expected)
    got_leaves, got_spec = tree_flatten(got)
    if len(exp_leaves) != len(got_leaves):
        return f"structure {exp_spec} vs {got_spec}"
    rtol, atol = TOLERANCE[dtype]
    for e, g in zip(exp_leaves, got_leaves):
        if isinstance(e, torch.Tensor):
            if not isinstance(g, torch.Tensor):
                return f"expected a tensor, got {type(g).__name__}"
            if g.device.type != "cpu":
                return f"result on {g.device}"
            if e.dtype != g.dtype or e.shape != g.shape:
                return f"dtype/shape {e.dtype}{list(e.shape)} vs {g.dtype}{list(g.shape)}"
            if not values:
                continue
            try:
                torch.testing.assert_close(g, e, rtol=rtol, atol=atol, equal_nan=True, check_device=False)
            except AssertionError as err:
                return str(err).splitlines()[0] + " " + " ".join(str(err).splitlines()[2:4])
        elif isinstance(e, float) and isinstance(g, float):
            if not (abs(e - g) <= atol + rtol * abs(e) or (e != e and g != g)):
                return f"{g} vs {e}"
        elif e != g and not (isinstance(e, float) and e != e):
            return f"{g!r} vs {e!r}"
    return None


def run_op(op: Any, dtype: torch.dtype, max_samples: int | None = None) -> OpRow:
    row = OpRow(op.name)
    try:
        samples = list(op.sample_inputs("cpu", dtype, requires_grad=False))
    except Exception as err:  # the OpInfo cannot make samples for this dtype
        row.first_problem = f"no samples: {err}"[:200]
        return row
    for index, sample in enumerate(samples[:max_samples]):
        args = (sample.input, *sample.args)
        torch.manual_seed(index)
        try:
            expected = op(*args, **sample.kwargs)
        except Exception:
            continue  # CPU eager rejects this sample too: not a test of ours
        row.samples += 1
        before = deferfuse.fallback_counts()
        torch.manual_seed(index)
        draws = _generator.draws()
        try:
            got = op(*tree_map(_to_tpu, args), **tree_map(_to_tpu, sample.kwargs))
            got = tree_map(_to_cpu, got)
            drew = _generator.draws() != draws
            row.random += drew
            problem = _compare(expected, got, dtype, values=op.name not in UNINITIALIZED and not drew)
            if problem is None:
                row.passed += 1
            else:
                row.mismatched += 1
                row.first_problem = row.first_problem or f"mismatch: {problem}"[:300]
        except Exception as err:
            row.errored += 1
            row.first_problem = (
                row.first_problem or f"error: {type(err).__name__}: {err}".splitlines()[0][:300]
            )
        used = deferfuse.fallback_counts() - before
        if used:
            row.fell_back += 1
            row.fallback_ops |= set(used)
            for aten_op in used:
                row.fallback_samples[aten_op] = row.fallback_samples.get(aten_op, 0) + 1
    return row


def select_ops(names: list[str] | None, dtype: torch.dtype) -> list[Any]:
    from torch.testing._internal.common_methods_invocations import op_db

    chosen = []
    for op in op_db:
        full = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
        if names is not None and op.name not in names and full not in names:
            continue
        if op.name in SKIP or dtype not in op.supported_dtypes("cpu"):
            continue
        chosen.append(op)
    return chosen


def top_fallbacks(rows: list[OpRow]) -> list[tuple[str, int, list[str]]]:
    """Each aten op that fell back, with the number of samples in which it did
    and the OpInfo ops whose samples those were, most samples first."""
    samples: dict[str, int] = {}
    users: dict[str, list[str]] = {}
    for r in rows:
        for aten_op, n in r.fallback_samples.items():
            samples[aten_op] = samples.get(aten_op, 0) + n
            users.setdefault(aten_op, []).append(r.name)
    return sorted(((k, v, users[k]) for k, v in samples.items()), key=lambda t: (-t[1], t[0]))


def run(
    mode: str,
    dtype: torch.dtype,
    names: list[str] | None = None,
    max_samples: int | None = None,
    verbose: bool = False,
) -> dict[str, Any]:
    rows = []
    with deferfuse.mode(mode):
        for op in select_ops(names, dtype):
            start = time.perf_counter()
            row = run_op(op, dtype, max_samples)
            deferfuse.sync()
            if verbose:
                took = time.perf_counter() - start
                print(
                    f"  {row.name:40s} {row.passed:3d}/{row.samples:3d} ({took:.1f}s) {row.first_problem[:80]}",
                    file=sys.stderr,
                )
            rows.append(row)
    total = {
        k: sum(getattr(r, k) for r in rows)
        for k in ("samples", "passed", "mismatched", "errored", "fell_back", "random")
    }
    return {"mode": mode, "dtype": str(dtype).replace("torch.", ""), "ops": len(rows), **total, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", default="defer_and_fuse", choices=["strict", "debug", "defer_and_fuse"])
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    parser.add_argument("--ops", help="comma-separated OpInfo names (default: all)")
    parser.add_argument("--max-samples", type=int, help="at most this many samples per op")
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    parser.add_argument("--verbose", action="store_true", help="print each op as it finishes (stderr)")
    parser.add_argument(
        "--top-fallbacks",
        type=int,
        metavar="N",
        default=0,
        help="end with the N aten ops in the most samples that fell back",
    )
    a = parser.parse_args()
    names = a.ops.split(",") if a.ops else None
    result = run(a.mode, DTYPES[a.dtype], names, a.max_samples, a.verbose)
    rows = result.pop("rows")
    print(
        f"{'op':40s} {'samples':>7s} {'pass':>5s} {'mism':>5s} {'err':>5s} {'cpu':>5s}  first problem / ops that fell back"
    )
    for r in rows:
        note = r.first_problem or ", ".join(sorted(r.fallback_ops))
        print(
            f"{r.name:40s} {r.samples:7d} {r.passed:5d} {r.mismatched:5d} {r.errored:5d} {r.fell_back:5d}  {note[:140]}"
        )
    n = max(result["samples"], 1)
    print(
        f"\nmode {result['mode']}, {result['dtype']}: {result['ops']} ops, {result['samples']} samples: "
        f"{result['passed']} passed ({100 * result['passed'] / n:.1f}%), {result['mismatched']} mismatched, "
        f"{result['errored']} errored, {result['fell_back']} fell back to the CPU ({100 * result['fell_back'] / n:.1f}%); "
        f"{result['random']} drew random numbers (compared by dtype and shape)"
    )
    fallbacks = deferfuse.fallback_counts()
    print("ops through the CPU fallback (calls):", ", ".join(f"{k} {v}" for k, v in fallbacks.most_common()))
    if a.top_fallbacks:
        print(f"\naten ops by samples that fell back through them (top {a.top_fallbacks}):")
        for aten_op, count, users in top_fallbacks(rows)[: a.top_fallbacks]:
            print(f"  {count:6d}  {aten_op:45s} {', '.join(users[:6])}{' ...' if len(users) > 6 else ''}")
    if a.json:
        result["fallback_ops"] = dict(fallbacks)
        result["fallback_samples"] = {op: n for op, n, _ in top_fallbacks(rows)}
        print(json.dumps(result))


if __name__ == "__main__":
    main()
