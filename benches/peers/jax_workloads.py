"""The six benchmark workloads of `benches/src/lib.rs`, as `jax.jit` functions
on XLA's CPU backend: the peer `compare --peers` measures deferfuse against.

Same shapes, same primitives (GELU with tanh, LayerNorm with mean and
variance, softmax with max/exp/sum/div), f32. Prints one JSON object per
workload: `jax_ms` (median execute time of the compiled function, results
ready), `jax_min_ms` and `jax_compile_ms` (lowering plus XLA compilation, first
call).

Run it with the bench venv: `bash benches/peers/setup_jax.sh`, then
`.venv-bench/bin/python benches/peers/jax_workloads.py [--quick] [--runs N] [--workload NAME ...]
[--plugin PATH] [--donate]`. `--plugin` runs jax on a PJRT plugin library (the
one deferfuse's PJRT backend loads) instead of jaxlib's own CPU client, so both
compile with the same XLA build; `compare --peers` passes it, and `--serve`,
under which it answers compare's requests to interleave the two sides' steps.
"""

import argparse
import json
import math
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np


def use_platform(plugin):
    """Runs on jaxlib's own CPU client, or on the PJRT plugin at `plugin`
    (the library deferfuse's PJRT backend loads), so both sides compile with
    the same XLA build."""
    if plugin is None:
        jax.config.update("jax_platforms", "cpu")
        return
    from jax._src import xla_bridge

    xla_bridge.register_plugin("deferfuse_peer", library_path=plugin)
    jax.config.update("jax_platforms", "deferfuse_peer")


def gelu_tanh(x):
    cube = x * x * x
    inner = (x + cube * 0.044715) * 0.7978845608028654
    return x * 0.5 * (jnp.tanh(inner) + 1.0)


def layer_norm(x, gamma, beta):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    centered = x - mean
    var = jnp.mean(centered * centered, axis=-1, keepdims=True)
    return centered / jnp.sqrt(var + 1e-5) * gamma + beta


def softmax(x):
    shifted = x - jnp.max(x, axis=-1, keepdims=True)
    e = jnp.exp(shifted)
    return e / jnp.sum(e, axis=-1, keepdims=True)


def mlp_block(x, w1, b1, w2, b2, gamma, beta):
    h = gelu_tanh(x @ w1.T + b1)
    y = h @ w2.T + b2 + x
    return layer_norm(y, gamma, beta)


def adam_step(p, m, v, g, t=3):
    lr, beta1, beta2, eps = 1e-3, 0.9, 0.999, 1e-8
    m = m * beta1 + g * (1.0 - beta1)
    v = v * beta2 + g * g * (1.0 - beta2)
    m_hat = m / (1.0 - beta1**t)
    v_hat = v / (1.0 - beta2**t)
    p = p - m_hat / (jnp.sqrt(v_hat) + eps) * lr
    return p, m, v


def transformer_block(x, wq, wk, wv, wo, w1, w2, g1, b1, g2, b2):
    batch, seq, width = x.shape
    heads = 4
    head_dim = width // heads

    def split(y):
        return y.reshape(batch, seq, heads, head_dim).transpose(0, 2, 1, 3)

    h = layer_norm(x, g1, b1)
    q, k, v = split(h @ wq.T), split(h @ wk.T), split(h @ wv.T)
    scores = (q @ k.transpose(0, 1, 3, 2)) * (1.0 / math.sqrt(head_dim))
    attn = softmax(scores) @ v
    merged = attn.transpose(0, 2, 1, 3).reshape(batch, seq, width)
    x = x + merged @ wo.T
    h = layer_norm(x, g2, b2)
    return x + gelu_tanh(h @ w1.T) @ w2.T


def inputs(name, quick):
    rng = np.random.default_rng(0)

    def pick(full, small):
        return small if quick else full

    def randn(shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    if name == "gelu_tanh":
        return gelu_tanh, [randn((pick(4 << 20, 1 << 20),))]
    if name == "layer_norm":
        rows = pick(8192, 2048)
        return layer_norm, [randn((rows, 1024)), randn((1024,)), randn((1024,))]
    if name == "softmax":
        return softmax, [randn((pick(8192, 2048), 1024), 2.0)]
    if name == "mlp_block":
        rows, width, hidden = 256, pick(1024, 512), pick(4096, 2048)
        return mlp_block, [
            randn((rows, width)),
            randn((hidden, width), 1 / math.sqrt(width)),
            randn((hidden,), 0.1),
            randn((width, hidden), 1 / math.sqrt(hidden)),
            randn((width,), 0.1),
            randn((width,)),
            randn((width,), 0.1),
        ]
    if name == "adam_step":
        n = pick(10_000_000, 2_000_000)
        return adam_step, [
            randn((n,)),
            randn((n,), 0.01),
            (rng.random(n) * 1e-4).astype(np.float32),
            randn((n,), 0.01),
        ]
    if name == "transformer_block":
        batch, seq, width = pick(8, 2), 128, 256
        s = 1 / math.sqrt(width)
        shapes = [(width, width)] * 4 + [(4 * width, width), (width, 4 * width)]
        args = [randn((batch, seq, width))] + [randn(shape, s) for shape in shapes]
        args += [randn((width,), 0.1) + (1.0 if i % 2 == 0 else 0.0) for i in range(4)]
        return transformer_block, args
    raise SystemExit(f"unknown workload {name!r}")


NAMES = ["gelu_tanh", "layer_norm", "softmax", "mlp_block", "adam_step", "transformer_block"]


class Peer:
    """One workload compiled with jax.jit, stepped the way `compare` steps
    deferfuse: the Adam step's new state replaces the old before the step
    synchronizes (donated to the step with `--donate`, as deferfuse donates
    it), every step waits for its results."""

    def __init__(self, name, quick, donate):
        fn, host_args = inputs(name, quick)
        self.carried = 3 if name == "adam_step" else 0
        self.args = [jax.device_put(a) for a in host_args]
        donated = tuple(range(self.carried)) if donate else ()
        start = time.perf_counter()
        self.compiled = jax.jit(fn, donate_argnums=donated).lower(*self.args).compile()
        self.compile_ms = (time.perf_counter() - start) * 1e3
        self.step()  # warm-up, like compare's cold step

    def step(self):
        start = time.perf_counter()
        out = self.compiled(*self.args)
        if self.carried:
            self.args[: self.carried] = out[: self.carried]
        jax.block_until_ready(out)
        return (time.perf_counter() - start) * 1e3


def measure(name, quick, runs, donate):
    peer = Peer(name, quick, donate)
    times = sorted(peer.step() for _ in range(runs))
    return {
        "workload": name,
        "jax_ms": times[len(times) // 2],
        "jax_min_ms": times[0],
        "jax_compile_ms": peer.compile_ms,
    }


def serve(quick, donate):
    """Answers `compare`, one JSON line per request on stdin: `prepare NAME`
    (compile, warm up) and `run N` (N steps of the prepared workload), so
    that compare can interleave jax's steps with its own."""
    peer = None
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "prepare":
            peer = Peer(words[1], quick, donate)
            print(json.dumps({"workload": words[1], "jax_compile_ms": peer.compile_ms}), flush=True)
        elif words[0] == "run":
            print(json.dumps({"times": [peer.step() for _ in range(int(words[1]))]}), flush=True)
        elif words[0] == "quit":
            return


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--workload", action="append", default=[])
    parser.add_argument(
        "--plugin", default=None, help="a PJRT plugin library to run on instead of jaxlib's CPU client"
    )
    parser.add_argument("--donate", action="store_true", help="donate the Adam step's state to the step")
    parser.add_argument(
        "--serve", action="store_true", help="answer prepare/run requests on stdin (for compare)"
    )
    args = parser.parse_args()
    use_platform(args.plugin)
    if args.serve:
        serve(args.quick, args.donate)
        return
    runs = args.runs or (3 if args.quick else 7)
    for name in args.workload or NAMES:
        print(json.dumps(measure(name, args.quick, runs, args.donate)), flush=True)


if __name__ == "__main__":
    main()
