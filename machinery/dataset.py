"""dataset.py: data.py's `prepare`: check the recipe and name it by a cache key, run an engine,
publish the directory.

Serves: data.py (`python data.py prepare`; the lesson's steps, its reference engine and the shard
format are there), data_at_scale.py (its `prepare` plans and publishes with this file, so both
engines end in the same bytes), and whoever needs a dataset built: train.py (`--data pydocs` is
dataset.prepare(["pydocs"]), cached), the tests.

A prepared dataset is one directory, published whole, that train.py reads with data.TokenData:

    manifest.json        sources, settings, the funnel, the tokenizer, the mixture, the split
                         sizes, the timings
    tokenizer.json       the BPE tokenizer (bpe.py), trained on the train split only
    train_00000.bin ...  token shards, data.py's format: a 32-byte header, then uint16 (or
                         uint32) ids
    val_00000.bin ...

Three steps, each a function:

    plan_dataset   every argument checked and every source opened before any work (a typo fails in
                   one line, in a second, not after an hour of cleaning); the cache key: a SHA-256
                   of the inputs (each file's path, size and mtime), every setting, and the bytes of
                   the code that writes the dataset (code_version). With no --out it names the
                   folder: .cache/data/pydocs-v4096-<its first 12 hex digits>. A finished dataset
                   with the same key is reused as is; a folder holding anything else is refused.
    an engine      in_memory.build_in_memory (`prepare` below) or data_at_scale's streaming and Ray
                   engines: the funnel, the tokenizer, per-source token counts, and a writer of the
                   shards (an in_memory.Built).
    write_dataset  the shards, tokenizer.json and manifest.json written into a temporary folder
                   beside the output, given the umask's modes, then one rename into place (or
                   store.publish for an s3:// URI, which copies the manifest last). A reader sees no
                   dataset or all of it; a killed run leaves a .NAME.tmp-* folder that the next run
                   removes (`remove_stale_publishes`).

Depends on: data.py (the recipe, the engine, the checks of sources, weights and --val-data),
formats.py (DataError, the count of skipped .jsonl lines), bpe.py (a --tokenizer file), store.py (an
--out URI) and fileio.py (the umask's modes, a full disk in one line), and the standard library.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import glob
import hashlib
import itertools
import json
import os
import pathlib
import re
import shutil
import sys
import tempfile
import time
from typing import Callable, Iterable, Iterator

import data
from machinery import cleaning
from machinery import fileio
from machinery import in_memory
from machinery import formats
from machinery import store
from data import DataError
from machinery import tokenizer_files


@dataclasses.dataclass
class Plan:
    """What prepare settles before any work: the recipe, its cache key, the output (a folder, or a
    store's URI), and whether a finished dataset with that key is already there (reuse: return it as
    is)."""

    recipe: in_memory.Recipe | None  # None when reused
    key: str
    out_dir: pathlib.Path | str
    reuse: bool
    # malformed .jsonl lines the in-memory reading skipped (--skip-bad-lines)
    jsonl_stats: formats.JsonlStats


def kept_txt_split(txt_split: str) -> str:
    """How a .txt kept whole is cut into documents: only at <|endoftext|> unless `txt_split` says
    otherwise."""
    return "eot" if txt_split == "auto" else txt_split


def plan_dataset(
    sources: list[str],
    out_dir: str | os.PathLike | None = None,
    vocab_size: int = data.DEFAULT_VOCAB_SIZE,
    seed: int = 0,
    val_fraction: float = 0.05,
    weights: list[float] | None = None,
    train_tokens: float | None = None,
    tokenizer: str | os.PathLike | None = None,
    tokenizer_train_bytes: int = 4_000_000,
    pattern: str = "gpt4",
    shard_tokens: int = 100_000_000,
    clean_settings: data.CleanSettings | None = None,
    text_field: str = "text",
    txt_split: str = "auto",
    skip_bad_lines: bool = False,
    max_documents: int | None = None,
    kind: str | None = None,
    val_data: list[str] | None = None,
    log: Callable = lambda *a, **k: None,
) -> Plan:
    """Check every argument, open the sources, and name the dataset: out_dir or a cache directory
    named by a hash of the inputs, every setting and the code (`code_version`). Every bad input
    fails here, before any work.

    sources: names ("pydocs", "pystdlib", "hf:..."), files, directories, globs or URIs
    (`formats.open_source`). weights (one per source) with train_tokens mix the train split by token
    share (None: the smallest budget that reads every source once). tokenizer: a bpe.py JSON file to
    reuse instead of training one on (up to tokenizer_train_bytes of) train text. val_data: files
    that are the validation split, verbatim (`formats.read_val_file`); every cleaned document then
    goes to train (val_fraction is not used), and the overlap of the two is measured
    (`in_memory.val_overlap`). out_dir may be a URI (s3://bucket/datasets/name, gs://, hdfs://,
    file://): the dataset is built on local disk, then published to the store (`store.publish`).
    """
    if not sources:
        raise DataError("no sources given: pass `data` pydocs (or a path)")
    if len(set(sources)) != len(sources):
        raise DataError(
            f"a source is listed twice in {sources}; give each once (use `weights` to up-weight)"
        )
    if weights is not None and len(weights) != len(sources):
        raise DataError(
            f"`weights`: {len(weights)} weights for {len(sources)} sources: give one weight per "
            "source"
        )
    if weights is not None:
        data.check_weights(weights)
    if tokenizer is None and vocab_size < 257:
        raise DataError(
            f"`vocab_size` {vocab_size} is too small: 256 byte tokens + <|endoftext|> need at "
            "least 257"
        )
    if not 0 <= val_fraction < 1:
        raise DataError(f"`val_fraction` must be in [0, 1), got {val_fraction}")
    if train_tokens is not None and (weights is None or not train_tokens > 0):
        raise DataError(
            f"`train_tokens` {train_tokens:g} needs `weights` and a positive budget, e.g. "
            "`weights` 1 `train_tokens` 5e6"
        )
    settings = clean_settings or data.CleanSettings()
    cleaning.load_classifiers(settings)
    jsonl_stats = formats.JsonlStats()
    opened = [
        formats.open_source(
            s, text_field, txt_split, skip_bad_lines, max_documents, jsonl_stats, kind
        )
        for s in sources
    ]
    # text kept whole is cut into documents only at <|endoftext|> markers
    if txt_split == "auto":
        opened = [
            formats.open_source(
                s.spec,
                text_field,
                kept_txt_split(txt_split),
                skip_bad_lines,
                max_documents,
                jsonl_stats,
                kind,
            )
            if cleaning.keeps_whole(s, settings)
            else s
            for s in opened
        ]
    for flag, path in [("--tokenizer", tokenizer)] + [("--val-data", p) for p in val_data or []]:
        if store.is_uri(path):
            raise DataError(
                f"{flag} {path}: give a local file (copy it down first, e.g. with aws s3 cp)"
            )
    val_paths = check_val_files(val_data, opened) if val_data else []
    if train_tokens is not None:
        check_budget(opened, weights, train_tokens)
    tokenizer_path = pathlib.Path(tokenizer) if tokenizer else None
    if tokenizer_path is not None and not tokenizer_path.is_file():
        raise DataError(f"tokenizer file {tokenizer_path} not found: pass a bpe.py tokenizer JSON")
    key_inputs = {
        "code": code_version(),
        "sources": [(s.spec, s.kind, s.fingerprint) for s in opened],
        "settings": dataclasses.asdict(settings),
        "vocab_size": vocab_size,
        "seed": seed,
        "val_fraction": val_fraction,
        "weights": weights,
        "train_tokens": train_tokens,
        "pattern": pattern,
        "tokenizer_train_bytes": tokenizer_train_bytes,
        "tokenizer": hashlib.sha256(tokenizer_path.read_bytes()).hexdigest()
        if tokenizer_path
        else None,
        "quality_model": settings.quality_model  # its bytes, not only its name
        and hashlib.sha256(pathlib.Path(settings.quality_model).read_bytes()).hexdigest(),
        "shard_tokens": shard_tokens,
        "text_field": text_field,
        "txt_split": txt_split,
        "skip_bad_lines": skip_bad_lines,
        "max_documents": max_documents,
        "val_data": [f"{p.resolve()}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in val_paths],
    }
    key = hashlib.sha256(json.dumps(key_inputs, sort_keys=True, default=str).encode()).hexdigest()
    if out_dir is None:
        slug = "+".join(
            re.sub(r"[^A-Za-z0-9._-]+", "_", store.pure_path(s).name or s)[:40] for s in sources
        )[:80]
        out_dir = cache_root() / "data" / f"{slug}-v{vocab_size}-{key[:12]}"
    remote = store.is_uri(out_dir)
    if not remote:
        out_dir = pathlib.Path(out_dir)
    existing = formats.read_manifest_or_none(out_dir)
    if existing is not None:
        if existing.get("cache_key") == key:
            log(
                f"cache hit: reusing {out_dir} (same inputs and settings); the times below are "
                "its first build's"
            )
            for notice in existing.get("notices", []):
                print(notice, file=sys.stderr)
            return Plan(None, key, out_dir, True, jsonl_stats)
        raise DataError(
            f"{out_dir} already holds a different dataset; remove it or pick another `out`"
        )
    if remote:
        store.check_out(out_dir, DATASET_FILE, DataError)
    elif out_dir.exists() and not out_dir.is_dir():
        raise DataError(f"`out` {out_dir} is a file; give a directory path")
    elif out_dir.exists() and any(out_dir.iterdir()):
        raise DataError(
            f"{out_dir} exists and is not a dataset directory; remove it or pick another `out`"
        )
    recipe = in_memory.Recipe(
        opened,
        settings,
        vocab_size,
        seed,
        val_fraction,
        weights,
        train_tokens,
        tokenizer_path,
        in_memory.check_eot(tokenizer_files.read_tokenizer(tokenizer_path))
        if tokenizer_path
        else None,
        tokenizer_train_bytes,
        pattern,
        shard_tokens,
        (text_field, txt_split, skip_bad_lines, max_documents),
        val_paths,
    )
    # fail now, not after minutes of cleaning
    if remote:
        store.check_writable(out_dir, DataError)
    else:
        check_writable(out_dir.parent, "--out")
    return Plan(recipe, key, out_dir, False, jsonl_stats)


def prepare(
    sources: list[str],
    out_dir: str | os.PathLike | None = None,
    *,
    threads: int | None = None,
    verbose: bool = False,
    **recipe,
) -> pathlib.Path | str:
    """Build (or reuse) a token dataset directory with the reference engine: manifest.json,
    tokenizer.json, train_*.bin, val_*.bin. recipe: `plan_dataset`'s arguments (vocab_size, seed,
    val_fraction, weights, ...).

    The whole corpus is held in lists (`in_memory.build_in_memory`): for small inputs, and the
    oracle of the tests. data_at_scale.prepare takes the same arguments and writes the same bytes
    with the streaming engine (any corpus size, worker processes, resumable) or Ray; `python data.py
    prepare` runs it above 64 MiB (`--engine auto`). Notices (heavy cleaning, the --val-data
    overlap) are printed to stderr, also when the dataset is reused.
    """
    log = print if verbose else (lambda *a, **k: None)
    with planned(sources, out_dir, log, recipe) as plan:
        return plan.out_dir if plan.reuse else run_in_memory(plan, threads, log)


@contextlib.contextmanager
def planned(sources: list[str], out_dir, log: Callable, recipe: dict) -> Iterator[Plan]:
    """plan_dataset, with the output locked until the block (which builds and publishes it)
    ends. Two prepares of one output (two shells, a sweep's runs) would share its temporary and
    work folders, each removing the other's; so the second waits for the first (saying so), then
    plans again: it reuses what the first published or, if the first was killed, resumes its
    work. The lock is `fileio.hold`'s: a killed holder frees it."""
    plan = plan_dataset(sources, out_dir, log=log, **recipe)
    if plan.reuse:
        yield plan
        return
    lock = staging_dir(plan.out_dir) / f".{local_name(plan.out_dir)}.lock"
    with fileio.hold(
        lock,
        lambda pid: print(
            f"waiting for process {pid}, which is preparing {plan.out_dir}", file=sys.stderr
        ),
        DataError,
        "remove it, or pick another --out",
    ) as (busy, _):
        # what is alive now (modules: ~10^5 objects) outlives the build: full collections skip it
        gc.freeze()
        try:
            yield plan_dataset(sources, out_dir, log=log, **recipe) if busy else plan
        finally:
            gc.unfreeze()


def staging_dir(out_dir: pathlib.Path | str) -> pathlib.Path:
    """Where a prepare of out_dir writes its temporary folder and lock: beside a local out_dir,
    in the temp folder for a store's URI."""
    return pathlib.Path(tempfile.gettempdir()) if store.is_uri(out_dir) else out_dir.parent


def run_in_memory(plan: Plan, threads: int | None, log: Callable) -> pathlib.Path | str:
    """The reference engine on a checked plan: `in_memory.build_in_memory` (data.py's funnel,
    the code the chapter teaches), then the directory published whole.
    data_at_scale.prepare(engine="auto") sends small inputs here."""
    staging = staging_dir(plan.out_dir)
    remove_stale_publishes(plan.out_dir, staging)
    clock = Clock()
    val_texts = [d for path in plan.recipe.val_files for d in formats.read_val_file(path)]
    built = in_memory.build_in_memory(plan.recipe, clock, log, threads, val_texts)
    if plan.jsonl_stats.skipped:
        built.funnel.steps[0].reasons["malformed_jsonl_lines_skipped"] = plan.jsonl_stats.skipped
    return write_dataset(plan, built, clock, staging, "in-memory")


def format_overlap(overlap: dict) -> str:
    """One line on the overlap of --val-data with train: the last of the dataset's notices.

    >>> print(format_overlap({"n": 13, "ngrams": 2000,  # doctest: +NORMALIZE_WHITESPACE
    ...     "shared": 3, "documents": 1, "contaminated": 1, "example": "a b"}))
    --val-data: 3 of its 2,000 13-grams (0.15%) also occur in train,
    in 1 of 1 documents (e.g. "a b")
    """
    share = overlap["shared"] / max(1, overlap["ngrams"])
    example = f' (e.g. "{overlap["example"]}")' if overlap["example"] else ""
    return (
        f"--val-data: {overlap['shared']:,} of its {overlap['ngrams']:,} {overlap['n']}-grams "
        f"({share:.2%}) also occur in train, in {overlap['contaminated']:,} of "
        f"{overlap['documents']:,} documents{example}"
    )


NO_SPACE_FIX = "pass --out elsewhere"


def write_dataset(
    plan: Plan, built: in_memory.Built, clock: Clock, staging: pathlib.Path, engine: str
) -> pathlib.Path | str:
    """The dataset directory from what an engine built: its shards, tokenizer.json and
    manifest.json, written in a temporary folder in `staging`, given the umask's modes (mkdtemp
    makes it 0700 and ShardWriter's files are 0600: another account could not read the dataset),
    then published whole: one rename, or `store.publish` for a URI. A full disk (or ulimit -f) is
    one line naming the output. Prints the engine's notices first."""
    recipe, out_dir, tok = plan.recipe, plan.out_dir, built.tokenizer
    settings, val_paths = recipe.settings, recipe.val_files
    text_field, txt_split, _, max_documents = recipe.read_options
    # both engines measure the overlap (`Built.overlap`); it is told here, once
    if built.overlap is not None:
        built.funnel.notices.append(format_overlap(built.overlap))
    for notice in built.funnel.notices:
        print(notice, file=sys.stderr)
    # a store's dataset is staged on local disk first
    remote = store.is_uri(out_dir)
    full = (staging, "pass --work-dir elsewhere") if remote else (out_dir, NO_SPACE_FIX)
    with temporary_folder(staging, local_name(out_dir), *full) as tmp_dir:
        dtype = data.dtype_for_vocab(len(tok))
        splits = built.write_splits(tmp_dir, dtype)
        if val_paths:
            splits["val"].update(files=[str(p) for p in val_paths], overlap=built.overlap)
        (tmp_dir / "tokenizer.json").write_text(tok.to_json(), encoding="utf-8")
        clock.finish()
        manifest = {
            "format": "llm-token-shards",
            "version": data.SHARD_VERSION,
            "cache_key": plan.key,
            "sources": [
                {"spec": s.spec, "kind": s.kind, "kept": built.kept[s.spec]} for s in recipe.sources
            ],
            "settings": {
                **dataclasses.asdict(settings),
                "val_fraction": None if val_paths else recipe.val_fraction,
                "val_data": [str(p) for p in val_paths],
                "seed": recipe.seed,
                "weights": recipe.weights,
                "train_tokens": recipe.train_tokens,
                "text_field": text_field,
                "txt_split": txt_split,
                "max_documents": max_documents,
            },
            "funnel": built.funnel.to_list(),
            "notices": built.funnel.notices,
            "tokenizer": {
                "file": "tokenizer.json",
                "vocab_size": len(tok),
                "eot_id": tok.eot_id,
                "pattern": recipe.pattern if recipe.tokenizer_path is None else "from file",
                "trained_on_bytes": built.trained_on,
                "source": str(recipe.tokenizer_path) if recipe.tokenizer_path else None,
            },
            "dtype": dtype.name,
            "mixture": built.mixture,
            "splits": splits,
            "timings": {
                **clock.timings,
                "encoded_bytes": built.encoded_bytes,
                "input_bytes": built.funnel.bytes_read,
                "engine": engine,
            },
        }
        (tmp_dir / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
        if remote:
            store.publish(tmp_dir, out_dir, DataError)
            shutil.rmtree(tmp_dir)
        else:
            fileio.publish_tree(tmp_dir)
            rename_into_place(tmp_dir, out_dir)
    return out_dir


@contextlib.contextmanager
def temporary_folder(parent: pathlib.Path, name: str, target, fix: str) -> Iterator[pathlib.Path]:
    """A new .NAME.tmp-* folder in `parent` for a block that fills it and renames (or copies) it
    into place. If the block fails, the folder goes, with the folders made for it, and a full disk
    (a quota, ulimit -f) becomes one line naming `target` and the `fix`. Both a prepare's publish
    and a download write this way."""
    made, tmp_dir = fileio.missing_folders(parent), None
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp_dir = pathlib.Path(tempfile.mkdtemp(dir=parent, prefix=f".{name}.tmp-"))
        yield tmp_dir
    except BaseException as e:
        if tmp_dir is not None:
            shutil.rmtree(tmp_dir, ignore_errors=True)
        fileio.remove_if_empty(made)
        if isinstance(e, Exception) and fileio.is_no_space(e):
            raise DataError(fileio.no_space_message(target, fix)) from None
        raise


def local_name(out_dir: pathlib.Path | str) -> str:
    """The name of out_dir's temporary and work folders: its own name, plus a hash of the URI for a
    store's (whose folders share the temp folder with those of any other bucket)."""
    if not store.is_uri(out_dir):
        return out_dir.name
    return f"{store.pure_path(out_dir).name}-{hashlib.sha256(out_dir.encode()).hexdigest()[:8]}"


def remove_stale_publishes(out_dir: pathlib.Path | str, staging: pathlib.Path) -> None:
    """Remove what killed runs left: half-written .NAME.tmp-* folders (never used: a dataset is
    published by one rename, or in a store by copies that end with the manifest) in the staging
    folder and beside out_dir, and, for a URI, the store's OUT.tmp-* prefixes."""
    name = glob.escape(local_name(out_dir))
    folders = {staging} if store.is_uri(out_dir) else {staging, out_dir.parent}
    for stale in itertools.chain(*(f.glob(f".{name}.tmp-*") for f in folders)):
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
    if store.is_uri(out_dir):
        store.remove_stale_publishes(out_dir, DataError)


def check_writable(folder: pathlib.Path, flag: str) -> None:
    """Raise DataError unless a file can be created in `folder`. A check, not a step: the folders it
    makes to try are removed again, so a run that then fails on its input leaves no empty cache
    folder behind."""
    made = fileio.missing_folders(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        raise DataError(
            f"cannot write in {folder} ({e.strerror}); pick a writable {flag}"
        ) from None
    finally:
        fileio.remove_if_empty(made)


# what a publish writes, but the manifest
DATASET_FILE = re.compile(r"(train|val)_\d{5}\.bin|tokenizer\.json")


def rename_into_place(tmp_dir: pathlib.Path, out_dir: pathlib.Path) -> None:
    """Rename the finished temporary directory into place. If another process (another rank)
    finished the same dataset first, keep theirs: the shards and tokenizer are identical by
    construction."""
    if out_dir.exists() and not any(out_dir.iterdir()):
        out_dir.rmdir()
    try:
        os.rename(tmp_dir, out_dir)
    except OSError:
        if formats.read_manifest_or_none(out_dir) is None:
            raise
        shutil.rmtree(tmp_dir, ignore_errors=True)


# --------------------------------------------------------------------------------------------------
# The checks of a recipe before any work, the cache (its root, the code version in its key), the
# timings, and a prepared dataset's summary (`python data.py inspect`)
# --------------------------------------------------------------------------------------------------

# the repository: machinery/dataset.py's folder's parent
REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent


def check_val_files(val_data: list[str], sources: list[data.Source]) -> list[pathlib.Path]:
    """The --val-data paths, after the checks that need no cleaning: each exists, is a file of a
    known type, has text, and is not the text of a training source (a copy would make the held-out
    loss a training loss)."""
    paths = [pathlib.Path(p).expanduser() for p in val_data]
    # globs, folders resolved
    train_files = [f for source in sources for f in source.files if not store.is_uri(f)]
    for path in paths:
        if not path.is_file():
            what = (
                "is a directory: name the file(s)"
                if path.is_dir()
                else "not found: name the held-out text file"
                if not path.exists()
                else f"is {formats.special_file(path)}, not a regular file: save the held-out text"
            )
            raise DataError(f"`val_data` {path} {what} (e.g. the last 10% of your text)")
        if not formats.readable(path):
            raise DataError(
                f"`val_data` {path}: unknown file type {path.suffix!r}; use a .txt, .jsonl or "
                ".parquet file"
            )
        if not formats.read_val_file(path):
            raise DataError(f"`val_data` {path} is empty: give a file with the held-out text")
        digest = hashlib.sha256(path.read_bytes()).digest()
        for train_file in train_files:
            if (
                train_file.stat().st_size == path.stat().st_size
                and hashlib.sha256(train_file.read_bytes()).digest() == digest
            ):
                raise DataError(
                    f"`val_data` {path} is the same text as the training file {train_file}: hold "
                    "out a different file (e.g. its last 10%), or drop `val_data` to hold out a "
                    "share of the training text instead"
                )
    return paths


def check_budget(sources: list[data.Source], weights: list[float], train_tokens: float) -> None:
    """Before any work: refuse a token budget that must read a source more than data.MAX_EPOCHS
    times.
    The tokens are not known until the text is encoded, but a byte of UTF-8 is at most one token,
    and each document adds one <|endoftext|>: N bytes of text hold at most 2N tokens. So a share of
    T tokens of a 20 kB file is at least T / 40,000 epochs: --train-tokens 1e15 would be 2.5e10
    passes over it. Only local uncompressed files have a known size; other sources are checked once
    they are encoded (`mixture_plan`)."""
    total_weight = sum(weights)
    for source, w in zip(sources, weights):
        files = source.files
        if not files or any(store.is_uri(f) or store.pure_path(f).suffix == ".gz" for f in files):
            continue
        most_tokens = 2 * sum(pathlib.Path(f).stat().st_size for f in files)
        epochs = train_tokens * w / total_weight / max(1, most_tokens)
        if epochs > data.MAX_EPOCHS:
            raise DataError(
                f"`train_tokens` {train_tokens:g} reads {source.label} at least {epochs:.3g} "
                f"times, more than {data.MAX_EPOCHS} epochs: lower the budget (its "
                f"{most_tokens / 2:,.0f} bytes hold at most {most_tokens:,.0f} tokens)"
            )


class Clock:
    """Wall and CPU seconds per phase. The CPU clock counts every thread of this process and its
    finished worker processes: on a shared machine the wall clock also measures the neighbours, the
    CPU clock only us."""

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
        for key, spent in (
            (f"{name}_s", time.perf_counter() - wall),
            (f"{name}_cpu_s", self.cpu() - cpu),
        ):
            # a phase may recur: add up
            self.timings[key] = round(self.timings.get(key, 0) + spent, 3)

    def finish(self) -> None:
        self.timings["total_s"] = round(time.perf_counter() - self.start[0], 3)
        self.timings["total_cpu_s"] = round(self.cpu() - self.start[1], 3)


def cache_root() -> pathlib.Path:
    return pathlib.Path(os.environ.get("PRETRAIN_CACHE", REPO_ROOT / ".cache")).expanduser()


# Every file whose bytes can change a dataset's: the chapter, its engine, its command line, and the
# files the prepare path imports (tests/test_data_at_scale.py checks this is the set of imports),
# named from the repository's root. Their bytes are in the cache key, so an edit to any invalidates
# the datasets it would build differently, and a Ray cluster's workers receive these very files.
PREPARE_FILES = (
    "data.py",
    "bpe.py",
    "dedup.py",
    "classify.py",
    "machinery/data_at_scale.py",
    "machinery/dataset.py",
    "machinery/in_memory.py",
    "machinery/cleaning.py",
    "machinery/formats.py",
    "machinery/store.py",
    "machinery/fileio.py",
    "machinery/tokenizer_files.py",
    # a Hugging Face tokenizer.json is read by the bridge, which imports the model and train.py
    "machinery/hf.py",
    "machinery/checkpoints.py",
    "model.py",
    "train.py",
    "machinery/cli.py",
    "machinery/commands/data.py",
)


# ... and the files they read that change what a filter keeps: the shipped classifiers
CACHE_KEY_FILES = PREPARE_FILES + ("classifiers/language.pt", "classifiers/quality.pt")


def code_version(files: Iterable[str] = CACHE_KEY_FILES, root: pathlib.Path = REPO_ROOT) -> str:
    """Hash of the code that shapes the output: each file's name and bytes (a file missing, say
    data.py copied without its engine, hashes as missing)."""
    h = hashlib.sha256()
    for name in files:
        path = pathlib.Path(root) / name
        content = path.read_bytes() if path.is_file() else b""
        h.update(f"{name}:{len(content) if path.is_file() else 'missing'}:".encode() + content)
    return h.hexdigest()[:16]


def summary(data_dir: str | os.PathLike) -> str:
    """A prepared dataset's funnel, then a few lines: tokens and documents per split and per
    source, bytes per token, throughput. A manifest that is valid JSON but lacks what prepare
    writes (a key, a number) is one line, not a KeyError."""
    m = load_manifest(data_dir)
    try:
        return "\n".join(_summary_lines(m, data_dir))
    except (KeyError, TypeError, ValueError, AttributeError, ArithmeticError) as e:
        raise DataError(
            f"{data_dir}: damaged manifest.json ({type(e).__name__}: {e}); re-run prepare"
        ) from None


def _summary_lines(m: dict, data_dir: str | os.PathLike) -> list[str]:
    lines = [
        data.Funnel.from_manifest(m).format(),
        f"dataset {data_dir}",
        f"tokenizer: {m['tokenizer']['vocab_size']:,} tokens, dtype {m['dtype']}",
    ]
    for split, s in m["splits"].items():
        lines.append(
            f"{split:>5}: {s['documents']:,} documents, {s['tokens']:,} tokens, "
            f"{s['bytes'] / 1e6:,.2f} MB, "
            f"{s['bytes'] / max(1, s['tokens']):.2f} bytes/token, {len(s['shards'])} shard(s)"
        )
    # a manifest written before the per-source counts has none
    for source in [s for s in m["sources"] if "kept" in s]:
        train, val = source["kept"]["train"], source["kept"]["val"]
        lines.append(
            f"  kept from {source['spec']}: {train['tokens']:,} train + {val['tokens']:,} val "
            f"tokens, {train['documents']:,} + {val['documents']:,} documents"
        )
    for name, p in (m["mixture"] or {}).items():
        lines.append(
            f"  mix {name}: weight {p['weight']:.2f}, {p['tokens']:,.0f} tokens, {p['epochs']:.2f} "
            "epochs"
        )
    tm = m["timings"]
    phases = ", ".join(
        f"{p} {tm[p + '_s']:.1f}/{tm[p + '_cpu_s']:.1f}s" for p in ("clean", "tokenizer", "encode")
    )
    mb_in, mb_encoded = tm["input_bytes"] / 1e6, tm["encoded_bytes"] / 1e6
    # os.times() does not see Ray's worker processes
    cpu = "driver CPU" if tm.get("engine") == "ray" else "CPU"
    lines.append(f"time (wall/{cpu}): {phases}, total {tm['total_s']:.1f}/{tm['total_cpu_s']:.1f}s")
    lines.append(
        f"throughput: {mb_in:.2f} MB read -> {mb_in / tm['total_s']:.2f} MB/s end to end "
        f"({mb_in / max(tm['total_cpu_s'], 1e-9):.2f} MB per {cpu}-second); encoding "
        f"{mb_encoded:.2f} MB at {mb_encoded / max(tm['encode_s'], 1e-9):.1f} MB/s "
        f"({mb_encoded / max(tm['encode_cpu_s'], 1e-9):.1f} MB per {cpu}-second)"
    )
    return lines


def load_manifest(data_dir: str | os.PathLike) -> dict:
    """A dataset's manifest.json, from a local directory (data.load_manifest) or an object-store
    URI."""
    if not store.is_uri(data_dir):
        return data.load_manifest(data_dir)
    manifest = formats.read_manifest_or_none(data_dir)
    if manifest is None:
        raise DataError(
            f"{data_dir} has no readable manifest.json: run `python data.py prepare` first"
        )
    return manifest


if __name__ == "__main__":
    # no commands of its own: --help (or no argument) says what runs this file
    from machinery import cli

    cli.help_only(__doc__, "No commands of its own: `python data.py prepare` runs it.")
