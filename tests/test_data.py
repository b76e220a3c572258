"""Tests for data.py: sources, HTML extraction, quality filters, dedup steps, PII masks, mixing, the split, shards,
prepare (funnel, cache, encoding against the tokenizer) and the loader (determinism, ranks, resume).

Hand-made corpora keep this file fast; the one test over the full embedded corpus is marked slow."""

import collections
import gzip
import itertools
import json
import pathlib
import random
import re
import shutil
import subprocess
import sys
import tempfile
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import data
from machinery import cleaning
from machinery import data_at_scale
from machinery.commands import data as data_command
from machinery import dataset
import dedup
from machinery import formats
from data import DataError

ROOT = pathlib.Path(__file__).resolve().parent.parent

# ---------------------------------------------------------------------------------------------------------------------
# Hand-made documents
# ---------------------------------------------------------------------------------------------------------------------

GOOD_PROSE = (
    "The lobster is a species of clawed crustacean that lives on the rocky floor of the eastern Atlantic Ocean. "
    "It grows slowly, moulting many times during a long life, and adults may reach a length of sixty centimetres. "
    "Fishermen catch it with baited pots that are lowered to the seabed and hauled back a day later. "
    "Although the animal looks blue while alive, it becomes bright red when cooked, because heat breaks apart "
    "a protein that hides the red pigment in its shell. Conservation rules limit the size of lobsters that may "
    "be landed, and some regions release young animals raised in hatcheries to support the wild population."
)

WORDS = (
    "river stone garden window paper market winter summer bridge forest letter village doctor teacher "
    "engine castle silver orange planet island mountain harbor library journey science history ocean "
    "kitchen station morning evening lantern blanket painter pocket ladder needle button carpet rabbit "
    "thunder meadow valley shadow mirror candle basket hammer violin feather marble copper saddle"
).split()


def random_doc(rng: random.Random, n_words: int = 80) -> str:
    """An English-looking document that passes the Gopher rules (stop words, no repeated n-grams)."""
    words = []
    for _ in range(n_words // 4):
        words += [
            rng.choice(("the", "and", "with", "of")),
            rng.choice(WORDS),
            rng.choice(WORDS),
            rng.choice(WORDS),
        ]
    return " ".join(words) + "."


def near_copy(rng: random.Random, doc: str, rate: float = 0.03) -> str:
    """Replace about `rate` of the words (J of 3-word shingles stays well above 0.5)."""
    words = doc.split()
    for i in rng.sample(range(len(words)), max(1, int(rate * len(words)))):
        words[i] = rng.choice(WORDS)
    return " ".join(words)


def shingle_set(text: str, n: int = 3) -> set:
    w = text.split()
    return {tuple(w[i : i + n]) for i in range(len(w) - n + 1)}


def exact_jaccard(a: str, b: str) -> float:
    sa, sb = shingle_set(a), shingle_set(b)
    return len(sa & sb) / len(sa | sb) if sa | sb else 0.0


# ---------------------------------------------------------------------------------------------------------------------
# Sources
# ---------------------------------------------------------------------------------------------------------------------


def test_module_docstrings_walks_classes_and_functions():
    source = (
        '"""Mod doc."""\nclass A:\n    """A doc."""\n    def f(self):\n        """F doc."""\n'
        'def g():\n    pass\nasync def h():\n    """H doc."""\n'
    )
    assert (
        formats.module_docstrings(source, "m")
        == "m\nMod doc.\n\nm.A\nA doc.\n\nm.A.f\nF doc.\n\nm.h\nH doc."
    )
    assert formats.module_docstrings("def (:", "broken") == ""


def test_pydocs_is_stable_prose_with_topics():
    first = list(itertools.islice(formats.read_pydocs(), 5))
    assert first == list(itertools.islice(formats.read_pydocs(), 5))  # stable order
    assert all(isinstance(d, str) and d for d in first)
    docs = list(formats.read_pydocs())
    size = sum(len(d.encode()) for d in docs)
    assert 1.0e6 < size < 6e6, size  # "about 2 MB" on any CPython 3.x
    assert not any(d.startswith("test.") for d in docs)  # tests are skipped
    from pydoc_data.topics import topics

    assert docs[-len(topics) :] == [topics[k].strip() for k in sorted(topics)]


def test_pystdlib_documents_are_python_files():
    docs = list(itertools.islice(formats.read_pystdlib(), 20))
    assert len(docs) == 20
    import ast

    for d in docs:
        ast.parse(d)
    assert formats.open_source("pystdlib").kind == "code"


def test_split_plain_text_modes():
    assert formats.split_plain_text("a\n\nb\n \nc") == ["a", "b", "c"]
    assert formats.split_plain_text("a\n\nb<|endoftext|>c") == ["a\n\nb", "c"]
    assert formats.split_plain_text("a\n\nb", "file") == ["a\n\nb"]
    with pytest.raises(DataError, match="txt split"):
        formats.split_plain_text("a", "lines")


def test_local_files_txt_jsonl_gz_and_directories(tmp_path):
    (tmp_path / "b.txt").write_text("one\n\ntwo\n")
    (tmp_path / "a.jsonl").write_text(
        json.dumps({"text": "alpha"}) + "\n\n" + json.dumps({"text": "beta"}) + "\n"
    )
    with gzip.open(tmp_path / "c.jsonl.gz", "wt") as f:
        f.write(json.dumps({"body": "x", "text": "gamma"}) + "\n")
    (tmp_path / "notes.bin").write_bytes(b"\x00\x01")  # not a known type: ignored in a dir
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "info.txt").write_text("hidden")  # hidden folders are skipped
    docs = list(formats.open_source(str(tmp_path)).documents())
    assert docs == ["alpha", "beta", "one", "two", "gamma"]  # files in sorted path order
    assert list(
        formats.open_source(str(tmp_path / "c.jsonl.gz"), text_field="body").documents()
    ) == ["x"]
    assert list(formats.open_source(str(tmp_path / "b.txt"), max_documents=1).documents()) == [
        "one"
    ]


def test_kinds_from_file_types_and_overrides(tmp_path):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "a.py").write_text("x = 1\n")
    (tmp_path / "code" / "b.py").write_text("y = 2\n")
    source = formats.open_source(str(tmp_path / "code"))
    assert source.kind == "code" and list(source.documents()) == ["x = 1\n", "y = 2\n"]
    (tmp_path / "code" / "page.html").write_text("<p>hi</p>")
    with pytest.raises(DataError, match="mixes code and html"):
        formats.open_source(str(tmp_path / "code"))
    assert formats.open_source(str(tmp_path / "code"), kind="code").kind == "code"
    assert formats.open_source("pydocs", kind="code").kind == "code"
    with pytest.raises(DataError, match="unknown source kind"):
        formats.open_source("pydocs", kind="poetry")


def test_malformed_jsonl_names_the_line_or_skips_and_counts(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(
        b'{"text": "ok"}\n{"text": broken\n{"other": 1}\n{"text": "caf\xe9"}\n[1]\n{"text": "fine"}\n'
    )
    with pytest.raises(DataError, match=r"bad.jsonl:2: "):
        list(formats.open_source(str(path)).documents())
    stats = formats.JsonlStats()
    docs = list(formats.open_source(str(path), skip_bad_lines=True, jsonl_stats=stats).documents())
    assert docs == ["ok", "fine"] and stats.skipped == 4
    path.write_bytes(b'{"text": "ok"}\n\n{"text": "caf\xe9"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:3: not UTF-8 text \(byte 13\); fix the line"):
        list(formats.open_source(str(path)).documents())


@pytest.mark.parametrize(
    "line, message",
    [
        (
            b"[" * 5000 + b"]" * 5000,
            r"bad.jsonl:2: JSON nested more than 1,000 levels deep.*fix the line, or pass "
            r"--skip-bad-lines",
        ),  # json.loads: RecursionError
        (b'{"a": ' * 3000 + b"1" + b"}" * 3000, "bad.jsonl:2: JSON nested more than 1,000"),
        (
            b'{"body": "x", "id": 3}',
            r"bad.jsonl:2: no string field 'text' \(its keys: body, id\); pass --text-field",
        ),
        (b'{"text": 3}', r"no string field 'text' \(its keys: text\); pass --text-field"),
        (
            b'["text"]',
            r"bad.jsonl:2: an array, not an object with a string field 'text'; fix the line",
        ),
        (b"null", "bad.jsonl:2: null, not an object"),
        (
            b"1" * 5000,
            r"bad.jsonl:2: not valid JSON \(Exceeds the limit",
        ),  # int's 4,300-digit string limit
    ],
)
def test_each_kind_of_bad_jsonl_line_is_named_with_its_fix(tmp_path, line, message):
    """What is wrong with the line decides the fix: a line that is not JSON needs fixing, an object without the
    field needs --text-field. A line nested thousands deep is a bad line like any other (skipped and counted with
    --skip-bad-lines), not a RecursionError."""
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"text": "ok"}\n' + line + b'\n{"text": "fine"}\n')
    with pytest.raises(DataError, match=message) as raised:
        list(formats.open_source(str(path)).documents())
    assert "\n" not in str(raised.value) and len(str(raised.value)) < 400
    stats = formats.JsonlStats()
    assert list(
        formats.open_source(str(path), skip_bad_lines=True, jsonl_stats=stats).documents()
    ) == ["ok", "fine"]
    assert stats.skipped == 1


def test_bad_paths_and_files(tmp_path):
    with pytest.raises(DataError, match="not found"):
        formats.open_source(str(tmp_path / "missing.txt"))
    with pytest.raises(DataError, match="not found"):
        formats.open_source("no-such-corpus")
    (tmp_path / "blob.txt").write_bytes(b"PK\x03\x04\x00\x00binary")
    with pytest.raises(DataError, match="binary"):
        list(formats.open_source(str(tmp_path / "blob.txt")).documents())
    (tmp_path / "latin.txt").write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(DataError, match="not UTF-8"):
        list(formats.open_source(str(tmp_path / "latin.txt")).documents())
    (tmp_path / "cut.jsonl.gz").write_bytes(gzip.compress(b'{"text": "a"}\n' * 100)[:40])
    with pytest.raises(DataError, match="damaged gzip"):
        list(formats.open_source(str(tmp_path / "cut.jsonl.gz")).documents())
    (tmp_path / "cut.txt.gz").write_bytes(b"not gzip at all")
    with pytest.raises(DataError, match="damaged gzip"):
        list(formats.open_source(str(tmp_path / "cut.txt.gz")).documents())
    (tmp_path / "x.docx").write_text("x")
    with pytest.raises(DataError, match="unknown file type"):
        formats.open_source(str(tmp_path / "x.docx"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="holds no"):
        formats.open_source(str(tmp_path / "empty"))


def test_parquet_source(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(
        pa.table({"text": ["first doc", "second doc"], "n": [1, 2]}), tmp_path / "d.parquet"
    )
    assert list(formats.open_source(str(tmp_path / "d.parquet")).documents()) == [
        "first doc",
        "second doc",
    ]


def test_parquet_without_pyarrow_says_how(tmp_path, monkeypatch):
    (tmp_path / "d.parquet").write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(DataError, match="pip install pyarrow"):
        list(formats.open_source(str(tmp_path / "d.parquet")).documents())


def test_hf_source_offline_error_names_alternatives(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # as on a machine without `datasets`
    source = formats.open_source("hf:wikitext-2")
    with pytest.raises(DataError, match="pip install datasets.*pydocs"):
        list(source.documents())


def test_hf_source_resolves_aliases_and_regroups_wikitext(monkeypatch):
    """With a stand-in `datasets` (no network here): what data.py asks for and how it reads the rows."""
    calls = []

    def load_dataset(repo, config, split, streaming):
        calls.append((repo, config, split, streaming))
        if repo == "nobody/missing":
            raise FileNotFoundError(
                "Dataset 'nobody/missing' doesn't exist on the Hub\nmore detail"
            )
        if repo == "Salesforce/wikitext":
            return [
                {"text": line}
                for line in [
                    " = Lobster = \n",
                    " \n",
                    " Lobsters moult . \n",
                    " = Crab = \n",
                    " \n",
                    " Crabs walk . \n",
                ]
            ]
        return [{"text": "story one"}, {"text": "story two"}, {"text": "story three"}]

    monkeypatch.setitem(sys.modules, "datasets", type(sys)("datasets"))
    monkeypatch.setattr(sys.modules["datasets"], "load_dataset", load_dataset, raising=False)
    assert list(formats.open_source("hf:wikitext-103").documents()) == [
        "Lobster\n\nLobsters moult .",
        "Crab\n\nCrabs walk .",
    ]
    assert list(formats.open_source("hf:tinystories", max_documents=2).documents()) == [
        "story one",
        "story two",
    ]
    list(formats.open_source("hf:someone/corpus:cfg:validation").documents())
    assert calls == [
        ("Salesforce/wikitext", "wikitext-103-raw-v1", "train", True),
        ("roneneldan/TinyStories", None, "train", True),
        ("someone/corpus", "cfg", "validation", True),
    ]
    with pytest.raises(
        DataError,
        match=r"hf:nobody/missing: could not load it \(FileNotFoundError: Dataset "
        r"'nobody/missing' doesn't exist on the Hub\); offline, use pydocs",
    ):
        list(formats.open_source("hf:nobody/missing").documents())


def test_wikitext_articles_and_paragraphs():
    raw = (
        " \n = Lobster = \n \n Lobsters live in the sea . \n \n = = Biology = = \n \n They moult . \n"
        " = Crab = \n \n Crabs walk sideways . \n"
    )
    assert formats.parse_wikitext(raw) == [
        "Lobster\n\nLobsters live in the sea .\n= = Biology = =\nThey moult .",
        "Crab\n\nCrabs walk sideways .",
    ]
    assert formats.wikitext_paragraphs(raw) == [
        "Lobsters live in the sea .",
        "They moult .",
        "Crabs walk sideways .",
    ]
    assert formats.wikitext_paragraphs(raw, min_words=5) == ["Lobsters live in the sea ."]


def test_wikitext_shared_valid_split(shared_data):
    text = (shared_data / "wikitext-2-raw" / "wiki.valid.raw").read_text(encoding="utf-8")
    articles = formats.parse_wikitext(text)
    assert len(articles) == 60 and articles[0].startswith("Homarus gammarus\n")
    assert (
        len(formats.wikitext_paragraphs(text, min_words=100)) >= 500
    )  # enough for the dedup experiment


# ---------------------------------------------------------------------------------------------------------------------
# HTML to text
# ---------------------------------------------------------------------------------------------------------------------


def test_html_to_text_keeps_paragraphs_and_drops_chrome():
    page = """<html><head><title>T</title><style>p {color: red}</style></head><body>
      <header><h1>Site name</h1></header><nav><a href="/">Home</a> | <a href="/a">About</a></nav>
      <article><h2>Lobsters</h2><p>Lobsters are <b>blue</b>&nbsp;when alive &amp; red
      when cooked.</p><script>var x = "<p>not text</p>";</script><p>They moult.<br>Often.</p>
      <ul><li>claws</li><li>tail</li></ul></article>
      <aside>Related posts</aside><footer>&copy; 2024 Example</footer></body></html>"""
    assert data.html_to_text(page) == (
        "Lobsters\n\nLobsters are blue when alive & red when cooked.\n\n"
        "They moult.\n\nOften.\n\nclaws\n\ntail"
    )


def test_html_source_goes_through_extraction(tmp_path):
    (tmp_path / "page.html").write_text(
        "<nav>menu</nav><p>" + GOOD_PROSE + "</p><footer>foot</footer>"
    )
    docs, _, funnel = cleaning.clean(
        [formats.open_source(str(tmp_path / "page.html"))], data.CleanSettings(near_dup_threshold=0)
    )
    assert docs == [GOOD_PROSE]
    assert [s.name for s in funnel.steps][:3] == [
        "read page.html",
        "extract text (page.html)",
        "quality filters (gopher, page.html)",
    ]


# ---------------------------------------------------------------------------------------------------------------------
# Quality filters: one hand-made document per named reason
# ---------------------------------------------------------------------------------------------------------------------


def test_good_prose_passes_gopher():
    assert data.gopher_rejection(GOOD_PROSE) is None
    assert data.gopher_rejection(random_doc(random.Random(0))) is None


@pytest.mark.parametrize(
    "reason, text",
    [
        ("too_few_words", "The lobster is blue and it lives in the sea."),
        ("too_many_words", GOOD_PROSE),  # with max_words=50 below
        ("mean_word_length", " ".join(["a an to of it is be"] * 10) + " the and with"),
        ("mean_word_length", " ".join(f"internationalisation{i}" for i in range(60)) + " the and"),
        ("symbol_ratio", GOOD_PROSE + "".join(f" #tag{i}" for i in range(15))),
        ("bullet_lines", "\n".join(f"- the item {i} and more words with text" for i in range(12))),
        (
            "ellipsis_lines",
            "\n".join(
                f"The story number {i} of the night with a twist and then..." for i in range(10)
            ),
        ),
        ("alphabetic_words", GOOD_PROSE + " " + " ".join(str(i) for i in range(40))),
        ("stop_words", " ".join(random.Random(1).choices(WORDS, k=80))),
        (
            "duplicate_lines",
            GOOD_PROSE + "\n" + "\n".join(["Click here to subscribe to our newsletter"] * 5),
        ),
        (
            "duplicate_paragraphs",
            GOOD_PROSE.replace(". ", ".\n") + "\n\nBuy now and save.\n\nBuy now and save.",
        ),
        ("top_2gram", GOOD_PROSE + " " + " ".join(["lobster lobster"] * 20)),
        (
            "duplicate_5grams",
            GOOD_PROSE + " " + GOOD_PROSE.split(".")[0] + " " + GOOD_PROSE.split(".")[1],
        ),
    ],
)
def test_each_gopher_rule_has_a_named_reason(reason, text):
    max_words = 50 if reason == "too_many_words" else 100_000
    assert data.gopher_rejection(text, max_words=max_words) == reason


def test_letter_and_stop_word_rules_match_their_per_word_definitions():
    """alphabetic_words (one regex pass over the text, then the words with no ASCII letter checked for any
    letter) and stop_words (the words as they are first) against the plain per-word definitions, on texts of
    digits, symbols, accented and CJK words, capitalised stop words and Unicode spaces (str.split's)."""
    tokens = [
        "42",
        "½",
        "²",
        "é",
        "中文",
        "3rd",
        "x",
        "(c)",
        "::",
        "Ǆ",
        "the",
        "The",
        "OF",
        "of,",
        "and",
    ]
    spaces = [" ", " ", "\t", "\u3000", "\xa0", "\x1c", "\u2028"]
    rng = random.Random(4)
    for _ in range(400):
        text = "".join(rng.choice(tokens) + rng.choice(spaces) for _ in range(rng.randint(1, 40)))
        words, punctuation = text.split(), data._PUNCTUATION
        lettered = sum(any(c.isalpha() for c in w) for w in words)
        # "zh": no word-count or word-length rule; the tokens make no symbol, bullet or ellipsis line
        reason = data._word_rejection(text, words, [text.strip()], 50, 10**6, True, "zh")
        assert (reason == "alphabetic_words") == (lettered < 0.8 * len(words)), text
        stops = data.GOPHER_STOP_WORDS.intersection(w.lower().strip(punctuation) for w in words)
        english = data._word_rejection(text, words, [text.strip()], 0, 10**6, True, "en")
        if reason is None and english != "mean_word_length":
            assert (english == "stop_words") == (len(stops) < 2), text


def test_pii_needs_never_skip_a_match(monkeypatch):
    """PII_NEEDS (what a pattern cannot match without) only spares the slow patterns: with every need met,
    every text is masked the same, on texts strung from the pieces of emails, addresses and phone numbers."""
    pieces = (
        "bob@example.com|ann@my-site.org|a@b|x@y.z|@-@|1.2.3.4|10.0.0.1|v1.2.3.4|1.2.3.4.5|(555) 123-4567|"
        "555.123.4567|+1 555 123 4567|+44 20 7946 0958|2023-01-15|555-1234|+1|٣٣٣-٣٣٣٣|@|.|-| |\n|7|1234"
    ).split("|")
    rng = random.Random(6)
    texts = ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 12))) for _ in range(3000)]
    masked = [data.mask_pii(t) for t in texts]
    monkeypatch.setattr(data, "PII_NEEDS", {label: [re.compile("")] for label in data.PII_NEEDS})
    assert [data.mask_pii(t) for t in texts] == masked
    assert sum(m != t for (m, _), t in zip(masked, texts)) > 1000  # most texts hold one


def test_ngram_fractions_match_counting_word_tuples():
    """The numpy n-gram ids against the plain definition (dicts of word tuples), on repetitive random texts."""

    def top(words, n, total):
        counts = collections.Counter(zip(*(words[i:] for i in range(n))))
        gram, count = counts.most_common(1)[0] if counts else ((), 0)
        return count * sum(len(w) for w in gram) / total if count > 1 else 0.0

    def duplicated(words, n, total):
        first, covered = {}, [False] * len(words)
        for i, gram in enumerate(zip(*(words[j:] for j in range(n)))):
            j = first.setdefault(gram, i)
            if j != i:
                covered[i : i + n] = covered[j : j + n] = [True] * n
        return sum(len(w) for w, c in zip(words, covered) if c) / total

    rng = random.Random(0)
    for _ in range(300):
        words = [
            rng.choice(["a", "bb", "the", "ccc", "dddd"][: rng.randint(1, 5)])
            for _ in range(rng.randint(0, 60))
        ]
        ngrams, total = data.NGrams(words), max(1, sum(map(len, words)))
        for n in range(1, 11):
            assert data._top_ngram_fraction(ngrams, n, total) == pytest.approx(
                top(words, n, total), abs=1e-12
            )
            assert data._duplicate_ngram_fraction(ngrams, n, total) == pytest.approx(
                duplicated(words, n, total), abs=1e-12
            )


HANDOUT_CASES = [  # CS336 assignment 4's Gopher rules, one hand-made failure each
    ("too_few_words", "The lobster is blue and it lives in the sea."),
    ("too_many_words", " ".join(["lobster"] * 100_001)),
    ("mean_word_length", " ".join(["a an to of it is be"] * 10)),
    ("mean_word_length", " ".join(f"internationalisation{i}" for i in range(60))),
    (
        "ellipsis_lines",
        "\n".join(f"The story number {i} of the night with a twist and then..." for i in range(10)),
    ),
    ("alphabetic_words", GOOD_PROSE + " " + " ".join(str(i) for i in range(40))),
]


@pytest.mark.parametrize("reason, text", HANDOUT_CASES)
def test_gopher_handout_rules_reject_what_the_handout_names(reason, text):
    assert data.gopher_rejection(text, rules="handout") == reason


def test_gopher_handout_rules_are_only_those_four():
    """Documents that break only rules outside the handout pass it, and fail the full set."""
    outside = {
        "stop_words": " ".join(random.Random(1).choices(WORDS, k=80)),
        "symbol_ratio": GOOD_PROSE + "".join(f" #tag{i}" for i in range(15)),
        "bullet_lines": "\n".join(f"- the {WORDS[i]} and more words with text" for i in range(12)),
        "duplicate_lines": GOOD_PROSE
        + "\n"
        + "\n".join(["Click here to subscribe to our newsletter"] * 5),
        "top_2gram": GOOD_PROSE + " " + " ".join(["lobster lobster"] * 20),
    }
    for reason, text in outside.items():
        assert data.gopher_rejection(text) == reason
        assert data.gopher_rejection(text, rules="handout") is None, reason
    boundary = " ".join(["word"] * 49)  # the handout's bounds are inclusive
    assert data.gopher_rejection(boundary, rules="handout") == "too_few_words"
    assert data.gopher_rejection(boundary + " word", rules="handout") is None
    assert (
        data.gopher_rejection(" ".join(["abcdefghij"] * 60), rules="handout") is None
    )  # mean length 10
    assert (
        data.gopher_rejection(" ".join(["abcdefghijk"] * 60), rules="handout") == "mean_word_length"
    )
    with pytest.raises(DataError, match="unknown Gopher rule set"):
        data.gopher_rejection(GOOD_PROSE, rules="cs336")
    name, rule = cleaning.quality_rule("prose", data.CleanSettings(filters="gopher-handout"))
    assert (
        name == "gopher-handout"
        and rule(outside["stop_words"]) is None
        and rule("too short") == "too_few_words"
    )


def test_code_filters():
    good = "def f(x):\n    return x + 1\n\n\nclass A:\n    pass\n"
    assert data.code_rejection(good) is None
    assert data.code_rejection("x = '" + "a" * 1200 + "'\n") == "max_line_length"
    assert data.code_rejection("\n".join(["x = 1  # " + "word " * 30] * 20)) == "mean_line_length"
    assert (
        data.code_rejection("x = [\n" + "(0, 0), (0, 0), [], {},\n" * 20 + "]\n")
        == "alphanumeric_fraction"
    )


# ---------------------------------------------------------------------------------------------------------------------
# Exact dedup, boilerplate lines, PII
# ---------------------------------------------------------------------------------------------------------------------


def test_exact_dedup_ignores_case_and_whitespace_only():
    docs = ["The cat sat.", "the  cat\nsat.", "The cat sat!", "The cat sat."]
    assert data.exact_dedup(docs) == [0, 2]


def test_boilerplate_lines_are_removed_across_documents():
    footer = "Copyright 2024 Example Corp, all rights reserved."
    docs = [f"Story {i} is here with words.\n{footer}\nEnd" for i in range(4)] + [
        "Plain text without footer."
    ]
    lines = data.boilerplate_lines(docs, min_documents=3)
    assert lines == {footer}
    assert data.remove_lines(docs[0], lines) == ("Story 0 is here with words.\nEnd", 1)
    assert data.boilerplate_lines(docs, min_documents=5) == set()
    assert (
        data.boilerplate_lines(["a b\n}\n", "c d\n}\n", "e\n}\n"], min_documents=2) == set()
    )  # short lines stay


def test_line_dedup_counts_occurrences_and_keeps_trailing_newlines():
    docs = ["intro\nsame\nsame\nown line\n", "other\nshared\n", "shared\nlast line without newline"]
    lines = data.repeated_lines(docs)
    assert lines == {"same", "shared"}  # "same" is in one document only, but twice
    assert [data.drop_lines(d, lines) for d in docs] == [
        ("intro\nown line\n", 2),
        ("other\n", 1),
        ("last line without newline", 1),
    ]
    assert data.boilerplate_lines(docs, min_documents=2) == set()  # the other mode: documents
    assert data.drop_lines("only\n", {"only"}) == ("", 1)
    assert data.repeated_lines(["a\n", "a"]) == {"a"}  # the last line's missing newline is no edit


def test_line_dedup_matches_cs336_fixtures(shared_data):
    """CS336 assignment 4's exact line dedup test: five files in, five expected files out, byte for byte."""
    fixtures = shared_data / "cs336" / "a4" / "fixtures"
    if not fixtures.is_dir():
        pytest.skip(f"CS336 fixtures not found at {fixtures}")
    names = sorted(p.name for p in (fixtures / "documents_with_line_duplicates").iterdir())
    docs = [
        (fixtures / "documents_with_line_duplicates" / n).read_text(encoding="utf-8") for n in names
    ]
    lines = data.repeated_lines(docs)
    for name, doc in zip(names, docs):
        expected = (fixtures / "documents_line_deduplicated" / name).read_text(encoding="utf-8")
        assert data.drop_lines(doc, lines)[0] == expected, name


def test_clean_line_dedup_option_counts_occurrences(tmp_path):
    rng = random.Random(3)
    docs = [random_doc(rng) + "\nSign up today for our free weekly letter" for _ in range(2)] + [
        random_doc(rng) + "\nA line written twice here\nA line written twice here" for _ in range(1)
    ]
    source = formats.open_source(str(write_jsonl(tmp_path / "web.jsonl", docs)))
    settings = dict(filters="none", near_dup_threshold=0, mask_pii=False)
    by_documents, _, _ = cleaning.clean([source], data.CleanSettings(**settings))
    assert by_documents == docs  # in 2 documents: under the default 3
    by_occurrences, _, funnel = cleaning.clean(
        [source], data.CleanSettings(line_dedup="occurrences", **settings)
    )
    assert by_occurrences == [
        d.split("\n")[0] + "\n" for d in docs
    ]  # kept lines keep their newline
    assert funnel.steps[-1].reasons["lines_removed"] == 4 and funnel.steps[-1].name.startswith(
        "line dedup"
    )


def test_clean_near_dedup_can_strip_accents(tmp_path):
    rng = random.Random(6)
    doc = random_doc(rng).replace("e", "é").replace("a", "à")  # most words carry an accent
    source = formats.open_source(
        str(write_jsonl(tmp_path / "web.jsonl", [doc, data.dedup.remove_accents(doc)]))
    )
    settings = dict(filters="none", mask_pii=False)
    assert len(cleaning.clean([source], data.CleanSettings(**settings))[0]) == 2
    assert cleaning.clean([source], data.CleanSettings(strip_accents=True, **settings))[0] == [doc]


@pytest.mark.parametrize(
    "text, masked, label",
    [
        ("write to jane.doe+news@mail.example.co.uk today", "write to <EMAIL> today", "EMAIL"),
        ("Call (555) 123-4567 now", "Call <PHONE> now", "PHONE"),
        ("Call 555-123-4567.", "Call <PHONE>.", "PHONE"),
        ("Call 555.123.4567", "Call <PHONE>", "PHONE"),
        ("Call +1 555 123 4567", "Call <PHONE>", "PHONE"),
        ("Call +1-555-123-4567", "Call <PHONE>", "PHONE"),
        ("Call (283)-182-3829 now", "Call <PHONE> now", "PHONE"),  # CS336's format
        ("Call (283) 182 3829 or (283)182-3829", "Call <PHONE> or <PHONE>", "PHONE"),
        ("London +44 20 7946 0958 office", "London <PHONE> office", "PHONE"),
        ("server at 192.168.0.1.", "server at <IP>.", "IP"),
        ("from 8.8.8.8, to 255.255.255.0", "from <IP>, to <IP>", "IP"),
    ],
)
def test_pii_masks(text, masked, label):
    out, counts = data.mask_pii(text)
    assert out == masked and counts == collections.Counter({label: masked.count(f"<{label}>")})


@pytest.mark.parametrize(
    "text",
    [
        "Python 3.11.7 and numpy 1.26.4 and v1.2.3.4 released",
        "Broadcom LAN Driver 14.0.1.0 and Ethernet Driver Ver. 4.23.0.0, version 1.2.3.4, build 10.0.19041.1",
        "on 2023-01-15 and 15/01/2023 and 2023.01.15 at 10:30:00",
        "ISBN 978-3-16-148410-0 and order 1234567890 and 3.14159265",
        "the range 1.2.3.4.5 and 256.1.1.1 and 1.2.3",
        "a@b is not an email, nor is user@localhost",
        "dates 12-31-2024 and 2024-12-31T23:59:59",
    ],
)
def test_pii_leaves_versions_dates_and_numbers_alone(text):
    assert data.mask_pii(text) == (text, collections.Counter())


# ---------------------------------------------------------------------------------------------------------------------
# Mixing and the split
# ---------------------------------------------------------------------------------------------------------------------


def test_mixture_plan_reproduces_the_lecture():
    plan = data.mixture_plan({"web": 70, "code": 15, "books": 10, "math": 5}, 20e9, {"math": 0.5e9})
    assert plan["math"]["tokens"] == pytest.approx(1e9) and plan["math"]["epochs"] == pytest.approx(
        2.0
    )
    assert plan["web"]["tokens"] == pytest.approx(14e9) and plan["web"]["epochs"] is None
    assert sum(p["tokens"] for p in plan.values()) == pytest.approx(20e9)
    with pytest.warns(UserWarning, match="5.0 times"):
        data.mixture_plan({"web": 0.9, "math": 0.1}, 20e9, {"math": 0.4e9})
    with pytest.raises(DataError, match="positive"):
        data.mixture_plan({"web": 1.0, "math": 0.0}, 1e9)


def test_mix_cli_prints_the_lecture_table(capsys):
    assert data_command.main(["mix"]) == 0
    math_row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("math")][0]
    assert math_row.split()[1:] == ["0.05", "1e+09", "5e+08", "2.00"]
    with pytest.raises(SystemExit) as exit_info:
        sys.exit(data_command.main(["mix", "--weights", "web=0.9", "math"]))
    assert exit_info.value.code == 2 and "name=number" in capsys.readouterr().err


def test_partial_epoch_fills_the_budget_with_whole_passes_then_the_lowest_buckets():
    lengths, buckets = np.array([10, 20, 30, 40, 5]), np.array([3, 100, 7, 60000, 8])
    histogram = np.bincount(buckets, weights=lengths, minlength=data.MIX_BUCKETS)
    full, cut = data.partial_epoch(
        250, 105, histogram
    )  # 2 passes, then 40 more tokens: buckets 3 and 7
    assert (full, cut) == (2, 8)
    reads = data.document_reads(full, cut, buckets)
    assert reads.tolist() == [3, 2, 3, 2, 2] and (reads * lengths).sum() >= 250
    assert data.partial_epoch(210, 105, histogram) == (2, 0)
    keys = np.array(
        [data.document_keys(f"doc {i}", seed=0)[2] for i in range(200)], dtype=np.uint64
    )
    buckets = data.mix_bucket(keys)
    histogram = np.bincount(buckets, weights=np.full(200, 10), minlength=data.MIX_BUCKETS)
    reads = data.document_reads(
        *data.partial_epoch(1000, 2000, histogram), buckets
    )  # half an epoch
    assert reads.max() == 1 and 1000 <= 10 * reads.sum() < 1000 + 10 * np.bincount(buckets).max()


def test_split_is_a_per_document_coin_and_never_leaves_a_side_empty():
    keys = np.array(
        [data.document_keys(f"doc {i}", seed=3)[0] for i in range(1000)], dtype=np.uint64
    )
    is_val = data.split_documents(keys, 0.1)
    assert 70 < is_val.sum() < 130
    assert (
        data.split_documents(keys[:500], 0.1) == is_val[:500]
    ).all()  # each decision needs its document
    other = np.array(
        [data.document_keys(f"doc {i}", seed=4)[0] for i in range(1000)], dtype=np.uint64
    )
    assert (data.split_documents(other, 0.1) != is_val).any()
    assert data.split_documents(keys[:2], 0.01).tolist().count(True) == 1
    assert data.split_documents(keys[:2], 0.999).tolist().count(True) == 1
    assert not data.split_documents(keys, 0.0).any()
    with pytest.raises(DataError, match="at least 2"):
        data.split_documents(keys[:1], 0.1)


def test_split_after_near_dedup_leaves_no_near_duplicate_across(tmp_path):
    rng = random.Random(0)
    originals = [random_doc(rng, 120) for _ in range(60)]
    copies = [near_copy(rng, originals[i]) for i in range(0, 60, 4)]
    assert min(exact_jaccard(originals[i * 4], c) for i, c in enumerate(copies)) > 0.6
    path = tmp_path / "docs.jsonl"
    mixed = originals + copies
    rng.shuffle(mixed)
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in mixed))
    docs, _, funnel = cleaning.clean(
        [formats.open_source(str(path))], data.CleanSettings(filters="none")
    )
    assert funnel.steps[-1].name.startswith("near dedup") and funnel.steps[-1].reasons[
        "near_duplicate"
    ] == len(copies)
    is_val = data.split_documents(
        np.array([data.document_keys(d, 0)[0] for d in docs], dtype=np.uint64), 0.3
    )
    train, val = np.flatnonzero(~is_val).tolist(), np.flatnonzero(is_val).tolist()
    worst = max(exact_jaccard(docs[i], docs[j]) for i in train for j in val)
    assert worst < 0.5


# ---------------------------------------------------------------------------------------------------------------------
# Shards
# ---------------------------------------------------------------------------------------------------------------------


def write_shard(path: pathlib.Path, tokens, dtype) -> None:
    """A shard written by hand from data.py's header (a test's dataset; prepare writes through ShardWriter)."""
    dtype = np.dtype(dtype)
    header = data.SHARD_HEADER.pack(
        data.SHARD_MAGIC, data.SHARD_VERSION, dtype.itemsize, len(tokens)
    )
    path.write_bytes(header + np.asarray(tokens).astype(dtype).tobytes())


@pytest.mark.parametrize("dtype, top", [("uint16", 2**16 - 1), ("uint32", 2**32 - 1)])
def test_shard_round_trip(tmp_path, dtype, top):
    tokens = np.array([0, 1, 2, top, 7], dtype=np.int64)
    writer = data.ShardWriter(tmp_path, "s", np.dtype(dtype), shard_tokens=10)
    writer.add(tokens)
    assert writer.close() == [{"file": "s_00000.bin", "tokens": 5}]
    back = data.read_shard(tmp_path / "s_00000.bin")
    assert back.dtype == np.dtype(dtype) and back.tolist() == tokens.tolist()
    assert (tmp_path / "s_00000.bin").stat().st_size == 32 + 5 * np.dtype(dtype).itemsize
    assert [p.name for p in tmp_path.iterdir()] == ["s_00000.bin"]  # no temp file left behind
    write_shard(tmp_path / "e.bin", np.zeros(0, dtype=np.int64), dtype)
    assert len(data.read_shard(tmp_path / "e.bin")) == 0


def test_vocab_sets_the_shard_dtype():
    assert data.dtype_for_vocab(50257) == np.uint16 and data.dtype_for_vocab(100277) == np.uint32
    with pytest.raises(DataError, match="does not fit uint32"):
        data.dtype_for_vocab(2**33)


def test_damaged_shard_headers_are_named(tmp_path):
    path = tmp_path / "s.bin"
    write_shard(path, np.arange(10), "uint16")
    good = path.read_bytes()
    cases = {
        "bad magic": b"NOTTOKS\x00" + good[8:],
        "version": good[:8] + b"\x09" + good[9:],
        "token size": good[:12] + b"\x03" + good[13:],
        "header says 10": good[:-2],
        "shorter than": good[:20],
    }
    for message, damaged in cases.items():
        path.write_bytes(damaged)
        with pytest.raises(DataError, match=message):
            data.read_shard(path)


def test_shard_writer_splits_streams(tmp_path):
    writer = data.ShardWriter(tmp_path, "train", np.dtype("uint16"), shard_tokens=4)
    for doc in ([1, 2, 3], [4, 5], [6, 7, 8, 9, 10]):
        writer.add(np.array(doc, dtype=np.uint16))
    shards = writer.close()
    assert [s["tokens"] for s in shards] == [4, 4, 2]
    assert np.concatenate([data.read_shard(tmp_path / s["file"]) for s in shards]).tolist() == list(
        range(1, 11)
    )


# ---------------------------------------------------------------------------------------------------------------------
# The loader (over a hand-made dataset directory, so it is tested independently of prepare)
# ---------------------------------------------------------------------------------------------------------------------


def make_dataset(
    directory: pathlib.Path, shard_lengths: dict, dtype="uint16", vocab=1000
) -> pathlib.Path:
    """A dataset directory whose split streams are 0, 1, 2, ... modulo vocab, cut into shards."""
    directory.mkdir(parents=True, exist_ok=True)
    splits = {}
    for split, lengths in shard_lengths.items():
        shards, start = [], 0
        for k, n in enumerate(lengths):
            name = f"{split}_{k:05d}.bin"
            write_shard(directory / name, np.arange(start, start + n) % vocab, dtype)
            shards.append({"file": name, "tokens": n})
            start += n
        splits[split] = {"documents": 1, "tokens": start, "bytes": 3 * start, "shards": shards}
    manifest = {
        "tokenizer": {"file": "tokenizer.json", "vocab_size": vocab, "eot_id": vocab - 1},
        "splits": splits,
        "funnel": [],
        "mixture": None,
        "dtype": dtype,
    }
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return directory


def test_get_batch_is_seeded_shifted_and_within_shards(tmp_path):
    td = data.TokenData(
        make_dataset(tmp_path / "d", {"train": [500, 300, 9], "val": [100]}, vocab=10**6)
    )
    x, y = td.get_batch("train", 64, 16, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (64, 16) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1]) and torch.equal(y[:, -1], x[:, -1] + 1)
    assert torch.all(x[:, -1] + 1 < 800)  # windows never cross into shard 3
    assert torch.all((x[:, 0] < 500 - 16) | (x[:, 0] >= 500))  # nor straddle shards 1 and 2
    x2, _ = td.get_batch("train", 64, 16, torch.Generator().manual_seed(0))
    assert torch.equal(x, x2)
    assert not torch.equal(x, td.get_batch("train", 64, 16, torch.Generator().manual_seed(1))[0])
    assert data.bytes_per_token(td) == 3.0 and data.bytes_per_token(tmp_path / "d", "train") == 3.0
    with pytest.raises(DataError, match="block_size=200"):
        td.get_batch("val", 1, 200)
    with pytest.raises(DataError, match="no split 'test'"):
        td.get_batch("test", 1, 2)


def test_uint32_dataset_loads(tmp_path):
    td = data.TokenData(
        make_dataset(tmp_path / "d", {"train": [70000], "val": [10]}, "uint32", vocab=100277)
    )
    x, y = td.get_batch("train", 8, 32, torch.Generator().manual_seed(0))
    assert torch.equal(y, x + 1) and td.vocab_size == 100277


def test_iterator_covers_every_window_once_per_epoch(tmp_path):
    td = data.TokenData(make_dataset(tmp_path / "d", {"train": [41, 25], "val": [10]}, vocab=10**6))
    it = td.iterator("train", batch_size=2, block_size=4, seed=0)
    assert it.num_windows == 10 + 6
    starts = [int(v) for _ in range(8) for v in it.next()[0][:, 0]]
    assert sorted(starts) == [4 * k for k in range(10)] + [41 + 4 * k for k in range(6)]
    assert it.state_dict()["epoch"] == 0
    it.next()
    assert it.state_dict()["epoch"] == 1  # a new permutation
    plain = td.iterator("train", 2, 4, shuffle=False)
    assert [int(v) for v in plain.next()[0][:, 0]] == [0, 4]


def test_iterator_ranks_partition_the_single_process_batch(tmp_path):
    td = data.TokenData(make_dataset(tmp_path / "d", {"train": [1000], "val": [10]}, vocab=10**6))
    single = td.iterator("train", 8, 8, seed=5)
    ranks = [td.iterator("train", 2, 8, rank=r, world_size=4, seed=5) for r in range(4)]
    for _ in range(20):  # crosses an epoch boundary
        x, y = single.next()
        parts = [it.next() for it in ranks]
        assert torch.equal(x, torch.cat([p[0] for p in parts])) and torch.equal(
            y, torch.cat([p[1] for p in parts])
        )
    with pytest.raises(DataError, match="outside world size"):
        td.iterator("train", 2, 8, rank=4, world_size=4)
    with pytest.raises(DataError, match="fewer than batch_size"):
        td.iterator("val", 4, 8)


def test_iterator_pins_contiguous_batches_for_a_cuda_run(tmp_path, monkeypatch):
    """pin_memory=True: x and y each contiguous and page-locked, the only kind of tensor that .to(cuda,
    non_blocking=True) copies asynchronously. Pinning needs a GPU, so Tensor.pin_memory is recorded instead.
    Catches: pageable batches (non_blocking then waits), or pinned strided views of the (B, T+1) windows."""
    pinned = []

    def pin(t):
        pinned.append(t.is_contiguous())
        return t

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin)
    td = data.TokenData(make_dataset(tmp_path / "d", {"train": [1000], "val": [10]}, vocab=10**6))
    x, y = td.iterator("train", 4, 8, seed=0, pin_memory=True).next()
    want_x, want_y = td.iterator("train", 4, 8, seed=0).next()
    assert pinned == [True, True] and torch.equal(x, want_x) and torch.equal(y, want_y)
    td.iterator("train", 4, 8, seed=0).next()
    assert len(pinned) == 2  # a CPU run pins nothing


def test_iterator_resume_gives_the_same_next_batches(tmp_path):
    td = data.TokenData(make_dataset(tmp_path / "d", {"train": [3000], "val": [10]}, vocab=10**6))
    it = td.iterator("train", 4, 16, seed=1)
    for _ in range(50):
        it.next()
    state = it.state_dict()
    assert all(type(v) is int for v in state.values())
    json.dumps(state)
    expected = [it.next() for _ in range(10)]
    resumed = td.iterator("train", 4, 16, seed=1)
    resumed.load_state_dict(state)
    for (x, y), (rx, ry) in zip(expected, [resumed.next() for _ in range(10)]):
        assert torch.equal(x, rx) and torch.equal(y, ry)
    with pytest.raises(DataError, match="block_size=16"):
        td.iterator("train", 4, 32, seed=1).load_state_dict(state)
    with pytest.raises(DataError, match="shuffle=1"):
        td.iterator("train", 4, 16, seed=1, shuffle=False).load_state_dict(state)
    with pytest.raises(DataError, match="positive integers"):
        td.iterator("train", 0, 16)
    with pytest.raises(DataError, match="positive integers"):
        td.get_batch("train", 4, -1)


def test_damaged_dataset_is_named(tmp_path):
    with pytest.raises(DataError, match="no readable manifest"):
        data.TokenData(tmp_path)
    (tmp_path / "manifest.json").write_text('{"splits": {}}')
    with pytest.raises(DataError, match="damaged manifest"):
        data.TokenData(tmp_path)
    d = make_dataset(tmp_path / "d", {"train": [100], "val": [10]})
    with open(d / "train_00000.bin", "ab") as f:
        f.write(b"\x00")
    with pytest.raises(DataError, match="damaged shard"):
        data.TokenData(d)


# ---------------------------------------------------------------------------------------------------------------------
# prepare: the funnel, the tokens (against the tokenizer's own Python encoder), the cache, mixing, bad input
# ---------------------------------------------------------------------------------------------------------------------


def write_jsonl(path: pathlib.Path, docs: list[str]) -> pathlib.Path:
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    """40 distinct documents, 4 exact copies, 4 near copies, 3 too short, one with PII; and a prepared dataset."""
    rng = random.Random(0)
    root = tmp_path_factory.mktemp("corpus")
    originals = [random_doc(rng, 100) for _ in range(40)]
    originals[7] += " Write to ann.lee@example.org or call 555-867-5309 today."
    docs = (
        originals
        + [originals[i].upper() for i in range(4)]
        + [near_copy(rng, originals[i]) for i in (10, 11, 12, 13)]
        + ["too short", "also too short here", "tiny"]
    )
    rng.shuffle(docs)
    path = write_jsonl(root / "docs.jsonl", docs)
    out = data_at_scale.prepare([str(path)], root / "ds", vocab_size=300, val_fraction=0.2, seed=0)
    return {"path": path, "originals": originals, "out": out, "root": root}


def split_stream(tokens: np.ndarray, eot: int) -> list[list[int]]:
    """The documents of a packed stream: it starts with <|endoftext|> and each document follows one."""
    assert tokens[0] == eot
    cuts = np.flatnonzero(tokens == eot).tolist() + [len(tokens)]
    return [tokens[a + 1 : b].tolist() for a, b in zip(cuts, cuts[1:])]


def test_prepare_funnel_counts_and_reasons(small_corpus):
    m = data.load_manifest(small_corpus["out"])
    steps = {s["name"].split(" (")[0]: s for s in m["funnel"]}
    assert steps["quality filters"]["docs_in"] == 51 and steps["quality filters"]["reasons"] == {
        "too_few_words": 3
    }
    assert steps["exact dedup"]["reasons"]["duplicate"] == 4
    assert steps["near dedup"]["reasons"]["near_duplicate"] == 4
    assert steps["PII masking"]["reasons"] == {"email": 1, "phone": 1}
    n_val = steps["train/val split"]["reasons"]["val"]
    assert (
        3 <= n_val <= 14 and steps["train/val split"]["docs_out"] == 40 - n_val
    )  # a coin each, p = 0.2
    assert (
        m["splits"]["train"]["documents"] == 40 - n_val and m["splits"]["val"]["documents"] == n_val
    )
    assert m["tokenizer"]["vocab_size"] == 300 and m["dtype"] == "uint16"
    text = data.Funnel.from_manifest(m).format()
    assert "too_few_words 3" in text and "near_duplicate 4" in text


@pytest.mark.parametrize("engine", ["in-memory", "streaming"])
def test_kept_per_source_counts_each_source_s_own_documents_in_the_shards(
    small_corpus, tmp_path, engine
):
    """Each source's "kept" documents and tokens (manifest sources, summary's "kept from" lines) are
    its own: every packed document decoded, looked up in the two files, and counted with its
    <|endoftext|>. The streaming engine's chunks (4 KiB, two workers) add up to the same."""
    rng = random.Random(9)
    other = write_jsonl(tmp_path / "other.jsonl", [random_doc(rng, 70) for _ in range(12)])
    paths = [small_corpus["path"], other]
    sources, kwargs = [str(p) for p in paths], dict(vocab_size=300, val_fraction=0.3)
    if engine == "in-memory":
        out = dataset.prepare(sources, tmp_path / "ds", **kwargs)
    else:
        out = data_at_scale.prepare(
            sources, tmp_path / "ds", workers=2, chunk_mb=4 / 1024, **kwargs
        )
    td = data.TokenData(out)
    texts = [[json.loads(line)["text"] for line in p.read_text().splitlines()] for p in paths]
    counted = {
        s: {split: {"documents": 0, "tokens": 0} for split in ("train", "val")} for s in sources
    }
    for split in ("train", "val"):
        stream = np.concatenate([np.asarray(a) for a in td.shards[split]])
        for ids in split_stream(stream, td.eot_id):
            head = td.tokenizer.decode(ids)[:40]
            (source,) = [s for s, docs in zip(sources, texts) if any(head in d for d in docs)]
            counted[source][split]["documents"] += 1
            counted[source][split]["tokens"] += len(ids) + 1
    assert {s["spec"]: s["kept"] for s in td.manifest["sources"]} == counted
    assert all(counted[s][split]["documents"] > 0 for s in sources for split in ("train", "val"))
    kept = counted[str(other)]
    assert (
        f"kept from {other}: {kept['train']['tokens']:,} train + {kept['val']['tokens']:,} val "
        f"tokens, {kept['train']['documents']:,} + {kept['val']['documents']:,} documents"
    ) in dataset.summary(out)


def test_prepare_tokens_match_the_tokenizer_and_the_text(small_corpus):
    td = data.TokenData(small_corpus["out"])
    tok = td.tokenizer
    assert len(tok) == td.vocab_size == 300 and td.eot_id == tok.eot_id
    expected = {
        d.replace("ann.lee@example.org", "<EMAIL>").replace("555-867-5309", "<PHONE>")
        for d in small_corpus["originals"]
    }
    seen = []
    for split in ("train", "val"):
        stream = np.concatenate([np.asarray(a) for a in td.shards[split]])
        docs = split_stream(stream, td.eot_id)
        info = td.manifest["splits"][split]
        assert len(docs) == info["documents"] and len(stream) == info["tokens"]
        texts = [tok.decode(ids) for ids in docs]
        assert all(
            ids == tok.encode_ordinary(t) for ids, t in zip(docs, texts)
        )  # tiktoken path == Python encoder
        assert info["bytes"] == sum(len(t.encode()) for t in texts)
        seen += texts
    assert len(seen) == len(set(seen)) == 40  # 40 originals, one per near-dup cluster
    lowered = {e.lower() for e in expected}
    for (
        t
    ) in seen:  # each is an original, its upper-case copy, or its near copy (whichever came first)
        assert t.lower() in lowered or max(exact_jaccard(t, e) for e in expected) > 0.6
    assert any("<EMAIL>" in t and "<PHONE>" in t for t in seen)
    assert data.bytes_per_token(small_corpus["out"]) == pytest.approx(
        td.manifest["splits"]["val"]["bytes"] / td.manifest["splits"]["val"]["tokens"]
    )


def test_prepare_is_deterministic(small_corpus, tmp_path):
    again = data_at_scale.prepare(
        [str(small_corpus["path"])], tmp_path / "again", vocab_size=300, val_fraction=0.2, seed=0
    )
    for name in ("tokenizer.json", "train_00000.bin", "val_00000.bin"):
        assert (again / name).read_bytes() == (small_corpus["out"] / name).read_bytes()


def test_prepare_without_validation_split(small_corpus, tmp_path):
    tokenizer = small_corpus["out"] / "tokenizer.json"
    out = data_at_scale.prepare(
        [str(small_corpus["path"])], tmp_path / "noval", tokenizer=tokenizer, val_fraction=0.0
    )
    td = data.TokenData(out)
    assert td.manifest["splits"]["val"] == {
        "documents": 0,
        "unique_documents": 0,
        "tokens": 0,
        "bytes": 0,
        "shards": [],
    }
    assert td.manifest["splits"]["train"]["documents"] == 40
    with pytest.raises(DataError, match="'val' split is empty"):
        data.bytes_per_token(td)
    with pytest.raises(DataError, match="no shard with more than"):
        td.get_batch("val", 1, 8)


def test_encoding_threads_do_not_change_ids(small_corpus):
    td = data.TokenData(small_corpus["out"])
    docs = small_corpus["originals"]
    one = data.encode_documents(td.tokenizer, docs, threads=1)
    two = data.encode_documents(td.tokenizer, docs, threads=2)
    assert all(np.array_equal(a, b) for a, b in zip(one, two))


def test_prepare_reuses_the_cache_and_keys_on_settings(small_corpus, tmp_path, monkeypatch):
    out = small_corpus["out"]
    stamp = (out / "manifest.json").stat().st_mtime_ns
    assert (
        data_at_scale.prepare(
            [str(small_corpus["path"])], out, vocab_size=300, val_fraction=0.2, seed=0
        )
        == out
    )
    assert (out / "manifest.json").stat().st_mtime_ns == stamp
    with pytest.raises(DataError, match="different dataset"):
        data_at_scale.prepare(
            [str(small_corpus["path"])], out, vocab_size=300, val_fraction=0.2, seed=1
        )
    monkeypatch.setenv("PRETRAIN_CACHE", str(tmp_path / "cache"))
    kwargs = dict(
        vocab_size=270,
        tokenizer=out / "tokenizer.json",
        clean_settings=data.CleanSettings(filters="none"),
    )
    a = data_at_scale.prepare([str(small_corpus["path"])], **kwargs)
    assert (
        a.parent == tmp_path / "cache" / "data"
        and data_at_scale.prepare([str(small_corpus["path"])], **kwargs) == a
    )
    b = data_at_scale.prepare([str(small_corpus["path"])], seed=5, **kwargs)
    assert b != a and data.load_manifest(b)["settings"]["seed"] == 5
    m = data.load_manifest(a)
    assert (
        m["tokenizer"]["trained_on_bytes"] == 0 and m["tokenizer"]["vocab_size"] == 300
    )  # reused, not trained
    assert not [
        p for p in (tmp_path / "cache" / "data").iterdir() if ".tmp-" in p.name
    ]  # no half-written dirs


def test_prepare_mixes_sources_by_weight(small_corpus, tmp_path):
    rng = random.Random(1)
    other = write_jsonl(tmp_path / "other.jsonl", [random_doc(rng, 60) for _ in range(20)])
    tokenizer = small_corpus["out"] / "tokenizer.json"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # under 4 epochs: no warning
        out = data_at_scale.prepare(
            [str(small_corpus["path"]), str(other)],
            tmp_path / "mix",
            tokenizer=tokenizer,
            weights=[0.5, 0.5],
            val_fraction=0.1,
        )
    m = data.load_manifest(out)
    mix = m["mixture"]
    first, second = mix[str(small_corpus["path"])], mix[str(other)]
    assert first["epochs"] == pytest.approx(1.0)  # covering budget: all read once...
    assert second["epochs"] > 2.0  # ...but the small source is up-weighted
    assert first["tokens"] == pytest.approx(second["tokens"])
    unique_total = sum(s["kept"]["train"]["tokens"] for s in m["sources"])
    assert m["splits"]["train"]["tokens"] >= first["tokens"] + second["tokens"] > unique_total
    assert m["splits"]["train"]["documents"] > m["splits"]["train"]["unique_documents"]
    with pytest.warns(UserWarning, match="times"):
        data_at_scale.prepare(
            [str(small_corpus["path"]), str(other)],
            tmp_path / "mix2",
            tokenizer=tokenizer,
            weights=[0.1, 0.9],
            val_fraction=0.1,
        )


def test_prepare_bad_input_is_one_clear_error(small_corpus, tmp_path):
    tokenizer = small_corpus["out"] / "tokenizer.json"
    shorts = write_jsonl(
        tmp_path / "short.jsonl", ["a few words", "and a few more", "nothing long"]
    )
    with pytest.raises(
        DataError, match=r"quality filters \(gopher.*removed all 3 documents \(too_few_words 3\)"
    ):
        data_at_scale.prepare([str(shorts)], tmp_path / "x", tokenizer=tokenizer)
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(DataError, match="no documents"):
        data_at_scale.prepare([str(tmp_path / "empty.txt")], tmp_path / "x", tokenizer=tokenizer)
    with pytest.raises(DataError, match="too small"):
        data_at_scale.prepare([str(shorts)], tmp_path / "x", vocab_size=100)
    with pytest.raises(DataError, match="listed twice"):
        data_at_scale.prepare([str(shorts), str(shorts)], tmp_path / "x")
    with pytest.raises(DataError, match="`val_fraction`"):
        data_at_scale.prepare([str(shorts)], tmp_path / "x", val_fraction=1.0)
    with pytest.raises(DataError, match="one weight per source"):
        data_at_scale.prepare([str(shorts)], tmp_path / "x", weights=[0.5, 0.5])
    with pytest.raises(DataError, match="tokenizer file"):
        data_at_scale.prepare([str(shorts)], tmp_path / "x", tokenizer=tmp_path / "none.json")
    (tmp_path / "occupied").mkdir()
    (tmp_path / "occupied" / "notes.txt").write_text("mine")
    with pytest.raises(DataError, match="not a dataset directory"):
        data_at_scale.prepare(
            [str(small_corpus["path"])], tmp_path / "occupied", tokenizer=tokenizer
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "empty.txt",
        "occupied",
        "short.jsonl",
    ]  # nothing written


def test_bad_settings_fail_before_any_work(small_corpus, tmp_path):
    corpus = str(small_corpus["path"])
    with pytest.raises(DataError, match="needs `weights`"):
        data_at_scale.prepare([corpus], tmp_path / "x", train_tokens=5e6)
    with pytest.raises(DataError, match="positive budget"):
        data_at_scale.prepare([corpus], tmp_path / "x", weights=[1.0], train_tokens=-5)
    with pytest.raises(DataError, match="boilerplate_min_documents must be at least 2"):
        data.CleanSettings(boilerplate_min_documents=1)
    with pytest.raises(DataError, match="near_dup_threshold must be 0"):
        data.CleanSettings(near_dup_threshold=1.0)
    with pytest.raises(DataError, match="token budget must be positive"):
        data.mixture_plan({"web": 1.0}, -1)
    with pytest.raises(DataError, match="unique token counts must be positive"):
        data.mixture_plan({"web": 1.0}, 100, {"web": -1})
    with pytest.raises(DataError, match="threads must be at least 1"):
        data.encode_documents(
            data.bpe.Tokenizer.load(small_corpus["out"] / "tokenizer.json"), ["a b"], threads=0
        )
    (tmp_path / "file.txt").write_text("mine")
    with pytest.raises(DataError, match="is a file"):
        data_at_scale.prepare([corpus], tmp_path / "file.txt", vocab_size=300)
    with pytest.raises(DataError, match="cannot write in"):
        data_at_scale.prepare([corpus], tmp_path / "file.txt" / "ds", vocab_size=300)
    assert [p.name for p in tmp_path.iterdir()] == ["file.txt"]  # nothing written


def test_cli_prints_the_funnel_and_exits_2_on_bad_input(small_corpus, tmp_path, capsys):
    assert (
        data_command.main(
            [
                "prepare",
                "--data",
                str(small_corpus["path"]),
                "--vocab-size",
                "300",
                "--val-fraction",
                "0.2",
                "--out",
                str(small_corpus["out"]),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "quality filters (gopher" in out and "too_few_words 3" in out and "train:" in out
    # issue 43: a cache hit printed the first build's times as this call's: said apart now
    lines = out.splitlines()
    hit = next(i for i, line in enumerate(lines) if line.startswith("cache hit: "))
    timing = next(i for i, line in enumerate(lines) if line.startswith("time (wall/CPU): "))
    assert hit < timing and "the times below are its first build's" in lines[hit], out
    assert re.fullmatch(r"this call: \d+\.\ds", lines[-1]), out
    assert data_command.main(["inspect", str(small_corpus["out"])]) == 0
    assert "a random val window, decoded:" in capsys.readouterr().out
    for argv in (
        ["prepare", "--data", str(tmp_path / "nope.jsonl")],
        ["inspect", str(tmp_path)],
        ["prepare", "--data", str(small_corpus["path"]), "--tokenizer", str(small_corpus["path"])],
    ):
        with pytest.raises(SystemExit) as exit_info:
            sys.exit(data_command.main(argv))
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err


# ---------------------------------------------------------------------------------------------------------------------
# Your own text: curated files kept whole, --val-data verbatim, one long document, bad input
# ---------------------------------------------------------------------------------------------------------------------


def play(n_speeches: int = 400, seed: int = 0) -> str:
    """A play: mostly short speeches (Gopher's too_few_words), speaker lines in every speech (boilerplate to the
    web funnel) and a repeated refrain (exact duplicates), separated by blank lines."""
    rng = random.Random(seed)
    speakers = ["KING RICHARD III:", "QUEEN ELIZABETH:", "DUKE OF YORK:"]
    speeches = []
    for i in range(n_speeches):
        body = (
            "Ay, my good lord."
            if i % 10 == 0
            else random_doc(rng, 80)
            if i % 4 == 1
            else " ".join(rng.choices(WORDS, k=rng.randint(5, 30))) + "."
        )
        speeches.append(f"{speakers[i % 3]}\n{body}")
    return "\n\n".join(speeches) + "\n"


def train_text(out: pathlib.Path) -> str:
    """The train split's documents, decoded and joined by blank lines."""
    td = data.TokenData(out)
    stream = np.concatenate([np.asarray(a) for a in td.shards["train"]])
    return "\n\n".join(td.tokenizer.decode(ids) for ids in split_stream(stream, td.eot_id))


def test_curated_text_is_kept_whole_and_web_cleaning_says_so(tmp_path, capsys):
    text = play()
    path = tmp_path / "play.txt"
    path.write_text(text)
    out = data_at_scale.prepare([str(path)], tmp_path / "kept", vocab_size=257, val_fraction=0.0)
    m = data.load_manifest(out)
    assert [s["name"].split(" (")[0] for s in m["funnel"]] == [
        "read play.txt",
        "kept whole",
        "PII masking",
        "train/val split",
    ]
    assert m["splits"]["train"]["bytes"] >= 0.99 * len(text.encode())
    assert sorted(train_text(out).split("\n\n")) == sorted(
        text.strip().split("\n\n")
    )  # every speech, whole
    assert m["notices"] == [] and "note:" not in capsys.readouterr().err
    web = data_at_scale.prepare(
        [str(path)],
        tmp_path / "web",
        vocab_size=257,
        val_fraction=0.0,
        clean_settings=data.CleanSettings(cleaning="web"),
    )
    notices = data.load_manifest(web)["notices"]
    assert len(notices) == 1 and "--cleaning keep" in notices[0] and "play.txt" in notices[0]
    assert capsys.readouterr().err.strip() == notices[0]
    jsonl = write_jsonl(
        tmp_path / "play.jsonl", text.split("\n\n")
    )  # web-like: the funnel by default
    assert not formats.open_source(str(jsonl)).curated and formats.open_source(str(path)).curated
    keep = data.CleanSettings(cleaning="keep", near_dup_threshold=0.5)
    docs, _, funnel = cleaning.clean([formats.open_source(str(jsonl))], keep)
    assert docs == [d.strip() for d in text.split("\n\n")] and funnel.notices == []


def test_tinyshakespeare_keeps_its_text(shared_data, tmp_path):
    """The issue's case: 1 MB of short speeches. The web funnel kept 0.52 of 0.99 M characters; kept whole, >= 99%."""
    path = shared_data / "tinyshakespeare" / "input.txt"
    out = data_at_scale.prepare([str(path)], tmp_path / "ds", vocab_size=257)
    m = data.load_manifest(out)
    kept = m["splits"]["train"]["bytes"] + m["splits"]["val"]["bytes"]
    assert kept >= 0.99 * path.stat().st_size and m["splits"]["val"]["documents"] >= 2


def test_val_data_is_the_file_verbatim_and_its_overlap_is_reported(tmp_path, capsys):
    rng = random.Random(4)
    train_docs = [random_doc(rng, 120) for _ in range(30)]
    (tmp_path / "train.txt").write_text("\n\n".join(train_docs))
    copied = " ".join(train_docs[5].split()[:20])  # 8 of its 13-grams are in train
    val_bytes = (
        f"Held-out text, kept exactly:\r\n  {random_doc(rng, 60)}\n\n{copied}\n   \n".encode()
    )
    (tmp_path / "val.txt").write_bytes(val_bytes)
    for engine in ("memory", "stream"):  # the lesson's engine and the streaming one
        assert (
            data_command.main(
                [
                    "prepare",
                    "--data",
                    str(tmp_path / "train.txt"),
                    "--val-data",
                    str(tmp_path / "val.txt"),
                    "--vocab-size",
                    "300",
                    "--engine",
                    engine,
                    "--out",
                    str(tmp_path / engine),
                ]
            )
            == 0
        )
        err = capsys.readouterr().err
        td = data.TokenData(tmp_path / engine)
        val = td.manifest["splits"]["val"]
        assert val["bytes"] == len(val_bytes) and val["documents"] == 1
        stream = np.concatenate([np.asarray(a) for a in td.shards["val"]])
        assert td.tokenizer.decode(split_stream(stream, td.eot_id)[0]).encode() == val_bytes
        assert td.manifest["splits"]["train"]["bytes"] >= 0.99 * len(
            "\n\n".join(train_docs)
        )  # all of train
        assert val["overlap"]["shared"] == 8 and val["overlap"]["contaminated"] == 1
        assert "--val-data: 8 of its" in err and "also occur in train" in err
    eot_file = tmp_path / "stories.txt"  # TinyStories' marker separates documents
    eot_file.write_text("One story.<|endoftext|>Another story.\n")
    assert formats.read_val_file(eot_file) == ["One story.", "Another story.\n"]


def test_one_long_document_is_cut_into_chunks(tmp_path):
    assert cleaning.chunk_document("a\nb\n\nc", 100) == ["a\nb\n\nc"]
    assert cleaning.chunk_document("aaaa\nbb\n\ncc", 9) == ["aaaa\nbb", "cc"]  # at the blank line
    assert cleaning.chunk_document("aaaa\nbbbb\ncc", 9) == [
        "aaaa\nbbbb",
        "cc",
    ]  # else at a line break
    assert cleaning.chunk_document("abcdefghij", 4) == ["abcd", "efgh", "ij"]  # else at the limit
    rng = random.Random(5)
    novel = "\n".join(
        random_doc(rng, rng.randint(5, 40)) for _ in range(3000)
    )  # no blank line at all
    pieces = cleaning.chunk_document(novel, 16_384)
    assert all(len(p) <= 16_384 for p in pieces) and "\n".join(pieces) == novel and len(pieces) > 20
    (tmp_path / "novel.txt").write_text(novel)
    out = data_at_scale.prepare(
        [str(tmp_path / "novel.txt")], tmp_path / "ds", vocab_size=257, txt_split="file"
    )
    splits = data.load_manifest(out)["splits"]
    assert (
        splits["val"]["documents"] >= 1
        and splits["train"]["documents"] == len(pieces) - splits["val"]["documents"]
    )
    (tmp_path / "note.txt").write_text(play(30))  # ~6,000 characters: cut finer, into 20 or more
    small = data_at_scale.prepare([str(tmp_path / "note.txt")], tmp_path / "small", vocab_size=257)
    splits = data.load_manifest(small)["splits"]
    assert splits["val"]["documents"] >= 1 and splits["train"]["documents"] >= 19


def test_own_text_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "train.txt").write_text(play(50))
    (tmp_path / "copy.txt").write_text(play(50))
    (tmp_path / "empty.txt").write_text(" \n\n")
    cases = {
        ("--data", "train.txt", "--val-data", "missing.txt"): "--val-data .*missing.txt not found",
        (
            "--data",
            "train.txt",
            "--val-data",
            "copy.txt",
        ): "--val-data .*copy.txt is the same text as the training file .*train.txt",
        ("--data", "train.txt", "--val-data", "empty.txt"): "--val-data .*empty.txt is empty",
        ("--data", "empty.txt"): "source .*empty.txt.* has no documents",
        ("--data", "train.txt", "--val-data", "train.txt"): "is the same text as the training file",
        (
            "--data",
            "tr*.txt",
            "--val-data",
            "copy.txt",
        ): "copy.txt is the same text as the training file .*train.txt",
    }
    for args, message in cases.items():
        argv = ["prepare", "--vocab-size", "257", "--out", str(tmp_path / "ds")]
        argv += [str(tmp_path / a) if a.endswith(".txt") else a for a in args]
        with pytest.raises(SystemExit) as exit_info:
            sys.exit(data_command.main(argv))
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and err.count("\n") == 1 and re.search(message, err), (
            args,
            err,
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "copy.txt",
        "empty.txt",
        "train.txt",
    ]  # nothing written


def test_script_help_runs():
    out = subprocess.run(
        [sys.executable, "data.py", "--help"], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0 and "prepare" in out.stdout and "mix" in out.stdout


def test_docstring_examples():
    import doctest

    assert doctest.testmod(data).failed == 0 and doctest.testmod(cleaning).failed == 0


@pytest.mark.slow
def test_prepare_pydocs_default(tmp_path, monkeypatch):
    """The default corpus end to end, as `python train.py` runs it (offline, ~20 s on 2 cores)."""
    monkeypatch.setenv("PRETRAIN_CACHE", str(tmp_path))
    out = data_at_scale.prepare(["pydocs"])
    m = data.load_manifest(out)
    assert m["funnel"][0]["docs_in"] > 500 and m["funnel"][1]["reasons"]["too_few_words"] > 0
    assert m["tokenizer"]["vocab_size"] == data.DEFAULT_VOCAB_SIZE
    assert m["splits"]["train"]["tokens"] > 200_000 and m["splits"]["val"]["tokens"] > 5_000
    assert 3.0 < data.bytes_per_token(out) < 5.0
    x, y = data.TokenData(out).get_batch("val", 4, 128, torch.Generator().manual_seed(0))
    assert x.shape == (4, 128) and int(x.max()) < data.DEFAULT_VOCAB_SIZE


# ---------------------------------------------------------------------------------------------------------------------
# The streaming engine against the in-memory reference; resume after SIGKILL; memory; bad inputs
# ---------------------------------------------------------------------------------------------------------------------

FOOTER = "Subscribe to our newsletter for more stories like this one."


def web_corpus(rng: random.Random, n: int) -> list[str]:
    """Web-like documents: a footer line on a third of them (boilerplate), exact copies (case and spacing), near
    copies, too-short pages and one with contact details (PII)."""
    docs = []
    for i in range(n):
        doc = random_doc(rng, 90)
        if i % 3 == 0:
            doc += "\n" + FOOTER
        if i % 17 == 5:
            doc += " Mail ann.lee@example.org or call 555-867-5309."
        if i % 13 == 2:
            doc = "\n  " + doc + "  \n"  # cleaning strips the ends
        docs.append(doc)
        if i % 7 == 3:
            docs.append("  " + doc.upper())
        if i % 5 == 1:
            docs.append(near_copy(rng, doc))
        if i % 11 == 0:
            docs.append("too short to keep")
    return docs


def dataset_files(directory: pathlib.Path) -> dict:
    """Every file of a dataset directory as bytes, the manifest without its timings."""
    files = {
        p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.name != "manifest.json"
    }
    manifest = data.load_manifest(directory)
    manifest.pop("timings")
    return {**files, "manifest": manifest}


@pytest.fixture(scope="module")
def mixed_inputs(tmp_path_factory):
    """A directory of web .jsonl (split over many chunks), .jsonl.gz and an HTML page; a .txt source; a code
    directory."""
    rng = random.Random(5)
    root = tmp_path_factory.mktemp("inputs")
    web = root / "web"
    web.mkdir()
    write_jsonl(web / "a.jsonl", web_corpus(rng, 120))
    with gzip.open(web / "b.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write("".join(json.dumps({"text": d}) + "\n" for d in web_corpus(rng, 30)))
    accented = [
        " ".join(
            w.replace("e", "é") if k % 2 else w for k, w in enumerate(random_doc(rng, 90).split())
        )
        for _ in range(3)
    ]  # near copies only once accents are stripped (--strip-accents)
    echo = "This one line is said twice in a single page."  # CS336's line dedup counts it twice
    write_jsonl(
        web / "c.jsonl",
        accented
        + [d.replace("é", "e") for d in accented]
        + [f"{random_doc(rng, 90)}\n{echo}\n{random_doc(rng, 60)}\n{echo}"],
    )
    (root / "books.txt").write_text(
        "\n\n".join(random_doc(rng, 70) for _ in range(25)) + "\n", encoding="utf-8"
    )
    (root / "pages").mkdir()
    (root / "pages" / "p.html").write_text(
        "<nav>Home</nav><p>" + GOOD_PROSE + "</p><footer>(c)</footer>"
    )
    code = root / "code"
    code.mkdir()
    for i in range(12):
        (code / f"m{i}.py").write_text(
            "".join(f"def f{i}_{k}(x):\n    return x * {k} + {i}\n" for k in range(12))
        )
    return root


@pytest.mark.parametrize("case", ["web", "mixed-sources", "no-near-dedup", "cs336-handout"])
def test_streaming_equals_in_memory(mixed_inputs, tmp_path, case, monkeypatch):
    """Same documents kept, same split, same token ids, same manifest: the reference engine is the oracle.
    Tiny chunks (4 KiB) cut the .jsonl into many byte ranges, two worker processes run them, and near-dup
    candidates are verified a few documents at a time."""
    monkeypatch.setattr(data_at_scale, "VERIFY_BYTES", 3000)
    web = str(mixed_inputs / "web")
    kwargs = {
        "web": dict(sources=[web], val_fraction=0.2),
        "mixed-sources": dict(
            sources=[
                web,
                str(mixed_inputs / "books.txt"),
                str(mixed_inputs / "code"),
                str(mixed_inputs / "pages"),
            ],
            weights=[0.5, 0.3, 0.1, 0.1],
            val_fraction=0.1,
            seed=3,
            clean_settings=data.CleanSettings(cleaning="web", strip_accents=True),
        ),
        "no-near-dedup": dict(
            sources=[web],
            clean_settings=data.CleanSettings(
                near_dup_threshold=0, mask_pii=False, boilerplate_min_documents=5
            ),
            weights=[1.0],
            train_tokens=50_000,
            tokenizer_train_bytes=20_000,
        ),
        "cs336-handout": dict(
            sources=[web],
            clean_settings=data.CleanSettings(filters="gopher-handout", line_dedup="occurrences"),
        ),
    }[case]
    sources = kwargs.pop("sources")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the up-weighted sources' epochs warning
        reference = dataset.prepare(sources, tmp_path / "reference", vocab_size=300, **kwargs)
        streamed = data_at_scale.prepare(
            sources, tmp_path / "streamed", vocab_size=300, workers=2, chunk_mb=4 / 1024, **kwargs
        )
    expected, got = dataset_files(reference), dataset_files(streamed)
    assert got.keys() == expected.keys()
    for name in expected:
        assert got[name] == expected[name], name
    steps = {s["name"].split(" (")[0]: s for s in expected["manifest"]["funnel"]}
    assert steps["exact dedup"]["reasons"]["duplicate"] > 0  # every step had work to do
    if case != "no-near-dedup":
        assert (steps.get("boilerplate lines") or steps["line dedup"])["reasons"][
            "lines_removed"
        ] > 0
        assert (
            steps["near dedup"]["reasons"]["near_duplicate"] > 0
            and steps["PII masking"]["reasons"]["email"] > 0
        )
    assert not [
        p.name for p in tmp_path.iterdir() if p.name.startswith(".")
    ]  # no work or temporary folders left


def chained_corpus(rng: random.Random) -> tuple[list[str], list[str]]:
    """web_corpus (exact copies, boilerplate footers, near copies) around two clusters that only union-find over
    every range's pairs resolves: a chain X~Y~Z (X and Z not similar) and a V: C similar to A and to B, A and B not
    (J 2/3 and 1/3 of 3-word shingles). A opens the corpus, B sits in the middle and C closes it, so their pairs
    are verified in different ranges of document ids. Returns (documents, [A, B, C])."""
    p, q, r, s, t, u = (random_doc(rng, 40) for _ in range(6))
    a, b, c = f"{p} {q}", f"{q} {r}", f"{p} {q} {r}"
    docs = web_corpus(rng, 60)
    middle = len(docs) // 2
    return [a] + docs[:middle] + [f"{s} {t}", b, f"{s} {t} {u}"] + docs[middle:] + [
        f"{t} {u}",
        c,
    ], [a, b, c]


def documents(out: pathlib.Path) -> list[str]:
    """Every document of a dataset's train and val splits, decoded."""
    td = data.TokenData(out)
    return [
        td.tokenizer.decode(ids)
        for split in ("train", "val")
        for ids in split_stream(
            np.concatenate([np.asarray(a) for a in td.shards[split]]), td.eot_id
        )
    ]


def test_join_ranges_cover_the_key_space_and_the_documents():
    """Ranges of keys tile [0, 2^64) and ranges of ids tile the documents, with at least 4 per worker."""
    for entries, workers, count in (
        (0, 1, 4),
        (10, 2, 8),
        (10**9, 3, 239),
    ):  # 10^9 x 16 B / 64 MiB = 238.4
        ranges = data_at_scale._key_ranges(entries, workers)
        assert len(ranges) == count
        assert ranges[0][0] == 0 and ranges[-1][1] == 2**64
        assert all(high == low for (_, high), (low, _) in zip(ranges, ranges[1:]))
    documents = [5, 0, 3, 1]
    ids = [(chunk << 32) | k for chunk, n in enumerate(documents) for k in range(n)]
    for parts in (1, 2, 4, 9, 20):
        covered = [
            [i for i in ids if first <= i < last]
            for first, last in data_at_scale._id_ranges(documents, parts)
        ]
        assert sum(covered, []) == ids and all(covered) and len(covered) == min(parts, len(ids))


@pytest.mark.parametrize("workers", [1, 2])
def test_streaming_joins_over_many_ranges_equal_in_memory(tmp_path, workers, monkeypatch, capsys):
    """Every join cut into many key ranges (JOIN_BYTES of 1 KiB), run on 1 and 2 worker processes: the same bytes as
    the in-memory engine, the V cluster resolved as one (A kept, B and C dropped)."""
    docs, (a, b, c) = chained_corpus(random.Random(7))
    assert (
        dedup.jaccard(dedup.shingles(a), dedup.shingles(b))
        < 0.5
        < dedup.jaccard(dedup.shingles(a), dedup.shingles(c))
    )
    write_jsonl(tmp_path / "web.jsonl", docs)
    monkeypatch.setattr(data_at_scale, "JOIN_BYTES", 1 << 10)
    monkeypatch.setattr(data_at_scale, "VERIFY_BYTES", 3000)
    reference = dataset.prepare(
        [str(tmp_path / "web.jsonl")], tmp_path / "reference", vocab_size=300
    )
    streamed = data_at_scale.prepare(
        [str(tmp_path / "web.jsonl")],
        tmp_path / "streamed",
        vocab_size=300,
        workers=workers,
        chunk_mb=4 / 1024,
        verbose=True,
    )
    assert dataset_files(streamed) == dataset_files(reference)
    ranges = dict(
        re.findall(r"  (.+ join|verify candidates): (\d+) ranges", capsys.readouterr().err)
    )
    assert len(ranges) == 4 and min(map(int, ranges.values())) >= 4 * workers, ranges
    kept = documents(streamed)
    assert a in kept and b not in kept and c not in kept


def test_streaming_reads_parquet_row_groups_and_globs(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rng = random.Random(2)
    for name in ("x", "y"):
        pq.write_table(
            pa.table({"text": web_corpus(rng, 40)}), tmp_path / f"{name}.parquet", row_group_size=10
        )
    chunks = data_at_scale.plan_chunks(
        [formats.open_source(str(tmp_path / "*.parquet"))], chunk_bytes=1
    )
    assert len(chunks) > 10 and {c.stop - c.start for c in chunks} == {1}  # one row group per chunk
    reference = dataset.prepare(
        [str(tmp_path / "*.parquet")], tmp_path / "reference", vocab_size=280
    )
    streamed = data_at_scale.prepare(
        [str(tmp_path / "*.parquet")],
        tmp_path / "streamed",
        vocab_size=280,
        workers=2,
        chunk_mb=1e-3,
    )
    assert dataset_files(streamed) == dataset_files(reference)


# Kept-whole text and --val-data on the stream: a directory of text files read in 7-byte blocks (a marker, a "\r\n"
# and a UTF-8 character cut in two, pieces cut across blocks), against the in-memory reference.

MAIL = "ann.lee@example.org"
EOT = data.EOT


@pytest.fixture(scope="module")
def own_text(tmp_path_factory):
    """books/: a.txt with <|endoftext|> markers (and empty documents between them), b.md small, with "\r\n" line
    ends, accents and Unicode spaces, c.txt longer than a piece, with lines longer than a piece; val.txt, a held-out
    file that copies 20 words of a train document and 20 around an email (found in train only before masking)."""
    rng = random.Random(9)
    root = tmp_path_factory.mktemp("own")
    books = root / "books"
    books.mkdir()
    stories = [random_doc(rng, 60) for _ in range(12)]
    stories[3] = (
        " ".join(stories[3].split()[:30])
        + f" write to {MAIL} today "
        + " ".join(stories[3].split()[30:])
    )
    (books / "a.txt").write_text(
        f"{EOT}  \n".join(stories[:6]) + f"\n{EOT}\n \n{EOT}" + EOT.join(stories[6:]) + EOT
    )
    note = (
        "Café naïve façade,\u3000déjà vu.\r\n\r\n  Ünïcode spaces\u2003and\x85lines.\r\nLast line\r"
    )
    (books / "b.md").write_bytes(note.encode("utf-8"))
    lines = [
        random_doc(rng, rng.choice([8, 30, 600])) for _ in range(60)
    ]  # some longer than a piece
    (books / "c.txt").write_text(
        "".join(line + rng.choice(["\n", "\n\n", " \n \n", f"{EOT}"]) for line in lines)
    )
    copied = " ".join(stories[5].split()[10:30])
    around_mail = " ".join(stories[3].split()[20:40])  # 11 13-grams, all with the email's words
    (root / "val.txt").write_bytes(
        f" Held out:\r\n{random_doc(rng, 50)}\n\n{copied}\n{around_mail}\n  ".encode()
    )
    return root


def streamed_and_reference(
    sources: list[str], tmp_path: pathlib.Path, **kwargs
) -> tuple[dict, dict]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the up-weighted sources' epochs warning
        reference = dataset.prepare(sources, tmp_path / "reference", **kwargs)
        streamed = data_at_scale.prepare(
            sources, tmp_path / "streamed", workers=2, chunk_mb=4 / 1024, **kwargs
        )
    assert data.load_manifest(streamed)["timings"]["engine"] == "streaming, 2 worker(s)"
    return dataset_files(streamed), dataset_files(reference)


def test_kept_whole_pieces_stay_out_of_exact_dedup(own_text, mixed_inputs, tmp_path, monkeypatch):
    """Every document hash made equal (0): exact dedup keeps the first cleaned document, as the in-memory engine
    does; pieces kept whole, read before it, must not count as its earlier copies (they have no hash at all)."""
    monkeypatch.setattr(data, "document_hash", lambda text: 0)
    got, expected = streamed_and_reference(
        [str(own_text / "books"), str(mixed_inputs / "web")], tmp_path, vocab_size=300
    )
    assert got == expected
    funnel = expected["manifest"]["funnel"]
    pieces = next(s["docs_out"] for s in funnel if s["name"].startswith("kept whole"))
    assert next(s["docs_out"] for s in funnel if s["name"] == "exact dedup (hash)") == pieces + 1


@pytest.mark.parametrize(
    "case", ["kept-whole", "kept-whole-small-pieces", "keep-jsonl", "kept-and-web", "val-data"]
)
def test_streaming_keeps_text_whole_and_takes_val_data_as_in_memory(
    own_text, mixed_inputs, tmp_path, case, monkeypatch
):
    """Shards, tokenizer and manifest equal the in-memory engine's: the pieces (the piece size shrinks for a small
    source; with chunk_chars 300 the counting pass stops early), the kept-whole funnel row, the split, mixing,
    and --val-data's val split and 13-gram overlap."""
    monkeypatch.setattr(data_at_scale, "TEXT_BLOCK_BYTES", 7)
    books, web = str(own_text / "books"), str(mixed_inputs / "web")
    kwargs = {
        "kept-whole": dict(sources=[books]),
        "kept-whole-small-pieces": dict(
            sources=[books], clean_settings=data.CleanSettings(chunk_chars=300), val_fraction=0.3
        ),
        "keep-jsonl": dict(
            sources=[web, str(mixed_inputs / "pages")],
            clean_settings=data.CleanSettings(cleaning="keep"),
        ),
        "kept-and-web": dict(sources=[books, web], weights=[0.7, 0.3], train_tokens=60_000, seed=2),
        "val-data": dict(sources=[books, web], val_data=[str(own_text / "val.txt")]),
    }[case]
    got, expected = streamed_and_reference(
        kwargs.pop("sources"), tmp_path, vocab_size=300, **kwargs
    )
    assert got.keys() == expected.keys()
    for name in expected:
        assert got[name] == expected[name], name
    manifest = expected["manifest"]
    kept = [s for s in manifest["funnel"] if s["name"].startswith("kept whole")]
    assert kept and all(s["docs_out"] >= 20 for s in kept)
    size = int(re.search(r"at_most_(\d+)_chars", next(iter(kept[0]["reasons"]))).group(1))
    assert (
        size == 300 if case == "kept-whole-small-pieces" else size < 16_384
    )  # small sources: finer
    if case == "val-data":
        overlap = manifest["splits"]["val"]["overlap"]
        assert overlap["shared"] >= 8 and overlap["contaminated"] == 1  # the 20 copied words
        assert manifest["notices"][-1] == dataset.format_overlap(overlap)
        assert manifest["splits"]["val"]["bytes"] == (own_text / "val.txt").stat().st_size
        # the val file is no source's: each source's kept documents are all train
        assert [s["kept"]["val"]["documents"] for s in manifest["sources"]] == [0, 0]


def test_tinyshakespeare_streams_as_in_memory(shared_data, tmp_path, monkeypatch):
    """1.1M characters kept whole, read in 4 KiB blocks: the 69 pieces of 16,384 characters and everything after."""
    monkeypatch.setattr(data_at_scale, "TEXT_BLOCK_BYTES", 4096)
    got, expected = streamed_and_reference(
        [str(shared_data / "tinyshakespeare" / "input.txt")], tmp_path, vocab_size=257
    )
    assert got == expected
    assert expected["manifest"]["funnel"][1]["reasons"] == {"pieces_of_at_most_16384_chars": 69}


_STREAM_TEXT = st.lists(
    st.sampled_from(
        [
            "a",
            "bb ",
            "word",
            " ",
            "\n",
            "\n\n",
            "\t",
            "\r\n",
            "\r",
            "\u3000",
            "\x85",
            "é",
            "日本",
            EOT,
            "<|end",
            "oftext|>",
            "<",
            "\n \t\n",
            " " * 15,
        ]
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    parts=_STREAM_TEXT,
    block=st.integers(1, 12),
    size=st.integers(1, 10),
    mode=st.sampled_from(["eot", "blank", "file"]),
    limit=st.integers(1, 80),
)
@example(
    parts=["ab", "\n", " " * 15, "\n", "cd"], block=18, size=9, mode="blank", limit=80
)  # a long blank line cut
@example(parts=["ab", EOT, "cd"], block=5, size=9, mode="eot", limit=80)  # a marker cut in three
def test_block_stream_cuts_the_pieces_of_chunk_document(parts, block, size, mode, limit):
    """read_text_blocks -> split_text_stream -> cut_stream yields chunk_document's pieces of split_plain_text's
    documents of _read_text's text, with blocks of any size cutting markers, "\r\n" and UTF-8 characters; its
    counts are the documents' and stripped_chars counts them up to a limit."""
    with tempfile.TemporaryDirectory(prefix="keptwhole-") as folder:
        path = pathlib.Path(folder) / "t.txt"
        path.write_bytes("".join(parts).encode("utf-8"))
        docs = formats.split_plain_text(formats.read_text(path), mode)
        counts = collections.Counter()
        events = lambda: data_at_scale.split_text_stream(
            data_at_scale.read_text_blocks(path, block), mode
        )  # noqa: E731
        pieces = [p for d in docs for p in cleaning.chunk_document(d, size)]
        assert list(data_at_scale.cut_stream(events(), size, counts)) == pieces
        chars = sum(map(len, docs))
        assert (counts["read_docs"], counts["read_chars"], counts["read_bytes"]) == (
            len(docs),
            chars,
            sum(len(d.encode()) for d in docs),
        )
        counted = data_at_scale.stripped_chars(events(), limit)
        assert counted == chars if chars < limit else counted >= limit


def test_jsonl_byte_ranges_read_every_line_once(tmp_path):
    lines = [json.dumps({"text": f"document {i} " + "x" * (i % 13)}) for i in range(200)]
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(lines[:100]) + "\n\n" + "\n".join(lines[100:]) + "\n")
    size = path.stat().st_size
    for step in (1, 7, 64, 1000, size):
        got = [
            d
            for start in range(0, size, step)
            for d in formats.read_jsonl(path, start=start, stop=start + step)
        ]
        assert got == [json.loads(line)["text"] for line in lines], step
    path.write_text("\n".join(lines[:150]) + "\n{broken\n")
    with pytest.raises(DataError, match=r"d.jsonl:151: "):  # the line number from the start
        list(formats.read_jsonl(path, start=size // 2, stop=size))


def run_prepare(args: list[str], **popen) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "data.py", "prepare", "--engine", "stream", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **popen,
    )


def kill_when(
    process: subprocess.Popen, work_parent: pathlib.Path, pattern: str, count: int
) -> None:
    """SIGKILL the whole process group once `count` work files match `pattern` (the run is mid-stage)."""
    import os
    import signal
    import time

    deadline = time.time() + 120
    while len(list(work_parent.glob(f".*.work-*/{pattern}"))) < count:
        assert process.poll() is None, (
            "the run finished before it could be killed: " + process.stderr.read()
        )
        assert time.time() < deadline
        time.sleep(0.01)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def test_killed_run_resumes_to_byte_identical_shards(mixed_inputs, tmp_path):
    """SIGKILL mid stage 1, rerun and SIGKILL mid stage 3, rerun to the end: the finished chunks are skipped and
    the dataset is byte-identical to an uninterrupted run's."""
    args = [
        "--data",
        str(mixed_inputs / "web"),
        str(mixed_inputs / "books.txt"),
        "--vocab-size",
        "300",
        "--chunk-mb",
        str(2 / 1024),
        "--workers",
        "2",
        "--out",
        str(tmp_path / "ds"),
        "--cleaning",
        "web",
    ]  # books.txt through the funnel: the streaming engine
    kill_when(run_prepare(args), tmp_path, "s1-*.json", 5)
    (tmp_path / ".ds.tmp-killed").mkdir()  # as a kill during publishing would leave it
    kill_when(run_prepare(args), tmp_path, "s3-*.json", 1)
    finished = run_prepare(args)
    _, err = finished.communicate(timeout=300)
    assert finished.returncode == 0, err
    assert "done before" in err and "docs/s" in err and "MB/s" in err and "ETA" in err
    assert [p.name for p in tmp_path.iterdir()] == [
        "ds"
    ]  # work folder and the stale .tmp- folder gone
    whole = data_at_scale.prepare(
        [str(mixed_inputs / "web"), str(mixed_inputs / "books.txt")],
        tmp_path / "whole",
        vocab_size=300,
        workers=1,
        clean_settings=data.CleanSettings(cleaning="web"),
    )
    assert dataset_files(tmp_path / "ds") == dataset_files(whole)
    assert not [
        name for name in data_at_scale._PROCESS_CACHE if str(tmp_path) in name
    ]  # steps run here: freed


KILL_IN_JOIN = """
import os, pathlib, signal, sys
sys.path.insert(0, {root!r})
from machinery import data_at_scale
boilerplate_range = data_at_scale.boilerplate_range


def boilerplate_range_then_die(job, chunk_count, low, high):
    boilerplate_range(job, chunk_count, low, high)
    # >= 2, not == 2: two workers finishing together can take the count from 1 to 3 at once
    if len(list(pathlib.Path(job.work).glob("boilerplate-*.npy"))) >= 2:
        os.killpg(0, signal.SIGKILL)                # this process and its workers


data_at_scale.boilerplate_range = boilerplate_range_then_die
data_at_scale.prepare([{corpus!r}], {out!r}, vocab_size=300, workers={workers}, chunk_mb=16 / 1024)
"""


def test_killed_join_resumes_from_its_finished_ranges(tmp_path, capsys):
    """SIGKILL once 2 ranges of the boilerplate join are written: a rerun with the same ranges joins only the
    others; a rerun with other ranges (1 worker's 4 after 2 workers' 8) takes none of the old files for one of its
    own. Both write the in-memory engine's bytes."""
    import signal

    corpus = write_jsonl(tmp_path / "web.jsonl", chained_corpus(random.Random(8))[0])
    reference = dataset_files(
        dataset.prepare([str(corpus)], tmp_path / "reference", vocab_size=300)
    )
    for killed_with, done_before in ((1, " (2 done before)"), (2, "")):
        script = KILL_IN_JOIN.format(
            root=str(ROOT), corpus=str(corpus), out=str(tmp_path / "ds"), workers=killed_with
        )
        killed = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=300,
            start_new_session=True,
        )
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        out = data_at_scale.prepare(
            [str(corpus)],
            tmp_path / "ds",
            vocab_size=300,
            workers=1,
            chunk_mb=16 / 1024,
            verbose=True,
        )
        progress = capsys.readouterr().err
        assert re.search(rf"boilerplate join: 4 ranges{re.escape(done_before)}\n", progress), (
            progress
        )
        assert dataset_files(out) == reference
        shutil.rmtree(out)


RSS_SCRIPT = """
import sys
sys.path.insert(0, {root!r})
from machinery import data_at_scale
data_at_scale.prepare([{corpus!r}], {out!r}, vocab_size=300, tokenizer_train_bytes=200_000, workers=1, chunk_mb=0.5)
print(data_at_scale._peak_rss_mb())
"""


def peak_rss_mb(corpus: pathlib.Path, out: pathlib.Path) -> float:
    """A prepare's peak RSS in a fresh process: its own (Linux's VmHWM). getrusage's ru_maxrss would keep the peak
    of the process that forked it (pytest: ~300 MB) across exec, and so hide any growth below that."""
    if not pathlib.Path("/proc/self/status").exists():
        pytest.skip("a child's own peak memory is read from Linux's /proc/self/status")
    script = RSS_SCRIPT.format(root=str(ROOT), corpus=str(corpus), out=str(out))
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    return float(done.stdout.split()[-1])


@pytest.mark.long  # run by .ci/run (RUN_LONG=1): keeps `python -m pytest` near 15 minutes
def test_peak_memory_does_not_grow_with_the_corpus(tmp_path):
    """A corpus twice as large (15 MB -> 29 MB of web text) costs the streaming engine (one process) no more than a
    few MB more at peak (measured +5 MB); the in-memory engine, ~5 bytes of RAM per byte of text, would add ~70 MB.
    Both are past the size where the engine's buffers fill: from 1.5 MB to 15 MB the peak still rises as they fill
    (252 -> 276 MB), and a lighter start-up (the move of issue 44: 268 -> 252 MB at 1.5 MB) made that warm-up
    visible."""
    sizes = {"large": range(10), "larger": range(20)}  # seeds of 1,800 documents each: the same mix
    peaks = {}
    for name, seeds in sizes.items():
        corpus = tmp_path / f"{name}.jsonl"
        write_jsonl(corpus, [d for seed in seeds for d in web_corpus(random.Random(seed), 1800)])
        peaks[name] = peak_rss_mb(corpus, tmp_path / name)
    assert peaks["larger"] < peaks["large"] + 25, peaks


CUT_SCRIPT = """
import collections, pathlib, sys
sys.path.insert(0, {root!r})
from machinery import data_at_scale
before = data_at_scale._peak_rss_mb()
blocks = data_at_scale.read_text_blocks(pathlib.Path({path!r}))
stream = data_at_scale.split_text_stream(blocks, "eot")
pieces = sum(1 for _ in data_at_scale.cut_stream(stream, 16_384, collections.Counter()))
print(before, data_at_scale._peak_rss_mb(), pieces)
"""


@pytest.mark.long  # run by .ci/run (RUN_LONG=1): keeps `python -m pytest` near 15 minutes
def test_peak_memory_of_kept_whole_text_does_not_grow_with_the_file(tmp_path):
    """A .txt kept whole 10x larger (1.8 MB -> 18 MB, one document: no <|endoftext|>) costs the streaming engine
    (one process) ~1 MB more at peak (the in-memory engine: +230 MB), measured as the child's own peak; reading it
    and cutting its 1,101 pieces raises the peak by 1.5-2.6 MB (read as one string: +31 MB)."""
    rng = random.Random(3)
    book = "\n\n".join(random_doc(rng, rng.randint(20, 200)) for _ in range(2500)) + "\n"
    small, large = tmp_path / "small.txt", tmp_path / "large.txt"
    small.write_text(book)
    large.write_text(book * 10)
    small_mb, large_mb = peak_rss_mb(small, tmp_path / "s"), peak_rss_mb(large, tmp_path / "l")
    assert large_mb < small_mb + 10, (small_mb, large_mb)
    cut = CUT_SCRIPT.format(root=str(ROOT), path=str(large))  # the reader and cutter alone
    before, after, pieces = map(
        float,
        subprocess.run(
            [sys.executable, "-c", cut], capture_output=True, text=True, timeout=600
        ).stdout.split(),
    )
    assert pieces > 1000 and after - before < 10, (
        before,
        after,
    )  # MB: a few blocks, not the 18 MB text


def test_progress_reports_the_process_own_peak_memory_not_its_parents():
    """The progress lines' peak RSS is the process's own (VmHWM): a child started by a parent holding 600 MB more
    reports its own few hundred MB, where getrusage's ru_maxrss (kept across exec) would report the parent's peak."""
    if not pathlib.Path("/proc/self/status").exists():
        pytest.skip("a process's own peak memory is read from Linux's /proc/self/status")
    ballast = b"x" * (600 << 20)  # touched pages: the parent's RSS grows by 600 MB
    script = (
        "import resource, sys; sys.path.insert(0, {!r}); from machinery import data_at_scale; "
        "print(data_at_scale._peak_rss_mb(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)"
    ).format(str(ROOT))
    own, inherited = map(
        float,
        subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
        ).stdout.split(),
    )
    del ballast
    assert inherited > 600 and own < inherited - 400, (own, inherited)


def test_bad_inputs_name_the_file_exit_2_and_write_nothing(tmp_path):
    good = random_doc(random.Random(0), 80)
    cases = {}
    bad_gz = tmp_path / "gz"
    bad_gz.mkdir()
    write_jsonl(bad_gz / "a.jsonl", [good])
    (bad_gz / "b.jsonl.gz").write_bytes(
        gzip.compress(
            ("".join(json.dumps({"text": good + str(i)}) + "\n" for i in range(500))).encode()
        )[:300]
    )
    cases[bad_gz] = "b.jsonl.gz: damaged gzip"
    no_column = tmp_path / "pq"
    no_column.mkdir()
    write_jsonl(no_column / "a.jsonl", [good])
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"body": [good]}), no_column / "b.parquet")
        cases[no_column] = "b.parquet: no column 'text'"
    except ImportError:
        pass
    binary = tmp_path / "bin"
    binary.mkdir()
    write_jsonl(binary / "a.jsonl", [good])
    (binary / "b.txt").write_bytes(b"\x00\x01\x02" * 100)
    cases[binary] = "b.txt looks binary"
    import os

    if os.geteuid() != 0:  # root reads any file whatever its mode
        unreadable = tmp_path / "perm"
        unreadable.mkdir()
        write_jsonl(unreadable / "a.jsonl", [good])
        write_jsonl(unreadable / "b.jsonl", [good]).chmod(0)
        cases[unreadable] = "b.jsonl: cannot read it"
    for directory, message in cases.items():
        process = run_prepare(
            [
                "--data",
                str(directory),
                "--out",
                str(tmp_path / "out"),
                "--vocab-size",
                "260",
                "--workers",
                "2",
            ]
        )
        _, err = process.communicate(timeout=120)
        lines = [
            line for line in err.splitlines() if not line.startswith("  ")
        ]  # progress lines are indented
        assert process.returncode == 2 and len(lines) == 1 and message in lines[0], err
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(d.name for d in cases), err


# ---------------------------------------------------------------------------------------------------------------------
# issue 24: data.py (absurd mixes, a dataset without val, modes for others to read, a full disk, unreachable stores)
# ---------------------------------------------------------------------------------------------------------------------

QUICK = dict(
    vocab_size=257,
    clean_settings=data.CleanSettings(filters="none", near_dup_threshold=0, mask_pii=False),
)


def two_corpora(tmp_path: pathlib.Path) -> list[str]:
    rng = random.Random(24)
    return [
        str(write_jsonl(tmp_path / f"{name}.jsonl", [random_doc(rng, 60) for _ in range(12)]))
        for name in ("a", "b")
    ]


def test_a_mix_that_repeats_a_source_over_100_times_is_refused_before_anything_is_written(tmp_path):
    """Weights 1 and 5,000 pass the ratio bound (a million), but under the covering budget they read b about 5,000
    times: refused once the tokens are counted, with nothing left behind (the old code wrote 5,000 passes)."""
    sources = two_corpora(tmp_path)
    with pytest.raises(
        DataError, match=r"would be read [\d.e+]+ times, more than 100 epochs.*\(weights\)"
    ):
        dataset.prepare(sources, tmp_path / "out", weights=[1, 5000], **QUICK)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "b.jsonl"]
    with pytest.raises(DataError, match="more than 1,000,000"):
        dataset.prepare(sources, tmp_path / "out", weights=[1e-300, 1], **QUICK)
    with pytest.raises(DataError, match="more than 100 epochs"):
        data.mixture_plan({"math": 1.0}, 1e12, {"math": 1e9})
    with pytest.raises(DataError, match="at least 1 token"):
        data.mixture_plan({"math": 1.0}, 1e9, {"math": 1e-300})  # was a plan of inf epochs
    assert data.mixture_plan({"a": 1, "b": 1e6}, 1e6 + 1, {"a": 1, "b": 1e6})["a"][
        "epochs"
    ] == pytest.approx(1.0)


def test_inspect_of_a_dataset_without_val_shows_a_train_window(tmp_path, capsys):
    """--val-fraction 0 gives a val split of no shards: inspect reports train and decodes a train window."""
    out = dataset.prepare(two_corpora(tmp_path)[:1], tmp_path / "ds", val_fraction=0, **QUICK)
    assert data.load_manifest(out)["splits"]["val"]["shards"] == []
    assert data_command.main(["inspect", str(out), "--tokens", "16"]) == 0
    printed = capsys.readouterr().out
    assert (
        "  val: 0 documents" in printed
        and "a random train window (the val split is empty), decoded:" in printed
    )
    (out / "tokenizer.json").unlink()  # was a FileNotFoundError traceback
    with pytest.raises(SystemExit) as exit_info:
        sys.exit(data_command.main(["inspect", str(out)]))
    err = capsys.readouterr().err
    assert (
        exit_info.value.code == 2
        and err.count("\n") == 1
        and "tokenizer.json: cannot read it" in err
    )
    assert err.rstrip().endswith("the dataset's tokenizer: re-run prepare")


@pytest.mark.parametrize("key", ["timings", "funnel", "mixture", "dtype"])
def test_inspect_of_a_manifest_missing_a_key_is_one_line(tmp_path, capsys, key):
    """A manifest that is valid JSON but lacks a key prepare writes: summary() raised a KeyError traceback."""
    out = dataset.prepare(two_corpora(tmp_path)[:1], tmp_path / "ds", **QUICK)
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest[key]
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SystemExit) as exit_info:
        sys.exit(data_command.main(["inspect", str(out)]))
    err = capsys.readouterr().err
    assert (
        exit_info.value.code == 2
        and err == f"error: {out}: damaged manifest.json (KeyError: '{key}'); re-run prepare\n"
    )


@pytest.mark.parametrize(
    "mask, folder_mode, file_mode",
    [(0o022, 0o755, 0o644), (0o077, 0o700, 0o600)],
    ids=["umask-022", "umask-077"],
)
def test_published_dataset_cache_and_download_get_the_umask_modes(
    tmp_path, monkeypatch, mask, folder_mode, file_mode
):
    """mkdtemp makes 0700 folders and mkstemp 0600 files; renamed into place they stayed private, so another
    account could not read a dataset. Published, every folder and file has the umask's mode: 0755/0644 under
    umask 022 (and 0700/0600 under 077: the modes follow the umask, they are not forced open)."""
    pytest.importorskip("pyarrow", reason="download reads a file:// store through pyarrow.fs")
    monkeypatch.setenv("PRETRAIN_CACHE", str(tmp_path / "cache"))
    old = __import__("os").umask(mask)
    try:
        cached = dataset.prepare(two_corpora(tmp_path)[:1], **QUICK)  # the default: the cache
        (tmp_path / "store").mkdir()
        store = f"file://{tmp_path}/store/ds"
        dataset.prepare(two_corpora(tmp_path)[:1], store, **QUICK)
        downloaded = data_at_scale.download(store, tmp_path / "down" / "ds")
    finally:
        __import__("os").umask(old)
    for root in (cached, downloaded):
        paths = [root, *root.rglob("*")]
        assert {p.name for p in paths} >= {
            "manifest.json",
            "tokenizer.json",
            "train_00000.bin",
            "val_00000.bin",
        }
        for path in paths + [root.parent]:
            assert path.stat().st_mode & 0o777 == (folder_mode if path.is_dir() else file_mode), (
                path
            )
    assert (tmp_path / "cache").stat().st_mode & 0o777 == folder_mode


FULL_DISK_RUN = """
import resource, sys
from machinery import data_at_scale, dataset
from machinery.commands import data as data_command
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), resource.getrlimit(resource.RLIMIT_FSIZE)[1]))  # ulimit -f
def reference(sources, out_dir, *, threads=None, verbose=False, workers=None, chunk_mb=None, engine=None,
              ray_address=None, work_dir=None, **recipe):     # the publish step, not the streaming engine's work files
    return dataset.prepare(sources, out_dir, threads=threads, verbose=verbose, **recipe)
data_at_scale.prepare = reference
sys.exit(data_command.main(sys.argv[2:]))
"""


@pytest.mark.parametrize(
    "vocab, limit, fails_in",
    [(300, 8000, "train"), (1000, 7000, "tokenizer")],
    ids=["in-a-shard", "in-the-tokenizer"],
)
def test_a_file_size_limit_while_publishing_is_one_line_leaves_nothing_and_a_rerun_works(
    tmp_path, monkeypatch, vocab, limit, fails_in
):
    """Under `ulimit -f` a write fails with EFBIG (on a full disk: ENOSPC), here in the train shard (vocabulary 300:
    a 17 kB shard, a 4 kB tokenizer) or in tokenizer.json (vocabulary 1,000: 5 kB and 10 kB). Either gives one line
    naming the output and the fix, exit 2, and no temp folder, temp file or empty parent; the same prepare without
    the limit then builds the dataset. (The old code: `OSError: [Errno 27] File too large` and a traceback.)"""
    corpus = tmp_path / "in" / "corpus.txt"
    corpus.parent.mkdir()
    rng = random.Random(5)
    corpus.write_text("\n\n".join(random_doc(rng, 40) for _ in range(60)))
    out = tmp_path / "out" / "ds"
    argv = [
        "prepare",
        "--data",
        str(corpus),
        "--out",
        str(out),
        "--vocab-size",
        str(vocab),
        "--filters",
        "none",
        "--near-dup-threshold",
        "0",
        "--no-pii",
    ]
    env = {**__import__("os").environ, "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1"}
    failed = subprocess.run(
        [sys.executable, "-c", FULL_DISK_RUN, str(limit), *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in failed.stderr.splitlines() if line.strip()]
    assert (
        failed.returncode == 2
        and lines[-1] == f"error: no space left writing {out}: free space or pass --out elsewhere"
        and "Traceback" not in failed.stderr
    ), failed.stderr
    assert not (tmp_path / "out").exists()  # no temp folder, no empty parent, no dataset
    monkeypatch.chdir(tmp_path)
    dataset.prepare(
        [str(corpus)],
        out,
        vocab_size=vocab,
        **{k: v for k, v in QUICK.items() if k != "vocab_size"},
    )
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["ds"]
    sizes = {p.name.split("_")[0].split(".")[0]: p.stat().st_size for p in out.iterdir()}
    assert (
        sizes[fails_in] > limit > max(size for name, size in sizes.items() if name != fails_in)
    )  # where it hit
    assert data.TokenData(out).get_batch("train", 1, 8)[0].shape == (1, 8)


def test_download_tells_an_unreachable_store_from_a_missing_dataset(tmp_path, monkeypatch):
    """Nothing listens on the endpoint: the store cannot be reached (the old message said the dataset was not
    published, sending the user to re-run prepare). A prefix without a manifest: not a published dataset."""
    pytest.importorskip("pyarrow", reason="object-store URIs go through pyarrow.fs")
    for name, value in (
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with __import__("socket").socket() as probe:  # a port that was free a moment ago: refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(
        DataError, match=r"cannot reach it \(.*connect.*\); check the bucket and key, the endpoint"
    ):
        data_at_scale.download(
            f"s3://bucket/ds?endpoint_override=127.0.0.1:{port}&scheme=http", tmp_path / "d"
        )
    with pytest.raises(DataError, match="has no manifest.json: not a published dataset"):
        data_at_scale.download(f"file://{tmp_path}/nothing-here", tmp_path / "d")
    assert sorted(p.name for p in tmp_path.iterdir()) == []
