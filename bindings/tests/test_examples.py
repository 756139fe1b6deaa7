"""The examples of bindings/examples/ at their smallest size, two steps, in
every mode: their losses (and the tokens minGPT, Llama and Qwen2 generate)
against CPU eager
within each example's written tolerance, and the ops that fell back."""

from __future__ import annotations

import importlib
import pathlib
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))

import _runner  # noqa: E402

#: example -> (tolerance, ops allowed to fall back to the CPU)
CASES = {
    "resnet": (1e-4, set()),  # two steps; the example explains its 2e-2 over more
    "mingpt": (1e-4, set()),
    "dlrm": (1e-5, set()),
    # generate() ands integer flags; the engine has no integer bitwise ops.
    "llama": (1e-4, {"aten::bitwise_and.Tensor"}),
    "qwen": (1e-4, {"aten::bitwise_and.Tensor"}),
    "unet": (1e-4, set()),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_example_trains_like_cpu_in_every_mode(name):
    tolerance, allowed = CASES[name]
    example = importlib.import_module(name)
    rows = _runner.compare(name, example.train, tolerance, steps=2, size="tiny")
    assert [way for way, *_ in rows] == ["CPU eager"] + [f"tpu {m}" for m in _runner.MODES]
    for way, _first, _warm, fell in rows:
        assert set(fell) <= allowed, f"{name} on {way} fell back: {fell}"
