"""Multi-process scenarios for `test_distributed.py`.

`python dist_workers.py SCENARIO WORLD` spawns WORLD ranks that rendezvous
through a file store, runs SCENARIO on each, and prints one JSON object per
rank: what it measured, or the error it raised. Every rank reports, so that a
test sees which rank failed and why; the parent enforces a timeout.
"""

from __future__ import annotations

import datetime
import json
import os
import queue
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

TIMEOUT_S = 60
#: Elements per rank in the collective cases (divisible by 2 and 4 ranks).
N = 24


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().cpu(), b.detach().cpu()
    if a.shape != b.shape or a.dtype != b.dtype:
        return float("inf")
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


# ---- collectives: every op and dtype against gloo on CPU tensors -------------------


def _inputs(rank: int, dtype: torch.dtype, n: int = N) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + rank)
    if dtype.is_floating_point:
        return torch.randn(n, generator=g).to(dtype)
    return torch.randint(1, 7, (n,), generator=g).to(dtype)


def collectives(rank: int, world: int) -> dict:
    """Each collective on `tpu` tensors with tpu_dist against the same call on
    CPU tensors with gloo (same inputs): the largest difference per case."""
    import deferfuse  # noqa: F401

    gloo = dist.new_group(backend="gloo")
    out: dict[str, float] = {}

    def both(name: str, run) -> None:
        try:
            tpu, cpu = run("tpu", None), run("cpu", gloo)
            pairs = zip(tpu, cpu) if isinstance(tpu, list) else [(tpu, cpu)]
            out[name] = max(_diff(a, b) for a, b in pairs)
        except Exception as e:  # reported, so that one case does not hide the others
            out[name] = f"{type(e).__name__}: {str(e)[:200]}"

    R = dist.ReduceOp
    floats, ints = (torch.float32, torch.float64, torch.bfloat16), (torch.int32, torch.int64)
    for dtype in floats + ints:
        ops = [R.SUM, R.PRODUCT, R.MIN, R.MAX] + ([R.BAND, R.BOR, R.BXOR] if dtype in ints else [])
        for op in ops:

            def reduce_all(dev, group, op=op, dtype=dtype):
                t = _inputs(rank, dtype).to(dev)
                dist.all_reduce(t, op=op, group=group)
                return t

            both(f"all_reduce/{op}/{dtype}", reduce_all)
    for dtype in floats:

        def average(dev, group, dtype=dtype):
            t = _inputs(rank, dtype).to(dev)
            if dev == "tpu":
                dist.all_reduce(t, op=R.AVG)
                return t
            dist.all_reduce(t, op=R.SUM, group=group)
            return t / world

        def premul(dev, group, dtype=dtype):
            t = _inputs(rank, dtype).to(dev)
            if dev == "tpu":
                dist.all_reduce(t, op=R.PREMUL_SUM(0.5))
                return t
            t = t * 0.5
            dist.all_reduce(t, op=R.SUM, group=group)
            return t

        both(f"all_reduce/avg/{dtype}", average)
        both(f"all_reduce/premul_sum/{dtype}", premul)

    for dtype in (torch.float32, torch.int64):
        x = lambda dev, dtype=dtype: _inputs(rank, dtype).to(dev)  # noqa: E731

        def broadcast(dev, group, x=x):
            t = x(dev)
            dist.broadcast(t, src=world - 1, group=group)
            return t

        def all_gather(dev, group, x=x):
            outs = [torch.empty_like(x(dev)) for _ in range(world)]
            dist.all_gather(outs, x(dev), group=group)
            return outs

        def all_gather_into(dev, group, x=x):
            o = torch.empty(world * N, dtype=x("cpu").dtype, device=dev)
            dist.all_gather_into_tensor(o, x(dev), group=group)
            return o

        def reduce_scatter(dev, group, x=x):
            o = torch.empty(N // world, dtype=x("cpu").dtype, device=dev)
            dist.reduce_scatter(o, list(x(dev).chunk(world)), group=group)
            return o

        def reduce_scatter_tensor(dev, group, x=x):
            o = torch.empty(N // world, dtype=x("cpu").dtype, device=dev)
            dist.reduce_scatter_tensor(o, x(dev), group=group)
            return o

        def all_to_all(dev, group, x=x):
            outs = [torch.empty(N // world, dtype=x("cpu").dtype, device=dev) for _ in range(world)]
            dist.all_to_all(outs, list(x(dev).chunk(world)), group=group)
            return outs

        def all_to_all_single(dev, group, x=x):
            # Uneven splits: rank r sends r + 1 elements to every peer.
            sizes = [r + 1 for r in range(world)]
            o = torch.empty(sum(sizes), dtype=x("cpu").dtype, device=dev)
            i = x(dev)[: (rank + 1) * world]
            dist.all_to_all_single(
                o, i, output_split_sizes=sizes, input_split_sizes=[rank + 1] * world, group=group
            )
            return o

        def gather(dev, group, x=x):
            outs = [torch.zeros_like(x(dev)) for _ in range(world)] if rank == 0 else None
            dist.gather(x(dev), outs, dst=0, group=group)
            return outs if rank == 0 else [x(dev)]

        def scatter(dev, group, x=x):
            o = torch.zeros(N // world, dtype=x("cpu").dtype, device=dev)
            dist.scatter(o, list(x(dev).chunk(world)) if rank == 0 else None, src=0, group=group)
            return o

        def reduce(dev, group, x=x):
            t = x(dev)
            dist.reduce(t, dst=0, group=group)
            return t if rank == 0 else x(dev)

        def send_recv(dev, group, x=x):
            t = x(dev)
            peer = (rank + 1) % world, (rank - 1) % world
            reqs = [
                dist.isend(t, peer[0], group=group),
                dist.irecv(r := torch.empty_like(t), peer[1], group=group),
            ]
            [w.wait() for w in reqs]
            return r

        def recv_any(dev, group, x=x):
            if rank == 0:
                got = [torch.empty_like(x(dev)) for _ in range(world - 1)]
                # From any source (dist.recv(src=None) would also ask for the
                # sender's rank, which c10d cannot take from a Python backend).
                [dist.irecv(g, group=group).wait() for g in got]
                return sorted(got, key=lambda g: g.double().sum().item())
            dist.send(x(dev), 0, group=group)
            return [x(dev)]

        cases = [broadcast, all_gather, all_gather_into, reduce_scatter, reduce_scatter_tensor, all_to_all]
        cases += [all_to_all_single, gather, scatter, reduce, send_recv, recv_any]
        for f in cases:
            both(f"{f.__name__}/{dtype}", f)

    def coalesced(dev, group):
        ts = [_inputs(rank, torch.float32, 4).to(dev), _inputs(rank, torch.float32, 6).to(dev)]
        if dev == "cpu":  # gloo has no coalescing: one call per tensor
            [dist.all_reduce(t, group=group) for t in ts]
            return ts
        # One allreduce_coalesced call on the backend.
        with dist._coalescing_manager(device=torch.device(dev)):
            for t in ts:
                dist.all_reduce(t)
        return ts

    both("all_reduce_coalesced", coalesced)

    def async_work(dev, group):
        t = _inputs(rank, torch.float32).to(dev)
        work = dist.all_reduce(t, group=group, async_op=True)
        work.wait()
        (result,) = work.get_future().wait()
        return [t, result]

    both("async_work", async_work)

    def in_place_reaches_only_its_storage(dev, group):
        # The transport writes a whole storage's engine buffer in place: a
        # view must see the result; other tensors made from the input,
        # recorded before the call, must keep the input's value.
        t = _inputs(rank, torch.float32).to(dev)
        view, copy, same, pending = t.view(4, -1), t.clone(), t * 1.0, t + 1.0
        part = t[: N // 2]  # part of a storage: staged, then written back
        dist.all_reduce(t, group=group)
        dist.all_reduce(part, group=group)
        return [t, view, copy, same, pending]

    both("in_place_reaches_only_its_storage", in_place_reaches_only_its_storage)

    def functional(dev, group):
        import torch.distributed._functional_collectives as fc

        t = _inputs(rank, torch.float32).to(dev)
        return [
            fc.all_reduce(t, "sum", group or dist.group.WORLD),
            fc.all_gather_tensor(t, 0, group or dist.group.WORLD),
        ]

    both("functional_collectives", functional)
    dist.barrier()
    return out


# ---- training: DDP, FSDP2, DTensor against single-process training ------------------


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))


class _TinyLM(torch.nn.Module):
    """A one-layer transformer language model (no dropout: bits must match)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(20, 16)
        self.block = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.head = torch.nn.Linear(16, 20)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.embed(x)))


def _batch(kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    if kind == "mlp":
        return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
    data = torch.randint(0, 20, (8, 7), generator=g)
    return data[:, :-1], data[:, 1:]


def _loss(kind: str, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = model(x)
    if kind == "mlp":
        return torch.nn.functional.mse_loss(out, y)
    return torch.nn.functional.cross_entropy(out.reshape(-1, 20), y.reshape(-1))


def _single_process(kind: str, steps: int) -> tuple[list[float], list[torch.Tensor]]:
    """Full-batch training on the CPU: what every data-parallel run must equal."""
    model = _mlp() if kind == "mlp" else _TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = _batch(kind)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = _loss(kind, model, x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach() for p in model.parameters()]


def _rel(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    return max(_diff(a, b) / max(b.abs().max().item(), 1e-12) for a, b in zip(got, want))


def _ddp(rank: int, world: int, kind: str, steps: int = 5, **options) -> float:
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = (_mlp() if kind == "mlp" else _TinyLM()).to("tpu")
    ddp = DDP(model, **options)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    x, y = _batch(kind)
    per = x.shape[0] // world
    xs, ys = x[rank * per : (rank + 1) * per].to("tpu"), y[rank * per : (rank + 1) * per].to("tpu")
    for step in range(steps):
        opt.zero_grad()
        if step == 0 and not options.get("static_graph"):
            # An accumulation step under no_sync: local gradients only, then
            # one synchronized step on the same data; twice the gradient, so
            # the learning rate is halved for it.
            with ddp.no_sync():
                _loss(kind, ddp, xs, ys).backward()
            _loss(kind, ddp, xs, ys).backward()
            for g in opt.param_groups:
                g["lr"] = 0.05
        else:
            for g in opt.param_groups:
                g["lr"] = 0.1
            _loss(kind, ddp, xs, ys).backward()
        opt.step()
    return _rel([p.detach() for p in model.parameters()], _single_process(kind, steps)[1])


def _fsdp(rank: int, world: int, steps: int = 3) -> dict:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import fully_shard

    model = _TinyLM().to("tpu")
    fully_shard(model.block)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = _batch("lm")
    per = x.shape[0] // world
    xs, ys = x[rank * per : (rank + 1) * per].to("tpu"), y[rank * per : (rank + 1) * per].to("tpu")
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = _loss("lm", model, xs, ys)
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total, op=dist.ReduceOp.AVG)
        losses.append(total.item())
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=False))
    want_losses, want_params = _single_process("lm", steps)
    names = [n for n, _ in _TinyLM().named_parameters()]
    return {
        "fsdp_loss": max(abs(a - b) / abs(b) for a, b in zip(losses, want_losses)),
        "fsdp_params": _rel([full[n] for n in names], want_params),
        "fsdp_state_dict_is_full": all(not hasattr(full[n], "placements") for n in names),
    }


def _dtensor(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("tpu", (world,))
    x, w = _batch("mlp")[0], torch.randn(16, 6, generator=torch.Generator().manual_seed(2))
    a = distribute_tensor(x.to("tpu"), mesh, [Shard(0)])
    b = distribute_tensor(w.to("tpu"), mesh, [Replicate()])
    out = {"dtensor_matmul": _diff((a @ b).full_tensor(), x @ w)}
    out["dtensor_redistribute"] = _diff(
        a.redistribute(mesh, [Shard(1)]).redistribute(mesh, [Replicate()]).to_local(), x
    )
    # Tensor parallel: the first linear split by columns, the second by rows.
    ref = _mlp()
    tp = parallelize_module(_mlp().to("tpu"), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    out["tensor_parallel_mlp"] = _diff(tp(x.to("tpu")), ref(x))
    return out


def _asymmetric(rank: int, world: int) -> float:
    """Rank 0 records extra work and logs between collectives."""
    t = torch.full((4,), float(rank + 1), device="tpu")
    if rank == 0:
        side = (t * 3).sin().sum()
        print(f"rank 0 logs {side.item():.3f}", file=sys.stderr)
    dist.all_reduce(t)
    if rank == 0:
        for _ in range(5):
            t = t + 0.0
    dist.all_reduce(t)
    want = float(sum(range(1, world + 1)) * world)
    return (t.cpu() - want).abs().max().item()


def _compiled_collective(rank: int, world: int) -> float:
    """A functional collective inside a `torch.compile(backend="tpu")` graph."""
    import torch.distributed._functional_collectives as fc

    def step(x: torch.Tensor) -> torch.Tensor:
        return (fc.all_reduce(x * 2, "sum", dist.group.WORLD) + 1).sum()

    x = torch.full((4,), rank + 1.0, device="tpu")
    got = torch.compile(step, backend="tpu", fullgraph=True, dynamic=False)(x).item()
    want = 4 * (2 * sum(range(1, world + 1)) + 1)
    return abs(got - want)


def training(rank: int, world: int) -> dict:
    import deferfuse  # noqa: F401

    out: dict = {}
    out["ddp_mlp"] = _ddp(rank, world, "mlp")
    out["ddp_lm"] = _ddp(rank, world, "lm")
    out["ddp_find_unused"] = _ddp(rank, world, "lm", find_unused_parameters=True)
    out["ddp_static_graph"] = _ddp(rank, world, "lm", static_graph=True)
    out["ddp_bucket_view"] = _ddp(rank, world, "lm", gradient_as_bucket_view=True)
    out.update(_fsdp(rank, world))
    out.update(_dtensor(rank, world))
    out["asymmetric"] = _asymmetric(rank, world)
    out["compiled_collective"] = _compiled_collective(rank, world)
    return out


# ---- faults: clear errors within the timeout, never a hang ------------------------


def faults(rank: int, world: int) -> dict:
    import deferfuse  # noqa: F401

    out: dict = {}
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4 + rank, device="tpu"))
        out["mismatch"] = "no error"
    except Exception as e:
        out["mismatch"] = str(e)[:300]
    out["mismatch_s"] = time.monotonic() - start
    # A rank that is late past the group's timeout: the others fail at it.
    short = dist.new_group(backend="tpu_dist", timeout=datetime.timedelta(seconds=3))
    start = time.monotonic()
    if rank == world - 1:
        time.sleep(8)
    else:
        try:
            dist.all_reduce(torch.ones(4, device="tpu"), group=short)
            out["late"] = "no error"
        except Exception as e:
            out["late"] = str(e)[:300]
        out["late_s"] = time.monotonic() - start
    dist.barrier()
    if rank == world - 1:
        os._exit(3)  # a rank that dies without a word
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4, device="tpu"))
        out["peer_died"] = "no error"
    except Exception as e:
        out["peer_died"] = str(e)[:300]
    out["peer_died_s"] = time.monotonic() - start
    return out


# ---- the default backend of `tpu`, next to gloo for CPU tensors -------------------


def defaults(rank: int, world: int) -> dict:
    """Run after `init_process_group(device_id=tpu:0)` with no backend named:
    PyTorch picks the backend registered for the accelerator, `tpu`. A group of both
    kinds ("cpu:gloo,tpu:tpu_dist") serves CPU tensors and gloo-only calls."""
    import deferfuse  # noqa: F401

    default = dist.distributed_c10d._get_default_group()
    both = dist.new_group(backend="cpu:gloo,tpu:tpu_dist")
    t, c = torch.full((3,), rank + 1.0, device="tpu"), torch.full((3,), rank + 1.0)
    dist.all_reduce(t)
    dist.all_reduce(c, group=both)
    dist.all_reduce(t, group=both)
    dist.monitored_barrier(group=both, timeout=datetime.timedelta(seconds=TIMEOUT_S))
    # Works answer is_completed(); a receive from any source learns its sender.
    work = dist.all_reduce(torch.ones(2, device="tpu"), async_op=True)
    work.wait()
    completed = work.is_completed()
    got = torch.zeros(2, device="tpu")
    if rank == 0:
        sender = dist.recv(got)  # src=None: any rank
    else:
        sender = None
        dist.send(torch.full((2,), 7.0 + rank, device="tpu"), dst=0)
    return {
        "completed": completed,
        "sender": sender,
        "received": got.cpu().tolist(),
        "default": type(default._get_backend(torch.device("tpu"))).__name__,
        "both": [type(both._get_backend(torch.device(d))).__name__ for d in ("cpu", "tpu")],
        "tpu_sum": t.cpu().tolist(),
        "cpu_sum": c.tolist(),
    }


# ---- one on-disk cache shared by the ranks of one host ----------------------------


def shared_cache(rank: int, world: int) -> dict:
    """Every rank runs the same new programs at once against one cache
    directory: each program is built by one rank and read by the others."""
    import deferfuse

    dist.barrier()  # start together
    x = torch.arange(64.0, device="tpu").reshape(8, 8)
    for k in range(3):
        y = torch.softmax(x * (k + 2), dim=-1) @ x.t()
        y.sum().item()
    dist.barrier()
    return {"tier3": deferfuse.stats()["cache"]["tier3"]}


SCENARIOS = {
    "collectives": collectives,
    "training": training,
    "faults": faults,
    "defaults": defaults,
    "shared_cache": shared_cache,
}
#: The backend each scenario initializes with; None: the default of the
#: device `tpu`, with `device_id=tpu:0`.
BACKENDS = {"defaults": None}


def _rank(rank: int, world: int, scenario: str, store: str, results) -> None:
    os.environ["TORCH_TPU_EAGER_MODE"] = os.environ.get("TORCH_TPU_EAGER_MODE", "defer_and_fuse")
    try:
        import deferfuse  # noqa: F401 - registers tpu_dist

        dist.init_process_group(
            BACKENDS.get(scenario, "tpu_dist"),
            device_id=torch.device("tpu", 0) if scenario in BACKENDS else None,
            init_method=f"file://{store}",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=TIMEOUT_S),
        )
        got = SCENARIOS[scenario](rank, world)
        dist.destroy_process_group()
        results.put((rank, got))
    except BaseException as e:  # noqa: BLE001 - every failure is reported to the parent
        results.put((rank, {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]}))


def main(scenario: str, world: int) -> None:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_rank, args=(r, world, scenario, store, results)) for r in range(world)]
        for p in procs:
            p.start()
        got: dict = {}
        deadline = time.monotonic() + TIMEOUT_S * 4
        # Until every rank reported, or the ones still silent have exited.
        while len(got) < world and time.monotonic() < deadline:
            try:
                rank, result = results.get(timeout=1)
                got[rank] = result
            except queue.Empty:
                if all(p.exitcode is not None for r, p in enumerate(procs) if r not in got):
                    break
        for p in procs:
            p.join(TIMEOUT_S)
    for r in range(world):
        print(json.dumps({"rank": r, **got.get(r, {"error": "no report"})}, default=str))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
