"""The IsoFLOP sweep and the dedup-effect experiment: scaling.py's laws measured on real runs, on a
CPU.

Serves: scaling.py. It owns the experiments of that chapter, the parts that train models: the
sweep's model family and plan, running each point through train.py, reading the runs back, the
held-out prediction, the sweep's plot and REPORT.md, the dedup-effect experiment and its report.
Their command line, `python scaling.py sweep|dedup-effect ...`, is machinery/commands/scaling.py.

The sweep does the lecture's project M3 the Chinchilla way: at 4 budgets 1e12 .. 8e12 FLOPs (8×), 5
sizes around sqrt(C/120) parameters, each trained through train.py for exactly D = C/6N tokens with
its own cosine schedule, so every point is annealed. The models are small transformers, not toys: 2
to 4 layers of width 32 to 128 with 16-channel heads (43k to 870k parameters on a 512-token BPE).
Example: at C = 1e12 the 43,168-parameter model trains 1e12 / (6 · 43,168) = 3.86M tokens in 943
steps of 32 × 128, and the 381,600-parameter one 437k tokens in 853 steps of 4 × 128: the batch (4
to 128 sequences, doubling) follows the size so that every run takes 800 to 1,600 steps (fewer leave
the loss visibly short of the same tokens in more steps, and runs far apart in steps would not be
compared on equal terms: docs/scaling-sweep.md has the measurement). The 3 sizes nearest each
budget's best run are trained again from another seed, since one run's loss varies ~0.02 nats with
its seed, and a point's seeds count as their mean. A parabola in log N per budget gives N*
(scaling.py's Approach 2); the minima give N_opt ∝ C^a. Then the law fitted on these budgets
predicts N_opt and the loss at 2e13, and three sizes there are trained (the one nearest the
prediction twice) and compared. `dedup-effect` repeats 1% of the documents 50 times and measures
what dedup.py buys, against the seed-to-seed spread. How the design and its learning rates were
chosen: docs/scaling-sweep.md. `--device cuda` runs the same plan at 10× the budgets.

Depends on numpy, scaling.py (the laws and the fits), machinery's scaling_plots and scaling_reports
(the plot's panels, the fit's table) and fileio.py; inside the functions that need them: model.py
(parameter counts), data.py and data_at_scale.py (preparing corpora), dedup.py and evaluate.py (the
dedup effect), matplotlib (the plot).

Every run is `python train.py ...` in a subprocess, so the sweep imports no training code.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import pathlib
import shutil
import sys
import threading
from typing import Sequence

import numpy as np

import scaling
from machinery import checkpoints, devices, fileio, scaling_plots
from machinery.scaling_reports import fit_markdown
from scaling import (
    AllocationLaw,
    ChinchillaFit,
    FitReport,
    Run,
    ScalingError,
    fit_all,
    fit_line,
    group_close,
    isoflop_minima,
    params_for_budget,
    unit_fraction,
)

# the repository's root, where train.py is
ROOT = pathlib.Path(__file__).resolve().parent.parent

# --------------------------------------------------------------------------------------------------
# 1. The IsoFLOP sweep (the lecture's project M3): budgets, sizes around each optimum, one annealed
#    run per point.
# --------------------------------------------------------------------------------------------------

# channels per attention head in the sweep's family: width 32 has 2 heads, width 128 has 8
HEAD_DIM = 16


@dataclasses.dataclass(frozen=True)
class Shape:
    """A model of the sweep's family: `n_layer` blocks of width `n_embd`, 16-channel heads, FFN
    rounded to 16.

    >>> Shape(2, 64).name, Shape(2, 64).counts(512)     # (all parameters, non-embedding parameters)
    ('L2-d64', (133440, 100672))
    """

    n_layer: int
    n_embd: int

    @property
    def name(self) -> str:
        return f"L{self.n_layer}-d{self.n_embd}"

    def config_overrides(self) -> dict:
        heads = self.n_embd // HEAD_DIM
        return {
            "n_layer": self.n_layer,
            "n_embd": self.n_embd,
            "n_head": heads,
            "n_kv_head": heads,
            "ffn_multiple_of": 16,
        }

    def counts(self, vocab_size: int) -> tuple[int, int]:
        """(all parameters, non-embedding parameters), counted by model.py (the tied embedding
        counted once)."""
        from model import GPTConfig

        cfg = GPTConfig(vocab_size=vocab_size, **self.config_overrides())
        return scaling.count_params(cfg), scaling.count_params(cfg, non_embedding=True)


def depth_for_width(n_embd: int) -> int:
    """The sweep's depth rule: one layer per 32 channels of width, rounded, and never fewer than 2
    (attention over attention's output is what makes a transformer more than a bigram table with a
    mixer).

    >>> [depth_for_width(d) for d in (32, 48, 64, 80, 96, 128, 192)]
    [2, 2, 2, 3, 3, 4, 6]
    """
    return max(2, (n_embd + 16) // 32)


def shape_family(max_width: int = 512) -> list[Shape]:
    """Widths 32 to 128 in steps of 16, then steps of 32; depth by depth_for_width. The smallest
    member, 2 layers of width 32 with two 16-channel heads, has 43,168 parameters on a 512-token
    vocabulary; the 128-wide one has 4 layers and 869,504. Width 32 is the floor: below it a head is
    thinner than 16 channels or the model has one.

    >>> [s.name for s in shape_family(192)]
    ['L2-d32', 'L2-d48', 'L2-d64', 'L3-d80', 'L3-d96', 'L4-d112', 'L4-d128', 'L5-d160', 'L6-d192']
    """
    widths = list(range(32, 129, 16)) + list(range(160, max_width + 1, 32))
    return [Shape(depth_for_width(d), d) for d in widths if d <= max_width]


def nearest_shapes(
    targets: Sequence[float], vocab_size: int, family: Sequence[Shape] | None = None
) -> list[Shape]:
    """For each target N (ascending), the family member nearest in log N that is larger than the
    previous pick: distinct sizes, in order, as close to the targets as the family allows.

    >>> [s.name for s in nearest_shapes([2e4, 4e4, 3e5], 512)]   # 2e4, 4e4 nearest 43k: 80k
    ['L2-d32', 'L2-d48', 'L3-d80']
    """
    members = sorted(family or shape_family(), key=lambda s: s.counts(vocab_size)[0])
    picked: list[Shape] = []
    for target in sorted(targets):
        floor = picked[-1].counts(vocab_size)[0] if picked else 0
        left = [s for s in members if s.counts(vocab_size)[0] > floor]
        if not left:
            raise ScalingError(
                f"no model in the family is larger than {floor:,} parameters: lower the budgets"
            )
        picked.append(min(left, key=lambda s: abs(math.log(s.counts(vocab_size)[0] / target))))
    return picked


def lr_for_width(n_embd: int, lr_at_64: float) -> float:
    """The sweep's learning-rate rule: Adam's best rate falls as 1/width (muP, Yang et al. 2022),
    anchored at width 64 by the short search recorded in docs/scaling-sweep.md.

    >>> lr_for_width(32, 6e-3), lr_for_width(128, 6e-3)
    (0.012, 0.003)
    """
    return lr_at_64 * 64 / n_embd


@dataclasses.dataclass(frozen=True)
class SweepSettings:
    """The IsoFLOP design. At each budget C, `sizes_per_budget` models from guess/spread to
    guess·spread around N = sqrt(C / 6r) (r = tokens_per_param_guess), each trained for exactly D =
    C / 6N tokens with its own cosine schedule (warmup, then down to 10% at the last step), so every
    final point is annealed.

    Every run takes at least `min_steps` optimizer steps: its batch is the largest of `batch_sizes`
    (sequences of `block_size` tokens) that still gives that many, so with batches doubling from 4
    to 128 every run takes between 800 and 1,600 steps and no point gains more from its step count
    than its neighbours. A small model at a big budget then takes big batches (its steps are cheap
    but many: a 2-layer step costs ~20 ms of framework time however small the batch) and a big model
    takes small ones. A size that would get fewer steps even at the smallest batch, or read more
    than `max_run_tokens`, is left out of that budget's choice. Then a held-out budget
    `heldout_factor` × the largest is predicted from the others, trained at `heldout_sizes` sizes
    around the prediction, and compared.

    Every run uses `seed`; the `second_seed_sizes` sizes nearest each budget's best run are trained
    again with seed + 1 before anything is fitted to them (and the held-out size nearest the
    prediction along with the other held-out runs), and a point's seeds count as their mean loss.
    One run's loss varies by ~0.02 nats (0.8%) from seed to seed (docs/scaling-sweep.md); near a
    minimum, where a parabola's vertex and its loss are read, that is a quarter of the loss step
    between neighbouring sizes, so the minima and the prediction rest on two seeds there and on one
    where the curve is steep."""

    data: str = "pystdlib"
    vocab_size: int = 512
    budgets: tuple[float, ...] = (1e12, 2e12, 4e12, 8e12)
    sizes_per_budget: int = 5
    size_spread: float = 4.0
    tokens_per_param_guess: float = 20.0
    heldout_factor: float = 2.5
    heldout_sizes: int = 3
    batch_sizes: tuple[int, ...] = (4, 8, 16, 32, 64, 128)
    block_size: int = 128
    min_steps: int = 800
    # 2 epochs of pystdlib's 13.7M train tokens; sweep() sets the dataset's
    max_run_tokens: int = 27_000_000
    lr_at_64: float = 4e-3
    warmup_fraction: float = 0.05
    # "cosine": every point its own run. "wsd" (Hägele et al. 2024): each size and seed trains
    # once at a constant rate, a trunk extended as far as its longest point needs, and every point
    # is a branch resumed from the trunk's checkpoint and decayed over its last decay_fraction; a
    # size keeps one batch at every budget (its smallest budget's), so its branches share a trunk.
    # The time estimate still counts each point as a whole run: an upper bound under wsd
    schedule: str = "cosine"
    decay_fraction: float = 0.2
    # every run is scored on the same first 384 windows of the val split
    eval_windows: int = 384
    seed: int = 0
    second_seed_sizes: int = 3
    device: str = "cpu"
    workers: int = 2
    threads: int = 1
    bootstrap: int = 50


QUICK_SWEEP = SweepSettings(
    data="pydocs",
    budgets=(3e9, 9e9),
    sizes_per_budget=3,
    size_spread=2.0,
    batch_sizes=(2, 4),
    block_size=64,
    min_steps=20,
    eval_windows=16,
    bootstrap=10,
    second_seed_sizes=1,
)

# The same plan for one CUDA GPU (`--device cuda`): budgets 10x, batches 2x, bf16, one run at a
# time. pystdlib still holds enough text for it (the longest run reads 1.8 epochs); bigger budgets
# need a bigger --data, since the smallest sizes would otherwise read it many times over.
GPU_SWEEP = dataclasses.replace(
    SweepSettings(),
    budgets=(1e13, 2e13, 4e13, 8e13),
    batch_sizes=(8, 16, 32, 64, 128, 256),
    device="cuda",
    workers=1,
    threads=0,
)


@dataclasses.dataclass(frozen=True)
class PlannedRun:
    """One point of the sweep: a shape trained for `steps` steps of `batch_size` sequences at
    learning rate `lr`, from `seed` (named with it when it is not 0: C1e12-L2-d32 and its second
    seed C1e12-L2-d32-s1)."""

    budget: float
    shape: Shape
    params: int
    non_embedding: int
    steps: int
    tokens: int
    lr: float
    batch_size: int
    heldout: bool = False
    seed: int = 0

    @property
    def name(self) -> str:
        return f"C{self.budget:.0e}-{self.shape.name}".replace("+", "") + (
            f"-s{self.seed}" if self.seed else ""
        )

    @property
    def compute(self) -> float:
        return 6.0 * self.params * self.tokens


def plan_run(
    budget: float,
    shape: Shape,
    settings: SweepSettings,
    heldout: bool = False,
    seed: int | None = None,
) -> PlannedRun:
    """D = C / 6N tokens in whole steps of the largest batch that still gives min_steps steps (else
    the smallest batch); the actual D is recorded. The seed is settings.seed unless given.

    >>> r = plan_run(1e12, Shape(2, 32), SweepSettings())      # 43,168 parameters: D = 3.86M tokens
    >>> r.batch_size, r.steps, r.tokens
    (32, 943, 3862528)
    """
    n, non_embedding = shape.counts(settings.vocab_size)
    tokens = budget / (6.0 * n)
    batch_tokens = tokens
    if settings.schedule == "wsd":  # the batch the smallest budget gives: one trunk per size
        batch_tokens = min(settings.budgets) / (6.0 * n)
    fits = [
        b
        for b in settings.batch_sizes
        if batch_tokens / (b * settings.block_size) >= settings.min_steps
    ]
    batch = max(fits) if fits else min(settings.batch_sizes)
    steps = max(1, round(tokens / (batch * settings.block_size)))
    return PlannedRun(
        budget,
        shape,
        n,
        non_embedding,
        steps,
        steps * batch * settings.block_size,
        lr_for_width(shape.n_embd, settings.lr_at_64),
        batch,
        heldout,
        settings.seed if seed is None else seed,
    )


def trainable_shapes(budget: float, settings: SweepSettings) -> list[Shape]:
    """The family members a budget can train well: at least min_steps steps at the smallest batch,
    and at most max_run_tokens tokens.

    >>> [s.name for s in trainable_shapes(8e12, SweepSettings())][:2]   # 43k: 31M tokens > 2 epochs
    ['L2-d48', 'L2-d64']
    """
    smallest = min(settings.batch_sizes) * settings.block_size
    return [
        s
        for s in shape_family()
        if settings.min_steps * smallest
        <= budget / (6.0 * s.counts(settings.vocab_size)[0])
        <= settings.max_run_tokens
    ]


def sizes_near(budget: float, targets: Sequence[float], settings: SweepSettings) -> list[Shape]:
    """nearest_shapes among the shapes this budget can train; a design they cannot cover is one
    ScalingError."""
    allowed = trainable_shapes(budget, settings)
    # (an empty list would mean the whole family to nearest_shapes)
    if len(allowed) >= len(targets):
        with contextlib.suppress(ScalingError):
            return nearest_shapes(targets, settings.vocab_size, allowed)
    raise ScalingError(
        f"at C = {budget:.3g} only {len(allowed)} sizes of the family train at least "
        f"{settings.min_steps} steps on at most {settings.max_run_tokens:,} tokens, and "
        f"{len(targets)} are needed: choose other settings.budgets (a smaller one leaves the big "
        f"sizes too few steps, a bigger one the small too few tokens: a larger settings.data helps)"
    )


def plan_isoflop(settings: SweepSettings) -> list[PlannedRun]:
    """Every (budget, size) of the IsoFLOP grid, smallest budget first.

    >>> [(f"{r.budget:.0e}", r.shape.name, r.batch_size, r.steps)
    ...  for r in plan_isoflop(SweepSettings())][:3]
    [('1e+12', 'L2-d32', 32, 943), ('1e+12', 'L2-d48', 16, 1016), ('1e+12', 'L2-d64', 8, 1220)]
    """
    runs = []
    for budget in sorted(settings.budgets):
        guess = params_for_budget(budget, settings.tokens_per_param_guess)
        k = settings.sizes_per_budget
        targets = [guess * settings.size_spread ** (2 * i / (k - 1) - 1) for i in range(k)]
        runs += [plan_run(budget, s, settings) for s in sizes_near(budget, targets, settings)]
    return runs


def plan_heldout(settings: SweepSettings, predicted_params: float) -> list[PlannedRun]:
    """The held-out budget: the shape nearest the predicted N_opt (and with heldout_sizes = 3, one
    size 2x either side, enough for a parabola that measures the optimum there too); with second
    seeds, the shape nearest the prediction once more from seed + 1, planned with the others so that
    the four runs share the cores."""
    budget = settings.heldout_factor * max(settings.budgets)
    targets = (
        [predicted_params]
        if settings.heldout_sizes == 1
        else [predicted_params / 2, predicted_params, predicted_params * 2]
    )
    runs = [
        plan_run(budget, s, settings, heldout=True) for s in sizes_near(budget, targets, settings)
    ]
    if settings.second_seed_sizes:
        nearest = min(runs, key=lambda r: abs(math.log(r.params / predicted_params)))
        runs.append(dataclasses.replace(nearest, seed=settings.seed + 1))
    return runs


def plan_second_seeds(settings: SweepSettings, records: Sequence[dict]) -> list[PlannedRun]:
    """The grid points measured again with seed + 1: at each budget of `records` (the grid's
    final.jsonl records, one seed), the `second_seed_sizes` sizes nearest its best run (the best and
    its neighbours, the window slid inside the sizes at an edge).

    >>> rec = lambda d, loss: {"budget": 1e12, "parameters": d * d, "loss": loss, "n_layer": 2,
    ...                        "n_embd": d, "heldout": False}
    >>> records = [rec(d, 3 - d / 100) for d in (32, 48, 64, 80, 96)]
    >>> again = plan_second_seeds(SweepSettings(), records)
    >>> [r.name for r in again]          # the best is the largest size: the window ends there
    ['C1e12-L2-d64-s1', 'C1e12-L2-d80-s1', 'C1e12-L2-d96-s1']
    """
    again = []
    for budget, group in group_close(list(records), key=lambda r: r["budget"]).items():
        group = sorted(group, key=lambda r: r["parameters"])
        k = min(settings.second_seed_sizes, len(group))  # k = 0: the window below is empty
        best = min(range(len(group)), key=lambda i: group[i]["loss"])
        start = min(max(best - (k - 1) // 2, 0), len(group) - k)
        again += [
            plan_run(
                r["budget"], Shape(r["n_layer"], r["n_embd"]), settings, seed=settings.seed + 1
            )
            for r in group[start : start + k]
        ]
    return again


# What one train.py run of the sweep costs on this 2-core CPU, two runs side by side at one thread
# each (fitted to the sweep's runs: 85 min predicted for the 36 of docs/sweep/final.jsonl, 85.5
# measured): ~7 s to start (Python and torch, torch.optim's first import of torch._dynamo, the
# dataset, the checkpoint), ~20 ms of framework time per step (a 2-layer model's forward and
# backward are a few hundred small kernels), and the model's 6·N FLOPs per token at ~2.2e10 FLOP/s
# (7e9 for 2 × 32 at batch 32, 3e10 for 4 × 128: wider matmuls use the core better).
RUN_START_SECONDS, STEP_SECONDS, CPU_FLOPS = 7.0, 0.02, 2.2e10
# assumed, not measured: a model of a few million parameters uses ~1% of a big GPU's peak
GPU_FLOPS = 5e12
# an experiment estimated longer than this is refused unless max_hours (--max-hours) allows it
MAX_HOURS = 12.0


def estimate_seconds(settings: SweepSettings, runs: Sequence[PlannedRun]) -> float:
    """Wall time of training `runs`, `workers` side by side (at most one per core): start-up,
    per-step framework time, and 6·N·D training plus 2·N per evaluated token, at CPU_FLOPS per run
    (GPU_FLOPS on a GPU).

    >>> round(estimate_seconds(QUICK_SWEEP, plan_isoflop(QUICK_SWEEP)))   # 6 tiny runs, 2 at once
    25
    >>> big = dataclasses.replace(QUICK_SWEEP, budgets=(1e15, 3e15))
    >>> f"{estimate_seconds(QUICK_SWEEP, plan_isoflop(big)):.2g}"
    '2.8e+05'
    """
    return sum(run_seconds(settings, r) for r in runs) / max(
        1, min(settings.workers, os.cpu_count() or 1)
    )


def run_seconds(settings: SweepSettings, run: PlannedRun) -> float:
    """One run's estimated seconds (see estimate_seconds)."""
    return _estimated_seconds(settings, run.steps, run.params, run.tokens)


def _estimated_seconds(settings: SweepSettings, steps: int, params: float, tokens: float) -> float:
    flops = CPU_FLOPS if settings.device == "cpu" else GPU_FLOPS
    eval_tokens = settings.eval_windows * settings.block_size
    return (
        RUN_START_SECONDS
        + steps * STEP_SECONDS
        + (6.0 * params * tokens + 2.0 * params * eval_tokens) / flops
    )


def wall_seconds(settings: SweepSettings, records: Sequence[dict]) -> float:
    """How long `records` take from scratch as the sweep runs them, from their measured seconds: the
    grid's first seeds, then its second seeds, then the held-out runs (each phase needs the last
    one's losses), each phase `workers` at a time, the longest by estimate first, every run to the
    worker that is free first.

    >>> rec = lambda secs, seed=0: {"steps": secs * 1000, "parameters": 1, "tokens": 1,
    ...                             "seconds": secs, "seed": seed, "heldout": False}
    >>> wall_seconds(SweepSettings(), [rec(2), rec(3), rec(2), rec(5, seed=1)])   # 3 by 2+2, then 5
    9.0
    """
    phases = (
        [r for r in records if not r["heldout"] and r.get("seed", 0) == settings.seed],
        [r for r in records if not r["heldout"] and r.get("seed", 0) != settings.seed],
        [r for r in records if r["heldout"]],
    )
    total = 0.0
    for phase in phases:
        free = [0.0] * max(1, settings.workers)
        for r in sorted(
            phase,
            key=lambda r: -_estimated_seconds(settings, r["steps"], r["parameters"], r["tokens"]),
        ):
            free[free.index(min(free))] += r["seconds"]
        total += max(free)
    return total


def planned_runs(settings: SweepSettings) -> list[PlannedRun]:
    """Every run the sweep will train, as far as it is known before training: the grid, the held-out
    budget at the 20:1 guess, and the second seeds where that guess puts the minima (the middle of
    each budget's sizes)."""
    grid = plan_isoflop(settings)
    heldout_budget = settings.heldout_factor * max(settings.budgets)
    held = plan_heldout(
        settings, params_for_budget(heldout_budget, settings.tokens_per_param_guess)
    )
    k, again = settings.second_seed_sizes, []
    for group in group_close(grid, key=lambda r: r.budget).values():
        start = (len(group) - k) // 2
        again += [dataclasses.replace(r, seed=settings.seed + 1) for r in group[start : start + k]]
    return grid + held + again


def about(hours: float) -> str:
    """An estimate as a person says it: hours from one hour up, minutes below, so a short run is
    never "about 0 hours".

    >>> about(1.42), about(12.6), about(0.12), about(1 / 60), about(0.001)
    ('about 1.4 hours', 'about 13 hours', 'about 7 minutes', 'about 1 minute', 'under a minute')
    """
    if hours >= 1:
        return f"about {hours:,.{1 if hours < 10 else 0}f} hours"
    minutes = round(hours * 60)
    if minutes < 1:
        return "under a minute"
    return f"about {minutes} minute{'' if minutes == 1 else 's'}"


def planned_hours(settings: SweepSettings) -> float:
    """The whole sweep's estimated wall time in hours (planned_runs at estimate_seconds)."""
    return estimate_seconds(settings, planned_runs(settings)) / 3600


def train_command(settings: SweepSettings, run: PlannedRun, data_dir, out_dir) -> list[str]:
    """The train.py command line of one point: the shape through --model-args, exactly run.steps
    steps, one evaluation at the end on the same held-out windows as every other run. Its schedule:
    its own cosine, or (schedule "wsd") a branch that resumes its trunk's checkpoint at
    decay_start and decays linearly over the last decay_fraction of its steps."""
    s = settings
    if s.schedule == "wsd":
        trunk = pathlib.Path(out_dir).parent / trunk_name(run)
        resume = trunk / checkpoint_name(decay_start(s, run.steps))
        schedule = ["--schedule", "wsd", "--decay-fraction", f"{s.decay_fraction:g}"]
        return _command(s, run, run.steps, data_dir, out_dir) + schedule + ["--resume", str(resume)]
    return _command(s, run, run.steps, data_dir, out_dir) + ["--schedule", "cosine", "--overwrite"]


def _command(s: SweepSettings, run: PlannedRun, steps: int, data_dir, out_dir) -> list[str]:
    """What every train.py command of the sweep says: run's shape, batch, rate and seed for `steps`
    steps, evaluated and checkpointed at the last. Warmup: 5% of the run's steps, or under wsd 5%
    of min_steps, which a trunk and all its branches share."""
    model_args = ",".join(f"{k}={v}" for k, v in run.shape.config_overrides().items())
    warmup = min(max(1, round(s.warmup_fraction * steps)), steps)
    if s.schedule == "wsd":
        warmup = max(1, round(s.warmup_fraction * s.min_steps))
    flags = {
        "--data": data_dir,
        "--model": "sweep-1",
        "--model-args": model_args,
        "--out-dir": out_dir,
        "--max-steps": steps,
        "--batch-size": run.batch_size,
        "--block-size": s.block_size,
        "--lr": f"{run.lr:.6g}",
        "--warmup-steps": warmup,
        "--eval-interval": steps,
        "--eval-batches": max(1, s.eval_windows // run.batch_size),
        "--ckpt-interval": steps,
        "--seed": run.seed,
        "--dtype": "fp32" if s.device == "cpu" else "bf16",
        "--device": s.device,
        "--num-samples": 0,
        "--log-interval": max(1, steps // 10),
    }
    flat = [str(x) for pair in flags.items() for x in pair]
    return [sys.executable, str(ROOT / "train.py"), *flat, "--no-eval-at-start", "--no-plot"]


# --------------------------------------------------------------------------------------------------
# WSD trunks: one constant-rate run per size and seed, each point a decay branch from it
# --------------------------------------------------------------------------------------------------


def decay_start(settings: SweepSettings, steps: int) -> int:
    """The step a branch of `steps` steps starts decaying at, as train.wsd_lr computes it: the
    trunk's checkpoint there is where the branch resumes.

    >>> decay_start(SweepSettings(), 943), decay_start(SweepSettings(), 1016)
    (754, 813)
    """
    return steps - int(round(settings.decay_fraction * steps))


def trunk_name(run: PlannedRun) -> str:
    """The trunk a point branches from: one per size and seed ('trunk-L2-d32-s0')."""
    return f"trunk-{run.shape.name}-s{run.seed}"


def checkpoint_name(step: int) -> str:
    """train.py's checkpoint file for `step` (train.checkpoint_path)."""
    return f"ckpt_{step:07d}.pt"


def trunk_command(s: SweepSettings, run: PlannedRun, steps: int, data_dir, trunk) -> list[str]:
    """The trunk of run's size and seed trained at the constant rate to `steps` (warmup, then no
    decay), keeping a checkpoint at every length it stops at; a trunk that holds checkpoints
    resumes from its latest (a bare --resume)."""
    cmd = _command(s, run, steps, data_dir, trunk)
    cmd += ["--schedule", "wsd", "--decay-fraction", "0", "--keep-checkpoints", "1000"]
    if any(pathlib.Path(trunk).glob("ckpt_*.pt")):
        cmd.append("--resume")
    return cmd


def extend_trunks(
    settings: SweepSettings, runs: Sequence[PlannedRun], data_dir, out: pathlib.Path, log
) -> None:
    """Before any branch trains: train each trunk the runs branch from through every decay start
    they need, shortest first (a later phase extends it further), `workers` trunks at a time. A
    trunk whose command (its length aside) changed starts over; its seconds add up in
    train_seconds.txt."""
    import concurrent.futures
    import time

    needs: dict[str, tuple[PlannedRun, set]] = {}
    for run in runs:
        needs.setdefault(trunk_name(run), (run, set()))[1].add(decay_start(settings, run.steps))

    def extend(name: str) -> None:
        run, starts = needs[name]
        trunk = out / "runs" / name
        stamp, timing = trunk / "command.json", trunk / "train_seconds.txt"
        wanted = json.dumps(_command(settings, run, 0, data_dir, trunk)[1:])  # the length aside
        if not stamp.is_file() or stamp.read_text(encoding="utf-8") != wanted:
            shutil.rmtree(trunk, ignore_errors=True)
            trunk.mkdir(parents=True)
            _write_text(stamp, wanted)
        for start in sorted(starts):
            if (trunk / checkpoint_name(start)).is_file():
                continue
            done = [int(path.stem[5:]) for path in trunk.glob("ckpt_*.pt")]
            if done and max(done) > start:
                raise ScalingError(
                    f"{name} is trained past step {start}, where a branch starts: remove {trunk} "
                    "and run the sweep again"
                )
            t0 = time.perf_counter()
            cmd = trunk_command(settings, run, start, data_dir, trunk)
            _run_train(cmd, trunk / f"train-{start}.log", settings.threads)
            seconds = time.perf_counter() - t0
            before = float(timing.read_text()) if timing.is_file() else 0.0
            _write_text(timing, f"{before + seconds:.1f}")
            log(f"{name}: constant rate to step {start} ({seconds:.0f} s)")

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, settings.workers)) as pool:
        for future in [pool.submit(extend, name) for name in needs]:
            future.result()


def shell_command(cmd: Sequence[str], threads: int = 1) -> str:
    """A train.py command line as one shell line to copy: `python`, paths relative to the project
    folder where they are inside it, and the thread count the run had (a CPU's sums depend on it).

    >>> shell_command([sys.executable, str(ROOT / "train.py"),
    ...                "--out-dir", str(ROOT / "out" / "a b")])
    "OMP_NUM_THREADS=1 python train.py --out-dir 'out/a b'"
    """

    def relative(arg: str) -> str:
        path = pathlib.Path(arg)
        return (
            str(path.relative_to(ROOT)) if path.is_absolute() and path.is_relative_to(ROOT) else arg
        )

    import shlex

    line = shlex.join(["python"] + [relative(a) for a in cmd[1:]])
    return f"OMP_NUM_THREADS={threads} {line}" if threads else line


def final_val_loss(metrics_path, steps: int) -> float | None:
    """The validation loss logged at step `steps` (the end of the schedule), or None if the run did
    not get there."""
    path = pathlib.Path(metrics_path)
    if not path.is_file():
        return None
    losses = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        # a torn last line (a killed run) is no record
        with contextlib.suppress(ScalingError):
            r = fileio.parse_json(line, str(path), ScalingError)
            if r.get("step") == steps and "val_loss" in r:
                losses.append(r["val_loss"])
    return (
        float(losses[-1])
        if losses and losses[-1] is not None and math.isfinite(losses[-1])
        else None
    )


def _run_train(cmd: list[str], log_path: pathlib.Path, threads: int = 1) -> None:
    """Run train.py, its output going to log_path; a failure becomes one ScalingError line quoting
    its error.

    threads: torch's CPU threads for the run (0 = torch's default). These models' matmuls are too
    small to gain much from a second core, so the sweep runs `workers` single-threaded runs side by
    side instead."""
    import subprocess

    env = dict(os.environ)
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    with open(log_path, "w", encoding="utf-8") as log_file:
        done = subprocess.run(cmd, stdout=log_file, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    if done.returncode != 0:
        tail = [
            line
            for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines()
            if line.strip()
        ][-1:]
        raise ScalingError(
            f"train.py failed (exit {done.returncode}) in {log_path.parent.name}: "
            f"{tail[0] if tail else 'no output'}"
        )


def _write_text(path, text: str) -> pathlib.Path:
    """Write whole or not at all (fileio: temp file, then rename); a full disk is one ScalingError
    line."""
    return fileio.write_atomic(path, text, error=ScalingError, fix="pass out_dir on another disk")


def train_or_reuse(
    cmd: list[str], run_dir: pathlib.Path, steps: int, threads: int, diverged_ok: bool = False
) -> tuple[float | None, float, bool]:
    """Train `cmd` into run_dir unless a finished run of it is there: (loss, seconds, reused). A
    failed run, or a diverged one unless diverged_ok, leaves no folder."""
    import time

    stamp, timing = run_dir / "command.json", run_dir / "train_seconds.txt"
    wanted = json.dumps(cmd[1:])
    loss = final_val_loss(run_dir / "metrics.jsonl", steps)
    finished = stamp.is_file() and stamp.read_text(encoding="utf-8") == wanted
    if finished and (loss is not None or diverged_ok):
        seconds = float(timing.read_text()) if timing.is_file() else 0.0
        return loss, seconds, True
    shutil.rmtree(run_dir, ignore_errors=True)  # a branch resumes into an empty folder
    run_dir.mkdir(parents=True)
    t0 = time.perf_counter()
    try:
        _run_train(cmd, run_dir / "train.log", threads)
        seconds = time.perf_counter() - t0
        loss = final_val_loss(run_dir / "metrics.jsonl", steps)
        if loss is None and not diverged_ok:
            raise ScalingError(f"{run_dir.name}: train.py wrote no final validation loss")
        _write_text(timing, f"{seconds:.1f}")
        _write_text(stamp, wanted)
    except BaseException:
        shutil.rmtree(run_dir, ignore_errors=True)  # only finished runs stay
        raise
    return loss, seconds, False


def execute_runs(
    settings: SweepSettings, runs: Sequence[PlannedRun], data_dir, out_dir, log=print
) -> list[dict]:
    """Train every planned run (`workers` at a time, the longest first by run_seconds, so that no
    long run starts last while the other cores idle; `train_or_reuse`). Returns one final.jsonl
    record per run, in plan order."""
    import concurrent.futures

    out = pathlib.Path(out_dir)
    if settings.schedule == "wsd":
        extend_trunks(settings, runs, data_dir, out, log)
    failed = threading.Event()

    def one(run: PlannedRun) -> dict:
        # another run failed: the sweep stops, this queued run never starts
        if failed.is_set():
            raise concurrent.futures.CancelledError()
        try:
            return train_one(run)
        except BaseException:
            failed.set()
            raise

    def train_one(run: PlannedRun) -> dict:
        run_dir = out / "runs" / run.name
        cmd = train_command(settings, run, data_dir, run_dir)
        loss, seconds, reused = train_or_reuse(cmd, run_dir, run.steps, settings.threads)
        log(
            f"{run.name}: N = {run.params:,} ({run.non_embedding:,} non-embedding), D = "
            f"{run.tokens:,}, "
            f"lr {run.lr:.3g}, loss {loss:.4f} ({seconds:.0f} s{', reused' if reused else ''})"
        )
        record = {
            "name": run.name,
            "budget": run.budget,
            "parameters": run.params,
            "non_embedding_parameters": run.non_embedding,
            "tokens": run.tokens,
            "compute": run.compute,
            "loss": loss,
            "n_layer": run.shape.n_layer,
            "n_embd": run.shape.n_embd,
            "lr": run.lr,
            "steps": run.steps,
            "batch_size": run.batch_size,
            "heldout": run.heldout,
            "seed": run.seed,
            "seconds": round(seconds, 1),
            "command": shell_command(cmd, settings.threads),
        }
        if settings.schedule == "wsd":
            record["trunk"] = trunk_name(run)
        return record

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, settings.workers)) as pool:
        futures = {
            i: pool.submit(one, runs[i])  # submitted longest first
            for i in sorted(range(len(runs)), key=lambda i: -run_seconds(settings, runs[i]))
        }
        concurrent.futures.wait(futures.values(), return_when=concurrent.futures.FIRST_EXCEPTION)
        failed.set()  # done, or one failed: nothing queued starts now
        errors = [
            f.exception()
            for f in futures.values()
            if f.done()
            and not f.cancelled()
            and f.exception() is not None
            and not isinstance(f.exception(), concurrent.futures.CancelledError)
        ]
        if errors:
            raise errors[0]
        return [futures[i].result() for i in range(len(runs))]


def runs_of(
    records: Sequence[dict], heldout: bool = False, non_embedding: bool = False
) -> list[Run]:
    """final.jsonl records as Runs (N = all parameters, or Kaplan's non-embedding count), a point's
    seeds as one Run at their mean loss (scaling.mean_over_seeds)."""
    key = "non_embedding_parameters" if non_embedding else "parameters"
    return scaling.mean_over_seeds(
        [
            Run(float(r[key]), float(r["tokens"]), float(r["loss"]), float(r["budget"]), r["name"])
            for r in records
            if bool(r.get("heldout")) == heldout
        ]
    )


@dataclasses.dataclass
class SweepResult:
    settings: SweepSettings
    out_dir: pathlib.Path
    records: list  # final.jsonl, one dict per final point
    train_tokens: int  # unique tokens in the train split
    corpus: str  # the dataset's sources, e.g. "pystdlib"
    report: FitReport | None = None
    non_embedding_report: FitReport | None = None
    prediction: dict | None = None
    plot: pathlib.Path | None = None


def predict_heldout(report: FitReport, fit_runs: Sequence[Run]) -> dict:
    """Before training the held-out budget (the report's target compute), from the fits on the grid
    alone: N_opt there from Approach 2 (or, where it cannot be fitted, the next approach that can),
    and its loss two ways: Approach 3's law at (N_opt, C/6N_opt), and a power law L* = k·C^g through
    the IsoFLOP minima's losses. Raises ScalingError when no approach fits."""
    budget = report.target
    usable = [
        k
        for k in ("approach2", "approach3", "approach1")
        if isinstance(report.laws[k], AllocationLaw)
    ]
    if not usable:
        raise ScalingError(
            "no approach could be fitted to the IsoFLOP runs: " + report.laws["approach2"]
        )
    law = report.laws[usable[0]]
    n_opt = float(law.params_at(budget))
    out = {
        "budget": budget,
        "params": n_opt,
        "tokens": budget / (6 * n_opt),
        "a": law.a,
        "approach": usable[0],
        "params_interval": report.intervals.get(usable[0], {}).get("params"),
    }
    minima = isoflop_minima(fit_runs)
    if len(minima) >= 2:
        g, k = fit_line(
            np.log([m[0] for m in minima]),
            np.log([np.polyval(m[2], math.log(m[1])) for m in minima]),
        )
        out.update(minima_loss_at_budget=math.exp(k) * budget**g, minima_loss_exponent=g)
    if report.chinchilla is not None:
        out["law3_loss_at_opt"] = report.chinchilla.loss(n_opt, budget / (6 * n_opt))
        out["law3"] = dataclasses.asdict(report.chinchilla)
    return out


def check_design(settings: SweepSettings, max_hours: float = MAX_HOURS) -> float:
    """Refuse a design that cannot be fitted or built, or that would run past max_hours; returns the
    estimate."""
    s = settings
    if len(s.budgets) < 2 or len(set(s.budgets)) != len(s.budgets):
        raise ScalingError(
            "settings.budgets needs at least 2 different compute budgets, e.g. 1e12 2e12 4e12 8e12"
        )
    if s.sizes_per_budget < 3:
        raise ScalingError(
            "a sweep needs at least 3 sizes per budget (a parabola has 3 coefficients)"
        )
    if s.heldout_sizes not in (1, 3):
        raise ScalingError(f"settings.heldout_sizes must be 1 or 3, got {s.heldout_sizes}")
    if not 0 <= s.second_seed_sizes <= s.sizes_per_budget:
        raise ScalingError(
            f"settings.second_seed_sizes {s.second_seed_sizes}: give 0 (one seed) to "
            f"{s.sizes_per_budget} (every size of a budget)"
        )
    if s.device != "cpu":
        # "`device` cuda: no CUDA device here; ..."
        devices.resolve_device(s.device, error=ScalingError)
    # a design the family cannot build fails here
    runs = planned_runs(s)
    hours = estimate_seconds(s, runs) / 3600
    if hours > max_hours:
        flops = sum(r.compute for r in runs)
        where = "this CPU" if s.device == "cpu" else f"the GPU (assumed {GPU_FLOPS:.0e} FLOP/s)"
        raise ScalingError(
            f"this sweep ({flops:.2g} FLOPs) would take {about(hours)} on {where} "
            f"({s.workers} runs at a time at ~{CPU_FLOPS:.1e} FLOP/s each on a CPU): lower "
            f"settings.budgets, or pass max_hours {math.ceil(hours * 1.5)} to run it anyway"
        )
    return hours


def open_dataset(spec: str):
    """A prepared dataset directory, checked whole (manifest, shard sizes, token ids below the
    vocabulary) before any run reads it: a data.TokenData; None when `spec` names sources to
    prepare. Problems are one ScalingError."""
    import data as data_lib

    path = pathlib.Path(spec)
    if (
        path.is_dir()
        and not (path / "manifest.json").exists()
        and ((path / "tokenizer.json").exists() or any(path.glob("train_*.bin")))
    ):
        raise ScalingError(
            f"settings.data {spec}: a dataset folder without manifest.json (damaged or half "
            f"copied): prepare it again into {spec} with python data.py prepare"
        )
    if not (path / "manifest.json").exists():
        return None
    with _data_errors(spec):
        fileio.read_json(
            path / "manifest.json", ScalingError, "prepare it again with python data.py prepare"
        )
        dataset = data_lib.TokenData(path)
        for split, shards in dataset.shards.items():
            top = max((int(a.max()) for a in shards if len(a)), default=-1)
            if top >= dataset.vocab_size:
                raise ScalingError(
                    f"a token id {top} in the {split} shards is outside the "
                    f"{dataset.vocab_size}-token "
                    f"vocabulary (damaged shards): prepare it again with python data.py prepare"
                )
    return dataset


@contextlib.contextmanager
def _data_errors(spec: str):
    """data.py's errors (DataError is a ValueError), and OSErrors, as one ScalingError line naming
    settings.data."""
    try:
        yield
    except (ValueError, OSError) as e:
        first = str(e).splitlines()[0] if str(e) else e.__class__.__name__
        raise ScalingError(f"settings.data {spec}: {first}") from None


@contextlib.contextmanager
def output_folder(out_dir, keep=lambda out: False):
    """Create the output folder and prove it writable (a probe file), then yield it. When the body
    fails, a folder this call created is removed, unless keep(folder) says it holds something a
    rerun reuses."""
    out = pathlib.Path(out_dir).resolve()  # absolute: train.py runs in the project folder
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        fileio.write_atomic(out / ".write-probe", "", fsync=False).unlink()
    except OSError as e:
        if created:
            shutil.rmtree(out, ignore_errors=True)
        raise ScalingError(
            f"cannot write out_dir {out_dir} ({e.strerror or e}): pass a writable out_dir"
        ) from None
    try:
        yield out
    except BaseException:
        if created and not keep(out):
            shutil.rmtree(out, ignore_errors=True)
        raise


def sweep(
    settings: SweepSettings = SweepSettings(),
    out_dir="out/sweep",
    log=print,
    max_hours: float = MAX_HOURS,
) -> SweepResult:
    """The whole experiment: prepare the corpus, train the IsoFLOP grid, predict the held-out budget
    from it, train that, fit the three approaches on the grid, write final.jsonl, scaling.png and
    REPORT.md into out_dir.

    Everything that can be checked is checked before the first side effect (the design and its
    estimated time, the dataset, the output folder); a sweep that fails later keeps only its
    finished runs (a rerun reuses them) and removes an output folder it created that holds none."""
    from machinery import data_at_scale, formats

    s = settings
    dataset = open_dataset(s.data)
    # the dataset's tokenizer rules, and no run reads it more than twice
    if dataset is not None:
        s = dataclasses.replace(
            s, vocab_size=int(dataset.vocab_size), max_run_tokens=_two_epochs(dataset)
        )
    hours = check_design(s, max_hours)
    sources = [x for x in s.data.split(",") if x]
    if dataset is None:
        with _data_errors(s.data):
            for spec in sources:
                # a missing file fails here, before any output
                formats.open_source(spec)
    with output_folder(out_dir, keep=lambda out: any((out / "runs").glob("*/command.json"))) as out:
        if dataset is None:
            log(
                f"preparing {s.data} with a {s.vocab_size}-token BPE (cached after the first time) "
                "..."
            )
            with _data_errors(s.data):
                data_dir = data_at_scale.prepare(sources, vocab_size=s.vocab_size, seed=s.seed)
            dataset = open_dataset(str(data_dir))
            s = dataclasses.replace(s, max_run_tokens=_two_epochs(dataset))
        return _sweep_in(s, dataset, out, hours, log)


def _two_epochs(dataset) -> int:
    """A run may read its train split twice: Muennighoff et al. (2023) measured up to 4 epochs of
    repeated data as nearly as good as unique data, and the largest budgets need the small sizes'
    long runs."""
    return 2 * int(dataset.manifest["splits"]["train"]["tokens"])


def _sweep_in(s: SweepSettings, dataset, out: pathlib.Path, hours: float, log) -> SweepResult:
    """sweep() once its inputs are checked: the grid, the prediction, the held-out runs, the
    files."""
    data_dir, manifest = dataset.data_dir, dataset.manifest
    train_tokens = int(manifest["splits"]["train"]["tokens"])
    corpus = "+".join(src["spec"] for src in manifest.get("sources", [])) or s.data
    grid = plan_isoflop(s)
    log(
        f"{len(grid)} IsoFLOP runs on {data_dir} ({train_tokens:,} train tokens), {s.workers} at a "
        f"time, {about(hours)} with the held-out budget ..."
        + (f"\n{QUICK_NOTE}" if is_quick(s) else "")
    )
    records = execute_runs(s, grid, data_dir, out, log)
    again = plan_second_seeds(s, records)
    if again:
        which = f"{s.second_seed_sizes} sizes" if s.second_seed_sizes > 1 else "size"
        log(
            f"seed {s.seed + 1} for the {which} nearest each budget's best: "
            + ", ".join(r.name for r in again)
        )
        records += execute_runs(s, again, data_dir, out, log)
    fit_runs = runs_of(records)  # a point's two seeds as their mean
    heldout_budget = s.heldout_factor * max(s.budgets)
    report = fit_all(fit_runs, heldout_budget, bootstrap=s.bootstrap, seed=s.seed)
    try:
        prediction = predict_heldout(report, fit_runs)
    except ScalingError as e:
        prediction = {"budget": heldout_budget, "error": str(e)}
        log(f"no prediction for the held-out budget: {e}")
    if "params" in prediction:
        held = plan_heldout(s, prediction["params"])
        log(
            f"predicted at C = {heldout_budget:.3g}: N_opt = {prediction['params']:,.0f} "
            f"({prediction['approach']}); training " + ", ".join(r.name for r in held)
        )
        held_records = execute_runs(s, held, data_dir, out, log)
        if "law3" in prediction:
            for record in held_records:
                record["predicted_loss"] = ChinchillaFit(**prediction["law3"]).loss(
                    record["parameters"], record["tokens"]
                )
        records += held_records
    result = SweepResult(
        s,
        out,
        records,
        train_tokens,
        corpus,
        report,
        fit_all(runs_of(records, non_embedding=True), heldout_budget, bootstrap=0),
        prediction,
    )
    _write_text(out / "final.jsonl", "".join(json.dumps(r) + "\n" for r in records))
    result.plot = plot_sweep(result, out / "scaling.png")
    _write_text(out / "REPORT.md", sweep_report(result))
    return result


def plot_sweep(result: SweepResult, path) -> pathlib.Path:
    """Three panels from final.jsonl. Left: loss against compute, one line per size. Middle: the
    IsoFLOP curves, loss against N per budget with the fitted parabola and its minimum (star), the
    held-out run(s) in black. Right: N_opt against compute: Approach 2's minima and the three fitted
    laws, with the held-out prediction."""
    grid, held = runs_of(result.records), runs_of(result.records, heldout=True)
    fig, (left, middle, right) = scaling_plots.pyplot().subplots(1, 3, figsize=(18, 6))
    # one group per size
    for n, points in group_close(grid + held, key=lambda r: r.params).items():
        points = sorted(points, key=lambda r: r.compute)
        left.plot(
            [r.compute for r in points], [r.loss for r in points], "o-", ms=4, label=f"N = {n:,.0f}"
        )
    left.set_xlabel("compute C = 6·N·D (FLOPs)")
    left.set_title("final loss against compute, one line per size")

    scaling_plots.draw_isoflop_curves(middle, grid)
    if held:
        middle.plot(
            [r.params for r in held],
            [r.loss for r in held],
            "ks",
            ms=7,
            label=f"held-out C = {held[0].budget:.2g} (measured)",
        )
    twice = [r for group in _points(result.records).values() if len(group) > 1 for r in group]
    if twice:
        middle.plot(
            [r["parameters"] for r in twice],
            [r["loss"] for r in twice],
            ".",
            color="grey",
            ms=4,
            label="the two seeds of a point (their mean is plotted)",
        )
    p = result.prediction or {}
    for key, marker, label in (
        ("minima_loss_at_budget", "kx", "prediction: minima's power law"),
        ("law3_loss_at_opt", "k+", "prediction: Approach 3's law"),
    ):
        if "params" in p and key in p:
            middle.plot([p["params"]], [p[key]], marker, ms=10, mew=2, label=label)
    middle.set_title("IsoFLOP curves: parabola in log N, minimum = star")

    computes = np.array([r.compute for r in grid + held])
    scaling_plots.draw_allocations(
        right,
        grid,
        result.report.laws if result.report else {},
        np.logspace(math.log10(computes.min()), math.log10(computes.max()) + 0.1, 50),
    )
    if "params" in p:
        right.plot(
            [p["budget"]], [p["params"]], "kx", ms=10, mew=2, label="held-out: predicted N_opt"
        )
    right.set_title("N_opt against compute, three approaches")
    for ax in (left, middle):
        scaling_plots.log_axes(ax, "held-out loss (nats/token)")
    scaling_plots.log_axes(right)
    # below: the curves fill it
    middle.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.13))
    return scaling_plots.save_png(fig, path)


def wsd_cost(records: Sequence[dict], cooldown_fraction: float = 0.2) -> tuple[float, float]:
    """Tokens the grid costs as one cosine run per point, and as WSD (Hägele et al. 2024): per size
    one constant-rate trunk as long as its longest budget, plus a cooldown branch of
    `cooldown_fraction` of each budget's tokens.

    >>> wsd_cost([{"parameters": 1, "tokens": 100}, {"parameters": 1, "tokens": 300},
    ...           {"parameters": 2, "tokens": 50}])
    (450, 440.0)
    """
    cosine = sum(r["tokens"] for r in records)
    by_size: dict = {}
    for r in records:
        by_size.setdefault(r["parameters"], []).append(r["tokens"])
    wsd = sum(max(t) + cooldown_fraction * sum(t) for t in by_size.values())
    return cosine, wsd


def annealing_line(result: SweepResult) -> str:
    """The report's line on how each point is annealed, and what it costs in tokens: its own cosine
    run (and what WSD trunks would have cost), or the branches of the trunks it trained."""
    s, records = result.settings, result.records
    if s.schedule != "wsd":
        budgets = sorted({r["budget"] for r in records if not r["heldout"]})
        cosine, wsd = wsd_cost([r for r in records if r.get("seed", 0) == s.seed])
        return (
            f"- **Annealing**: every point is the end of its own cosine schedule ({cosine:,} "
            "tokens in all). WSD with cooldown branches (Hägele et al. 2024) would share one "
            f"constant-rate trunk per size: {wsd:,.0f} tokens here, {1 - wsd / cosine:.0%} less "
            "(`--schedule wsd` trains it so). The budgets are "
            f"{budgets[1] / budgets[0]:.1f}× apart, so the largest budget dominates each size's "
            "cost; WSD pays off the more budgets share one size (and when the trunk is reused for "
            "a longer run later), and one cosine run per point keeps every point a run anyone can "
            "repeat alone."
        )
    trunks: dict[str, int] = {}
    branches = 0
    for r in records:
        start = decay_start(s, r["steps"])
        trunks[r["trunk"]] = max(trunks.get(r["trunk"], 0), start * r["batch_size"] * s.block_size)
        branches += (r["steps"] - start) * r["batch_size"] * s.block_size
    seconds = [result.out_dir / "runs" / name / "train_seconds.txt" for name in trunks]
    trunk_seconds = sum(float(path.read_text()) for path in seconds if path.is_file())
    cosine, wsd = sum(r["tokens"] for r in records), sum(trunks.values()) + branches
    return (
        f"- **Annealing**: WSD (Hägele et al. 2024). Each size and seed trained once at the "
        f"constant rate, {len(trunks)} trunks of {sum(trunks.values()):,} tokens in all "
        f"({trunk_seconds:,.0f} run-seconds), and every point is a branch resumed from its "
        f"trunk and decayed linearly to 10% over its last {s.decay_fraction:.0%} "
        f"({branches:,} tokens): {wsd:,} tokens, where one cosine run per point reads "
        f"{cosine:,} ({1 - wsd / cosine:.0%} less). A size keeps one batch at every budget."
    )


def _points(records: Sequence[dict]) -> dict[tuple, list[dict]]:
    """final.jsonl records by point (budget, N, D, held out or not): a point trained with two seeds
    has two."""
    by_point: dict[tuple, list[dict]] = {}
    for r in records:
        by_point.setdefault(
            (r["budget"], r["parameters"], r["tokens"], bool(r["heldout"])), []
        ).append(r)
    return by_point


def seed_pairs(records: Sequence[dict]) -> list[tuple[str, float, float]]:
    """(name, first seed's loss, second seed's loss) for every point of `records` trained with two
    seeds."""
    pairs = []
    for group in _points(records).values():
        if len(group) == 2:
            first, second = sorted(group, key=lambda r: r.get("seed", 0))
            pairs.append((first["name"], first["loss"], second["loss"]))
    return pairs


def seed_line(records: Sequence[dict], settings: SweepSettings) -> str:
    """The design's seeds bullet: which points have two, and the seed noise they measure.

    The s.d. of one run's loss from n pairs of differences d: sqrt(sum d^2 / 2n) (each d is the
    difference of two draws, whose variance is twice one draw's), e.g. pairs differing by 0.02 and
    0.04 give sqrt(0.002 / 4) = 0.022.
    """
    s, pairs = settings, seed_pairs(records)
    if not pairs:
        return f"- **Seeds**: every run from seed {s.seed}, one seed per point."
    d = np.array([b - a for _, a, b in pairs])
    worst = max(pairs, key=lambda p: abs(p[2] - p[1]))
    # |loss difference| between each budget's best size and its neighbours
    steps = []
    for group in group_close(runs_of(records), key=lambda r: r.budget).values():
        losses = [r.loss for r in sorted(group, key=lambda r: r.params)]
        best = int(np.argmin(losses))
        steps += [
            abs(losses[j] - losses[best]) for j in (best - 1, best + 1) if 0 <= j < len(losses)
        ]
    which = f"the {s.second_seed_sizes} sizes" if s.second_seed_sizes > 1 else "the size"
    return (
        f"- **Seeds**: every run from seed {s.seed}; {which} nearest each budget's best run, and "
        "the held-out "
        f"size nearest the prediction, again from seed {s.seed + 1} ({len(pairs)} points), and the "
        "fits "
        "and the prediction use a point's mean loss. The pairs measure the seed noise: one run's "
        "loss has a "
        f"standard deviation of {math.sqrt(np.sum(d**2) / (2 * len(d))):.3f} nats (largest "
        "difference "
        f"{abs(worst[2] - worst[1]):.3f}, at {worst[0]}: {worst[1]:.4f} and {worst[2]:.4f}), "
        "against a median "
        f"difference of {np.median(steps):.3f} between a budget's best size and its neighbours."
    )


APPROACHES = {"approach1": "Approach 1", "approach2": "Approach 2", "approach3": "Approach 3"}


def _agreement(report: FitReport) -> tuple[list[str], float | None]:
    """The fitted exponents a by approach and their largest pairwise gap (None when fewer than 2
    were fitted)."""
    laws = {k: v for k, v in report.laws.items() if isinstance(v, AllocationLaw)}
    parts = [f"{APPROACHES[k]} a = {v.a:.3f}" for k, v in laws.items()]
    values = [v.a for v in laws.values()]
    return parts, (max(values) - min(values) if len(values) >= 2 else None)


def prediction_lines(
    p: dict | None, records: Sequence[dict], budgets: Sequence[float]
) -> list[str]:
    """The held-out section of REPORT.md: what the fit on the smaller budgets predicted, and what
    was measured."""
    if not p or "params" not in p:
        return [f"No prediction: {p['error'] if p else 'the sweep did not reach it'}."]
    held = [r for r in records if r["heldout"]]
    lines = [
        f"Fitted on the {len(budgets)} budgets above only, before training it: at C = "
        f"{p['budget']:.3g} "
        f"({p['budget'] / max(budgets):g}× the largest), {APPROACHES[p['approach']]} puts N_opt at "
        f"{p['params']:,.0f}"
        + (
            f" (bootstrap 10-90%: {p['params_interval'][0]:,.0f}-{p['params_interval'][1]:,.0f})"
            if p.get("params_interval")
            else ""
        )
        + f", D_opt = {p['tokens']:,.0f}. Predicted loss at that optimum: "
        + "; ".join(
            x
            for x in (
                f"{p['minima_loss_at_budget']:.4f} from the IsoFLOP minima's power law L* ∝ C^"
                f"{p['minima_loss_exponent']:.3f}"
                if "minima_loss_at_budget" in p
                else "",
                f"{p['law3_loss_at_opt']:.4f} from Approach 3's law"
                if "law3_loss_at_opt" in p
                else "",
            )
            if x
        )
        + ".",
        "",
        "| held-out run | seed | N | D | predicted loss (Approach 3 at this N, D) | measured | "
        "error |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in held:
        pred = r.get("predicted_loss")
        lines.append(
            f"| {r['n_layer']} × {r['n_embd']} | {r.get('seed', 0)} | {r['parameters']:,} | "
            f"{r['tokens']:,} | "
            + (
                f"{pred:.4f} | {r['loss']:.4f} | {(r['loss'] - pred) / r['loss']:+.2%} |"
                if pred
                else f"· | {r['loss']:.4f} | · |"
            )
        )
    if not held:
        return lines + ["", "The held-out run has not been trained yet."]
    # a size's seeds as their mean
    held_points = runs_of(records, heldout=True)
    best = min(held_points, key=lambda r: r.loss)
    seeds = [r["loss"] for r in held if r["parameters"] == best.params]
    measured_as = (
        f"the mean of its {len(seeds)} seeds ({', '.join(f'{x:.4f}' for x in seeds)})"
        if len(seeds) > 1
        else "one seed"
    )
    lines.append("")
    if "minima_loss_at_budget" in p:
        lines.append(
            "Minima power law against the best held-out size: predicted "
            f"{p['minima_loss_at_budget']:.4f}, measured {best.loss:.4f}, {measured_as} "
            f"({(best.loss - p['minima_loss_at_budget']) / best.loss:+.2%})."
        )
    lines.append(
        f"That size has N = {best.params:,.0f}, {best.params / p['params']:.2f}× the predicted "
        f"N_opt (the nearest size in the family)."
    )
    sizes = len(held_points)
    if sizes >= 3:
        measured = isoflop_minima(held_points)
        lines.append(
            f"Measured optimum at the held-out budget (parabola through the {sizes} sizes): N* = "
            f"{measured[0][1]:,.0f}, the prediction is {p['params'] / measured[0][1]:.2f}× it."
            if measured
            else "The held-out sizes show no U with its bottom inside them, so the optimum there "
            "is not measured."
        )
    else:
        lines.append(
            "One held-out size was trained, so the optimal size there is predicted, not measured "
            "(`--heldout-sizes 3` adds a size 2× either side and a parabola through them)."
        )
    return lines


def _regenerate(result: SweepResult) -> str:
    """The commands that make this sweep again (--quick kept): its --data folder first, when it was
    given a prepared one (a source name such as pydocs the sweep prepares itself)."""
    s = result.settings
    quick = " --quick" if is_quick(s) else ""
    data = "" if s.data == (QUICK_SWEEP if quick else SweepSettings).data else f" --data {s.data}"
    if s.schedule != "cosine":
        data += f" --schedule {s.schedule}"
    command = f"`python scaling.py sweep{quick}{data}`"
    if not data or not (pathlib.Path(s.data) / "manifest.json").is_file():
        return command
    corpus = result.corpus.replace("+", " ")
    return (
        f"`python data.py prepare --data {corpus} --vocab-size {s.vocab_size} --out {s.data}`, "
        f"then {command}"
    )


def is_quick(s: SweepSettings) -> bool:
    """Whether these are --quick's settings: tiny models, seconds per run, a test of the
    plumbing."""
    return s.budgets == QUICK_SWEEP.budgets and s.block_size == QUICK_SWEEP.block_size


QUICK_NOTE = (
    "--quick is a plumbing test (tiny models, seconds per run): its fits and prediction are not "
    "meaningful; `python scaling.py sweep` runs the real design"
)


def sweep_report(result: SweepResult) -> str:
    """REPORT.md, written from final.jsonl: the design, the runs, the three fits, the prediction and
    the targets."""
    s, records = result.settings, result.records
    grid = runs_of(records)
    budgets = sorted({r["budget"] for r in records if not r["heldout"]})
    longest = max(r["tokens"] for r in records)
    schedule = f"{s.warmup_fraction:.0%} warmup, then cosine to 10% at the run's last step"
    at_budget = ""
    if s.schedule == "wsd":
        at_budget = " at the size's smallest budget, kept at every budget"
        schedule = (
            f"warmup over {s.warmup_fraction:.0%} of {s.min_steps:,} steps, then the trunk's "
            f"constant rate; each point decays to 10% over its last {s.decay_fraction:.0%}"
        )
    out = [
        f"# Scaling sweep: {len(budgets)} IsoFLOP budgets on `{result.corpus}`, one held-out "
        "budget predicted",
        "",
        *([f"**{QUICK_NOTE}.**", ""] if is_quick(s) else []),
        f"Regenerate: {_regenerate(result)} (reuses finished runs; every number below is computed "
        "from "
        "`final.jsonl`, whose `command` field is the `python train.py ...` line of each point: run "
        "one alone from the project folder and it gives the same loss).",
        "",
        "## Design",
        "",
        f"- **Budgets** C = {', '.join(f'{b:.3g}' for b in budgets)} FLOPs "
        f"({budgets[-1] / budgets[0]:.0f}× span); "
        f"at each, {s.sizes_per_budget} model sizes from N/{s.size_spread:g} to "
        f"{s.size_spread:g}·N around the "
        f"guess N = sqrt(C / 6·{s.tokens_per_param_guess:g}), each trained for D = C / 6N tokens "
        f"in whole steps of {'/'.join(map(str, s.batch_sizes))} sequences of {s.block_size} "
        "tokens: the largest "
        f"batch that still gives at least {s.min_steps:,} steps{at_budget} (steps per run: "
        f"{min(r['steps'] for r in records):,} to {max(r['steps'] for r in records):,}). A size "
        "that would get "
        f"fewer steps, or read more than {s.max_run_tokens:,} tokens, is not tried at that budget.",
        "- **Models**: one aspect ratio (depth = width / 32 rounded, at least 2 layers; heads of "
        f"{HEAD_DIM} channels; widths {min(r['n_embd'] for r in records)} to "
        f"{max(r['n_embd'] for r in records)}), a "
        f"{s.vocab_size}-token BPE so the embedding stays a minority of the parameters. N counts "
        "all parameters "
        "(the tied embedding is also the output layer, a real matmul per token, so C = 6·N·D "
        f"counts it); Kaplan's non-embedding count is in the table and refitted below.",
        f"- **Data**: `{result.corpus}` with {result.train_tokens:,} unique train tokens; the "
        f"longest run reads {longest:,} tokens = {longest / result.train_tokens:.2f} epochs, so "
        + (
            "no run repeats a token."
            if longest <= result.train_tokens
            else "the longest runs repeat data."
        )
        + " Loss is measured on the same "
        f"{s.eval_windows * s.block_size:,} held-out tokens (the val split, cut by document) for "
        "every run.",
        f"- **Learning rate** per size by the rule lr = {s.lr_at_64:g} · 64 / width (Adam's "
        f"optimum falls as 1/width, muP); {schedule}.",
    ]
    out.append(seed_line(records, s))
    out.append(annealing_line(result))
    out += [
        "",
        "## Runs",
        "",
        "| budget C | layers × width | N (all) | non-embedding | D tokens | D/N | steps × batch | "
        "lr | seed | held-out loss | train time |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in sorted(
        records, key=lambda r: (r["heldout"], r["budget"], r["parameters"], r.get("seed", 0))
    ):
        tag = " (held-out)" if r["heldout"] else ""
        out.append(
            f"| {r['budget']:.3g}{tag} | {r['n_layer']} × {r['n_embd']} | {r['parameters']:,} | "
            f"{r['non_embedding_parameters']:,} | {r['tokens']:,} | "
            f"{r['tokens'] / r['parameters']:.1f} | "
            f"{r['steps']:,} × {r['batch_size']} | {r['lr']:.3g} | {r.get('seed', 0)} | "
            f"{r['loss']:.4f} | {r['seconds']:.0f} s |"
        )
    which = ""
    if s.schedule == "wsd":
        which = " (the branches: the trunks are counted above)"
    out.append(
        f"\n{len(records)} runs{which}, {sum(r['seconds'] for r in records):,.0f} run-seconds. "
        "From scratch, "
        f"{s.workers} at a time as the sweep orders them (the grid, its second seeds, the held-out "
        "budget; "
        f"longest first), these times take {wall_seconds(s, records) / 60:.0f} min; the estimate "
        f"printed before the first run is {planned_hours(s) * 60:.0f} min."
    )

    minima = isoflop_minima(grid)
    found = {round(m[0], -3) for m in minima}
    inside = [b for b in budgets if round(b, -3) in found]
    out += [
        "",
        "## IsoFLOP minima (Approach 2, step 1)",
        "",
        "| budget C | sizes | N* (parabola vertex) | D* = C/6N* | D*/N* | loss at N* |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for budget, n_star, coef in minima:
        out.append(
            f"| {budget:.3g} | {sum(abs(math.log(r.budget / budget)) < 0.01 for r in grid)} | "
            f"{n_star:,.0f} | "
            f"{budget / (6 * n_star):,.0f} | {budget / (6 * n_star * n_star):.1f} | "
            f"{np.polyval(coef, math.log(n_star)):.4f} |"
        )
    out.append(
        f"\n{len(inside)} of {len(budgets)} budgets have their minimum inside the sizes tried"
        + (
            "."
            if len(inside) == len(budgets)
            else f" (missing: {', '.join(f'{b:.3g}' for b in budgets if b not in inside)})."
        )
    )

    report = result.report
    parts, gap = _agreement(report)
    out += [
        "",
        "## The three approaches on the same runs",
        "",
        fit_markdown(report),
        "",
        f"Agreement: {'; '.join(parts)}"
        + (f"; largest gap {gap:.3f} (target ≤ 0.1)." if gap is not None else "."),
    ]
    if result.non_embedding_report is not None:
        ne_parts, _ = _agreement(result.non_embedding_report)
        out.append(f"With Kaplan's non-embedding N instead: {'; '.join(ne_parts)}.")
    out += [
        "",
        "![loss against compute, IsoFLOP curves and "
        f"N_opt]({result.plot.name if result.plot else 'scaling.png'})",
    ]

    out += ["", "## Prediction of the held-out budget", ""] + prediction_lines(
        result.prediction, records, budgets
    )
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------------------------
# 2. The dedup effect: a few documents repeated many times (as web crawls repeat boilerplate pages),
#    measured.
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DedupEffectSettings:
    """`repeated_share` of the train documents each get `repeats` near-copies (2-5% of words edited,
    so exact dedup misses them): 1% of documents × 50 copies is about a third of the tokens. The
    held-out documents are cut off first, so no copy of them exists anywhere. The same model trains
    the same number of tokens on the corpus with the copies and on dedup.py's cleaned version, with
    `seeds` seeds each (init and data order), so the effect is compared with the seed-to-seed
    spread."""

    source: str = "pydocs"
    # see docs/scaling-sweep.md: 2 × 32 lands on seed-dependent plateaus at 488 steps
    shape: Shape = Shape(1, 32)
    vocab_size: int = 512
    tokens: int = 500_000
    batch_size: int = 8
    block_size: int = 128
    lr_at_64: float = 3e-3
    repeated_share: float = 0.01
    repeats: int = 50
    held_out_fraction: float = 0.1
    threshold: float = 0.5
    seeds: int = 3
    workers: int = 2
    threads: int = 1
    max_documents: int | None = None  # read only the first documents of the source (quick runs)


QUICK_DEDUP = DedupEffectSettings(
    shape=Shape(1, 16),
    tokens=4096,
    batch_size=4,
    block_size=64,
    repeated_share=0.02,
    repeats=5,
    seeds=2,
    max_documents=150,
)


def _write_if_changed(path: pathlib.Path, text: str) -> pathlib.Path:
    """Rewrite a file only when its content changes: data.py's cache keys on size and mtime, so an
    unchanged corpus file keeps its prepared dataset."""
    if not (path.is_file() and path.read_text(encoding="utf-8") == text):
        _write_text(path, text)
    return path


def repeat_documents(
    documents: list[str], share: float, repeats: int, seed: int = 0
) -> tuple[list[str], list[int]]:
    """documents + `repeats` near-copies of each of round(share · len) randomly chosen documents (at
    least 1). Returns the corpus and the chosen indices.

    >>> corpus, chosen = repeat_documents([f"doc {i} " + "word " * 20 for i in range(10)], 0.1, 3)
    >>> len(corpus), chosen
    (13, [6])
    """
    import random

    from machinery import dedup_experiment

    rng = random.Random(seed)
    vocabulary = sorted({w for doc in documents for w in doc.split()})
    chosen = sorted(rng.sample(range(len(documents)), max(1, round(share * len(documents)))))
    copies = [
        dedup_experiment.make_near_copy(documents[i], rng, rng.uniform(0.02, 0.05), vocabulary)
        for i in chosen
        for _ in range(repeats)
    ]
    return documents + copies, chosen


def dedup_effect(
    settings: DedupEffectSettings = DedupEffectSettings(),
    out_dir="out/dedup-effect",
    log=print,
    max_hours: float = MAX_HOURS,
) -> dict:
    """Build both corpora, prepare them with one tokenizer (data.py), train the same model for the
    same tokens on each with several seeds (train.py), score every run on the same held-out
    documents (evaluate.py)."""
    s = settings
    unit_fraction("repeated share", s.repeated_share)
    unit_fraction("held-out fraction", s.held_out_fraction)
    if s.seeds < 2:
        raise ScalingError(
            "settings.seeds must be at least 2: the seed-to-seed spread is the yardstick"
        )
    trainer, planned = _dedup_effect_plan(s)
    hours = (
        estimate_seconds(dataclasses.replace(trainer, workers=s.workers), [planned] * (2 * s.seeds))
        / 3600
    )
    if hours > max_hours:
        raise ScalingError(
            f"{2 * s.seeds} runs of {planned.tokens:,} tokens would take {about(hours)} on this "
            f"CPU: lower settings.tokens, or pass max_hours {math.ceil(hours * 1.5)} to run them "
            "anyway"
        )
    # a failed experiment leaves no half-made folder (an old one stays)
    with output_folder(out_dir) as out:
        return _dedup_effect_in(s, trainer, planned, out, log)


def _dedup_effect_plan(s: DedupEffectSettings) -> tuple[SweepSettings, PlannedRun]:
    """The trainer settings and the one run every (corpus, seed) trains: the same model, tokens and
    schedule."""
    trainer = SweepSettings(
        batch_sizes=(s.batch_size,),
        block_size=s.block_size,
        lr_at_64=s.lr_at_64,
        eval_windows=s.batch_size,
        threads=s.threads,
    )
    n, _ = s.shape.counts(s.vocab_size)
    return trainer, plan_run(6.0 * n * s.tokens, s.shape, trainer)


def _dedup_effect_in(
    s: DedupEffectSettings, trainer: SweepSettings, planned: PlannedRun, out: pathlib.Path, log
) -> dict:
    import concurrent.futures

    import data as data_lib
    import dedup as dedup_lib
    import evaluate as evaluate_lib
    from machinery import cleaning, data_at_scale, formats

    # The source through data.py's funnel (quality filters, exact dedup) but without near-dedup:
    # that is ours.
    source = formats.open_source(s.source, max_documents=s.max_documents)
    docs, _, _ = cleaning.clean([source], data_lib.CleanSettings(near_dup_threshold=0))
    order = np.random.default_rng(0).permutation(len(docs))
    n_held = max(1, round(s.held_out_fraction * len(docs)))
    held = [docs[i] for i in sorted(order[:n_held])]
    train_docs = [docs[i] for i in sorted(order[n_held:])]
    with_dups, chosen = repeat_documents(train_docs, s.repeated_share, s.repeats)
    kept = dedup_lib.dedup(with_dups, threshold=s.threshold)
    deduped = [with_dups[i] for i in kept]
    copies_left = sum(i >= len(train_docs) for i in kept)
    originals_dropped = sum(i not in set(kept) for i in range(len(train_docs)))
    n_copies = len(with_dups) - len(train_docs)
    log(
        f"{len(train_docs)} train documents + {len(chosen)} × {s.repeats} near-copies = "
        f"{len(with_dups)}; dedup.py "
        f"kept {len(deduped)} ({n_copies - copies_left} copies removed, {originals_dropped} "
        f"originals dropped); {len(held)} held out"
    )

    corpora = {
        name: _write_if_changed(
            out / f"{name}.jsonl", "".join(json.dumps({"text": t}) + "\n" for t in texts)
        )
        for name, texts in (("deduplicated", deduped), ("with_duplicates", with_dups))
    }
    # already cleaned above
    keep_all = data_lib.CleanSettings(filters="none", near_dup_threshold=0)
    datasets = {
        "deduplicated": data_at_scale.prepare(
            [str(corpora["deduplicated"])],
            vocab_size=s.vocab_size,
            clean_settings=keep_all,
            val_fraction=0.02,
        )
    }
    datasets["with_duplicates"] = data_at_scale.prepare(
        [str(corpora["with_duplicates"])],
        clean_settings=keep_all,
        val_fraction=0.02,
        tokenizer=datasets["deduplicated"] / "tokenizer.json",
    )

    def one(job):
        name, seed = job
        run_dir = out / f"{name}-seed{seed}"
        run_dir.mkdir(parents=True, exist_ok=True)
        cmd = train_command(
            dataclasses.replace(trainer, seed=seed), planned, datasets[name], run_dir
        )
        _run_train(cmd, run_dir / "train.log", s.threads)
        model, tok, ckpt = evaluate_lib.load_model(run_dir, verify=checkpoints.verify_checksum)
        held_ids = evaluate_lib.held_out_from_documents("held-out", held, tok)
        scored = evaluate_lib.perplexity_report(model, held_ids, block_size=s.block_size)
        manifest = fileio.read_json(
            datasets[name] / "manifest.json", ScalingError, "run the experiment again"
        )
        log(f"{name}, seed {seed}: held-out loss {scored['loss']:.4f}")
        return {
            "corpus": name,
            "seed": seed,
            "train_tokens": manifest["splits"]["train"]["tokens"],
            "tokens_trained": planned.tokens,
            "held_out_loss": scored["loss"],
            "held_out_bpb": scored["bits_per_byte"],
            "held_out_tokens": scored["tokens"],
        }

    jobs = [(name, seed) for seed in range(s.seeds) for name in ("with_duplicates", "deduplicated")]
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, s.workers)) as pool:
        rows = list(pool.map(one, jobs))
    result = {
        "settings": {**dataclasses.asdict(s), "shape": s.shape.name},
        "train_documents": len(train_docs),
        "repeated_documents": len(chosen),
        "copies": n_copies,
        "copies_removed": n_copies - copies_left,
        "originals_dropped": originals_dropped,
        "held_out_documents": len(held),
        "documents": {"with_duplicates": len(with_dups), "deduplicated": len(deduped)},
        "parameters": planned.params,
        "lr": planned.lr,
        "rows": rows,
    }
    _write_text(out / "result.json", json.dumps(result, indent=1))
    _write_text(out / "REPORT.md", dedup_effect_report(result))
    return result


def dedup_effect_summary(rows: Sequence[dict]) -> dict:
    """Mean and sample standard deviation of the held-out loss per corpus, the effect (with -
    without) and the effect in seed standard deviations (the larger of the two corpora's spreads).

    >>> losses = {"with_duplicates": (3.0, 3.2), "deduplicated": (2.5, 2.7)}
    >>> rows = [{"corpus": c, "held_out_loss": x} for c, xs in losses.items() for x in xs]
    >>> r = dedup_effect_summary(rows)
    >>> round(r["effect"], 3), round(r["seed_sd"], 3), round(r["sigmas"], 1)
    (0.5, 0.141, 3.5)
    """
    by = {
        c: np.array([r["held_out_loss"] for r in rows if r["corpus"] == c])
        for c in ("with_duplicates", "deduplicated")
    }
    sd = {c: float(np.std(v, ddof=1)) for c, v in by.items()}
    effect = float(by["with_duplicates"].mean() - by["deduplicated"].mean())
    worst = max(sd.values())
    return {
        "mean": {c: float(v.mean()) for c, v in by.items()},
        "sd": sd,
        "effect": effect,
        "seed_sd": worst,
        "sigmas": effect / worst if worst > 0 else math.inf,
    }


def dedup_effect_report(result: dict) -> str:
    """The per-seed table, the effect against the seed spread, and what it means, written from the
    numbers."""
    s, rows = result["settings"], result["rows"]
    summary = dedup_effect_summary(rows)
    trained = rows[0]["tokens_trained"]
    out = [
        f"# Dedup effect: {s['shape']} ({result['parameters']:,} parameters) on `{s['source']}`, "
        f"{trained:,} tokens per run, {s['seeds']} seeds per corpus",
        "",
        f"{result['repeated_documents']} of {result['train_documents']} train documents "
        f"({result['repeated_documents'] / result['train_documents']:.1%}) were each repeated "
        f"{s['repeats']} "
        "times as near-copies (2-5% of words edited, so exact hashing misses them). dedup.py "
        "(MinHash + LSH, "
        f"Jaccard ≥ {s['threshold']}) removed {result['copies_removed']} of the {result['copies']} "
        f"copies and {result['originals_dropped']} originals. Every run is scored on the same "
        f"{result['held_out_documents']} held-out documents, cut before the copies were made (none "
        "of them is "
        f"repeated anywhere). Same model, learning rate {result['lr']:.3g}, tokens and tokenizer "
        "for all.",
        "",
        "| training corpus | seed | train tokens | epochs read | held-out loss | held-out "
        "bits/byte |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in sorted(rows, key=lambda r: (r["corpus"], r["seed"])):
        out.append(
            f"| {r['corpus'].replace('_', ' ')} | {r['seed']} | {r['train_tokens']:,} | "
            f"{r['tokens_trained'] / r['train_tokens']:.2f} | {r['held_out_loss']:.4f} | "
            f"{r['held_out_bpb']:.4f} |"
        )
    m, sd = summary["mean"], summary["sd"]
    dup_tokens = {r["corpus"]: r["train_tokens"] for r in rows}
    share = 1 - dup_tokens["deduplicated"] / dup_tokens["with_duplicates"]
    out += [
        "",
        f"Mean held-out loss: with duplicates {m['with_duplicates']:.4f} ± "
        f"{sd['with_duplicates']:.4f}, "
        f"deduplicated {m['deduplicated']:.4f} ± {sd['deduplicated']:.4f} (± one seed standard "
        "deviation). "
        f"**Effect of the duplicates: {summary['effect']:+.4f} nats = {summary['sigmas']:.1f} seed "
        "standard deviations.**",
        "",
    ]
    if summary["sigmas"] > 3:
        out.append(
            f"Deduplication helped beyond the seed noise. The copies are {share:.0%} of the "
            "training tokens, so "
            "the run with them read that much less distinct text in the same budget, and spent "
            "the rest "
            f"memorising {result['repeated_documents']} documents that say nothing about the "
            "held-out ones."
        )
    elif summary["sigmas"] < -3:
        out.append(
            "The run with duplicates scored better, beyond the seed spread. Duplicates add no "
            "information, "
            "so look for a confound: the repeated documents may resemble the held-out text."
        )
    else:
        out.append(
            f"No effect beyond 3 seed standard deviations: with {share:.0%} of the tokens "
            f"duplicated, the difference is within the run-to-run noise at this budget."
        )
    return "\n".join(out) + "\n"
