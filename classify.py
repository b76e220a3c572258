"""classify.py: a fastText-style linear text classifier, written by hand; one model, two filters of
the funnel.

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
n-grams sharing a bucket share a row, a small price (B = 2**17). Why it is fast enough for every
document of a crawl: a 1,000-character text has ~3,200 features; scoring it is a gather of 3,200
rows of D = 16 floats, one mean and one (16 x K) product: ~0.1 M flops, a millisecond in Python with
numpy, nothing next to a transformer's forward pass. Training is cross-entropy on the softmax, by
Adam over a few epochs: seconds on one CPU for tens of thousands of documents.

Scoring is numpy (the same floats in every process, so every engine keeps the same documents);
training is torch. A trained model is a plain file of tensors (`save`, `load` with
torch.load(weights_only=True): never a pickle), with a version and its labels; a file from another
version or a damaged one is refused with its name.

Language identification, `identify_language(text) -> ("en", 0.97)`: the default model is trained at
first use (seconds, then cached) on sentences in LANGUAGES made by Faker's lorem provider (MIT
licence; its per-locale lists of real words, drawn into sentences of that language's script and
spelling, not running text). The funnel keeps a document whose top language is one of --lang with a
score >= --lang-threshold (datatrove's 0.65). Quality, `classify_quality(text) -> ("high", 0.9)`:
positives are reference-like text, negatives web-like junk; the default model takes the module
docstrings of Python's standard library as positives and synthetic web spam (Faker's product names,
addresses, phone numbers, catch phrases and keyword lists) as negatives; a user trains their own
from files (data.py's --quality-positives / --quality-negatives). The funnel keeps a document whose
P(high) >= --quality-threshold.

Depends on: numpy, torch and the standard library (no sibling files). Optional: faker (the default
models' text).
"""
from __future__ import annotations

import ast
import functools
import os
import pathlib
import random
import zlib

import numpy as np
import torch

VERSION = 1
BUCKETS = 2 ** 17
DIM = 16
MAX_CHARS = 1_000
NGRAMS = (1, 2, 3)
# ISO 639-1 code -> Faker locale of its word list
LANGUAGES = {
    "ar": "ar_AA",
    "az": "az_AZ",
    "bn": "bn_BD",
    "cs": "cs_CZ",
    "da": "da_DK",
    "de": "de_DE",
    "el": "el_GR",
    "en": "en_US",
    "es": "es_ES",
    "fa": "fa_IR",
    "fr": "fr_FR",
    "he": "he_IL",
    "hy": "hy_AM",
    "it": "it_IT",
    "ja": "ja_JP",
    "mk": "mk_MK",
    "nl": "nl_NL",
    "pl": "pl_PL",
    "ru": "ru_RU",
    "th": "th_TH",
    "tl": "tl_PH",
    "uk": "uk_UA",
    "vi": "vi_VN",
    "zh": "zh_CN",
}


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
        cls, texts: list[str], labels: list[str], epochs: int = 5, seed: int = 0
    ) -> "Classifier":
        """Fit by Adam on the cross-entropy of shuffled mini-batches of 64 documents.

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
        bag = torch.nn.EmbeddingBag(BUCKETS, DIM, mode="mean")
        # fastText's initialization
        torch.nn.init.uniform_(bag.weight, -1 / DIM, 1 / DIM)
        head = torch.nn.Linear(DIM, len(names))
        opt = torch.optim.Adam([*bag.parameters(), *head.parameters()], lr=0.02)
        for _ in range(epochs):
            for batch in torch.randperm(len(texts)).split(64):
                ids = torch.cat([feats[i] for i in batch])
                offsets = torch.tensor([0] + [len(feats[i]) for i in batch[:-1]]).cumsum(0)
                loss = torch.nn.functional.cross_entropy(head(bag(ids, offsets)), y[batch])
                opt.zero_grad()
                loss.backward()
                opt.step()
        return cls(names, bag.weight.detach().numpy(), head.weight.detach().numpy().T.copy(),
                   head.bias.detach().numpy())

    def save(self, path: pathlib.Path | str) -> None:
        """Tensors and labels, written to a temporary file then renamed (never half-written)."""
        tmp = pathlib.Path(f"{path}.tmp{os.getpid()}")
        torch.save(
            {
                "version": VERSION,
                "labels": self.labels,
                "embed": torch.from_numpy(self.embed),
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
            return cls(
                list(state["labels"]), *(state[k].numpy() for k in ("embed", "weight", "bias"))
            )
        # any damage: a truncated zip, a missing key, a pickle
        except Exception as e:
            # torch's are many lines
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ValueError(
                f"{path}: not a classifier file of this version ({first}); retrain it or delete it"
            ) from None


def faker_sentences(code: str, count: int, seed: int) -> list[str]:
    """`count` texts of 1-4 Faker sentences in language `code`."""
    try:
        import faker
    except ImportError:
        raise ValueError(
            "the default classifiers are trained on Faker's text: pip install faker"
        ) from None
    fake = faker.Faker(LANGUAGES[code])
    fake.seed_instance(seed)
    return [
        fake.paragraph(nb_sentences=random.Random(seed + i).randint(1, 4)) for i in range(count)
    ]


def language_corpus(per_language: int, seed: int) -> tuple[list[str], list[str]]:
    """(texts, language codes): per_language texts of each of LANGUAGES."""
    texts = {code: faker_sentences(code, per_language, seed) for code in LANGUAGES}
    return [t for c in texts for t in texts[c]], [c for c in texts for _ in texts[c]]


def reference_texts() -> list[str]:
    """Module docstrings of Python's standard library: curated, edited prose (the default
    positives)."""
    root = pathlib.Path(os.__file__).parent
    docs = (ast.get_docstring(ast.parse(p.read_bytes())) for p in sorted(root.glob("*.py")))
    return [d for d in docs if d and len(d) > 200]


def spam_texts(count: int, seed: int) -> list[str]:
    """Synthetic low-quality web text: shop listings, contact blocks, keyword stuffing (the default
    negatives)."""
    import faker
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


def cache_dir() -> pathlib.Path:
    """Where default models are kept (data.py's cache root, $PRETRAIN_CACHE, else the repository's
    .cache)."""
    return pathlib.Path(
        os.environ.get("PRETRAIN_CACHE", pathlib.Path(__file__).parent / ".cache")
    ).expanduser()


@functools.lru_cache(maxsize=None)
def default_model(task: str) -> Classifier:
    """The default "language" or "quality" classifier: trained on first use (seconds), then read
    from the cache."""
    path = cache_dir() / "classify" / f"{task}-v{VERSION}.pt"
    if path.exists():
        return Classifier.load(path)
    model = Classifier.train(
        *(language_corpus(300, 0) if task == "language" else quality_corpus(0))
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    model.save(path)
    return model


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

