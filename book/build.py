"""book/build.py: the chapters as an annotated book, prose beside code, built offline from the files themselves.

    python book/build.py --out book/site        # a few seconds; open book/site/index.html (or python -m http.server)

Every top-level .py file of the repository becomes one page; nothing is copied by hand, so the book cannot drift
from the code. A page is the file read top to bottom:

* the module docstring is the introduction;
* each section banner (a `# ----` line, `# N. Title`, a `# ----` line) becomes a heading with an anchor;
* the code follows in file order, cut into rows: a row starts at a block of full-line comments and at every
  function or class that carries a docstring (and at every top-level or class-level definition, so each has an
  anchor). The comments and docstrings of a row are its prose, rendered as Markdown (lists, tables, code spans,
  indented blocks for the worked numbers) in a column beside the code they describe; docstrings leave the code
  column, trailing `# why` comments stay in it;
* names that come from another chapter (`data_lib.open_source`, `from model import GPT`, `bpe.Tokenizer`, a code
  span `train.load_checkpoint` in prose) link to their definition on that chapter's page;
* the figures a chapter draws appear on its page, read from the files its own commands wrote (table FIGURES).

The formulas in the docstrings are plain text and Unicode (C ≈ 6·N·D, Σ c_i·B^i, √(J(1−J)/k)), most of them in
indented blocks, so they render verbatim in a monospace block: no math typesetting is needed, nothing to load.

Which files are chapters: the ten files at the root, in the order of the table CHAPTERS (the reading order README
and docs/ use too). The files of machinery/ (command lines, the run's wiring, engines, I/O, bridges) follow them as
an appendix, each marked with its kind and the "Serves:" line of its docstring where it has one.

Libraries: markdown-it-py and mdit-py-plugins (Markdown), Pygments (highlighting), imported when the build runs.
Figures that need long runs come from their committed outputs; `--refresh-figures NAME` reruns one's command.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import html
import io
import math
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import tokenize

ROOT = pathlib.Path(__file__).resolve().parent.parent
BOOK_DIR = pathlib.Path(__file__).resolve().parent
MARKER = ".book-site"  # written into every site we build: only such a folder is ever replaced
if (
    str(ROOT) not in sys.path
):  # fileio.py: the output-path checks every command of the repository shares
    sys.path.append(str(ROOT))


class BookError(Exception):
    """A bad input to the build: printed as one line, exit code 2."""


# ------------------------------------------------------------------------------------------------------------------
# 1. What the book contains: the chapters in reading order, the companion files, the figures
# ------------------------------------------------------------------------------------------------------------------
# (file stem, what it is in the pipeline). The order is the order of reading; the pipeline map on the index page is
# drawn from the same table, so a chapter added here appears in both.
CHAPTERS = [
    ("bpe", "text → tokens: byte-level BPE, trained and encoded by hand"),
    ("dedup", "near duplicates: shingles, MinHash, LSH"),
    ("classify", "the filter's classifiers: language and quality, fastText-style by hand"),
    ("data", "raw sources → clean, deduplicated, mixed text → packed token shards"),
    ("model", "the decoder-only Transformer the tokens feed"),
    ("train", "the loop: optimizer, schedule, precision, checkpoints"),
    ("parallel", "many copies of one model: DP, ZeRO-1/2/3"),
    ("model_parallel", "one model cut into pieces: TP, PP, EP, CP"),
    ("scaling", "plan N and D before the run, fit laws after it"),
    ("evaluate", "held-out loss, bits-per-byte, exact match, contamination"),
]

# Kinds of the machinery files the design names (by module name); any other is "machinery".
COMPANION_KINDS = {
    "machinery.data_at_scale": "engine (streaming and Ray)",
    "machinery.store": "engine (object-store I/O)",
    "machinery.formats": "I/O (the file formats of data.py's sources)",
    "machinery.dataset": "engine (prepare: plan, cache key, publish)",
    "machinery.cleaning": "engine (each source's own funnel steps, both engines)",
    "machinery.presets": "config (the named model sizes)",
    "machinery.hf": "bridge (Hugging Face)",
    "machinery.sweep": "experiment",
    "machinery.fileio": "I/O (untrusted JSON, atomic writes)",
    "machinery.cli": "command-line helpers",
}


@dataclasses.dataclass(frozen=True)
class Figure:
    """One figure a chapter makes: where its committed output lies, the command that produced it,
    and the rows whose text discusses it (the first anchor the page has wins; the figure is laid out
    right after that row)."""

    name: str  # for --refresh-figures
    chapter: str  # the page it appears on
    title: str
    output: str  # repository-relative: a .png (shown as an image) or a .txt (the command's printed output)
    command: str  # run from the repository root
    produces: str = (
        ""  # for a PNG another command writes elsewhere: copied to `output` by --refresh-figures
    )
    near: tuple[str, ...] = ()


FIGURES = [
    Figure(
        "funnel",
        "data",
        "The funnel on the embedded corpus: documents and characters through each step",
        "docs/figures/data-funnel.txt",
        "python data.py prepare --data pydocs --out out-book-data",
        near=("Funnel",),
    ),
    Figure(
        "s-curve",
        "dedup",
        "The LSH S-curve: P(candidate) = 1 − (1 − J^r)^b against Jaccard J, drawn",
        "docs/figures/dedup-s-curve.png",
        "python book/figures.py s-curve",
        near=("candidate_probability",),
    ),
    Figure(
        "lsh-demo",
        "dedup",
        "The same S-curve as numbers, and the lecture's demo",
        "docs/figures/dedup-demo.txt",
        "python dedup.py demo",
        near=("lsh_threshold", "candidate_probability"),
    ),
    Figure(
        "bpe-merges",
        "bpe",
        "Tokens per word as merges are learned: held-out English against Python code",
        "docs/figures/bpe-merges.png",
        "python book/figures.py bpe-merges",
        near=("train_bpe",),
    ),
    Figure(
        "languages",
        "classify",
        "One sentence in twelve languages, and its words alone, as the shipped language model reads them",
        "docs/figures/classify-languages.png",
        "python book/figures.py languages",
        near=("identify_language",),
    ),
    Figure(
        "model-cost",
        "model",
        "Parameters per preset, and the attention share of the training FLOPs per token",
        "docs/figures/model-cost.png",
        "python book/figures.py model-cost",
        near=("causal_attention", "GPTConfig"),
    ),
    Figure(
        "loss",
        "train",
        "Loss curve of the default run (tiny model, pydocs, 600 steps): training and held-out loss",
        "docs/figures/train-loss.png",
        "python train.py --out-dir out-book-train",
        produces="out-book-train/loss.png",
        near=("train_loop",),
    ),
    Figure(
        "zero-memory",
        "parallel",
        "Training state per rank of a 7e9-parameter model: DP against ZeRO-1, 2 and 3",
        "docs/figures/parallel-zero-memory.png",
        "python book/figures.py zero-memory",
        near=("zero_memory_per_rank",),
    ),
    Figure(
        "bubble",
        "model_parallel",
        "A 1F1B pipeline schedule on 4 stages and 16 micro-batches, and its bubble",
        "docs/figures/parallel-schedule.txt",
        "python parallel.py schedule --p 4 --m 16",
        near=("bubble_fraction", "one_f_one_b_schedule"),
    ),
    Figure(
        "scaling",
        "scaling",
        "Loss against compute, the IsoFLOP curves and N_opt of the committed sweep",
        "docs/sweep/scaling.png",
        "python scaling.py sweep",
        near=("fit_all", "isoflop_minima"),
    ),
    Figure(
        "emergence",
        "evaluate",
        "Exact match of k steps (p^k) against per-step accuracy p: a jump made by the metric",
        "docs/figures/evaluate-emergence.png",
        "python book/figures.py emergence",
        near=("emergence_table", "exact_match_from_per_step"),
    ),
]


def _require_libraries():
    """markdown-it-py, mdit-py-plugins and Pygments, or one line saying how to install them."""
    try:
        import markdown_it  # noqa: F401
        import mdit_py_plugins  # noqa: F401
        import pygments  # noqa: F401
    except ImportError as e:
        raise BookError(
            f"the book needs {e.name}: pip install markdown-it-py mdit-py-plugins pygments"
        ) from e


# ------------------------------------------------------------------------------------------------------------------
# 2. Reading one file: docstrings, banners, comments and definitions, by ast and tokenize (never by guessing)
# ------------------------------------------------------------------------------------------------------------------
_DASHES = re.compile(r"^# ?-{20,}\s*$")
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


@dataclasses.dataclass
class Definition:
    """A def or class: the line its row starts at (first decorator), its docstring, its anchor if it has one."""

    start: int
    qualname: str | None  # "GPT", "GPT.forward" (module and class level); None inside a function
    doc: str | None
    doc_lines: range  # the docstring's lines, removed from the code column


@dataclasses.dataclass
class Source:
    """A parsed top-level file: everything a page and the cross-links need."""

    stem: str
    path: pathlib.Path
    lines: list[str]
    docstring: str
    doc_lines: range
    banners: dict[
        int, tuple[int, str, str, int]
    ]  # first line -> (last line, title, more text, title's last line)
    comments: dict[int, str]  # full-line comment: line -> text after "#"
    definitions: dict[int, Definition]  # start line -> definition
    assigned: dict[int, list[str]]  # line -> names a top-level assignment binds there
    symbols: set[str]  # what other pages may link to: "GPT", "PRESETS", "GPT.forward"
    module_aliases: dict[str, str]  # "data_lib" -> "data" (import data as data_lib)
    imported_names: dict[str, tuple[str, str]]  # "GPT" -> ("model", "GPT") (from model import GPT)

    @property
    def filename(self) -> str:
        """The file's path from the repository root: "train.py", "machinery/fileio.py"."""
        return self.stem.replace(".", "/") + ".py"

    @property
    def top_level(self) -> list[str]:
        """Names of the top-level functions and classes, in file order."""
        return [
            d.qualname for d in self.definitions.values() if d.qualname and "." not in d.qualname
        ]


def _whole_lines(node: ast.AST, lines: list[str]) -> bool:
    """True when a docstring occupies its lines alone (nothing but indentation before it, at most a comment after)."""
    before = lines[node.lineno - 1][: node.col_offset]
    after = lines[node.end_lineno - 1][node.end_col_offset :]
    return not before.strip() and (not after.strip() or after.strip().startswith("#"))


def _docstring_node(node: ast.AST) -> ast.AST | None:
    body = getattr(node, "body", None)
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        return body[0]
    return None


def _definitions(tree: ast.Module, lines: list[str]) -> dict[int, Definition]:
    """Every def and class, with qualified names for those at module and class level (the ones given anchors)."""
    found: dict[int, Definition] = {}

    def visit(node: ast.AST, prefix: str | None, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, _DEFS):
                qualname = (
                    None if in_function else (f"{prefix}.{child.name}" if prefix else child.name)
                )
                doc_node = _docstring_node(child)
                doc, doc_lines = None, range(0)
                if doc_node is not None and _whole_lines(doc_node, lines):
                    doc, doc_lines = (
                        ast.get_docstring(child),
                        range(doc_node.lineno, doc_node.end_lineno + 1),
                    )
                start = min([child.lineno] + [d.lineno for d in child.decorator_list])
                found.setdefault(start, Definition(start, qualname, doc, doc_lines))
                visit(
                    child,
                    qualname if isinstance(child, ast.ClassDef) and qualname else None,
                    in_function or not isinstance(child, ast.ClassDef),
                )
            elif isinstance(child, (ast.If, ast.Try, ast.With)) and not in_function:
                visit(
                    child, prefix, in_function
                )  # `if HAVE_X: def f ...` at module level keeps its anchor

    visit(tree, None, False)
    return dict(sorted(found.items()))


def _assigned(tree: ast.Module) -> dict[int, list[str]]:
    """Top-level assignments: line -> bound names (PRESETS = {...}, PRIME = ...)."""
    bound: dict[int, list[str]] = {}
    for node in tree.body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, (ast.AnnAssign, ast.AugAssign))
            else []
        )
        for target in targets:
            for name in ast.walk(target):
                if isinstance(name, ast.Name):
                    bound.setdefault(node.lineno, []).append(name.id)
    return bound


def _imports(
    tree: ast.Module, modules: set[str]
) -> tuple[dict[str, str], dict[str, tuple[str, str]]]:
    """Imports of the book's other files, anywhere in the file (functions import lazily too):
    `import data as data_lib` and `from machinery import fileio` are aliases of a module,
    `from model import GPT` a name from one."""
    aliases: dict[str, str] = {}
    names: dict[str, tuple[str, str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    aliases[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                if submodule in modules:
                    aliases[alias.asname or alias.name] = submodule
                elif node.module in modules:
                    names[alias.asname or alias.name] = (node.module, alias.name)
    return aliases, names


def _banners(lines: list[str]) -> dict[int, tuple[int, str, str, int]]:
    """`# ----` / `# N. Title` (one or more lines) / `# ----`: first line -> (last line, title, the rest of the title
    lines, the title lines' last line), 1-based. The title is the first sentence; the sentences after it, and any
    lines under a bare `#` (data.py's shard format), are the prose of the section's first row."""
    found: dict[int, tuple[int, str, str, int]] = {}
    i = 0
    while i < len(lines):
        if _DASHES.match(lines[i]):
            j = i + 1
            while j < len(lines) and lines[j].startswith("#") and not _DASHES.match(lines[j]):
                j += 1
            if (
                j > i + 1
                and j < len(lines)
                and _DASHES.match(lines[j])
                and lines[i + 1].startswith("# ")
            ):
                title_end = i + 1
                while title_end + 1 < j and lines[title_end + 1].startswith("# "):
                    title_end += 1
                text = " ".join(line[2:].strip() for line in lines[i + 1 : title_end + 1])
                # The title is the first sentence (after the "N. "); further sentences are the section's prose.
                number = re.match(r"\d+\.\s+", text)
                start = number.end() if number else 0
                split = re.search(r"(?<=[.!?])\s+(?=[A-Z`\"(])", text[start:])
                title, rest = (
                    (text, "")
                    if split is None
                    else (text[: start + split.start()], text[start + split.end() :])
                )
                found[i + 1] = (j + 1, title, rest, title_end + 1)
                i = j
        i += 1
    return found


def _full_line_comments(source: str) -> dict[int, str]:
    """Comments alone on their line (tokenize knows a `#` inside a string is not one): line -> text after `#`."""
    comments = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT and not token.line[: token.start[1]].strip():
            text = token.string[1:]
            comments[token.start[0]] = text[1:] if text.startswith(" ") else text
    return comments


def module_name(path: pathlib.Path, root: pathlib.Path) -> str:
    """A file's module name from the root: train.py -> "train", machinery/fileio.py -> "machinery.fileio"
    (a file outside the root, shown alone, is its own name)."""
    if not path.is_relative_to(root):
        return path.stem
    return ".".join(path.relative_to(root).with_suffix("").parts)


def read_source(path: pathlib.Path, modules: set[str], root: pathlib.Path = ROOT) -> Source:
    source = path.read_text(encoding="utf-8")
    try:
        tree = ast.parse(source, filename=str(path))
    except SyntaxError as e:
        raise BookError(
            f"{path.name}: cannot parse line {e.lineno} ({e.msg}): fix the file, then build again"
        ) from e
    lines = source.splitlines()
    doc_node = _docstring_node(tree)
    docstring = ast.get_docstring(tree) or ""
    doc_lines = (
        range(doc_node.lineno, doc_node.end_lineno + 1) if doc_node is not None else range(0)
    )
    definitions = _definitions(tree, lines)
    assigned = _assigned(tree)
    symbols = {d.qualname for d in definitions.values() if d.qualname}
    symbols |= {name for names in assigned.values() for name in names}
    aliases, imported = _imports(tree, modules)
    return Source(
        module_name(path, root),
        path,
        lines,
        docstring,
        doc_lines,
        _banners(lines),
        _full_line_comments(source),
        definitions,
        assigned,
        symbols,
        aliases,
        imported,
    )


def first_line(source: Source) -> str:
    """What the file teaches: its docstring's first paragraph (a line may wrap), or its first sentence when the
    paragraph is longer than a table cell should be; without a leading "name.py:"."""
    paragraph = " ".join(source.docstring.split("\n\n", 1)[0].split())
    if len(paragraph) > 240:
        paragraph = re.split(r"(?<=[.!?])\s+(?=[A-Z`])", paragraph, maxsplit=1)[0]
    return re.sub(rf"^{re.escape(source.filename)}:\s*", "", paragraph)


def serves_line(source: Source) -> str:
    """The "Serves: ..." paragraph of a companion's docstring, else the first sentence that says
    what it serves (a sentence ends at a stop followed by a space, so "data.py" does not end one);
    without a leading "Serves"."""
    match = re.search(
        r"^Serves:\s*(.+?)(?:\n\s*\n|\n[A-Z][\w -]*:|\Z)", source.docstring, re.M | re.S
    )
    if match:  # up to the next labelled sentence ("... one). Owns: ..."), if the paragraph goes on
        return re.split(r"(?<=[.)])\s+(?=[A-Z][\w ]{0,20}:\s)", " ".join(match.group(1).split()))[0]
    match = re.search(r"\bserves\s+(.*?[.!?])(?=\s|\Z)", source.docstring, re.I | re.S)
    return " ".join(match.group(1).split()) if match else ""


# ------------------------------------------------------------------------------------------------------------------
# 3. Cutting a file into rows: (prose, code) pairs and headings, in file order
# ------------------------------------------------------------------------------------------------------------------
# The rule (labml's, adapted to this project's style): a block of full-line comments opens a row and is its prose;
# a def/class opens a row unless the current row has no code yet (then the comment above it describes it and the
# definition joins that row); its docstring is added to the row's prose. Blank lines at the edges of a row's code
# are dropped. Every line of the file is either the introduction, a banner, prose or code: nothing is lost.


@dataclasses.dataclass
class Row:
    anchor: str | None = None
    prose: list[tuple[str, str]] = dataclasses.field(
        default_factory=list
    )  # ("comment" | "doc", text)
    code: list[int] = dataclasses.field(default_factory=list)  # 1-based line numbers

    def has_code(self) -> bool:
        return bool(self.code)


@dataclasses.dataclass
class Heading:
    anchor: str
    title: str
    line: int = 0  # the banner's first line: a long file's page is cut at headings


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower())[:60].strip("-") or "section"


def cut_rows(src: Source) -> list[Row | Heading]:
    items: list[Row | Heading] = []
    row = Row()
    comment_run: list[str] = []  # consecutive full-line comments, joined into one prose part

    def end_comment_run() -> None:
        if comment_run:
            row.prose.append(("comment", "\n".join(comment_run)))
            comment_run.clear()

    def flush() -> None:
        nonlocal row
        end_comment_run()
        while row.code and not src.lines[row.code[-1] - 1].strip():
            row.code.pop()
        if row.code or row.prose:
            items.append(row)
        row = Row()

    skip = set(src.doc_lines)
    for definition in src.definitions.values():
        skip.update(definition.doc_lines)
    line_no = 1
    while line_no <= len(src.lines):
        if line_no in src.banners:
            flush()
            last, title, rest, title_end = src.banners[line_no]
            number = re.match(r"(\d+)\.", title)
            items.append(
                Heading(
                    f"s{number.group(1)}-{_slug(title[number.end() :])}"
                    if number
                    else f"s-{_slug(title)}",
                    title,
                    line_no,
                )
            )
            if rest:
                comment_run.extend([rest, ""])
            comment_run.extend(
                src.comments[n]
                for n in range(title_end + 1, last)
                if src.comments[n] or comment_run
            )
            line_no = last + 1
            continue
        if line_no in skip:
            line_no += 1
            continue
        text = src.lines[line_no - 1]
        if line_no in src.comments:
            if row.has_code():
                flush()
            if comment_run and line_no - 1 not in src.comments:
                comment_run.append("")  # a blank line between comments: a new paragraph
            comment_run.append(src.comments[line_no])
            line_no += 1
            continue
        definition = src.definitions.get(line_no)
        if definition is not None and (definition.qualname or definition.doc):
            if row.has_code():
                flush()
            end_comment_run()
            if definition.qualname and row.anchor is None:
                row.anchor = definition.qualname
            if definition.doc:
                row.prose.append(("doc", definition.doc))
        if text.strip() or row.has_code():
            end_comment_run()
            row.code.append(line_no)
        line_no += 1
    flush()
    return items


# ------------------------------------------------------------------------------------------------------------------
# 4. Prose: docstrings and comments as Markdown (markdown-it-py), code spans linked to their definitions
# ------------------------------------------------------------------------------------------------------------------
# The text is already Markdown in all but two habits, fixed line by line before parsing: doctest examples
# (`>>> ...` and their output) become fenced pycon blocks, and a comment's aligned columns (lines indented two or
# three spaces past the `#`, fewer than Markdown's four) become a plain monospace block so their columns survive.


def fence_doctests(text: str) -> str:
    out: list[str] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        stripped = lines[i].lstrip()
        if stripped.startswith(">>> "):
            indent = lines[i][: len(lines[i]) - len(stripped)]
            block = []
            while i < len(lines) and lines[i].strip():
                block.append(
                    lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i].strip()
                )
                i += 1
            out += [f"{indent}```pycon"] + [indent + line for line in block] + [f"{indent}```"]
            continue
        out.append(lines[i])
        i += 1
    return "\n".join(out)


def separate_indented_blocks(text: str) -> str:
    """Docstrings write `Run it:` and then the indented commands with no blank line between (reST's habit); in
    Markdown an indented block cannot interrupt a paragraph, so the commands would run into the sentence. A line
    indented four or more spaces past the text line above it opens a block: put the blank line there."""
    out: list[str] = []
    text_indent: int | None = None  # indentation of the last line of running text
    block_indent: int | None = None  # inside an indented block: its indentation
    in_fence = False
    for line in text.split("\n"):
        stripped = line.lstrip()
        indent = len(line) - len(stripped)
        if stripped.startswith("```"):
            in_fence = not in_fence
        if in_fence or stripped.startswith("```") or not stripped:
            out.append(line)
            continue
        if block_indent is not None and indent >= block_indent:
            out.append(line)
            continue
        block_indent = None
        if text_indent is not None and indent >= text_indent + 4:
            if out and out[-1].strip():
                out.append("")
            block_indent = indent
        else:
            text_indent = indent
        out.append(line)
    return "\n".join(out)


def fence_aligned_comment_lines(text: str) -> str:
    out: list[str] = []
    block: list[str] = []
    for line in text.split("\n") + [""]:
        if re.match(r"^ {2,}\S", line):
            block.append(line)
            continue
        if block:
            out += ["", "```text"] + block + ["```", ""]
            block = []
        out.append(line)
    return "\n".join(out[:-1])


class Linker:
    """Resolves a name seen on one page to a link: another page's anchor, this page's, or nothing. A
    file whose lesson needs more than one sitting is cut into parts (stem.html, stem-2.html, ...) at
    section headings; `current` is the page being written, so an anchor on it is "#name" and one on
    another part is "file#name"."""

    def __init__(self, sources: dict[str, Source]):
        self.sources = sources
        self.items = {stem: cut_rows(src) for stem, src in sources.items()}
        self.cuts = {stem: part_cuts(src, self.items[stem]) for stem, src in sources.items()}
        self.current = "index.html"
        self._lines: dict[str, dict[str, int]] = {}
        # prose names a machinery file by its own name ("fileio.py"): the module it means, unless a
        # chapter has that name (machinery/commands/train.py is "commands/train.py" in prose)
        self.short = {
            stem.rsplit(".", 1)[-1]: stem
            for stem in sources
            if "." in stem and stem.rsplit(".", 1)[-1] not in sources
        }

    def file(self, name: str) -> str | None:
        """The module a prose file name means: "train" -> train, "fileio" or "machinery/fileio" ->
        machinery.fileio; None for a file the book does not show."""
        name = name.replace("/", ".")
        if name in self.sources:
            return name
        if f"machinery.{name}" in self.sources:
            return f"machinery.{name}"
        return self.short.get(name)

    def page(self, stem: str, line: int = 1) -> str:
        """The page (part) of stem's file that shows `line`."""
        part = sum(cut <= line for cut in self.cuts.get(stem, []))
        return f"{stem}.html" if part == 0 else f"{stem}-{part + 1}.html"

    def parts(self, stem: str) -> list[str]:
        return [f"{stem}.html"] + [f"{stem}-{k}.html" for k in range(2, len(self.cuts[stem]) + 2)]

    def href(self, stem: str, anchor: str) -> str:
        """stem's anchor from the current page: "#anchor" on the same part, "stem-2.html#anchor" on
        another."""
        if stem not in self._lines:
            src, lines = self.sources[stem], {}
            for line, names in sorted(src.assigned.items(), reverse=True):
                lines.update({name: line for name in names})
            lines.update({h.anchor: h.line for h in self.items[stem] if isinstance(h, Heading)})
            lines.update({d.qualname: d.start for d in src.definitions.values() if d.qualname})
            self._lines[stem] = lines
        target = self.page(stem, self._lines[stem].get(anchor, 1))
        return f"#{anchor}" if target == self.current else f"{target}#{anchor}"

    def attribute(self, module: str, attr: str, more: str = "") -> str | None:
        """`module.attr` (or `module.Class.method`): the anchor on module's page, when it defines that name."""
        symbols = self.sources[module].symbols
        if more and f"{attr}.{more}" in symbols:
            return self.href(module, f"{attr}.{more}")
        return self.href(module, attr) if attr in symbols else None

    def name(self, src: Source, name: str) -> str | None:
        """A bare name: imported from another page (`from model import GPT`), or a definition on this page."""
        if name in src.imported_names:
            module, original = src.imported_names[name]
            return self.attribute(module, original) or self.page(module)
        if name in src.top_level:
            return self.href(src.stem, name)
        return None

    def link_text(self, src: Source, escaped: str) -> str:
        """Plain prose (already HTML-escaped): another file's name (`bpe.py`) links to its page, and
        `module.name` (train.load_checkpoint, data_lib.open_source) to the definition, where that file defines it."""

        def replace(match: re.Match) -> str:
            head, tail = match.group(1), match.group(2)
            if tail == "py":
                module = self.file(head)
                href = self.page(module) if module is not None and module != src.stem else None
            else:
                module = src.module_aliases.get(head, head if head in self.sources else None)
                href = self.attribute(module, tail) if module is not None else None
            return f'<a class="xref" href="{href}">{match.group(0)}</a>' if href else match.group(0)

        return re.sub(
            r"(?<![\w./-])([A-Za-z_]\w*)\.([A-Za-z_]\w*)\b(?![\w/-]|\.\w)", replace, escaped
        )

    def code_span(self, src: Source, content: str) -> str | None:
        """A prose code span: `bpe.py`, `data_lib.open_source(...)`, `bpe.Tokenizer`, `GPT`, `Tokenizer.encode`."""
        match = re.fullmatch(r"([\w/]+)\.py", content)
        if match and self.file(match.group(1)) is not None:
            return self.page(self.file(match.group(1)))
        match = re.match(
            r"([A-Za-z_]\w*)\.([A-Za-z_]\w*)(?:\.([A-Za-z_]\w*))?(?:\(.*\))?$", content
        )
        if match:
            head, attr, more = match.groups()
            module = src.module_aliases.get(head, head if head in self.sources else None)
            if module is not None:
                return self.attribute(module, attr, more or "")
            if f"{head}.{attr}" in src.symbols:
                return self.href(src.stem, f"{head}.{attr}")
            return None
        match = re.fullmatch(r"([A-Za-z_]\w*)(?:\(.*\))?", content)
        return self.name(src, match.group(1)) if match else None


def make_markdown(linker: Linker, used_ids: set[str]):
    """A markdown-it renderer: CommonMark + tables, no raw HTML, headings with unique anchors, linked code spans."""
    from markdown_it import MarkdownIt
    from markdown_it.common.utils import escapeHtml
    from mdit_py_plugins.anchors import anchors_plugin

    def unique_slug(title: str) -> str:
        base = "doc-" + _slug(title)
        slug, n = base, 2
        while slug in used_ids:
            slug, n = f"{base}-{n}", n + 1
        used_ids.add(slug)
        return slug

    def code_inline(self, tokens, idx, options, env):
        content = tokens[idx].content
        href = None if env.get("in_link") else linker.code_span(env["source"], content)
        code = f"<code>{escapeHtml(content)}</code>"
        return f'<a class="xref" href="{escapeHtml(href)}">{code}</a>' if href else code

    def fence(self, tokens, idx, options, env):
        token = tokens[idx]
        language = token.info.strip() or "text"
        return f'<pre class="block code-{escapeHtml(language)}">{highlight_block(token.content, language)}</pre>\n'

    def code_block(self, tokens, idx, options, env):
        return f'<pre class="block">{escapeHtml(tokens[idx].content)}</pre>\n'

    def text(self, tokens, idx, options, env):
        inside_link = (
            any(t.type == "link_open" for t in tokens[:idx])
            and [t.type for t in tokens[:idx] if t.type in ("link_open", "link_close")][-1]
            == "link_open"
        )
        content = escapeHtml(tokens[idx].content)
        return (
            content
            if inside_link or env.get("in_link")
            else linker.link_text(env["source"], content)
        )

    md = MarkdownIt("commonmark", {"html": False}).enable("table").enable("strikethrough")
    md.inline.ruler.before("emphasis", "formula_star", formula_star)
    md.use(anchors_plugin, min_level=1, max_level=4, slug_func=unique_slug)
    md.add_render_rule("code_inline", code_inline)
    md.add_render_rule("text", text)
    md.add_render_rule("fence", fence)
    md.add_render_rule("code_block", code_block)
    return md


def formula_star(state, silent: bool) -> bool:
    """A `*` run between two non-space characters is a product or a glob (3*C*H, B*T, train_*.bin,
    2**32), not emphasis: keep it as text. Emphasis (*word*, **a sentence.**) has a space or
    punctuation on its outer side."""
    pos, src = state.pos, state.src
    if src[pos] != "*":
        return False
    end = pos
    while end < state.posMax and src[end] == "*":
        end += 1
    before, after = src[pos - 1] if pos else " ", src[end] if end < state.posMax else " "
    if not (before.isalnum() or before in ")]_") or not (after.isalnum() or after in "([._"):
        return False
    if not silent:
        state.push("text", "", 0).content = src[pos:end]
    state.pos = end
    return True


def highlight_block(text: str, language: str) -> str:
    """A fenced block: pycon and python highlighted by Pygments, anything else escaped verbatim."""
    if language not in ("pycon", "python"):
        return html.escape(text, quote=False)
    from pygments import lex
    from pygments.lexers import PythonConsoleLexer, PythonLexer

    lexer = PythonConsoleLexer() if language == "pycon" else PythonLexer()
    return "".join(_span(ttype, value) for ttype, value in lex(text, lexer)).rstrip("\n")


_DIVIDER = re.compile(r"^-{2,}\s*(.*?)\s*-{4,}\s*$|^(\S.*?)\s+-{4,}\s*$")


def divider_headings(text: str) -> str:
    """A divider comment (`-- encoding ------`, `Closed-form accounting ------`) is a sub-heading; a
    bare rule of dashes says nothing and goes."""
    out = []
    for line in text.split("\n"):
        match = _DIVIDER.match(line) or re.match(r"^-{4,}\s*$", line)
        if match is None:
            out.append(line)
        elif any(match.groups()):
            out += ["", f"#### {next(g for g in match.groups() if g)}", ""]
    return "\n".join(out)


def prose_html(md, src: Source, parts: list[tuple[str, str]]) -> str:
    chunks = []
    for kind, text in parts:
        text = fence_doctests(divider_headings(text) if kind == "comment" else text)
        text = (
            fence_aligned_comment_lines(text)
            if kind == "comment"
            else separate_indented_blocks(text)
        )
        chunks.append(md.render(text, {"source": src}))
    return "".join(chunks)


# ------------------------------------------------------------------------------------------------------------------
# 5. Code: Pygments tokens of the whole file, cut into lines, names from other chapters linked
# ------------------------------------------------------------------------------------------------------------------
# The whole file is lexed at once (a line in the middle of a triple-quoted string is still a string), then the
# token stream is cut at newlines, so any subset of lines can be shown with the right colours.


def _css_class(ttype) -> str:
    from pygments.token import STANDARD_TYPES

    while ttype not in STANDARD_TYPES:
        ttype = ttype.parent
    return STANDARD_TYPES[ttype]


def _span(ttype, value: str, href: str | None = None) -> str:
    css = _css_class(ttype)
    text = html.escape(value, quote=False)
    inner = f'<span class="{css}">{text}</span>' if css else text
    return f'<a class="xref" href="{html.escape(href)}">{inner}</a>' if href else inner


def token_lines(src: Source) -> list[list[tuple[object, str]]]:
    from pygments import lex
    from pygments.lexers import PythonLexer

    lines: list[list[tuple[object, str]]] = [[]]
    for ttype, value in lex("\n".join(src.lines) + "\n", PythonLexer(stripnl=False, ensurenl=True)):
        pieces = value.split("\n")
        for k, piece in enumerate(pieces):
            if k:
                lines.append([])
            if piece:
                lines[-1].append((ttype, piece))
    return lines[: len(src.lines)]


def code_line_html(linker: Linker, src: Source, tokens: list[tuple[object, str]]) -> str:
    """One line of code with links: `alias.attr` to attr's anchor on alias's page, imported names to theirs,
    module names in import statements to their page, uses of this page's functions and classes to their row."""
    from pygments.token import Name

    hrefs: list[str | None] = [None] * len(tokens)
    for k, (ttype, value) in enumerate(tokens):
        if ttype not in Name or (k and tokens[k - 1][1] == "."):
            continue  # `self.prepare` is not dataset.prepare
        if ttype is Name.Namespace:
            hrefs[k] = linker.page(value) if value in linker.sources else None
        elif value in src.module_aliases:
            if k + 2 < len(tokens) and tokens[k + 1][1] == "." and tokens[k + 2][0] in Name:
                target = linker.attribute(src.module_aliases[value], tokens[k + 2][1])
                if target:
                    hrefs[k], hrefs[k + 2] = linker.page(src.module_aliases[value]), target
        elif ttype not in (Name.Function, Name.Class):  # a definition's own name is not a use
            hrefs[k] = linker.name(src, value)
    return "".join(_span(ttype, value, href) for (ttype, value), href in zip(tokens, hrefs))


# ------------------------------------------------------------------------------------------------------------------
# 6. Pages: the index (pipeline map, chapters, companions) and one page per file
# ------------------------------------------------------------------------------------------------------------------


def _layout(title: str, body: str, nav: str) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{html.escape(title)}</title>\n"
        '<link rel="stylesheet" href="book.css">\n<link rel="stylesheet" href="pygments.css">\n'
        '<link rel="icon" href="data:,">\n'
        f'</head>\n<body>\n<nav class="top">{nav}</nav>\n<main>\n{body}\n</main>\n</body>\n</html>\n'
    )


def _nav(order: list[str], page: str | None, toc: str = "", files: list[str] | None = None) -> str:
    """Index, previous and next in reading order (a file's parts, then the next file), the parts of
    a long file, and the page's sections as a menu (a <details>, so it opens without JavaScript and
    stays in the sticky bar wherever the reader is). `order`: the files' stems in book order;
    `files`: the parts of this page's file."""
    links = ['<a href="index.html">Book index</a>']
    if page is not None:
        files = files or [page]
        k = files.index(page)
        stem = re.sub(r"-\d+$", "", page.removesuffix(".html"))
        j = order.index(stem)
        prev = files[k - 1] if k > 0 else f"{order[j - 1]}.html" if j > 0 else None
        next_ = (
            files[k + 1]
            if k + 1 < len(files)
            else f"{order[j + 1]}.html"
            if j + 1 < len(order)
            else None
        )
        if prev:
            links.append(f'<a href="{prev}" rel="prev">← {_label(prev)}</a>')
        if next_:
            links.append(f'<a href="{next_}" rel="next">{_label(next_)} →</a>')
        if len(files) > 1:
            links.append(
                '<span class="parts">Parts: '
                + " ".join(
                    f"<b>{n}</b>" if name == page else f'<a href="{name}">{n}</a>'
                    for n, name in enumerate(files, 1)
                )
                + "</span>"
            )
    if toc:
        links.append(
            f'<details class="sections"><summary>Sections</summary><ul>{toc}</ul></details>'
        )
    return " ".join(links)


def _label(page: str) -> str:
    """data.html -> data.py, data-2.html -> data.py (2), machinery.fileio.html -> machinery/fileio.py."""
    match = re.fullmatch(r"([\w.]+?)(?:-(\d+))?\.html", page)
    name = match.group(1).replace(".", "/") + ".py"
    if match.group(2):
        name += f" ({match.group(2)})"
    return name


def figure_html(figure: Figure, root: pathlib.Path) -> str:
    """A figure from the file the chapter's command wrote, opening full size on a click; when it is
    missing, the command that makes it."""
    path = root / figure.output
    caption = (
        f"<figcaption>{html.escape(figure.title)}. Made by <code>{html.escape(figure.command)}</code>"
        f" (<code>{html.escape(figure.output)}</code>).</figcaption>"
    )
    if not path.is_file():
        return (
            f'<figure class="missing" id="figure-{figure.name}"><p>Not built yet: run '
            f"<code>{html.escape(figure.command)}</code> from the repository root, then "
            f"<code>python book/build.py --refresh-figures {figure.name}</code>.</p>{caption}</figure>"
        )
    if path.suffix == ".png":
        src = f"figures/{path.name}"
        return (
            f'<figure id="figure-{figure.name}"><a href="{src}" title="open full size"><img src="{src}" '
            f'alt="{html.escape(figure.title)}"></a>{caption}</figure>'
        )
    printed = printed_output_html(path.read_text(encoding="utf-8"))
    return f'<figure id="figure-{figure.name}">{printed}{caption}</figure>'


def printed_output_html(text: str) -> str:
    """A command's printed output: its Markdown tables (`| a | b |`) as tables, every other line verbatim."""
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    chunks, block, in_table = [], [], False
    for line in text.rstrip("\n").split("\n") + [None]:
        table_line = line is not None and line.lstrip().startswith("|")
        if line is None or table_line != in_table:
            if block:
                chunks.append(
                    f'<div class="table">{md.render(chr(10).join(block))}</div>'
                    if in_table
                    else f'<pre class="block output">{html.escape(chr(10).join(block), quote=False)}</pre>'
                )
            block, in_table = [], table_line
        if line is not None:
            block.append(line)
    return "".join(chunks)


def is_wide(prose: str, code_lines: int) -> bool:
    """Prose that needs the page's width: a table or a block (doctests, worked numbers) would be
    clipped in the one-third column, and a lesson much taller than its code would leave the code
    column empty beside it (about 70 characters of prose per line of code keeps the two columns of
    similar height)."""
    if "<table" in prose or '<pre class="block' in prose:
        return True
    return len(re.sub(r"<[^>]+>", "", prose)) > 300 + 70 * code_lines


_CLI = re.compile(r"^(\d+\.\s*)?(the\s+)?command line\b", re.I)


def folded_from(items: list) -> int:
    """Where the command-line code starts (folded, so the page reads as its lesson): a section
    titled "Command line", else the first row of a CLI's parser or main()."""
    for k, item in enumerate(items):
        if isinstance(item, Heading) and _CLI.match(item.title):
            return k
    for k, item in enumerate(items):
        if isinstance(item, Row) and item.anchor in ("_Parser", "main", "build_parser"):
            return k
    return len(items)


SITTING_MINUTES = 45
WORDS_PER_MINUTE = 200  # prose read with care (a technical text, not a novel)
SECONDS_PER_CODE_LINE = 6  # a line of code read, not skimmed


def reading_minutes(words: int, code_lines: int) -> float:
    """The time a learner needs: 200 words of prose a minute and 6 s a line of code (so 1,000 words
    beside 200 lines take 5 + 20 = 25 minutes)."""
    return words / WORDS_PER_MINUTE + code_lines * SECONDS_PER_CODE_LINE / 60


def part_cuts(src: Source, items: list) -> list[int]:
    """Where a page longer than one sitting (45 minutes of its lesson; the folded command line not
    counted) is cut into parts of about equal reading time: the first lines of the parts 2, 3, ... A
    part starts at a section heading, or at a definition when a section (train.py's Trainer) is
    longer than a part. Each cut is the place a part may start whose reading time so far is nearest
    the part's share, before or after it, so a few words more never move a cut a whole section."""
    fold = folded_from(items)
    costs = [
        0.0
        if isinstance(item, Heading)
        else reading_minutes(sum(len(text.split()) for _, text in item.prose), len(item.code))
        for item in items[:fold]
    ]
    intro = reading_minutes(len(src.docstring.split()), 0)
    total = intro + sum(costs)
    n = math.ceil(total / SITTING_MINUTES)
    cuts, done = [], intro
    before = None  # (line, minutes read before it): the last place a part may start, not yet a cut
    for item, cost in zip(items, costs):
        line = _first_line(item)
        starts = isinstance(item, Heading) or (item.anchor and line)
        share = total * (len(cuts) + 1) / n  # where the next cut should fall, in minutes
        if starts and len(cuts) + 1 < n and done >= share:
            if before is not None and share - before[1] < done - share:
                cuts.append(before[0])  # the place before the share is nearer it
            else:
                cuts.append(line)
        if starts and line not in cuts and (before is None or done > before[1]):
            before = (line, done)  # a heading, not the definition right under it
        done += cost
    return cuts


def part_minutes(src: Source, items: list, cuts: list[int]) -> list[float]:
    """The reading time of each part of a page (its folded command line not counted), shown in its
    heading."""
    minutes, part = [reading_minutes(len(src.docstring.split()), 0)] + [0.0] * len(cuts), 0
    for item in items[: folded_from(items)]:
        if _first_line(item):
            part = sum(cut <= _first_line(item) for cut in cuts)
        if isinstance(item, Row):
            minutes[part] += reading_minutes(
                sum(len(text.split()) for _, text in item.prose), len(item.code)
            )
    return minutes


def _first_line(item) -> int:
    """The line an item starts at (0 for a row of prose alone, which stays with the part before
    it)."""
    return item.line if isinstance(item, Heading) else item.code[0] if item.code else 0


def page_html(
    linker: Linker, src: Source, order: list[str], kind: str, root: pathlib.Path
) -> dict[str, str]:
    """The pages of one file: {file name: html}, one per part (one for a file read in one
    sitting)."""
    used_ids: set[str] = set()
    md = make_markdown(linker, used_ids)
    items = linker.items[src.stem]
    tokens = token_lines(src)
    for item in items:
        if item.anchor:
            used_ids.add(item.anchor)

    def line_anchor(line_no: int) -> str:
        """The anchors of the names a line binds (A, B = 1, 2 binds two): the first as the line's
        id, the others as empty spans that open it."""
        names = [name for name in src.assigned.get(line_no, []) if name not in used_ids]
        used_ids.update(names)
        if not names:
            return ">"
        more = "".join(f'<span id="{html.escape(name)}"></span>' for name in names[1:])
        return f' id="{html.escape(names[0])}">{more}'

    files = linker.parts(src.stem)
    linker.current = None  # the menu is on every part: links name the file
    toc = "".join(
        f'<li><a href="{linker.href(src.stem, h.anchor)}">'
        f"{md.renderInline(h.title, {'source': src, 'in_link': True})}</a></li>"
        for h in items
        if isinstance(h, Heading)
    )
    # Each figure goes right after the row whose text discusses it (the first of its anchors on this
    # page).
    anchors = {
        item.anchor: k for k, item in enumerate(items) if isinstance(item, Row) and item.anchor
    }
    placed: dict[int, list[str]] = {}
    for figure in (f for f in FIGURES if f.chapter == src.stem):
        at = next((anchors[a] for a in figure.near if a in anchors), -1)
        placed.setdefault(at, []).append(figure_html(figure, root))
    label = ""
    if kind != "chapter":
        serves = serves_line(src)
        label = f'<p class="kind">Machinery: {html.escape(kind)}.'
        if serves:
            label += f" Serves: {md.renderInline(serves, {'source': src})}"
        label += "</p>"
    linker.current = files[0]
    minutes = part_minutes(src, items, linker.cuts[src.stem])
    of = f" · part 1 of {len(files)}" if len(files) > 1 else ""
    of += f' <small class="minutes">about {minutes[0]:.0f} minutes</small>'

    parts: dict[str, list[str]] = {name: [] for name in files}
    parts[files[0]].append(
        f'<header class="intro"><h1><code>{src.filename}</code>{of}</h1>{label}'
        f"{md.render(separate_indented_blocks(fence_doctests(src.docstring)), {'source': src})}"
        + "".join(f'<div class="figures">{f}</div>' for f in placed.get(-1, []))
        + (f'<nav class="toc"><h2>Sections</h2><ul>{toc}</ul></nav>' if toc else "")
        + "</header>"
    )
    fold = folded_from(items)
    hint = '<span class="hint">folded: the code that reads the flags and runs the commands</span>'
    for k, item in enumerate(items):
        if _first_line(item) and linker.page(src.stem, _first_line(item)) != linker.current:
            linker.current = linker.page(src.stem, _first_line(item))
            number = files.index(linker.current) + 1
            parts[linker.current].append(
                f'<header class="intro part"><h1><code>{src.filename}</code> · part '
                f'{number} of {len(files)} <small class="minutes">about '
                f"{minutes[number - 1]:.0f} minutes</small></h1></header>"
            )
        out = parts[linker.current]
        heading = isinstance(item, Heading) and (
            f'<h2 class="banner" id="{item.anchor}"><a href="#{item.anchor}">'
            f"{md.renderInline(item.title, {'source': src, 'in_link': True})}"
            "</a></h2>"
        )
        if k == fold:
            out.append(
                f'<details class="cli"><summary>{heading or "<h2>The command line</h2>"}{hint}</summary>'
            )
        if heading:
            if k != fold:
                out.append(heading)
            continue
        code = "".join(
            f'<span class="line" data-n="{n}"{line_anchor(n)}{code_line_html(linker, src, tokens[n - 1])}'
            f"</span>"
            for n in item.code
        )
        anchor = f' id="{html.escape(item.anchor)}"' if item.anchor else ""
        prose = prose_html(md, src, item.prose)
        shape = " wide" if prose and is_wide(prose, len(item.code)) else "" if prose else " bare"
        out.append(
            f'<section class="row{shape}"{anchor}><div class="prose">{prose}</div>'
            f'<div class="code"><pre>{code}</pre></div></section>'
        )
        out += [f'<div class="figures">{f}</div>' for f in placed.get(k, [])]
    if fold < len(items):
        parts[linker.current].append("</details>")
    linker.current = "index.html"
    pages = {}
    for number, name in enumerate(files):
        title = src.filename + (f" (part {number + 1} of {len(files)})" if len(files) > 1 else "")
        pages[name] = _layout(
            f"{title} · the book", "\n".join(parts[name]), _nav(order, name, toc, files)
        )
    return pages


def index_html(
    linker: Linker,
    sources: dict[str, Source],
    chapters: list[str],
    companions: list[tuple[str, str]],
) -> str:
    md = make_markdown(linker, set())

    def inline(stem: str, text: str) -> str:
        # Rendered as if on stem's page, where a name it defines links to "#name"; on the index that is stem.html#name.
        return md.renderInline(text, {"source": sources[stem]}).replace(
            'href="#', f'href="{stem}.html#'
        )

    stages = "".join(
        f'<li><a href="{stem}.html"><code>{stem}.py</code></a><span>{html.escape(stage)}</span></li>'
        for stem, stage in CHAPTERS
        if stem in sources
    )
    chapter_rows = "".join(
        f'<tr><td>{k}</td><td><a href="{stem}.html"><code>{sources[stem].filename}</code></a></td>'
        f"<td>{inline(stem, first_line(sources[stem]))}</td></tr>"
        for k, stem in enumerate(chapters, 1)
    )
    companion_rows = "".join(
        f'<tr><td><a href="{stem}.html"><code>{sources[stem].filename}</code></a></td>'
        f"<td>{html.escape(kind)}</td><td>{inline(stem, first_line(sources[stem]))}</td></tr>"
        for stem, kind in companions
    )
    body = (
        '<header class="intro"><h1>LLM pretraining from scratch, read as a book</h1>'
        "<p>Each page is one file of the repository, rendered from the file itself: its docstring first, then the "
        "code in file order with its comments and docstrings beside it. Read the chapters in this order; the "
        "appendix shows machinery/: the command lines, the run's wiring, engines, I/O and bridges.</p>"
        '<h2 id="pipeline">The pipeline</h2><p>Data flows down the list; each step is a chapter.</p>'
        f'<ol class="pipeline">{stages}</ol>'
        '<h2 id="chapters">Chapters</h2><div class="table"><table><thead><tr><th>#</th><th>file</th>'
        f"<th>what it teaches</th></tr></thead><tbody>{chapter_rows}</tbody></table></div>"
        + (
            '<h2 id="companions">Appendix: machinery</h2><div class="table"><table><thead><tr><th>file</th>'
            f"<th>kind</th><th>what it is</th></tr></thead><tbody>{companion_rows}</tbody></table></div>"
            if companions
            else ""
        )
        + "</header>"
    )
    return _layout("LLM pretraining from scratch · the book", body, _nav(["index"], None))


# ------------------------------------------------------------------------------------------------------------------
# 7. The build: discover, classify, render, publish the folder whole
# ------------------------------------------------------------------------------------------------------------------


def discover(
    root: pathlib.Path = ROOT,
) -> tuple[dict[str, Source], list[str], list[tuple[str, str]]]:
    """The chapters at the root in reading order, then machinery/'s files (its command lines last)."""
    paths = sorted(p for p in root.glob("*.py") if p.is_file())
    paths += sorted(
        p for p in (root / "machinery").rglob("*.py") if p.is_file() and p.name != "__init__.py"
    )
    modules = {module_name(p, root) for p in paths}
    sources = {module_name(p, root): read_source(p, modules, root) for p in paths}
    reading = [stem for stem, _ in CHAPTERS]
    chapters = [stem for stem in reading if stem in sources]
    others = sorted(
        (stem for stem in sources if stem not in reading),
        key=lambda stem: (".commands." in stem, stem),
    )
    companions = []
    for stem in others:
        kind = COMPANION_KINDS.get(stem, "machinery")
        if ".commands." in stem:
            kind = "command line"
        companions.append((stem, kind))
    return sources, chapters, companions


def reading_order(chapters: list[str], companions: list[tuple[str, str]]) -> list[str]:
    """Previous/next order: the chapters, then the appendix."""
    return chapters + [stem for stem, _ in companions]


def build(out: pathlib.Path, root: pathlib.Path = ROOT) -> list[pathlib.Path]:
    """Render every page of the files in `root` into a fresh folder beside `out`, then swap it in: `out` is whole
    or untouched."""
    from machinery import fileio

    _require_libraries()
    problem = fileio.output_path_problem(out)  # before resolve(): a loop is a RuntimeError there
    if problem:
        raise BookError(f"--out: {problem}: choose another folder for the site, e.g. book/site")
    out = out.resolve()
    if out.exists() and not out.is_dir():
        raise BookError(f"--out {out} is a file: give a folder for the site, e.g. book/site")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).exists():
        raise BookError(
            f"--out {out} holds files this command did not write: choose a new or empty folder"
        )
    if out == root or root.is_relative_to(out):
        raise BookError(
            f"--out {out} would replace the repository: choose a folder inside it, e.g. book/site"
        )
    sources, chapters, companions = discover(root)
    order = reading_order(chapters, companions)
    linker = Linker(sources)
    pages = {"index.html": index_html(linker, sources, chapters, companions)}
    for stem in chapters:
        pages.update(page_html(linker, sources[stem], order, "chapter", root))
    for stem, kind in companions:
        pages.update(page_html(linker, sources[stem], order, kind, root))

    try:
        publish(out, pages, root)
    except (
        OSError
    ) as e:  # a full disk, a read-only or special folder (/proc): one line, no traceback
        raise BookError(
            f"--out {out}: cannot write the site ({e.strerror or e}): choose a writable folder with "
            "free space; nothing was changed there"
        ) from e
    return [out / name for name in pages]


def publish(out: pathlib.Path, pages: dict[str, str], root: pathlib.Path) -> None:
    """Write every file into a fresh folder beside `out`, then swap it in: `out` is the old site or
    the new one, whole, whatever fails (a full disk midway removes the half-written folder and keeps
    the old site)."""
    from pygments.formatters import HtmlFormatter

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    old = None
    try:
        for name, text in pages.items():
            (staging / name).write_text(text, encoding="utf-8")
        shutil.copyfile(BOOK_DIR / "book.css", staging / "book.css")
        (staging / "pygments.css").write_text(
            HtmlFormatter(style="default").get_style_defs([".code", ".block"]), encoding="utf-8"
        )
        (staging / "figures").mkdir()
        for figure in FIGURES:
            if figure.output.endswith(".png") and (root / figure.output).is_file():
                shutil.copyfile(
                    root / figure.output, staging / "figures" / pathlib.Path(figure.output).name
                )
        (staging / MARKER).write_text(
            "built by book/build.py; the next build replaces this folder\n"
        )
        umask = os.umask(0)
        os.umask(umask)
        for path in [staging, *staging.rglob("*")]:
            path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)
        if out.exists():
            old = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
            os.replace(out, old / "site")
        os.replace(staging, out)
    except BaseException:
        if old is not None and (old / "site").exists() and not out.exists():
            os.replace(old / "site", out)  # the swap failed halfway: put the old site back
        shutil.rmtree(staging, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def refresh_figures(names: list[str]) -> None:
    """Rerun the named figures' commands from the repository root and store their outputs where FIGURES says."""
    known = {f.name: f for f in FIGURES}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise BookError(
            f"--refresh-figures {unknown[0]}: no such figure; choose from {', '.join(known)}"
        )
    for name in names:
        figure = known[name]
        result = subprocess.run(
            [sys.executable, *shlex.split(figure.command)[1:]],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            tail = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise BookError(f"--refresh-figures {name}: `{figure.command}` failed: {tail}")
        target = ROOT / figure.output
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = target.with_name(f".{target.name}.tmp{os.getpid()}")
        if figure.produces:
            shutil.copyfile(ROOT / figure.produces, temp)
        elif not figure.output.endswith(
            ".png"
        ):  # a PNG without `produces` was written by its command
            temp.write_text(result.stdout, encoding="utf-8")
        if temp.exists():
            os.replace(temp, target)
        print(f"{name}: {figure.output} from `{figure.command}`")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--out", type=pathlib.Path, default=BOOK_DIR / "site", help="the site folder (book/site)"
    )
    parser.add_argument(
        "--refresh-figures",
        nargs="+",
        metavar="NAME",
        default=[],
        help=f"first rerun these figures' commands ({', '.join(f.name for f in FIGURES)})",
    )
    args = parser.parse_args(argv)
    try:
        refresh_figures(args.refresh_figures)
        pages = build(args.out)
    except BookError as e:
        print(f"book/build.py: error: {e}", file=sys.stderr)
        return 2
    print(f"{len(pages)} pages in {args.out}: open {args.out / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
