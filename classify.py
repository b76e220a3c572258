"""classify.py: a fastText-style linear text classifier, written by hand; two filters of the funnel.

The last two steps of the lecture's filter table are "language detection" and "a classifier score".
Both are the same small model (Joulin et al. 2016, "Bag of Tricks for Efficient Text
Classification"; fastText's lid.176 is one, DCLM's quality filter another):

    text -> features: its character 1-, 2- and 3-grams and its words, each hashed to one of B
            buckets
         -> average of their rows of an embedding E (B, D)      # bag of features: no order
         -> a linear layer W (D, K) + b -> softmax over K labels   # "en", "fr", ... or "high"

What it sees of a document: its first MAX_CHARS characters, lower-cased with spaces collapsed, so a
5 MB page costs as much as a 1 KB one. Character n-grams carry the language ("th", "ing", "sch",
"ção"), and need no spaces: Chinese, Japanese and Thai are written without them, and their single
characters are already features. Why hashing: the vocabulary of n-grams of a crawl is unbounded;
crc32(n-gram) mod B maps any of them to a fixed table with no dictionary to build or ship. Two
n-grams sharing a bucket share a row, a small price (B = 2**16). Why it is fast enough for every
document of a crawl: a 1,000-character text has ~3,200 features; scoring it is a gather of 3,200
rows of D = 16 floats, one mean and one (16 x K) product: ~0.1 M flops, a millisecond in Python with
numpy, nothing next to a transformer's forward pass. Training is cross-entropy on the softmax, by
Adam over a few epochs, a step touching only its batch's rows: seconds on one CPU for tens of
thousands of documents.

Language identification, `identify_language(text) -> ("en", 0.97)`: trained on human translations
(docs/data.md); --lang keeps a top language listed, score >= --lang-threshold (datatrove's 0.65).

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

Depends on: numpy, torch, the standard library and fileio.py (files written whole).
"""
from __future__ import annotations

import argparse
import ast
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

import fileio

VERSION = 1
BUCKETS = 2 ** 16
DIM = 16
MAX_CHARS = 1_000
NGRAMS = (1, 2, 3)
# ISO 639-1 codes; Django's locale folder is the same code but for Chinese
LANGUAGES = ("ar az bn cs da de el en es fa fr he hy it ja ko mk nl pl ru th uk vi zh").split()
DJANGO_LOCALE = {"zh": "zh_Hans"}
# "%(name)s", "%s", "{name}": the message's placeholders, no language's words
PLACEHOLDER = re.compile(r"%\(\w+\)[sd]|%[sd]|\{\w*\}")
# a .po entry: msgid "..." then msgstr "...", each string possibly continued on "..." lines
PO_ENTRY = re.compile(r'^msgid ((?:".*"\n)+)msgstr ((?:".*"\n)+)', re.MULTILINE)
PO_FUZZY = re.compile(r"^#,.*\bfuzzy\b", re.MULTILINE)
# one message in HELD_OUT_EVERY is held out (by its msgid's crc32), in every language
HELD_OUT_EVERY = 5
MODEL_DIR = pathlib.Path(__file__).resolve().parent / "classifiers"
QUALITY_LABELS = ("high", "low")


def features(text: str) -> np.ndarray:
    """The hashed bucket of each character n-gram and word of the text's first MAX_CHARS characters.

    >>> grams = (" ", "h", "i", " ", " h", "hi", "i ", " hi", "hi ", "hi")
    >>> features("Hi").tolist() == [zlib.crc32(g.encode()) % BUCKETS for g in grams]
    True
    """
    s = " " + " ".join(text[:MAX_CHARS].lower().split()) + " "
    grams = [s[i:i + n] for n in NGRAMS for i in range(len(s) - n + 1)] + s.split()
    return np.array([zlib.crc32(g.encode()) % BUCKETS for g in grams], dtype=np.int64)


class Classifier:
    """Averaged hashed-feature embeddings, a linear layer, softmax. `predict` -> (label,
    probability)."""

    def __init__(
        self, labels: list[str], embed: np.ndarray, weight: np.ndarray, bias: np.ndarray
    ) -> None:
        self.labels, self.embed, self.weight, self.bias = labels, embed, weight, bias

    def probabilities(self, text: str) -> np.ndarray:
        # (D,) @ (D, K) -> (K,)
        logits = self.embed[features(text)].mean(0) @ self.weight + self.bias
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
        gradients), not all B of them: 14,000 Django messages train in ~10 s. `progress(done,
        total)` is called after each batch (documents seen, of epochs x documents).

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


def po_messages(path: pathlib.Path) -> list[tuple[str, str]]:
    """(msgid, msgstr) of a gettext catalog's entries but the header (msgid ""), fuzzy ones and
    plural ones (msgid is followed by msgid_plural, not msgstr); msgstr is "" where a language has
    no translation yet (English's catalogs: all of them). Entries are separated by blank lines; a
    string continues on the lines that follow it, C-style literals that Python reads as one when
    they sit in parentheses, unescaped.

    >>> import tempfile
    >>> po = pathlib.Path(tempfile.mkdtemp()) / "x.po"
    >>> _ = po.write_text('msgid "Save"\\nmsgstr "Enregis"\\n"trer \\\\"1\\\\""\\n\\n'
    ...                   '#, fuzzy\\nmsgid "A"\\nmsgstr "B"\\n')
    >>> po_messages(po)
    [('Save', 'Enregistrer "1"')]
    """
    blocks = path.read_text(encoding="utf-8").split("\n\n")
    entries = [PO_ENTRY.search(block + "\n") for block in blocks if not PO_FUZZY.search(block)]
    pairs = [[ast.literal_eval(f"({quoted})") for quoted in e.groups()] for e in entries if e]
    return [(msgid, msgstr) for msgid, msgstr in pairs if msgid]


@functools.lru_cache(maxsize=None)
def django_messages(code: str) -> dict[str, str]:
    """msgid -> its translation into `code` (for "en", the msgid itself), placeholders removed,
    from every catalog of Django's wheel. A translation equal to its msgid ("OK", "URL") is left
    out: it says nothing of the language."""
    try:
        import django
    except ImportError:
        raise ValueError(
            "the default language model trains on Django's translations: "
            "pip install 'django>=5.2,<5.3'"
        ) from None
    root = pathlib.Path(django.__file__).parent
    locale = DJANGO_LOCALE.get(code, code)
    found = {}
    for path in sorted(root.rglob(f"locale/{locale}/LC_MESSAGES/*.po")):
        for msgid, msgstr in po_messages(path):
            text = " ".join(PLACEHOLDER.sub("", msgid if code == "en" else msgstr).split())
            if text and (code == "en" or msgstr != msgid):
                found.setdefault(msgid, text)
    return found


def language_corpus(split: str) -> tuple[list[str], list[str]]:
    """(texts, language codes) of the "train" or "held-out" messages of every language in
    LANGUAGES: ~14,000 and ~3,100."""
    pairs = [(text, code) for code in LANGUAGES for msgid, text in django_messages(code).items()
             if (zlib.crc32(msgid.encode()) % HELD_OUT_EVERY == 0) == (split == "held-out")]
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
             and (zlib.crc32(text.encode()) % HELD_OUT_EVERY == 0) == (split == "held-out")]
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


def train_default(task: str, progress=None) -> Classifier:
    """The default "language" or "quality" classifier, trained afresh (what classifiers/ ships)."""
    if task == "language":
        return Classifier.train(*language_corpus("train"), progress=progress)
    return Classifier.train(*quality_corpus(), progress=progress)


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
    parser = argparse.ArgumentParser(
        prog="classify.py", description="Train the language or quality classifier (the models "
        "that ship in classifiers/ are read by data.py's --lang and --quality-threshold).")
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser(
        "train", help="train a classifier into --out",
        description="Train a classifier and write it to OUT/TASK.pt (atomically). The shipped ones "
        "are rewritten only by --out classifiers.")
    train.add_argument("task", choices=("language", "quality"))
    train.add_argument("--out", default="out/classifiers",
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
    args = parse_args(argv)
    out = pathlib.Path(args.out)
    path = out / f"{args.task}.pt"
    try:
        if args.task == "language" and (args.positives or args.negatives):
            raise ClassifyError("--positives and --negatives train the quality model; "
                                "drop them or train quality")
        if out.exists() and not out.is_dir():
            raise ClassifyError(f"--out {out} is a file; name a folder")
        start = time.perf_counter()
        if args.task == "language":
            texts, labels = language_corpus("train")
        else:
            texts, labels = quality_corpus(tuple(args.positives), tuple(args.negatives))
        model = Classifier.train(texts, labels, progress=Progress(f"training {args.task}"))
        created = fileio.missing_folders(out)
        out.mkdir(parents=True, exist_ok=True)
        try:
            model.save(path, fix="choose another --out")
        except ClassifyError:
            fileio.remove_if_empty(created)
            raise
    except ClassifyError as e:
        print(f"classify.py: error: {e}", file=sys.stderr)
        return 2
    print(f"{path}: {len(model.labels)} labels, {len(texts):,} documents, trained in "
          f"{time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
