"""Training one model on many processes, by hand over torch.distributed: data parallel and
ZeRO-1/2/3, on a dp x tp x pp mesh of process groups, each proved equal to a single-process run.
Collectives run on gloo (CPU, where every figure below was measured) or nccl (CUDA, one GPU per
rank). The other half of the lecture, one model cut into pieces (tensor, pipeline, expert and
context parallel), is model_parallel.py, built on this file's Comm, Mesh, DataParallel and Zero.

Depends on torch and the standard library only (no sibling files).

Why it is needed. Mixed-precision AdamW keeps 16 bytes per parameter: 2 for bf16 weights, 2 for bf16
gradients and 12 for the optimizer (an fp32 master copy and two moving averages). A 7e9-parameter
model needs 7e9 x 16 = 112 GB before a single activation is stored. The lecture names four knives;
the two of this file copy the whole model to every rank:

1. Data parallel (DP). Every rank holds the whole model, reads a different slice of the batch, and
   the ranks average their gradients with an all-reduce (2(n-1)/n of the gradient bytes per rank)
   before the optimizer step. Faster, not smaller: each of 8 GPUs still holds 112 GB.
2. ZeRO (FSDP is the same idea). An all-reduce is a reduce-scatter followed by an all-gather, so
   rank r only needs to keep slice r of what is redundant:
       stage 1 shards the optimizer state:  2 + 2 + 12/8 = 5.5 bytes/param  -> 7e9, 8 GPUs: 38.5 GB
       stage 2 also shards the gradients:   2 + 14/8     = 3.75 bytes/param -> 26.25 GB
       stage 3 also shards the weights:     16/8         = 2 bytes/param    -> 14 GB
   Stages 1 and 2 communicate what DP does; stage 3 gathers the weights once for forward and again
   for backward, about 1.5x DP. ZeRO saves memory; it does not make a step faster.

The order of this file: communication (with byte counters), the mesh, data parallel, ZeRO,
gradient clipping across the mesh, the accounting of memory and traffic against the formulas
above. The essay in full and the measured figures: docs/parallel.md, docs/parallel-figures.md.
    python parallel.py demo              # each layout on 2 CPU processes vs one: weights, bytes
    python parallel.py schedule --p 4 --m 16 [--measure]    # a pipeline schedule drawn, its bubble
    python parallel.py memory --params 7e9 --world 8        # 112 / 38.5 / 26.25 / 14 GB per GPU
    python parallel.py mesh --dp 2 --tp 2 --pp 2            # the rank grid and its groups
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import itertools
import os
from typing import Callable, Iterable, Iterator, Sequence

import torch
import torch.distributed as dist
import torch.nn as nn


class ParallelError(ValueError):
    """A bad parallel configuration (sizes that do not divide, ...): one line naming the problem and
    the fix."""


# --------------------------------------------------------------------------------------------------
# 1. Communication helpers
#
# Every collective goes through a `Comm`, which is one process group plus counters of the bytes this
# rank sends. The counters use the cost of the standard ring algorithms, per rank, for a tensor of b
# bytes on n ranks:
#     all-reduce      2(n-1)/n * b   (a reduce-scatter then an all-gather)
#     reduce-scatter   (n-1)/n * b   (b = the full input)
#     all-gather       (n-1)/n * b   (b = the full output)
#     broadcast / send           b
# so "bytes communicated per step" can be compared with the theory (DP: 2(n-1)/n of the gradient
# bytes). torch 2.13 renamed all_gather_into_tensor / reduce_scatter_tensor to all_gather_single /
# reduce_scatter_single; the old names warn. We pick whichever this torch has, so the file runs on
# old and new versions without warnings.
# --------------------------------------------------------------------------------------------------

_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class _DoneWork:
    """Stands in for an async handle when nothing had to be sent (a group of one rank)."""

    def wait(self) -> bool:
        return True


class Comm:
    """One process group (one axis of the mesh) and the bytes this rank has sent through it.

    `ranks` are global ranks in group order; `rank` is this process's index in that list. With one
    rank every collective is the identity and costs nothing, so a mesh axis of size 1 needs no
    special cases elsewhere.
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

    def count_all_reduce(self, numel: int, itemsize: int) -> None:
        """Record the bytes of an all-reduce of numel elements (ring: 2 (n-1)/n of them)."""
        self._count("all_reduce", 2 * (self.size - 1) / self.size * numel * itemsize)

    def all_reduce(
        self, t: torch.Tensor, op=dist.ReduceOp.SUM, async_op: bool = False, count: bool = True
    ):
        """In place: every rank ends with op(t over ranks). gloo has no AVG: sum, then divide
        yourself. count=False inside an autograd.Function: its caller counts the bytes, so a
        traced backward mutates no Python state."""
        if self.size == 1:
            return _DoneWork() if async_op else None
        if count:
            self.count_all_reduce(t.numel(), t.element_size())
        return dist.all_reduce(t, op=op, group=self.group, async_op=async_op)

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, async_op: bool = False):
        """out (N/n,) on rank r = sum over ranks of inp[r*N/n:(r+1)*N/n]; inp is (N,)."""
        if self.size == 1:
            out.copy_(inp)
            return _DoneWork() if async_op else None
        self._count(
            "reduce_scatter", (self.size - 1) / self.size * inp.numel() * inp.element_size()
        )
        return _reduce_scatter_flat(
            out, inp, op=dist.ReduceOp.SUM, group=self.group, async_op=async_op
        )

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor, async_op: bool = False):
        """out (N,) = concatenation of every rank's inp (N/n,), in rank order."""
        if self.size == 1:
            out.copy_(inp)
            return _DoneWork() if async_op else None
        self._count("all_gather", (self.size - 1) / self.size * out.numel() * out.element_size())
        return _all_gather_flat(out, inp, group=self.group, async_op=async_op)

    def all_to_all(self, t: torch.Tensor) -> torch.Tensor:
        """Row j of t (n, ...) goes to rank j; row j of the result came from rank j."""
        if self.size == 1:
            return t.clone()
        self._count("all_to_all", (self.size - 1) / self.size * t.numel() * t.element_size())
        out = torch.empty_like(t)
        dist.all_to_all_single(out, t.contiguous(), group=self.group)
        return out

    def broadcast(self, t: torch.Tensor, src: int = 0) -> None:
        """In place: every rank gets group rank `src`'s t."""
        if self.size == 1:
            return
        if self.rank == src:
            self._count("broadcast", t.numel() * t.element_size())
        dist.broadcast(t, src=self.ranks[src], group=self.group)

    def send_recv(
        self, sends: Sequence[tuple[torch.Tensor, int]], recvs: Sequence[tuple[torch.Tensor, int]]
    ):
        """Post all sends and receives (tensor, global peer rank) as one batch and wait for all of
        them: posted together, two neighbours that both send first do not wait on each other."""
        for work in self.start_send_recv(sends, recvs):
            work.wait()

    def start_send_recv(
        self, sends: Sequence[tuple[torch.Tensor, int]], recvs: Sequence[tuple[torch.Tensor, int]]
    ) -> list:
        """send_recv without the wait: the handles to wait on once the caller has computed
        something meanwhile (ring attention overlaps the next K/V block's transfer with this
        one's attention). Neither side may touch the tensors before the wait."""
        ops = [dist.P2POp(dist.isend, t, peer) for t, peer in sends]
        ops += [dist.P2POp(dist.irecv, t, peer) for t, peer in recvs]
        for t, _ in sends:
            self._count("send", t.numel() * t.element_size())
        return dist.batch_isend_irecv(ops) if ops else []


# --------------------------------------------------------------------------------------------------
# 2. The mesh: world = dp x tp x pp
#
# Global rank = (pp_rank * dp + dp_rank) * tp + tp_rank: tp varies fastest, so the ranks of one
# tensor-parallel group are neighbours (the same machine, with the fast links); pp varies slowest.
# With dp=2, tp=2, pp=2:
#     rank:     0  1  2  3  4  5  6  7
#     pp_rank:  0  0  0  0  1  1  1  1
#     dp_rank:  0  0  1  1  0  0  1  1
#     tp_rank:  0  1  0  1  0  1  0  1
# tp groups {0,1} {2,3} {4,5} {6,7}; dp groups {0,2} {1,3} {4,6} {5,7}; pp groups {0,4} {1,5} {2,6}
# {3,7}. The pure functions below compute the grid; `Mesh.build` turns it into process groups. Every
# rank must create every group, in the same order (a rule of torch.distributed), and keeps the ones
# it belongs to.
# --------------------------------------------------------------------------------------------------


def check_mesh_sizes(world: int, dp: int, tp: int, pp: int) -> None:
    """Raise ParallelError unless world == dp * tp * pp with every size >= 1."""
    if min(dp, tp, pp) < 1:
        raise ParallelError(f"mesh sizes must be >= 1, got dp={dp} tp={tp} pp={pp}")
    if dp * tp * pp != world:
        raise ParallelError(
            f"world size {world} != dp*tp*pp = {dp}*{tp}*{pp} = {dp * tp * pp}: "
            f"choose tp and pp sizes whose product divides {world}"
        )


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
    """Every group of every axis as lists of global ranks, plus the "embed" groups {first, last
    pipeline stage} that share the gradient of tied embeddings.
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
    """This rank's place in the dp x tp x pp grid and one Comm per axis (passed explicitly, never
    global)."""

    world: int
    rank: int
    dp: Comm
    tp: Comm
    pp: Comm
    embed: Comm  # {first stage, last stage} of this rank's pipeline: tied-embedding gradients
    # a gloo group of every rank with a long timeout, for waiting out rank-0-only work
    patient: object = None
    cp: Comm = dataclasses.field(default_factory=Comm.single)  # context parallel's group

    @property
    def sizes(self) -> dict[str, int]:
        return {"dp": self.dp.size, "tp": self.tp.size, "pp": self.pp.size}

    @classmethod
    def build(cls, dp: int = -1, tp: int = 1, pp: int = 1, cp: int = 1) -> "Mesh":
        """Create the groups on an initialised process group; dp=-1 means world // (tp * pp * cp).
        Context parallel runs with dp alone (model_parallel.py): its groups take the tp groups'
        place, consecutive ranks."""
        world, rank = dist.get_world_size(), dist.get_rank()
        if cp > 1 and tp * pp > 1:
            raise ParallelError(
                f"context parallel (cp {cp}) with tp {tp} / pp {pp}: ring attention is wired "
                f"into the plain forward only; use context parallel with data parallel alone"
            )
        tp = tp * cp  # one of the two is 1
        if dp == -1:
            if tp < 1 or pp < 1 or world % (tp * pp):
                raise ParallelError(
                    f"tp*pp = {tp}*{pp} does not divide the world size {world}: "
                    f"choose tp and pp sizes whose product divides {world}"
                )
            dp = world // (tp * pp)
        check_mesh_sizes(world, dp, tp, pp)
        comms = {}
        for axis, groups in axis_groups(dp, tp, pp).items():
            for ranks in groups:
                # new_group is collective over the whole world, so every rank creates every group.
                group = dist.new_group(ranks) if len(ranks) > 1 else None
                if rank in ranks:
                    comms[axis] = Comm(group, ranks, ranks.index(rank))
        if cp > 1:
            comms["cp"], comms["tp"] = comms["tp"], Comm.single()
        embed = comms.get("embed", Comm.single())  # middle pipeline stages hold no embedding
        # Work only rank 0 does (preparing the data, writing a 13 GB checkpoint, sampling) can
        # outlast the collectives' timeout, which is kept short so that a dead rank is noticed. The
        # other ranks wait for it in a barrier of this group instead, whose timeout is a day (env
        # PARALLEL_SLOW_TIMEOUT_S).
        slow_s = float(os.environ.get("PARALLEL_SLOW_TIMEOUT_S", 86_400))
        patient = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=slow_s))
        cp_comm = comms.get("cp", Comm.single())
        return cls(world, rank, comms["dp"], comms["tp"], comms["pp"], embed, patient, cp_comm)

    def wait_for_rank0(self) -> None:
        """Every rank waits here until all have arrived, rank 0 after its rank-0-only work (long
        timeout)."""
        if self.patient is not None:
            dist.barrier(group=self.patient)

    @classmethod
    def single(cls) -> "Mesh":
        """The mesh of a plain one-process run."""
        return cls(1, 0, Comm.single(), Comm.single(), Comm.single(), Comm.single())

    def comms(self) -> list[Comm]:
        return [self.dp, self.tp, self.pp, self.embed, self.cp]

    def bytes_sent(self) -> float:
        return sum(c.bytes_sent for c in self.comms())

    def reset_counters(self) -> None:
        for c in self.comms():
            c.reset_counters()


def broadcast_module(module: nn.Module, comm: Comm, src: int = 0, comm_of=None) -> None:
    """Make every rank's parameters and buffers equal to group rank `src`'s (the start of DP and
    ZeRO). comm_of(t), when given, is the group that shares tensor t (under expert parallel an
    expert slice is shared by the ranks holding those experts only)."""
    with torch.no_grad():
        for t in list(module.parameters()) + list(module.buffers()):
            group = comm_of(t) if comm_of else comm
            group.broadcast(t.data, src)


# --------------------------------------------------------------------------------------------------
# 3. Data parallel
#
# Each rank runs forward and backward on its own slice of the batch; the gradients must be averaged
# before the step. Waiting for the whole backward and then all-reducing leaves the network idle
# during backward and the compute idle during the all-reduce. Instead, gradients are grouped into
# buckets in *reverse* parameter order (the order backward produces them: the last layer's gradients
# come first), and a bucket's all-reduce starts, asynchronously, the moment its last gradient is
# accumulated (`register_post_accumulate_grad_hook`), while backward keeps computing earlier layers.
# `finish_gradient_sync()` waits for the buckets in flight, flushes the ones that never filled (a
# parameter unused in this forward) and writes the averages back into `.grad`. Buckets are launched
# strictly in order, so every rank issues the same all-reduces in the same order even if one rank
# skipped a parameter. The hooks only read `.grad`; they never touch the weights. `no_sync()` turns
# the hooks off for gradient accumulation: micro-batches accumulate locally and only the last
# backward communicates. Frozen parameters (requires_grad=False) are not in any bucket.
# --------------------------------------------------------------------------------------------------


def bucket_layout(nbytes: Sequence[int], bucket_bytes: int) -> list[list[int]]:
    """Group tensors (given in the order their gradients arrive) into buckets of about
    `bucket_bytes`. A bucket closes once it reaches the cap; a tensor bigger than the cap gets a
    bucket of its own.
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
        self.offsets, numel, _ = shard_layout([p.numel() for p in params], world=1)
        self.buffer = torch.zeros(numel, dtype=params[0].dtype, device=params[0].device)
        self.arrived: set[int] = set()
        self.work = None

    def slice(self, i: int) -> torch.Tensor:
        return self.buffer[self.offsets[i] : self.offsets[i + 1]]


class Layout(nn.Module):
    """What train.py's loop calls on a model, whatever the layout; this base is one whole model in
    one process (the defaults), DataParallel and machinery/parallelize.py's DistributedModel
    override what they split.

    >>> layout = Layout(nn.Linear(2, 1))
    >>> layout.pipelined, layout.describe(), sorted(layout.full_state_dict())
    (False, '', ['bias', 'weight'])
    """

    # True: train through pipeline_step(micro_batches), not forward + backward
    pipelined = False
    mesh: Mesh | None = None  # the axes the gradient norm adds up over (None: all of it is here)

    def __init__(self, module: nn.Module | None = None):
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def no_sync(self):
        """Backward accumulates gradients locally in this block (micro-batches but the last)."""
        return contextlib.nullcontext()

    def finish_gradient_sync(self) -> None:
        """After the last backward: every rank's gradients averaged (nothing to do alone)."""

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Clip to the global norm of the full model (max_norm 0: only measure); return the norm
        before, a 0-dim tensor on the device (train.py reads it with the loss, once per step)."""
        limit = max_norm if max_norm > 0 else float("inf")
        return clip_grad_norm_(self.module.parameters(), limit, self.mesh)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The one-process state dict on the CPU, a checkpoint's "model" (collective if split)."""
        return {k: v.detach().cpu() for k, v in self.module.state_dict().items()}

    def load_full_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.module.load_state_dict(state)

    def describe(self, micro_batches: int = 1) -> str:
        """The layout's accounting printed at the start of a run ('' with nothing to split)."""
        return ""

    def full_model(self) -> nn.Module:
        """A whole model with the current weights, for sampling (collective when split)."""
        return self.module


class _LaunchInOrder:
    """What DataParallel and Zero share: buckets (with .params and .arrived) whose collective a
    gradient hook starts once their last gradient has arrived, strictly in order, never inside
    no_sync(). A subclass says how a bucket starts (`_start`)."""

    def _launch_in_order(self, buckets: list, hooked: bool) -> None:
        self._buckets, self._next_bucket, self._sync = buckets, 0, True
        self._where = {id(p): (k, i) for k, b in enumerate(buckets) for i, p in enumerate(b.params)}
        if not hooked:
            return
        for bucket in buckets:
            for p in bucket.params:
                p.register_post_accumulate_grad_hook(self._grad_ready)

    @contextlib.contextmanager
    def no_sync(self):
        """Accumulate gradients locally (no communication) inside this block."""
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    def _grad_ready(self, p: torch.Tensor) -> None:
        if not self._sync:
            return
        k, i = self._where[id(p)]
        if k < self._next_bucket:
            raise RuntimeError(
                "a gradient arrived for a bucket already sent: call finish_gradient_sync() after "
                "each backward, or wrap all but the last micro-batch in no_sync()"
            )
        self._buckets[k].arrived.add(i)
        self._launch(flush=False)

    def _launch(self, flush: bool) -> None:
        """Start every bucket whose gradients have all arrived (flush: every bucket), in order."""
        while self._next_bucket < len(self._buckets):
            bucket = self._buckets[self._next_bucket]
            if not flush and len(bucket.arrived) < len(bucket.params):
                return
            self._start(bucket)
            self._next_bucket += 1


class DataParallel(_LaunchInOrder, Layout):
    """Wrap a module for data parallel training over `comm` (the mesh's dp axis):

        loss = dp(x, y)[1]; loss.backward(); dp.finish_gradient_sync(); opt.step()

    (accumulating: the backwards of all micro-batches but the last inside `with dp.no_sync():`).
    `bucket_bytes` trades overlap (small buckets start early) against per-message latency (25 MB
    in DDP)."""

    def __init__(self, module: nn.Module, comm: Comm, bucket_bytes: int = 25 * 2**20):
        super().__init__(module)
        self.comm = comm
        broadcast_module(module, comm)
        # shared (tied) weights appear once
        params = [p for p in module.parameters() if p.requires_grad]
        order = list(reversed(params))
        layout = bucket_layout([p.numel() * p.element_size() for p in order], bucket_bytes)
        self.buckets = [_Bucket([order[i] for i in idx]) for idx in layout]
        self._launch_in_order(self.buckets, hooked=comm.size > 1)  # alone: nothing to average

    def _start(self, bucket: _Bucket) -> None:
        for i, p in enumerate(bucket.params):
            # unused here: contribute zeros (or the grad accumulated under no_sync)
            bucket.slice(i).copy_(p.grad.reshape(-1) if p.grad is not None else 0)
        bucket.work = self.comm.all_reduce(bucket.buffer, async_op=True)

    def finish_gradient_sync(self) -> None:
        """Wait for every bucket, flush partial ones, and set each .grad to the average over the dp
        ranks."""
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


# --------------------------------------------------------------------------------------------------
# 4. ZeRO stages 1, 2 and 3
#
# Parameters are grouped into units (by default: each element of the model's ModuleLists, e.g. each
# Transformer block, plus a "root" unit with everything else: embedding, final norm, head). A unit's
# parameters live in one flat buffer padded to a multiple of n (the dp size), so it splits into n
# equal shards; rank r owns shard r of every unit. Example: a unit of 3 + 4 parameters on 4 ranks is
# padded to 8; each rank owns 2 of them:
#     flat  [a a a b b b b 0]   shards  r0 [a a]  r1 [a b]  r2 [b b]  r3 [b 0]
# The optimizer (any torch.optim class) sees only this rank's shards, one Parameter per unit, so its
# state is 1/n of the full state: that is stage 1. After backward:
#     stage 1: gradients stay full in .grad; a reduce-scatter hands each rank the sum of its shard.
#     stage 2: as soon as a unit's gradients are complete, a hook copies them into a flat buffer,
#              frees .grad and starts the reduce-scatter (overlapping backward); only the shard's
#              gradient is kept.
#     stage 3: like 2, and the full weights are freed too. A unit's weights are all-gathered just
#              before its forward and freed after it; gathered again when backward reaches the unit
#              (a hook on the unit's output gradient) and freed once its gradients are sent.
#              Memory: 16/n bytes per parameter.
# After the optimizer steps its shard, stages 1 and 2 all-gather the shards back into the full
# weights (stage 3 gathers them at the next forward). Traffic per step: stages 1-2 reduce-scatter +
# all-gather = 2(n-1)/n of the parameter bytes, like DP's all-reduce; stage 3 gathers twice +
# reduce-scatter = 3(n-1)/n, i.e. 1.5x. Units launch their reduce-scatters strictly in order (last
# block first, root last) so all ranks agree.
#
# Mixed precision (stage 3, FSDP's MixedPrecision): the shards stay fp32 (the master weights the
# optimizer updates), but `compute_dtype=torch.bfloat16` gathers shard.to(bf16), so forward and
# backward run on bf16 weights; their bf16 gradients are reduce-scattered in `reduce_dtype` (fp32 by
# default: exact sums) into the shard's fp32 .grad. Gathers send 2 bytes per parameter, not 4: the
# 124m preset on 8 GPUs (85M block + 39M root parameters) gathers 7/8 x (2 x 85M + 39M) x 2 B = 366
# MB per step instead of 732 MB. Held per rank: 16/n bytes/param, plus one gathered unit in bf16.
# gloo (CPU) reduces and gathers bf16 as nccl does, so the CPU tests run the GPU's path.
# --------------------------------------------------------------------------------------------------


def shard_layout(numels: Sequence[int], world: int) -> tuple[list[int], int, int]:
    """Offsets of tensors packed in one flat buffer, the buffer length padded to a multiple of
    `world`, and the length of one shard.
    >>> shard_layout([3, 4], 4)
    ([0, 3, 7], 8, 2)
    """
    offsets = [0]
    for n in numels:
        offsets.append(offsets[-1] + n)
    padded = -(-offsets[-1] // world) * world
    return offsets, padded, padded // world


class _FlatUnit:
    """The parameters of one unit (and one optimizer param group) as a padded flat buffer + this
    rank's shard.

    `full` is what the module computes with (compute_dtype); `shard` is this rank's fp32 master
    slice.
    """

    def __init__(
        self,
        params: list[nn.Parameter],
        comm: Comm,
        stage: int,
        group: int = 0,
        compute_dtype: torch.dtype | None = None,
        reduce_dtype: torch.dtype | None = None,
    ):
        # group: optimizer group
        self.params, self.comm, self.stage, self.group = params, comm, stage, group
        self.offsets, self.padded, self.shard_size = shard_layout(
            [p.numel() for p in params], comm.size
        )
        p0 = params[0]
        master = torch.zeros(self.padded, dtype=p0.dtype, device=p0.device)
        with torch.no_grad():
            for p, o in zip(params, self.offsets):
                master[o : o + p.numel()].copy_(p.data.reshape(-1))
        self.compute_dtype = compute_dtype or p0.dtype
        self.reduce_dtype = reduce_dtype or p0.dtype
        self.full = master if self.compute_dtype == p0.dtype else master.to(self.compute_dtype)
        for p, o in zip(params, self.offsets):
            # the module now reads the flat buffer
            p.data = self.full[o : o + p.numel()].view(p.shape)
        lo = comm.rank * self.shard_size
        mine = master[lo : lo + self.shard_size]
        # Stages 1-2 keep the full buffer, so the shard is a view of it: the step updates the
        # weights in place.
        self.shard = nn.Parameter(mine if stage < 3 else mine.clone())
        self.gathered = True
        self.arrived: set[int] = set()
        self.pending = None  # (work, reduced shard gradient) of an async reduce-scatter
        if stage == 3:
            self.free()

    def gather(self) -> None:
        """All-gather the shards, cast to the compute dtype, into the full buffer (which every
        parameter views)."""
        if self.gathered:
            return
        self.full.untyped_storage().resize_(self.full.numel() * self.full.element_size())
        self.comm.all_gather(self.full, self.shard.detach().to(self.compute_dtype))
        self.gathered = True

    def free(self) -> None:
        """Release the full weights' memory; the parameters keep viewing the (empty) buffer."""
        self.full.untyped_storage().resize_(0)
        self.gathered = False

    def master_full(self) -> torch.Tensor:
        """The unit's full weights in the master dtype (padded flat; collective when the shards must
        be gathered)."""
        if self.gathered and self.full.dtype == self.shard.dtype:
            return self.full
        out = torch.empty(self.padded, dtype=self.shard.dtype, device=self.shard.device)
        self.comm.all_gather(out, self.shard.detach())
        return out

    def flat_grad(self, release: bool) -> torch.Tensor:
        """The unit's gradients in one padded flat tensor of reduce_dtype (zeros where a parameter
        got none)."""
        flat = torch.zeros(self.padded, dtype=self.reduce_dtype, device=self.full.device)
        for p, o in zip(self.params, self.offsets):
            if p.grad is not None:
                flat[o : o + p.numel()].copy_(p.grad.reshape(-1))
                if release:
                    p.grad = None
        return flat

    def start_reduce(self, release: bool) -> None:
        """Start the async reduce-scatter of this unit's gradients. release=True (stages 2-3) frees
        the full gradients; release=False (stage 1) keeps them, re-pointed into the flat buffer so
        they are held once."""
        flat = self.flat_grad(release)
        if not release:
            for p, o in zip(self.params, self.offsets):
                p.grad = flat[o : o + p.numel()].view(p.shape)
        out = torch.empty(self.shard_size, dtype=self.reduce_dtype, device=self.full.device)
        work = self.comm.reduce_scatter(out, flat, async_op=True)
        self.pending = (work, out, None if release else flat)

    def finish_reduce(self) -> None:
        """Wait for the reduce-scatter; the shard's .grad (master dtype) becomes the average over
        the dp ranks."""
        work, out, flat = self.pending
        work.wait()
        out = out.to(self.shard.dtype).div_(self.comm.size)
        # stage 1: write the averaged slice into the full gradient buffer and view it
        if flat is not None:
            lo = self.comm.rank * self.shard_size
            flat[lo : lo + self.shard_size].copy_(out)
            out = flat[lo : lo + self.shard_size]
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


class Zero(_LaunchInOrder):
    """A ZeRO optimizer: wraps a module (in place) and runs `optimizer_cls` on this rank's shards.

        zero = Zero(model, mesh.dp, stage=3, optimizer_cls=torch.optim.AdamW, lr=3e-4)
        loss = model(x, y)[1]; loss.backward(); zero.finish_gradient_sync()
        zero.clip_grad_norm_(1.0); zero.step(); zero.zero_grad()

    `param_groups`: torch-style dicts over the module's parameters (the wrapper's `param_groups` are
    the inner optimizer's, so a schedule sets `group["lr"]` as usual); `units`: the modules stage 3
    gathers one at a time (default: the elements of the module's ModuleLists). Stage 3 only:
    `compute_dtype` and `reduce_dtype`, the dtypes weights are gathered in and gradients
    reduce-scattered in (default: the master dtype). `shard_comm(p)`: the group sharing p's shards
    when not all of `comm` holds p (expert slices, model_parallel.py section 4); default `comm`.
    """

    def __init__(
        self,
        module: nn.Module,
        comm: Comm,
        stage: int,
        optimizer_cls=torch.optim.AdamW,
        param_groups: list[dict] | None = None,
        units: list[nn.Module] | None = None,
        compute_dtype: torch.dtype | None = None,
        reduce_dtype: torch.dtype | None = None,
        shard_comm: Callable[[nn.Parameter], Comm] | None = None,
        **optimizer_kwargs,
    ):
        if stage not in (1, 2, 3):
            raise ParallelError(f"ZeRO stage must be 1, 2 or 3, got {stage}")
        if stage < 3 and (compute_dtype or reduce_dtype):
            raise ParallelError(
                f"compute_dtype/reduce_dtype are ZeRO-3's (it gathers the weights); stage {stage} "
                f"keeps full fp32 weights: run its forward under autocast instead"
            )
        self.module, self.comm, self.stage = module, comm, stage
        self.comm_of = shard_comm or (lambda p: comm)
        broadcast_module(module, comm, comm_of=self.comm_of)
        groups = param_groups or [{"params": [p for p in module.parameters() if p.requires_grad]}]
        unit_modules = units if units is not None else _default_units(module)
        self._build_units(groups, unit_modules, compute_dtype, reduce_dtype)
        inner_groups = []
        for g, group in enumerate(groups):
            options = {k: v for k, v in group.items() if k != "params"}
            inner_groups.append(
                {"params": [u.shard for u in self.units if u.group == g], **options}
            )
        self.optimizer = optimizer_cls([g for g in inner_groups if g["params"]], **optimizer_kwargs)
        if hasattr(self.optimizer, "orthogonalise"):  # Muon (train.py): whole matrices only
            self._orthogonalise_matrix = self.optimizer.orthogonalise
            self.optimizer.orthogonalise = self._orthogonalise_shard
            self._unit_of_shard = {id(u.shard): u for u in self.units}  # looked up every step
        self._reduced = False
        # stage 1 reduces after backward, stages 2-3 as backward produces the gradients
        self._launch_in_order(self.units, hooked=stage >= 2)
        if stage == 3:
            self._hook_units(unit_modules)

    def _build_units(self, groups, unit_modules, compute_dtype, reduce_dtype) -> None:
        """One _FlatUnit per (unit module, optimizer group, shard group) holding parameters, in
        backward order: last block first, the root (embedding + head) last."""
        group_of = {id(p): g for g, group in enumerate(groups) for p in group["params"]}
        root = len(unit_modules)
        owner: dict[int, int] = {}  # id(param) -> unit index; unit `root` is everything else
        for u, m in enumerate(unit_modules):
            for p in m.parameters():
                owner.setdefault(id(p), u)
        self.units: list[_FlatUnit] = []
        self._units_of_module: dict[int, list[_FlatUnit]] = {}
        all_params = [p for p in self.module.parameters() if id(p) in group_of]
        comms = list(dict.fromkeys(map(self.comm_of, all_params)))  # in order: the same on all
        for u in list(reversed(range(root))) + [root]:
            for g, c in itertools.product(range(len(groups)), comms):
                params = [
                    p
                    for p in all_params
                    if owner.get(id(p), root) == u and group_of[id(p)] == g and self.comm_of(p) is c
                ]
                if params:
                    unit = _FlatUnit(params, c, self.stage, g, compute_dtype, reduce_dtype)
                    self.units.append(unit)
                    key = id(unit_modules[u]) if u < root else id(self.module)
                    self._units_of_module.setdefault(key, []).append(unit)

    # --- stage 3: gather just in time
    # -----------------------------------------------------------------------------
    def _hook_units(self, unit_modules: list[nn.Module]) -> None:
        """Block units: gather before forward, free after it, gather again when backward reaches
        them. The root unit (embedding, head): gathered at the model's forward, freed once its
        gradients are sent (or right after forward when no backward will come, e.g. under
        torch.no_grad)."""
        for m in unit_modules:
            units = self._units_of_module.get(id(m), [])
            m.register_forward_pre_hook(lambda mod, args, units=units: _gather_units(units))
            m.register_forward_hook(
                lambda mod, args, out, units=units: self._after_unit_forward(units, out)
            )
        root = self._units_of_module.get(id(self.module), [])
        self.module.register_forward_pre_hook(lambda mod, args: _gather_units(root))
        self.module.register_forward_hook(
            lambda mod, args, out: None if torch.is_grad_enabled() else _free_units(root)
        )

    def _after_unit_forward(self, units: list[_FlatUnit], out) -> None:
        _free_units(units)
        outputs = out if isinstance(out, (tuple, list)) else (out,)
        for t in outputs:
            if torch.is_tensor(t) and t.requires_grad:
                # Runs when the gradient of the unit's output is ready, i.e. just before the unit's
                # backward.
                t.register_hook(lambda grad, units=units: _gather_units(units))
                break

    # --- gradients
    # ----------------------------------------------------------------------------------------------
    def _start(self, unit: _FlatUnit) -> None:
        unit.start_reduce(release=self.stage >= 2)
        if self.stage == 3:
            unit.free()

    def finish_gradient_sync(self) -> None:
        """Wait for (or, in stage 1, start) the reduce-scatters; afterwards each shard's .grad is
        the average."""
        self._launch(flush=True)
        for unit in self.units:
            unit.finish_reduce()
            unit.arrived = set()
        self._next_bucket = 0
        self._reduced = True

    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    def clip_grad_norm_(self, max_norm: float, mesh: Mesh | None = None) -> torch.Tensor:
        """Scale the shard gradients so the global norm is at most max_norm; return the norm before
        (the shards' squares add up over dp, then over tp and pp as section 5 says)."""
        if not self._reduced:
            self.finish_gradient_sync()
        device = self.units[0].full.device if self.units else None
        total = torch.stack(_sq_norms(_shard_grad_pieces(self.units), device))
        self.comm.all_reduce(total)
        norm = _combine_sq_norms(total[0], total[1], mesh)
        _scale_grads([u.shard for u in self.units], max_norm, norm)
        return norm

    def step(self) -> None:
        """Step the inner optimizer on the shards, then (stages 1-2) all-gather the new weights."""
        if not self._reduced:
            self.finish_gradient_sync()
        self.optimizer.step()
        if self.stage < 3:
            works = [
                unit.comm.all_gather(unit.full, unit.shard.detach().clone(), async_op=True)
                for unit in self.units
            ]
            for work in works:
                work.wait()
        self._reduced = False

    def _orthogonalise_shard(self, shard: nn.Parameter, nesterov: torch.Tensor) -> torch.Tensor:
        """Muon on flat shards: Newton-Schulz needs each whole matrix, so the unit's momentum shards
        are all-gathered (one gather more per step), every rank orthogonalises every matrix of the
        unit (the same result everywhere) and keeps its slice. A unit of 3 + 4 values on 2 ranks:
            [m m m m | m m m 0] -> [u u u u | u u u 0] -> rank 1 keeps [u u u 0]"""
        unit = self._unit_of_shard[id(shard)]
        momentum = torch.empty(unit.padded, dtype=nesterov.dtype, device=nesterov.device)
        unit.comm.all_gather(momentum, nesterov.contiguous())  # (padded,)
        update = torch.zeros_like(momentum)
        for p, o in zip(unit.params, unit.offsets):
            whole = momentum[o : o + p.numel()].view(p.shape)  # (rows, cols)
            update[o : o + p.numel()] = self._orthogonalise_matrix(p, whole).flatten()
        lo = unit.comm.rank * unit.shard_size
        return update[lo : lo + unit.shard_size]

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        for unit in self.units:
            for p in unit.params:
                p.grad = None
        self._reduced = False

    # --- full weights on demand
    @contextlib.contextmanager
    def gathered(self):
        """Inside this block every unit holds its full weights (stage 3 frees them on exit)."""
        was = [u.gathered for u in self.units]
        for u in self.units:
            u.gather()
        try:
            yield
        finally:
            for u, g in zip(self.units, was):
                if not g:
                    u.free()


def _shard_grad_pieces(units: list[_FlatUnit]) -> Iterator[tuple[nn.Parameter, torch.Tensor]]:
    """(parameter, its piece of this rank's shard gradient): a shard can cover pieces of several
    parameters, so walk their ranges."""
    for u in units:
        if u.shard.grad is None:
            continue
        lo, hi = u.comm.rank * u.shard_size, (u.comm.rank + 1) * u.shard_size
        for p, o in zip(u.params, u.offsets):
            a, b = max(o, lo), min(o + p.numel(), hi)
            if a < b:
                yield p, u.shard.grad[a - lo : b - lo]


# --------------------------------------------------------------------------------------------------
# 5. Gradient clipping across the mesh
#
# Clipping needs the norm of the whole model's gradient, and each layout holds a different part of
# it. Squared norms add up, so each rank sums the squares of what it holds and the sums are
# all-reduced where they differ:
#     DP: every rank holds the full averaged gradient                      -> nothing to add
#     ZeRO: rank r holds shard r (padding is zero)                         -> add over dp
#     TP (model_parallel.py): slices of the split matrices (`p.tp_sharded`) -> add over tp;
#         replicated parameters (norm gains) are the same on every tp rank: counted once
#     PP: stage s holds its layers                                         -> add over pp; the last
#         stage's copy of a tied embedding (`p.pp_tied_copy`) is skipped, the first stage's counts
# --------------------------------------------------------------------------------------------------


def _sq_norms(
    pieces: Iterable[tuple[nn.Parameter, torch.Tensor]], device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sums of squared gradients over (parameter, gradient piece) pairs: (tensor-parallel slices,
    everything else); the last stage's copy of a tied embedding is skipped."""
    sums = {True: torch.zeros((), device=device), False: torch.zeros((), device=device)}
    for p, grad in pieces:
        if not getattr(p, "pp_tied_copy", False):
            sharded = getattr(p, "tp_sharded", False)
            sums[sharded] = sums[sharded] + grad.detach().float().pow(2).sum()
    return sums[True], sums[False]


def _combine_sq_norms(
    sharded: torch.Tensor, replicated: torch.Tensor, mesh: Mesh | None
) -> torch.Tensor:
    """Global norm from this rank's squared sums: tensor-parallel slices add up over tp, stages over
    pp."""
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
    """torch.nn.utils.clip_grad_norm_ for a model split by tp and pp (gradients already averaged
    over dp), the norm that of the full model as the table above adds it up. Returns the norm
    before clipping."""
    params = list(params)
    device = params[0].device if params else None
    pieces = [(p, p.grad) for p in params if p.grad is not None]
    sharded, replicated = _sq_norms(pieces, device)
    norm = _combine_sq_norms(sharded, replicated, mesh)
    _scale_grads(params, max_norm, norm)
    return norm


# --------------------------------------------------------------------------------------------------
# 6. Accounting: what each rank holds and sends (the formulas)
# --------------------------------------------------------------------------------------------------


def zero_memory_per_rank(
    num_params: float,
    world: int,
    stage: int,
    bytes_param: float = 2,
    bytes_grad: float = 2,
    bytes_optimizer: float = 12,
) -> float:
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


def zero_bytes_per_step(
    block_params: float,
    other_params: float,
    world: int,
    stage: int,
    gather_bytes: float = 4,
    reduce_bytes: float = 4,
) -> float:
    """Bytes one rank sends per optimizer step under DP (stage 0) or ZeRO-1/2/3, at the ring costs
    of section 1, as this file's code sends them. With f = (n-1)/n and
    N = block_params + other_params:
        stage 0:    all-reduce of the gradients                       2 f N reduce_bytes
        stages 1-2: reduce-scatter the gradients, all-gather weights  f N (reduce_bytes +
                    gather_bytes)
        stage 3:    gather every unit for forward, the blocks again for backward (the root unit,
                    embedding + norm + head, stays gathered until its gradients are sent),
                    reduce-scatter the gradients
                    f ((2 blocks + other) gather_bytes + N reduce_bytes)
    gather_bytes is the size of the dtype weights travel in (ZeRO-3 in bf16: 2), reduce_bytes the
    gradients'.
    >>> fp32, bf16 = zero_bytes_per_step(85e6, 39e6, 8, 3), zero_bytes_per_step(85e6, 39e6, 8, 3, 2)
    >>> f"{fp32 / 1e6:.0f} MB fp32 vs {bf16 / 1e6:.0f} MB bf16 gathers"
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


if __name__ == "__main__":
    from machinery.commands import parallel as command

    raise SystemExit(command.main())
