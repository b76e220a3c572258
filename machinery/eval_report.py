"""What evaluate.py's commands print and draw: the progress lines of a long evaluation; the tables
of the lecture's bits-per-byte example, of a checkpoint's scores, of a tokenizer-fair comparison,
of the emergence sweep and of the contamination check; the emergence figure. No lesson here: the
numbers come from evaluate.py.

Serves: machinery/commands/evaluate.py. Depends on evaluate.py, numpy and, for the figure,
matplotlib.
"""

from __future__ import annotations

import math
import sys
import time

import numpy as np

import evaluate

PROGRESS_EVERY_S = 10.0  # a long loop says where it is this often (a short one says nothing)


class Progress:
    """Where a loop is, on stderr, at most once every PROGRESS_EVERY_S seconds: 'held-out text: 120
    of 480 windows, 3.1/s, ETA 1m50s'. Scoring a checkpoint takes minutes on a busy CPU; these lines
    say it is moving and when it ends, and stdout keeps only the results. An instance is the
    `progress(done, total, detail)` callback evaluate.py's scoring loops take."""

    def __init__(self, what: str, unit: str):
        self.what, self.unit = what, unit
        self.start = self.last = time.perf_counter()

    def __call__(self, done: int, total: int, detail: str = "") -> None:
        now = time.perf_counter()
        if now - self.last < PROGRESS_EVERY_S:
            return
        self.last = now
        rate = done / max(now - self.start, 1e-9)
        left = round((total - done) / rate) if rate else 0
        print(
            f"{self.what}: {done:,} of {total:,} {self.unit}{detail}, {rate:,.1f}/s, "
            f"ETA {left // 60}m{left % 60:02d}s",
            file=sys.stderr,
            flush=True,
        )


def bpb_table(rows: list[tuple[str, int, float]], n_bytes: int) -> str:
    """Rows (name, tokens, perplexity) over the same text -> a table showing why per-token
    perplexity misleads."""
    lines = [
        f"same text of {n_bytes:,} bytes",
        f"{'model':<8}{'tokens':>8}{'ppl':>8}{'total nats':>12}{'bits/byte':>11}",
    ]
    for name, n_tokens, ppl in rows:
        lines.append(
            f"{name:<8}{n_tokens:>8,}{ppl:>8g}{n_tokens * math.log(ppl):>12.0f}"
            f"{evaluate.bpb_from_perplexity(n_tokens, ppl, n_bytes):>11.2f}"
        )
    best = min(rows, key=lambda r: evaluate.bpb_from_perplexity(r[1], r[2], n_bytes))
    lines.append(f"lower bits-per-byte predicts the text better: {best[0]}")
    return "\n".join(lines)


def format_evaluation(result: dict) -> str:
    """The table `python evaluate.py --ckpt` prints (evaluate.evaluate_checkpoint's dict)."""
    h, lw = result["held_out"], result["last_word"]
    lines = [
        f"checkpoint      {result['checkpoint']} (step {result['step']}, "
        f"{result['params']:,} parameters, vocab {result['vocab_size']:,})",
        f"held-out text   {h['data']}: {h['tokens']:,} tokens, {h['bytes']:,} bytes"
        + ("" if h["whole_split"] else " (a prefix)")
        + f", window {h['block_size']} stride {h['stride']}",
        f"{'metric':<34}{'value':>10}",
        f"{'loss (nats/token)':<34}{h['loss']:>10.4f}",
        f"{'perplexity':<34}{h['perplexity']:>10.2f}",
        f"{'bits per byte':<34}{h['bits_per_byte']:>10.4f}",
        f"{'tokens per byte':<34}{h['tokens_per_byte']:>10.4f}",
        f"{'next-token accuracy':<34}{h['token_accuracy']:>10.4f}",
        f"{'last word: exact match (%d items)' % lw['items']:<34}{lw['exact_match']:>10.4f}",
        f"{'last word: p(right word), mean':<34}{lw['p_answer']:>10.4f}",
        f"{'last word: answer-token accuracy':<34}{lw['answer_token_accuracy']:>10.4f}",
    ]
    if "tasks" in result:
        t = result["tasks"]
        lines += [
            f"{'tasks: exact match (%d items)' % t['items']:<34}{t['exact_match']:>10.4f}",
            f"{'tasks: p(right answer), mean':<34}{t['p_answer']:>10.4f}",
        ]
    for ex in lw["examples"]:
        lines.append(
            f"  ...{ex['prompt_tail'][-40:]!r} -> {ex['prediction']!r} "
            f"(right: {ex['answer'].strip()!r}, p = {ex['p_answer']:.3f})"
        )
    return "\n".join(lines)


def format_comparison(rows: list[dict]) -> str:
    """compare's table: one row per checkpoint, the same text, bits per byte last."""
    lines = [
        f"same text: {rows[0]['data']} ({rows[0]['bytes']:,} bytes)",
        f"{'checkpoint':<40}{'vocab':>7}{'tokens':>10}{'ppl':>9}{'total nats':>12}"
        f"{'bits/byte':>10}",
    ]
    for r in rows:
        lines.append(
            f"{r['checkpoint'][-40:]:<40}{r['vocab_size']:>7,}{r['tokens']:>10,}"
            f"{r['perplexity']:>9.2f}{r['loss'] * r['tokens']:>12,.0f}{r['bits_per_byte']:>10.4f}"
        )
    best = min(rows, key=lambda r: r["bits_per_byte"])
    lines.append(f"fewest bits per byte (predicts this text best): {best['checkpoint']}")
    return "\n".join(lines)


def format_emergence_sweep(rows: list[dict], k: int) -> str:
    """emergence's table: per model size, the smooth metric beside the all-or-nothing one."""
    lines = [
        f"{'non-emb params':>15}{'loss':>8}{'per-token acc':>15}{f'{k}-token EM':>12}"
        f"{f'acc^{k}':>9}  checkpoint"
    ]
    for r in rows:
        lines.append(
            f"{r['non_embedding_params']:>15,}{r['loss']:>8.3f}"
            f"{r['per_token_accuracy']:>15.4f}{r[f'exact_match_{k}']:>12.4f}"
            f"{r[f'accuracy_pow_{k}']:>9.4f}  {r['checkpoint']}"
        )
    return "\n".join(lines)


def emergence_figure(rows: list[dict], k: int):
    """Left: the lecture's arithmetic (p -> p^k). Right: the sweep, per-token accuracy and k-token
    exact match against model size. Returns the matplotlib Figure (the command writes it)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2))
    left, right = fig.subplots(1, 2)
    p = np.linspace(0, 1, 101)
    left.plot(p, p, label="per-step accuracy p")
    left.plot(p, p**k, label=f"{k}-step exact match p^{k}")
    left.scatter(
        evaluate.LECTURE_PER_STEP, [x**k for x in evaluate.LECTURE_PER_STEP], color="C1", zorder=3
    )
    left.set(
        xlabel="per-step accuracy (grows smoothly with scale)",
        ylabel="score",
        title="same progress, two metrics (the lecture's table)",
    )
    left.legend()
    if rows:
        n = [r["non_embedding_params"] for r in rows]
        right.plot(
            n,
            [r["per_token_accuracy"] for r in rows],
            "o-",
            label="per-token accuracy (continuous)",
        )
        right.plot(
            n,
            [r[f"exact_match_{k}"] for r in rows],
            "s-",
            label=f"{k}-token exact match (all or nothing)",
        )
        right.plot(
            n,
            [r[f"accuracy_pow_{k}"] for r in rows],
            ":",
            color="gray",
            label=f"per-token accuracy^{k}",
        )
        right.set_xscale("log")
        right.set_ylim(bottom=0)
        right.legend()
    right.set(xlabel="non-embedding parameters", ylabel="score on held-out text", title="our sweep")
    return fig


def format_contamination(report: dict, show: int = 10) -> str:
    """A summary and the most contaminated documents."""
    r = report
    lines = [
        f"training corpus : {r['train_documents']:,} documents, {r['train_words']:,} words, "
        f"{r['train_ngrams']:,} distinct {r['n']}-grams",
        f"{r['index'] + ' index':<16}: built in {r['build_s']:.1f} s, "
        f"raised peak memory by {r['peak_rss_growth_mb']:.0f} MB "
        f"(process peak {r['peak_rss_mb']:.0f} MB)",
        f"evaluation set  : {r['eval_documents']:,} documents, {r['eval_checkable']:,} with "
        f"{r['n']}+ words (checked in {r['check_s']:.2f} s)",
        f"contaminated    : {r['contaminated']:,} documents "
        f"({100 * r['contaminated_fraction']:.1f}%) share >= {r['min_overlap']} {r['n']}-gram(s) "
        f"with the training corpus",
    ]
    worst = sorted(
        (d for d in r["documents"] if d["contaminated"]), key=lambda d: (-d["fraction"], d["doc"])
    )
    if worst and show > 0:
        lines.append(
            f"{'doc':>6} {'ngrams':>7} {'shared':>7} {'frac':>6}  first shared {r['n']}-gram"
        )
        for d in worst[:show]:
            lines.append(
                f"{d['doc']:>6} {d['ngrams']:>7} {d['overlapping']:>7} "
                f"{d['fraction']:>6.2f}  {d['example']}"
            )
    return "\n".join(lines)
