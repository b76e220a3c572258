"""Evaluation: did training work? Perplexity, bits-per-byte, exact match, contamination, and the
emergence lesson.

A trained model is judged on text it has never seen (the held-out split, cut before training and
deduplicated together with the training data, or we would be grading it on questions it has already
read).

1. Perplexity. The model's loss on a token is -ln p(right token), in nats. Averaged over the
   held-out tokens it is the cross-entropy L, and perplexity = exp(L): "how many choices the model
   hesitates between". A model that spreads its probability evenly over a vocabulary of V tokens has
   L = ln V and perplexity exactly V.

2. Bits-per-byte. Perplexity is an average *per token*, and a token of one tokenizer is not the same
   amount of text as a token of another, so perplexities of models with different tokenizers cannot
   be compared. The lecture's example: the same 1,000-byte text is 250 tokens for model A at
   perplexity 18 and 400 tokens for model B at perplexity 12. B looks better, but A's total loss is
   250 x ln 18 = 723 nats and B's is 400 x ln 12 = 994 nats: A predicts the text better. Divide by
   what both share, the bytes:

       bits-per-byte = total nats / UTF-8 bytes / ln 2
       A: 723 / 1000 / 0.693 = 1.04        B: 994 / 1000 / 0.693 = 1.43

   (`python evaluate.py bpb` prints this table.) Bits-per-byte is also what compression means: 1.04
   bits per byte is a text compressed to 13% of its size.

3. Long texts. The model sees at most `block_size` tokens. Cutting a long text into disjoint blocks
   makes the first tokens of every block guess with almost no context. A sliding window with a
   stride s < block_size moves by s tokens and scores only the s newest tokens, so each token is
   scored exactly once with at least block_size - s tokens of context (at the cost of block_size / s
   times the compute). When the text fits in one window the result is exactly the plain evaluation.

4. Exact match. A set of questions with known answers ("The capital of France is" -> "Paris"),
   answered by greedy decoding, scored 1 only when the answer is exactly right after a documented
   normalisation (`normalize_answer`). It says whether the model is usable, but it is coarse: an
   extra token makes the answer wrong. The built-in task needs no download: LAMBADA-style last-word
   prediction on held-out paragraphs, scored both as exact match and as the probability the model
   gives the right word (a continuous metric).

5. Emergence. If a task needs k steps all right and the model gets each step right with probability
   p, exact match is p^k. With k = 5, a smooth per-step accuracy 0.5 / 0.6 / 0.7 / 0.8 / 0.9 / 0.95
   gives exact match 0.03 / 0.08 / 0.17 / 0.33 / 0.59 / 0.77: near zero for the first half, then a
   sudden climb. A plot of that looks like an ability "appearing" at some scale (Wei et al. 2022);
   Schaeffer et al. (2023) argue that much of it is the discontinuous metric.
   `python evaluate.py emergence` prints the table and, given the checkpoints of a scaling sweep,
   plots per-token accuracy (smooth) against k-token exact match (sudden) across real model sizes.
   Before calling a jump "emergence", ask what the metric is, and whether a continuous one jumps
   too.

6. Contamination. If evaluation text leaked into the training data, the score measures memory, not
   skill. The common check (GPT-3 and after): an evaluation document is contaminated when one of its
   13-word sequences (13-grams, lowercased words, punctuation ignored) also occurs in the training
   corpus. We report it per document and can drop the contaminated ones. Why 13 and not 6: between
   WikiText-2's validation and test articles (different articles), no 13-gram is shared, but 80 test
   paragraphs share a 6-gram ("and published by sega for the"): short n-grams flag common phrases,
   long ones flag copied text. The training side is a sorted numpy array of 64-bit n-gram hashes (8
   bytes per n-gram): the Python standard library (3.4M words, 3.1M distinct 13-grams) becomes 24 MB
   of hashes, and building it raises the peak memory by ~100 MB, where a Python set of word tuples
   raises it by ~740 MB (`--index set`).

7. Recall (MQAR, Arora et al. 2023, "Zoology"). A sequence lists key-value pairs, then asks for keys
   again: "k1 v1 k2 v2 ... k1 ? k2 ?": after each repeated key the model must output its value.
   Attention looks the key up in its cache (one induction head); a linear-attention layer must have
   squeezed every pair into its fixed d x d state, which holds about d clean facts before they blur.
   `python evaluate.py recall` trains all-attention, all-linear and hybrid models of equal size on
   it and writes docs/recall/REPORT.md.

The metrics work on any causal language model that maps token ids (B, T) to logits (B, T, V) (or
returns (logits, loss)).

Depends on: torch, numpy and five siblings. dedup.py: the contamination check's n-gram index
(shingle overlap between corpora is its topic; numpy only). train.py (its checkpoint loader, which
builds the GPT and the tokenizer), data.py (held-out token shards, text sources), model.py (the
check of --device) and fileio.py (task files), imported only where checkpoints, datasets and task
files are loaded, so the metrics can be copied with dedup alone. cli.py (the shared parser and
argparse types) only in build_parser().

    python evaluate.py --ckpt out/                         loss, perplexity, bits/byte, last word
    python evaluate.py --ckpt out/ --data wiki.test.raw    the same on any text (--tasks FILE.jsonl)
    python evaluate.py bpb                                 the lecture's 1.04 vs 1.43 example
    python evaluate.py emergence [--ckpt RUN ...]          the p^k table; a sweep's plot
    python evaluate.py contamination --train T --eval E    13-gram overlap per document (--drop OUT)
    python evaluate.py compare --ckpt A --ckpt B --data F  two tokenizers, one text, bits-per-byte
    python evaluate.py sample --ckpt out/ --prompt "def"   streaming generation (--top-k, ...)
    python evaluate.py recall                              MQAR: attention vs linear vs hybrid
"""
from __future__ import annotations

import argparse
import codecs
import concurrent.futures
import dataclasses
import itertools
import json
import math
import os
import pathlib
import random
import re
import resource
import sys
import tempfile
import time
import unicodedata

import numpy as np
import torch
import torch.nn.functional as F

import dedup


class EvalError(Exception):
    """A bad input (missing checkpoint, malformed task file, empty evaluation set): one line for the
    user."""


# --------------------------------------------------------------------------------------------------
# 1. Perplexity and bits-per-byte
# --------------------------------------------------------------------------------------------------

LN2 = math.log(2.0)


def perplexity(mean_nats: float) -> float:
    """exp of the mean per-token loss in nats. perplexity(math.log(18)) -> 18.0"""
    return math.exp(mean_nats)


def bits_per_byte(total_nats: float, n_bytes: int) -> float:
    """Total loss of a text in nats -> bits per UTF-8 byte.
    bits_per_byte(250 * math.log(18), 1000) -> 1.0425"""
    if n_bytes <= 0:
        raise EvalError("bits-per-byte needs a text of at least one byte")
    return total_nats / n_bytes / LN2


def bpb_from_perplexity(n_tokens: int, ppl: float, n_bytes: int) -> float:
    """The lecture's conversion: n_tokens at perplexity ppl over n_bytes.
    (400, 12, 1000) -> 1.434"""
    return bits_per_byte(n_tokens * math.log(ppl), n_bytes)


def bpb_table(rows: list[tuple[str, int, float]], n_bytes: int) -> str:
    """Rows (name, tokens, perplexity) over the same text -> a table showing why per-token
    perplexity misleads."""
    lines = [f"same text of {n_bytes:,} bytes",
             f"{'model':<8}{'tokens':>8}{'ppl':>8}{'total nats':>12}{'bits/byte':>11}"]
    for name, n_tokens, ppl in rows:
        lines.append(f"{name:<8}{n_tokens:>8,}{ppl:>8g}{n_tokens * math.log(ppl):>12.0f}"
                     f"{bpb_from_perplexity(n_tokens, ppl, n_bytes):>11.2f}")
    best = min(rows, key=lambda r: bpb_from_perplexity(r[1], r[2], n_bytes))
    lines.append(f"lower bits-per-byte predicts the text better: {best[0]}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# 2. Scoring every token of a long text with a sliding window
# --------------------------------------------------------------------------------------------------

def device_of(model) -> torch.device:
    """Where the model's weights live (CPU for a model without parameters)."""
    first = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    return first.device if first is not None else torch.device("cpu")


def logits_of(model, idx: torch.Tensor) -> torch.Tensor:
    """Logits (B, T, V) for ids (B, T) from a model that returns logits or (logits, loss), on the
    model's device."""
    idx = idx.to(device_of(model))
    out = model(idx)
    logits = out[0] if isinstance(out, (tuple, list)) else out
    if logits.dim() != 3 or logits.shape[:2] != idx.shape:
        raise EvalError(f"the model returned logits of shape {tuple(logits.shape)} for input "
                        f"{tuple(idx.shape)}; evaluation needs logits for every position (B, T, V)")
    return logits


def window_plan(n_ids: int, block_size: int, stride: int) -> list[tuple[int, int, int]]:
    """Windows (start, end, first) over n_ids ids: the input is ids[start:end], the targets
    ids[start+1:end+1], and only the targets ids[first+1:end+1] are new to this window. Each of the
    n_ids - 1 targets is scored once.

    window_plan(10, 4, 2) -> [(0, 4, 0), (2, 6, 4), (4, 8, 6), (5, 9, 8)]
    (the first window scores ids 1..4, the next ones the 2 newest ids each, the last one the single
    id left).
    """
    if not 1 <= stride <= block_size:
        raise EvalError(f"stride must be between 1 and the block size {block_size}, got {stride}")
    last = n_ids - 1                       # index of the last target
    end = min(block_size, last)
    plan = [(0, end, 0)]
    while end < last:
        new_end = min(end + stride, last)
        plan.append((max(0, new_end - block_size), new_end, end))
        end = new_end
    return plan


PROGRESS_EVERY_S = 10.0      # a long loop says where it is this often (a short one says nothing)


class Progress:
    """Where a loop of known length is, on stderr, at most once every PROGRESS_EVERY_S seconds:
    'held-out text: 120 of 480 windows, 3.1/s, ETA 1m50s'. Scoring a checkpoint takes minutes on a
    busy CPU; these lines say it is moving and when it ends, and stdout keeps only the results."""

    def __init__(self, what: str, total: int, unit: str):
        self.what, self.total, self.unit = what, total, unit
        self.start = self.last = time.perf_counter()

    def update(self, done: int, detail: str = "") -> None:
        now = time.perf_counter()
        if now - self.last < PROGRESS_EVERY_S:
            return
        self.last = now
        rate = done / max(now - self.start, 1e-9)
        left = round((self.total - done) / rate) if rate else 0
        print(f"{self.what}: {done:,} of {self.total:,} {self.unit}{detail}, {rate:,.1f}/s, "
              f"ETA {left // 60}m{left % 60:02d}s", file=sys.stderr, flush=True)


@dataclasses.dataclass
class TokenScores:
    """Per-target results of a teacher-forced pass: nll[i] = -ln p(ids[i+1] | ids[:i+1]) and
    correct[i] = whether the model's top choice was ids[i+1]."""
    nll: np.ndarray        # (N-1,) float64, nats
    correct: np.ndarray    # (N-1,) bool

    @property
    def n_tokens(self) -> int:
        return len(self.nll)

    @property
    def total_nats(self) -> float:
        return float(self.nll.sum())

    @property
    def mean_nats(self) -> float:
        return self.total_nats / self.n_tokens

    @property
    def accuracy(self) -> float:
        return float(self.correct.mean())


@torch.no_grad()
def score_tokens(model, ids, block_size: int, stride: int | None = None,
                 batch_size: int = 8, progress: bool = False) -> TokenScores:
    """Teacher-forced loss and top-1 correctness for every id after the first, with a sliding
    window.

    ids: a sequence of N >= 2 token ids. stride defaults to block_size (disjoint blocks).
    Windows of equal length are stacked into batches of `batch_size` (B, block_size).
    progress: say on stderr how many windows are done (Progress).
    """
    ids = torch.as_tensor(ids, dtype=torch.long).flatten()
    if ids.numel() < 2:
        raise EvalError(f"the evaluation text is {ids.numel()} token(s); at least 2 are needed "
                        "(give a longer text)")
    plan = window_plan(ids.numel(), block_size, stride or block_size)
    nll = np.empty(ids.numel() - 1, dtype=np.float64)
    correct = np.empty(ids.numel() - 1, dtype=bool)
    # The first window may be shorter than block_size; every later one has exactly block_size ids,
    # so they stack.
    groups = [plan[:1]] + [plan[i:i + batch_size] for i in range(1, len(plan), batch_size)]
    ticker = Progress("held-out text", len(plan), "windows") if progress else None
    windows_done = 0
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    try:
        for group in groups:
            x = torch.stack([ids[s:e] for s, e, _ in group])             # (B, T)
            y = torch.stack([ids[s + 1:e + 1] for s, e, _ in group])     # (B, T)
            logits = logits_of(model, x).float()                         # (B, T, V)
            y = y.to(logits.device)
            token_nll = F.cross_entropy(logits.transpose(1, 2), y, reduction="none")   # (B, T)
            hit = logits.argmax(dim=-1) == y                                            # (B, T)
            for row, (s, e, first) in enumerate(group):
                # window positions whose targets were not scored before
                new = slice(first - s, e - s)
                nll[first:e] = token_nll[row, new].double().cpu().numpy()
                correct[first:e] = hit[row, new].cpu().numpy()
            windows_done += len(group)
            if ticker:
                ticker.update(windows_done)
    finally:
        if was_training:
            model.train()
    return TokenScores(nll, correct)


# --------------------------------------------------------------------------------------------------
# 3. Exact match: greedy answers, a documented normalisation, the probability of the right answer
# --------------------------------------------------------------------------------------------------

_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """The normalisation exact match compares under (SQuAD's, plus Unicode NFKC first): NFKC
    (full-width letters, ligatures -> plain ones), case-folded, punctuation (Unicode category P*)
    deleted, the articles a / an / the dropped, whitespace runs collapsed to one space, ends
    stripped.

    normalize_answer("  The Eiffel Tower! ") -> "eiffel tower"
    normalize_answer("ＰＡＲＩＳ.") -> "paris"
    """
    text = unicodedata.normalize("NFKC", text).casefold()
    text = "".join(ch for ch in text if not unicodedata.category(ch).startswith("P"))
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, answer: str) -> bool:
    """exact_match("the Paris.", "Paris") -> True; exact_match("Paris, France", "Paris") -> False"""
    return normalize_answer(prediction) == normalize_answer(answer)


def leading_words(text: str, n_words: int) -> str:
    """What a greedy continuation answered: its first line, cut to the answer's number of words.
    leading_words(" Paris is big\\nNext", 1) -> "Paris"
    """
    return " ".join(text.split("\n")[0].split()[:n_words])


@dataclasses.dataclass
class Task:
    """One question: the model continues `prompt`; `answer` is the right continuation (with its
    leading space)."""
    prompt: str
    answer: str


def _jsonl_objects(path: pathlib.Path):
    """(line number, parsed object) for each non-blank line of a jsonl file; a line that is not JSON
    is an EvalError naming its number."""
    from machinery import fileio
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            # fileio: bad syntax, bad UTF-8 and JSON nested thousands deep are one line
            if line.strip():
                yield number, fileio.parse_json(line, f"{path} line {number}", EvalError,
                                                "each line must be one JSON object")


# --max-tasks: each task decodes its answer token by token; 1,000,000 would take hours
MAX_TASKS = 10_000


def read_tasks(path, limit: int = MAX_TASKS) -> list[Task]:
    """A jsonl task file: one {"prompt": "...", "answer": "..."} object per line (blank lines
    skipped). A malformed line is reported with its number; a file of more than `limit` tasks is
    refused (--max-tasks)."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise EvalError(f"--tasks {path} {'is a directory' if path.is_dir() else 'not found'}: "
                        f"give a jsonl file of {{\"prompt\": ..., \"answer\": ...}} lines")
    tasks = []
    try:
        for number, item in _jsonl_objects(path):
            if not (isinstance(item, dict) and isinstance(item.get("prompt"), str)
                    and isinstance(item.get("answer"), str) and item["answer"].strip()):
                raise EvalError(f"{path} line {number}: needs string fields \"prompt\" and a "
                                f"non-empty \"answer\"")
            tasks.append(Task(item["prompt"], item["answer"]))
            if len(tasks) > limit:
                raise EvalError(f"{path} holds more than {limit:,} tasks (--max-tasks), hours of "
                                f"decoding; raise --max-tasks or score a sample of the file")
    except EvalError as e:
        raise EvalError(f"--tasks {e}") from None
    if not tasks:
        raise EvalError(f"task file {path} has no tasks: add jsonl lines "
                        f"{{\"prompt\": ..., \"answer\": ...}}")
    return tasks


def split_paragraphs(text: str) -> list[str]:
    """Paragraphs are separated by blank (or whitespace-only) lines.
    "a\\nb\\n \\nc" -> ["a\\nb", "c"]"""
    # runs of consecutive lines, each run all blank or all non-blank: (non_blank, its lines)
    runs = itertools.groupby(text.splitlines(), key=lambda line: bool(line.strip()))
    return ["\n".join(lines) for non_blank, lines in runs if non_blank]


# The last word of a paragraph: letters only, after a space, followed only by punctuation (WikiText
# spaces it out).
_LAST_WORD = re.compile(r" ([^\W\d_]+)(?:\s*[^\w\s])*\s*$")


def last_word_tasks(documents: list[str], n_items: int = 200, min_words: int = 20, seed: int = 0,
                    max_prompt_chars: int = 2000) -> list[Task]:
    """LAMBADA-style items from held-out documents: at the end of every paragraph of min_words+
    words, predict its last word from everything before it in the document (the last
    max_prompt_chars characters of it).

    A paragraph ends at a blank line or the end of the document, and a line of min_words+ words is a
    paragraph by itself (WikiText puts one paragraph per line). "... the lobsters are blue ." gives
    Task(prompt="... the lobsters are", answer=" blue"). At most n_items, drawn with `seed`, kept in
    order.
    """
    items = []
    for doc in documents:
        lines = doc.split("\n")
        offset, words_so_far = 0, 0
        for i, line in enumerate(lines):
            n_words = len(line.split())
            words_so_far = words_so_far + n_words if n_words else 0
            ends_paragraph = n_words and (i + 1 == len(lines) or not lines[i + 1].strip()
                                          or n_words >= min_words)
            if ends_paragraph:
                m = _LAST_WORD.search(line)
                if m and words_so_far >= min_words:
                    cut = offset + m.start()
                    prompt = doc[max(0, cut - max_prompt_chars):cut]
                    if cut > max_prompt_chars:          # do not start in the middle of a word
                        prompt = prompt[prompt.find(" ") + 1:]
                    items.append(Task(prompt, " " + m.group(1)))
                words_so_far = 0
            offset += len(line) + 1
    if not items:
        raise EvalError(f"no held-out paragraph has {min_words}+ words ending in a word: "
                        "evaluate on a longer text (--data) or lower --min-words")
    if len(items) > n_items:
        keep = sorted(random.Random(seed).sample(range(len(items)), n_items))
        items = [items[i] for i in keep]
    return items


@torch.no_grad()
def greedy_continue(model, prompt_ids: list[int], max_new_tokens: int, block_size: int,
                    stop=lambda ids: False) -> list[int]:
    """Greedy decoding: append the top token max_new_tokens times (context cropped to block_size),
    stopping early when stop(new_ids) is true. Returns the new ids."""
    ids = list(prompt_ids)
    for _ in range(max_new_tokens):
        x = torch.tensor([ids[-block_size:]], dtype=torch.long)       # (1, T)
        ids.append(int(logits_of(model, x)[0, -1].argmax()))
        if stop(ids[len(prompt_ids):]):
            break
    return ids[len(prompt_ids):]


@torch.no_grad()
def score_answer(model, prompt_ids: list[int], answer_ids: list[int],
                 block_size: int) -> tuple[float, int]:
    """Teacher-forced: (ln p(answer | prompt), how many answer tokens were the model's top choice).
    All answer tokens top-1 <=> greedy decoding from the prompt produces exactly these tokens."""
    ids = list(prompt_ids) + list(answer_ids)
    # (1, T): the prompt is cropped on the left
    x = torch.tensor([ids[:-1][-block_size:]], dtype=torch.long)
    # (A, V): the positions predicting the answer
    logits = logits_of(model, x)[0, -len(answer_ids):].float()
    y = torch.tensor(answer_ids, dtype=torch.long, device=logits.device)   # (A,)
    logprob = -F.cross_entropy(logits, y, reduction="sum").item()
    return logprob, int((logits.argmax(-1) == y).sum())


def _encode(tokenizer, text: str) -> list[int]:
    """Text -> ids with no special-token parsing (evaluation text is data, not markup); through the
    tokenizer's tiktoken twin when it has one (same ids, Rust speed)."""
    if hasattr(tokenizer, "to_tiktoken"):
        return tokenizer.to_tiktoken().encode_ordinary(text)
    if hasattr(tokenizer, "encode_ordinary"):
        return list(tokenizer.encode_ordinary(text))
    return list(tokenizer.encode(text))


def evaluate_tasks(model, tokenizer, tasks: list[Task], block_size: int, slack_tokens: int = 4,
                   n_examples: int = 3, label: str = "tasks") -> dict:
    """Exact match by greedy decoding, plus the continuous view of the same answers.

    For each task: greedy-decode up to len(answer tokens) + slack_tokens tokens (stopping at a
    newline or end-of-text), keep the first line's first as many words as the answer has, and
    compare under normalize_answer. The same answers are also scored teacher-forced: p(answer |
    prompt) and the fraction of answer tokens that were the model's top choice. `examples` shows the
    first right answer (if any) and the first wrong ones. A long set says on stderr where it is
    (Progress, named `label`).
    """
    if not tasks:
        raise EvalError("the task set is empty: nothing to score")
    eot = getattr(tokenizer, "eot_id", None)

    def stop(new_ids):
        return (eot is not None and new_ids[-1] == eot) or "\n" in tokenizer.decode(new_ids)

    # examples[True]: the tasks answered right, examples[False]: the others
    probs, token_hits, token_total, examples = [], 0, 0, {True: [], False: []}
    ticker = Progress(label, len(tasks), "scored")
    for number, task in enumerate(tasks, 1):
        prompt_ids, answer_ids = _encode(tokenizer, task.prompt), _encode(tokenizer, task.answer)
        if not prompt_ids:
            prompt_ids = [eot] if eot is not None else []
        if not prompt_ids or not answer_ids or len(answer_ids) >= block_size:
            raise EvalError(f"task {number}: the prompt must be non-empty and the answer shorter "
                            f"than the {block_size}-token context")
        logprob, n_top = score_answer(model, prompt_ids, answer_ids, block_size)
        generated = greedy_continue(model, prompt_ids, len(answer_ids) + slack_tokens, block_size,
                                    stop)
        if eot is not None and generated and generated[-1] == eot:
            generated = generated[:-1]
        prediction = leading_words(tokenizer.decode(generated), max(1, len(task.answer.split())))
        hit = exact_match(prediction, task.answer)
        probs.append(math.exp(logprob))
        token_hits += n_top
        token_total += len(answer_ids)
        examples[hit].append({"prompt_tail": task.prompt[-60:], "answer": task.answer,
                              "prediction": prediction, "exact_match": hit,
                              "p_answer": math.exp(logprob)})
        ticker.update(number, f" (exact match so far {len(examples[True]) / number:.3f})")
    shown = examples[True][:1] + examples[False][:n_examples - min(1, len(examples[True]))]
    return {"items": len(tasks), "exact_match": len(examples[True]) / len(tasks),
            "p_answer": float(np.mean(probs)), "answer_token_accuracy": token_hits / token_total,
            "examples": shown}


# --------------------------------------------------------------------------------------------------
# 4. Emergence: smooth per-step accuracy, sudden exact match
# --------------------------------------------------------------------------------------------------

LECTURE_PER_STEP = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)


def exact_match_from_per_step(per_step: float, k: int = 5) -> float:
    """All k independent steps right: per_step ** k. exact_match_from_per_step(0.8) -> 0.328"""
    return per_step ** k


def emergence_table(per_step=LECTURE_PER_STEP, k: int = 5) -> str:
    """The lecture's table: per-step accuracy 0.5 ... 0.95 -> 5-step exact match 0.03 ... 0.77."""
    head = f"{'per-step accuracy':<22}" + "".join(f"{p:>7.2f}" for p in per_step)
    row = f"{f'{k}-step exact match':<22}" + "".join(f"{exact_match_from_per_step(p, k):>7.2f}"
                                                      for p in per_step)
    return head + "\n" + row


def k_token_exact_match(correct: np.ndarray, k: int) -> float:
    """Fraction of start positions t whose next k tokens are all the model's top choice
    (teacher-forced), which is exactly the fraction where greedy decoding from the true prefix
    reproduces the next k tokens.
    k_token_exact_match(np.array([1, 1, 0, 1, 1, 1], bool), 2) -> 3/5
    """
    if len(correct) < k:
        raise EvalError(f"{len(correct)} scored tokens cannot hold a {k}-token run: "
                        "evaluate more tokens")
    run = np.concatenate([[0], np.cumsum(correct, dtype=np.int64)])
    return float(np.mean(run[k:] - run[:-k] == k))


# --------------------------------------------------------------------------------------------------
# 5. Contamination: 13-gram overlap between evaluation documents and the training corpus
# --------------------------------------------------------------------------------------------------

# The index itself is shingle overlap between two corpora, dedup.py's topic (its section 8): the
# training side becomes dedup.NgramIndex, every 13-gram hash in one sorted uint64 array (8 bytes per
# n-gram), or dedup.SetNgramIndex, a Python set of word tuples kept as the readable reference (~25x
# the memory). Each evaluation document is then looked up n-gram by n-gram (dedup.document_overlap):
# its 13-grams of lowercased words (dedup.overlap_words("It's 13 words, or so.") -> ["it", "s",
# "13", "words", "or", "so"]), the positions found in training, and the first shared one as the
# example.

def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024     # Linux reports KiB


def contamination_report(train_documents, eval_documents: list[str], n: int = 13,
                         min_overlap: int = 1, index: str = "hashed") -> dict:
    """Per evaluation document: how many of its n-grams occur in the training documents;
    contaminated when at least min_overlap do (GPT-3's rule is any, min_overlap=1). index: "hashed"
    (dedup.NgramIndex) or "set" (dedup.SetNgramIndex, the reference). Also the time the check took
    and how far building the index raised the process's peak memory."""
    if not eval_documents:
        raise EvalError("the evaluation set has no documents: nothing to check")
    if index not in ("hashed", "set"):
        raise EvalError(f"unknown index {index!r}: use hashed or set")
    start, peak_before = time.perf_counter(), _peak_rss_mb()
    ngram_index = (dedup.NgramIndex if index == "hashed" else dedup.SetNgramIndex)(n)
    for doc in train_documents:
        ngram_index.add(doc)
    ngram_index.freeze()
    built = time.perf_counter()
    if ngram_index.documents == 0:
        raise EvalError("the training corpus has no documents: nothing to check against")
    per_doc = []
    for i, doc in enumerate(eval_documents):
        row = dedup.document_overlap(ngram_index, doc)
        row.update(doc=i, contaminated=row["overlapping"] >= min_overlap,
                   preview=" ".join(doc.split())[:60])
        per_doc.append(row)
    flagged = sum(r["contaminated"] for r in per_doc)
    return {
        "n": n, "min_overlap": min_overlap, "index": index,
        "train_documents": ngram_index.documents, "train_words": ngram_index.words_seen,
        "train_ngrams": len(ngram_index),
        "eval_documents": len(per_doc), "eval_checkable": sum(r["ngrams"] > 0 for r in per_doc),
        "contaminated": flagged, "contaminated_fraction": flagged / len(per_doc),
        "build_s": built - start, "check_s": time.perf_counter() - built,
        "peak_rss_mb": _peak_rss_mb(), "peak_rss_growth_mb": _peak_rss_mb() - peak_before,
        "documents": per_doc,
    }


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
    worst = sorted((d for d in r["documents"] if d["contaminated"]),
                   key=lambda d: (-d["fraction"], d["doc"]))
    if worst and show > 0:
        lines.append(f"{'doc':>6} {'ngrams':>7} {'shared':>7} {'frac':>6}  "
                     f"first shared {r['n']}-gram")
        for d in worst[:show]:
            lines.append(f"{d['doc']:>6} {d['ngrams']:>7} {d['overlapping']:>7} "
                         f"{d['fraction']:>6.2f}  {d['example']}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# 6. Checkpoints and evaluation text
# --------------------------------------------------------------------------------------------------

def resolve_device(name: str = "auto") -> torch.device:
    """"auto": the GPU when there is one, else the CPU; model.py's one check of --device, as an
    EvalError.

    >>> resolve_device("meta")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    evaluate.EvalError: --device meta: meta tensors hold no data to compute with; use auto, cpu, ...
    """
    import model
    return model.resolve_device(name, EvalError)


def load_model(ckpt_path, device="cpu") -> tuple[object, object, dict]:
    """(GPT in eval mode, bpe.Tokenizer, checkpoint dict) from a checkpoint file or a run directory
    (its newest checkpoint that loads), via train.py's loader (torch.load with weights_only=True: no
    pickle code runs)."""
    import train
    path = pathlib.Path(ckpt_path)
    if not path.exists():
        raise EvalError(f"checkpoint {path} not found: train one (python train.py) or pass "
                        "--ckpt FILE_OR_RUN_DIR")
    try:
        ckpt = train.load_checkpoint(path, log=lambda message: print(message, file=sys.stderr))
    except train.TrainError as e:
        raise EvalError(f"cannot load checkpoint: {e}") from e
    if not ckpt.get("tokenizer_json"):
        raise EvalError(f"checkpoint {ckpt['path']} has no tokenizer (tokenizer_json): evaluation "
                        "needs the tokenizer it was trained with; save checkpoints with train.py, "
                        "which embeds it")
    try:
        model, tokenizer = train.model_from_checkpoint(ckpt, device)
    except (KeyError, RuntimeError, ValueError, TypeError) as e:
        raise EvalError(f"checkpoint {ckpt['path']} is damaged "
                        f"({type(e).__name__}: {str(e).splitlines()[0]})") from e
    return model, tokenizer, ckpt


@dataclasses.dataclass
class HeldOut:
    """Evaluation text as the model sees it: ids (each document preceded by <|endoftext|> when the
    tokenizer has one, as data.py packs them), the UTF-8 bytes of the text (for bits-per-byte) and
    the documents themselves."""
    name: str
    ids: np.ndarray            # (N,) int64
    n_bytes: int
    documents: list[str]


def held_out_from_documents(name: str, documents: list[str], tokenizer) -> HeldOut:
    """Tokenize documents with the model's tokenizer. With <|endoftext|> before each document (as
    data.py packs them) every byte of text lies in a predicted token; a tokenizer without it joins
    documents with a blank line."""
    documents = [d for d in documents if d.strip()]
    if not documents:
        raise EvalError(f"the evaluation set {name} is empty: give a text with at least one "
                        "non-blank document")
    eot = getattr(tokenizer, "eot_id", None)
    pieces = [[eot] + _encode(tokenizer, doc) if eot is not None
              else _encode(tokenizer, doc + "\n\n") for doc in documents]
    ids = np.fromiter((i for piece in pieces for i in piece), dtype=np.int64)
    n_bytes = sum(len(d.encode("utf-8")) + (0 if eot is not None else 2) for d in documents)
    return HeldOut(name, ids, n_bytes, documents)


def _data_error_types():
    import data as data_lib
    return data_lib, (data_lib.DataError, OSError, KeyError, ValueError)


def decode_documents(shards, eot_id: int | None, tokenizer):
    """Yield the text of each document packed in token shards (data.py puts <|endoftext|> before
    every document; a document may continue from one shard into the next). Reads one document at a
    time from the memory map."""
    carry: list[int] = []
    for shard in shards:
        cuts = (np.flatnonzero(np.asarray(shard) == eot_id) if eot_id is not None
                else np.zeros(0, np.int64))
        starts, ends = np.concatenate([[0], cuts + 1]), np.concatenate([cuts, [len(shard)]])
        for i, (a, b) in enumerate(zip(starts.tolist(), ends.tolist())):
            piece = (carry if i == 0 else []) + shard[a:b].tolist()
            if i == len(starts) - 1:
                carry = piece         # the shard's last document may go on in the next shard
            elif piece:
                yield tokenizer.decode(piece)
    if carry:
        yield tokenizer.decode(carry)


def open_split(data_dir, split: str):
    """(data.TokenData, its shards of `split`) with data.py's errors turned into one line."""
    data_lib, errors = _data_error_types()
    try:
        data = data_lib.TokenData(data_dir)
        data.tokenizer                # a damaged tokenizer.json fails here, not halfway through
    except errors as e:
        raise EvalError(f"cannot read the dataset {data_dir}: {e}") from e
    if split not in data.shards:
        raise EvalError(f"{data_dir} has no {split!r} split; evaluate another text with --data")
    return data, data.shards[split]


def held_out_from_data_dir(data_dir, tokenizer, tokenizer_json: str | None = None,
                           split: str = "val") -> HeldOut:
    """The held-out split of a prepared dataset directory (data.py's shards). Its ids are used as
    they are when the dataset was tokenized by this tokenizer; otherwise its text is decoded and
    re-tokenized."""
    data, shards = open_split(data_dir, split)
    ids = (np.concatenate([np.asarray(s, dtype=np.int64) for s in shards]) if shards
           else np.zeros(0, np.int64))
    if len(ids) < 2:
        raise EvalError(f"the {split} split of {data_dir} is empty: prepare the data with a "
                        "validation split")
    documents = [d for d in decode_documents(shards, data.eot_id, data.tokenizer) if d]
    if tokenizer_json is None or tokenizer_json != data.tokenizer.to_json():
        return held_out_from_documents(f"{data_dir} ({split}, re-tokenized)", documents, tokenizer)
    return HeldOut(f"{data_dir} ({split})", ids, int(data.manifest["splits"][split]["bytes"]),
                   documents)


def held_out_from_source(spec: str, tokenizer, tokenizer_json: str | None = None) -> HeldOut:
    """--data: a prepared dataset directory (its val split), or anything data.py reads (a
    .txt/.raw/.jsonl file, a directory of them, pydocs, pystdlib), read as documents and tokenized
    with the model's tokenizer."""
    path = pathlib.Path(spec)
    if (path / "manifest.json").is_file():
        return held_out_from_data_dir(path, tokenizer, tokenizer_json)
    data_lib, errors = _data_error_types()
    try:
        documents = list(data_lib.open_source(spec).documents())
    except errors as e:
        raise EvalError(f"cannot read --data {spec}: {e}") from e
    return held_out_from_documents(spec, documents, tokenizer)


def checkpoint_held_out(ckpt: dict, tokenizer, data: str | None) -> HeldOut:
    """--data if given, else the validation split the checkpoint was trained beside."""
    if data:
        return held_out_from_source(data, tokenizer, ckpt.get("tokenizer_json"))
    data_dir = ckpt.get("data_dir")
    if not data_dir or not (pathlib.Path(data_dir) / "manifest.json").is_file():
        raise EvalError(f"the checkpoint's dataset {data_dir!r} is not on this machine: "
                        "pass --data TEXT_OR_DATA_DIR")
    return held_out_from_data_dir(data_dir, tokenizer, ckpt.get("tokenizer_json"))


def perplexity_report(model, held: HeldOut, block_size: int, stride: int | None = None,
                      max_tokens: int | None = None, progress: bool = False) -> dict:
    """Mean loss, perplexity, bits-per-byte and tokens per byte of a model on held-out ids. With
    max_tokens only a prefix is scored and bits-per-byte uses the split's average bytes per
    token."""
    ids = held.ids if not max_tokens else held.ids[:max_tokens + 1]
    stride = stride or max(1, block_size // 2)
    scores = score_tokens(model, torch.from_numpy(np.ascontiguousarray(ids)), block_size, stride,
                          progress=progress)
    whole = len(ids) == len(held.ids)
    n_bytes = held.n_bytes if whole else held.n_bytes * scores.n_tokens / (len(held.ids) - 1)
    return {"data": held.name, "tokens": scores.n_tokens, "bytes": round(n_bytes),
            "whole_split": whole, "block_size": block_size, "stride": stride,
            "loss": scores.mean_nats, "perplexity": perplexity(scores.mean_nats),
            "bits_per_byte": bits_per_byte(scores.total_nats, n_bytes),
            "tokens_per_byte": scores.n_tokens / n_bytes, "token_accuracy": scores.accuracy}


def evaluate_checkpoint(ckpt_path, data: str | None = None, stride: int | None = None,
                        max_tokens: int | None = None, tasks_path=None, last_word_items: int = 200,
                        min_words: int = 20, seed: int = 0, device="cpu",
                        max_tasks: int = MAX_TASKS) -> dict:
    """Everything `python evaluate.py --ckpt PATH` reports, as one dict (written as JSON, printed as
    a table)."""
    # a bad task file fails before any work
    tasks = read_tasks(tasks_path, max_tasks) if tasks_path else None
    model, tokenizer, ckpt = load_model(ckpt_path, device)
    block_size = model.config.block_size
    held = checkpoint_held_out(ckpt, tokenizer, data)
    result = {"checkpoint": ckpt["path"], "step": ckpt.get("step"), "params": model.num_params(),
              "non_embedding_params": model.num_params(non_embedding=True),
              "vocab_size": len(tokenizer)}
    result["held_out"] = perplexity_report(model, held, block_size, stride, max_tokens,
                                           progress=True)
    result["last_word"] = evaluate_tasks(
        model, tokenizer, last_word_tasks(held.documents, last_word_items, min_words, seed),
        block_size, label="last-word tasks")
    if tasks is not None:
        result["tasks"] = dict(evaluate_tasks(model, tokenizer, tasks, block_size),
                               file=str(tasks_path))
    return result


def format_evaluation(result: dict) -> str:
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
        lines += [f"{'tasks: exact match (%d items)' % t['items']:<34}{t['exact_match']:>10.4f}",
                  f"{'tasks: p(right answer), mean':<34}{t['p_answer']:>10.4f}"]
    for ex in lw["examples"]:
        lines.append(f"  ...{ex['prompt_tail'][-40:]!r} -> {ex['prediction']!r} "
                     f"(right: {ex['answer'].strip()!r}, p = {ex['p_answer']:.3f})")
    return "\n".join(lines)


def write_json(obj, path) -> pathlib.Path:
    """Write JSON whole (fileio.write_atomic: temp file, rename, the umask's modes); failures are
    one EvalError."""
    return _write_whole(path, json.dumps(obj, indent=1) + "\n", "--json")


def _write_whole(path, content, flag: str) -> pathlib.Path:
    from machinery import fileio
    path = pathlib.Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return fileio.write_atomic(path, content, error=EvalError,
                                   fix=f"choose another {flag} path")
    except OSError as e:
        raise EvalError(f"cannot write {path} ({e.strerror}): choose another {flag} path") from e


# --------------------------------------------------------------------------------------------------
# 7. Tokenizer-fair comparison: two checkpoints, one text, bits-per-byte
# --------------------------------------------------------------------------------------------------

def compare_checkpoints(ckpt_paths: list, data: str | None = None, stride: int | None = None,
                        max_documents: int | None = None, device="cpu") -> list[dict]:
    """Each model reads the same documents through its own tokenizer; per-token numbers differ in
    meaning, bits per byte do not. Without --data, the first checkpoint's held-out documents are
    used for all."""
    if len(ckpt_paths) < 2:
        raise EvalError("compare needs at least two checkpoints: --ckpt A --ckpt B")
    documents, name, rows = None, data, []
    for path in ckpt_paths:
        model, tokenizer, ckpt = load_model(path, device)
        if documents is None:
            documents = checkpoint_held_out(ckpt, tokenizer, data).documents[:max_documents]
            name = data or f"held-out text of {ckpt['path']}"
        held = held_out_from_documents(name, documents, tokenizer)
        report = perplexity_report(model, held, model.config.block_size, stride)
        rows.append(dict(report, checkpoint=ckpt["path"], vocab_size=len(tokenizer)))
    return rows


def format_comparison(rows: list[dict]) -> str:
    lines = [f"same text: {rows[0]['data']} ({rows[0]['bytes']:,} bytes)",
             f"{'checkpoint':<40}{'vocab':>7}{'tokens':>10}{'ppl':>9}{'total nats':>12}"
             f"{'bits/byte':>10}"]
    for r in rows:
        lines.append(f"{r['checkpoint'][-40:]:<40}{r['vocab_size']:>7,}{r['tokens']:>10,}"
                     f"{r['perplexity']:>9.2f}{r['loss'] * r['tokens']:>12,.0f}"
                     f"{r['bits_per_byte']:>10.4f}")
    best = min(rows, key=lambda r: r["bits_per_byte"])
    lines.append(f"fewest bits per byte (predicts this text best): {best['checkpoint']}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# 8. Emergence on real checkpoints: per-token accuracy (smooth) vs k-token exact match (sudden)
# --------------------------------------------------------------------------------------------------

def expand_runs(paths: list) -> list:
    """A directory holding run directories (a sweep's output) stands for each run in it that has a
    checkpoint."""
    import train
    runs = []
    for path in map(pathlib.Path, paths):
        if path.is_dir() and not train.list_checkpoints(path):
            runs += sorted(d for d in path.iterdir() if d.is_dir() and train.list_checkpoints(d))
        else:
            runs.append(path)
    return runs


def emergence_sweep(ckpt_paths: list, k: int = 5, data: str | None = None, max_tokens: int = 20000,
                    device="cpu") -> list[dict]:
    """For each checkpoint (a scaling sweep's models), on the same held-out text: per-token
    accuracy, k-token exact match, the p^k prediction from per-token accuracy, and the loss. Sorted
    by non-embedding parameters."""
    ckpt_paths = expand_runs(ckpt_paths)
    if not ckpt_paths:
        raise EvalError("give the sweep's checkpoints: emergence --ckpt RUN1 --ckpt RUN2 ... "
                        "(or --ckpt SWEEP_DIR)")
    documents, rows = None, []
    for path in ckpt_paths:
        model, tokenizer, ckpt = load_model(path, device)
        if documents is None:
            documents = checkpoint_held_out(ckpt, tokenizer, data).documents
        held = held_out_from_documents(data or "held-out text", documents, tokenizer)
        ids = torch.from_numpy(np.ascontiguousarray(held.ids[:max_tokens + 1]))
        scores = score_tokens(model, ids, model.config.block_size,
                              max(1, model.config.block_size // 2))
        rows.append({"checkpoint": ckpt["path"],
                     "non_embedding_params": model.num_params(non_embedding=True),
                     "loss": scores.mean_nats, "tokens": scores.n_tokens,
                     "per_token_accuracy": scores.accuracy,
                     f"exact_match_{k}": k_token_exact_match(scores.correct, k),
                     f"accuracy_pow_{k}": scores.accuracy ** k})
    return sorted(rows, key=lambda r: r["non_embedding_params"])


def format_emergence_sweep(rows: list[dict], k: int) -> str:
    lines = [f"{'non-emb params':>15}{'loss':>8}{'per-token acc':>15}{f'{k}-token EM':>12}"
             f"{f'acc^{k}':>9}  checkpoint"]
    for r in rows:
        lines.append(f"{r['non_embedding_params']:>15,}{r['loss']:>8.3f}"
                     f"{r['per_token_accuracy']:>15.4f}{r[f'exact_match_{k}']:>12.4f}"
                     f"{r[f'accuracy_pow_{k}']:>9.4f}  {r['checkpoint']}")
    return "\n".join(lines)


def plot_emergence(rows: list[dict], k: int, png_path) -> pathlib.Path:
    """Left: the lecture's arithmetic (p -> p^k). Right: the sweep, per-token accuracy and k-token
    exact match against model size. Written atomically."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=(11, 4.2))
    left, right = fig.subplots(1, 2)
    p = np.linspace(0, 1, 101)
    left.plot(p, p, label="per-step accuracy p")
    left.plot(p, p ** k, label=f"{k}-step exact match p^{k}")
    left.scatter(LECTURE_PER_STEP, [x ** k for x in LECTURE_PER_STEP], color="C1", zorder=3)
    left.set(xlabel="per-step accuracy (grows smoothly with scale)", ylabel="score",
             title="same progress, two metrics (the lecture's table)")
    left.legend()
    if rows:
        n = [r["non_embedding_params"] for r in rows]
        right.plot(n, [r["per_token_accuracy"] for r in rows], "o-",
                   label="per-token accuracy (continuous)")
        right.plot(n, [r[f"exact_match_{k}"] for r in rows], "s-",
                   label=f"{k}-token exact match (all or nothing)")
        right.plot(n, [r[f"accuracy_pow_{k}"] for r in rows], ":", color="gray",
                   label=f"per-token accuracy^{k}")
        right.set_xscale("log")
        right.set_ylim(bottom=0)
        right.legend()
    right.set(xlabel="non-embedding parameters", ylabel="score on held-out text", title="our sweep")
    return _save_figure(fig, png_path, "--plot")


def _save_figure(fig, png_path, flag: str) -> pathlib.Path:
    """Write a matplotlib Figure as a PNG whole (_write_whole: temp file, rename). A Figure made
    without pyplot draws with the Agg renderer and is freed like any object: nothing to close."""
    fig.tight_layout()
    return _write_whole(png_path, lambda f: fig.savefig(f, format="png", dpi=110), flag)


# --------------------------------------------------------------------------------------------------
# 9. Sampling from a checkpoint, streamed as it is generated
# --------------------------------------------------------------------------------------------------

def stream_sample(model, tokenizer, prompt: str, max_new_tokens: int = 200,
                  temperature: float = 0.8, top_k: int | None = 50, seed: int = 0):
    """Yield text pieces as tokens are sampled (model.generate one token at a time, seeded, so the
    result equals a single generate call). Bytes of a character split across tokens are held back
    until the character is whole; generation stops at <|endoftext|>."""
    eot = getattr(tokenizer, "eot_id", None)
    prompt_ids = _encode(tokenizer, prompt) or ([eot] if eot is not None else [])
    if not prompt_ids:
        raise EvalError("the prompt is empty and the tokenizer has no <|endoftext|> to start "
                        "from: give --prompt")
    device = device_of(model)
    generator = torch.Generator(device=device).manual_seed(seed)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    idx = torch.tensor([prompt_ids], dtype=torch.long, device=device)   # (1, T)
    for _ in range(max_new_tokens):
        idx = model.generate(idx[:, -model.config.block_size:], 1, temperature=temperature,
                             top_k=top_k, generator=generator)
        token = int(idx[0, -1])
        if token == eot:
            break
        piece = decoder.decode(tokenizer.vocab[token])
        if piece:
            yield piece
    tail = decoder.decode(b"", final=True)
    if tail:
        yield tail


# --------------------------------------------------------------------------------------------------
# 10. Associative recall (MQAR): what linear attention gives up, what one attention layer buys back
# --------------------------------------------------------------------------------------------------

# GPTConfig.layer_pattern of each model, all RECALL_LAYERS deep and of the same width: the hybrid
# is the lecture's proportion, mostly linear layers with one attention layer (Jamba, Zamba,
# Griffin: one in four to one in eight).
RECALL_KINDS = {"attention": "AAAA", "linear": "LLLL", "hybrid": "LLLA"}
RECALL_LAYERS = 4
# Learning rates swept per kind, as Zoology does: each kind trains seed 0 at every rate, keeps the
# rate with the best mean accuracy over the pair counts, and trains its other seeds at that rate
# (one rate per model, not per seed). Pilots (one seed, 4 layers): attention sat on the 1 / pairs
# plateau (it answers with any value from the context) for hundreds of steps at some rates; the
# hybrid at 3e-3 left it by step 400.
RECALL_LRS = (1e-3, 3e-3, 1e-2)
RECALL_BATCH, RECALL_STEPS, RECALL_WIDTH, RECALL_VOCAB = 64, 1500, 32, 64
# Decoding is timed on this many threads (the same for every model and context), after this many
# warm-up tokens, as the median over the timed tokens.
DECODE_THREADS, DECODE_WARMUP, DECODE_TOKENS = 1, 4, 32


def mqar_batch(n_pairs: int, batch: int, vocab_size: int = 256, generator=None):
    """Multi-query associative recall: (idx, targets), each (batch, 4 * n_pairs).

    Keys come from the lower half of the vocabulary and values from the upper half, n_pairs distinct
    keys per row; the pairs are listed, then every key is asked again in a shuffled order, followed
    by its value. Only the values of the second half are targets (-1 elsewhere: the first half is
    random, nothing to learn).

    >>> idx, targets = mqar_batch(2, 1, vocab_size=8, generator=torch.Generator().manual_seed(0))
    >>> idx.tolist(), targets.tolist()
    ([[2, 7, 3, 7, 2, 7, 3, 7]], [[-1, -1, -1, -1, 7, -1, 7, -1]])
    """
    half = vocab_size // 2
    if not 1 <= n_pairs <= half:
        raise EvalError(f"{n_pairs} key-value pairs need {n_pairs} distinct keys, but "
                        f"vocab_size={vocab_size} "
                        f"has {half}; use 1 to {half} pairs")
    # (B, n) distinct keys
    keys = torch.rand(batch, half, generator=generator).argsort(-1)[:, :n_pairs]
    values = torch.randint(half, vocab_size, (batch, n_pairs), generator=generator)   # (B, n)
    # the questions' order
    order = torch.rand(batch, n_pairs, generator=generator).argsort(-1)
    # (B, 2n) k1 v1 k2 v2 ...
    listed = torch.stack((keys, values), -1).flatten(1)
    asked = torch.stack((keys.gather(1, order), values.gather(1, order)), -1).flatten(1)
    idx = torch.cat((listed, asked), 1)                                              # (B, 4n)
    targets = torch.full_like(idx, -1)
    targets[:, 2 * n_pairs:-1:2] = asked[:, 1::2]          # after the asked key comes its value
    return idx, targets


def recall_accuracy(model, n_pairs: int, n_rows: int = 256, seed: int = 0) -> float:
    """Fraction of asked keys whose value the model predicts (greedy), on fresh MQAR rows."""
    idx, targets = mqar_batch(n_pairs, n_rows, model.config.vocab_size,
                              torch.Generator().manual_seed(seed))
    with torch.no_grad():
        predicted = model(idx)[0].argmax(-1)
    asked = targets >= 0
    return (predicted[asked] == targets[asked]).float().mean().item()


def recall_config(kind: str, pair_counts: list[int], width: int = RECALL_WIDTH):
    """The GPTConfig of one model: RECALL_LAYERS layers of RECALL_KINDS[kind], 2 heads."""
    import model as model_lib
    return model_lib.GPTConfig(vocab_size=RECALL_VOCAB, block_size=4 * max(pair_counts),
                               n_layer=RECALL_LAYERS, n_head=2, n_kv_head=2, n_embd=width,
                               layer_pattern=RECALL_KINDS[kind])


def train_recall(kind: str, seed: int, pair_counts: list[int], steps: int,
                 width: int = RECALL_WIDTH, batch: int = RECALL_BATCH, lr: float = 3e-3):
    """A model of `kind` (RECALL_KINDS) trained on MQAR rows whose pair count cycles through
    pair_counts; AdamW without weight decay at lr, a 50-step warmup, cosine decay to 0. Returns
    the model in eval mode."""
    import model as model_lib
    torch.manual_seed(seed)
    net = model_lib.GPT(recall_config(kind, pair_counts, width))
    optimizer = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.98))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 50)
                                                 * 0.5 * (1 + math.cos(math.pi * s / steps)))
    generator = torch.Generator().manual_seed(seed + 1000)
    for step in range(steps):
        idx, targets = mqar_batch(pair_counts[step % len(pair_counts)], batch, RECALL_VOCAB,
                                  generator)
        _, loss = net(idx, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        optimizer.step()
        schedule.step()
    return net.eval()


def decode_bytes_per_token(config, context: int, bytes_per_value: int = 4) -> tuple[int, int]:
    """(KV cache + recurrent state, weights) bytes one decoding step reads after `context` tokens.

    Each attention layer reads every cached key and value (2 * n_kv_head * head_dim values a
    token: grows with context); each linear layer reads its (n_head, head_dim, head_dim) state
    (flat); every step reads all the weights once (GPTConfig.decode_state_bytes, fp32 here).

    >>> from model import GPTConfig
    >>> config = GPTConfig(vocab_size=64, n_layer=2, n_head=2, n_kv_head=2, n_embd=32,
    ...                    layer_pattern="LA")
    >>> decode_bytes_per_token(config, 100)[0]          # (2 * 2 * 16 * 100 + 2 * 16 * 16) * 4
    27648
    """
    return (config.decode_state_bytes(context, bytes_per_value=bytes_per_value),
            config.num_params() * bytes_per_value)


def decode_cost(net, context: int, threads: int = DECODE_THREADS) -> dict:
    """Decoding one token after a prompt of `context` tokens: the median ms over DECODE_TOKENS
    steps after DECODE_WARMUP untimed ones, on `threads` threads, and the bytes each step reads
    (decode_bytes_per_token). The same weights in a model whose block_size and cache hold the
    prompt and every new token, so nothing slides (RoPE has no table to outgrow)."""
    import model as model_lib
    n_new = DECODE_WARMUP + DECODE_TOKENS
    long = model_lib.GPT(dataclasses.replace(net.config, block_size=context + n_new)).eval()
    long.load_state_dict(net.state_dict())
    cache = model_lib.KVCache(long.config.n_layer, 1, long.config.n_kv_head, context + n_new,
                              long.config.head_dim, kinds=long.config.layer_kinds)
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
    state_bytes, weight_bytes = decode_bytes_per_token(long.config, context)
    return {"context": context, "ms_per_token": float(np.median(step_ms[DECODE_WARMUP:])),
            "state_bytes": state_bytes, "weight_bytes": weight_bytes, "threads": threads}


def _recall_run(kind: str, seed: int, pair_counts: list[int], steps: int, width: int, lr: float):
    """One model of the experiment, in a worker process on one thread (a second thread buys
    nothing on matmuls this small; the processes use the cores): its row and its weights."""
    torch.set_num_threads(1)
    begun = time.perf_counter()
    net = train_recall(kind, seed, pair_counts, steps, width, lr=lr)
    row = {"kind": kind, "seed": seed, "lr": lr, "params": net.num_params(),
           "train_s": time.perf_counter() - begun,
           "accuracy": {n: recall_accuracy(net, n, seed=10_000 + seed) for n in pair_counts}}
    print(f"  {kind:<9} seed {seed} lr {lr:g}: " + "  ".join(
        f"{n} pairs {a:.3f}" for n, a in row["accuracy"].items()), flush=True)
    return row, net.state_dict()


def _cpu_seconds() -> float:
    """User + system CPU time of this process and of its finished (joined) children."""
    both = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in both)


def best_lr(sweep: list[dict], kind: str) -> float:
    """The swept rate whose row of `kind` has the best mean accuracy (the lower rate on a tie)."""
    rows = sorted((row for row in sweep if row["kind"] == kind), key=lambda row: row["lr"])
    return max(rows, key=lambda row: np.mean(list(row["accuracy"].values())))["lr"]


def recall_experiment(pair_counts: list[int], seeds: int, steps: int, contexts: list[int],
                      width: int = RECALL_WIDTH, lrs=RECALL_LRS, workers: int | None = None):
    """Sweep: seed 0 of every kind at every rate of `lrs`. Then seeds 1.. of each kind at its best
    rate (best_lr); seed 0's row at that rate is reused. Training runs in `workers` processes
    (default one per model of a phase: they share the cores). Then, in this process alone, the
    decoding cost of each kind's seed-0 model at every context. Also what the run cost: wall and
    CPU seconds, and the load average at the start and the end (a shared machine inflates both)."""
    started, cpu, load = time.perf_counter(), _cpu_seconds(), os.getloadavg()
    sweep_jobs = [(kind, 0, lr) for kind in RECALL_KINDS for lr in lrs]
    # spawn, not fork: a forked child of a process that already ran torch's thread pool can hang
    import multiprocessing
    with concurrent.futures.ProcessPoolExecutor(
            workers or len(sweep_jobs), mp_context=multiprocessing.get_context("spawn")) as pool:
        swept = list(pool.map(_recall_run, *zip(*[(kind, seed, pair_counts, steps, width, lr)
                                                  for kind, seed, lr in sweep_jobs])))
        best = {kind: best_lr([row for row, _ in swept], kind) for kind in RECALL_KINDS}
        jobs = [(kind, seed, pair_counts, steps, width, best[kind])
                for kind in RECALL_KINDS for seed in range(1, seeds)]
        more = list(pool.map(_recall_run, *zip(*jobs))) if jobs else []
    chosen = {row["kind"]: (row, weights) for row, weights in swept
              if row["lr"] == best[row["kind"]]}
    rows = [row for kind in RECALL_KINDS
            for row in [chosen[kind][0]] + [r for r, _ in more if r["kind"] == kind]]
    costs = []
    for kind, (_, weights) in chosen.items():
        import model as model_lib
        net = model_lib.GPT(recall_config(kind, pair_counts, width)).eval()
        net.load_state_dict(weights)
        costs += [{"kind": kind, **decode_cost(net, context)} for context in contexts]
    return {"pair_counts": pair_counts, "seeds": seeds, "steps": steps, "width": width,
            "layers": RECALL_LAYERS, "patterns": RECALL_KINDS, "batch": RECALL_BATCH,
            "lrs": list(lrs), "lr": best, "sweep": [row for row, _ in swept], "rows": rows,
            "costs": costs, "wall_s": time.perf_counter() - started,
            "cpu_s": _cpu_seconds() - cpu, "workers": workers or len(sweep_jobs),
            "cores": os.cpu_count(), "load_start": load[0], "load_end": os.getloadavg()[0]}


def recall_verdict(result: dict) -> dict:
    """The expected shape, checked seed by seed on the accuracy table: every attention seed at
    >= 0.95 at every pair count; every linear seed down by >= 0.1 from the fewest to the most
    pairs; every hybrid seed, at the most pairs, at least half-way from linear's mean to
    attention's. "shown" needs all of it with at least 3 seeds of each kind.
    -> {kind: [passed, per seed], "shown": bool}."""
    counts = result["pair_counts"]
    runs = {kind: [row["accuracy"] for row in result["rows"] if row["kind"] == kind]
            for kind in RECALL_KINDS}
    att, lin = (float(np.mean([a[counts[-1]] for a in runs[kind]]))
                for kind in ("attention", "linear"))
    passed = {"attention": [min(a[n] for n in counts) >= 0.95 for a in runs["attention"]],
              "linear": [a[counts[0]] - a[counts[-1]] >= 0.1 for a in runs["linear"]],
              "hybrid": [att > lin and a[counts[-1]] - lin >= 0.5 * (att - lin)
                         for a in runs["hybrid"]]}
    shown = all(len(seeds) >= 3 and all(seeds) for seeds in passed.values())
    return {**passed, "shown": shown}


def _cost_lines(costs: list[dict]) -> list[str]:
    """The decoding table and, per kind, how ms and bytes per token change from the shortest
    context to the longest (computed from the table)."""
    lines = ["| model | context | ms / token (median) | KV cache + state read | + weights read |",
             "|---|---:|---:|---:|---:|"]
    lines += [f"| {c['kind']} | {c['context']:,} | {c['ms_per_token']:.3f} | "
              f"{c['state_bytes'] / 1024:,.1f} KiB | "
              f"{(c['state_bytes'] + c['weight_bytes']) / 1024:,.1f} KiB |"
              for c in costs]
    lines.append("")
    for kind in RECALL_KINDS:
        mine = sorted((c for c in costs if c["kind"] == kind), key=lambda c: c["context"])
        if len(mine) < 2:
            continue
        first, last = mine[0], mine[-1]
        read = [c["state_bytes"] + c["weight_bytes"] for c in (first, last)]
        lines.append(f"- {kind}: from {first['context']:,} to {last['context']:,} tokens of "
                     f"context, ms / token x{last['ms_per_token'] / first['ms_per_token']:.2f}, "
                     f"bytes read / token x{read[1] / read[0]:.2f}.")
    return lines


def recall_report(result: dict) -> str:
    """REPORT.md: the learning-rate sweep, accuracy per kind and pair count (mean, min-max over
    seeds), the verdict on the expected shape (recall_verdict, computed from the table), decoding
    cost and bytes read per token, and what the run cost on this machine."""
    counts, r = result["pair_counts"], result
    runs = {kind: [row for row in r["rows"] if row["kind"] == kind] for kind in RECALL_KINDS}
    # (kind -> per pair count, the accuracies of its seeds)
    cells = {kind: [[row["accuracy"][n] for row in runs[kind]] for n in counts] for kind in runs}
    verdict = recall_verdict(result)
    patterns = ", ".join(f"{kind} `{pattern}`" for kind, pattern in r["patterns"].items())
    lines = ["# Associative recall (MQAR): attention, linear attention, hybrid", "",
             f"Made by `python evaluate.py recall --out docs/recall`: {r['layers']}-layer models "
             f"of width {r['width']} ({patterns}; A attention, L gated linear attention), "
             f"{r['steps']:,} AdamW steps of {r['batch']} rows (no weight decay, cosine decay), "
             f"{r['seeds']} seeds, scored on 256 fresh rows per pair count.", "",
             f"The run took {r['wall_s'] / 60:.1f} min of wall time and {r['cpu_s'] / 60:.1f} min "
             f"of CPU time ({r['workers']} processes of one thread, {r['cores']} cores); the load "
             f"average was {r['load_start']:.1f} at the start and {r['load_end']:.1f} at the end"
             + (", so the machine was shared and the wall time and ms / token below are inflated."
                if max(r["load_start"], r["load_end"]) > r["cores"] else "."), "",
             "## Learning rate (seed 0 of each kind at each rate; mean accuracy over the pair "
             "counts)", "",
             "| model | " + " | ".join(f"lr {lr:g}" for lr in r["lrs"]) + " | kept |",
             "|---|" + "---:|" * (len(r["lrs"]) + 1)]
    for kind in RECALL_KINDS:
        swept = {row["lr"]: np.mean(list(row["accuracy"].values()))
                 for row in r["sweep"] if row["kind"] == kind}
        lines.append(f"| {kind} | " + " | ".join(f"{swept[lr]:.3f}" for lr in r["lrs"])
                     + f" | {r['lr'][kind]:g} |")
    lines += ["", "Each kind's other seeds train at its kept rate (one rate per model).", "",
              "## Recall accuracy (mean over seeds, min-max in brackets)", "",
              "| model | params | " + " | ".join(f"{n} pairs" for n in counts) + " |",
              "|---|---:|" + "---:|" * len(counts)]
    lines += [f"| {kind} | {runs[kind][0]['params']:,} | "
              + " | ".join(f"{np.mean(c):.3f} ({min(c):.2f}-{max(c):.2f})" for c in cells[kind])
              + " |" for kind in runs]
    lines += ["", "A model that answers with a random value from the context scores 1 / pairs: "
              + " / ".join(f"{1 / n:.2f}" for n in counts) + ".", "",
              "## What the table says (computed from it, seed by seed)", "",
              f"- attention: {sum(verdict['attention'])} of {len(verdict['attention'])} seeds "
              f">= 0.95 at every pair count.",
              f"- linear: {sum(verdict['linear'])} of {len(verdict['linear'])} seeds down by "
              f">= 0.1 from {counts[0]} to {counts[-1]} pairs (its state per head is a fixed "
              f"head_dim x head_dim matrix).",
              f"- hybrid: {sum(verdict['hybrid'])} of {len(verdict['hybrid'])} seeds at least "
              f"half-way from linear's mean to attention's at {counts[-1]} pairs, with one "
              f"attention layer in {r['layers']}.",
              "- the expected shape (all of the above, at least 3 seeds each): "
              f"**{'shown' if verdict['shown'] else 'not shown by this run'}**.", "",
              f"## Decoding cost per token at growing context (one sequence, fp32, "
              f"{r['costs'][0]['threads'] if r['costs'] else DECODE_THREADS} thread, median of "
              f"{DECODE_TOKENS} tokens after {DECODE_WARMUP} warm-up ones, seed 0's model)", ""]
    lines += _cost_lines(r["costs"])
    lines += ["", "![recall vs pairs](recall.png)", ""]
    return "\n".join(lines)


def plot_recall(result: dict, png_path) -> pathlib.Path:
    """Accuracy against pairs, one line per kind (the mean) over its seeds' points."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    counts = result["pair_counts"]
    for i, kind in enumerate(RECALL_KINDS):
        runs = [r for r in result["rows"] if r["kind"] == kind]
        for r in runs:
            ax.scatter(counts, [r["accuracy"][n] for n in counts], color=f"C{i}", alpha=0.4, s=12)
        ax.plot(counts, [np.mean([r["accuracy"][n] for r in runs]) for n in counts], "o-",
                color=f"C{i}", label=f"{kind} ({result['patterns'][kind]})")
    ax.set(xlabel="key-value pairs in the sequence", ylabel="recall accuracy", ylim=(0, 1.02),
           title="MQAR: what a fixed-size state forgets")
    ax.set_xscale("log", base=2)
    ax.legend()
    return _save_figure(fig, png_path, "--out")


# --------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------

def _read_documents(spec: str, split: str):
    """Documents for the contamination check, yielded one at a time (a training corpus is never held
    in memory by this function): a prepared dataset directory (decoded from its token shards, the
    given split), a .txt/.raw file split into paragraphs, a .jsonl file (its "text", or "prompt" +
    "answer"), or anything data.py reads (a directory of files, pydocs, pystdlib)."""
    path = pathlib.Path(spec)
    if (path / "manifest.json").is_file():
        data, shards = open_split(path, split)
        yield from decode_documents(shards, data.eot_id, data.tokenizer)
    elif path.is_file() and path.suffix == ".jsonl":
        for number, item in _jsonl_objects(path):
            try:
                yield item["text"] if "text" in item else item["prompt"] + item["answer"]
            except (KeyError, TypeError):
                raise EvalError(f"{path} line {number}: expected a JSON object with \"text\" "
                                "(or \"prompt\" and \"answer\")") from None
    elif path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise EvalError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start}): "
                            "give a text file") from e
        yield from split_paragraphs(text)
    else:
        data_lib, errors = _data_error_types()
        try:
            yield from data_lib.open_source(spec).documents()
        except errors as e:
            raise EvalError(f"cannot read {spec}: {e}") from e


def _write_kept(spec: str, documents: list[str], report: dict, out_path) -> pathlib.Path:
    """--drop: the evaluation documents that are not contaminated, as jsonl {"text": ...} (atomic
    write)."""
    kept = [doc for doc, row in zip(documents, report["documents"]) if not row["contaminated"]]
    return _write_whole(out_path, "".join(json.dumps({"text": doc}, ensure_ascii=False) + "\n"
                                          for doc in kept), "--drop")


def build_parser() -> argparse.ArgumentParser:
    from machinery.cli import Parser, in_range, writable
    count, seed, out_file = in_range(int, 1), in_range(int, 0, 2**32 - 1), writable("file")
    # --device, the same for the default command and every subcommand that loads a model
    device = argparse.ArgumentParser(add_help=False)
    device.add_argument("--device", default="auto",
                        help="auto (GPU if any), cpu, cuda, cuda:1, ...")
    parser = Parser(
        prog="evaluate.py", formatter_class=argparse.RawDescriptionHelpFormatter, parents=[device],
        description="Evaluate a checkpoint: held-out loss, perplexity, bits-per-byte, exact match; "
                    "the emergence lesson; contamination; tokenizer-fair comparison; sampling.",
        epilog="examples:\n  python evaluate.py --ckpt out/\n  python evaluate.py emergence\n"
               "  python evaluate.py contamination --train wiki.valid.raw --eval wiki.test.raw\n"
               "  python evaluate.py sample --ckpt out/ --prompt 'def '")
    parser.add_argument("--ckpt", default="out",
                        help="checkpoint file or run directory (newest checkpoint); default out/")
    parser.add_argument("--data", help="evaluation text: a data dir (val split), a .txt/.raw/"
                        ".jsonl file, pydocs, ...; default: the checkpoint's validation split")
    parser.add_argument("--stride", type=count,
                        help="sliding-window stride in tokens (default block_size / 2)")
    parser.add_argument("--max-tokens", type=count, help="score only the first N held-out tokens")
    parser.add_argument("--tasks", help="jsonl task file of {\"prompt\": ..., \"answer\": ...} for "
                                        "exact match")
    parser.add_argument("--max-tasks", type=count, default=MAX_TASKS,
                        help="refuse a --tasks file of more tasks (default %(default)s; a progress "
                             "line every 500)")
    parser.add_argument("--last-word-items", type=count, default=200,
                        help="items of the built-in last-word task")
    parser.add_argument("--min-words", type=count, default=20,
                        help="shortest paragraph for the last-word task")
    parser.add_argument("--seed", type=seed, default=0, help="seed for drawing last-word items")
    parser.add_argument("--json", type=out_file,
                        help="write the results here (default: eval_STEP.json beside the "
                             "checkpoint)")
    sub = parser.add_subparsers(dest="command",
                                metavar="{bpb,emergence,contamination,compare,recall,sample}",
                                parser_class=Parser)

    p = sub.add_parser("bpb", help="the lecture's bits-per-byte example (or your own numbers)")
    p.add_argument("--bytes", type=count, default=1000)
    p.add_argument("--tokens", type=count, nargs="+", default=[250, 400])
    p.add_argument("--ppl", type=in_range(float, 1.0, 1e30), nargs="+", default=[18, 12],
                   help="perplexity per --tokens entry (>= 1: e^loss with loss >= 0)")

    p = sub.add_parser("emergence", parents=[device],
                       help="the p -> p^k table; with --ckpt ... the plot from a sweep's "
                            "checkpoints")
    p.add_argument("--ckpt", action="append", default=[],
                   help="a sweep checkpoint or run directory (repeat), or a directory of run "
                        "directories")
    p.add_argument("--k", type=in_range(int, 1, 1000), default=5,
                   help="steps that must all be right")
    p.add_argument("--data",
                   help="held-out text for all models (default: the first checkpoint's val split)")
    p.add_argument("--max-tokens", type=count, default=20000)
    p.add_argument("--plot", type=out_file, default=None,
                   help="PNG path for the plot (with --ckpt; default emergence.png)")
    p.add_argument("--json", type=out_file, help="write the sweep's numbers here")

    p = sub.add_parser("contamination",
                       help="13-gram overlap of evaluation documents with a training corpus")
    p.add_argument("--train", required=True, nargs="+",
                   help="training corpus: data dir (its train split, decoded from the token "
                        "shards), text/jsonl file(s), pystdlib")
    p.add_argument("--eval", required=True,
                   help="evaluation documents: data dir (its val split), .txt/.raw (one document "
                        "per paragraph), .jsonl (text, or prompt + answer)")
    p.add_argument("--n", type=in_range(int, 1, 1000), default=13,
                   help="n-gram length in words (default 13)")
    p.add_argument("--min-overlap", type=count, default=1,
                   help="shared n-grams that flag a document (default 1)")
    p.add_argument("--show", type=in_range(int, 0), default=10,
                   help="how many flagged documents to list")
    p.add_argument("--index", choices=("hashed", "set"), default="hashed",
                   help="hashed: sorted uint64 n-gram hashes in numpy (default); set: Python set "
                        "of word tuples")
    p.add_argument("--drop", type=out_file,
                   help="write the uncontaminated evaluation documents here (jsonl)")
    p.add_argument("--json", type=out_file, help="write the full per-document report here")

    p = sub.add_parser("compare", parents=[device],
                       help="two checkpoints with different tokenizers on one text, by "
                            "bits-per-byte")
    p.add_argument("--ckpt", action="append", default=[], required=True,
                   help="a checkpoint (give two or more)")
    p.add_argument("--data", help="the text (default: the first checkpoint's held-out documents)")
    p.add_argument("--stride", type=count)
    p.add_argument("--max-documents", type=count, help="use only the first N documents")
    p.add_argument("--json", type=out_file)

    p = sub.add_parser("recall", help="MQAR: attention / linear / hybrid models, recall vs pairs")
    p.add_argument("--pairs", type=in_range(int, 1, RECALL_VOCAB // 2), nargs="+",
                   default=[2, 4, 8], help="key-value pair counts (sequence length 4 x pairs)")
    p.add_argument("--seeds", type=in_range(int, 1, 100), default=3)
    p.add_argument("--steps", type=in_range(int, 1, 1_000_000), default=RECALL_STEPS,
                   help="training steps per model")
    p.add_argument("--lr", type=in_range(float, 0.0, 1.0, low_open=True), nargs="+",
                   default=list(RECALL_LRS),
                   help="learning rates swept per kind on seed 0 (the best one trains the rest)")
    p.add_argument("--width", type=in_range(int, 4, 1024), default=RECALL_WIDTH,
                   help="n_embd (2 heads)")
    p.add_argument("--workers", type=in_range(int, 1, 256),
                   help="processes training models at once (default: one per model)")
    # a 4-layer attention model at width 1,024 holds 64 KiB of KV cache a token: 2**20 tokens
    # are 64 GiB, so the bound stays far below what the prompt's forward would allocate
    p.add_argument("--contexts", type=in_range(int, 1, 65_536), nargs="+",
                   default=[256, 2048, 16_384], help="prompt lengths at which decoding is timed")
    p.add_argument("--out", type=writable("dir"),
                   help="where REPORT.md, recall.png, recall.json go (default: a fresh folder "
                        "in the system's temporary folder; docs/recall holds the committed run)")

    p = sub.add_parser("sample", parents=[device],
                       help="generate from a checkpoint, streaming to stdout")
    p.add_argument("--ckpt", default="out")
    p.add_argument("--prompt", default="")
    p.add_argument("--max-new-tokens", type=in_range(int, 0, 1_000_000), default=200)
    p.add_argument("--temperature", type=in_range(float, 0.0, 100.0), default=0.8,
                   help="0 = greedy")
    p.add_argument("--top-k", type=in_range(int, 0), default=50, help="0 = all tokens")
    p.add_argument("--seed", type=seed, default=0)
    return parser


def run(args) -> None:
    to_json = None                  # what a command writes to its --json, once its output is shown
    if args.command == "bpb":
        if len(args.tokens) != len(args.ppl):
            raise EvalError("give one --ppl per --tokens entry")
        names = [chr(ord("A") + i) for i in range(len(args.tokens))]
        print(bpb_table(list(zip(names, args.tokens, args.ppl)), args.bytes))
    elif args.command == "emergence":
        print(emergence_table(k=args.k))
        if args.ckpt:
            to_json = emergence_sweep(args.ckpt, args.k, args.data, args.max_tokens, args.device)
            print("\n" + format_emergence_sweep(to_json, args.k))
            print(f"plot: {plot_emergence(to_json, args.k, args.plot or 'emergence.png')}")
    elif args.command == "contamination":
        documents = list(_read_documents(args.eval, "val"))
        train_documents = (doc for spec in args.train for doc in _read_documents(spec, "train"))
        to_json = contamination_report(train_documents, documents, args.n, args.min_overlap,
                                       args.index)
        to_json["train"], to_json["eval"] = args.train, args.eval
        print(format_contamination(to_json, args.show))
        if args.drop:
            print(f"kept {len(documents) - to_json['contaminated']:,} clean documents: "
                  f"{_write_kept(args.eval, documents, to_json, args.drop)}")
    elif args.command == "compare":
        to_json = compare_checkpoints(args.ckpt, args.data, args.stride, args.max_documents,
                                      args.device)
        print(format_comparison(to_json))
    elif args.command == "recall":
        if args.width % 4:
            raise EvalError(f"--width {args.width}: 2 heads need an even head size; "
                            f"use a multiple of 4")
        result = recall_experiment(args.pairs, args.seeds, args.steps, args.contexts, args.width,
                                   args.lr, args.workers)
        report = recall_report(result)
        print(report)
        # never into the repository unless asked: a trial run would overwrite docs/recall
        out = pathlib.Path(args.out or tempfile.mkdtemp(prefix="recall-"))
        plot_recall(result, out / "recall.png")
        write_json(result, out / "recall.json")
        print(f"report: {_write_whole(out / 'REPORT.md', report, '--out')}")
    elif args.command == "sample":
        model, tokenizer, _ = load_model(args.ckpt, args.device)
        print(args.prompt, end="", flush=True)
        for piece in stream_sample(model, tokenizer, args.prompt, args.max_new_tokens,
                                   args.temperature, args.top_k or None, args.seed):
            print(piece, end="", flush=True)
        print()
    else:
        to_json = evaluate_checkpoint(args.ckpt, args.data, args.stride, args.max_tokens,
                                      args.tasks, args.last_word_items, args.min_words, args.seed,
                                      args.device, args.max_tasks)
        print(format_evaluation(to_json))
        args.json = (args.json or pathlib.Path(to_json["checkpoint"]).parent
                     / f"eval_{to_json['step'] or 0:07d}.json")
    if to_json is not None and args.json:
        print(f"json: {write_json(to_json, args.json)}")


def main(argv: list[str] | None = None) -> int:
    from machinery.cli import run as run_cli
    args = build_parser().parse_args(argv)

    def command():
        # once, before any work, for every command that takes it
        args.device = resolve_device(args.device)
        run(args)
    return run_cli(command, (EvalError,), "evaluate.py")


if __name__ == "__main__":
    sys.exit(main())
