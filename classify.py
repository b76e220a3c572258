"""classify.py: a fastText-style linear text classifier, written by hand; one model, two filters of
the funnel.

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

Scoring is numpy (the same floats in every process: every engine keeps the same documents);
training is torch. A model is a file of tensors, its version and labels (`save`; `load` never
unpickles); a file of another version, or a damaged one, is refused with its name.

Language identification, `identify_language(text) -> ("pt", 0.97)`: trained on real human
translations, the gettext catalogs of Django, Weblate, Wagtail and Sphinx (classify_corpora.py:
what is held out, how to add a language). The funnel keeps a document whose top language is in
--lang with a score >= --lang-threshold (0.65); text in a language it does not know scores low.

Quality, `classify_quality(text) -> ("high", 0.9)`: positives are reference-like text, negatives
web-like junk; the default model takes the module docstrings of Python's standard library as
positives and synthetic web spam (Faker's product names, addresses, phone numbers, catch phrases and
keyword lists) as negatives; a user trains their own from files (data.py's --quality-positives /
--quality-negatives). The funnel keeps a document whose P(high) >= --quality-threshold.

Both default models ship in classifiers/ (language.pt, quality.pt: 2 MiB each, float16);
`python classify.py` retrains them (~20 s; needs django for the text and faker for the spam, only
then).

Depends on: numpy, torch (classify_corpora.py only to retrain the language model).
"""
from __future__ import annotations

import ast
import functools
import os
import pathlib
import random
import re
import sys
import time

import numpy as np
import torch

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
# "%(name)s", "%s", "%1$s", "{name}", "<b>", "&amp;": the message's placeholders and markup, no
# language's words
PLACEHOLDER = re.compile(r"%\(\w+\)[sdfr]|%(?:\d\$)?[sdfr]|\{[\w.:]*\}|<[^<>]*>|&\w+;")
# a .po entry: msgid "..." then msgstr "...", each string possibly continued on "..." lines
PO_ENTRY = re.compile(r'^msgid ((?:".*"\n)+)msgstr ((?:".*"\n)+)', re.MULTILINE)
PO_FUZZY = re.compile(r"^#,.*\bfuzzy\b", re.MULTILINE)
MODEL_DIR = pathlib.Path(__file__).resolve().parent / "classifiers"
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
        cls, texts: list[str], labels: list[str], epochs: int = 5, seed: int = 0
    ) -> "Classifier":
        """Fit by Adam on the cross-entropy of shuffled mini-batches of 64 documents. As in
        fastText, a step updates only the embedding rows of the batch's features (sparse
        gradients), not all B of them: 14,000 Django messages train in ~10 s.

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
        finally:
            torch.set_num_threads(threads)
        # the embedding is kept in float16 (`save`): rounded here, so the saved model is this one
        return cls(names, bag.weight.detach().half().float().numpy(),
                   head.weight.detach().numpy().T.copy(), head.bias.detach().numpy())

    def save(self, path: pathlib.Path | str) -> None:
        """Tensors (the embedding in float16: half the bytes, 2 MiB) and labels, written to a
        temporary file then renamed (never half-written)."""
        tmp = pathlib.Path(f"{path}.tmp{os.getpid()}")
        torch.save(
            {
                "version": VERSION,
                "labels": self.labels,
                "embed": torch.from_numpy(self.embed).half(),
                "weight": torch.from_numpy(self.weight),
                "bias": torch.from_numpy(self.bias),
            },
            tmp,
        )
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: pathlib.Path | str) -> "Classifier":
        try:
            state = torch.load(path, weights_only=True)
            if state.get("version") != VERSION:
                raise ValueError(f"version {state.get('version')!r}, this code reads {VERSION}")
            return cls(list(state["labels"]),
                       *(state[k].float().numpy() for k in ("embed", "weight", "bias")))
        # any damage: a truncated zip, a missing key, a pickle
        except Exception as e:
            # torch's are many lines
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ValueError(
                f"{path}: not a classifier file of this version ({first}); retrain it "
                "(`python classify.py` for the default ones)"
            ) from None


def parse_po(text: str) -> list[tuple[str, str]]:
    """(msgid, msgstr) of a gettext catalog's entries but the header (msgid ""), fuzzy ones and
    plural ones (msgid is followed by msgid_plural, not msgstr); msgstr is "" where a language has
    no translation yet (English's catalogs: all of them). Entries are separated by blank lines; a
    string continues on the lines that follow it, C-style literals that Python reads as one when
    they sit in parentheses, unescaped.

    >>> parse_po('msgid "Save"\\nmsgstr "Enregis"\\n"trer \\\\"1\\\\""\\n\\n'
    ...          '#, fuzzy\\nmsgid "A"\\nmsgstr "B"\\n')
    [('Save', 'Enregistrer "1"')]
    """
    blocks = text.replace("\r\n", "\n").split("\n\n")
    entries = [PO_ENTRY.search(block + "\n") for block in blocks if not PO_FUZZY.search(block)]
    pairs = []
    for entry in entries:
        try:
            pairs.append([ast.literal_eval(f"({quoted})") for quoted in entry.groups()])
        # a string Python does not read as C does (a stray escape): one entry lost, not the file
        except (AttributeError, SyntaxError, ValueError):
            continue
    return [(msgid, msgstr) for msgid, msgstr in pairs if msgid]


def clean_message(text: str) -> str:
    """A message without its placeholders and markup, spaces collapsed: the language's words.

    >>> clean_message("Delete %(name)s <b>now</b>, {count} left")
    'Delete now, left'
    """
    return " ".join(PLACEHOLDER.sub("", text).split())


def language_corpus(split: str) -> tuple[list[str], list[str]]:
    """(texts, language codes) of the "train" or "held-out" text of every language in LANGUAGES
    (classify_corpora.py: the packages' catalogs, their pinned wheels fetched by pip once)."""
    import classify_corpora
    folder = classify_corpora.default_folder()
    classify_corpora.fetch(folder)
    train, held_out = classify_corpora.corpus(folder)
    chosen = train if split == "train" else held_out
    pairs = [(text, code) for code in LANGUAGES for text in chosen.get(code, [])]
    return [t for t, _ in pairs], [c for _, c in pairs]


def reference_texts() -> list[str]:
    """Module docstrings of Python's standard library: curated, edited prose (the default
    positives)."""
    root = pathlib.Path(os.__file__).parent
    docs = (ast.get_docstring(ast.parse(p.read_bytes())) for p in sorted(root.glob("*.py")))
    return [d for d in docs if d and len(d) > 200]


def spam_texts(count: int, seed: int) -> list[str]:
    """Synthetic low-quality web text: shop listings, contact blocks, keyword stuffing (the default
    negatives)."""
    try:
        import faker
    except ImportError:
        raise ValueError("the default quality model's negatives are Faker's: pip install faker") \
            from None
    fake, rng = faker.Faker("en_US"), random.Random(seed)
    fake.seed_instance(seed)
    parts = [lambda: f"BUY {fake.catch_phrase().upper()} NOW!!! only ${rng.randint(1, 99)}.99",
             lambda: f"{fake.company()} | {fake.address()} | call {fake.phone_number()}",
             lambda: " ".join(fake.words(8)) + " best cheap free " + " ".join(fake.words(4)),
             lambda: f"Home > {fake.word().title()} > {fake.bs().title()} >> click here",
             lambda: f"{fake.email()} {fake.url()} #{fake.word()} #{fake.word()} login | register"]
    return ["\n".join(rng.choice(parts)() for _ in range(rng.randint(3, 12))) for _ in range(count)]


def quality_corpus(seed: int) -> tuple[list[str], list[str]]:
    """(texts, "high"/"low"): the reference docstrings and as many spam pages."""
    high = reference_texts()
    return high + spam_texts(len(high), seed), ["high"] * len(high) + ["low"] * len(high)


def train_default(task: str) -> Classifier:
    """The default "language" or "quality" classifier, trained afresh (what classifiers/ ships)."""
    return Classifier.train(*(language_corpus("train") if task == "language"
                              else quality_corpus(0)))


@functools.lru_cache(maxsize=None)
def default_model(task: str) -> Classifier:
    """The shipped "language" or "quality" classifier, read once per process."""
    return Classifier.load(MODEL_DIR / f"{task}.pt")


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
    """A classifier file, read once per process (every chunk of an engine reuses it)."""
    return Classifier.load(path)


def main() -> None:
    """python classify.py: retrain the default models into classifiers/ (needs django, faker)."""
    for task in ("language", "quality"):
        start = time.perf_counter()
        try:
            model = train_default(task)
        except ValueError as e:
            sys.exit(f"classify.py: {e}")
        model.save(MODEL_DIR / f"{task}.pt")
        print(f"{MODEL_DIR.name}/{task}.pt: {len(model.labels)} labels, trained in "
              f"{time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
