"""Evaluation: did training work? Perplexity, bits-per-byte, exact match, contamination, the
emergence lesson and associative recall. docs/evaluate.md tells each lesson in full.

A trained model is judged on text it has never seen (the held-out split, cut before training and
deduplicated together with the training data, or we would grade it on questions it has read).

1. Perplexity = exp(mean loss in nats), "how many choices the model hesitates between": a model
   spreading its probability evenly over V tokens has perplexity exactly V.
2. Bits-per-byte = total nats / UTF-8 bytes / ln 2, fair across tokenizers. The lecture's example:
   the same 1,000 bytes are 250 tokens at perplexity 18 for A (723 nats) and 400 tokens at
   perplexity 12 for B (994 nats): 1.04 vs 1.43 bits per byte, so A predicts the text better.
3. Long texts: a sliding window of stride s < block_size scores each token once, with at least
   block_size - s tokens of context; a text that fits one window gets the plain evaluation.
4. Exact match: greedy answers compared after a documented normalisation (`normalize_answer`),
   with the probability of the right answer beside it (a continuous metric). The built-in task is
   LAMBADA-style: the last word of each held-out paragraph.
5. Emergence: k steps each right with probability p give exact match p^k. With k = 5, per-step
   0.5 / 0.6 / 0.7 / 0.8 / 0.9 / 0.95 gives 0.03 / 0.08 / 0.17 / 0.33 / 0.59 / 0.77: a smooth climb
   looks sudden under an all-or-nothing metric (Schaeffer et al. 2023).
6. Contamination: an evaluation document sharing a 13-gram with the training corpus is flagged
   (GPT-3's rule); 13 and not 6, because short n-grams flag common phrases, long ones copied text.
7. Recall (MQAR, Zoology): "k1 v1 k2 v2 ... k1 ? k2 ?". Attention looks a key up in its cache; a
   linear-attention layer must have squeezed every pair into its fixed d x d state.

The metrics work on any causal LM mapping ids (B, T) to logits (B, T, V) (or to (logits, loss)).

Depends on: torch, numpy, dedup.py (the contamination check's n-gram index), scaling.py (the
decoding state's bytes), and only where a checkpoint is loaded or a recall model built, train.py
and model.py.

The commands (their command line is in machinery/commands/):

    python evaluate.py --ckpt out/                         loss, perplexity, bits/byte, last word
    python evaluate.py bpb                                 the lecture's 1.04 vs 1.43 example
    python evaluate.py emergence [--ckpt RUN ...]          the p^k table; a sweep's plot
    python evaluate.py contamination --train T --eval E    13-gram overlap per document
    python evaluate.py compare --ckpt A --ckpt B           two tokenizers, one text, bits-per-byte
    python evaluate.py sample --ckpt out/ --prompt "def"   streaming generation
    python evaluate.py recall                              MQAR: attention vs linear vs hybrid
"""

from __future__ import annotations

import codecs
import dataclasses
import math
import pathlib
import random
import re
import resource
import sys
import time
import unicodedata

import numpy as np
import torch
import torch.nn.functional as F

import dedup
import scaling


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
        raise EvalError(
            f"the model returned logits of shape {tuple(logits.shape)} for input "
            f"{tuple(idx.shape)}; evaluation needs logits for every position (B, T, V)"
        )
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
    last = n_ids - 1  # index of the last target
    end = min(block_size, last)
    plan = [(0, end, 0)]
    while end < last:
        new_end = min(end + stride, last)
        plan.append((max(0, new_end - block_size), new_end, end))
        end = new_end
    return plan


@dataclasses.dataclass
class TokenScores:
    """Per-target results of a teacher-forced pass: nll[i] = -ln p(ids[i+1] | ids[:i+1]) and
    correct[i] = whether the model's top choice was ids[i+1]."""

    nll: np.ndarray  # (N-1,) float64, nats
    correct: np.ndarray  # (N-1,) bool

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
def score_tokens(
    model,
    ids,
    block_size: int,
    stride: int | None = None,
    batch_size: int = 8,
    progress=None,
) -> TokenScores:
    """Teacher-forced loss and top-1 correctness for every id after the first, with a sliding
    window.

    ids: a sequence of N >= 2 token ids. stride defaults to block_size (disjoint blocks).
    Windows of equal length are stacked into batches of `batch_size` (B, block_size).
    progress: called as progress(windows done, windows in all) after each batch, or None.
    """
    ids = torch.as_tensor(ids, dtype=torch.long).flatten()
    if ids.numel() < 2:
        raise EvalError(
            f"the evaluation text is {ids.numel()} token(s); "
            "at least 2 are needed (give a longer text)"
        )
    plan = window_plan(ids.numel(), block_size, stride or block_size)
    nll = np.empty(ids.numel() - 1, dtype=np.float64)
    correct = np.empty(ids.numel() - 1, dtype=bool)
    # The first window may be shorter than block_size; every later one has exactly block_size ids,
    # so they stack.
    groups = [plan[:1]] + [plan[i : i + batch_size] for i in range(1, len(plan), batch_size)]
    windows_done = 0
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    try:
        for group in groups:
            x = torch.stack([ids[s:e] for s, e, _ in group])  # (B, T)
            y = torch.stack([ids[s + 1 : e + 1] for s, e, _ in group])  # (B, T)
            logits = logits_of(model, x).float()  # (B, T, V)
            y = y.to(logits.device)
            token_nll = F.cross_entropy(logits.transpose(1, 2), y, reduction="none")  # (B, T)
            hit = logits.argmax(dim=-1) == y  # (B, T)
            for row, (s, e, first) in enumerate(group):
                # window positions whose targets were not scored before
                new = slice(first - s, e - s)
                nll[first:e] = token_nll[row, new].double().cpu().numpy()
                correct[first:e] = hit[row, new].cpu().numpy()
            windows_done += len(group)
            if progress:
                progress(windows_done, len(plan))
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


# The last word of a paragraph: letters only, after a space, followed only by punctuation (WikiText
# spaces it out).
_LAST_WORD = re.compile(r" ([^\W\d_]+)(?:\s*[^\w\s])*\s*$")


def last_word_tasks(
    documents: list[str],
    n_items: int = 200,
    min_words: int = 20,
    seed: int = 0,
    max_prompt_chars: int = 2000,
) -> list[Task]:
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
            ends_paragraph = n_words and (
                i + 1 == len(lines) or not lines[i + 1].strip() or n_words >= min_words
            )
            if ends_paragraph:
                m = _LAST_WORD.search(line)
                if m and words_so_far >= min_words:
                    cut = offset + m.start()
                    prompt = doc[max(0, cut - max_prompt_chars) : cut]
                    if cut > max_prompt_chars:  # do not start in the middle of a word
                        prompt = prompt[prompt.find(" ") + 1 :]
                    items.append(Task(prompt, " " + m.group(1)))
                words_so_far = 0
            offset += len(line) + 1
    if not items:
        raise EvalError(
            f"no held-out paragraph has {min_words}+ words ending in a word: "
            "evaluate on a longer text or lower min_words"
        )
    if len(items) > n_items:
        keep = sorted(random.Random(seed).sample(range(len(items)), n_items))
        items = [items[i] for i in keep]
    return items


@torch.no_grad()
def greedy_continue(
    model, prompt_ids: list[int], max_new_tokens: int, block_size: int, stop=lambda ids: False
) -> list[int]:
    """Greedy decoding: append the top token max_new_tokens times (context cropped to block_size),
    stopping early when stop(new_ids) is true. Returns the new ids."""
    ids = list(prompt_ids)
    for _ in range(max_new_tokens):
        x = torch.tensor([ids[-block_size:]], dtype=torch.long)  # (1, T)
        ids.append(int(logits_of(model, x)[0, -1].argmax()))
        if stop(ids[len(prompt_ids) :]):
            break
    return ids[len(prompt_ids) :]


@torch.no_grad()
def score_answer(
    model, prompt_ids: list[int], answer_ids: list[int], block_size: int
) -> tuple[float, int]:
    """Teacher-forced: (ln p(answer | prompt), how many answer tokens were the model's top choice).
    All answer tokens top-1 <=> greedy decoding from the prompt produces exactly these tokens."""
    ids = list(prompt_ids) + list(answer_ids)
    # (1, T): the prompt is cropped on the left
    x = torch.tensor([ids[:-1][-block_size:]], dtype=torch.long)
    # (A, V): the positions predicting the answer
    logits = logits_of(model, x)[0, -len(answer_ids) :].float()
    y = torch.tensor(answer_ids, dtype=torch.long, device=logits.device)  # (A,)
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


def answer_task(model, tokenizer, task: Task, block_size: int, slack_tokens: int = 4) -> dict:
    """One task, both ways. Greedy: decode up to len(answer tokens) + slack_tokens tokens (stopping
    at a newline or end-of-text), keep the first line's first as many words as the answer has, and
    compare under normalize_answer. Teacher-forced: p(answer | prompt) and how many answer tokens
    were the model's top choice."""
    eot = getattr(tokenizer, "eot_id", None)
    prompt_ids, answer_ids = _encode(tokenizer, task.prompt), _encode(tokenizer, task.answer)
    if not prompt_ids and eot is not None:
        prompt_ids = [eot]  # an empty prompt starts from <|endoftext|>, as a document does
    if not prompt_ids or not answer_ids or len(answer_ids) >= block_size:
        raise EvalError(
            "the prompt must be non-empty and the answer shorter than the "
            f"{block_size}-token context"
        )

    def stop(new_ids):
        return (eot is not None and new_ids[-1] == eot) or "\n" in tokenizer.decode(new_ids)

    logprob, n_top = score_answer(model, prompt_ids, answer_ids, block_size)
    generated = greedy_continue(model, prompt_ids, len(answer_ids) + slack_tokens, block_size, stop)
    if eot is not None and generated and generated[-1] == eot:
        generated = generated[:-1]
    prediction = leading_words(tokenizer.decode(generated), max(1, len(task.answer.split())))
    return {
        "prompt_tail": task.prompt[-60:],
        "answer": task.answer,
        "prediction": prediction,
        "exact_match": exact_match(prediction, task.answer),
        "p_answer": math.exp(logprob),
        "answer_tokens": len(answer_ids),
        "top1_tokens": n_top,
    }


def evaluate_tasks(
    model, tokenizer, tasks: list[Task], block_size: int, n_examples: int = 3, progress=None
) -> dict:
    """Exact match by greedy decoding over a task set, plus the continuous view of the same answers
    (answer_task): the mean p(answer | prompt) and the fraction of answer tokens that were the
    model's top choice. `examples` shows the first right answer (if any) and the first wrong ones.
    progress: called as progress(tasks done, tasks in all, detail) after each task, or None."""
    if not tasks:
        raise EvalError("the task set is empty: nothing to score")
    answers, hits = [], 0
    for number, task in enumerate(tasks, 1):
        try:
            answers.append(answer_task(model, tokenizer, task, block_size))
        except EvalError as e:
            raise EvalError(f"task {number}: {e}") from None
        hits += answers[-1]["exact_match"]
        if progress:
            progress(number, len(tasks), f" (exact match so far {hits / number:.3f})")
    right = [a for a in answers if a["exact_match"]]
    wrong = [a for a in answers if not a["exact_match"]]
    return {
        "items": len(tasks),
        "exact_match": len(right) / len(tasks),
        "p_answer": float(np.mean([a["p_answer"] for a in answers])),
        "answer_token_accuracy": sum(a["top1_tokens"] for a in answers)
        / sum(a["answer_tokens"] for a in answers),
        "examples": right[:1] + wrong[: n_examples - min(1, len(right))],
    }


# --------------------------------------------------------------------------------------------------
# 4. Emergence: smooth per-step accuracy, sudden exact match
# --------------------------------------------------------------------------------------------------

LECTURE_PER_STEP = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)


def exact_match_from_per_step(per_step: float, k: int = 5) -> float:
    """All k independent steps right: per_step ** k. exact_match_from_per_step(0.8) -> 0.328"""
    return per_step**k


def emergence_table(per_step=LECTURE_PER_STEP, k: int = 5) -> str:
    """The lecture's table: per-step accuracy 0.5 ... 0.95 -> 5-step exact match 0.03 ... 0.77."""
    head = f"{'per-step accuracy':<22}" + "".join(f"{p:>7.2f}" for p in per_step)
    row = f"{f'{k}-step exact match':<22}" + "".join(
        f"{exact_match_from_per_step(p, k):>7.2f}" for p in per_step
    )
    return head + "\n" + row


def k_token_exact_match(correct: np.ndarray, k: int) -> float:
    """Fraction of start positions t whose next k tokens are all the model's top choice
    (teacher-forced), which is exactly the fraction where greedy decoding from the true prefix
    reproduces the next k tokens.
    k_token_exact_match(np.array([1, 1, 0, 1, 1, 1], bool), 2) -> 3/5
    """
    if len(correct) < k:
        raise EvalError(
            f"{len(correct)} scored tokens cannot hold a {k}-token run: evaluate more tokens"
        )
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
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def contamination_report(
    train_documents,
    eval_documents: list[str],
    n: int = 13,
    min_overlap: int = 1,
    index: str = "hashed",
) -> dict:
    """Per evaluation document: how many of its n-grams occur in the training documents;
    contaminated when at least min_overlap do (GPT-3's rule is any, min_overlap=1). index: "hashed"
    (dedup.NgramIndex) or "set" (dedup.SetNgramIndex, the reference). Also the time the check took
    and how far building the index raised the process's peak memory."""
    if not eval_documents:
        raise EvalError("the evaluation set has no documents: nothing to check")
    indexes = {"hashed": dedup.NgramIndex, "set": dedup.SetNgramIndex}
    if index not in indexes:
        raise EvalError(f"unknown index {index!r}: use hashed or set")
    start, peak_before = time.perf_counter(), _peak_rss_mb()
    ngram_index = indexes[index](n)
    for doc in train_documents:
        ngram_index.add(doc)
    ngram_index.freeze()
    built = time.perf_counter()
    if ngram_index.documents == 0:
        raise EvalError("the training corpus has no documents: nothing to check against")
    per_doc = []
    for i, doc in enumerate(eval_documents):
        row = dedup.document_overlap(ngram_index, doc)
        row.update(
            doc=i,
            contaminated=row["overlapping"] >= min_overlap,
            preview=" ".join(doc.split())[:60],
        )
        per_doc.append(row)
    flagged = sum(r["contaminated"] for r in per_doc)
    return {
        "n": n,
        "min_overlap": min_overlap,
        "index": index,
        "train_documents": ngram_index.documents,
        "train_words": ngram_index.words_seen,
        "train_ngrams": len(ngram_index),
        "eval_documents": len(per_doc),
        "eval_checkable": sum(r["ngrams"] > 0 for r in per_doc),
        "contaminated": flagged,
        "contaminated_fraction": flagged / len(per_doc),
        "build_s": built - start,
        "check_s": time.perf_counter() - built,
        "peak_rss_mb": _peak_rss_mb(),
        "peak_rss_growth_mb": _peak_rss_mb() - peak_before,
        "documents": per_doc,
    }


# --------------------------------------------------------------------------------------------------
# 6. Checkpoints and evaluation text
# --------------------------------------------------------------------------------------------------


def load_model(ckpt_path, device="cpu", verify=None) -> tuple[object, object, dict]:
    """(GPT in eval mode, bpe.Tokenizer, checkpoint dict) from a checkpoint file or a run directory
    (its newest checkpoint that loads), via train.py's loader (torch.load with weights_only=True: no
    pickle code runs; `verify`: train.load_checkpoint's check of the file's bytes)."""
    import train

    path = pathlib.Path(ckpt_path)
    if not path.exists():
        raise EvalError(f"checkpoint {path} not found: train one (python train.py)")
    try:
        ckpt = train.load_checkpoint(
            path, log=lambda message: print(message, file=sys.stderr), verify=verify
        )
    except train.TrainError as e:
        raise EvalError(f"cannot load checkpoint: {e}") from e
    if not ckpt.get("tokenizer_json"):
        raise EvalError(
            f"checkpoint {ckpt['path']} has no tokenizer (tokenizer_json): evaluation needs the "
            "tokenizer it was trained with; save checkpoints with train.py, which embeds it"
        )
    try:
        model, tokenizer = train.model_from_checkpoint(ckpt, device)
    except (KeyError, RuntimeError, ValueError, TypeError) as e:
        raise EvalError(
            f"checkpoint {ckpt['path']} is damaged ({type(e).__name__}: {str(e).splitlines()[0]})"
        ) from e
    return model, tokenizer, ckpt


@dataclasses.dataclass
class HeldOut:
    """Evaluation text as the model sees it: ids (each document preceded by <|endoftext|> when the
    tokenizer has one, as data.py packs them), the UTF-8 bytes of the text (for bits-per-byte) and
    the documents themselves."""

    name: str
    ids: np.ndarray  # (N,) int64
    n_bytes: int
    documents: list[str]


def held_out_from_documents(name: str, documents: list[str], tokenizer) -> HeldOut:
    """Tokenize documents with the model's tokenizer. With <|endoftext|> before each document (as
    data.py packs them) every byte of text lies in a predicted token; a tokenizer without it joins
    documents with a blank line."""
    documents = [d for d in documents if d.strip()]
    if not documents:
        raise EvalError(
            f"the evaluation set {name} is empty: give a text with at least one non-blank document"
        )
    eot = getattr(tokenizer, "eot_id", None)
    pieces = [
        [eot] + _encode(tokenizer, doc) if eot is not None else _encode(tokenizer, doc + "\n\n")
        for doc in documents
    ]
    ids = np.fromiter((i for piece in pieces for i in piece), dtype=np.int64)
    n_bytes = sum(len(d.encode("utf-8")) + (0 if eot is not None else 2) for d in documents)
    return HeldOut(name, ids, n_bytes, documents)


def perplexity_report(
    model,
    held: HeldOut,
    block_size: int,
    stride: int | None = None,
    max_tokens: int | None = None,
    progress=None,
) -> dict:
    """Mean loss, perplexity, bits-per-byte and tokens per byte of a model on held-out ids. With
    max_tokens only a prefix is scored and bits-per-byte uses the split's average bytes per
    token. progress: as in score_tokens."""
    ids = held.ids if not max_tokens else held.ids[: max_tokens + 1]
    stride = stride or max(1, block_size // 2)
    scores = score_tokens(
        model, torch.from_numpy(np.ascontiguousarray(ids)), block_size, stride, progress=progress
    )
    whole = len(ids) == len(held.ids)
    n_bytes = held.n_bytes if whole else held.n_bytes * scores.n_tokens / (len(held.ids) - 1)
    return {
        "data": held.name,
        "tokens": scores.n_tokens,
        "bytes": round(n_bytes),
        "whole_split": whole,
        "block_size": block_size,
        "stride": stride,
        "loss": scores.mean_nats,
        "perplexity": perplexity(scores.mean_nats),
        "bits_per_byte": bits_per_byte(scores.total_nats, n_bytes),
        "tokens_per_byte": scores.n_tokens / n_bytes,
        "token_accuracy": scores.accuracy,
    }


def evaluate_checkpoint(
    model,
    tokenizer,
    ckpt: dict,
    held: HeldOut,
    last_word: list[Task],
    tasks: list[Task] | None = None,
    stride: int | None = None,
    max_tokens: int | None = None,
    ticker=None,
) -> dict:
    """Everything `python evaluate.py --ckpt PATH` reports, as one dict (written as JSON, printed as
    a table): the checkpoint, its loss, perplexity and bits-per-byte on the held-out text, exact
    match on the last-word tasks (last_word_tasks of the same text) and on `tasks` if given.
    ticker(what, unit), if given, makes the progress callback of each phase."""

    def progress(what: str, unit: str):
        return ticker(what, unit) if ticker else None

    block_size = model.config.block_size
    result = {
        "checkpoint": ckpt["path"],
        "step": ckpt.get("step"),
        "params": model.num_params(),
        "non_embedding_params": model.num_params(non_embedding=True),
        "vocab_size": len(tokenizer),
    }
    result["held_out"] = perplexity_report(
        model, held, block_size, stride, max_tokens, progress("held-out text", "windows")
    )
    result["last_word"] = evaluate_tasks(
        model, tokenizer, last_word, block_size, progress=progress("last-word tasks", "scored")
    )
    if tasks is not None:
        result["tasks"] = evaluate_tasks(
            model, tokenizer, tasks, block_size, progress=progress("tasks", "scored")
        )
    return result


# --------------------------------------------------------------------------------------------------
# 7. Tokenizer-fair comparison: two checkpoints, one text, bits-per-byte
# --------------------------------------------------------------------------------------------------


def compare_checkpoints(
    loaded, documents: list[str], name: str, stride: int | None = None
) -> list[dict]:
    """Each model reads the same documents through its own tokenizer; per-token numbers differ in
    meaning, bits per byte do not. loaded: (model, tokenizer, checkpoint dict) per checkpoint, an
    iterator that loads each one when its turn comes (one model in memory at a time)."""
    rows = []
    for model, tokenizer, ckpt in loaded:
        held = held_out_from_documents(name, documents, tokenizer)
        report = perplexity_report(model, held, model.config.block_size, stride)
        rows.append(dict(report, checkpoint=ckpt["path"], vocab_size=len(tokenizer)))
    return rows


# --------------------------------------------------------------------------------------------------
# 8. Emergence on real checkpoints: per-token accuracy (smooth) vs k-token exact match (sudden)
# --------------------------------------------------------------------------------------------------


def emergence_sweep(
    loaded, documents: list[str], name: str, k: int = 5, max_tokens: int = 20000
) -> list[dict]:
    """For each checkpoint (a scaling sweep's models, `loaded` as in compare_checkpoints), on the
    same held-out documents: per-token accuracy, k-token exact match, the p^k prediction from
    per-token accuracy, and the loss. Sorted by non-embedding parameters."""
    rows = []
    for model, tokenizer, ckpt in loaded:
        held = held_out_from_documents(name, documents, tokenizer)
        ids = torch.from_numpy(np.ascontiguousarray(held.ids[: max_tokens + 1]))
        scores = score_tokens(
            model, ids, model.config.block_size, max(1, model.config.block_size // 2)
        )
        rows.append(
            {
                "checkpoint": ckpt["path"],
                "non_embedding_params": model.num_params(non_embedding=True),
                "loss": scores.mean_nats,
                "tokens": scores.n_tokens,
                "per_token_accuracy": scores.accuracy,
                f"exact_match_{k}": k_token_exact_match(scores.correct, k),
                f"accuracy_pow_{k}": scores.accuracy**k,
            }
        )
    return sorted(rows, key=lambda r: r["non_embedding_params"])


# --------------------------------------------------------------------------------------------------
# 9. Sampling from a checkpoint, streamed as it is generated
# --------------------------------------------------------------------------------------------------


def stream_sample(
    model,
    tokenizer,
    prompt: str,
    max_new_tokens: int = 200,
    temperature: float = 0.8,
    top_k: int | None = 50,
    seed: int = 0,
):
    """Yield text pieces as tokens are sampled (model.generate one token at a time, seeded, so the
    result equals a single generate call). Bytes of a character split across tokens are held back
    until the character is whole; generation stops at <|endoftext|>."""
    eot = getattr(tokenizer, "eot_id", None)
    prompt_ids = _encode(tokenizer, prompt)
    if not prompt_ids and eot is not None:
        prompt_ids = [eot]  # an empty prompt starts from <|endoftext|>, as a document does
    if not prompt_ids:
        raise EvalError("the prompt is empty and the tokenizer has no <|endoftext|> to start from")
    device = device_of(model)
    generator = torch.Generator(device=device).manual_seed(seed)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    idx = torch.tensor([prompt_ids], dtype=torch.long, device=device)  # (1, T)
    for _ in range(max_new_tokens):
        idx = model.generate(
            idx[:, -model.config.block_size :],
            1,
            temperature=temperature,
            top_k=top_k,
            generator=generator,
        )
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

# Each model's layer_pattern, all RECALL_LAYERS deep and one width: the hybrid is the lecture's
# mostly linear stack with one attention layer (Jamba, Zamba, Griffin: one in four to eight).
RECALL_KINDS = {"attention": "AAAA", "linear": "LLLL", "hybrid": "LLLA"}
RECALL_LAYERS = 4
# Learning rates swept per kind, as Zoology does: each kind trains seed 0 at every rate, keeps the
# rate with the best mean accuracy over the pair counts, and trains its other seeds at that rate
# (one rate per model, not per seed). Pilots: with heads of 16 or 32, GPT-2's init or gates kept
# at 0.95, the models answered with any value of the row for thousands of steps (docs/model.md).
RECALL_LRS = (1e-3, 3e-3, 1e-2)
RECALL_BATCH, RECALL_STEPS, RECALL_WIDTH, RECALL_VOCAB, RECALL_HEADS = 64, 1500, 64, 64, 1


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
        raise EvalError(
            f"{n_pairs} key-value pairs need {n_pairs} distinct keys, but vocab_size={vocab_size} "
            f"has {half}; use 1 to {half} pairs"
        )
    keys = torch.rand(batch, half, generator=generator).argsort(-1)[:, :n_pairs]  # (B, n) distinct
    values = torch.randint(half, vocab_size, (batch, n_pairs), generator=generator)  # (B, n)
    order = torch.rand(batch, n_pairs, generator=generator).argsort(-1)  # (B, n) asking order
    # (B, 2n) k1 v1 k2 v2 ...
    listed = torch.stack((keys, values), -1).flatten(1)
    asked = torch.stack((keys.gather(1, order), values.gather(1, order)), -1).flatten(1)
    idx = torch.cat((listed, asked), 1)  # (B, 4n)
    targets = torch.full_like(idx, -1)
    targets[:, 2 * n_pairs : -1 : 2] = asked[:, 1::2]  # after the asked key comes its value
    return idx, targets


def recall_accuracy(model, n_pairs: int, n_rows: int = 256, seed: int = 0) -> float:
    """Fraction of asked keys whose value the model predicts (greedy), on fresh MQAR rows."""
    idx, targets = mqar_batch(
        n_pairs, n_rows, model.config.vocab_size, torch.Generator().manual_seed(seed)
    )
    with torch.no_grad():
        predicted = model(idx)[0].argmax(-1)
    asked = targets >= 0
    return (predicted[asked] == targets[asked]).float().mean().item()


def recall_config(kind: str, pair_counts: list[int], width: int = RECALL_WIDTH):
    """One model's GPTConfig: RECALL_LAYERS layers of RECALL_KINDS[kind], the head untied."""
    import model as model_lib

    return model_lib.GPTConfig(
        vocab_size=RECALL_VOCAB,
        block_size=4 * max(pair_counts),
        n_layer=RECALL_LAYERS,
        n_head=RECALL_HEADS,
        n_kv_head=RECALL_HEADS,
        n_embd=width,
        tie_embeddings=False,
        layer_pattern=RECALL_KINDS[kind],
    )


def recall_init(net: torch.nn.Module) -> None:
    """PyTorch's default initialisation in place of GPT-2's N(0, 0.02): every linear weight
    U(+-1/sqrt(fan_in)), the embedding N(0, 1); linear attention's gates start at retention 1/2
    (bias 0, not 3): to hand the attention layer the previous token they must learn to forget."""
    for module in net.modules():
        if isinstance(module, torch.nn.Linear):
            bound = 1 / math.sqrt(module.in_features)
            torch.nn.init.uniform_(module.weight, -bound, bound)
            if module.bias is not None:  # only the gates have one
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, torch.nn.Embedding):
            torch.nn.init.normal_(module.weight, 0.0, 1.0)


def train_recall(
    kind: str,
    seed: int,
    pair_counts: list[int],
    steps: int,
    width: int = RECALL_WIDTH,
    batch: int = RECALL_BATCH,
    lr: float = 3e-3,
):
    """A model of `kind` (RECALL_KINDS, recall_init) trained on MQAR rows cycling through
    pair_counts: AdamW, no weight decay, 50 warmup steps, cosine to 0. Returns it in eval mode."""
    import model as model_lib

    torch.manual_seed(seed)
    net = model_lib.GPT(recall_config(kind, pair_counts, width))
    recall_init(net)
    optimizer = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.98))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / 50) * 0.5 * (1 + math.cos(math.pi * s / steps))
    )
    generator = torch.Generator().manual_seed(seed + 1000)
    for step in range(steps):
        n_pairs = pair_counts[step % len(pair_counts)]
        idx, targets = mqar_batch(n_pairs, batch, RECALL_VOCAB, generator)
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
    (flat); every step reads all the weights once (scaling.count_decode_state_bytes, fp32 here).

    >>> from model import GPTConfig
    >>> config = GPTConfig(vocab_size=64, n_layer=2, n_head=2, n_kv_head=2, n_embd=32,
    ...                    layer_pattern="LA")
    >>> decode_bytes_per_token(config, 100)[0]          # (2 * 2 * 16 * 100 + 2 * 16 * 16) * 4
    27648
    """
    return (
        scaling.count_decode_state_bytes(config, context, bytes_per_value=bytes_per_value),
        scaling.count_params(config) * bytes_per_value,
    )


def recall_run(kind: str, seed: int, pair_counts: list[int], steps: int, width: int, lr: float):
    """One model of the experiment: trained (train_recall), then scored at every pair count on
    fresh rows (seeded apart from its training rows). Returns its row and its weights."""
    begun = time.perf_counter()
    net = train_recall(kind, seed, pair_counts, steps, width, lr=lr)
    row = {
        "kind": kind,
        "seed": seed,
        "lr": lr,
        "params": net.num_params(),
        "train_s": time.perf_counter() - begun,
        "accuracy": {n: recall_accuracy(net, n, seed=10_000 + seed) for n in pair_counts},
    }
    return row, net.state_dict()


def best_lr(sweep: list[dict], kind: str) -> float:
    """The swept rate whose row of `kind` has the best mean accuracy (the lower rate on a tie)."""
    rows = sorted((row for row in sweep if row["kind"] == kind), key=lambda row: row["lr"])
    return max(rows, key=lambda row: np.mean(list(row["accuracy"].values())))["lr"]


def train_in_turn(jobs: list[tuple]) -> list[tuple[dict, dict]]:
    """recall_run of each job (its arguments), one after another in this process."""
    return [recall_run(*job) for job in jobs]


def recall_experiment(
    pair_counts: list[int],
    seeds: int,
    steps: int,
    width: int = RECALL_WIDTH,
    lrs=RECALL_LRS,
    train_all=train_in_turn,
) -> dict:
    """Sweep: seed 0 of every kind at every rate of `lrs`. Then seeds 1.. of each kind at its best
    rate (best_lr); seed 0's row at that rate is reused. "weights": each kind's seed-0 model at
    its best rate (the recall command times its decoding). train_all(jobs) trains a phase's
    models, each job the arguments of recall_run, and returns their (row, weights): one after
    another by default (the recall command runs them in parallel processes)."""
    swept = train_all(
        [(kind, 0, pair_counts, steps, width, lr) for kind in RECALL_KINDS for lr in lrs]
    )
    best = {kind: best_lr([row for row, _ in swept], kind) for kind in RECALL_KINDS}
    more = train_all(
        [
            (kind, seed, pair_counts, steps, width, best[kind])
            for kind in RECALL_KINDS
            for seed in range(1, seeds)
        ]
    )
    chosen = {
        row["kind"]: (row, weights) for row, weights in swept if row["lr"] == best[row["kind"]]
    }
    rows = [
        row
        for kind in RECALL_KINDS
        for row in [chosen[kind][0]] + [r for r, _ in more if r["kind"] == kind]
    ]
    return {
        "pair_counts": pair_counts,
        "seeds": seeds,
        "steps": steps,
        "width": width,
        "heads": RECALL_HEADS,
        "layers": RECALL_LAYERS,
        "patterns": RECALL_KINDS,
        "batch": RECALL_BATCH,
        "lrs": list(lrs),
        "lr": best,
        "sweep": [row for row, _ in swept],
        "rows": rows,
        "weights": {kind: weights for kind, (_, weights) in chosen.items()},
    }


def recall_verdict(result: dict) -> dict:
    """The expected shape, checked seed by seed on the accuracy table: every attention seed at
    >= 0.95 at every pair count; every linear seed down by >= 0.1 from the fewest to the most
    pairs; every hybrid seed, at the most pairs, at least half-way from linear's mean to
    attention's. "shown" needs all of it with at least 3 seeds of each kind.
    -> {kind: [passed, per seed], "shown": bool}."""
    counts = result["pair_counts"]
    runs = {
        kind: [row["accuracy"] for row in result["rows"] if row["kind"] == kind]
        for kind in RECALL_KINDS
    }
    att, lin = (
        float(np.mean([a[counts[-1]] for a in runs[kind]])) for kind in ("attention", "linear")
    )
    passed = {
        "attention": [min(a[n] for n in counts) >= 0.95 for a in runs["attention"]],
        "linear": [a[counts[0]] - a[counts[-1]] >= 0.1 for a in runs["linear"]],
        "hybrid": [att > lin and a[counts[-1]] - lin >= 0.5 * (att - lin) for a in runs["hybrid"]],
    }
    shown = all(len(seeds) >= 3 and all(seeds) for seeds in passed.values())
    return {**passed, "shown": shown}


if __name__ == "__main__":
    from machinery.commands import evaluate as command

    raise SystemExit(command.main())
