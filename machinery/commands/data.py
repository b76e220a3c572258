"""`python data.py prepare|mix|inspect|download|html ...`: data.py's command line.

Every argparse table of the chapter lives here, and every message that names a flag the user typed:
the library raises DataError in its own terms, and this layer answers in one line with exit code 2.
`prepare` runs data_at_scale.prepare (the lesson's in-memory engine below 64 MiB of local input, the
streaming engine or Ray above).
"""

from __future__ import annotations

import argparse
import hashlib
import math
import pathlib
import re
import time

import torch

import bpe
import classify
import data
import dedup
from data import (
    CLEANING_CHOICES,
    DEFAULT_VOCAB_SIZE,
    FILTER_CHOICES,
    LINE_DEDUP_CHOICES,
    CleanSettings,
    DataError,
    TokenData,
    html_to_text,
    mixture_plan,
)
from machinery import data_at_scale, formats, store
from machinery.dataset import cache_root, summary
from machinery.formats import open_source
from machinery.cli import Parser, add_commands, in_range, run, writable

SEED_MAX = 2**32 - 1  # numpy's legacy generator and torch agree on seeds in [0, 2^32)
TOKENS_MAX = 1e16  # a token budget beyond any run (the largest public ones are ~4e13)


def _parse_assignments(items: list[str], flag: str, low: float = 0.0) -> dict[str, float]:
    """['web=0.7', 'code=0.3'] -> {'web': 0.7, 'code': 0.3}; each number finite, at least `low` (or
    > 0 without one) and at most TOKENS_MAX."""
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
        if not (
            math.isfinite(number)
            and (number >= low if low else number > 0)
            and number <= TOKENS_MAX
        ):
            raise DataError(
                f"{flag} {item!r}: the number must be {f'>= {low:g}' if low else '> 0'} and <= "
                f"{TOKENS_MAX:g}"
            )
        out[name] = number
    return out


def train_quality_model(positives: list[str], negatives: list[str]) -> str:
    """A quality classifier trained on the documents of these sources, saved in the cache under a
    name made of its training text's hash (so the dataset's cache key follows the text). Returns the
    file's path."""
    texts = {}
    for flag, specs in (("--quality-positives", positives), ("--quality-negatives", negatives)):
        texts[flag] = [d for spec in specs for d in open_source(spec).documents() if d.strip()]
        if not texts[flag]:
            raise DataError(f"{flag} {' '.join(specs)}: no documents; name files that hold text")
    high, low = texts.values()
    # surrogatepass: a .jsonl's lone "\ud800" hashes like any other code point
    digest = hashlib.sha256("\0".join(high + ["\1"] + low).encode("utf-8", "surrogatepass"))
    digest = digest.hexdigest()[:16]
    path = cache_root() / "classify" / f"quality-{digest}.pt"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        model = classify.Classifier.train(
            high + low,
            ["high"] * len(high) + ["low"] * len(low),
            progress=classify.Progress("training the quality model"),
        )
        try:
            model.save(path, fix="point PRETRAIN_CACHE elsewhere")
        except classify.ClassifyError as e:
            raise DataError(f"--quality-positives: {e}") from None
    return str(path)


def _cmd_prepare(args: argparse.Namespace, prepare) -> None:
    # prepare: data_at_scale.prepare, which runs this file's engine or the streaming one
    if bool(args.quality_positives) != bool(args.quality_negatives):
        raise DataError("--quality-positives and --quality-negatives go together; give both")
    model = (
        train_quality_model(args.quality_positives, args.quality_negatives)
        if args.quality_positives
        else args.quality_model
    )
    settings = CleanSettings(
        cleaning=args.cleaning,
        filters=args.filters,
        line_dedup=args.line_dedup,
        near_dup_threshold=args.near_dup_threshold,
        strip_accents=args.strip_accents,
        mask_pii=not args.no_pii,
        boilerplate_min_documents=args.boilerplate_min_documents,
        lang=tuple(args.lang),
        lang_threshold=args.lang_threshold,
        quality_threshold=args.quality_threshold,
        quality_model=model,
    )
    started = time.perf_counter()
    out = prepare(
        args.data,
        args.out,
        vocab_size=args.vocab_size,
        seed=args.seed,
        val_fraction=args.val_fraction,
        weights=args.weights,
        train_tokens=args.train_tokens,
        tokenizer=args.tokenizer,
        tokenizer_train_bytes=int(args.tokenizer_train_mb * 1e6),
        clean_settings=settings,
        text_field=args.text_field,
        txt_split=args.txt_split,
        skip_bad_lines=args.skip_bad_lines,
        max_documents=args.max_documents,
        kind=args.kind,
        threads=args.threads,
        workers=args.workers,
        chunk_mb=args.chunk_mb,
        engine=args.engine,
        ray_address=args.ray_address,
        val_data=args.val_data,
        work_dir=args.work_dir,
        verbose=True,
    )
    print(summary(out))
    # on a cache hit the times above are the first build's: this call's own, said apart
    print(f"this call: {time.perf_counter() - started:.1f}s")


def _cmd_mix(args: argparse.Namespace) -> None:
    weights = _parse_assignments(args.weights, "--weights")
    # a count of tokens: a fraction of one is a typo
    unique = _parse_assignments(args.unique, "--unique", low=1.0)
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
    print(summary(args.dir))
    longest = {split: max(map(len, shards), default=0) for split, shards in data.shards.items()}
    # a window needs x and its y
    split = next((s for s in ("val", "train") if longest.get(s, 0) >= 2), None)
    if split is None:
        print("no split holds two tokens: no window to decode")
        return
    x, _ = data.get_batch(
        split, 1, min(args.tokens, longest[split] - 1), torch.Generator().manual_seed(0)
    )
    note = "" if split == "val" else " (the val split is empty)"
    print(f"a random {split} window{note}, decoded:\n" + data.tokenizer.decode(x[0].tolist()))


def _cmd_html(args: argparse.Namespace) -> None:
    path = pathlib.Path(args.file)
    if not path.is_file():
        raise DataError(f"{path} not found")
    print(html_to_text(formats.read_text(path)))


# prepare's flags: the sources, the split, the tokenizer, the cleaning steps, the engine
PREPARE_FLAGS = [
    (
        "--data",
        {
            "nargs": "+",
            "default": ["pydocs"],
            "help": "sources: pydocs, pystdlib, hf:NAME, files/dirs/globs "
            "(.txt .jsonl .parquet .raw .html .py, .gz), or their URIs in an object store "
            "(s3://bucket/web/*.parquet, gs://, hdfs://, file://)",
        },
    ),
    (
        "--vocab-size",
        {
            "type": in_range(int, 257, 2**32),
            "default": DEFAULT_VOCAB_SIZE,
            "help": "BPE vocabulary (default %(default)s)",
        },
    ),
    (
        "--out",
        {
            "type": writable("dir", elsewhere=store.is_uri),
            "default": None,
            "help": "output directory or object-store URI, e.g. "
            "s3://bucket/datasets/name (default: a cache dir in $PRETRAIN_CACHE or .cache/)",
        },
    ),
    (
        "--seed",
        {
            "type": in_range(int, 0, SEED_MAX),
            "default": 0,
            "help": "seeds the split, the tokenizer sample, mixing and order",
        },
    ),
    (
        "--val-fraction",
        {
            "type": in_range(float, 0.0, 1.0, high_open=True),
            "default": 0.05,
            "help": "documents held out for validation",
        },
    ),
    (
        "--val-data",
        {
            "nargs": "+",
            "default": None,
            "metavar": "PATH",
            "help": "held-out file(s) used verbatim as the val split (replaces "
            "--val-fraction); their 13-gram overlap with train is reported",
        },
    ),
    (
        "--cleaning",
        {
            "choices": CLEANING_CHOICES,
            "default": "auto",
            "help": "auto: the funnel for web-like sources (.jsonl .parquet .html "
            "hf: pydocs pystdlib), local text (.txt .md .raw .py) kept "
            "whole; web: the funnel for every source; keep: none",
        },
    ),
    (
        "--weights",
        {
            "type": in_range(float, 0.0, TOKENS_MAX, low_open=True),
            "nargs": "+",
            "default": None,
            "help": "mixing weight per source, in order",
        },
    ),
    (
        "--train-tokens",
        {
            "type": in_range(float, 1.0, TOKENS_MAX),
            "default": None,
            "help": "train token budget for the mix (e.g. 5e6)",
        },
    ),
    (
        "--tokenizer",
        {"default": None, "help": "reuse this bpe.py tokenizer JSON instead of training one"},
    ),
    # >= 1 byte
    (
        "--tokenizer-train-mb",
        {
            "type": in_range(float, 1e-6, 1e6),
            "default": 4.0,
            "help": "MB of train text the tokenizer trains on (default %(default)s)",
        },
    ),
    (
        "--filters",
        {
            "choices": FILTER_CHOICES,
            "default": "auto",
            "help": "quality rules: auto = Gopher for prose, code rules for code; "
            "gopher-handout = only the Gopher rules of CS336's data handout "
            "(word count, word length, ellipsis lines, alphabetic)",
        },
    ),
    (
        "--line-dedup",
        {
            "choices": LINE_DEDUP_CHOICES,
            "default": "documents",
            "help": "documents: remove boilerplate lines (see "
            "--boilerplate-min-documents); occurrences: remove every "
            "line seen more than once in the corpus (CS336's exact line dedup)",
        },
    ),
    (
        "--near-dup-threshold",
        {
            "type": in_range(float, 0.0, 1.0, high_open=True),
            "default": 0.5,
            "help": "Jaccard threshold; 0 turns near-dedup off",
        },
    ),
    (
        "--boilerplate-min-documents",
        {
            "type": in_range(int, 2),
            "default": 3,
            "help": "a prose line found in this many documents is boilerplate and removed",
        },
    ),
    (
        "--strip-accents",
        {"action": "store_true", "help": "near dedup compares texts without accents"},
    ),
    ("--no-pii", {"action": "store_true", "help": "do not mask emails, phones and IPs"}),
    (
        "--lang",
        {
            "nargs": "+",
            "default": [],
            "metavar": "CODE",
            "help": "keep only documents in these languages (ISO 639-1: en zh ...; classify.py)",
        },
    ),
    ("--lang-threshold", {"type": float, "default": 0.65, "help": "least language score kept"}),
    (
        "--quality-threshold",
        {
            "type": float,
            "default": 0.0,
            "help": "keep documents whose quality-classifier P(high) is at least this (0: off)",
        },
    ),
    ("--quality-model", {"default": "", "help": "a classifier file (default: classify.py's)"}),
    (
        "--quality-positives",
        {
            "nargs": "+",
            "default": [],
            "metavar": "SOURCE",
            "help": "train the quality classifier: reference-like "
            "sources (with --quality-negatives)",
        },
    ),
    (
        "--quality-negatives",
        {"nargs": "+", "default": [], "metavar": "SOURCE", "help": "web-like sources"},
    ),
    ("--text-field", {"default": "text", "help": "the .jsonl/.parquet field holding the text"}),
    (
        "--txt-split",
        {
            "choices": ["auto", "eot", "blank", "file"],
            "default": "auto",
            "help": "how .txt files split into documents (auto: <|endoftext|> if "
            "present, else blank lines; a file kept whole is cut only at <|endoftext|>)",
        },
    ),
    ("--skip-bad-lines", {"action": "store_true", "help": "skip and count malformed .jsonl lines"}),
    (
        "--max-documents",
        {
            "type": in_range(int, 1),
            "default": None,
            "help": "read at most this many documents per source",
        },
    ),
    (
        "--kind",
        {
            "choices": ["prose", "code", "html"],
            "default": None,
            "help": "treat every source as this kind "
            "(default: by name and file type; .py files are code)",
        },
    ),
    (
        "--threads",
        {
            "type": in_range(int, 1, 1024),
            "default": None,
            "help": "encoding threads (default: all cores)",
        },
    ),
    # --workers, --chunk-mb, --engine, --ray-address, --work-dir
    *data_at_scale.ENGINE_FLAGS,
]


# each of prepare's parameters (the library's name) -> its flag: val_data -> --val-data
FLAG_OF = {
    name[2:].replace("-", "_"): name
    for name, _ in PREPARE_FLAGS + list(data_at_scale.ENGINE_FLAGS)
    if name.startswith("--")
}


def main(
    argv: list[str] | None = None, prog: str = "data.py", description: str | None = None
) -> int:
    parser = Parser(
        prog=prog,
        description=description or data.__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    add_commands(
        sub,
        {
            "prepare": (
                "clean, dedup, split, train/reuse the tokenizer, encode and pack shards",
                lambda args: _cmd_prepare(args, data_at_scale.prepare),
                PREPARE_FLAGS,
            ),
            "mix": (
                "tokens and epochs per source for a budget (the lecture's 20e9 at 70/15/10/5)",
                _cmd_mix,
                [
                    ("--tokens", {"type": in_range(float, 1.0, TOKENS_MAX), "default": 20e9}),
                    (
                        "--weights",
                        {
                            "nargs": "+",
                            "default": ["web=0.70", "code=0.15", "books=0.10", "math=0.05"],
                        },
                    ),
                    (
                        "--unique",
                        {
                            "nargs": "*",
                            "default": ["math=0.5e9"],
                            "help": "unique tokens on hand per source",
                        },
                    ),
                ],
            ),
            "inspect": (
                "print a prepared dataset's funnel, sizes and a decoded sample",
                _cmd_inspect,
                [("dir", {}), ("--tokens", {"type": in_range(int, 1, 1_000_000), "default": 64})],
            ),
            "download": (
                "copy a dataset published to an object store down to a local directory",
                lambda args: print(
                    f"downloaded {args.uri} to {data_at_scale.download(args.uri, args.dir)}"
                ),
                [
                    (
                        "uri",
                        {
                            "help": "the dataset's URI, as given to prepare --out "
                            "(s3://bucket/datasets/name)"
                        },
                    ),
                    (
                        "dir",
                        {
                            "type": writable("dir"),
                            "help": "local directory to create (train.py --data reads it)",
                        },
                    ),
                ],
            ),
            "html": ("print the text extracted from an HTML file", _cmd_html, [("file", {})]),
        },
    )

    args = parser.parse_args(argv)
    return run(lambda: _in_flags(args), (DataError, bpe.TokenizerError, dedup.DedupError))


def _in_flags(args: argparse.Namespace) -> None:
    """Run the command; the library's DataError names a parameter (`weights`, val_data; a one-word
    one such as threads at the start or in parentheses), the user typed a flag (--weights,
    --val-data, --threads): say it as the flag."""
    try:
        args.run(args)
    except DataError as e:
        message = str(e)
        for name, flag in FLAG_OF.items():
            message = message.replace(f"`{name}`", flag)
            if "_" in name:  # not inside a path (/tmp/val_data.txt)
                message = re.sub(rf"(?<![\w./-]){name}(?!\w|\.\w)", flag, message)
            elif message.startswith((f"{name} ", f"{name}:")):
                message = flag + message[len(name) :]
            message = message.replace(f"({name})", f"({flag})")
        raise DataError(message) from None
