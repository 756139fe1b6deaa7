"""The zoo's fixed sample (bindings/conformance/zoo.py --sample), DeferAndFuse,
each architecture in its own process: fails when an architecture that ran,
matched or stayed off the CPU fallback in the recorded baseline
(zoo_baseline.json, written by `python bindings/tests/test_zoo_sample.py
--record`) no longer does."""

from __future__ import annotations

import csv
import json
import pathlib
import subprocess
import sys

ZOO = pathlib.Path(__file__).resolve().parents[1] / "conformance" / "zoo.py"
BASELINE = pathlib.Path(__file__).with_name("zoo_baseline.json")


def _sample(tmp: pathlib.Path) -> dict[str, dict]:
    out = tmp / "zoo.csv"
    subprocess.run([sys.executable, str(ZOO), "--sample", "--csv", str(out)], check=True, capture_output=True)
    with open(out) as f:
        return {
            r["model"]: {
                "tried": r["tried"] == "True",
                "ran": r["ran"] == "True",
                "matched": r["matched"] == "True",
                "on_engine": r["tried"] == "True" and not r["fell_back"],
            }
            for r in csv.DictReader(f)
        }


def test_the_sample_keeps_what_the_baseline_had(tmp_path):
    now, then = _sample(tmp_path), json.loads(BASELINE.read_text())
    lost = [
        f"{model}: no longer {what}"
        for model, was in then.items()
        for what in ("tried", "ran", "matched", "on_engine")
        if was[what] and not now.get(model, {}).get(what)
    ]
    assert not lost, lost
    assert sum(r["matched"] for r in now.values()) >= 0.75 * len(now)


if __name__ == "__main__" and "--record" in sys.argv:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        BASELINE.write_text(json.dumps(_sample(pathlib.Path(d)), indent=1, sort_keys=True) + "\n")
