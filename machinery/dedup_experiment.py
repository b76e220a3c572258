"""dedup_experiment.py: the lecture's required exercise (dedup.py's, not a chapter): plant near
copies of WikiText-2 paragraphs, then measure MinHash + LSH against brute-force Jaccard for several
(num_perm, bands, rows) settings: recall, false positives, the estimate's error, pairs compared and
time. `python dedup.py experiment` prints `run_experiment`'s JSON; bench/bench_dedup.py and
sweep.py's dedup sweep plant their copies with `plant_near_duplicates` / `make_near_copy`.

Depends on dedup.py, numpy and the standard library.
"""

from __future__ import annotations

import random
import re
import time

import numpy as np

import dedup

DEFAULT_SETTINGS = ((64, 16, 4), (128, 32, 4), (128, 16, 8), (128, 64, 2), (256, 64, 4))


def make_near_copy(text: str, rng: random.Random, rate: float, vocabulary: list[str]) -> str:
    """A copy of `text` with round(rate · words) edits (at least one), each a random replace,
    delete or insert of one word at a random position; new words come from `vocabulary`.

    >>> make_near_copy("a b c d e f g h i j", random.Random(0), 0.2, ["X", "Y"])
    'a b c d Y f h i j'
    """
    words = text.split()
    for _ in range(max(1, round(rate * len(words)))):
        action = rng.choice(("replace", "delete", "insert"))
        position = rng.randrange(len(words))
        if action == "replace":
            words[position] = rng.choice(vocabulary)
        elif action == "delete" and len(words) > 1:
            del words[position]
        else:
            words.insert(position, rng.choice(vocabulary))
    return " ".join(words)


def plant_near_duplicates(
    documents: list[str], copies: int = 100, rate_range=(0.02, 0.05), seed: int = 0
) -> tuple[list[str], set[tuple[int, int]]]:
    """documents + one near copy of `copies` randomly chosen documents (appended), and the true
    pairs (original index, copy index). Each copy gets its own edit rate drawn uniformly from
    `rate_range`; inserted and replacing words come from the documents' own words (punctuation
    tokens left out: they are no edit)."""
    rng = random.Random(seed)
    vocabulary = sorted({w for doc in documents for w in doc.split() if re.search(r"\w", w)})
    chosen = sorted(rng.sample(range(len(documents)), copies))
    corpus, pairs = list(documents), set()
    for source in chosen:
        pairs.add((source, len(corpus)))
        corpus.append(make_near_copy(documents[source], rng, rng.uniform(*rate_range), vocabulary))
    return corpus, pairs


def brute_force_jaccard(shingle_sets: list[set[str]]) -> tuple[np.ndarray, np.ndarray]:
    """Exact Jaccard of every pair i < j: (pairs (N(N-1)/2, 2), jaccard (N(N-1)/2,)). 600 documents:
    179,700."""
    num_docs = len(shingle_sets)
    i, j = np.triu_indices(num_docs, k=1)
    sizes = [len(s) for s in shingle_sets]
    values = np.empty(len(i))
    for p, (a, b) in enumerate(zip(i.tolist(), j.tolist())):
        common = len(shingle_sets[a] & shingle_sets[b])
        values[p] = common / (sizes[a] + sizes[b] - common)
    return np.stack([i, j], axis=1).astype(np.int64), values


def measure_setting(
    documents: list[str],
    planted: set[tuple[int, int]],
    exact_of: dict[tuple[int, int], float],
    setting: tuple[int, int, int],
    threshold: float = 0.5,
    n: int = 3,
    seed: int = 0,
    verify: str = "estimate",
) -> dict:
    """One row of the experiment: MinHash + LSH + verification with setting = (k, bands, rows),
    timed, and scored against `exact_of`, the exact Jaccard of every pair i < j (brute force)."""
    k, bands, rows = setting
    start = time.perf_counter()
    signatures = dedup.MinHasher(k, seed).signatures_from_texts(documents, n)
    candidates = dedup.candidate_pairs(signatures, bands, rows)
    if verify == "exact":
        similarity = dedup.pair_jaccard(documents, candidates, n)
    else:
        similarity = dedup.pair_estimates(signatures, candidates)
    found = set(map(tuple, candidates[similarity >= threshold].tolist()))
    seconds = time.perf_counter() - start
    # the estimate's error only where there is something to estimate: pairs with J > 0.1
    similar = [pair for pair, j in exact_of.items() if j > 0.1]
    estimates = dedup.pair_estimates(signatures, np.array(similar))
    errors = np.abs(estimates - np.array([exact_of[pair] for pair in similar]))
    planted_mean = float(np.mean([exact_of[pair] for pair in planted]))
    false_pairs = found - planted
    return {
        "num_perm": k,
        "bands": bands,
        "rows": rows,
        "lsh_threshold": round(dedup.lsh_threshold(bands, rows), 4),
        "p_candidate_at_threshold": round(dedup.candidate_probability(threshold, bands, rows), 4),
        "mae_jaccard_above_0.1": round(float(np.mean(errors)), 4),
        "standard_error_at_planted_mean": round(dedup.standard_error(planted_mean, k), 4),
        "recall": len(found & planted) / len(planted),
        "false_positives": len(false_pairs),
        "false_positives_exact_below_threshold": sum(exact_of[p] < threshold for p in false_pairs),
        "pairs_compared": len(candidates),
        "fraction_of_brute_force": round(len(candidates) / len(exact_of), 5),
        "seconds": round(seconds, 3),
    }


def run_experiment(
    documents: list[str],
    planted: set[tuple[int, int]],
    settings=DEFAULT_SETTINGS,
    threshold: float = 0.5,
    n: int = 3,
    seed: int = 0,
    verify: str = "estimate",
) -> dict:
    """Brute force vs MinHash + LSH for each (k, bands, rows) of `settings`: a JSON-ready dict, one
    `measure_setting` row per setting."""
    dedup.check_threshold(threshold)
    if verify not in ("exact", "estimate"):
        raise dedup.DedupError(f"verify must be 'exact' or 'estimate', got {verify!r}")
    for k, bands, rows in settings:
        dedup.resolve_bands_rows(threshold, k, bands, rows)
    start = time.perf_counter()
    all_pairs, exact = brute_force_jaccard([dedup.shingles(doc, n) for doc in documents])
    brute_seconds = time.perf_counter() - start
    exact_of = dict(zip(map(tuple, all_pairs.tolist()), exact.tolist()))
    planted_j = [exact_of[pair] for pair in planted]
    return {
        "documents": len(documents),
        "planted_pairs": len(planted),
        "threshold": threshold,
        "shingle_n": n,
        "verify": verify,
        "seed": seed,
        "brute_force": {
            "pairs": len(exact),
            "seconds": round(brute_seconds, 3),
            "pairs_jaccard_above_0.1": int((exact > 0.1).sum()),
            "pairs_jaccard_at_least_threshold": int((exact >= threshold).sum()),
        },
        "planted_jaccard": {
            "min": round(min(planted_j), 4),
            "mean": round(float(np.mean(planted_j)), 4),
            "max": round(max(planted_j), 4),
        },
        "settings": [
            measure_setting(documents, planted, exact_of, setting, threshold, n, seed, verify)
            for setting in settings
        ],
    }
