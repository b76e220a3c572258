"""dedup_files.py: dedup.py's near-dedup applied to files (dedup.py's helper, not a chapter).

`python dedup.py run --input FILE... --out FILE` reads corpus files (`read_corpus`: .jsonl or text),
deduplicates their documents together with `dedup.near_duplicates`, and writes the kept ones whole
(`write_atomic`). Every problem is a one-line `dedup.DedupError` in library terms; an `OptionError`
says which keyword of `dedup_files` fixes it, so the command line can name its flag.

Depends on dedup.py, fileio.py (untrusted JSON lines, files written whole with the umask's modes)
and the standard library.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import time

import dedup
from dedup import DedupError
from machinery import fileio


class OptionError(DedupError):
    """A DedupError that one keyword argument of `dedup_files` fixes: `option` names it, `problem`
    and `fix` are the message's two halves (a command line puts its flag into the fix)."""

    def __init__(self, problem: str, option: str, fix: str) -> None:
        super().__init__(f"{problem}: {fix}")
        self.problem, self.option, self.fix = problem, option, fix


def read_text(path: str | os.PathLike) -> str:
    """The UTF-8 text of a file, or a DedupError naming what is wrong with it."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise DedupError(f"{path} does not exist or is not a file: check the path")
    data = path.read_bytes()
    if b"\x00" in data:
        raise DedupError(
            f"{path} is not a text file (it contains NUL bytes): pass UTF-8 text or jsonl"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise DedupError(
            f"{path} is not UTF-8 text (bad byte at offset {error.start}): convert it to UTF-8"
        ) from None


def write_atomic(path: str | os.PathLike, text: str, fix: str = "write it on another disk") -> None:
    """fileio.write_atomic (temp file, rename, the umask's modes), with the failures said as one
    DedupError line (`fix`: what to do about a full disk)."""
    path = pathlib.Path(path)
    if path.is_dir():
        raise DedupError(f"{path} is a directory: give a file path for the output")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fileio.write_atomic(path, text, error=DedupError, fix=fix)
    except OSError as error:
        raise DedupError(
            f"cannot write {path} ({error.strerror}): choose a writable folder"
        ) from None


def read_corpus(
    path: str | os.PathLike, text_field: str = "text", split: str = "auto"
) -> tuple[list[str], list[str]]:
    """Documents of one corpus file: (texts, records). A .jsonl/.ndjson file holds one JSON object
    per line with the text under `text_field` (records are the original lines); other files are text
    with one document per line (split="line") or documents separated by blank lines (split="blank");
    "auto" picks blank when there are any."""
    text = read_text(path)
    if pathlib.Path(path).suffix.lower() in (".jsonl", ".ndjson"):
        texts, records = [], []
        for number, line in enumerate(text.split("\n"), 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            record = fileio.parse_json(line, where, DedupError, "give one JSON object per line")
            if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
                problem = f"{where} has no string field {text_field!r}"
                raise OptionError(problem, "text_field", "name the field that holds the text")
            texts.append(record[text_field])
            records.append(line)
        return texts, records
    if split not in ("auto", "line", "blank"):
        raise DedupError(f"split must be auto, line or blank, got {split!r}")
    if split == "blank" or (split == "auto" and re.search(r"\n[ \t]*\n", text)):
        texts = [block.strip() for block in re.split(r"\n[ \t]*\n", text) if block.strip()]
    else:
        texts = [line.strip() for line in text.split("\n") if line.strip()]
    return texts, [json.dumps({"text": t}, ensure_ascii=False) for t in texts]


def dedup_files(
    inputs: list[str],
    out: str,
    threshold: float = 0.5,
    num_perm: int = 128,
    bands: int | None = None,
    rows: int | None = None,
    n: int = 3,
    seed: int = 0,
    verify: str = "exact",
    text_field: str = "text",
    split: str = "auto",
    strip_accents: bool = False,
    fix: str = "write it on another disk",
) -> dict:
    """Deduplicate the documents of all `inputs` together and write the kept ones to `out` (.jsonl:
    one JSON line per document, the original line for jsonl inputs; otherwise text, one document per
    line, or separated by blank lines when any document spans lines). Returns the counts."""
    # (texts, records) per file
    corpora = [read_corpus(path, text_field, split) for path in inputs]
    texts = [text for file_texts, _ in corpora for text in file_texts]
    records = [record for _, file_records in corpora for record in file_records]
    if not texts:
        problem = f"no documents found in {', '.join(map(str, inputs))}"
        raise OptionError(problem, "split", "check the files and how they split into documents")
    start = time.perf_counter()
    clusters = dedup.near_duplicates(
        texts, threshold, num_perm, bands, rows, n, seed, verify, strip_accents
    )
    dropped = {i for cluster in clusters for i in cluster[1:]}
    kept = [i for i in range(len(texts)) if i not in dropped]
    seconds = time.perf_counter() - start
    if pathlib.Path(out).suffix.lower() in (".jsonl", ".ndjson"):
        body = "".join(records[i] + "\n" for i in kept)
    else:
        separator = "\n\n" if any("\n" in texts[i] for i in kept) or split == "blank" else "\n"
        body = separator.join(texts[i] for i in kept) + "\n"
    write_atomic(out, body, fix)
    return {
        "documents": len(texts),
        "clusters": len(clusters),
        "removed": len(dropped),
        "kept": len(kept),
        "seconds": round(seconds, 3),
    }
