"""Near-duplicate detection: shingles, Jaccard, MinHash and LSH banding, written out by hand.

Why. A model that sees the same article many times learns to recite it, the compute spent on the
copies is wasted, and benchmark questions that float around the web leak into training. An exact
hash finds byte-for-byte copies; it misses the reposted article with a few words changed, because
changing one word changes the whole hash. For that we compare *content overlap*.

1. Shingles and Jaccard. Cut a document into overlapping runs of n words ("shingles", n = 3 here as
   in the lecture, 5 in FineWeb) and compare the sets:

       A = "the cat sat on the mat today"
         -> {the cat sat, cat sat on, sat on the, on the mat, the mat today}
       B = "the cat sat on the rug today"
         -> {the cat sat, cat sat on, sat on the, on the rug, the rug today}
       Jaccard(A, B) = |A ∩ B| / |A ∪ B| = 3 / 7 ≈ 0.43   (one changed word breaks up to n shingles)

2. MinHash: a short signature whose agreement rate estimates Jaccard. Pick k random hash functions;
   for each one keep only the smallest hash over the document's shingles. Why P(min_A == min_B) =
   Jaccard(A, B): order all shingles of A ∪ B by one random hash. The smallest of them is equally
   likely to be any element of the union, and min_A == min_B exactly when it lies in A ∩ B. With
   k = 128, a pair whose signatures agree in 55 places gets the estimate 55 / 128 ≈ 0.43, whatever
   the documents' length. Each position is a coin flip with success probability J, so the standard
   error is √(J(1 − J) / k): 0.044 at J = 0.43, k = 128 (4x the functions halve it).

3. LSH banding: compare only pairs that are likely similar (600 documents make 179,700 pairs, a
   million 5·10^11). Cut each signature into b bands of r rows (32 x 4 = 128). Two documents become
   a *candidate* if they agree on every row of at least one band; a band matches with probability
   J^r, so    P(candidate | J) = 1 − (1 − J^r)^b,    an S-curve steepest near (1/b)^(1/r).
   32 x 4: threshold ≈ 0.42, P(J = 0.5) ≈ 0.87, P(J = 0.2) ≈ 0.05. 16 x 8: threshold ≈ 0.71,
   P(J = 0.5) ≈ 0.06. Candidates are *verified* (exact Jaccard, or the signature estimate) against
   the threshold, and union-find joins the verified pairs into clusters; `dedup` keeps the first of
   each cluster.

Section 8 turns the same shingles on another question: which documents of a small corpus share a
13-gram with a big one (contamination). docs/dedup.md: the exact modular arithmetic, the numbers.
Run it: python dedup.py demo | experiment | run --input corpus.jsonl --out deduped.jsonl

Depends on numpy and the standard library.
"""

from __future__ import annotations

import functools
import math
import re
import unicodedata

import numpy as np


class DedupError(ValueError):
    """A bad input: the message names the problem and the fix (the CLI prints it, exit code 2)."""


# --------------------------------------------------------------------------------------------------
# 1. Shingles and exact Jaccard
# --------------------------------------------------------------------------------------------------

_WORD = re.compile(r"\w+")


def normalized_words(text: str) -> list[str]:
    """The words a shingle is made of: Unicode NFKC, case-folded, then the runs of letters, digits
    and "_" (regex \\w+), so punctuation and whitespace only separate words. Case, punctuation and
    spacing differences do not count as edits.

    >>> normalized_words("The  cat, sat.\\nON the-mat!")
    ['the', 'cat', 'sat', 'on', 'the', 'mat']
    """
    if not isinstance(text, str):
        raise DedupError(
            f"documents must be str, got {type(text).__name__}: convert or drop it before dedup"
        )
    return _WORD.findall(unicodedata.normalize("NFKC", text).casefold())


def remove_accents(text: str) -> str:
    """Accents removed, for comparing texts that differ only in them: Unicode NFD splits "é" into
    "e" and a combining acute accent, and every combining mark is dropped (the normalization of
    Stanford CS336's MinHash exercise). Scripts that are all combining marks lose them too, so it is
    an option, off by default.

    >>> remove_accents("Café Müller, naïve")
    'Cafe Muller, naive'
    """
    return "".join(c for c in unicodedata.normalize("NFD", text) if not unicodedata.combining(c))


def _is_int(value) -> bool:
    """An integer, Python's or numpy's, but not a bool (in Python, True is the int 1)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _check_n(n) -> None:
    if not _is_int(n) or n < 1:
        raise DedupError(
            f"shingle size n must be an integer >= 1, got {n!r}: use n=3 (lecture) or n=5 (FineWeb)"
        )


def shingles(text: str, n: int = 3, strip_accents: bool = False) -> set[str]:
    """The set of n-word shingles of `text` (words joined by one space). A document with fewer than
    n words is a single shingle: all of its words (the empty string for an empty document), so it
    can still be compared. strip_accents=True shingles the text after `remove_accents`.

    >>> sorted(shingles("a b c d"))
    ['a b c', 'b c d']
    >>> shingles("hello world"), shingles("Café crème", strip_accents=True)
    ({'hello world'}, {'cafe creme'})
    """
    _check_n(n)
    words = normalized_words(remove_accents(text) if strip_accents else text)
    if len(words) < n:
        return {" ".join(words)}
    return {" ".join(words[i : i + n]) for i in range(len(words) - n + 1)}


def jaccard(a: set, b: set) -> float:
    """Exact Jaccard similarity |a ∩ b| / |a ∪ b| of two sets (two empty sets are identical: 1.0).

    >>> jaccard(shingles("the cat sat on the mat today"), shingles("the cat sat on the rug today"))
    0.42857142857142855
    """
    union = len(a | b)
    return len(a & b) / union if union else 1.0


# --------------------------------------------------------------------------------------------------
# 2. A stable 32-bit hash per shingle
# --------------------------------------------------------------------------------------------------
# Python's hash() of a str is salted per process (PYTHONHASHSEED), so signatures would change
# between runs. We want the same 32-bit number for a shingle on every run and machine, computed by
# numpy for a whole batch of text at once (~0.5 µs per Python call would cost more than MinHash):
#   word:    a polynomial hash of its Unicode code points c_0..c_{L-1}, Σ c_i·B^(L-1-i) mod 2^64
#            (B odd), plus the length, then MurmurHash3's fmix64 finalizer (a bijection that makes
#            every output bit depend on every input bit). Over a long string it is one cumulative
#            sum: with W_i = B^-i (B is odd, so invertible mod 2^64),
#            Σ_{s<=i<e} c_i·B^(e-1-i) = (prefix[e] − prefix[s])·B^(e-1), prefix = cumsum(c·W).
#   shingle: h <- fmix64(h XOR word) over its n words, from a fixed seed; x = the top 32 bits.
# uint64 wrap-around is wanted here (the hash lives mod 2^64); section 3's modular arithmetic must
# not. `word_hash` and `shingle_hash` are the same functions in plain Python, the tests' oracle.

_MASK64 = (1 << 64) - 1
_POLY_BASE = 0x100000001B3  # FNV-1's 64-bit prime: odd, so invertible mod 2^64
_LENGTH_MIX = 0x9E3779B97F4A7C15  # golden-ratio constant: word length enters the hash too
_SHINGLE_SEED = 0x9E3779B97F4A7C15  # the shingle hash before any word
_FMIX_MUL1, _FMIX_MUL2 = 0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53  # MurmurHash3 fmix64 constants


def _fmix64_int(h: int) -> int:
    """MurmurHash3's fmix64 on a Python int (the reference for `_fmix64_array`)."""
    h ^= h >> 33
    h = (h * _FMIX_MUL1) & _MASK64
    h ^= h >> 33
    h = (h * _FMIX_MUL2) & _MASK64
    return h ^ (h >> 33)


def _fmix64_array(h: np.ndarray) -> np.ndarray:
    """fmix64 on a uint64 array (same shape); products wrap modulo 2^64 on purpose (the mixing)."""
    h = h ^ (h >> np.uint64(33))
    h *= np.uint64(_FMIX_MUL1)
    h ^= h >> np.uint64(33)
    h *= np.uint64(_FMIX_MUL2)
    return h ^ (h >> np.uint64(33))


def word_hash(word: str) -> int:
    """Stable 64-bit hash of one normalised word: fmix64(Σ c_i·B^(L-1-i) + L·K mod 2^64) over its
    code points.

    >>> word_hash("cat") == word_hash("cat") != word_hash("act")
    True
    """
    poly = 0
    for char in word:
        poly = (poly * _POLY_BASE + ord(char)) & _MASK64
    return _fmix64_int((poly + len(word) * _LENGTH_MIX) & _MASK64)


def shingle_hash(shingle: str) -> int:
    """The 32-bit hash x of one shingle string (words separated by single spaces, as `shingles`
    makes them).

    >>> 0 <= shingle_hash("the cat sat") < 2**32
    True
    """
    h = _SHINGLE_SEED
    for word in shingle.split(" "):
        h = _fmix64_int(h ^ word_hash(word))
    return h >> 32


@functools.lru_cache(maxsize=2)  # B^i and B^-i: a larger group's pair replaces them
def _powers(base: int, length: int) -> np.ndarray:
    """base^0, base^1, ..., base^(length-1) mod 2^64: (length,) uint64 (cumprod wraps: wanted).
    Cached and read-only: every group of texts reuses the same tables."""
    steps = np.full(length, base, dtype=np.uint64)
    steps[:1] = 1
    powers = np.cumprod(steps)
    powers.flags.writeable = False
    return powers


def _bmp_word_table() -> np.ndarray:
    """(65536,) bool: which BMP characters regex \\w matches, asked of the regex itself."""
    table = np.zeros(0x10000, dtype=bool)
    for match in _WORD.finditer("".join(map(chr, range(0x10000)))):
        table[match.start() : match.end()] = True
    return table


_WORD_CHAR = _bmp_word_table()


def _is_word_char(codes: np.ndarray) -> np.ndarray:
    """(L,) uint32 code points -> bool: exactly the characters regex \\w matches."""
    flags = _WORD_CHAR.take(codes, mode="clip")  # code points above U+FFFF read U+FFFF's entry
    astral = np.flatnonzero(codes > 0xFFFF)  # emoji, rare CJK: ask the regex
    flags[astral] = [_WORD.fullmatch(chr(c)) is not None for c in codes[astral].tolist()]
    return flags


GROUP_CHARS = 1 << 18  # texts are hashed in groups of ~this many characters (a few MB of arrays)


def _text_groups(texts: list[str]):
    """(first, last) index ranges covering texts, each ~GROUP_CHARS characters (>= one text)."""
    ends = np.cumsum([len(text) + 1 for text in texts])  # (texts,) characters up to each "\n"
    first = 0
    while first < len(texts):
        group_start = ends[first - 1] if first else 0
        last = int(np.searchsorted(ends, group_start + GROUP_CHARS, side="right"))
        last = max(last, first + 1)  # one text longer than GROUP_CHARS is a group of its own
        yield first, last
        first = last


def word_hashes(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The 64-bit `word_hash` of every word of every text, in order, without a Python loop over
    words: (hashes (total words,) uint64, words per text (texts,) int64). The texts are joined into
    one string, so callers pass one group of them at a time (`_text_groups`).

    >>> hashes, counts = word_hashes(["The cat", "", "sat."])
    >>> counts.tolist(), [int(h) for h in hashes] == [word_hash(w) for w in ("the", "cat", "sat")]
    ([2, 0, 1], True)
    """
    normalized = [unicodedata.normalize("NFKC", text).casefold() for text in texts]
    joined = "\n".join(normalized) + "\n"  # "\n" is no word char: words never span texts
    codes = np.frombuffer(joined.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)  # (L,)
    bounds = np.flatnonzero(np.diff(_is_word_char(codes), prepend=False))  # where words begin/end
    starts, ends = bounds[0::2], bounds[1::2]  # (words,) [start, end): the text ends in "\n"
    # table length: >= L, and the same for every group (casefold may lengthen one: "ß" -> "ss")
    table = max(2 * GROUP_CHARS, 1 << (len(codes) - 1).bit_length())
    inverse_powers = _powers(pow(_POLY_BASE, -1, 1 << 64), table)[: len(codes)]  # (L,) B^-i
    prefix = np.zeros(len(codes) + 1, dtype=np.uint64)  # prefix[i] = Σ_{j<i} c_j·B^-j
    np.cumsum(codes * inverse_powers, out=prefix[1:])  # wraps mod 2^64
    edges = prefix[bounds].reshape(-1, 2)  # (words, 2) the sums at each start and end
    poly = (edges[:, 1] - edges[:, 0]) * _powers(_POLY_BASE, table)[ends - 1]  # Σ c_i·B^(end-1-i)
    lengths = (ends - starts).astype(np.uint64)
    text_ends = np.cumsum([len(t) + 1 for t in normalized])  # code point after each text's "\n"
    counts = np.diff(np.searchsorted(starts, text_ends), prepend=0)  # words per text
    return _fmix64_array(poly + lengths * np.uint64(_LENGTH_MIX)), counts


def _fingerprints_of_group(texts: list[str], n: int) -> tuple[np.ndarray, np.ndarray]:
    """`shingle_fingerprints` of one group of texts."""
    words64, lengths = word_hashes(texts)
    empty = np.flatnonzero(lengths == 0)
    if empty.size:  # an empty document is the one shingle "" (one empty word)
        word_ends = np.cumsum(lengths)
        words64 = np.insert(words64, word_ends[empty], np.uint64(word_hash("")))
        lengths[empty] = 1
    word_starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))  # (docs,) first word of each doc
    per_doc = np.where(lengths >= n, lengths - n + 1, 1)  # shingles per document
    offsets = np.concatenate(([0], np.cumsum(per_doc))).astype(np.int64)  # (docs + 1,)
    # first word of every shingle: doc start + 0, 1, ..., per_doc - 1 (an arange restarted per doc)
    first_word = np.repeat(word_starts - offsets[:-1], per_doc) + np.arange(offsets[-1])
    h = np.full(offsets[-1], _SHINGLE_SEED, dtype=np.uint64)
    for j in range(n):  # fold word j of every shingle into h
        if j < lengths.min():  # every shingle has a word j
            h = _fmix64_array(h ^ words64[j:][first_word])  # word j: first_word + j, no sum
        else:  # a shingle of a short document has its words only (lengths < n)
            live = np.repeat(lengths > j, per_doc)  # (shingles,) the shingles with a word j
            h[live] = _fmix64_array(h[live] ^ words64[first_word[live] + j])
    return h, offsets


def shingle_fingerprints(texts: list[str], n: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """All shingles of all texts as 64-bit fingerprints: (values, offsets), where
    values[offsets[d]:offsets[d+1]] belong to document d (one per shingle position, repeats
    allowed). Equal to `shingle_hash` of every string of `shingles(text, n)` before its final >> 32,
    without building those strings. Two different shingles share a fingerprint with probability
    ~2^-64, so the Jaccard of fingerprint sets is the exact Jaccard of the shingle sets.

    >>> values, offsets = shingle_fingerprints(["a b c d", "hi"], n=3)
    >>> offsets.tolist(), int(values[2] >> np.uint64(32)) == shingle_hash("hi")
    ([0, 2, 3], True)
    """
    _check_n(n)
    values, offsets, shift = [np.empty(0, dtype=np.uint64)], [np.zeros(1, dtype=np.int64)], 0
    for first, last in _text_groups(texts):
        group_values, group_offsets = _fingerprints_of_group(texts[first:last], n)
        values.append(group_values)
        offsets.append(group_offsets[1:] + shift)
        shift += group_offsets[-1]
    return np.concatenate(values), np.concatenate(offsets)


# --------------------------------------------------------------------------------------------------
# 3. MinHash with exact modular arithmetic
# --------------------------------------------------------------------------------------------------

PRIME = (1 << 32) + 15  # 4,294,967,311: the smallest prime above 2^32 (a Miller-Rabin test checks)
_HASH_RANGE = 1 << 32  # x, a and b all lie in [0, 2^32)


def universal_hash(x: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """h_i(x) = (a_i·x + b_i) mod p for every x and every function i, exactly: shape (len(x),
    len(a)), uint64.

    Why this never overflows. x, a and b are all below 2^32, so
        a·x + b <= (2^32 − 1)·(2^32 − 1) + (2^32 − 1) = 2^64 − 2^32 < 2^64,
    which a uint64 holds exactly; then one `%` by p gives the true residue. (a ranges over [1,
    2^32) instead of [1, p): 15 of 4.3 billion values are left out, which changes nothing
    measurable.) The classic bug (p = 2^61 − 1, a·x up to 2^93, wrapped silently modulo 2^64) and
    why "keep a < 2^29" does not fix it: docs/dedup.md.

    >>> top = np.array([2**32 - 1], dtype=np.uint64)
    >>> universal_hash(top, top, top).tolist() == [[((2**32 - 1)**2 + 2**32 - 1) % PRIME]]
    True
    """
    x, a, b = (np.asarray(values, dtype=np.uint64) for values in (x, a, b))
    for name, values in (("x", x), ("a", a), ("b", b)):
        if values.size and int(values.max()) >= _HASH_RANGE:
            raise DedupError(
                f"{name} must be below 2^32 for exact arithmetic, got {int(values.max())}"
            )
    return (x[:, None] * a[None, :] + b[None, :]) % np.uint64(PRIME)


_FIXED_POINT_SHIFT = 2.0**17  # added to s < 2^13: the float's exponent is fixed (hash_fractions)
_FRACTION_MASK = (1 << 35) - 1  # the mantissa bits below the binary point at that exponent


def _residues(fixed_point: np.ndarray) -> np.ndarray:
    """35-bit fixed-point fractions (`hash_fractions`) -> exact residues in [0, p), uint64: residue
    r reads as r + 1/2 within ±0.28, so floor recovers it."""
    return np.floor(fixed_point * (PRIME / 2.0**35)).astype(np.uint64)


def _split_11_bits(x: np.ndarray) -> np.ndarray:
    """x -> (4, n) float64 rows x_0, x_1, x_2, 1, x = x_2·2^22 + x_1·2^11 + x_0 (hash_fractions)."""
    x = np.asarray(x, dtype=np.uint64)
    parts = np.empty((4, len(x)))
    parts[0] = x & np.uint64(0x7FF)
    parts[1] = (x >> np.uint64(11)) & np.uint64(0x7FF)
    parts[2] = x >> np.uint64(22)
    parts[3] = 1.0
    return parts


# Beyond 8,192 permutations the standard error sqrt(J(1-J)/k) is below 0.006 and buys nothing, while
# signatures (8k bytes per document) and the (k, chunk) block grow without bound (1e8: 745 GiB).
MAX_NUM_PERM = 8192


def _check_num_perm(num_perm) -> None:
    if not _is_int(num_perm) or not 1 <= num_perm <= MAX_NUM_PERM:
        raise DedupError(
            f"num_perm must be an integer in [1, {MAX_NUM_PERM}], got {num_perm!r}: use e.g. "
            f"num_perm=128"
        )


class MinHasher:
    """k seeded hash functions h_i(x) = (a_i·x + b_i) mod p and the signatures they give.

    >>> hasher = MinHasher(num_perm=128, seed=0)
    >>> sig = hasher.signatures([shingles("the cat sat on the mat today"),
    ...                          shingles("the cat sat on the rug today")])
    >>> sig.shape, sig.dtype
    ((2, 128), dtype('uint64'))
    """

    # Shingles hashed per step. The (num_perm, chunk) float64 block (384 KiB at k = 128) stays in
    # cache, and the (k, 4) @ (4, chunk) product stays below OpenBLAS's threading threshold (m·n·k
    # <= 262,144): BLAS threads on a busy machine were measured 50x slower at chunk = 2048.
    chunk = 384

    def __init__(self, num_perm: int = 128, seed: int = 0):
        _check_num_perm(num_perm)
        self.num_perm = int(num_perm)
        self.seed = seed
        rng = np.random.default_rng(seed)
        self.a = rng.integers(1, _HASH_RANGE, size=self.num_perm, dtype=np.uint64)  # (k,) never 0
        self.b = rng.integers(0, _HASH_RANGE, size=self.num_perm, dtype=np.uint64)  # (k,)
        # `hash_fractions`' coefficients, over p: a·2^(11j) mod p for j = 0, 1, 2, and b: (k, 4)
        shifted = [(int(a) << shift) % PRIME for a in self.a for shift in (0, 11, 22)]
        pieces = np.array(shifted, dtype=np.float64).reshape(-1, 3) / PRIME  # (k, 3)
        # (b + 1/2)/p: each residue r reads mid-gap, at (r + 1/2)/p (see hash_fractions)
        offsets = (self.b.astype(np.float64) + 0.5) / PRIME + _FIXED_POINT_SHIFT  # (k,)
        self._coefficients = np.column_stack([pieces, offsets])

    def hash_fractions(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """(h_i(x) + 1/2)/p for all k functions and all 32-bit x as 35-bit fixed-point integers:
        (k, len(x)) uint64 equal to ((h_i(x) + 1/2)/p)·2^35 within ±2.2. out: an optional (k,
        len(x)) float64 buffer (the signature loop reuses one).

        Why floats: numpy's uint64 product has no SIMD instruction on common CPUs and `%` is a
        division per element (`universal_hash` costs ~3x more per value). Cut x into 11-bit pieces,
        x = x_2·2^22 + x_1·2^11 + x_0, and let c_j = a·2^(11j) mod p: a·x + b ≡ c_0·x_0 + c_1·x_1 +
        c_2·x_2 + b (mod p), so (h(x) + 1/2)/p is the fractional part of
            s = (c_0/p)·x_0 + (c_1/p)·x_1 + (c_2/p)·x_2 + (b + 1/2)/p,    0 <= s < 2^13
        and s for all k x n pairs is ONE matrix product (k, 4) @ (4, n). Adding 2^17 to the last
        column puts every S = s + 2^17 in [2^17, 2^18), where a float64's step is 2^-35: the low 35
        bits of S's mantissa ARE s's fraction, one bitwise AND. The rounding error, < 1.1·2^-34
        (docs/dedup.md), is under half the gap 1/p between residues, and the 1/2 puts residue r in
        the middle of its gap: it reads strictly inside (r/p, (r + 1)/p), never wraps past 0 or 1,
        so the fixed-point values are in the exact order of the residues and floor(value·p/2^35)
        recovers a minimum's residue.
        """
        return self._fractions(_split_11_bits(x), out)

    def _fractions(self, parts: np.ndarray, out: np.ndarray | None) -> np.ndarray:
        """`hash_fractions` from the (4, n) pieces of `_split_11_bits`."""
        shifted = np.matmul(self._coefficients, parts, out=out)  # (k, n) float64 S = s + 2^17
        bits = shifted.view(np.uint64)  # same memory, read as integers
        np.bitwise_and(bits, np.uint64(_FRACTION_MASK), out=bits)  # keep the 35 fraction bits
        return bits

    def hash_block(self, x: np.ndarray) -> np.ndarray:
        """All k hashes (a_i·x + b_i) mod p of 32-bit values x, exactly: (k, len(x)) uint64 (via
        `hash_fractions`).

        >>> hasher = MinHasher(4, seed=0)
        >>> x = np.array([0, 12345, 2**32 - 1], dtype=np.uint64)
        >>> hasher.hash_block(x).tolist() == universal_hash(x, hasher.a, hasher.b).T.tolist()
        True
        """
        return _residues(self.hash_fractions(x))

    def signature_reference(self, shingle_set: set[str]) -> list[int]:
        """The lesson version, in plain Python integers: for each function, the minimum over the
        shingles. Slow (k x |set| Python operations): the tests' oracle for `signatures`."""
        xs = [shingle_hash(s) for s in shingle_set]
        return [min((int(a) * x + int(b)) % PRIME for x in xs) for a, b in zip(self.a, self.b)]

    def signatures(self, shingle_sets: list[set[str]]) -> np.ndarray:
        """Signatures of many shingle sets: (docs, num_perm) uint64, row d = signature of
        shingle_sets[d]."""
        if len(shingle_sets) == 0:
            raise DedupError("no documents: pass a non-empty list of shingle sets")
        empty = [d for d, shingle_set in enumerate(shingle_sets) if not shingle_set]
        if empty:
            raise DedupError(
                f"document {empty[0]} has no shingles: use shingles(text), which never returns an "
                f"empty set"
            )
        xs = [shingle_hash(s) for shingle_set in shingle_sets for s in shingle_set]
        offsets = np.concatenate(([0], np.cumsum([len(s) for s in shingle_sets], dtype=np.int64)))
        return self.signatures_from_hashes(np.asarray(xs, dtype=np.uint64), offsets)

    def signatures_from_texts(self, texts: list[str], n: int = 3) -> np.ndarray:
        """The fast path, equal to `signatures([shingles(t, n) for t in texts])`. Texts go through
        in groups (`GROUP_CHARS`): memory is the (docs, k) result plus one group's arrays."""
        _check_documents(texts)
        _check_n(n)
        out = np.empty((len(texts), self.num_perm), dtype=np.uint64)
        for first, last in _text_groups(texts):
            values, offsets = _fingerprints_of_group(texts[first:last], n)
            out[first:last] = self.signatures_from_hashes(values >> np.uint64(32), offsets)
        return out

    def signatures_from_hashes(self, x: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """Per-document minima (docs, k) of every h_i over x[offsets[d]:offsets[d+1]] (non-empty).

        We walk over the shingles in fixed windows so memory stays flat however long a document is.
        In a window, the (k, window) block of hash values is reduced per document with
        `np.minimum.reduceat`; a document cut by a window edge gets its minimum from both windows.
        """
        x = np.asarray(x, dtype=np.uint64)
        offsets = np.asarray(offsets, dtype=np.int64)
        num_docs = len(offsets) - 1
        if x.size and int(x.max()) >= _HASH_RANGE:
            raise DedupError(
                "shingle hashes must be 32-bit: use shingle_hash, or shingle_fingerprints >> 32"
            )
        # (docs, k) minima
        out = np.full((num_docs, self.num_perm), np.iinfo(np.uint64).max, dtype=np.uint64)
        block = np.empty((self.num_perm, self.chunk))
        window_starts = np.arange(0, len(x), self.chunk)
        window_stops = np.minimum(window_starts + self.chunk, len(x))
        first_docs = np.searchsorted(offsets, window_starts, side="right") - 1  # window's first doc
        last_docs = np.searchsorted(offsets, window_stops - 1, side="right") - 1  # ... and last doc
        parts = _split_11_bits(x)  # (4, shingles)
        for start, stop, first, last in zip(
            window_starts.tolist(), window_stops.tolist(), first_docs.tolist(), last_docs.tolist()
        ):
            values = self._fractions(  # (k, window) uint64
                parts[:, start:stop], block if stop - start == self.chunk else None
            )
            seg_starts = offsets[first : last + 1] - start  # where each document's run begins
            seg_starts[0] = 0  # the first may have begun earlier
            minima = np.minimum.reduceat(values, seg_starts, axis=1)  # (k, docs in window)
            rows = out[first : last + 1]
            np.minimum(rows, minima.T, out=rows)
        return _residues(out)  # exact residues (see hash_fractions)


def estimate_jaccard(sig_a: np.ndarray, sig_b: np.ndarray) -> float | np.ndarray:
    """Fraction of positions where two signatures agree (the MinHash estimate of Jaccard). Works
    row-wise on stacks of signatures too: (pairs, k) and (pairs, k) -> (pairs,).

    >>> estimate_jaccard(np.array([1, 2, 3, 4]), np.array([1, 9, 3, 9]))
    0.5
    """
    sig_a, sig_b = np.asarray(sig_a), np.asarray(sig_b)
    if sig_a.shape != sig_b.shape:
        raise DedupError(
            f"signatures differ in shape {sig_a.shape} vs {sig_b.shape}: use the same MinHasher "
            f"for both"
        )
    agree = np.mean(sig_a == sig_b, axis=-1)
    return float(agree) if agree.ndim == 0 else agree


# --------------------------------------------------------------------------------------------------
# 4. The theory: standard error, the S-curve, and choosing (bands, rows)
# --------------------------------------------------------------------------------------------------


def standard_error(j: float, num_perm: int) -> float:
    """Standard error √(J(1 − J)/k) of the MinHash estimate (k coins, each with P = J).

    >>> round(standard_error(0.43, 128), 3)
    0.044
    """
    return math.sqrt(j * (1 - j) / num_perm)


def candidate_probability(j, bands: int, rows: int):
    """P(documents with Jaccard j share a whole band) = 1 − (1 − j^rows)^bands; j may be an array.

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


def check_threshold(threshold) -> None:
    is_number = isinstance(threshold, (int, float, np.floating)) and not isinstance(threshold, bool)
    if not is_number or not 0.0 < float(threshold) < 1.0:
        raise DedupError(
            f"threshold must be a number strictly between 0 and 1, got {threshold!r}: e.g. 0.5"
        )


def band_errors(threshold: float, bands: int, rows: int, grid: int = 2001) -> tuple[float, float]:
    """(false-positive area, false-negative area) of a banding under the S-curve, over Jaccard
    uniform in [0, 1]: ∫_0^t P(j) dj (dissimilar pairs that become candidates) and ∫_t^1 1 −
    P(j) dj (similar pairs that do not)."""
    below = np.linspace(0.0, threshold, grid)
    above = np.linspace(threshold, 1.0, grid)
    false_pos = np.trapezoid(candidate_probability(below, bands, rows), below)
    false_neg = np.trapezoid(1.0 - candidate_probability(above, bands, rows), above)
    return float(false_pos), float(false_neg)


def choose_bands_rows(
    threshold: float,
    num_perm: int = 128,
    false_positive_weight: float = 0.5,
    false_negative_weight: float = 0.5,
) -> tuple[int, int]:
    """The (bands, rows) with bands·rows = num_perm that minimises the weighted false-positive +
    false-negative areas of `band_errors` at this threshold.

    >>> choose_bands_rows(0.5, 128)
    (32, 4)
    """
    check_threshold(threshold)
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


def resolve_bands_rows(
    threshold: float, num_perm: int, bands: int | None, rows: int | None
) -> tuple[int, int]:
    """Fill in (bands, rows): both None -> `choose_bands_rows`; one given -> the other is num_perm /
    it; both given -> they must multiply to num_perm."""
    _check_num_perm(num_perm)
    for name, value in (("bands", bands), ("rows", rows)):
        if value is not None and (not _is_int(value) or value < 1):
            raise DedupError(f"{name} must be a positive integer, got {value!r}")
    if bands is None and rows is None:
        return choose_bands_rows(threshold, num_perm)
    if bands is None or rows is None:
        given, name = (bands, "bands") if rows is None else (rows, "rows")
        if num_perm % given:
            raise DedupError(
                f"num_perm={num_perm} is not divisible by {name}={given}: pick a divisor of "
                f"num_perm"
            )
        return (given, num_perm // given) if name == "bands" else (num_perm // given, given)
    if bands * rows != num_perm:
        raise DedupError(
            f"bands x rows = {bands} x {rows} = {bands * rows} must equal num_perm={num_perm}: "
            f"give only bands (rows = num_perm // bands) or use choose_bands_rows"
        )
    return int(bands), int(rows)


# --------------------------------------------------------------------------------------------------
# 5. LSH banding: candidates by sorting band rows (numpy), not by Python dicts
# --------------------------------------------------------------------------------------------------


def pairs_in_groups(order: np.ndarray, group: np.ndarray) -> np.ndarray:
    """All pairs of items that share a group.

    order: (N,) item ids sorted so that equal groups are contiguous; group: (N,) group id of
    order[i]. Returns (pairs, 2) int64 item ids with the smaller id first. Pairs at distance d in
    sorted order share a group when group[i] == group[i + d]; we step d = 1, 2, ... keeping only
    positions still inside a group.

    >>> pairs_in_groups(np.array([7, 3, 5, 9]), np.array([0, 0, 0, 1])).tolist()  # 7, 3, 5: group 0
    [[3, 7], [3, 5], [5, 7]]
    """
    found = []
    candidates = np.arange(len(order) - 1)
    distance = 1
    while candidates.size:
        same = group[candidates] == group[candidates + distance]
        candidates = candidates[same]  # positions whose group reaches distance d further
        if candidates.size:
            left, right = order[candidates], order[candidates + distance]
            found.append(np.stack([np.minimum(left, right), np.maximum(left, right)], axis=1))
            candidates = candidates[candidates + distance + 1 < len(order)]
        distance += 1
    return np.concatenate(found) if found else np.empty((0, 2), dtype=np.int64)


def band_key(band_rows: np.ndarray) -> np.ndarray:
    """One 64-bit key per document for a band: (N, r) uint64 -> (N,) uint64, fmix64 folded over the
    r values. Equal bands give equal keys; different bands share a key with probability ~2^-64
    (handled by the caller). An index too big for memory joins documents on these keys on disk
    instead (machinery/data_at_scale.py)."""
    key = np.full(len(band_rows), _SHINGLE_SEED, dtype=np.uint64)
    for column in band_rows.T:
        key = _fmix64_array(key ^ column)
    return key


def candidate_pairs(
    signatures: np.ndarray, bands: int, rows: int, documents: np.ndarray | None = None
) -> np.ndarray:
    """Candidate pairs as an array (pairs, 2) of document ids, i < j, sorted, each pair once.
    `documents`, an ascending array of row ids, restricts the search to those rows (without copying
    the whole signature array).

    Per band: sort the documents by a 64-bit key of their band (one argsort), so documents with
    identical bands become neighbours; every pair inside a run of identical bands is a candidate.
    Neighbours with equal keys are checked row by row: if two different bands ever share a key
    (odds ~2^-64 per pair), that band is re-sorted by the rows themselves (np.lexsort) and its runs
    are cut where the rows differ, so a key collision neither makes a false candidate nor hides one.
    """
    signatures = np.asarray(signatures)
    if signatures.ndim != 2 or signatures.shape[0] == 0:
        raise DedupError(
            f"signatures must be a non-empty (docs, num_perm) array, got shape {signatures.shape}"
        )
    if bands is None or rows is None:
        raise DedupError(
            "lsh_candidates needs both bands and rows: e.g. choose_bands_rows(threshold, num_perm)"
        )
    bands, rows = resolve_bands_rows(0.5, signatures.shape[1], bands, rows)
    if documents is None:
        documents = np.arange(signatures.shape[0])
    documents = np.asarray(documents, dtype=np.int64)
    num_docs = len(documents)
    keys = []
    for band in range(bands):
        band_rows = signatures[documents, band * rows : (band + 1) * rows]  # (N, r) a small copy
        band_keys = band_key(band_rows)
        order = np.argsort(band_keys)  # (N,) equal keys side by side
        new_run = band_keys[order[1:]] != band_keys[order[:-1]]  # (N-1,) the key changes
        same = np.flatnonzero(~new_run)  # neighbours with equal keys: are their bands equal too?
        if np.any(band_rows[order[same]] != band_rows[order[same + 1]]):  # no: sort exactly
            order = np.lexsort(band_rows.T[::-1])
            new_run = np.any(band_rows[order[1:]] != band_rows[order[:-1]], axis=1)
        group = np.concatenate(([0], np.cumsum(new_run)))
        pairs = pairs_in_groups(order, group)
        keys.append(pairs[:, 0] * num_docs + pairs[:, 1])  # one int64 per pair
    unique = np.unique(np.concatenate(keys))
    return documents[np.stack([unique // num_docs, unique % num_docs], axis=1)]


def lsh_candidates(signatures: np.ndarray, bands: int, rows: int) -> set[tuple[int, int]]:
    """Pairs (i, j), i < j, of documents that agree on every row of at least one band.

    >>> sig = np.array([[1, 2, 3, 4], [1, 2, 9, 9], [7, 7, 3, 4], [5, 6, 7, 8]], dtype=np.uint64)
    >>> sorted(lsh_candidates(sig, bands=2, rows=2))
    [(0, 1), (0, 2)]
    """
    return set(map(tuple, candidate_pairs(signatures, bands, rows).tolist()))


# --------------------------------------------------------------------------------------------------
# 6. Clusters: union-find over the verified pairs
# --------------------------------------------------------------------------------------------------


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
            parent[i] = parent[parent[i]]  # path halving: point at the grandparent as we climb
            i = parent[i]
        return i

    def union(self, i: int, j: int) -> None:
        root_i, root_j = self.find(i), self.find(j)
        if root_i == root_j:
            return
        if self.size[root_i] < self.size[root_j]:
            root_i, root_j = root_j, root_i
        self.parent[root_j] = root_i  # hang the smaller tree under the larger one
        self.size[root_i] += self.size[root_j]

    def clusters(self) -> list[list[int]]:
        """Sets of two or more members, each sorted, ordered by their smallest member."""
        members: dict[int, list[int]] = {}
        for i in range(len(self.parent)):
            members.setdefault(self.find(i), []).append(i)  # i ascends: lists come out sorted
        return sorted((m for m in members.values() if len(m) >= 2), key=lambda m: m[0])


# --------------------------------------------------------------------------------------------------
# 7. The whole job: texts -> clusters -> documents to keep
# --------------------------------------------------------------------------------------------------


def _check_documents(texts) -> None:
    if isinstance(texts, (str, bytes)) or not hasattr(texts, "__len__"):
        raise DedupError("texts must be a list of strings, not a single string: wrap it in a list")
    if len(texts) == 0:
        raise DedupError("empty document list: pass at least one document")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise DedupError(
                f"document {i} is {type(text).__name__}, not str: decode or drop it before dedup"
            )


def pair_jaccard(texts: list[str], pairs: np.ndarray, n: int = 3) -> np.ndarray:
    """Exact Jaccard of the shingle sets of each pair (i, j): (pairs,). Only documents that appear
    in a pair are shingled (as 64-bit fingerprints, see `shingle_fingerprints`).

    >>> texts = ["the cat sat on the mat today", "x", "the cat sat on the rug today"]
    >>> pair_jaccard(texts, np.array([[0, 2]]))
    array([0.42857143])
    """
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    involved = np.unique(pairs)
    values, offsets = shingle_fingerprints([texts[d] for d in involved.tolist()], n)
    for start, stop in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
        values[start:stop].sort()  # each document's fingerprints ascending, in place
    first = np.ones(len(values), dtype=bool)  # (shingles,) the first of its value in its document
    first[1:] = values[1:] != values[:-1]
    first[offsets[:-1]] = True
    distinct = np.add.reduceat(first, offsets[:-1], dtype=np.int64)  # (documents,) set sizes
    sets = np.split(values[first], np.cumsum(distinct)[:-1])  # per document: sorted, distinct
    similarity = np.empty(len(pairs))
    for p, (i, j) in enumerate(np.searchsorted(involved, pairs).tolist()):
        common = len(np.intersect1d(sets[i], sets[j], assume_unique=True))
        similarity[p] = common / (len(sets[i]) + len(sets[j]) - common)
    return similarity


def pair_estimates(signatures: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """MinHash estimate of each pair's Jaccard from the signatures: (pairs,), in bounded chunks."""
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    similarity = np.empty(len(pairs))
    for start in range(0, len(pairs), 65536):
        chunk = pairs[start : start + 65536]
        similarity[start : start + len(chunk)] = estimate_jaccard(
            signatures[chunk[:, 0]], signatures[chunk[:, 1]]
        )
    return similarity


def identical_signature_groups(signatures: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Collapse documents whose whole signatures are identical (exact copies, mostly): returns
    (representatives, the smallest document of each group plus every document without a twin,
    ascending; star pairs (m, 2), one (representative, member) per other member). Without this, m
    copies of one boilerplate page would make m(m-1)/2 candidate pairs in every band; with it, they
    cost m - 1 pairs.

    >>> sig = np.array([[1, 2], [3, 4], [1, 2], [1, 2]], dtype=np.uint64)
    >>> representatives, stars = identical_signature_groups(sig)
    >>> representatives.tolist(), stars.tolist()
    ([0, 1], [[0, 2], [0, 3]])
    """
    odd = np.random.default_rng(0).integers(0, 2**63, size=signatures.shape[1], dtype=np.uint64)
    mixer = odd * 2 + 1  # (k,) random odd multipliers
    keys = _fmix64_array(signatures @ mixer)  # (N,) a hash of the whole row (wraps mod 2^64)
    order = np.argsort(keys, kind="stable")  # twins side by side, smaller index first
    same_key = np.flatnonzero(keys[order[1:]] == keys[order[:-1]])  # only these can be twins
    twin_of_previous = np.zeros(len(order) - 1, dtype=bool)  # (N-1,) exactly equal rows
    twin_of_previous[same_key] = np.all(
        signatures[order[same_key]] == signatures[order[same_key + 1]], axis=1
    )
    group = np.concatenate(([0], np.cumsum(~twin_of_previous)))
    first_in_group = order[np.concatenate(([True], ~twin_of_previous))]  # (groups,) stable: min
    representative = first_in_group[group]  # (N,) for order[i]
    is_member = representative != order
    stars = np.stack([representative[is_member], order[is_member]], axis=1).astype(np.int64)
    return np.sort(first_in_group), stars[np.lexsort((stars[:, 1], stars[:, 0]))]


def near_duplicate_pairs(
    texts: list[str],
    threshold: float = 0.5,
    num_perm: int = 128,
    bands: int | None = None,
    rows: int | None = None,
    n: int = 3,
    seed: int = 0,
    verify: str = "exact",
    strip_accents: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Verified pairs (m, 2), i < j, sorted, with their similarity (m,): MinHash signatures ->
    copies collapsed -> LSH candidates -> verification at `threshold` (verify="exact": exact Jaccard
    of the shingle sets, via 64-bit fingerprints; "estimate": the signatures' agreement rate).
    bands/rows default to `choose_bands_rows`.

    Copies: a document whose shingle set equals an earlier one's (for "estimate": whose signature
    does) is listed once, as (first copy, copy) with similarity 1.0, and left out of LSH; its other
    pairs are its first copy's, so the clusters are those of the full pair list. strip_accents:
    shingle every text after `remove_accents` (signatures and exact verification alike).
    """
    _check_documents(texts)
    check_threshold(threshold)
    _check_n(n)
    bands, rows = resolve_bands_rows(threshold, num_perm, bands, rows)
    if verify not in ("exact", "estimate"):
        raise DedupError(f"verify must be 'exact' or 'estimate', got {verify!r}")
    if strip_accents:
        texts = [remove_accents(text) for text in texts]
    signatures = MinHasher(num_perm, seed).signatures_from_texts(texts, n)
    representatives, stars = identical_signature_groups(signatures)
    if verify == "exact":  # equal signatures, unequal sets: not copies, back into LSH
        copies = pair_jaccard(texts, stars, n) == 1.0
        representatives = np.union1d(representatives, stars[~copies, 1])
        stars = stars[copies]
    candidates = candidate_pairs(signatures, bands, rows, documents=representatives)
    if verify == "exact":
        similarity = pair_jaccard(texts, candidates, n)
    else:
        similarity = pair_estimates(signatures, candidates)
    keep = similarity >= threshold
    pairs = np.concatenate([stars, candidates[keep]])
    similarity = np.concatenate([np.ones(len(stars)), similarity[keep]])
    order = np.lexsort((pairs[:, 1], pairs[:, 0]))
    return pairs[order], similarity[order]


def near_duplicates(
    texts: list[str],
    threshold: float = 0.5,
    num_perm: int = 128,
    bands: int | None = None,
    rows: int | None = None,
    n: int = 3,
    seed: int = 0,
    verify: str = "exact",
    strip_accents: bool = False,
) -> list[list[int]]:
    """Clusters of near-duplicate documents (each cluster sorted, size >= 2, clusters ordered by
    first index): union-find over `near_duplicate_pairs`. Clusters are transitive: if A ~ B and B ~
    C, A and C share one.

    >>> near_duplicates(["the cat sat on the mat today", "a completely different sentence here",
    ...                  "The cat sat on the mat, today!"])
    [[0, 2]]
    """
    pairs, _ = near_duplicate_pairs(
        texts, threshold, num_perm, bands, rows, n, seed, verify, strip_accents
    )
    union_find = UnionFind(len(texts))
    for i, j in pairs.tolist():
        union_find.union(i, j)
    return union_find.clusters()


def dedup(texts: list[str], threshold: float = 0.5, **kwargs) -> list[int]:
    """Indices of the documents to keep: every document outside a cluster, and the first of each
    cluster, in order. Keyword arguments go to `near_duplicates`.

    >>> dedup(["the cat sat on the mat today", "other words entirely here",
    ...        "the cat sat on the mat today"])
    [0, 1]
    """
    dropped = {i for cluster in near_duplicates(texts, threshold, **kwargs) for i in cluster[1:]}
    return [i for i in range(len(texts)) if i not in dropped]


# --------------------------------------------------------------------------------------------------
# 8. Overlap of two corpora: the 13-gram index (evaluate.py's contamination, data.py's --val-data)
# --------------------------------------------------------------------------------------------------
# Near-dedup asks which documents of one corpus resemble each other; contamination asks which
# documents of a small corpus (an evaluation set, a held-out file) share a long shingle with a big
# one (the training corpus). GPT-3's rule: an evaluation document is contaminated when one of its
# 13-grams (13 consecutive lowercased words, punctuation ignored) occurs in training. 13 words are
# long enough that only copied text shares them (evaluate.py shows why 6 is too short). The big side
# becomes an index; the small side is looked up in it, document by document.

_UNKNOWN = np.uint64(2**64 - 1)  # id of a word the indexed corpus never had
_NGRAM_BASE = np.uint64(_POLY_BASE)  # odd multiplier of the polynomial n-gram hash (mod 2^64)


def overlap_words(text: str) -> list[str]:
    """The unit of overlap: lowercased runs of letters/digits; punctuation and spacing are ignored.

    >>> overlap_words("It's 13 words, or so.")
    ['it', 's', '13', 'words', 'or', 'so']
    """
    return _WORD.findall(text.lower())  # the words of section 1, lowercased, not NFKC-folded


def ngram_hashes(word_ids: np.ndarray, n: int) -> np.ndarray:
    """64-bit hash of every run of n consecutive word ids: h = sum_j mix(id[i+j]) * BASE^(n-1-j) mod
    2^64. (len(word_ids) - n + 1,) uint64; empty when the document has fewer than n words. Two
    different n-grams share a hash with probability about 2^-64, so a false hit needs ~10^19
    comparisons.

    >>> a, b = ngram_hashes(np.array([1, 2, 3, 1, 2]), 2), ngram_hashes(np.array([9, 1, 2]), 2)
    >>> len(a), bool(a[0] == a[3] == b[1]), bool(a[0] == a[1])  # (1, 2) alike wherever it occurs
    (4, True, False)
    """
    count = len(word_ids) - n + 1
    if count <= 0:
        return np.empty(0, dtype=np.uint64)
    # fmix64 (section 2) spreads small consecutive word ids over all 64 bits; + 1: no id mixes to 0
    mixed = _fmix64_array(word_ids.astype(np.uint64) + np.uint64(1))
    h = np.zeros(count, dtype=np.uint64)
    for j in range(n):  # Horner's rule over the n positions, all start positions at once
        h = h * _NGRAM_BASE + mixed[j : j + count]
    return h


class SetNgramIndex:
    """The plain way, kept as the readable reference: a Python set of word tuples. Exact, but every
    13-gram costs a tuple of 13 string references plus a set slot (~200 bytes), so it is ~25x the
    memory of the hashed index.

    index = SetNgramIndex(13); index.add(doc) for each indexed document; index.freeze();
    document_overlap(index, text).
    """

    def __init__(self, n: int = 13):
        self.n, self.documents, self.words_seen = n, 0, 0
        self.grams: set[tuple[str, ...]] = set()

    def add(self, text: str) -> None:
        tokens = overlap_words(text)
        self.grams.update(tuple(tokens[i : i + self.n]) for i in range(len(tokens) - self.n + 1))
        self.words_seen += len(tokens)
        self.documents += 1

    def freeze(self) -> "SetNgramIndex":
        return self

    def __len__(self) -> int:
        return len(self.grams)

    def hit_mask(self, tokens: list[str]) -> np.ndarray:
        """(max(0, len(tokens) - n + 1),) bool: which of the document's n-grams occur in the indexed
        corpus."""
        return np.array(
            [tuple(tokens[i : i + self.n]) in self.grams for i in range(len(tokens) - self.n + 1)],
            dtype=bool,
        )


class NgramIndex:
    """The scalable way: every n-gram hash of the corpus in one sorted uint64 array (8 bytes per
    n-gram), queried by binary search. Same interface as SetNgramIndex; words get integer ids from a
    dict, so identical words hash identically on both sides.

    >>> index = NgramIndex(n=3); index.add("the cat sat on the mat"); _ = index.freeze()
    >>> index.hit_mask(overlap_words("a cat sat on the rug")).tolist()  # "cat sat on", "sat on the"
    [False, True, True, False]
    """

    def __init__(self, n: int = 13):
        self.n, self.documents, self.words_seen = n, 0, 0
        self.vocab: dict[str, int] = {}
        self._parts: list[np.ndarray] = []
        self.hashes = np.empty(0, dtype=np.uint64)

    def add(self, text: str) -> None:
        tokens = overlap_words(text)
        vocab = self.vocab
        ids = np.fromiter(
            (vocab.setdefault(w, len(vocab)) for w in tokens), dtype=np.uint64, count=len(tokens)
        )
        self._parts.append(ngram_hashes(ids, self.n))
        self.words_seen += len(tokens)
        self.documents += 1

    def freeze(self) -> "NgramIndex":
        """Sort, drop repeats by neighbour compare (np.unique: ~20x slower on uint64, numpy 2)."""
        hashes = np.concatenate([self.hashes, *self._parts])
        hashes.sort()
        self.hashes = (
            hashes[np.concatenate([[True], hashes[1:] != hashes[:-1]])] if len(hashes) else hashes
        )
        self._parts = []
        return self

    def __len__(self) -> int:
        return len(self.hashes)

    def hit_mask(self, tokens: list[str]) -> np.ndarray:
        """As SetNgramIndex.hit_mask, by binary search in the sorted hashes."""
        n = self.n
        ids = np.fromiter(
            (self.vocab.get(w, _UNKNOWN) for w in tokens), dtype=np.uint64, count=len(tokens)
        )
        hashes = ngram_hashes(ids, n)
        if not len(hashes) or not len(self.hashes):
            return np.zeros(len(hashes), dtype=bool)
        at = np.minimum(np.searchsorted(self.hashes, hashes), len(self.hashes) - 1)
        hit = self.hashes[at] == hashes
        known = np.concatenate([[0], np.cumsum(ids != _UNKNOWN, dtype=np.int64)])
        return hit & ((known[n:] - known[:-n]) == n)  # an n-gram with an unseen word is not in it


def document_overlap(index, text: str) -> dict:
    """The n-grams of one document (of the small corpus) found in the indexed one. -> {"words",
    "ngrams", "overlapping", "fraction", "example"}: example is the first shared n-gram (or None).
    `index` is anything with `n` and `hit_mask(words)`: NgramIndex, SetNgramIndex, or
    data_at_scale's index of the small side (marking the n-grams its training stream held).

    >>> index = NgramIndex(n=3); index.add("the cat sat on the mat"); _ = index.freeze()
    >>> document_overlap(index, "A cat sat on the rug!")["example"]
    'cat sat on'
    """
    tokens = overlap_words(text)
    hit = index.hit_mask(tokens)
    first = int(np.argmax(hit)) if hit.any() else None
    return {
        "words": len(tokens),
        "ngrams": len(hit),
        "overlapping": int(hit.sum()),
        "fraction": float(hit.mean()) if len(hit) else 0.0,
        "example": " ".join(tokens[first : first + index.n]) if first is not None else None,
    }


if __name__ == "__main__":
    from machinery.commands import dedup as command

    raise SystemExit(command.main())
