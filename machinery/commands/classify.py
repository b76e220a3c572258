"""python classify.py score {language,quality} TEXT... [--model FILE] [--top K]: what a classifier
says of each text (the shipped one, or one trained with train).
python classify.py train {language,quality} [--out DIR] [--positives FILE...] [--negatives ...]:
train one of classify.py's classifiers into DIR/TASK.pt. classify.py's errors come back as one line
naming the flag that fixes them, exit code 2."""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import classify
from machinery import classify_corpora, fileio
from machinery.cli import Parser, writable


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = Parser(
        prog="classify.py",
        description="Train the language or quality classifier (the models that ship in "
        "classifiers/ are read by data.py's --lang and --quality-threshold).",
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    score = commands.add_parser(
        "score",
        help="score texts with a classifier",
        description="Print each text's most likely labels and their probabilities, by the shipped "
        "classifier (classifiers/TASK.pt) or --model FILE.",
    )
    score.add_argument("task", choices=("language", "quality"))
    score.add_argument("texts", nargs="+", metavar="TEXT", help="the texts to score")
    score.add_argument(
        "--model", help="a classifier file written by train (default: the shipped one)"
    )
    score.add_argument("--top", type=int, default=1, help="labels to print per text (default: 1)")
    train = commands.add_parser(
        "train",
        help="train a classifier into --out",
        description="Train a classifier and write it to OUT/TASK.pt (atomically). The shipped ones "
        "are rewritten only by --out classifiers.",
    )
    train.add_argument("task", choices=("language", "quality"))
    train.add_argument(
        "--out",
        default="out/classifiers",
        type=writable("dir"),
        help="folder to write TASK.pt into (default: out/classifiers; "
        "classifiers rewrites the shipped model)",
    )
    for flag, side, default in (
        ("--positives", "high (reference prose)", classify_corpora.QUALITY_POSITIVES),
        ("--negatives", "low (web crawl)", classify_corpora.QUALITY_NEGATIVES),
    ):
        train.add_argument(
            flag,
            nargs="+",
            default=[],
            metavar="FILE",
            help=f"quality: {side} documents, .jsonl (text field), a WikiExtractor dump or "
            f"blank-line-separated text (default: ../shared/data/{' and '.join(default)})",
        )
    return parser.parse_args(argv)


def train(args: argparse.Namespace) -> tuple[classify.Classifier, int]:
    """Train the model args.task names on its corpus and save it into args.out (made first, before
    the minutes of training; removed again if training fails). -> (model, documents)."""
    out = pathlib.Path(args.out)
    if args.task == "language" and (args.positives or args.negatives):
        raise classify.ClassifyError(
            "--positives and --negatives train the quality model; drop them or train quality"
        )
    created = fileio.missing_folders(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise classify.ClassifyError(
            f"--out {out}: cannot make the folder ({e.strerror})"
        ) from None
    try:
        if args.task == "language":
            texts, labels = classify_corpora.language_corpus("train")
        else:
            texts, labels = classify_corpora.quality_corpus(
                tuple(args.positives), tuple(args.negatives)
            )
        progress = classify.Progress(f"training {args.task}")
        model = classify.Classifier.train(texts, labels, progress=progress)
        model.save(out / f"{args.task}.pt", fix="choose another --out")
    except classify_corpora.SideError as e:
        fileio.remove_if_empty(created)
        flags = " and ".join(f"--{side}" for side in e.sides)
        raise classify.ClassifyError(f"{flags}: {e.problem}; {e.fix}") from None
    except BaseException:
        fileio.remove_if_empty(created)
        raise
    return model, len(texts)


def score(args: argparse.Namespace) -> list[str]:
    """One line per text: its args.top most likely labels with their probabilities, then the text.

    >>> text = "Das Wetter ist heute schön, also gehen wir im Park spazieren."
    >>> score(argparse.Namespace(task="language", model=None, top=1, texts=[text]))[0][:8]
    'de 0.95 '
    """
    if args.top < 1:
        raise classify.ClassifyError(f"--top {args.top}: give 1 or more labels to print")
    labels = classify.QUALITY_LABELS if args.task == "quality" else ()
    model = classify.default_model(args.task)
    if args.model:
        model = classify.Classifier.load(args.model, labels)
    lines = []
    for text in args.texts:
        probabilities = model.probabilities(text)
        best = probabilities.argsort()[::-1][: args.top]
        said = "  ".join(f"{model.labels[i]} {probabilities[i]:.2f}" for i in best)
        lines.append(f"{said}  {text}")
    return lines


def main(argv: list[str] | None = None) -> int:
    """python classify.py score|train ...: score texts with a classifier, or train one into DIR."""
    args = parse_args(argv)
    if args.command == "score":
        try:
            print("\n".join(score(args)))
        except classify.ClassifyError as e:
            print(f"classify.py: error: {e}", file=sys.stderr)
            return 2
        return 0
    start = time.perf_counter()
    try:
        model, documents = train(args)
    except (classify.ClassifyError, classify_corpora.CatalogError) as e:
        print(f"classify.py: error: {e}", file=sys.stderr)
        return 2
    print(
        f"{pathlib.Path(args.out) / f'{args.task}.pt'}: {len(model.labels)} labels, "
        f"{documents:,} documents, trained in {time.perf_counter() - start:.1f} s"
    )
    return 0
