"""classify.py: a fastText-style linear text classifier, written by hand; two filters of the funnel.

The last two steps of the lecture's filter table are "language detection" and "a classifier score".
Both are the same small model (Joulin et al. 2016, "Bag of Tricks for Efficient Text
Classification"; fastText's lid.176 is one, DCLM's quality filter another):

    text -> features: its character 1-, 2- and 3-grams and words, each hashed to one of B buckets
         -> average of their rows of an embedding E (B, D)      # bag of features: no order
         -> a linear layer W (D, K) + b -> softmax over K labels   # "en", "fr", ... or "high"

Why hashing: the character n-grams of a crawl ("th", "ing", "ção": the language is in them, and no
spaces are needed, which Chinese, Japanese and Thai lack) are unbounded; a hash mod B maps any of
them to a fixed table with no dictionary to ship (B = 2**16). Only the first MAX_CHARS characters
count: ~3,000 features, hashed at once by numpy (`features`), then a mean of their rows: ~0.1 ms.

`identify_language(text) -> ("pt", 0.97)` is trained on real human translations (gettext catalogs);
`classify_quality(text) -> ("high", 0.9)` on the lecture's contrast, reference prose (Wikipedia)
against web crawl (C4, FineWeb): it knows no rule of quality, it scores how much a page reads like
text someone chose to keep, so choosing the positives is choosing what "quality" means. Both ship
in classifiers/, checked before trusted (`Classifier.load`). docs/classify.md: the details.

Depends on numpy, torch, the standard library and dedup.py (`_powers`: B^0, B^1, ... mod 2^64).
"""

from __future__ import annotations

import errno
import functools
import os
import pathlib
import pickle
import stat
import sys
import time
from typing import Callable

import numpy as np
import torch

from dedup import _powers  # base^0, base^1, ... mod 2^64, (count,) uint64

VERSION = 2
BUCKET_BITS = 16
BUCKETS = 2**BUCKET_BITS
DIM = 16
MAX_CHARS = 1_000
NGRAMS = (1, 2, 3)
# ISO 639 codes: every language with >= 300 training texts in Django's, Weblate's, Wagtail's and
# Sphinx's catalogs but Bosnian (309 texts, read as Croatian or Serbian here and by lid.176 alike)
LANGUAGES = (
    "af ar ast az ba be bg bn br ca ckb cs cy da de dsb dv el en eo es et eu fa fi fr ga gd gl "
    "he hi hr hsb hu hy ia id is it ja ka kab kk km ko ky lt lv mi mk ml mn mr ms my nb ne nl nn "
    "os pa pl pt ro ru sk sl sq sr sv sw ta tet tg th tk tr tt ug uk ur uz vi zh"
).split()
MODEL_DIR = pathlib.Path(__file__).resolve().parent / "classifiers"
QUALITY_LABELS = ("high", "low")
# the polynomial hash of `features`: P (odd, so invertible mod 2^64), its powers P^i and P^-i for
# every position of a text, the multiplier that spreads h over the buckets (2^64 / golden ratio),
# and a salt per kind of feature: words, then each n of NGRAMS
HASH_BASE = 0x100000001B3


HASH_POWERS = _powers(HASH_BASE, MAX_CHARS + 2)
HASH_INVERSE_POWERS = _powers(pow(HASH_BASE, -1, 2**64), MAX_CHARS + 2)
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
    bigram "hi"). No Python loop over n-grams: ~60 µs for 1,000 characters.

    >>> features("Hi").tolist() == features("  hI ").tolist()     # " hi ": 4 + 3 + 2 grams, 1 word
    True
    >>> len(set(features("abc abc").tolist()))      # 1 word, 4 distinct 1-, 2- and 3-grams each
    13
    """
    codes = _code_points(text)  # (L,)
    length = len(codes)
    prefix = np.zeros(length + 1, dtype=np.uint64)
    np.cumsum((codes + np.uint64(1)) * HASH_POWERS[:length], out=prefix[1:])  # (L + 1,)
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
    """Averaged hashed-feature embeddings, a linear layer, softmax: `predict` -> (label, p)."""

    def __init__(self, labels: list[str], embed: np.ndarray, weight: np.ndarray, bias: np.ndarray):
        self.labels, self.embed, self.weight, self.bias = labels, embed, weight, bias

    def probabilities(self, text: str) -> np.ndarray:
        ids = features(text)  # (F,)
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
        cls,
        texts: list[str],
        labels: list[str],
        epochs: int = 5,
        seed: int = 0,
        progress: Callable[[int, int], None] | None = None,
    ) -> "Classifier":
        """Fit by Adam on the cross-entropy of shuffled mini-batches of 64 documents. As in
        fastText, a step updates only the embedding rows of the batch's features (sparse
        gradients), not all B of them: 84 x 1,500 catalog texts x 5 epochs train in about a minute.
        `progress(done, total)` is called after each batch (documents seen, of epochs x documents).

        >>> labels = ["high"] * 20 + ["low"] * 20
        >>> c = Classifier.train(["good text here"] * 20 + ["buy now cheap"] * 20, labels)
        >>> c.predict("good text")[0], c.predict("cheap, buy")[0]
        ('high', 'low')
        """
        if not texts or len(set(labels)) < 2:
            raise ValueError(f"training needs texts of two labels or more: {sorted(set(labels))}")
        torch.manual_seed(seed)
        names = sorted(set(labels))
        feats = [torch.from_numpy(features(t)) for t in texts]
        y = torch.tensor([names.index(label) for label in labels])
        bag = torch.nn.EmbeddingBag(BUCKETS, DIM, mode="mean", sparse=True)
        # fastText's initialization
        torch.nn.init.uniform_(bag.weight, -1 / DIM, 1 / DIM)
        head = torch.nn.Linear(DIM, len(names))
        sparse_adam = torch.optim.SparseAdam(bag.parameters(), lr=0.02)
        opts = (sparse_adam, torch.optim.Adam(head.parameters(), lr=0.02))
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
        embed = bag.weight.detach().half().float().numpy()
        return cls(names, embed, head.weight.detach().numpy().T.copy(), head.bias.detach().numpy())

    def save(self, path: pathlib.Path | str, fix: str = "write it elsewhere") -> None:
        """Tensors (the embedding in float16: 2 MiB) and labels, into a temporary file then renamed:
        never half-written (a full disk: a ClassifyError ending in `fix`, no temp file left)."""
        state = {
            "version": VERSION,
            "labels": self.labels,
            "embed": torch.from_numpy(self.embed).half(),
            "weight": torch.from_numpy(self.weight),
            "bias": torch.from_numpy(self.bias),
        }
        tmp = pathlib.Path(f"{path}.tmp")
        try:
            with open(tmp, "wb") as f:
                torch.save(state, f)
            os.replace(tmp, path)
        except BaseException as e:
            tmp.unlink(missing_ok=True)
            if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise ClassifyError(f"no space left writing {path}: free space or {fix}") from None
            raise

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
            what = "holds Python objects, not a classifier file of ours"
            raise ClassifyError(f"{path}: {what} (refused unread: a pickle can run code)") from None
        # any other damage (a truncated zip, not a zip at all): the first of torch's many lines
        except Exception as e:
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
# what a path is, in words, by its file type ("" for a regular file: the one we read)
FILE_KINDS = {stat.S_IFREG: "", stat.S_IFDIR: "a folder", stat.S_IFIFO: "a FIFO"}
FILE_KINDS |= {stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a device", stat.S_IFBLK: "a device"}


def special_file_kind(path: pathlib.Path | str) -> str:
    """ "" for a regular file (or a link to one), else what it is, in words ("a FIFO", "a folder",
    "missing"): checked before any read."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        return f"unreadable ({e.strerror})" if e.errno != errno.ENOENT else "missing"
    return FILE_KINDS.get(stat.S_IFMT(mode), "not a regular file")


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
    strings = isinstance(names, list) and all(isinstance(n, str) and n for n in names)
    if not strings or len(names) < 2 or len(set(names)) != len(names):
        raise refuse(f"labels {str(names)[:60]!r} are not two or more distinct names")
    if labels and sorted(names) != sorted(labels):
        shown = " ".join(names[:6]) + (" ..." if len(names) > 6 else "")
        wanted = " and ".join(labels)
        raise ClassifyError(f"{where}: its labels are {shown}, not {wanted}: not for this filter")
    sizes = {"buckets": BUCKETS, "dim": None, "labels": len(names)}
    for key, dims in TENSOR_SHAPES.items():
        tensor = state[key]
        if not isinstance(tensor, torch.Tensor) or tensor.dtype not in FLOAT_DTYPES:
            raise refuse(
                f"{key} is {getattr(tensor, 'dtype', type(tensor).__name__)}, not a float tensor"
            )
        # the embedding fixes D; the other two must agree with it
        if key == "embed" and tensor.dim() == 2:
            sizes["dim"] = tensor.shape[1]
        want = tuple(sizes[d] for d in dims)
        if tuple(tensor.shape) != want:
            raise refuse(f"{key} has shape {tuple(tensor.shape)}, not {want}")
        if not bool(torch.isfinite(tensor).all()):
            raise refuse(f"{key} holds NaN or infinite weights")
    return tuple(state[key].float().numpy() for key in TENSOR_SHAPES)


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
    """A quality classifier file (labels high and low), read once per process (engines reuse it)."""
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
        eta = (total - done) / max(rate, 1e-9)
        counts = f"{done:,} of {total:,} documents (epochs x texts), {rate:,.0f}/s, ETA {eta:.0f} s"
        print(f"{self.what}: {counts}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    from machinery.commands import classify as command

    raise SystemExit(command.main())
