"""bpe.py at scale: the tokenizer's lesson, run over corpora that do not fit one process or one
read.

- Training: `train_bpe_parallel` counts the pre-tokens of big files in several processes, then
  learns the merges with bpe.py's `train_on_counts`. A corpus is cut into chunks only where a new
  piece must start whatever follows (at special tokens and, for the built-in patterns, at a space
  or tab after a printable ASCII character), so counting chunk by chunk gives exactly the counts of
  one pass (tests/test_bpe.py checks it).
- Encoding: `encode_stream`, `encode_iterable` and `encode_file` encode text that arrives in pieces
  in bounded memory, with exactly the ids of encoding the whole text at once.

Depends on: bpe.py, machinery/tokenizer_files.py (existing_file) and the standard library.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Iterable, Iterator

import regex

import bpe
from machinery import tokenizer_files

# below this many bytes of input, starting processes costs more than it saves
PARALLEL_MIN_BYTES = 4 << 20


def train_bpe_parallel(
    text_or_paths,
    vocab_size: int,
    special_tokens: Iterable[str] = (bpe.EOT,),
    pattern: str = "gpt4",
    workers: int | None = None,
    errors: str = "strict",
    verbose: bool = False,
) -> bpe.Tokenizer:
    """bpe.train_bpe with the pre-tokens counted in `workers` processes (see count_pretokens)."""
    specials = bpe.check_specials(special_tokens)
    bpe.check_vocab_size(vocab_size, specials)
    pattern = bpe.resolve_pattern(pattern)
    start = time.perf_counter()
    word_counts = count_pretokens(text_or_paths, pattern, specials, workers, errors)
    if not verbose:
        return bpe.train_on_counts(word_counts, vocab_size, specials, pattern)
    print(
        f"pre-tokenized: {len(word_counts):,} distinct pieces, {sum(word_counts.values()):,} in "
        f"all ({time.perf_counter() - start:.2f}s)",
        file=sys.stderr,
    )
    wanted = vocab_size - 256 - len(specials)
    progress = MergeProgress()
    tokenizer = bpe.train_on_counts(word_counts, vocab_size, specials, pattern, progress)
    progress.report(len(tokenizer.merges), wanted)
    if len(tokenizer.merges) < wanted:
        print(
            f"stopped early: the corpus has no pairs left after {len(tokenizer.merges)} merges",
            file=sys.stderr,
        )
    return tokenizer


class MergeProgress:
    """Called after each merge; prints "merges done/wanted (rate/s)" at most once a second."""

    def __init__(self):
        self.start = self.last = time.perf_counter()

    def __call__(self, done: int, wanted: int) -> None:
        if time.perf_counter() - self.last > 1.0:
            self.report(done, wanted)

    def report(self, done: int, wanted: int) -> None:
        self.last = time.perf_counter()
        rate = done / max(self.last - self.start, 1e-9)
        print(f"merges {done:,}/{wanted:,} ({rate:,.0f}/s)", file=sys.stderr)


def count_pretokens(
    text_or_paths,
    pattern: str,
    special_tokens: Iterable[str] = (),
    workers: int | None = None,
    errors: str = "strict",
) -> Counter:
    """Frequency of every distinct pre-token, as bytes, over a text or files; in parallel for big
    inputs.

    Inputs are cut into chunks only where a new piece must start (at special tokens and, for the
    built-in patterns, at spaces after a printable ASCII character), so counting chunk by chunk
    gives exactly the counts of one pass. `workers=None` uses up to one process per core and per MiB
    when the input is over PARALLEL_MIN_BYTES (below that, starting processes costs more than it
    saves); `workers=1` stays in this process.

    >>> count_pretokens("a a a<|endoftext|>b", bpe.GPT2_PATTERN, ["<|endoftext|>"])
    Counter({b' a': 2, b'a': 1, b'b': 1})
    """
    specials = tuple(special_tokens)
    if isinstance(text_or_paths, str):
        texts, paths, total = [text_or_paths], [], len(text_or_paths)
    else:
        paths = training_files(text_or_paths)
        for path in paths:
            _check_not_binary(path)
        texts, total = [], sum(p.stat().st_size for p in paths)
    if workers is not None and workers < 1:
        raise bpe.TokenizerError(
            f"workers must be at least 1, got {workers}; leave it out to use all cores"
        )
    if workers is None:
        # >= 1 MiB each
        workers = min(os.cpu_count() or 1, total >> 20) if total > PARALLEL_MIN_BYTES else 1
    n_chunks = 4 * workers if workers > 1 else 1
    at_spaces = pattern in (bpe.GPT2_PATTERN, bpe.GPT4_PATTERN)
    tasks = [c for t in texts for c in _text_chunks(t, specials, n_chunks, at_spaces)]
    tasks += [c for p in paths for c in _file_chunks(p, specials, n_chunks, at_spaces)]
    counts = Counter()
    if workers > 1 and len(tasks) > 1:
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        with multiprocessing.get_context(method).Pool(min(workers, len(tasks))) as pool:
            results = pool.starmap(_count_chunk, [(t, pattern, specials, errors) for t in tasks])
    else:
        results = [_count_chunk(t, pattern, specials, errors) for t in tasks]
    for chunk_counts in results:
        counts.update(chunk_counts)
    return Counter({piece.encode("utf-8"): c for piece, c in counts.items()})


def training_files(paths) -> list[Path]:
    """The paths to train on (one path or a list of them), each an existing file."""
    items = [paths] if isinstance(paths, os.PathLike) else list(paths)
    if not items:
        raise bpe.TokenizerError("no input to train on: give a text or at least one file")
    if not all(isinstance(p, (str, os.PathLike)) for p in items):
        raise bpe.TokenizerError("text_or_paths must be a str of text, a path, or a list of paths")
    return [tokenizer_files.existing_file(p, "input file") for p in items]


def _check_not_binary(path: Path) -> None:
    with open(path, "rb") as f:
        head = f.read(8192)
    if b"\x00" in head:
        raise bpe.TokenizerError(
            f"{path} looks like a binary file (it contains NUL bytes); train on UTF-8 text"
        )


def _count_chunk(task, pattern: str, specials: tuple[str, ...], errors: str) -> Counter:
    """Count pre-tokens in one chunk. A task is a str of text, or (path, start, end) bytes of a
    file."""
    if isinstance(task, str):
        text = task
    else:
        path, start, end = task
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read(end - start)
        try:
            text = data.decode("utf-8", errors=errors)
        except UnicodeDecodeError as e:
            raise bpe.TokenizerError(
                f"{path}: invalid UTF-8 at byte {start + e.start}; fix the file or pass "
                f"errors='replace'"
            ) from None
    return Counter(bpe.pretokenize(text, pattern, specials))


def _cut_finder(specials: tuple[str, ...], at_spaces: bool, as_bytes: bool) -> regex.Pattern | None:
    """A regex for the places where a chunk of training text may start, so that counting chunk by
    chunk gives exactly the counts of one pass: the start of a special token (a hard boundary
    anyway), and, for the GPT-2 and GPT-4 patterns, a space or tab after a printable ASCII
    character, where a new piece starts whatever follows."""
    alternatives = [regex.escape(s) for s in sorted(specials, key=len, reverse=True)]
    if at_spaces:
        alternatives.append(r"(?<=[!-~])[ \t]")
    if not alternatives:
        return None
    pattern = "|".join(alternatives)
    return regex.compile(pattern.encode("utf-8") if as_bytes else pattern)


def _next_cut(
    data, pos: int, finder: regex.Pattern, spaced_specials: tuple, limit: int
) -> int | None:
    """The first cut at or after pos (and before limit) that is not inside a special token
    containing a space."""
    m = finder.search(data, pos)
    while m is not None and m.start() < limit:
        p = m.start()
        # an occurrence of s covers p if it starts in (p - len(s), p): is the first one from there
        # before p?
        if not any(-1 < data.find(s, max(0, p - len(s) + 1)) < p for s in spaced_specials):
            return p
        m = finder.search(data, p + 1)
    return None


def _text_chunks(text: str, specials: tuple[str, ...], n: int, at_spaces: bool) -> list[str]:
    """Split text into about n chunks at places where a new piece must start (see _cut_finder)."""
    finder = _cut_finder(specials, at_spaces, as_bytes=False)
    if n <= 1 or finder is None or len(text) < 2 * n:
        return [text]
    spaced = tuple(s for s in specials if " " in s or "\t" in s)
    cuts, target = [0], len(text) // n
    cut = _next_cut(text, target, finder, spaced, len(text))
    while cut is not None:
        cuts.append(cut)
        cut = _next_cut(text, cut + target, finder, spaced, len(text))
    cuts.append(len(text))
    return [text[a:b] for a, b in zip(cuts, cuts[1:])]


def _file_chunks(
    path: Path, specials: tuple[str, ...], n: int, at_spaces: bool
) -> list[tuple[str, int, int]]:
    """Byte ranges of a file, about n of them, cut as _text_chunks cuts text (never inside a UTF-8
    character: a cut is at an ASCII space or tab, or at a special token's first byte)."""
    size = path.stat().st_size
    finder = _cut_finder(specials, at_spaces, as_bytes=True)
    if n <= 1 or finder is None or size < 2 * n:
        return [(str(path), 0, size)]
    spaced = tuple(s.encode("utf-8") for s in specials if " " in s or "\t" in s)
    # context kept on both sides of a window
    margin = max([len(s.encode("utf-8")) for s in specials] + [1])
    cuts = [0]
    with open(path, "rb") as f:
        for k in range(1, n):
            pos, cut = max(k * size // n, cuts[-1] + 1), None
            while cut is None and pos < size:  # read 64 kB windows from pos until one holds a cut
                start = pos - min(pos, margin)
                f.seek(start)
                window = f.read(pos - start + (1 << 16) + margin)
                # judge only cuts before `limit`, so every special token that could cover one is in
                # the window
                limit = len(window) - margin if start + len(window) < size else len(window)
                found = _next_cut(window, pos - start, finder, spaced, limit)
                if found is not None:
                    cut = start + found
                pos = start + limit
            if cut is None:
                break
            cuts.append(cut)
    cuts.append(size)
    return [(str(path), a, b) for a, b in zip(cuts, cuts[1:])]


# Encoding in bounded memory.


def encode_stream(
    tokenizer: bpe.Tokenizer,
    chunks: Iterable[str],
    allowed_special=(),
    disallowed_special="all",
    fast: bool = False,
) -> Iterator[list[int]]:
    """Encode text that arrives in pieces (file blocks, lines) in bounded memory, yielding lists
    of ids.

    The ids are exactly those of encoding the whole text at once, because text is only cut where
    a new pre-token must start whatever follows: after a non-space character and before a space
    or tab, or after a letter/digit and before a newline (for GPT-2/GPT-4-style patterns no
    piece runs across those points; a custom regex must respect them too). What follows the last
    cut waits for the next chunk. `fast=True` encodes each part with `to_tiktoken()`.
    """
    encode = tokenizer.to_tiktoken().encode if fast else tokenizer.encode
    allowed, disallowed = tokenizer.special_sets(allowed_special, disallowed_special)
    # tiktoken wants sets
    specials = {"allowed_special": set(allowed), "disallowed_special": set(disallowed)}
    pending = ""
    for chunk in chunks:
        if not isinstance(chunk, str):
            raise bpe.TokenizerError(
                f"encode_stream expects str chunks, got {type(chunk).__name__}"
            )
        search_from = max(len(pending) - 1, 0)
        pending += chunk
        cut = _last_safe_cut(pending, search_from, allowed | disallowed)
        if cut > 0:
            yield encode(pending[:cut], **specials)
            pending = pending[cut:]
    if pending:
        yield encode(pending, **specials)


# a space/tab after a non-space, or a newline after a letter/digit (the lookbehinds may look
# before `pos`)
SAFE_CUT = re.compile(r"(?<=[^\s])[ \t]|(?<=[^\W_])\n")


def _last_safe_cut(text: str, search_from: int, specials: frozenset = frozenset()) -> int:
    """Index of the last safe cut in text[search_from:], or 0 if none (see encode_stream).

    Searches a window at the end first, widening it only when it holds no cut, so a 1 MB block
    costs a few microseconds rather than a scan over its ~200k spaces. A cut inside one of
    `specials` (the allowed ones, which must stay whole, and the disallowed ones, which must be
    seen whole to raise) moves to the start of that special token, including one that is still
    incomplete at the end of the text.
    """
    cut, window, search_from = 0, 4096, max(search_from, 1)
    while True:
        start = max(search_from, len(text) - window)
        for m in SAFE_CUT.finditer(text, start):
            cut = m.start()
        if cut or start == search_from:
            break
        window *= 8
    moved = True
    while moved and cut:
        moved = False
        for s in specials:
            for i in range(max(0, cut - len(s) + 1), cut):
                if text.startswith(s, i) or (len(text) - i < len(s) and s.startswith(text[i:])):
                    cut, moved = i, True
                    break
    return cut


def encode_iterable(tokenizer: bpe.Tokenizer, iterable: Iterable[str], **kwargs) -> Iterator[int]:
    """Ids one by one from an iterable of strings (e.g. an open file's lines)."""
    for ids in encode_stream(tokenizer, iterable, **kwargs):
        yield from ids


def encode_file(
    tokenizer: bpe.Tokenizer, path, chunk_chars: int = 1 << 18, errors: str = "strict", **kwargs
) -> Iterator[list[int]]:
    """Stream-encode a UTF-8 file in blocks of `chunk_chars` characters: memory stays near one
    block."""
    path = tokenizer_files.existing_file(path, "input file")
    # newline="": keep \r\n as it is
    with open(path, encoding="utf-8", errors=errors, newline="") as f:
        try:
            yield from encode_stream(tokenizer, iter(lambda: f.read(chunk_chars), ""), **kwargs)
        except UnicodeDecodeError as e:
            raise bpe.TokenizerError(
                f"{path}: invalid UTF-8 ({e.reason}); fix the file or pass errors='replace'"
            ) from None
