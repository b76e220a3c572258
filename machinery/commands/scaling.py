"""The command line of scaling.py: `python scaling.py [budget|isoflop|kaplan|verdicts|trillion|
memory|bubble|hardware|fit|sweep|recipe|dedup-effect] ...`; with no subcommand, the lecture's worked
example.

The calculator's and the fit's subcommands call scaling.py and print machinery/scaling_reports.py's
tables (a plot by machinery/scaling_plots.py, runs read by machinery/runs_file.py); `sweep` and
`dedup-effect` run machinery/sweep.py's experiments. A library error (ScalingError) is one line and
exit code 2; where it names an argument the user set by a flag, the line names the flag.

Depends on scaling.py, machinery's cli, runs_file, scaling_plots, scaling_reports and sweep, and the
standard library.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import pathlib
import re
import sys

from machinery import recipe, runs_file, scaling_plots, scaling_reports, sweep
from machinery.cli import Parser, add_commands, in_range, run, writable
from machinery.scaling_reports import (
    budget_report,
    hardware_report,
    isoflop_report,
    kaplan_report,
    memory_report,
    trillion_report,
    verdicts_report,
)
from scaling import (
    FITS,
    GPUS,
    LECTURE_ACHIEVED_FLOPS,
    LECTURE_SIZES,
    ScalingError,
    activation_memory,
    fit_all,
    pipeline_bubble,
    plan_budget,
    positive,
    tokens_per_param_verdict,
    training_memory,
)

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
    low, high, unit, example = QUANTITIES[what]
    return in_range(float, low, high, rule=f"{low:g} to {high:g} {unit}, e.g. {example}")


def _whole(text: str) -> float:
    """argparse type for counts (GPUs, layers, stages): a positive whole number, '8' or '1e3'."""
    try:
        x = positive("value", text)
    except ScalingError:
        x = math.nan
    if not x <= NUMBER_MAX or x != int(x):  # NaN fails the first test
        raise argparse.ArgumentTypeError(f"expected a whole number like 8, got {text!r}")
    return x


# The library names an argument as its function does (plan_budget's tokens_per_param, sweep()'s
# settings.budgets and max_hours); the user typed the flag.
FLAGS = {
    "tokens_per_param": "--tokens-per-param",
    "tokens_per_step": "--tokens-per-step",
    "settings.budgets": "--budgets",
    "settings.heldout_sizes": "--heldout-sizes",
    "settings.second_seed_sizes": "--second-seeds",
    "settings.data": "--data",
    "settings.seeds": "--seeds",
    "settings.tokens": "--tokens",
    "max_hours": "--max-hours",
    "out_dir": "--out-dir",
    "`device`": "--device",  # machinery/devices.resolve_device's name for the setting
}
# a name on its own, not a piece of a word or of a path (a folder called out_dir keeps its name)
NAMED = re.compile(r"(?<![\w/.-])(" + "|".join(map(re.escape, FLAGS)) + r")(?![\w/])")


def with_flags(error: ScalingError) -> ScalingError:
    """The same one line with each argument name of FLAGS in it written as its flag.

    >>> str(with_flags(ScalingError("lower settings.budgets, or pass max_hours 3 to run it")))
    'lower --budgets, or pass --max-hours 3 to run it'
    >>> str(with_flags(ScalingError("cannot write out_dir /tmp/out_dir (read-only)")))
    'cannot write --out-dir /tmp/out_dir (read-only)'
    """
    return ScalingError(NAMED.sub(lambda m: FLAGS[m.group(1)], str(error)))


def _cmd_budget(args) -> str:
    # A datasheet peak is reached at ~40% MFU; the lecture's 2e14 is already what a GPU achieves.
    peak, mfu = (GPUS[args.gpu].bf16_flops, 0.4) if args.gpu else (LECTURE_ACHIEVED_FLOPS, 1.0)
    try:
        b = plan_budget(
            args.compute,
            args.tokens_per_param,
            args.tokens_per_step,
            args.flops_per_gpu or peak,
            mfu if args.mfu is None else args.mfu,
            int(args.gpus),
        )
    except ScalingError as e:
        raise with_flags(e) from None
    return budget_report(b)


def _cmd_memory(args) -> str:
    shape = dict(
        n_layer=int(args.layers),
        d_model=int(args.d_model),
        n_head=int(args.heads),
        seq_len=int(args.seq_len),
        micro_batch=int(args.micro_batch),
    )
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
    runs = runs_file.load_runs(args.runs)
    report = fit_all(runs, args.target_compute, bootstrap=int(args.bootstrap), seed=args.seed)
    if all(isinstance(law, str) for law in report.laws.values()):
        raise ScalingError(
            f"nothing could be fitted to {len(runs)} runs: " + report.laws["approach3"]
        )
    text = scaling_reports.fit_markdown(report)
    if args.plot:
        text += f"\nplot: {scaling_plots.plot_runs(runs, report, args.plot)}"
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
            "recipe,dedup-effect} --help",
        ]
    )


def flag(name: str, **options) -> tuple:
    """One row of a cli.add_commands table: the flag (or positional) and its argparse options."""
    return (name, options)


def _calculator_commands() -> dict:
    """budget, isoflop, kaplan, hardware, verdicts, trillion, memory and bubble: cli.add_commands's
    table, {name: (help, run, flags)}."""
    fraction = in_range(float, 0.0, 1.0, low_open=True)
    compute = flag("compute", type=_number("compute"), help="FLOPs, e.g. 1.2e20")
    # the activation estimate's shape flags: a 7B model's by default
    shape = [
        flag(
            name,
            type=_whole,
            default=default,
            help=f"activation estimate (default {default}: a 7B shape)",
        )
        for name, default in (
            ("--layers", 32),
            ("--d-model", 4096),
            ("--heads", 32),
            ("--seq-len", 4096),
            ("--micro-batch", 1),
        )
    ]
    budget = [
        compute,
        flag(
            "--tokens-per-param",
            type=_number("tokens per parameter"),
            default=20.0,
            help="D = R·N (default 20, Chinchilla)",
        ),
        flag(
            "--tokens-per-step",
            type=_number("tokens per step"),
            default=5e5,
            help="global batch in tokens (default 5e5)",
        ),
        flag(
            "--gpu",
            choices=sorted(GPUS),
            help="take the peak from the hardware table (MFU default 0.4)",
        ),
        flag("--gpus", type=_whole, default=8, help="GPUs for the wall time (default 8)"),
        flag(
            "--flops-per-gpu",
            type=_number("FLOP/s"),
            default=None,
            help="peak FLOP/s per GPU (default: the lecture's achieved 2e14, with MFU 1)",
        ),
        flag("--mfu", type=fraction, default=None, help="fraction of the peak achieved, in (0, 1]"),
    ]
    isoflop = [
        compute,
        flag(
            "--fit",
            choices=sorted(FITS),
            default="hoffmann",
            help="which published fit (default hoffmann)",
        ),
        flag(
            "--sizes",
            type=_number("parameters"),
            nargs="+",
            default=list(LECTURE_SIZES),
            help="model sizes N",
        ),
    ]
    verdicts = [
        flag("--params", type=_number("parameters"), help="judge your own model: parameters ..."),
        flag("--tokens", type=_number("tokens"), help="... and training tokens"),
    ]
    trillion = [
        flag("--params", type=_number("parameters"), default=1e12),
        flag("--tokens-per-param", type=_number("tokens per parameter"), default=20.0),
        flag("--gpu", choices=sorted(GPUS), default="H100"),
        flag("--mfu", type=fraction, default=0.4, help="fraction of peak, in (0, 1] (default 0.4)"),
        flag(
            "--active-fraction",
            type=fraction,
            default=37 / 671,
            help="MoE: active / total parameters (default DeepSeek-V3's 37/671)",
        ),
    ]
    memory = [
        flag(
            "params",
            type=_number("parameters"),
            nargs="?",
            default=7e9,
            help="parameters (default 7e9)",
        ),
        flag("--gpus", type=_whole, default=8),
        flag("--gpu-memory", type=_number("GB"), default=80.0, help="GB per GPU (default 80)"),
        *shape,
    ]
    bubble = [
        flag("p", type=_whole, help="pipeline stages"),
        flag("m", type=_whole, help="micro-batches per step"),
    ]
    return {
        "budget": ("N, D, steps and GPU time for a compute budget", _cmd_budget, budget),
        "isoflop": (
            "the Chinchilla IsoFLOP table and the compute-optimal size",
            lambda a: isoflop_report(a.compute, a.fit, a.sizes),
            isoflop,
        ),
        "kaplan": (
            "Kaplan et al. 2020's power laws next to Chinchilla's allocation",
            lambda a: kaplan_report(),
            [],
        ),
        "hardware": ("the GPU table (bf16 dense peaks)", lambda a: hardware_report(), []),
        "verdicts": ("tokens per parameter of real models against 20:1", _cmd_verdicts, verdicts),
        "trillion": (
            "the exercise: a 1T-parameter model at D = 20N on H100s",
            lambda a: trillion_report(
                a.params, a.tokens_per_param, a.gpu, a.mfu, a.active_fraction
            ),
            trillion,
        ),
        "memory": (
            "training-state bytes per GPU by ZeRO stage, plus activations",
            _cmd_memory,
            memory,
        ),
        "bubble": ("pipeline bubble (p-1)/(m+p-1)", _cmd_bubble, bubble),
    }


def _cmd_verdicts(args) -> str:
    if args.params and args.tokens:
        verdict = tokens_per_param_verdict(args.params, args.tokens)
        return f"{args.params:.3g} parameters, {args.tokens:.3g} tokens: {verdict}"
    return verdicts_report()


def _cmd_bubble(args) -> str:
    p, m = args.p, args.m
    return f"p={p:g}, m={m:g}: bubble = ({p:g}-1)/({m:g}+{p:g}-1) = {pipeline_bubble(p, m):.1%}"


def _fit_flags() -> list:
    return [
        flag("runs", help="runs file, e.g. ../shared/data/cs336/a3/data/isoflops_curves.json"),
        flag(
            "--target-compute",
            type=_number("compute"),
            default=1e23,
            help="where to report N_opt, D_opt",
        ),
        flag(
            "--bootstrap",
            type=in_range(int, 0, 10_000),
            default=100,
            help="bootstrap resamples (default 100)",
        ),
        flag("--seed", type=in_range(int, 0, 2**32 - 1), default=0),
        flag("--plot", type=writable("file"), help="also draw the runs and the fits to this PNG"),
    ]


# --------------------------------------------------------------------------------------------------
# The experiments: `sweep` and `dedup-effect` (machinery/sweep.py).
# --------------------------------------------------------------------------------------------------


def _sweep_settings(args) -> sweep.SweepSettings:
    """The defaults (or --quick's), with the flags given (sweep() checks the whole design before
    anything runs)."""
    gpu = args.device != "cpu"
    if args.quick:
        settings = sweep.QUICK_SWEEP
    elif gpu:
        settings = sweep.GPU_SWEEP
    else:
        settings = sweep.SweepSettings()
    # one run at a time on the GPU, bf16; the device is checked in sweep()
    if gpu:
        settings = dataclasses.replace(settings, device=args.device, workers=1, threads=0)
    given = {
        "budgets": tuple(args.budgets) if args.budgets else None,
        "sizes_per_budget": args.sizes,
        "heldout_sizes": args.heldout_sizes,
        "data": args.data,
        "vocab_size": args.vocab_size,
        "lr_at_64": args.lr_at_64,
        "workers": args.workers,
        "threads": args.threads,
        "bootstrap": args.bootstrap,
        "seed": args.seed,
        "second_seed_sizes": args.second_seeds,
        "schedule": args.schedule,
    }
    return dataclasses.replace(settings, **{k: v for k, v in given.items() if v is not None})


def _log_line(message: str) -> None:
    """One progress line to stderr in one write, so the lines of two runs finishing together never
    interleave."""
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


def _cmd_sweep(args) -> str:
    settings = _sweep_settings(args)
    out_dir = args.out_dir or ("out/sweep-quick" if args.quick else "out/sweep")
    try:
        result = sweep.sweep(settings, out_dir, log=_log_line, max_hours=args.max_hours)
    except ScalingError as e:
        raise with_flags(e) from None
    written = f"{result.out_dir / 'REPORT.md'}, {result.plot}, {result.out_dir / 'final.jsonl'}"
    return sweep.sweep_report(result) + f"\nwritten: {written}"


def _cmd_dedup_effect(args) -> str:
    settings = sweep.QUICK_DEDUP if args.quick else sweep.DedupEffectSettings()
    given = {
        "tokens": args.tokens,
        "seeds": args.seeds,
        "workers": args.workers,
        "threads": args.threads,
    }
    settings = dataclasses.replace(settings, **{k: v for k, v in given.items() if v is not None})
    out_dir = args.out_dir or ("out/dedup-effect-quick" if args.quick else "out/dedup-effect")
    try:
        result = sweep.dedup_effect(settings, out_dir, log=_log_line, max_hours=args.max_hours)
    except ScalingError as e:
        raise with_flags(e) from None
    return sweep.dedup_effect_report(result) + f"\nwritten: {pathlib.Path(out_dir) / 'REPORT.md'}"


def _cmd_recipe(args) -> str:
    settings = recipe.QUICK_RECIPE if args.quick else recipe.RecipeSettings()
    given = {"workers": args.workers, "threads": args.threads, "seeds": args.seeds}
    settings = dataclasses.replace(settings, **{k: v for k, v in given.items() if v is not None})
    out_dir = args.out_dir or ("out/recipe-quick" if args.quick else "out/recipe")
    try:
        result = recipe.recipe(settings, out_dir, log=_log_line)
    except ScalingError as e:
        raise with_flags(e) from None
    return recipe.recipe_report(result) + f"\nwritten: {pathlib.Path(out_dir) / 'REPORT.md'}"


def _shared_flags(name: str, quick: str, max_hours: bool = True) -> list:
    """The flags the experiments share: --quick, --workers, --threads, --out-dir and (the sweep's
    and dedup-effect's: they estimate their time first) --max-hours."""
    shared = [
        flag("--quick", action="store_true", help=f"{quick}, for tests"),
        flag("--workers", type=in_range(int, 1, 64), help="training runs side by side (default 2)"),
        flag(
            "--threads",
            type=in_range(int, 0, 1024),
            help="torch CPU threads per training run (default 1; 0 = torch's own)",
        ),
        flag(
            "--out-dir",
            type=writable("dir"),
            default=None,
            help=f"default out/{name} (quick: out/{name}-quick)",
        ),
    ]
    if not max_hours:
        return shared
    return shared + [
        flag(
            "--max-hours",
            type=in_range(float, 0.0, 1e6, low_open=True),
            default=sweep.MAX_HOURS,
            help=f"refuse runs estimated to take longer than this on this CPU "
            f"(default {sweep.MAX_HOURS:g})",
        ),
    ]


def _experiment_commands() -> dict:
    """sweep, recipe and dedup-effect: cli.add_commands's table."""
    sweep_flags = [
        flag(
            "--budgets",
            type=in_range(float, 1e6, 1e18),
            nargs="+",
            help="compute budgets in FLOPs (default 1e12 2e12 4e12 8e12; on a GPU 1e13 2e13 "
            "4e13 8e13)",
        ),
        flag("--sizes", type=in_range(int, 3, 9), help="model sizes per budget, 3..9 (default 5)"),
        flag(
            "--heldout-sizes",
            type=int,
            choices=(1, 3),
            help="sizes trained at the held-out budget: 3 (default: a parabola there measures "
            "the optimum too) or 1 (the predicted size only)",
        ),
        flag(
            "--device",
            default="cpu",
            help="cpu (default), or cuda / cuda:N: the same plan at 10x the budgets, bf16, one "
            "run at a time",
        ),
        flag("--data", help="corpus (default pystdlib, embedded) or a prepared dataset directory"),
        flag(
            "--vocab-size",
            type=in_range(int, 257, 65536),
            help="BPE vocabulary when the corpus is prepared (default 512)",
        ),
        flag(
            "--lr-at-64",
            type=in_range(float, 0.0, 1.0, low_open=True),
            help="learning rate of a width-64 model; each size gets this·64/width (default 4e-3)",
        ),
        flag("--bootstrap", type=in_range(int, 0, 10_000), help="bootstrap resamples (default 50)"),
        flag(
            "--seed",
            type=in_range(int, 0, 2**32 - 1),
            help="seed of every run and of the bootstrap",
        ),
        flag(
            "--second-seeds",
            type=in_range(int, 0, 9),
            help="sizes nearest each budget's best run trained again with seed + 1, and fitted "
            "as the mean of the two (default 3; 0 = one seed per point)",
        ),
        flag(
            "--schedule",
            choices=("cosine", "wsd"),
            help="cosine (default): each point its own run; wsd: one constant-rate trunk per size "
            "and seed, each point a decay branch resumed from it",
        ),
    ]
    dedup_flags = [
        flag(
            "--tokens", type=in_range(int, 1, 10**9), help="tokens trained per run (default 500000)"
        ),
        flag("--seeds", type=in_range(int, 2, 20), help="seeds per corpus, 2..20 (default 3)"),
    ]
    return {
        "sweep": (
            "IsoFLOP sweep through train.py: fit Approaches 1-3, predict a held-out budget",
            _cmd_sweep,
            _shared_flags("sweep", "a tiny design on pydocs (seconds per run)") + sweep_flags,
        ),
        "recipe": (
            "Muon vs tuned AdamW, QK-norm / soft-cap / z-loss, WSD branches, width transfer",
            _cmd_recipe,
            _shared_flags("recipe", "a tiny design on pydocs (seconds per run)", max_hours=False)
            + [
                flag(
                    "--seeds",
                    type=in_range(int, 2, 20),
                    help="seeds per compared point (default 3)",
                )
            ],
        ),
        "dedup-effect": (
            "1%% of documents repeated 50x vs dedup.py's cleaned corpus, 3 seeds",
            _cmd_dedup_effect,
            _shared_flags("dedup-effect", "tiny runs (seconds each)") + dedup_flags,
        ),
    }


def build_parser() -> argparse.ArgumentParser:
    """Every subcommand of `python scaling.py`: the calculator, the fit and the experiments."""
    p = Parser(
        prog="scaling.py",
        description="Plan a pretraining run (C = 6ND, Chinchilla, memory) and fit scaling laws to "
        "runs. With no subcommand: the lecture's worked example.",
    )
    sub = p.add_subparsers(dest="command", parser_class=Parser)
    fit = (
        "fit Approaches 1-3 to runs (JSON/JSONL of parameters, tokens or compute, loss)",
        _cmd_fit,
        _fit_flags(),
    )
    add_commands(sub, {**_calculator_commands(), "fit": fit, **_experiment_commands()})
    return p


def main(argv: list[str] | None = None) -> int:
    """Print the command's text (the lesson when there is none); a ScalingError is one line and
    exit code 2."""
    args = build_parser().parse_args(argv)
    return run(
        lambda: print(args.run(args) if args.command else _lesson()), (ScalingError,), "scaling.py"
    )
