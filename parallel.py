"""Training one model on many processes, by hand over torch.distributed: data parallel, ZeRO-1/2/3, tensor
parallel and pipeline parallel, each proved equal to a single-process run.

Depends on: torch and the standard library only (its tests and demos use model.py; train.py wires it in).
Collectives run on gloo (CPU, where every figure below was measured) or nccl (CUDA, one GPU per rank).

Why it is needed. Mixed-precision AdamW keeps 16 bytes per parameter: 2 for bf16 weights, 2 for bf16 gradients
and 12 for the optimizer (an fp32 master copy and two moving averages). A 7e9-parameter model needs
7e9 x 16 = 112 GB before a single activation is stored; a 70B model about 1,120 GB. No GPU holds that, and one GPU
would take months anyway. The lecture names four knives, and this file is one chapter per knife:

1. Data parallel (DP). Every rank holds the whole model, reads a different slice of the batch, and the ranks
   average their gradients with an all-reduce before the optimizer step. A ring all-reduce sends 2(n-1)/n of the
   gradient bytes per rank, whatever n is. It makes training faster, not smaller: each of 8 GPUs still holds 112 GB.
2. ZeRO (FSDP is the same idea). An all-reduce is a reduce-scatter (rank r gets the sum of slice r) followed by an
   all-gather (everyone gets every slice). So rank r only needs to keep slice r of what is redundant:
       stage 1 shards the optimizer state:        2 + 2 + 12/8 = 5.5 bytes/param  -> 7e9 on 8 GPUs: 38.5 GB
       stage 2 also shards the gradients:          2 + 14/8     = 3.75 bytes/param -> 26.25 GB
       stage 3 also shards the weights:            16/8         = 2 bytes/param    -> 14 GB (on 4 GPUs: 28 GB)
   Stages 1 and 2 communicate what DP does; stage 3 gathers the weights once for forward and again for backward,
   about 1.5x DP. ZeRO saves memory; it does not make a step faster.
3. Tensor parallel (TP). Split the matrices inside a layer. The MLP's first matrix is split by columns, the second
   by rows; the nonlinearity runs on each piece alone, so one MLP costs one all-reduce in forward and one in
   backward. Attention is split by heads. Traffic is per layer, so TP stays inside one machine.
4. Pipeline parallel (PP). Put different layers on different ranks: 32 layers on 4 GPUs is 8 each. The pipeline
   idles while it fills and drains; with p stages and m micro-batches the idle share (the bubble) is
   (p - 1) / (m + p - 1): p = 4, m = 16 gives 3/19, about 16%.

Large runs combine them: TP inside a machine, PP and DP (with ZeRO) across machines. The ranks form a grid
world = dp x tp x pp with tp innermost (neighbouring ranks share the fast links) and pp outermost.

The order of this file: communication helpers (with byte counters), the mesh, a process launcher for tests,
data parallel, ZeRO, tensor parallel, pipeline schedules and their executor (with gradient clipping across the
mesh), `parallelize` (what train.py calls), and the accounting of memory and bubble against the formulas above.
Every mode is tested equal to a single-process run (tests/test_parallel.py). Demos, no download needed:
    python parallel.py demo              # each layout on 2 CPU processes vs one process: weights, bytes, memory
    python parallel.py schedule --p 4 --m 16 [--measure]    # a pipeline schedule drawn, its bubble
    python parallel.py memory --params 7e9 --world 8        # 112 / 38.5 / 26.25 / 14 GB per GPU
    python parallel.py mesh --dp 2 --tp 2 --pp 2            # the rank grid and its groups
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import gc
import io
import math
import os
import sys
import tempfile
import time
import traceback
from typing import Callable, Iterable, NamedTuple, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


class ParallelError(ValueError):
    """A bad parallel configuration (sizes that do not divide, ...): one line naming the problem and the fix."""


# ------------------------------------------------------------------------------------------------------------------
# 1. Communication helpers
#
# Every collective goes through a `Comm`, which is one process group plus counters of the bytes this rank sends.
# The counters use the cost of the standard ring algorithms, per rank, for a tensor of b bytes on n ranks:
#     all-reduce      2(n-1)/n * b   (a reduce-scatter then an all-gather)
#     reduce-scatter   (n-1)/n * b   (b = the full input)
#     all-gather       (n-1)/n * b   (b = the full output)
#     broadcast / send           b
# so "bytes communicated per step" can be compared with the theory (DP: 2(n-1)/n of the gradient bytes).
# torch 2.13 renamed all_gather_into_tensor / reduce_scatter_tensor to all_gather_single / reduce_scatter_single;
# the old names warn. We pick whichever this torch has, so the file runs on old and new versions without warnings.
# ------------------------------------------------------------------------------------------------------------------

_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class _DoneWork:
    """Stands in for an async handle when nothing had to be sent (a group of one rank)."""

    def wait(self) -> bool:
        return True


class Comm:
    """One process group (one axis of the mesh) and the bytes this rank has sent through it.

    `ranks` are global ranks in group order; `rank` is this process's index in that list. With one rank every
    collective is the identity and costs nothing, so a mesh axis of size 1 needs no special cases elsewhere.
    >>> c = Comm.single(); t = torch.ones(3); c.all_reduce(t); t.tolist(), c.bytes_sent
    ([1.0, 1.0, 1.0], 0)
    """

    def __init__(self, group, ranks: Sequence[int], rank: int):
        self.group, self.ranks, self.rank, self.size = group, list(ranks), rank, len(ranks)
        self.bytes_by_op: dict[str, float] = {}

    @classmethod
    def single(cls) -> "Comm":
        return cls(None, [0], 0)

    @property
    def bytes_sent(self) -> float:
        return sum(self.bytes_by_op.values())

    def reset_counters(self) -> None:
        self.bytes_by_op.clear()

    def _count(self, op: str, nbytes: float) -> None:
        self.bytes_by_op[op] = self.bytes_by_op.get(op, 0) + nbytes

    def global_rank(self, group_rank: int) -> int:
        return self.ranks[group_rank]

    def all_reduce(self, t: torch.Tensor, op=dist.ReduceOp.SUM, async_op: bool = False):
        """In place: every rank ends with op(t over ranks). gloo has no AVG: sum, then divide yourself."""
        if self.size == 1:
            return _DoneWork() if async_op else None
        self._count("all_reduce", 2 * (self.size - 1) / self.size * t.numel() * t.element_size())
        return dist.all_reduce(t, op=op, group=self.group, async_op=async_op)

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, async_op: bool = False):
        """out (N/n,) on rank r = sum over ranks of inp[r*N/n:(r+1)*N/n]; inp is (N,)."""
        if self.size == 1:
            out.copy_(inp)
            return _DoneWork() if async_op else None
        self._count("reduce_scatter", (self.size - 1) / self.size * inp.numel() * inp.element_size())
        return _reduce_scatter_flat(out, inp, op=dist.ReduceOp.SUM, group=self.group, async_op=async_op)

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor, async_op: bool = False):
        """out (N,) = concatenation of every rank's inp (N/n,), in rank order."""
        if self.size == 1:
            out.copy_(inp)
            return _DoneWork() if async_op else None
        self._count("all_gather", (self.size - 1) / self.size * out.numel() * out.element_size())
        return _all_gather_flat(out, inp, group=self.group, async_op=async_op)

    def broadcast(self, t: torch.Tensor, src: int = 0) -> None:
        """In place: every rank gets group rank `src`'s t."""
        if self.size == 1:
            return
        if self.rank == src:
            self._count("broadcast", t.numel() * t.element_size())
        dist.broadcast(t, src=self.ranks[src], group=self.group)

    def send_recv(self, sends: Sequence[tuple[torch.Tensor, int]], recvs: Sequence[tuple[torch.Tensor, int]]):
        """Post all sends and receives (tensor, global peer rank) as one batch and wait for all of them.

        Posting a send and a receive together is what keeps two neighbours that both send first from waiting on
        each other forever.
        """
        ops = [dist.P2POp(dist.isend, t, peer) for t, peer in sends]
        ops += [dist.P2POp(dist.irecv, t, peer) for t, peer in recvs]
        for t, _ in sends:
            self._count("send", t.numel() * t.element_size())
        if ops:
            for work in dist.batch_isend_irecv(ops):
                work.wait()


# ------------------------------------------------------------------------------------------------------------------
# 2. The mesh: world = dp x tp x pp
#
# Global rank = (pp_rank * dp + dp_rank) * tp + tp_rank: tp varies fastest, so the ranks of one tensor-parallel
# group are neighbours (the same machine, with the fast links); pp varies slowest. With dp=2, tp=2, pp=2:
#     rank:     0  1  2  3  4  5  6  7
#     pp_rank:  0  0  0  0  1  1  1  1
#     dp_rank:  0  0  1  1  0  0  1  1
#     tp_rank:  0  1  0  1  0  1  0  1
# tp groups {0,1} {2,3} {4,5} {6,7}; dp groups {0,2} {1,3} {4,6} {5,7}; pp groups {0,4} {1,5} {2,6} {3,7}.
# The pure functions below compute the grid; `Mesh.build` turns it into process groups. Every rank must create
# every group, in the same order (a rule of torch.distributed), and keeps the ones it belongs to.
# ------------------------------------------------------------------------------------------------------------------


def check_mesh_sizes(world: int, dp: int, tp: int, pp: int) -> None:
    """Raise ParallelError unless world == dp * tp * pp with every size >= 1."""
    if min(dp, tp, pp) < 1:
        raise ParallelError(f"mesh sizes must be >= 1, got dp={dp} tp={tp} pp={pp}")
    if dp * tp * pp != world:
        raise ParallelError(f"world size {world} != dp*tp*pp = {dp}*{tp}*{pp} = {dp * tp * pp}: "
                            f"choose --tp and --pp so that their product divides {world}")


def rank_coords(rank: int, dp: int, tp: int, pp: int) -> tuple[int, int, int]:
    """Global rank -> (pp_rank, dp_rank, tp_rank), tp innermost.
    >>> rank_coords(5, dp=2, tp=2, pp=2)
    (1, 0, 1)
    """
    return rank // (dp * tp), (rank // tp) % dp, rank % tp


def coords_rank(pp_rank: int, dp_rank: int, tp_rank: int, dp: int, tp: int) -> int:
    """(pp_rank, dp_rank, tp_rank) -> global rank; the inverse of rank_coords.
    >>> coords_rank(1, 0, 1, dp=2, tp=2)
    5
    """
    return (pp_rank * dp + dp_rank) * tp + tp_rank


def axis_groups(dp: int, tp: int, pp: int) -> dict[str, list[list[int]]]:
    """Every group of every axis as lists of global ranks, plus the "embed" groups {first, last pipeline stage}
    that share the gradient of tied embeddings.
    >>> axis_groups(dp=2, tp=2, pp=2)["dp"]
    [[0, 2], [1, 3], [4, 6], [5, 7]]
    """
    groups: dict[str, list[list[int]]] = {"tp": [], "dp": [], "pp": [], "embed": []}
    for s in range(pp):
        for d in range(dp):
            groups["tp"].append([coords_rank(s, d, t, dp, tp) for t in range(tp)])
        for t in range(tp):
            groups["dp"].append([coords_rank(s, d, t, dp, tp) for d in range(dp)])
    for d in range(dp):
        for t in range(tp):
            line = [coords_rank(s, d, t, dp, tp) for s in range(pp)]
            groups["pp"].append(line)
            groups["embed"].append(sorted({line[0], line[-1]}))
    return groups


@dataclasses.dataclass
class Mesh:
    """This rank's place in the dp x tp x pp grid and one Comm per axis (passed explicitly, never global)."""

    world: int
    rank: int
    dp: Comm
    tp: Comm
    pp: Comm
    embed: Comm  # {first stage, last stage} of this rank's pipeline: tied-embedding gradients
    patient: object = None  # a gloo group of every rank with a long timeout, for waiting out rank-0-only work

    @property
    def sizes(self) -> dict[str, int]:
        return {"dp": self.dp.size, "tp": self.tp.size, "pp": self.pp.size}

    @classmethod
    def build(cls, dp: int = -1, tp: int = 1, pp: int = 1) -> "Mesh":
        """Create the groups on an initialised process group; dp=-1 means world // (tp * pp)."""
        world, rank = dist.get_world_size(), dist.get_rank()
        if dp == -1:
            if tp < 1 or pp < 1 or world % (tp * pp):
                raise ParallelError(f"tp*pp = {tp}*{pp} does not divide the world size {world}: "
                                    f"choose --tp and --pp whose product divides {world}")
            dp = world // (tp * pp)
        check_mesh_sizes(world, dp, tp, pp)
        comms = {}
        for axis, groups in axis_groups(dp, tp, pp).items():
            for ranks in groups:
                # new_group is collective over the whole world, so every rank creates every group.
                group = dist.new_group(ranks) if len(ranks) > 1 else None
                if rank in ranks:
                    comms[axis] = Comm(group, ranks, ranks.index(rank))
        embed = comms.get("embed", Comm.single())  # middle pipeline stages hold no embedding
        # Work only rank 0 does (preparing the data, writing a 13 GB checkpoint, sampling) can outlast the
        # collectives' timeout, which is kept short so that a dead rank is noticed. The other ranks wait for it
        # in a barrier of this group instead, whose timeout is a day (env PARALLEL_SLOW_TIMEOUT_S).
        patient = dist.new_group(backend="gloo", timeout=datetime.timedelta(
            seconds=float(os.environ.get("PARALLEL_SLOW_TIMEOUT_S", 86_400))))
        return cls(world, rank, comms["dp"], comms["tp"], comms["pp"], embed, patient)

    def wait_for_rank0(self) -> None:
        """Every rank waits here until all have arrived, rank 0 after its rank-0-only work (long timeout)."""
        if self.patient is not None:
            dist.barrier(group=self.patient)

    @classmethod
    def single(cls) -> "Mesh":
        """The mesh of a plain one-process run."""
        return cls(1, 0, Comm.single(), Comm.single(), Comm.single(), Comm.single())

    def comms(self) -> list[Comm]:
        return [self.dp, self.tp, self.pp, self.embed]

    def bytes_sent(self) -> float:
        return sum(c.bytes_sent for c in self.comms())

    def reset_counters(self) -> None:
        for c in self.comms():
            c.reset_counters()


def check_combination(zero_stage: int, tp: int, pp: int) -> None:
    """Refuse the layouts this file does not support, with the reason.
    >>> check_combination(1, 2, 2)
    """
    if zero_stage not in (0, 1, 2, 3):
        raise ParallelError(f"--zero must be 0, 1, 2 or 3, got {zero_stage}")
    if zero_stage >= 2 and pp > 1:
        raise ParallelError(f"--zero {zero_stage} with --pp {pp}: ZeRO-2/3 reduce gradients as backward produces "
                            f"them, but a pipeline accumulates them over micro-batches; use --zero 1 with --pp")
    if zero_stage == 3 and tp > 1:
        raise ParallelError(f"--zero 3 with --tp {tp}: ZeRO-3 gathers weights in the module's forward hooks, which "
                            f"the tensor-parallel forward bypasses; use --zero 1 or 2 with --tp")


def init_distributed(timeout_s: float | None = None) -> tuple[int, int, torch.device]:
    """Join the process group that torchrun describes in the environment (RANK, WORLD_SIZE, MASTER_ADDR, ...).

    Returns (rank, world_size, device): gloo on CPU, nccl on CUDA (one GPU per local rank). Without torchrun's
    variables it is a plain single-process run: (0, 1, device), no process group. A rank that dies makes the
    others fail with a timeout error after `timeout_s` (env PARALLEL_TIMEOUT_S, default 600, torch's own default
    for nccl) instead of hanging; work that only rank 0 does is waited for in `Mesh.wait_for_rank0` instead.
    """
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return 0, 1, torch.device("cuda" if torch.cuda.is_available() else "cpu")
    timeout_s = timeout_s or float(os.environ.get("PARALLEL_TIMEOUT_S", 600))
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        device, backend = torch.device("cuda", local), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        # device_id binds nccl to this rank's GPU at once (torch >= 2.3), so no collective has to guess it.
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s),
                                device_id=device if backend == "nccl" else None)
    return dist.get_rank(), dist.get_world_size(), device


# ------------------------------------------------------------------------------------------------------------------
# 3. A launcher for tests, demos and benchmarks: `launch(fn, world)` runs fn(rank, world, *args) in `world` fresh
# processes joined by a gloo group over a FileStore (no ports to collide), and returns each rank's result.
# If a rank raises, the parent stops the others and raises WorkerError naming the rank and its error; if the whole
# run exceeds `timeout_s`, it stops them all. Nothing can hang a test. On Linux "fork" starts a worker in ~0.05 s
# (it inherits the imported torch); "spawn" re-imports torch (3-6 s each here) and is what other systems need.
# ------------------------------------------------------------------------------------------------------------------


class WorkerError(RuntimeError):
    """A worker of `launch` failed or the run timed out."""


def _shut_down_process_group() -> None:
    """Tear gloo down in a fixed order, all ranks together (a no-op if `fn` already destroyed the group).

    1. A barrier: no rank closes its connections while a peer still has a message in flight to or from it.
    2. A garbage collection: modules, hooks and wrappers form reference cycles that keep Comm objects, hence
       ProcessGroups and async work handles, alive; they are freed now, while every backend still runs, not by a
       GC pass at some later point of the process's exit.
    3. destroy_process_group: every backend shuts down and joins its worker threads, here, on this thread.
    """
    if not dist.is_initialized():
        return
    dist.barrier()
    gc.collect()
    dist.destroy_process_group()


def _worker_main(fn, rank, world, store_path, timeout_s, results, args):
    torch.set_num_threads(1)  # world processes share the cores; more threads would only fight
    try:
        store = dist.FileStore(store_path, world)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
        value = fn(rank, world, *args)
        buffer = io.BytesIO()
        torch.save(value, buffer)  # tensors travel as bytes: the worker may exit before the parent reads them
        del value
        results.put((rank, "ok", buffer.getvalue()))
        _shut_down_process_group()
    except BaseException as e:  # noqa: BLE001 - every failure is reported to the parent as one line
        frames = [f for f in traceback.extract_tb(e.__traceback__) if f"{os.sep}torch{os.sep}" not in f.filename]
        last = frames[-1] if frames else None
        where = f" (at {os.path.basename(last.filename)}:{last.lineno})" if last else ""
        results.put((rank, "error", f"{type(e).__name__}: {e}{where}".encode()))


def launch(fn: Callable, world: int, *args, timeout_s: float = 120.0, start_method: str | None = None) -> list:
    """Run fn(rank, world, *args) on `world` processes; return the list of their return values, by rank.
    fn must be a module-level function (spawn pickles it by name); its return value may hold tensors."""
    method = start_method or ("fork" if sys.platform.startswith("linux") else "spawn")
    ctx = mp.get_context(method)
    results = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        store_path = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_worker_main, args=(fn, r, world, store_path, timeout_s, results, args))
                 for r in range(world)]
        for p in procs:
            p.start()
        done: dict[int, object] = {}
        deadline = time.monotonic() + timeout_s
        try:
            while len(done) < world:
                if not results.empty():
                    rank, status, payload = results.get()
                    if status == "error":
                        raise WorkerError(f"rank {rank} failed: {payload.decode()}")
                    done[rank] = torch.load(io.BytesIO(payload), weights_only=True)
                    continue
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in done]
                if dead and results.empty():
                    raise WorkerError(f"rank {dead[0]} died with exit code {procs[dead[0]].exitcode}")
                if time.monotonic() > deadline:
                    missing = sorted(set(range(world)) - set(done))
                    raise WorkerError(f"ranks {missing} did not finish within {timeout_s:.0f} s; stopped them")
                time.sleep(0.01)
        finally:
            for p in procs:
                p.join(timeout=5 if len(done) == world else 0.2)
                if p.is_alive():
                    p.kill()
                    p.join()
    return [done[r] for r in range(world)]


def broadcast_module(module: nn.Module, comm: Comm, src: int = 0) -> None:
    """Make every rank's parameters and buffers equal to group rank `src`'s (the start of DP and ZeRO)."""
    with torch.no_grad():
        for t in list(module.parameters()) + list(module.buffers()):
            comm.broadcast(t.data, src)


# ------------------------------------------------------------------------------------------------------------------
# 4. Data parallel
#
# Each rank runs forward and backward on its own slice of the batch; the gradients must be averaged before the
# step. Waiting for the whole backward and then all-reducing leaves the network idle during backward and the
# compute idle during the all-reduce. Instead, gradients are grouped into buckets in *reverse* parameter order
# (the order backward produces them: the last layer's gradients come first), and a bucket's all-reduce starts,
# asynchronously, the moment its last gradient is accumulated (`register_post_accumulate_grad_hook`), while
# backward keeps computing earlier layers. `finish_gradient_sync()` waits for the buckets in flight, flushes the
# ones that never filled (a parameter unused in this forward) and writes the averages back into `.grad`.
# Buckets are launched strictly in order, so every rank issues the same all-reduces in the same order even if
# one rank skipped a parameter. The hooks only read `.grad`; they never touch the weights.
# `no_sync()` turns the hooks off for gradient accumulation: micro-batches accumulate locally and only the last
# backward communicates. Frozen parameters (requires_grad=False) are not in any bucket.
# ------------------------------------------------------------------------------------------------------------------


def bucket_layout(nbytes: Sequence[int], bucket_bytes: int) -> list[list[int]]:
    """Group tensors (given in the order their gradients arrive) into buckets of about `bucket_bytes`.
    A bucket closes once it reaches the cap; a tensor bigger than the cap gets a bucket of its own.
    >>> bucket_layout([4, 4, 4, 12, 4], bucket_bytes=8)
    [[0, 1], [2, 3], [4]]
    """
    buckets: list[list[int]] = [[]]
    filled = 0
    for i, n in enumerate(nbytes):
        buckets[-1].append(i)
        filled += n
        if filled >= bucket_bytes:
            buckets.append([])
            filled = 0
    return [b for b in buckets if b]


class _Bucket:
    """A flat buffer holding the gradients of a few parameters, all-reduced as one message."""

    def __init__(self, params: list[nn.Parameter]):
        self.params = params
        self.offsets = [0]
        for p in params:
            self.offsets.append(self.offsets[-1] + p.numel())
        self.buffer = torch.zeros(self.offsets[-1], dtype=params[0].dtype, device=params[0].device)
        self.arrived: set[int] = set()
        self.work = None

    def slice(self, i: int) -> torch.Tensor:
        return self.buffer[self.offsets[i]:self.offsets[i + 1]]


class DataParallel(nn.Module):
    """Wrap a module for data parallel training over `comm` (the mesh's dp axis).

    Usage per step:  loss = dp(x, y)[1]; loss.backward(); dp.finish_gradient_sync(); opt.step()
    With accumulation:  with dp.no_sync(): (micro-batches but the last) backward; then the last backward; finish.
    `bucket_bytes` trades overlap (small buckets start early) against per-message latency (25 MB in DDP).
    """

    def __init__(self, module: nn.Module, comm: Comm, bucket_bytes: int = 25 * 2**20):
        super().__init__()
        self.module, self.comm = module, comm
        broadcast_module(module, comm)
        params = [p for p in module.parameters() if p.requires_grad]  # shared (tied) weights appear once
        order = list(reversed(params))
        layout = bucket_layout([p.numel() * p.element_size() for p in order], bucket_bytes)
        self.buckets = [_Bucket([order[i] for i in idx]) for idx in layout]
        self._where: dict[int, tuple[_Bucket, int]] = {}
        for bucket in self.buckets:
            for i, p in enumerate(bucket.params):
                self._where[id(p)] = (bucket, i)
                p.register_post_accumulate_grad_hook(self._grad_ready)
        self._next_bucket = 0
        self._sync = True

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Accumulate gradients locally (no communication) inside this block."""
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    def _grad_ready(self, p: torch.Tensor) -> None:
        if not self._sync or self.comm.size == 1:
            return
        bucket, i = self._where[id(p)]
        if bucket.work is not None:
            raise RuntimeError("a gradient arrived for a bucket already sent: call finish_gradient_sync() after "
                               "each backward, or wrap all but the last micro-batch in no_sync()")
        bucket.slice(i).copy_(p.grad.reshape(-1))
        bucket.arrived.add(i)
        self._launch(flush=False)

    def _launch(self, flush: bool) -> None:
        """Start the all-reduce of every bucket that is full (or, when flushing, of every bucket), in order."""
        while self._next_bucket < len(self.buckets):
            bucket = self.buckets[self._next_bucket]
            if not flush and len(bucket.arrived) < len(bucket.params):
                return
            for i, p in enumerate(bucket.params):
                if i not in bucket.arrived:  # unused here: contribute zeros (or the grad accumulated under no_sync)
                    bucket.slice(i).copy_(p.grad.reshape(-1) if p.grad is not None else 0)
            bucket.work = self.comm.all_reduce(bucket.buffer, async_op=True)
            self._next_bucket += 1

    def finish_gradient_sync(self) -> None:
        """Wait for every bucket, flush partial ones, and set each .grad to the average over the dp ranks."""
        if self.comm.size == 1:
            return
        self._launch(flush=True)
        for bucket in self.buckets:
            bucket.work.wait()
            bucket.buffer.div_(self.comm.size)
            for i, p in enumerate(bucket.params):
                averaged = bucket.slice(i).view_as(p)
                if p.grad is None:
                    p.grad = averaged.clone()
                else:
                    p.grad.copy_(averaged)
            bucket.work, bucket.arrived = None, set()
        self._next_bucket = 0


# ------------------------------------------------------------------------------------------------------------------
# 5. ZeRO stages 1, 2 and 3
#
# Parameters are grouped into units (by default: each element of the model's ModuleLists, e.g. each Transformer
# block, plus a "root" unit with everything else: embedding, final norm, head). A unit's parameters live in one
# flat buffer padded to a multiple of n (the dp size), so it splits into n equal shards; rank r owns shard r of
# every unit. Example: a unit of 3 + 4 parameters on 4 ranks is padded to 8; each rank owns 2 of them:
#     flat  [a a a b b b b 0]   shards  r0 [a a]  r1 [a b]  r2 [b b]  r3 [b 0]
# The optimizer (any torch.optim class) sees only this rank's shards, one Parameter per unit, so its state is
# 1/n of the full state: that is stage 1. After backward:
#     stage 1: gradients stay full in .grad; a reduce-scatter hands each rank the sum of its shard.
#     stage 2: as soon as a unit's gradients are complete, a hook copies them into a flat buffer, frees .grad and
#              starts the reduce-scatter (overlapping backward); only the shard's gradient is kept.
#     stage 3: like 2, and the full weights are freed too. A unit's weights are all-gathered just before its
#              forward and freed after it; gathered again when backward reaches the unit (a hook on the unit's
#              output gradient) and freed once its gradients are sent. Memory: 16/n bytes per parameter.
# After the optimizer steps its shard, stages 1 and 2 all-gather the shards back into the full weights (stage 3
# gathers them at the next forward). Traffic per step: stages 1-2 reduce-scatter + all-gather = 2(n-1)/n of the
# parameter bytes, like DP's all-reduce; stage 3 gathers twice + reduce-scatter = 3(n-1)/n, i.e. 1.5x.
# Units launch their reduce-scatters strictly in order (last block first, root last) so all ranks agree.
#
# Mixed precision (stage 3, FSDP's MixedPrecision): the shards stay fp32 (the master weights the optimizer
# updates), but a unit is gathered in the compute dtype: `compute_dtype=torch.bfloat16` all-gathers
# shard.to(bf16), so forward and backward run on bf16 weights and produce bf16 gradients, which are
# reduce-scattered in `reduce_dtype` (fp32 by default: exact sums; bf16 halves that traffic too) and land in
# the shard's fp32 .grad. Gathers then send 2 bytes per parameter instead of 4: the 124m preset on 8 GPUs
# (85M block + 39M root parameters) gathers 7/8 x (2 x 85M + 39M) x 2 B = 366 MB per step instead of 732 MB
# (`zero_bytes_per_step` counts it all). Held per rank: fp32 shard 4/n +
# fp32 shard gradient 4/n + moments 8/n = 16/n bytes/param, plus one gathered unit at a time in bf16.
# gloo (CPU) reduces and gathers bf16 as well as nccl, so the CPU tests run this path as the GPU does.
# ------------------------------------------------------------------------------------------------------------------


def shard_layout(numels: Sequence[int], world: int) -> tuple[list[int], int, int]:
    """Offsets of tensors packed in one flat buffer, the buffer length padded to a multiple of `world`,
    and the length of one shard.
    >>> shard_layout([3, 4], 4)
    ([0, 3, 7], 8, 2)
    """
    offsets = [0]
    for n in numels:
        offsets.append(offsets[-1] + n)
    padded = -(-offsets[-1] // world) * world
    return offsets, padded, padded // world


def _free_storage(t: torch.Tensor) -> None:
    t.untyped_storage().resize_(0)


def _alloc_storage(t: torch.Tensor) -> None:
    t.untyped_storage().resize_(t.numel() * t.element_size())


class _FlatUnit:
    """The parameters of one unit (and one optimizer param group) as a padded flat buffer + this rank's shard.

    `full` is what the module computes with (compute_dtype); `shard` is this rank's fp32 master slice.
    """

    def __init__(self, params: list[nn.Parameter], comm: Comm, stage: int, group: int = 0,
                 compute_dtype: torch.dtype | None = None, reduce_dtype: torch.dtype | None = None):
        self.params, self.comm, self.stage, self.group = params, comm, stage, group  # group: optimizer group
        self.offsets, self.padded, self.shard_size = shard_layout([p.numel() for p in params], comm.size)
        p0 = params[0]
        master = torch.zeros(self.padded, dtype=p0.dtype, device=p0.device)
        with torch.no_grad():
            for p, o in zip(params, self.offsets):
                master[o:o + p.numel()].copy_(p.data.reshape(-1))
        self.compute_dtype = compute_dtype or p0.dtype
        self.reduce_dtype = reduce_dtype or p0.dtype
        self.full = master if self.compute_dtype == p0.dtype else master.to(self.compute_dtype)
        for p, o in zip(params, self.offsets):
            p.data = self.full[o:o + p.numel()].view(p.shape)  # the module now reads the flat buffer
        lo = comm.rank * self.shard_size
        mine = master[lo:lo + self.shard_size]
        # Stages 1-2 keep the full buffer, so the shard is a view of it: the step updates the weights in place.
        self.shard = nn.Parameter(mine if stage < 3 else mine.clone())
        self.gathered = True
        self.arrived: set[int] = set()
        self.pending = None  # (work, reduced shard gradient) of an async reduce-scatter
        if stage == 3:
            self.free()

    def gather(self) -> None:
        """All-gather the shards, cast to the compute dtype, into the full buffer (which every parameter views)."""
        if self.gathered:
            return
        _alloc_storage(self.full)
        self.comm.all_gather(self.full, self.shard.detach().to(self.compute_dtype))
        self.gathered = True

    def free(self) -> None:
        _free_storage(self.full)
        self.gathered = False

    def master_full(self) -> torch.Tensor:
        """The unit's full weights in the master dtype (padded flat; collective when the shards must be gathered)."""
        if self.gathered and self.full.dtype == self.shard.dtype:
            return self.full
        out = torch.empty(self.padded, dtype=self.shard.dtype, device=self.shard.device)
        self.comm.all_gather(out, self.shard.detach())
        return out

    def flat_grad(self, release: bool) -> torch.Tensor:
        """The unit's gradients in one padded flat tensor of reduce_dtype (zeros where a parameter got none)."""
        flat = torch.zeros(self.padded, dtype=self.reduce_dtype, device=self.full.device)
        for p, o in zip(self.params, self.offsets):
            if p.grad is not None:
                flat[o:o + p.numel()].copy_(p.grad.reshape(-1))
                if release:
                    p.grad = None
        return flat

    def start_reduce(self, release: bool) -> None:
        """Start the async reduce-scatter of this unit's gradients. release=True (stages 2-3) frees the full
        gradients; release=False (stage 1) keeps them, re-pointed into the flat buffer so they are held once."""
        flat = self.flat_grad(release)
        if not release:
            for p, o in zip(self.params, self.offsets):
                p.grad = flat[o:o + p.numel()].view(p.shape)
        out = torch.empty(self.shard_size, dtype=self.reduce_dtype, device=self.full.device)
        work = self.comm.reduce_scatter(out, flat, async_op=True)
        self.pending = (work, out, None if release else flat)

    def finish_reduce(self) -> None:
        """Wait for the reduce-scatter; the shard's .grad (master dtype) becomes the average over the dp ranks."""
        work, out, flat = self.pending
        work.wait()
        out = out.to(self.shard.dtype).div_(self.comm.size)
        if flat is not None:  # stage 1: write the averaged slice into the full gradient buffer and view it
            lo = self.comm.rank * self.shard_size
            flat[lo:lo + self.shard_size].copy_(out)
            out = flat[lo:lo + self.shard_size]
        self.shard.grad = out if self.shard.grad is None else self.shard.grad.add_(out)
        self.pending = None


def _gather_units(units: list[_FlatUnit]) -> None:
    for u in units:
        u.gather()


def _free_units(units: list[_FlatUnit]) -> None:
    for u in units:
        u.free()


def _default_units(module: nn.Module) -> list[nn.Module]:
    """The elements of every nn.ModuleList directly under `module` (e.g. GPT.blocks)."""
    return [m for child in module.children() if isinstance(child, nn.ModuleList) for m in child]


class Zero:
    """A ZeRO optimizer: wraps a module (in place) and runs `optimizer_cls` on this rank's shards.

        zero = Zero(model, mesh.dp, stage=3, optimizer_cls=torch.optim.AdamW, lr=3e-4)
        loss = model(x, y)[1]; loss.backward(); zero.finish_gradient_sync(); zero.clip_grad_norm_(1.0); zero.step()
        zero.zero_grad()

    `param_groups` are torch-style dicts over the module's parameters (e.g. weight decay only on matrices);
    `units` are the modules whose weights stage 3 gathers and frees one at a time (default: every element of the
    module's ModuleLists). `param_groups` of the wrapper are the inner optimizer's, so a learning-rate schedule
    sets `group["lr"]` as usual. Stage 3 only: `compute_dtype` (e.g. torch.bfloat16) is the dtype weights are
    gathered and computed in, `reduce_dtype` the dtype gradients are reduce-scattered in (default: the master
    dtype, fp32); the shards and the optimizer stay in the master dtype.
    """

    def __init__(self, module: nn.Module, comm: Comm, stage: int, optimizer_cls=torch.optim.AdamW,
                 param_groups: list[dict] | None = None, units: list[nn.Module] | None = None,
                 compute_dtype: torch.dtype | None = None, reduce_dtype: torch.dtype | None = None,
                 **optimizer_kwargs):
        if stage not in (1, 2, 3):
            raise ParallelError(f"ZeRO stage must be 1, 2 or 3, got {stage}")
        if stage < 3 and (compute_dtype or reduce_dtype):
            raise ParallelError(f"compute_dtype/reduce_dtype are ZeRO-3's (it gathers the weights); stage {stage} "
                                f"keeps full fp32 weights: run its forward under autocast instead")
        self.module, self.comm, self.stage = module, comm, stage
        broadcast_module(module, comm)
        groups = param_groups or [{"params": [p for p in module.parameters() if p.requires_grad]}]
        group_of = {id(p): g for g, group in enumerate(groups) for p in group["params"]}
        unit_modules = units if units is not None else _default_units(module)
        owner: dict[int, int] = {}  # id(param) -> unit index; unit len(unit_modules) is the root
        for u, m in enumerate(unit_modules):
            for p in m.parameters():
                owner.setdefault(id(p), u)
        # Units in backward order: last block first, the root (embedding + head) last.
        self.units: list[_FlatUnit] = []
        self._units_of_module: dict[int, list[_FlatUnit]] = {}
        all_params = list(module.parameters())
        for u in list(reversed(range(len(unit_modules)))) + [len(unit_modules)]:
            for g in range(len(groups)):
                params = [p for p in all_params if id(p) in group_of and owner.get(id(p), len(unit_modules)) == u
                          and group_of[id(p)] == g]
                if params:
                    unit = _FlatUnit(params, comm, stage, group=g, compute_dtype=compute_dtype,
                                     reduce_dtype=reduce_dtype)
                    self.units.append(unit)
                    key = id(unit_modules[u]) if u < len(unit_modules) else id(module)
                    self._units_of_module.setdefault(key, []).append(unit)
        self._where = {id(p): (unit, i) for unit in self.units for i, p in enumerate(unit.params)}
        inner_groups = []
        for g, group in enumerate(groups):
            options = {k: v for k, v in group.items() if k != "params"}
            inner_groups.append({"params": [u.shard for u in self.units if u.group == g], **options})
        self.optimizer = optimizer_cls([g for g in inner_groups if g["params"]], **optimizer_kwargs)
        self._next_unit = 0
        self._sync = True
        self._reduced = False
        if stage >= 2:
            for p in [p for u in self.units for p in u.params]:
                p.register_post_accumulate_grad_hook(self._grad_ready)
        if stage == 3:
            self._hook_units(unit_modules)

    # --- stage 3: gather just in time -----------------------------------------------------------------------------
    def _hook_units(self, unit_modules: list[nn.Module]) -> None:
        """Block units: gather before forward, free after it, gather again when backward reaches them.
        The root unit (embedding, head): gathered at the model's forward, freed once its gradients are sent
        (or right after forward when no backward will come, e.g. under torch.no_grad)."""
        for m in unit_modules:
            units = self._units_of_module.get(id(m), [])
            m.register_forward_pre_hook(lambda mod, args, units=units: _gather_units(units))
            m.register_forward_hook(lambda mod, args, out, units=units: self._after_unit_forward(units, out))
        root = self._units_of_module.get(id(self.module), [])
        self.module.register_forward_pre_hook(lambda mod, args: _gather_units(root))
        self.module.register_forward_hook(lambda mod, args, out: None if torch.is_grad_enabled() else _free_units(root))

    def _after_unit_forward(self, units: list[_FlatUnit], out) -> None:
        _free_units(units)
        outputs = out if isinstance(out, (tuple, list)) else (out,)
        for t in outputs:
            if torch.is_tensor(t) and t.requires_grad:
                # Runs when the gradient of the unit's output is ready, i.e. just before the unit's backward.
                t.register_hook(lambda grad, units=units: _gather_units(units))
                break

    # --- gradients ------------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def no_sync(self):
        """Accumulate full local gradients without communicating (the last micro-batch's backward sends)."""
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    def _grad_ready(self, p: torch.Tensor) -> None:
        if not self._sync:
            return
        unit, i = self._where[id(p)]
        unit.arrived.add(i)
        self._launch(flush=False)

    def _launch(self, flush: bool) -> None:
        while self._next_unit < len(self.units):
            unit = self.units[self._next_unit]
            if not flush and len(unit.arrived) < len(unit.params):
                return
            unit.start_reduce(release=True)
            if self.stage == 3:
                unit.free()
            self._next_unit += 1

    def finish_gradient_sync(self) -> None:
        """Wait for (or, in stage 1, start) the reduce-scatters; afterwards each shard's .grad is the average."""
        if self.stage == 1:
            for unit in self.units:
                unit.start_reduce(release=False)
        else:
            self._launch(flush=True)
        for unit in self.units:
            unit.finish_reduce()
            unit.arrived = set()
        self._next_unit = 0
        self._reduced = True

    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    def clip_grad_norm_(self, max_norm: float, mesh: Mesh | None = None) -> torch.Tensor:
        """Scale the shard gradients so the global gradient norm is at most max_norm; return the norm before.
        Squared norms of the shards add up over dp (padding is zero); with a mesh, tensor-parallel slices add up
        over tp and pipeline stages over pp (see `clip_grad_norm_`)."""
        if not self._reduced:
            self.finish_gradient_sync()
        sharded, replicated = _zero_grad_sq_norms(self.units)
        total = torch.stack([sharded, replicated])
        self.comm.all_reduce(total)
        norm = _combine_sq_norms(total[0], total[1], mesh)
        _scale_grads([u.shard for u in self.units], max_norm, norm)
        return norm

    def step(self) -> None:
        """Step the inner optimizer on the shards, then (stages 1-2) all-gather the updated weights."""
        if not self._reduced:
            self.finish_gradient_sync()
        self.optimizer.step()
        if self.stage < 3:
            works = [unit.comm.all_gather(unit.full, unit.shard.detach().clone(), async_op=True)
                     for unit in self.units]
            for work in works:
                work.wait()
        self._reduced = False

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        for unit in self.units:
            for p in unit.params:
                p.grad = None
        self._reduced = False

    # --- checkpoints in any layout --------------------------------------------------------------------------------
    @contextlib.contextmanager
    def gathered(self):
        """Inside this block every unit holds its full weights (stage 3 frees them again on exit)."""
        was = [u.gathered for u in self.units]
        for u in self.units:
            u.gather()
        try:
            yield
        finally:
            for u, g in zip(self.units, was):
                if not g:
                    u.free()

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The module's unsharded state dict in the master dtype (same keys as a single-process model), on every
        rank. Collective: gathers the fp32 shards (never the bf16 compute copies)."""
        full = {}
        for u in self.units:
            flat = u.master_full()
            for p, o in zip(u.params, u.offsets):
                full[id(p)] = flat[o:o + p.numel()].view(p.shape).clone()
        return {k: full[id(v)] if id(v) in full else v.detach().clone()
                for k, v in self.module.state_dict(keep_vars=True).items()}

    def load_full_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Set every rank's shards (and the full weights where they are held) from an unsharded state dict."""
        names = self._names()
        for u in self.units:
            flat = torch.zeros(u.padded, dtype=u.shard.dtype, device=u.shard.device)
            for p, o in zip(u.params, u.offsets):
                flat[o:o + p.numel()].copy_(state[names[id(p)]].reshape(-1))
            lo = u.comm.rank * u.shard_size
            with torch.no_grad():
                u.shard.copy_(flat[lo:lo + u.shard_size])
                if u.gathered:
                    u.full.copy_(flat)
        with torch.no_grad():
            for name, buffer in self.module.named_buffers():
                buffer.copy_(state[name])

    def _names(self) -> dict[int, str]:
        return {id(p): n for n, p in self.module.named_parameters()}

    def optimizer_state_dict(self) -> dict:
        """The optimizer state unsharded and keyed by parameter name (see `named_optimizer_state`)."""
        names, state = self._names(), {}
        for u in self.units:
            for key, value in self.optimizer.state.get(u.shard, {}).items():
                if torch.is_tensor(value) and value.shape == u.shard.shape:
                    full = torch.empty(u.padded, dtype=value.dtype, device=value.device)
                    self.comm.all_gather(full, value.contiguous())
                    for p, o in zip(u.params, u.offsets):
                        state.setdefault(names[id(p)], {})[key] = full[o:o + p.numel()].view(p.shape).clone()
                else:
                    for p in u.params:
                        state.setdefault(names[id(p)], {})[key] = value.clone() if torch.is_tensor(value) else value
        groups = []
        for group in self.optimizer.param_groups:
            options = {k: v for k, v in group.items() if k != "params"}
            members = {id(q) for q in group["params"]}
            options["param_names"] = [names[id(p)] for u in self.units if id(u.shard) in members for p in u.params]
            groups.append(options)
        return {"state": state, "param_groups": groups}

    def load_optimizer_state_dict(self, saved: dict) -> None:
        names = self._names()
        for u in self.units:
            per_param = [saved["state"].get(names[id(p)], {}) for p in u.params]
            keys = set().union(*(s.keys() for s in per_param))
            lo = u.comm.rank * u.shard_size
            state = {}
            for key in keys:
                first = next(s[key] for s in per_param if key in s)
                if torch.is_tensor(first) and first.dim() > 0:
                    flat = torch.zeros(u.padded, dtype=first.dtype, device=u.full.device)
                    for p, o, s in zip(u.params, u.offsets, per_param):
                        if key in s:
                            flat[o:o + p.numel()].copy_(s[key].reshape(-1))
                    state[key] = flat[lo:lo + u.shard_size].clone()
                else:      # AdamW's 0-dim `step`: fused and capturable kernels read it on the shard's device
                    state[key] = first.to(u.shard.device, copy=True) if torch.is_tensor(first) else first
            if state:
                self.optimizer.state[u.shard] = state
        _load_group_options(self.optimizer, saved)

    def memory_bytes(self) -> dict[str, int]:
        """Bytes this rank holds right now for parameters, gradients and optimizer state."""
        params = [p for u in self.units for p in u.params] + [u.shard for u in self.units]
        return training_state_bytes(params, self.optimizer)


def _zero_grad_sq_norms(units: list[_FlatUnit]) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of squared gradients of this rank's shards, split into tensor-parallel-sharded and replicated parts
    (a shard can cover pieces of several parameters: walk their ranges)."""
    device = units[0].full.device if units else None
    sharded, replicated = torch.zeros((), device=device), torch.zeros((), device=device)
    for u in units:
        if u.shard.grad is None:
            continue
        lo, hi = u.comm.rank * u.shard_size, (u.comm.rank + 1) * u.shard_size
        g = u.shard.grad.float()
        for p, o in zip(u.params, u.offsets):
            a, b = max(o, lo), min(o + p.numel(), hi)
            if a < b and not getattr(p, "pp_tied_copy", False):
                part = g[a - lo:b - lo].pow(2).sum()
                if getattr(p, "tp_sharded", False):
                    sharded = sharded + part
                else:
                    replicated = replicated + part
    return sharded, replicated


def _load_group_options(optimizer: torch.optim.Optimizer, saved: dict) -> None:
    for group, options in zip(optimizer.param_groups, saved.get("param_groups", [])):
        group.update({k: v for k, v in options.items() if k not in ("params", "param_names")})


def named_optimizer_state(optimizer: torch.optim.Optimizer, module: nn.Module) -> dict:
    """A plain optimizer's state keyed by parameter name instead of position, the layout-free format that
    `Zero.optimizer_state_dict` also writes, so a checkpoint moves between 1 rank and n ranks.
    >>> m = nn.Linear(2, 1); o = torch.optim.AdamW(m.parameters()); m(torch.ones(1, 2)).sum().backward(); o.step()
    >>> sorted(named_optimizer_state(o, m)["state"]["weight"])
    ['exp_avg', 'exp_avg_sq', 'step']
    """
    names = {id(p): n for n, p in module.named_parameters()}
    state = {names[id(p)]: {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()}
             for p, s in optimizer.state.items() if id(p) in names}
    groups = [{**{k: v for k, v in g.items() if k != "params"},
               "param_names": [names[id(p)] for p in g["params"] if id(p) in names]} for g in optimizer.param_groups]
    return {"state": state, "param_groups": groups}


def load_named_optimizer_state(optimizer: torch.optim.Optimizer, module: nn.Module, saved: dict) -> None:
    """Inverse of `named_optimizer_state` for a plain optimizer over `module`'s parameters."""
    for name, p in module.named_parameters():
        if name in saved["state"]:
            optimizer.state[p] = {k: v.clone().to(p.device) if torch.is_tensor(v) else v
                                  for k, v in saved["state"][name].items()}
    _load_group_options(optimizer, saved)


def training_state_bytes(params: Iterable[torch.Tensor], optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes actually allocated for parameters, gradients and optimizer state (each storage counted once)."""
    seen: set[int] = set()

    def size(tensors) -> int:
        total = 0
        for t in tensors:
            if t is None or not torch.is_tensor(t):
                continue
            storage = t.untyped_storage()
            if storage.data_ptr() in seen or storage.nbytes() == 0:
                continue
            seen.add(storage.data_ptr())
            total += storage.nbytes()
        return total

    params = list(params)
    return {"params": size(params), "grads": size(p.grad for p in params),
            "optimizer": size(v for s in optimizer.state.values() for v in s.values())}


# ------------------------------------------------------------------------------------------------------------------
# 6. Tensor parallel (Megatron-LM)
#
# A linear layer y = x W^T with W (out, in) can be split two ways across t ranks:
#   column parallel: rank r keeps rows r of W (a slice of the outputs): y_r = x W_r^T, no communication;
#   row parallel:    rank r keeps columns r of W (a slice of the inputs): y = sum_r x_r W_r^T, one all-reduce.
# Chaining column then row needs no communication in between, because the slice of the outputs rank r computed
# is exactly the slice of the inputs it needs next. So in the MLP w2(silu(w1 x) * w3 x), w1 and w3 are split by
# columns, silu and the product run on each slice alone, w2 is split by rows: one all-reduce per MLP (of the
# activations, (B, T, C) floats). Attention is the same with heads as the slices: wq, wk, wv by heads (under GQA
# the kv heads split too, so the query heads of rank r find their kv heads on rank r), wo by rows.
# Autograd needs the mirror image, so the pair of operators of the paper (called f and g there):
#   f = copy_to_tp:     forward identity,     backward all-reduce (each rank's x fed a slice; the grads add up)
#   g = reduce_from_tp: forward all-reduce,   backward identity
# f sits before attention and before the MLP, g after wo and after w2. The embedding splits the vocabulary:
# rank r holds rows [r V/t, (r+1) V/t) (V padded up to a multiple of t), looks up the ids it owns, zeros the
# rest and all-reduces. The LM head shares those rows and produces logits for its slice of the vocabulary; the
# cross-entropy is computed without ever gathering the (B, T, V) logits: all-reduce the row maxima, the sums of
# exponentials and the target's logit - three tensors of (B*T,) floats instead of (B*T, V).
# Every rank slices the same full, seeded weights, so the model computes the same function for any t.
# ------------------------------------------------------------------------------------------------------------------


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        ctx.comm.all_reduce(grad)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        x = x.contiguous().clone()
        comm.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def copy_to_tp(x: torch.Tensor, comm: Comm) -> torch.Tensor:
    """f: identity forward, all-reduce of the gradient backward."""
    return x if comm.size == 1 else _CopyToTP.apply(x, comm)


def reduce_from_tp(x: torch.Tensor, comm: Comm) -> torch.Tensor:
    """g: all-reduce forward, identity backward."""
    return x if comm.size == 1 else _ReduceFromTP.apply(x, comm)


def _tag(p: nn.Parameter, dim: int, full_size: int) -> nn.Parameter:
    """Mark a parameter as this rank's slice along `dim` of a tensor whose full (unpadded) size there is full_size."""
    p.tp_sharded, p.tp_dim, p.tp_full_size = True, dim, full_size
    return p


def _slice(full: torch.Tensor, dim: int, comm: Comm, padded: int | None = None) -> torch.Tensor:
    """This rank's contiguous slice of `full` along dim, after zero-padding that dim to `padded`.
    >>> _slice(torch.arange(6.).view(3, 2), 0, Comm.single(), padded=4).tolist()
    [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [0.0, 0.0]]
    """
    if padded is not None and padded > full.shape[dim]:
        pad_shape = list(full.shape)
        pad_shape[dim] = padded - full.shape[dim]
        full = torch.cat([full, full.new_zeros(pad_shape)], dim=dim)
    return full.chunk(comm.size, dim=dim)[comm.rank].clone()


class ColumnParallelLinear(nn.Module):
    """Rows [r out/t, (r+1) out/t) of a Linear's weight: (..., in) -> (..., out/t), no communication forward.
    copy_input=True applies f to the input (when no enclosing module does it already)."""

    def __init__(self, full: nn.Linear, comm: Comm, copy_input: bool = False, weight: nn.Parameter | None = None):
        super().__init__()
        self.comm, self.copy_input = comm, copy_input
        self.weight = weight if weight is not None else _tag(nn.Parameter(_slice(full.weight.data, 0, comm)), 0,
                                                             full.out_features)
        self.bias = None if full.bias is None else _tag(nn.Parameter(_slice(full.bias.data, 0, comm)), 0,
                                                        full.out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.copy_input:
            x = copy_to_tp(x, self.comm)
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """Columns [r in/t, (r+1) in/t) of a Linear's weight: (..., in/t) -> (..., out), one all-reduce (g)."""

    def __init__(self, full: nn.Linear, comm: Comm):
        super().__init__()
        self.comm = comm
        self.weight = _tag(nn.Parameter(_slice(full.weight.data, 1, comm)), 1, full.in_features)
        self.bias = None if full.bias is None else nn.Parameter(full.bias.data.clone())  # added once, after g

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = reduce_from_tp(F.linear(x, self.weight), self.comm)
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """Rows [r V'/t, (r+1) V'/t) of the embedding (V' = V padded to a multiple of t): ids (B, T) -> (B, T, C)."""

    def __init__(self, full: nn.Embedding, comm: Comm):
        super().__init__()
        self.comm = comm
        self.vocab_size = full.num_embeddings
        self.padded = -(-self.vocab_size // comm.size) * comm.size
        self.per_rank = self.padded // comm.size
        self.start = comm.rank * self.per_rank
        self.weight = _tag(nn.Parameter(_slice(full.weight.data, 0, comm, self.padded)), 0, self.vocab_size)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        local = idx - self.start
        mine = (local >= 0) & (local < self.per_rank)                         # (B, T) ids this rank owns
        x = F.embedding(local.clamp(0, self.per_rank - 1), self.weight)        # (B, T, C)
        return reduce_from_tp(x * mine.unsqueeze(-1).to(x.dtype), self.comm)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, comm, start, vocab_size):
        # logits (N, V/t) for vocabulary ids [start, start + V/t); targets (N,) global ids, -1 = ignore.
        logits = logits.float()
        width = logits.shape[-1]
        ids = torch.arange(start, start + width, device=logits.device)
        logits = logits.masked_fill(ids >= vocab_size, float("-inf"))         # padded vocabulary rows
        row_max = logits.max(dim=-1).values
        comm.all_reduce(row_max, op=dist.ReduceOp.MAX)
        shifted = logits - row_max[:, None]
        exp = shifted.exp()
        sum_exp = exp.sum(dim=-1)
        comm.all_reduce(sum_exp)
        local_t = targets - start
        owned = (local_t >= 0) & (local_t < width)
        rows = torch.arange(len(targets), device=logits.device)
        target_logit = torch.where(owned, shifted[rows, local_t.clamp(0, width - 1)], 0.0)
        comm.all_reduce(target_logit)
        valid = targets != -1
        count = valid.sum().clamp(min=1)
        loss = ((sum_exp.log() - target_logit) * valid).sum() / count
        ctx.save_for_backward(exp / sum_exp[:, None], local_t, owned, valid, count)
        return loss

    @staticmethod
    def backward(ctx, grad):
        softmax, local_t, owned, valid, count = ctx.saved_tensors
        rows = torch.arange(len(local_t), device=softmax.device)
        g = softmax.clone()
        g[rows[owned], local_t[owned]] -= 1.0                                 # d loss / d logits = p - onehot
        g *= (valid.to(g.dtype) * grad / count)[:, None]
        return g, None, None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, comm: Comm, start: int,
                                 vocab_size: int) -> torch.Tensor:
    """Mean cross-entropy over (N,) targets from each rank's (N, V/t) slice of the logits (ignore_index -1)."""
    return _VocabParallelCrossEntropy.apply(logits, targets, comm, start, vocab_size)


def _copy_input_hook(comm: Comm):
    return lambda module, args: (copy_to_tp(args[0], comm),) + tuple(args[1:])


def apply_tensor_parallel(model: nn.Module, comm: Comm) -> nn.Module:
    """Split a model.py GPT across the ranks of `comm` in place (heads, MLP hidden units, vocabulary)."""
    t, cfg = comm.size, model.config
    if getattr(cfg, "n_expert", 0):
        raise ParallelError("tensor parallel splits the dense SwiGLU; this model uses MoE: set n_expert=0 or --tp 1")
    for name, value in [("n_head", cfg.n_head), ("n_kv_head", cfg.n_kv_head), ("ffn hidden size", cfg.ffn_dim)]:
        if value % t:
            raise ParallelError(f"{name} = {value} is not divisible by --tp {t}; choose a tp that divides it")
    model.tp_comm = comm
    if t == 1:
        return model
    for block in model.blocks:
        attn, ffn = block.attn, block.ffn
        attn.wq, attn.wk, attn.wv = (ColumnParallelLinear(lin, comm) for lin in (attn.wq, attn.wk, attn.wv))
        attn.wo = RowParallelLinear(attn.wo, comm)
        attn.n_head, attn.n_kv_head = attn.n_head // t, attn.n_kv_head // t  # heads on this rank
        attn.register_forward_pre_hook(_copy_input_hook(comm))
        ffn.w1, ffn.w3 = ColumnParallelLinear(ffn.w1, comm), ColumnParallelLinear(ffn.w3, comm)
        ffn.w2 = RowParallelLinear(ffn.w2, comm)
        ffn.register_forward_pre_hook(_copy_input_hook(comm))
    tied = model.lm_head.weight is model.tok_emb.weight
    model.tok_emb = VocabParallelEmbedding(model.tok_emb, comm)
    model.tp_vocab_start = model.tok_emb.start  # kept on the model: a last pipeline stage has no embedding
    padded_head = nn.Linear(cfg.n_embd, model.tok_emb.padded, bias=False, device=model.lm_head.weight.device)
    with torch.no_grad():
        padded_head.weight.zero_()[:cfg.vocab_size].copy_(model.lm_head.weight)
    head = ColumnParallelLinear(padded_head, comm, copy_input=True, weight=model.tok_emb.weight if tied else None)
    if not tied:
        _tag(head.weight, 0, cfg.vocab_size)
    model.lm_head = head
    return model


def lm_loss(model: nn.Module, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy; vocabulary-parallel when the model's head is split."""
    comm = getattr(model, "tp_comm", None)
    if comm is None or comm.size == 1:
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
    return vocab_parallel_cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), comm,
                                        model.tp_vocab_start, model.config.vocab_size)


class TensorParallel(nn.Module):
    """A GPT split by `apply_tensor_parallel`; forward(idx, targets) -> (this rank's logits slice, loss)."""

    def __init__(self, model: nn.Module, comm: Comm):
        super().__init__()
        self.module = apply_tensor_parallel(model, comm)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        m = self.module
        if m.tp_comm.size == 1:
            return m(idx, targets)
        x = m.embed(idx)                                                       # (B, T, C), the same on every rank
        for block in m.blocks:
            x = block(x)  # a Block checkpoints its own activations when the config asks
        logits = m.head(x)                                                     # (B, T, V'/t)
        return logits, None if targets is None else lm_loss(m, logits, targets)


def tp_gather(t: torch.Tensor, p: nn.Parameter, comm: Comm) -> torch.Tensor:
    """The full tensor of which `t` (shaped like parameter p) is this rank's slice; unpadded."""
    if not getattr(p, "tp_sharded", False) or comm.size == 1:
        return t.detach().clone()
    moved = t.detach().movedim(p.tp_dim, 0).contiguous()
    out = torch.empty(comm.size * moved.numel(), dtype=t.dtype, device=t.device)
    comm.all_gather(out, moved.reshape(-1))
    full = out.view(comm.size * moved.shape[0], *moved.shape[1:])[:p.tp_full_size]
    return full.movedim(0, p.tp_dim).contiguous()


def tp_slice(full: torch.Tensor, p: nn.Parameter, comm: Comm) -> torch.Tensor:
    """This rank's slice of a full tensor shaped like parameter p's full tensor (inverse of tp_gather)."""
    if not getattr(p, "tp_sharded", False) or comm.size == 1:
        return full.clone()
    return _slice(full, p.tp_dim, comm, padded=p.shape[p.tp_dim] * comm.size)


# ------------------------------------------------------------------------------------------------------------------
# 7. Pipeline parallel: schedules as plain lists of actions
#
# The model's layers are cut into p contiguous stages; the batch into m micro-batches. A schedule says, for each
# stage, the order of its actions: F i / B i (forward / backward of micro-batch i) and the messages between
# neighbours: SEND_F / RECV_F carry activations (B/m, T, C) to the next stage, SEND_B / RECV_B carry their
# gradients back. Consecutive messages in a list are posted together as one batch (see Comm.send_recv).
#
# GPipe, all-forward-all-backward (AFAB): every forward, then every backward. Simple, but stage s holds the
# activations of all m micro-batches at once. p = 3, m = 4 (time ->, each cell one forward or backward slot):
#     stage 0: F0 F1 F2 F3 .  .  .  .  B0 B1 B2 B3
#     stage 1: .  F0 F1 F2 F3 .  .  B0 B1 B2 B3 .
#     stage 2: .  .  F0 F1 F2 F3 B0 B1 B2 B3 .  .
# 1F1B: stage s runs p - s - 1 warm-up forwards, then alternates one forward and one backward, then drains.
# Same bubble, but at most p - s micro-batches are in flight, so activation memory is bounded by p, not m.
# In both, each stage idles (p - 1) slots of forward + backward out of (m + p - 1): the bubble
# (p - 1) / (m + p - 1); p = 4, m = 16 -> 3/19 = 16%. `simulate` replays a schedule with timings and checks it.
# ------------------------------------------------------------------------------------------------------------------


class Action(NamedTuple):
    op: str   # "F", "B", "SEND_F", "RECV_F", "SEND_B", "RECV_B"
    mb: int   # micro-batch index

    def __repr__(self) -> str:
        return f"{self.op}{self.mb}"


COMM_OPS = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")


def _forward_actions(stage: int, p: int, mb: int) -> list[Action]:
    first, last = stage == 0, stage == p - 1
    return ([] if first else [Action("RECV_F", mb)]) + [Action("F", mb)] + ([] if last else [Action("SEND_F", mb)])


def _backward_actions(stage: int, p: int, mb: int) -> list[Action]:
    first, last = stage == 0, stage == p - 1
    return ([] if last else [Action("RECV_B", mb)]) + [Action("B", mb)] + ([] if first else [Action("SEND_B", mb)])


def afab_schedule(p: int, m: int) -> list[list[Action]]:
    """GPipe: per stage, all forwards then all backwards.
    >>> afab_schedule(2, 2)
    [[F0, SEND_F0, F1, SEND_F1, RECV_B0, B0, RECV_B1, B1], [RECV_F0, F0, RECV_F1, F1, B0, SEND_B0, B1, SEND_B1]]
    """
    return [[a for i in range(m) for a in _forward_actions(s, p, i)] +
            [a for i in range(m) for a in _backward_actions(s, p, i)] for s in range(p)]


def one_f_one_b_schedule(p: int, m: int) -> list[list[Action]]:
    """1F1B: warm-up forwards, steady one-forward-one-backward, cool-down backwards (PipeDream-flush/Megatron).
    >>> one_f_one_b_schedule(2, 2)[0]
    [F0, SEND_F0, F1, SEND_F1, RECV_B0, B0, RECV_B1, B1]
    """
    schedule = []
    for s in range(p):
        warmup = min(p - s - 1, m)
        actions = [a for i in range(warmup) for a in _forward_actions(s, p, i)]
        for k in range(m - warmup):
            actions += _forward_actions(s, p, warmup + k) + _backward_actions(s, p, k)
        actions += [a for i in range(m - warmup, m) for a in _backward_actions(s, p, i)]
        schedule.append(actions)
    return schedule


SCHEDULES = {"afab": afab_schedule, "1f1b": one_f_one_b_schedule}


def _batches(actions: list[Action]) -> list[list[Action]]:
    """Split a stage's actions into steps: one compute action, or a run of consecutive messages posted together."""
    steps: list[list[Action]] = []
    for a in actions:
        if a.op in COMM_OPS and steps and steps[-1][0].op in COMM_OPS:
            steps[-1].append(a)
        else:
            steps.append([a])
    return steps


def _channel(stage: int, a: Action) -> tuple[str, int, int, str]:
    """(direction, from stage, to stage, side) of a message: SEND_F on s goes s -> s+1, RECV_B on s comes s+1 -> s."""
    return {"SEND_F": ("F", stage, stage + 1, "send"), "RECV_F": ("F", stage - 1, stage, "recv"),
            "SEND_B": ("B", stage, stage - 1, "send"), "RECV_B": ("B", stage + 1, stage, "recv")}[a.op]


def simulate(schedule: list[list[Action]], t_f: float = 1.0, t_b: float = 2.0) -> dict:
    """Replay a schedule as the executor runs it: a compute takes t_f / t_b, a batch of messages completes when
    the partner of every message in it has been posted (the k-th send on a channel meets its k-th receive).
    Raises ParallelError on a deadlock, a send meeting the receive of another micro-batch, or a compute whose
    input has not arrived. Returns the makespan, each stage's bubble (idle share) and peak in-flight micro-batches.
    >>> round(simulate(one_f_one_b_schedule(4, 16))["bubble"], 3), round(3 / 19, 3)
    (0.158, 0.158)
    """
    p = len(schedule)
    steps = [_batches(a) for a in schedule]
    pc, clock = [0] * p, [0.0] * p
    posted: dict[tuple, list[tuple[int, float]]] = {}   # channel side -> [(mb, time posted)]
    mine: list[list[int] | None] = [None] * p            # indices of this stage's posted messages
    arrived_f, arrived_b = [set() for _ in range(p)], [set() for _ in range(p)]
    done_f, done_b = [set() for _ in range(p)], [set() for _ in range(p)]
    in_flight, peak, busy = [0] * p, [0] * p, [0.0] * p
    timeline: list[list[tuple[float, Action]]] = [[] for _ in range(p)]
    while any(pc[s] < len(steps[s]) for s in range(p)):
        progress = False
        for s in range(p):
            if pc[s] >= len(steps[s]):
                continue
            step = steps[s][pc[s]]
            if step[0].op == "F" or step[0].op == "B":
                a = step[0]
                if a.op == "F":
                    if s > 0 and a.mb not in arrived_f[s]:
                        raise ParallelError(f"stage {s} runs F{a.mb} before receiving its input")
                    done_f[s].add(a.mb)
                    in_flight[s] += 1
                    peak[s] = max(peak[s], in_flight[s])
                else:
                    if a.mb not in done_f[s] or (s < p - 1 and a.mb not in arrived_b[s]):
                        raise ParallelError(f"stage {s} runs B{a.mb} before its forward or its output gradient")
                    done_b[s].add(a.mb)
                    in_flight[s] -= 1
                duration = t_f if a.op == "F" else t_b
                timeline[s].append((clock[s], a))
                clock[s] += duration
                busy[s] += duration
                pc[s] += 1
                progress = True
                continue
            if mine[s] is None:  # post every message of the batch
                mine[s] = []
                for a in step:
                    key = _channel(s, a)
                    if not 0 <= key[1] < p or not 0 <= key[2] < p:
                        raise ParallelError(f"stage {s} has {a} with no neighbour")
                    if (a.op == "SEND_F" and a.mb not in done_f[s]) or (a.op == "SEND_B" and a.mb not in done_b[s]):
                        raise ParallelError(f"stage {s} runs {a} before computing what it sends")
                    mine[s].append(len(posted.setdefault(key, [])))
                    posted[key].append((a.mb, clock[s]))
                progress = True
            partners = []
            for a, k in zip(step, mine[s]):
                direction, src, dst, side = _channel(s, a)
                other = posted.get((direction, src, dst, "recv" if side == "send" else "send"), [])
                if len(other) <= k:
                    break
                if other[k][0] != a.mb:
                    raise ParallelError(f"stage {s}: {a} meets micro-batch {other[k][0]} on the other side")
                partners.append(other[k][1])
            else:
                clock[s] = max([clock[s]] + partners)
                for a in step:
                    if a.op == "RECV_F":
                        arrived_f[s].add(a.mb)
                    elif a.op == "RECV_B":
                        arrived_b[s].add(a.mb)
                mine[s] = None
                pc[s] += 1
                progress = True
        if not progress:
            raise ParallelError(f"deadlock: stages wait at {[steps[s][pc[s]] if pc[s] < len(steps[s]) else None for s in range(p)]}")
    for s in range(p):
        n = len({a.mb for a in schedule[s] if a.op == "F"})
        if done_f[s] != done_b[s] or len(done_f[s]) != n:
            raise ParallelError(f"stage {s} does not run every forward and backward exactly once")
    makespan = max(clock)
    bubbles = [1 - b / makespan for b in busy]
    return {"makespan": makespan, "bubble": max(bubbles), "bubbles": bubbles, "peak_in_flight": peak,
            "timeline": timeline}


def render_schedule(schedule: list[list[Action]]) -> str:
    """The schedule as a time grid (forward and backward one slot each), as drawn in the lesson.
    >>> print(render_schedule(afab_schedule(2, 2)))
    stage 0: F0 F1 .  .  B0 B1
    stage 1: .  F0 F1 B0 B1 .
    """
    timeline = simulate(schedule, 1.0, 1.0)["timeline"]
    width = int(max(t for line in timeline for t, _ in line)) + 1
    cell = max(len(f"{a.op}{a.mb}") for line in timeline for _, a in line) + 1
    rows = []
    for s, line in enumerate(timeline):
        cells = [".".ljust(cell)] * width
        for t, a in line:
            cells[int(t)] = f"{a.op}{a.mb}".ljust(cell)
        rows.append(f"stage {s}: " + "".join(cells).rstrip())
    return "\n".join(rows)


def bubble_fraction(p: int, m: int) -> float:
    """The idle share of a pipeline with p stages and m micro-batches.
    >>> round(bubble_fraction(4, 16), 3)
    0.158
    """
    return (p - 1) / (m + p - 1)


# ------------------------------------------------------------------------------------------------------------------
# 8. Pipeline parallel: the executor
#
# Each rank builds the whole model from the same seed, then keeps only its stage: the first stage keeps the
# embedding, the last the final norm and head, every stage its slice of the blocks (the others become Identity,
# so parameter names stay those of the full model and checkpoints merge by name). With tied embeddings the
# first and last stage each hold a copy of the (V, C) matrix; after backward they all-reduce its gradient over
# the "embed" group, so both copies take the same step and stay equal. The last stage divides each
# micro-batch's loss by m, so the summed gradients are those of the mean loss over the whole batch. A
# data-parallel wrapper (DataParallel or ZeRO-1) only communicates after the stage's last backward.
# ------------------------------------------------------------------------------------------------------------------


def layer_ranges(n_layer: int, p: int) -> list[tuple[int, int]]:
    """Contiguous [lo, hi) layer ranges for p stages, sizes differing by at most one (earlier stages get more).
    >>> layer_ranges(5, 2)
    [(0, 3), (3, 5)]
    """
    if n_layer < p:
        raise ParallelError(f"{n_layer} layers cannot fill {p} pipeline stages; use --pp <= {n_layer}")
    sizes = [n_layer // p + (1 if s < n_layer % p else 0) for s in range(p)]
    starts = [sum(sizes[:s]) for s in range(p)]
    return [(lo, lo + n) for lo, n in zip(starts, sizes)]


class PipelineParallel:
    """Run one training step of a GPT cut into pipeline stages over `mesh.pp`.

        pipe = PipelineParallel(model, mesh, schedule="1f1b")   # prunes `model` to this rank's stage
        loss = pipe.step(x, y, micro_batches=4, grad_sync=dp)   # forward + backward; then opt.step()
    """

    def __init__(self, model: nn.Module, mesh: Mesh, schedule: str = "1f1b"):
        if schedule not in SCHEDULES:
            raise ParallelError(f"unknown pipeline schedule {schedule!r}; choose one of {sorted(SCHEDULES)}")
        self.model, self.comm, self.embed_comm, self.schedule = model, mesh.pp, mesh.embed, schedule
        p, s = self.comm.size, self.comm.rank
        self.lo, self.hi = layer_ranges(len(model.blocks), p)[s]
        self.first, self.last = s == 0, s == p - 1
        self.tied = model.lm_head.weight is model.tok_emb.weight
        for i in range(len(model.blocks)):
            if not self.lo <= i < self.hi:
                model.blocks[i] = nn.Identity()
        if p > 1:
            if self.tied and self.last:  # the last stage gets its own copy of the tied matrix
                shared = model.lm_head.weight
                copy = nn.Parameter(shared.detach().clone())
                copy.__dict__.update({k: v for k, v in shared.__dict__.items() if k.startswith("tp_")})
                copy.pp_tied_copy = True  # counted once in the gradient norm
                model.lm_head.weight = copy
            if not self.first:
                model.tok_emb = None
            if not self.last:
                model.norm, model.lm_head = None, None
        self.stats: dict[str, float] = {}

    def tied_weight(self) -> nn.Parameter | None:
        """This stage's copy of the tied embedding matrix (first or last stage), else None."""
        if not self.tied or self.comm.size == 1:
            return None
        return self.model.tok_emb.weight if self.first else self.model.lm_head.weight if self.last else None

    def stage_forward(self, x: torch.Tensor, targets: torch.Tensor | None) -> torch.Tensor:
        """ids (b, T) or activations (b, T, C) -> activations (b, T, C), or on the last stage the loss."""
        if self.first:
            x = self.model.embed(x)
        for i in range(self.lo, self.hi):
            x = self.model.blocks[i](x)
        return lm_loss(self.model, self.model.head(x), targets) if self.last else x

    def step(self, idx: torch.Tensor, targets: torch.Tensor, micro_batches: int, grad_sync=None) -> torch.Tensor:
        """Forward and backward of the batch (B, T) as `micro_batches` pieces; returns the mean loss on every
        stage. `grad_sync` (DataParallel / Zero stage 1) communicates once, after this stage's last backward."""
        m, p = micro_batches, self.comm.size
        if m < 1 or idx.shape[0] % m:
            raise ParallelError(f"batch size {idx.shape[0]} is not divisible by --micro-batches {m}; "
                                f"choose a divisor of the batch size")
        ids, tgts = idx.chunk(m), targets.chunk(m)
        shape = (idx.shape[0] // m, idx.shape[1], self.model.config.n_embd)
        dtype, device = next(self.model.parameters()).dtype, idx.device
        actions = SCHEDULES[self.schedule](p, m)[self.comm.rank]
        last_backward = max(i for i, a in enumerate(actions) if a.op == "B")
        inputs, outputs, grads, losses = {}, {}, {}, []
        nxt = self.comm.global_rank(self.comm.rank + 1) if not self.last else None
        prev = self.comm.global_rank(self.comm.rank - 1) if not self.first else None
        compute_s, start, position = 0.0, time.perf_counter(), 0
        for step in _batches(actions):
            a = step[0]
            if a.op in ("F", "B"):
                t0 = time.perf_counter()
                if a.op == "F":
                    x = ids[a.mb] if self.first else inputs[a.mb]
                    out = self.stage_forward(x, tgts[a.mb] if self.last else None)
                    if self.last:
                        losses.append(out.detach())
                        out = out / m
                    outputs[a.mb] = out
                else:
                    sync_now = grad_sync is None or position == last_backward
                    with contextlib.nullcontext() if sync_now else grad_sync.no_sync():
                        if self.last:
                            outputs.pop(a.mb).backward()
                        else:
                            torch.autograd.backward(outputs.pop(a.mb), grads.pop(a.mb))
                compute_s += time.perf_counter() - t0
                position += 1
                continue
            sends, recvs = [], []
            for a in step:
                if a.op == "SEND_F":
                    sends.append((outputs[a.mb].detach(), nxt))
                elif a.op == "SEND_B":
                    sends.append((inputs.pop(a.mb).grad, prev))
                elif a.op == "RECV_F":
                    inputs[a.mb] = torch.empty(shape, dtype=dtype, device=device)
                    recvs.append((inputs[a.mb], prev))
                else:
                    grads[a.mb] = torch.empty(shape, dtype=dtype, device=device)
                    recvs.append((grads[a.mb], nxt))
            self.comm.send_recv(sends, recvs)
            for a in step:
                if a.op == "RECV_F":
                    inputs[a.mb].requires_grad_()
            position += len(step)
        if grad_sync is not None:
            grad_sync.finish_gradient_sync()
        tied = self.tied_weight()
        if tied is not None and tied.grad is not None:
            self.embed_comm.all_reduce(tied.grad)
        wall = time.perf_counter() - start
        self.stats = {"compute_s": compute_s, "wall_s": wall, "bubble": 1 - compute_s / wall}
        loss = torch.stack(losses).mean() if self.last else torch.zeros((), device=device)
        self.comm.broadcast(loss, src=p - 1)
        return loss


def _combine_sq_norms(sharded: torch.Tensor, replicated: torch.Tensor, mesh: Mesh | None) -> torch.Tensor:
    """Global norm from this rank's squared sums: tensor-parallel slices add up over tp, stages over pp."""
    if mesh is None:
        return (sharded + replicated).sqrt()
    sharded = sharded.clone()
    mesh.tp.all_reduce(sharded)
    total = (sharded + replicated).reshape(1)
    mesh.pp.all_reduce(total)
    return total[0].sqrt()


def _scale_grads(params: Iterable[torch.Tensor], max_norm: float, norm: torch.Tensor) -> None:
    scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    for p in params:
        if p.grad is not None:
            p.grad.mul_(scale)


def clip_grad_norm_(params: Iterable[nn.Parameter], max_norm: float, mesh: Mesh) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_ for a model split by tp and pp (gradients already averaged over dp).
    The norm must be that of the full model: the squares of tensor-parallel slices (`p.tp_sharded`) are summed
    over tp, replicated parameters (norm weights) counted once, stages summed over pp, and the last stage's copy
    of a tied embedding (`p.pp_tied_copy`) skipped. Returns the norm before clipping."""
    params = list(params)
    device = params[0].device if params else None
    sharded, replicated = torch.zeros((), device=device), torch.zeros((), device=device)
    for p in params:
        if p.grad is None or getattr(p, "pp_tied_copy", False):
            continue
        sq = p.grad.detach().float().pow(2).sum()
        if getattr(p, "tp_sharded", False):
            sharded = sharded + sq
        else:
            replicated = replicated + sq
    norm = _combine_sq_norms(sharded, replicated, mesh)
    _scale_grads(params, max_norm, norm)
    return norm


def _to_cpu(obj):
    """A nested dict of tensors with every tensor copied to the CPU. all_gather_object pickles its object, and a
    CUDA tensor unpickles onto the GPU it came from (pytorch/pytorch#76865): every process would open a CUDA
    context on every other rank's GPU, or crash where it sees only its own."""
    if torch.is_tensor(obj):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    return obj


def full_model_state_dict(model: nn.Module, mesh: Mesh) -> dict[str, torch.Tensor]:
    """Merge every stage's (and every tensor-parallel rank's) parameters into the single-process state dict."""
    params = dict(model.named_parameters(remove_duplicate=False))
    local = {k: tp_gather(v, params[k], mesh.tp) if k in params else v.detach().clone()
             for k, v in model.state_dict().items()}
    if mesh.pp.size == 1:
        return local
    merged: dict[str, torch.Tensor] = {}
    parts = [None] * mesh.pp.size
    dist.all_gather_object(parts, _to_cpu(local), group=mesh.pp.group)
    for part in parts:
        merged.update(part)
    return merged


# ------------------------------------------------------------------------------------------------------------------
# 9. Putting it together for train.py: `parallelize(model, optimizer, mesh, zero, schedule)`
#
# train.py builds the full model and a plain optimizer as if it were alone, then hands both over. Every rank
# builds the same full weights (same seed within a dp group), so slicing them (TP) or pruning them (PP) gives
# the same function as one process. What comes back keeps train.py's loop unchanged:
#   model:     forward(x, y) (not under PP), no_sync(), finish_gradient_sync(), clip_grad_norm_(max_norm),
#              pipeline_step(micro_batches) (under PP), full_state_dict() / load_full_state_dict() and
#              full_model() (a plain GPT with every weight, for sampling); all of them collective.
#   optimizer: param_groups, step(), zero_grad(), and state_dict() / load_state_dict() in the format of the
#              single-process optimizer (torch's, keyed by position), so a checkpoint saved on 4 ranks resumes
#              on 1 and back, in any layout.
# ------------------------------------------------------------------------------------------------------------------


def _canonical(name: str, p: torch.Tensor) -> str:
    """The single-process name of a parameter: the last stage's copy of a tied embedding is tok_emb.weight."""
    return "tok_emb.weight" if getattr(p, "pp_tied_copy", False) else name


class DistributedModel(nn.Module):
    """A GPT split over a mesh; see the section comment. Build it with `parallelize`."""

    def __init__(self, model: nn.Module, mesh: Mesh, zero: int, schedule: str):
        super().__init__()
        self.mesh, self.zero_stage = mesh, zero
        self.config = model.config
        self.module = TensorParallel(model, mesh.tp)  # tp = 1 splits nothing
        self.pipe = PipelineParallel(model, mesh, schedule) if mesh.pp.size > 1 else None
        self.zero: Zero | None = None
        self.sync = None

    @property
    def model(self) -> nn.Module:
        return self.module.module

    @property
    def pipelined(self) -> bool:
        """True under pipeline parallel: train with pipeline_step(micro_batches), not forward + backward."""
        return self.pipe is not None

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        if self.pipe is None:
            return self.module(idx, targets)
        if torch.is_grad_enabled():
            raise ParallelError("under pipeline parallel, train through pipeline_step(); forward() only evaluates")
        return None, self.pipeline_eval(idx, targets)

    @torch.no_grad()
    def pipeline_eval(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Forward only, stage after stage (no micro-batches needed): the loss, on every stage."""
        pipe, comm = self.pipe, self.mesh.pp
        shape = (idx.shape[0], idx.shape[1], self.config.n_embd)
        dtype = next(self.model.parameters()).dtype
        x = idx if pipe.first else torch.empty(shape, dtype=dtype, device=idx.device)
        if not pipe.first:
            comm.send_recv([], [(x, comm.global_rank(comm.rank - 1))])
        out = pipe.stage_forward(x, targets if pipe.last else None)
        if not pipe.last:
            comm.send_recv([(out, comm.global_rank(comm.rank + 1))], [])
        loss = out.float().reshape(()) if pipe.last else torch.zeros((), device=idx.device)
        comm.broadcast(loss, src=comm.size - 1)
        return loss

    def pipeline_step(self, micro_batches: list[tuple[torch.Tensor, torch.Tensor]], count: int = 0) -> float:
        """Forward + backward of all micro-batches as one pipelined batch of `count` pieces (0 = as given)."""
        x = torch.cat([b[0] for b in micro_batches])
        y = torch.cat([b[1] for b in micro_batches])
        return float(self.pipe.step(x, y, count or len(micro_batches), self.sync))

    def no_sync(self):
        return self.sync.no_sync() if self.sync is not None else contextlib.nullcontext()

    def finish_gradient_sync(self) -> None:
        if self.sync is not None and self.pipe is None:
            self.sync.finish_gradient_sync()

    def clip_grad_norm_(self, max_norm: float) -> float:
        """Clip to the global norm of the full model (max_norm 0: only measure); return the norm before."""
        limit = max_norm if max_norm > 0 else float("inf")
        if self.zero is not None:
            return float(self.zero.clip_grad_norm_(limit, self.mesh))
        return float(clip_grad_norm_(self.model.parameters(), limit, self.mesh))

    def full_state_dict(self, cpu: bool = True) -> dict[str, torch.Tensor]:
        """The single-process state dict, fp32 (under ZeRO-3 gathered from the master shards), on every rank; on
        the CPU (for a checkpoint), or with cpu=False where the weights live."""
        if self.zero is not None and self.zero.stage == 3:  # ZeRO-3 runs without tp and pp
            state = self.zero.full_state_dict()
        else:
            state = full_model_state_dict(self.model, self.mesh)
        return {k: v.cpu() for k, v in state.items()} if cpu else state

    def load_full_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        params = dict(self.model.named_parameters(remove_duplicate=False))
        local = {}
        for k, v in self.model.state_dict().items():
            full = state[_canonical(k, params[k]) if k in params else k]
            local[k] = tp_slice(full, params[k], self.mesh.tp) if k in params else full
        if self.zero is not None:
            self.zero.load_full_state_dict(local)
        else:
            self.model.load_state_dict(local)

    def describe(self, micro_batches: int = 1) -> str:
        """The accounting printed at the start of a run: layout, what this rank holds, traffic and bubble."""
        m = self.mesh
        n_local = sum(p.numel() for p in self.model.parameters())
        n_full = self.config.num_params()
        dp, stage = m.dp.size, self.zero_stage
        lines = [f"parallel: world {m.world} = dp {dp} x tp {m.tp.size} x pp {m.pp.size}, ZeRO-{stage}"
                 + (f", {self.pipe.schedule} schedule" if self.pipe else "")]
        lines.append(f"  this rank: {n_local:,} of {n_full:,} parameters after TP/PP; weights + grads + AdamW state "
                     f"per rank by the formula: {zero_memory_per_rank(n_local, dp, stage, 4, 4, 8) / 2**20:,.1f} MiB "
                     f"fp32 (16 bytes/param, ZeRO shares), "
                     f"{zero_memory_per_rank(n_local, dp, stage) / 2**20:,.1f} MiB mixed precision")
        if dp > 1:
            blocks = sum(p.numel() for b in getattr(self.model, "blocks", []) for p in b.parameters())
            unit = self.zero.units[0] if self.zero is not None else None
            gather_bytes = unit.full.element_size() if unit else 4
            reduce_bytes = torch.finfo(unit.reduce_dtype).bits // 8 if unit else 4
            sent = zero_bytes_per_step(blocks, n_local - blocks, dp, stage, gather_bytes, reduce_bytes)
            lines.append(f"  data-parallel traffic per step and rank: {sent / 2**20:,.2f} MiB (weights gathered in "
                         f"{gather_bytes} bytes, gradients reduced in {reduce_bytes}; see zero_bytes_per_step)")
        if self.pipe is not None:
            lines.append(f"  pipeline bubble (p-1)/(m+p-1) = {bubble_fraction(m.pp.size, micro_batches):.1%} with "
                         f"{micro_batches} micro-batches")
        return "\n".join(lines)

    def full_model(self) -> nn.Module:
        """A plain (unsplit) copy of the model with the current weights, on every rank, on this rank's device
        (the sampler feeds it ids and a generator of that device)."""
        device = next(self.model.parameters()).device
        full = type(self.model)(self.config).to(device)
        full.load_state_dict(self.full_state_dict(cpu=False))
        return full


class DistributedOptimizer:
    """The optimizer of a DistributedModel: a plain torch optimizer or ZeRO over this rank's parameters, whose
    state_dict() is the single-process optimizer's (collective: gathers over dp, tp and pp)."""

    def __init__(self, wrapped: DistributedModel, optimizer: torch.optim.Optimizer, names: list[list[str]],
                 compute_dtype: torch.dtype | None = None, reduce_dtype: torch.dtype | None = None):
        self.wrapped, self.mesh = wrapped, wrapped.mesh
        self.group_names = names  # the single-process optimizer's parameter names, group by group, in order
        local = {_canonical(n, p): p for n, p in wrapped.model.named_parameters()}
        groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [local[n] for n in names_g if n in local]}
                  for g, names_g in zip(optimizer.param_groups, names)]
        if wrapped.zero_stage:
            wrapped.zero = Zero(wrapped.model, self.mesh.dp, wrapped.zero_stage, type(optimizer),
                                param_groups=[g for g in groups if g["params"]], compute_dtype=compute_dtype,
                                reduce_dtype=reduce_dtype)
            wrapped.sync = self.inner = wrapped.zero
        else:
            self.inner = type(optimizer)([g for g in groups if g["params"]])
            if self.mesh.dp.size > 1:
                wrapped.sync = DataParallel(wrapped.model, self.mesh.dp)

    @property
    def param_groups(self) -> list[dict]:
        return self.inner.param_groups

    def step(self) -> None:
        self.inner.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad()
        for p in self.wrapped.model.parameters():
            p.grad = None

    def _named_state(self) -> dict[str, dict]:
        model, tp = self.wrapped.model, self.mesh.tp
        named = (self.inner.optimizer_state_dict() if isinstance(self.inner, Zero)
                 else named_optimizer_state(self.inner, model))["state"]
        params = dict(model.named_parameters())
        state = {}
        for name, s in named.items():
            p = params[name]
            if getattr(p, "pp_tied_copy", False):
                continue  # the first stage's copy is the one saved
            state[name] = {k: tp_gather(v, p, tp) if torch.is_tensor(v) and v.shape == p.shape else v
                           for k, v in s.items()}
        if self.mesh.pp.size > 1:
            parts = [None] * self.mesh.pp.size
            dist.all_gather_object(parts, _to_cpu(state), group=self.mesh.pp.group)
            state = {k: v for part in parts for k, v in part.items()}
        return state

    def state_dict(self) -> dict:
        """torch's format of the single-process optimizer: {"state": {index: ...}, "param_groups": [...]}."""
        state = self._named_state()
        order = [n for names in self.group_names for n in names]
        groups, start = [], 0
        for options, names in zip(self.inner.param_groups, self.group_names):
            groups.append({**{k: v for k, v in options.items() if k != "params"},
                           "params": list(range(start, start + len(names)))})
            start += len(names)
        return {"state": {i: state[n] for i, n in enumerate(order) if n in state}, "param_groups": groups}

    def load_state_dict(self, saved: dict) -> None:
        order = [n for names in self.group_names for n in names]
        by_name = {order[int(i)]: s for i, s in saved["state"].items()}
        model, tp = self.wrapped.model, self.mesh.tp
        named = {}
        for name, p in model.named_parameters():
            s = by_name.get(_canonical(name, p))
            if s is not None:
                named[name] = {k: tp_slice(v, p, tp) if torch.is_tensor(v) and v.dim() > 0 else v
                               for k, v in s.items()}
        groups = [{k: v for k, v in g.items() if k != "params"} for g in saved["param_groups"]]
        payload = {"state": named, "param_groups": groups if len(groups) == len(self.inner.param_groups) else []}
        if isinstance(self.inner, Zero):
            self.inner.load_optimizer_state_dict(payload)
        else:
            load_named_optimizer_state(self.inner, model, payload)


def parallelize(model: nn.Module, optimizer: torch.optim.Optimizer, mesh: Mesh, zero: int = 0,
                schedule: str = "1f1b", compute_dtype: torch.dtype | None = None,
                reduce_dtype: torch.dtype | None = None) -> tuple[DistributedModel, DistributedOptimizer]:
    """Split a full GPT and its plain optimizer over the mesh: TP inside, then PP, then DP or ZeRO over dp.
    compute_dtype / reduce_dtype: ZeRO-3's mixed precision (see `Zero`)."""
    check_combination(zero, mesh.tp.size, mesh.pp.size)
    if (compute_dtype or reduce_dtype) and zero != 3:
        raise ParallelError("gathering weights in a compute dtype is ZeRO-3's; use --zero 3, or autocast alone")
    if mesh.pp.size > 1 and getattr(model.config, "n_expert", 0):
        raise ParallelError("pipeline parallel does not carry the MoE load-balancing loss; use --pp 1 with MoE")
    if dist.is_initialized() and dist.get_world_size() > 1:
        # Every rank must start from the same full weights before slicing or pruning them: rank 0's.
        with torch.no_grad():
            for t in model.state_dict().values():
                dist.broadcast(t, src=0)
    names = {id(p): n for n, p in model.named_parameters()}
    group_names = [[names[id(p)] for p in g["params"]] for g in optimizer.param_groups]
    wrapped = DistributedModel(model, mesh, zero, schedule)
    return wrapped, DistributedOptimizer(wrapped, optimizer, group_names, compute_dtype, reduce_dtype)


# ------------------------------------------------------------------------------------------------------------------
# 10. Accounting: what each rank holds (the formula), how long a real pipeline idles
# ------------------------------------------------------------------------------------------------------------------


def zero_memory_per_rank(num_params: float, world: int, stage: int, bytes_param: float = 2,
                         bytes_grad: float = 2, bytes_optimizer: float = 12) -> float:
    """Bytes per rank for weights + gradients + optimizer state under ZeRO stage 0-3 (0 = plain DP).
    The defaults are mixed-precision AdamW (2 + 2 + 12 = 16 bytes/param); fp32 AdamW is 4 + 4 + 8.
    >>> [round(zero_memory_per_rank(7e9, 8, s) / 1e9, 2) for s in range(4)]
    [112.0, 38.5, 26.25, 14.0]
    """
    if stage not in (0, 1, 2, 3):
        raise ParallelError(f"ZeRO stage must be 0, 1, 2 or 3, got {stage}")
    optimizer = bytes_optimizer / (world if stage >= 1 else 1)
    grads = bytes_grad / (world if stage >= 2 else 1)
    weights = bytes_param / (world if stage >= 3 else 1)
    return num_params * (weights + grads + optimizer)


def zero_bytes_per_step(block_params: float, other_params: float, world: int, stage: int,
                        gather_bytes: float = 4, reduce_bytes: float = 4) -> float:
    """Bytes one rank sends per optimizer step under DP (stage 0) or ZeRO-1/2/3, at the ring costs of section 1,
    as this file's code sends them. With f = (n-1)/n and N = block_params + other_params:
        stage 0:    all-reduce of the gradients                       2 f N reduce_bytes
        stages 1-2: reduce-scatter the gradients, all-gather weights  f N (reduce_bytes + gather_bytes)
        stage 3:    gather every unit for forward, the blocks again for backward (the root unit, embedding +
                    norm + head, stays gathered until its gradients are sent), reduce-scatter the gradients
                    f ((2 blocks + other) gather_bytes + N reduce_bytes)
    gather_bytes is the size of the dtype weights travel in (ZeRO-3 in bf16: 2), reduce_bytes the gradients'.
    >>> f"{zero_bytes_per_step(85e6, 39e6, 8, 3) / 1e6:.0f} MB fp32 vs {zero_bytes_per_step(85e6, 39e6, 8, 3, 2) / 1e6:.0f} MB bf16 gathers"
    '1166 MB fp32 vs 800 MB bf16 gathers'
    """
    if stage not in (0, 1, 2, 3):
        raise ParallelError(f"ZeRO stage must be 0, 1, 2 or 3, got {stage}")
    f, total = (world - 1) / world, block_params + other_params
    if stage == 0:
        return 2 * f * total * reduce_bytes
    if stage < 3:
        return f * total * (reduce_bytes + gather_bytes)
    return f * ((2 * block_params + other_params) * gather_bytes + total * reduce_bytes)


def measure_pipeline_bubble(rank: int, world: int, schedule: str, micro_batches: int, steps: int = 3) -> dict:
    """(launch target) Time a real pipeline of `world` stages on a small GPT: busy vs wall time per stage."""
    from model import GPT, GPTConfig  # the demo's model; parallel.py itself does not need model.py
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=256, block_size=64, n_layer=2 * world, n_head=4, n_kv_head=4, n_embd=128)
    mesh = Mesh.build(pp=world)
    pipe = PipelineParallel(GPT(cfg), mesh, schedule)
    x = torch.randint(0, cfg.vocab_size, (2 * micro_batches, cfg.block_size))
    bubbles = []
    for _ in range(steps):
        pipe.step(x, x, micro_batches)
        bubbles.append(pipe.stats["bubble"])
    return {"bubble": min(bubbles)}


# ------------------------------------------------------------------------------------------------------------------
# The command line: demos of each lesson
# ------------------------------------------------------------------------------------------------------------------


def _demo_worker(rank: int, world: int, steps: int) -> dict:
    """Train a tiny GPT `steps` AdamW steps in each layout; return its full weights, traffic and memory."""
    from model import GPT, GPTConfig
    cfg = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_kv_head=2, n_embd=32, ffn_hidden=64)
    g = torch.Generator().manual_seed(1)
    data = [(torch.randint(0, 64, (8, 16), generator=g), torch.randint(0, 64, (8, 16), generator=g))
            for _ in range(steps)]
    out = {}
    for name, sizes, zero in [("DP", dict(dp=world), 0), ("ZeRO-1", dict(dp=world), 1), ("ZeRO-2", dict(dp=world), 2),
                              ("ZeRO-3", dict(dp=world), 3), (f"TP{world}", dict(tp=world), 0),
                              (f"PP{world} 1F1B", dict(pp=world), 0)]:
        torch.manual_seed(0)
        model = GPT(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        mesh = Mesh.build(**sizes)
        wrapped, wopt = parallelize(model, opt, mesh, zero=zero)
        for i, (x, y) in enumerate(data):
            if i == steps - 1:
                mesh.reset_counters()
            xs, ys = x.chunk(mesh.dp.size)[mesh.dp.rank], y.chunk(mesh.dp.size)[mesh.dp.rank]
            if wrapped.pipe is not None:
                wrapped.pipeline_step(list(zip(xs.chunk(4), ys.chunk(4))))
            else:
                wrapped(xs, ys)[1].backward()
                wrapped.finish_gradient_sync()
            wopt.step()
            if i == steps - 1:
                sent = mesh.bytes_sent()
                params = [p for p in wrapped.model.parameters()]
                if wrapped.zero is not None:
                    mem = wrapped.zero.memory_bytes()
                else:
                    mem = training_state_bytes(params, wopt.inner)
            wopt.zero_grad()
        out[name] = {"state": wrapped.full_state_dict(), "bytes": sent, "memory": sum(mem.values())}
    return out


def _cmd_demo(args) -> int:
    from model import GPT, GPTConfig
    cfg = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_kv_head=2, n_embd=32, ffn_hidden=64)
    # Every layout uses all ranks on one axis: TP splits the heads, PP the layers, DP the batch of 8.
    fits = [w for w in range(1, 9) if all(d % w == 0 for d in (cfg.n_head, cfg.n_kv_head, cfg.n_layer, 8))]
    if args.world not in fits:
        raise ParallelError(f"the demo model (n_head {cfg.n_head}, n_kv_head {cfg.n_kv_head}, n_layer "
                            f"{cfg.n_layer}, batch 8) splits over {' or '.join(map(str, fits))} ranks, not "
                            f"--world {args.world}")
    torch.manual_seed(0)
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    for _ in range(args.steps):
        x, y = torch.randint(0, 64, (8, 16), generator=g), torch.randint(0, 64, (8, 16), generator=g)
        model(x, y)[1].backward()
        opt.step()
        opt.zero_grad()
    want = model.state_dict()
    n = model.num_params()
    results = launch(_demo_worker, args.world, args.steps, timeout_s=300)
    print(f"{n:,} parameters, {args.steps} AdamW steps on {args.world} ranks vs one process (fp32, 16 bytes/param"
          f" = {16 * n:,} bytes in one process)")
    print(f"{'mode':<12} {'max |diff|':>11} {'bytes sent/step/rank':>21} {'state bytes/rank':>17} {'vs 1 process':>13}")
    for mode in results[0]:
        diff = max(float((results[r][mode]["state"][k] - want[k]).abs().max()) for r in range(args.world)
                   for k in want)
        sent = max(r[mode]["bytes"] for r in results)
        memory = max(r[mode]["memory"] for r in results)
        print(f"{mode:<12} {diff:>11.2e} {sent:>21,.0f} {memory:>17,} {memory / (16 * n):>12.2f}x")
    return 0


def _cmd_schedule(args) -> int:
    schedule = SCHEDULES[args.schedule](args.p, args.m)
    print(render_schedule(schedule))
    sim = simulate(schedule)
    print(f"bubble: simulated {sim['bubble']:.3f}, formula (p-1)/(m+p-1) = {bubble_fraction(args.p, args.m):.3f}; "
          f"peak micro-batches in flight per stage: {sim['peak_in_flight']}")
    if args.measure:
        measured = launch(measure_pipeline_bubble, args.p, args.schedule, args.m, timeout_s=300)
        print(f"measured on {args.p} processes (busy vs wall time per stage): "
              + ", ".join(f"{r['bubble']:.3f}" for r in measured))
    return 0


def _cmd_memory(args) -> int:
    print(f"{args.params:.3g} parameters x 16 bytes (mixed-precision AdamW) = {16 * args.params / 1e9:.2f} GB")
    for stage in range(4):
        per = zero_memory_per_rank(args.params, args.world, stage)
        print(f"  {'DP' if stage == 0 else f'ZeRO-{stage}':<7} on {args.world} ranks: {per / 1e9:8.2f} GB per rank")
    return 0


def _cmd_mesh(args) -> int:
    world = args.dp * args.tp * args.pp
    print(f"world {world} = dp {args.dp} x tp {args.tp} x pp {args.pp}")
    print("rank     " + " ".join(f"{r:>2}" for r in range(world)))
    for i, axis in enumerate(("pp", "dp", "tp")):
        print(f"{axis}_rank  " + " ".join(f"{rank_coords(r, args.dp, args.tp, args.pp)[i]:>2}" for r in range(world)))
    for axis, groups in axis_groups(args.dp, args.tp, args.pp).items():
        print(f"{axis} groups: {groups}")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument in one line (exit code 2), without the usage block."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _in_range(kind=int, low=None, high=None, low_open=False, high_open=False):
    """argparse type: a finite int or float within the bounds (open ends with low_open/high_open).

    >>> _in_range(float, 0.0, 1.0, low_open=True)("0.5")
    0.5
    >>> _in_range(int, 0)("-1")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: must be an integer >= 0, got '-1'
    """
    def show(x):
        return f"{x:g}" if isinstance(x, float) else str(x)
    bounds = [f"{'>' if low_open else '>='} {show(low)}" if low is not None else "",
              f"{'<' if high_open else '<='} {show(high)}" if high is not None else ""]
    rule = ("an integer " if kind is int else "a number ") + " and ".join(filter(None, bounds))

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if (value is None or not math.isfinite(value)
                or low is not None and (value < low or low_open and value == low)
                or high is not None and (value > high or high_open and value == high)):
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text!r}")
        return value
    return parse


# Sizes the CLI draws or spawns: a rank grid wider than this does not fit a screen, and every pipeline stage or
# data-parallel rank of a demo is a CPU process of this machine.
MAX_DRAWN_RANKS, MAX_MICRO_BATCHES, MAX_PROCESSES = 512, 1024, 64


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p = sub.add_parser("demo", help="train a tiny GPT in every layout on N CPU processes; compare with one process")
    p.add_argument("--world", type=_in_range(int, 1, MAX_PROCESSES), default=2, help="processes (gloo on CPU)")
    p.add_argument("--steps", type=_in_range(int, 1, 10_000), default=5, help="AdamW steps")
    p.set_defaults(run=_cmd_demo)
    p = sub.add_parser("schedule", help="draw a pipeline schedule and its bubble")
    p.add_argument("--p", type=_in_range(int, 1, MAX_PROCESSES), default=4, help="stages")
    p.add_argument("--m", type=_in_range(int, 1, MAX_MICRO_BATCHES), default=8, help="micro-batches")
    p.add_argument("--schedule", choices=sorted(SCHEDULES), default="1f1b")
    p.add_argument("--measure", action="store_true", help="also time a real pipeline on p CPU processes")
    p.set_defaults(run=_cmd_schedule)
    p = sub.add_parser("memory", help="bytes per rank under DP and ZeRO-1/2/3 (the lecture's 7B on 8 GPUs)")
    p.add_argument("--params", type=_in_range(float, 0.0, 1e15, low_open=True), default=7e9)
    p.add_argument("--world", type=_in_range(int, 1, 10**9), default=8)
    p.set_defaults(run=_cmd_memory)
    p = sub.add_parser("mesh", help="print the dp x tp x pp rank grid and its groups")
    p.add_argument("--dp", type=_in_range(int, 1, MAX_DRAWN_RANKS), default=2)
    p.add_argument("--tp", type=_in_range(int, 1, MAX_DRAWN_RANKS), default=2)
    p.add_argument("--pp", type=_in_range(int, 1, MAX_DRAWN_RANKS), default=2)
    p.set_defaults(run=_cmd_mesh)
    args = parser.parse_args(argv)
    if args.command == "mesh" and args.dp * args.tp * args.pp > MAX_DRAWN_RANKS:
        parser.error(f"argument --dp/--tp/--pp: a grid of {args.dp * args.tp * args.pp} ranks is too wide to draw; "
                     f"keep dp x tp x pp <= {MAX_DRAWN_RANKS}")
    if args.command == "schedule" and args.measure and args.p < 2:
        parser.error("argument --p: --measure needs --p >= 2 processes")
    try:
        return args.run(args)
    except (ParallelError, WorkerError) as e:
        print(f"parallel.py: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
