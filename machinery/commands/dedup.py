"""python dedup.py demo | experiment | run: dedup.py's command line. `demo` prints the lecture's
worked numbers, `experiment` runs the lecture's exercise (planted near-duplicates in WikiText-2,
measured against brute force) and `run` deduplicates corpus files (machinery/dedup_files.py). A
library error is one line, with the flag that fixes it, and exit code 2."""

from __future__ import annotations

import json
import pathlib

import numpy as np

import dedup
from dedup import DedupError
from machinery import dedup_experiment, dedup_files
from machinery.cli import Parser, add_commands, in_range, run, writable

DEFAULT_WIKITEXT = (
    pathlib.Path(__file__).resolve().parents[3]
    / "shared"
    / "data"
    / "wikitext-2-raw"
    / "wiki.valid.raw"
)


def demo() -> str:
    """The lecture's worked numbers, computed (not typed in)."""
    a_text, b_text = "the cat sat on the mat today", "the cat sat on the rug today"
    a, b = dedup.shingles(a_text), dedup.shingles(b_text)
    hasher = dedup.MinHasher(128, seed=0)
    sig = hasher.signatures([a, b])
    agree = int(np.sum(sig[0] == sig[1]))
    j = dedup.jaccard(a, b)
    out = [
        f"A = {a_text!r}",
        f"B = {b_text!r}",
        f"shared shingles: {sorted(a & b)}",
        f"Jaccard(A, B) = {len(a & b)}/{len(a | b)} = {j:.2f}",
        f"'a b c d e f' vs 'a b c x e f': Jaccard = "
        f"{dedup.jaccard(dedup.shingles('a b c d e f'), dedup.shingles('a b c x e f')):.2f} "
        f"(1/7: one word touches 3 shingles)",
        f"MinHash k=128: {agree} of 128 positions agree -> estimate {agree / 128:.2f} "
        f"(true {j:.2f}; standard error sqrt(J(1-J)/k) = {dedup.standard_error(j, 128):.3f} "
        f"at J={j:.2f}, k=128)",
        "",
        "P(candidate) = 1 - (1 - J^r)^b:",
        "| J | 32 x 4 | 16 x 8 |",
        "|---|---|---|",
    ]
    for jj in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9):
        out.append(
            f"| {jj:.1f} | {dedup.candidate_probability(jj, 32, 4):.2f} "
            f"| {dedup.candidate_probability(jj, 16, 8):.2f} |"
        )
    out += [
        "",
        f"threshold (1/b)^(1/r): 32 x 4 -> {dedup.lsh_threshold(32, 4):.2f}, "
        f"16 x 8 -> {dedup.lsh_threshold(16, 8):.2f}",
        "chosen for threshold 0.5, k=128: bands x rows = %d x %d"
        % dedup.choose_bands_rows(0.5, 128),
    ]
    return "\n".join(out)


def wikitext_paragraphs(lines, count: int = 500, min_words: int = 100) -> list[str]:
    """The first `count` paragraphs (lines) with at least `min_words` words that are not
    headings (" = ... = ")."""
    paragraphs = []
    for line in lines:
        line = line.strip()
        if line and not line.startswith("=") and len(dedup.normalized_words(line)) >= min_words:
            paragraphs.append(line)
            if len(paragraphs) == count:
                break
    return paragraphs


def load_wikitext(source: str, count: int = 500, min_words: int = 100) -> list[str]:
    """Paragraphs from a raw WikiText file, or from Hugging Face's wikitext-2-raw-v1 train split
    when source == "hf" (needs the `datasets` package and a network)."""
    if str(source) == "hf":
        try:
            import datasets
        except ImportError:
            raise DedupError(
                f"WikiText-2 is read from {DEFAULT_WIKITEXT} (not here) or from Hugging Face, "
                "which needs the `datasets` package (pip install datasets) and a network: install "
                "it or pass --data PATH to a raw WikiText file"
            ) from None
        try:
            lines = datasets.load_dataset(
                "Salesforce/wikitext", "wikitext-2-raw-v1", split="train"
            )["text"]
        # network or hub failure: one line, not the hub's traceback
        except Exception as error:
            raise DedupError(
                f"WikiText-2 is read from {DEFAULT_WIKITEXT} (not here) or downloaded from Hugging "
                f"Face, which failed ({type(error).__name__}): pass --data PATH to a raw WikiText "
                f"file"
            ) from None
    else:
        lines = dedup_files.read_text(source).split("\n")
    paragraphs = wikitext_paragraphs(lines, count, min_words)
    if len(paragraphs) < count:
        raise DedupError(
            f"{source} has only {len(paragraphs)} paragraphs of {min_words}+ words, need {count}: "
            "use a larger raw WikiText file (e.g. wiki.valid.raw)"
        )
    return paragraphs


def experiment_table(result: dict) -> str:
    """The experiment's Markdown table (one row per setting), then a line on the data it ran on."""
    lines = [
        f"| k | bands x rows | LSH threshold | P(cand. at J={result['threshold']}) "
        "| MAE (J > 0.1) | recall | false positives | pairs compared | vs brute force | time (s) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in result["settings"]:
        lines.append(
            f"| {s['num_perm']} | {s['bands']} x {s['rows']} | {s['lsh_threshold']:.2f} "
            f"| {s['p_candidate_at_threshold']:.2f} | {s['mae_jaccard_above_0.1']:.4f} "
            f"| {s['recall']:.2f} | {s['false_positives']} | {s['pairs_compared']:,} "
            f"| {100 * s['fraction_of_brute_force']:.2f}% | {s['seconds']:.2f} |"
        )
    brute = result["brute_force"]
    lines.append(
        f"| brute force | all pairs | | | exact | | | {brute['pairs']:,} | 100% "
        f"| {brute['seconds']:.2f} |"
    )
    lines.append(
        f"\n{result['documents']} documents, {result['planted_pairs']} planted pairs "
        f"(exact Jaccard {result['planted_jaccard']['min']:.2f}.."
        f"{result['planted_jaccard']['max']:.2f}); "
        f"{brute['pairs_jaccard_above_0.1']} pairs with J > 0.1; verify = {result['verify']}"
    )
    return "\n".join(lines)


SEED_MAX = 2**32 - 1  # the seeds every CLI of the project accepts: [0, 2^32)


def _parse_settings(text: str) -> list[tuple[int, int, int]]:
    try:
        settings = [
            tuple(int(v) for v in item.split(":")) for item in text.split(",") if item.strip()
        ]
    except ValueError:
        settings = []
    if not settings or any(len(s) != 3 for s in settings):
        raise DedupError(
            f"--settings must look like 128:32:4,128:16:8 (k:bands:rows), got {text!r}"
        )
    for k, bands, rows in settings:  # fail before any data is read
        try:
            dedup.resolve_bands_rows(0.5, k, bands, rows)
        except DedupError as e:
            raise DedupError(f"--settings {k}:{bands}:{rows}: {e}") from None
    return settings


def _cmd_experiment(args) -> None:
    settings = _parse_settings(args.settings)
    paragraphs = load_wikitext(args.data)
    documents, planted = dedup_experiment.plant_near_duplicates(paragraphs, seed=args.seed)
    result = dedup_experiment.run_experiment(
        documents, planted, settings, args.threshold, seed=args.seed, verify=args.verify
    )
    result["data"] = str(args.data)
    print(experiment_table(result))
    dedup_files.write_atomic(args.out, json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


def _cmd_run(args) -> None:
    try:  # fail before any data is read
        dedup.resolve_bands_rows(args.threshold, args.num_perm, args.bands, args.rows)
    except DedupError as e:
        raise DedupError(
            f"--num-perm {args.num_perm} --bands {args.bands} --rows {args.rows}: {e}"
        ) from None
    try:
        report = dedup_files.dedup_files(
            args.input,
            args.out,
            args.threshold,
            args.num_perm,
            args.bands,
            args.rows,
            args.n,
            args.seed,
            args.verify,
            args.text_field,
            args.split,
            args.strip_accents,
            fix="give --out a path on another disk",
        )
    except dedup_files.OptionError as e:
        raise DedupError(f"{e.problem}: {OPTION_FIXES[e.option]}") from None
    print(
        f"{report['documents']} documents, {report['clusters']} clusters, "
        f"removed {report['removed']}, "
        f"kept {report['kept']} -> {args.out} ({report['seconds']:.2f} s)"
    )


# what the command line says where dedup_files names a keyword argument
OPTION_FIXES = {"text_field": "pass --text-field NAME", "split": "check the files and --split"}


def main(argv=None) -> int:
    parser = Parser(
        prog="dedup.py",
        description="Near-duplicate detection with MinHash + LSH (see dedup.py's docstring).",
    )
    # the flags `experiment` and `run` share, after each one's own
    shared = [
        (
            "--threshold",
            {"type": in_range(float, 0.0, 1.0, low_open=True, high_open=True), "default": 0.5},
        ),
        ("--seed", {"type": in_range(int, 0, SEED_MAX), "default": 0}),
    ]
    add_commands(
        parser.add_subparsers(dest="command", required=True, parser_class=Parser),
        {
            "demo": ("print the lecture's worked numbers", lambda args: print(demo()), []),
            "experiment": (
                "the lecture's exercise: planted near-duplicates in WikiText-2",
                _cmd_experiment,
                [
                    (
                        "--data",
                        {
                            "default": str(DEFAULT_WIKITEXT)
                            if DEFAULT_WIKITEXT.is_file()
                            else "hf",
                            "help": "raw WikiText file, or 'hf' for the Hugging Face train split "
                            "(default: %(default)s)",
                        },
                    ),
                    (
                        "--settings",
                        {
                            "default": ",".join(
                                ":".join(map(str, s)) for s in dedup_experiment.DEFAULT_SETTINGS
                            ),
                            "help": "k:bands:rows,... (default: %(default)s)",
                        },
                    ),
                    (
                        "--verify",
                        {
                            "choices": ("estimate", "exact"),
                            "default": "estimate",
                            "help": "how candidates are confirmed (default: the MinHash estimate)",
                        },
                    ),
                    (
                        "--out",
                        {
                            "type": writable("file"),
                            "default": "out/dedup_experiment.json",
                            "help": "JSON results (default: %(default)s)",
                        },
                    ),
                    *shared,
                ],
            ),
            "run": (
                "deduplicate corpus files",
                _cmd_run,
                [
                    (
                        "--input",
                        {
                            "nargs": "+",
                            "required": True,
                            "help": ".jsonl (one object per line) or text files",
                        },
                    ),
                    (
                        "--out",
                        {
                            "type": writable("file"),
                            "required": True,
                            "help": "output file (.jsonl or text)",
                        },
                    ),
                    *[
                        (flag, {"type": in_range(int, 1, dedup.MAX_NUM_PERM), "default": default})
                        for flag, default in (
                            ("--num-perm", 128),
                            ("--bands", None),
                            ("--rows", None),
                        )
                    ],
                    (
                        "--n",
                        {
                            "type": in_range(int, 1, 100),
                            "default": 3,
                            "help": "words per shingle (default: %(default)s)",
                        },
                    ),
                    ("--verify", {"choices": ("exact", "estimate"), "default": "exact"}),
                    (
                        "--text-field",
                        {
                            "default": "text",
                            "help": "jsonl field holding the text (default: %(default)s)",
                        },
                    ),
                    (
                        "--split",
                        {
                            "choices": ("auto", "line", "blank"),
                            "default": "auto",
                            "help": "text files: one document per line, or blank-line separated "
                            "(default: %(default)s)",
                        },
                    ),
                    (
                        "--strip-accents",
                        {
                            "action": "store_true",
                            "help": "compare texts without their accents (NFD, combining "
                            "marks dropped): café = cafe",
                        },
                    ),
                    *shared,
                ],
            ),
        },
    )
    args = parser.parse_args(argv)
    # a DedupError, or an OSError (unreadable input, full disk): one line, exit code 2 (SystemExit,
    # as a script); success returns 0, so a caller in this process goes on
    if run(lambda: args.run(args), (DedupError, OSError)):
        raise SystemExit(2)
    return 0
