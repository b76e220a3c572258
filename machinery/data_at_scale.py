"""data_at_scale.py: data.py's pipeline at scale: the streaming engine, the Ray engine, and
`prepare` for both.

Serves the chapter data.py. data.py is the lesson, on in-memory lists (sources, HTML, filters,
dedup, PII, the funnel, the split, mixing, the shard format, the reference engine, the loader); this
file owns what it takes to run the same funnel over a corpus of any size: chunks of files in worker
processes with memory that does not grow with the corpus, joins by key range on disk, resuming after
a kill, Ray tasks over a cluster, and `prepare`'s engine half (work folders, stale files, the
engine's run). "The engines write byte-identical output" is this file boundary: data.py is the
reference, this file the scale, and tests/test_data*.py compare their bytes.

    python data.py prepare --data corpus.jsonl --engine stream --workers 8  # the streaming engine
    python data.py prepare --data s3://bucket/web/*.parquet --engine ray --ray-address auto \
        --out s3://bucket/ds

A stream, not a list. Holding the corpus costs ~5.5 bytes of RAM per byte of text (Python strings,
the lists of ids): FineWeb-Edu's 10B tokens are ~40 GB of text, ~220 GB of RAM. So this file runs
data.py's funnel as a stream (section 1), and data.py keeps its in-memory engine as the small,
readable reference that the tests hold this one to, byte for byte:

    global   kept-whole piece sizes   count a kept-whole source's characters up to 20 x 16,384
    stage 1  per chunk (16 MiB)       read, extract, quality filters -> cleaned text, 8-byte hash
                                      per doc, hashes of its lines (sorted run); a chunk kept whole:
                                      its pieces, a .txt read in 1 MiB blocks and cut as it streams
    join     exact dedup              per range of hash values: the first document of each hash
    join     boilerplate lines        per range of line hashes: count the documents holding each
    stage 2  per chunk                drop copies, boilerplate lines, PII -> final text; MinHash
                                      signature -> 32 band keys (sorted run); split/sample/mix keys
    join     near dedup               per range of band keys: documents sharing a key -> candidate
                                      pairs; per range of document ids: exact Jaccard, reading back
                                      only those documents; then one union-find over all the pairs
    global   split, tokenizer         the split is a coin per document: key(text, seed) <
                                      val_fraction·2^64; BPE trains on the documents with the
                                      smallest sample keys (~4 MB)
    stage 3  per chunk                encode train and val documents; with --val-data, note the val
                                      files' 13-grams each train document holds (dedup.py's overlap)
    global   mix and pack             per-source token counts and a 65,536-bucket histogram of mix
                                      keys decide how often each document is read; shards are
                                      written in order

Kept whole, streamed. chunk_document cuts a piece at the last blank line (else line break) of the
window text[start:start + size + 1], so a cutter that holds one window and one block of the file
yields its very pieces; a marker cut in two by a block's end waits for the next block. The piece
size, min(16,384, chars / 20), needs the source's characters only up to 20 x 16,383 + 1 = 327,661:
Tiny Shakespeare's count stops after its first 1 MiB block (1,048,576 of its 1,115,393 characters),
size 16,384, 69 pieces; a 10 GB book's count stops there too, and then it is cut holding ~1 MiB.
--val-data: the val files are small, train is not, so each worker hashes the val files' 13-grams (8
bytes each: 20,712 for the last 10% of Tiny Shakespeare) and looks up its train documents in them;
stage 3 reads the final text, after PII masking and near-dedup, as the in-memory engine's
in_memory.val_overlap does (dedup.py's 13-gram index).

Every stage function maps one chunk to files named by the chunk (s1-000042.txt, ...), written under
temporary names and renamed, the chunk's .json counts last: a rerun after a kill skips every chunk
with its .json, and every join range and join whose result file exists. A document's id is (chunk <<
32) | its position, so sorting ids sorts documents in input order; joins sort by (key, id); every
random choice is a keyed hash of the text. That is why any schedule (1 worker or 64, killed and
resumed, or a cluster's task scheduler running the same stage functions) writes the same bytes. The
contract an engine relies on: `plan_chunks` numbers the chunks; `stage_read`, `stage_clean` and
`stage_encode` take (Job, Chunk), read only the files of earlier steps, write only files named by
their chunk, and return the JSON counts they also save; before stage 1 run `copy_val_files` (in the
driver, with --val-data) and `kept_piece_sizes` (when a source is kept whole), between the stages,
in this order, the exact join (`exact_range` per key range, then `join_exact`), the boilerplate join
(`boilerplate_range`, `join_boilerplate`), the near-dup join (`band_join_range` per key range,
`verify_range` per range of ids, `join_near_duplicates`), `decide_split`, `draw_tokenizer_sample`
(then BPE) and, after stage 3, `encode_val_files` and `val_files_overlap` (with --val-data) and
`write_split_shards`.

A join is parallel too, by key range. Each chunk's keys (document hashes, line hashes, band keys)
are a sorted run on disk; the 64-bit key space is cut into ranges, enough for each to fit JOIN_BYTES
and at least 4 per worker (8 on 2 cores, 256 on 64). Every entry of a key lies in the one range that
holds the key, so a range is joined from its own slice of each run, knowing nothing of the others: a
unit of work like a chunk, on any worker, its result a file named by its bounds (a rerun skips it; a
run cut into other ranges never takes it for one of its own). A small final step combines the files:
exact dedup marks the documents each range kept; boilerplate concatenates the ranges' hashes (in key
order, so sorted); near-dedup first verifies each candidate pair once, per range of document ids (a
pair sharing bands in several key ranges is a candidate in each), then runs one union-find over
every verified pair, since a cluster spans ranges: C~A found in one, C~B in another (A and B not
similar) is one cluster {A, B, C}, of which only A stays, as in the in-memory engine.

Memory, per document (FineWeb-Edu 10BT: 9.7M documents of ~4 KB):
    RAM, main process   1 B survivor flag (exact dedup's final step; memory-mapped after), 16 B
                        per verified near-duplicate pair and 8 B per near-duplicate dropped
    RAM, per join task  one key range of at most JOIN_BYTES (64 MiB), whatever the corpus size
    RAM, per worker     one chunk: 16 MiB of text as Python strings and lists, ~100 MB; a
                        kept-whole .txt of any size: a 1 MiB block, one piece, 40 B per piece
    disk (work files)   the text twice at most (stage 1's is deleted when stage 2 is done), 12 B
                        of document hash, ~20 B/line of line hashes, 32 bands x 12 B = 384 B of
                        band keys, ~2 B per token; removed when the dataset is published

On a cluster, `prepare --engine ray` (section 2) makes that scheduler Ray: one task per chunk and
stage, per range of a join, per join's final step and per split's shards, calling these very
functions on the same work files (on storage every node sees). The output is byte-identical to the
local engine's for the reasons above, and one more: a task only writes files (temporary name, then
rename) that a rerun writes again identically, so Ray may rerun a task whose worker died.

A cluster's corpus and datasets live in an object store. `--data` and `--out` take URIs that
pyarrow.fs opens (s3://bucket/web/*.parquet, gs://, hdfs://, file://; store.py). A chunk names its
object by URI and each task opens it itself: a .jsonl range is one seek and sequential reads, a
.parquet row group a byte range. The work files stay on a POSIX folder (`--work-dir`, on a cluster
one every node mounts), since they are renamed, appended and memory-mapped; the dataset is published
to the store by store.publish (manifest last), and `python data.py download` (`download`, section 4)
copies one down for the loader, which memory-maps shards. The engine's flags of `python data.py
prepare` are this file's too (`ENGINE_FLAGS`), checked by `prepare` before any work.

A job that dies leaves nothing running and nothing it should not: a worker process asks the kernel
to kill it when its parent dies (prctl PR_SET_PDEATHSIG on Linux, and a check of its parent's pid),
so a SIGKILLed `prepare` frees its workers' memory at once; a Ray started here keeps its session
files in the work folder, removed with it; the dataset's files and folders get the umask's modes
(fileio.publish_tree); and a full disk, a quota or `ulimit -f` is the one line "no space left
writing PATH: free space or pass --out elsewhere".

Depends on: numpy, the standard library, and data.py's siblings: data.py (the steps, the recipe, the
shard format), dataset.py (the plan, the publishing of the directory), formats.py (a .jsonl byte
range, a .parquet row group, DataError), bpe.py (the tokenizer), dedup.py (MinHash band keys, pairs,
union-find, exact Jaccard, the 13-gram index), store.py (object-store URIs) and fileio.py (work
files written whole, a full disk in one line). Optional: ray (`--engine ray`), pyarrow (.parquet and
URIs).
"""

from __future__ import annotations

import array
import codecs
import collections
import concurrent.futures
import contextlib
import ctypes
import dataclasses
import datetime
import gc
import glob
import gzip
import hashlib
import itertools
import json
import logging
import multiprocessing
import os
import pathlib
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import zlib
from typing import Callable, Iterable, Iterator

import numpy as np

import bpe
import data
from machinery import cleaning
from machinery import dataset
import dedup
from machinery import fileio
from machinery import in_memory
from machinery import formats
from machinery import store
from data import DataError


# --------------------------------------------------------------------------------------------------
# 1. The streaming engine: the same funnel over chunks of files, in worker processes, with memory
#    that does not grow with the corpus, resumable after a kill. See the module docstring for the
#    design and its arithmetic.
# --------------------------------------------------------------------------------------------------

CHUNK_BYTES = 16 << 20  # input bytes per chunk: the unit of parallel work and of resuming
JOIN_BYTES = 64 << 20  # memory for one key range of a join (boilerplate counts, LSH bands)


@dataclasses.dataclass(frozen=True)
class Chunk:
    """A slice of one source, read by one worker. Chunks are numbered in document order, so a
    document's stable id is (chunk index << 32) | its position in the chunk, and sorting ids sorts
    documents as the reference does."""

    index: int
    source: int  # position of its source in --data
    # None: the whole source through its own reader (named sources, --max-documents)
    path: str | None = None
    start: int = 0  # .jsonl: first byte; .parquet: first row group
    # .jsonl: byte after the last (None: to the end); .parquet: row group after the last
    stop: int | None = None
    size: int = 0  # input bytes (progress and ETA)


@dataclasses.dataclass(frozen=True)
class Job:
    """What every stage function needs, picklable: sent to worker processes (and to a cluster's
    tasks)."""

    work: str  # the work directory of this dataset
    sources: tuple[tuple[str, str], ...]  # (spec, kind) per source
    # (text_field, txt_split, skip_bad_lines, max_documents)
    read_options: tuple
    settings: data.CleanSettings
    seed: int
    val_fraction: float  # 0 with --val-data: every cleaned document trains
    bands: int
    rows: int
    # per source: its piece size if kept whole (`kept_piece_sizes`), else 0
    kept_whole: tuple[int, ...] = ()
    # --val-data: the val split is the files (`copy_val_files`)
    val_data: bool = False

    def whole(self, chunk: Chunk) -> bool:
        return bool(self.kept_whole) and self.kept_whole[chunk.source] > 0


def _check_readable(path: pathlib.Path | str) -> None:
    """One line naming an unreadable file or a .gz that is not gzip, before any work starts."""
    try:
        # an object: a 2-byte range, not a MiB
        with store.open_input(path, buffer=2, error=DataError) as f:
            head = f.read(2)
    except OSError as e:
        raise DataError(
            f"{path}: cannot read it ({e.strerror or store.first_line(e)}); fix its permissions or "
            "move it out of the input"
        ) from None
    if store.pure_path(path).suffix == ".gz" and head != b"\x1f\x8b":
        raise DataError(
            f"{path}: damaged gzip file (no gzip header); re-download or re-compress it"
        )


def plan_chunks(
    sources: list[data.Source], chunk_bytes: int = CHUNK_BYTES, text_field: str = "text"
) -> list[Chunk]:
    """Cut the sources into chunks of about chunk_bytes: an uncompressed .jsonl by byte ranges (a
    line belongs to the range holding its first byte), a .parquet by groups of row groups, any other
    file whole, a named source (or one limited by --max-documents) whole. Checks every file is
    readable first."""
    chunks: list[Chunk] = []

    def add(**fields) -> None:
        chunks.append(Chunk(len(chunks), **fields))

    for s_index, source in enumerate(sources):
        for path in source.files:
            _check_readable(path)
        if not source.files or source.max_documents is not None:
            add(source=s_index, size=sum(store.file_size(f, DataError) for f in source.files))
            continue
        for path in source.files:
            size = store.file_size(path, DataError)
            reader = formats.FILE_READERS[formats.inner_suffix(path)]
            if reader == "jsonl" and store.pure_path(path).suffix != ".gz" and size > chunk_bytes:
                for start in range(0, size, chunk_bytes):
                    add(
                        source=s_index,
                        path=str(path),
                        start=start,
                        stop=min(start + chunk_bytes, size),
                        size=min(chunk_bytes, size - start),
                    )
            elif reader == "parquet":
                meta = formats.parquet_file(path, text_field).metadata
                first, gathered = 0, 0
                for group in range(meta.num_row_groups):
                    gathered += meta.row_group(group).total_byte_size
                    if gathered >= chunk_bytes or group == meta.num_row_groups - 1:
                        add(
                            source=s_index,
                            path=str(path),
                            start=first,
                            stop=group + 1,
                            size=gathered,
                        )
                        first, gathered = group + 1, 0
            else:
                add(source=s_index, path=str(path), size=size)
    return chunks


def chunk_documents(job: Job, chunk: Chunk, stats: formats.JsonlStats) -> Iterator[str]:
    """The documents of one chunk, in order."""
    spec, kind = job.sources[chunk.source]
    text_field, txt_split, skip_bad_lines, max_documents = job.read_options
    if job.whole(chunk):
        txt_split = dataset.kept_txt_split(txt_split)
    if chunk.path is None:
        yield from formats.open_source(
            spec, text_field, txt_split, skip_bad_lines, max_documents, stats, kind
        ).documents()
        return
    path = chunk.path if store.is_uri(chunk.path) else pathlib.Path(chunk.path)
    reader = formats.FILE_READERS[formats.inner_suffix(path)]
    if reader == "jsonl":
        yield from formats.read_jsonl(
            path, text_field, skip_bad_lines, stats, chunk.start, chunk.stop
        )
    elif reader == "parquet":
        yield from formats.read_parquet(path, text_field, range(chunk.start, chunk.stop))
    else:
        yield from formats.file_source(path, {"text_field": text_field, "txt_split": txt_split})()


# A text file kept whole is read in blocks, never as one string: a 10 GB book is 10 GB of text but
# only one document. The pieces `chunk_document` cuts need a window of max_chars + 1 characters, so
# a stream holding a block and one piece yields exactly its pieces. Three steps: blocks of text ->
# documents as a stream of fragments (None ends one) -> pieces.

TEXT_BLOCK_BYTES = 1 << 20  # bytes of a kept-whole text file read at a time


def read_text_blocks(path: pathlib.Path | str, block_bytes: int | None = None) -> Iterator[str]:
    """A (possibly gzipped) UTF-8 file or object as blocks of text of block_bytes (default
    TEXT_BLOCK_BYTES), with data.py's universal newlines and read errors, never holding more than a
    block: a "\\r" at a block's end waits for the next block (it may begin a "\\r\\n"), and so do
    the 1-3 bytes of a character cut in two (the incremental decoder holds them)."""
    block_bytes = block_bytes or TEXT_BLOCK_BYTES
    decoder, offset, held = codecs.getincrementaldecoder("utf-8")(), 0, ""
    try:
        with store.open_input(
            path, unzip=store.pure_path(path).suffix == ".gz", error=DataError
        ) as f:
            head = f.read(8192)
            if b"\x00" in head:
                raise DataError(
                    f"{path} looks binary (NUL bytes); pass a UTF-8 text, .jsonl, .parquet or .gz "
                    "file"
                )
            raws = itertools.chain(
                (head[k : k + block_bytes] for k in range(0, len(head), block_bytes)),
                # b"": the end
                iter(lambda: f.read(block_bytes), b""),
                [b""],
            )
            for raw in raws:
                pending = len(decoder.getstate()[0])
                try:
                    text = held + decoder.decode(raw, final=not raw)
                except UnicodeDecodeError as e:
                    raise DataError(
                        f"{path} is not UTF-8 text (byte {offset - pending + e.start}); convert "
                        "it, e.g. with iconv"
                    ) from None
                offset += len(raw)
                held = "\r" if raw and text.endswith("\r") else ""
                text = text[: len(text) - len(held)].replace("\r\n", "\n").replace("\r", "\n")
                if text:
                    yield text
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise DataError(f"{path}: damaged gzip file ({e}); re-download or re-compress it") from None


# --txt-split mode -> (separator, the end of a text that may be the start of a separator cut by a
# block's end)
_TEXT_SEPARATORS = {
    "eot": (
        re.compile(re.escape(data.EOT)),
        re.compile(
            "(?:"
            + "|".join(re.escape(data.EOT[:k]) for k in range(len(data.EOT) - 1, 0, -1))
            + r")\Z"
        ),
    ),
    "blank": (re.compile(r"\n[ \t]*\n"), re.compile(r"\n[ \t]*\Z")),
    "file": (None, None),
}


def split_text_stream(blocks: Iterable[str], mode: str) -> Iterator[str | None]:
    """The documents of `split_plain_text(text, mode)` (before stripping), from the blocks of text,
    as fragments of text with a None after each document. A separator cut in two by a block's end is
    held back and read whole with the next block: "a<|endof" + "text|>b" -> "a", None, "b", None.

    >>> list(split_text_stream(["a<|endof", "text|>b"], "eot"))
    ['a', '', None, 'b', '', None]
    """
    if mode not in _TEXT_SEPARATORS:
        raise DataError(f"unknown txt split mode {mode!r}; use auto, eot, blank or file")
    separator, partial = _TEXT_SEPARATORS[mode]
    held = ""
    for block in blocks:
        parts = separator.split(held + block) if separator else [held + block]
        for part in parts[:-1]:
            yield part
            yield None
        last = parts[-1]
        # where an unfinished separator may be
        look = max(0, len(last) - len(data.EOT)) if mode == "eot" else 0
        tail = partial.search(last, look) if partial else None
        cut = tail.start() if tail else len(last)
        yield last[:cut]
        held = last[cut:]
    yield held
    yield None


_NON_SPACE = re.compile(r"\S")  # the same whitespace as str.strip()


def cut_stream(
    fragments: Iterable[str | None], max_chars: int, counts: collections.Counter
) -> Iterator[str]:
    """`chunk_document(document.strip(), max_chars)` for every document of a stream of fragments
    (None ends a document), holding about max_chars characters and a fragment, never a document.
    counts gets what `clean` counts of the stripped documents: read_docs (those with text),
    read_chars, read_bytes (UTF-8).

    A cut at `start` reads text[start:start + max_chars + 1] and happens when the stripped document
    goes past start + max_chars, i.e. when a non-space character lies there or later; the document's
    end is known only at its None. So with max_chars 8, "aa bb\\n\\ncc dd\\nee" arriving as "aa
    bb\\n\\ncc", " dd\\nee", None is cut once " dd" has come: ['aa bb', 'cc dd', 'ee'], as
    chunk_document cuts the whole string.

    >>> list(cut_stream(["aa bb\\n\\ncc", " dd\\nee", None], 8, collections.Counter()))
    ['aa bb', 'cc dd', 'ee']
    """
    # text[start:] is the document from the next piece on
    text, start, done, done_bytes = "", 0, 0, 0
    for fragment in fragments:
        if fragment is None:  # the document ends: its last piece
            rest = text[start:].rstrip()
            # a document with text: it has a non-space here
            if rest:
                counts["read_docs"] += 1
                counts["read_chars"] += done + len(rest)
                counts["read_bytes"] += done_bytes + len(rest.encode("utf-8"))
                yield rest.strip()
            text, start, done, done_bytes = "", 0, 0, 0
            continue
        # nothing of this document yet: strip its start
        if not text:
            fragment = fragment.lstrip()
            if not fragment:
                continue
        text, start = text[start:] + fragment, 0
        while _NON_SPACE.search(text, start + max_chars):
            cut = cleaning.cut_position(text[start : start + max_chars + 1], max_chars)
            piece = text[start : start + cut]
            if piece.strip():
                yield piece.strip()
            done += cut
            done_bytes += len(piece.encode("utf-8"))
            start += cut


def stripped_chars(fragments: Iterable[str | None], limit: int) -> int:
    """The characters of a stream's documents once stripped (what `cut_stream` counts as
    read_chars), counted until `limit` is reached; then a number >= limit. The piece size only needs
    to know that much."""
    # length: chars of this document from its first non-space; last: to its last
    total, length, last = 0, 0, 0
    for fragment in fragments:
        if fragment is None:
            total, length, last = total + last, 0, 0
            continue
        if not length:
            fragment = fragment.lstrip()
            if not fragment:
                continue
        end = len(fragment.rstrip())
        if end:
            last = length + end
        length += len(fragment)
        if total + last >= limit:
            return total + last
    return total


def _streams_text(chunk: Chunk) -> bool:
    """Whether a kept-whole chunk is a text file, read in blocks (other readers yield bounded
    documents)."""
    return (
        chunk.path is not None and formats.FILE_READERS[formats.inner_suffix(chunk.path)] == "txt"
    )


def _text_fragments(job: Job, chunk: Chunk) -> Iterator[str | None]:
    """The documents of a kept-whole text file as a stream of fragments (`split_text_stream`)."""
    path = chunk.path if store.is_uri(chunk.path) else pathlib.Path(chunk.path)
    return split_text_stream(read_text_blocks(path), dataset.kept_txt_split(job.read_options[1]))


def _kept_documents(job: Job, chunk: Chunk, counts: collections.Counter) -> Iterator[str]:
    """The documents of a kept-whole chunk that is not a text file, as `clean` reads them (text
    extracted from HTML, documents of whitespace skipped), counting them."""
    kind = job.sources[chunk.source][1]
    return cleaning.read_documents(
        chunk_documents(job, chunk, formats.JsonlStats()), kind, None, counts, collections.Counter()
    )


def kept_pieces(job: Job, chunk: Chunk, counts: collections.Counter) -> Iterator[str]:
    """The pieces of a kept-whole chunk: `chunk_document(document, size)` of each of its documents,
    a text file's streamed in blocks (`cut_stream`)."""
    size = job.kept_whole[chunk.source]
    if _streams_text(chunk):
        yield from cut_stream(_text_fragments(job, chunk), size, counts)
        return
    for doc in _kept_documents(job, chunk, counts):
        yield from cleaning.chunk_document(doc, size)


def kept_piece_sizes(job: Job, chunks: list[Chunk]) -> tuple[int, ...]:
    """Job.kept_whole: the piece size of each kept-whole source (job.kept_whole > 0 marks them), 0
    for the others. The size needs the source's characters only up to 20 x (chunk_chars - 1) + 1
    (`kept_piece_size`), so a counting pass stops there: Tiny Shakespeare's after its first 1 MiB
    block (1,048,576 of 1,115,393 characters), a 10 GB book's too; a small file is counted whole."""
    chunk_chars = job.settings.chunk_chars
    # from here on the size is chunk_chars
    limit = cleaning.KEPT_MIN_PIECES * (chunk_chars - 1) + 1
    sizes = []
    for s_index, whole in enumerate(job.kept_whole):
        chars, counts = 0, collections.Counter()
        for chunk in (c for c in chunks if c.source == s_index and whole):
            if chars >= limit:
                break
            if _streams_text(chunk):
                chars += stripped_chars(_text_fragments(job, chunk), limit - chars)
                continue
            for doc in _kept_documents(job, chunk, counts):
                chars += len(doc)
                if chars >= limit:
                    break
        # before any stage: one line, nothing left
        if whole and not chars and not counts["read_docs"]:
            raise DataError(
                f"source {job.sources[s_index][0]!r} has no documents (empty file or wrong "
                "`text_field`?)"
            )
        sizes.append(max(1, cleaning.kept_piece_size(chars, chunk_chars)) if whole else 0)
    return tuple(sizes)


# Work files. Stage s of chunk c writes ws-c.* files, each through a temporary name, and then
# ws-c.json with its counts: the marker that the chunk is done. A global step writes its result file
# last. A rerun skips what exists.


def _work(job: Job, name: str) -> pathlib.Path:
    return pathlib.Path(job.work) / name


def _chunk_file(job: Job, stage: int, chunk: int, name: str) -> pathlib.Path:
    return pathlib.Path(job.work) / f"s{stage}-{chunk:06d}.{name}"


class DiskFull(DataError):
    """A full disk, a quota or ulimit -f while writing the work files: the work so far stays, for
    the rerun."""


def _write_work(path: pathlib.Path, content) -> None:
    """A work file written whole (temporary name, then rename: a kill never leaves half of one),
    without fsync: a rerun after a crash of the machine redoes the chunk anyway. A full disk is
    data.py's one line."""
    fileio.write_atomic(path, content, error=DiskFull, fix=dataset.NO_SPACE_FIX, fsync=False)


def _no_space(error: OSError, path) -> DiskFull:
    """The one line for a full disk, a quota or ulimit -f met while writing `path` (or the file the
    error names)."""
    return DiskFull(
        fileio.no_space_message(getattr(error, "filename", None) or path, dataset.NO_SPACE_FIX)
    )


def _save_array(path: pathlib.Path, array: np.ndarray) -> None:
    _write_work(path, lambda f: np.save(f, array))


def _load_array(path: pathlib.Path) -> np.ndarray:
    """A saved array, memory-mapped (pages are read on touch; empty arrays cannot be mapped)."""
    try:
        return np.load(path, mmap_mode="r")
    except ValueError:
        return np.load(path)


def _save_json(path: pathlib.Path, value) -> None:
    _write_work(path, json.dumps(value, sort_keys=True))


class _TextSpill:
    """Documents appended to one file as UTF-8, with byte offsets: written under a temporary name,
    renamed at close."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path
        fd, self.tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        self.file, self.offsets = os.fdopen(fd, "wb"), [0]

    def add(self, text: str) -> int:
        data = text.encode("utf-8")
        self.file.write(data)
        self.offsets.append(self.offsets[-1] + len(data))
        return len(self.offsets) - 2

    def close(self) -> np.ndarray:
        self.file.close()
        os.replace(self.tmp, self.path)
        return np.array(self.offsets, dtype=np.int64)

    def discard(self) -> None:
        # closing flushes the buffer: on a full disk that fails again
        with contextlib.suppress(OSError):
            self.file.close()
        os.unlink(self.tmp)


def _read_texts(
    path: pathlib.Path, offsets: np.ndarray, which: Iterable[int] | None = None
) -> Iterator[str]:
    """Documents of a text spill: all of them in order, or those at the positions `which` (ascending
    is fastest)."""
    with open(path, "rb") as f:
        for i in range(len(offsets) - 1) if which is None else which:
            f.seek(int(offsets[i]))
            yield f.read(int(offsets[i + 1] - offsets[i])).decode("utf-8")


def line_hash(line: str) -> int:
    """64-bit hash of a stripped line: what the streaming engine counts across documents instead of
    the line."""
    return int.from_bytes(hashlib.blake2b(line.encode("utf-8"), digest_size=8).digest(), "little")


def stage_read(job: Job, chunk: Chunk) -> dict:
    """Stage 1, one chunk: read -> extract text (HTML) -> quality filters. Writes the surviving
    documents (s1-C.txt + s1-C.offsets.npy), the sorted run of (8-byte exact-dedup hash, document)
    (s1-C.doc_hash.npy, s1-C.hash_doc.npy) and, for prose, the sorted run of (line hash, document)
    of its countable lines (s1-C.line_hash.npy, s1-C.line_doc.npy). A chunk kept whole writes its
    pieces instead (`kept_pieces`), with empty runs: dedup passes them by."""
    spec, kind = job.sources[chunk.source]
    rule_name, rule = cleaning.quality_rule(kind, job.settings)
    counts, reasons, jsonl = collections.Counter(), collections.Counter(), formats.JsonlStats()
    hashes, line_hashes, line_docs = [], [], []
    spill = _TextSpill(_chunk_file(job, 1, chunk.index, "txt"))
    try:
        # kept whole: the pieces' characters (not the documents' ones)
        pieces = [0]
        for piece in kept_pieces(job, chunk, counts) if job.whole(chunk) else ():
            # no hash: exact dedup never sees it (join_exact keeps every piece)
            spill.add(piece)
            pieces.append(len(piece))
        if job.whole(chunk):
            counts["kept_chars"] = sum(pieces)
        documents = () if job.whole(chunk) else chunk_documents(job, chunk, jsonl)
        for doc in cleaning.read_documents(documents, kind, rule, counts, reasons):
            local = spill.add(doc)
            hashes.append(data.document_hash(doc))
            # distinct long lines, or (CS336's line dedup) every line occurrence
            if kind != "code":
                for line in (
                    data.countable_lines(doc)
                    if job.settings.line_dedup == "documents"
                    else [raw.rstrip("\n") for raw in data.LINE.findall(doc)]
                ):
                    line_hashes.append(line_hash(line))
                    line_docs.append(local)
        offsets = spill.close()
    except OSError as e:
        spill.discard()
        # the disk of the work files is full: the input is not to blame
        if fileio.is_no_space(e):
            raise _no_space(e, spill.path) from None
        raise DataError(
            f"{chunk.path or spec}: cannot read it ({e.strerror or e}); fix or remove the file"
        ) from None
    except BaseException:
        spill.discard()
        raise
    line_hashes = np.array(line_hashes, dtype=np.uint64)
    line_docs = np.array(line_docs, dtype=np.uint32)
    order = np.lexsort((line_docs, line_hashes))  # a sorted run, by hash
    hashes = np.array(hashes, dtype=np.uint64)
    # another, of the document hashes
    by_hash = np.argsort(hashes, kind="stable")
    _save_array(_chunk_file(job, 1, chunk.index, "offsets.npy"), offsets)
    _save_array(_chunk_file(job, 1, chunk.index, "doc_hash.npy"), hashes[by_hash])
    _save_array(_chunk_file(job, 1, chunk.index, "hash_doc.npy"), by_hash.astype(np.uint32))
    _save_array(_chunk_file(job, 1, chunk.index, "line_hash.npy"), line_hashes[order])
    _save_array(_chunk_file(job, 1, chunk.index, "line_doc.npy"), line_docs[order])
    result = {
        "source": chunk.source,
        "docs": len(offsets) - 1,
        "counts": dict(counts),
        "reasons": dict(reasons),
        "jsonl_skipped": jsonl.skipped,
        "line_entries": len(line_hashes),
    }
    _save_json(_chunk_file(job, 1, chunk.index, "json"), result)
    return result


# The joins, by key range (the module docstring says why ranges are independent): a range is a unit
# of work like a chunk, run on any worker, its result a file named by its bounds; a final step per
# join combines the files. Range functions take the number of chunks, not the chunks: each of a
# cluster's hundreds of tasks gets a few bytes.


def _range_count(entries: int, workers: int) -> int:
    """How many ranges a join of `entries` entries takes: enough for each to fit JOIN_BYTES (16
    bytes an entry while joining), and at least 4 per worker, so that 2 cores and 64 both have work
    and a slow range does not hold up the rest.

    >>> _range_count(10, workers=2), _range_count(10**9, workers=2)  # 10^9 x 16 B / 64 MiB = 238.4
    (8, 239)
    """
    return max(-(-entries * 16 // JOIN_BYTES), 4 * workers)


def _key_ranges(entries: int, workers: int = 1) -> list[tuple[int, int]]:
    """The 64-bit key space cut into _range_count(entries, workers) equal ranges [low, high), in
    order.

    >>> _key_ranges(10, workers=1)[1:3]
    [(4611686018427387904, 9223372036854775808), (9223372036854775808, 13835058055282163712)]
    """
    parts = _range_count(entries, workers)
    bounds = [data.KEY_RANGE * p // parts for p in range(parts + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def _run_slice(keys: np.ndarray, low: int, high: int) -> slice:
    """Positions of a sorted uint64 run whose keys lie in [low, high)."""
    start = int(np.searchsorted(keys, np.uint64(low), side="left"))
    stop = len(keys)
    if high < data.KEY_RANGE:
        stop = int(np.searchsorted(keys, np.uint64(high), side="left"))
    return slice(start, stop)


def _range_of_runs(
    job: Job, stage: int, chunk_count: int, key_file: str, doc_file: str, low: int, high: int
) -> tuple[np.ndarray, np.ndarray]:
    """(keys, stable document ids) of every chunk's sorted run (sS-C.KEY_FILE, sS-C.DOC_FILE) within
    [low, high): the whole of a join's input for that range, in chunk order."""
    keys, ids = [np.zeros(0, dtype=np.uint64)], [np.zeros(0, dtype=np.int64)]
    for chunk in range(chunk_count):
        run = _load_array(_chunk_file(job, stage, chunk, key_file))
        part = _run_slice(run, low, high)
        keys.append(np.asarray(run[part]))
        docs = _load_array(_chunk_file(job, stage, chunk, doc_file))[part]
        ids.append((np.int64(chunk) << 32) | docs.astype(np.int64))
    return np.concatenate(keys), np.concatenate(ids)


def _range_file(job: Job, name: str, low: int, high: int) -> pathlib.Path:
    """The result file of the range [low, high) of a join, named by its bounds."""
    return pathlib.Path(job.work) / f"{name}-{low:016x}-{high:016x}.npy"


def _range_results(
    job: Job, name: str, ranges: list[tuple[int, int]], empty: np.ndarray
) -> np.ndarray:
    """The result files of a join's ranges, concatenated in range order (`empty` when there are
    none)."""
    return np.concatenate(
        [empty] + [np.asarray(_load_array(_range_file(job, name, *r))) for r in ranges]
    )


def exact_range(job: Job, chunk_count: int, low: int, high: int) -> None:
    """Exact dedup of the documents whose hash lies in [low, high): the first (smallest id) of each
    hash group stays. Writes the sorted ids that stay (exact-LOW-HIGH.npy)."""
    hashes, ids = _range_of_runs(job, 1, chunk_count, "doc_hash.npy", "hash_doc.npy", low, high)
    order = np.lexsort((ids, hashes))
    first = np.ones(len(order), dtype=bool)
    first[1:] = hashes[order][1:] != hashes[order][:-1]
    _save_array(_range_file(job, "exact", low, high), np.sort(ids[order][first]))


def join_exact(job: Job, chunks: list[Chunk], ranges: list[tuple[int, int]]) -> None:
    """Exact dedup, the final step: mark the documents that the ranges kept, and every piece of a
    kept-whole chunk. Writes exact_keep.npy (one bool per stage-1 document, chunks in order: 1 byte
    a document) and doc_starts.npy (the first position of each chunk)."""
    sizes = [len(_load_array(_chunk_file(job, 1, c.index, "offsets.npy"))) - 1 for c in chunks]
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    keep = np.zeros(starts[-1], dtype=bool)
    for r in ranges:
        kept = np.asarray(_load_array(_range_file(job, "exact", *r)))
        keep[starts[kept >> 32] + (kept & 0xFFFFFFFF)] = True
    for c in chunks:  # pieces kept whole: not in the hash runs, all stay
        if job.whole(c):
            keep[starts[c.index] : starts[c.index + 1]] = True
    _save_array(_work(job, "doc_starts.npy"), starts)
    _save_array(_work(job, "exact_keep.npy"), keep)


def boilerplate_range(job: Job, chunk_count: int, low: int, high: int) -> None:
    """The boilerplate lines whose hash lies in [low, high) (boilerplate-LOW-HIGH.npy, sorted):
    count, per line hash, the documents that survive exact dedup and hold it."""
    keep = _load_array(_work(job, "exact_keep.npy"))
    starts = _load_array(_work(job, "doc_starts.npy"))
    hashes, ids = _range_of_runs(job, 1, chunk_count, "line_hash.npy", "line_doc.npy", low, high)
    alive = keep[starts[ids >> 32] + (ids & 0xFFFFFFFF)]
    values, counts = np.unique(hashes[alive], return_counts=True)
    least = job.settings.boilerplate_min_documents if job.settings.line_dedup == "documents" else 2
    _save_array(_range_file(job, "boilerplate", low, high), values[counts >= least])


def join_boilerplate(job: Job, ranges: list[tuple[int, int]]) -> None:
    """Boilerplate lines, the final step: the ranges' hashes in range order, so sorted
    (boilerplate.npy)."""
    _save_array(
        _work(job, "boilerplate.npy"),
        _range_results(job, "boilerplate", ranges, np.zeros(0, np.uint64)),
    )


# per worker process: the boilerplate set, the MinHasher, the tokenizer
_PROCESS_CACHE: dict = {}


def _cached(name: str, make: Callable):
    if name not in _PROCESS_CACHE:
        _PROCESS_CACHE[name] = make()
    return _PROCESS_CACHE[name]


def _in_sorted(values: np.ndarray, members: np.ndarray) -> np.ndarray:
    """(len(values),) bool: which values occur in `members`, a sorted array (boilerplate.npy, a
    join's ranges concatenated in key order): one binary search each, where np.isin would sort the
    members again per call.

    >>> a, b = np.array([5, 1, 9], dtype=np.uint64), np.array([1, 5, 7], dtype=np.uint64)
    >>> _in_sorted(a, b).tolist()
    [True, True, False]
    """
    if not len(members):
        return np.zeros(len(values), dtype=bool)
    at = np.minimum(np.searchsorted(members, values), len(members) - 1)
    return members[at] == values


def _remove_boilerplate(
    texts: list[str], boilerplate: np.ndarray, marked: list[bool]
) -> tuple[list[str], int]:
    """(texts without their boilerplate lines, lines removed): `remove_lines` with hashed lines.
    Only the marked texts (`stage_clean`) can lose a line; the others are stripped, as remove_lines
    strips every text."""
    out, removed = [], 0
    for text, check in zip(texts, marked):
        lines = text.split("\n") if check else []
        hits = _in_sorted(
            np.array([line_hash(line.strip()) for line in lines], dtype=np.uint64), boilerplate
        )
        kept = [
            line
            for line, hit in zip(lines, hits.tolist())
            if not hit or len(line.split()) < data.BOILERPLATE_MIN_WORDS
        ]
        out.append(("\n".join(kept) if check else text).strip())
        removed += len(lines) - len(kept)
    return out, removed


def _drop_repeated_lines(
    texts: list[str], repeated: np.ndarray, marked: list[bool]
) -> tuple[list[str], int]:
    """(texts without the lines whose hash is in `repeated`, lines removed): `drop_lines` with
    hashed lines, on the marked texts only (`stage_clean`)."""
    out, removed = [], 0
    for text, check in zip(texts, marked):
        lines = data.LINE.findall(text) if check else []
        hits = _in_sorted(
            np.array([line_hash(raw.rstrip("\n")) for raw in lines], dtype=np.uint64), repeated
        ).tolist()
        out.append("".join(raw for raw, hit in zip(lines, hits) if not hit) if check else text)
        removed += sum(hits)
    return out, removed


def _band_keys(signatures: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """One 64-bit key per (document, band): (N, bands) uint64, `dedup.band_key` of band b's rows
    with b itself in front, so keys of different bands differ. Two documents share a key when they
    agree on every row of that band (or, with odds ~2^-64, by collision, which verification
    rejects)."""
    out = np.empty((len(signatures), bands), dtype=np.uint64)
    for band in range(bands):
        band_index = np.full((len(signatures), 1), band, dtype=np.uint64)
        out[:, band] = dedup.band_key(
            np.hstack([band_index, signatures[:, band * rows : (band + 1) * rows]])
        )
    return out


def stage_clean(job: Job, chunk: Chunk) -> dict:
    """Stage 2, one chunk: drop exact duplicates, remove boilerplate lines (prose), mask PII; then
    per document its MinHash band keys (a sorted run: s2-C.band_key.npy, s2-C.band_doc.npy) and its
    split/sample/mix keys. Writes the cleaned documents (s2-C.txt + offsets), which are the final
    text of every document that survives. A chunk kept whole only has its pieces masked, one at a
    time (a kept-whole file is one chunk, of any size)."""
    spec, kind = job.sources[chunk.source]
    start = int(_load_array(_work(job, "doc_starts.npy"))[chunk.index])
    offsets = _load_array(_chunk_file(job, 1, chunk.index, "offsets.npy"))
    keep = np.asarray(_load_array(_work(job, "exact_keep.npy"))[start : start + len(offsets) - 1])
    texts = _read_texts(
        _chunk_file(job, 1, chunk.index, "txt"), offsets, np.flatnonzero(keep).tolist()
    )
    counts = collections.Counter(docs_in=0, chars_in=0, chars_boilerplate=0)
    pii = collections.Counter()
    final = []
    # 40 bytes per document
    keys, chars, sizes = array.array("Q"), array.array("q"), array.array("q")
    if not job.whole(chunk):
        texts = list(texts)
        counts.update(docs_in=len(texts), chars_in=sum(map(len, texts)))
        if kind != "code":
            boilerplate = _cached(
                job.work + "boilerplate", lambda: np.load(_work(job, "boilerplate.npy"))
            )
            remove = _remove_boilerplate
            if job.settings.line_dedup == "occurrences":
                remove = _drop_repeated_lines
            # marked: the documents with a line in `boilerplate`, found by one lookup of stage 1's
            # run of (line hash, document); only those are split into lines again (most have none)
            found = _in_sorted(
                _load_array(_chunk_file(job, 1, chunk.index, "line_hash.npy")), boilerplate
            )
            marked = np.zeros(len(keep), dtype=bool)
            marked[_load_array(_chunk_file(job, 1, chunk.index, "line_doc.npy"))[found]] = True
            marked = marked[np.flatnonzero(keep)].tolist()
            texts, counts["lines_removed"] = remove(texts, boilerplate, marked)
            texts = [t for t in texts if t.strip()]
    spill = _TextSpill(_chunk_file(job, 2, chunk.index, "txt"))
    for text in texts:
        if job.whole(chunk):
            counts.update(docs_in=1, chars_in=len(text))
        counts["chars_boilerplate"] += len(text)
        if job.settings.mask_pii:
            text, found = data.mask_pii(text)
            pii.update({k.lower(): v for k, v in found.items()})
        spill.add(text)
        keys.extend(data.document_keys(text, job.seed))
        chars.append(len(text))
        sizes.append(len(text.encode("utf-8")))
        if not job.whole(chunk):
            # for MinHash; a kept-whole chunk is not near-deduplicated
            final.append(text)
    _save_array(_chunk_file(job, 2, chunk.index, "offsets.npy"), spill.close())
    keys = np.frombuffer(keys, dtype=np.uint64).reshape(-1, 3)
    for name, column in (("split_key", 0), ("sample_key", 1), ("mix_key", 2)):
        _save_array(
            _chunk_file(job, 2, chunk.index, f"{name}.npy"), np.ascontiguousarray(keys[:, column])
        )
    _save_array(_chunk_file(job, 2, chunk.index, "chars.npy"), np.frombuffer(chars, dtype=np.int64))
    _save_array(_chunk_file(job, 2, chunk.index, "bytes.npy"), np.frombuffer(sizes, dtype=np.int64))
    band_keys = np.zeros((0, job.bands), dtype=np.uint64)
    if job.settings.near_dup_threshold > 0 and final:
        hasher = _cached("minhash", lambda: dedup.MinHasher(data.NEAR_DUP_NUM_PERM, seed=0))
        signed = [dedup.remove_accents(t) for t in final] if job.settings.strip_accents else final
        band_keys = _band_keys(
            hasher.signatures_from_texts(signed, data.NEAR_DUP_SHINGLE), job.bands, job.rows
        )
    flat_keys = band_keys.ravel()  # (docs · bands,)
    flat_docs = np.repeat(np.arange(len(band_keys), dtype=np.uint32), job.bands)
    order = np.lexsort((flat_docs, flat_keys))
    _save_array(_chunk_file(job, 2, chunk.index, "band_key.npy"), flat_keys[order])
    _save_array(_chunk_file(job, 2, chunk.index, "band_doc.npy"), flat_docs[order])
    result = {
        "source": chunk.source,
        "docs": len(chars),
        "counts": dict(counts),
        "pii": dict(pii),
        "chars_out": int(sum(chars)),
        "band_entries": int(len(flat_keys)),
    }
    _save_json(_chunk_file(job, 2, chunk.index, "json"), result)
    return result


def _texts_by_id(job: Job, ids: np.ndarray) -> list[str]:
    """Cleaned documents by stable id ((chunk << 32) | position), in the order of `ids`
    (ascending)."""
    out = []
    for chunk in np.unique(ids >> 32).tolist():
        positions = (ids[(ids >> 32) == chunk] & 0xFFFFFFFF).tolist()
        offsets = _load_array(_chunk_file(job, 2, chunk, "offsets.npy"))
        out += _read_texts(_chunk_file(job, 2, chunk, "txt"), offsets, positions)
    return out


VERIFY_BYTES = 16 << 20  # text read back at once to verify candidate pairs


def _verify_batches(job: Job, candidates: np.ndarray) -> Iterator[np.ndarray]:
    """Consecutive runs of candidate pairs whose distinct documents hold at most VERIFY_BYTES of
    text together (a run has at least one pair): the memory of verification is bounded whatever the
    number of near-copies."""
    sizes: dict[int, np.ndarray] = {}

    def size(doc: int) -> int:
        if doc >> 32 not in sizes:
            sizes[doc >> 32] = _load_array(_chunk_file(job, 2, doc >> 32, "bytes.npy"))
        return int(sizes[doc >> 32][doc & 0xFFFFFFFF])

    start, seen, held = 0, set(), 0
    for k, pair in enumerate(candidates.tolist()):
        new = {doc for doc in pair if doc not in seen}
        grow = sum(map(size, new))
        if held + grow > VERIFY_BYTES and k > start:
            yield candidates[start:k]
            start, seen, held, new = k, set(), 0, set(pair)
            grow = sum(map(size, new))
        seen |= new
        held += grow
    if start < len(candidates):
        yield candidates[start:]


def band_join_range(job: Job, chunk_count: int, low: int, high: int) -> None:
    """Near-dedup, step 1, for the band keys in [low, high): documents sharing a key share a band,
    so every pair inside a run of equal keys is a candidate (dedup's pairs-in-groups). Writes the
    range's distinct candidate pairs, sorted (near-candidates-LOW-HIGH.npy: (pairs, 2) ids, the
    smaller first)."""
    keys, ids = _range_of_runs(job, 2, chunk_count, "band_key.npy", "band_doc.npy", low, high)
    order = np.lexsort((ids, keys))
    group = np.concatenate(([0], np.cumsum(keys[order][1:] != keys[order][:-1])))
    pairs = dedup.pairs_in_groups(ids[order], group)
    _save_array(_range_file(job, "near-candidates", low, high), np.unique(pairs, axis=0))


def _id_ranges(documents: list[int], parts: int) -> list[tuple[int, int]]:
    """The documents, in id order, cut into `parts` runs of about equal count, as [first, last) id
    bounds (empty runs left out). documents: how many each chunk has.

    >>> _id_ranges([3, 0, 2], 2)         # ids 0, 1 | 2, then chunk 2's (2 << 32) and (2 << 32) + 1
    [(0, 2), (2, 12884901888)]
    """
    # documents in the chunks before
    before = np.concatenate([[0], np.cumsum(documents)]).astype(np.int64)
    bounds = []
    for k in (int(before[-1]) * p // parts for p in range(parts + 1)):
        # the chunk holding the k-th document
        chunk = int(np.searchsorted(before, k, side="right")) - 1
        bounds.append((chunk << 32) | (k - int(before[chunk])))
    return [(first, last) for first, last in zip(bounds[:-1], bounds[1:]) if first < last]


def verify_range(job: Job, key_ranges: list[tuple[int, int]], first: int, last: int) -> None:
    """Near-dedup, step 2, for the candidate pairs whose smaller id lies in [first, last): exact
    Jaccard of their shingles, reading back only those documents. A pair that shares bands in
    several key ranges is a candidate in each, and verified here once. Writes the pairs at or above
    the threshold (near-verified-FIRST-LAST.npy)."""
    found = [np.zeros((0, 2), dtype=np.int64)]
    # each file is sorted by the smaller id: read a slice of it
    for r in key_ranges:
        pairs = _load_array(_range_file(job, "near-candidates", *r))
        found.append(
            np.asarray(
                pairs[np.searchsorted(pairs[:, 0], first) : np.searchsorted(pairs[:, 0], last)]
            )
        )
    candidates = np.unique(np.concatenate(found), axis=0)
    verified = [np.zeros((0, 2), dtype=np.int64)]
    for batch in _verify_batches(job, candidates):
        involved = np.unique(batch)
        texts = _texts_by_id(job, involved)
        if job.settings.strip_accents:
            texts = [dedup.remove_accents(t) for t in texts]
        similarity = dedup.pair_jaccard(
            texts, np.searchsorted(involved, batch), data.NEAR_DUP_SHINGLE
        )
        verified.append(batch[similarity >= job.settings.near_dup_threshold])
    _save_array(_range_file(job, "near-verified", first, last), np.concatenate(verified))


def join_near_duplicates(job: Job, id_ranges: list[tuple[int, int]]) -> None:
    """Near-dedup, step 3, the final step: union-find over the verified pairs of every range,
    together, since a cluster spans ranges (A~C verified in one, B~C in another: A, B and C are one
    cluster even when A and B are not similar); every member but the first (smallest id) of a
    cluster goes. Writes near_drop.npy (sorted ids)."""
    verified = _range_results(job, "near-verified", id_ranges, np.zeros((0, 2), dtype=np.int64))
    members = np.unique(verified)
    union_find = dedup.UnionFind(len(members))
    for i, j in np.searchsorted(members, verified).tolist():
        union_find.union(i, j)
    drop = [m for cluster in union_find.clusters() for m in cluster[1:]]
    _save_array(_work(job, "near_drop.npy"), np.sort(members[drop]).astype(np.int64))


def _chunk_survivors(job: Job, chunk: int, count: int) -> np.ndarray:
    """(count,) bool: which cleaned documents of a chunk survive near-dedup."""
    drop = _cached(job.work + "near_drop", lambda: np.load(_work(job, "near_drop.npy")))
    alive = np.ones(count, dtype=bool)
    # drop is sorted: this chunk's slice
    first, last = np.searchsorted(drop, [chunk << 32, (chunk + 1) << 32])
    alive[drop[first:last] & 0xFFFFFFFF] = False
    return alive


def decide_split(job: Job, chunks: list[Chunk]) -> dict:
    """The split of the survivors (split.json): per-document coins, plus the crossing document of
    `split_documents` when a side came out empty; also the counts for the funnel."""
    cut = np.uint64(data.val_cut(job.val_fraction)) if job.val_fraction > 0 else np.uint64(0)
    n = n_val = chars_all = chars_train = 0
    # (key, id) of the crossing candidates
    smallest_train, largest_val = (data.KEY_RANGE, -1), (-1, -1)
    for c in chunks:
        keys = np.asarray(_load_array(_chunk_file(job, 2, c.index, "split_key.npy")))
        alive = _chunk_survivors(job, c.index, len(keys))
        chars = np.asarray(_load_array(_chunk_file(job, 2, c.index, "chars.npy")))
        is_val = (keys < cut) & alive
        is_train = ~is_val & alive
        n, n_val = n + int(alive.sum()), n_val + int(is_val.sum())
        chars_all += int(chars[alive].sum())
        chars_train += int(chars[is_train].sum())
        if is_train.any():
            k = np.flatnonzero(is_train)[np.argmin(keys[is_train])]
            smallest_train = min(smallest_train, (int(keys[k]), (c.index << 32) | int(k)))
        if is_val.any():
            k = np.flatnonzero(is_val)[np.argmax(keys[is_val])]
            largest_val = max(largest_val, (int(keys[k]), -((c.index << 32) | int(k))))
    if n < 2 and not job.val_data:
        raise DataError(
            f"{n} document(s) left after cleaning: need at least 2 for a train/val split"
        )
    to_val = to_train = None
    if job.val_fraction > 0 and n_val == 0:
        to_val, n_val = smallest_train[1], 1
    elif n_val == n:
        to_train, n_val = -largest_val[1], n - 1
    moved = to_val if to_val is not None else to_train
    if moved is not None:
        chars = int(_load_array(_chunk_file(job, 2, moved >> 32, "chars.npy"))[moved & 0xFFFFFFFF])
        chars_train += chars if to_train is not None else -chars
    return {
        "to_val": to_val,
        "to_train": to_train,
        "documents": n,
        "val": n_val,
        "chars": chars_all,
        "train_chars": chars_train,
    }


def _chunk_split(job: Job, chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, val) bool masks over a chunk's cleaned documents, after near-dedup and the split."""
    split = _cached(job.work + "split", lambda: json.loads(_work(job, "split.json").read_text()))
    keys = np.asarray(_load_array(_chunk_file(job, 2, chunk, "split_key.npy")))
    alive = _chunk_survivors(job, chunk, len(keys))
    cut = np.uint64(data.val_cut(job.val_fraction))
    is_val = (keys < cut) & alive if job.val_fraction > 0 else np.zeros_like(alive)
    for gid, side in ((split["to_val"], True), (split["to_train"], False)):
        if gid is not None and gid >> 32 == chunk:
            is_val[gid & 0xFFFFFFFF] = side
    return alive & ~is_val, is_val


def draw_tokenizer_sample(job: Job, chunks: list[Chunk], max_bytes: int) -> str:
    """`tokenizer_sample` without holding the train split: a histogram of train bytes over the top
    16 bits of the sample key finds the bucket where max_bytes is reached; only documents in buckets
    up to it are ranked and read."""
    if max_bytes <= 0:
        return ""
    histogram, arrays = np.zeros(data.MIX_BUCKETS), []
    for c in chunks:
        train, _ = _chunk_split(job, c.index)
        keys = np.asarray(_load_array(_chunk_file(job, 2, c.index, "sample_key.npy")))
        sizes = np.asarray(_load_array(_chunk_file(job, 2, c.index, "bytes.npy")))
        histogram += np.bincount(
            data.mix_bucket(keys[train]), weights=sizes[train], minlength=data.MIX_BUCKETS
        )
        arrays.append((c.index, train))
    # the bucket that reaches max_bytes
    last = int(np.searchsorted(np.cumsum(histogram), max_bytes))
    keys, ids, sizes = [], [], []
    for chunk, train in arrays:
        k = np.asarray(_load_array(_chunk_file(job, 2, chunk, "sample_key.npy")))
        pick = train & (data.mix_bucket(k) <= last)
        keys.append(k[pick])
        ids.append((np.int64(chunk) << 32) | np.flatnonzero(pick).astype(np.int64))
        sizes.append(np.asarray(_load_array(_chunk_file(job, 2, chunk, "bytes.npy")))[pick])
    keys, ids, sizes = np.concatenate(keys), np.concatenate(ids), np.concatenate(sizes)
    order = np.lexsort((ids, keys))
    # size before this one < max_bytes
    taken = np.cumsum(sizes[order]) - sizes[order] < max_bytes
    picked = ids[order][taken]
    texts = dict(zip(np.sort(picked).tolist(), _texts_by_id(job, np.sort(picked))))
    return data.EOT.join(texts[i] for i in picked.tolist())


def _encode_into(path: pathlib.Path, job: Job, texts: Iterable[str], threads: int) -> np.ndarray:
    """Encode documents into a token file (<|endoftext|> before each), ~1M characters per encode
    call; returns the token offsets of the documents, (documents + 1,)."""
    tok = _cached(job.work + "tokenizer", lambda: bpe.Tokenizer.load(_work(job, "tokenizer.json")))
    dtype = data.dtype_for_vocab(len(tok)).newbyteorder("<")
    starts = [0]

    def write_tokens(f) -> None:
        batch, batch_chars = [], 0
        for text in itertools.chain(texts, [None]):
            if text is not None:
                batch.append(text)
                batch_chars += len(text)
            if batch and (text is None or batch_chars > 1 << 20):
                # the in-memory engine's encoder too: a run of documents per thread
                for ids in data.encode_documents(tok, batch, threads):
                    f.write(np.concatenate(([tok.eot_id], ids)).astype(dtype).tobytes())
                    starts.append(starts[-1] + len(ids) + 1)
                batch, batch_chars = [], 0

    _write_work(path, write_tokens)
    return np.array(starts, dtype=np.int64)


def stage_encode(job: Job, chunk: Chunk, threads: int = 1) -> dict:
    """Stage 3, one chunk: encode the train and val documents (<|endoftext|> before each) into
    s3-C.{split}.bin, with per-document token offsets, and for train each document's bytes and mix
    bucket (for the packing). With --val-data, each train document is also looked up in the val
    files' 13-grams (s3-C.val_found.npy)."""
    offsets = _load_array(_chunk_file(job, 2, chunk.index, "offsets.npy"))
    sizes = np.asarray(_load_array(_chunk_file(job, 2, chunk.index, "bytes.npy")))
    result = {"source": chunk.source}
    for split, members in zip(("train", "val"), _chunk_split(job, chunk.index)):
        positions = np.flatnonzero(members)
        texts = _read_texts(_chunk_file(job, 2, chunk.index, "txt"), offsets, positions.tolist())
        found = [np.zeros(0, dtype=np.int64)]
        if split == "train" and job.val_data:
            val = _cached(job.work + "val_ngrams", lambda: ValNgrams(val_documents(job)))

            def looked_up(texts: Iterator[str]) -> Iterator[str]:
                for text in texts:
                    found.append(val.look_up(text))
                    yield text

            texts = looked_up(texts)
        starts = _encode_into(_chunk_file(job, 3, chunk.index, f"{split}.bin"), job, texts, threads)
        _save_array(_chunk_file(job, 3, chunk.index, f"{split}.starts.npy"), starts)
        _save_array(_chunk_file(job, 3, chunk.index, f"{split}.bytes.npy"), sizes[positions])
        if split == "train":
            keys = np.asarray(_load_array(_chunk_file(job, 2, chunk.index, "mix_key.npy")))[
                positions
            ]
            _save_array(
                _chunk_file(job, 3, chunk.index, "train.bucket.npy"),
                data.mix_bucket(keys).astype(np.int32),
            )
            _save_array(
                _chunk_file(job, 3, chunk.index, "val_found.npy"), np.unique(np.concatenate(found))
            )
        result[split] = {
            "documents": len(positions),
            "tokens": int(starts[-1]),
            "bytes": int(sizes[positions].sum()),
        }
    _save_json(_chunk_file(job, 3, chunk.index, "json"), result)
    return result


# --val-data on the stream. The val files are small (a held-out file); the train corpus is not. So
# the val files' 13-grams are the index: each worker hashes them once, looks up every train document
# of its chunks in stage 3 (the final text, after near-dedup: the documents that train) and notes
# the val 13-grams it found; the union over the chunks gives in_memory.val_overlap's numbers
# without an index of train (8 bytes per val 13-gram, none per train one).


def copy_val_files(job: Job, paths: list[pathlib.Path]) -> None:
    """The --val-data documents (`read_val_file`), copied by the driver into the work folder
    (val.txt and its offsets, last) that every task reads: on a cluster the files may be on the
    driver's disk only."""
    if _work(job, "val.offsets.npy").exists():
        return
    spill = _TextSpill(_work(job, "val.txt"))
    for path in paths:
        for doc in formats.read_val_file(path):
            spill.add(doc)
    _save_array(_work(job, "val.offsets.npy"), spill.close())


def val_documents(job: Job) -> list[str]:
    """The --val-data documents, in order, from the work folder's copy."""
    return list(_read_texts(_work(job, "val.txt"), _load_array(_work(job, "val.offsets.npy"))))


class ValNgrams:
    """The val documents' n-grams, hashed as dedup.NgramIndex hashes an indexed corpus
    (dedup.ngram_hashes of word ids), but with word ids from the val text: a word val does not have
    cannot be in a shared n-gram. `found` marks the n-grams some train document holds; `hit_mask` is
    dedup.document_overlap's view of it."""

    def __init__(self, docs: list[str], n: int = in_memory.OVERLAP_N) -> None:
        self.n, self.vocab = n, {}
        hashes = [
            self._hashes(
                [self.vocab.setdefault(w, len(self.vocab)) for w in dedup.overlap_words(d)]
            )
            for d in docs
        ]
        # (distinct n-grams,)
        self.hashes = np.unique(np.concatenate(hashes + [np.zeros(0, dtype=np.uint64)]))
        self.found = np.zeros(len(self.hashes), dtype=bool)

    def _hashes(self, ids: list[int]) -> np.ndarray:
        return dedup.ngram_hashes(np.array(ids, dtype=np.uint64), self.n)

    def look_up(self, text: str) -> np.ndarray:
        """Positions in self.hashes of the val n-grams that `text` (a train document) holds."""
        ids = [self.vocab.get(w, -1) for w in dedup.overlap_words(text)]
        if len(ids) < self.n or not len(self.hashes):
            return np.zeros(0, dtype=np.int64)
        known = np.concatenate([[0], np.cumsum(np.array(ids) >= 0)])
        hashes = self._hashes([max(i, 0) for i in ids])[
            known[self.n :] - known[: -self.n] == self.n
        ]
        at = np.minimum(np.searchsorted(self.hashes, hashes), len(self.hashes) - 1)
        return np.unique(at[self.hashes[at] == hashes])

    def hit_mask(self, tokens: list[str]) -> np.ndarray:
        """(max(0, len(tokens) - n + 1),) bool for a val document's words: which of its n-grams
        train holds."""
        hashes = self._hashes([self.vocab[w] for w in tokens])
        return self.found[np.searchsorted(self.hashes, hashes)]


def encode_val_files(job: Job, index: int) -> dict:
    """The --val-data documents, encoded as a chunk's val documents are, under chunk number `index`
    (one past the last chunk): s3-I.val.bin, .starts.npy, .bytes.npy, and s3-I.json last."""
    docs = val_documents(job)
    starts = _encode_into(_chunk_file(job, 3, index, "val.bin"), job, docs, threads=1)
    sizes = np.array([len(d.encode("utf-8")) for d in docs], dtype=np.int64)
    _save_array(_chunk_file(job, 3, index, "val.starts.npy"), starts)
    _save_array(_chunk_file(job, 3, index, "val.bytes.npy"), sizes)
    result = {"documents": len(docs), "tokens": int(starts[-1]), "bytes": int(sizes.sum())}
    _save_json(_chunk_file(job, 3, index, "json"), result)
    return result


def val_files_overlap(job: Job, chunks: list[Chunk]) -> dict:
    """`in_memory.val_overlap` from stage 3's findings: the val n-grams found in any chunk, then
    dedup.document_overlap per val document, as in_memory.val_overlap computes it with an index of
    train."""
    docs = val_documents(job)
    val = ValNgrams(docs)
    for c in chunks:
        val.found[_load_array(_chunk_file(job, 3, c.index, "val_found.npy"))] = True
    return in_memory.overlap_summary([dedup.document_overlap(val, doc) for doc in docs], val.n)


# tokens read back at once while packing: a few MB, not a memory map of a chunk
SHARD_PIECE_TOKENS = 1 << 20


def write_split_shards(
    job: Job,
    chunks: list[Chunk],
    split: str,
    rules: list[tuple[int, int]] | None,
    directory: pathlib.Path,
    dtype: np.dtype,
    shard_tokens: int,
) -> dict:
    """Pack one split's encoded chunks into shards: pass e writes, in document order, every document
    read more than e times (val: each once; with --val-data, the val files' documents after the
    chunks' none). Reads the token files a run of consecutive documents at a time, in pieces of
    SHARD_PIECE_TOKENS."""
    writer = data.ShardWriter(directory, split, dtype, shard_tokens)
    documents, unique, n_bytes = 0, 0, 0
    passes = 1 if rules is None else max((full + (cut > 0) for full, cut in rules), default=0)
    encoded = [(c.index, c.source) for c in chunks] + (
        [(len(chunks), None)] if split == "val" and job.val_data else []
    )
    for epoch in range(passes):
        for index, source in encoded:
            starts = np.asarray(_load_array(_chunk_file(job, 3, index, f"{split}.starts.npy")))
            if len(starts) == 1:
                continue
            sizes = np.asarray(_load_array(_chunk_file(job, 3, index, f"{split}.bytes.npy")))
            reads = (
                np.ones(len(sizes), dtype=np.int64)
                if rules is None
                else data.document_reads(
                    *rules[source],
                    np.asarray(_load_array(_chunk_file(job, 3, index, "train.bucket.npy"))),
                )
            )
            chosen = reads > epoch
            unique += len(sizes) if epoch == 0 else 0
            documents, n_bytes = documents + int(chosen.sum()), n_bytes + int(sizes[chosen].sum())
            # runs of consecutive chosen documents are contiguous token ranges: write each in one
            # piece
            edges = np.flatnonzero(np.diff(np.concatenate(([0], chosen.astype(np.int8), [0]))))
            with open(_chunk_file(job, 3, index, f"{split}.bin"), "rb") as tokens:
                for first, last in zip(edges[0::2].tolist(), edges[1::2].tolist()):
                    for piece in range(int(starts[first]), int(starts[last]), SHARD_PIECE_TOKENS):
                        tokens.seek(piece * dtype.itemsize)
                        writer.add(
                            np.fromfile(
                                tokens, dtype, min(SHARD_PIECE_TOKENS, int(starts[last]) - piece)
                            )
                        )
    shards = writer.close()
    return {
        "documents": documents,
        "unique_documents": unique,
        "tokens": sum(s["tokens"] for s in shards),
        "bytes": n_bytes,
        "shards": shards,
    }


def _peak_rss_mb() -> float:
    """This process's peak resident memory in MB. On Linux the kernel's VmHWM, which starts afresh
    at exec: getrusage's ru_maxrss keeps the peak of the process that forked this one (a big
    notebook or test runner would show as our peak). Elsewhere ru_maxrss (macOS reports bytes)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 2**10
    except (OSError, StopIteration):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / (2**20 if sys.platform == "darwin" else 2**10)


class _Progress:
    """One stderr line every few seconds while a stage runs: chunks, documents/s, MB/s of input,
    ETA."""

    def __init__(self, title: str, chunks: list[Chunk], done: int, show: bool) -> None:
        self.title, self.total, self.show = title, sum(c.size for c in chunks) or 1, show
        self.count, self.done, self.skipped = len(chunks), 0, done
        self.size_done = self.docs = 0
        self.start = self.last = time.perf_counter()

    def update(self, chunk: Chunk, result: dict) -> None:
        self.done, self.size_done = self.done + 1, self.size_done + chunk.size
        self.docs += result.get("docs", 0) or sum(
            result.get(s, {}).get("documents", 0) for s in ("train", "val")
        )
        now = time.perf_counter()
        if self.show and (now - self.last > 3 or self.done + self.skipped == self.count):
            self.last, elapsed = now, max(now - self.start, 1e-9)
            left = 0
            if self.size_done:
                left = (self.total - self.size_done) / max(self.size_done / elapsed, 1e-9)
            skipped = f" ({self.skipped} done before)" if self.skipped else ""
            print(
                f"  {self.title}: {self.done + self.skipped}/{self.count} chunks{skipped}, "
                f"{self.docs / elapsed:,.0f} docs/s, {self.size_done / elapsed / 1e6:,.1f} MB/s, "
                f"ETA {datetime.timedelta(seconds=round(left))}, peak RSS {_peak_rss_mb():,.0f} MB",
                file=sys.stderr,
                flush=True,
            )


# prctl(2): the signal this process gets when its parent dies (Linux)
PR_SET_PDEATHSIG = 1
# elsewhere: how often a worker checks that its parent is alive
PARENT_POLL_S = 1.0


def _start_worker(parent: int) -> None:
    """Run first in every worker process. Its own object-store clients (a forked client's
    connections are the parent's). And it dies with its parent: a SIGKILLed `prepare` runs no
    finally block and no pool shutdown, so without this its workers live on, re-parented to init,
    each holding a chunk's ~100-200 MB. On Linux the kernel sends SIGKILL when the parent dies
    (PR_SET_PDEATHSIG); the parent may have died before that call, so the pid of the parent is
    checked after it. Elsewhere a thread checks that pid every PARENT_POLL_S."""
    store.filesystem_root.cache_clear()
    death_signal_set = False
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        death_signal_set = libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    if os.getppid() != parent:
        os._exit(1)
    if not death_signal_set:

        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(PARENT_POLL_S)
            os._exit(1)

        threading.Thread(target=watch, daemon=True).start()


def _in_processes(calls: list[tuple], workers: int) -> Iterator[tuple[int, object]]:
    """(position, function(*args)) for each (function, *args) in calls, as they finish: on `workers`
    forked processes, or right here when there is one worker or one call."""
    if workers == 1 or len(calls) <= 1:
        for position, (function, *args) in enumerate(calls):
            yield position, function(*args)
        return
    # workers inherit the loaded modules: no re-import
    context = multiprocessing.get_context("fork")
    # a worker's garbage collections skip the objects it inherits: walking them would touch,
    outer_freeze = gc.get_freeze_count()  # (dataset.planned's, kept until its build ends)
    gc.freeze()
    # and so copy, every page of this process's heap (a pool of 2 cost ~0.4 CPU-s more here)
    try:
        with concurrent.futures.ProcessPoolExecutor(
            min(workers, len(calls)),
            mp_context=context,
            initializer=_start_worker,
            initargs=(os.getpid(),),
        ) as pool:
            futures = {pool.submit(*call): position for position, call in enumerate(calls)}
            try:
                for future in concurrent.futures.as_completed(futures):
                    yield futures[future], future.result()
            except BaseException:
                pool.shutdown(wait=True, cancel_futures=True)
                raise
    finally:
        if not outer_freeze:
            gc.unfreeze()


def _run_stage(
    title: str,
    stage: int,
    function: Callable,
    job: Job,
    chunks: list[Chunk],
    workers: int,
    show: bool,
    *args,
    ray: "RayEngine | None" = None,
) -> list[dict]:
    """Run function(job, chunk, *args) for every chunk not already done, on `workers` processes (or
    as Ray tasks); the results (from the chunks' json markers for those done before) in chunk
    order."""
    results = {}
    for c in chunks:
        marker = _chunk_file(job, stage, c.index, "json")
        if marker.exists():
            results[c.index] = json.loads(marker.read_text())
    todo = [c for c in chunks if c.index not in results]
    progress = _Progress(title, chunks, len(results), show)
    finished = (
        ray.map(function, job, todo, *args)
        if ray is not None
        else (
            (todo[i], result)
            for i, result in _in_processes([(function, job, c, *args) for c in todo], workers)
        )
    )
    for c, result in finished:
        results[c.index] = result
        progress.update(c, result)
    return [results[c.index] for c in chunks]


def _run_ranges(
    title: str,
    function: Callable,
    job: Job,
    inputs,
    name: str,
    ranges: list[tuple[int, int]],
    workers: int,
    show: bool,
    ray: "RayEngine | None" = None,
) -> None:
    """Run function(job, inputs, low, high) for every range of a join whose result file `name` is
    missing, on `workers` processes (or as Ray tasks), as _run_stage runs chunks."""
    todo = [
        (function, job, inputs, low, high)
        for low, high in ranges
        if not _range_file(job, name, low, high).exists()
    ]
    if show:
        skipped = f" ({len(ranges) - len(todo)} done before)" if len(todo) < len(ranges) else ""
        print(f"  {title}: {len(ranges)} ranges{skipped}", file=sys.stderr, flush=True)
    if ray is not None:
        ray.call_all(*todo)
    else:
        # the files are the results
        for _ in _in_processes(todo, workers):
            pass


def _remove_work_files(work: pathlib.Path, patterns: list[str]) -> None:
    for pattern in patterns:
        for path in work.glob(pattern):
            path.unlink()


def build_streaming(
    recipe: in_memory.Recipe,
    work: pathlib.Path,
    clock: "dataset.Clock",
    log: Callable,
    threads: int | None,
    workers: int,
    chunk_bytes: int,
    show_progress: bool,
    ray: "RayEngine | None" = None,
) -> in_memory.Built:
    """The streaming engine: stage functions over chunks and joins over key ranges of the sorted
    runs on disk (both parallel), each result saved in `work` so that a rerun continues where a
    killed run stopped. With `ray`, every chunk's stage, join range and final step runs as a Ray
    task (section 11); without, on `workers` processes here (a join's final step in this
    process)."""
    settings = recipe.settings
    bands, rows = dedup.resolve_bands_rows(
        settings.near_dup_threshold or 0.5, data.NEAR_DUP_NUM_PERM, None, None
    )
    whole = [cleaning.keeps_whole(s, settings) for s in recipe.sources]
    job = Job(
        str(work),
        tuple((s.spec, s.kind) for s in recipe.sources),
        recipe.read_options,
        settings,
        recipe.seed,
        0.0 if recipe.val_files else recipe.val_fraction,
        bands,
        rows,
        tuple(settings.chunk_chars if w else 0 for w in whole),
        bool(recipe.val_files),
    )
    chunks = plan_chunks(recipe.sources, chunk_bytes, recipe.read_options[0])
    work.mkdir(parents=True, exist_ok=True)
    if job.val_data:
        copy_val_files(job, recipe.val_files)
    # a global step: as one Ray task, or right here
    run = ray.call if ray is not None else _run_task
    if any(whole):
        job = dataclasses.replace(job, kept_whole=run(kept_piece_sizes, job, chunks))
    # a join takes at least 4 ranges per worker
    join_workers = ray.cpus if ray is not None else workers

    def join_ranges(
        title: str, function: Callable, inputs, name: str, ranges: list[tuple[int, int]]
    ) -> None:
        _run_ranges(title, function, job, inputs, name, ranges, workers, show_progress, ray)

    log(
        f"streaming {len(chunks)} chunk(s) of up to {chunk_bytes / 2**20:g} MiB on {workers} "
        f"worker(s); work files in {work}"
    )

    with clock.phase("clean"):
        read = _run_stage(
            "read + filters", 1, stage_read, job, chunks, workers, show_progress, ray=ray
        )
        funnel = data.Funnel()
        for s_index, source in enumerate(recipe.sources):
            mine = [r for r in read if r["source"] == s_index]
            total = sum((collections.Counter(r["counts"]) for r in mine), collections.Counter())
            reasons = sum((collections.Counter(r["reasons"]) for r in mine), collections.Counter())
            kept = sum(r["docs"] for r in mine)
            if whole[s_index]:
                reasons = {f"pieces_of_at_most_{job.kept_whole[s_index]}_chars": kept}
            cleaning.source_steps(funnel, source, settings, total, reasons, kept, log)
        skipped = sum(r["jsonl_skipped"] for r in read)
        if skipped:
            funnel.steps[0].reasons["malformed_jsonl_lines_skipped"] = skipped
        if not _work(job, "exact_keep.npy").exists():
            with clock.phase("joins"):
                ranges = _key_ranges(sum(r["docs"] for r in read), join_workers)
                join_ranges("exact dedup join", exact_range, len(chunks), "exact", ranges)
                run(join_exact, job, chunks, ranges)
        if not _work(job, "boilerplate.npy").exists():
            with clock.phase("joins"):
                ranges = _key_ranges(sum(r["line_entries"] for r in read), join_workers)
                join_ranges(
                    "boilerplate join", boilerplate_range, len(chunks), "boilerplate", ranges
                )
                run(join_boilerplate, job, ranges)
        cleaned = _run_stage(
            "exact dedup + boilerplate + PII + MinHash",
            2,
            stage_clean,
            job,
            chunks,
            workers,
            show_progress,
            ray=ray,
        )
        # read by stage 2 only: free the disk
        _remove_work_files(work, ["s1-*.txt", "s1-*.line_*.npy"])
        total = collections.Counter()
        for r in cleaned:
            total.update(r["counts"])
        kept_chars = sum(r["counts"]["chars_in"] for r in cleaned)
        docs = sum(r["docs"] for r in cleaned)
        # as `clean`: no dedup rows when every source is kept
        if not all(whole):
            funnel.add_counts(
                "exact dedup (hash)",
                sum(r["docs"] for r in read),
                total["docs_in"],
                sum(r["counts"].get("kept_chars", 0) for r in read),
                kept_chars,
                {"duplicate": sum(r["docs"] for r in read) - total["docs_in"]},
            )
            funnel.add_counts(
                f"boilerplate lines (prose, in >={settings.boilerplate_min_documents} docs)"
                if settings.line_dedup == "documents"
                else "line dedup (every line seen more than once)",
                total["docs_in"],
                docs,
                kept_chars,
                total["chars_boilerplate"],
                {
                    "lines_removed": total["lines_removed"],
                    "distinct_lines": len(_load_array(_work(job, "boilerplate.npy"))),
                    "emptied": total["docs_in"] - docs,
                },
            )
        if not docs:
            raise funnel.empty_error("the corpus")
        if settings.mask_pii:
            pii = sum((collections.Counter(r["pii"]) for r in cleaned), collections.Counter())
            funnel.add_counts(
                "PII masking",
                docs,
                docs,
                total["chars_boilerplate"],
                sum(r["chars_out"] for r in cleaned),
                pii,
            )
        near_dedup = settings.near_dup_threshold > 0 and any(
            r["docs"] for c, r in zip(chunks, cleaned) if not job.whole(c)
        )
        if not _work(job, "near_drop.npy").exists():
            if near_dedup:
                with clock.phase("joins"):
                    key_ranges = _key_ranges(sum(r["band_entries"] for r in cleaned), join_workers)
                    join_ranges(
                        "LSH band join", band_join_range, len(chunks), "near-candidates", key_ranges
                    )
                    candidates = sum(
                        len(_load_array(_range_file(job, "near-candidates", *r)))
                        for r in key_ranges
                    )
                    id_ranges = _id_ranges(
                        [r["docs"] for r in cleaned], _range_count(candidates, join_workers)
                    )
                    join_ranges(
                        "verify candidates", verify_range, key_ranges, "near-verified", id_ranges
                    )
                    run(join_near_duplicates, job, id_ranges)
            else:
                _save_array(_work(job, "near_drop.npy"), np.zeros(0, dtype=np.int64))
        if not _work(job, "split.json").exists():
            with clock.phase("joins"):
                _save_json(_work(job, "split.json"), run(decide_split, job, chunks))
        split = json.loads(_work(job, "split.json").read_text())
        if near_dedup:
            funnel.add_counts(
                f"near dedup (MinHash, J>={settings.near_dup_threshold})",
                docs,
                split["documents"],
                sum(r["chars_out"] for r in cleaned),
                split["chars"],
                {"near_duplicate": docs - split["documents"]},
            )
        val_docs = len(val_documents(job)) if job.val_data else split["val"]
        funnel.add_counts(
            "train/val split" + (" (--val-data)" if job.val_data else ""),
            split["documents"],
            split["documents"] - split["val"],
            split["chars"],
            split["train_chars"],
            {"val": val_docs},
        )

    with clock.phase("tokenizer"):
        if _work(job, "tokenizer.json").exists():
            tok = bpe.Tokenizer.load(_work(job, "tokenizer.json"))
            trained_on = json.loads(_work(job, "tokenizer.trained.json").read_text())["bytes"]
        else:
            tok, trained_on = in_memory.tokenizer_for(
                recipe,
                lambda: draw_tokenizer_sample(job, chunks, recipe.tokenizer_train_bytes),
                log,
            )
            _write_work(_work(job, "tokenizer.json"), tok.to_json())
            _save_json(_work(job, "tokenizer.trained.json"), {"bytes": trained_on})

    with clock.phase("encode"):
        encode_threads = (threads or os.cpu_count() or 1) if workers == 1 and ray is None else 1
        encoded = _run_stage(
            "encode", 3, stage_encode, job, chunks, workers, show_progress, encode_threads, ray=ray
        )
        overlap, val_encoded = None, {"bytes": 0}
        # the val split: the files, after the chunks' none
        if job.val_data:
            marker = _chunk_file(job, 3, len(chunks), "json")
            if marker.exists():
                val_encoded = json.loads(marker.read_text())
            else:
                val_encoded = run(encode_val_files, job, len(chunks))
            with clock.phase("overlap"):
                overlap = run(val_files_overlap, job, chunks)
        _remove_work_files(work, ["s2-*.txt"])
    kept = in_memory.kept_per_source(
        recipe.sources,
        [
            (c.source, split, r[split]["documents"], r[split]["tokens"])
            for c, r in zip(chunks, encoded)
            for split in ("train", "val")
        ],
    )
    bucket_tokens = [np.zeros(data.MIX_BUCKETS) for _ in kept]
    for c, r in zip(chunks, encoded):
        if recipe.weights is not None and r["train"]["documents"]:
            lengths = np.diff(_load_array(_chunk_file(job, 3, c.index, "train.starts.npy")))
            buckets = _load_array(_chunk_file(job, 3, c.index, "train.bucket.npy"))
            bucket_tokens[c.source] += np.bincount(
                buckets, weights=lengths, minlength=data.MIX_BUCKETS
            )
    mixture, rules = in_memory.plan_mix(recipe, kept, bucket_tokens)

    def write_splits(directory: pathlib.Path, dtype: np.dtype) -> dict:
        with clock.phase("shards"):
            steps = [
                (
                    write_split_shards,
                    job,
                    chunks,
                    split,
                    rules if split == "train" else None,
                    directory,
                    dtype,
                    recipe.shard_tokens,
                )
                for split in ("train", "val")
            ]
            written = (
                ray.call_all(*steps) if ray is not None else [_run_task(*step) for step in steps]
            )
            return dict(zip(("train", "val"), written))

    encoded_bytes = (
        sum(r[s]["bytes"] for r in encoded for s in ("train", "val")) + val_encoded["bytes"]
    )
    return in_memory.Built(
        funnel, tok, trained_on, kept, mixture, encoded_bytes, write_splits, overlap
    )


# --------------------------------------------------------------------------------------------------
# 2. The Ray engine: the same stage functions, scheduled by Ray over a cluster's cores (or this
#    machine's)
# --------------------------------------------------------------------------------------------------

# a task whose worker dies (killed, OOM, lost node) reruns up to 3 times
RAY_TASK_RETRIES = 3
# tasks return small dicts; the documents travel through the work directory
RAY_LOCAL_OBJECT_STORE = 256 << 20


def _run_task(function: Callable, *args):
    """What each Ray task executes: one stage function of the streaming engine, unchanged."""
    return function(*args)


class RayEngine:
    """Runs the streaming engine's steps as Ray tasks: `map` one task per chunk, `call` one task per
    global step, `call_all` one task each for the ranges of a join (or the two splits' shards).

    Every task reads its inputs from the work directory and writes its outputs there, through a
    temporary name then a rename, and returns only counts. So a task may run on any node, twice (Ray
    retries it when its worker dies), or after a kill of the whole job: the files it leaves are the
    same. Results come back keyed by chunk index, so the order tasks finish in never reaches the
    output.
    """

    def __init__(self, ray) -> None:
        self.ray = ray
        # retry_exceptions stays False: a DataError is a bad input, and rerunning the task cannot
        # fix it
        self.task = ray.remote(max_retries=RAY_TASK_RETRIES)(_run_task)
        self.cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        # queued work stays bounded
        self.in_flight = 2 * self.cpus

    def _submit(self, function: Callable, *args):
        return self.task.options(name=function.__name__).remote(function, *args)

    def _get(self, ref):
        try:
            return self.ray.get(ref)
        # re-raise the task's own one-line error, no traceback
        except self.ray.exceptions.RayTaskError as e:
            # a full disk: prepare's one line
            if isinstance(
                e.cause, (DataError, bpe.TokenizerError, dedup.DedupError)
            ) or fileio.is_no_space(e.cause):
                raise e.cause from None
            raise

    def map(
        self, function: Callable, job: Job, chunks: list[Chunk], *args
    ) -> Iterator[tuple[Chunk, dict]]:
        """(chunk, function(job, chunk, *args)) for every chunk, as tasks finish, at most in_flight
        at a time."""
        waiting, pending = collections.deque(chunks), {}
        try:
            while waiting or pending:
                while waiting and len(pending) < self.in_flight:
                    chunk = waiting.popleft()
                    # a task may run in any folder
                    local = chunk.path and not store.is_uri(chunk.path)
                    task_chunk = dataclasses.replace(
                        chunk, path=os.path.abspath(chunk.path) if local else chunk.path
                    )
                    pending[self._submit(function, job, task_chunk, *args)] = chunk
                [ref], _ = self.ray.wait(list(pending), num_returns=1)
                yield pending.pop(ref), self._get(ref)
        # stop the other tasks: none may write into a work folder being removed
        except BaseException:
            for ref in pending:
                self.ray.cancel(ref)
            if pending:
                self.ray.wait(list(pending), num_returns=len(pending))
            raise

    def call(self, function: Callable, *args):
        """function(*args) as one task (a global step: a join, the split, a split's shards)."""
        return self._get(self._submit(function, *args))

    def call_all(self, *calls: tuple) -> list:
        """Each (function, *args) as one task, all running at once; their results in the order
        given."""
        refs = [self._submit(*c) for c in calls]
        return [self._get(ref) for ref in refs]


def _import_ray():
    try:
        import ray
    except ImportError:
        raise DataError("`engine` ray needs Ray: pip install ray (or use `engine` local)") from None
    return ray


def check_ray_address(address: str | None) -> None:
    """--ray-address is auto or HOST:PORT with a port a socket can have (1-65535), before anything
    dials it.

    >>> check_ray_address("10.0.0.1:6379"), check_ray_address("auto"), check_ray_address(None)
    (None, None, None)
    >>> check_ray_address("127.0.0.1:99999")     # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    data.DataError: `ray_address` 127.0.0.1:99999: port 99999 is out of range 1-65535; ...
    """
    if address in (None, "auto"):
        return
    host, _, port = address.rpartition(":")
    form = "give auto or HOST:PORT, e.g. 10.0.0.1:6379"
    if not host or "/" in host or not (port.isascii() and port.isdigit()):
        raise DataError(f"`ray_address` {address!r} is not auto or HOST:PORT; {form}")
    if not 1 <= int(port) <= 65535:
        raise DataError(f"`ray_address` {address}: port {port} is out of range 1-65535; {form}")


def _check_ray_ready(address: str | None) -> None:
    """Before any work: the address has its form (`check_ray_address`), Ray is installed, and a
    HOST:PORT address answers (ray.init would retry for minutes before giving up)."""
    check_ray_address(address)
    _import_ray()
    if address in (None, "auto"):
        return
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as e:
        raise DataError(
            f"`ray_address` {address}: nothing answers there ({e.strerror or e}); start a Ray head "
            f"on port {port} (the `ray start` command) or fix the address"
        ) from None


@contextlib.contextmanager
def ray_engine(address: str | None, cpus: int | None) -> Iterator[RayEngine]:
    """A RayEngine on the cluster at `address` ("auto": the one `ray start` runs on this machine),
    or on a Ray started here with `cpus` cores and stopped afterwards. A Ray the caller already
    started is used as it is. A cluster's workers receive dataset.CACHE_KEY_FILES (this file,
    data.py, the siblings they import and the shipped classifiers/) from this driver as their
    working folder (runtime_env working_dir), so they run the very code and models this run was
    started with; a Ray started here imports them from this driver's sys.path. A Ray started here
    writes its session (logs, sockets, spilled objects) into a fresh folder of the temp folder,
    removed when it stops: by default Ray keeps every session under /tmp/ray for good. Set
    RAY_TMPDIR to keep them where you say."""
    ray = _import_ray()
    if ray.is_initialized():
        yield RayEngine(ray)
        return
    session = None
    if address is None:
        options = {
            "address": "local",
            "num_cpus": cpus,
            "object_store_memory": RAY_LOCAL_OBJECT_STORE,
        }
        if "RAY_TMPDIR" not in os.environ:
            # Ray's socket paths (~65 bytes below it) must fit 107 bytes
            base = tempfile.gettempdir()
            session = tempfile.mkdtemp(prefix="ray-", dir=base if len(base) <= 32 else "/tmp")
            options["_temp_dir"] = session
    else:
        # py_modules would ship the .py files alone, each to a folder of its own: classify.py would
        # find no classifiers/ beside it. A working folder keeps the repository's layout.
        session = tempfile.mkdtemp(prefix="pretrain-code-")  # uploaded by ray.init, then removed
        for name in dataset.CACHE_KEY_FILES:
            pathlib.Path(session, name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(dataset.REPO_ROOT / name, pathlib.Path(session, name))
        options = {"address": address, "runtime_env": {"working_dir": session}}
    try:
        # a busy machine can miss the 30 s Ray gives a new raylet: start once more
        for attempt in range(2):
            # log_to_driver off: tasks print nothing; a task's error comes back as itself
            try:
                ray.init(
                    include_dashboard=False,
                    logging_level=logging.ERROR,
                    log_to_driver=False,
                    **options,
                )
                break
            except (ConnectionError, ray.exceptions.AuthenticationError) as e:
                raise DataError(
                    f"`ray_address` {address}: {str(e).splitlines()[0]} (a cluster started by `ray "
                    "start` may want RAY_AUTH_MODE=token and its token: see README)"
                ) from None
            except Exception as e:  # Ray's own start-up failures
                ray.shutdown()
                if attempt or address is not None:
                    raise DataError(
                        f"Ray did not start: {str(e).splitlines()[0]}; retry, or use `engine` local"
                    ) from None
        yield RayEngine(ray)
    finally:
        ray.shutdown()
        if session is not None:
            shutil.rmtree(session, ignore_errors=True)


# --------------------------------------------------------------------------------------------------
# 3. prepare on either engine: data.py's plan and publishing around the streaming engine's run
# --------------------------------------------------------------------------------------------------


def prepare(
    sources: list[str],
    out_dir: str | os.PathLike | None = None,
    *,
    threads: int | None = None,
    workers: int | None = None,
    chunk_mb: float = CHUNK_BYTES / 2**20,
    engine: str = "stream",
    ray_address: str | None = None,
    work_dir: str | os.PathLike | None = None,
    verbose: bool = False,
    **recipe,
) -> pathlib.Path | str:
    """Build (or reuse) a token dataset directory (manifest.json, tokenizer.json, train_*.bin,
    val_*.bin) with the streaming engine, byte-identical to dataset.prepare's. recipe:
    dataset.plan_dataset's arguments (vocab_size, seed, val_fraction, weights, train_tokens,
    tokenizer, clean_settings, val_data, ...), checked there before any work.

    The streaming engine reads chunks of chunk_mb MiB on `workers` processes (default: all cores)
    and is resumable: its work files live in a hidden .NAME.work-* folder in work_dir, by default
    beside a local output or in the temp folder for a URI, removed when the dataset is published; on
    a multi-node cluster a folder every node sees. engine="ray" runs its steps as Ray tasks (section
    2) on the cluster at ray_address, or on a Ray started here with `workers` cores; the output is
    again byte-identical. engine="auto" (the command line's default, and train.py's) sends small
    local inputs (`fits_in_memory`) to data.py's reference engine instead, the code the chapter
    teaches; "memory" always does; "stream" (the default here, or its old name "local") never.
    """
    log = print if verbose else (lambda *a, **k: None)
    _check_engine_options(out_dir, workers, chunk_mb, engine, ray_address, work_dir)
    remote = store.is_uri(out_dir)
    with dataset.planned(sources, out_dir, log, recipe) as plan:
        # Ray's workers may run in any folder
        if engine == "ray" and not remote:
            plan = dataclasses.replace(plan, out_dir=plan.out_dir.absolute())
        if plan.reuse:
            return plan.out_dir
        small = engine == "auto" and fits_in_memory(plan.recipe.sources, plan.recipe.val_files)
        if engine == "memory" or small:
            return dataset.run_in_memory(plan, threads, log)
        out_dir = plan.out_dir
        chunk_bytes = max(1, int(chunk_mb * 2**20))
        name = dataset.local_name(out_dir)
        work_root = (
            pathlib.Path(work_dir)
            if work_dir is not None
            else pathlib.Path(tempfile.gettempdir())
            if remote
            else out_dir.parent
        )
        work_root = work_root.absolute() if engine == "ray" else work_root
        digest = hashlib.sha256(f"{plan.key}:{chunk_bytes}".encode()).hexdigest()[:12]
        work = work_root / f".{name}.work-{digest}"
        # unreadable or malformed files: fail now
        plan_chunks(plan.recipe.sources, chunk_bytes, plan.recipe.read_options[0])
        dataset.check_writable(work_root, "--work-dir" if work_dir is not None else "--out")
        dataset.remove_stale_publishes(out_dir, work_root)
        # other settings' work: never reused
        for folder in {work_root} if remote else {work_root, out_dir.parent}:
            for stale in folder.glob(f".{glob.escape(name)}.work-*"):
                if stale != work and stale.is_dir():
                    shutil.rmtree(stale, ignore_errors=True)

        made_for_work = fileio.missing_folders(work_root)  # made for the work: undone on bad input
        session = ray_engine(ray_address, workers) if engine == "ray" else contextlib.nullcontext()
        with session as ray:
            clock = dataset.Clock()
            workers = workers or len(os.sched_getaffinity(0))
            try:
                try:
                    built = build_streaming(
                        plan.recipe, work, clock, log, threads, workers, chunk_bytes, verbose, ray
                    )
                # a work file written by hand (a spill) on a full disk
                except OSError as e:
                    if not fileio.is_no_space(e):
                        raise
                    raise _no_space(e, work) from None
            except DiskFull:
                # as a kill: the work stays, a rerun resumes from it
                raise
            except (DataError, bpe.TokenizerError, dedup.DedupError):
                # bad input: its work is never reused (the fix changes the key); a kill keeps it
                shutil.rmtree(work, ignore_errors=True)
                fileio.remove_if_empty(made_for_work)
                raise
            # the shard tasks write there: every node sees it
            staging = work_root if remote else out_dir.parent
            dataset.write_dataset(
                plan, built, clock, staging, "ray" if ray else f"streaming, {workers} worker(s)"
            )
        shutil.rmtree(work, ignore_errors=True)
        for key in [key for key in _PROCESS_CACHE if key.startswith(str(work))]:
            # steps run here cached the work's arrays: free them with the work
            del _PROCESS_CACHE[key]
        return out_dir


def _check_engine_options(
    out_dir, workers: int | None, chunk_mb: float, engine: str, ray_address, work_dir
) -> None:
    """prepare's engine options, checked before any work."""
    if workers is not None and not 1 <= workers <= 1024:
        raise DataError(
            f"`workers` must be between 1 and 1024, got {workers}; leave it out to use all cores"
        )
    if not 0.001 <= chunk_mb <= 4096:
        raise DataError(f"`chunk_mb` must be between 0.001 and 4096, got {chunk_mb}")
    if engine == "ray":
        _check_ray_ready(ray_address)
    elif engine not in ENGINES or ray_address is not None:
        raise DataError(
            f"`engine` {engine} `ray_address` {ray_address}: the engine is one of "
            f"{ENGINES}, and only ray takes an address"
        )
    if store.is_uri(work_dir):
        raise DataError(
            f"`work_dir` {work_dir}: give a folder (on a cluster, one every node mounts): work "
            "files are renamed, appended and memory-mapped, which an object store cannot do"
        )
    if (
        work_dir is not None
        and pathlib.Path(work_dir).exists()
        and not pathlib.Path(work_dir).is_dir()
    ):
        raise DataError(f"`work_dir` {work_dir} is a file; give a directory path")
    if work_dir is not None:  # also when a small input leaves it unused (--engine auto)
        dataset.check_writable(pathlib.Path(work_dir), "--work-dir")
    if store.is_uri(out_dir) and engine == "ray" and ray_address is not None and work_dir is None:
        raise DataError(
            f"`out` {out_dir} with `ray_address`: pass `work_dir` on a folder every node mounts "
            f"(NFS), since a task on one node reads the work files of another"
        )


ENGINES = ("auto", "memory", "stream", "local", "ray")  # "local": the old name of "stream"
IN_MEMORY_MAX_BYTES = 64 << 20  # engine="auto": local inputs up to this size are held in lists


def fits_in_memory(sources: list[data.Source], val_files: list[pathlib.Path]) -> bool:
    """engine="auto"'s choice: the embedded corpora and local files (with --val-data) of at most
    IN_MEMORY_MAX_BYTES in all go through in_memory.build_in_memory, the reference a learner reads
    (its lists take a few times the text's size); hf: sources, object-store URIs and anything
    larger stream.

    >>> fits_in_memory([formats.open_source("pydocs")], [])
    True
    """
    if any(s.spec.startswith("hf:") or any(map(store.is_uri, s.files)) for s in sources):
        return False
    files = [*(f for s in sources for f in s.files), *val_files]
    return sum(pathlib.Path(f).stat().st_size for f in files) <= IN_MEMORY_MAX_BYTES


# `python data.py prepare`'s flags for this file's engines (rows of cli.add_arguments); `prepare`
# checks their values before any work (a bad one is one line naming the flag, as data.py's own are)
ENGINE_FLAGS = [
    (
        "--workers",
        {
            "type": int,
            "default": None,
            "help": "processes for the per-document steps (default: all cores)",
        },
    ),
    (
        "--chunk-mb",
        {
            "type": float,
            "default": CHUNK_BYTES / 2**20,
            "help": "MiB of input per chunk, the unit of parallel work and of resuming "
            "(default %(default)g)",
        },
    ),
    (
        "--engine",
        {
            "choices": ENGINES,
            "default": "auto",
            "help": f"auto: data.py's in-memory reference engine for the embedded corpora "
            f"and local inputs up to {IN_MEMORY_MAX_BYTES >> 20} MiB, else stream; "
            f"memory: always the reference; stream (or local): worker processes "
            f"here; ray: the stream's steps as Ray tasks (pip install ray); all "
            f"write the same bytes",
        },
    ),
    (
        "--ray-address",
        {
            "default": None,
            "help": "with --engine ray: auto or HOST:PORT of a running cluster "
            "(default: start Ray here)",
        },
    ),
    (
        "--work-dir",
        {
            "default": None,
            "help": "where the streaming engine's work files go (default: beside a local "
            "--out, the temp folder for a URI); on a multi-node cluster a folder every node sees",
        },
    ),
]


# --------------------------------------------------------------------------------------------------
# 4. download: a dataset published to an object store, copied down for the loader
# --------------------------------------------------------------------------------------------------


def download(uri: str, directory: str | os.PathLike) -> pathlib.Path:
    """Copy a dataset that prepare published to an object store down to a local directory, for the
    loader (which memory-maps shards): the manifest's files, then the manifest, into a temporary
    folder renamed into place. A directory that already holds the same dataset (same cache key) is
    returned as is. An endpoint that does not answer is told apart from a prefix that holds no
    dataset: they need different fixes."""
    directory = pathlib.Path(directory)
    if not store.is_uri(uri):
        raise DataError(
            f"download {uri}: give the URI the dataset was published to "
            "(s3://bucket/datasets/name); a "
            f"local dataset folder needs no download: pass it to train.py `data`"
        )
    # refused or unreachable: not a missing dataset
    found = store.exists(uri, "manifest.json", DataError)
    manifest = formats.read_manifest_or_none(uri) if found else None
    if manifest is None:
        raise DataError(
            f"{uri} has {'a damaged' if found else 'no'} manifest.json: not a published dataset "
            f"(or a run still publishing); check the URI, or prepare it with `out` {uri}"
        )
    try:
        key = manifest["cache_key"]
        names = [manifest["tokenizer"]["file"]] + [
            s["file"] for split in manifest["splits"].values() for s in split["shards"]
        ]
    except (KeyError, TypeError, AttributeError) as e:
        raise DataError(f"{uri}: damaged manifest.json (missing {e}); prepare it again") from None
    strange = [n for n in names if not (isinstance(n, str) and dataset.DATASET_FILE.fullmatch(n))]
    if strange:  # "../x" would be written outside the folder
        raise DataError(
            f"{uri}: its manifest.json names {strange[0]!r}, not a dataset file; prepare it again"
        )
    here = formats.read_manifest_or_none(directory)
    if here is not None and here.get("cache_key") == key:
        return directory
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise DataError(f"{directory} exists and is not empty; remove it or pick another directory")
    dataset.check_writable(directory.parent, "download directory")
    try:
        with dataset.temporary_folder(
            directory.parent, directory.name, directory, "download to another directory"
        ) as tmp_dir:
            store.copy_down(uri, names, tmp_dir, DataError)
            (tmp_dir / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
            # the umask's modes, as for a dataset prepare writes
            fileio.publish_tree(tmp_dir)
            dataset.rename_into_place(tmp_dir, directory)
    # the store stopped answering half-way (a full disk: above)
    except OSError as e:
        raise DataError(
            f"downloading {uri} failed ({store.first_line(e)}); run again to retry"
        ) from None
    return directory


def main(argv: list[str] | None = None) -> int:
    """`python data_at_scale.py ...` is `python data.py ...`: the command line is the chapter's,
    under this file's name and description."""
    from machinery.commands import data as command  # the command line imports this file

    return command.main(
        argv,
        prog="data_at_scale.py",
        description=(
            __doc__.split("\n\n")[0] + "\n\nIts command line is data.py's: the same commands and "
            "flags;\n`prepare --engine stream` (or `--engine ray`) runs this file's engines."
        ),
    )


if __name__ == "__main__":
    # run as the module `data_at_scale`, not `__main__`: Ray sends workers functions by name
    from machinery import data_at_scale

    raise SystemExit(data_at_scale.main())
