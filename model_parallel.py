"""model_parallel.py: one model cut into pieces, by hand over torch.distributed. parallel.py
teaches why a 7e9-parameter model (112 GB of training state) needs several GPUs and owns the knives
that copy the model (DP, ZeRO); this file owns the knives that cut it, for any GPT shaped as the
model chapter's: tensor parallel (TP) splits the matrices inside a layer (one all-reduce per MLP
and per attention, forward and backward: it stays inside one machine), pipeline parallel (PP) puts
different layers on different ranks (idle share (p - 1) / (m + p - 1)), expert parallel the MoE's
experts (tokens sent to them by all-to-all), context parallel one sequence (ring attention).

Depends on: torch, the standard library and parallel.py (Comm and Mesh to communicate, Layout).

The order of this file: tensor parallel, pipeline schedules as plain lists of actions (testable
without processes), their executor, expert parallel, context parallel. Every mode is tested equal
to a single-process run (tests/test_parallel.py, tests/test_ep_cp.py). Its demos run from
parallel.py's command line:
    python parallel.py demo                                 # every layout on 2 CPU processes vs one
    python parallel.py schedule --p 4 --m 16 [--measure]    # a pipeline schedule drawn, its bubble
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from parallel import Comm, Layout, Mesh, ParallelError


# --------------------------------------------------------------------------------------------------
# 1. Tensor parallel (Megatron-LM)
#
# A linear layer y = x W^T with W (out, in) can be split two ways across t ranks:
#   column parallel: rank r keeps rows r of W (a slice of the outputs): y_r = x W_r^T,
#                    no communication;
#   row parallel:    rank r keeps columns r of W (a slice of the inputs): y = sum_r x_r W_r^T,
#                    one all-reduce.
# Chaining column then row needs no communication in between, because the slice of the outputs rank
# r computed is exactly the slice of the inputs it needs next. So in the MLP w2(silu(w1 x) * w3 x),
# w1 and w3 are split by columns, silu and the product run on each slice alone, w2 is split by rows:
# one all-reduce per MLP (of the activations, (B, T, C) floats). Attention is the same with heads as
# the slices: wq, wk, wv by heads (under GQA the kv heads split too, so the query heads of rank r
# find their kv heads on rank r), wo by rows. Autograd needs the mirror image, so the pair of
# operators of the paper (called f and g there):
#   f = copy_to_tp:     forward identity,     backward all-reduce (each rank's x fed a slice;
#                       the grads add up)
#   g = reduce_from_tp: forward all-reduce,   backward identity
# f sits before attention and before the MLP, g after wo and after w2. Their bytes are counted
# outside autograd and torch.compile's graph (a counter updated inside a compiled block is a value
# dynamo guards on: a recompile per call), from the input's shape by a hook in the block's __call__
# (`_count_block_traffic`). The embedding splits the vocabulary: rank r holds rows
# [r V/t, (r+1) V/t) (V padded up to a multiple of t), looks up the ids it owns, zeros the rest and
# all-reduces. The LM head shares those rows and produces logits for its slice of the vocabulary;
# the cross-entropy is computed without ever gathering the (B, T, V) logits: all-reduce the row
# maxima, the sums of exponentials and the target's logit - three tensors of (B*T,) floats instead
# of (B*T, V). Every rank slices the same full, seeded weights: the same function for any t.
# --------------------------------------------------------------------------------------------------


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        ctx.comm.all_reduce(grad, count=False)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        x = x.contiguous().clone()
        comm.all_reduce(x, count=False)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def copy_to_tp(x: torch.Tensor, comm: Comm, count: bool = True) -> torch.Tensor:
    """f: identity forward, all-reduce of the gradient backward (count=False: a hook counts)."""
    if comm.size == 1:
        return x
    if count:
        comm.count_all_reduce(x.numel(), x.element_size())  # backward's, of a gradient like x
    return _CopyToTP.apply(x, comm)


def reduce_from_tp(x: torch.Tensor, comm: Comm, count: bool = True) -> torch.Tensor:
    """g: all-reduce forward, identity backward. count=False inside a block (its hook counts)."""
    if comm.size == 1:
        return x
    if count:
        comm.count_all_reduce(x.numel(), x.element_size())
    return _ReduceFromTP.apply(x, comm)


def _count_block_traffic(comm: Comm):
    """A Block's forward pre-hook counting its four all-reduces of (B, T, C) from the input's
    shape: f's before attention and the MLP (gradients like x), g's after wo and w2 (the compute
    dtype: bf16 under autocast). It runs in the block's __call__, outside a compiled forward."""

    def hook(block, args):
        x = args[0]
        g_itemsize = x.element_size()
        if torch.is_autocast_enabled(x.device.type):
            g_itemsize = torch.finfo(torch.get_autocast_dtype(x.device.type)).bits // 8
        for itemsize in (x.element_size(), g_itemsize) * 2:
            comm.count_all_reduce(x.numel(), itemsize)

    return hook


def shard_slice(
    full: torch.Tensor, dim: int, comm: Comm, padded: int | None = None
) -> torch.Tensor:
    """This rank's contiguous slice of `full` along dim, after zero-padding that dim to `padded`.
    >>> shard_slice(torch.arange(6.).view(3, 2), 0, Comm.single(), padded=4).tolist()
    [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [0.0, 0.0]]
    """
    if padded is not None and padded > full.shape[dim]:
        pad_shape = list(full.shape)
        pad_shape[dim] = padded - full.shape[dim]
        full = torch.cat([full, full.new_zeros(pad_shape)], dim=dim)
    return full.chunk(comm.size, dim=dim)[comm.rank].clone()


def _shard_param(
    full: torch.Tensor, dim: int, comm: Comm, padded: int | None = None
) -> nn.Parameter:
    """This rank's slice of `full` as a Parameter, marked with the dim and the full (unpadded) size
    there: the gradient norm adds such slices up over tp, a checkpoint gathers them."""
    p = nn.Parameter(shard_slice(full, dim, comm, padded))
    p.tp_sharded, p.tp_dim, p.tp_full_size = True, dim, full.shape[dim]
    return p


class ColumnParallelLinear(nn.Module):
    """Rows [r out/t, (r+1) out/t) of a Linear's weight: (..., in) -> (..., out/t), no communication
    forward. copy_input=True applies f to the input (when no enclosing module does it already)."""

    def __init__(
        self,
        full: nn.Linear,
        comm: Comm,
        copy_input: bool = False,
        weight: nn.Parameter | None = None,
    ):
        super().__init__()
        self.comm, self.copy_input = comm, copy_input
        if weight is None:  # given: the LM head shares the vocabulary-parallel embedding's rows
            weight = _shard_param(full.weight.data, 0, comm)
        self.weight, self.bias = weight, None
        if full.bias is not None:
            self.bias = _shard_param(full.bias.data, 0, comm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.copy_input:
            x = copy_to_tp(x, self.comm)
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """Columns [r in/t, (r+1) in/t) of a Linear's weight: (..., in/t) -> (..., out), then g."""

    def __init__(self, full: nn.Linear, comm: Comm):
        super().__init__()
        self.comm, self.count = comm, False  # inside a block, whose hook counts
        self.weight = _shard_param(full.weight.data, 1, comm)
        # added once, after g
        self.bias = None if full.bias is None else nn.Parameter(full.bias.data.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = reduce_from_tp(F.linear(x, self.weight), self.comm, self.count)
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """Embedding rows [r V'/t, (r+1) V'/t), V' = V padded to divide by t: (B, T) -> (B, T, C)."""

    def __init__(self, full: nn.Embedding, comm: Comm):
        super().__init__()
        self.comm = comm
        self.vocab_size = full.num_embeddings
        self.padded = -(-self.vocab_size // comm.size) * comm.size
        self.per_rank = self.padded // comm.size
        self.start = comm.rank * self.per_rank
        self.weight = _shard_param(full.weight.data, 0, comm, self.padded)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        local = idx - self.start
        # (B, T) ids this rank owns
        mine = (local >= 0) & (local < self.per_rank)
        x = F.embedding(local.clamp(0, self.per_rank - 1), self.weight)  # (B, T, C)
        return reduce_from_tp(x * mine.unsqueeze(-1).to(x.dtype), self.comm)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, comm, start, vocab_size):
        # logits (N, V/t) for vocabulary ids [start, start + V/t); targets (N,) global ids, -1 =
        # ignore. One fp32 working copy of the logits (N, V/t), as model.py's loss keeps one (bf16
        # would round the loss itself), and every step after it in place: it becomes the shifted
        # logits, their exp, then the softmax that backward needs.
        probs = logits.to(torch.float32, copy=True)
        width = probs.shape[-1]
        ids = torch.arange(start, start + width, device=probs.device)
        # padded vocabulary rows
        probs.masked_fill_(ids >= vocab_size, float("-inf"))
        row_max = probs.max(dim=-1).values
        comm.all_reduce(row_max, op=dist.ReduceOp.MAX, count=False)
        probs.sub_(row_max[:, None])
        local_t = targets - start
        owned = (local_t >= 0) & (local_t < width)
        local_t = local_t.clamp(0, width - 1)
        rows = torch.arange(len(targets), device=probs.device)
        target_logit = torch.where(owned, probs[rows, local_t], 0.0)
        comm.all_reduce(target_logit, count=False)
        sum_exp = probs.exp_().sum(dim=-1)
        comm.all_reduce(sum_exp, count=False)
        valid = targets != -1
        count = valid.sum().clamp(min=1)
        loss = ((sum_exp.log() - target_logit) * valid).sum() / count
        ctx.save_for_backward(probs.div_(sum_exp[:, None]), local_t, owned, valid, count)
        return loss

    @staticmethod
    def backward(ctx, grad):
        # in place on the saved softmax (a second backward would find it changed and raise)
        g, local_t, owned, valid, count = ctx.saved_tensors
        rows = torch.arange(len(local_t), device=g.device)
        # d loss / d logits = p - onehot; indexed by every row, not by a boolean mask (whose
        # nonzero() would stop the host until the GPU caught up)
        g[rows, local_t] -= owned.to(g.dtype)
        g *= (valid.to(g.dtype) * grad / count)[:, None]
        return g, None, None, None, None


def vocab_parallel_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, comm: Comm, start: int, vocab_size: int
) -> torch.Tensor:
    """Mean cross-entropy of (N,) targets (-1: ignored) from each rank's (N, V/t) logits."""
    comm.count_all_reduce(3 * logits.shape[0], 4)  # fp32 row maxima, exp sums, target logits
    return _VocabParallelCrossEntropy.apply(logits, targets, comm, start, vocab_size)


def _copy_input_hook(comm: Comm):
    return lambda module, args: (copy_to_tp(args[0], comm, count=False),) + tuple(args[1:])


def apply_tensor_parallel(model: nn.Module, comm: Comm) -> nn.Module:
    """Split a model.py GPT over `comm`'s ranks in place (heads, MLP hidden units, vocabulary)."""
    t, cfg = comm.size, model.config
    if getattr(cfg, "n_expert", 0):
        raise ParallelError(
            "tensor parallel splits the dense SwiGLU; this model uses MoE: set n_expert=0 or tp 1"
        )
    split = {"n_head": cfg.n_head, "n_kv_head": cfg.n_kv_head, "ffn hidden size": cfg.ffn_dim}
    for name, value in split.items():
        if value % t:
            raise ParallelError(
                f"{name} = {value} is not divisible by tp {t}; choose a tp that divides it"
            )
    model.tp_comm = comm
    if t == 1:
        return model
    for block in model.blocks:
        attn, ffn = block.attn, block.ffn
        attn.wq, attn.wk, attn.wv = (
            ColumnParallelLinear(lin, comm) for lin in (attn.wq, attn.wk, attn.wv)
        )
        attn.wo = RowParallelLinear(attn.wo, comm)
        attn.n_head, attn.n_kv_head = attn.n_head // t, attn.n_kv_head // t  # heads on this rank
        attn.register_forward_pre_hook(_copy_input_hook(comm))
        ffn.w1, ffn.w3 = ColumnParallelLinear(ffn.w1, comm), ColumnParallelLinear(ffn.w3, comm)
        ffn.w2 = RowParallelLinear(ffn.w2, comm)
        ffn.register_forward_pre_hook(_copy_input_hook(comm))
        block.register_forward_pre_hook(_count_block_traffic(comm))
    tied = model.lm_head.weight is model.tok_emb.weight
    model.tok_emb = VocabParallelEmbedding(model.tok_emb, comm)
    # kept on the model: a last pipeline stage has no embedding
    model.tp_vocab_start = model.tok_emb.start
    padded_head = nn.Linear(
        cfg.n_embd, model.tok_emb.padded, bias=False, device=model.lm_head.weight.device
    )
    with torch.no_grad():
        padded_head.weight.zero_()[: cfg.vocab_size].copy_(model.lm_head.weight)
    head = ColumnParallelLinear(
        padded_head, comm, copy_input=True, weight=model.tok_emb.weight if tied else None
    )
    if not tied:
        head.weight.tp_full_size = cfg.vocab_size  # the padded rows are not the model's
    model.lm_head = head
    return model


def lm_loss(model: nn.Module, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy; vocabulary-parallel when the model's head is split."""
    comm = getattr(model, "tp_comm", None)
    flat_targets = targets.reshape(-1)  # (B T,)
    if comm is None or comm.size == 1:
        flat_logits = logits.float().view(-1, logits.size(-1))  # (B T, V)
        return F.cross_entropy(flat_logits, flat_targets, ignore_index=-1)
    flat_logits = logits.reshape(-1, logits.size(-1))  # (B T, V'/t): this rank's vocabulary slice
    start, vocab_size = model.tp_vocab_start, model.config.vocab_size
    return vocab_parallel_cross_entropy(flat_logits, flat_targets, comm, start, vocab_size)


class TensorParallel(nn.Module):
    """A GPT split by `apply_tensor_parallel`: forward(idx, targets) -> (logits slice, loss)."""

    def __init__(self, model: nn.Module, comm: Comm):
        super().__init__()
        self.module = apply_tensor_parallel(model, comm)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        m = self.module
        if m.tp_comm.size == 1:
            return m(idx, targets)
        # (B, T, C), the same on every rank
        x = m.embed(idx)
        for block in m.blocks:
            x = block(x)  # a Block checkpoints its own activations when the config asks
        logits = m.head(x)  # (B, T, V'/t)
        return logits, None if targets is None else lm_loss(m, logits, targets)


# --------------------------------------------------------------------------------------------------
# 2. Pipeline parallel: schedules as plain lists of actions
#
# The model's layers are cut into p contiguous stages; the batch into m micro-batches. A schedule
# says, for each stage, the order of its actions: F i / B i (forward / backward of micro-batch i)
# and the messages between neighbours: SEND_F / RECV_F carry activations (B/m, T, C) to the next
# stage, SEND_B / RECV_B carry their gradients back. Consecutive messages in a list are posted
# together as one batch (see Comm.send_recv).
#
# GPipe, all-forward-all-backward (AFAB): every forward, then every backward. Simple, but stage s
# holds the activations of all m micro-batches at once. p = 3, m = 4 (time ->, each cell one forward
# or backward slot):
#     stage 0: F0 F1 F2 F3 .  .  .  .  B0 B1 B2 B3
#     stage 1: .  F0 F1 F2 F3 .  .  B0 B1 B2 B3 .
#     stage 2: .  .  F0 F1 F2 F3 B0 B1 B2 B3 .  .
# 1F1B: stage s runs p - s - 1 warm-up forwards, then alternates one forward and one backward, then
# drains. Same bubble, but at most p - s micro-batches are in flight, so activation memory is
# bounded by p, not m. In both, each stage idles (p - 1) slots of forward + backward out of (m + p -
# 1): the bubble (p - 1) / (m + p - 1); p = 4, m = 16 -> 3/19 = 16%. `simulate` replays a schedule
# with timings and checks it.
# --------------------------------------------------------------------------------------------------


class Action(NamedTuple):
    op: str  # "F", "B", "SEND_F", "RECV_F", "SEND_B", "RECV_B"
    mb: int  # micro-batch index

    def __repr__(self) -> str:
        return f"{self.op}{self.mb}"


COMM_OPS = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")


def _actions(op: str, stage: int, p: int, mb: int) -> list[Action]:
    """F or B of micro-batch mb with its messages: a forward receives from the stage before and
    sends to the one after, a backward the other way round; the ends of the pipe have no
    neighbour there."""
    upstream, downstream = stage - 1, stage + 1  # where a forward's input comes from, goes to
    if op == "B":
        upstream, downstream = downstream, upstream
    actions = [Action(op, mb)]
    if 0 <= upstream < p:
        actions.insert(0, Action("RECV_" + op, mb))
    if 0 <= downstream < p:
        actions.append(Action("SEND_" + op, mb))
    return actions


def afab_schedule(p: int, m: int) -> list[list[Action]]:
    """GPipe: per stage, all forwards then all backwards.
    >>> afab_schedule(2, 2)  # doctest: +NORMALIZE_WHITESPACE
    [[F0, SEND_F0, F1, SEND_F1, RECV_B0, B0, RECV_B1, B1],
     [RECV_F0, F0, RECV_F1, F1, B0, SEND_B0, B1, SEND_B1]]
    """
    return [
        [a for i in range(m) for a in _actions("F", s, p, i)]
        + [a for i in range(m) for a in _actions("B", s, p, i)]
        for s in range(p)
    ]


def one_f_one_b_schedule(p: int, m: int) -> list[list[Action]]:
    """1F1B: warm-up forwards, steady one-forward-one-backward, cool-down backwards
    (PipeDream-flush/Megatron).
    >>> one_f_one_b_schedule(2, 2)[0]
    [F0, SEND_F0, F1, SEND_F1, RECV_B0, B0, RECV_B1, B1]
    """
    schedule = []
    for s in range(p):
        warmup = min(p - s - 1, m)
        actions = [a for i in range(warmup) for a in _actions("F", s, p, i)]
        for k in range(m - warmup):
            actions += _actions("F", s, p, warmup + k) + _actions("B", s, p, k)
        actions += [a for i in range(m - warmup, m) for a in _actions("B", s, p, i)]
        schedule.append(actions)
    return schedule


SCHEDULES = {"afab": afab_schedule, "1f1b": one_f_one_b_schedule}


def _batches(actions: list[Action]) -> list[list[Action]]:
    """A stage's actions as steps: one compute, or a run of consecutive messages posted together."""
    steps: list[list[Action]] = []
    for a in actions:
        if a.op in COMM_OPS and steps and steps[-1][0].op in COMM_OPS:
            steps[-1].append(a)
        else:
            steps.append([a])
    return steps


def _channel(stage: int, a: Action) -> tuple[str, int, int, str]:
    """(direction, from, to, side) of a message: SEND_F on s goes s -> s+1, RECV_B s+1 -> s."""
    return {
        "SEND_F": ("F", stage, stage + 1, "send"),
        "RECV_F": ("F", stage - 1, stage, "recv"),
        "SEND_B": ("B", stage, stage - 1, "send"),
        "RECV_B": ("B", stage + 1, stage, "recv"),
    }[a.op]


class _Replay:
    """The state of `simulate`, per stage: its clock, the micro-batches it has computed and
    received, the messages posted on each channel side (the k-th send meets the k-th receive)."""

    def __init__(self, p: int, t_f: float, t_b: float):
        self.p, self.duration = p, {"F": t_f, "B": t_b}
        self.clock, self.busy = [0.0] * p, [0.0] * p
        self.in_flight, self.peak = [0] * p, [0] * p
        self.done = {op: [set() for _ in range(p)] for op in ("F", "B", "RECV_F", "RECV_B")}
        self.posted: dict[tuple, list[tuple[int, float]]] = {}  # channel side -> [(mb, time)]
        self.mine: list[list[int] | None] = [None] * p  # indices of this stage's posted messages
        self.timeline: list[list[tuple[float, Action]]] = [[] for _ in range(p)]

    def compute(self, s: int, a: Action) -> None:
        """Run F or B of micro-batch a.mb on stage s, after checking its input is there."""
        if a.op == "F" and s > 0 and a.mb not in self.done["RECV_F"][s]:
            raise ParallelError(f"stage {s} runs F{a.mb} before receiving its input")
        no_output_grad = s < self.p - 1 and a.mb not in self.done["RECV_B"][s]
        if a.op == "B" and (a.mb not in self.done["F"][s] or no_output_grad):
            raise ParallelError(f"stage {s} runs B{a.mb} before its forward or its output gradient")
        self.done[a.op][s].add(a.mb)
        self.in_flight[s] += 1 if a.op == "F" else -1
        self.peak[s] = max(self.peak[s], self.in_flight[s])
        self.timeline[s].append((self.clock[s], a))
        self.clock[s] += self.duration[a.op]
        self.busy[s] += self.duration[a.op]

    def post(self, s: int, step: list[Action]) -> None:
        """Post every message of a batch (once), after checking each has a neighbour and data."""
        self.mine[s] = []
        for a in step:
            key = _channel(s, a)
            if not 0 <= key[1] < self.p or not 0 <= key[2] < self.p:
                raise ParallelError(f"stage {s} has {a} with no neighbour")
            if a.op.startswith("SEND") and a.mb not in self.done[a.op[-1]][s]:
                raise ParallelError(f"stage {s} runs {a} before computing what it sends")
            self.mine[s].append(len(self.posted.setdefault(key, [])))
            self.posted[key].append((a.mb, self.clock[s]))

    def complete(self, s: int, step: list[Action]) -> bool:
        """True once every message of the batch has met its partner; the clock moves to the last."""
        partners = []
        for a, k in zip(step, self.mine[s]):
            direction, src, dst, side = _channel(s, a)
            other = self.posted.get((direction, src, dst, "recv" if side == "send" else "send"), [])
            if len(other) <= k:
                return False
            if other[k][0] != a.mb:
                raise ParallelError(
                    f"stage {s}: {a} meets micro-batch {other[k][0]} on the other side"
                )
            partners.append(other[k][1])
        self.clock[s] = max([self.clock[s]] + partners)
        for a in step:
            if a.op.startswith("RECV"):
                self.done[a.op][s].add(a.mb)
        self.mine[s] = None
        return True


def simulate(schedule: list[list[Action]], t_f: float = 1.0, t_b: float = 2.0) -> dict:
    """Replay a schedule as the executor runs it (a compute takes t_f / t_b; a batch of messages
    completes once every message's partner is posted); ParallelError on a deadlock, a mismatched
    message or a compute before its input. Returns the makespan and, per stage, the bubble (idle
    share), peak in-flight micro-batches and timeline (what `python parallel.py schedule` draws).
    >>> round(simulate(one_f_one_b_schedule(4, 16))["bubble"], 3), round(3 / 19, 3)
    (0.158, 0.158)
    """
    p = len(schedule)
    steps = [_batches(a) for a in schedule]
    pc, replay = [0] * p, _Replay(p, t_f, t_b)
    while any(pc[s] < len(steps[s]) for s in range(p)):
        progress = False
        for s in range(p):
            if pc[s] >= len(steps[s]):
                continue
            step = steps[s][pc[s]]
            if step[0].op in ("F", "B"):
                replay.compute(s, step[0])
            elif replay.mine[s] is None:
                replay.post(s, step)
                progress = True
            if step[0].op in ("F", "B") or replay.complete(s, step):
                pc[s] += 1
                progress = True
        if not progress:
            waiting = [steps[s][pc[s]] if pc[s] < len(steps[s]) else None for s in range(p)]
            raise ParallelError(f"deadlock: stages wait at {waiting}")
    for s in range(p):
        forwards, backwards = replay.done["F"][s], replay.done["B"][s]
        expected = {a.mb for a in schedule[s] if a.op == "F"}
        if forwards != backwards or len(forwards) != len(expected):
            raise ParallelError(f"stage {s} does not run every forward and backward exactly once")
    makespan = max(replay.clock)
    bubbles = [1 - b / makespan for b in replay.busy]
    return {
        "makespan": makespan,
        "bubble": max(bubbles),
        "bubbles": bubbles,
        "peak_in_flight": replay.peak,
        "timeline": replay.timeline,
    }


def bubble_fraction(p: int, m: int) -> float:
    """The idle share of a pipeline with p stages and m micro-batches.
    >>> round(bubble_fraction(4, 16), 3)
    0.158
    """
    return (p - 1) / (m + p - 1)


# --------------------------------------------------------------------------------------------------
# 3. Pipeline parallel: the executor
#
# Each rank builds the whole model from the same seed, then keeps only its stage: the first stage
# keeps the embedding, the last the final norm and head, every stage its slice of the blocks (the
# others become Identity, so parameter names stay those of the full model and checkpoints merge by
# name). With tied embeddings the first and last stage each hold a copy of the (V, C) matrix; after
# backward they all-reduce its gradient over the "embed" group, so both copies take the same step
# and stay equal. The last stage divides each micro-batch's loss by m, so the summed gradients are
# those of the mean loss over the whole batch. A data-parallel wrapper (DataParallel or ZeRO-1) only
# communicates after the stage's last backward.
# --------------------------------------------------------------------------------------------------


def layer_ranges(n_layer: int, p: int) -> list[tuple[int, int]]:
    """Contiguous [lo, hi) layer ranges for p stages, sizes differing by at most one (earlier stages
    get more).
    >>> layer_ranges(5, 2)
    [(0, 3), (3, 5)]
    """
    if n_layer < p:
        raise ParallelError(
            f"{n_layer} layers cannot fill {p} pipeline stages; use pp <= {n_layer}"
        )
    sizes = [n_layer // p + (1 if s < n_layer % p else 0) for s in range(p)]
    starts = [sum(sizes[:s]) for s in range(p)]
    return [(lo, lo + n) for lo, n in zip(starts, sizes)]


class PipelineParallel:
    """Run one training step of a GPT cut into pipeline stages over `mesh.pp`.

    pipe = PipelineParallel(model, mesh, schedule="1f1b")  # prunes `model` to this rank's stage
    loss = pipe.step(x, y, micro_batches=4, grad_sync=dp)  # forward + backward; then opt.step()
    """

    def __init__(self, model: nn.Module, mesh: Mesh, schedule: str = "1f1b"):
        if schedule not in SCHEDULES:
            raise ParallelError(
                f"unknown pipeline schedule {schedule!r}; choose one of {sorted(SCHEDULES)}"
            )
        self.model, self.comm, self.embed_comm, self.schedule = model, mesh.pp, mesh.embed, schedule
        p, s = self.comm.size, self.comm.rank
        self.lo, self.hi = layer_ranges(len(model.blocks), p)[s]
        self.first, self.last = s == 0, s == p - 1
        self.tied = model.lm_head.weight is model.tok_emb.weight
        self.tied_copy = None  # this stage's copy of a tied embedding: its gradient is shared
        for i in range(len(model.blocks)):
            if not self.lo <= i < self.hi:
                model.blocks[i] = nn.Identity()
        if p > 1:
            if self.tied and self.last:  # the last stage gets its own copy of the tied matrix
                shared = model.lm_head.weight
                copy = nn.Parameter(shared.detach().clone())
                copy.__dict__.update(
                    {k: v for k, v in shared.__dict__.items() if k.startswith("tp_")}
                )
                copy.pp_tied_copy = True  # counted once in the gradient norm
                model.lm_head.weight = self.tied_copy = copy
            if self.tied and self.first:
                self.tied_copy = model.tok_emb.weight
            if not self.first:
                model.tok_emb = None
            if not self.last:
                model.norm, model.lm_head = None, None
        self.stats: dict[str, float] = {}

    def stage_forward(self, x: torch.Tensor, targets: torch.Tensor | None) -> torch.Tensor:
        """ids (b, T) or activations (b, T, C) -> activations, or on the last stage the loss."""
        if self.first:
            x = self.model.embed(x)
        for i in range(self.lo, self.hi):
            x = self.model.blocks[i](x)
        return lm_loss(self.model, self.model.head(x), targets) if self.last else x

    def step(
        self, idx: torch.Tensor, targets: torch.Tensor, micro_batches: int, grad_sync=None
    ) -> torch.Tensor:
        """Forward and backward of the batch (B, T) as `micro_batches` pieces; returns the mean loss
        on every stage. `grad_sync` (DataParallel / Zero stage 1) communicates once, after this
        stage's last backward."""
        m, p = micro_batches, self.comm.size
        if m < 1 or idx.shape[0] % m:
            raise ParallelError(
                f"batch size {idx.shape[0]} is not divisible by {m} micro-batches; "
                f"choose a divisor of the batch size"
            )
        ids, tgts = idx.chunk(m), targets.chunk(m)
        shape = (idx.shape[0] // m, idx.shape[1], self.model.config.n_embd)  # (b, T, C)
        dtype, device = next(self.model.parameters()).dtype, idx.device
        if torch.is_autocast_enabled(device.type):  # model.py's residual stream is in its dtype
            dtype = torch.get_autocast_dtype(device.type)
        empty = functools.partial(torch.empty, shape, dtype=dtype, device=device)
        actions = SCHEDULES[self.schedule](p, m)[self.comm.rank]
        inputs, outputs, grads, losses = {}, {}, {}, []
        compute_s, start, backwards = 0.0, time.perf_counter(), 0
        for step in _batches(actions):
            a = step[0]
            if a.op in COMM_OPS:
                self._exchange(step, inputs, outputs, grads, empty)
                continue
            t0 = time.perf_counter()
            if a.op == "F":
                x = ids[a.mb] if self.first else inputs[a.mb]
                out = self.stage_forward(x, tgts[a.mb] if self.last else None)
                if self.last:
                    losses.append(out.detach())
                    out = out / m
                outputs[a.mb] = out
            else:
                backwards += 1  # only the stage's last backward communicates
                sync_now = grad_sync is None or backwards == m
                with contextlib.nullcontext() if sync_now else grad_sync.no_sync():
                    if self.last:
                        outputs.pop(a.mb).backward()
                    else:
                        torch.autograd.backward(outputs.pop(a.mb), grads.pop(a.mb))
            compute_s += time.perf_counter() - t0
        if grad_sync is not None:
            grad_sync.finish_gradient_sync()
        if self.tied_copy is not None and self.tied_copy.grad is not None:
            self.embed_comm.all_reduce(self.tied_copy.grad)
        wall = time.perf_counter() - start
        self.stats = {"compute_s": compute_s, "wall_s": wall, "bubble": 1 - compute_s / wall}
        loss = torch.stack(losses).mean() if self.last else torch.zeros((), device=device)
        self.comm.broadcast(loss, src=p - 1)
        return loss

    def _exchange(
        self, step: list[Action], inputs: dict, outputs: dict, grads: dict, empty
    ) -> None:
        """Post one batch of messages together: activations to the next stage (SEND_F, RECV_F),
        their gradients back (SEND_B, RECV_B). `empty()` makes a (b, T, C) receive buffer; a
        received activation then requires grad, so this stage's backward produces its gradient."""
        nxt = self.comm.global_rank(self.comm.rank + 1) if not self.last else None
        prev = self.comm.global_rank(self.comm.rank - 1) if not self.first else None
        sends, recvs = [], []
        for a in step:
            if a.op == "SEND_F":
                sends.append((outputs[a.mb].detach(), nxt))
            elif a.op == "SEND_B":
                sends.append((inputs.pop(a.mb).grad, prev))
            elif a.op == "RECV_F":
                inputs[a.mb] = empty()
                recvs.append((inputs[a.mb], prev))
            else:
                grads[a.mb] = empty()
                recvs.append((grads[a.mb], nxt))
        self.comm.send_recv(sends, recvs)
        for a in step:
            if a.op == "RECV_F":
                inputs[a.mb].requires_grad_()


# --------------------------------------------------------------------------------------------------
# 4. Expert parallel (GShard, DeepSpeed-MoE): the experts on different ranks, tokens sent to them
#
# E experts over n ranks: rank j keeps experts [j E/n, (j+1) E/n) of every MoE layer; attention,
# norms, the router and the embedding stay replicated. Each rank routes its own tokens as model.py
# does, into the static (E, cap, C) buffer of slots (capacity makes it static: every rank sends
# every other exactly E/n x cap slots, zero-padded, so no rank has to announce how much is coming):
#   dispatch: all-to-all of that buffer: row j (the slots for rank j's experts) goes to rank j;
#   rank j runs its E/n experts on (E/n, n cap, C), its experts' slots from every rank, one matmul;
#   combine:  the inverse permutation back to (n, E/n, cap, C) rows, and the same all-to-all returns
#             each rank its slots, which model.py weights by the gates and sums per token.
# An all-to-all is its own adjoint (backward sends the gradients the same way), so each MoE layer
# costs four (`all_to_all_bytes`):
#     bytes per rank per layer and step = 4 (n-1)/n x E x cap x C x bytes per float
# The expert group sits inside the data-parallel group (DeepSpeed-MoE, Megatron): n consecutive dp
# ranks share their experts, each reading its own batch. Dense gradients average over dp as usual;
# an expert's gradient on its owner already sums the losses of its n ranks, so it is divided by n
# and averaged over the dp/n ranks that hold the same experts (the expert-data-parallel group:
# machinery/parallelize.py's ExpertDataParallel, and ZeRO's shard_comm for their state). The balance
# loss uses f_e and P_e of the global batch (averaged over dp), as one process would see them.
# Capacity is per rank (cap = factor x N_rank x k / E): with factor 0 nothing is dropped and the
# step equals one process's; with drops it differs (docs/parallel.md has both and worked numbers).
# --------------------------------------------------------------------------------------------------


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return comm.all_to_all(x)

    @staticmethod
    def backward(ctx, grad):
        return ctx.comm.all_to_all(grad.contiguous()), None


def all_to_all_bytes(n_expert: int, capacity: int, n_embd: int, n: int, nbytes: int = 4) -> float:
    """Bytes one rank sends per MoE layer and training step under expert parallel over n ranks.
    >>> all_to_all_bytes(8, 320, 4096, 8) / 2**20    # dispatch + combine, forward and backward
    140.0
    """
    return 4 * (n - 1) / n * n_expert * capacity * n_embd * nbytes


@torch.compiler.disable
def dispatch_experts_combine(moe: nn.Module, x: torch.Tensor, comm: Comm) -> torch.Tensor:
    """Expert parallel in place of MoE.experts: slots (E, cap, C) -> expert outputs (E, cap, C).
    The slots travel in the residual stream's dtype (model.py keeps it bf16 under bf16 autocast:
    half the bytes of fp32). Outside torch.compile's graph, as the counters it updates."""
    n, (E, cap, C) = comm.size, x.shape
    got = _AllToAll.apply(x.reshape(n, -1), comm)  # dispatch (n, E/n cap C)
    mine = got.view(n, E // n, cap, C).transpose(0, 1).reshape(E // n, n * cap, C)
    out = type(moe).experts(moe, mine)  # my experts: (E/n, n cap, C)
    back = out.view(E // n, n, cap, C).transpose(0, 1).reshape(n, -1)  # the inverse permutation
    return _AllToAll.apply(back, comm).view(E, cap, C)  # combine


@torch.compiler.disable
def global_balance_stats(fraction: torch.Tensor, mean_prob: torch.Tensor, dp: Comm):
    """f_e and P_e averaged over every data-parallel rank's tokens (equal counts). The gradient of
    P_e stays this rank's own: data parallel averages the ranks' gradients, which sums each rank's
    share of the mean. Outside torch.compile's graph (its all-reduce updates a counter)."""
    stats = torch.stack([fraction, mean_prob.detach()])
    dp.all_reduce(stats)
    stats /= dp.size
    return stats[0], mean_prob + (stats[1] - mean_prob).detach()


def _split_comms(dp: Comm, n: int) -> tuple[Comm, Comm]:
    """(expert group: n consecutive dp ranks, expert-data-parallel group: the dp ranks holding my
    experts). Every rank creates every group (dp is the world: EP runs without tp, pp and cp)."""
    comms = []
    experts, replicas = range(0, dp.size, n), range(n)
    for groups in ([dp.ranks[i : i + n] for i in experts], [dp.ranks[j::n] for j in replicas]):
        for ranks in groups:
            group = dist.new_group(ranks) if len(ranks) > 1 else None
            if dp.global_rank(dp.rank) in ranks:
                comms.append(Comm(group, ranks, ranks.index(dp.global_rank(dp.rank))))
    return comms[0], comms[1]


class ExpertParallel(Layout):
    """A MoE GPT whose experts are split over n of the dp ranks; forward as a GPT's."""

    def __init__(self, model: nn.Module, dp: Comm, n: int):
        super().__init__()
        E = model.config.n_expert
        if not E or E % n or dp.size % n:
            raise ParallelError(
                f"expert parallel over {n} ranks needs a MoE whose n_expert ({E}) and "
                f"data-parallel size ({dp.size}) {n} divides; set n_expert to a multiple of {n}"
            )
        self.module = model
        self.ep, self.edp = _split_comms(dp, n)
        for block in model.blocks:
            moe = block.ffn
            for name in ("w1", "w2", "w3"):
                p = _shard_param(getattr(moe, name).data, 0, self.ep)
                p.register_hook(lambda g: g / n)  # the owner summed the losses of n ranks
                setattr(moe, name, p)
            moe.experts = lambda x, moe=moe: dispatch_experts_combine(moe, x, self.ep)
            moe.balance_stats = lambda f, p: global_balance_stats(f, p, dp)


# --------------------------------------------------------------------------------------------------
# 5. Context parallel (ring attention, Liu et al. 2023): one sequence split over n ranks
#
# Everything but attention is per token, so n ranks can each hold T/n of a sequence's tokens:
# activations per rank fall from B T C per layer to B (T/n) C, and the attention scores of one block
# pair are (T/n)^2, not T^2. Attention needs every earlier key, so the K/V blocks travel around a
# ring: at step s rank r holds the block of rank r - s, attends to it and passes it on (n - 1 passes
# per layer), the next block's transfer started before this one's compute and waited after it. Each
# step is FlashAttention's online softmax: per query a running max m, sum l and unnormalised output,
# rescaled by exp(m_old - m_new) when a block raises the max; nothing of size (T/n)^2 is kept, and
# backward recomputes each block's probabilities from the saved log-sum-exp m + log l, sending the
# K/V blocks round again with the dK/dV their visitors have added (n passes bring them home). The
# load-balanced split: cut the sequence into 2n chunks, rank r holds chunks r and 2n-1-r (one early,
# one late), so every rank has the same number of visible (query, key) pairs; contiguous blocks
# would leave rank 0 with almost nothing to attend to and rank n-1 with n times as much
# (`cp_positions`). A block pair is then fully visible,
# fully masked (skipped: no compute) or this rank's own diagonal chunk (run causally), so each rank
# computes its share of the causal pairs, not all n^2 blocks (`ring_pieces`). RoPE rotates each
# token by its absolute position, so it needs no change. Traffic per rank, layer and step: a block
# is 2 B h_kv (T/n) d values; n-1 K/V passes forward, n-1 in backward and n dK/dV passes in fp32:
# 2 B h_kv (T/n) d (2 (n-1) bytes-per-float + 4 n) (`ring_bytes`). The compute one pass has to hide
# behind grows as (T/n)^2, the bytes as T/n: the longer the blocks, the cheaper the ring.
# --------------------------------------------------------------------------------------------------


def cp_positions(seq_len: int, n: int, rank: int, device=None) -> torch.Tensor:
    """The positions of the tokens rank `rank` of n holds: chunks rank and 2n-1-rank of 2n. Built
    where they are used (no host-to-device copy).
    >>> cp_positions(8, 2, 0).tolist(), cp_positions(8, 2, 1).tolist()
    ([0, 1, 6, 7], [2, 3, 4, 5])
    """
    L = seq_len // (2 * n)
    late = 2 * n - 1 - rank
    early = torch.arange(rank * L, (rank + 1) * L, device=device)
    return torch.cat([early, torch.arange(late * L, (late + 1) * L, device=device)])


def ring_bytes(
    batch: int, seq_len: int, n_kv_head: int, head_dim: int, n: int, nbytes: int = 4
) -> float:
    """Bytes one rank sends per attention layer and training step in the K/V ring of n ranks.
    >>> ring_bytes(1, 131072, 8, 128, 8) / 2**20    # a 128k-token sequence on 8 ranks, fp32
    2816.0
    """
    block = 2 * batch * n_kv_head * (seq_len // n) * head_dim
    return block * (2 * (n - 1) * nbytes + n * 4)


def ring_pieces(rank: int, source: int, L: int, tile: int = 64) -> list[tuple[slice, slice, bool]]:
    """The score blocks rank `rank` computes against the K/V block of rank `source`, each as (query
    rows, key rows, causal) in the local (2L,) order (early chunk, late chunk). Fully masked pairs
    are skipped: an earlier source's early chunk is seen by all of this rank's queries, a later
    source is seen by the late chunk only, and this rank's own block has two diagonal chunks, run
    in tiles of `tile` queries: the keys before the tile in one piece, the tile's own square
    causally (top-left aligned). Every rank gets 2 L^2 pairs per step (plus the diagonals' halves).
    >>> [(q.start, q.stop, k.start, k.stop, c) for q, k, c in ring_pieces(1, 0, 4)]
    [(0, 8, 0, 4, False)]
    >>> [(q.start, q.stop, k.start, k.stop, c) for q, k, c in ring_pieces(0, 1, 4)]
    [(4, 8, 0, 8, False)]
    """
    if source < rank:
        return [(slice(0, 2 * L), slice(0, L), False)]
    if source > rank:
        return [(slice(L, 2 * L), slice(0, 2 * L), False)]
    pieces = [(slice(L, 2 * L), slice(0, L), False)]  # late queries, early keys: all visible
    for start in (0, L):  # early x early, late x late: causal
        for i in range(start, start + L, tile):
            rows = slice(i, min(i + tile, start + L))
            if i > start:
                pieces.append((rows, slice(start, i), False))
            pieces.append((rows, rows, True))
    return pieces


def _start_ring_pass(t: torch.Tensor, comm: Comm) -> tuple[torch.Tensor, list]:
    """Send t to the next rank and receive the previous one's, without waiting: (the buffer it
    arrives in, the handles to wait on before reading it or writing t)."""
    if comm.size == 1:
        return t, []
    got = torch.empty_like(t)
    n, r = comm.size, comm.rank
    works = comm.start_send_recv(
        [(t, comm.global_rank((r + 1) % n))], [(got, comm.global_rank((r - 1) % n))]
    )
    return got, works


def _scores(q, k, rows: slice, cols: slice, causal: bool, scale: float) -> torch.Tensor:
    """Scores of query rows against key rows, (B, h_kv, g, |rows|, |cols|) in fp32 (fp64 for fp64
    inputs); causal masks keys after their query on a diagonal square."""
    acc_dtype = torch.promote_types(q.dtype, torch.float32)
    s = (q[..., rows, :] @ k[..., cols, :].transpose(-1, -2)).to(acc_dtype) * scale
    if causal:
        side = s.shape[-1]
        s = s.masked_fill(
            torch.ones(side, side, dtype=torch.bool, device=s.device).triu(1), -math.inf
        )
    return s


class _RingAttention(torch.autograd.Function):
    """Causal attention of this rank's queries over the ring's K/V blocks, the FlashAttention way
    (section 5): q (B, h_kv, g, 2L, d), k and v (B, h_kv, 1, 2L, d) (GQA's group g broadcast, no
    copy), in the local order of `cp_positions`; saved for backward: q, k, v, the output and one
    log-sum-exp per query, O(T/n). `work` (a dict or None) counts the score elements computed, per
    batch row and head."""

    @staticmethod
    def forward(ctx, q, k, v, comm, work):
        n, r, L, scale = comm.size, comm.rank, q.shape[-2] // 2, q.shape[-1] ** -0.5
        acc_dtype = torch.promote_types(q.dtype, torch.float32)  # fp32 statistics under bf16
        acc = torch.zeros(q.shape, dtype=acc_dtype, device=q.device)  # sum_j p_ij v_j
        m = torch.full(q.shape[:-1], -math.inf, dtype=acc_dtype, device=q.device)  # running max
        l = torch.zeros(q.shape[:-1], dtype=acc_dtype, device=q.device)  # running sum
        kv = torch.stack([k, v])  # one message per step
        for step in range(n):
            if step < n - 1:
                arriving, works = _start_ring_pass(kv, comm)
            for rows, cols, causal in ring_pieces(r, (r - step) % n, L):
                s = _scores(q, kv[0], rows, cols, causal, scale)
                m_new = torch.maximum(m[..., rows], s.amax(-1))
                p = (s - m_new[..., None]).exp()
                rescale = (m[..., rows] - m_new).exp()  # exp(-inf) = 0 at the start
                l[..., rows] = l[..., rows] * rescale + p.sum(-1)
                update = (p.to(v.dtype) @ kv[1][..., cols, :]).to(acc_dtype)
                acc[..., rows, :] = acc[..., rows, :] * rescale[..., None] + update
                m[..., rows] = m_new
                if work is not None:
                    work["scores"] = work.get("scores", 0) + s.shape[-2] * s.shape[-1]
            if step < n - 1:
                for w in works:
                    w.wait()
                kv = arriving
        out = (acc / l[..., None]).to(q.dtype)
        ctx.save_for_backward(q, k, v, out, m + l.log())
        ctx.comm = comm
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        comm, dout = ctx.comm, dout.contiguous()
        n, r, L, scale = comm.size, comm.rank, q.shape[-2] // 2, q.shape[-1] ** -0.5
        acc_dtype = torch.promote_types(q.dtype, torch.float32)
        delta = (dout.to(acc_dtype) * out.to(acc_dtype)).sum(-1)  # (B, h_kv, g, 2L)
        dq = torch.zeros(q.shape, dtype=acc_dtype, device=q.device)
        kv, dkv_arrived, dkv_works = torch.stack([k, v]), None, []
        for step in range(n):
            if step < n - 1:
                arriving, works = _start_ring_pass(kv, comm)
            dkv = torch.zeros(kv.shape, dtype=acc_dtype, device=q.device)
            for rows, cols, causal in ring_pieces(r, (r - step) % n, L):
                p = (_scores(q, kv[0], rows, cols, causal, scale) - lse[..., rows, None]).exp()
                dp = (dout[..., rows, :] @ kv[1][..., cols, :].transpose(-1, -2)).to(acc_dtype)
                ds = (p * (dp - delta[..., rows, None])).to(q.dtype)
                dq[..., rows, :] += (ds @ kv[0][..., cols, :]).to(acc_dtype) * scale
                # dK, dV sum over the query heads of the group (dim 2)
                dk = (ds.transpose(-1, -2) @ q[..., rows, :]).to(acc_dtype) * scale
                dv = (p.to(q.dtype).transpose(-1, -2) @ dout[..., rows, :]).to(acc_dtype)
                dkv[0][..., cols, :] += dk.sum(2, keepdim=True)
                dkv[1][..., cols, :] += dv.sum(2, keepdim=True)
            if dkv_arrived is not None:  # what the previous ranks added to the block we hold
                for w in dkv_works:
                    w.wait()
                dkv += dkv_arrived
            dkv_arrived, dkv_works = _start_ring_pass(dkv, comm)
            if step < n - 1:
                for w in works:
                    w.wait()
                kv = arriving
        for w in dkv_works:
            w.wait()
        return (dq.to(q.dtype), dkv_arrived[0].to(k.dtype), dkv_arrived[1].to(v.dtype), None, None)


@torch.compiler.disable
def ring_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, comm: Comm, work: dict | None = None
) -> torch.Tensor:
    """Causal attention of this rank's queries q (B, h, T/n, d) over the whole sequence, whose K/V
    (B, h_kv, T/n, d) blocks go round the ring of `comm`; positions as `cp_positions`.
    -> (B, h, T/n, d). Outside torch.compile's graph (its sends, waits and counters are Python);
    the rest of the block compiles around it."""
    h_kv = k.shape[1]
    out = _RingAttention.apply(
        q.unflatten(1, (h_kv, -1)), k.unsqueeze(2), v.unsqueeze(2), comm, work
    )
    return out.flatten(1, 2)


class ContextParallel(nn.Module):
    """A GPT whose sequences are split over the ranks of `comm`: forward(idx, targets) with the full
    (B, T) batch (the same on every cp rank) -> (this rank's logits (B, T/n, V), the loss)."""

    def __init__(self, model: nn.Module, comm: Comm):
        super().__init__()
        if model.config.n_expert or model.config.dropout:
            raise ParallelError(
                "context parallel splits dense attention without dropout: set n_expert=0 and "
                "dropout=0, or cp 1 (MoE capacity would count one rank's tokens)"
            )
        self.module, self.comm = model, comm
        self.work: dict[str, int] = {}  # score elements computed per batch row and head
        # Set once: a function made anew each step would be a new guard for torch.compile.
        for block in model.blocks:
            block.attn.attend = functools.partial(ring_attention, comm=comm, work=self.work)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        m, n, T = self.module, self.comm.size, idx.shape[1]
        if T % (2 * n):
            raise ParallelError(
                f"sequence length {T} is not a multiple of 2 x cp {n} (two "
                f"chunks per rank); choose a block size divisible by {2 * n}"
            )
        positions = cp_positions(T, n, self.comm.rank, idx.device)
        for block in m.blocks:
            block.attn.positions = positions
        x = m.embed(idx[:, positions])  # (B, T/n, C)
        for block in m.blocks:
            x = block(x)
        logits = m.head(x)  # (B, T/n, V)
        if targets is None:
            return logits, None
        # this rank's summed loss over the whole sequence's token count (the gradients of the
        # replicated weights add up over cp: data parallel averages over Megatron's dp x cp group)
        mine = targets[:, positions].reshape(-1)
        local = F.cross_entropy(
            logits.float().flatten(0, 1), mine, ignore_index=-1, reduction="sum"
        )
        totals = torch.stack([local.detach(), (mine != -1).sum().to(local.dtype)])
        self.comm.all_reduce(totals)
        loss = local * n / totals[1].clamp(min=1)  # x n: data parallel averages over dp x cp
        mean = totals[0] / totals[1].clamp(min=1)  # the value returned: the whole batch's mean
        return logits, loss + (mean - loss).detach()


if __name__ == "__main__":
    from machinery.commands import parallel as command

    raise SystemExit(command.main())
