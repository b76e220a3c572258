"""Near-duplicate detection: shingles, Jaccard, MinHash and LSH banding, written out by hand.

Why. A model that sees the same article many times learns to recite it, the compute spent on the copies is
wasted, and benchmark questions that float around the web leak into training. An exact hash of each document
finds copies that are byte-for-byte equal; it misses the reposted article with a few words changed, because
changing one word changes the whole hash. For that we compare *content overlap*.

1. Shingles and Jaccard. Cut a document into overlapping runs of n words ("shingles", n = 3 here as in the
   lecture, 5 in FineWeb) and compare the sets:

       A = "the cat sat on the mat today" -> {the cat sat, cat sat on, sat on the, on the mat, the mat today}
       B = "the cat sat on the rug today" -> {the cat sat, cat sat on, sat on the, on the rug, the rug today}
       Jaccard(A, B) = |A ∩ B| / |A ∪ B| = 3 / 7 ≈ 0.43

   One changed word breaks every shingle that covers it (up to n of them), so shingles are sensitive:
   "a b c d e f" vs "a b c x e f" share only "a b c": 1 / 7 ≈ 0.14.

2. MinHash: a short signature whose agreement rate estimates Jaccard. Pick k random hash functions; for each
   one keep only the smallest hash over the document's shingles. Why P(min_A == min_B) = Jaccard(A, B): order
   all shingles of A ∪ B by one random hash. The smallest of them is equally likely to be any element of the
   union. min_A == min_B exactly when that element lies in A ∩ B (if it were only in A, B's minimum would be a
   different, larger shingle). So the probability is |A ∩ B| / |A ∪ B|. With k = 128 functions, a pair whose
   signatures agree in 55 places gets the estimate 55 / 128 ≈ 0.43, and comparing two documents costs 128
   number comparisons whatever their length. Each position is a coin flip with success probability J, so the
   estimate's standard error is √(J(1 − J) / k): 0.044 at J = 0.43, k = 128 (4x the functions halve it).

   The k functions are h_i(x) = (a_i·x + b_i) mod p: x is the shingle's 32-bit hash, p a prime above 2^32, a_i
   and b_i random (seeded). See `universal_hash` for how the product stays exact in 64-bit integers.

3. LSH banding: compare only pairs that are likely similar. 600 documents already make 179,700 pairs, a million
   make 5·10^11. Cut each signature into b bands of r rows (32 x 4 = 128). Two documents become a *candidate*
   if they agree on every row of at least one band. A band matches with probability J^r, so

       P(candidate | J) = 1 − (1 − J^r)^b       an S-curve whose steepest point is near (1/b)^(1/r)

   32 x 4: threshold ≈ 0.42, P(J = 0.5) ≈ 0.87, P(J = 0.2) ≈ 0.05.   16 x 8: threshold ≈ 0.71, P(J = 0.5) ≈ 0.06.
   Candidates are then *verified* (signature estimate, or exact Jaccard when the texts are at hand) against the
   threshold, and union-find joins the verified pairs into clusters; `dedup` keeps the first of each cluster.

Run it:
    python dedup.py demo                                  # the lecture's worked numbers
    python dedup.py experiment --data ../shared/data/wikitext-2-raw/wiki.valid.raw
    python dedup.py run --input corpus.jsonl --out deduped.jsonl

Depends on numpy and the standard library only (no sibling files).
"""
from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import math
import os
import pathlib
import random
import re
import sys
import tempfile
import time
import unicodedata

import numpy as np


class DedupError(ValueError):
    """A bad input to this module: the message names the problem and the fix (the CLI prints it, exit code 2)."""


# ----------------------------------------------------------------------------------------------------------
# 1. Shingles and exact Jaccard
# ----------------------------------------------------------------------------------------------------------

_PUNCTUATION = re.compile(r"[^\w\s]+")


def normalized_words(text: str) -> list[str]:
    """The words a shingle is made of: Unicode NFKC, case-folded, punctuation turned into spaces, split on runs
    of whitespace. So case, punctuation and spacing differences do not count as edits.

    >>> normalized_words("The  cat, sat.\\nON the-mat!")
    ['the', 'cat', 'sat', 'on', 'the', 'mat']
    """
    if not isinstance(text, str):
        raise DedupError(f"documents must be str, got {type(text).__name__}: convert or drop it before dedup")
    return _PUNCTUATION.sub(" ", unicodedata.normalize("NFKC", text).casefold()).split()


def _check_n(n) -> None:
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
        raise DedupError(f"shingle size n must be an integer >= 1, got {n!r}: use n=3 (lecture) or n=5 (FineWeb)")


def shingles(text: str, n: int = 3) -> set[str]:
    """The set of n-word shingles of `text` (words joined by one space). A document with fewer than n words is a
    single shingle: all of its words (the empty string for an empty document), so it can still be compared.

    >>> sorted(shingles("a b c d"))
    ['a b c', 'b c d']
    >>> shingles("hello world")
    {'hello world'}
    """
    _check_n(n)
    words = normalized_words(text)
    if len(words) < n:
        return {" ".join(words)}
    return {" ".join(words[i:i + n]) for i in range(len(words) - n + 1)}


def jaccard(a: set, b: set) -> float:
    """Exact Jaccard similarity |a ∩ b| / |a ∪ b| of two sets (two empty sets are identical: 1.0).

    >>> jaccard(shingles("the cat sat on the mat today"), shingles("the cat sat on the rug today"))
    0.42857142857142855
    """
    union = len(a | b)
    return len(a & b) / union if union else 1.0


# ----------------------------------------------------------------------------------------------------------
# 2. A stable 32-bit hash per shingle
# ----------------------------------------------------------------------------------------------------------
# Python's built-in hash() of a str is salted per process (PYTHONHASHSEED), so signatures would change between
# runs. We want the same 32-bit number for the same shingle on every run and machine, and we want it fast:
# hashing every shingle string with hashlib costs ~0.5 µs of Python per shingle. So we hash each *distinct word*
# once with BLAKE2b (hashlib, stable everywhere), and combine the n word hashes of a shingle with integer mixing
# that numpy runs over millions of shingles at once: h <- fmix64(h XOR word), MurmurHash3's 64-bit finalizer,
# a bijection whose every output bit depends on every input bit. The shingle's x is the top 32 bits.
# Here uint64 wrap-around is what we want (it is the mixing); the *modular* MinHash arithmetic below must not wrap.

_MASK64 = (1 << 64) - 1
_SHINGLE_SEED = 0x9E3779B97F4A7C15              # any fixed odd constant: the hash of "zero words so far"
_FMIX_MUL1, _FMIX_MUL2 = 0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53   # MurmurHash3 fmix64 constants


def word_hash(word: str) -> int:
    """Stable 64-bit hash of one normalised word (BLAKE2b, 8-byte digest, little-endian).

    >>> word_hash("cat") == word_hash("cat") != word_hash("dog")
    True
    """
    return int.from_bytes(hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest(), "little")


def _fmix64_int(h: int) -> int:
    """MurmurHash3's fmix64 on a Python int (the reference for `_fmix64_array`)."""
    h ^= h >> 33
    h = (h * _FMIX_MUL1) & _MASK64
    h ^= h >> 33
    h = (h * _FMIX_MUL2) & _MASK64
    return h ^ (h >> 33)


def _fmix64_array(h: np.ndarray) -> np.ndarray:
    """fmix64 on a uint64 array; products wrap modulo 2^64 on purpose (that is the mixing). Shape preserved."""
    h = h ^ (h >> np.uint64(33))
    h *= np.uint64(_FMIX_MUL1)
    h ^= h >> np.uint64(33)
    h *= np.uint64(_FMIX_MUL2)
    return h ^ (h >> np.uint64(33))


def shingle_hash(shingle: str) -> int:
    """The 32-bit hash x of one shingle string (words separated by single spaces, as `shingles` makes them).

    >>> 0 <= shingle_hash("the cat sat") < 2**32
    True
    """
    h = _SHINGLE_SEED
    for word in shingle.split(" "):
        h = _fmix64_int(h ^ word_hash(word))
    return h >> 32


class _Vocabulary(dict):
    """word -> consecutive id, assigning the next id on first sight (lets `map` run at C speed)."""

    def __missing__(self, word):
        self[word] = index = len(self)
        return index


def shingle_hashes(texts: list[str], n: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """All shingle hashes of all texts at once: (x, offsets), where x[offsets[d]:offsets[d+1]] are document d's
    32-bit shingle hashes (uint64 array, one per shingle position, repeats allowed: a min ignores them).
    Equal to hashing every string of `shingles(text, n)` with `shingle_hash`, without building those strings.

    >>> x, offsets = shingle_hashes(["a b c d", "hi"], n=3)
    >>> offsets.tolist(), int(x[2]) == shingle_hash("hi")
    ([0, 2, 3], True)
    """
    _check_n(n)
    vocabulary = _Vocabulary()
    word_ids: list[int] = []
    lengths = np.empty(len(texts), dtype=np.int64)
    for d, text in enumerate(texts):
        words = normalized_words(text) or [""]      # an empty document is the one shingle "" (one empty word)
        word_ids.extend(map(vocabulary.__getitem__, words))
        lengths[d] = len(words)
    table = np.fromiter((word_hash(w) for w in vocabulary), dtype=np.uint64, count=len(vocabulary))
    words64 = table[np.asarray(word_ids, dtype=np.int64)]                   # (total words,)
    word_starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))           # (docs,) first word of each doc
    per_doc = np.where(lengths >= n, lengths - n + 1, 1)                   # shingles per document
    offsets = np.concatenate(([0], np.cumsum(per_doc))).astype(np.int64)   # (docs + 1,)
    # First word of every shingle: doc start + 0, 1, ..., per_doc - 1 (a flat arange, restarted per doc).
    first_word = np.repeat(word_starts - offsets[:-1], per_doc) + np.arange(offsets[-1])
    width = np.repeat(np.minimum(lengths, n), per_doc)                     # words in each shingle (< n if short)
    h = np.full(offsets[-1], _SHINGLE_SEED, dtype=np.uint64)
    for j in range(n):                                                     # fold word j of every shingle into h
        live = width > j
        if live.all():
            h = _fmix64_array(h ^ words64[first_word + j])
        else:
            h[live] = _fmix64_array(h[live] ^ words64[first_word[live] + j])
    return h >> np.uint64(32), offsets


# ----------------------------------------------------------------------------------------------------------
# 3. MinHash with exact modular arithmetic
# ----------------------------------------------------------------------------------------------------------

PRIME = (1 << 32) + 15          # 4,294,967,311: the smallest prime above 2^32 (tests check it with Miller-Rabin)
_HASH_RANGE = 1 << 32           # x, a and b all lie in [0, 2^32)


def universal_hash(x: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """h_i(x) = (a_i·x + b_i) mod p for every x and every function i, exactly: shape (len(x), len(a)), uint64.

    Why this never overflows. x, a and b are all below 2^32, so
        a·x + b <= (2^32 − 1)·(2^32 − 1) + (2^32 − 1) = 2^64 − 2^32 < 2^64,
    which a uint64 holds exactly; then one `%` by p gives the true residue. (a ranges over [1, 2^32) instead of
    [1, p): 15 of 4.3 billion values are left out, which changes nothing measurable.)
    The classic bug, in peers too: p = 2^61 − 1 with a up to 2^61 and x up to 2^32 makes a·x as large as 2^93;
    numpy wraps it silently modulo 2^64, so the code computes some other function, not (a·x + b) mod p.
    And the tempting fix "keep a < 2^29 so a·x < 2^61" is worse than it looks: with no wrap-around, a·x + b mod p
    orders the x's by x itself (rotated once where a·x + b crosses p), so all k functions pick nearly the same
    minimum and the k estimates stop being independent.

    >>> universal_hash(np.array([2**32 - 1], dtype=np.uint64), np.array([2**32 - 1], dtype=np.uint64),
    ...                np.array([2**32 - 1], dtype=np.uint64)).tolist() == [[((2**32 - 1)**2 + 2**32 - 1) % PRIME]]
    True
    """
    x = np.asarray(x, dtype=np.uint64)
    a = np.asarray(a, dtype=np.uint64)
    b = np.asarray(b, dtype=np.uint64)
    for name, values in (("x", x), ("a", a), ("b", b)):
        if values.size and int(values.max()) >= _HASH_RANGE:
            raise DedupError(f"{name} must be below 2^32 for exact arithmetic, got {int(values.max())}")
    return (x[:, None] * a[None, :] + b[None, :]) % np.uint64(PRIME)


def _check_num_perm(num_perm) -> None:
    if not isinstance(num_perm, (int, np.integer)) or isinstance(num_perm, bool) or num_perm < 1:
        raise DedupError(f"num_perm must be a positive integer, got {num_perm!r}: use e.g. num_perm=128")


class MinHasher:
    """k seeded hash functions h_i(x) = (a_i·x + b_i) mod p and the signatures they give.

    >>> hasher = MinHasher(num_perm=128, seed=0)
    >>> sig = hasher.signatures([shingles("the cat sat on the mat today"), shingles("the cat sat on the rug today")])
    >>> sig.shape, sig.dtype
    ((2, 128), dtype('uint64'))
    """

    # Shingles hashed per step: the (num_perm, chunk) uint64 block (1 MiB at k = 128) stays in cache.
    chunk = 1024

    def __init__(self, num_perm: int = 128, seed: int = 0):
        _check_num_perm(num_perm)
        self.num_perm = int(num_perm)
        self.seed = seed
        rng = np.random.default_rng(seed)
        self.a = rng.integers(1, _HASH_RANGE, size=self.num_perm, dtype=np.uint64)   # (k,) never 0
        self.b = rng.integers(0, _HASH_RANGE, size=self.num_perm, dtype=np.uint64)   # (k,)

    def signature_reference(self, shingle_set: set[str]) -> list[int]:
        """The lesson version, in plain Python integers: for each function, the minimum over the shingles.
        Slow (k x |set| Python operations); the tests use it as the oracle for `signatures`."""
        xs = [shingle_hash(s) for s in shingle_set]
        return [min((int(a) * x + int(b)) % PRIME for x in xs) for a, b in zip(self.a, self.b)]

    def signatures(self, shingle_sets: list[set[str]]) -> np.ndarray:
        """Signatures of many shingle sets: (docs, num_perm) uint64, row d = signature of shingle_sets[d]."""
        if len(shingle_sets) == 0:
            raise DedupError("no documents: pass a non-empty list of shingle sets")
        counts = np.empty(len(shingle_sets), dtype=np.int64)
        xs = []
        for d, shingle_set in enumerate(shingle_sets):
            if not shingle_set:
                raise DedupError(f"document {d} has no shingles: use shingles(text), which never returns an empty set")
            counts[d] = len(shingle_set)
            xs.extend(map(shingle_hash, shingle_set))
        offsets = np.concatenate(([0], np.cumsum(counts)))
        return self.signatures_from_hashes(np.asarray(xs, dtype=np.uint64), offsets)

    def signatures_from_texts(self, texts: list[str], n: int = 3) -> np.ndarray:
        """Signatures straight from texts (the fast path): equal to `signatures([shingles(t, n) for t in texts])`."""
        _check_documents(texts)
        return self.signatures_from_hashes(*shingle_hashes(texts, n))

    def signatures_from_hashes(self, x: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """Per-document minima of every h_i over x[offsets[d]:offsets[d+1]] (each range non-empty): (docs, k).

        We walk over the shingles in fixed windows so memory stays flat however long a document is. In a window,
        the (k, window) block of hash values is reduced per document with `np.minimum.reduceat`; a document cut
        by a window edge gets its minimum from both windows.
        """
        x = np.asarray(x, dtype=np.uint64)
        offsets = np.asarray(offsets, dtype=np.int64)
        num_docs = len(offsets) - 1
        if x.size and int(x.max()) >= _HASH_RANGE:
            raise DedupError("shingle hashes must be 32-bit: use shingle_hash / shingle_hashes")
        out = np.full((num_docs, self.num_perm), np.iinfo(np.uint64).max, dtype=np.uint64)
        a = self.a[:, None]                                   # (k, 1)
        b = self.b[:, None]                                   # (k, 1)
        prime = np.uint64(PRIME)
        block = np.empty((self.num_perm, self.chunk), dtype=np.uint64)
        for start in range(0, len(x), self.chunk):
            stop = min(start + self.chunk, len(x))
            values = block[:, :stop - start]                  # (k, window)
            np.multiply(a, x[start:stop], out=values)         # a·x < 2^64: exact (see universal_hash)
            np.add(values, b, out=values)                     # + b stays < 2^64
            np.remainder(values, prime, out=values)           # exact residue in [0, p)
            first = np.searchsorted(offsets, start, side="right") - 1     # document holding shingle `start`
            last = np.searchsorted(offsets, stop - 1, side="right") - 1  # document holding shingle `stop - 1`
            docs = np.arange(first, last + 1)
            seg_starts = np.maximum(offsets[docs], start) - start        # where each document's run begins
            minima = np.minimum.reduceat(values, seg_starts, axis=1)     # (k, docs in window)
            out[docs] = np.minimum(out[docs], minima.T)
        return out


def estimate_jaccard(sig_a: np.ndarray, sig_b: np.ndarray) -> float | np.ndarray:
    """Fraction of positions where two signatures agree (the MinHash estimate of Jaccard). Works row-wise on
    stacks of signatures too: (pairs, k) and (pairs, k) -> (pairs,).

    >>> estimate_jaccard(np.array([1, 2, 3, 4]), np.array([1, 9, 3, 9]))
    0.5
    """
    sig_a, sig_b = np.asarray(sig_a), np.asarray(sig_b)
    if sig_a.shape != sig_b.shape:
        raise DedupError(f"signatures differ in shape {sig_a.shape} vs {sig_b.shape}: use the same MinHasher for both")
    agree = np.mean(sig_a == sig_b, axis=-1)
    return float(agree) if agree.ndim == 0 else agree


# ----------------------------------------------------------------------------------------------------------
# 4. The theory: standard error, the S-curve, and choosing (bands, rows)
# ----------------------------------------------------------------------------------------------------------

def standard_error(j: float, num_perm: int) -> float:
    """Standard error √(J(1 − J)/k) of the MinHash estimate (each of k positions is a coin with P = J).

    >>> round(standard_error(0.43, 128), 3)
    0.044
    """
    return math.sqrt(j * (1 - j) / num_perm)


def candidate_probability(j, bands: int, rows: int):
    """P(two documents with Jaccard j share at least one whole band) = 1 − (1 − j^rows)^bands. Accepts arrays.

    >>> round(candidate_probability(0.5, 32, 4), 2), round(candidate_probability(0.2, 32, 4), 2)
    (0.87, 0.05)
    """
    probability = 1.0 - (1.0 - np.asarray(j, dtype=np.float64) ** rows) ** bands
    return float(probability) if probability.ndim == 0 else probability


def lsh_threshold(bands: int, rows: int) -> float:
    """Where the S-curve is steepest, approximately: (1/bands)^(1/rows).

    >>> round(lsh_threshold(32, 4), 2), round(lsh_threshold(16, 8), 2)
    (0.42, 0.71)
    """
    return (1.0 / bands) ** (1.0 / rows)


def _check_threshold(threshold) -> None:
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float, np.floating)) \
            or not 0.0 < float(threshold) < 1.0:
        raise DedupError(f"threshold must be a number strictly between 0 and 1, got {threshold!r}: e.g. 0.5")


def band_errors(threshold: float, bands: int, rows: int, grid: int = 2001) -> tuple[float, float]:
    """(false-positive area, false-negative area) of a banding under the S-curve, over Jaccard uniform in [0, 1]:
    ∫_0^t P(j) dj (dissimilar pairs that become candidates) and ∫_t^1 1 − P(j) dj (similar pairs that do not)."""
    below = np.linspace(0.0, threshold, grid)
    above = np.linspace(threshold, 1.0, grid)
    false_pos = np.trapezoid(candidate_probability(below, bands, rows), below)
    false_neg = np.trapezoid(1.0 - candidate_probability(above, bands, rows), above)
    return float(false_pos), float(false_neg)


def choose_bands_rows(threshold: float, num_perm: int = 128, false_positive_weight: float = 0.5,
                      false_negative_weight: float = 0.5) -> tuple[int, int]:
    """The (bands, rows) with bands·rows = num_perm that minimises the weighted false-positive + false-negative
    areas of `band_errors` at this threshold.

    >>> choose_bands_rows(0.5, 128)
    (32, 4)
    """
    _check_threshold(threshold)
    _check_num_perm(num_perm)
    best = None
    for rows in range(1, num_perm + 1):
        if num_perm % rows:
            continue
        bands = num_perm // rows
        false_pos, false_neg = band_errors(threshold, bands, rows)
        cost = false_positive_weight * false_pos + false_negative_weight * false_neg
        if best is None or cost < best[0]:
            best = (cost, bands, rows)
    return best[1], best[2]


def resolve_bands_rows(threshold: float, num_perm: int, bands: int | None, rows: int | None) -> tuple[int, int]:
    """Fill in (bands, rows): both None -> `choose_bands_rows`; one given -> the other is num_perm / it;
    both given -> they must multiply to num_perm."""
    _check_num_perm(num_perm)
    for name, value in (("bands", bands), ("rows", rows)):
        if value is not None and (not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1):
            raise DedupError(f"{name} must be a positive integer, got {value!r}")
    if bands is None and rows is None:
        return choose_bands_rows(threshold, num_perm)
    if bands is None or rows is None:
        given, name = (bands, "bands") if rows is None else (rows, "rows")
        if num_perm % given:
            raise DedupError(f"num_perm={num_perm} is not divisible by {name}={given}: pick a divisor of num_perm")
        return (given, num_perm // given) if name == "bands" else (num_perm // given, given)
    if bands * rows != num_perm:
        raise DedupError(f"bands x rows = {bands} x {rows} = {bands * rows} must equal num_perm={num_perm}: "
                         f"e.g. bands={num_perm // rows if num_perm % rows == 0 else 32}, "
                         f"rows={rows if num_perm % rows == 0 else num_perm // 32}")
    return int(bands), int(rows)


# ----------------------------------------------------------------------------------------------------------
# 5. LSH banding: candidates by sorting band rows (numpy), not by Python dicts
# ----------------------------------------------------------------------------------------------------------

def _pairs_in_groups(order: np.ndarray, group: np.ndarray) -> np.ndarray:
    """All pairs (as keys lo·N + hi is done by the caller) of items that share a group.

    order: (N,) item ids sorted so that equal groups are contiguous; group: (N,) group id of order[i].
    Returns (pairs, 2) int64 item ids with the smaller id first. Pairs at distance d in sorted order share a
    group when group[i] == group[i + d]; we step d = 1, 2, ... keeping only positions still inside a group.
    """
    found = []
    candidates = np.arange(len(order) - 1)
    distance = 1
    while candidates.size:
        same = group[candidates] == group[candidates + distance]
        candidates = candidates[same]                        # positions whose group reaches distance d further
        if candidates.size:
            left, right = order[candidates], order[candidates + distance]
            found.append(np.stack([np.minimum(left, right), np.maximum(left, right)], axis=1))
            candidates = candidates[candidates + distance + 1 < len(order)]
        distance += 1
    return np.concatenate(found) if found else np.empty((0, 2), dtype=np.int64)


def candidate_pairs(signatures: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """Candidate pairs as an array (pairs, 2) of document ids, i < j, sorted, each pair once.

    Per band: sort the documents by their band rows (np.lexsort: exact, no hashing of the band), so documents
    with identical bands become neighbours; every pair inside a run of equal bands is a candidate. Memory is a
    few arrays of length N per band plus the pairs found: no dict of tuples.
    """
    signatures = np.asarray(signatures)
    if signatures.ndim != 2 or signatures.shape[0] == 0:
        raise DedupError(f"signatures must be a non-empty (docs, num_perm) array, got shape {signatures.shape}")
    if bands is None or rows is None:
        raise DedupError("lsh_candidates needs both bands and rows: e.g. choose_bands_rows(threshold, num_perm)")
    bands, rows = resolve_bands_rows(0.5, signatures.shape[1], bands, rows)
    num_docs = signatures.shape[0]
    keys = []
    for band in range(bands):
        rows_of_band = signatures[:, band * rows:(band + 1) * rows]            # (N, r)
        order = np.lexsort(rows_of_band.T[::-1])                               # (N,) lexicographic row order
        sorted_rows = rows_of_band[order]
        starts_group = np.any(sorted_rows[1:] != sorted_rows[:-1], axis=1)    # (N-1,) a new band value begins
        group = np.concatenate(([0], np.cumsum(starts_group)))
        pairs = _pairs_in_groups(order, group)
        keys.append(pairs[:, 0] * num_docs + pairs[:, 1])                      # one int64 per pair
    unique = np.unique(np.concatenate(keys))
    return np.stack([unique // num_docs, unique % num_docs], axis=1)


def lsh_candidates(signatures: np.ndarray, bands: int, rows: int) -> set[tuple[int, int]]:
    """Pairs (i, j), i < j, of documents that agree on all `rows` values of at least one of `bands` bands.

    >>> sig = np.array([[1, 2, 3, 4], [1, 2, 9, 9], [7, 7, 3, 4], [5, 6, 7, 8]], dtype=np.uint64)
    >>> sorted(lsh_candidates(sig, bands=2, rows=2))
    [(0, 1), (0, 2)]
    """
    return set(map(tuple, candidate_pairs(signatures, bands, rows).tolist()))


# ----------------------------------------------------------------------------------------------------------
# 6. Clusters: union-find over the verified pairs
# ----------------------------------------------------------------------------------------------------------

class UnionFind:
    """Disjoint sets over 0..n-1 with path halving and union by size.

    >>> uf = UnionFind(5); uf.union(0, 1); uf.union(3, 4); uf.union(1, 4)
    >>> uf.clusters()
    [[0, 1, 3, 4]]
    """

    def __init__(self, n: int):
        self.parent = list(range(n))
        self.size = [1] * n

    def find(self, i: int) -> int:
        parent = self.parent
        while parent[i] != i:
            parent[i] = parent[parent[i]]          # path halving: point at the grandparent as we climb
            i = parent[i]
        return i

    def union(self, i: int, j: int) -> None:
        root_i, root_j = self.find(i), self.find(j)
        if root_i == root_j:
            return
        if self.size[root_i] < self.size[root_j]:
            root_i, root_j = root_j, root_i
        self.parent[root_j] = root_i               # hang the smaller tree under the larger one
        self.size[root_i] += self.size[root_j]

    def clusters(self) -> list[list[int]]:
        """Sets with at least two members, each sorted ascending, ordered by their smallest member."""
        members: dict[int, list[int]] = {}
        for i in range(len(self.parent)):
            members.setdefault(self.find(i), []).append(i)     # i increases, so each list comes out sorted
        return sorted((m for m in members.values() if len(m) >= 2), key=lambda m: m[0])


# ----------------------------------------------------------------------------------------------------------
# 7. The whole job: texts -> clusters -> documents to keep
# ----------------------------------------------------------------------------------------------------------

def _check_documents(texts) -> None:
    if isinstance(texts, (str, bytes)) or not hasattr(texts, "__len__"):
        raise DedupError("texts must be a list of strings, not a single string: wrap it in a list")
    if len(texts) == 0:
        raise DedupError("empty document list: pass at least one document")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise DedupError(f"document {i} is {type(text).__name__}, not str: decode or drop it before dedup")


def verified_pairs(texts: list[str], signatures: np.ndarray, pairs: np.ndarray, threshold: float,
                   verify: str = "exact", n: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Keep the candidate pairs whose similarity is >= threshold: returns (pairs kept (m, 2), their similarity).
    verify="exact": exact Jaccard of the shingle sets (built only for documents that appear in a candidate);
    verify="estimate": the MinHash estimate from the signatures (no texts needed)."""
    if verify == "estimate":
        similarity = np.empty(len(pairs))
        for start in range(0, len(pairs), 65536):                   # bounded (chunk, k) temporaries
            chunk = pairs[start:start + 65536]
            similarity[start:start + len(chunk)] = estimate_jaccard(signatures[chunk[:, 0]], signatures[chunk[:, 1]])
    elif verify == "exact":
        sets: dict[int, set[str]] = {}
        similarity = np.empty(len(pairs))
        for p, (i, j) in enumerate(pairs.tolist()):
            if i not in sets:
                sets[i] = shingles(texts[i], n)
            if j not in sets:
                sets[j] = shingles(texts[j], n)
            similarity[p] = jaccard(sets[i], sets[j])
    else:
        raise DedupError(f"verify must be 'exact' or 'estimate', got {verify!r}")
    keep = similarity >= threshold
    return pairs[keep], similarity[keep]


def near_duplicates(texts: list[str], threshold: float = 0.5, num_perm: int = 128, bands: int | None = None,
                    rows: int | None = None, n: int = 3, seed: int = 0, verify: str = "exact") -> list[list[int]]:
    """Clusters of near-duplicate documents (each cluster sorted, size >= 2, clusters ordered by first index).

    MinHash signatures -> LSH candidates -> verified at `threshold` -> union-find. bands/rows default to
    `choose_bands_rows(threshold, num_perm)`.

    >>> near_duplicates(["the cat sat on the mat today", "a completely different sentence here",
    ...                  "The cat sat on the mat, today!"])
    [[0, 2]]
    """
    _check_documents(texts)
    _check_threshold(threshold)
    _check_n(n)
    bands, rows = resolve_bands_rows(threshold, num_perm, bands, rows)
    signatures = MinHasher(num_perm, seed).signatures_from_texts(texts, n)
    pairs = candidate_pairs(signatures, bands, rows)
    kept, _ = verified_pairs(texts, signatures, pairs, threshold, verify, n)
    union_find = UnionFind(len(texts))
    for i, j in kept.tolist():
        union_find.union(i, j)
    return union_find.clusters()


def dedup(texts: list[str], threshold: float = 0.5, **kwargs) -> list[int]:
    """Indices of the documents to keep: every document outside a cluster, and the first of each cluster, in order.
    Keyword arguments go to `near_duplicates`.

    >>> dedup(["the cat sat on the mat today", "other words entirely here", "the cat sat on the mat today"])
    [0, 1]
    """
    dropped = {i for cluster in near_duplicates(texts, threshold, **kwargs) for i in cluster[1:]}
    return [i for i in range(len(texts)) if i not in dropped]
