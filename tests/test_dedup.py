"""Tests for dedup.py against real oracles: exact Jaccard, Python big-integer arithmetic, brute-force banding,
the lecture's worked numbers, and the statistics MinHash promises."""

import hashlib
import json
import math
import os
import random
import re
import subprocess
import sys
import unicodedata

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import dedup
from machinery import dedup_experiment
from machinery.commands import dedup as dedup_command
from dedup import (
    PRIME,
    DedupError,
    MinHasher,
    UnionFind,
    candidate_probability,
    choose_bands_rows,
    dedup as dedup_indices,
    estimate_jaccard,
    jaccard,
    lsh_candidates,
    lsh_threshold,
    near_duplicates,
    shingles,
    standard_error,
    universal_hash,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------- the lecture's worked numbers


def test_worked_shingle_examples():
    a, b = shingles("the cat sat on the mat today"), shingles("the cat sat on the rug today")
    assert a == {"the cat sat", "cat sat on", "sat on the", "on the mat", "the mat today"}
    assert jaccard(a, b) == pytest.approx(3 / 7) and round(jaccard(a, b), 2) == 0.43
    assert jaccard(shingles("a b c d e f"), shingles("a b c x e f")) == pytest.approx(1 / 7)


def test_worked_theory_numbers():
    assert round(standard_error(0.43, 128), 3) == 0.044
    assert round(lsh_threshold(32, 4), 2) == 0.42 and round(lsh_threshold(16, 8), 2) == 0.71
    assert round(candidate_probability(0.5, 32, 4), 2) == 0.87
    assert round(candidate_probability(0.2, 32, 4), 2) == 0.05
    assert round(candidate_probability(0.5, 16, 8), 2) == 0.06
    curve = candidate_probability(np.linspace(0, 1, 11), 32, 4)
    assert curve[0] == 0 and curve[-1] == 1 and np.all(np.diff(curve) > 0)


def test_shingle_normalisation_and_short_documents():
    assert shingles("The CAT, sat!") == shingles("the   cat sat")
    assert shingles("two words") == {"two words"}
    assert shingles("") == {""} and shingles("...") == {""}
    assert shingles("a b c d e", n=5) == {"a b c d e"} and len(shingles("a b c d e", n=1)) == 5
    assert jaccard(set(), set()) == 1.0


def test_accent_stripping_is_nfd_without_combining_marks(tmp_path, capsys):
    """CS336's MinHash normalization option: "café" and "cafe" shingle alike; off by default."""
    assert (
        dedup.remove_accents("café crème brûlée, naïve Ångström")
        == "cafe creme brulee, naive Angstrom"
    )
    assert (
        dedup.remove_accents("e\u0301") == "e" and dedup.remove_accents("Straße ½") == "Straße ½"
    )  # no marks
    accented, plain = "le café crème est très bon ce matin", "le cafe creme est tres bon ce matin"
    assert shingles(accented) != shingles(plain)
    assert (
        shingles(accented, strip_accents=True)
        == shingles(plain)
        == shingles(plain, strip_accents=True)
    )
    texts = [accented, "an unrelated sentence about rivers and stones today", plain]
    assert dedup.near_duplicates(texts) == []
    assert dedup.near_duplicates(texts, strip_accents=True) == [[0, 2]]
    assert dedup.dedup(texts, strip_accents=True, verify="estimate") == [0, 1]
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    for flags, kept in (([], texts), (["--strip-accents"], texts[:2])):
        dedup_command.main(
            ["run", "--input", str(tmp_path / "in.txt"), "--out", str(tmp_path / "out.txt"), *flags]
        )
        assert (tmp_path / "out.txt").read_text() == "\n".join(kept) + "\n"


# ---------------------------------------------------------------- exact modular arithmetic


def _is_prime(n):
    """Deterministic Miller-Rabin for n < 3.3e24 (the first 12 prime bases suffice)."""
    bases = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37]
    if n < 2 or any(n % q == 0 and n != q for q in bases):
        return n in bases
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in bases:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def test_prime_is_the_smallest_prime_above_2_to_32():
    assert _is_prime(PRIME) and PRIME > 2**32
    assert not any(_is_prime(2**32 + c) for c in range(1, 15))


def test_universal_hash_is_exact_against_python_integers():
    rng = np.random.default_rng(1)
    top = 2**32 - 1
    x = np.concatenate([[0, 1, 2, top - 1, top], rng.integers(0, 2**32, 2000)]).astype(np.uint64)
    a = np.concatenate([[1, 2, top - 1, top], rng.integers(1, 2**32, 60)]).astype(np.uint64)
    b = np.concatenate([[0, 1, top - 1, top], rng.integers(0, 2**32, 60)]).astype(np.uint64)
    got = universal_hash(x, a, b)
    want = [[(int(ai) * int(xi) + int(bi)) % PRIME for ai, bi in zip(a, b)] for xi in x]
    assert got.tolist() == want
    # The oracle can fail: the classic formula with 61-bit a wraps in uint64 and disagrees with exact integers.
    a61 = np.array([2**61 - 2], dtype=np.uint64)
    wrapped = (x[-5:] * a61 + np.uint64(7)) % np.uint64(2**61 - 1)
    assert wrapped.tolist() != [(int(xi) * (2**61 - 2) + 7) % (2**61 - 1) for xi in x[-5:]]


def test_universal_hash_rejects_values_that_could_overflow():
    with pytest.raises(DedupError, match="below 2"):
        universal_hash(
            np.array([2**32], dtype=np.uint64),
            np.array([3], dtype=np.uint64),
            np.array([0], np.uint64),
        )


def _x_with_residue(a, b, residue):
    """The x in [0, p) with (a·x + b) mod p == residue."""
    return (residue - b) * pow(a, -1, PRIME) % PRIME


def test_fast_float_hash_is_exact_including_boundary_residues():
    hasher = MinHasher(256, seed=7)
    rng = np.random.default_rng(3)
    special = [
        _x_with_residue(int(a), int(b), r)
        for a, b in zip(hasher.a[:40], hasher.b[:40])
        for r in (0, 1, 2, PRIME // 2, PRIME - 2, PRIME - 1)
    ]
    x = np.array(
        [v for v in special if v < 2**32]
        + [0, 1, 2**11 - 1, 2**11, 2**22, 2**32 - 1]
        + rng.integers(0, 2**32, 20000).tolist(),
        dtype=np.uint64,
    )
    assert len(x) > 20000 + 200
    fast = hasher.hash_block(x)  # (k, n) via float64 fixed point
    assert np.array_equal(fast, universal_hash(x, hasher.a, hasher.b).T)
    sample = rng.choice(len(x), 300, replace=False)
    assert all(
        int(fast[i, s]) == (int(hasher.a[i]) * int(x[s]) + int(hasher.b[i])) % PRIME
        for i in range(0, 256, 17)
        for s in sample
    )


def test_signature_minimum_is_exact_when_a_document_holds_a_root():
    hasher = MinHasher(16, seed=1)
    roots = [_x_with_residue(int(a), int(b), 0) for a, b in zip(hasher.a, hasher.b)]
    rng = np.random.default_rng(0)
    x = rng.integers(0, 2**32, 900).astype(np.uint64)
    i = next(i for i, r in enumerate(roots) if r < 2**32)
    x[450] = roots[i]  # document 1 holds function i's root
    offsets = np.array([0, 300, 600, 900])
    signatures = hasher.signatures_from_hashes(x, offsets)
    exact = universal_hash(x, hasher.a, hasher.b)  # (n, k)
    want = np.stack([exact[s:e].min(axis=0) for s, e in zip(offsets[:-1], offsets[1:])])
    assert np.array_equal(signatures, want) and signatures[1, i] == 0
    # Force roundings the error budget allows: one float step down or up in the (b + 1/2)/p + 2^17 column. The
    # root still reads inside residue 0's own gap (0, 1/p), never as 1 - ε (what the 1/2 is for), so still exact:
    for direction in (0.0, np.inf):
        nudged = MinHasher(16, seed=1)
        nudged._coefficients[:, 3] = np.nextafter(nudged._coefficients[:, 3], direction)
        assert 0 < nudged.hash_fractions(x[450:451])[i, 0] < 2**35 / PRIME
        assert np.array_equal(nudged.signatures_from_hashes(x, offsets), want)
        assert np.array_equal(nudged.hash_block(x), exact.T)


def test_the_tempting_small_a_fix_is_degenerate_and_ours_is_not():
    """The claim in universal_hash's docstring: with p = 2^61 - 1 and a < 2^29 (so a·x never wraps), about half
    of the k functions pick the same shingle, the one with the smallest x; ours pick it about k/|set| times."""
    rng = random.Random(0)
    xs = [rng.randrange(2**32) for _ in range(200)]
    mersenne = 2**61 - 1
    small_a = [(rng.randrange(1, 2**29), rng.randrange(mersenne)) for _ in range(128)]
    degenerate = sum(min(xs, key=lambda x: (a * x + b) % mersenne) == min(xs) for a, b in small_a)
    hasher = MinHasher(128, seed=0)
    ours = sum(
        min(xs, key=lambda x: (int(a) * x + int(b)) % PRIME) == min(xs)
        for a, b in zip(hasher.a, hasher.b)
    )
    assert degenerate > 40 and ours < 5


def test_minhasher_parameters_are_seeded_and_in_range():
    h1, h2, h3 = MinHasher(64, seed=5), MinHasher(64, seed=5), MinHasher(64, seed=6)
    assert (
        np.array_equal(h1.a, h2.a) and np.array_equal(h1.b, h2.b) and not np.array_equal(h1.a, h3.a)
    )
    assert h1.a.min() >= 1 and h1.a.max() < 2**32 and h1.b.max() < 2**32


# ---------------------------------------------------------------- signatures

TEXTS = [
    "the cat sat on the mat today",
    "The cat sat on the rug today.",
    "",
    "hi",
    "two words",
    "Unicode: café naïve Straße ﬁne — 東京 タワー",
    " ".join(f"w{i}" for i in range(3000)),  # longer than one hashing window
    "a b c a b c a b c",  # repeated shingles
    "emoji 😀 and 𠀋 astral ٣٤ digits snake_case e\u0301 combining \ud800 lone surrogate",
    "\n\n  \t ",  # whitespace only: the empty shingle
]


def test_fast_signatures_equal_the_reference_in_python_integers():
    hasher = MinHasher(32, seed=3)
    fast = hasher.signatures_from_texts(TEXTS)
    from_sets = hasher.signatures([shingles(t) for t in TEXTS])
    assert fast.shape == (len(TEXTS), 32) and fast.dtype == np.uint64
    assert np.array_equal(fast, from_sets)
    for text, row in zip(TEXTS, fast):
        assert row.tolist() == hasher.signature_reference(shingles(text))


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.text(max_size=40) | st.text(alphabet="ab cД_1.", max_size=30), min_size=1, max_size=5
    ),
    st.integers(1, 4),
)
def test_vectorised_hashing_equals_the_string_path_on_any_unicode(texts, n):
    fingerprints, offsets = dedup.shingle_fingerprints(texts, n)
    for d, text in enumerate(texts):
        want = sorted(dedup.shingle_hash(s) for s in shingles(text, n))
        assert sorted(
            set((fingerprints[offsets[d] : offsets[d + 1]] >> np.uint64(32)).tolist())
        ) == sorted(set(want))
    hasher = MinHasher(8, seed=2)
    assert np.array_equal(
        hasher.signatures_from_texts(texts, n), hasher.signatures([shingles(t, n) for t in texts])
    )


def test_window_and_group_boundaries_do_not_change_results(monkeypatch):
    hasher = MinHasher(16, seed=0)
    whole = hasher.signatures_from_texts(TEXTS)
    values, offsets = dedup.shingle_fingerprints(TEXTS)
    monkeypatch.setattr(MinHasher, "chunk", 7)  # documents now straddle many windows
    monkeypatch.setattr(dedup, "GROUP_CHARS", 20)  # and texts are hashed a few at a time
    assert np.array_equal(hasher.signatures_from_texts(TEXTS), whole)
    assert [a.tolist() for a in dedup.shingle_fingerprints(TEXTS)] == [
        values.tolist(),
        offsets.tolist(),
    ]


def _slow_signature(text: str, a: list[int], b: list[int], n: int = 3) -> list[int]:
    """Today's MinHash signature in plain Python, its constants written out here rather than read from dedup.py:
    NFKC + casefold, regex \\w+ words, n-word shingles (fewer words: one shingle of them all, the empty word for
    an empty text); a word hashes as fmix64(Σ c_i·B^(L-1-i) + L·K mod 2^64), B = 0x100000001B3, K = golden
    ratio; a shingle folds h <- fmix64(h XOR word) from seed K and keeps the top 32 bits, x; then min over
    (a·x + b) mod (2^32 + 15)."""
    mask, golden = 2**64 - 1, 0x9E3779B97F4A7C15

    def fmix64(h):
        h ^= h >> 33
        h = h * 0xFF51AFD7ED558CCD & mask
        h ^= h >> 33
        h = h * 0xC4CEB9FE1A85EC53 & mask
        return h ^ (h >> 33)

    def word_hash(word):
        poly = 0
        for char in word:
            poly = (poly * 0x100000001B3 + ord(char)) & mask
        return fmix64((poly + len(word) * golden) & mask)

    words = re.findall(r"\w+", unicodedata.normalize("NFKC", text).casefold())
    runs = {tuple(words[i : i + n]) for i in range(len(words) - n + 1)} or {tuple(words) or ("",)}
    xs = []
    for run in runs:
        h = golden
        for word in run:
            h = fmix64(h ^ word_hash(word))
        xs.append(h >> 32)
    return [min((ai * x + bi) % (2**32 + 15) for x in xs) for ai, bi in zip(a, b)]


def test_signatures_are_todays_bit_for_bit():
    """Speed work must not move a bit of a signature (issue 47): the fast path equals a slow copy of today's
    definition, and k = 128 signatures of TEXTS still have the digest they had before the fast path's rewrite."""
    rng = np.random.default_rng(0)  # MinHasher(seed=0)'s draws: a in [1, 2^32), then b in [0, 2^32)
    a = rng.integers(1, 2**32, size=128, dtype=np.uint64).tolist()
    b = rng.integers(0, 2**32, size=128, dtype=np.uint64).tolist()
    fast = MinHasher(128, seed=0).signatures_from_texts(TEXTS)
    assert fast.tolist() == [_slow_signature(text, a, b) for text in TEXTS]
    digest = hashlib.sha256(fast.astype("<u8").tobytes()).hexdigest()
    assert digest == "b4a4aa56d7854840a147bdb827732cad7c1dd9236b9e258a49f47a8cef3de145"


def test_signatures_are_stable_across_processes():
    code = (
        "import dedup; print(dedup.MinHasher(8, seed=0).signatures_from_texts(['the cat sat on the mat'])"
        "[0].tolist())"
    )
    outs = set()
    for hash_seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        outs.add(
            subprocess.run(
                [sys.executable, "-c", code],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
    here = (
        str(MinHasher(8, seed=0).signatures_from_texts(["the cat sat on the mat"])[0].tolist())
        + "\n"
    )
    assert outs == {here}


def _sets_with_jaccard(rng, common, only_a, only_b):
    tokens = [f"t{v}" for v in rng.choice(10**9, common + only_a + only_b, replace=False)]
    shared = set(tokens[:common])
    return shared | set(tokens[common : common + only_a]), shared | set(tokens[common + only_a :])


def test_estimate_is_unbiased_and_error_shrinks_like_one_over_sqrt_k():
    rng = np.random.default_rng(0)
    pairs = [_sets_with_jaccard(rng, 60, 40, 40) for _ in range(150)]  # J = 60 / 140 ≈ 0.43
    true_j = 60 / 140
    rmse = {}
    for k in (16, 64, 256):
        hasher = MinHasher(k, seed=11)
        sig = hasher.signatures([s for pair in pairs for s in pair])
        estimates = estimate_jaccard(sig[0::2], sig[1::2])
        assert abs(estimates.mean() - true_j) < 4 * standard_error(true_j, k) / math.sqrt(
            len(pairs)
        )
        rmse[k] = float(np.sqrt(np.mean((estimates - true_j) ** 2)))
        assert 0.75 < rmse[k] / standard_error(true_j, k) < 1.3
    assert 1.5 < rmse[16] / rmse[64] < 2.7 and 1.5 < rmse[64] / rmse[256] < 2.7


def test_estimate_jaccard_counts_agreeing_positions():
    assert (
        estimate_jaccard(np.arange(128), np.where(np.arange(128) < 55, np.arange(128), -1))
        == 55 / 128
    )
    with pytest.raises(DedupError, match="shape"):
        estimate_jaccard(np.zeros(4), np.zeros(5))


# ---------------------------------------------------------------- LSH banding


def test_lsh_candidates_match_brute_force_banding(monkeypatch):
    rng = np.random.default_rng(2)
    sig = rng.integers(0, 3, size=(60, 12)).astype(np.uint64)  # tiny alphabet: many band collisions
    for bands, rows in ((12, 1), (6, 2), (4, 3), (3, 4), (1, 12)):
        want = {
            (i, j)
            for i in range(60)
            for j in range(i + 1, 60)
            if any(
                np.array_equal(sig[i, b * rows : (b + 1) * rows], sig[j, b * rows : (b + 1) * rows])
                for b in range(bands)
            )
        }
        assert lsh_candidates(sig, bands, rows) == want
        # Every band key colliding (as if 64-bit hashes clashed) must change nothing: the rows decide.
        with monkeypatch.context() as patch:
            patch.setattr(
                dedup, "band_key", lambda band_rows: np.zeros(len(band_rows), dtype=np.uint64)
            )
            assert lsh_candidates(sig, bands, rows) == want


def test_identical_documents_always_collide():
    rng = random.Random(0)
    texts = [
        " ".join(rng.choice(["x", "y", "z", "w", "v"]) + str(rng.randrange(50)) for _ in range(40))
        for _ in range(30)
    ]
    texts += [texts[3], texts[17], texts[17]]
    for bands, rows in ((64, 2), (16, 8), (1, 128)):
        sig = MinHasher(128, seed=9).signatures_from_texts(texts)
        pairs = lsh_candidates(sig, bands, rows)
        assert {(3, 30), (17, 31), (17, 32), (31, 32)} <= pairs
    assert near_duplicates(texts, threshold=0.9) == [[3, 30], [17, 31, 32]]


def test_candidate_rate_follows_the_s_curve():
    rng = np.random.default_rng(4)
    pairs = [_sets_with_jaccard(rng, 50, 25, 25) for _ in range(300)]  # J = 0.5
    sig = MinHasher(128, seed=1).signatures([s for pair in pairs for s in pair])
    for bands, rows in ((32, 4), (16, 8)):
        hit = np.mean(
            [bool(lsh_candidates(sig[2 * i : 2 * i + 2], bands, rows)) for i in range(len(pairs))]
        )
        p = candidate_probability(0.5, bands, rows)
        assert abs(hit - p) < 4 * math.sqrt(p * (1 - p) / len(pairs)) + 0.01


def test_chooser_minimises_the_error_areas():
    assert choose_bands_rows(0.5, 128) == (32, 4)
    rows = [choose_bands_rows(t, 128)[1] for t in (0.2, 0.4, 0.6, 0.8, 0.9)]
    assert rows == sorted(rows) and rows[0] < rows[-1]
    for t in (0.3, 0.5, 0.8):
        b, r = choose_bands_rows(t, 120)
        best = min(
            sum(dedup.band_errors(t, 120 // rr, rr)) for rr in range(1, 121) if 120 % rr == 0
        )
        assert b * r == 120 and sum(dedup.band_errors(t, b, r)) == pytest.approx(best)


# ---------------------------------------------------------------- clusters and the whole job


def test_union_find_clusters():
    uf = UnionFind(8)
    for i, j in ((5, 6), (0, 7), (6, 2), (7, 3)):
        uf.union(i, j)
    assert uf.clusters() == [[0, 3, 7], [2, 5, 6]]
    assert uf.find(3) == uf.find(0) != uf.find(5)


def brute_force_clusters(sets, threshold):
    """The oracle: union-find over every pair whose exact Jaccard reaches the threshold."""
    truth = UnionFind(len(sets))
    for i in range(len(sets)):
        for j in range(i + 1, len(sets)):
            if jaccard(sets[i], sets[j]) >= threshold:
                truth.union(i, j)
    return truth.clusters()


def test_many_exact_copies_cost_linear_pairs_and_cluster_correctly():
    rng = random.Random(8)
    vocab = [f"w{i}" for i in range(3000)]
    a, b = ([rng.choice(vocab) for _ in range(80)] for _ in range(2))
    near_a = list(a)
    near_a[40] = "changed"
    texts = [" ".join(a)] * 150 + [
        " ".join(rng.choice(vocab) for _ in range(80)) for _ in range(40)
    ]
    texts += [" ".join(near_a)] + [" ".join(b)] * 3
    rng.shuffle(texts)
    pairs, similarity = dedup.near_duplicate_pairs(texts, threshold=0.5)
    assert len(pairs) < 200 and np.all(similarity >= 0.5)  # not 150·149/2 = 11,175 pairs per band
    sets = [shingles(t) for t in texts]
    truth = brute_force_clusters(sets, 0.5)
    clusters = near_duplicates(texts, threshold=0.5)
    assert clusters == truth and sorted(map(len, clusters)) == [3, 151]


def test_collapsing_copies_gives_the_clusters_of_all_pairs():
    """With k = 8, signatures often coincide for documents that are not copies: the collapse must then fall back
    to LSH for them, and clusters must equal union-find over ALL verified LSH candidates (no collapse)."""
    rng = random.Random(4)
    vocab = [f"v{i}" for i in range(40)]
    base = [[rng.choice(vocab) for _ in range(30)] for _ in range(12)]
    texts = []
    for _ in range(120):
        words = list(rng.choice(base))
        for _ in range(rng.randrange(4)):
            words[rng.randrange(30)] = rng.choice(vocab)
        texts.append(" ".join(words))
    for verify in ("exact", "estimate"):
        signatures = MinHasher(8, seed=0).signatures_from_texts(texts)
        candidates = dedup.candidate_pairs(signatures, 4, 2)
        similarity = (
            dedup.pair_jaccard(texts, candidates)
            if verify == "exact"
            else dedup.pair_estimates(signatures, candidates)
        )
        full = UnionFind(len(texts))
        for i, j in candidates[similarity >= 0.6].tolist():
            full.union(i, j)
        assert (
            near_duplicates(texts, 0.6, num_perm=8, bands=4, rows=2, verify=verify)
            == full.clusters()
        )
    _, stars = dedup.identical_signature_groups(signatures)
    copies = len(texts) - len({frozenset(shingles(t)) for t in texts})
    assert len(stars) > copies  # some signature twins are not copies: the fallback ran


def test_pair_jaccard_is_the_jaccard_of_the_shingle_sets():
    """Exact verification against `jaccard` of the string sets, on pairs that stress its bookkeeping: shingles
    repeated inside a document, one-shingle documents equal to their neighbour (equal fingerprints on both
    sides of a document boundary), empty and short documents."""
    rng = random.Random(6)
    texts = ["x y z", "x y z", "x y z x y z", "", "hi", "hi", "a b c a b c a b c"]
    texts += [" ".join(rng.choice("abcd") for _ in range(rng.randrange(1, 12))) for _ in range(40)]
    pairs = np.array([(i, j) for i in range(len(texts)) for j in range(i + 1, len(texts))])
    want = [jaccard(shingles(texts[i]), shingles(texts[j])) for i, j in pairs.tolist()]
    assert dedup.pair_jaccard(texts, pairs).tolist() == want
    assert dedup.pair_jaccard(texts, np.empty((0, 2))).tolist() == []


def test_no_duplicates_keeps_everything():
    texts = ["one two three four", "five six seven eight", "nine ten eleven twelve", ""]
    for verify in ("exact", "estimate"):
        assert near_duplicates(texts, verify=verify) == [] and dedup_indices(
            texts, verify=verify
        ) == [0, 1, 2, 3]
    assert near_duplicates(["only one document here"]) == []
    assert [a.tolist() for a in dedup.shingle_fingerprints([])] == [[], [0]]
    assert [a.tolist() for a in dedup.word_hashes([])] == [[], []]


def test_near_duplicates_and_dedup_against_exact_jaccard():
    rng = random.Random(5)
    vocab = [f"word{i}" for i in range(2000)]
    base = [[rng.choice(vocab) for _ in range(120)] for _ in range(40)]
    texts = [" ".join(words) for words in base]
    for src in (4, 4, 9, 30):  # near copies: 3 words replaced each
        words = list(base[src])
        for pos in rng.sample(range(120), 3):
            words[pos] = rng.choice(vocab)
        texts.append(" ".join(words))
    sets = [shingles(t) for t in texts]
    truth = brute_force_clusters(sets, 0.5)
    clusters = near_duplicates(texts, threshold=0.5)
    assert clusters == truth == [[4, 40, 41], [9, 42], [30, 43]]
    assert near_duplicates(texts, threshold=0.5, verify="estimate", num_perm=256) == clusters
    pairs, similarity = dedup.near_duplicate_pairs(texts, threshold=0.05, bands=64, rows=2)
    assert len(pairs) >= 4
    for (i, j), value in zip(
        pairs.tolist(), similarity.tolist()
    ):  # fingerprint Jaccard == string Jaccard
        assert value == jaccard(sets[i], sets[j])
    assert dedup_indices(texts) == [i for i in range(len(texts)) if i not in (40, 41, 42, 43)]


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: near_duplicates(["a b c"], num_perm=128, bands=30), "not divisible"),
        (lambda: near_duplicates(["a b c"], num_perm=128, bands=16, rows=4), "must equal num_perm"),
        (lambda: near_duplicates(["a b c"], threshold=0.0), "strictly between 0 and 1"),
        (lambda: near_duplicates(["a b c"], threshold=1.5), "strictly between 0 and 1"),
        (lambda: near_duplicates(["a b c"], threshold="0.5"), "strictly between 0 and 1"),
        (lambda: near_duplicates(["a b c"], n=0), "n must be an integer >= 1"),
        (lambda: near_duplicates([]), "empty document list"),
        (lambda: near_duplicates(["ok", b"bytes"]), "document 1 is bytes"),
        (lambda: near_duplicates("just one string"), "not a single string"),
        (lambda: near_duplicates(["a"], verify="maybe"), "verify must be"),
        (lambda: MinHasher(0), r"num_perm must be an integer in \[1, 8192\]"),
        (
            lambda: MinHasher(10**8),
            r"num_perm must be an integer in \[1, 8192\]",
        ),  # 745 GiB of hash block
        (lambda: MinHasher(8).signatures([{"a"}, set()]), "document 1 has no shingles"),
        (lambda: lsh_candidates(np.zeros((3, 8), np.uint64), 3, 3), "must equal num_perm"),
        (lambda: shingles("a", n=1.5), "n must be an integer"),
    ],
)
def test_bad_inputs_raise_one_clear_error(call, message):
    with pytest.raises(DedupError, match=message):
        call()


# ---------------------------------------------------------------- the experiment and the command line


def test_planted_copies_are_seeded_near_duplicates():
    rng = random.Random(1)
    docs = [" ".join(f"v{rng.randrange(5000)}" for _ in range(150)) for _ in range(50)]
    corpus, pairs = dedup_experiment.plant_near_duplicates(docs, copies=20, seed=3)
    again, same_pairs = dedup_experiment.plant_near_duplicates(docs, copies=20, seed=3)
    assert corpus == again and pairs == same_pairs and len(corpus) == 70 and len(pairs) == 20
    for i, j in pairs:
        assert corpus[j] != corpus[i] and j >= 50
        edits = abs(len(corpus[j].split()) - 150)
        assert edits <= 8 and 0.5 < jaccard(shingles(corpus[i]), shingles(corpus[j])) < 0.97


def test_wikitext_paragraphs_skip_headings_and_short_lines():
    long = " ".join(["word"] * 100)
    lines = [
        " = Heading = ",
        "",
        "short line",
        " = = Sub = = ",
        long + " a",
        "x " * 99,
        long + " b",
        long,
    ]
    assert dedup_command.wikitext_paragraphs(lines, count=2) == [long + " a", long + " b"]


def test_experiment_meets_the_acceptance_numbers(shared_data, tmp_path):
    path = shared_data / "wikitext-2-raw" / "wiki.valid.raw"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    out = tmp_path / "result.json"
    dedup_command.main(
        [
            "experiment",
            "--data",
            str(path),
            "--out",
            str(out),
            "--settings",
            "128:32:4,128:16:8,64:16:4",
        ]
    )
    result = json.loads(out.read_text())
    assert result["documents"] == 600 and result["planted_pairs"] == 100
    assert result["brute_force"]["pairs"] == 179_700 and len(result["settings"]) == 3
    main_setting = result["settings"][0]
    assert (main_setting["num_perm"], main_setting["bands"], main_setting["rows"]) == (128, 32, 4)
    assert main_setting["mae_jaccard_above_0.1"] < 0.05
    assert main_setting["recall"] >= 0.9 and main_setting["false_positives"] <= 5
    assert main_setting["pairs_compared"] < 179_700 / 100
    # 16 x 8 puts its threshold near 0.71, above the weakest planted copies: it may only lose recall.
    assert result["settings"][1]["recall"] <= main_setting["recall"]


def test_demo_prints_the_worked_numbers(capsys):
    dedup_command.main(["demo"])
    text = capsys.readouterr().out
    for expected in (
        "3/7 = 0.43",
        "Jaccard = 0.14",
        "= 0.044",
        "| 0.5 | 0.87 | 0.06 |",
        "| 0.2 | 0.05 |",
        "32 x 4 -> 0.42, 16 x 8 -> 0.71",
        "32 x 4",
    ):
        assert expected in text


def test_run_deduplicates_jsonl_and_text(tmp_path, capsys):
    base = (
        "the quick brown fox jumps over the lazy dog while the cat sleeps on a warm mat by the door"
    )
    near = base.replace("warm", "soft")
    other = "completely different words about compilers and parsers and the grammar of programming languages"
    lines = [json.dumps({"id": i, "text": t}) for i, t in enumerate([base, other, near, base])]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    dedup_command.main(
        ["run", "--input", str(tmp_path / "in.jsonl"), "--out", str(tmp_path / "out.jsonl")]
    )
    assert (tmp_path / "out.jsonl").read_text().splitlines() == lines[:2]
    assert "4 documents, 1 clusters, removed 2, kept 2" in capsys.readouterr().out
    (tmp_path / "in.txt").write_text(
        f"{base}\nsecond line\n\n{other}\n\n{near}\nsecond line\n"
    )  # blank-separated
    dedup_command.main(
        ["run", "--input", str(tmp_path / "in.txt"), "--out", str(tmp_path / "out.txt")]
    )
    assert (tmp_path / "out.txt").read_text() == f"{base}\nsecond line\n\n{other}\n"
    (tmp_path / "lines.txt").write_text(f"{base}\n{other}\n{near}\n")
    dedup_command.main(
        [
            "run",
            "--input",
            str(tmp_path / "lines.txt"),
            str(tmp_path / "in.jsonl"),
            "--out",
            str(tmp_path / "both.txt"),
        ]
    )
    assert (tmp_path / "both.txt").read_text() == f"{base}\n{other}\n"
    # Only "\n" ends a JSON line: U+2028 may sit raw inside a JSON string.
    (tmp_path / "sep.jsonl").write_text(
        json.dumps({"text": "a\u2028b " + other}, ensure_ascii=False) + "\n"
    )
    dedup_command.main(
        ["run", "--input", str(tmp_path / "sep.jsonl"), "--out", str(tmp_path / "sep_out.jsonl")]
    )
    assert json.loads((tmp_path / "sep_out.jsonl").read_text())["text"] == "a\u2028b " + other


def test_run_writes_its_output_with_the_umask_modes(tmp_path):
    """The kept documents are for others to read: 0644 under umask 022 (a bare mkstemp would leave 0600)."""
    (tmp_path / "in.txt").write_text("one document here\nanother one there\n")
    old = os.umask(0o022)
    try:
        dedup_command.main(
            ["run", "--input", str(tmp_path / "in.txt"), "--out", str(tmp_path / "out.txt")]
        )
    finally:
        os.umask(old)
    assert oct((tmp_path / "out.txt").stat().st_mode & 0o777) == "0o644"


@pytest.mark.parametrize(
    "content, args, message",
    [
        (None, [], "does not exist"),
        (b"\x89PNG\x00\x00binary", [], "not a text file"),
        (b"caf\xe9 latin-1", [], "not UTF-8"),
        (b'{"text": "ok"}\n{broken\n', [], "in.jsonl:2: not valid JSON"),
        (
            b'{"text": "ok"}\n' + b"[" * 5000 + b"\n",
            [],
            "in.jsonl:2: JSON nested more than 1,000 levels",
        ),
        (b'{"body": "no text field"}\n', [], "no string field 'text'"),
        (b"\n\n", [], "no documents found"),
        (b'{"text": "a b c"}\n', ["--bands", "30"], "not divisible"),
    ],
)
def test_run_bad_inputs_exit_2_with_one_line_and_no_output(
    tmp_path, capsys, content, args, message
):
    path = tmp_path / "in.jsonl"
    if content is not None:
        path.write_bytes(content)
    out = tmp_path / "out.jsonl"
    out.write_text("previous result\n")
    with pytest.raises(SystemExit) as exit_info:
        dedup_command.main(["run", "--input", str(path), "--out", str(out), *args])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err and err.count("\n") == 1
    assert out.read_text() == "previous result\n" and sorted(
        p.name for p in tmp_path.iterdir()
    ) == sorted(["out.jsonl"] + (["in.jsonl"] if content is not None else []))


def test_cli_help_and_exit_code_as_a_script(tmp_path):
    for args in (["--help"], ["run", "--help"], ["experiment", "--help"], ["demo", "--help"]):
        assert (
            subprocess.run(
                [sys.executable, "dedup.py", *args], cwd=ROOT, capture_output=True
            ).returncode
            == 0
        )
    bad = subprocess.run(
        [
            sys.executable,
            "dedup.py",
            "experiment",
            "--data",
            str(tmp_path / "missing.raw"),
            "--out",
            str(tmp_path / "r.json"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and bad.stderr.count("\n") == 1
    assert not (tmp_path / "r.json").exists()
    settings = subprocess.run(
        [sys.executable, "dedup.py", "experiment", "--settings", "128:32"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert settings.returncode == 2 and "k:bands:rows" in settings.stderr


def test_experiment_bad_data_is_one_clear_error(tmp_path, capsys):
    small = tmp_path / "small.raw"
    small.write_text(" = Title = \n" + " ".join(["word"] * 120) + "\n")
    cases = [
        (["--data", str(small)], "has only 1 paragraphs of 100+ words, need 500"),
        (["--data", str(small), "--settings", "128:30:4"], "must equal num_perm=128"),
    ]
    try:
        import datasets  # noqa: F401
    except ImportError:
        cases.append((["--data", "hf"], "needs the `datasets` package"))
    for args, message in cases:
        with pytest.raises(SystemExit) as exit_info:
            dedup_command.main(["experiment", "--out", str(tmp_path / "r.json"), *args])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and message in err and err.count("\n") == 1
    assert not (tmp_path / "r.json").exists()
