"""transformers models from small configs on `tpu`, against CPU eager: a
forward pass in DeferAndFuse for a few architectures and one training step
(the full table: `python bindings/conformance/models.py`)."""

from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "conformance"))
import models  # noqa: E402


@pytest.mark.parametrize("name", ["gpt2", "llama", "t5", "vit"])
def test_forward_matches_cpu(name):
    row = models.run_forward(name, "defer_and_fuse")
    assert row["ran"], row.get("error")
    assert row["matched"], row


def test_training_step_matches_cpu():
    row = models.run_training("bert", "defer_and_fuse")
    assert row["ran"], row.get("error")
    assert row["matched"], row
