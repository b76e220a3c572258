"""data.py: from raw corpora to clean, deduplicated, mixed, packed token shards, and the loader that reads them.

"What the model learns depends on what it reads." Raw text is mostly unusable: web pages carry menus, footers,
boilerplate, machine-made junk and duplicates. The lecture's pipeline, with its illustrative funnel for 1,000 pages:

    step                      what it does                                         1,000 web pages
    extract text              HTML -> body text, drop menus and footers            1,000
    language/quality filters  rules (length, symbol ratio, repeated lines), ...    300 left
    dedup                     drop exact and near-identical documents              200 left
    PII removal               emails, phone numbers, ... -> placeholders           200, masked
    mixing                    decide how much web, code, books, math               by weight

"Most of it is thrown away" is normal. This file runs that funnel on real text and prints it the same way. On the
embedded corpus (the standard library's docstrings, CPython 3.11): 722 documents read -> 337 pass the Gopher rules
(236 have under 50 words, 121 repeat too many 5-grams) -> 336 after exact dedup -> 335 after near-dedup, 7 IPs and
5 emails masked: 2.50M characters in, 1.19M out.

    python data.py prepare --data pydocs                 # the embedded corpus: stdlib docstrings, ~2 MB, offline
    python data.py prepare --data corpus.jsonl pystdlib --weights 0.7 0.3 --vocab-size 8192 --out data/my
    python data.py mix --tokens 20e9 --weights web=0.70 code=0.15 books=0.10 math=0.05 --unique math=0.5e9

Mixing is arithmetic on tokens. The lecture's example: 20e9 training tokens at 70% web / 15% code / 10% books /
5% math asks for 0.05 x 20e9 = 1e9 math tokens; with only 0.5e9 unique math tokens on hand, math is read
1e9 / 0.5e9 = 2 times (2 epochs). Scarce high-quality data is up-weighted like this, but repeat it too often and
the model starts to memorise it (we warn above 4 epochs, where Muennighoff et al. 2023 saw returns fall off).

The validation split is cut after deduplication, so no validation document has a near-duplicate in train (else the
held-out loss is measured on text the model has seen). The tokenizer (bpe.py) is trained on the train split only.
Documents are encoded with the tokenizer's tiktoken twin (fast, multi-threaded), each preceded by <|endoftext|>,
and packed into shards: a 32-byte header (magic, version, dtype, token count) followed by raw uint16 token ids
(uint32 when the vocabulary has more than 65,536 entries). A JSON manifest records sources, settings, the funnel,
the tokenizer and the split sizes. The same inputs and settings map to the same cache directory, reused as is.

The loader memory-maps the shards: `get_batch` draws random windows (seeded), `iterator` walks a seeded permutation
of non-overlapping windows, split across data-parallel ranks, with a position that can be saved and restored.

Depends on: numpy, torch (the loader's tensors), tiktoken (through bpe.py), the standard library, and two siblings:
bpe.py (train_bpe, Tokenizer) and dedup.py (near-dedup). Everything runs offline except `hf:` sources.
"""
from __future__ import annotations

import argparse
import ast
import collections
import contextlib
import dataclasses
import gzip
import hashlib
import html.parser
import io
import json
import math
import os
import pathlib
import re
import shutil
import struct
import sys
import sysconfig
import tempfile
import time
import tokenize
import warnings
from typing import Callable, Iterable, Iterator

import numpy as np
import torch

import bpe
import dedup

EOT = "<|endoftext|>"
DEFAULT_VOCAB_SIZE = 4096          # the tiny CPU run: small enough to train on ~2 MB in seconds, big enough for words
REPO_ROOT = pathlib.Path(__file__).resolve().parent


class DataError(ValueError):
    """Bad input to the data pipeline: the message is one line naming the problem and the fix."""


# ---------------------------------------------------------------------------------------------------------------------
# 1. Sources: each yields documents (strings) in a stable order
# ---------------------------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Source:
    """A named stream of documents.

    kind: "prose" (Gopher quality filters, boilerplate-line removal), "code" (code filters only) or "html"
    (text is extracted first, then treated as prose). fingerprint: what the cache key needs to know about the
    input (file sizes and mtimes, the Python version for embedded corpora).
    """
    spec: str
    kind: str
    fingerprint: str
    read: Callable[[], Iterator[str]]
    max_documents: int | None = None

    @property
    def label(self) -> str:
        """The spec, shortened to a file name for paths (for the funnel table)."""
        return self.spec if self.spec in ("pydocs", "pystdlib") or self.spec.startswith("hf:") \
            else pathlib.Path(self.spec).name or self.spec

    def documents(self) -> Iterator[str]:
        for i, doc in enumerate(self.read()):
            if self.max_documents is not None and i >= self.max_documents:
                return
            yield doc


def _stdlib_root() -> pathlib.Path:
    return pathlib.Path(sysconfig.get_paths()["stdlib"])


_NOT_STDLIB = {"site-packages", "dist-packages", "__pycache__"}
_TEST_DIRS = {"test", "tests", "idle_test"}


def stdlib_files(include_tests: bool) -> list[pathlib.Path]:
    """The standard library's .py files in sorted (stable) order, without third-party packages."""
    root, files = _stdlib_root(), []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames
                             if d not in _NOT_STDLIB and (include_tests or d not in _TEST_DIRS))
        for name in sorted(filenames):
            if name.endswith(".py") and (include_tests or not name.startswith("test_")):
                files.append(pathlib.Path(dirpath) / name)
    return files


def _read_python_source(path: pathlib.Path) -> str | None:
    """Decode a .py file by its coding cookie (PEP 263); None for the few deliberately broken test files."""
    try:
        with tokenize.open(path) as f:
            return f.read()
    except (SyntaxError, UnicodeDecodeError):
        return None


def module_docstrings(source: str, module: str) -> str:
    """One module's docstrings as a document: a heading line with the qualified name, then the docstring.

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
    """The embedded prose corpus (~2.3 MB): stdlib docstrings, one document per module (tests skipped), then the
    reference manual's topics from pydoc_data.topics (what `help("with")` prints), one document per topic."""
    for path in stdlib_files(include_tests=False):
        source = _read_python_source(path)
        text = module_docstrings(source, _module_name(path)) if source else ""
        if text:
            yield text
    try:
        from pydoc_data.topics import topics
    except ImportError:       # some distributions strip pydoc_data; the docstrings alone are still ~1.8 MB
        return
    for name in sorted(topics):
        yield topics[name].strip()


def read_pystdlib() -> Iterator[str]:
    """The embedded code corpus (~31 MB): every .py file of the standard library, tests included, one per document."""
    for path in stdlib_files(include_tests=True):
        source = _read_python_source(path)
        if source and source.strip():
            yield source


def _read_bytes(path: pathlib.Path) -> bytes:
    """A (possibly gzipped) file's bytes; a binary file or a damaged .gz is refused with one clear line."""
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (gzip.BadGzipFile, EOFError) as e:
        raise DataError(f"{path}: damaged gzip file ({e}); re-download or re-compress it") from None
    if b"\x00" in raw[:8192]:
        raise DataError(f"{path} looks binary (NUL bytes); pass a UTF-8 text, .jsonl, .parquet or .gz file")
    return raw


def _read_text(path: pathlib.Path) -> str:
    """A (possibly gzipped) file as UTF-8 text with universal newlines."""
    try:
        text = _read_bytes(path).decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path} is not UTF-8 text (byte {e.start}); convert it, e.g. with iconv") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _inner_suffix(path: pathlib.Path) -> str:
    """'.txt' for both a.txt and a.txt.gz."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes.pop()
    return suffixes[-1] if suffixes else ""


def split_plain_text(text: str, mode: str = "auto") -> list[str]:
    """Split a .txt file into documents.

    mode "eot": on <|endoftext|> (TinyStories' convention); "blank": on blank lines (one paragraph per document);
    "file": the whole file is one document; "auto": "eot" when the marker occurs, else "blank".

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
    yield from split_plain_text(_read_text(path), mode)


@dataclasses.dataclass
class JsonlStats:
    """Malformed lines skipped while reading (only when skipping was asked for)."""
    skipped: int = 0


def read_jsonl(path: pathlib.Path, field: str = "text", skip_bad_lines: bool = False,
               stats: JsonlStats | None = None) -> Iterator[str]:
    """One JSON object per line; the document is `obj[field]`. A malformed line stops with its line number,
    unless skip_bad_lines, which skips and counts it."""
    with (gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")) as f:    # streamed line by line
        try:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    text = json.loads(line)[field]           # json.loads decodes the UTF-8 bytes itself
                    if not isinstance(text, str):
                        raise TypeError
                except (ValueError, KeyError, TypeError, IndexError):
                    if skip_bad_lines:
                        if stats is not None:
                            stats.skipped += 1
                        continue
                    raise DataError(f"{path}:{lineno}: not a UTF-8 JSON object with a string field {field!r} (fix "
                                    f"the line, pass --text-field, or --skip-bad-lines to skip and count)") from None
                yield text
        except (gzip.BadGzipFile, EOFError) as e:
            raise DataError(f"{path}: damaged gzip file ({e}); re-download or re-compress it") from None


def read_parquet(path: pathlib.Path, field: str = "text") -> Iterator[str]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{path}: reading .parquet needs pyarrow (pip install pyarrow), "
                        f"or convert it to .jsonl") from None
    table = pq.ParquetFile(path)
    if field not in table.schema_arrow.names:
        raise DataError(f"{path}: no column {field!r} (columns: {', '.join(table.schema_arrow.names)}); "
                        f"pass --text-field")
    for batch in table.iter_batches(columns=[field]):
        for text in batch.column(0).to_pylist():
            if text:
                yield text


_WIKITEXT_TITLE = re.compile(r"^ = [^=].* = $")


def iter_wikitext_articles(lines: Iterable[str]) -> Iterator[str]:
    """WikiText raw: an article starts at a top-level heading line ' = Title = ' (sub-headings use ' = = ');
    each article becomes one document, its title the first line. Streams: one article in memory at a time."""
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

    >>> parse_wikitext(" = A = \\n \\n Text a . \\n = = Sub = = \\n More . \\n = B = \\n Text b . \\n")
    ['A\\n\\nText a .\\n= = Sub = =\\nMore .', 'B\\n\\nText b .']
    """
    return list(iter_wikitext_articles(text.split("\n")))


def wikitext_paragraphs(text: str, min_words: int = 0) -> list[str]:
    """WikiText raw body paragraphs (not headings) with at least min_words words, in file order: the units of the
    dedup experiment (the lecture takes the first 500 of at least 100 words)."""
    paragraphs = (line.strip() for line in text.split("\n"))
    return [p for p in paragraphs if p and not p.startswith("=") and len(p.split()) >= min_words]


def read_wikitext(path: pathlib.Path) -> Iterator[str]:
    yield from parse_wikitext(_read_text(path))


def read_html(path: pathlib.Path) -> Iterator[str]:
    yield _read_text(path)


_FILE_READERS = {".txt": "txt", ".md": "txt", ".text": "txt", ".jsonl": "jsonl", ".json": "jsonl",
                 ".parquet": "parquet", ".raw": "wikitext", ".html": "html", ".htm": "html", ".py": "python"}
_FILE_KINDS = {"html": "html", "python": "code"}          # every other reader yields prose

HF_ALIASES = {
    "wikitext-2": ("Salesforce/wikitext", "wikitext-2-raw-v1"),
    "wikitext-103": ("Salesforce/wikitext", "wikitext-103-raw-v1"),
    "tinystories": ("roneneldan/TinyStories", None),
    "fineweb-edu": ("HuggingFaceFW/fineweb-edu", "sample-10BT"),
}


def read_hf(name: str, field: str = "text") -> Iterator[str]:
    """hf:NAME[:CONFIG[:SPLIT]] or an alias (hf:wikitext-2, hf:wikitext-103, hf:tinystories, hf:fineweb-edu),
    streamed with the `datasets` package. WikiText comes as lines and is regrouped into articles."""
    try:
        import datasets
    except ImportError:
        raise DataError(f"hf:{name} needs the `datasets` package and the network (pip install datasets); "
                        f"offline, use pydocs, pystdlib or a local .txt/.jsonl/.parquet/.raw path") from None
    repo, *rest = name.split(":")
    config, split = (rest + [None, None])[:2]
    if repo in HF_ALIASES:
        repo, config = HF_ALIASES[repo][0], config or HF_ALIASES[repo][1]
    try:
        stream = datasets.load_dataset(repo, config, split=split or "train", streaming=True)
        if repo == "Salesforce/wikitext":                  # rows are lines: regroup them into articles
            yield from iter_wikitext_articles(row[field] for row in stream)
            return
        for row in stream:
            yield row[field]
    except Exception as e:          # the hub's many error types (offline, unknown name, gated) become one line
        first_line = (str(e).strip().splitlines() or [""])[0][:200]
        raise DataError(f"hf:{name}: could not load it ({type(e).__name__}: {first_line}); offline, use pydocs, "
                        f"pystdlib or a local path") from None


def _file_source(path: pathlib.Path, options: dict) -> Callable[[], Iterator[str]]:
    kind = _FILE_READERS.get(_inner_suffix(path))
    field = options.get("text_field", "text")
    if kind == "txt":
        return lambda: read_txt(path, options.get("txt_split", "auto"))
    if kind == "jsonl":
        return lambda: read_jsonl(path, field, options.get("skip_bad_lines", False), options.get("jsonl_stats"))
    if kind == "parquet":
        return lambda: read_parquet(path, field)
    if kind == "wikitext":
        return lambda: read_wikitext(path)
    if kind == "html":
        return lambda: read_html(path)
    if kind == "python":
        return lambda: iter([_read_text(path)])
    raise DataError(f"{path}: unknown file type {path.suffix!r}; use "
                    f"{', '.join(sorted(_FILE_READERS))} (optionally .gz)")


def _files_under(directory: pathlib.Path) -> list[pathlib.Path]:
    files = sorted(p for p in directory.rglob("*")                    # hidden files and folders (.git) skipped
                   if p.is_file() and _inner_suffix(p) in _FILE_READERS
                   and not any(part.startswith(".") for part in p.relative_to(directory).parts))
    if not files:
        raise DataError(f"{directory} holds no {'/'.join(sorted(_FILE_READERS))} files")
    return files


def open_source(spec: str, text_field: str = "text", txt_split: str = "auto", skip_bad_lines: bool = False,
                max_documents: int | None = None, jsonl_stats: JsonlStats | None = None,
                kind: str | None = None) -> Source:
    """Turn a source spec (a name, hf:..., or a path to a file or directory) into a Source.
    kind overrides what the file types imply ("code" for a .jsonl of source files, say)."""
    if kind not in (None, "prose", "code", "html"):
        raise DataError(f"unknown source kind {kind!r}; use prose, code or html")
    options = dict(text_field=text_field, txt_split=txt_split, skip_bad_lines=skip_bad_lines,
                   jsonl_stats=jsonl_stats)
    version = f"python-{sys.version.split()[0]}@{_stdlib_root()}"
    if spec == "pydocs":
        return Source(spec, kind or "prose", version, read_pydocs, max_documents)
    if spec == "pystdlib":
        return Source(spec, kind or "code", version, read_pystdlib, max_documents)
    if spec.startswith("hf:"):
        name = spec[3:]
        return Source(spec, kind or "prose", spec, lambda: read_hf(name, text_field), max_documents)
    path = pathlib.Path(spec).expanduser()
    if not path.exists():
        hint = "a name (pydocs, pystdlib, hf:NAME) or an existing file/directory"
        raise DataError(f"source {spec!r} not found: give {hint}")
    files = _files_under(path) if path.is_dir() else [path]
    readers = [_file_source(f, options) for f in files]
    kinds = {_FILE_KINDS.get(_FILE_READERS[_inner_suffix(f)], "prose") for f in files}
    if len(kinds) > 1 and kind is None:
        raise DataError(f"{path} mixes {' and '.join(sorted(kinds))} files, which are cleaned differently: pass "
                        f"them as separate sources (or force one with --kind)")
    fingerprint = ";".join(f"{f.resolve()}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files)

    def read() -> Iterator[str]:
        for reader in readers:
            yield from reader()

    return Source(spec, kind or kinds.pop(), fingerprint, read, max_documents)


# ---------------------------------------------------------------------------------------------------------------------
# 2. Extract text from HTML (standard library parser)
# ---------------------------------------------------------------------------------------------------------------------

class _TextExtractor(html.parser.HTMLParser):
    """Collects visible text, skipping non-content elements and breaking paragraphs at block elements."""
    SKIP = {"script", "style", "nav", "header", "footer", "aside", "noscript", "template", "head", "svg",
            "iframe", "form", "button", "select"}
    BLOCK = {"p", "div", "br", "li", "ul", "ol", "h1", "h2", "h3", "h4", "h5", "h6", "tr", "table", "section",
             "article", "main", "blockquote", "pre", "hr", "dl", "dt", "dd", "figcaption", "title", "body"}
    PARAGRAPH = "\x00"

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skip_depth = 0

    def handle_starttag(self, tag: str, attrs) -> None:
        if tag in self.SKIP:
            self.skip_depth += 1
        elif tag in self.BLOCK:
            self.parts.append(self.PARAGRAPH)

    def handle_startendtag(self, tag: str, attrs) -> None:
        if tag in self.BLOCK:
            self.parts.append(self.PARAGRAPH)

    def handle_endtag(self, tag: str) -> None:
        if tag in self.SKIP:
            self.skip_depth = max(0, self.skip_depth - 1)
        elif tag in self.BLOCK:
            self.parts.append(self.PARAGRAPH)

    def handle_data(self, data: str) -> None:
        if not self.skip_depth:
            self.parts.append(data)


def html_to_text(page: str) -> str:
    """Body text of an HTML page: no script/style/nav/header/footer/aside, one paragraph per block element.

    >>> html_to_text("<nav>Home | About</nav><p>Hello <b>big</b>\\n world.</p><footer>(c) 2024</footer><p>Bye</p>")
    'Hello big world.\\n\\nBye'
    """
    parser = _TextExtractor()
    parser.feed(page)
    parser.close()
    paragraphs = "".join(parser.parts).split(_TextExtractor.PARAGRAPH)
    return "\n\n".join(" ".join(p.split()) for p in paragraphs if p.strip())


# ---------------------------------------------------------------------------------------------------------------------
# 3. Quality filters: rules after Gopher (Rae et al. 2021, MassiveText), each rejection with a named reason
# ---------------------------------------------------------------------------------------------------------------------

GOPHER_STOP_WORDS = frozenset({"the", "be", "to", "of", "and", "that", "have", "with"})
_BULLETS = ("-", "*", "•", "‣", "●", "◦", "–")
_PUNCTUATION = ".,;:!?\"'()[]{}"
TOP_NGRAM_MAX = {2: 0.20, 3: 0.18, 4: 0.16}                  # chars in the most frequent n-gram / all word chars
DUP_NGRAM_MAX = {5: 0.15, 6: 0.14, 7: 0.13, 8: 0.12, 9: 0.11, 10: 0.10}   # chars in repeated n-grams / all


def _duplicate_fractions(items: list[str]) -> tuple[float, float]:
    """(fraction of items that repeat an earlier one, fraction of characters in those repeats).

    >>> _duplicate_fractions(["a", "bb", "a", "a"])
    (0.5, 0.4)
    """
    seen, dup_items, dup_chars = set(), 0, 0
    for item in items:
        if item in seen:
            dup_items += 1
            dup_chars += len(item)
        seen.add(item)
    total_chars = sum(len(i) for i in items)
    return dup_items / max(1, len(items)), dup_chars / max(1, total_chars)


def _top_ngram_fraction(words: list[str], n: int, total_chars: int) -> float:
    """Share of word characters covered by the single most frequent n-gram (counting every occurrence)."""
    counts = collections.Counter(zip(*(words[i:] for i in range(n))))
    if not counts:
        return 0.0
    gram, count = counts.most_common(1)[0]
    return count * sum(len(w) for w in gram) / total_chars if count > 1 else 0.0


def _duplicate_ngram_fraction(words: list[str], n: int, total_chars: int) -> float:
    """Share of word characters inside n-grams that occur more than once (each word counted once)."""
    first_seen: dict[tuple, int] = {}
    covered = bytearray(len(words))
    for i, gram in enumerate(zip(*(words[j:] for j in range(n)))):
        j = first_seen.setdefault(gram, i)
        if j != i:
            covered[i:i + n] = b"\x01" * n
            covered[j:j + n] = b"\x01" * n
    return sum(len(w) for w, c in zip(words, covered) if c) / total_chars


def gopher_rejection(text: str, min_words: int = 50, max_words: int = 100_000) -> str | None:
    """The first Gopher rule a document breaks (its name), or None when it passes. Rules (Rae et al. 2021, App. A):

        too_few_words, too_many_words   50 <= words <= 100,000 (words: whitespace-separated)
        mean_word_length                3 to 10 characters
        symbol_ratio                    ("#" + "...") per word <= 0.1
        bullet_lines, ellipsis_lines    <= 90% of lines start with a bullet, <= 30% end with "..."
        alphabetic_words                >= 80% of words contain a letter
        stop_words                      at least 2 of: the, be, to, of, and, that, have, with
        duplicate_lines, _paragraphs    <= 30% of lines (paragraphs) repeat one above, holding <= 20% of characters
        top_2gram, _3gram, _4gram       the most frequent n-gram covers <= 20%, 18%, 16% of characters
        duplicate_5grams ... _10grams   repeated n-grams cover <= 15%, 14%, ... 10% of characters

    >>> gopher_rejection("too short")
    'too_few_words'
    >>> gopher_rejection(" ".join(["the quick brown fox jumps over the lazy dog and runs"] * 10))
    'top_3gram'
    """
    words = text.split()
    n = len(words)
    if n < min_words:
        return "too_few_words"
    if n > max_words:
        return "too_many_words"
    total_chars = sum(len(w) for w in words)
    if not 3 <= total_chars / n <= 10:
        return "mean_word_length"
    if (text.count("#") + text.count("...") + text.count("…")) / n > 0.1:
        return "symbol_ratio"
    lines = [line.strip() for line in text.split("\n") if line.strip()]
    if sum(line.startswith(_BULLETS) for line in lines) > 0.9 * len(lines):
        return "bullet_lines"
    if sum(line.endswith(("...", "…")) for line in lines) > 0.3 * len(lines):
        return "ellipsis_lines"
    if sum(any(c.isalpha() for c in w) for w in words) < 0.8 * n:
        return "alphabetic_words"
    if len(GOPHER_STOP_WORDS.intersection(w.lower().strip(_PUNCTUATION) for w in words)) < 2:
        return "stop_words"
    dup_lines, dup_line_chars = _duplicate_fractions(lines)
    if dup_lines > 0.3 or dup_line_chars > 0.2:
        return "duplicate_lines"
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
    dup_paragraphs, dup_paragraph_chars = _duplicate_fractions(paragraphs)
    if dup_paragraphs > 0.3 or dup_paragraph_chars > 0.2:
        return "duplicate_paragraphs"
    for k, limit in TOP_NGRAM_MAX.items():
        if _top_ngram_fraction(words, k, total_chars) > limit:
            return f"top_{k}gram"
    for k, limit in DUP_NGRAM_MAX.items():
        if _duplicate_ngram_fraction(words, k, total_chars) > limit:
            return f"duplicate_{k}grams"
    return None


def code_rejection(text: str) -> str | None:
    """Rules for source code (as in the Codex and StarCoder data cards): minified or generated files have huge
    lines; data blobs have few letters and digits.

    >>> code_rejection("x = 1\\n" + "y = [" + "0, " * 500 + "]\\n")
    'max_line_length'
    """
    lines = text.split("\n")
    if max(len(line) for line in lines) > 1000:
        return "max_line_length"
    if len(text) / len(lines) > 100:
        return "mean_line_length"
    if sum(c.isalnum() for c in text) < 0.25 * len(text):
        return "alphanumeric_fraction"
    return None


# ---------------------------------------------------------------------------------------------------------------------
# 4. Exact dedup of documents, and removal of lines repeated across the corpus (boilerplate)
# ---------------------------------------------------------------------------------------------------------------------

def document_hash(text: str) -> str:
    """Hash of a document after normalising case and whitespace, so re-wrapped copies collide.

    >>> document_hash("Hello  World\\n") == document_hash("hello world")
    True
    """
    return hashlib.sha1(" ".join(text.lower().split()).encode("utf-8")).hexdigest()


def exact_dedup(texts: list[str]) -> list[int]:
    """Indices of the first document of each hash group, in order.

    >>> exact_dedup(["a b", "c", "A  b", "c", "d"])
    [0, 1, 4]
    """
    seen, kept = set(), []
    for i, text in enumerate(texts):
        h = document_hash(text)
        if h not in seen:
            seen.add(h)
            kept.append(i)
    return kept


def boilerplate_lines(texts: list[str], min_documents: int = 3, min_words: int = 3) -> set[str]:
    """Lines (stripped, at least min_words words) that occur in at least min_documents different documents:
    cookie notices, navigation leftovers, licence footers. Short lines ("Returns", "}") are never boilerplate.

    >>> sorted(boilerplate_lines(["a\\nAll rights reserved here", "b\\nAll rights reserved here", "c"], 2))
    ['All rights reserved here']
    """
    if min_documents < 2:
        raise DataError(f"--boilerplate-min-documents must be at least 2 (a line in one document is not repeated), "
                        f"got {min_documents}")
    document_counts = collections.Counter()
    for text in texts:
        lines = {line.strip() for line in text.split("\n")}
        document_counts.update(line for line in lines if len(line.split()) >= min_words)
    return {line for line, count in document_counts.items() if count >= min_documents}


def remove_lines(text: str, lines: set[str]) -> tuple[str, int]:
    """(text without those lines, how many lines were removed)."""
    kept = [line for line in text.split("\n") if line.strip() not in lines]
    removed = text.count("\n") + 1 - len(kept)
    return "\n".join(kept).strip(), removed


# ---------------------------------------------------------------------------------------------------------------------
# 5. PII masking
# ---------------------------------------------------------------------------------------------------------------------

_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
PII_PATTERNS = {
    # local@domain.tld; the TLD needs 2+ letters, so "a@b" in code is left alone.
    "EMAIL": re.compile(r"\b[A-Za-z0-9._%+-]+@(?:[A-Za-z0-9-]+\.)+[A-Za-z]{2,}\b"),
    # four octets 0-255; not inside a longer dotted number ("1.2.3.4.5") or a word ("v1.2.3.4").
    "IP": re.compile(rf"(?<![\w.]){_OCTET}(?:\.{_OCTET}){{3}}(?!\.?\d)(?!\w)"),
    # North American (555) 123-4567, 555-123-4567, 555.123.4567, +1 555 123 4567; international +44 20 7946 0958.
    # Separators are required, so bare numbers, dates (2023-01-15) and versions (3.11.7) never match.
    "PHONE": re.compile(r"(?<![\w+.-])(?:(?:\+?1[ .-]?)?(?:\(\d{3}\)[ ]?|\d{3}[ .-])\d{3}[ .-]\d{4}"
                        r"|\+\d{1,3}(?:[ .-]\(?\d{1,4}\)?){2,5})(?!\d)(?![.-]\d)"),
}


# A dotted quad right after "version", "Ver.", "driver", "build", ... is a version number, not an address.
_VERSION_CONTEXT = re.compile(r"(?i)\b(?:v|ver\.?|version|release|build|driver|firmware|update)\s*$")


def mask_pii(text: str) -> tuple[str, collections.Counter]:
    """Replace emails, phone numbers and IPv4 addresses with <EMAIL>, <PHONE>, <IP>; return the counts.

    >>> text, counts = mask_pii("Mail bob@example.com or call (555) 123-4567 from 10.0.0.1, Python 3.11.7, 2023-01-15.")
    >>> text, sorted(counts.items())
    ('Mail <EMAIL> or call <PHONE> from <IP>, Python 3.11.7, 2023-01-15.', [('EMAIL', 1), ('IP', 1), ('PHONE', 1)])
    """
    counts = collections.Counter()
    for label, pattern in PII_PATTERNS.items():
        def replace(match: re.Match, label=label) -> str:
            if label == "PHONE" and not 7 <= sum(c.isdigit() for c in match.group()) <= 15:
                return match.group()
            if label == "IP" and _VERSION_CONTEXT.search(match.string, max(0, match.start() - 16), match.start()):
                return match.group()
            counts[label] += 1
            return f"<{label}>"
        text = pattern.sub(replace, text)
    return text, counts


# ---------------------------------------------------------------------------------------------------------------------
# 6. The funnel: every step reports documents and characters in and out, and why documents left
# ---------------------------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Step:
    """One row of the funnel; reasons maps a named cause to how many documents (or lines, or masks) it hit."""
    name: str
    docs_in: int
    docs_out: int
    chars_in: int
    chars_out: int
    reasons: dict = dataclasses.field(default_factory=dict)


class Funnel:
    """The lecture's table (1,000 -> 300 -> 200 ...) for an actual run."""

    def __init__(self) -> None:
        self.steps: list[Step] = []
        self.bytes_read = 0                  # UTF-8 bytes of every document read, for the throughput figure

    def add(self, name: str, before: list[str], after: list[str], reasons: dict | None = None) -> None:
        self.steps.append(Step(name, len(before), len(after), sum(map(len, before)), sum(map(len, after)),
                               dict(sorted((reasons or {}).items(), key=lambda kv: -kv[1]))))

    @classmethod
    def from_manifest(cls, manifest: dict) -> "Funnel":
        funnel = cls()
        funnel.steps = [Step(**s) for s in manifest["funnel"]]
        return funnel

    def to_list(self) -> list[dict]:
        return [dataclasses.asdict(s) for s in self.steps]

    def format(self) -> str:
        width = max([len(s.name) for s in self.steps] + [30])
        rows = [f"{'step':<{width}}{'documents':>20}{'characters':>24}   removed or changed because"]
        for s in self.steps:
            docs = f"{s.docs_in:,} -> {s.docs_out:,}"
            chars = f"{s.chars_in / 1e6:,.2f}M -> {s.chars_out / 1e6:,.2f}M"
            why = ", ".join(f"{k} {v:,}" for k, v in s.reasons.items())
            rows.append(f"{s.name:<{width}}{docs:>20}{chars:>24}   {why}".rstrip())
        return "\n".join(rows)

    def empty_error(self, what: str) -> DataError:
        last = self.steps[-1]
        why = ", ".join(f"{k} {v:,}" for k, v in last.reasons.items()) or "no reason recorded"
        return DataError(f"{what}: step '{last.name}' removed all {last.docs_in:,} documents ({why}); "
                         f"loosen it (--filters none/code) or add data")


@dataclasses.dataclass
class CleanSettings:
    """Knobs of the cleaning pipeline (all part of the cache key)."""
    filters: str = "auto"                # auto (by source kind), gopher, code, none
    min_words: int = 50
    max_words: int = 100_000
    boilerplate_min_documents: int = 3
    near_dup_threshold: float = 0.5      # Jaccard of 3-word shingles; 0 disables near-dedup
    mask_pii: bool = True

    def __post_init__(self):
        if self.boilerplate_min_documents < 2:           # checked here too, so a bad flag fails before any work
            raise DataError(f"--boilerplate-min-documents must be at least 2 (a line in one document is not "
                            f"repeated), got {self.boilerplate_min_documents}")
        if not (self.near_dup_threshold == 0 or 0 < self.near_dup_threshold < 1):
            raise DataError(f"--near-dup-threshold must be 0 (off) or strictly between 0 and 1, "
                            f"got {self.near_dup_threshold}")


def _quality_rule(kind: str, settings: CleanSettings) -> tuple[str, Callable[[str], str | None] | None]:
    """(name, document -> rejection reason or None) for a source kind; "auto" picks Gopher for prose."""
    choice = {"prose": "gopher", "html": "gopher", "code": "code"}[kind] if settings.filters == "auto" \
        else settings.filters
    rules = {"gopher": lambda d: gopher_rejection(d, settings.min_words, settings.max_words),
             "code": code_rejection, "none": None}
    if choice not in rules:
        raise DataError(f"unknown filter set {choice!r}; use auto, gopher, code or none")
    return choice, rules[choice]


def clean(sources: list[Source], settings: CleanSettings | None = None,
          log: Callable[[str], None] = lambda s: None) -> tuple[list[str], list[int], Funnel]:
    """Run the funnel over all sources. Returns (documents, source index of each, funnel).

    Per source: read, extract text (HTML), quality filters. Across sources: exact dedup, boilerplate lines (prose
    only; a repeated line of code is not boilerplate), near-dedup with dedup.py, PII masking.
    """
    settings = settings or CleanSettings()
    funnel = Funnel()
    docs, origin = [], []
    for s_index, source in enumerate(sources):
        raw = [d for d in source.documents() if d.strip()]
        if not raw:
            raise DataError(f"source {source.spec!r} has no documents (empty file or wrong --text-field?)")
        funnel.add(f"read {source.label}", raw, raw)
        funnel.bytes_read += sum(len(d.encode("utf-8")) for d in raw)
        if source.kind == "html":
            text = [html_to_text(d) for d in raw]
            kept = [t for t in text if t]
            funnel.add(f"extract text ({source.label})", raw, kept, {"no_text": len(text) - len(kept)})
            raw = kept
        rule_name, rule = _quality_rule(source.kind, settings)
        if rule is not None:
            reasons, kept = collections.Counter(), []
            for d in raw:
                reason = rule(d)
                if reason:
                    reasons[reason] += 1
                else:
                    kept.append(d)
            funnel.add(f"quality filters ({rule_name}, {source.label})", raw, kept, reasons)
            if not kept:
                raise funnel.empty_error(f"source {source.spec!r}")
            raw = kept
        log(f"  {source.label}: {len(raw):,} documents after the per-source steps")
        docs += raw
        origin += [s_index] * len(raw)

    kept = exact_dedup(docs)
    before, docs, origin = docs, [docs[i] for i in kept], [origin[i] for i in kept]
    funnel.add("exact dedup (hash)", before, docs, {"duplicate": len(before) - len(docs)})

    prose = [i for i, o in enumerate(origin) if sources[o].kind != "code"]
    boiler = boilerplate_lines([docs[i] for i in prose], settings.boilerplate_min_documents)
    before, lines_removed = list(docs), 0
    for i in prose:
        docs[i], removed = remove_lines(docs[i], boiler)
        lines_removed += removed
    keep = [i for i, d in enumerate(docs) if d]
    docs, origin = [docs[i] for i in keep], [origin[i] for i in keep]
    funnel.add(f"boilerplate lines (prose, in >={settings.boilerplate_min_documents} docs)", before, docs,
               {"lines_removed": lines_removed, "distinct_lines": len(boiler), "emptied": len(before) - len(docs)})
    if not docs:
        raise funnel.empty_error("the corpus")

    if settings.near_dup_threshold > 0:
        t0 = time.perf_counter()
        kept = dedup.dedup(docs, threshold=settings.near_dup_threshold)
        before, docs, origin = docs, [docs[i] for i in kept], [origin[i] for i in kept]
        funnel.add(f"near dedup (MinHash, J>={settings.near_dup_threshold})", before, docs,
                   {"near_duplicate": len(before) - len(docs)})
        log(f"  near dedup: {time.perf_counter() - t0:.1f}s")

    if settings.mask_pii:
        before, counts = docs, collections.Counter()
        docs = []
        for d in before:
            masked, c = mask_pii(d)
            docs.append(masked)
            counts.update(c)
        funnel.add("PII masking", before, docs, {k.lower(): v for k, v in counts.items()})
    if not docs:
        raise funnel.empty_error("the corpus")
    return docs, origin, funnel


# ---------------------------------------------------------------------------------------------------------------------
# 7. Train/val split (after dedup) and mixing
# ---------------------------------------------------------------------------------------------------------------------

def split_indices(n: int, val_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Seeded split of n deduplicated documents: (train indices, val indices), each ascending.
    At least one document goes each way when n >= 2.

    >>> split_indices(10, 0.2, seed=0)[1] == split_indices(10, 0.2, seed=0)[1]
    True
    """
    if n < 2:
        raise DataError(f"{n} document(s) left after cleaning: need at least 2 for a train/val split")
    n_val = min(n - 1, max(1, round(n * val_fraction))) if val_fraction > 0 else 0
    order = np.random.default_rng(seed).permutation(n)
    return sorted(order[n_val:].tolist()), sorted(order[:n_val].tolist())


def mixture_plan(weights: dict[str, float], total_tokens: float,
                 unique_tokens: dict[str, float] | None = None, max_epochs: float = 4.0) -> dict[str, dict]:
    """Tokens and epochs per source for a token budget.

    The lecture: 20e9 tokens at web 70 / code 15 / books 10 / math 5 with 0.5e9 unique math tokens:
    >>> plan = mixture_plan({"web": .7, "code": .15, "books": .1, "math": .05}, 20e9, {"math": 0.5e9})
    >>> plan["math"]["tokens"], plan["math"]["epochs"], plan["web"]["tokens"]
    (1000000000.0, 2.0, 14000000000.0)

    Weights are normalised to sum to 1. A source repeated more than max_epochs times triggers a warning.
    """
    if not weights or any(w <= 0 for w in weights.values()):
        raise DataError(f"mixing weights must be positive, got {weights}")
    if not total_tokens > 0:
        raise DataError(f"the token budget must be positive, got {total_tokens:g}")
    if unique_tokens and any(not u > 0 for u in unique_tokens.values()):
        raise DataError(f"unique token counts must be positive, got {unique_tokens}")
    total_weight = sum(weights.values())
    unique_tokens = unique_tokens or {}
    plan = {}
    for name, w in weights.items():
        tokens = total_tokens * w / total_weight
        unique = unique_tokens.get(name)
        epochs = tokens / unique if unique else None
        if epochs is not None and epochs > max_epochs:
            warnings.warn(f"source {name} would be read {epochs:.1f} times (> {max_epochs:g} epochs): expect "
                          f"memorisation and diminishing returns; lower its weight or the token budget", stacklevel=2)
        plan[name] = {"weight": w / total_weight, "tokens": tokens, "unique_tokens": unique, "epochs": epochs}
    return plan


def covering_budget(weights: dict[str, float], unique_tokens: dict[str, float]) -> float:
    """The smallest budget that reads every source at least once (no token thrown away; the scarce sources are
    repeated instead): max over sources of unique / weight.

    >>> covering_budget({"a": 0.5, "b": 0.5}, {"a": 100, "b": 300})
    600.0
    """
    total_weight = sum(weights.values())
    return max(unique_tokens[k] / (w / total_weight) for k, w in weights.items())


def mix_documents(origin: list[int], lengths: list[int], names: list[str], weights: list[float] | None,
                  total_tokens: float | None, seed: int) -> tuple[list[int], dict | None, dict[str, int]]:
    """The order in which train documents are packed: (document indices, the mixture plan, unique tokens per
    source). Without weights every document once; with weights each source fills its share of total_tokens
    (default: the covering budget) by whole passes plus a seeded partial pass. The order is shuffled (seeded).

    Two 10-token web documents and one 5-token math document at 50/50 over 40 tokens: math is read 4 times.
    >>> sorted(mix_documents([0, 0, 1], [10, 10, 5], ["web", "math"], [0.5, 0.5], 40, seed=0)[0])
    [0, 1, 2, 2, 2, 2]
    """
    unique = {name: 0 for name in names}
    for o, n in zip(origin, lengths):
        unique[names[o]] += n
    order, mixture = list(range(len(origin))), None
    if weights is not None:
        empty = [name for name in names if unique[name] == 0]
        if empty:
            raise DataError(f"source(s) {empty} have no train documents left to mix; drop them or add data")
        weight_of = dict(zip(names, weights))
        mixture = mixture_plan(weight_of, total_tokens or covering_budget(weight_of, unique), unique)
        order = []
        for s_index, name in enumerate(names):
            members = [i for i, o in enumerate(origin) if o == s_index]
            picks = repeat_documents([lengths[i] for i in members], mixture[name]["tokens"], seed + s_index)
            order += [members[p] for p in picks]
    order = [order[i] for i in np.random.default_rng(seed).permutation(len(order)).tolist()]
    return order, mixture, unique


def repeat_documents(lengths: list[int], target_tokens: float, seed: int) -> list[int]:
    """Document indices that fill target_tokens: whole passes over all documents, then a seeded random subset
    for the fractional epoch (whole documents, stopping once the target is reached).

    >>> repeat_documents([10, 10, 10], 45, seed=0)[:3], len(repeat_documents([10, 10, 10], 45, seed=0))
    ([0, 1, 2], 5)
    """
    total = sum(lengths)
    if total == 0:
        return []
    full_epochs, remainder = divmod(target_tokens, total)
    order = list(range(len(lengths))) * int(full_epochs)
    filled = 0
    for i in np.random.default_rng(seed).permutation(len(lengths)).tolist():
        if filled >= remainder:
            break
        order.append(i)
        filled += lengths[i]
    return order


# ---------------------------------------------------------------------------------------------------------------------
# 8. Token shards: a 32-byte header (magic, version, dtype, count) and raw little-endian token ids
#
#    offset  0   8 bytes  magic b"LLMTOKS\0"         (a file that is not a shard is refused)
#    offset  8   uint32   format version (1)
#    offset 12   uint32   bytes per token: 2 (uint16) or 4 (uint32)
#    offset 16   uint64   token count N               (must equal (file size - 32) / bytes per token)
#    offset 24   8 bytes  zero padding, so the ids start 32-byte aligned
#    offset 32   N ids    <|endoftext|> doc <|endoftext|> doc ...   (memory-mapped by the loader)
# ---------------------------------------------------------------------------------------------------------------------

SHARD_MAGIC = b"LLMTOKS\x00"
SHARD_VERSION = 1
SHARD_HEADER = struct.Struct("<8sIIQ8x")      # magic, version, bytes per token (2 or 4), token count, padding
SHARD_DTYPES = {2: np.dtype("<u2"), 4: np.dtype("<u4")}


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    """uint16 holds ids below 65,536 (GPT-2's 50,257 fits); bigger vocabularies (cl100k) need uint32."""
    if vocab_size <= 2 ** 16:
        return SHARD_DTYPES[2]
    if vocab_size <= 2 ** 32:
        return SHARD_DTYPES[4]
    raise DataError(f"vocabulary of {vocab_size:,} does not fit uint32 token ids")


def _atomic_write(path: pathlib.Path, write: Callable[[io.BufferedWriter], None]) -> None:
    """Write through a temporary file in the same directory, then rename: readers never see half a file."""
    path = pathlib.Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_shard(path: pathlib.Path, tokens: np.ndarray, dtype: np.dtype | str = "uint16") -> None:
    """Write token ids as a shard; ids that do not fit the dtype are refused (nothing is written)."""
    dtype = np.dtype(dtype).newbyteorder("<")
    if dtype.itemsize not in SHARD_DTYPES or dtype.kind != "u":
        raise DataError(f"shard dtype must be uint16 or uint32, got {dtype}")
    tokens = np.asarray(tokens)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= 2 ** (8 * dtype.itemsize)):
        raise DataError(f"token id {int(tokens.max())} does not fit {dtype.name}: the vocabulary is too large for "
                        f"this dtype; use uint32")
    header = SHARD_HEADER.pack(SHARD_MAGIC, SHARD_VERSION, dtype.itemsize, tokens.size)
    _atomic_write(path, lambda f: (f.write(header), f.write(tokens.astype(dtype).tobytes())))


def read_shard(path: pathlib.Path) -> np.ndarray:
    """Memory-map a shard's tokens (read-only), after checking its header against the file size."""
    path = pathlib.Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(SHARD_HEADER.size)
    except OSError as e:
        raise DataError(f"cannot read shard {path}: {e.strerror}") from None
    if len(head) < SHARD_HEADER.size:
        raise DataError(f"{path}: damaged shard (shorter than its {SHARD_HEADER.size}-byte header); re-run prepare")
    magic, version, itemsize, count = SHARD_HEADER.unpack(head)
    if magic != SHARD_MAGIC:
        raise DataError(f"{path}: not a token shard (bad magic {magic!r}); re-run prepare")
    if version != SHARD_VERSION:
        raise DataError(f"{path}: shard format version {version}, this data.py reads {SHARD_VERSION}; re-run prepare")
    if itemsize not in SHARD_DTYPES:
        raise DataError(f"{path}: damaged shard header (token size {itemsize}); re-run prepare")
    if SHARD_HEADER.size + count * itemsize != size:
        raise DataError(f"{path}: damaged shard (header says {count:,} tokens, file holds "
                        f"{(size - SHARD_HEADER.size) / itemsize:,.1f}); re-run prepare")
    if count == 0:
        return np.zeros(0, dtype=SHARD_DTYPES[itemsize])
    return np.memmap(path, dtype=SHARD_DTYPES[itemsize], mode="r", offset=SHARD_HEADER.size, shape=(count,))


class ShardWriter:
    """Accumulates documents' tokens and writes shards of at most shard_tokens tokens (documents may straddle)."""

    def __init__(self, directory: pathlib.Path, prefix: str, dtype: np.dtype, shard_tokens: int) -> None:
        self.directory, self.prefix, self.dtype, self.shard_tokens = directory, prefix, dtype, shard_tokens
        self.buffer: list[np.ndarray] = []
        self.buffered = 0
        self.shards: list[dict] = []

    def add(self, tokens: np.ndarray) -> None:
        self.buffer.append(tokens)
        self.buffered += len(tokens)
        while self.buffered >= self.shard_tokens:
            self._flush(self.shard_tokens)

    def _flush(self, n: int) -> None:
        stream = np.concatenate(self.buffer)
        name = f"{self.prefix}_{len(self.shards):05d}.bin"
        write_shard(self.directory / name, stream[:n], self.dtype)
        self.shards.append({"file": name, "tokens": int(n)})
        rest = stream[n:]
        self.buffer, self.buffered = ([rest] if len(rest) else []), len(rest)

    def close(self) -> list[dict]:
        if self.buffered:
            self._flush(self.buffered)
        return self.shards


# ---------------------------------------------------------------------------------------------------------------------
# 9. prepare: sources -> clean -> split -> tokenizer -> encode (parallel) -> mix -> shards + manifest, cached
# ---------------------------------------------------------------------------------------------------------------------

class _Clock:
    """Wall and CPU seconds per phase. The CPU clock counts every thread of this process and its finished worker
    processes: on a shared machine the wall clock also measures the neighbours, the CPU clock only us."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}
        self.start = (time.perf_counter(), self.cpu())

    @staticmethod
    def cpu() -> float:
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        wall, cpu = time.perf_counter(), self.cpu()
        yield
        self.timings[f"{name}_s"] = round(time.perf_counter() - wall, 3)
        self.timings[f"{name}_cpu_s"] = round(self.cpu() - cpu, 3)

    def finish(self) -> None:
        self.timings["total_s"] = round(time.perf_counter() - self.start[0], 3)
        self.timings["total_cpu_s"] = round(self.cpu() - self.start[1], 3)


def cache_root() -> pathlib.Path:
    return pathlib.Path(os.environ.get("PRETRAIN_CACHE", REPO_ROOT / ".cache")).expanduser()


def _code_version() -> str:
    """Hash of the code that shapes the output, so an edit to the pipeline or the tokenizer invalidates caches."""
    h = hashlib.sha256()
    for module_file in (__file__, bpe.__file__, dedup.__file__):
        h.update(pathlib.Path(module_file).read_bytes())
    return h.hexdigest()[:16]


def encode_documents(tokenizer: bpe.Tokenizer, docs: list[str], threads: int | None = None) -> list[np.ndarray]:
    """Token ids of each document through the tokenizer's tiktoken twin, whose Rust core encodes a batch on
    several threads at once (the GIL is released), in batches to bound memory."""
    encoding = tokenizer.to_tiktoken()
    if threads is not None and threads < 1:
        raise DataError(f"--threads must be at least 1, got {threads}; leave it out to use all cores")
    threads = threads or os.cpu_count() or 1
    dtype = dtype_for_vocab(len(tokenizer))
    out = []
    for start in range(0, len(docs), 4096):
        batch = encoding.encode_ordinary_batch(docs[start:start + 4096], num_threads=threads)
        out += [np.asarray(ids, dtype=dtype) for ids in batch]
    return out


def _tokenizer_sample(docs: list[str], max_bytes: int, seed: int) -> str:
    """Train documents in a seeded order, up to max_bytes, joined by <|endoftext|> (which BPE never merges across)."""
    picked, size = [], 0
    for i in np.random.default_rng(seed).permutation(len(docs)).tolist():
        if size >= max_bytes:
            break
        picked.append(docs[i])
        size += len(docs[i].encode("utf-8"))
    return EOT.join(picked)


def prepare(sources: list[str], out_dir: str | os.PathLike | None = None, vocab_size: int = DEFAULT_VOCAB_SIZE,
            seed: int = 0, val_fraction: float = 0.05, weights: list[float] | None = None,
            train_tokens: float | None = None, tokenizer: str | os.PathLike | None = None,
            tokenizer_train_bytes: int = 4_000_000, pattern: str = "gpt4", shard_tokens: int = 100_000_000,
            clean_settings: CleanSettings | None = None, text_field: str = "text", txt_split: str = "auto",
            skip_bad_lines: bool = False, max_documents: int | None = None, kind: str | None = None,
            threads: int | None = None, verbose: bool = False) -> pathlib.Path:
    """Build (or reuse) a token dataset directory: manifest.json, tokenizer.json, train_*.bin, val_*.bin.

    sources: names ("pydocs", "pystdlib", "hf:..."), files or directories. weights (one per source) with
    train_tokens mix the train split by token share (None: the smallest budget that reads every source once).
    tokenizer: a bpe.py JSON file to reuse instead of training one on (up to tokenizer_train_bytes of) train text.
    The directory is out_dir or a cache directory named by a hash of the inputs and every setting; when it
    already holds a finished dataset with that hash, it is returned at once. The cleaned corpus is held in
    memory (near-dedup compares all documents), which suits corpora up to a few GB of text.
    """
    log = print if verbose else (lambda *a, **k: None)
    if not sources:
        raise DataError("no sources given: pass --data pydocs (or a path)")
    if len(set(sources)) != len(sources):
        raise DataError(f"a source is listed twice in {sources}; give each once (use --weights to up-weight)")
    if weights is not None and len(weights) != len(sources):
        raise DataError(f"{len(weights)} weights for {len(sources)} sources: give one weight per source")
    if tokenizer is None and vocab_size < 257:
        raise DataError(f"--vocab-size {vocab_size} is too small: 256 byte tokens + <|endoftext|> need at least 257")
    if not 0 <= val_fraction < 1:
        raise DataError(f"--val-fraction must be in [0, 1), got {val_fraction}")
    if train_tokens is not None and (weights is None or not train_tokens > 0):
        raise DataError(f"--train-tokens {train_tokens:g} needs --weights and a positive budget, e.g. --weights 1 "
                        f"--train-tokens 5e6")
    settings = clean_settings or CleanSettings()
    jsonl_stats = JsonlStats()
    opened = [open_source(s, text_field, txt_split, skip_bad_lines, max_documents, jsonl_stats, kind)
              for s in sources]
    tokenizer_path = pathlib.Path(tokenizer) if tokenizer else None
    if tokenizer_path is not None and not tokenizer_path.is_file():
        raise DataError(f"tokenizer file {tokenizer_path} not found: pass a bpe.py tokenizer JSON")
    key_inputs = {
        "code": _code_version(),
        "sources": [(s.spec, s.kind, s.fingerprint) for s in opened],
        "settings": dataclasses.asdict(settings),
        "vocab_size": vocab_size, "seed": seed, "val_fraction": val_fraction, "weights": weights,
        "train_tokens": train_tokens, "pattern": pattern, "tokenizer_train_bytes": tokenizer_train_bytes,
        "tokenizer": hashlib.sha256(tokenizer_path.read_bytes()).hexdigest() if tokenizer_path else None,
        "shard_tokens": shard_tokens, "text_field": text_field, "txt_split": txt_split,
        "skip_bad_lines": skip_bad_lines, "max_documents": max_documents,
    }
    key = hashlib.sha256(json.dumps(key_inputs, sort_keys=True, default=str).encode()).hexdigest()
    if out_dir is None:
        slug = "+".join(re.sub(r"[^A-Za-z0-9._-]+", "_", pathlib.Path(s).name or s)[:40] for s in sources)[:80]
        out_dir = cache_root() / "data" / f"{slug}-v{vocab_size}-{key[:12]}"
    out_dir = pathlib.Path(out_dir)
    existing = _read_manifest_or_none(out_dir)
    if existing is not None:
        if existing.get("cache_key") == key:
            log(f"reusing {out_dir} (same inputs and settings)")
            return out_dir
        raise DataError(f"{out_dir} already holds a different dataset; remove it or pick another --out")
    if out_dir.exists() and not out_dir.is_dir():
        raise DataError(f"--out {out_dir} is a file; give a directory path")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise DataError(f"{out_dir} exists and is not a dataset directory; remove it or pick another --out")
    _check_writable(out_dir.parent)                        # fail now, not after minutes of cleaning

    clock = _Clock()
    with clock.phase("clean"):
        docs, origin, funnel = clean(opened, settings, log)
    if jsonl_stats.skipped:
        funnel.steps[0].reasons["malformed_jsonl_lines_skipped"] = jsonl_stats.skipped
    train_idx, val_idx = split_indices(len(docs), val_fraction, seed)
    train_docs, val_docs = [docs[i] for i in train_idx], [docs[i] for i in val_idx]
    train_origin = [origin[i] for i in train_idx]
    funnel.steps.append(Step("train/val split", len(docs), len(train_docs), sum(map(len, docs)),
                             sum(map(len, train_docs)), {"val": len(val_docs)}))

    with clock.phase("tokenizer"):
        if tokenizer_path is not None:
            tok = bpe.Tokenizer.load(tokenizer_path)
            trained_on = 0
        else:
            sample = _tokenizer_sample(train_docs, tokenizer_train_bytes, seed)
            trained_on = len(sample.encode("utf-8"))
            log(f"training a {vocab_size:,}-token BPE tokenizer on {trained_on / 1e6:.2f} MB of train text ...")
            tok = bpe.train_bpe(sample, vocab_size, special_tokens=(EOT,), pattern=pattern)
    if tok.eot_id is None:
        raise DataError(f"the tokenizer has no {EOT} special token; train it with special_tokens=({EOT!r},)")

    with clock.phase("encode"):
        train_ids = encode_documents(tok, train_docs, threads)
        val_ids = encode_documents(tok, val_docs, threads)
    encoded_bytes = sum(len(d.encode("utf-8")) for d in train_docs + val_docs)

    names = [src.spec for src in opened]
    lengths = [len(ids) + 1 for ids in train_ids]                   # + 1: the <|endoftext|> before each document
    order, mixture, unique = mix_documents(train_origin, lengths, names, weights, train_tokens, seed)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = pathlib.Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.tmp-"))
    try:
        dtype = dtype_for_vocab(len(tok))
        eot = np.array([tok.eot_id], dtype=dtype)
        splits = {}
        for split, ids_list, picks, texts in (("train", train_ids, order, train_docs),
                                              ("val", val_ids, range(len(val_ids)), val_docs)):
            writer = ShardWriter(tmp_dir, split, dtype, shard_tokens)
            n_bytes = 0
            for i in picks:
                writer.add(eot)
                writer.add(ids_list[i])
                n_bytes += len(texts[i].encode("utf-8"))
            shards = writer.close()
            splits[split] = {"documents": len(picks), "unique_documents": len(texts),
                             "tokens": sum(s["tokens"] for s in shards), "bytes": n_bytes, "shards": shards}
        (tmp_dir / "tokenizer.json").write_text(tok.to_json(), encoding="utf-8")
        clock.finish()
        manifest = {
            "format": "llm-token-shards", "version": SHARD_VERSION, "cache_key": key,
            "sources": [{"spec": s.spec, "kind": s.kind, "train_unique_tokens": unique[s.spec]} for s in opened],
            "settings": {**dataclasses.asdict(settings), "val_fraction": val_fraction, "seed": seed,
                         "weights": weights, "train_tokens": train_tokens, "text_field": text_field,
                         "txt_split": txt_split, "max_documents": max_documents},
            "funnel": funnel.to_list(),
            "tokenizer": {"file": "tokenizer.json", "vocab_size": len(tok), "eot_id": tok.eot_id,
                          "pattern": pattern if tokenizer_path is None else "from file",
                          "trained_on_bytes": trained_on, "source": str(tokenizer_path) if tokenizer_path else None},
            "dtype": dtype.name, "mixture": mixture, "splits": splits,
            "timings": {**clock.timings, "encoded_bytes": encoded_bytes, "input_bytes": funnel.bytes_read},
        }
        (tmp_dir / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
        _publish(tmp_dir, out_dir)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    return out_dir


def _check_writable(folder: pathlib.Path) -> None:
    """Raise DataError unless a file can be created in `folder` (made if missing)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        raise DataError(f"cannot write in {folder} ({e.strerror}); pick a writable --out") from None


def _publish(tmp_dir: pathlib.Path, out_dir: pathlib.Path) -> None:
    """Rename the finished temporary directory into place. If another process (another rank) finished the same
    dataset first, keep theirs: the shards and tokenizer are identical by construction."""
    if out_dir.exists() and not any(out_dir.iterdir()):
        out_dir.rmdir()
    try:
        os.rename(tmp_dir, out_dir)
    except OSError:
        if _read_manifest_or_none(out_dir) is None:
            raise
        shutil.rmtree(tmp_dir, ignore_errors=True)


def _read_manifest_or_none(data_dir: pathlib.Path) -> dict | None:
    try:
        return json.loads((pathlib.Path(data_dir) / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def summary(data_dir: str | os.PathLike) -> str:
    """A few lines on a prepared dataset: tokens and documents per split, bytes per token, throughput."""
    m = load_manifest(data_dir)
    lines = [f"dataset {data_dir}", f"tokenizer: {m['tokenizer']['vocab_size']:,} tokens, dtype {m['dtype']}"]
    for split, s in m["splits"].items():
        lines.append(f"{split:>5}: {s['documents']:,} documents, {s['tokens']:,} tokens, {s['bytes'] / 1e6:,.2f} MB, "
                     f"{s['bytes'] / max(1, s['tokens']):.2f} bytes/token, {len(s['shards'])} shard(s)")
    for name, p in (m["mixture"] or {}).items():
        lines.append(f"  mix {name}: weight {p['weight']:.2f}, {p['tokens']:,.0f} tokens, {p['epochs']:.2f} epochs")
    tm = m["timings"]
    phases = ", ".join(f"{p} {tm[p + '_s']:.1f}/{tm[p + '_cpu_s']:.1f}s" for p in ("clean", "tokenizer", "encode"))
    mb_in, mb_encoded = tm["input_bytes"] / 1e6, tm["encoded_bytes"] / 1e6
    lines.append(f"time (wall/CPU): {phases}, total {tm['total_s']:.1f}/{tm['total_cpu_s']:.1f}s")
    lines.append(f"throughput: {mb_in:.2f} MB read -> {mb_in / tm['total_s']:.2f} MB/s end to end "
                 f"({mb_in / max(tm['total_cpu_s'], 1e-9):.2f} MB per CPU-second); encoding {mb_encoded:.2f} MB at "
                 f"{mb_encoded / max(tm['encode_s'], 1e-9):.1f} MB/s ({mb_encoded / max(tm['encode_cpu_s'], 1e-9):.1f}"
                 f" MB per CPU-second)")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------------
# 10. The loader: memory-mapped shards, random windows, and a resumable, rank-sharded sequential iterator
# ---------------------------------------------------------------------------------------------------------------------

def load_manifest(data_dir: str | os.PathLike) -> dict:
    manifest = _read_manifest_or_none(pathlib.Path(data_dir))
    if manifest is None:
        raise DataError(f"{data_dir} has no readable manifest.json: run `python data.py prepare` first")
    return manifest


def _check_batch_shape(batch_size: int, block_size: int) -> None:
    if not all(isinstance(n, (int, np.integer)) and n > 0 for n in (batch_size, block_size)):
        raise DataError(f"batch_size and block_size must be positive integers, got {batch_size!r}, {block_size!r}")


class TokenData:
    """A prepared dataset directory.

    >>> data = TokenData(prepare(["pydocs"]))                          # doctest: +SKIP
    >>> x, y = data.get_batch("train", batch_size=4, block_size=64)   # doctest: +SKIP
    >>> x.shape, bool((x[:, 1:] == y[:, :-1]).all())                  # doctest: +SKIP
    (torch.Size([4, 64]), True)
    """

    def __init__(self, data_dir: str | os.PathLike) -> None:
        self.data_dir = pathlib.Path(data_dir)
        self.manifest = load_manifest(self.data_dir)
        self._tokenizer = None
        self.shards: dict[str, list[np.ndarray]] = {}
        try:
            self.vocab_size: int = self.manifest["tokenizer"]["vocab_size"]
            self.eot_id: int | None = self.manifest["tokenizer"]["eot_id"]
            for split, info in self.manifest["splits"].items():
                arrays = [read_shard(self.data_dir / s["file"]) for s in info["shards"]]
                for a, s in zip(arrays, info["shards"]):
                    if len(a) != s["tokens"]:
                        raise DataError(f"{self.data_dir / s['file']}: {len(a):,} tokens, manifest says "
                                        f"{s['tokens']:,}; re-run prepare")
                self.shards[split] = arrays
        except (KeyError, TypeError) as e:
            raise DataError(f"{self.data_dir / 'manifest.json'}: damaged manifest (missing {e}); re-run prepare") \
                from None

    @property
    def tokenizer(self) -> bpe.Tokenizer:
        if self._tokenizer is None:
            self._tokenizer = bpe.Tokenizer.from_json(
                (self.data_dir / self.manifest["tokenizer"]["file"]).read_text(encoding="utf-8"))
        return self._tokenizer

    def _split(self, split: str) -> list[np.ndarray]:
        if split not in self.shards:
            raise DataError(f"no split {split!r} in {self.data_dir} (has {', '.join(self.shards)})")
        return self.shards[split]

    def get_batch(self, split: str, batch_size: int, block_size: int,
                  generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Random windows: x (B, T) and y (B, T) = x shifted by one token, int64 on CPU. A window never straddles
        two shards; every start position in the split is equally likely."""
        _check_batch_shape(batch_size, block_size)
        shards = self._split(split)
        starts = np.array([max(0, len(a) - block_size) for a in shards])   # valid start positions per shard
        total = int(starts.sum())
        if total == 0:
            raise DataError(f"split {split!r} has no shard with more than block_size={block_size} tokens; "
                            f"use a smaller --block-size or more data")
        picks = torch.randint(total, (batch_size,), generator=generator).numpy()
        bounds = np.cumsum(starts)
        shard_of = np.searchsorted(bounds, picks, side="right")
        offsets = picks - (bounds - starts)[shard_of]
        windows = np.stack([shards[s][o:o + block_size + 1] for s, o in zip(shard_of, offsets)]).astype(np.int64)
        xy = torch.from_numpy(windows)                                     # (B, T+1)
        return xy[:, :-1], xy[:, 1:]

    def iterator(self, split: str, batch_size: int, block_size: int, rank: int = 0, world_size: int = 1,
                 seed: int = 0, shuffle: bool = True) -> "BatchIterator":
        return BatchIterator(self._split(split), batch_size, block_size, rank, world_size, seed, shuffle, split)


class BatchIterator:
    """Sequential, resumable, rank-sharded batches.

    The split is cut into non-overlapping windows of T+1 tokens (stride T, so every token is a target once per
    epoch). Each epoch walks a permutation of the windows seeded by (seed, epoch) (or file order when not
    shuffle). A step consumes batch_size x world_size windows; rank r takes the r-th slice of batch_size. The
    state is the epoch and the number of windows consumed in it: save it with state_dict(), restore it with
    load_state_dict(), and the next batch is the one that would have come (also after changing world_size).
    """

    def __init__(self, shards: list[np.ndarray], batch_size: int, block_size: int, rank: int = 0,
                 world_size: int = 1, seed: int = 0, shuffle: bool = True, split: str = "train") -> None:
        _check_batch_shape(batch_size, block_size)
        if not 0 <= rank < world_size:
            raise DataError(f"rank {rank} outside world size {world_size}")
        self.shards, self.batch_size, self.block_size = shards, batch_size, block_size
        self.rank, self.world_size, self.seed, self.shuffle = rank, world_size, seed, shuffle
        self.windows_per_shard = np.array([max(0, (len(a) - 1) // block_size) for a in shards])
        self.first_window = np.concatenate([[0], np.cumsum(self.windows_per_shard)])
        self.num_windows = int(self.first_window[-1])
        if self.num_windows < batch_size * world_size:
            raise DataError(f"split {split!r} has {self.num_windows:,} windows of {block_size + 1} tokens, fewer "
                            f"than batch_size x world_size = {batch_size * world_size}; use smaller batches or "
                            f"blocks, or more data")
        self.epoch, self.position = 0, 0
        self._order_epoch, self._order = None, None

    def _epoch_order(self) -> np.ndarray:
        if self._order_epoch != self.epoch:
            self._order = (np.random.default_rng([self.seed, self.epoch]).permutation(self.num_windows)
                           if self.shuffle else np.arange(self.num_windows))
            self._order_epoch = self.epoch
        return self._order

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        step = self.batch_size * self.world_size
        if self.position + step > self.num_windows:       # drop the ragged tail so every rank stays in step
            self.epoch, self.position = self.epoch + 1, 0
        start = self.position + self.rank * self.batch_size
        windows = self._epoch_order()[start:start + self.batch_size]
        self.position += step
        shard_of = np.searchsorted(self.first_window, windows, side="right") - 1
        offsets = (windows - self.first_window[shard_of]) * self.block_size
        xy = torch.from_numpy(np.stack([self.shards[s][o:o + self.block_size + 1]
                                        for s, o in zip(shard_of, offsets)]).astype(np.int64))   # (B, T+1)
        return xy[:, :-1], xy[:, 1:]

    __next__ = next

    def __iter__(self) -> "BatchIterator":
        return self

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed,
                "block_size": self.block_size, "num_windows": self.num_windows, "shuffle": int(self.shuffle)}

    def load_state_dict(self, state: dict) -> None:
        for k in ("seed", "block_size", "num_windows", "shuffle"):
            if state[k] != int(getattr(self, k)):
                raise DataError(f"loader state was saved with {k}={state[k]}, this iterator has "
                                f"{getattr(self, k)}: resume with the same data and --block-size/--seed")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


def bytes_per_token(data: str | os.PathLike | TokenData, split: str = "val") -> float:
    """UTF-8 bytes of text per token in a split (tokens include one <|endoftext|> per document), so that
    bits-per-byte = loss_nats / ln 2 / bytes_per_token."""
    manifest = data.manifest if isinstance(data, TokenData) else load_manifest(data)
    s = manifest["splits"].get(split)
    if not s or not s["tokens"]:
        raise DataError(f"the {split!r} split is empty: prepare the data with --val-fraction > 0")
    return s["bytes"] / s["tokens"]


# ---------------------------------------------------------------------------------------------------------------------
# 11. Command line
# ---------------------------------------------------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument in one line (exit code 2), without the usage block."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _in_range(kind=int, low=None, high=None, low_open=False, high_open=False):
    """argparse type: a finite int or float within the bounds (open ends with low_open/high_open).

    >>> _in_range(float, 0.0, 1.0, low_open=True)("0.5")
    0.5
    >>> _in_range(int, 0)("-1")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: must be an integer >= 0, got '-1'
    """
    def show(x):
        return f"{x:g}" if isinstance(x, float) else str(x)
    bounds = [f"{'>' if low_open else '>='} {show(low)}" if low is not None else "",
              f"{'<' if high_open else '<='} {show(high)}" if high is not None else ""]
    rule = ("an integer " if kind is int else "a number ") + " and ".join(filter(None, bounds))

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if (value is None or not math.isfinite(value)
                or low is not None and (value < low or low_open and value == low)
                or high is not None and (value > high or high_open and value == high)):
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text!r}")
        return value
    return parse


def _writable(kind="file"):
    """argparse type: a path where a `kind` ("file" or "dir") can be written. Checks only, creates nothing, so a
    bad output path fails before any work."""
    def parse(text: str) -> str:
        path = pathlib.Path(text)
        if path.is_dir() if kind == "file" else path.exists() and not path.is_dir():
            raise argparse.ArgumentTypeError(f"{text} is a {'directory' if kind == 'file' else 'file'}: "
                                             f"give a {'file' if kind == 'file' else 'directory'} path")
        here = path.absolute()
        parent = next(p for p in ((here, *here.parents) if kind == "dir" else here.parents) if p.exists())
        if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            raise argparse.ArgumentTypeError(f"cannot write {text}: {parent} is "
                                             f"{'a file' if not parent.is_dir() else 'read-only'}")
        return text
    return parse


SEED_MAX = 2**32 - 1             # numpy's legacy generator and torch agree on seeds in [0, 2^32)
TOKENS_MAX = 1e16                # a token budget beyond any run (the largest public ones are ~4e13)


def _parse_assignments(items: list[str], flag: str) -> dict[str, float]:
    """['web=0.7', 'code=0.3'] -> {'web': 0.7, 'code': 0.3}; each number finite, > 0 and at most TOKENS_MAX."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            number = float(value)
        except ValueError:
            sep = ""
        if not sep or not name:
            raise DataError(f"{flag} {item!r} must look like name=number, e.g. math=0.05")
        if name in out:
            raise DataError(f"{flag} names {name!r} twice; give each source once")
        if not (math.isfinite(number) and 0 < number <= TOKENS_MAX):
            raise DataError(f"{flag} {item!r}: the number must be > 0 and <= {TOKENS_MAX:g}")
        out[name] = number
    return out


def _cmd_prepare(args: argparse.Namespace) -> None:
    settings = CleanSettings(filters=args.filters, near_dup_threshold=args.near_dup_threshold,
                             mask_pii=not args.no_pii, boilerplate_min_documents=args.boilerplate_min_documents)
    out = prepare(args.data, args.out, vocab_size=args.vocab_size, seed=args.seed, val_fraction=args.val_fraction,
                  weights=args.weights, train_tokens=args.train_tokens, tokenizer=args.tokenizer,
                  tokenizer_train_bytes=int(args.tokenizer_train_mb * 1e6), clean_settings=settings,
                  text_field=args.text_field, txt_split=args.txt_split, skip_bad_lines=args.skip_bad_lines,
                  max_documents=args.max_documents, kind=args.kind, threads=args.threads, verbose=True)
    print(Funnel.from_manifest(load_manifest(out)).format())
    print(summary(out))


def _cmd_mix(args: argparse.Namespace) -> None:
    weights = _parse_assignments(args.weights, "--weights")
    unique = _parse_assignments(args.unique, "--unique")
    unknown = set(unique) - set(weights)
    if unknown:
        raise DataError(f"--unique names {sorted(unknown)} have no --weights entry")
    plan = mixture_plan(weights, args.tokens, unique)
    print(f"{'source':<10}{'weight':>8}{'tokens':>14}{'unique':>14}{'epochs':>8}")
    for name, p in plan.items():
        unique_s = f"{p['unique_tokens']:.3g}" if p["unique_tokens"] else "-"
        epochs_s = f"{p['epochs']:.2f}" if p["epochs"] is not None else "-"
        print(f"{name:<10}{p['weight']:>8.2f}{p['tokens']:>14.3g}{unique_s:>14}{epochs_s:>8}")


def _cmd_inspect(args: argparse.Namespace) -> None:
    data = TokenData(args.dir)
    print(Funnel.from_manifest(data.manifest).format())
    print(summary(args.dir))
    x, _ = data.get_batch("val", 1, min(args.tokens, len(data.shards["val"][0]) - 1), torch.Generator().manual_seed(0))
    print("a random val window, decoded:\n" + data.tokenizer.decode(x[0].tolist()))


def _cmd_html(args: argparse.Namespace) -> None:
    path = pathlib.Path(args.file)
    if not path.is_file():
        raise DataError(f"{path} not found")
    print(html_to_text(_read_text(path)))


def main(argv: list[str] | None = None) -> None:
    parser = _Parser(prog="data.py", description=__doc__.split("\n\n")[0],
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("prepare", help="clean, dedup, split, train/reuse the tokenizer, encode and pack shards")
    p.add_argument("--data", nargs="+", default=["pydocs"],
                   help="sources: pydocs, pystdlib, hf:NAME, or files/dirs (.txt .jsonl .parquet .raw .html .py, .gz)")
    p.add_argument("--vocab-size", type=_in_range(int, 257, 2**32), default=DEFAULT_VOCAB_SIZE,
                   help="BPE vocabulary (default %(default)s)")
    p.add_argument("--out", type=_writable("dir"), default=None,
                   help="output directory (default: a cache dir in $PRETRAIN_CACHE or .cache/)")
    p.add_argument("--seed", type=_in_range(int, 0, SEED_MAX), default=0,
                   help="seeds the split, the tokenizer sample, mixing and order")
    p.add_argument("--val-fraction", type=_in_range(float, 0.0, 1.0, high_open=True), default=0.05,
                   help="documents held out for validation")
    p.add_argument("--weights", type=_in_range(float, 0.0, TOKENS_MAX, low_open=True), nargs="+", default=None,
                   help="mixing weight per source, in order")
    p.add_argument("--train-tokens", type=_in_range(float, 1.0, TOKENS_MAX), default=None,
                   help="train token budget for the mix (e.g. 5e6)")
    p.add_argument("--tokenizer", default=None, help="reuse this bpe.py tokenizer JSON instead of training one")
    p.add_argument("--tokenizer-train-mb", type=_in_range(float, 0.0, 1e6, low_open=True), default=4.0,
                   help="MB of train text the tokenizer trains on (default %(default)s)")
    p.add_argument("--filters", choices=["auto", "gopher", "code", "none"], default="auto",
                   help="quality rules: auto = Gopher for prose, code rules for code")
    p.add_argument("--near-dup-threshold", type=_in_range(float, 0.0, 1.0, high_open=True), default=0.5,
                   help="Jaccard threshold; 0 turns near-dedup off")
    p.add_argument("--boilerplate-min-documents", type=_in_range(int, 2), default=3,
                   help="a prose line found in this many documents is boilerplate and removed")
    p.add_argument("--no-pii", action="store_true", help="do not mask emails, phones and IPs")
    p.add_argument("--text-field", default="text", help="the .jsonl/.parquet field holding the text")
    p.add_argument("--txt-split", choices=["auto", "eot", "blank", "file"], default="auto",
                   help="how .txt files split into documents (auto: <|endoftext|> if present, else blank lines)")
    p.add_argument("--skip-bad-lines", action="store_true", help="skip and count malformed .jsonl lines")
    p.add_argument("--max-documents", type=_in_range(int, 1), default=None,
                   help="read at most this many documents per source")
    p.add_argument("--kind", choices=["prose", "code", "html"], default=None,
                   help="treat every source as this kind (default: by name and file type; .py files are code)")
    p.add_argument("--threads", type=_in_range(int, 1, 1024), default=None, help="encoding threads (default: all cores)")
    p.set_defaults(run=_cmd_prepare)

    p = sub.add_parser("mix", help="tokens and epochs per source for a budget (the lecture's 20e9 at 70/15/10/5)")
    p.add_argument("--tokens", type=_in_range(float, 1.0, TOKENS_MAX), default=20e9)
    p.add_argument("--weights", nargs="+", default=["web=0.70", "code=0.15", "books=0.10", "math=0.05"])
    p.add_argument("--unique", nargs="*", default=["math=0.5e9"], help="unique tokens on hand per source")
    p.set_defaults(run=_cmd_mix)

    p = sub.add_parser("inspect", help="print a prepared dataset's funnel, sizes and a decoded sample")
    p.add_argument("dir")
    p.add_argument("--tokens", type=_in_range(int, 1, 1_000_000), default=64)
    p.set_defaults(run=_cmd_inspect)

    p = sub.add_parser("html", help="print the text extracted from an HTML file")
    p.add_argument("file")
    p.set_defaults(run=_cmd_html)

    args = parser.parse_args(argv)
    try:
        args.run(args)
    except (DataError, bpe.TokenizerError, dedup.DedupError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
