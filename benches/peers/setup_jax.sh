#!/usr/bin/env bash
# Creates the bench-only venv `.venv-bench` at the repository root with jax
# (and its jaxlib, XLA's CPU backend) from PyPI, for `compare --peers`.
# Not part of the test setup: the tests never need jax. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/../.."

# Unpinned by default: the newest jax this Python supports (0.10.2 on
# Python 3.11, 0.12 on 3.12+). JAX_VERSION=x.y.z pins one.
JAX_VERSION="${JAX_VERSION:-}"

if [ ! -x .venv-bench/bin/python ]; then
    python3 -m venv .venv-bench
fi
installed="$(.venv-bench/bin/python -c 'import jax; print(jax.__version__)' 2>/dev/null || true)"
if [ -z "$installed" ] || { [ -n "$JAX_VERSION" ] && [ "$installed" != "$JAX_VERSION" ]; }; then
    spec="jax${JAX_VERSION:+==$JAX_VERSION}"
    .venv-bench/bin/python -m pip install --disable-pip-version-check --quiet "$spec" numpy
fi
.venv-bench/bin/python -c 'import jax; print("jax", jax.__version__, "devices", jax.devices())'
