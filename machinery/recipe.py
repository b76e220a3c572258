"""The 2024-26 recipe, measured: each change's effect in nats against its baseline, 3 seeds.

Serves: train.py (Muon, section 9; WSD, section 2; the width rule, section 3), model.py (QK-norm,
the logit soft-cap and z-loss) and scaling.py, whose experiment it is: its command line, `python
scaling.py recipe [--quick]`, is machinery/commands/scaling.py. It writes REPORT.md, result.json
and recipe.png into its out-dir (docs/recipe holds the committed run).

Every run is `python train.py ...` in a subprocess (machinery/sweep.py's runner), the same 2-layer,
width-64 model (16-channel heads, 0.13M parameters on the 512-token pystdlib BPE) for the same
tokens, scored on the same held-out windows. Four experiments:

1. Optimizer: AdamW and Muon, each over the same learning-rate grid on seed 0; each one's best rate
   trained again from seeds 1 and 2. The gap is counted in seed standard deviations (the larger of
   the two), as the dedup-effect experiment does. Then the same on train.py's default model (`python
   train.py`: the tiny preset, 1.3M parameters, on pydocs, 600 steps of 16 x 128 tokens), each
   optimizer over its own grid around its best rate, so that the AdamW it beats is a tuned one.
2. Stability: AdamW at its best rate and at `high_lr_factor` times it, plain and with each of
   QK-norm, the logit soft-cap and z-loss, 3 seeds each: the loss penalty of the too-high rate, and
   the largest attention logit the finished model computes on held-out text.
3. WSD branches: one warmup-stable run per seed, checkpointed; from the checkpoint at 80% of each
   length L, a branch resumes (optimizer moments, data position and all) and decays linearly to
   10% over the last 20% of L, beside a cosine run of length L. One stable run and its branches
   cost fewer steps than one cosine run per length; a branch decaying to 0 is measured too.
4. Width transfer: the learning-rate grid at widths 64, 128 and 256, plain and with train.py's
   width rule (`--lr-base-width 64`), one seed: where the best rate moves.

Depends on numpy and machinery's sweep (the runner, the dataset, the output folder) and fileio;
inside the functions that need them: torch, evaluate.py (loading a run) and the attention probe,
matplotlib (the plot).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import math
import pathlib
import sys
import time
from typing import Sequence

import numpy as np

from machinery import fileio, sweep
from scaling import ScalingError


@dataclasses.dataclass(frozen=True)
class RecipeSettings:
    """The experiment's design (see the module docstring); `quick` shrinks it to seconds."""

    data: str = "pystdlib"
    vocab_size: int = 512
    n_layer: int = 2
    n_embd: int = 64
    batch_size: int = 16
    block_size: int = 128
    steps: int = 400  # 400 x 16 x 128 = 0.82M tokens a run
    warmup_steps: int = 20
    lrs: tuple[float, ...] = (2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2)
    seeds: int = 3
    high_lr_factor: float = 8.0
    # (name, --model-args added) of each stability tool
    stability: tuple[tuple[str, str], ...] = (
        ("QK-norm", "qk_norm=True"),
        ("soft-cap 30", "logit_softcap=30"),
        ("z-loss 1e-4", "z_loss=0.0001"),
    )
    wsd_lengths: tuple[float, ...] = (0.5, 0.75, 1.0)  # fractions of `steps`
    decay_fraction: float = 0.2
    widths: tuple[int, ...] = (64, 128, 256)
    width_lrs: tuple[float, ...] = (1e-3, 2e-3, 4e-3, 8e-3)
    width_rule: tuple[str, ...] = ("--lr-base-width", "64")  # train.py's flag and its base
    # train.py's default model, data, batch and schedule; only the optimizer, rate and seed change
    default_data: str = "pydocs"
    default_steps: int = 600  # train.py's --max-steps
    default_batch_size: int = 16  # train.py's --batch-size
    default_lrs: tuple[tuple[str, tuple[float, ...]], ...] = (
        ("adamw", (1e-3, 2e-3, 4e-3, 8e-3)),  # train.py's default rate is 2e-3
        ("muon", (2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2)),
    )
    eval_windows: int = 384
    workers: int = 2
    threads: int = 1


QUICK_RECIPE = RecipeSettings(
    data="pydocs",
    batch_size=4,
    block_size=64,
    steps=20,
    warmup_steps=2,
    lrs=(2e-3, 8e-3),
    seeds=2,
    widths=(32, 64),
    width_lrs=(2e-3, 8e-3),
    width_rule=("--lr-base-width", "32"),
    default_steps=20,
    default_batch_size=4,
    default_lrs=(("adamw", (2e-3, 8e-3)), ("muon", (8e-3, 3.2e-2))),
    eval_windows=8,
)

HEAD_DIM = 16


@dataclasses.dataclass(frozen=True)
class Job:
    """One train.py run: its folder name, the flags that differ from the common ones, its steps;
    `model` "default" is train.py's own model, data and batch, "recipe" the experiment's."""

    name: str
    flags: tuple[str, ...]
    steps: int
    n_embd: int = 64
    model_args: str = ""
    model: str = "recipe"


# --------------------------------------------------------------------------------------------------
# The runs
# --------------------------------------------------------------------------------------------------


def command(s: RecipeSettings, job: Job, data_dir, run_dir) -> list[str]:
    """train.py's command line for a job: the common settings, then the job's flags (argparse keeps
    the last value of a flag given twice, so a job may override a common one). A default-model job
    sets only what every run sets: its steps, its evaluation and where it writes."""
    batch_size = s.batch_size
    if job.model == "default":
        batch_size = s.default_batch_size
    common = {
        "--data": str(data_dir),
        "--out-dir": str(run_dir),
        "--batch-size": batch_size,
        "--max-steps": job.steps,
        "--eval-interval": job.steps,
        "--eval-batches": max(1, s.eval_windows // batch_size),
        "--ckpt-interval": job.steps,
        "--log-interval": max(1, job.steps // 4),
        "--dtype": "fp32",
        "--device": "cpu",
        "--num-samples": 0,
    }
    if job.model == "recipe":
        heads = job.n_embd // HEAD_DIM
        model_args = f"n_layer={s.n_layer},n_embd={job.n_embd},n_head={heads},n_kv_head={heads}"
        model_args += ",ffn_multiple_of=16" + (f",{job.model_args}" if job.model_args else "")
        common.update({"--model": "sweep-1", "--model-args": model_args})
        common.update({"--block-size": s.block_size, "--warmup-steps": s.warmup_steps})
    flat = [str(x) for pair in common.items() for x in pair]
    return [sys.executable, str(sweep.ROOT / "train.py"), *flat, "--no-eval-at-start", "--no-plot"]


def run_jobs(
    s: RecipeSettings, jobs: Sequence[Job], data_dirs: dict, out: pathlib.Path, log
) -> dict:
    """Train the jobs, `workers` side by side, reusing a finished run whose command is unchanged;
    data_dirs: {job.model: its prepared dataset}. Returns {name: final validation loss, or None
    where it is not finite: a diverged run}. A run that fails stops the experiment (one
    ScalingError line); the finished ones stay for a rerun."""
    unique = list({job.name: job for job in jobs}.values())

    def one(job: Job):
        run_dir = out / "runs" / job.name
        cmd = command(s, job, data_dirs[job.model], run_dir) + list(job.flags)
        # a diverged run (no finite loss) is a result here: the stability section counts them
        loss, seconds, reused = sweep.train_or_reuse(
            cmd, run_dir, job.steps, s.threads, diverged_ok=True
        )
        if not reused:
            shown = "diverged" if loss is None else f"{loss:.4f}"
            log(f"{job.name}: loss {shown} ({seconds:.0f} s)")
        return job.name, loss

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, s.workers)) as pool:
        # the longest first, so that no long run starts last while the other core idles
        ordered = sorted(unique, key=lambda job: -job.steps * job.n_embd**2)
        futures = [pool.submit(one, job) for job in ordered]
        try:
            return dict(future.result() for future in futures)
        except BaseException:
            pool.shutdown(cancel_futures=True)  # one failed: nothing queued starts
            raise


def guard_events(run_dir: pathlib.Path) -> int:
    """How often the spike guard stepped in (a skipped batch or a rollback): a run that only
    finished because the guard kept rescuing it says so."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return 0
    events = [json.loads(line).get("event") for line in path.read_text().splitlines() if line]
    return sum(event in ("skipped_batch", "rollback") for event in events)


def lr_name(lr: float) -> str:
    """'4e-03' -> a folder-name-safe rate: lr_name(0.004) == 'lr0.004'."""
    return f"lr{lr:g}"


def optimizer_job(s: RecipeSettings, optimizer: str, lr: float, seed: int, model_args="", name=""):
    """A run of the optimizer experiment (a stability run: the same with model_args, named)."""
    flags = ("--optimizer", optimizer, "--lr", f"{lr:g}", "--seed", str(seed))
    tag = f"-{name}" if name else ""
    return Job(f"{optimizer}{tag}-{lr_name(lr)}-s{seed}", flags, s.steps, s.n_embd, model_args)


def best_rates(losses: dict, grid: dict) -> dict:
    """{optimizer: the rate of its lowest loss} from a grid {optimizer: {lr: job}}; a diverged run
    counts as infinite."""
    return {
        opt: min(runs, key=lambda lr: _finite(losses.get(runs[lr].name)))
        for opt, runs in grid.items()
    }


def _finite(loss) -> float:
    return math.inf if loss is None else loss


def mean_sd(values: Sequence[float | None]) -> tuple[float, float]:
    """Mean and sample standard deviation; a diverged run (None) makes both nan.

    >>> mean_sd([3.0, 3.2, 3.1])
    (3.1, 0.1)
    """
    if any(v is None for v in values) or not values:
        return math.nan, math.nan
    array = np.array(values, dtype=float)
    sd = float(np.std(array, ddof=1)) if len(array) > 1 else 0.0
    return round(float(array.mean()), 12), round(sd, 12)


# --------------------------------------------------------------------------------------------------
# The plan: three phases, each needing the last one's results
# --------------------------------------------------------------------------------------------------


def grid_jobs(s: RecipeSettings) -> dict:
    """Phase 1: {optimizer: {lr: job}} on seed 0, the same on the default model, and the width
    grid {(width, rule, lr): job}."""
    grid = {opt: {lr: optimizer_job(s, opt, lr, 0) for lr in s.lrs} for opt in ("adamw", "muon")}
    default = {opt: {lr: default_job(s, opt, lr, 0) for lr in lrs} for opt, lrs in s.default_lrs}
    widths = {
        (width, rule, lr): width_job(s, width, rule, lr)
        for width in s.widths
        for rule in ("plain", "rule")
        for lr in s.width_lrs
    }
    return {"optimizer": grid, "default": default, "width": widths}


def default_job(s: RecipeSettings, optimizer: str, lr: float, seed: int) -> Job:
    """`python train.py --optimizer ... --lr ... --seed ...`: the default model (width 128)."""
    flags = ("--optimizer", optimizer, "--lr", f"{lr:g}", "--seed", str(seed))
    name = f"default-{optimizer}-{lr_name(lr)}-s{seed}"
    return Job(name, flags, s.default_steps, n_embd=128, model="default")


def width_job(s: RecipeSettings, width: int, rule: str, lr: float) -> Job:
    """A run of the width grid: the optimizer experiment's AdamW run (seed 0) at another width,
    with or without the rule. The rule at its base width multiplies by 1: that is the plain run,
    and the plain run at the recipe's width is the optimizer grid's own."""
    job = optimizer_job(s, "adamw", lr, 0)
    uses_rule = rule == "rule" and width != int(s.width_rule[-1])
    if width == s.n_embd and not uses_rule:
        return job
    kind = "rule" if uses_rule else "plain"
    flags = job.flags + (s.width_rule if uses_rule else ())
    return Job(f"width{width}-{kind}-{lr_name(lr)}", flags, s.steps, width)


def branch_points(s: RecipeSettings) -> dict[int, int]:
    """{length L: the step its WSD branch starts decaying}, as train.wsd_lr computes it.

    >>> branch_points(RecipeSettings())
    {200: 160, 300: 240, 400: 320}
    """
    lengths = [round(fraction * s.steps) for fraction in s.wsd_lengths]
    return {L: L - int(round(s.decay_fraction * L)) for L in lengths}


def second_jobs(s: RecipeSettings, best: dict, best_default: dict) -> dict:
    """Phase 2, given each optimizer's best rate on each model: the other seeds, the stability
    grid, the WSD stable runs and the cosine runs they are compared with."""
    seeds, lr = range(s.seeds), best["adamw"]
    jobs = {
        "optimizer": {opt: [optimizer_job(s, opt, best[opt], k) for k in seeds] for opt in best},
        "default": {
            opt: [default_job(s, opt, best_default[opt], k) for k in seeds] for opt in best_default
        },
    }
    tools = [("plain", "")] + list(s.stability)
    jobs["stability"] = {
        (tool, rate): [
            optimizer_job(s, "adamw", rate, k, args, _slug(tool) if args else "") for k in seeds
        ]
        for tool, args in tools
        for rate in (lr, lr * s.high_lr_factor)
    }
    points = branch_points(s)
    interval = math.gcd(*points.values())
    stable_flags = ("--schedule", "wsd", "--decay-fraction", "0", "--lr", f"{lr:g}")
    stable_flags += ("--ckpt-interval", str(interval))
    stable_flags += ("--keep-checkpoints", str(max(points.values()) // interval))
    jobs["stable"] = [
        Job(f"wsd-stable-s{k}", stable_flags + ("--seed", str(k)), max(points.values()))
        for k in seeds
    ]
    jobs["cosine"] = {L: [_cosine_job(s, lr, L, k) for k in seeds] for L in points}
    return jobs


def _cosine_job(s: RecipeSettings, lr: float, length: int, seed: int) -> Job:
    """A cosine run of `length` steps; the full length is the optimizer experiment's run."""
    job = optimizer_job(s, "adamw", lr, seed)
    if length == s.steps:
        return job
    return dataclasses.replace(job, name=f"cosine{length}-{lr_name(lr)}-s{seed}", steps=length)


def branch_jobs(s: RecipeSettings, lr: float, out: pathlib.Path) -> dict:
    """Phase 3: from each stable run's checkpoint at a branch point, the decay to 10% (and, at the
    full length, to 0). {(L, min_lr_ratio): [job per seed]}."""
    jobs = {}
    for L, point in branch_points(s).items():
        floors = [0.1]
        if L == s.steps:
            floors.append(0.0)  # decay to zero, measured at the full length only
        for floor in floors:
            flags = ("--schedule", "wsd", "--decay-fraction", f"{s.decay_fraction:g}")
            flags += ("--lr", f"{lr:g}", "--min-lr-ratio", f"{floor:g}")
            jobs[(L, floor)] = [
                Job(
                    f"wsd{L}-to{floor:g}-s{k}",
                    flags
                    + ("--seed", str(k))
                    + ("--resume", str(out / "runs" / f"wsd-stable-s{k}" / f"ckpt_{point:07d}.pt")),
                    L,
                )
                for k in range(s.seeds)
            ]
    return jobs


def _slug(tool: str) -> str:
    """'soft-cap 30' -> 'soft-cap-30': a run folder's name."""
    return tool.replace(" ", "-")


# --------------------------------------------------------------------------------------------------
# The experiment
# --------------------------------------------------------------------------------------------------


def recipe(settings: RecipeSettings = RecipeSettings(), out_dir="out/recipe", log=print) -> dict:
    """Prepare the corpus (cached), run the three phases, write result.json, REPORT.md and
    recipe.png into out_dir; returns the result. A rerun reuses every finished run."""
    from machinery import data_at_scale

    s = settings
    dataset = sweep.open_dataset(s.data)
    keep = lambda out: any((out / "runs").glob("*/command.json"))  # noqa: E731
    with sweep.output_folder(out_dir, keep=keep) as out:
        data_dir = pathlib.Path(s.data).resolve()  # train.py runs in the project folder
        if dataset is None:
            log(f"preparing {s.data} with a {s.vocab_size}-token BPE (cached after the first time)")
            with sweep._data_errors(s.data):
                data_dir = data_at_scale.prepare(s.data.split(","), vocab_size=s.vocab_size, seed=0)
        default_dir = prepare_default(s, log)
        data_dirs = {"recipe": data_dir, "default": default_dir}
        t0 = time.perf_counter()
        first = grid_jobs(s)
        every = [j for runs in first["optimizer"].values() for j in runs.values()]
        every += [j for runs in first["default"].values() for j in runs.values()]
        losses = run_jobs(s, every + list(first["width"].values()), data_dirs, out, log)
        best = best_rates(losses, first["optimizer"])
        best_default = best_rates(losses, first["default"])
        second = second_jobs(s, best, best_default)
        every = list(second["stable"])
        for group in ("optimizer", "default", "stability", "cosine"):
            every += [j for runs in second[group].values() for j in runs]
        losses.update(run_jobs(s, every, data_dirs, out, log))
        third = branch_jobs(s, best["adamw"], out)
        third_jobs = [j for runs in third.values() for j in runs]
        losses.update(run_jobs(s, third_jobs, data_dirs, out, log))
        logits = largest_logits(s, second["stability"], data_dir, out)
        result = summarise(s, first, second, third, losses, logits, (best, best_default), out)
        result["runs"] = len(losses)
        seconds = [out / "runs" / name / "train_seconds.txt" for name in losses]
        result["train_minutes"] = round(sum(float(p.read_text()) for p in seconds) / 60, 1)
        result["minutes"] = round((time.perf_counter() - t0) / 60, 1)
        fileio.write_atomic(out / "result.json", json.dumps(result, indent=1), error=ScalingError)
        fileio.write_atomic(out / "REPORT.md", recipe_report(result), error=ScalingError)
        plot_recipe(result, out / "recipe.png")
    return result


def prepare_default(s: RecipeSettings, log) -> pathlib.Path:
    """The dataset `python train.py` trains on (data.py's default vocabulary), prepared once here
    as train.py would, so that two runs starting side by side do not both prepare it."""
    import data as data_lib
    from machinery import data_at_scale

    log(f"preparing {s.default_data} as train.py does (cached after the first time)")
    clean = data_lib.CleanSettings(cleaning="auto")
    with sweep._data_errors(s.default_data):
        found = data_at_scale.prepare(
            [s.default_data], engine="auto", val_data=None, clean_settings=clean
        )
    return pathlib.Path(found)


def largest_logits(s: RecipeSettings, stability: dict, data_dir, out: pathlib.Path) -> dict:
    """{run name: the largest attention logit its finished model computes on the first held-out
    windows} for every stability run that finished (machinery/attention_probe.py)."""
    import torch

    import data as data_lib
    import evaluate
    from machinery.attention_probe import max_attention_logit

    val = data_lib.TokenData(data_dir).shards["val"][0]
    windows = min(s.batch_size, len(val) // s.block_size)
    idx = torch.from_numpy(val[: windows * s.block_size].astype(np.int64)).view(windows, -1)
    found = {}
    for job in (job for runs in stability.values() for job in runs):
        run_dir = out / "runs" / job.name
        if sweep.final_val_loss(run_dir / "metrics.jsonl", job.steps) is not None:
            model, _, _ = evaluate.load_model(run_dir)
            found[job.name] = round(max_attention_logit(model, idx), 3)
    return found


def summarise(s, first, second, third, losses, logits, bests, out: pathlib.Path) -> dict:
    """Every run's loss, grouped as the report reads them (JSON: rates and lengths as strings);
    bests: each optimizer's best rate on the recipe's model and on the default model."""

    def of(jobs):
        return [losses.get(job.name) for job in jobs]

    grid = first["optimizer"]
    stability = [
        {
            "tool": tool,
            "lr": rate,
            "losses": of(jobs),
            "logits": [logits.get(job.name) for job in jobs],
            "guard": [guard_events(out / "runs" / job.name) for job in jobs],
        }
        for (tool, rate), jobs in second["stability"].items()
    ]
    wsd = {
        str(L): {"cosine": of(second["cosine"][L]), "branch": of(third[(L, 0.1)])}
        for L in branch_points(s)
    }
    return {
        "settings": dataclasses.asdict(s),
        "best_lr": bests[0],
        "grid": _grid_losses(grid, losses),
        "seeds": {opt: of(jobs) for opt, jobs in second["optimizer"].items()},
        "default": {
            "best_lr": bests[1],
            "grid": _grid_losses(first["default"], losses),
            "seeds": {opt: of(jobs) for opt, jobs in second["default"].items()},
        },
        "stability": stability,
        "wsd": wsd,
        "wsd_to_zero": of(third[(s.steps, 0.0)]),
        "wsd_stable": of(second["stable"]),
        "width": [
            {"width": w, "rule": rule, "lr": lr, "loss": losses.get(job.name)}
            for (w, rule, lr), job in first["width"].items()
        ],
    }


def _grid_losses(grid: dict, losses: dict) -> dict:
    """{optimizer: {rate as a string (JSON's keys): its seed-0 loss}}."""
    return {
        opt: {f"{lr:g}": losses.get(j.name) for lr, j in runs.items()} for opt, runs in grid.items()
    }


# --------------------------------------------------------------------------------------------------
# The report, written from result.json's numbers
# --------------------------------------------------------------------------------------------------


def sigmas(baseline, changed) -> float:
    """How far the mean moved from baseline to changed, in seed standard deviations (the larger of
    the two spreads, as the dedup-effect experiment counts).

    >>> round(sigmas([3.0, 3.2], [2.5, 2.7]), 1)
    -3.5
    """
    (a, a_sd), (b, b_sd) = mean_sd(baseline), mean_sd(changed)
    worst = max(a_sd, b_sd)
    if worst > 0:
        return (b - a) / worst
    return math.copysign(math.inf, b - a) if b != a else 0.0


def _pm(values) -> str:
    """'3.1234 ± 0.0100' (mean ± seed standard deviation), or 'diverged'."""
    mean, sd = mean_sd(values)
    return "diverged" if math.isnan(mean) else f"{mean:.4f} ± {sd:.4f}"


def _loss(value) -> str:
    return "diverged" if value is None else f"{value:.4f}"


def optimizer_section(r: dict) -> list[str]:
    """Muon against AdamW, on the default model and on the recipe's: each one's seed-0 grid, the
    best rates over the seeds, the gap in seed SDs."""
    s = r["settings"]
    out = [
        "## 1. Muon against a tuned AdamW",
        "",
        "### train.py's default model (`python train.py`: the tiny preset on "
        f"`{s['default_data']}`, {s['default_steps']} steps of {s['default_batch_size']} "
        "sequences)",
        "",
    ]
    out += optimizer_rows(r["default"])
    out += [f"### The recipe's model ({s['n_layer']} layers of width {s['n_embd']})", ""]
    return out + optimizer_rows(r)


def optimizer_rows(part: dict) -> list[str]:
    """One model's grid table (a dash where an optimizer's grid has no such rate) and its verdict,
    with a warning where a best rate sits at its grid's edge: a better one may lie outside."""
    grid, seeds, best = part["grid"], part["seeds"], part["best_lr"]
    rates = sorted({lr for runs in grid.values() for lr in runs}, key=float)
    out = ["| learning rate | AdamW | Muon |", "|---:|---:|---:|"]
    for lr in rates:
        cells = [_loss(grid[opt][lr]) if lr in grid[opt] else "-" for opt in ("adamw", "muon")]
        out.append(f"| {lr} | {cells[0]} | {cells[1]} |")
    gap = mean_sd(seeds["adamw"])[0] - mean_sd(seeds["muon"])[0]
    apart = -sigmas(seeds["adamw"], seeds["muon"])
    out += [
        "",
        f"Seed 0 over the grid; each optimizer's best rate then over {len(seeds['adamw'])} seeds: "
        f"AdamW at {best['adamw']:g} {_pm(seeds['adamw'])}, Muon at {best['muon']:g} "
        f"{_pm(seeds['muon'])}. **Muon is {gap:.4f} nats lower = {apart:.1f} seed standard "
        "deviations** (the larger of the two spreads).",
        "",
    ]
    if apart > 3:
        out.append("Muon trains this model lower than the tuned AdamW, beyond the seed noise.")
    elif apart < -3:
        out.append("AdamW trains this model lower than Muon, beyond the seed noise.")
    else:
        out.append("The two are within 3 seed standard deviations of each other here.")
    for opt, name in (("adamw", "AdamW"), ("muon", "Muon")):
        edges = (min(grid[opt], key=float), max(grid[opt], key=float))
        if f"{best[opt]:g}" in edges:
            out.append(f"{name}'s best rate is its grid's edge: a better one may lie outside it.")
    return out + [""]


def stability_section(r: dict) -> list[str]:
    """Each tool at the best rate and at the too-high one: the penalty and the largest logit."""
    rows = {(row["tool"], row["lr"]): row for row in r["stability"]}
    tools = list(dict.fromkeys(row["tool"] for row in r["stability"]))
    low, high = sorted({row["lr"] for row in r["stability"]})
    out = [
        "## 2. Stability: QK-norm, the logit soft-cap, z-loss at a too-high learning rate",
        "",
        f"AdamW at its best rate {low:g} and at {high / low:g}x it ({high:g}); mean ± seed SD. "
        "The penalty is the loss at the high rate minus the loss at the best, seed by seed. The "
        "logit is the largest q·k/sqrt(d) the finished model computes on held-out text (mean "
        "over seeds); the guard's steps are batches train.py's spike guard skipped or rolled "
        "back, over all seeds.",
        "",
        f"| tool | loss at {low:g} | loss at {high:g} | penalty | largest logit at {low:g} | at "
        f"{high:g} | spike-guard steps at {high:g} |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    penalties = {}
    for tool in tools:
        good, bad = rows[(tool, low)], rows[(tool, high)]
        penalties[tool] = paired(good["losses"], bad["losses"])
        logits = [_mean_or_dash(rows[(tool, rate)]["logits"]) for rate in (low, high)]
        out.append(
            f"| {tool} | {_pm(good['losses'])} | {_pm(bad['losses'])} | "
            f"{_pm(penalties[tool])} | {logits[0]} | {logits[1]} | {sum(bad['guard'])} |"
        )
    out.append("")
    for tool in tools[1:]:
        at_best = [rows[(name, low)]["losses"] for name in ("plain", tool)]
        out.append(
            f"- {tool}: the penalty changes by {_effect(penalties['plain'], penalties[tool])}; "
            f"the loss at the best rate by {_effect(*at_best)}."
        )
    return out + [""]


def paired(baseline, changed) -> list:
    """Seed by seed, changed - baseline (None where either diverged)."""
    return [None if None in pair else pair[1] - pair[0] for pair in zip(baseline, changed)]


def _effect(baseline, changed) -> str:
    """'-0.4000 nats (-8.0 seed SDs)': the change of the mean, and in seed standard deviations."""
    change = mean_sd(changed)[0] - mean_sd(baseline)[0]
    if math.isnan(change):
        return "nothing measurable (a run diverged)"
    return f"{change:+.4f} nats ({sigmas(baseline, changed):+.1f} seed SDs)"


def _mean_or_dash(values) -> str:
    found = [v for v in values if v is not None]
    return f"{np.mean(found):.1f}" if found else "-"


def wsd_section(r: dict) -> list[str]:
    """Each WSD branch beside the cosine run of its length, and what the branches cost."""
    s = r["settings"]
    lengths = [int(L) for L in r["wsd"]]
    out = [
        "## 3. WSD: decay branches from one stable run, against one cosine run per length",
        "",
        "| steps | cosine to 10% | WSD branch to 10% | branch − cosine, seed by seed | seeds "
        "where the branch is lower |",
        "|---:|---:|---:|---:|---:|",
    ]
    for L in lengths:
        row = r["wsd"][str(L)]
        gap = paired(row["cosine"], row["branch"])
        lower = sum(g is not None and g < 0 for g in gap)
        out.append(
            f"| {L} | {_pm(row['cosine'])} | {_pm(row['branch'])} | {_pm(gap)} | "
            f"{lower} of {len(gap)} |"
        )
    gaps = [
        g for L in lengths for g in paired(r["wsd"][str(L)]["cosine"], r["wsd"][str(L)]["branch"])
    ]
    if all(g is not None and g < 0 for g in gaps):
        out += ["", "Every branch ends below the cosine run of its length, in every seed."]
    elif all(g is not None and g > 0 for g in gaps):
        out += ["", "Every branch ends above the cosine run of its length, in every seed."]
    else:
        out += ["", "The branches and the cosine runs trade places from seed to seed."]
    full = r["wsd"][str(max(lengths))]["branch"]
    stable = max(L - int(round(s["decay_fraction"] * L)) for L in lengths)
    branch_steps = sum(int(round(s["decay_fraction"] * L)) for L in lengths)
    out += [
        "",
        f"Decaying to 0 instead of 10% at {max(lengths)} steps: {_pm(r['wsd_to_zero'])}, a "
        f"change of {_effect(full, r['wsd_to_zero'])}. The stable run before any decay (step "
        f"{stable}): {_pm(r['wsd_stable'])}.",
        "",
        f"Cost per seed: the cosine runs take {sum(lengths):,} steps together; the stable run and "
        f"its branches {stable + branch_steps:,} ({stable} + {branch_steps}), "
        f"{1 - (stable + branch_steps) / sum(lengths):.0%} fewer, and one more length costs one "
        "more branch.",
        "",
    ]
    return out


def width_section(r: dict) -> list[str]:
    """Where the best learning rate sits at each width, plain and with the width rule."""
    s, widths = r["settings"], sorted({row["width"] for row in r["width"]})
    best = {}
    for rule in ("plain", "rule"):
        for w in widths:
            rows = [x for x in r["width"] if x["width"] == w and x["rule"] == rule]
            best[(rule, w)] = min(rows, key=lambda x: _finite(x["loss"]))
    out = [
        "## 4. Width transfer: the best learning rate as the model widens",
        "",
        f"AdamW, seed 0, the optimizer experiment's runs at each width (heads of {HEAD_DIM}: "
        "more heads as it widens); the rule is "
        f"`{' '.join(s['width_rule'])}` (train.py section 3: the hidden matrices' rate x "
        "base / width, the embedding's and the gains' unchanged).",
        "",
        "| width | plain: best rate | its loss | rule: best rate | its loss |",
        "|---:|---:|---:|---:|---:|",
    ]
    for w in widths:
        plain, rule = best[("plain", w)], best[("rule", w)]
        out.append(
            f"| {w} | {plain['lr']:g} | {_loss(plain['loss'])} | {rule['lr']:g} | "
            f"{_loss(rule['loss'])} |"
        )
    small, large = widths[0], widths[-1]
    for rule in ("plain", "rule"):
        carried = best[(rule, small)]["lr"]
        at_large = next(
            x
            for x in r["width"]
            if x["width"] == large and x["rule"] == rule and x["lr"] == carried
        )
        cost = _finite(at_large["loss"]) - _finite(best[(rule, large)]["loss"])
        out.append(
            f"\n{rule}: width {small}'s best rate {carried:g} used at width {large} costs "
            f"{cost:+.4f} nats against width {large}'s own best."
        )
    return out + [""]


def recipe_report(r: dict) -> str:
    """REPORT.md: the four experiments, each computed from result.json."""
    s = r["settings"]
    head = [
        "# The 2024-26 recipe, measured on a CPU",
        "",
        "Every run but section 1's on the default model: `train.py`, "
        f"{s['n_layer']} layers of width {s['n_embd']} (heads of {HEAD_DIM}), {s['steps']} steps "
        f"of {s['batch_size']} x {s['block_size']} tokens on "
        f"`{s['data']}` ({s['vocab_size']}-token BPE), warmup {s['warmup_steps']} steps, "
        f"validation loss on the same {s['eval_windows']} held-out windows. Made by `python "
        f"scaling.py recipe`: {r['runs']} runs, {r['train_minutes']} minutes of training, "
        f"{s['workers']} side by side: about {r['train_minutes'] / s['workers']:.0f} minutes from "
        f"scratch (this invocation: {r['minutes']}; a rerun reuses every finished run).",
        "",
    ]
    sections = optimizer_section(r) + stability_section(r) + wsd_section(r) + width_section(r)
    return "\n".join(head + sections)


def plot_recipe(r: dict, path) -> pathlib.Path:
    """recipe.png: loss against learning rate for AdamW and Muon (seed 0) on the default model and
    on the recipe's, and at each width, plain (solid) and with the width rule (dashed)."""
    from machinery import scaling_plots

    plt = scaling_plots.pyplot()
    fig, (default, left, right) = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, grid in ((default, r["default"]["grid"]), (left, r["grid"])):
        for opt in ("adamw", "muon"):
            rates = sorted(grid[opt], key=float)
            losses = [_nan(grid[opt][x]) for x in rates]
            ax.plot([float(x) for x in rates], losses, "o-", label=opt)
    for color, w in zip(("C0", "C1", "C2", "C3"), sorted({x["width"] for x in r["width"]})):
        for rule, style in (("plain", "o-"), ("rule", "s--")):
            rows = [x for x in r["width"] if x["width"] == w and x["rule"] == rule]
            rows.sort(key=lambda x: x["lr"])
            rates, losses = [x["lr"] for x in rows], [_nan(x["loss"]) for x in rows]
            right.plot(rates, losses, style, color=color, label=f"width {w}, {rule}")
    titles = ("optimizer, default model", "optimizer, recipe model", "width transfer")
    for ax, title in zip((default, left, right), titles):
        ax.set_xscale("log")
        ax.minorticks_off()
        rates = sorted({line_x for line in ax.get_lines() for line_x in line.get_xdata()})
        ax.set_xticks(rates, [f"{x:g}" for x in rates])
        ax.set_xlabel("learning rate")
        ax.set_ylabel("validation loss")
        ax.set_title(title + " (seed 0)")
        ax.legend(fontsize=8)
    return scaling_plots.save_png(fig, path)


def _nan(loss) -> float:
    return math.nan if loss is None else loss
