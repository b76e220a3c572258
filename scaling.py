"""Scaling laws: plan a pretraining run before touching a GPU, then fit the laws to your own runs.

A 1,000-GPU run is planned on paper first. This file is that paper, in the order of the lecture.

1. Compute. Training costs C ≈ 6·N·D FLOPs (N parameters, D tokens): a forward pass is one multiply
   and one add per parameter per token (2 FLOPs), the backward pass twice that (4 FLOPs).

2. The worked budget.  You have C = 1.2e20 FLOPs.  Chinchilla's rule of thumb is D ≈ 20·N, so
       C = 6·N·(20·N) = 120·N²  =>  N = sqrt(C / 120) = sqrt(1e18) = 1e9,  D = 20·N = 2e10 tokens.
   At 5e5 tokens per step that is 2e10 / 5e5 = 40,000 steps. A GPU that really does 2e14 FLOP/s
   needs 1.2e20 / 2e14 = 6e5 s ≈ 167 hours; 8 of them ≈ 21 hours (before communication overhead).
   Same rule: 1e18 FLOPs -> N ≈ 9.1e7, D ≈ 1.8e9; 1.2e21 -> N ≈ 3.2e9, D ≈ 6.3e10.
   (`python scaling.py budget 1.2e20` prints this line by line.)

3. The Chinchilla law (Hoffmann et al. 2022, Approach 3) predicts the loss of any (N, D):
       L(N, D) = E + A / N^α + B / D^β,    E = 1.69, A = 406.4, B = 410.7, α = 0.34, β = 0.28.
   E is the entropy of text itself, A/N^α the price of a too-small model, B/D^β the price of too
   little data. Along the IsoFLOP line 6·N·D = 1.2e20 it is a U:
       N      1e8     2.5e8   1e9     2.5e9   1e10
       D/N    2000    320     20      3.2     0.2
       L      2.75    2.62    2.58    2.64    2.87
   Setting dL/dN = 0 along D = C/(6N) gives the optimum in closed form,
       N_opt = G·(C/6)^(β/(α+β)),  D_opt = G⁻¹·(C/6)^(α/(α+β)),  G = (α·A / (β·B))^(1/(α+β)),
   here N_opt ≈ 7e8 at about 40 tokens per parameter; the optimal loss falls 2.95 -> 2.57 -> 2.31 at
   1.2e19 -> 1.2e20 -> 1.2e21 FLOPs. The bottom is flat (2.5e8 .. 2.5e9 all within 2.58-2.64), which
   is why "20 tokens per parameter" is a good start, not an exact answer. Besiroglu et al. (2024)
   refitted the same form to data read off the paper's plots and got E = 1.8172, A = 482.01,
   B = 2085.43, α = 0.3478, β = 0.3658: N and D then grow at nearly equal rates (0.51 / 0.49),
   agreeing with the paper's Approaches 1 and 2.

4. Kaplan et al. (2020) fitted separate power laws, L ∝ N^-0.076, D^-0.095, C^-0.050, and advised
   growing the model as C^0.73 (Chinchilla: about C^0.5); one reason is that they did not shorten
   the cosine schedule for short runs, so small-data runs looked worse than they were. Real models
   against 20:1: GPT-3 trained 1.7 tokens per parameter (under-trained), Chinchilla 20, Llama 3 8B
   1,875 (over-trained on purpose: serving costs 2N per token, so a smaller model trained longer is
   cheaper for life). A dense 1T-parameter model at D = 20N costs 1.2e26 FLOPs = 8.4e7 H100-hours at
   40% MFU (351 days on 10,000 GPUs); a mixture of experts pays compute only for its active
   parameters, which is why models that large are MoE.

5. Memory. Mixed-precision AdamW keeps 16 bytes per parameter: bf16 weights (2) and grads (2), fp32
   master weights (4) and two fp32 moments (4 + 4). 7e9 parameters = 112 GB. ZeRO shards it over W
   GPUs: stage 1 the 12 optimizer bytes (2 + 2 + 12/8 = 5.5 B/param = 38.5 GB on 8 GPUs), stage 2
   also the gradients (2 + 14/8 = 3.75 B = 26.25 GB), stage 3 also the weights (16/8 = 2 B = 14 GB;
   28 GB on 4 GPUs). A pipeline of p stages fed m micro-batches idles a fraction (p-1)/(m+p-1) of
   the time: p=4, m=16 -> 16%.

6. Fitting your own runs (the three approaches of Hoffmann et al.): Approach 1 takes the lowest loss
   at each compute and fits N_opt ∝ C^a; Approach 2 fits a parabola in log N per IsoFLOP budget and
   fits its minima; Approach 3 fits E, A, B, α, β with a Huber loss on log L from a grid of starts.

7. The sweep (`python scaling.py sweep`, in sweep.py) does 6 the Chinchilla way on a CPU: 4 budgets,
   5 sizes around sqrt(C/120) each, every point trained through train.py to the end of its own
   cosine schedule; the law fitted on them predicts a budget 3× the largest, which is then trained
   and compared. `dedup-effect` (also in sweep.py) measures what dedup.py buys.

Depends on numpy, the standard library and fileio.py (reading runs files); torch only for the
Approach 3 fit (L-BFGS), matplotlib only to draw a PNG. The calculator and the fitting work in a
copy of this file and fileio.py. build_parser() imports cli.py (the shared parser and argparse
types).

The experiments that train models live in sweep.py; only main() imports it, to add their
subcommands.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import pathlib
import sys
from typing import NamedTuple, Sequence

import numpy as np

from machinery import fileio
ROOT = pathlib.Path(__file__).resolve().parent


class ScalingError(ValueError):
    """A bad input, reported as one line (exit code 2 from the CLI)."""


_LOG_FLOAT_MAX = math.log(np.finfo(float).max) - 1   # ≈ 708.8: e^this still fits in a float64


def positive(name: str, value) -> float:
    """Return value as a finite float > 0, else raise ScalingError naming the argument.

    >>> positive("budget", "1.2e20")
    1.2e+20
    """
    try:
        # true is not 1 parameter; 10**400, an int JSON allows, overflows float
        x = math.nan if isinstance(value, bool) else float(value)
    except (TypeError, ValueError, OverflowError):
        raise ScalingError(
            f"{name} must be a positive number like 1.2e20, got {value!r:.40}"
        ) from None
    if not math.isfinite(x) or x <= 0:
        raise ScalingError(f"{name} must be a positive finite number, got {value!r}")
    return x


def unit_fraction(name: str, value) -> float:
    """A number in (0, 1], e.g. the model FLOPs utilisation (MFU)."""
    x = positive(name, value)
    if x > 1:
        raise ScalingError(
            f"{name} must be in (0, 1] (a fraction of peak, e.g. 0.4), got {value!r}"
        )
    return x


# --------------------------------------------------------------------------------------------------
# 1. Hardware: the peaks a budget divides by.
# --------------------------------------------------------------------------------------------------

class GPU(NamedTuple):
    name: str
    bf16_flops: float   # dense bf16 tensor-core peak, FLOP/s (no 2:4 sparsity)
    memory_gb: float    # HBM capacity, GB


# NVIDIA datasheet peaks for the SXM parts. Real training reaches 35-45% of this on big clusters
# (the MFU).
GPUS = {
    "A100": GPU("A100 SXM 80GB", 312e12, 80),
    "H100": GPU("H100 SXM", 989e12, 80),
    "H200": GPU("H200 SXM", 989e12, 141),   # same compute die as the H100, more and faster memory
}

# the lecture's "a GPU really does 2e14 FLOP/s" (an A100 at 64%, an H100 at 20%)
LECTURE_ACHIEVED_FLOPS = 2e14


def training_flops(n_params: float, n_tokens: float) -> float:
    """C ≈ 6·N·D: 2 FLOPs per parameter per token forward, 4 backward.

    >>> training_flops(1e9, 2e10)
    1.2e+20
    """
    return 6.0 * positive("parameters", n_params) * positive("tokens", n_tokens)


# --------------------------------------------------------------------------------------------------
# 2. The budget: from FLOPs to N, D, steps and GPU time.
# --------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Budget:
    """A planned run. Times are in seconds; `seconds` is wall time on `gpus` GPUs at `mfu` of
    `flops_per_gpu`."""
    compute: float
    tokens_per_param: float
    params: float
    tokens: float
    tokens_per_step: float
    steps: float
    flops_per_gpu: float
    mfu: float
    gpus: int
    seconds_one_gpu: float
    seconds: float

    @property
    def achieved_flops(self) -> float:
        return self.flops_per_gpu * self.mfu

    @property
    def gpu_hours(self) -> float:
        return self.seconds_one_gpu / 3600


def params_for_budget(compute: float, tokens_per_param: float = 20.0) -> float:
    """N from C = 6·N·(r·N) = 6r·N², i.e. N = sqrt(C / 6r).

    >>> params_for_budget(1.2e20)      # sqrt(1.2e20 / 120) = sqrt(1e18)
    1000000000.0
    """
    c = positive("compute budget", compute)
    r = positive("tokens per parameter", tokens_per_param)
    return math.sqrt(c / (6.0 * r))


def plan_budget(
    compute: float,
    tokens_per_param: float = 20.0,
    tokens_per_step: float = 5e5,
    flops_per_gpu: float = LECTURE_ACHIEVED_FLOPS,
    mfu: float = 1.0,
    gpus: int = 8,
) -> Budget:
    """The lecture's planning chain for one budget.

    >>> b = plan_budget(1.2e20)
    >>> b.params, b.tokens, b.steps, round(b.seconds_one_gpu / 3600), round(b.seconds / 3600)
    (1000000000.0, 20000000000.0, 40000.0, 167, 21)
    """
    c = positive("compute budget", compute)
    n = params_for_budget(c, tokens_per_param)
    d = tokens_per_param * n
    # the arithmetic still works, but on fractions of a parameter or of a token
    if n < 1 or d < 1:
        raise ScalingError(
            f"C = {c:.3g} FLOPs at {tokens_per_param:g} tokens per parameter gives N = {n:.3g} "
            f"parameters and D = {d:.3g} tokens, less than one: raise the budget or move "
            f"--tokens-per-param toward 20"
        )
    per_step = positive("tokens per step", tokens_per_step)
    if per_step > d:
        raise ScalingError(
            f"one step of {per_step:.3g} tokens is more than the whole run's D = {d:.3g} tokens: "
            f"lower --tokens-per-step or raise the budget"
        )
    flops = positive("FLOP/s per GPU", flops_per_gpu)
    u = unit_fraction("MFU", mfu)
    g = int(positive("number of GPUs", gpus))
    one_gpu = c / (flops * u)
    return Budget(
        c, tokens_per_param, n, d, per_step, d / per_step, flops, u, g, one_gpu, one_gpu / g
    )


def _hours(seconds: float) -> str:
    """6e5 -> '167 h (6.9 days)'; 7.5e4 -> '21 h'; 625 -> '10 min'."""
    h = seconds / 3600
    if h >= 48:
        return f"{h:,.0f} h ({h / 24:,.1f} days)"
    if h >= 1:
        return f"{h:,.0f} h"
    return f"{seconds / 60:.0f} min"


def budget_report(b: Budget) -> str:
    """The budget printed line by line, each with its formula (what `scaling.py budget` shows)."""
    r = b.tokens_per_param
    law = compute_optimal(b.compute)
    lines = [
        f"Budget C = {b.compute:.3g} FLOPs, rule D = {r:g}·N tokens",
        f"1. size:  C = 6·N·D and D = {r:g}·N  =>  C = {6 * r:g}·N²  =>  N = sqrt(C / {6 * r:g}) "
        f"= sqrt({b.compute / (6 * r):.3g}) = {b.params:.3g} parameters",
        f"          D = {r:g}·N = {b.tokens:.3g} tokens;  check 6 × {b.params:.3g} × "
        f"{b.tokens:.3g} "
        f"= {6 * b.params * b.tokens:.3g}",
        f"2. data:  {b.tokens:.3g} clean, deduplicated tokens (raw web keeps a small fraction "
        "after filtering "
        f"and dedup, so start from several times more)",
        f"3. steps: D / tokens per step = {b.tokens:.3g} / {b.tokens_per_step:.3g} = "
        f"{b.steps:,.0f} steps",
        f"4. time:  C / achieved FLOP/s = {b.compute:.3g} / ({b.flops_per_gpu:.3g} × MFU "
        f"{b.mfu:g}) "
        f"= {b.seconds_one_gpu:.3g} s ≈ {_hours(b.seconds_one_gpu)} on 1 GPU",
        f"          on {b.gpus} GPUs: {b.seconds_one_gpu:.3g} / {b.gpus} = {b.seconds:.3g} s ≈ "
        f"{_hours(b.seconds)} "
        f"(before communication overhead); {b.gpu_hours:,.3g} GPU-hours",
        f"   (the Chinchilla law's own optimum at this budget: N ≈ {law.params:.2g}, D ≈ "
        f"{law.tokens:.2g}, "
        f"{law.tokens_per_param:.0f} tokens/param, predicted loss {law.loss:.2f}; see `isoflop`)",
    ]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# 3. The Chinchilla law, its compute-optimal allocation and the IsoFLOP table.
# --------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ChinchillaFit:
    """L(N, D) = E + A / N^alpha + B / D^beta (loss in nats per token)."""
    E: float
    A: float
    B: float
    alpha: float
    beta: float
    source: str = ""

    def loss(self, n, d):
        """Works on floats and numpy arrays alike."""
        n = np.asarray(n, dtype=float)
        d = np.asarray(d, dtype=float)
        out = self.E + self.A / n ** self.alpha + self.B / d ** self.beta
        return float(out) if out.ndim == 0 else out

    @property
    def a(self) -> float:
        """N_opt ∝ C^a with a = β / (α + β)."""
        return self.beta / (self.alpha + self.beta)

    @property
    def b(self) -> float:
        """D_opt ∝ C^b with b = α / (α + β)."""
        return self.alpha / (self.alpha + self.beta)

    def optimal_params(self, compute):
        """Closed form: N_opt = G·(C/6)^a with G = (αA / βB)^(1/(α+β))."""
        g = (self.alpha * self.A / (self.beta * self.B)) ** (1.0 / (self.alpha + self.beta))
        return g * (np.asarray(compute, dtype=float) / 6.0) ** self.a


FITS = {
    # Hoffmann et al. 2022, eq. (10), the rounded constants printed in the paper (and in the
    # lecture).
    "hoffmann": ChinchillaFit(1.69, 406.4, 410.7, 0.34, 0.28, "Hoffmann et al. 2022, Approach 3"),
    # Besiroglu, Erdil, Barnett, You 2024, "Chinchilla Scaling: A replication attempt"
    # (arXiv:2404.10102), refit to 240 runs read off Hoffmann's Figure 4 (standard errors 0.03,
    # 124.58, 1293.23, 0.02, 0.02).
    "besiroglu": ChinchillaFit(
        1.8172, 482.01, 2085.43, 0.3478, 0.3658, "Besiroglu et al. 2024 replication"
    ),
}


def _get_fit(fit) -> ChinchillaFit:
    if isinstance(fit, ChinchillaFit):
        return fit
    if fit not in FITS:
        raise ScalingError(
            f"unknown fit {fit!r}: choose one of {', '.join(FITS)} (or pass a ChinchillaFit)"
        )
    return FITS[fit]


def chinchilla_loss(N, D, fit="hoffmann"):
    """Predicted loss of a model with N parameters trained on D tokens.

    1.69 + 406.4/10^(9·0.34) + 410.7/(2e10)^0.28 = 1.69 + 0.354 + 0.536:
    >>> round(chinchilla_loss(1e9, 2e10), 2)
    2.58
    """
    n = np.asarray(N, dtype=float)
    d = np.asarray(D, dtype=float)
    if not (np.all(np.isfinite(n)) and np.all(n > 0) and np.all(np.isfinite(d)) and np.all(d > 0)):
        raise ScalingError("parameters and tokens must be positive finite numbers")
    return _get_fit(fit).loss(n, d)


class Allocation(NamedTuple):
    """How to spend a compute budget: N parameters, D tokens, and the loss the law predicts for
    them."""
    compute: float
    params: float
    tokens: float
    loss: float

    @property
    def tokens_per_param(self) -> float:
        return self.tokens / self.params


def compute_optimal(C, tokens_per_param=None, fit="hoffmann") -> Allocation:
    """Split C between N and D.

    tokens_per_param=None minimises the fitted law (closed form); a number r fixes D = r·N (N =
    sqrt(C / 6r)).

    >>> a = compute_optimal(1.2e20); f"{a.params:.1e} {a.tokens_per_param:.0f} {a.loss:.2f}"
    '7.0e+08 41 2.57'
    >>> compute_optimal(1.2e20, tokens_per_param=20).params
    1000000000.0
    """
    c = positive("compute budget", C)
    law = _get_fit(fit)
    if tokens_per_param is None:
        return _on_isoflop(c, float(law.optimal_params(c)), law)
    return _on_isoflop(c, params_for_budget(c, tokens_per_param), law)


def _on_isoflop(c: float, n: float, law: ChinchillaFit) -> Allocation:
    """N parameters on the IsoFLOP line 6·N·D = C: D = C / 6N, and the loss the law predicts
    there."""
    d = c / (6.0 * n)
    return Allocation(c, n, d, law.loss(n, d))


LECTURE_SIZES = (1e8, 2.5e8, 1e9, 2.5e9, 1e10)


def isoflop_table(C, sizes: Sequence[float] = LECTURE_SIZES, fit="hoffmann") -> list[Allocation]:
    """One row per model size N on the IsoFLOP line 6·N·D = C: D = C/(6N) and the predicted loss.

    >>> [round(r.loss, 2) for r in isoflop_table(1.2e20)]
    [2.75, 2.62, 2.58, 2.64, 2.87]
    """
    c = positive("compute budget", C)
    law = _get_fit(fit)
    return [_on_isoflop(c, positive("model size", n), law) for n in sizes]


def isoflop_report(C, fit="hoffmann", sizes: Sequence[float] = LECTURE_SIZES) -> str:
    """The IsoFLOP table, its optimum, and the optimal loss a decade either side (`scaling.py
    isoflop`)."""
    law = _get_fit(fit)
    c = positive("compute budget", C)
    out = [f"IsoFLOP table at C = {c:.3g} FLOPs with {law.source}: "
           f"L = {law.E:g} + {law.A:g}/N^{law.alpha:g} + {law.B:g}/D^{law.beta:g}",
           "| parameters N | tokens D | tokens/param | predicted loss |", "|---:|---:|---:|---:|"]
    for r in isoflop_table(c, sizes, law):
        out.append(
            f"| {r.params:.3g} | {r.tokens:.3g} | {r.tokens_per_param:,.3g} | {r.loss:.2f} |"
        )
    best = compute_optimal(c, fit=law)
    out.append(
        f"| **optimum {best.params:.2g}** | {best.tokens:.2g} | {best.tokens_per_param:.0f} | "
        f"{best.loss:.2f} |"
    )
    out.append(f"Closed form: N_opt = G·(C/6)^{law.a:.3f}, D_opt ∝ C^{law.b:.3f}, "
               f"G = (αA/βB)^(1/(α+β)) = {float(law.optimal_params(6.0)):.4g}")
    optima = [compute_optimal(c * k, fit=law) for k in (0.1, 1.0, 10.0)]
    out.append(
        "Optimal loss: "
        + ", ".join(f"{o.loss:.2f} at {o.compute:.2g}" for o in optima)
        + "; the reducible part L - E shrinks "
        f"×{(optima[2].loss - law.E) / (optima[1].loss - law.E):.2f} per 10× compute"
    )
    return "\n".join(out)


# --------------------------------------------------------------------------------------------------
# 4. Kaplan et al. 2020: three separate power laws and a model that grows as C^0.73.
# --------------------------------------------------------------------------------------------------

PF_DAY = 1e15 * 86400   # 8.64e19 FLOPs, Kaplan's unit of compute

# Kaplan et al. 2020, Table 5 / eqs. (1.1)-(1.3), (6.1): WebText2, their BPE, non-embedding
# parameters, loss in nats.
KAPLAN = {"alpha_N": 0.076, "N_c": 8.8e13, "alpha_D": 0.095, "D_c": 5.4e13,
          "alpha_C": 0.050, "C_c_pf_days": 3.1e8, "N_opt_coef": 1.3e9, "N_opt_exp": 0.73}


def kaplan_loss_params(n_nonembedding):
    """L(N) = (N_c / N)^0.076: a converged model of N non-embedding parameters (data unlimited)."""
    return (KAPLAN["N_c"] / np.asarray(n_nonembedding, dtype=float)) ** KAPLAN["alpha_N"]


def kaplan_loss_data(tokens):
    """L(D) = (D_c / D)^0.095: a large model trained on D tokens with early stopping."""
    return (KAPLAN["D_c"] / np.asarray(tokens, dtype=float)) ** KAPLAN["alpha_D"]


def kaplan_loss_compute(flops):
    """L(C_min) = (C_c / C_min)^0.050 with C in PF-days, along the compute-efficient frontier."""
    return (KAPLAN["C_c_pf_days"] / (np.asarray(flops, dtype=float) / PF_DAY)) ** KAPLAN["alpha_C"]


def kaplan_optimal_params(flops):
    """N_opt = 1.3e9 · (C / PF-day)^0.73 non-embedding parameters.

    >>> f"{kaplan_optimal_params(PF_DAY):.2g}"
    '1.3e+09'
    """
    return KAPLAN["N_opt_coef"] * (np.asarray(flops, dtype=float) / PF_DAY) ** KAPLAN["N_opt_exp"]


def kaplan_report() -> str:
    """Kaplan's laws next to Chinchilla's allocation (`scaling.py kaplan`)."""
    k = KAPLAN
    out = [
        "Kaplan et al. 2020 (non-embedding parameters, loss in nats):",
        f"  L(N) = ({k['N_c']:.2g} / N)^{k['alpha_N']}    10× parameters -> loss × "
        f"{10 ** -k['alpha_N']:.3f}",
        f"  L(D) = ({k['D_c']:.2g} / D)^{k['alpha_D']}    10× tokens     -> loss × "
        f"{10 ** -k['alpha_D']:.3f}",
        f"  L(C) = ({k['C_c_pf_days']:.2g} PF-days / C)^{k['alpha_C']}  10× compute -> loss × "
        f"{10 ** -k['alpha_C']:.3f}",
        f"  N_opt = {k['N_opt_coef']:.2g} · (C / PF-day)^{k['N_opt_exp']}  (1 PF-day = "
        f"{PF_DAY:.3g} FLOPs)",
        "",
        f"Optimal model size by compute: Kaplan grows N as C^{k['N_opt_exp']}, Chinchilla as "
        f"C^{FITS['hoffmann'].a:.2f} (Hoffmann fit) ~ C^0.5",
        "| compute | Kaplan N_opt | Kaplan D = C/6N | Chinchilla N_opt | Chinchilla D |",
        "|---:|---:|---:|---:|---:|",
    ]
    for c in (1e18, 1e20, 1e22, 1e24):
        kn = float(kaplan_optimal_params(c))
        ch = compute_optimal(c)
        out.append(
            f"| {c:.0e} | {kn:.2g} | {c / (6 * kn):.2g} | {ch.params:.2g} | {ch.tokens:.2g} |"
        )
    out.append(
        "Why they differ: Kaplan kept one learning-rate schedule length for all runs (short runs "
        "were "
        "under-credited), counted only non-embedding parameters, and fitted smaller models."
    )
    return "\n".join(out)


# --------------------------------------------------------------------------------------------------
# 5. Tokens per parameter for real models, and the 1T-parameter exercise.
# --------------------------------------------------------------------------------------------------

# (name, parameters, training tokens) as published.
REAL_MODELS = (
    ("GPT-3 175B (2020)", 175e9, 300e9),
    ("Gopher 280B (2021)", 280e9, 300e9),
    ("Chinchilla 70B (2022)", 70e9, 1.4e12),
    ("Llama 2 70B (2023)", 70e9, 2e12),
    ("Llama 3 8B (2024)", 8e9, 15e12),
)


def tokens_per_param_verdict(params: float, tokens: float) -> str:
    """Read D/N against Chinchilla's 20:1.

    >>> tokens_per_param_verdict(175e9, 300e9)
    'under-trained (1.7:1, far below 20:1)'
    >>> tokens_per_param_verdict(8e9, 15e12)
    'inference-optimal: over-trained on purpose (1875:1)'
    """
    r = positive("tokens", tokens) / positive("parameters", params)
    if r < 10:
        return f"under-trained ({r:.2g}:1, far below 20:1)"
    if r <= 50:
        return f"compute-optimal range ({r:.0f}:1, near 20:1)"
    return f"inference-optimal: over-trained on purpose ({r:.0f}:1)"


def verdicts_report() -> str:
    out = ["| model | parameters | tokens | tokens/param | verdict |", "|---|---:|---:|---:|---|"]
    for name, n, d in REAL_MODELS:
        out.append(
            f"| {name} | {n:.3g} | {d:.3g} | {d / n:,.1f} | {tokens_per_param_verdict(n, d)} |"
        )
    out.append(
        "20:1 minimises training compute only; serving costs ~2N FLOPs per generated token, so a "
        "model that "
        "will serve trillions of tokens is made smaller and trained far longer."
    )
    return "\n".join(out)


def trillion_report(
    params: float = 1e12,
    tokens_per_param: float = 20.0,
    gpu: str = "H100",
    mfu: float = 0.4,
    active_fraction: float = 37 / 671,
) -> str:
    """The exercise: a dense 1T-parameter model at D = 20N on H100s at 40% MFU, and why MoE is
    attractive."""
    n = positive("parameters", params)
    d = positive("tokens per parameter", tokens_per_param) * n
    hw = GPUS[gpu]
    rate = hw.bf16_flops * unit_fraction("MFU", mfu)
    c = 6 * n * d
    gpu_seconds = c / rate
    out = [
        f"Dense {n:.3g} parameters, D = {tokens_per_param:g}·N = {d:.3g} tokens: C = 6·N·D = "
        f"{c:.3g} FLOPs",
        f"{hw.name} at {mfu:.0%} MFU = {rate:.3g} FLOP/s -> {gpu_seconds / 3600:.3g} GPU-hours "
        f"({gpu_seconds / 3600 / 24 / 365:,.0f} GPU-years)",
        "| GPUs | wall time |",
        "|---:|---:|",
    ]
    for g in (1_000, 10_000, 100_000):
        out.append(
            f"| {g:,} | {gpu_seconds / g / 86400:,.0f} days ({gpu_seconds / g / 86400 / 365:.2f} "
            "years) |"
        )
    need = gpu_seconds / (90 * 86400)
    state = training_memory(n).total
    out.append(
        f"Finishing in 90 days needs {need:,.0f} {gpu}s; the 16 B/param training state alone is "
        f"{state / 1e12:.0f} TB = {math.ceil(state / (hw.memory_gb * 1e9)):,} GPUs' memory with "
        "ZeRO-3."
    )
    active = n * unit_fraction("active fraction", active_fraction)
    c_moe = 6 * active * d
    out.append(
        f"MoE: compute counts only the active parameters. With DeepSeek-V3's ratio (37B of 671B = "
        f"{active_fraction:.1%}), {n:.3g} total = {active:.3g} active -> C = "
        f"6·{active:.3g}·{d:.3g} = "
        f"{c_moe:.3g} FLOPs, {c / c_moe:.0f}× less "
        f"({gpu_seconds * c_moe / c / 86400 / 10_000:,.0f} days on "
        f"10,000 GPUs); memory still holds all {n:.3g} parameters."
    )
    return "\n".join(out)


# --------------------------------------------------------------------------------------------------
# 6. Memory per GPU (ZeRO stages, activations) and the pipeline bubble.
# --------------------------------------------------------------------------------------------------

class Memory(NamedTuple):
    """Bytes of training state held by one GPU."""
    weights: float
    grads: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer


def training_memory(
    N, world_size=1, zero_stage=0, weight_bytes=2, grad_bytes=2, optimizer_bytes=12
) -> Memory:
    """Per-GPU bytes for mixed-precision AdamW: bf16 weights (2) + bf16 grads (2) + fp32 master and
    moments (12).

    ZeRO-1 shards the optimizer state over the world, ZeRO-2 also the gradients, ZeRO-3 also the
    weights.

    >>> [round(training_memory(7e9, 8, s).total / 1e9, 2) for s in (0, 1, 2, 3)]
    [112.0, 38.5, 26.25, 14.0]

    This project's code holds the same 16 bytes split as 4 + 4 + 8: train.py keeps fp32 weights and
    gradients (autocast casts to bf16 per matmul, transiently), and parallel.py's ZeRO-3 in bf16
    keeps fp32 master shards and fp32 shard gradients, gathering one unit at a time in bf16. So
    `training_memory(N, w, s, 4, 4, 8)` is what it holds between steps (tests/test_parallel.py
    measures it), and bench/bench_gpu.py compares it with a GPU.
    >>> training_memory(124e6, 8, 3, 4, 4, 8).total == training_memory(124e6, 8, 3).total
    True
    """
    n = positive("parameters", N)
    w = int(positive("world size", world_size))
    if zero_stage not in (0, 1, 2, 3):
        raise ScalingError(f"ZeRO stage must be 0, 1, 2 or 3, got {zero_stage!r}")
    return Memory(weight_bytes * n / (w if zero_stage >= 3 else 1),
                  grad_bytes * n / (w if zero_stage >= 2 else 1),
                  optimizer_bytes * n / (w if zero_stage >= 1 else 1))


def activation_memory(n_layer: int, d_model: int, n_head: int, seq_len: int, micro_batch: int,
                      checkpointing: bool = False, flash_attention: bool = True) -> float:
    """Bytes of saved activations per GPU for one micro-batch (16-bit activations, no tensor
    parallelism).

    Korthikanti et al. 2022 count s·b·h·(34 + 5·a·s/h) bytes per layer: 34·s·b·h for the matmul
    inputs, norms, GELU and dropout masks, 5·a·s²·b for the attention scores, their softmax and
    dropout mask (gone with flash attention, which recomputes them). With full activation
    checkpointing only each layer's input (2·s·b·h bytes) is kept, plus one layer's full set while
    it is recomputed; the price is one extra forward (+33% compute).

    >>> round(activation_memory(24, 2048, 16, 1024, 8) / 1e9, 1)
    13.7
    >>> round(activation_memory(24, 2048, 16, 1024, 8, checkpointing=True) / 1e9, 2)
    1.38
    """
    s, b, h, a, layers = seq_len, micro_batch, d_model, n_head, n_layer
    for name, v in (
        ("n_layer", layers),
        ("d_model", h),
        ("n_head", a),
        ("seq_len", s),
        ("micro_batch", b),
    ):
        positive(name, v)
    per_layer = s * b * h * (34 + (0 if flash_attention else 5 * a * s / h))
    if checkpointing:
        return layers * 2 * s * b * h + per_layer
    return layers * per_layer


def pipeline_bubble(p, m) -> float:
    """Idle fraction of a p-stage pipeline fed m micro-batches (GPipe and 1F1B alike):
    (p-1)/(m+p-1).

    >>> round(pipeline_bubble(4, 16), 3)   # 3/19
    0.158
    """
    stages, micro = positive("pipeline stages", p), positive("micro-batches", m)
    for name, x in (("pipeline stages", stages), ("micro-batches", micro)):
        if x != int(x):
            raise ScalingError(f"{name} must be a whole number >= 1, got {x:g}")
    return (stages - 1) / (micro + stages - 1)


def memory_report(N: float, gpus: int = 8, gpu_memory_gb: float = 80.0) -> str:
    n = positive("parameters", N)
    out = [
        f"Training state for {n:.3g} parameters, mixed-precision AdamW (16 B/param = "
        f"{16 * n / 1e9:.4g} GB), "
        f"per GPU on {gpus} GPUs:",
        "| ZeRO stage | shards | bytes/param | GB per GPU | fits in " + f"{gpu_memory_gb:g} GB? |",
        "|---|---|---:|---:|---|",
    ]
    sharded = {
        0: "nothing (plain data parallel)",
        1: "optimizer state",
        2: "+ gradients",
        3: "+ weights",
    }
    for stage in (0, 1, 2, 3):
        m = training_memory(n, gpus, stage)
        out.append(f"| {stage} | {sharded[stage]} | {m.total / n:.4g} | {m.total / 1e9:.4g} | "
                   f"{'yes' if m.total / 1e9 < gpu_memory_gb else 'no'} (before activations) |")
    return "\n".join(out)


# --------------------------------------------------------------------------------------------------
# 7. Fitting laws to runs: the three approaches of Hoffmann et al. 2022.
# --------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Run:
    """One measured point: a model of `params` parameters after `tokens` tokens (compute = 6·N·D)
    had `loss`.

    `budget` groups IsoFLOP runs (the compute they were planned for); `series` names the training
    run a checkpoint belongs to (a loss curve)."""
    params: float
    tokens: float
    loss: float
    budget: float
    series: str = ""

    @property
    def compute(self) -> float:
        return 6.0 * self.params * self.tokens


_KEYS = {
    "params": ("parameters", "params", "N"),
    "tokens": ("tokens", "D"),
    "compute": ("compute", "compute_budget", "C", "flops"),
    "loss": ("loss", "final_loss", "val_loss"),
}


def _field(record: dict, what: str):
    for key in _KEYS[what]:
        if key in record and record[key] is not None:
            return record[key]
    return None


def run_from_record(record: dict, where: str = "record") -> Run:
    """Build a Run from {parameters, tokens or compute, loss}; accepts CS336's
    compute_budget/final_loss names.

    >>> run_from_record({"parameters": 1e9, "compute_budget": 1.2e20, "final_loss": 2.6}).tokens
    20000000000.0
    """
    if not isinstance(record, dict):
        raise ScalingError(
            f"{where}: expected a JSON object with parameters, tokens or compute, and loss"
        )
    n, d, c, loss = (_field(record, k) for k in ("params", "tokens", "compute", "loss"))
    missing = [name for name, v in (("parameters", n), ("loss", loss)) if v is None]
    if d is None and c is None:
        missing.append("tokens or compute")
    if missing:
        raise ScalingError(
            f"{where}: missing {', '.join(missing)} (need parameters, tokens or compute, and loss)"
        )
    try:
        n = positive("parameters", n)
        loss = positive("loss", loss)
        d = positive("tokens", d) if d is not None else positive("compute", c) / (6.0 * n)
        budget = positive("budget", record["budget"]) if record.get("budget") is not None else \
            positive("compute", c) if c is not None else 6.0 * n * d
    except ScalingError as e:
        raise ScalingError(f"{where}: {e}") from None
    for name, value in (("parameters", n), ("tokens", d), ("loss", loss), ("budget", budget)):
        # 1e300 tokens or a subnormal loss: no real run
        if not _RANGES[name][0] <= value <= _RANGES[name][1]:
            raise ScalingError(
                f"{where}: {name} {value:.3g} is outside {_RANGES[name]}, the range of a real "
                f"run; fix the record"
            )
    return Run(n, d, loss, budget, str(record.get("series", record.get("run", ""))))


# What a real run can hold: a fit's logs and powers stay finite inside these bounds (e^708 is
# float64's limit).
_RANGES = {
    "parameters": (1.0, 1e16),
    "tokens": (1.0, 1e20),
    "loss": (1e-6, 1e3),
    "budget": (1.0, 1e40),
}


def load_runs(path) -> list[Run]:
    """Read runs from a JSON list or a JSONL file (one object per line); errors name the line.

    The format: {"parameters": N, "tokens": D (or "compute": C), "loss": L, optional "budget": the
    IsoFLOP group, "series": a run name}. A record marked "heldout": true (a sweep's prediction
    check) is left out of the fit, and records of one point trained with several seeds become one
    run at their mean loss (mean_over_seeds).
    """
    p = pathlib.Path(path)
    if not p.is_file():
        raise ScalingError(f"runs file {str(p)!r} not found: give a JSON or JSONL file of runs")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ScalingError(
            f"cannot read runs file {str(p)!r} as UTF-8 text ({e.__class__.__name__}): "
            f"give a JSON or JSONL file of runs"
        ) from None
    fix = ("give a JSON list of runs, or JSONL: one {parameters, tokens or compute, loss} object "
           "per line")
    try:
        document = fileio.parse_json(text, str(p), ScalingError, fix)
    except ScalingError:
        # not one JSON value: JSONL (or damaged), judged line by line below
        document = None
    if isinstance(document, list):
        records = [(f"{p} record {i + 1}", r) for i, r in enumerate(document)]
    elif isinstance(document, dict) and any(
        _field(document, k) is not None for k in ("params", "loss")
    ):
        # one-line JSONL, too
        records = [(f"{p} line 1" if "\n" not in text.strip() else str(p), document)]
    elif document is not None:
        raise ScalingError(f"{p}: {_describe(document)}, not a list of runs: {fix}")
    else:
        records = [(f"{p} line {n}", fileio.parse_json(line, f"{p} line {n}", ScalingError, fix))
                   for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    runs = []
    for where, record in records:
        if isinstance(record, dict) and not isinstance(record.get("heldout", False), bool):
            raise ScalingError(
                f"{where}: heldout is {record['heldout']!r}, not true or false; fix the record"
            )
        if not (isinstance(record, dict) and record.get("heldout")):
            runs.append(run_from_record(record, where))
    return mean_over_seeds(runs)


def mean_over_seeds(runs: Sequence[Run]) -> list[Run]:
    """Runs of the same N, D and budget (one point trained again with another seed) as one run at
    their mean loss, in first-seen order: a point measured twice is measured better, not counted
    twice by a fit.

    >>> runs = [Run(1e5, 2e6, 2.5, 1e12), Run(2e5, 1e6, 2.9, 1e12), Run(1e5, 2e6, 3.5, 1e12)]
    >>> [r.loss for r in mean_over_seeds(runs)]
    [3.0, 2.9]
    """
    groups: dict[tuple, list[Run]] = {}
    for r in runs:
        groups.setdefault((r.params, r.tokens, r.budget), []).append(r)
    return [dataclasses.replace(g[0], loss=sum(r.loss for r in g) / len(g)) if len(g) > 1 else g[0]
            for g in groups.values()]


def _describe(value) -> str:
    """What a JSON value is, for an error: 'a JSON object with keys "runs", "meta" (its "runs" is a
    list)'.

    >>> _describe({"runs": [], "meta": 1})
    'a JSON object with keys "runs", "meta" (its "runs" is a list: give that list)'
    """
    if not isinstance(value, dict):
        return f"a JSON {type(value).__name__.replace('str', 'string').replace('NoneType', 'null')}"
    keys = ", ".join(f'"{k}"' for k in list(value)[:5]) + (", ..." if len(value) > 5 else "")
    lists = [k for k, v in value.items() if isinstance(v, list)]
    return (f"a JSON object with keys {keys}" if keys else "an empty JSON object") + \
        (f' (its "{lists[0]}" is a list: give that list)' if lists else "")


class AllocationLaw(NamedTuple):
    """N_opt(C) = coef · C^a and D_opt(C) = C / (6·N_opt) ∝ C^(1-a): what each approach
    estimates."""
    a: float
    coef: float

    @property
    def b(self) -> float:
        return 1.0 - self.a

    def params_at(self, compute):
        return self.coef * np.asarray(compute, dtype=float) ** self.a

    def tokens_at(self, compute):
        c = np.asarray(compute, dtype=float)
        return c / (6.0 * self.params_at(c))


def fit_line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least-squares slope and intercept of y = slope·x + intercept."""
    slope, intercept = np.polyfit(x, y, 1)
    return float(slope), float(intercept)


def _allocation_line(computes, params, approach: str) -> AllocationLaw:
    """Fit log N = a·log C + k. Optima at nearly equal computes can give a slope of thousands and a
    coefficient e^k beyond any float: that is no law, and is reported as one line instead of an
    OverflowError.

    >>> round(_allocation_line([1e18, 1e20], [1e8, 1e9], "Approach 1").a, 6)
    0.5
    """
    a, k = fit_line(np.log(computes), np.log(params))
    if not (math.isfinite(a) and abs(k) < _LOG_FLOAT_MAX):
        raise ScalingError(
            f"{approach}: the optima give N_opt ∝ C^{a:.3g}, a line no float can hold: their "
            "computes "
            f"({min(computes):.3g}-{max(computes):.3g}) are too close together; spread the budgets"
        )
    return AllocationLaw(a, math.exp(k))


def group_close(runs: Sequence[Run], key, rel: float = 0.01) -> dict[float, list[Run]]:
    """Group runs whose key (a compute) agrees within `rel` (float round-off makes 6·N·(C/6N) differ
    from C)."""
    groups: dict[float, list[Run]] = {}
    for r in sorted(runs, key=key):
        last = next(reversed(groups), None)
        if last is not None and abs(math.log(key(r) / last)) < rel:
            groups[last].append(r)
        else:
            groups[key(r)] = [r]
    return groups


def frontier(runs: Sequence[Run]) -> list[Run]:
    """The lowest loss at each compute (Approach 1): walking up in compute, keep a run when it beats
    every run that used less compute. Runs at the same compute compete first; only the best of them
    can enter.

    >>> rs = [Run(1, 1, 3.0, 6), Run(2, 1, 2.5, 12), Run(1, 3, 2.8, 18), Run(2, 2, 2.0, 24)]
    >>> [r.loss for r in frontier(rs)]
    [3.0, 2.5, 2.0]
    """
    best_so_far = math.inf
    out = []
    for group in group_close(runs, key=lambda r: r.compute).values():
        champion = min(group, key=lambda r: r.loss)
        if champion.loss < best_so_far:
            out.append(champion)
            best_so_far = champion.loss
    return out


def fit_approach1(runs: Sequence[Run]) -> AllocationLaw:
    """Approach 1: fit log N = a·log C + k through the frontier runs (the lowest loss at each
    compute)."""
    front = frontier(runs)
    if len({r.params for r in front}) < 2:
        raise ScalingError(
            f"Approach 1 needs a frontier that crosses at least 2 model sizes (got "
            f"{len({r.params for r in front})} from {len(runs)} runs): add sizes or longer runs"
        )
    return _allocation_line([r.compute for r in front], [r.params for r in front], "Approach 1")


def isoflop_minima(runs: Sequence[Run]) -> list[tuple[float, float, np.ndarray]]:
    """Approach 2, step 1: per IsoFLOP budget with ≥ 3 sizes, fit loss = c0 + c1·x + c2·x² (x = ln
    N) and take the vertex N* = exp(-c1 / 2c2). Returns [(budget, N*, coefficients)]; a budget whose
    parabola opens downwards, or whose vertex lies outside the sizes tried (an extrapolation), is
    skipped."""
    out = []
    for budget, group in group_close(runs, key=lambda r: r.budget).items():
        if len({r.params for r in group}) < 3:
            continue
        x = np.log([r.params for r in group])
        c2, c1, c0 = np.polyfit(x, [r.loss for r in group], 2)
        vertex = -c1 / (2 * c2) if c2 > 0 else math.nan
        if not x.min() <= vertex <= x.max():          # no U, or its bottom outside the sizes tried
            continue
        out.append((budget, math.exp(vertex), np.array([c2, c1, c0])))
    return out


def fit_approach2(runs: Sequence[Run]) -> AllocationLaw:
    """Approach 2: IsoFLOP parabola minima N*(C), then log N* = a·log C + k."""
    if not runs:
        raise ScalingError(
            "Approach 2 needs IsoFLOP runs (one compute, 3+ sizes); there are none (in a sweep: "
            "the "
            "curves of 3+ sizes never reach the same compute)"
        )
    minima = isoflop_minima(runs)
    if len(minima) < 2:
        raise ScalingError(
            f"Approach 2 needs at least 2 compute budgets with 3+ model sizes each and a U-shaped "
            f"loss with its minimum inside the sizes tried (got {len(minima)} usable of "
            f"{len(group_close(runs, key=lambda r: r.budget))} budgets)"
        )
    return _allocation_line([m[0] for m in minima], [m[1] for m in minima], "Approach 2")


# The grid of starting points Hoffmann et al. used (Appendix D.2): α, β ∈ {0, .5, .., 2},
# e ∈ {-1, -.5, .., 1}, a, b ∈ {0, 5, .., 25}, where A = e^a, B = e^b, E = e^e: 5·5·5·6·6 = 4,500
# starts.
GRID = (
    np.array(
        np.meshgrid(
            np.arange(0, 26, 5.0),
            np.arange(0, 26, 5.0),
            np.arange(-1, 1.01, 0.5),
            np.arange(0, 2.01, 0.5),
            np.arange(0, 2.01, 0.5),
            indexing="ij",
        )
    )
    .reshape(5, -1)
    .T
)


def _huber(r, delta):
    """Quadratic inside ±delta, linear outside: robust to outlier runs."""
    a = np.abs(r)
    return np.where(a <= delta, 0.5 * r * r, delta * (a - 0.5 * delta))


def _log_law(theta: np.ndarray, log_n: np.ndarray, log_d: np.ndarray) -> np.ndarray:
    """log L = logsumexp(a - α·log N, b - β·log D, e) for theta rows (a, b, e, α, β); shape (S,
    runs)."""
    a, b, e, alpha, beta = (theta[:, i:i + 1] for i in range(5))
    terms = np.stack(
        [a - alpha * log_n, b - beta * log_d, np.broadcast_to(e, (len(theta), len(log_n)))]
    )
    top = terms.max(axis=0)
    return top + np.log(np.exp(terms - top).sum(axis=0))


def fit_approach3(runs: Sequence[Run], delta: float = 1e-3, refine: int = 16,
                  starts: np.ndarray | None = None) -> ChinchillaFit:
    """Approach 3: minimise Σ Huber_δ(log L̂(N, D) - log L) over (a, b, e, α, β) with L-BFGS.

    Every grid start is scored at once (numpy); the `refine` best, plus any extra `starts`, are run
    to convergence with torch's L-BFGS in float64, and the lowest objective wins. The sum (not the
    mean) keeps the objective's scale, which Besiroglu et al. found made the original optimiser stop
    early.
    """
    if len(runs) < 5:
        raise ScalingError(
            f"Approach 3 fits 5 parameters (E, A, B, alpha, beta): give at least 5 runs, "
            f"got {len(runs)}"
        )
    if len({r.params for r in runs}) < 2 or len({r.tokens for r in runs}) < 2:
        raise ScalingError(
            "Approach 3 needs runs with at least 2 different sizes and 2 different token counts"
        )
    import torch   # only this fit needs it

    log_n = np.log([r.params for r in runs])
    log_d = np.log([r.tokens for r in runs])
    log_l = np.log([r.loss for r in runs])
    scores = _huber(_log_law(GRID, log_n, log_d) - log_l, delta).sum(axis=1)
    candidates = GRID[np.argsort(scores, kind="stable")[:refine]]
    if starts is not None:
        candidates = np.vstack([np.atleast_2d(starts), candidates])

    tn, td, tl = (torch.tensor(v, dtype=torch.float64) for v in (log_n, log_d, log_l))

    def objective(theta):
        a, b, e, alpha, beta = theta
        pred = torch.logsumexp(torch.stack([a - alpha * tn, b - beta * td, e.expand_as(tn)]), dim=0)
        return torch.nn.functional.huber_loss(pred, tl, reduction="sum", delta=delta)

    best_value, best_theta = math.inf, None
    for start in candidates:
        theta = torch.tensor(start, dtype=torch.float64, requires_grad=True)
        opt = torch.optim.LBFGS(
            [theta],
            lr=1.0,
            max_iter=500,
            tolerance_grad=1e-12,
            tolerance_change=1e-14,
            history_size=20,
            line_search_fn="strong_wolfe",
        )

        def closure():
            opt.zero_grad()
            value = objective(theta)
            value.backward()
            return value

        opt.step(closure)
        with torch.no_grad():
            value = float(objective(theta))
        found = theta.detach().numpy().copy()
        # A start can run off to A, B or E = e^800: a perfect fit of a too-narrow range of N or D
        # that no float can hold. Such a law predicts nothing outside the runs, so it does not
        # compete.
        if (
            math.isfinite(value)
            and value < best_value
            and np.all(np.abs(found[:3]) < _LOG_FLOAT_MAX)
        ):
            best_value, best_theta = value, found
    if best_theta is None:
        raise ScalingError(
            f"Approach 3 found no law with finite constants for these {len(runs)} runs (E, A or B "
            f"beyond 1e300): they span too little of N ({min(np.exp(log_n)):.3g}-"
            f"{max(np.exp(log_n)):.3g}) or D ({min(np.exp(log_d)):.3g}-{max(np.exp(log_d)):.3g}) "
            f"to pin five constants; add sizes or longer runs"
        )
    a, b, e, alpha, beta = best_theta
    return ChinchillaFit(
        math.exp(e), math.exp(a), math.exp(b), float(alpha), float(beta), "Approach 3 fit"
    )


def _law_from_fit(fit: ChinchillaFit) -> AllocationLaw:
    """The allocation a Chinchilla fit implies: N_opt = G·(C/6)^a = (G·6^-a)·C^a."""
    if not (fit.alpha > 0 and fit.beta > 0):
        raise ScalingError(
            f"Approach 3's law has alpha = {fit.alpha:.3g}, beta = {fit.beta:.3g}: the loss does "
            "not "
            f"fall with both N and D, so it implies no compute-optimal size"
        )
    return AllocationLaw(fit.a, float(fit.optimal_params(1.0)))


@dataclasses.dataclass
class FitReport:
    """What `fit_all` found: per approach the exponent a (N_opt ∝ C^a), N_opt and D_opt at the
    target compute, and bootstrap intervals (10th-90th percentile, as Hoffmann et al. report)."""
    target: float
    runs: int
    # approach name -> AllocationLaw, or the error message when it could not be fitted
    laws: dict
    chinchilla: ChinchillaFit | None
    intervals: dict       # approach name -> {"a": (lo, hi), "params": (lo, hi), "tokens": (lo, hi)}
    bootstrap: int

    def markdown(self) -> str:
        out = [
            f"Fitted on {self.runs} runs; target compute C = {self.target:.3g} FLOPs; intervals: "
            f"10th-90th percentile over {self.bootstrap} bootstrap resamples of the runs.",
            "",
            "| approach | a (N_opt ∝ C^a) | b (D_opt ∝ C^b) | N_opt | D_opt | tokens/param |",
            "|---|---|---|---|---|---:|",
        ]
        names = {
            "approach1": "1: frontier",
            "approach2": "2: IsoFLOP parabolas",
            "approach3": "3: parametric fit",
        }
        for key, law in self.laws.items():
            if isinstance(law, str):
                out.append(f"| {names[key]} | not fitted: {law} | | | | |")
                continue
            ci = self.intervals.get(key, {})

            def show(value, name, fmt):
                lo_hi = ci.get(name)
                return f"{value:{fmt}}" + (
                    f" [{lo_hi[0]:{fmt}}, {lo_hi[1]:{fmt}}]" if lo_hi else ""
                )

            n, d = float(law.params_at(self.target)), float(law.tokens_at(self.target))
            out.append(
                f"| {names[key]} | {show(law.a, 'a', '.3f')} | {1 - law.a:.3f} | "
                f"{show(n, 'params', '.3g')} | "
                f"{show(d, 'tokens', '.3g')} | {d / n:.3g} |"
            )
        if self.chinchilla is not None:
            f = self.chinchilla
            out.append(
                f"\nApproach 3 law: L = {f.E:.4g} + {f.A:.4g}/N^{f.alpha:.4f} + "
                f"{f.B:.4g}/D^{f.beta:.4f}"
            )
        return "\n".join(out)


def fit_all(runs: Sequence[Run], target_compute: float, bootstrap: int = 100, seed: int = 0,
            refine: int = 16) -> FitReport:
    """All three approaches on the same runs, each with bootstrap intervals (resample the runs with
    replacement, refit; a resample where an approach cannot be fitted is dropped for that
    approach)."""
    target = positive("target compute", target_compute)
    laws: dict = {}
    chinchilla = None
    fitters = {"approach1": fit_approach1, "approach2": fit_approach2}
    for key, fitter in fitters.items():
        try:
            laws[key] = fitter(runs)
        except ScalingError as e:
            laws[key] = str(e)
    try:
        chinchilla = fit_approach3(runs, refine=refine)
        laws["approach3"] = _law_from_fit(chinchilla)
        # Each resample starts from the full fit's constants: one L-BFGS run instead of `refine`
        # grid starts.
        theta0 = np.array([math.log(chinchilla.A), math.log(chinchilla.B), math.log(chinchilla.E),
                           chinchilla.alpha, chinchilla.beta])
        fitters["approach3"] = lambda rs: _law_from_fit(fit_approach3(rs, refine=0, starts=theta0))
    except ScalingError as e:
        laws["approach3"] = str(e)

    rng = np.random.default_rng(seed)
    samples: dict = {k: [] for k, v in laws.items() if not isinstance(v, str)}
    for _ in range(int(bootstrap)):
        resample = [runs[i] for i in rng.integers(0, len(runs), len(runs))]
        for key in samples:
            try:
                law = fitters[key](resample)
            except (ScalingError, np.linalg.LinAlgError, ValueError):
                continue
            samples[key].append((law.a, float(law.params_at(target)), float(law.tokens_at(target))))
    intervals = {}
    for key, rows in samples.items():
        if len(rows) >= 2:
            arr = np.array(rows)
            lo, hi = np.percentile(arr, 10, axis=0), np.percentile(arr, 90, axis=0)
            intervals[key] = {
                "a": (lo[0], hi[0]),
                "params": (lo[1], hi[1]),
                "tokens": (lo[2], hi[2]),
            }
    return FitReport(target, len(runs), laws, chinchilla, intervals, int(bootstrap))


def synthetic_isoflop_runs(
    fit="besiroglu",
    budgets=(1e18, 3e18, 1e19, 3e19, 1e20),
    sizes_per_budget: int = 9,
    noise: float = 0.01,
    seed: int = 0,
) -> list[Run]:
    """IsoFLOP runs drawn from a known law with multiplicative noise: the test a fitter must pass
    before its answers on real runs mean anything. Sizes span 1/8x .. 8x the law's optimum at each
    budget."""
    law = _get_fit(fit)
    rng = np.random.default_rng(seed)
    runs = []
    for c in budgets:
        centre = float(law.optimal_params(c))
        for n in centre * np.logspace(-math.log10(8), math.log10(8), sizes_per_budget):
            d = c / (6 * n)
            loss = law.loss(n, d) * math.exp(noise * rng.standard_normal())
            runs.append(Run(float(n), float(d), loss, float(c)))
    return runs



# --------------------------------------------------------------------------------------------------
# 8. Plots: the lecture's log-log picture.
# --------------------------------------------------------------------------------------------------

def save_png(fig, path) -> pathlib.Path:
    """Lay out, write and close a matplotlib figure, never leaving a half-written PNG
    (fileio.write_atomic)."""
    path = pathlib.Path(path)
    if path.is_dir():
        raise ScalingError(
            f"{str(path)!r} is a directory: give a file name for the plot, e.g. {path / 'fit.png'}"
        )
    fig.tight_layout()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return fileio.write_atomic(
            path,
            lambda f: fig.savefig(f, format="png", dpi=120),
            error=ScalingError,
            fix="choose another path for the plot",
        )
    except OSError as e:
        raise ScalingError(
            f"cannot write the plot {str(path)!r} ({e.strerror}); choose another path"
        ) from None
    finally:
        pyplot().close(fig)


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend (imported here: only the plots need
    matplotlib)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def draw_isoflop_curves(ax, runs: Sequence[Run]) -> None:
    """Loss against N per IsoFLOP budget, each budget's parabola in log N and its vertex (a
    star)."""
    for budget, group in group_close(runs, key=lambda r: r.budget).items():
        group = sorted(group, key=lambda r: r.params)
        (line,) = ax.plot(
            [r.params for r in group], [r.loss for r in group], "o", ms=4, label=f"C = {budget:.2g}"
        )
        for _, n_star, coef in isoflop_minima(group):
            x = np.linspace(math.log(group[0].params), math.log(group[-1].params), 100)
            ax.plot(np.exp(x), np.polyval(coef, x), "-", color=line.get_color(), lw=1)
            ax.plot(
                [n_star], [np.polyval(coef, math.log(n_star))], "*", color=line.get_color(), ms=10
            )
    ax.set_xlabel("parameters N")


def draw_allocations(ax, runs: Sequence[Run], laws: dict, computes: np.ndarray) -> None:
    """N_opt against compute: the points Approaches 1 and 2 fit, and each fitted law over
    `computes`."""
    front = frontier(runs)
    ax.plot(
        [r.compute for r in front],
        [r.params for r in front],
        "ks",
        ms=5,
        label="Approach 1: best run per C",
    )
    minima = isoflop_minima(runs)
    if minima:
        ax.plot(
            [m[0] for m in minima],
            [m[1] for m in minima],
            "r*",
            ms=9,
            label="Approach 2: IsoFLOP minima",
        )
    for key, style in (("approach1", "k--"), ("approach2", "r-"), ("approach3", "b:")):
        law = laws.get(key)
        if isinstance(law, AllocationLaw):
            ax.plot(computes, law.params_at(computes), style, label=f"{key}: N_opt ∝ C^{law.a:.2f}")
    ax.set_xlabel("compute C (FLOPs)")
    ax.set_ylabel("compute-optimal parameters N_opt")


def log_axes(ax, ylabel: str | None = None) -> None:
    """Log-log axes with a grid and a legend; with a ylabel (a loss axis), its ticks as plain
    numbers."""
    import matplotlib.ticker
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    if ylabel:
        ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.yaxis.set_minor_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_ylabel(ylabel)


def plot_runs(runs: Sequence[Run], report: FitReport, path) -> pathlib.Path:
    """Two log-log panels. Left: loss against N per IsoFLOP budget with its parabola and minimum.
    Right: the compute-optimal N against compute, the points each approach used and the three fitted
    lines."""
    fig, (left, right) = pyplot().subplots(1, 2, figsize=(13, 5))
    draw_isoflop_curves(left, runs)
    log_axes(left, "loss (nats/token)")
    computes = np.array([r.compute for r in runs])
    draw_allocations(
        right,
        runs,
        report.laws,
        np.logspace(math.log10(computes.min()), math.log10(max(computes.max(), report.target)), 50),
    )
    log_axes(right)
    return save_png(fig, path)


# --------------------------------------------------------------------------------------------------
# 10. The command line.
# --------------------------------------------------------------------------------------------------

# FLOPs, parameters, tokens: 1e30 is ~1e4 x the largest run to date, and products stay finite
NUMBER_MAX = 1e30

# What each quantity can sensibly be. Below the low end the chain prints fractions of a parameter, a
# token or a step (`budget 1e-300` would plan a 9e-152-parameter model); above the high end it
# describes nothing physical. Tokens per parameter: GPT-3 trained 1.7, Llama 3 8B 1,875; 1e-2 .. 1e6
# brackets anything anyone has trained.
QUANTITIES = {
    "compute": (1e6, NUMBER_MAX, "FLOPs", "1.2e20"),
    "parameters": (1.0, 1e15, "parameters", "7e9"),
    "tokens": (1.0, NUMBER_MAX, "tokens", "2e10"),
    "tokens per parameter": (1e-2, 1e6, "tokens per parameter", "20"),
    "tokens per step": (1.0, 1e12, "tokens per step", "5e5"),
    "FLOP/s": (1e9, 1e18, "FLOP/s", "2e14"),
    "GB": (1e-3, 1e6, "GB", "80"),
}


def _number(what: str):
    """argparse type for a quantity of QUANTITIES: '1.2e20' -> 1.2e20; outside its range, one line
    with the range.

    >>> _number("compute")("1e-300")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: must be 1e+06 to 1e+30 FLOPs, e.g. 1.2e20, got '1e-300'
    """
    from machinery.cli import in_range
    low, high, unit, example = QUANTITIES[what]
    return in_range(float, low, high, rule=f"{low:g} to {high:g} {unit}, e.g. {example}")


def _whole(text: str) -> float:
    """argparse type for counts (GPUs, layers, stages): a positive whole number, '8' or '1e3'."""
    try:
        x = positive("value", text)
    except ScalingError:
        x = math.nan
    if not x <= NUMBER_MAX or x != int(x):           # NaN fails the first test
        raise argparse.ArgumentTypeError(f"expected a whole number like 8, got {text!r}")
    return x


def hardware_report() -> str:
    out = ["| GPU | bf16 dense peak | memory | at 40% MFU |", "|---|---:|---:|---:|"]
    for key, g in GPUS.items():
        out.append(f"| {key} ({g.name}) | {g.bf16_flops / 1e12:.0f} TFLOP/s | {g.memory_gb:g} GB | "
                   f"{0.4 * g.bf16_flops:.3g} FLOP/s |")
    return "\n".join(out)


def _cmd_budget(args) -> str:
    # A datasheet peak is reached at ~40% MFU; the lecture's 2e14 is already what a GPU achieves.
    peak, mfu = (GPUS[args.gpu].bf16_flops, 0.4) if args.gpu else (LECTURE_ACHIEVED_FLOPS, 1.0)
    b = plan_budget(
        args.compute,
        args.tokens_per_param,
        args.tokens_per_step,
        args.flops_per_gpu or peak,
        mfu if args.mfu is None else args.mfu,
        int(args.gpus),
    )
    return budget_report(b)


def _cmd_memory(args) -> str:
    shape = dict(n_layer=int(args.layers), d_model=int(args.d_model), n_head=int(args.heads),
                 seq_len=int(args.seq_len), micro_batch=int(args.micro_batch))
    plain = activation_memory(**shape)
    ckpt = activation_memory(**shape, checkpointing=True)
    attn = activation_memory(**shape, flash_attention=False)
    return (
        f"{memory_report(args.params, int(args.gpus), args.gpu_memory)}\n"
        f"Activations per GPU for shape {shape} (Korthikanti et al. 2022, 16-bit): "
        f"{plain / 1e9:.3g} GB with flash attention, {attn / 1e9:.3g} GB storing attention scores, "
        f"{ckpt / 1e9:.3g} GB with activation checkpointing (+1 forward, ~33% more compute)."
    )


def _cmd_fit(args) -> str:
    runs = load_runs(args.runs)
    report = fit_all(runs, args.target_compute, bootstrap=int(args.bootstrap), seed=args.seed)
    if all(isinstance(law, str) for law in report.laws.values()):
        raise ScalingError(
            f"nothing could be fitted to {len(runs)} runs: " + report.laws["approach3"]
        )
    text = report.markdown()
    if args.plot:
        text += f"\nplot: {plot_runs(runs, report, args.plot)}"
    return text


def _lesson() -> str:
    """`python scaling.py` with no subcommand: the lecture's planning chain in one go."""
    return "\n\n".join(
        [
            budget_report(plan_budget(1.2e20)),
            isoflop_report(1.2e20),
            hardware_report(),
            memory_report(7e9, 8),
            f"ZeRO-3 on 4 GPUs: {training_memory(7e9, 4, 3).total / 1e9:g} GB per GPU (fits in 80 "
            "GB, "
            f"before activations); plain data parallel needs {training_memory(7e9).total / 1e9:g} "
            "GB",
            f"Pipeline bubble with p=4 stages, m=16 micro-batches: (p-1)/(m+p-1) = 3/19 = "
            f"{pipeline_bubble(4, 16):.1%}",
            "More: scaling.py "
            "{budget,isoflop,kaplan,verdicts,trillion,memory,bubble,hardware,fit,sweep,"
            "dedup-effect} --help",
        ]
    )


def build_parser(add_experiments=None) -> argparse.ArgumentParser:
    """The calculator's and the fit's subcommands; add_experiments(sub) adds more (main passes
    sweep.py's)."""
    from machinery.cli import Parser, add_commands, in_range, writable
    p = Parser(prog="scaling.py",
               description="Plan a pretraining run (C = 6ND, Chinchilla, memory) and fit scaling "
                           "laws to runs. With no subcommand: the lecture's worked example.")
    sub = p.add_subparsers(dest="command", parser_class=Parser)
    fraction = in_range(float, 0.0, 1.0, low_open=True)
    compute = ("compute", {"type": _number("compute"), "help": "FLOPs, e.g. 1.2e20"})
    # the activation estimate's shape flags: a 7B model's by default
    shape = [(flag, {"type": _whole, "default": default,
                     "help": f"activation estimate (default {default}: a 7B shape)"})
             for flag, default in (("--layers", 32), ("--d-model", 4096), ("--heads", 32),
                                   ("--seq-len", 4096), ("--micro-batch", 1))]
    add_commands(sub, {
        "budget": ("N, D, steps and GPU time for a compute budget", _cmd_budget, [
            compute,
            ("--tokens-per-param", {"type": _number("tokens per parameter"), "default": 20.0,
                                    "help": "D = R·N (default 20, Chinchilla)"}),
            ("--tokens-per-step", {"type": _number("tokens per step"), "default": 5e5,
                                   "help": "global batch in tokens (default 5e5)"}),
            ("--gpu", {"choices": sorted(GPUS),
                       "help": "take the peak from the hardware table (MFU default 0.4)"}),
            ("--gpus", {"type": _whole, "default": 8,
                        "help": "GPUs for the wall time (default 8)"}),
            ("--flops-per-gpu", {"type": _number("FLOP/s"), "default": None,
                                 "help": "peak FLOP/s per GPU (default: the lecture's achieved "
                                         "2e14, with MFU 1)"}),
            ("--mfu", {"type": fraction, "default": None,
                       "help": "fraction of the peak achieved, in (0, 1]"})]),
        "isoflop": ("the Chinchilla IsoFLOP table and the compute-optimal size",
                    lambda a: isoflop_report(a.compute, a.fit, a.sizes), [
            compute,
            ("--fit", {"choices": sorted(FITS), "default": "hoffmann",
                       "help": "which published fit (default hoffmann)"}),
            ("--sizes", {"type": _number("parameters"), "nargs": "+",
                         "default": list(LECTURE_SIZES), "help": "model sizes N"})]),
        "kaplan": ("Kaplan et al. 2020's power laws next to Chinchilla's allocation",
                   lambda a: kaplan_report(), []),
        "hardware": ("the GPU table (bf16 dense peaks)", lambda a: hardware_report(), []),
        "verdicts": ("tokens per parameter of real models against 20:1",
                     lambda a: (f"{a.params:.3g} parameters, {a.tokens:.3g} tokens: "
                                f"{tokens_per_param_verdict(a.params, a.tokens)}"
                                if a.params and a.tokens else verdicts_report()), [
            ("--params", {"type": _number("parameters"),
                          "help": "judge your own model: parameters ..."}),
            ("--tokens", {"type": _number("tokens"), "help": "... and training tokens"})]),
        "trillion": ("the exercise: a 1T-parameter model at D = 20N on H100s",
                     lambda a: trillion_report(a.params, a.tokens_per_param, a.gpu, a.mfu,
                                               a.active_fraction), [
            ("--params", {"type": _number("parameters"), "default": 1e12}),
            ("--tokens-per-param", {"type": _number("tokens per parameter"), "default": 20.0}),
            ("--gpu", {"choices": sorted(GPUS), "default": "H100"}),
            ("--mfu", {"type": fraction, "default": 0.4,
                       "help": "fraction of peak, in (0, 1] (default 0.4)"}),
            ("--active-fraction", {"type": fraction, "default": 37 / 671,
                                   "help": "MoE: active / total parameters (default DeepSeek-V3's "
                                           "37/671)"})]),
        "memory": ("training-state bytes per GPU by ZeRO stage, plus activations", _cmd_memory, [
            ("params", {"type": _number("parameters"), "nargs": "?", "default": 7e9,
                        "help": "parameters (default 7e9)"}),
            ("--gpus", {"type": _whole, "default": 8}),
            ("--gpu-memory", {"type": _number("GB"), "default": 80.0,
                              "help": "GB per GPU (default 80)"}),
            *shape]),
        "bubble": ("pipeline bubble (p-1)/(m+p-1)",
                   lambda a: (f"p={a.p:g}, m={a.m:g}: bubble = ({a.p:g}-1)/({a.m:g}+{a.p:g}-1) = "
                              f"{pipeline_bubble(a.p, a.m):.1%}"), [
            ("p", {"type": _whole, "help": "pipeline stages"}),
            ("m", {"type": _whole, "help": "micro-batches per step"})]),
        "fit": ("fit Approaches 1-3 to runs (JSON/JSONL of parameters, tokens or compute, loss)",
                _cmd_fit, [
            ("runs", {"help": "runs file, e.g. ../shared/data/cs336/a3/data/isoflops_curves.json"}),
            ("--target-compute", {"type": _number("compute"), "default": 1e23,
                                  "help": "where to report N_opt, D_opt"}),
            ("--bootstrap", {"type": in_range(int, 0, 10_000), "default": 100,
                             "help": "bootstrap resamples (default 100)"}),
            ("--seed", {"type": in_range(int, 0, 2**32 - 1), "default": 0}),
            ("--plot", {"type": writable("file"),
                        "help": "also draw the runs and the fits to this PNG"})]),
    })
    if add_experiments is not None:
        add_experiments(sub)
    return p


def run_command(args, prog: str = "scaling.py") -> int:
    """Print a parsed command's text (the lesson when there is none); a ScalingError is one line and
    exit 2."""
    from machinery.cli import run
    return run(lambda: print(args.run(args) if args.command else _lesson()), (ScalingError,), prog)


def main(argv: list[str] | None = None) -> int:
    # the experiments' subcommands (sweep, dedup-effect) live in sweep.py, above this file
    from machinery import sweep
    return run_command(build_parser(sweep.add_commands).parse_args(argv))


if __name__ == "__main__":
    # run as the module `scaling`, so sweep.py's `from scaling import ScalingError` is this class
    import scaling
    sys.exit(scaling.main())
