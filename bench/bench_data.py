"""Benchmark prepare at scale: data_at_scale.py's streaming engine on ~30 MB, 300 MB and 1 GB of web-like text, and
data.py's in-memory engine (the reference, what prepare did before streaming) beside it at the size it can handle.

With --peers before --peer-rev REV, the pipeline of that git revision (data.py, bpe.py, dedup.py as they were: e.g. the last commit
before the streaming engine) runs too, as "before".

The corpus (.jsonl, one document per line) is recombined from the real text in ../shared/data (WikiText, C4,
FineWeb, Wikipedia, TinyStories, Shakespeare): each document is 3-8 lines of 2-4 sentences drawn from ~90,000
distinct sentences, a fifth of them end with one of a few site footers (boilerplate), and each starts with a tag
word qzx<id>. A planted share (5%) are near copies of an earlier document: 2% of the words replaced, so the Jaccard
of 3-word shingles is ~0.88, with their own tag. After prepare, the shards are decoded and the tags counted: a
planted pair is found when exactly one of its two tags survives. Recall is over the pairs whose exact Jaccard is
>= 0.8 and whose two documents both pass the quality filters (checked when the corpus is made).

Each run is a fresh process; reported: wall seconds, MB/s (input bytes / wall), CPU seconds per MB (the process
and its workers: steadier than wall time on a shared machine), peak RSS of the main process and of the largest
worker, the funnel's near-duplicate count and the recall. Then CPU seconds per MB of input for each step of the
funnel (`step_costs`): the cleaning steps timed in this process (one core, on the corpus's first --steps-mb MB,
each step on what the one before it kept, with the streaming engine's functions), the tokenizer, tokenize
(encode) and pack (shards) steps from the run's own clock. On a loaded machine these, not wall time, say whether
a step got cheaper. The main process's peak is its own VmHWM (Linux), which
starts afresh at exec: getrusage's ru_maxrss would keep the peak of this benchmark process, which grows as it
decodes shards. A worker's (ru_maxrss of the children) counts the pages it shares with the main process it was
forked from.

    python bench/bench_data.py                                  # 30, 300, 1000 MB + the in-memory peer at 30 MB
    python bench/bench_data.py --sizes 3 --peer-mb 3            # a smoke run (~1 minute)
    python bench/bench_data.py --sizes 0.2 --peer-mb 0.2        # the test suite's run (seconds)
    python bench/bench_data.py --sizes --peers before --peer-rev f90028c   # the pipeline before streaming, 30 MB
    python bench/bench_data.py --sizes 30 --peers --workers 1 2            # the stream on 1 core, then on 2
    python bench/bench_data.py --sizes 30 --peers                           # issue 47's figures: 30 MB, per step

Needs ../shared/data. Corpora and outputs go to --work (default /tmp/bench_data), reused across runs.
"""

import json
import os
import pathlib
import random
import re
import shutil
import subprocess
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import classify  # noqa: E402
import data  # noqa: E402
import dedup  # noqa: E402
from machinery import cleaning, data_at_scale  # noqa: E402
from bench_dedup import DATA, sentence_pool  # noqa: E402
from benchcli import Parser, in_range  # noqa: E402

COPY_SHARE, COPY_RATE, FOOTER_SHARE = 0.05, 0.02, 0.2
FOOTERS = [
    "Subscribe to our newsletter to get the latest stories delivered to your inbox.",
    "All rights reserved. Reproduction without written permission is prohibited.",
    "Share this article with your friends on social media and leave a comment below.",
    "This site uses cookies to improve your experience. By continuing you accept them.",
    "Click here to read more articles like this one from our editors.",
]


def make_document(rng: random.Random, pool: list[str], tag: int) -> str:
    lines = [
        " ".join(rng.choice(pool) for _ in range(rng.randint(2, 4)))
        for _ in range(rng.randint(3, 8))
    ]
    lines[0] = f"qzx{tag} {lines[0]}"
    if rng.random() < FOOTER_SHARE:
        lines.append(rng.choice(FOOTERS))
    return "\n".join(lines)


def near_copy(rng: random.Random, text: str, tag: int, vocabulary: list[str]) -> str:
    """The text with its tag replaced and COPY_RATE of its other words replaced (line breaks kept)."""
    lines = [line.split(" ") for line in text.split("\n")]
    lines[0][0] = f"qzx{tag}"
    for li, words in enumerate(lines):
        for wi in range(1 if li == 0 else 0, len(words)):
            if rng.random() < COPY_RATE:
                words[wi] = rng.choice(vocabulary)
    return "\n".join(" ".join(words) for words in lines)


def build_corpus(path: pathlib.Path, megabytes: float, pool: list[str], seed: int = 0) -> dict:
    """Write the corpus; return its size and the planted pairs eligible for recall ((original tag, copy tag))."""
    meta = path.with_suffix(".json")
    if path.exists() and meta.exists():
        return json.loads(meta.read_text())
    rng = random.Random(seed)
    vocabulary = sorted({w for s in rng.sample(pool, 2000) for w in s.split()})
    target, size, tag, pending, eligible, planted = megabytes * 1e6, 0, 0, [], [], 0
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        while size < target:
            if pending and rng.random() < COPY_SHARE / (1 - COPY_SHARE) * 2 and rng.random() < 0.5:
                original_tag, original = pending.pop(rng.randrange(len(pending)))
                text = near_copy(rng, original, tag, vocabulary)
                planted += 1
                similar = dedup.pair_jaccard([original, text], np.array([[0, 1]]))[0] >= 0.8
                if (
                    similar
                    and data.gopher_rejection(original) is None
                    and data.gopher_rejection(text) is None
                ):
                    eligible.append((original_tag, tag))
            else:
                text = make_document(rng, pool, tag)
                if rng.random() < COPY_SHARE / (1 - COPY_SHARE):
                    pending.append((tag, text))
            line = json.dumps({"text": text}) + "\n"
            f.write(line)
            size += len(line.encode("utf-8"))
            tag += 1
    os.replace(tmp, path)
    info = {"bytes": size, "documents": tag, "planted": planted, "eligible": eligible}
    meta.write_text(json.dumps(info))
    return info


RUN = """
import json, resource, sys, time
def own_peak_kib():
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
sys.path.insert(0, {root!r})
import data, {module}
start = time.perf_counter()
out = {module}.prepare([{corpus!r}], {out!r}{options})
wall = time.perf_counter() - start
m = data.load_manifest(out)
print(json.dumps({{"wall": wall, "cpu": m["timings"]["total_cpu_s"], "timings": m["timings"], "funnel": m["funnel"],
                  "rss_main": own_peak_kib() / 1024,
                  "rss_worker": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}}))
"""


def as_html(text: str) -> str:
    """A web page around a document: one <p> per line, with a title, a script, a menu and a footer to drop."""
    body = "".join(f"<p>{line}</p>" for line in text.split("\n"))
    return (
        "<html><head><title>A page</title><script>var seen = 1;</script></head><body>"
        f"<nav>Home | About | Contact</nav><article>{body}</article><footer>(c) 2024</footer></body></html>"
    )


def step_costs(corpus: pathlib.Path, megabytes: float) -> dict[str, float]:
    """CPU seconds per MB of input of each cleaning step, timed here on one core over the corpus's first
    `megabytes`, every step on what the step before it kept (the streaming engine's stage_read, then
    stage_clean). HTML extraction runs on each document made a page (`as_html`) and the classifiers on the
    documents the Gopher rules kept: neither is in the default run (per MB of its own input)."""
    lines = []
    with open(corpus, encoding="utf-8") as f:
        size = 0
        for line in f:
            if size >= megabytes * 1e6:
                break
            lines.append(line)
            size += len(line.encode("utf-8"))
    costs, mb = {}, size / 1e6

    def timed(name: str, work, per_mb: float = mb):
        start = time.process_time()
        result = work()
        costs[name] = (time.process_time() - start) / per_mb
        return result

    docs = timed("read", lambda: [json.loads(line)["text"] for line in lines])
    pages = [as_html(d) for d in docs]
    timed("HTML*", lambda: [data.html_to_text(p) for p in pages], sum(map(len, pages)) / 1e6)
    rule = cleaning.quality_rule("prose", data.CleanSettings())[1]
    kept = timed("Gopher", lambda: [d for d in docs if rule(d) is None])
    language, quality = classify.default_model("language"), classify.default_model("quality")
    timed("language*", lambda: [language.predict(d) for d in kept])
    timed("quality*", lambda: [quality.probabilities(d) for d in kept])
    hashes = timed("exact dedup", lambda: [data.document_hash(d) for d in kept])
    kept = [kept[i] for i in np.unique(hashes, return_index=True)[1].tolist()]

    def boilerplate() -> list[str]:
        line_hashes = [[data_at_scale.line_hash(x) for x in data.countable_lines(d)] for d in kept]
        flat = np.array([h for hashes in line_hashes for h in hashes], dtype=np.uint64)
        values, counts = np.unique(flat, return_counts=True)
        lines = values[counts >= 3]  # in 3 documents (the distinct lines of each)
        marked = [
            bool(data_at_scale._in_sorted(np.array(h, np.uint64), lines).any()) for h in line_hashes
        ]
        texts = data_at_scale._remove_boilerplate(kept, lines, marked)[0]
        return [t for t in texts if t.strip()]

    texts = timed("boilerplate", boilerplate)
    texts = timed("PII", lambda: [data.mask_pii(t)[0] for t in texts])
    timed("document keys", lambda: [data.document_keys(t, 0) for t in texts])
    hasher = dedup.MinHasher(data.NEAR_DUP_NUM_PERM, seed=0)
    bands, rows = dedup.resolve_bands_rows(0.5, data.NEAR_DUP_NUM_PERM, None, None)
    timed(
        "MinHash",
        lambda: data_at_scale._band_keys(
            hasher.signatures_from_texts(texts, data.NEAR_DUP_SHINGLE), bands, rows
        ),
    )
    return costs


def checkout(revision: str, directory: pathlib.Path) -> pathlib.Path:
    """data.py, bpe.py and dedup.py as they were at a git revision (the pipeline before streaming, say)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("data.py", "bpe.py", "dedup.py"):
        source = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{revision}:{name}"], capture_output=True
        )
        if source.returncode:
            raise SystemExit(
                f"--peer-rev {revision}: git show {revision}:{name} failed: {source.stderr.decode()}"
            )
        (directory / name).write_bytes(source.stdout)
    return directory


def run_prepare(
    corpus: pathlib.Path,
    out: pathlib.Path,
    engine: str,
    code: pathlib.Path = ROOT,
    workers: int = 0,
) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    # machinery/dataset.py runs the reference (in-memory) engine; revisions before the split, data.py
    module = {
        "streaming": "machinery.data_at_scale",
        "in-memory": "machinery.dataset",
        "before": "data",
    }[engine]
    options = f", workers={workers}" if workers and engine != "in-memory" else ""
    script = RUN.format(
        root=str(code), corpus=str(corpus), out=str(out), options=options, module=module
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"prepare failed on {corpus}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def surviving_tags(out: pathlib.Path) -> dict[int, int]:
    """How many times each tag occurs in the decoded shards (train documents are read once: no weights)."""
    tokens = data.TokenData(out)
    encoding = tokens.tokenizer.to_tiktoken()
    counts: dict[int, int] = {}
    for shards in tokens.shards.values():
        for shard in shards:
            cuts = np.flatnonzero(np.asarray(shard) == tokens.eot_id).tolist() + [len(shard)]
            for a in range(0, len(cuts) - 1, 20_000):  # ~20,000 documents per decode
                text = encoding.decode(
                    np.asarray(shard[cuts[a] : cuts[min(a + 20_000, len(cuts) - 1)]]).tolist()
                )
                for tag in re.findall(r"\bqzx(\d+)\b", text):
                    counts[int(tag)] = counts.get(int(tag), 0) + 1
    return counts


def recall(info: dict, out: pathlib.Path) -> float:
    counts = surviving_tags(out)
    found = sum((counts.get(a, 0) > 0) != (counts.get(b, 0) > 0) for a, b in info["eligible"])
    return found / max(1, len(info["eligible"]))


def main(argv: list[str] | None = None) -> None:
    parser = Parser(description=__doc__.split("\n\n")[0])
    megabytes = in_range(float, 0.01, 100_000)
    parser.add_argument(
        "--sizes",
        type=megabytes,
        nargs="*",
        default=[30, 300, 1000],
        help="corpus sizes in MB for the streaming engine",
    )
    parser.add_argument("--peer-mb", type=megabytes, default=30, help="corpus size for the peers")
    parser.add_argument(
        "--peers",
        nargs="*",
        choices=["in-memory", "before"],
        default=["in-memory"],
        help="in-memory: this data.py's reference engine; before: the pipeline of --peer-rev",
    )
    parser.add_argument(
        "--peer-rev",
        default=None,
        help="a git revision for the 'before' peer (e.g. the commit before the streaming engine)",
    )
    parser.add_argument(
        "--workers",
        type=in_range(int, 0, 1024),
        nargs="*",
        default=[0],
        help="worker processes of the streaming runs, one run per count (0, the default: all cores)",
    )
    parser.add_argument(
        "--steps-mb",
        type=in_range(float, 0, 100_000),
        default=30,
        help="MB of each corpus whose cleaning steps are timed one by one (0: none)",
    )
    parser.add_argument("--work", default="/tmp/bench_data", help="where corpora and outputs go")
    args = parser.parse_args(argv)
    if "before" in args.peers and not args.peer_rev:
        parser.error("argument --peers: before needs --peer-rev REV")
    if not DATA.is_dir():
        raise SystemExit(f"needs the shared corpora at {DATA} (set SHARED_DATA)")
    work = pathlib.Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    pool = sentence_pool(DATA)
    print(
        f"sentence pool: {len(pool):,} sentences; machine: {os.cpu_count()} cores, load average "
        f"{os.getloadavg()[0]:.1f} at the start"
    )
    runs = [(args.peer_mb, peer, 0) for peer in args.peers] + [
        (mb, "streaming", workers) for mb in args.sizes for workers in args.workers
    ]
    header = (
        f"{'corpus':>8} {'engine':<10} {'docs':>9} {'wall s':>8} {'MB/s':>6} {'CPU s/MB':>8} "
        f"{'RSS main':>9} {'RSS worker':>10} {'near dups':>9} {'recall':>7}"
    )
    rows, steps = [], {}
    for mb, engine, workers in runs:
        t0 = time.perf_counter()
        corpus = work / f"corpus-{mb:g}MB.jsonl"
        info = build_corpus(corpus, mb, pool)
        print(
            f"corpus {corpus.name}: {info['bytes'] / 1e6:,.1f} MB, {info['documents']:,} documents, "
            f"{info['planted']:,} planted copies ({len(info['eligible']):,} with J >= 0.8 that pass the filters), "
            f"made in {time.perf_counter() - t0:.0f}s",
            flush=True,
        )
        out = work / f"out-{mb:g}MB-{engine}"
        code = (
            checkout(args.peer_rev, work / f"code-{args.peer_rev}") if engine == "before" else ROOT
        )
        result = run_prepare(corpus, out, engine, code, workers)
        engine = f"stream x{workers}" if workers else engine  # the row names its worker count
        near = next(
            (
                s["reasons"].get("near_duplicate", 0)
                for s in result["funnel"]
                if s["name"].startswith("near dedup")
            ),
            0,
        )
        mb_in = info["bytes"] / 1e6
        row = (
            f"{mb_in:>6.1f}MB {engine:<10} {info['documents']:>9,} "
            f"{result['wall']:>8.1f} {mb_in / result['wall']:>6.2f} {result['cpu'] / mb_in:>8.2f} "
            f"{result['rss_main']:>7.0f}MB {result['rss_worker']:>8.0f}MB {near:>9,} {recall(info, out):>7.3f}"
        )
        rows.append(row)
        phases = ", ".join(
            f"{name} {result['timings'][name + '_s']:.1f}/{result['timings'][name + '_cpu_s']:.1f}s"
            for name in ("clean", "joins", "tokenizer", "encode", "shards")
            if name + "_s" in result["timings"]
        )
        print(header + "\n" + row + f"\n    phases (wall/CPU): {phases}", flush=True)
        shutil.rmtree(out, ignore_errors=True)
        if args.steps_mb and mb not in steps:
            steps[mb] = step_costs(corpus, args.steps_mb)
        # tokenizer (training), tokenize and pack: the run's clock, over the whole corpus
        run_steps = {
            step: result["timings"].get(f"{name}_cpu_s", 0) / mb_in
            for step, name in (
                ("tokenizer", "tokenizer"),
                ("tokenize", "encode"),
                ("pack", "shards"),
            )
        }
        costs = {**steps.get(mb, {}), **run_steps}
        print(
            "    CPU s/MB by step: "
            + ", ".join(f"{name} {value:.3f}" for name, value in costs.items())
            + " (* not in the default run; the cleaning steps on this process's one core over "
            f"{min(mb, args.steps_mb):g} MB, the others from the run)",
            flush=True,
        )
    print(
        f"\nload average {os.getloadavg()[0]:.1f} at the end (2 cores shared: wall figures are load-dependent)"
    )
    print(header + "\n" + "\n".join(rows))


if __name__ == "__main__":
    main()
