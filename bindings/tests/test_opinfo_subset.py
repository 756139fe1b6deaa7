"""A fixed subset of PyTorch's OpInfo samples, float32, in DeferAndFuse and
Strict: fails when an op passes fewer samples, or falls back to the CPU on
more, than the recorded baseline (opinfo_baseline.json, written by
`python bindings/tests/test_opinfo_subset.py --record`)."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "conformance"))
import opinfo  # noqa: E402

OPS = """add sub mul div true_divide rsub pow abs neg exp log sqrt rsqrt reciprocal tanh sigmoid sin cos floor
ceil trunc sign square clamp maximum minimum eq ne lt le gt ge logical_and logical_or logical_not where
masked_fill lerp addcmul addcdiv sum mean amax amin argmax argmin prod var std logsumexp mm bmm matmul addmm
baddbmm softmax log_softmax nn.functional.layer_norm nn.functional.gelu nn.functional.silu nn.functional.relu
nn.functional.leaky_relu nn.functional.hardtanh nn.functional.elu nn.functional.softplus nn.functional.linear
cat stack transpose permute reshape view squeeze unsqueeze expand narrow select t flatten chunk split tril triu
full_like zeros_like ones_like isnan isinf""".split()
BASELINE = pathlib.Path(__file__).with_name("opinfo_baseline.json")
MODES = ("defer_and_fuse", "strict")


def _rows(mode: str) -> dict[str, dict]:
    result = opinfo.run(mode, torch.float32, OPS, max_samples=12)
    rows: dict[str, dict] = {}
    for r in result["rows"]:
        row = rows.setdefault(r.name, {"samples": 0, "passed": 0, "fell_back": 0})
        row["samples"] += r.samples
        row["passed"] += r.passed
        row["fell_back"] += r.fell_back
    return rows


@pytest.mark.parametrize("mode", MODES)
def test_no_regression_against_baseline(mode):
    baseline = json.loads(BASELINE.read_text())[mode]
    rows = _rows(mode)
    problems = []
    for name, want in baseline.items():
        got = rows.get(name, {"samples": 0, "passed": 0, "fell_back": 0})
        if got["passed"] < want["passed"]:
            problems.append(f"{name}: {got['passed']}/{got['samples']} passed, baseline {want['passed']}")
        if got["fell_back"] > want["fell_back"]:
            problems.append(f"{name}: {got['fell_back']} samples fell back, baseline {want['fell_back']}")
    assert not problems, "\n".join(problems)
    total = sum(r["samples"] for r in rows.values())
    assert total >= 300, f"only {total} samples ran"


if __name__ == "__main__" and "--record" in sys.argv:
    BASELINE.write_text(json.dumps({m: _rows(m) for m in MODES}, indent=1, sort_keys=True) + "\n")
    print(f"wrote {BASELINE}")
