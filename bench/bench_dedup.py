"""Benchmark dedup.py side by side with datasketch (MinHash + MinHashLSH), in one run, on the same documents.

1. Side by side: N documents built from the shared corpora with planted near-duplicates (default 10,000 = 9,000
   originals + 1,000 copies with 2-5% of words edited). Both pipelines start from the raw texts and end with
   verified pairs at threshold 0.5, k = 128, 3-word shingles (the same `dedup.shingles` feed datasketch):
     ours        dedup.near_duplicate_pairs (signatures -> LSH by sorting bands -> exact-Jaccard verification)
     datasketch  shingles -> MinHash.bulk -> MinHashLSH(threshold=0.5).insert -> query -> MinHash.jaccard >= 0.5
   Reported: signatures per second and end-to-end seconds, wall and CPU (best of --repeats, runs interleaved so
   machine load hits both alike; on a shared machine CPU time is the steadier figure), ours' CPU seconds per
   phase (shingle fingerprints, MinHash minima, LSH candidates, exact Jaccard), recall of the planted pairs (both
   documents in one cluster of the reported pairs), false positives (reported pairs whose exact Jaccard is below
   0.5).
2. Natural near-duplicates: C4's first 1,000 documents + ExLlamaV2's 118-document C4 sample (which re-crawls some
   of the same pages), 5-word shingles, checked against brute-force exact Jaccard of all 624,403 pairs.
3. Scale: 100,000 documents (90,000 + 10,000 planted copies) end to end with ours alone, in a fresh process:
   seconds and peak resident memory during the dedup (the process's VmHWM, reset after the texts are built).

    python bench/bench_dedup.py                       # all three, ~2-4 minutes on 2 busy cores
    python bench/bench_dedup.py --docs 2000 --big-docs 0 --repeats 1      # quick look
    python bench/bench_dedup.py --docs 200 --big-docs 200 --repeats 1 --skip-c4   # the tests'

Needs ../shared/data (the corpora) and the datasketch package (requirements-test.txt installs
it; not in requirements.txt).
"""

import argparse
import json
import os
import pathlib
import random
import re
import subprocess
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import dedup  # noqa: E402
from benchcli import Parser, in_range  # noqa: E402
from machinery import dedup_experiment, dedup_files  # noqa: E402
from machinery.cli import writable  # noqa: E402

DATA = pathlib.Path(os.environ.get("SHARED_DATA", ROOT.parent / "shared" / "data"))
THRESHOLD, NUM_PERM, SHINGLE = 0.5, 128, 3
MIN_DOCS = 20


# ---------------------------------------------------------------- corpora


def sentence_pool(data: pathlib.Path) -> list[str]:
    """Distinct sentences (6-60 words) from all the shared prose corpora, in a fixed order."""
    texts = []
    for name in ("wiki.valid.raw", "wiki.test.raw"):
        texts += [
            line
            for line in (data / "wikitext-2-raw" / name).read_text().splitlines()
            if line.strip() and not line.strip().startswith("=")
        ]
    texts += (
        (data / "tinystories" / "TinyStories-train-head-2MiB.txt")
        .read_text()
        .split("<|endoftext|>")
    )
    for path in (
        data / "c4-sample" / "c4-en-train-00000-first1000.jsonl",
        data / "fineweb-sample" / "fineweb-10BT-legalprefilter-500.jsonl",
    ):
        texts += [
            json.loads(line)["text"] for line in path.read_text().splitlines() if line.strip()
        ]
    texts += re.sub(
        r"<[^>]+>", " ", (data / "wikipedia-sample" / "exllamav2-wiki.utf8").read_text()
    ).split("\n")
    texts += (data / "tinyshakespeare" / "input.txt").read_text().split("\n\n")
    sentences = {}
    for text in texts:
        for sentence in re.split(r"(?<=[.!?])\s+", " ".join(text.split())):
            if 6 <= len(sentence.split()) <= 60:
                sentences[sentence] = None
    return list(sentences)


def build_corpus(pool: list[str], num_docs: int, copy_fraction: float = 0.1, seed: int = 0):
    """num_docs documents: originals made of random pool sentences (60-200 words each), then near copies of a
    random `copy_fraction` of them (2-5% of words replaced, deleted or inserted). Returns (texts, planted pairs)."""
    rng = random.Random(seed)
    num_copies = int(num_docs * copy_fraction)
    originals = []
    for _ in range(num_docs - num_copies):
        target, words, parts = rng.randint(60, 200), 0, []
        while words < target:
            parts.append(rng.choice(pool))
            words += parts[-1].count(" ") + 1
        originals.append(" ".join(parts))
    return dedup_experiment.plant_near_duplicates(originals, copies=num_copies, seed=seed + 1)


# ---------------------------------------------------------------- the two pipelines


def ours(texts, n=SHINGLE, verify="exact"):
    pairs, _ = dedup.near_duplicate_pairs(texts, THRESHOLD, NUM_PERM, n=n, verify=verify)
    return set(map(tuple, pairs.tolist()))


def datasketch_pairs(texts, n=SHINGLE):
    from datasketch import MinHash, MinHashLSH  # main() checks that it is installed

    minhashes = MinHash.bulk(
        [[s.encode("utf-8") for s in dedup.shingles(t, n)] for t in texts], num_perm=NUM_PERM
    )
    lsh = MinHashLSH(threshold=THRESHOLD, num_perm=NUM_PERM)
    for i, m in enumerate(minhashes):
        lsh.insert(i, m)
    pairs = set()
    for i, m in enumerate(minhashes):
        for j in lsh.query(m):
            if j > i and m.jaccard(minhashes[j]) >= THRESHOLD:
                pairs.add((i, j))
    return pairs


def ours_signatures(texts):
    return dedup.MinHasher(NUM_PERM, 0).signatures_from_texts(texts, SHINGLE)


def datasketch_signatures(texts):
    from datasketch import MinHash

    return MinHash.bulk(
        [[s.encode("utf-8") for s in dedup.shingles(t, SHINGLE)] for t in texts], num_perm=NUM_PERM
    )


def best_times(functions: dict, texts, repeats: int) -> tuple[dict, dict, dict]:
    """Best wall time and best CPU time (this process, all threads) of each function over `repeats` interleaved
    rounds, and each one's last result. On a shared machine the CPU time is the steadier figure."""
    wall, cpu, results = (
        {name: float("inf") for name in functions},
        {name: float("inf") for name in functions},
        {},
    )
    for _ in range(repeats):
        for name, function in functions.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            results[name] = function(texts)
            wall[name] = min(wall[name], time.perf_counter() - start)
            cpu[name] = min(cpu[name], time.process_time() - start_cpu)
    return wall, cpu, results


def ours_phases(texts, repeats: int) -> dict:
    """Best CPU seconds of each phase of ours over `repeats` rounds, each phase fed the previous one's output:
    where the end-to-end time goes (the rest: collapsing exact copies, input checks, sorting the pairs)."""
    hasher = dedup.MinHasher(NUM_PERM, 0)
    bands, rows = dedup.choose_bands_rows(THRESHOLD, NUM_PERM)
    best = {}
    for _ in range(repeats):
        timings = []
        start = time.process_time()
        values, offsets = dedup.shingle_fingerprints(texts, SHINGLE)
        timings.append(("shingle fingerprints", time.process_time() - start))
        start = time.process_time()
        signatures = hasher.signatures_from_hashes(values >> np.uint64(32), offsets)
        timings.append(("MinHash minima", time.process_time() - start))
        start = time.process_time()
        candidates = dedup.candidate_pairs(signatures, bands, rows)
        timings.append(("LSH candidates", time.process_time() - start))
        start = time.process_time()
        dedup.pair_jaccard(texts, candidates, SHINGLE)
        timings.append(("exact Jaccard", time.process_time() - start))
        for name, seconds in timings:
            best[name] = round(min(best.get(name, float("inf")), seconds), 3)
    return best


def connected(pairs: set, num_docs: int) -> dedup.UnionFind:
    """Union-find over reported pairs: a true pair counts as found when its documents end up in one cluster
    (ours lists one pair per extra exact copy, not every pair of copies; the clusters are the same)."""
    union_find = dedup.UnionFind(num_docs)
    for i, j in pairs:
        union_find.union(i, j)
    return union_find


def score(pairs: set, planted: set, texts, n=SHINGLE) -> dict:
    """Recall of planted pairs (same cluster); false positives = reported pairs with exact Jaccard below the
    threshold; other true pairs = reported pairs that were not planted but have Jaccard >= threshold."""
    sets = {}
    below = 0
    for i, j in pairs:
        for d in (i, j):
            if d not in sets:
                sets[d] = dedup.shingles(texts[d], n)
        below += dedup.jaccard(sets[i], sets[j]) < THRESHOLD
    clusters = connected(pairs, len(texts))
    found = sum(clusters.find(i) == clusters.find(j) for i, j in planted)
    return {
        "pairs": len(pairs),
        "recall": round(found / len(planted), 4),
        "false_positives": below,
        "other_true_pairs": len(pairs - planted) - below,
    }


# ---------------------------------------------------------------- 1. side by side


def side_by_side(num_docs: int, repeats: int, seed: int) -> dict:
    texts, planted = build_corpus(sentence_pool(DATA), num_docs, seed=seed)
    shingle_count = int(np.diff(dedup.shingle_fingerprints(texts, SHINGLE)[1]).sum())
    sig_wall, sig_cpu, _ = best_times(
        {"ours": ours_signatures, "datasketch": datasketch_signatures}, texts, repeats
    )
    e2e_wall, e2e_cpu, found = best_times(
        {
            "ours": ours,
            "ours (verify=estimate)": lambda t: ours(t, verify="estimate"),
            "datasketch": datasketch_pairs,
        },
        texts,
        repeats,
    )
    phases = ours_phases(texts, repeats)
    rows = {}
    for name in e2e_wall:
        rows[name] = {
            "end_to_end_s": round(e2e_wall[name], 3),
            "end_to_end_cpu_s": round(e2e_cpu[name], 3),
            **score(found[name], planted, texts),
        }
        if name in sig_wall:
            rows[name]["signatures_per_s"] = round(num_docs / sig_wall[name])
            rows[name]["signatures_per_cpu_s"] = round(num_docs / sig_cpu[name])
    return {
        "documents": num_docs,
        "planted_pairs": len(planted),
        "shingles": shingle_count,
        "repeats": repeats,
        "threshold": THRESHOLD,
        "num_perm": NUM_PERM,
        "shingle_words": SHINGLE,
        "results": rows,
        "ours_phases_cpu_s": phases,
        "load_average": os.getloadavg()[0],
        "speedup_end_to_end": round(e2e_wall["datasketch"] / e2e_wall["ours"], 2),
        "speedup_end_to_end_cpu": round(e2e_cpu["datasketch"] / e2e_cpu["ours"], 2),
        "speedup_signatures": round(sig_wall["datasketch"] / sig_wall["ours"], 2),
        "speedup_signatures_cpu": round(sig_cpu["datasketch"] / sig_cpu["ours"], 2),
    }


# ---------------------------------------------------------------- 2. natural near-duplicates in C4


def natural_c4() -> dict:
    texts = [
        json.loads(line)["text"]
        for line in (DATA / "c4-sample" / "c4-en-train-00000-first1000.jsonl")
        .read_text()
        .splitlines()
        if line.strip()
    ]
    texts += [
        line
        for line in (DATA / "c4-sample" / "exllamav2-c4.utf8").read_text().splitlines()
        if line.strip()
    ]
    start = time.perf_counter()
    all_pairs, exact = dedup_experiment.brute_force_jaccard([dedup.shingles(t, 5) for t in texts])
    brute_s = time.perf_counter() - start
    truth = set(map(tuple, all_pairs[exact >= THRESHOLD].tolist()))
    out = {
        "documents": len(texts),
        "brute_force_pairs": len(exact),
        "brute_force_s": round(brute_s, 2),
        "true_pairs_jaccard_at_least_0.5": len(truth),
    }
    for name, function in (
        ("ours", lambda t: ours(t, n=5)),
        ("datasketch", lambda t: datasketch_pairs(t, n=5)),
    ):
        start = time.perf_counter()
        found = function(texts)
        clusters = connected(found, len(texts))
        recall = sum(clusters.find(i) == clusters.find(j) for i, j in truth) / len(truth)
        out[name] = {
            "seconds": round(time.perf_counter() - start, 3),
            "found": len(found),
            "recall": round(recall, 4),
            "false_positives": len(found - truth),
        }
    return out


# ---------------------------------------------------------------- 3. scale, in a fresh process


def _memory_kib(field: str) -> int:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def big_child(num_docs: int, seed: int) -> dict:
    """Runs in its own process: build the corpus, reset the peak-RSS counter, dedup, report."""
    texts, planted = build_corpus(sentence_pool(DATA), num_docs, seed=seed)
    rss_texts = _memory_kib("VmRSS")
    pathlib.Path("/proc/self/clear_refs").write_text(
        "5"
    )  # reset VmHWM (peak RSS) to the current RSS
    start, start_cpu = time.perf_counter(), time.process_time()
    pairs, _ = dedup.near_duplicate_pairs(texts, THRESHOLD, NUM_PERM, n=SHINGLE)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - start_cpu
    found = set(map(tuple, pairs.tolist()))
    clusters = connected(found, num_docs)
    recall = sum(clusters.find(i) == clusters.find(j) for i, j in planted) / len(planted)
    return {
        "documents": num_docs,
        "planted_pairs": len(planted),
        "seconds": round(seconds, 2),
        "cpu_seconds": round(cpu_seconds, 2),
        "load_average": os.getloadavg()[0],
        "docs_per_s": round(num_docs / seconds),
        "rss_before_mib": round(rss_texts / 1024, 1),
        "peak_rss_mib": round(_memory_kib("VmHWM") / 1024, 1),
        "recall": round(recall, 4),
        "pairs": len(found),
        "cpus": os.cpu_count(),
    }


def scale(num_docs: int, seed: int) -> dict:
    child = subprocess.run(
        [sys.executable, __file__, "--child-big", str(num_docs), "--seed", str(seed)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(child.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- report


def report(result: dict) -> str:
    lines = []
    side = result.get("side_by_side")
    if side:
        lines += [
            f"Side by side: {side['documents']:,} documents ({side['planted_pairs']:,} planted pairs, "
            f"{side['shingles']:,} shingles), k={side['num_perm']}, threshold {side['threshold']}, "
            f"best of {side['repeats']}",
            "",
            "| pipeline | signatures/s (wall / CPU) | end to end s (wall / CPU) | recall | false positives "
            "| pairs reported |",
            "|---|---|---|---|---|---|",
        ]
        for name, row in side["results"].items():
            rate = (
                f"{row['signatures_per_s']:,} / {row['signatures_per_cpu_s']:,}"
                if "signatures_per_s" in row
                else "-"
            )
            lines.append(
                f"| {name} | {rate} | {row['end_to_end_s']:.2f} / {row['end_to_end_cpu_s']:.2f} "
                f"| {row['recall']:.3f} | {row['false_positives']} | {row['pairs']:,} |"
            )
        lines += [
            "",
            f"ours vs datasketch: {side['speedup_end_to_end']}x faster end to end "
            f"({side['speedup_end_to_end_cpu']}x in CPU time), {side['speedup_signatures']}x signatures/s "
            f"({side['speedup_signatures_cpu']}x in CPU time); load average {side['load_average']:.1f}",
            "ours by phase, CPU s (best of the rounds): "
            + ", ".join(
                f"{name} {seconds:.3f}" for name, seconds in side["ours_phases_cpu_s"].items()
            ),
            "",
        ]
    c4 = result.get("natural_c4")
    if c4:
        lines += [
            f"C4 natural near-duplicates: {c4['documents']} documents, 5-word shingles, "
            f"{c4['true_pairs_jaccard_at_least_0.5']} pairs with exact Jaccard >= 0.5 among "
            f"{c4['brute_force_pairs']:,} (brute force {c4['brute_force_s']} s)",
            "",
            "| pipeline | seconds | found | recall | false positives |",
            "|---|---|---|---|---|",
        ]
        for name in ("ours", "datasketch"):
            row = c4[name]
            lines.append(
                f"| {name} | {row['seconds']:.2f} | {row['found']} | {row['recall']:.3f} "
                f"| {row['false_positives']} |"
            )
        lines.append("")
    big = result.get("scale")
    if big:
        lines += [
            f"Scale: {big['documents']:,} documents ({big['planted_pairs']:,} planted), ours, one process on "
            f"a {big['cpus']}-core machine: {big['seconds']} s end to end ({big['docs_per_s']:,} docs/s; "
            f"{big['cpu_seconds']} s of CPU, load average {big['load_average']:.1f}), "
            f"peak RSS {big['peak_rss_mib']} MiB (texts alone {big['rss_before_mib']} MiB), "
            f"recall {big['recall']:.3f}"
        ]
    return "\n".join(lines)


def main(argv=None):
    parser = Parser(description=__doc__.split("\n")[0])
    docs = in_range(int, 0, 10_000_000)
    parser.add_argument(
        "--docs",
        type=docs,
        default=10_000,
        help="documents side by side, 0 to skip (default: %(default)s)",
    )
    parser.add_argument(
        "--big-docs", type=docs, default=100_000, help="documents for the scale run, 0 to skip"
    )
    parser.add_argument(
        "--repeats",
        type=in_range(int, 1, 1000),
        default=3,
        help="interleaved rounds, best time kept",
    )
    parser.add_argument("--seed", type=in_range(int, 0), default=0)
    parser.add_argument(
        "--skip-c4", action="store_true", help="skip the natural C4 near-duplicate check"
    )
    # checked now (a path under a file, a directory), not after minutes of work
    parser.add_argument(
        "--out",
        type=writable("file"),
        default=str(ROOT / "out" / "bench_dedup.json"),
        help="the JSON of every figure (default: %(default)s)",
    )
    parser.add_argument("--child-big", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for flag, value in (("--docs", args.docs), ("--big-docs", args.big_docs)):
        if 0 < value < MIN_DOCS:  # a tenth are planted copies: fewer plant none
            parser.error(f"argument {flag}: 0 (skip) or at least {MIN_DOCS} documents, got {value}")
    if args.child_big:
        print(json.dumps(big_child(args.child_big, args.seed)))
        return
    if not DATA.is_dir():
        sys.exit(f"error: shared corpora not found at {DATA} (set SHARED_DATA)")
    try:
        import datasketch  # noqa: F401  the peer of sections 1 and 2
    except ImportError:
        sys.exit(
            "error: the peer needs datasketch: pip install datasketch (or pip install -r "
            "requirements-test.txt)"
        )
    result = {}
    if args.docs:
        result["side_by_side"] = side_by_side(args.docs, args.repeats, args.seed)
    if not args.skip_c4:
        result["natural_c4"] = natural_c4()
    if args.big_docs:
        result["scale"] = scale(args.big_docs, args.seed)
    print(report(result))
    try:
        dedup_files.write_atomic(args.out, json.dumps(result, indent=2) + "\n")
    except dedup.DedupError as e:  # a full disk, or a folder made read-only meanwhile
        print(f"{parser.prog}: error: --out {e}", file=sys.stderr)
        return 2
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
