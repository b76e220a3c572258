"""formats.py: the file formats a data.py source is read from, each turned into a stream of
documents (strings).

Serves: data.py (`open_source` picks a reader here by file type; the lesson of the chapter starts
where the documents come out) and data_at_scale.py (its workers read a chunk of a file: a .jsonl
byte range, a .parquet row group). It is the layer below them, so it imports neither, and it owns
the error class they share, DataError: a bad input is one line naming the problem and the fix,
whichever of the three files finds it.

    file type         reader          one document is                        cleaned as
    .txt .md .text    read_txt        a piece between blank lines, or        prose, kept whole
                                      between <|endoftext|> markers
    .jsonl .json      read_jsonl      a line's obj["text"] (--text-field)    prose (web-like)
    .parquet          read_parquet    a row's "text" column (--text-field)   prose (web-like)
    .raw (WikiText)   read_wikitext   an article, from ' = Title = ' on      prose, kept whole
    .html .htm        read_html       the page (data.py extracts its text)   html
    .py               file_source     the whole file                         code, kept whole
    hf:NAME           read_hf         a row of a Hugging Face dataset        prose (web-like)

("kept whole": by default, see data.CleanSettings.cleaning.)

Any of them may be gzipped (a.txt.gz reads as a.txt) and named by an object store's URI
(s3://bucket/web/a.jsonl), which store.py opens. How a .txt splits, worked: "a
b\\n\\nc<|endoftext|>d" holds the marker, so it is cut there into 2 documents ("a b\\n\\nc", "d");
"a b\\n\\n\\nc" has none and is cut at its blank lines into "a b" and "c".

Reading a piece of a file, for the engine's workers. A .jsonl's byte range [start, stop) reads the
lines whose first byte lies in it: a 200-byte file of 20-byte lines cut at byte 90 reads lines 1-5
(line 5 holds bytes 80-99) in the first range and lines 6-10 in the second, so ranges that tile a
file read each line exactly once, each worker seeking to its own start. A .parquet file is cut by
row group (its footer lists them), read as byte ranges of the object. A malformed line's error names
its line number in the whole file, counted only when one fails.

--val-data files are read verbatim (`read_val_file`): a text file is one document byte for byte, cut
only at <|endoftext|> markers, so the held-out split is the very text given.

Depends on: the standard library and two siblings, store.py (files and objects named by URI, gzip)
and fileio.py (untrusted JSON in one line). Optional, imported only by the reader that needs it:
pyarrow (.parquet), datasets (`hf:`, which also needs the network).
"""
from __future__ import annotations

import dataclasses
import gzip
import pathlib
import re
import zlib
from typing import Callable, Iterable, Iterator

from machinery import fileio
# the document separator of .txt files (TinyStories' convention) and of the shards
EOT = "<|endoftext|>"


class DataError(ValueError):
    """Bad input to the data pipeline: the message is one line naming the problem and the fix."""


# A source may also be an object store's URI (s3://bucket/web/*.parquet): store.py lists and opens
# those, so a file of a source is named by its own URI (a str) or by a local pathlib.Path, and the
# readers below take either.

def _read_bytes(path: pathlib.Path | str) -> bytes:
    """A (possibly gzipped) file's bytes; a binary file or a damaged .gz is refused with one clear
    line."""
    from machinery import store
    try:
        with store.open_input(
            path, unzip=store.pure_path(path).suffix == ".gz", error=DataError
        ) as f:
            raw = f.read()
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise DataError(f"{path}: damaged gzip file ({e}); re-download or re-compress it") from None
    if b"\x00" in raw[:8192]:
        raise DataError(
            f"{path} looks binary (NUL bytes); pass a UTF-8 text, .jsonl, .parquet or .gz file"
        )
    return raw


def _read_utf8(path: pathlib.Path | str, flag: str = "") -> str:
    """A (possibly gzipped) file's UTF-8 text, as it is; text that is not UTF-8 is one line (naming
    the flag that gave the file, if any)."""
    try:
        return _read_bytes(path).decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(
            f"{flag}{path} is not UTF-8 text (byte {e.start}); convert it, e.g. with iconv"
        ) from None


def read_text(path: pathlib.Path) -> str:
    """A (possibly gzipped) file as UTF-8 text with universal newlines."""
    return _read_utf8(path).replace("\r\n", "\n").replace("\r", "\n")


def inner_suffix(path: pathlib.Path | str) -> str:
    """'.txt' for both a.txt and a.txt.gz (and s3://bucket/a.txt.gz)."""
    from machinery import store
    suffixes = [s.lower() for s in store.pure_path(path).suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes.pop()
    return suffixes[-1] if suffixes else ""


def split_plain_text(text: str, mode: str = "auto") -> list[str]:
    """Split a .txt file into documents.

    mode "eot": on <|endoftext|> (TinyStories' convention); "blank": on blank lines (one paragraph
    per document); "file": the whole file is one document; "auto": "eot" when the marker occurs,
    else "blank".

    >>> split_plain_text("a b\\n\\nc<|endoftext|>d")
    ['a b\\n\\nc', 'd']
    >>> split_plain_text("a b\\n\\n\\nc")
    ['a b', 'c']
    """
    if mode == "auto":
        mode = "eot" if EOT in text else "blank"
    if mode == "eot":
        parts = text.split(EOT)
    elif mode == "blank":
        parts = re.split(r"\n[ \t]*\n", text)
    elif mode == "file":
        parts = [text]
    else:
        raise DataError(f"unknown txt split mode {mode!r}; use auto, eot, blank or file")
    return [p.strip() for p in parts if p.strip()]


def read_txt(path: pathlib.Path, mode: str = "auto") -> Iterator[str]:
    yield from split_plain_text(read_text(path), mode)


@dataclasses.dataclass
class JsonlStats:
    """Malformed lines skipped while reading (only when skipping was asked for)."""
    skipped: int = 0


def read_jsonl(
    path: pathlib.Path | str,
    field: str = "text",
    skip_bad_lines: bool = False,
    stats: JsonlStats | None = None,
    start: int = 0,
    stop: int | None = None,
) -> Iterator[str]:
    """One JSON object per line; the document is `obj[field]`. A malformed line stops with its line
    number, unless skip_bad_lines, which skips and counts it. start/stop (uncompressed files): only
    the lines whose first byte lies in [start, stop), so byte ranges that tile a file read every
    line exactly once."""
    from machinery import store
    # line by line
    with store.open_input(path, unzip=store.pure_path(path).suffix == ".gz", error=DataError) as f:
        if start:
            f.seek(start - 1)
            # the line holding byte start - 1 belongs to the range before
            f.readline()
        lines = (
            iter(f.readline, b"")
            if stop is None
            else iter(lambda: f.readline() if f.tell() < stop else b"", b"")
        )
        try:
            for lineno, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                try:
                    # decodes the UTF-8 bytes itself
                    record = fileio.parse_json(line, "", DataError)
                except DataError:
                    record = _NOT_JSON
                text = record.get(field) if isinstance(record, dict) else None
                if not isinstance(text, str):
                    if skip_bad_lines:
                        if stats is not None:
                            stats.skipped += 1
                        continue
                    raise _bad_jsonl_line(
                        path,
                        lineno + (_count_lines(path, start) if start else 0),
                        line,
                        record,
                        field,
                    )
                yield text
        except (gzip.BadGzipFile, EOFError, zlib.error) as e:
            raise DataError(
                f"{path}: damaged gzip file ({e}); re-download or re-compress it"
            ) from None


_NOT_JSON = object()                  # what read_jsonl records for a line that does not parse
JSON_TYPES = {
    list: "an array",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
}


def _bad_jsonl_line(
    path: pathlib.Path | str, lineno: int, line: bytes, record, field: str
) -> DataError:
    """The one line for a .jsonl line without a string `field`: what is wrong with it, and the fix
    for that. A line that is not JSON (or not UTF-8, or nested 5,000 deep) needs fixing; a JSON
    object with other keys, --text-field.

    >>> line = b'{"body": "hi"}'
    >>> print(_bad_jsonl_line("a.jsonl", 3, line, {"body": "hi"}, "text"))  # doctest: +ELLIPSIS
    a.jsonl:3: no string field 'text' (its keys: body); pass --text-field, or ...
    >>> print(_bad_jsonl_line("a.jsonl", 4, b"[" * 5000, _NOT_JSON, "text"))  # doctest: +ELLIPSIS
    a.jsonl:4: JSON nested more than 1,000 levels deep; this project writes at most a few ...
    """
    skip = "--skip-bad-lines to skip and count such lines"
    # parse again, now naming the line: only a bad line pays for this
    if record is _NOT_JSON:
        try:
            fileio.parse_json(line, f"{path}:{lineno}", DataError, f"fix the line, or pass {skip}")
        except DataError as e:
            return e
    if isinstance(record, dict):
        keys = ", ".join(list(map(str, record))[:8]) or "none"
        return DataError(
            f"{path}:{lineno}: no string field {field!r} (its keys: {keys}); pass --text-field, or "
            f"{skip}"
        )
    return DataError(
        f"{path}:{lineno}: {JSON_TYPES.get(type(record), 'a value')}, not an object with a string "
        "field "
        f"{field!r}; fix the line, or pass {skip}"
    )


def _count_lines(path: pathlib.Path | str, start: int) -> int:
    """Lines of the file before the first line that starts at or after byte `start` > 0 (for a line
    number)."""
    from machinery import store
    with store.open_input(path, error=DataError) as f:
        head = f.read(start)
    return head.count(b"\n") + (0 if head.endswith(b"\n") else 1)


def read_parquet(
    path: pathlib.Path | str, field: str = "text", row_groups: range | None = None
) -> Iterator[str]:
    """The `field` column of a .parquet file, batch by batch (row_groups: only those). A data page
    that does not decompress (the footer read fine) is one line too, not pyarrow's OSError."""
    batches = parquet_file(path, field).iter_batches(columns=[field], row_groups=row_groups)
    try:
        for batch in batches:
            yield from filter(None, batch.column(0).to_pylist())
    # pyarrow's ArrowInvalid is a ValueError, its IOError an OSError
    except (OSError, ValueError) as e:
        raise DataError(
            f"{path}: damaged parquet data ({type(e).__name__}: {str(e)[:120]}); re-download it"
        ) from None


def parquet_file(path: pathlib.Path | str, field: str):
    """A pyarrow ParquetFile with a `field` column, or one line saying what is wrong with the
    file."""
    from machinery import store
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{path}: reading .parquet needs pyarrow (pip install pyarrow), "
                        f"or convert it to .jsonl") from None
    # an object: its footer and
    fs, key = store.filesystem(path, DataError) if store.is_uri(path) else (None, path)
    # row groups are read as byte ranges
    try:
        table = pq.ParquetFile(key, filesystem=fs)
    # pyarrow's ArrowInvalid/OSError: not a parquet file, or a damaged one
    except Exception as e:
        raise DataError(
            f"{path}: not a readable parquet file ({type(e).__name__}: {str(e)[:120]}); "
            f"re-download it"
        ) from None
    # two columns of one name: pyarrow cannot pick one
    if table.schema_arrow.names.count(field) != 1:
        raise DataError(
            f"{path}: {'no' if field not in table.schema_arrow.names else 'more than one'} "
            f"column {field!r} (columns: {', '.join(table.schema_arrow.names)}); pass --text-field"
        )
    kind = table.schema_arrow.field(field).type
    # bytes or lists: no text to read
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise DataError(
            f"{path}: column {field!r} holds {kind}, not text (string); pass the --text-field of "
            f"a string column or convert the file"
        )
    return table


_WIKITEXT_TITLE = re.compile(r"^ = [^=].* = $")


def iter_wikitext_articles(lines: Iterable[str]) -> Iterator[str]:
    """WikiText raw: an article starts at a top-level heading line ' = Title = ' (sub-headings use '
    = = '); each article becomes one document, its title the first line. Streams: one article in
    memory at a time."""
    article = None
    for line in lines:
        line = line.rstrip("\n")
        if _WIKITEXT_TITLE.match(line):
            if article and len(article) > 2:
                yield "\n".join(article)
            article = [line.strip(" =").strip(), ""]
        elif article is not None and line.strip():
            article.append(line.strip())
    if article and len(article) > 2:
        yield "\n".join(article)


def parse_wikitext(text: str) -> list[str]:
    """The articles of a WikiText raw file.

    >>> parse_wikitext(" = A = \\n \\n Text a . \\n = = Sub = = \\n More . \\n"
    ...                " = B = \\n Text b . \\n")
    ['A\\n\\nText a .\\n= = Sub = =\\nMore .', 'B\\n\\nText b .']
    """
    return list(iter_wikitext_articles(text.split("\n")))


def wikitext_paragraphs(text: str, min_words: int = 0) -> list[str]:
    """WikiText raw body paragraphs (not headings) with at least min_words words, in file order: the
    units of the dedup experiment (the lecture takes the first 500 of at least 100 words)."""
    paragraphs = (line.strip() for line in text.split("\n"))
    return [p for p in paragraphs if p and not p.startswith("=") and len(p.split()) >= min_words]


def read_wikitext(path: pathlib.Path) -> Iterator[str]:
    yield from parse_wikitext(read_text(path))


def read_html(path: pathlib.Path) -> Iterator[str]:
    yield read_text(path)


FILE_READERS = {
    ".txt": "txt",
    ".md": "txt",
    ".text": "txt",
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".parquet": "parquet",
    ".raw": "wikitext",
    ".html": "html",
    ".htm": "html",
    ".py": "python",
}
FILE_TYPES = "/".join(sorted(FILE_READERS))              # for messages: ".htm/.html/.json/..."
_FILE_KINDS = {"html": "html", "python": "code"}          # every other reader yields prose
# local text someone chose; jsonl/parquet/html are web-like
_CURATED_READERS = {"txt", "wikitext", "python"}


def readable(path: pathlib.Path | str) -> bool:
    """Whether a reader here knows the file's type: a.jsonl.gz yes, notes.docx no."""
    return inner_suffix(path) in FILE_READERS


def file_kind(path: pathlib.Path | str) -> str:
    """How data.py cleans a (readable) file's documents: "html", "code" or "prose"."""
    return _FILE_KINDS.get(FILE_READERS[inner_suffix(path)], "prose")


def is_curated(path: pathlib.Path | str) -> bool:
    """Whether a (readable) file is text someone chose (.txt, .md, .raw, .py), which data.py keeps
    whole."""
    return FILE_READERS[inner_suffix(path)] in _CURATED_READERS

HF_ALIASES = {
    "wikitext-2": ("Salesforce/wikitext", "wikitext-2-raw-v1"),
    "wikitext-103": ("Salesforce/wikitext", "wikitext-103-raw-v1"),
    "tinystories": ("roneneldan/TinyStories", None),
    "fineweb-edu": ("HuggingFaceFW/fineweb-edu", "sample-10BT"),
}


def read_hf(name: str, field: str = "text") -> Iterator[str]:
    """hf:NAME[:CONFIG[:SPLIT]] or an alias (hf:wikitext-2, hf:wikitext-103, hf:tinystories,
    hf:fineweb-edu), streamed with the `datasets` package. WikiText comes as lines and is regrouped
    into articles."""
    try:
        import datasets
    except ImportError:
        raise DataError(
            f"hf:{name} needs the `datasets` package and the network (pip install datasets); "
            f"offline, use pydocs, pystdlib or a local .txt/.jsonl/.parquet/.raw path"
        ) from None
    repo, *rest = name.split(":")
    config, split = (rest + [None, None])[:2]
    if repo in HF_ALIASES:
        repo, config = HF_ALIASES[repo][0], config or HF_ALIASES[repo][1]
    try:
        stream = datasets.load_dataset(repo, config, split=split or "train", streaming=True)
        # rows are lines: regroup them into articles
        if repo == "Salesforce/wikitext":
            yield from iter_wikitext_articles(row[field] for row in stream)
            return
        for row in stream:
            yield row[field]
    # the hub's many error types (offline, unknown name, gated) become one line
    except Exception as e:
        first_line = (str(e).strip().splitlines() or [""])[0][:200]
        raise DataError(
            f"hf:{name}: could not load it ({type(e).__name__}: {first_line}); offline, use "
            "pydocs, "
            f"pystdlib or a local path"
        ) from None


def file_source(path: pathlib.Path | str, options: dict) -> Callable[[], Iterator[str]]:
    from machinery import store
    kind = FILE_READERS.get(inner_suffix(path))
    field = options.get("text_field", "text")
    if kind == "txt":
        return lambda: read_txt(path, options.get("txt_split", "auto"))
    if kind == "jsonl":
        return lambda: read_jsonl(
            path, field, options.get("skip_bad_lines", False), options.get("jsonl_stats")
        )
    if kind == "parquet":
        return lambda: read_parquet(path, field)
    if kind == "wikitext":
        return lambda: read_wikitext(path)
    if kind == "html":
        return lambda: read_html(path)
    if kind == "python":
        return lambda: iter([read_text(path)])
    raise DataError(f"{path}: unknown file type {store.pure_path(path).suffix!r}; use "
                    f"{', '.join(sorted(FILE_READERS))} (optionally .gz)")


def read_val_file(path: pathlib.Path) -> list[str]:
    """The documents of a --val-data file, verbatim: a text file is one document, byte for byte (no
    newline normalization, no stripping), cut only at <|endoftext|> markers (which become the
    token); a .jsonl/.parquet file gives its records' text fields as they are. Nothing is filtered,
    deduplicated or masked.

    >>> import tempfile
    >>> f = pathlib.Path(tempfile.mkdtemp()) / "val.txt"
    >>> _ = f.write_bytes(b" a\\r\\n\\nb ")
    >>> read_val_file(f)
    [' a\\r\\n\\nb ']
    """
    reader = FILE_READERS.get(inner_suffix(path))
    if reader == "jsonl":
        return list(read_jsonl(path))
    if reader == "parquet":
        return list(read_parquet(path))
    return [part for part in _read_utf8(path, "--val-data ").split(EOT) if part.strip()]


if __name__ == "__main__":
    # no commands of its own: --help (or no argument) says what runs this file
    from machinery import cli
    cli.help_only(__doc__, "No commands of its own: `python data.py prepare --data FILES` reads "
                  "them through it.")
