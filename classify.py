"""classify.py: a fastText-style linear text classifier, written by hand; two filters of the funnel.

The last two steps of the lecture's filter table are "language detection" and "a classifier score".
Both are the same small model (Joulin et al. 2016, "Bag of Tricks for Efficient Text
Classification"; fastText's lid.176 is one, DCLM's quality filter another):

    text -> features: its character 1-, 2- and 3-grams and words, each hashed to one of B buckets
         -> average of their rows of an embedding E (B, D)      # bag of features: no order
         -> a linear layer W (D, K) + b -> softmax over K labels   # "en", "fr", ... or "high"

What it sees of a document: its first MAX_CHARS characters, lower-cased with spaces collapsed, so a
5 MB page costs as much as a 1 KB one. Character n-grams carry the language ("th", "ing", "ção")
and need no spaces (Chinese, Japanese and Thai have none). Why hashing: the n-grams of a crawl are
unbounded; a hash mod B maps any of them to a fixed table with no dictionary to ship (B = 2**16;
two n-grams in one bucket share a row). Fast enough for a crawl: 1,000 characters are ~3,000
features, hashed at once by numpy (`features`), then a gather of 3,000 rows of D = 16 floats, a
mean and a (16 x K) product: ~0.1 ms. Training: cross-entropy by Adam, a step touching only its
batch's rows.

Language identification, `identify_language(text) -> ("pt", 0.97)`: trained on real human
translations, the gettext catalogs of Django, Weblate, Wagtail and Sphinx (classify_corpora.py:
what is held out, how to add a language). The funnel keeps a document whose top language is in
--lang with a score >= --lang-threshold (0.65); text in a language it does not know scores low.

Quality, `classify_quality(text) -> ("high", 0.9)`, trained on the lecture's contrast (GPT-3, LLaMA,
DCLM): reference prose as "high" (the Wikipedia sample) against web crawl as "low" (the C4 and
FineWeb samples). That contrast is the lesson: the model knows no rule of quality, it scores how
much a page reads like text someone chose to keep, so choosing the positives is choosing what
"quality" means, biases included (a topic the positives lack scores low). `train quality
--positives --negatives` trains your own; --quality-threshold keeps P(high) >= it.

Scoring is numpy (the same floats in every process: every engine keeps the same documents);
training is torch. Both models ship in classifiers/ (plain tensors, float16, 2 MiB each, checked
before trusted: `Classifier.load`); `python classify.py train {language,quality} --out DIR`
retrains one (default out/classifiers; only `--out classifiers` rewrites the shipped file).

Depends on: numpy, torch, the standard library and fileio.py (files written whole);
classify_corpora.py only to retrain the language model, cli.py only for the command line.
"""
from __future__ import annotations

import argparse
import errno
import functools
import json
import os
import pathlib
import pickle
import re
import stat
import sys
import time
import zlib
from typing import Callable

import numpy as np
import torch

from machinery import fileio
VERSION = 2
BUCKET_BITS = 16
BUCKETS = 2 ** BUCKET_BITS
DIM = 16
MAX_CHARS = 1_000
NGRAMS = (1, 2, 3)
# ISO 639 codes: every language with >= 300 training texts in classify_corpora.py's catalogs but
# Bosnian (309 texts, read as Croatian or Serbian by this model and by lid.176 alike)
LANGUAGES = ("af ar ast az ba be bg bn br ca ckb cs cy da de dsb dv el en eo es et eu fa fi fr ga "
             "gd gl he hi hr hsb hu hy ia id is it ja ka kab kk km ko ky lt lv mi mk ml mn mr ms "
             "my nb ne nl nn os pa pl pt ro ru sk sl sq sr sv sw ta tet tg th tk tr tt ug uk ur uz "
             "vi zh").split()
MODEL_DIR = pathlib.Path(__file__).resolve().parent / "classifiers"
QUALITY_LABELS = ("high", "low")
# the polynomial hash of `features`: P (odd, so invertible mod 2^64), its powers P^i and P^-i for
# every position of a text, the multiplier that spreads h over the buckets (2^64 / golden ratio),
# and a salt per kind of feature: words, then each n of NGRAMS
HASH_BASE = 0x100000001B3


def _powers(base: int, count: int) -> np.ndarray:
    """base^0, base^1, ... base^(count - 1) mod 2^64, (count,) uint64."""
    return np.cumprod(np.r_[1, np.full(count - 1, base)].astype(np.uint64))


HASH_POWERS = _powers(HASH_BASE, MAX_CHARS + 2)
HASH_INVERSE_POWERS = _powers(pow(HASH_BASE, -1, 2 ** 64), MAX_CHARS + 2)
HASH_MIX = np.uint64(0x9E3779B97F4A7C15)
HASH_SALTS = np.arange(len(NGRAMS) + 1, dtype=np.uint64) * np.uint64(0x632BE59BD9B4E019)


def _code_points(text: str) -> np.ndarray:
    """The text's first MAX_CHARS characters, lower-cased, spaces collapsed, a space at each end, as
    an array of code points (L,) (UTF-32: one number per character, whatever its script)."""
    # cut again after lower(): it may lengthen a text ("İ" is "i" and a combining dot)
    s = " " + " ".join(text[:MAX_CHARS].lower().split())[:MAX_CHARS] + " "
    # surrogatepass: a lone surrogate ("\ud800", legal in JSON) is a code point like any other
    return np.frombuffer(s.encode("utf-32-le", "surrogatepass"), dtype=np.uint32).astype(np.uint64)


def features(text: str) -> np.ndarray:
    """The hashed bucket of each character n-gram and word of the text's first MAX_CHARS characters.

    Every string is hashed as a polynomial, h = sum_k (c_k + 1) P^k mod 2^64, computed for all of
    them at once from one prefix sum over the code points: the string at [i, i + n) is
    (prefix[i + n] - prefix[i]) * P^-i (P is odd, so it has an inverse mod 2^64). uint64 arithmetic
    wraps in numpy as in C, the same in every process. The bucket is the top 16 bits of (h + the
    kind's salt) * MIX (Knuth's multiplicative hashing; the salt keeps the word "hi" apart from the
    bigram "hi"). No Python loop over n-grams: ~60 µs for 1,000 characters, crc32 per n-gram took
    ~1.5 ms.

    >>> features("Hi").tolist() == features("  hI ").tolist()     # " hi ": 4 + 3 + 2 grams, 1 word
    True
    >>> len(set(features("abc abc").tolist()))      # 1 word, 4 distinct 1-, 2- and 3-grams each
    13
    """
    codes = _code_points(text)                                                      # (L,)
    length = len(codes)
    prefix = np.zeros(length + 1, dtype=np.uint64)
    np.cumsum((codes + np.uint64(1)) * HASH_POWERS[:length], out=prefix[1:])         # (L + 1,)
    # the words: between two consecutive spaces (the text starts and ends with one)
    spaces = np.flatnonzero(codes == 32)
    starts, ends = spaces[:-1] + 1, spaces[1:]
    starts, ends = starts[ends > starts], ends[ends > starts]
    hashes = [(prefix[ends] - prefix[starts]) * HASH_INVERSE_POWERS[starts] + HASH_SALTS[0]]
    # the n-grams at every start i: slices, no index arrays
    for salt, n in zip(HASH_SALTS[1:], NGRAMS):
        count = max(length - n + 1, 0)
        hashes.append((prefix[n:] - prefix[:count]) * HASH_INVERSE_POWERS[:count] + salt)
    buckets = (np.concatenate(hashes) * HASH_MIX) >> np.uint64(64 - BUCKET_BITS)
    # < 2^16: the same bits read as int64 (what torch's embedding takes)
    return buckets.view(np.int64)


class Classifier:
    """Averaged hashed-feature embeddings, a linear layer, softmax. `predict` -> (label,
    probability)."""

    def __init__(
        self, labels: list[str], embed: np.ndarray, weight: np.ndarray, bias: np.ndarray
    ) -> None:
        self.labels, self.embed, self.weight, self.bias = labels, embed, weight, bias

    def probabilities(self, text: str) -> np.ndarray:
        ids = features(text)                                                        # (F,)
        # the mean of their rows (F, D) -> (D,): einsum's plain C loop, 3x faster than .mean(0)
        # and, unlike a BLAS product, the same floats whatever the thread count
        mean = np.einsum("fd->d", self.embed.take(ids, axis=0)) / len(ids)
        # (D,) @ (D, K) -> (K,)
        logits = mean @ self.weight + self.bias
        e = np.exp(logits - logits.max())
        return e / e.sum()

    def predict(self, text: str) -> tuple[str, float]:
        p = self.probabilities(text)
        return self.labels[int(p.argmax())], float(p.max())

    @classmethod
    def train(
        cls, texts: list[str], labels: list[str], epochs: int = 5, seed: int = 0,
        progress: Callable[[int, int], None] | None = None,
    ) -> "Classifier":
        """Fit by Adam on the cross-entropy of shuffled mini-batches of 64 documents. As in
        fastText, a step updates only the embedding rows of the batch's features (sparse
        gradients), not all B of them: 84 x 1,500 catalog texts x 5 epochs train in about a minute.
        `progress(done, total)` is called after each batch (documents seen, of epochs x documents).

        >>> c = Classifier.train(["good text here"] * 20 + ["buy now cheap"] * 20,
        ...                      ["high"] * 20 + ["low"] * 20)
        >>> c.predict("good text")[0], c.predict("cheap, buy")[0]
        ('high', 'low')
        """
        if not texts or len(set(labels)) < 2:
            raise ValueError(
                f"training needs texts of at least two labels, got {sorted(set(labels))}"
            )
        torch.manual_seed(seed)
        names = sorted(set(labels))
        feats = [torch.from_numpy(features(t)) for t in texts]
        y = torch.tensor([names.index(label) for label in labels])
        bag = torch.nn.EmbeddingBag(BUCKETS, DIM, mode="mean", sparse=True)
        # fastText's initialization
        torch.nn.init.uniform_(bag.weight, -1 / DIM, 1 / DIM)
        head = torch.nn.Linear(DIM, len(names))
        opts = (torch.optim.SparseAdam(bag.parameters(), lr=0.02),
                torch.optim.Adam(head.parameters(), lr=0.02))
        # ops this small run fastest on one thread (on a busy 2-core machine, 20x faster)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        done = 0
        try:
            for _ in range(epochs):
                for batch in torch.randperm(len(texts)).split(64):
                    ids = torch.cat([feats[i] for i in batch])
                    offsets = torch.tensor([0] + [len(feats[i]) for i in batch[:-1]]).cumsum(0)
                    loss = torch.nn.functional.cross_entropy(head(bag(ids, offsets)), y[batch])
                    for opt in opts:
                        opt.zero_grad()
                    loss.backward()
                    for opt in opts:
                        opt.step()
                    done += len(batch)
                    if progress is not None:
                        progress(done, epochs * len(texts))
        finally:
            torch.set_num_threads(threads)
        # the embedding is kept in float16 (`save`): rounded here, so the saved model is this one
        return cls(names, bag.weight.detach().half().float().numpy(),
                   head.weight.detach().numpy().T.copy(), head.bias.detach().numpy())

    def save(self, path: pathlib.Path | str, fix: str = "write it elsewhere") -> None:
        """Tensors (the embedding in float16: half the bytes, 2 MiB) and labels, written to a
        temporary file then renamed (never half-written; on a full disk, one line and no temp
        file left)."""
        state = {
            "version": VERSION,
            "labels": self.labels,
            "embed": torch.from_numpy(self.embed).half(),
            "weight": torch.from_numpy(self.weight),
            "bias": torch.from_numpy(self.bias),
        }
        fileio.write_atomic(path, lambda f: torch.save(state, f), error=ClassifyError, fix=fix)

    @classmethod
    def load(cls, path: pathlib.Path | str, labels: tuple[str, ...] = ()) -> "Classifier":
        """A classifier file, checked like any file from outside before it is trusted: a regular
        file (a FIFO would hang the read), plain tensors (never a pickle), this version, two or
        more labels (exactly `labels` when given), shapes and float dtypes that fit, finite
        weights (a NaN makes every score NaN, and a NaN compared to a threshold keeps nothing or
        everything). Anything else is a ClassifyError naming the file."""
        kind = special_file_kind(path)
        if kind:
            raise ClassifyError(f"{path} is {kind}, not a classifier file")
        try:
            state = torch.load(path, weights_only=True)
        except pickle.UnpicklingError:
            # torch's message advises weights_only=False: running the pickle's code
            raise ClassifyError(f"{path}: holds Python objects, not a classifier file of ours "
                                "(refused unread: a pickle can run code)") from None
        # any other damage: a truncated zip, not a zip at all
        except Exception as e:
            # torch's are many lines
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ClassifyError(f"{path}: not a classifier file ({first}); {RETRAIN}") from None
        embed, weight, bias = checked_state(state, str(path), labels)
        return cls(list(state["labels"]), embed, weight, bias)


class ClassifyError(ValueError):
    """A classifier file that cannot be trusted or written, training text that cannot be had."""


RETRAIN = "retrain it (python classify.py train --help)"
# the tensors of a saved classifier: embedding (B, D), linear layer (D, K) and bias (K,)
TENSOR_SHAPES = {"embed": ("buckets", "dim"), "weight": ("dim", "labels"), "bias": ("labels",)}
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def special_file_kind(path: pathlib.Path | str) -> str:
    """"" for a regular file (or a link to one), else what it is, in words ("a FIFO", "a folder",
    "missing"): checked before any read."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        return f"unreadable ({e.strerror})" if e.errno != errno.ENOENT else "missing"
    for test, words in ((stat.S_ISREG, ""), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
                        (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"),
                        (stat.S_ISBLK, "a device")):
        if test(mode):
            return words
    return "not a regular file"


def checked_state(
    state: object, where: str, labels: tuple[str, ...]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(embed, weight, bias) as float32 arrays from a loaded file's dict, or a ClassifyError naming
    the file and the field that is wrong."""
    def refuse(what: str) -> ClassifyError:
        return ClassifyError(f"{where}: {what}; {RETRAIN}")
    if not isinstance(state, dict) or set(state) != {"version", "labels", *TENSOR_SHAPES}:
        keys = sorted(map(str, state)) if isinstance(state, dict) else type(state).__name__
        raise refuse(f"holds {keys}, not a classifier's version, labels, embed, weight and bias")
    if type(state["version"]) is not int or state["version"] != VERSION:
        raise refuse(f"version {state['version']!r}, this code reads {VERSION}")
    names = state["labels"]
    if not (isinstance(names, list) and len(names) >= 2 and len(set(names)) == len(names)
            and all(isinstance(n, str) and n for n in names)):
        raise refuse(f"labels {str(names)[:60]!r} are not two or more distinct names")
    if labels and sorted(names) != sorted(labels):
        shown = " ".join(names[:6]) + (" ..." if len(names) > 6 else "")
        raise ClassifyError(f"{where}: its labels are {shown}, not "
                            f"{' and '.join(labels)}: not a model for this filter")
    sizes = {"buckets": BUCKETS, "dim": None, "labels": len(names)}
    for key, dims in TENSOR_SHAPES.items():
        tensor = state[key]
        if not isinstance(tensor, torch.Tensor) or tensor.dtype not in FLOAT_DTYPES:
            raise refuse(f"{key} is {getattr(tensor, 'dtype', type(tensor).__name__)}, not a "
                         "float tensor")
        # the embedding fixes D; the other two must agree with it
        if key == "embed" and tensor.dim() == 2:
            sizes["dim"] = tensor.shape[1]
        want = tuple(sizes[d] for d in dims)
        if tuple(tensor.shape) != want:
            raise refuse(f"{key} has shape {tuple(tensor.shape)}, not {want}")
        if not bool(torch.isfinite(tensor).all()):
            raise refuse(f"{key} holds NaN or infinite weights")
    return tuple(state[key].float().numpy() for key in TENSOR_SHAPES)


def language_corpus(split: str) -> tuple[list[str], list[str]]:
    """(texts, language codes) of the "train" or "held-out" text of every language in LANGUAGES
    (classify_corpora.py: the packages' catalogs, their pinned wheels fetched by pip once)."""
    from machinery import classify_corpora
    folder = classify_corpora.default_folder()
    classify_corpora.fetch(folder)
    train, held_out = classify_corpora.corpus(folder)
    chosen = train if split == "train" else held_out
    pairs = [(text, code) for code in LANGUAGES for text in chosen.get(code, [])]
    return [t for t, _ in pairs], [c for _, c in pairs]


def shared_data() -> pathlib.Path:
    """The corpora folder next to the repository (../shared/data), or $SHARED_DATA."""
    return pathlib.Path(os.environ.get("SHARED_DATA", MODEL_DIR.parent.parent / "shared" / "data"))


# the default quality contrast, relative to shared_data(): reference prose against web crawl
QUALITY_POSITIVES = ("wikipedia-sample/exllamav2-wiki.utf8",)
QUALITY_NEGATIVES = ("c4-sample/c4-en-train-00000-first1000.jsonl",
                     "fineweb-sample/fineweb-10BT-legalprefilter-500.jsonl")
# shorter documents are not training text of either side: a title, a one-line stub
QUALITY_MIN_WORDS = 20
# one document in HELD_OUT_EVERY is held out (by its text's crc32)
HELD_OUT_EVERY = 5
# a WikiExtractor article's first and last lines: <doc id=".." url=".." title=".."> ... </doc>
WIKI_DOC = re.compile(r"^<doc [^>]*>\n(.*?)^</doc>$", re.MULTILINE | re.DOTALL)


def read_documents(path: pathlib.Path | str) -> list[str]:
    """The documents of a training file: a .jsonl file's "text" fields, a WikiExtractor dump's
    articles (<doc ...> ... </doc>), else blank-line-separated blocks of text."""
    path = pathlib.Path(path)
    kind = special_file_kind(path)
    if kind:
        raise ClassifyError(f"{path} is {kind}, not a file of documents")
    try:
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".jsonl":
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
            docs = [row["text"] for row in rows if isinstance(row.get("text"), str)]
        elif WIKI_DOC.search(text):
            docs = WIKI_DOC.findall(text)
        else:
            docs = re.split(r"\n\s*\n", text)
    except (OSError, UnicodeDecodeError, ValueError, AttributeError) as e:
        raise ClassifyError(f"{path}: cannot read documents from it ({e}); give .jsonl rows with "
                            "a text field, or plain UTF-8 text") from None
    return [d.strip() for d in docs if d.strip()]


def quality_corpus(
    positives: tuple[str, ...] = (), negatives: tuple[str, ...] = (), split: str = "train"
) -> tuple[list[str], list[str]]:
    """(texts, "high"/"low") of the "train" or "held-out" documents: the positives' (reference
    prose: by default Wikipedia) and the negatives' (web crawl: by default C4 and FineWeb). Files
    default to QUALITY_POSITIVES and QUALITY_NEGATIVES under shared_data(). A document is held out
    by its text's hash, one in HELD_OUT_EVERY, and a text found on both sides is dropped: no
    document is in both splits or both classes. Documents under QUALITY_MIN_WORDS words are left
    out (1,281 of the Wikipedia sample's 2,349 "articles" are a redirect's title alone: kept, they
    teach that short means reference). The train split is cut into pieces of at most MAX_CHARS
    (`pieces`), so the model learns from all of a document, not only from its start."""
    sides = {}
    for label, files, default, flag in (("high", positives, QUALITY_POSITIVES, "--positives"),
                                        ("low", negatives, QUALITY_NEGATIVES, "--negatives")):
        if not files:
            files = tuple(str(shared_data() / name) for name in default)
            missing = [f for f in files if not pathlib.Path(f).exists()]
            if missing:
                raise ClassifyError(f"{flag}: the default {missing[0]} is not here (a clone "
                                    f"without ../shared/data); name the files with {flag}")
        docs = (d for f in files for d in read_documents(f))
        sides[label] = dict.fromkeys(d for d in docs if len(d.split()) >= QUALITY_MIN_WORDS)
        if not sides[label]:
            raise ClassifyError(f"{flag} {' '.join(files)}: no document of {QUALITY_MIN_WORDS} "
                                "words or more; name files that hold text")
    both = set(sides["high"]) & set(sides["low"])
    pairs = [(text, label) for label, docs in sides.items() for text in docs if text not in both
             and (zlib.crc32(text.encode("utf-8", "surrogatepass")) % HELD_OUT_EVERY == 0)
             == (split == "held-out")]
    if len({label for _, label in pairs}) < 2:
        raise ClassifyError(f"--positives and --negatives: no {split} documents left on one side "
                            f"({len(both):,} texts on both sides are left out); name other files")
    if split == "train":
        pairs = [(piece, label) for text, label in pairs for piece in pieces(text)]
    return [t for t, _ in pairs], [y for _, y in pairs]


def pieces(text: str, size: int = MAX_CHARS) -> list[str]:
    """A document cut at line breaks into pieces of at most `size` characters (a longer line is
    a piece of its own: the model reads its first `size`).

    >>> pieces("aaa\\nbb\\ncccc", 6)
    ['aaa\\nbb', 'cccc']
    """
    out, piece = [], ""
    for line in text.split("\n"):
        if piece and len(piece) + 1 + len(line) > size:
            out.append(piece)
            piece = ""
        piece = f"{piece}\n{line}" if piece else line
    return [p for p in [*out, piece] if p.strip()]


def roc_auc(scores: list[float], truth: list[bool]) -> float:
    """The probability that a random positive scores above a random negative (ties count half):
    the area under the ROC curve, by ranks (Mann-Whitney).

    >>> roc_auc([0.9, 0.8, 0.3, 0.1], [True, False, True, False])
    0.75
    """
    order = np.argsort(scores, kind="stable")
    ranks = np.empty(len(scores))
    ranks[order] = np.arange(1, len(scores) + 1)
    # tied scores share their mean rank
    values = np.asarray(scores)[order]
    for value in np.unique(values):
        ranks[order[values == value]] = ranks[order[values == value]].mean()
    positive = np.asarray(truth, dtype=bool)
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


@functools.lru_cache(maxsize=None)
def default_model(task: str) -> Classifier:
    """The shipped "language" or "quality" classifier, read once per process."""
    return Classifier.load(MODEL_DIR / f"{task}.pt", QUALITY_LABELS if task == "quality" else ())


def identify_language(text: str) -> tuple[str, float]:
    """(ISO 639-1 code, probability) by the default language model.

    >>> identify_language("the quick brown fox jumps over the lazy dog and runs away")[0]
    'en'
    """
    return default_model("language").predict(text)


def classify_quality(text: str) -> tuple[str, float]:
    """("high" or "low", probability) by the default quality model."""
    return default_model("quality").predict(text)


@functools.lru_cache(maxsize=None)
def model_at(path: str) -> Classifier:
    """A quality classifier file (labels high and low), read once per process (every chunk of an
    engine reuses it)."""
    return Classifier.load(path, QUALITY_LABELS)


class Progress:
    """A training's progress on stderr, every few seconds: count, rate and ETA."""

    def __init__(self, what: str, every_s: float = 10.0) -> None:
        self.what, self.every_s = what, every_s
        self.start = self.last = None

    def __call__(self, done: int, total: int) -> None:
        now = time.perf_counter()
        # timed from the first batch: the features are read before it
        if self.start is None:
            self.start, self.last, self.first = now, now, done
            return
        if now - self.last < self.every_s and done < total:
            return
        self.last = now
        rate = (done - self.first) / max(now - self.start, 1e-9)
        print(f"{self.what}: {done:,} of {total:,} documents (epochs x texts), {rate:,.0f}/s, "
              f"ETA {(total - done) / max(rate, 1e-9):.0f} s", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from machinery.cli import Parser, writable  # the shared CLI helper: bad flags are one line, exit 2

    parser = Parser(
        prog="classify.py", description="Train the language or quality classifier (the models "
        "that ship in classifiers/ are read by data.py's --lang and --quality-threshold).")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    train = commands.add_parser(
        "train", help="train a classifier into --out",
        description="Train a classifier and write it to OUT/TASK.pt (atomically). The shipped ones "
        "are rewritten only by --out classifiers.")
    train.add_argument("task", choices=("language", "quality"))
    train.add_argument("--out", default="out/classifiers", type=writable("dir"),
                       help="folder to write TASK.pt into (default: out/classifiers; "
                            "classifiers rewrites the shipped model)")
    for flag, side, default in (("--positives", "high (reference prose)", QUALITY_POSITIVES),
                                ("--negatives", "low (web crawl)", QUALITY_NEGATIVES)):
        train.add_argument(flag, nargs="+", default=[], metavar="FILE",
                           help=f"quality: {side} documents, .jsonl (text field), a WikiExtractor "
                                f"dump or blank-line-separated text (default: ../shared/data/"
                                f"{' and '.join(default)})")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """python classify.py train {language,quality} [--out DIR]: train a classifier into DIR."""
    from machinery import classify_corpora
    args = parse_args(argv)
    out = pathlib.Path(args.out)
    path = out / f"{args.task}.pt"
    try:
        if args.task == "language" and (args.positives or args.negatives):
            raise ClassifyError("--positives and --negatives train the quality model; "
                                "drop them or train quality")
        created = fileio.missing_folders(out)
        try:
            out.mkdir(parents=True, exist_ok=True)          # before the minutes of training
        except OSError as e:
            raise ClassifyError(f"--out {out}: cannot make the folder ({e.strerror})") from None
        start = time.perf_counter()
        try:
            if args.task == "language":
                texts, labels = language_corpus("train")
            else:
                texts, labels = quality_corpus(tuple(args.positives), tuple(args.negatives))
            model = Classifier.train(texts, labels, progress=Progress(f"training {args.task}"))
            model.save(path, fix="choose another --out")
        except BaseException:
            fileio.remove_if_empty(created)
            raise
    except (ClassifyError, classify_corpora.CatalogError) as e:
        print(f"classify.py: error: {e}", file=sys.stderr)
        return 2
    print(f"{path}: {len(model.labels)} labels, {len(texts):,} documents, trained in "
          f"{time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
