"""`tpu_dist`: the c10d process-group backend of the device `tpu`.

`import deferfuse` registers it, for the device `tpu`, so that
`dist.init_process_group("tpu_dist")`, `init_process_group(device_id=
torch.device("tpu", 0))` and the default backend of a `tpu` tensor pick it,
and DDP, FSDP2, DTensor and c10d's functional collectives run on `tpu`
tensors as they do on CUDA ones.

The backend c10d sees is `TpuDistBackend`, a C++ class (`bindings/csrc/
dist.cpp`) that hands every call to `Collectives` below, so that the works
it returns answer `is_completed()` and the sender of a receive from any
source (c10d's own wrapper of a Python backend forwards only `wait` and
`get_future`).

The seam: every collective puts its `tpu` tensors on the host (the engine's
own buffer where a tensor is a whole storage, else a staged copy), hands
the host tensors to a *transport* (any c10d backend of CPU tensors: gloo
over TCP today) with the caller's options, waits, and writes staged results
back into the `tpu` tensors. A PJRT plugin's own collectives replace the
transport per backend without touching this class (`docs/distributed.md`).

Staging reads the inputs, so a collective is a materialization point: in
DeferAndFuse it runs what its inputs wait on (ranks that recorded different
pending traces cannot deadlock each other), and the flush shows as `read` in
`fusion-debug summary`. Collectives complete before they return: the engine
runs work in the order it was recorded, so every stream already waits for
them, and the `Work` they return is completed.
"""

from __future__ import annotations

import datetime
import functools
import threading
from typing import Any, Callable, Sequence

import torch
import torch._C._distributed_c10d as _c10d
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as _CBackend

from . import _handles, _native

NAME = "tpu_dist"
_RedOp = dist.ReduceOp.RedOpType


class _StagingPool:
    """Host buffers that collectives stage `tpu` tensors in, kept from one
    call to the next: a fresh buffer of many MiB costs a page fault per 4 KiB
    on every call, more than the copy into it. A collective takes buffers
    while it runs (`staged`) and gives them all back when it returns; calls
    that finish later (sends, receives) allocate their own."""

    #: The most bytes of free buffers kept.
    KEEP_BYTES = 256 << 20

    def __init__(self) -> None:
        self._free: dict[tuple[torch.dtype, int], list[torch.Tensor]] = {}
        self._kept = 0
        self._lock = threading.Lock()  # DDP's hooks call from autograd's thread
        self._calls = threading.local()

    def take(self, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        taken = getattr(self._calls, "taken", None)
        numel = shape.numel()
        flat = None
        if taken is not None:
            with self._lock:
                free = self._free.get((dtype, numel))
                if free:
                    flat = free.pop()
                    self._kept -= flat.nbytes
        if flat is None:
            flat = torch.empty(numel, dtype=dtype)
        if taken is not None:
            taken.append(flat)
        return flat.view(shape)

    def staged(self, method: Callable) -> Callable:
        @functools.wraps(method)
        def run(*args: Any) -> Any:
            if getattr(self._calls, "taken", None) is not None:  # called from a staged call
                return method(*args)
            self._calls.taken = []
            try:
                return method(*args)
            finally:
                with self._lock:
                    for flat in self._calls.taken:
                        if self._kept + flat.nbytes <= self.KEEP_BYTES:
                            self._free.setdefault((flat.dtype, flat.numel()), []).append(flat)
                            self._kept += flat.nbytes
                self._calls.taken = None

        return run


_POOL = _StagingPool()


def _host(t: torch.Tensor) -> torch.Tensor:
    """The value of `t` on the host (materialized), or `t` itself if it is there."""
    if t.device.type != "tpu":
        return t
    value = _handles.read(t)
    if isinstance(value, torch.Tensor):
        # A dtype the engine keeps on the CPU: a copy, since the transport
        # writes into what it is given and that value may be shared.
        return value.clone(memory_format=torch.contiguous_format)
    host = _POOL.take(t.shape, t.dtype)
    value.copy_to_address(host.data_ptr(), host.nbytes)
    return host


def _readable(t: torch.Tensor) -> torch.Tensor:
    """A host tensor for an input the transport only reads: the engine's
    buffer itself where `t` is all of its storage, else a staged copy. Take
    inputs before outputs: an output of the same storage then finds its
    value shared (the view holds it) and gets a buffer of its own."""
    view = _handles.host_view(t) if t.device.type == "tpu" else None
    return _host(t) if view is None else view


def _aliased(t: torch.Tensor) -> torch.Tensor | None:
    """The engine's own buffer of `t` as a host tensor the transport may
    write (`_handles.host_alias`), marked so that `_write_back` skips it."""
    alias = _handles.host_alias(t) if t.device.type == "tpu" else None
    if alias is not None:
        alias._deferfuse_alias_of = t
    return alias


def _in_place(t: torch.Tensor) -> torch.Tensor:
    """A host tensor for `t` that the transport reads and writes: the
    engine's buffer itself where `t` is all of its storage (no copy either
    way), else a staged copy."""
    alias = _aliased(t)
    return _host(t) if alias is None else alias


def _host_like(t: torch.Tensor) -> torch.Tensor:
    """A host tensor for an output the transport writes whole."""
    if t.device.type != "tpu":
        return t
    alias = _aliased(t)
    return _POOL.take(t.shape, t.dtype) if alias is None else alias


def _write_back(targets: Sequence[torch.Tensor], hosts: Sequence[torch.Tensor]) -> None:
    for t, h in zip(targets, hosts):
        if t is not h and getattr(h, "_deferfuse_alias_of", None) is not t:
            t.copy_(h)


class _Landing(dist.Work):
    """The work of a receive: completes when the transport's does, and then
    writes what arrived into the `tpu` tensors (once, on whichever thread
    waits first)."""

    def __init__(self, inner: dist.Work, targets: list[torch.Tensor], hosts: list[torch.Tensor]) -> None:
        super().__init__()
        self._inner, self._targets, self._hosts = inner, targets, hosts
        self._lock = threading.Lock()
        self._landed = False

    def _land(self) -> list[torch.Tensor]:
        with self._lock:
            if not self._landed:
                _write_back(self._targets, self._hosts)
                self._landed = True
        return self._targets

    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        self._inner.wait() if not timeout else self._inner.wait(timeout)
        self._land()
        return True

    def is_completed(self) -> bool:
        if not self._inner.is_completed():
            return False
        self._land()
        return True

    def _source_rank(self) -> int:
        return self._inner._source_rank()

    def get_future(self) -> torch.futures.Future:
        return self._inner.get_future().then(lambda _: self._land())


def _done(result: Any) -> dist.Work:
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(result)
    return _c10d._create_work_from_future(fut)


class _Reduction:
    """How a `ReduceOp` runs on a transport that knows only gloo's operations:
    AVG as SUM then a division by the group size, PREMUL_SUM as a scaling of
    the inputs then SUM."""

    def __init__(self, op: Any, size: int) -> None:
        kind = op.op if isinstance(op, dist.ReduceOp) else op
        self.factor = None
        self.divisor = None
        if kind == _RedOp.AVG:
            kind, self.divisor = _RedOp.SUM, size
        elif kind == _RedOp.PREMUL_SUM:
            kind, self.factor = _RedOp.SUM, op.__getstate__()[1]
        self.op = dist.ReduceOp(kind)

    def before(self, hosts: list[torch.Tensor]) -> list[torch.Tensor]:
        """The inputs to hand the transport: scaled copies for PREMUL_SUM (so
        that a caller's CPU input is never scaled in place)."""
        return hosts if self.factor is None else [h * self.factor for h in hosts]

    def after(self, hosts: Sequence[torch.Tensor]) -> None:
        if self.divisor is not None:
            for h in hosts:
                if h.is_floating_point() or h.is_complex():
                    h.div_(self.divisor)
                else:
                    h.div_(self.divisor, rounding_mode="floor")


def _pairwise(single: Callable, outputs: list, inputs: list, opts: Any) -> dist.Work:
    """A coalesced call as one call per (output, input) pair."""
    for out, inp in zip(outputs, inputs):
        single(out, inp, opts)
    return _done(outputs)


def _with_op(opts: Any, op: dist.ReduceOp, make: Callable[[], Any]) -> Any:
    out = make()
    out.reduceOp = op
    out.timeout = opts.timeout
    for name in ("rootRank", "rootTensor", "asyncOp"):
        if hasattr(opts, name):
            setattr(out, name, getattr(opts, name))
    return out


_DESCRIPTION_BYTES = 256


def _describe(tensors: Sequence[torch.Tensor]) -> str:
    return ", ".join(f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}" for t in tensors)


class Collectives:
    """What `TpuDistBackend` calls: c10d's collectives on `tpu` tensors over a
    transport of host tensors (method names as c10d's Python backends use)."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> None:
        self._size = size
        from . import _state

        self._check_calls = _state.config()["dist_check_calls"]
        self.transport = dist.ProcessGroupGloo(dist.PrefixStore("tpu_dist/gloo/", store), rank, size, timeout)

    def _agree(self, op: str, tensors: Sequence[torch.Tensor]) -> None:
        """Raises, on every rank, if the ranks called `op` with different
        tensors: the transport would otherwise abort the process or hang.
        Costs one small allgather of each rank's description of the call."""
        if self._size == 1 or not self._check_calls:
            return
        text = f"{op}({_describe(tensors)})".encode()[:_DESCRIPTION_BYTES]
        mine = torch.zeros(_DESCRIPTION_BYTES, dtype=torch.uint8)
        mine[: len(text)] = torch.frombuffer(bytearray(text), dtype=torch.uint8)
        every = torch.empty(self._size * _DESCRIPTION_BYTES, dtype=torch.uint8)
        self.transport._allgather_base(every, mine).wait()
        calls = [
            bytes(row.tolist()).rstrip(b"\0").decode(errors="replace") for row in every.view(self._size, -1)
        ]
        if any(c != calls[0] for c in calls):
            listed = "; ".join(f"rank {r}: {c}" for r, c in enumerate(calls))
            raise RuntimeError(f"tpu_dist: the ranks made different collective calls ({listed})")

    # Collectives run when called, so a coalescing window needs no buffering
    # (its start is a no-op in C++): its end returns a completed work.
    def end_coalescing(self) -> dist.Work:
        return _done([])

    # ---- reductions ---------------------------------------------------------------

    def _reduce_in_place(
        self, tensors: list[torch.Tensor], opts: Any, call: Callable, make: Callable
    ) -> dist.Work:
        self._agree(call.__name__, tensors)
        red = _Reduction(opts.reduceOp, self._size)
        hosts = red.before([_in_place(t) for t in tensors])
        call(hosts, _with_op(opts, red.op, make)).wait()
        red.after(hosts)
        _write_back(tensors, hosts)
        return _done(tensors)

    @_POOL.staged
    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work:
        return self._reduce_in_place(tensors, opts, self.transport.allreduce, dist.AllreduceOptions)

    @_POOL.staged
    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work:
        # One message per dtype: the tensors travel as one flat host buffer.
        one = dist.AllreduceOptions()
        one.reduceOp, one.timeout = opts.reduceOp, opts.timeout
        for dtype in dict.fromkeys(t.dtype for t in tensors):
            group = [t for t in tensors if t.dtype == dtype]
            flat = torch.cat([_host(t).reshape(-1) for t in group])
            self._reduce_in_place([flat], one, self.transport.allreduce, dist.AllreduceOptions)
            _write_back(
                group, [piece.view_as(t) for piece, t in zip(flat.split([t.numel() for t in group]), group)]
            )
        return _done(tensors)

    @_POOL.staged
    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work:
        return self._reduce_in_place(tensors, opts, self.transport.reduce, dist.ReduceOptions)

    @_POOL.staged
    def reduce_scatter(
        self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any
    ) -> dist.Work:
        self._agree("reduce_scatter", outputs)
        red = _Reduction(opts.reduceOp, self._size)
        host_in = [red.before([_host(t) for t in group]) for group in inputs]
        host_out = [_host_like(t) for t in outputs]
        self.transport.reduce_scatter(
            host_out, host_in, _with_op(opts, red.op, dist.ReduceScatterOptions)
        ).wait()
        red.after(host_out)
        _write_back(outputs, host_out)
        return _done(outputs)

    @_POOL.staged
    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> dist.Work:  # noqa: A002
        self._agree("reduce_scatter_tensor", [output, input])
        red = _Reduction(opts.reduceOp, self._size)
        (host_in,) = red.before([_host(input)])
        host_out = _host_like(output)
        self.transport._reduce_scatter_base(
            host_out, host_in, _with_op(opts, red.op, dist.ReduceScatterOptions)
        ).wait()
        red.after([host_out])
        _write_back([output], [host_out])
        return _done([output])

    @_POOL.staged
    def reduce_scatter_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any
    ) -> dist.Work:
        return _pairwise(self.reduce_scatter_single, outputs, inputs, opts)

    # ---- data movement ------------------------------------------------------------

    @_POOL.staged
    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work:
        self._agree("broadcast", tensors)
        hosts = [_in_place(t) for t in tensors]
        self.transport.broadcast(hosts, opts).wait()
        _write_back(tensors, hosts)
        return _done(tensors)

    @_POOL.staged
    def allgather(
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any
    ) -> dist.Work:
        self._agree("all_gather", inputs)
        return self._into_groups(self.transport.allgather, outputs, inputs, opts)

    @_POOL.staged
    def allgather_coalesced(
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any
    ) -> dist.Work:
        return _pairwise(lambda group, t, o: self.allgather([group], [t], o), outputs, inputs, opts)

    @_POOL.staged
    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> dist.Work:  # noqa: A002
        self._agree("all_gather_into_tensor", [output, input])
        host_in = _readable(input)
        host_out = _host_like(output)
        self.transport._allgather_base(host_out, host_in, opts).wait()
        _write_back([output], [host_out])
        return _done([output])

    @_POOL.staged
    def all_gather_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any
    ) -> dist.Work:
        return _pairwise(self.all_gather_single, outputs, inputs, opts)

    @_POOL.staged
    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any) -> dist.Work:
        return self._into_groups(self.transport.gather, outputs, inputs, opts)

    def _into_groups(
        self, call: Callable, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any
    ) -> dist.Work:
        """A call whose outputs come in one list per input (all_gather, gather)."""
        host_in = [_readable(t) for t in inputs]
        host_out = [[_host_like(t) for t in group] for group in outputs]
        call(host_out, host_in, opts).wait()
        for group, hosts in zip(outputs, host_out):
            _write_back(group, hosts)
        return _done(outputs)

    @_POOL.staged
    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any) -> dist.Work:
        host_in = [[_readable(t) for t in group] for group in inputs]
        host_out = [_host_like(t) for t in outputs]
        self.transport.scatter(host_out, host_in, opts).wait()
        _write_back(outputs, host_out)
        return _done(outputs)

    @_POOL.staged
    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any) -> dist.Work:
        self._agree("all_to_all", inputs)
        host_in = [_readable(t) for t in inputs]
        host_out = [_host_like(t) for t in outputs]
        self.transport.alltoall(host_out, host_in, opts).wait()
        _write_back(outputs, host_out)
        return _done(outputs)

    @_POOL.staged
    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        out_splits: list[int],
        in_splits: list[int],
        opts: Any,  # noqa: A002
    ) -> dist.Work:
        host_in = _readable(input)
        host_out = _host_like(output)
        self.transport.alltoall_base(host_out, host_in, out_splits, in_splits, opts).wait()
        _write_back([output], [host_out])
        return _done([output])

    # ---- point to point and barriers ----------------------------------------------

    # Point to point is asynchronous, as on CUDA: two ranks that each send
    # before they receive must not wait for each other.

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> dist.Work:
        # The transport's work keeps the staged host tensors alive until sent.
        return self.transport.send([_readable(t) for t in tensors], dst, tag)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> dist.Work:
        hosts = [_host_like(t) for t in tensors]
        return _Landing(self.transport.recv(hosts, src, tag), tensors, hosts)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> dist.Work:
        hosts = [_host_like(t) for t in tensors]
        return _Landing(self.transport.recv_anysource(hosts, tag), tensors, hosts)

    def barrier(self, opts: Any) -> dist.Work:
        from . import _state

        _state.sync()
        self.transport.barrier(opts).wait()
        return _done([])


def _create(store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> _CBackend:
    backend_class = _native.bridge().install_dist()
    return backend_class(rank, size, Collectives(store, rank, size, timeout))


def register() -> None:
    """Registers `tpu_dist` as the backend of the device `tpu` (idempotent)."""
    if not dist.is_available() or NAME in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(NAME, _create, devices=["tpu"])
