"""The reports of scaling.py's commands: each lesson's numbers laid out as the lines and Markdown
tables `python scaling.py budget|isoflop|kaplan|verdicts|trillion|memory|hardware|fit` print.

No number is computed here that scaling.py does not teach: each report calls the chapter's
functions (plan_budget, compute_optimal, isoflop_table, kaplan_optimal_params, training_memory,
fit_all) and formats what they return.

Depends on scaling.py and the standard library.
"""

from __future__ import annotations

import math
from typing import Sequence

from scaling import (
    FITS,
    GPUS,
    KAPLAN,
    LECTURE_SIZES,
    PF_DAY,
    REAL_MODELS,
    Budget,
    FitReport,
    _get_fit,
    compute_optimal,
    isoflop_table,
    kaplan_optimal_params,
    positive,
    tokens_per_param_verdict,
    training_memory,
    unit_fraction,
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
        f"{b.tokens:.3g} = {6 * b.params * b.tokens:.3g}",
        f"2. data:  {b.tokens:.3g} clean, deduplicated tokens (raw web keeps a small fraction "
        f"after filtering and dedup, so start from several times more)",
        f"3. steps: D / tokens per step = {b.tokens:.3g} / {b.tokens_per_step:.3g} = "
        f"{b.steps:,.0f} steps",
        f"4. time:  C / achieved FLOP/s = {b.compute:.3g} / ({b.flops_per_gpu:.3g} × MFU "
        f"{b.mfu:g}) = {b.seconds_one_gpu:.3g} s ≈ {_hours(b.seconds_one_gpu)} on 1 GPU",
        f"          on {b.gpus} GPUs: {b.seconds_one_gpu:.3g} / {b.gpus} = {b.seconds:.3g} s ≈ "
        f"{_hours(b.seconds)} (before communication overhead); {b.gpu_hours:,.3g} GPU-hours",
        f"   (the Chinchilla law's own optimum at this budget: N ≈ {law.params:.2g}, D ≈ "
        f"{law.tokens:.2g}, "
        f"{law.tokens_per_param:.0f} tokens/param, predicted loss {law.loss:.2f}; see `isoflop`)",
    ]
    return "\n".join(lines)


def isoflop_report(C, fit="hoffmann", sizes: Sequence[float] = LECTURE_SIZES) -> str:
    """The IsoFLOP table, its optimum, and the optimal loss a decade either side (`scaling.py
    isoflop`)."""
    law = _get_fit(fit)
    c = positive("compute budget", C)
    out = [
        f"IsoFLOP table at C = {c:.3g} FLOPs with {law.source}: "
        f"L = {law.E:g} + {law.A:g}/N^{law.alpha:g} + {law.B:g}/D^{law.beta:g}",
        "| parameters N | tokens D | tokens/param | predicted loss |",
        "|---:|---:|---:|---:|",
    ]
    for r in isoflop_table(c, sizes, law):
        out.append(
            f"| {r.params:.3g} | {r.tokens:.3g} | {r.tokens_per_param:,.3g} | {r.loss:.2f} |"
        )
    best = compute_optimal(c, fit=law)
    out.append(
        f"| **optimum {best.params:.2g}** | {best.tokens:.2g} | {best.tokens_per_param:.0f} | "
        f"{best.loss:.2f} |"
    )
    out.append(
        f"Closed form: N_opt = G·(C/6)^{law.a:.3f}, D_opt ∝ C^{law.b:.3f}, "
        f"G = (αA/βB)^(1/(α+β)) = {float(law.optimal_params(6.0)):.4g}"
    )
    optima = [compute_optimal(c * k, fit=law) for k in (0.1, 1.0, 10.0)]
    out.append(
        "Optimal loss: "
        + ", ".join(f"{o.loss:.2f} at {o.compute:.2g}" for o in optima)
        + "; the reducible part L - E shrinks "
        f"×{(optima[2].loss - law.E) / (optima[1].loss - law.E):.2f} per 10× compute"
    )
    return "\n".join(out)


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
        "were under-credited), counted only non-embedding parameters, and fitted smaller models."
    )
    return "\n".join(out)


def verdicts_report() -> str:
    out = ["| model | parameters | tokens | tokens/param | verdict |", "|---|---:|---:|---:|---|"]
    for name, n, d in REAL_MODELS:
        out.append(
            f"| {name} | {n:.3g} | {d:.3g} | {d / n:,.1f} | {tokens_per_param_verdict(n, d)} |"
        )
    out.append(
        "20:1 minimises training compute only; serving costs ~2N FLOPs per generated token, so a "
        "model that will serve trillions of tokens is made smaller and trained far longer."
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
        f"6·{active:.3g}·{d:.3g} = {c_moe:.3g} FLOPs, {c / c_moe:.0f}× less "
        f"({gpu_seconds * c_moe / c / 86400 / 10_000:,.0f} days on "
        f"10,000 GPUs); memory still holds all {n:.3g} parameters."
    )
    return "\n".join(out)


def memory_report(N: float, gpus: int = 8, gpu_memory_gb: float = 80.0) -> str:
    n = positive("parameters", N)
    out = [
        f"Training state for {n:.3g} parameters, mixed-precision AdamW (16 B/param = "
        f"{16 * n / 1e9:.4g} GB), per GPU on {gpus} GPUs:",
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
        out.append(
            f"| {stage} | {sharded[stage]} | {m.total / n:.4g} | {m.total / 1e9:.4g} | "
            f"{'yes' if m.total / 1e9 < gpu_memory_gb else 'no'} (before activations) |"
        )
    return "\n".join(out)


def hardware_report() -> str:
    out = ["| GPU | bf16 dense peak | memory | at 40% MFU |", "|---|---:|---:|---:|"]
    for key, g in GPUS.items():
        out.append(
            f"| {key} ({g.name}) | {g.bf16_flops / 1e12:.0f} TFLOP/s | {g.memory_gb:g} GB | "
            f"{0.4 * g.bf16_flops:.3g} FLOP/s |"
        )
    return "\n".join(out)


def fit_markdown(report: FitReport) -> str:
    """What fit_all found as a Markdown table, one row per approach with its bootstrap intervals."""
    out = [
        f"Fitted on {report.runs} runs; target compute C = {report.target:.3g} FLOPs; intervals: "
        f"10th-90th percentile over {report.bootstrap} bootstrap resamples of the runs.",
        "",
        "| approach | a (N_opt ∝ C^a) | b (D_opt ∝ C^b) | N_opt | D_opt | tokens/param |",
        "|---|---|---|---|---|---:|",
    ]
    names = {
        "approach1": "1: frontier",
        "approach2": "2: IsoFLOP parabolas",
        "approach3": "3: parametric fit",
    }
    for key, law in report.laws.items():
        if isinstance(law, str):
            out.append(f"| {names[key]} | not fitted: {law} | | | | |")
            continue
        ci = report.intervals.get(key, {})

        def show(value, name, fmt):
            lo_hi = ci.get(name)
            return f"{value:{fmt}}" + (f" [{lo_hi[0]:{fmt}}, {lo_hi[1]:{fmt}}]" if lo_hi else "")

        n, d = float(law.params_at(report.target)), float(law.tokens_at(report.target))
        out.append(
            f"| {names[key]} | {show(law.a, 'a', '.3f')} | {1 - law.a:.3f} | "
            f"{show(n, 'params', '.3g')} | {show(d, 'tokens', '.3g')} | {d / n:.3g} |"
        )
    if report.chinchilla is not None:
        f = report.chinchilla
        out.append(
            f"\nApproach 3 law: L = {f.E:.4g} + {f.A:.4g}/N^{f.alpha:.4f} + "
            f"{f.B:.4g}/D^{f.beta:.4f}"
        )
    return "\n".join(out)
