"""formats.py: the file formats a data.py source is read from, each turned into a stream of
documents (strings).

Serves: data.py's pipeline (`open_source` below turns a source spec into a data.Source whose reader
is one of these; the lesson of the chapter starts where the documents come out), dataset.py and
data_at_scale.py (its workers read a chunk of a file: a .jsonl byte range, a .parquet row group).
The error class they share is the chapter's, data.DataError: a bad input is one line naming the
problem and the fix, whichever file finds it.

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

Depends on: the standard library, data.py (Source, DataError, EOT) and two siblings, store.py
(files and objects named by URI, gzip) and fileio.py (untrusted JSON in one line). Optional,
imported only by the reader that needs it: pyarrow (.parquet), datasets (`hf:`, which also needs
the network).
"""

from __future__ import annotations

import ast
import dataclasses
import gzip
import os
import pathlib
import re
import stat
import sys
import sysconfig
import tokenize
import zlib
from typing import Callable, Iterable, Iterator

# EOT: the document separator of .txt files (TinyStories' convention) and of the shards
from data import EOT, DataError, Source
from machinery import fileio


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


_NOT_JSON = object()  # what read_jsonl records for a line that does not parse
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
        f"field {field!r}; fix the line, or pass {skip}"
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
        raise DataError(
            f"{path}: reading .parquet needs pyarrow (pip install pyarrow), or convert it to .jsonl"
        ) from None
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
            f"column {field!r} (columns: {', '.join(table.schema_arrow.names)}); pass `text_field`"
        )
    kind = table.schema_arrow.field(field).type
    # bytes or lists: no text to read
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise DataError(
            f"{path}: column {field!r} holds {kind}, not text (string); pass the `text_field` of "
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
FILE_TYPES = "/".join(sorted(FILE_READERS))  # for messages: ".htm/.html/.json/..."
_FILE_KINDS = {"html": "html", "python": "code"}  # every other reader yields prose
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
            "pydocs, pystdlib or a local path"
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
    raise DataError(
        f"{path}: unknown file type {store.pure_path(path).suffix!r}; use "
        f"{', '.join(sorted(FILE_READERS))} (optionally .gz)"
    )


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


# --------------------------------------------------------------------------------------------------
# Sources: a spec (a name, hf:NAME, a path, a folder, a glob, an object store's URI) opened as a
# data.Source, whose reader is one of the above per file; and the embedded corpora
# --------------------------------------------------------------------------------------------------


def _stdlib_root() -> pathlib.Path:
    return pathlib.Path(sysconfig.get_paths()["stdlib"])


_NOT_STDLIB = {"site-packages", "dist-packages", "__pycache__"}


_TEST_DIRS = {"test", "tests", "idle_test"}


def stdlib_files(include_tests: bool) -> list[pathlib.Path]:
    """The standard library's .py files in sorted (stable) order, without third-party packages."""
    root, files = _stdlib_root(), []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(
            d for d in dirnames if d not in _NOT_STDLIB and (include_tests or d not in _TEST_DIRS)
        )
        for name in sorted(filenames):
            if name.endswith(".py") and (include_tests or not name.startswith("test_")):
                files.append(pathlib.Path(dirpath) / name)
    return files


def _read_python_source(path: pathlib.Path) -> str | None:
    """Decode a .py file by its coding cookie (PEP 263); None for the few deliberately broken test
    files."""
    try:
        with tokenize.open(path) as f:
            return f.read()
    except (SyntaxError, UnicodeDecodeError):
        return None


def module_docstrings(source: str, module: str) -> str:
    """One module's docstrings as a document: a heading line with the qualified name, then the
    docstring.

    >>> print(module_docstrings('"Say hi."\\ndef hi():\\n    "Print hi."', "greet"))
    greet
    Say hi.
    <BLANKLINE>
    greet.hi
    Print hi.
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return ""
    blocks = []

    def visit(node: ast.AST, qualname: str) -> None:
        doc = ast.get_docstring(node, clean=True)
        if doc:
            blocks.append(f"{qualname}\n{doc}")
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, f"{qualname}.{child.name}")

    visit(tree, module)
    return "\n\n".join(blocks)


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(_stdlib_root()).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def read_pydocs() -> Iterator[str]:
    """The embedded prose corpus (~2.3 MB): stdlib docstrings, one document per module (tests
    skipped), then the reference manual's topics from pydoc_data.topics (what `help("with")`
    prints), one document per topic."""
    for path in stdlib_files(include_tests=False):
        source = _read_python_source(path)
        text = module_docstrings(source, _module_name(path)) if source else ""
        if text:
            yield text
    try:
        from pydoc_data.topics import topics
    # some distributions strip pydoc_data; the docstrings alone are still ~1.8 MB
    except ImportError:
        return
    for name in sorted(topics):
        yield topics[name].strip()


def read_pystdlib() -> Iterator[str]:
    """The embedded code corpus (~31 MB): every .py file of the standard library, tests included,
    one per document."""
    for path in stdlib_files(include_tests=True):
        source = _read_python_source(path)
        if source and source.strip():
            yield source


def _files_under(directory: pathlib.Path) -> list[pathlib.Path]:
    # hidden files and folders (.git) skipped
    files = sorted(
        p
        for p in directory.rglob("*")
        if p.is_file()
        and readable(p)
        and not any(part.startswith(".") for part in p.relative_to(directory).parts)
    )
    if not files:
        raise DataError(f"{directory} holds no {FILE_TYPES} files")
    return files


def special_file(path: pathlib.Path) -> str:
    """What a path that is neither a file nor a folder is: 'a FIFO (named pipe)', 'a device', 'a
    socket'."""
    mode = path.stat().st_mode
    return (
        "a FIFO (named pipe)"
        if stat.S_ISFIFO(mode)
        else "a socket"
        if stat.S_ISSOCK(mode)
        else "a device"
    )


def _is_dataset(folder: pathlib.Path) -> bool:
    """Whether a folder holds a dataset `prepare` wrote (its manifest says so): a corpus it must not
    read."""
    manifest = read_manifest_or_none(folder)
    return isinstance(manifest, dict) and manifest.get("format") == "llm-token-shards"


def open_source(
    spec: str,
    text_field: str = "text",
    txt_split: str = "auto",
    skip_bad_lines: bool = False,
    max_documents: int | None = None,
    jsonl_stats: JsonlStats | None = None,
    kind: str | None = None,
) -> Source:
    """Turn a source spec (a name, hf:..., a path to a file or directory, a glob, or the URI of an
    object, prefix or glob in an object store: s3://bucket/web/*.parquet) into a Source. kind
    overrides what the file types imply ("code" for a .jsonl of source files, say)."""
    from machinery import store  # object-store I/O, loaded only where a path may be a URI

    if kind not in (None, "prose", "code", "html"):
        raise DataError(f"unknown source kind {kind!r}; use prose, code or html")
    options = dict(
        text_field=text_field,
        txt_split=txt_split,
        skip_bad_lines=skip_bad_lines,
        jsonl_stats=jsonl_stats,
    )
    version = f"python-{sys.version.split()[0]}@{_stdlib_root()}"
    if spec == "pydocs":
        return Source(spec, kind or "prose", version, read_pydocs, max_documents)
    if spec == "pystdlib":
        return Source(spec, kind or "code", version, read_pystdlib, max_documents)
    if spec.startswith("hf:"):
        name = spec[3:]
        return Source(spec, kind or "prose", spec, lambda: read_hf(name, text_field), max_documents)
    path = pathlib.Path(spec).expanduser()
    if store.is_uri(spec):
        listed = store.list_files(spec, readable, FILE_TYPES, DataError)
        files = [uri for uri, _, _ in listed]
        fingerprint = ";".join(f"{uri}:{size}:{mtime_ns}" for uri, size, mtime_ns in listed)
    elif any(c in spec for c in "*?[") and not path.exists():  # a pattern: "shards/*.parquet"
        # pathlib's ** never follows a directory symlink:
        anchor = pathlib.Path(path.anchor or ".")
        # glob's loops forever
        matches = anchor.glob(str(path.relative_to(anchor)) if path.anchor else str(path))
        files = sorted(
            p for p in matches if p.is_file() and readable(p) and not p.name.startswith(".")
        )
        if not files:
            raise DataError(f"source {spec!r} matches no {FILE_TYPES} files; check the pattern")
    elif not path.exists():
        hint = "a name (pydocs, pystdlib, hf:NAME), an existing file/directory or a glob pattern"
        raise DataError(f"source {spec!r} not found: give {hint}")
    # reading a FIFO waits for a writer; /dev/zero never ends
    elif not (path.is_dir() or path.is_file()):
        raise DataError(
            f"source {spec!r} is {special_file(path)}, not a regular file: save the text to a "
            "file and pass that"
        )
    else:
        files = _files_under(path) if path.is_dir() else [path]
    if not store.is_uri(spec):
        for f in files:
            if f.name == "manifest.json" and _is_dataset(f.parent):
                raise DataError(
                    f"source {spec!r}: {f.parent} is a prepared dataset, not text: pass it to "
                    f"train.py `data` (or to data.py inspect), not to prepare"
                )
        stats = [f.stat() for f in files]
        if not any(st.st_size for st in stats):
            raise DataError(f"source {spec!r} is empty (0 bytes): give a file with text")
        fingerprint = ";".join(
            f"{f.resolve()}:{st.st_size}:{st.st_mtime_ns}" for f, st in zip(files, stats)
        )
    readers = [file_source(f, options) for f in files]
    kinds = {file_kind(f) for f in files}
    if len(kinds) > 1 and kind is None:
        raise DataError(
            f"{spec} mixes {' and '.join(sorted(kinds))} files, which are cleaned differently: "
            "pass them as separate sources (or force one with `kind`)"
        )

    def read() -> Iterator[str]:
        for file, reader in zip(files, readers):
            try:
                yield from reader()
            except OSError as e:  # EIO from a failing disk, a file removed midway
                raise DataError(
                    f"{file}: cannot read it ({e.strerror or e}); check the disk, or "
                    f"leave the file out of {spec}"
                ) from None

    curated = all(is_curated(f) for f in files)
    label = store.pure_path(spec).name or spec
    return Source(
        spec, kind or kinds.pop(), fingerprint, read, max_documents, tuple(files), curated, label
    )


def read_manifest_or_none(data_dir: pathlib.Path | str) -> dict | None:
    from machinery import store

    if store.is_uri(data_dir):
        path = store.uri_of(
            data_dir, store.filesystem(data_dir, DataError)[1] + "/manifest.json", DataError
        )
    else:
        path = pathlib.Path(data_dir) / "manifest.json"
    try:
        with store.open_input(path, error=DataError) as f:
            manifest = fileio.parse_json(f.read(), str(path), DataError)
    # missing, unreadable, or not JSON (however deeply nested)
    except (OSError, DataError):
        return None
    return manifest if isinstance(manifest, dict) else None


if __name__ == "__main__":
    # no commands of its own: --help (or no argument) says what runs this file
    from machinery import cli

    cli.help_only(
        __doc__,
        "No commands of its own: `python data.py prepare --data FILES` reads them through it.",
    )
