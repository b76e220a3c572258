"""Putting the parallel lessons together for train.py: `parallelize(model, optimizer, mesh, zero,
schedule)` cuts and wraps a full model (tensor parallel inside, then pipeline, then data parallel or
ZeRO over dp; experts over ep, the sequence over cp) so train.py's loop runs unchanged, and
checkpoints move between layouts in the single-process format. Wiring of the lessons of
parallel.py and model_parallel.py, not a lesson of its own.

Serves: train.py (through machinery/run.py), the tests and the demos."""

from __future__ import annotations

import contextlib
import dataclasses

import torch
import torch.distributed as dist
import torch.nn as nn

import scaling

from model_parallel import (
    ContextParallel,
    ExpertParallel,
    PipelineParallel,
    TensorParallel,
    all_to_all_bytes,
    bubble_fraction,
    ring_bytes,
    shard_slice,
)
from parallel import (
    Comm,
    DataParallel,
    Layout,
    Mesh,
    ParallelError,
    Zero,
    zero_bytes_per_step,
    zero_memory_per_rank,
)
# --------------------------------------------------------------------------------------------------
# 7. Checkpoints in any layout
#
# A checkpoint holds the single-process state dicts: the full model, and the optimizer state keyed
# by parameter name, whatever layout saved it, so a run saved on 4 ranks resumes on 1 and back. The
# functions below gather a Zero's shards into that format (collective) and scatter it back;
# model_parallel.parallelize uses them for train.py: wiring of the lessons above, not a lesson.
# --------------------------------------------------------------------------------------------------


def _param_names(module: nn.Module) -> dict[int, str]:
    return {id(p): n for n, p in module.named_parameters()}


def zero_full_state_dict(zero: Zero) -> dict[str, torch.Tensor]:
    """The module's unsharded state dict in the master dtype (same keys as a single-process
    model), on every rank. Collective: gathers the fp32 shards (never the bf16 compute
    copies)."""
    full = {}
    for u in zero.units:
        flat = u.master_full()
        for p, o in zip(u.params, u.offsets):
            full[id(p)] = flat[o : o + p.numel()].view(p.shape).clone()
    return {
        k: full[id(v)] if id(v) in full else v.detach().clone()
        for k, v in zero.module.state_dict(keep_vars=True).items()
    }


def load_zero_full_state_dict(zero: Zero, state: dict[str, torch.Tensor]) -> None:
    """Set every rank's shards (and the full weights where they are held) from an unsharded
    state dict."""
    names = _param_names(zero.module)
    for u in zero.units:
        flat = torch.zeros(u.padded, dtype=u.shard.dtype, device=u.shard.device)
        for p, o in zip(u.params, u.offsets):
            flat[o : o + p.numel()].copy_(state[names[id(p)]].reshape(-1))
        lo = u.comm.rank * u.shard_size
        with torch.no_grad():
            u.shard.copy_(flat[lo : lo + u.shard_size])
            if u.gathered:
                u.full.copy_(flat)
    with torch.no_grad():
        for name, buffer in zero.module.named_buffers():
            buffer.copy_(state[name])


def training_state_bytes(params, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes actually allocated for parameters, gradients and optimizer state (each storage counted
    once)."""
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
    return {
        "params": size(params),
        "grads": size(p.grad for p in params),
        "optimizer": size(v for s in optimizer.state.values() for v in s.values()),
    }


def zero_memory_bytes(zero: Zero) -> dict[str, int]:
    """Bytes this rank holds right now for parameters, gradients and optimizer state under ZeRO."""
    params = [p for u in zero.units for p in u.params] + [u.shard for u in zero.units]
    return training_state_bytes(params, zero.optimizer)


def zero_optimizer_state_dict(zero: Zero) -> dict:
    """The optimizer state unsharded, keyed by parameter name (see `named_optimizer_state`)."""
    names, state = _param_names(zero.module), {}
    for u in zero.units:
        for key, value in zero.optimizer.state.get(u.shard, {}).items():
            if torch.is_tensor(value) and value.shape == u.shard.shape:
                full = torch.empty(u.padded, dtype=value.dtype, device=value.device)
                u.comm.all_gather(full, value.contiguous())
                for p, o in zip(u.params, u.offsets):
                    piece = full[o : o + p.numel()].view(p.shape).clone()
                    state.setdefault(names[id(p)], {})[key] = piece
            else:  # the same for every parameter of the unit (AdamW's `step`)
                for p in u.params:
                    kept = value.clone() if torch.is_tensor(value) else value
                    state.setdefault(names[id(p)], {})[key] = kept
    groups = []
    for group in zero.optimizer.param_groups:
        options = {k: v for k, v in group.items() if k != "params"}
        members = {id(q) for q in group["params"]}
        options["param_names"] = [
            names[id(p)] for u in zero.units if id(u.shard) in members for p in u.params
        ]
        groups.append(options)
    return {"state": state, "param_groups": groups}


def load_zero_optimizer_state_dict(zero: Zero, saved: dict) -> None:
    """Each rank keeps its shard's slice of every saved per-parameter tensor (the inverse of
    `zero_optimizer_state_dict`)."""
    names = _param_names(zero.module)
    for u in zero.units:
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
                        flat[o : o + p.numel()].copy_(s[key].reshape(-1))
                state[key] = flat[lo : lo + u.shard_size].clone()
            # AdamW's 0-dim `step`: fused and capturable kernels read it on the shard's device
            else:
                state[key] = (
                    first.to(u.shard.device, copy=True) if torch.is_tensor(first) else first
                )
        if state:
            zero.optimizer.state[u.shard] = state
    _load_group_options(zero.optimizer, saved)


def _load_group_options(optimizer: torch.optim.Optimizer, saved: dict) -> None:
    for group, options in zip(optimizer.param_groups, saved.get("param_groups", [])):
        group.update({k: v for k, v in options.items() if k not in ("params", "param_names")})


def named_optimizer_state(optimizer: torch.optim.Optimizer, module: nn.Module) -> dict:
    """A plain optimizer's state keyed by parameter name instead of position, the layout-free format
    that `zero_optimizer_state_dict` also writes, so a checkpoint moves between 1 rank and n ranks.
    >>> m = nn.Linear(2, 1); o = torch.optim.AdamW(m.parameters())
    >>> m(torch.ones(1, 2)).sum().backward(); o.step()
    >>> sorted(named_optimizer_state(o, m)["state"]["weight"])
    ['exp_avg', 'exp_avg_sq', 'step']
    """
    names = _param_names(module)
    state = {
        names[id(p)]: {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()}
        for p, s in optimizer.state.items()
        if id(p) in names
    }
    groups = [
        {
            **{k: v for k, v in g.items() if k != "params"},
            "param_names": [names[id(p)] for p in g["params"] if id(p) in names],
        }
        for g in optimizer.param_groups
    ]
    return {"state": state, "param_groups": groups}


def load_named_optimizer_state(
    optimizer: torch.optim.Optimizer, module: nn.Module, saved: dict
) -> None:
    """Inverse of `named_optimizer_state` for a plain optimizer over `module`'s parameters."""
    for name, p in module.named_parameters():
        if name in saved["state"]:
            optimizer.state[p] = {
                k: v.clone().to(p.device) if torch.is_tensor(v) else v
                for k, v in saved["state"][name].items()
            }
    _load_group_options(optimizer, saved)


# --------------------------------------------------------------------------------------------------
# 6. Putting it together for train.py: `parallelize(model, optimizer, mesh, zero, schedule)`
#
# train.py builds the full model and a plain optimizer as if it were alone, then hands both over.
# Every rank builds the same full weights (same seed within a dp group), so slicing them (TP) or
# pruning them (PP) gives the same function as one process. What comes back keeps train.py's loop
# unchanged:
#   model:     parallel.Layout's interface: forward(x, y) (not under PP), no_sync(),
#              finish_gradient_sync(), clip_grad_norm_(max_norm), pipeline_step(micro_batches)
#              (under PP), full_state_dict() / load_full_state_dict() and full_model() (a plain GPT
#              with every weight, for sampling); all of them collective.
#   optimizer: param_groups, step(), zero_grad(), and state_dict() / load_state_dict() in the format
#              of the single-process optimizer (torch's, keyed by position), so a checkpoint saved
#              on 4 ranks resumes on 1 and back, in any layout.
# Checkpoints go through the single-process format: `tp_gather` / `tp_slice` turn a tensor-parallel
# slice into the full tensor and back, `full_model_state_dict` merges the pipeline stages. This
# section is the wiring of the lessons above for train.py, not a lesson of its own.
# --------------------------------------------------------------------------------------------------


def tp_gather(t: torch.Tensor, p: nn.Parameter, comm: Comm) -> torch.Tensor:
    """The full tensor of which `t` (shaped like parameter p) is this rank's slice; unpadded."""
    if not getattr(p, "tp_sharded", False) or comm.size == 1:
        return t.detach().clone()
    moved = t.detach().movedim(p.tp_dim, 0).contiguous()
    out = torch.empty(comm.size * moved.numel(), dtype=t.dtype, device=t.device)
    comm.all_gather(out, moved.reshape(-1))
    full = out.view(comm.size * moved.shape[0], *moved.shape[1:])[: p.tp_full_size]
    return full.movedim(0, p.tp_dim).contiguous()


def tp_slice(full: torch.Tensor, p: nn.Parameter, comm: Comm) -> torch.Tensor:
    """This rank's slice of a full tensor shaped like parameter p's full tensor (inverse of
    tp_gather)."""
    if not getattr(p, "tp_sharded", False) or comm.size == 1:
        return full.clone()
    return shard_slice(full, p.tp_dim, comm, padded=p.shape[p.tp_dim] * comm.size)


def _to_cpu(obj):
    """A nested dict of tensors with every tensor copied to the CPU. all_gather_object pickles its
    object, and a CUDA tensor unpickles onto the GPU it came from (pytorch/pytorch#76865): every
    process would open a CUDA context on every other rank's GPU, or crash where it sees only its
    own."""
    if torch.is_tensor(obj):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    return obj


def full_model_state_dict(model: nn.Module, mesh: Mesh) -> dict[str, torch.Tensor]:
    """Merge every stage's (and every tensor-parallel rank's) parameters into the single-process
    state dict."""
    params = dict(model.named_parameters(remove_duplicate=False))
    local = {
        k: tp_gather(v, params[k], mesh.tp) if k in params else v.detach().clone()
        for k, v in model.state_dict().items()
    }
    if mesh.pp.size == 1:
        return local
    merged: dict[str, torch.Tensor] = {}
    parts = [None] * mesh.pp.size
    dist.all_gather_object(parts, _to_cpu(local), group=mesh.pp.group)
    for part in parts:
        merged.update(part)
    return merged


def _canonical(name: str, p: torch.Tensor) -> str:
    """The single-process name of a parameter: the last stage's copy of a tied embedding is
    tok_emb.weight."""
    return "tok_emb.weight" if getattr(p, "pp_tied_copy", False) else name


class ExpertDataParallel:
    """Data parallel under expert parallel (model_parallel.py section 4): dense parameters averaged
    over dp, expert slices over their expert-dp group."""

    def __init__(self, model: nn.Module, dp: Comm, edp: Comm):
        split: dict[bool, list] = {False: [], True: []}
        for p in model.parameters():
            split[getattr(p, "tp_sharded", False)].append(p)
        self.parts = [
            DataParallel(nn.ParameterList(split[False]), dp),
            DataParallel(nn.ParameterList(split[True]), edp),
        ]

    @contextlib.contextmanager
    def no_sync(self):
        with self.parts[0].no_sync(), self.parts[1].no_sync():
            yield

    def finish_gradient_sync(self) -> None:
        for part in self.parts:
            part.finish_gradient_sync()


class DistributedModel(Layout):
    """A GPT split over a mesh; see the section comment. Build it with `parallelize`."""

    def __init__(self, model: nn.Module, mesh: Mesh, zero: int, schedule: str, ep: int = 1):
        super().__init__()
        self.mesh, self.zero_stage, self.layout = mesh, zero, mesh
        self.config = model.config
        self.edp = None
        if ep > 1:  # the expert slices gather, load and clip over ep as TP's slices do over tp
            self.module = ExpertParallel(model, mesh.dp, ep)
            self.mesh, self.edp = dataclasses.replace(mesh, tp=self.module.ep), self.module.edp
        elif mesh.cp.size > 1:  # gradients average over dp x cp: the world (cp runs without tp, pp)
            self.module = ContextParallel(model, mesh.cp)
            self.mesh = dataclasses.replace(mesh, dp=Comm(None, range(mesh.world), mesh.rank))
        else:
            self.module = TensorParallel(model, mesh.tp)  # tp = 1 splits nothing
        self.pipe = PipelineParallel(model, mesh, schedule) if mesh.pp.size > 1 else None
        self.zero: Zero | None = None
        self.sync = None

    @property
    def model(self) -> nn.Module:
        return self.module.module

    @property
    def pipelined(self) -> bool:
        """True under pipeline parallel: train with pipeline_step(micro_batches), not forward +
        backward."""
        return self.pipe is not None

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        if self.pipe is None:
            return self.module(idx, targets)
        if torch.is_grad_enabled():
            raise ParallelError(
                "under pipeline parallel, train through pipeline_step(); forward() only evaluates"
            )
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

    def pipeline_step(
        self, micro_batches: list[tuple[torch.Tensor, torch.Tensor]], count: int = 0
    ) -> torch.Tensor:
        """Forward + backward of all micro-batches as one pipelined batch of `count` pieces (0 = as
        given); the mean loss, 0-dim, on the device (no host read)."""
        x = torch.cat([b[0] for b in micro_batches])
        y = torch.cat([b[1] for b in micro_batches])
        return self.pipe.step(x, y, count or len(micro_batches), self.sync)

    def no_sync(self):
        return self.sync.no_sync() if self.sync is not None else contextlib.nullcontext()

    def finish_gradient_sync(self) -> None:
        if self.sync is not None and self.pipe is None:
            self.sync.finish_gradient_sync()

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        if self.zero is None:  # the slices TP, PP, EP hold, added up over self.mesh
            return super().clip_grad_norm_(max_norm)
        # Under EP dp is the world and every shard, dense or expert, is on one of its ranks: the
        # squares add up over dp alone (adding the expert ones over ep too would count them twice).
        mesh = self.mesh if self.edp is None else None
        return self.zero.clip_grad_norm_(max_norm if max_norm > 0 else float("inf"), mesh)

    def full_state_dict(self, cpu: bool = True) -> dict[str, torch.Tensor]:
        """The single-process state dict, fp32 (under ZeRO-3 gathered from the master shards), on
        every rank; on the CPU (for a checkpoint), or with cpu=False where the weights live."""
        if self.zero is not None and self.zero.stage == 3:  # ZeRO-3 runs without tp and pp
            state = zero_full_state_dict(self.zero)
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
            load_zero_full_state_dict(self.zero, local)
        else:
            self.model.load_state_dict(local)

    def describe(self, micro_batches: int = 1) -> str:
        """The accounting printed at the start of a run: layout, what this rank holds, traffic and
        bubble."""
        L, ep = self.layout, self.mesh.tp.size if self.edp else 1
        schedule = f", {self.pipe.schedule} schedule" if self.pipe else ""
        lines = [
            f"parallel: world {L.world} = dp {L.dp.size} x tp {L.tp.size} x pp {L.pp.size} x "
            f"cp {L.cp.size} (ep {ep} inside dp), ZeRO-{self.zero_stage}{schedule}"
        ]
        lines += self._token_traffic_lines() + self._state_and_dp_traffic_lines()
        if self.pipe is not None:
            bubble = bubble_fraction(L.pp.size, micro_batches)
            lines.append(
                f"  pipeline bubble (p-1)/(m+p-1) = {bubble:.1%} with {micro_batches} micro-batches"
            )
        return "\n".join(lines)

    def _token_traffic_lines(self) -> list[str]:
        """Bytes per token of the batch: EP's all-to-all, CP's K/V ring (per layer and step)."""
        cfg, lines = self.config, []
        if self.edp is not None:  # per token of this rank's batch: cap = N (factor 0), f N k / E
            n, f = self.mesh.tp.size, cfg.moe_capacity_factor
            slots = f * cfg.expert_top_k / cfg.n_expert if f else 1
            per_token = all_to_all_bytes(cfg.n_expert, slots, cfg.n_embd, n)
            lines.append(
                f"  expert all-to-all per MoE layer and step: 4 (n-1)/n E cap C x 4 bytes"
                f" = {per_token:,.0f} bytes per token of this rank's batch"
            )
        n = self.layout.cp.size
        if n > 1:
            per_token = ring_bytes(1, n, cfg.n_kv_head, cfg.head_dim, n) / n
            lines.append(
                f"  K/V ring per attention layer and step: 2 B h_kv (T/n) d x "
                f"(2 (n-1) x 4 + 4 n) bytes = {per_token:,.0f} bytes per token of the batch"
            )
        return lines

    def _state_and_dp_traffic_lines(self) -> list[str]:
        """What this rank holds by the 16 bytes/param formula (ZeRO shares), and what data
        parallel sends per step (see zero_bytes_per_step)."""
        dp, stage = self.mesh.dp.size, self.zero_stage
        params = list(self.model.parameters())
        n_local = sum(p.numel() for p in params)
        experts = [p for p in params if self.edp and getattr(p, "tp_sharded", False)]
        n_experts = sum(p.numel() for p in experts)
        # (parameters, the ranks their ZeRO shards spread over): EP's expert slices, expert-dp's
        parts = [(n_local - n_experts, dp), (n_experts, self.edp.size if self.edp else dp)]
        fp32, mixed = (
            sum(zero_memory_per_rank(n, size, stage, *nbytes) for n, size in parts)
            for nbytes in [(4, 4, 8), (2, 2, 12)]
        )
        n_model = scaling.count_params(self.config)
        lines = [
            f"  this rank: {n_local:,} of {n_model:,} parameters after TP/PP/EP; "
            f"weights + grads + AdamW state per rank by the formula: {fp32 / 2**20:,.1f} MiB fp32 "
            f"(16 bytes/param, ZeRO shares), {mixed / 2**20:,.1f} MiB mixed precision"
        ]
        if dp == 1:
            return lines
        blocks = sum(p.numel() for b in getattr(self.model, "blocks", []) for p in b.parameters())
        unit = self.zero.units[0] if self.zero is not None else None
        gather_bytes = unit.full.element_size() if unit else 4
        reduce_bytes = torch.finfo(unit.reduce_dtype).bits // 8 if unit else 4
        sent = sum(
            zero_bytes_per_step(b, other, size, stage, gather_bytes, reduce_bytes)
            for b, other, size in [
                (blocks - n_experts, n_local - blocks, dp),
                (n_experts, 0, parts[1][1]),  # EP: over expert-dp
            ]
        )
        lines.append(
            f"  data-parallel traffic per step and rank: {sent / 2**20:,.2f} MiB (weights "
            f"gathered in {gather_bytes} bytes, gradients reduced in {reduce_bytes}; see "
            "zero_bytes_per_step)"
        )
        return lines

    def full_model(self) -> nn.Module:
        """A plain (unsplit) copy of the model with the current weights, on every rank, on this
        rank's device (the sampler feeds it ids and a generator of that device)."""
        device = next(self.model.parameters()).device
        full = type(self.model)(self.config).to(device)
        full.load_state_dict(self.full_state_dict(cpu=False))
        return full


class DistributedOptimizer:
    """The optimizer of a DistributedModel: a plain torch optimizer or ZeRO over this rank's
    parameters, whose state_dict() is the single-process optimizer's (collective: gathers over dp,
    tp and pp)."""

    def __init__(
        self,
        wrapped: DistributedModel,
        optimizer: torch.optim.Optimizer,
        names: list[list[str]],
        compute_dtype: torch.dtype | None = None,
        reduce_dtype: torch.dtype | None = None,
    ):
        self.wrapped, self.mesh = wrapped, wrapped.mesh
        # the single-process optimizer's parameter names, group by group, in order
        self.group_names = names
        local = {_canonical(n, p): p for n, p in wrapped.model.named_parameters()}
        groups = [
            {
                **{k: v for k, v in g.items() if k != "params"},
                "params": [local[n] for n in names_g if n in local],
            }
            for g, names_g in zip(optimizer.param_groups, names)
        ]
        if wrapped.zero_stage:
            edp = wrapped.edp or self.mesh.dp  # EP: each expert slice over the ranks holding it
            wrapped.zero = Zero(
                wrapped.model,
                self.mesh.dp,
                wrapped.zero_stage,
                type(optimizer),
                param_groups=[g for g in groups if g["params"]],
                compute_dtype=compute_dtype,
                reduce_dtype=reduce_dtype,
                shard_comm=lambda p: edp if getattr(p, "tp_sharded", False) else self.mesh.dp,
            )
            wrapped.sync = self.inner = wrapped.zero
        else:
            self.inner = type(optimizer)([g for g in groups if g["params"]])
            if wrapped.edp is not None:
                wrapped.sync = ExpertDataParallel(wrapped.model, self.mesh.dp, wrapped.edp)
            elif self.mesh.dp.size > 1:
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
        if isinstance(self.inner, Zero):
            named = zero_optimizer_state_dict(self.inner)["state"]
        else:
            named = named_optimizer_state(self.inner, model)["state"]
        params = dict(model.named_parameters())
        state = {}
        for name, s in named.items():
            p = params[name]
            if getattr(p, "pp_tied_copy", False):
                continue  # the first stage's copy is the one saved
            state[name] = {
                k: tp_gather(v, p, tp) if torch.is_tensor(v) and v.shape == p.shape else v
                for k, v in s.items()
            }
        if self.mesh.pp.size > 1:
            parts = [None] * self.mesh.pp.size
            dist.all_gather_object(parts, _to_cpu(state), group=self.mesh.pp.group)
            state = {k: v for part in parts for k, v in part.items()}
        return state

    def state_dict(self) -> dict:
        """torch's format of the single-process optimizer: {"state": {index: ...}, "param_groups":
        [...]}."""
        state = self._named_state()
        order = [n for names in self.group_names for n in names]
        groups, start = [], 0
        for options, names in zip(self.inner.param_groups, self.group_names):
            groups.append(
                {
                    **{k: v for k, v in options.items() if k != "params"},
                    "params": list(range(start, start + len(names))),
                }
            )
            start += len(names)
        return {
            "state": {i: state[n] for i, n in enumerate(order) if n in state},
            "param_groups": groups,
        }

    def load_state_dict(self, saved: dict) -> None:
        order = [n for names in self.group_names for n in names]
        by_name = {order[int(i)]: s for i, s in saved["state"].items()}
        model, tp = self.wrapped.model, self.mesh.tp
        named = {}
        for name, p in model.named_parameters():
            s = by_name.get(_canonical(name, p))
            if s is not None:
                named[name] = {
                    k: tp_slice(v, p, tp) if torch.is_tensor(v) and v.dim() > 0 else v
                    for k, v in s.items()
                }
        groups = [{k: v for k, v in g.items() if k != "params"} for g in saved["param_groups"]]
        payload = {
            "state": named,
            "param_groups": groups if len(groups) == len(self.inner.param_groups) else [],
        }
        if isinstance(self.inner, Zero):
            load_zero_optimizer_state_dict(self.inner, payload)
        else:
            load_named_optimizer_state(self.inner, model, payload)


def check_combination(zero_stage: int, tp: int, pp: int) -> None:
    """Refuse the (ZeRO stage, tp, pp) combinations `parallelize` does not support, with the reason.
    >>> check_combination(1, 2, 2)
    """
    if zero_stage not in (0, 1, 2, 3):
        raise ParallelError(f"ZeRO stage must be 0, 1, 2 or 3, got {zero_stage}")
    if zero_stage >= 2 and pp > 1:
        raise ParallelError(
            f"ZeRO-{zero_stage} with pp {pp}: ZeRO-2/3 reduce gradients as backward produces "
            f"them, but a pipeline accumulates them over micro-batches; use ZeRO-1 with pp"
        )
    if zero_stage == 3 and tp > 1:
        raise ParallelError(
            f"ZeRO-3 with tp {tp}: ZeRO-3 gathers weights in the module's forward hooks, which "
            f"the tensor-parallel forward bypasses; use ZeRO-1 or 2 with tp"
        )


def check_layout(model: nn.Module, mesh: Mesh, zero: int, ep: int, mixed: bool) -> None:
    """Refuse, with the reason, the layouts `parallelize` does not support: ZeRO-2/3 with tp or pp
    (`check_combination`), ZeRO-3 with ep or cp, ep with cp, a compute dtype (`mixed`) outside
    ZeRO-3, a MoE under pp."""
    check_combination(zero, mesh.tp.size, mesh.pp.size)
    if zero == 3 and ep > 1:
        raise ParallelError(
            f"ZeRO-3 with ep {ep}: its full state dict gathers dp shards, not the expert slices "
            "over ep; use ZeRO <= 2"
        )
    if zero == 3 and mesh.cp.size > 1:
        raise ParallelError(
            f"ZeRO-3 with cp {mesh.cp.size}: ring attention runs the blocks itself, past the hook "
            "gathering embedding+head; use ZeRO <= 2"
        )
    if ep > 1 and mesh.cp.size > 1:
        raise ParallelError(
            f"ep {ep} with cp {mesh.cp.size}: expert parallel needs a MoE, ring attention a "
            "dense model (a rank's capacity would count its chunk's tokens only); use one of them"
        )
    if mixed and zero != 3:
        raise ParallelError(
            "gathering weights in a compute dtype is ZeRO-3's; use ZeRO-3, or autocast alone"
        )
    if mesh.pp.size > 1 and getattr(model.config, "n_expert", 0):
        raise ParallelError(
            "pipeline parallel does not carry the MoE load-balancing loss; use pp 1 with MoE"
        )


def parallelize(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    mesh: Mesh,
    zero: int = 0,
    schedule: str = "1f1b",
    compute_dtype: torch.dtype | None = None,
    reduce_dtype: torch.dtype | None = None,
    ep: int = 1,
) -> tuple[DistributedModel, DistributedOptimizer]:
    """Split a full GPT and its plain optimizer over the mesh: TP inside, then PP, then DP or ZeRO
    over dp; or experts over ep consecutive dp ranks; or sequences over mesh.cp.
    compute_dtype / reduce_dtype: ZeRO-3's mixed precision (see `Zero`)."""
    check_layout(model, mesh, zero, ep, mixed=bool(compute_dtype or reduce_dtype))
    if dist.is_initialized() and dist.get_world_size() > 1:
        # Every rank must start from the same full weights before slicing or pruning them: rank 0's.
        with torch.no_grad():
            for t in model.state_dict().values():
                dist.broadcast(t, src=0)
    names = {id(p): n for n, p in model.named_parameters()}
    group_names = [[names[id(p)] for p in g["params"]] for g in optimizer.param_groups]
    wrapped = DistributedModel(model, mesh, zero, schedule, ep)
    return wrapped, DistributedOptimizer(
        wrapped, optimizer, group_names, compute_dtype, reduce_dtype
    )
