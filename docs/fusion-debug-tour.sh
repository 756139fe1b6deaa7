#!/usr/bin/env bash
# Regenerates the fusion-debug walkthrough of docs/fusion-debug.md: dumps of the
# transformer block at batch 2 (`--quick`) and batch 8 (two processes), dumps
# of one process running an MLP block at batches 2, 8, 32 and 1 (the
# batch_sizes example), the answers, and docs/fusion-debug-transformer.png (a
# headless-Chromium screenshot of the HTML view). Needs /usr/bin/chromium
# (bash .ci/setup_chromium).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-$(mktemp -d)}"
cargo build --release -q -p benches --bin compare -p deferfuse --bin fusion-debug --example batch_sizes
target="${CARGO_TARGET_DIR:-target}/release"
rm -rf "$out/b2" "$out/b8" "$out/batches"
TORCH_TPU_FUSION_DUMP="$out/b2" "$target/compare" --quick --workload transformer_block --runs 3 >/dev/null
TORCH_TPU_FUSION_DUMP="$out/b8" "$target/compare" --workload transformer_block --runs 3 >/dev/null
# Flush 0 of each run makes the inputs; flush 1 is the block's first (cold) step.
a="$(ls "$out"/b2/*.json | sed -n 2p)"
b="$(ls "$out"/b8/*.json | sed -n 2p)"
"$target/fusion-debug" summary "$out/b2"
"$target/fusion-debug" explain "$a" --op 26
"$target/fusion-debug" diff "$a" "$b"
# One process, four batch sizes (the disk cache off, so only tier 1 serves):
# flush 0 makes the weights; flushes 1 to 4 are batches 2, 8, 32 and 1.
TORCH_TPU_CACHE_DIR=off TORCH_TPU_FUSION_DUMP="$out/batches" "$target/examples/batch_sizes" 2 8 32 1
"$target/fusion-debug" summary "$out/batches"
"$target/fusion-debug" diff "$(ls "$out"/batches/*.json | sed -n 2p)" "$(ls "$out"/batches/*.json | sed -n 3p)"
"$target/fusion-debug" diff "$(ls "$out"/batches/*.json | sed -n 2p)" "$(ls "$out"/batches/*.json | sed -n 5p)"
"$target/fusion-debug" show "$a" --format html -o "$out/transformer.html"
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --user-data-dir="$out/profile" --hide-scrollbars --window-size=1600,1100 \
    --screenshot="$PWD/docs/fusion-debug-transformer.png" "file://$out/transformer.html" 2>/dev/null
echo "dumps and page in $out; screenshot in docs/fusion-debug-transformer.png"
