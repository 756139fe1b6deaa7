"""torch.matmul peer of `gemm_table --peers`: answers one request per line on
stdin with one JSON line on stdout, so that the Rust side can interleave its
calls with ours.

    prepare LHS RHS TA TB DTYPE   e.g. `prepare 256,1024 1024,4096 0 1 f32`
    run N                         N timed calls of the prepared product (ms)
    quit

TA/TB = 1 stores that operand transposed and passes the transposed view, as
`F.linear` passes its weight; the product itself is `torch.matmul`.
"""

import json
import sys
import time

import torch


def stored(shape, transposed):
    s = list(shape)
    if transposed:
        s[-2], s[-1] = s[-1], s[-2]
    return s


def main():
    g = torch.Generator().manual_seed(0)
    a = b = None
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "prepare":
            lhs, rhs = ([int(d) for d in w.split(",")] for w in words[1:3])
            ta, tb = words[3] == "1", words[4] == "1"
            dtype = torch.bfloat16 if words[5] == "bf16" else torch.float32
            a = torch.randn(stored(lhs, ta), generator=g).to(dtype)
            b = torch.randn(stored(rhs, tb), generator=g).to(dtype)
            a, b = (a.transpose(-2, -1) if ta else a), (b.transpose(-2, -1) if tb else b)
            torch.matmul(a, b)
            print(json.dumps({"threads": torch.get_num_threads()}), flush=True)
        elif words[0] == "run":
            times = []
            for _ in range(int(words[1])):
                start = time.perf_counter()
                out = torch.matmul(a, b)
                times.append((time.perf_counter() - start) * 1e3)
                del out
            print(json.dumps({"times": times}), flush=True)
        elif words[0] == "quit":
            return


if __name__ == "__main__":
    main()
