"""The recall command's run and report: evaluate.py's MQAR comparison (recall_experiment) with its
models trained in parallel processes and what the run cost measured around it, then REPORT.md (the
learning-rate sweep, the accuracy table, the verdict, the decoding cost) and its figure.

Serves: machinery/commands/evaluate.py (`python evaluate.py recall`). Depends on evaluate.py, torch,
numpy and, for the figure, matplotlib.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import multiprocessing
import os
import resource
import time

import numpy as np
import torch

import evaluate
import model as model_lib
from evaluate import RECALL_KINDS

# Decoding is timed on this many threads (the same for every model and context), after this many
# warm-up tokens, as the median over the timed tokens.
DECODE_THREADS, DECODE_WARMUP, DECODE_TOKENS = 1, 4, 32


def decode_cost(net, context: int, threads: int = DECODE_THREADS) -> dict:
    """Decoding one token after a prompt of `context` tokens: the median ms over DECODE_TOKENS
    steps after DECODE_WARMUP untimed ones, on `threads` threads, and the bytes each step reads
    (evaluate.decode_bytes_per_token). The same weights in a model whose block_size and cache hold
    the prompt and every new token, so nothing slides (RoPE has no table to outgrow)."""
    n_new = DECODE_WARMUP + DECODE_TOKENS
    long = model_lib.GPT(dataclasses.replace(net.config, block_size=context + n_new)).eval()
    long.load_state_dict(net.state_dict())
    cache = model_lib.KVCache(
        long.config.n_layer,
        1,
        long.config.n_kv_head,
        context + n_new,
        long.config.head_dim,
        kinds=long.config.layer_kinds,
    )
    threads_before = torch.get_num_threads()
    torch.set_num_threads(threads)
    step_ms = []
    try:
        with torch.no_grad():
            # the prompt in chunks of 512: the scores of one chunk are (512, context), not
            # (context, context)
            for start in range(0, context, 512):
                long(torch.zeros(1, min(512, context - start), dtype=torch.long), kv_cache=cache)
            token = torch.zeros(1, 1, dtype=torch.long)
            for _ in range(n_new):
                begun = time.perf_counter()
                long(token, kv_cache=cache)
                step_ms.append((time.perf_counter() - begun) * 1e3)
    finally:
        torch.set_num_threads(threads_before)
    state_bytes, weight_bytes = evaluate.decode_bytes_per_token(long.config, context)
    return {
        "context": context,
        "ms_per_token": float(np.median(step_ms[DECODE_WARMUP:])),
        "state_bytes": state_bytes,
        "weight_bytes": weight_bytes,
        "threads": threads,
    }


def _train_one(job: tuple) -> tuple[dict, dict]:
    """One model of the experiment, in a worker process on one thread (a second thread buys
    nothing on matmuls this small; the processes use the cores): its row, printed, and its
    weights."""
    torch.set_num_threads(1)
    row, weights = evaluate.recall_run(*job)
    print(
        f"  {row['kind']:<9} seed {row['seed']} lr {row['lr']:g}: "
        + "  ".join(f"{n} pairs {a:.3f}" for n, a in row["accuracy"].items()),
        flush=True,
    )
    return row, weights


def _cpu_seconds() -> float:
    """User + system CPU time of this process and of its finished (joined) children."""
    both = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in both)


def run_recall(
    pair_counts: list[int],
    seeds: int,
    steps: int,
    contexts: list[int],
    width: int = evaluate.RECALL_WIDTH,
    lrs=evaluate.RECALL_LRS,
    workers: int | None = None,
) -> dict:
    """evaluate.recall_experiment with each phase's models trained in `workers` processes (default
    one per model of the sweep: they share the cores). Then, in this process alone, the decoding
    cost of each kind's seed-0 model at every context (decode_cost). Also what the run cost: wall
    and CPU seconds, and the load average at the start and the end (a shared machine inflates
    both)."""
    started, cpu, load = time.perf_counter(), _cpu_seconds(), os.getloadavg()
    workers = workers or len(RECALL_KINDS) * len(lrs)
    # spawn, not fork: a forked child of a process that already ran torch's thread pool can hang
    with concurrent.futures.ProcessPoolExecutor(
        workers, mp_context=multiprocessing.get_context("spawn")
    ) as pool:
        result = evaluate.recall_experiment(
            pair_counts,
            seeds,
            steps,
            width,
            lrs,
            train_all=lambda jobs: list(pool.map(_train_one, jobs)),
        )
    costs = []
    for kind, weights in result.pop("weights").items():
        net = model_lib.GPT(evaluate.recall_config(kind, pair_counts, width)).eval()
        net.load_state_dict(weights)
        costs += [{"kind": kind, **decode_cost(net, context)} for context in contexts]
    return {
        **result,
        "costs": costs,
        "wall_s": time.perf_counter() - started,
        "cpu_s": _cpu_seconds() - cpu,
        "workers": workers,
        "cores": os.cpu_count(),
        "load_start": load[0],
        "load_end": os.getloadavg()[0],
    }


def _cost_lines(costs: list[dict]) -> list[str]:
    """The decoding table and, per kind, how ms and bytes per token change from the shortest
    context to the longest (computed from the table)."""
    lines = [
        "| model | context | ms / token (median) | KV cache + state read | + weights read |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {c['kind']} | {c['context']:,} | {c['ms_per_token']:.3f} | "
        f"{c['state_bytes'] / 1024:,.1f} KiB | "
        f"{(c['state_bytes'] + c['weight_bytes']) / 1024:,.1f} KiB |"
        for c in costs
    ]
    lines.append("")
    for kind in RECALL_KINDS:
        mine = sorted((c for c in costs if c["kind"] == kind), key=lambda c: c["context"])
        if len(mine) < 2:
            continue
        first, last = mine[0], mine[-1]
        read = [c["state_bytes"] + c["weight_bytes"] for c in (first, last)]
        lines.append(
            f"- {kind}: from {first['context']:,} to {last['context']:,} tokens of "
            f"context, ms / token x{last['ms_per_token'] / first['ms_per_token']:.2f}, "
            f"bytes read / token x{read[1] / read[0]:.2f}."
        )
    return lines


def recall_report(result: dict) -> str:
    """REPORT.md: the learning-rate sweep, accuracy per kind and pair count (mean, min-max over
    seeds), the verdict on the expected shape (recall_verdict, computed from the table), decoding
    cost and bytes read per token, and what the run cost on this machine."""
    counts, r = result["pair_counts"], result
    runs = {kind: [row for row in r["rows"] if row["kind"] == kind] for kind in RECALL_KINDS}
    # (kind -> per pair count, the accuracies of its seeds)
    cells = {kind: [[row["accuracy"][n] for row in runs[kind]] for n in counts] for kind in runs}
    verdict = evaluate.recall_verdict(result)
    patterns = ", ".join(f"{kind} `{pattern}`" for kind, pattern in r["patterns"].items())
    lines = [
        "# Associative recall (MQAR): attention, linear attention, hybrid",
        "",
        f"Made by `python evaluate.py recall --out docs/recall`: {r['layers']}-layer models "
        f"of width {r['width']} (heads: {r['heads']} of {r['width'] // r['heads']}; {patterns}; A "
        "attention, L gated linear attention), initialised by `evaluate.recall_init` (PyTorch's "
        "defaults, linear attention's gates at retention 1/2), "
        f"{r['steps']:,} AdamW steps of {r['batch']} rows (no weight decay, cosine decay), "
        f"{r['seeds']} seeds, scored on 256 fresh rows per pair count.",
        "",
        f"The run took {r['wall_s'] / 60:.1f} min of wall time and {r['cpu_s'] / 60:.1f} min "
        f"of CPU time ({r['workers']} processes of one thread, {r['cores']} cores); the load "
        f"average was {r['load_start']:.1f} at the start and {r['load_end']:.1f} at the end"
        + (
            ", so the machine was shared and the wall time and ms / token below are inflated."
            if max(r["load_start"], r["load_end"]) > r["cores"]
            else "."
        ),
        "",
        "## Learning rate (seed 0 of each kind at each rate; mean accuracy over the pair counts)",
        "",
        "| model | " + " | ".join(f"lr {lr:g}" for lr in r["lrs"]) + " | kept |",
        "|---|" + "---:|" * (len(r["lrs"]) + 1),
    ]
    for kind in RECALL_KINDS:
        swept = {
            row["lr"]: np.mean(list(row["accuracy"].values()))
            for row in r["sweep"]
            if row["kind"] == kind
        }
        lines.append(
            f"| {kind} | "
            + " | ".join(f"{swept[lr]:.3f}" for lr in r["lrs"])
            + f" | {r['lr'][kind]:g} |"
        )
    lines += [
        "",
        "Each kind's other seeds train at its kept rate (one rate per model).",
        "",
        "## Recall accuracy (mean over seeds, min-max in brackets)",
        "",
        "| model | params | " + " | ".join(f"{n} pairs" for n in counts) + " |",
        "|---|---:|" + "---:|" * len(counts),
    ]
    lines += [
        f"| {kind} | {runs[kind][0]['params']:,} | "
        + " | ".join(f"{np.mean(c):.3f} ({min(c):.2f}-{max(c):.2f})" for c in cells[kind])
        + " |"
        for kind in runs
    ]
    # every listed key is asked once: a model that recalls nothing can still answer with a value
    # not yet asked, right 1/n + 1/(n-1) + ... + 1 times in n: H_n / n
    elimination = [sum(1 / k for k in range(1, n + 1)) / n for n in counts]
    linear_reading = "its state per head is a fixed head_dim x head_dim matrix"
    linear_means = [np.mean(c) for c in cells["linear"]]
    if all(abs(m - e) <= 0.02 for m, e in zip(linear_means, elimination)):
        linear_reading = "it answers by elimination at every count: it recalled nothing here"
    lines += [
        "",
        "A model that answers with a random value from the context scores 1 / pairs: "
        + " / ".join(f"{1 / n:.2f}" for n in counts)
        + "; one that answers by elimination (the values not yet asked) H_n / n: "
        + " / ".join(f"{e:.2f}" for e in elimination)
        + ".",
        "",
        "## What the table says (computed from it, seed by seed)",
        "",
        f"- attention: {sum(verdict['attention'])} of {len(verdict['attention'])} seeds "
        f">= 0.95 at every pair count.",
        f"- linear: {sum(verdict['linear'])} of {len(verdict['linear'])} seeds down by "
        f">= 0.1 from {counts[0]} to {counts[-1]} pairs ({linear_reading}).",
        f"- hybrid: {sum(verdict['hybrid'])} of {len(verdict['hybrid'])} seeds at least "
        f"half-way from linear's mean to attention's at {counts[-1]} pairs, with one "
        f"attention layer in {r['layers']}.",
        "- the expected shape (all of the above, at least 3 seeds each): "
        f"**{'shown' if verdict['shown'] else 'not shown by this run'}**.",
        "",
        f"## Decoding cost per token at growing context (one sequence, fp32, "
        f"{r['costs'][0]['threads'] if r['costs'] else DECODE_THREADS} thread, median of "
        f"{DECODE_TOKENS} tokens after {DECODE_WARMUP} warm-up ones, seed 0's model)",
        "",
    ]
    lines += _cost_lines(r["costs"])
    lines += ["", "![recall vs pairs](recall.png)", ""]
    return "\n".join(lines)


def recall_figure(result: dict):
    """Accuracy against pairs, one line per kind (the mean) over its seeds' points: the matplotlib
    Figure (the command writes it)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    counts = result["pair_counts"]
    for i, kind in enumerate(RECALL_KINDS):
        runs = [r for r in result["rows"] if r["kind"] == kind]
        for r in runs:
            ax.scatter(counts, [r["accuracy"][n] for n in counts], color=f"C{i}", alpha=0.4, s=12)
        ax.plot(
            counts,
            [np.mean([r["accuracy"][n] for r in runs]) for n in counts],
            "o-",
            color=f"C{i}",
            label=f"{kind} ({result['patterns'][kind]})",
        )
    ax.set(
        xlabel="key-value pairs in the sequence",
        ylabel="recall accuracy",
        ylim=(0, 1.02),
        title="MQAR: what a fixed-size state forgets",
    )
    ax.set_xscale("log", base=2)
    ax.legend()
    return fig
