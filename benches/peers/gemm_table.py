"""Reruns the GEMM table of docs/results/gemm.md: runs `gemm_table --peers
--json` (deferfuse's matmul, the gemm and matrixmultiply crates and
torch.matmul, interleaved in rounds) and prints the Markdown table, GFLOP/s
from each side's fastest call with the median in parentheses.

    .venv/bin/python benches/peers/gemm_table.py [--quick] [--from FILE]

`--from FILE` formats the JSON lines of an earlier run instead.
"""

import argparse
import json
import os
import subprocess
import sys

COLUMNS = [
    ("deferfuse", "deferfuse"),
    ("gemm", "gemm crate"),
    ("matrixmultiply", "matrixmultiply"),
    ("torch", "torch.matmul"),
]


def cell(row, key):
    if f"{key}_gflops" not in row:
        return "–"
    return f"{row[f'{key}_gflops']:.0f} ({row[f'{key}_median_gflops']:.0f})"


def table(rows):
    head = ["case", "layout", "dtype", "b×m×k×n"] + [name for _, name in COLUMNS] + ["deferfuse / torch"]
    lines = [
        "| " + " | ".join(head) + " |",
        "| " + " | ".join(["---"] * 4 + ["---:"] * (len(COLUMNS) + 1)) + " |",
    ]
    for r in rows:
        ratio = "–"
        if "torch_gflops" in r:
            ratio = f"{r['deferfuse_gflops'] / r['torch_gflops']:.2f}"
        dims = f"{r['b']}×{r['m']}×{r['k']}×{r['n']}"
        cells = [r["case"], r["layout"], r["dtype"], dims] + [cell(r, key) for key, _ in COLUMNS] + [ratio]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--from", dest="source", default=None)
    args = parser.parse_args()
    if args.source:
        with open(args.source) as f:
            text = f.read()
    else:
        root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
        cmd = [
            "cargo",
            "run",
            "--release",
            "-q",
            "-p",
            "benches",
            "--bin",
            "gemm_table",
            "--",
            "--peers",
            "--json",
        ]
        if args.quick:
            cmd.append("--quick")
        text = subprocess.run(cmd, cwd=root, check=True, capture_output=True, text=True).stdout
    rows = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    if not rows:
        sys.exit("gemm_table printed no rows")
    print(table(rows))


if __name__ == "__main__":
    main()
