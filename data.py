"""data.py: from raw corpora to clean, deduplicated, mixed, packed token shards, and the loader that
reads them.

"What the model learns depends on what it reads." Raw text is mostly unusable: web pages carry
menus, footers, boilerplate, machine-made junk and duplicates. The lecture's pipeline, with its
illustrative funnel for 1,000 pages:

    step                      what it does                                         1,000 web pages
    extract text              HTML -> body text, drop menus and footers            1,000
    language/quality filters  rules (length, symbol ratio, repeated lines), ...    300 left
    dedup                     drop exact and near-identical documents              200 left
    PII removal               emails, phone numbers, ... -> placeholders           200, masked
    mixing                    decide how much web, code, books, math               by weight

"Most of it is thrown away" is normal. This file runs that funnel on real text and prints it the
same way. On the embedded corpus (the standard library's docstrings, CPython 3.11): 722 documents
read -> 337 pass the Gopher rules (236 have under 50 words, 121 repeat too many 5-grams) -> 336
after exact dedup -> 335 after near-dedup, 7 IPs and 5 emails masked: 2.50M characters in, 1.19M
out. Mixing is arithmetic on tokens: 20e9 training tokens at 70% web / 15% code / 10% books / 5%
math asks for 1e9 math tokens; with 0.5e9 unique math tokens on hand, math is read 2 times.

    python data.py prepare --data pydocs       # the embedded corpus: stdlib docstrings, offline
    python data.py mix --tokens 20e9 --weights web=0.70 code=0.15 books=0.10 math=0.05

Text someone chose (a local .txt, .md, .raw or .py file) is kept whole by default: cut into pieces,
PII-masked, and nothing else (Tiny Shakespeare through the web funnel would lose half its text).
The validation split is cut after deduplication, so no validation document has a near-duplicate in
train; the tokenizer (bpe.py) is trained on the train split only. Documents are encoded, each
preceded by <|endoftext|>, and packed into shards: a 32-byte header, then raw uint16 token ids.
The loader memory-maps the shards: `get_batch` draws random windows, `iterator` walks a seeded
permutation of windows, split across data-parallel ranks, with a position that can be saved.

This file is the lesson, on lists: machinery/cleaning.py and in_memory.py run it in order. The
machinery around it (machinery/: the file formats and object stores a Source is read from,
`prepare`'s checks and cache, the streaming and Ray engines, the command line) is described in
docs/data.md and docs/data-at-scale.md; both engines write byte-identical datasets, because every
choice about a document is a keyed hash of its text (`document_keys`).

Depends on: numpy, torch, the standard library, bpe.py, classify.py and dedup.py.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import hashlib
import json
import html.parser
import itertools
import math
import os
import pathlib
import re
import struct
import sys
import tempfile
import time
import warnings
from typing import Callable, Iterable, Iterator

import numpy as np
import torch

import bpe
import classify
import dedup

# the marker before each document
EOT = "<|endoftext|>"


class DataError(ValueError):
    """Bad input to the data pipeline: the message is one line naming the problem and the fix."""


# the tiny CPU run: small enough to train on ~2 MB in seconds, big enough for words
DEFAULT_VOCAB_SIZE = 4096


# --------------------------------------------------------------------------------------------------
# 1. Sources: each yields documents (strings) in a stable order
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Source:
    """A named stream of documents.

    kind: "prose" (Gopher quality filters, boilerplate-line removal), "code" (code filters only) or
    "html" (text is extracted first, then treated as prose). fingerprint: what the cache key needs
    to know about the input (file sizes and mtimes, the Python version for embedded corpora).
    curated: local text files (.txt, .md, .raw, .py), which someone chose and which `clean` keeps
    whole by default, as opposed to web-like sources (.jsonl, .parquet, .html, hf:, the embedded
    corpora that demonstrate the funnel).
    """

    spec: str
    kind: str
    fingerprint: str
    read: Callable[[], Iterator[str]]
    max_documents: int | None = None
    # the files (or objects' URIs) it reads, in order (none for names)
    files: tuple[pathlib.Path | str, ...] = ()
    curated: bool = False
    # the funnel table's name for it: the spec, or a path's (or URI's) file name
    label: str = ""

    def __post_init__(self) -> None:
        self.label = self.label or self.spec

    def documents(self) -> Iterator[str]:
        for i, doc in enumerate(self.read()):
            if self.max_documents is not None and i >= self.max_documents:
                return
            yield doc


# --------------------------------------------------------------------------------------------------
# 2. Extract text from HTML (standard library parser)
# --------------------------------------------------------------------------------------------------


class _TextExtractor(html.parser.HTMLParser):
    """Collects visible text, skipping non-content elements and breaking paragraphs at block
    elements."""

    # elements whose text is not content
    SKIP = set("script style nav header footer aside noscript template head svg iframe".split())
    SKIP |= {"form", "button", "select"}
    # elements that end a paragraph
    BLOCK = set("p div br li ul ol h1 h2 h3 h4 h5 h6 tr table section article main".split())
    BLOCK |= set("blockquote pre hr dl dt dd figcaption title body".split())
    PARAGRAPH = "\x00"

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skip_depth = 0

    def handle_starttag(self, tag: str, attrs) -> None:
        if tag in self.SKIP:
            self.skip_depth += 1
        elif tag in self.BLOCK:
            self.parts.append(self.PARAGRAPH)

    def handle_startendtag(self, tag: str, attrs) -> None:
        if tag in self.BLOCK:
            self.parts.append(self.PARAGRAPH)

    def handle_endtag(self, tag: str) -> None:
        if tag in self.SKIP:
            self.skip_depth = max(0, self.skip_depth - 1)
        elif tag in self.BLOCK:
            self.parts.append(self.PARAGRAPH)

    def handle_data(self, data: str) -> None:
        if not self.skip_depth:
            self.parts.append(data)


def html_to_text(page: str) -> str:
    """Body text of an HTML page: no script/style/nav/header/footer/aside, one paragraph per block
    element.

    >>> html_to_text("<nav>Home | About</nav><p>Hello <b>big</b>\\n world.</p>"
    ...              "<footer>(c) 2024</footer><p>Bye</p>")
    'Hello big world.\\n\\nBye'
    """
    parser = _TextExtractor()
    parser.feed(page)
    parser.close()
    paragraphs = "".join(parser.parts).split(_TextExtractor.PARAGRAPH)
    return "\n\n".join(" ".join(p.split()) for p in paragraphs if p.strip())


# --------------------------------------------------------------------------------------------------
# 3. Quality filters: rules after Gopher (Rae et al. 2021, MassiveText), each rejection with a named
#    reason
# --------------------------------------------------------------------------------------------------

GOPHER_STOP_WORDS = frozenset({"the", "be", "to", "of", "and", "that", "have", "with"})
# rules that know one language's words, and languages written without spaces between words
ENGLISH_ONLY_RULES = ("stop_words",)
UNSPACED_LANGUAGES = frozenset({"zh", "ja", "th", "lo", "km", "my", "bo"})
WORD_COUNT_RULES = ("too_few_words", "too_many_words", "mean_word_length")
_BULLETS = ("-", "*", "•", "‣", "●", "◦", "–")
_PUNCTUATION = ".,;:!?\"'()[]{}"
# chars in the most frequent n-gram / all word chars
TOP_NGRAM_MAX = {2: 0.20, 3: 0.18, 4: 0.16}
# chars in repeated n-grams / all
DUP_NGRAM_MAX = {5: 0.15, 6: 0.14, 7: 0.13, 8: 0.12, 9: 0.11, 10: 0.10}


def _duplicate_fractions(items: list[str]) -> tuple[float, float]:
    """(fraction of items that repeat an earlier one, fraction of characters in those repeats).

    >>> _duplicate_fractions(["a", "bb", "a", "a"])
    (0.5, 0.4)
    """
    seen, dup_items, dup_chars = set(), 0, 0
    for item in items:
        if item in seen:
            dup_items += 1
            dup_chars += len(item)
        seen.add(item)
    total_chars = sum(len(i) for i in items)
    return dup_items / max(1, len(items)), dup_chars / max(1, total_chars)


class NGrams:
    """The n-grams of a word list as small integers, equal n-grams equal integers, exactly (no
    hashing): word ids, then (n-1)-gram id and next word id paired and renumbered by one numpy sort
    per n (an id: where the first of its equals sorts), in place of a dict of word tuples per n
    (the Gopher n-gram rules were 80% of the filter's time).

    >>> NGrams("a b a b a".split()).of(2).tolist()                  # "a b", "b a", "a b", "b a"
    [0, 2, 0, 2]
    >>> NGrams("a b a b a".split()).of(1).tolist()                  # words: where each first occurs
    [0, 1, 0, 1, 0]
    """

    def __init__(self, words: list[str]) -> None:
        first_position: dict[str, int] = {}
        # (N,)
        self.lengths = np.fromiter(map(len, words), dtype=np.int64, count=len(words))
        self.ids = {
            1: np.fromiter(
                map(first_position.setdefault, words, itertools.count()),
                dtype=np.int64,
                # n -> (N-n+1,); a word's id: where it first occurs
                count=len(words),
            )
        }

    def of(self, n: int) -> np.ndarray:
        while n not in self.ids:
            k = max(self.ids)
            # (k-gram, next word)
            pairs = self.ids[k][:-1] * (len(self.lengths) + 1) + self.ids[1][k:]
            self.ids[k + 1] = np.searchsorted(np.sort(pairs), pairs)
        return self.ids[n]


def _top_ngram_fraction(ngrams: NGrams, n: int, total_chars: int) -> float:
    """Share of word characters covered by the single most frequent n-gram (counting every
    occurrence; among equally frequent n-grams, the one seen first)."""
    ids = ngrams.of(n)
    if not len(ids):
        return 0.0
    counts = np.bincount(ids)
    if counts.max() < 2:
        return 0.0
    # first position of a top n-gram
    first = np.flatnonzero(counts[ids] == counts.max())[0]
    return int(counts.max()) * int(ngrams.lengths[first : first + n].sum()) / total_chars


def _duplicate_ngram_fraction(ngrams: NGrams, n: int, total_chars: int) -> float:
    """Share of word characters inside n-grams that occur more than once (each word counted
    once)."""
    ids = ngrams.of(n)
    if not len(ids):
        return 0.0
    # (N-n+1,) positions of repeats
    repeated = np.bincount(ids)[ids] > 1
    # (N,) the words inside one: a repeat at i covers words i .. i+n-1
    covered = np.convolve(repeated, np.ones(n, dtype=np.int64)) > 0
    return int(ngrams.lengths[covered].sum()) / total_chars


GOPHER_RULE_SETS = ("all", "handout")


def gopher_rejection(
    text: str,
    min_words: int = 50,
    max_words: int = 100_000,
    rules: str = "all",
    language: str = "en",
) -> str | None:
    """The first Gopher rule a document breaks (its name), or None when it passes. Rules (Rae et al.
    2021, App. A):

        too_few_words, too_many_words   50 <= words <= 100,000 (words: whitespace-separated)
        mean_word_length                3 to 10 characters
        symbol_ratio                    ("#" + "...") per word <= 0.1
        bullet_lines, ellipsis_lines    <= 90% of lines start with a bullet, <= 30% end with "..."
        alphabetic_words                >= 80% of words contain a letter
        stop_words                      at least 2 of: the, be, to, of, and, that, have, with
        duplicate_lines, _paragraphs    <= 30% of lines (paragraphs) repeat one above,
                                        holding <= 20% of characters
        top_2gram, _3gram, _4gram       the most frequent n-gram covers <= 20%, 18%, 16% of chars
        duplicate_5grams ... _10grams   repeated n-grams cover <= 15%, 14%, ... 10% of characters

    rules="handout" keeps only the four that Stanford CS336's data handout (assignment 4) asks for:
    word count, mean word length, ellipsis lines and alphabetic words (words here are
    whitespace-separated; the handout tokenizes with NLTK, which also counts punctuation marks as
    words).

    Two rules know only some languages: stop_words is English's (ENGLISH_ONLY_RULES: a French
    page has none of "the", "of"), and the word counts and mean word length need words between
    spaces (UNSPACED_LANGUAGES: Chinese, Japanese, Thai write none). `language`, the document's
    (classify.py's identifier, under --lang), skips the rules that do not know it; without --lang
    every document is taken for English.

    >>> gopher_rejection("too short")
    'too_few_words'
    >>> gopher_rejection(" ".join(["the quick brown fox jumps over the lazy dog and runs"] * 10))
    'top_3gram'
    >>> fox = " ".join(["the quick brown fox jumps over the lazy dog"] * 10)
    >>> print(gopher_rejection(fox, rules="handout"))
    None
    """
    if rules not in GOPHER_RULE_SETS:
        raise DataError(f"unknown Gopher rule set {rules!r}; use {' or '.join(GOPHER_RULE_SETS)}")
    words = text.split()
    lines = [line.strip() for line in text.split("\n") if line.strip()]
    reason = _word_rejection(text, words, lines, min_words, max_words, rules == "all", language)
    if reason is not None or rules != "all":
        return reason
    return _repetition_rejection(text, lines, words, sum(map(len, words)))


def _word_rejection(
    text: str,
    words: list[str],
    lines: list[str],
    min_words: int,
    max_words: int,
    every_rule: bool,
    language: str,
) -> str | None:
    """Gopher's rules on words and lines: counts, mean length, symbols, bullets, ellipses, letters,
    stop words (the handout's four when not every_rule)."""
    spaced = language not in UNSPACED_LANGUAGES
    n = len(words)
    if n < min_words and spaced:
        return "too_few_words"
    if n > max_words and spaced:
        return "too_many_words"
    if not n:
        return "too_few_words"
    total_chars = sum(map(len, words))
    if not 3 <= total_chars / n <= 10 and spaced:
        return "mean_word_length"
    if every_rule and (text.count("#") + text.count("...") + text.count("…")) / n > 0.1:
        return "symbol_ratio"
    if every_rule and sum(line.startswith(_BULLETS) for line in lines) > 0.9 * len(lines):
        return "bullet_lines"
    if sum(line.endswith(("...", "…")) for line in lines) > 0.3 * len(lines):
        return "ellipsis_lines"
    letterless = _NO_ASCII_LETTER.findall(" " + text)
    if n - sum(not any(map(str.isalpha, w)) for w in letterless) < 0.8 * n:
        return "alphabetic_words"
    if not every_rule:
        return None
    # the words as they are (most pages have two), lower-cased, then "the," too
    if (
        language == "en"
        and len(GOPHER_STOP_WORDS.intersection(words)) < 2
        and len(GOPHER_STOP_WORDS.intersection(text.lower().split())) < 2
        and len(GOPHER_STOP_WORDS.intersection(w.lower().strip(_PUNCTUATION) for w in words)) < 2
    ):
        return "stop_words"
    return None


def _repetition_rejection(
    text: str, lines: list[str], words: list[str], total_chars: int
) -> str | None:
    """Gopher's repetition rules (machine-made text repeats itself): duplicate lines and paragraphs,
    then the n-gram rules, each a fraction of the document's characters."""
    dup_lines, dup_line_chars = _duplicate_fractions(lines)
    if dup_lines > 0.3 or dup_line_chars > 0.2:
        return "duplicate_lines"
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
    dup_paragraphs, dup_paragraph_chars = _duplicate_fractions(paragraphs)
    if dup_paragraphs > 0.3 or dup_paragraph_chars > 0.2:
        return "duplicate_paragraphs"
    ngrams = NGrams(words)
    for k, limit in TOP_NGRAM_MAX.items():
        if _top_ngram_fraction(ngrams, k, total_chars) > limit:
            return f"top_{k}gram"
    for k, limit in DUP_NGRAM_MAX.items():
        fraction = _duplicate_ngram_fraction(ngrams, k, total_chars)
        if fraction > limit:
            return f"duplicate_{k}grams"
        # longer repeats lie inside shorter ones: all pass from here
        if fraction <= min(DUP_NGRAM_MAX.values()):
            return None
    return None


# a word without an ASCII letter, after whitespace (the text gets a space in front): one pass over
# the text, then those few checked for any letter (é, 中), instead of a Python call per word
_NO_ASCII_LETTER = re.compile(r"\s([^\sA-Za-z]+)(?!\S)")


def code_rejection(text: str) -> str | None:
    """Rules for source code (as in the Codex and StarCoder data cards): minified or generated files
    have huge lines; data blobs have few letters and digits.

    >>> code_rejection("x = 1\\n" + "y = [" + "0, " * 500 + "]\\n")
    'max_line_length'
    """
    lines = text.split("\n")
    if max(len(line) for line in lines) > 1000:
        return "max_line_length"
    if len(text) / len(lines) > 100:
        return "mean_line_length"
    if sum(c.isalnum() for c in text) < 0.25 * len(text):
        return "alphanumeric_fraction"
    return None


# --------------------------------------------------------------------------------------------------
# 4. Exact dedup of documents, and removal of lines repeated across the corpus (boilerplate)
# --------------------------------------------------------------------------------------------------


def document_hash(text: str) -> int:
    """64-bit hash of a document after normalising case and whitespace, so re-wrapped copies
    collide. Fixed size: a stream keeps 8 bytes per document, not the text (two of 10^8 documents
    collide with odds ~3·10^-4).

    >>> h = document_hash
    >>> h("Hello  World\\n") == h("hello world") != h("hello word")
    True
    """
    return int.from_bytes(
        hashlib.blake2b(" ".join(text.lower().split()).encode("utf-8"), digest_size=8).digest(),
        "little",
    )


def exact_dedup(texts: list[str]) -> list[int]:
    """Indices of the first document of each hash group, in order.

    >>> exact_dedup(["a b", "c", "A  b", "c", "d"])
    [0, 1, 4]
    """
    seen, kept = set(), []
    for i, text in enumerate(texts):
        h = document_hash(text)
        if h not in seen:
            seen.add(h)
            kept.append(i)
    return kept


# shorter lines ("Returns", "}", "Share this") are never boilerplate
BOILERPLATE_MIN_WORDS = 3


def countable_lines(text: str, min_words: int = BOILERPLATE_MIN_WORDS) -> set[str]:
    """The distinct stripped lines of a document long enough to count as boilerplate.

    >>> sorted(countable_lines("Read more about it\\n}\\n  Read more about it  \\nok"))
    ['Read more about it']
    """
    return {
        line for line in (raw.strip() for raw in text.split("\n")) if len(line.split()) >= min_words
    }


def boilerplate_lines(
    texts: list[str], min_documents: int = 3, min_words: int = BOILERPLATE_MIN_WORDS
) -> set[str]:
    """Lines (stripped, at least min_words words) that occur in at least min_documents different
    documents: cookie notices, navigation leftovers, licence footers. Short lines ("Returns", "}")
    are never boilerplate.

    >>> line = "All rights reserved here"
    >>> sorted(boilerplate_lines([f"a\\n{line}", f"b\\n{line}", "c"], 2))
    ['All rights reserved here']
    """
    document_counts = collections.Counter()
    for text in texts:
        document_counts.update(countable_lines(text, min_words))
    return {line for line, count in document_counts.items() if count >= min_documents}


def remove_lines(text: str, lines: set[str]) -> tuple[str, int]:
    """(text without those lines, how many lines were removed)."""
    kept = [line for line in text.split("\n") if line.strip() not in lines]
    removed = text.count("\n") + 1 - len(kept)
    return "\n".join(kept).strip(), removed


LINE = re.compile(r"[^\n]*\n|[^\n]+")  # a line with its newline, or a last line without one


def repeated_lines(texts: list[str]) -> set[str]:
    """Lines (exactly, without their newline) that occur more than once in the whole corpus,
    counting every occurrence, so a line repeated inside one document counts too: Stanford CS336's
    exact line dedup.

    >>> sorted(repeated_lines(["a\\nb\\n", "b\\nc", "c\\nd\\nd"]))
    ['b', 'c', 'd']
    """
    counts = collections.Counter(line.rstrip("\n") for text in texts for line in LINE.findall(text))
    return {line for line, count in counts.items() if count > 1}


def drop_lines(text: str, lines: set[str]) -> tuple[str, int]:
    """(text without those lines, how many were removed); kept lines keep their newlines, so a
    file's trailing newline survives and a document whose every line goes becomes "".

    >>> drop_lines("- home\\n- back\\nbody\\n", {"- home"})
    ('- back\\nbody\\n', 1)
    """
    all_lines = LINE.findall(text)
    kept = [line for line in all_lines if line.rstrip("\n") not in lines]
    return "".join(kept), len(all_lines) - len(kept)


# --------------------------------------------------------------------------------------------------
# 5. PII masking
# --------------------------------------------------------------------------------------------------

_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
PII_PATTERNS = {
    # local@domain.tld; the TLD needs 2+ letters, so "a@b" in code is left alone.
    "EMAIL": re.compile(r"\b[A-Za-z0-9._%+-]+@(?:[A-Za-z0-9-]+\.)+[A-Za-z]{2,}\b"),
    # four octets 0-255; not inside a longer dotted number ("1.2.3.4.5") or a word ("v1.2.3.4").
    "IP": re.compile(rf"(?<![\w.]){_OCTET}(?:\.{_OCTET}){{3}}(?!\.?\d)(?!\w)"),
    # North American (555) 123-4567, (555)-123-4567 (CS336's format), 555-123-4567, 555.123.4567, +1
    # 555 123 4567; international +44 20 7946 0958. Separators are required, so bare numbers, dates
    # (2023-01-15) and versions (3.11.7) never match.
    "PHONE": re.compile(
        r"(?<![\w+.-])(?:(?:\+?1[ .-]?)?(?:\(\d{3}\)[ .-]?|\d{3}[ .-])\d{3}[ .-]\d{4}"
        r"|\+\d{1,3}(?:[ .-]\(?\d{1,4}\)?){2,5})(?!\d)(?![.-]\d)"
    ),
}


# What each pattern cannot match without (one of): cheap searches that spare most documents the
# slow pattern (PII masking was a seventh of the CPU time of prepare)
PII_NEEDS = {
    "EMAIL": [re.compile(r"@[A-Za-z0-9-]+\.")],  # the domain's first part
    "IP": [re.compile(r"\.\d{1,3}\.")],  # the second octet, between dots
    "PHONE": [re.compile(r"\d{3}[ .-]\d{4}"), re.compile(r"\+\d")],  # how each form ends or starts
}

# A dotted quad right after "version", "Ver.", "driver", "build", ... is a version number, not an
# address.
_VERSION_CONTEXT = re.compile(
    r"(?i)\b(?:v|ver\.?|version|release|build|driver|firmware|update)\s*$"
)


def mask_pii(text: str) -> tuple[str, collections.Counter]:
    """Replace emails, phone numbers and IPv4 addresses with <EMAIL>, <PHONE>, <IP>; return the
    counts.

    >>> text, counts = mask_pii("Mail bob@example.com or call (555) 123-4567 from 10.0.0.1, "
    ...                         "Python 3.11.7, 2023-01-15.")
    >>> text
    'Mail <EMAIL> or call <PHONE> from <IP>, Python 3.11.7, 2023-01-15.'
    >>> sorted(counts.items())
    [('EMAIL', 1), ('IP', 1), ('PHONE', 1)]
    """
    counts = collections.Counter()
    for label, pattern in PII_PATTERNS.items():
        if not any(need.search(text) for need in PII_NEEDS[label]):
            continue

        def replace(match: re.Match, label=label) -> str:
            if label == "PHONE" and not 7 <= sum(c.isdigit() for c in match.group()) <= 15:
                return match.group()
            if label == "IP" and _VERSION_CONTEXT.search(
                match.string, max(0, match.start() - 16), match.start()
            ):
                return match.group()
            counts[label] += 1
            return f"<{label}>"

        text = pattern.sub(replace, text)
    return text, counts


# --------------------------------------------------------------------------------------------------
# 6. The funnel: every step reports documents and characters in and out, and why documents left
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Step:
    """One row of the funnel; reasons maps a named cause to how many documents (or lines, or masks)
    it hit."""

    name: str
    docs_in: int
    docs_out: int
    chars_in: int
    chars_out: int
    reasons: dict = dataclasses.field(default_factory=dict)


class Funnel:
    """The lecture's table (1,000 -> 300 -> 200 ...) for an actual run."""

    def __init__(self) -> None:
        self.steps: list[Step] = []
        # UTF-8 bytes of every document read, for the throughput figure
        self.bytes_read = 0
        # one line per source that cleaning cut by more than a quarter
        self.notices: list[str] = []

    def add(
        self, name: str, before: list[str], after: list[str], reasons: dict | None = None
    ) -> None:
        self.add_counts(
            name, len(before), len(after), sum(map(len, before)), sum(map(len, after)), reasons
        )

    def add_counts(
        self,
        name: str,
        docs_in: int,
        docs_out: int,
        chars_in: int,
        chars_out: int,
        reasons: dict | None = None,
    ) -> None:
        """A row from counts (the streaming engine sums them over chunks; it never holds the
        documents)."""
        self.steps.append(
            Step(
                name,
                int(docs_in),
                int(docs_out),
                int(chars_in),
                int(chars_out),
                dict(sorted((reasons or {}).items(), key=lambda kv: (-kv[1], kv[0]))),
            )
        )

    @classmethod
    def from_manifest(cls, manifest: dict) -> "Funnel":
        funnel = cls()
        funnel.steps = [Step(**s) for s in manifest["funnel"]]
        return funnel

    def to_list(self) -> list[dict]:
        return [dataclasses.asdict(s) for s in self.steps]

    def format(self) -> str:
        width = max([len(s.name) for s in self.steps] + [30])
        rows = [
            f"{'step':<{width}}{'documents':>20}{'characters':>24}   removed or changed because"
        ]
        for s in self.steps:
            docs = f"{s.docs_in:,} -> {s.docs_out:,}"
            chars = f"{s.chars_in / 1e6:,.2f}M -> {s.chars_out / 1e6:,.2f}M"
            why = ", ".join(f"{k} {v:,}" for k, v in s.reasons.items())
            rows.append(f"{s.name:<{width}}{docs:>20}{chars:>24}   {why}".rstrip())
        return "\n".join(rows)

    def empty_error(self, what: str) -> DataError:
        last = self.steps[-1]
        why = ", ".join(f"{k} {v:,}" for k, v in last.reasons.items()) or "no reason recorded"
        return DataError(
            f"{what}: step '{last.name}' removed all {last.docs_in:,} documents ({why}); "
            f"loosen it (`filters` none or code) or add data"
        )


# MinHash functions: standard error 0.044 at J = 0.43 (dedup.py's lesson)
NEAR_DUP_NUM_PERM = 128
NEAR_DUP_SHINGLE = 3  # words per shingle, as in the lecture

CLEANING_CHOICES = ("auto", "web", "keep")
FILTER_CHOICES = ("auto", "gopher", "gopher-handout", "code", "none")
LINE_DEDUP_CHOICES = ("documents", "occurrences")


@dataclasses.dataclass
class CleanSettings:
    """Knobs of the cleaning pipeline (all part of the cache key).

    cleaning: "auto" runs the funnel on web-like sources and keeps curated local text whole
    (Source.curated); "web" runs it on every source; "keep" keeps every source whole. A source kept
    whole is only cut into documents of at most chunk_chars characters, and into at least
    20 (so it can be shuffled and split), and PII-masked: no quality filters, no line
    removal, no dedup (a refrain or a repeated speech in a book is the author's choice). line_dedup:
    "documents" removes boilerplate (a line of 3+ words in >= boilerplate_min_documents documents);
    "occurrences" removes every line that occurs more than once in the corpus (CS336's exact line
    dedup).
    """

    cleaning: str = "auto"
    filters: str = "auto"  # auto (by source kind), gopher, gopher-handout, code, none
    min_words: int = 50
    max_words: int = 100_000
    line_dedup: str = "documents"
    boilerplate_min_documents: int = 3
    near_dup_threshold: float = 0.5  # Jaccard of 3-word shingles; 0 disables near-dedup
    strip_accents: bool = False  # near-dedup shingles "café" as "cafe"
    mask_pii: bool = True
    # ~4,000 tokens: several training windows per piece of a long text
    chunk_chars: int = 16_384
    # keep only these languages (classify.py's identifier); () keeps all
    lang: tuple[str, ...] = ()
    # ... and only if its score is at least this (datatrove's default)
    lang_threshold: float = 0.65
    # keep P(high) >= this by the quality classifier; 0 turns it off
    quality_threshold: float = 0.0
    # a classifier file (labels high/low); "" is classify.py's default
    quality_model: str = ""

    # checked on creation, so a bad setting fails before any work
    def __post_init__(self):
        for name, choices in (
            ("cleaning", CLEANING_CHOICES),
            ("filters", FILTER_CHOICES),
            ("line_dedup", LINE_DEDUP_CHOICES),
        ):
            if getattr(self, name) not in choices:
                raise DataError(
                    f"{name} {getattr(self, name)!r} is not one of {', '.join(choices)}"
                )
        if self.boilerplate_min_documents < 2:
            raise DataError(
                f"boilerplate_min_documents must be at least 2 (a line in one document is not "
                f"repeated), got {self.boilerplate_min_documents}"
            )
        if not (self.near_dup_threshold == 0 or 0 < self.near_dup_threshold < 1):
            raise DataError(
                f"near_dup_threshold must be 0 (off) or strictly between 0 and 1, "
                f"got {self.near_dup_threshold}"
            )
        if self.chunk_chars < 1:
            raise DataError(f"chunk_chars must be at least 1, got {self.chunk_chars}")
        for name in ("lang_threshold", "quality_threshold"):
            if not 0 <= getattr(self, name) <= 1:
                raise DataError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        unknown = sorted(set(self.lang) - set(classify.LANGUAGES))
        if unknown:
            raise DataError(
                f"lang {' '.join(unknown)}: unknown; use ISO 639-1 codes among "
                f"{' '.join(classify.LANGUAGES)}"
            )
        # a list from the command line: the same key as a tuple
        self.lang = tuple(self.lang)


def _without(docs: list[str], origin: list[int], dropped: set[int]) -> tuple[list[str], list[int]]:
    keep = [i for i in range(len(docs)) if i not in dropped]
    return [docs[i] for i in keep], [origin[i] for i in keep]


def clean_corpus(
    docs: list[str],
    origin: list[int],
    sources: list[Source],
    whole: list[bool],
    settings: CleanSettings,
    funnel: Funnel,
    log: Callable[[str], None] = lambda s: None,
) -> tuple[list[str], list[int]]:
    """The steps across sources, on what each source's own steps kept (machinery/cleaning.py's
    `clean`): exact dedup, line removal (prose only: a repeated line of code is not boilerplate),
    PII masking, then near-dedup (after masking, pages differing only in a contact address are
    equal). origin: the source index of each document; whole: the sources kept whole (no dedup, no
    line removal).
    """
    if not all(whole):
        docs, origin = _exact_and_line_dedup(docs, origin, sources, whole, settings, funnel)

    if settings.mask_pii:
        before, counts = docs, collections.Counter()
        docs = []
        for d in before:
            masked, c = mask_pii(d)
            docs.append(masked)
            counts.update(c)
        funnel.add("PII masking", before, docs, {k.lower(): v for k, v in counts.items()})
    cleaned = [i for i, o in enumerate(origin) if not whole[o]]
    if settings.near_dup_threshold > 0 and cleaned:
        t0 = time.perf_counter()
        kept = dedup.dedup(
            [docs[i] for i in cleaned],
            threshold=settings.near_dup_threshold,
            num_perm=NEAR_DUP_NUM_PERM,
            n=NEAR_DUP_SHINGLE,
            strip_accents=settings.strip_accents,
        )
        before = docs
        docs, origin = _without(docs, origin, set(cleaned) - {cleaned[k] for k in kept})
        step = f"near dedup (MinHash, J>={settings.near_dup_threshold})"
        funnel.add(step, before, docs, {"near_duplicate": len(before) - len(docs)})
        log(f"  near dedup: {time.perf_counter() - t0:.1f}s")
    if not docs:
        raise funnel.empty_error("the corpus")
    return docs, origin


def _exact_and_line_dedup(
    docs: list[str],
    origin: list[int],
    sources: list[Source],
    whole: list[bool],
    settings: CleanSettings,
    funnel: Funnel,
) -> tuple[list[str], list[int]]:
    """Exact dedup and line removal over the documents of the sources that are cleaned."""
    cleaned = [i for i, o in enumerate(origin) if not whole[o]]
    kept = exact_dedup([docs[i] for i in cleaned])
    before = docs
    docs, origin = _without(docs, origin, set(cleaned) - {cleaned[k] for k in kept})
    funnel.add("exact dedup (hash)", before, docs, {"duplicate": len(before) - len(docs)})

    prose = [i for i, o in enumerate(origin) if sources[o].kind != "code" and not whole[o]]
    if settings.line_dedup == "occurrences":
        step = "line dedup (every line seen more than once)"
        lines, remove = repeated_lines, drop_lines
    else:
        step = f"boilerplate lines (prose, in >={settings.boilerplate_min_documents} docs)"
        lines = functools.partial(
            boilerplate_lines, min_documents=settings.boilerplate_min_documents
        )
        remove = remove_lines
    repeated = lines([docs[i] for i in prose])
    before, lines_removed = list(docs), 0
    for i in prose:
        docs[i], removed = remove(docs[i], repeated)
        lines_removed += removed
    docs, origin = _without(docs, origin, {i for i, d in enumerate(docs) if not d.strip()})
    emptied = len(before) - len(docs)
    reasons = {"lines_removed": lines_removed, "distinct_lines": len(repeated), "emptied": emptied}
    funnel.add(step, before, docs, reasons)
    if not docs:
        raise funnel.empty_error("the corpus")
    return docs, origin


# --------------------------------------------------------------------------------------------------
# 7. Train/val split (after dedup) and mixing
# --------------------------------------------------------------------------------------------------

KEY_RANGE = 1 << 64  # document keys are uniform 64-bit integers


def document_keys(text: str, seed: int) -> tuple[int, int, int]:
    """Three 64-bit keys of a document's final text under a seed: (split, tokenizer sample, mixing).

    Every choice about a document is a function of that document alone, so a stream makes it the
    moment it sees the text, in any order, on any worker, and every engine makes the same one.
    blake2b keyed by the seed: the keys of different seeds are independent.

    >>> keys = document_keys("a document", seed=0)
    >>> keys == document_keys("a document", 0) != document_keys("a document", 1)
    True
    >>> all(0 <= k < 2**64 for k in keys)
    True
    """
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=24, key=str(seed).encode()).digest()
    return tuple(int.from_bytes(digest[i : i + 8], "little") for i in (0, 8, 16))


def val_cut(val_fraction: float) -> int:
    """Split keys below this go to validation: val_fraction of the key range."""
    return min(int(val_fraction * KEY_RANGE), KEY_RANGE - 1)


def split_documents(split_keys: np.ndarray, val_fraction: float) -> np.ndarray:
    """(n,) bool, True = validation. A document is held out when its split key is below
    val_fraction·2^64: a per-document coin, so about val_fraction of them are, whatever the order
    or number of workers. On a tiny corpus the coins may leave a side empty; then the document
    nearest the cut crosses over (the smallest key to val, or the largest to train), so each side
    has one when n >= 2.

    >>> split_documents(np.array([5, 2**62, 2**63, 3 * 2**62], dtype=np.uint64), 0.3).tolist()
    [True, True, False, False]
    >>> split_documents(np.array([2**63, 2**62], dtype=np.uint64), 0.01).tolist()
    [False, True]
    """
    n = len(split_keys)
    if n < 2:
        raise DataError(
            f"{n} document(s) left after cleaning: need at least 2 for a train/val split; add "
            "text or name a held-out file (val_data)"
        )
    keys = np.asarray(split_keys, dtype=np.uint64)
    is_val = (
        keys < np.uint64(val_cut(val_fraction)) if val_fraction > 0 else np.zeros(n, dtype=bool)
    )
    if val_fraction > 0 and not is_val.any():
        is_val[np.argmin(keys)] = True
    if is_val.all():
        is_val[np.argmax(keys)] = False
    return is_val


def tokenizer_sample(texts: list[str], sample_keys: list[int], max_bytes: int) -> str:
    """The text the tokenizer trains on: train documents in the order of their sample key, while
    fewer than max_bytes are taken, joined by <|endoftext|> (which BPE never merges across). A
    seeded random sample that a stream can draw too (data_at_scale.py: a histogram of the keys finds
    the cut, then only documents below it are read).

    >>> tokenizer_sample(["aa", "bbb", "c"], [30, 10, 20], max_bytes=4)
    'bbb<|endoftext|>c'
    """
    picked, size = [], 0
    for i in np.argsort(np.asarray(sample_keys, dtype=np.uint64), kind="stable").tolist():
        if size >= max_bytes:
            break
        picked.append(texts[i])
        size += len(texts[i].encode("utf-8"))
    return EOT.join(picked)


# Bounds on a mix, far beyond any sensible one, so a typo fails in one line instead of writing until
# the disk is full. Weights 1 and 1e16 ask for a source at 1e16 times the share of another: under
# the covering budget (the smallest that reads every source once) the heavy one is repeated ~1e16
# times its size. Past ~16 epochs a repeated token is worth almost nothing (Muennighoff et al.
# 2023), so more than 100 is a mistake, as is a weight under a millionth of another's (that source
# gets under a millionth of the tokens: leave it out).
MAX_WEIGHT_RATIO = 1e6
MAX_EPOCHS = 100


def check_weights(weights: Iterable[float]) -> None:
    """Mixing weights are finite, positive, and the largest is at most MAX_WEIGHT_RATIO times the
    smallest.

    >>> check_weights([1e-300, 1])                # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    data.DataError: weights: the largest weight is 1e+300 times the smallest, more than ...
    """
    weights = list(weights)
    if not weights or not all(math.isfinite(w) and w > 0 for w in weights):
        raise DataError(f"weights: mixing weights must be finite and positive, got {weights}")
    if max(weights) > MAX_WEIGHT_RATIO * min(weights):
        raise DataError(
            f"weights: the largest weight is {max(weights) / min(weights):.3g} times the "
            f"smallest, more than {MAX_WEIGHT_RATIO:,.0f}: no mix needs that (the light source "
            "would get under a millionth of the tokens); drop that source or fix the typo"
        )


def mixture_plan(
    weights: dict[str, float],
    total_tokens: float,
    unique_tokens: dict[str, float] | None = None,
    max_epochs: float = 4.0,
) -> dict[str, dict]:
    """Tokens and epochs per source for a token budget.

    The lecture: 20e9 tokens at web 70 / code 15 / books 10 / math 5 with 0.5e9 unique math tokens:
    >>> mix = {"web": .7, "code": .15, "books": .1, "math": .05}
    >>> plan = mixture_plan(mix, 20e9, {"math": 0.5e9})
    >>> plan["math"]["tokens"], plan["math"]["epochs"], plan["web"]["tokens"]
    (1000000000.0, 2.0, 14000000000.0)

    Weights are normalised to sum to 1. A source repeated more than max_epochs times triggers a
    warning; more than MAX_EPOCHS times, the plan is refused.
    """
    check_weights(weights.values())
    if not (total_tokens > 0 and math.isfinite(total_tokens)):
        raise DataError(f"the token budget must be positive and finite, got {total_tokens:g}")
    if unique_tokens and any(not (u >= 1 and math.isfinite(u)) for u in unique_tokens.values()):
        raise DataError(
            "unique token counts must be positive (at least 1 token) and finite, got "
            f"{unique_tokens}"
        )
    total_weight = sum(weights.values())
    unique_tokens = unique_tokens or {}
    plan = {}
    for name, w in weights.items():
        tokens = total_tokens * w / total_weight
        unique = unique_tokens.get(name)
        epochs = tokens / unique if unique else None
        if epochs is not None and epochs > MAX_EPOCHS:
            raise DataError(
                f"source {name} would be read {epochs:.3g} times, more than {MAX_EPOCHS} epochs "
                "(past ~16 a repeat adds almost nothing): lower its weight (weights) or the token "
                "budget, or give it more unique data"
            )
        if epochs is not None and epochs > max_epochs:
            warnings.warn(
                f"source {name} would be read {epochs:.1f} times (> {max_epochs:g} epochs): expect "
                f"memorisation and diminishing returns; lower its weight or the token budget",
                stacklevel=2,
            )
        plan[name] = {
            "weight": w / total_weight,
            "tokens": tokens,
            "unique_tokens": unique,
            "epochs": epochs,
        }
    return plan


def covering_budget(weights: dict[str, float], unique_tokens: dict[str, float]) -> float:
    """The smallest budget that reads every source at least once (no token thrown away; the scarce
    sources are repeated instead): max over sources of unique / weight.

    >>> covering_budget({"a": 0.5, "b": 0.5}, {"a": 100, "b": 300})
    600.0
    """
    total_weight = sum(weights.values())
    return max(unique_tokens[k] / (w / total_weight) for k, w in weights.items())


MIX_BUCKETS = 1 << 16  # a document's mix bucket: the top 16 bits of its mixing key


def mix_bucket(mix_keys: np.ndarray) -> np.ndarray:
    return (np.asarray(mix_keys, dtype=np.uint64) >> np.uint64(64 - 16)).astype(np.int64)


def partial_epoch(
    target_tokens: float, unique_tokens: int, bucket_tokens: np.ndarray
) -> tuple[int, int]:
    """How one source fills its share: (full passes, cut). Every document is read `full` times, and
    once more when its mix bucket is below `cut`, the smallest cut whose buckets hold the remaining
    tokens. bucket_tokens (65,536,) is the source's tokens per mix bucket: the decision needs this
    histogram, not every document's length.

    A 45-token target over 30 unique tokens (10 in bucket 0, 20 in bucket 5): one pass, then buckets
    0..5 (30 >= 15).
    >>> partial_epoch(45, 30, np.bincount([0, 5], weights=[10, 20], minlength=MIX_BUCKETS))
    (1, 6)
    """
    full, remainder = divmod(target_tokens, unique_tokens)
    if remainder <= 0:
        return int(full), 0
    return int(full), int(np.searchsorted(np.cumsum(bucket_tokens), remainder)) + 1


def plan_mixture(
    names: list[str],
    weights: list[float] | None,
    total_tokens: float | None,
    unique: dict[str, int],
    bucket_tokens: list[np.ndarray],
) -> tuple[dict | None, list[tuple[int, int]]]:
    """(the mixture plan, (full passes, cut) per source). Without weights every document once; with
    weights each source fills its share of total_tokens (default: the covering budget) by whole
    passes plus a partial pass over the documents of its lowest mix buckets (a seeded random subset,
    `partial_epoch`).

    Two sources at 50/50 over 40 tokens, web with 20 unique tokens and math with 5: math is read 4
    times.
    >>> plan_mixture(["web", "math"], [0.5, 0.5], 40, {"web": 20, "math": 5}, [None, None])[1]
    [(1, 0), (4, 0)]
    """
    if weights is None:
        return None, [(1, 0)] * len(names)
    empty = [name for name in names if unique[name] == 0]
    if empty:
        raise DataError(
            f"source(s) {empty} have no train documents left to mix; drop them or add data"
        )
    weight_of = dict(zip(names, weights))
    mixture = mixture_plan(weight_of, total_tokens or covering_budget(weight_of, unique), unique)
    return mixture, [
        partial_epoch(mixture[name]["tokens"], unique[name], bucket_tokens[i])
        for i, name in enumerate(names)
    ]


def document_reads(full: int, cut: int, buckets: np.ndarray) -> np.ndarray:
    """How many times each document of a source is packed: full, plus one when its mix bucket is
    below cut."""
    return full + (np.asarray(buckets) < cut).astype(np.int64)


# --------------------------------------------------------------------------------------------------
# 8. Token shards: a 32-byte header (magic, version, dtype, count) and raw little-endian token ids
#
#    offset 0 8 bytes magic b"LLMTOKS\0" (a file that is not a shard is refused) offset 8 uint32
#    format version (1) offset 12 uint32 bytes per token: 2 (uint16) or 4 (uint32) offset 16 uint64
#    token count N (must equal (file size - 32) / bytes per token) offset 24 8 bytes zero padding,
#    so the ids start 32-byte aligned offset 32 N ids <|endoftext|> doc <|endoftext|> doc ...
#    (memory-mapped by the loader)
# --------------------------------------------------------------------------------------------------

SHARD_MAGIC = b"LLMTOKS\x00"
SHARD_VERSION = 1
# magic, version, bytes per token (2 or 4), token count, padding
SHARD_HEADER = struct.Struct("<8sIIQ8x")
SHARD_DTYPES = {2: np.dtype("<u2"), 4: np.dtype("<u4")}


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    """uint16 holds ids below 65,536 (GPT-2's 50,257 fits); bigger vocabularies (cl100k) need
    uint32."""
    if vocab_size <= 2**16:
        return SHARD_DTYPES[2]
    if vocab_size <= 2**32:
        return SHARD_DTYPES[4]
    raise DataError(f"vocabulary of {vocab_size:,} does not fit uint32 token ids")


def read_shard(path: pathlib.Path) -> np.ndarray:
    """Memory-map a shard's tokens (read-only), after checking its header against the file size."""
    path = pathlib.Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(SHARD_HEADER.size)
    except OSError as e:
        raise DataError(f"cannot read shard {path}: {e.strerror}") from None
    if len(head) < SHARD_HEADER.size:
        raise DataError(
            f"{path}: damaged shard (shorter than its {SHARD_HEADER.size}-byte header); re-run "
            "prepare"
        )
    magic, version, itemsize, count = SHARD_HEADER.unpack(head)
    if magic != SHARD_MAGIC:
        raise DataError(f"{path}: not a token shard (bad magic {magic!r}); re-run prepare")
    if version != SHARD_VERSION:
        raise DataError(
            f"{path}: shard format version {version}, this data.py reads {SHARD_VERSION}; re-run "
            "prepare"
        )
    if itemsize not in SHARD_DTYPES:
        raise DataError(f"{path}: damaged shard header (token size {itemsize}); re-run prepare")
    if SHARD_HEADER.size + count * itemsize != size:
        raise DataError(
            f"{path}: damaged shard (header says {count:,} tokens, file holds "
            f"{(size - SHARD_HEADER.size) / itemsize:,.1f}); re-run prepare"
        )
    if count == 0:
        return np.zeros(0, dtype=SHARD_DTYPES[itemsize])
    return np.memmap(
        path, dtype=SHARD_DTYPES[itemsize], mode="r", offset=SHARD_HEADER.size, shape=(count,)
    )


class ShardWriter:
    """Streams token ids into shards of at most shard_tokens tokens (documents may straddle two).
    Each shard is written straight into a temporary file, its header completed and the file renamed
    when it is full, so memory holds one add() at a time, never a shard (100M tokens would be 200
    MB)."""

    def __init__(
        self, directory: pathlib.Path, prefix: str, dtype: np.dtype, shard_tokens: int
    ) -> None:
        self.directory = pathlib.Path(directory)
        self.prefix = prefix
        self.shard_tokens = shard_tokens
        self.dtype = np.dtype(dtype).newbyteorder("<")
        self.file, self.tmp, self.count = None, None, 0
        self.shards: list[dict] = []

    def add(self, tokens: np.ndarray) -> None:
        tokens = np.asarray(tokens).astype(self.dtype, copy=False)
        while len(tokens):
            if self.file is None:
                fd, self.tmp = tempfile.mkstemp(
                    dir=self.directory, prefix=f".{self.prefix}.", suffix=".tmp"
                )
                self.file, self.count = os.fdopen(fd, "wb"), 0
                self.file.write(bytes(SHARD_HEADER.size))  # completed in _finish
            room = self.shard_tokens - self.count
            self.file.write(tokens[:room].tobytes())
            self.count += min(room, len(tokens))
            tokens = tokens[room:]
            if self.count == self.shard_tokens:
                self._finish()

    def _finish(self) -> None:
        name = f"{self.prefix}_{len(self.shards):05d}.bin"
        self.file.seek(0)
        self.file.write(
            SHARD_HEADER.pack(SHARD_MAGIC, SHARD_VERSION, self.dtype.itemsize, self.count)
        )
        self.file.close()
        os.replace(self.tmp, self.directory / name)
        self.shards.append({"file": name, "tokens": int(self.count)})
        self.file = None

    def close(self) -> list[dict]:
        if self.file is not None:
            self._finish()
        return self.shards


def encode_documents(
    tokenizer: bpe.Tokenizer, docs: list[str], threads: int | None = None
) -> list[np.ndarray]:
    """Token ids of each document through the tokenizer's tiktoken twin, whose Rust core releases
    the GIL: one run of documents per thread (a task per document costs more than encoding a short
    one), each document's ids an array at once (a list of Python ints takes ~9x the memory)."""
    encoding = tokenizer.to_tiktoken()
    if threads is not None and threads < 1:
        raise DataError(f"threads must be at least 1, got {threads}; leave it out to use all cores")
    threads = threads or os.cpu_count() or 1
    dtype = dtype_for_vocab(len(tokenizer))

    def encode_run(run: list[str]) -> list[np.ndarray]:
        return [np.asarray(encoding.encode_ordinary(doc), dtype=dtype) for doc in run]

    size = max(1, -(-len(docs) // threads))
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        runs = pool.map(encode_run, [docs[i : i + size] for i in range(0, len(docs), size)])
        return [ids for run in runs for ids in run]


def pack_split(
    writer: ShardWriter,
    eot_id: int,
    documents: list[np.ndarray],
    reads: list[int],
    sizes: list[int],
) -> dict:
    """A split's shards, through the writer: <|endoftext|>, then a document's ids, for each
    document in order. A document the mix reads r times is packed r times: pass e packs those read
    more than e times. Returns the manifest's entry for the split (sizes: UTF-8 bytes of each)."""
    eot = np.array([eot_id], writer.dtype)
    packed, n_bytes = 0, 0
    for epoch in range(max(reads, default=0)):
        for ids, read, size in zip(documents, reads, sizes):
            if read > epoch:
                writer.add(eot)
                writer.add(ids)
                packed, n_bytes = packed + 1, n_bytes + size
    shards = writer.close()
    tokens = sum(s["tokens"] for s in shards)
    return {
        "documents": packed,
        "unique_documents": len(documents),
        "tokens": tokens,
        "bytes": n_bytes,
        "shards": shards,
    }


# --------------------------------------------------------------------------------------------------
# 9. The loader: a prepared dataset's manifest, memory-mapped shards, random windows, and a
#     resumable, rank-sharded sequential iterator. (prepare itself, the checked recipe, its cache
#     key and the directory published whole, is machinery/dataset.py, above this file.)
# --------------------------------------------------------------------------------------------------


def read_json(path: pathlib.Path, fix: str):
    """A JSON file prepare wrote; a missing or damaged one is one DataError line ending in `fix`."""
    try:
        return json.loads(path.read_bytes())
    except OSError as e:
        raise DataError(f"{path}: cannot read it ({e.strerror or e}); {fix}") from None
    # json's parser recurses once per bracket: a deeper file reaches Python's recursion limit
    except RecursionError:
        depth = sys.getrecursionlimit()
        raise DataError(f"{path}: JSON nested more than {depth:,} levels deep; {fix}") from None
    # not UTF-8, or not JSON
    except ValueError as e:
        raise DataError(f"{path}: not valid JSON ({e}); {fix}") from None


def load_manifest(data_dir: str | os.PathLike) -> dict:
    """A prepared dataset's manifest.json (in a local directory)."""
    path = pathlib.Path(data_dir) / "manifest.json"
    if not path.is_file():
        raise DataError(
            f"{data_dir} has no readable manifest.json: run `python data.py prepare` first"
        )
    manifest = read_json(path, "re-run `python data.py prepare`")
    if not isinstance(manifest, dict):
        raise DataError(
            f"{path}: damaged manifest ({type(manifest).__name__}, not an object); re-run "
            "`python data.py prepare`"
        )
    return manifest


def _check_batch_shape(batch_size: int, block_size: int) -> None:
    if not all(isinstance(n, (int, np.integer)) and n > 0 for n in (batch_size, block_size)):
        raise DataError(
            f"batch_size and block_size must be positive integers, got {batch_size!r}, "
            f"{block_size!r}"
        )


class TokenData:
    """A prepared dataset directory.

    >>> data = TokenData(dataset.prepare(["pydocs"]))                  # doctest: +SKIP
    >>> x, y = data.get_batch("train", batch_size=4, block_size=64)   # doctest: +SKIP
    >>> x.shape, bool((x[:, 1:] == y[:, :-1]).all())                  # doctest: +SKIP
    (torch.Size([4, 64]), True)
    """

    def __init__(self, data_dir: str | os.PathLike) -> None:
        # shards are memory-mapped: they must be on a local file system, not behind s3://
        if "://" in str(data_dir):
            raise DataError(
                f"{data_dir}: the loader reads a local dataset; copy it down first: python data.py "
                f"download {data_dir} DIR"
            )
        self.data_dir = pathlib.Path(data_dir)
        self.manifest = load_manifest(self.data_dir)
        self._tokenizer = None
        self.shards: dict[str, list[np.ndarray]] = {}
        try:
            self.vocab_size: int = self.manifest["tokenizer"]["vocab_size"]
            self.eot_id: int | None = self.manifest["tokenizer"]["eot_id"]
            for split, info in self.manifest["splits"].items():
                arrays = [read_shard(self.data_dir / s["file"]) for s in info["shards"]]
                for a, s in zip(arrays, info["shards"]):
                    if len(a) != s["tokens"]:
                        raise DataError(
                            f"{self.data_dir / s['file']}: {len(a):,} tokens, manifest says "
                            f"{s['tokens']:,}; re-run prepare"
                        )
                self.shards[split] = arrays
        except (KeyError, TypeError) as e:
            raise DataError(
                f"{self.data_dir / 'manifest.json'}: damaged manifest (missing {e}); re-run prepare"
            ) from None

    @property
    def tokenizer(self) -> bpe.Tokenizer:
        if self._tokenizer is None:
            path = self.data_dir / self.manifest["tokenizer"]["file"]
            document = read_json(path, "the dataset's tokenizer: re-run prepare")
            self._tokenizer = bpe.Tokenizer.from_document(document, str(path))
        return self._tokenizer

    def _split(self, split: str) -> list[np.ndarray]:
        if split not in self.shards:
            raise DataError(f"no split {split!r} in {self.data_dir} (has {', '.join(self.shards)})")
        return self.shards[split]

    def get_batch(
        self, split: str, batch_size: int, block_size: int, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Random windows: x (B, T) and y (B, T) = x shifted by one token, int64 on CPU. A window
        never straddles two shards; every start position in the split is equally likely."""
        _check_batch_shape(batch_size, block_size)
        shards = self._split(split)
        # valid start positions per shard
        starts = np.array([max(0, len(a) - block_size) for a in shards])
        total = int(starts.sum())
        if total == 0:
            raise DataError(
                f"split {split!r} has no shard with more than block_size={block_size} tokens; "
                f"use a smaller block_size or more data"
            )
        picks = torch.randint(total, (batch_size,), generator=generator).numpy()
        bounds = np.cumsum(starts)
        shard_of = np.searchsorted(bounds, picks, side="right")
        offsets = picks - (bounds - starts)[shard_of]
        windows = np.stack(
            [shards[s][o : o + block_size + 1] for s, o in zip(shard_of, offsets)]
        ).astype(np.int64)
        xy = torch.from_numpy(windows)  # (B, T+1)
        return xy[:, :-1], xy[:, 1:]

    def iterator(
        self,
        split: str,
        batch_size: int,
        block_size: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        pin_memory: bool = False,
    ) -> "BatchIterator":
        return BatchIterator(
            self._split(split),
            batch_size,
            block_size,
            rank,
            world_size,
            seed,
            shuffle,
            split,
            pin_memory,
        )


class BatchIterator:
    """Sequential, resumable, rank-sharded batches.

    The split is cut into non-overlapping windows of T+1 tokens (stride T, so every token is a
    target once per epoch). Each epoch walks a permutation of the windows seeded by (seed, epoch)
    (or file order when not shuffle). A step consumes batch_size x world_size windows; rank r takes
    the r-th slice of batch_size. The state is the epoch and the number of windows consumed in it:
    save it with state_dict(), restore it with load_state_dict(), and the next batch is the one that
    would have come (also after changing world_size). pin_memory=True (for a CUDA run) returns x and
    y in page-locked memory, each contiguous: only such a tensor goes to the GPU asynchronously
    under .to(device, non_blocking=True); from ordinary (pageable) memory the copy waits, and a
    strided view would be copied to a pageable contiguous buffer first.
    """

    def __init__(
        self,
        shards: list[np.ndarray],
        batch_size: int,
        block_size: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        split: str = "train",
        pin_memory: bool = False,
    ) -> None:
        _check_batch_shape(batch_size, block_size)
        self.pin_memory = pin_memory
        if not 0 <= rank < world_size:
            raise DataError(f"rank {rank} outside world size {world_size}")
        self.shards, self.batch_size, self.block_size = shards, batch_size, block_size
        self.rank, self.world_size, self.seed, self.shuffle = rank, world_size, seed, shuffle
        self.windows_per_shard = np.array([max(0, (len(a) - 1) // block_size) for a in shards])
        self.first_window = np.concatenate([[0], np.cumsum(self.windows_per_shard)])
        self.num_windows = int(self.first_window[-1])
        if self.num_windows < batch_size * world_size:
            raise DataError(
                f"split {split!r} has {self.num_windows:,} windows of {block_size + 1} tokens, "
                f"fewer than batch_size x world_size = {batch_size * world_size}; use smaller "
                "batches or blocks, or more data"
            )
        self.epoch, self.position = 0, 0
        self._order_epoch, self._order = None, None

    def _epoch_order(self) -> np.ndarray:
        if self._order_epoch != self.epoch:
            self._order = (
                np.random.default_rng([self.seed, self.epoch]).permutation(self.num_windows)
                if self.shuffle
                else np.arange(self.num_windows)
            )
            self._order_epoch = self.epoch
        return self._order

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        step = self.batch_size * self.world_size
        # drop the ragged tail so every rank stays in step
        if self.position + step > self.num_windows:
            self.epoch, self.position = self.epoch + 1, 0
        start = self.position + self.rank * self.batch_size
        windows = self._epoch_order()[start : start + self.batch_size]
        self.position += step
        shard_of = np.searchsorted(self.first_window, windows, side="right") - 1
        offsets = (windows - self.first_window[shard_of]) * self.block_size
        xy = torch.from_numpy(
            np.stack(
                [
                    self.shards[s][o : o + self.block_size + 1]
                    # (B, T+1)
                    for s, o in zip(shard_of, offsets)
                ]
            ).astype(np.int64)
        )
        if self.pin_memory:
            return xy[:, :-1].contiguous().pin_memory(), xy[:, 1:].contiguous().pin_memory()
        return xy[:, :-1], xy[:, 1:]

    __next__ = next

    def __iter__(self) -> "BatchIterator":
        return self

    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "block_size": self.block_size,
            "num_windows": self.num_windows,
            "shuffle": int(self.shuffle),
        }

    def load_state_dict(self, state: dict) -> None:
        for k in ("seed", "block_size", "num_windows", "shuffle"):
            if state[k] != int(getattr(self, k)):
                raise DataError(
                    f"loader state was saved with {k}={state[k]}, this iterator has "
                    f"{getattr(self, k)}: resume with the same data, block_size and seed"
                )
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


def bytes_per_token(data: str | os.PathLike | TokenData, split: str = "val") -> float:
    """UTF-8 bytes of text per token in a split (tokens include one <|endoftext|> per document), so
    that bits-per-byte = loss_nats / ln 2 / bytes_per_token."""
    manifest = data.manifest if isinstance(data, TokenData) else load_manifest(data)
    s = manifest["splits"].get(split)
    if not s or not s["tokens"]:
        raise DataError(f"the {split!r} split is empty: prepare the data with val_fraction > 0")
    return s["bytes"] / s["tokens"]


if __name__ == "__main__":
    from machinery.commands import data as command

    raise SystemExit(command.main())
