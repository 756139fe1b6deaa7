"""`tpu_dist`, the process-group backend of `tpu`, across real processes.

Each test runs a scenario of `dist_workers.py` in a fresh interpreter that
spawns the ranks (rendezvous through a file store), with a timeout so that a
hang fails the test instead of blocking the suite.

Tolerances: a collective moves the same host bytes through the same gloo
code as the CPU reference, so it must match bit for bit, except a coalesced
allreduce (one flat buffer: gloo's ring chunks it differently, f32 rounding).
Data-parallel training equals single-process full-batch training within
1e-5 relative (the halves' gradients are summed in another order).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKERS = Path(__file__).with_name("dist_workers.py")
TRAINING_REL = 1e-5


def _run(scenario: str, world: int, timeout: int = 300, env: dict | None = None) -> list[dict]:
    run = subprocess.run(
        [sys.executable, str(WORKERS), scenario, str(world)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    reports = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert run.returncode == 0 and len(reports) == world, run.stderr[-3000:]
    return reports


@pytest.mark.parametrize("world", [2, 4])
def test_every_collective_and_dtype_equals_gloo_on_cpu(world):
    for report in _run("collectives", world):
        assert "error" not in report, report.get("trace")
        cases = {k: v for k, v in report.items() if k != "rank"}
        assert len(cases) >= 60  # every op and dtype case of dist_workers.collectives
        # A failure message, or a difference from gloo on CPU tensors.
        wrong = {
            k: v
            for k, v in cases.items()
            if not isinstance(v, float) or v > (1e-6 if "coalesced" in k else 0.0)
        }
        assert not wrong, f"rank {report['rank']}: {wrong}"


def test_ddp_fsdp2_and_dtensor_equal_single_process_training():
    for report in _run("training", 2):
        assert "error" not in report, report.get("trace")
        for name in ("ddp_mlp", "ddp_lm", "ddp_find_unused", "ddp_static_graph", "ddp_bucket_view"):
            assert report[name] <= TRAINING_REL, (name, report[name])
        assert report["fsdp_loss"] <= TRAINING_REL and report["fsdp_params"] <= TRAINING_REL, report
        assert report["fsdp_state_dict_is_full"] is True
        assert report["dtensor_matmul"] <= 1e-5 and report["dtensor_redistribute"] == 0.0, report
        assert report["tensor_parallel_mlp"] <= 1e-5, report
        assert report["asymmetric"] == 0.0, report
        assert report["compiled_collective"] == 0.0, report


@pytest.mark.parametrize("mode", ["strict", "debug", "defer_and_fuse"])
def test_a_transport_writes_a_whole_storage_in_place_and_reaches_no_other(mode):
    """What collectives hand the transport for a whole storage: the engine's
    own buffer, written in place (no copy back), that only this storage sees."""
    import deferfuse
    from deferfuse import _handles

    with deferfuse.mode(mode):
        t = torch.arange(12.0).to("tpu")
        view, copy, same, pending = t.view(3, 4), t.clone(), t * 1.0, t + 1.0
        alias = _handles.host_alias(t)
        assert alias is not None and alias.device.type == "cpu"
        alias.fill_(7.0)
        assert torch.equal(t.cpu(), torch.full((12,), 7.0)) and torch.equal(
            view.cpu(), torch.full((3, 4), 7.0)
        )
        want = torch.arange(12.0)
        assert torch.equal(copy.cpu(), want) and torch.equal(same.cpu(), want)
        assert torch.equal(pending.cpu(), want + 1)
        # The same storage again: its buffer is its own now, so once the
        # first alias (which holds the value too) is gone, nothing is copied.
        address = alias.data_ptr()
        del alias
        assert _handles.host_alias(t).data_ptr() == address
        # A reader's view: the buffer itself (no copy); it keeps the value it
        # read alive when the storage moves on to a new value.
        view = _handles.host_view(t)
        assert view.data_ptr() == address
        t.add_(1.0)
        assert torch.equal(view, torch.full((12,), 7.0)) and torch.equal(t.cpu(), torch.full((12,), 8.0))
        # Part of a storage, a bool storage, an empty one: no alias (staged instead).
        assert _handles.host_alias(t[2:]) is None
        assert _handles.host_alias(torch.ones(3, dtype=torch.bool).to("tpu")) is None
        assert _handles.host_alias(torch.ones(0).to("tpu")) is None


def test_mismatched_calls_and_a_dead_rank_are_clear_errors_not_hangs():
    survivor, dead = _run("faults", 2)
    assert dead == {"rank": 1, "error": "no report"}
    expected = (
        "ranks made different collective calls (rank 0: allreduce(float32[4]); rank 1: allreduce(float32[5]))"
    )
    assert expected in survivor["mismatch"]
    assert "closed by peer" in survivor["peer_died"] or "reset by peer" in survivor["peer_died"], survivor
    # Both within a few seconds: far below the group's 60 s timeout.
    assert survivor["mismatch_s"] < 30 and survivor["peer_died_s"] < 30, survivor
    # A peer late past a group's 3 s timeout: an error at the timeout, not a hang.
    assert "timed out" in survivor["late"].lower() or "timeout" in survivor["late"].lower(), survivor
    assert 2.5 < survivor["late_s"] < 8, survivor


def test_tpu_dist_is_the_default_for_tpu_pairs_with_gloo_and_its_works_answer_as_gloos_do():
    reports = _run("defaults", 2)
    for report in reports:
        assert "error" not in report, report.get("trace")
        assert report["default"] == "TpuDistBackend"
        assert report["both"] == ["ProcessGroupGloo", "TpuDistBackend"]
        assert report["tpu_sum"] == [6.0] * 3 and report["cpu_sum"] == [3.0] * 3
        assert report["completed"] is True
    receiver = next(r for r in reports if r["rank"] == 0)
    assert receiver["sender"] == 1 and receiver["received"] == [8.0, 8.0], receiver


def test_ranks_on_one_host_build_each_program_once(tmp_path):
    reports = _run("shared_cache", 2, env={"TORCH_TPU_CACHE_DIR": str(tmp_path / "cache")})
    assert all("error" not in r for r in reports), reports
    tier3 = [r["tier3"] for r in reports]
    programs = tier3[0]["hits"] + tier3[0]["misses"]
    assert programs >= 3 and all(t["hits"] + t["misses"] == programs for t in tier3), tier3
    # One rank missed (and built) each program; the other waited and read it.
    assert sum(t["misses"] for t in tier3) == programs, tier3
    assert sum(t["hits"] for t in tier3) == programs * (len(tier3) - 1), tier3


def test_transformers_trainer_under_torchrun_matches_one_process(tmp_path):
    """A tiny GPT-2 trained by the Trainer: 2 ranks of batch 2 (torchrun,
    tpu_dist picked by the Trainer itself) against one process of batch 4."""
    script = Path(__file__).with_name("trainer_ddp.py")
    runs = {
        "one": [sys.executable, str(script), str(tmp_path / "one.json"), "4"],
        "two": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
        + [str(script), str(tmp_path / "two.json"), "2"],
    }
    got = {}
    for name, cmd in runs.items():
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
        assert run.returncode == 0, run.stderr[-3000:]
        got[name] = json.loads((tmp_path / f"{name}.json").read_text())
    one, two = got["one"], got["two"]
    assert one["device"] == two["device"] == "tpu:0"
    assert (one["world"], one["backend"]) == (1, None) and (two["world"], two["backend"]) == (2, "tpu_dist")
    assert len(one["losses"]) == len(two["losses"]) == 3
    for a, b in zip(one["losses"], two["losses"]):
        assert abs(a - b) <= TRAINING_REL * abs(a), (one["losses"], two["losses"])
    for key in ("weights", "weights_abs"):
        assert abs(one[key] - two[key]) <= TRAINING_REL * abs(one[key]), (one, two)
