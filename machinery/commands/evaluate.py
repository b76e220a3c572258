"""`python evaluate.py ...`: evaluate.py's command line. Every argparse table, every message that
names a flag, and what the commands read and write around the lessons: checkpoints (a run
directory, a sweep's directory of runs), held-out text (a prepared dataset's split, any source
data.py reads), task files, and the JSON, jsonl, Markdown and PNG files written whole.

    python evaluate.py --ckpt out/                         loss, perplexity, bits/byte, last word
    python evaluate.py --ckpt out/ --data wiki.test.raw    the same on any text (--tasks FILE.jsonl)
    python evaluate.py bpb                                 the lecture's 1.04 vs 1.43 example
    python evaluate.py emergence [--ckpt RUN ...]          the p^k table; a sweep's plot
    python evaluate.py contamination --train T --eval E    13-gram overlap per document (--drop OUT)
    python evaluate.py compare --ckpt A --ckpt B --data F  two tokenizers, one text, bits-per-byte
    python evaluate.py sample --ckpt out/ --prompt "def"   streaming generation (--top-k, ...)
    python evaluate.py recall                              MQAR: attention vs linear vs hybrid

Depends on evaluate.py, train.py (load_checkpoint, list_checkpoints), data.py (TokenData,
open_source), machinery/devices.py (resolve_device), machinery's cli, fileio, eval_report and
recall_report.
"""

from __future__ import annotations

import argparse
import itertools
import json
import pathlib
import tempfile

import numpy as np

import evaluate
from evaluate import EvalError, HeldOut, Task
from machinery import checkpoints, devices, eval_report, fileio, formats, recall_report
from machinery.cli import Parser, in_range, writable
from machinery.cli import run as run_cli

# --max-tasks: each task decodes its answer token by token; 1,000,000 would take hours
MAX_TASKS = 10_000


# --------------------------------------------------------------------------------------------------
# What the flags name: task files, held-out text, documents, checkpoints
# --------------------------------------------------------------------------------------------------


def _jsonl_objects(path: pathlib.Path):
    """(line number, parsed object) for each non-blank line of a jsonl file; a line that is not JSON
    is an EvalError naming its number."""
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            # fileio: bad syntax, bad UTF-8 and JSON nested thousands deep are one line
            if line.strip():
                yield (
                    number,
                    fileio.parse_json(
                        line,
                        f"{path} line {number}",
                        EvalError,
                        "each line must be one JSON object",
                    ),
                )


def read_tasks(path, limit: int = MAX_TASKS) -> list[Task]:
    """A jsonl task file: one {"prompt": "...", "answer": "..."} object per line (blank lines
    skipped). A malformed line is reported with its number; a file of more than `limit` tasks is
    refused (--max-tasks)."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise EvalError(
            f"--tasks {path} {'is a directory' if path.is_dir() else 'not found'}: "
            f'give a jsonl file of {{"prompt": ..., "answer": ...}} lines'
        )
    tasks = []
    try:
        for number, item in _jsonl_objects(path):
            if not (
                isinstance(item, dict)
                and isinstance(item.get("prompt"), str)
                and isinstance(item.get("answer"), str)
                and item["answer"].strip()
            ):
                raise EvalError(
                    f'{path} line {number}: needs string fields "prompt" and a non-empty "answer"'
                )
            tasks.append(Task(item["prompt"], item["answer"]))
            if len(tasks) > limit:
                raise EvalError(
                    f"{path} holds more than {limit:,} tasks (--max-tasks), hours of "
                    f"decoding; raise --max-tasks or score a sample of the file"
                )
    except EvalError as e:
        raise EvalError(f"--tasks {e}") from None
    if not tasks:
        raise EvalError(
            f'task file {path} has no tasks: add jsonl lines {{"prompt": ..., "answer": ...}}'
        )
    return tasks


def decode_documents(shards, eot_id: int | None, tokenizer):
    """Yield the text of each document packed in token shards (data.py puts <|endoftext|> before
    every document; a document may continue from one shard into the next). Reads one document at a
    time from the memory map."""
    carry: list[int] = []
    for shard in shards:
        cuts = (
            np.flatnonzero(np.asarray(shard) == eot_id)
            if eot_id is not None
            else np.zeros(0, np.int64)
        )
        starts, ends = np.concatenate([[0], cuts + 1]), np.concatenate([cuts, [len(shard)]])
        for i, (a, b) in enumerate(zip(starts.tolist(), ends.tolist())):
            piece = (carry if i == 0 else []) + shard[a:b].tolist()
            if i == len(starts) - 1:
                carry = piece  # the shard's last document may go on in the next shard
            elif piece:
                yield tokenizer.decode(piece)
    if carry:
        yield tokenizer.decode(carry)


def _data_error_types():
    import data as data_lib

    return data_lib, (data_lib.DataError, OSError, KeyError, ValueError)


def open_split(data_dir, split: str):
    """(data.TokenData, its shards of `split`) with data.py's errors turned into one line."""
    data_lib, errors = _data_error_types()
    try:
        data = data_lib.TokenData(data_dir)
        data.tokenizer  # a damaged tokenizer.json fails here, not halfway through
    except errors as e:
        raise EvalError(f"cannot read the dataset {data_dir}: {e}") from e
    if split not in data.shards:
        raise EvalError(f"{data_dir} has no {split!r} split; evaluate another text with --data")
    return data, data.shards[split]


def held_out_from_data_dir(
    data_dir, tokenizer, tokenizer_json: str | None = None, split: str = "val"
) -> HeldOut:
    """The held-out split of a prepared dataset directory (data.py's shards). Its ids are used as
    they are when the dataset was tokenized by this tokenizer; otherwise its text is decoded and
    re-tokenized."""
    data, shards = open_split(data_dir, split)
    ids = (
        np.concatenate([np.asarray(s, dtype=np.int64) for s in shards])
        if shards
        else np.zeros(0, np.int64)
    )
    if len(ids) < 2:
        raise EvalError(
            f"the {split} split of {data_dir} is empty: prepare the data with a validation split"
        )
    documents = [d for d in decode_documents(shards, data.eot_id, data.tokenizer) if d]
    if tokenizer_json is None or tokenizer_json != data.tokenizer.to_json():
        return evaluate.held_out_from_documents(
            f"{data_dir} ({split}, re-tokenized)", documents, tokenizer
        )
    return HeldOut(
        f"{data_dir} ({split})", ids, int(data.manifest["splits"][split]["bytes"]), documents
    )


def held_out_from_source(spec: str, tokenizer, tokenizer_json: str | None = None) -> HeldOut:
    """--data: a prepared dataset directory (its val split), or anything data.py reads (a
    .txt/.raw/.jsonl file, a directory of them, pydocs, pystdlib), read as documents and tokenized
    with the model's tokenizer."""
    path = pathlib.Path(spec)
    if (path / "manifest.json").is_file():
        return held_out_from_data_dir(path, tokenizer, tokenizer_json)
    data_lib, errors = _data_error_types()
    try:
        documents = list(formats.open_source(spec).documents())
    except errors as e:
        raise EvalError(f"cannot read --data {spec}: {e}") from e
    return evaluate.held_out_from_documents(spec, documents, tokenizer)


def checkpoint_held_out(ckpt: dict, tokenizer, data: str | None) -> HeldOut:
    """--data if given, else the validation split the checkpoint was trained beside."""
    if data:
        return held_out_from_source(data, tokenizer, ckpt.get("tokenizer_json"))
    data_dir = ckpt.get("data_dir")
    if not data_dir or not (pathlib.Path(data_dir) / "manifest.json").is_file():
        raise EvalError(
            f"the checkpoint's dataset {data_dir!r} is not on this machine: "
            "pass --data TEXT_OR_DATA_DIR"
        )
    return held_out_from_data_dir(data_dir, tokenizer, ckpt.get("tokenizer_json"))


def split_paragraphs(text: str) -> list[str]:
    """Paragraphs are separated by blank (or whitespace-only) lines.
    "a\\nb\\n \\nc" -> ["a\\nb", "c"]"""
    # runs of consecutive lines, each run all blank or all non-blank: (non_blank, its lines)
    runs = itertools.groupby(text.splitlines(), key=lambda line: bool(line.strip()))
    return ["\n".join(lines) for non_blank, lines in runs if non_blank]


def read_documents(spec: str, split: str):
    """Documents for the contamination check, yielded one at a time (a training corpus is never held
    in memory by this function): a prepared dataset directory (decoded from its token shards, the
    given split), a .txt/.raw file split into paragraphs, a .jsonl file (its "text", or "prompt" +
    "answer"), or anything data.py reads (a directory of files, pydocs, pystdlib)."""
    path = pathlib.Path(spec)
    if (path / "manifest.json").is_file():
        data, shards = open_split(path, split)
        yield from decode_documents(shards, data.eot_id, data.tokenizer)
    elif path.is_file() and path.suffix == ".jsonl":
        for number, item in _jsonl_objects(path):
            try:
                yield item["text"] if "text" in item else item["prompt"] + item["answer"]
            except (KeyError, TypeError):
                raise EvalError(
                    f"{path} line {number}: "
                    'expected a JSON object with "text" (or "prompt" and "answer")'
                ) from None
    elif path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise EvalError(
                f"{path} is not UTF-8 text ({e.reason} at byte {e.start}): give a text file"
            ) from e
        yield from split_paragraphs(text)
    else:
        data_lib, errors = _data_error_types()
        try:
            yield from formats.open_source(spec).documents()
        except errors as e:
            raise EvalError(f"cannot read {spec}: {e}") from e


def resolve_device(name: str = "auto"):
    """--device: "auto" is the GPU when there is one, else the CPU; model.py's one check of a
    device, as an EvalError naming the flag.

    >>> resolve_device("meta")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    evaluate.EvalError: --device meta: ...
    """

    try:
        return devices.resolve_device(name, EvalError)
    except EvalError as e:
        # model.py names the setting `device`; the user typed the flag
        raise EvalError(str(e).replace("`device`", "--device")) from None


def load_model(path, device):
    """evaluate.load_model with the run's sha256 checked, a missing --ckpt told by its flag."""
    try:
        return evaluate.load_model(path, device, verify=checkpoints.verify_checksum)
    except EvalError as e:
        if pathlib.Path(path).exists():
            raise
        raise EvalError(f"{e} or pass --ckpt FILE_OR_RUN_DIR") from None


def expand_runs(paths: list) -> list:
    """A directory holding run directories (a sweep's output) stands for each run in it that has a
    checkpoint."""
    import train

    runs = []
    for path in map(pathlib.Path, paths):
        if path.is_dir() and not train.list_checkpoints(path):
            runs += sorted(d for d in path.iterdir() if d.is_dir() and train.list_checkpoints(d))
        else:
            runs.append(path)
    return runs


def load_each(paths: list, device):
    """(model, tokenizer, checkpoint dict) per path, each loaded when its turn comes."""
    return (load_model(path, device) for path in paths)


# --------------------------------------------------------------------------------------------------
# Files written whole (fileio.write_atomic: temp file, rename, the umask's modes)
# --------------------------------------------------------------------------------------------------


def write_json(obj, path) -> pathlib.Path:
    """Write JSON whole (fileio.write_atomic: temp file, rename, the umask's modes); failures are
    one EvalError."""
    return write_whole(path, json.dumps(obj, indent=1) + "\n", "--json")


def write_whole(path, content, flag: str) -> pathlib.Path:
    """fileio.write_atomic of `content` (text, bytes, or a function given the open file) to `path`,
    its folder made first; a failure is one EvalError naming `flag`, the output's flag."""
    path = pathlib.Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return fileio.write_atomic(
            path, content, error=EvalError, fix=f"choose another {flag} path"
        )
    except OSError as e:
        raise EvalError(f"cannot write {path} ({e.strerror}): choose another {flag} path") from e


def save_figure(fig, png_path, flag: str) -> pathlib.Path:
    """Write a matplotlib Figure as a PNG whole (write_whole: temp file, rename). A Figure made
    without pyplot draws with the Agg renderer and is freed like any object: nothing to close."""
    fig.tight_layout()
    return write_whole(png_path, lambda f: fig.savefig(f, format="png", dpi=110), flag)


def write_kept(documents: list[str], report: dict, out_path) -> pathlib.Path:
    """--drop: the evaluation documents that are not contaminated, as jsonl {"text": ...} (atomic
    write)."""
    kept = [doc for doc, row in zip(documents, report["documents"]) if not row["contaminated"]]
    return write_whole(
        out_path,
        "".join(json.dumps({"text": doc}, ensure_ascii=False) + "\n" for doc in kept),
        "--drop",
    )


# --------------------------------------------------------------------------------------------------
# The command line
# --------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    count, seed, out_file = in_range(int, 1), in_range(int, 0, 2**32 - 1), writable("file")
    # --device, the same for the default command and every subcommand that loads a model
    device = argparse.ArgumentParser(add_help=False)
    device.add_argument(
        "--device", default="auto", help="auto (GPU if any), cpu, cuda, cuda:1, ..."
    )
    parser = Parser(
        prog="evaluate.py",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[device],
        description="Evaluate a checkpoint: held-out loss, perplexity, bits-per-byte, exact match; "
        "the emergence lesson; contamination; tokenizer-fair comparison; sampling.",
        epilog="examples:\n  python evaluate.py --ckpt out/\n  python evaluate.py emergence\n"
        "  python evaluate.py contamination --train wiki.valid.raw --eval wiki.test.raw\n"
        "  python evaluate.py sample --ckpt out/ --prompt 'def '",
    )
    parser.add_argument(
        "--ckpt",
        default="out",
        help="checkpoint file or run directory (newest checkpoint); default out/",
    )
    parser.add_argument(
        "--data",
        help="evaluation text: a data dir (val split), a .txt/.raw/"
        ".jsonl file, pydocs, ...; default: the checkpoint's validation split",
    )
    parser.add_argument(
        "--stride", type=count, help="sliding-window stride in tokens (default block_size / 2)"
    )
    parser.add_argument("--max-tokens", type=count, help="score only the first N held-out tokens")
    parser.add_argument(
        "--tasks", help='jsonl task file of {"prompt": ..., "answer": ...} for exact match'
    )
    parser.add_argument(
        "--max-tasks",
        type=count,
        default=MAX_TASKS,
        help="refuse a --tasks file of more tasks (default %(default)s; a progress line every 500)",
    )
    parser.add_argument(
        "--last-word-items", type=count, default=200, help="items of the built-in last-word task"
    )
    parser.add_argument(
        "--min-words", type=count, default=20, help="shortest paragraph for the last-word task"
    )
    parser.add_argument("--seed", type=seed, default=0, help="seed for drawing last-word items")
    parser.add_argument(
        "--json",
        type=out_file,
        help="write the results here (default: eval_STEP.json beside the checkpoint)",
    )
    sub = parser.add_subparsers(
        dest="command",
        metavar="{bpb,emergence,contamination,compare,recall,sample}",
        parser_class=Parser,
    )

    p = sub.add_parser("bpb", help="the lecture's bits-per-byte example (or your own numbers)")
    p.add_argument("--bytes", type=count, default=1000)
    p.add_argument("--tokens", type=count, nargs="+", default=[250, 400])
    p.add_argument(
        "--ppl",
        type=in_range(float, 1.0, 1e30),
        nargs="+",
        default=[18, 12],
        help="perplexity per --tokens entry (>= 1: e^loss with loss >= 0)",
    )

    p = sub.add_parser(
        "emergence",
        parents=[device],
        help="the p -> p^k table; with --ckpt ... the plot from a sweep's checkpoints",
    )
    p.add_argument(
        "--ckpt",
        action="append",
        default=[],
        help="a sweep checkpoint or run directory (repeat), or a directory of run directories",
    )
    p.add_argument(
        "--k", type=in_range(int, 1, 1000), default=5, help="steps that must all be right"
    )
    p.add_argument(
        "--data", help="held-out text for all models (default: the first checkpoint's val split)"
    )
    p.add_argument("--max-tokens", type=count, default=20000)
    p.add_argument(
        "--plot",
        type=out_file,
        default=None,
        help="PNG path for the plot (with --ckpt; default emergence.png)",
    )
    p.add_argument("--json", type=out_file, help="write the sweep's numbers here")

    p = sub.add_parser(
        "contamination", help="13-gram overlap of evaluation documents with a training corpus"
    )
    p.add_argument(
        "--train",
        required=True,
        nargs="+",
        help="training corpus: data dir (its train split, decoded from the token "
        "shards), text/jsonl file(s), pystdlib",
    )
    p.add_argument(
        "--eval",
        required=True,
        help="evaluation documents: data dir (its val split), .txt/.raw (one document "
        "per paragraph), .jsonl (text, or prompt + answer)",
    )
    p.add_argument(
        "--n", type=in_range(int, 1, 1000), default=13, help="n-gram length in words (default 13)"
    )
    p.add_argument(
        "--min-overlap",
        type=count,
        default=1,
        help="shared n-grams that flag a document (default 1)",
    )
    p.add_argument(
        "--show", type=in_range(int, 0), default=10, help="how many flagged documents to list"
    )
    p.add_argument(
        "--index",
        choices=("hashed", "set"),
        default="hashed",
        help="hashed: sorted uint64 n-gram hashes in numpy (default); "
        "set: Python set of word tuples",
    )
    p.add_argument(
        "--drop", type=out_file, help="write the uncontaminated evaluation documents here (jsonl)"
    )
    p.add_argument("--json", type=out_file, help="write the full per-document report here")

    p = sub.add_parser(
        "compare",
        parents=[device],
        help="two checkpoints with different tokenizers on one text, by bits-per-byte",
    )
    p.add_argument(
        "--ckpt", action="append", default=[], required=True, help="a checkpoint (give two or more)"
    )
    p.add_argument("--data", help="the text (default: the first checkpoint's held-out documents)")
    p.add_argument("--stride", type=count)
    p.add_argument("--max-documents", type=count, help="use only the first N documents")
    p.add_argument("--json", type=out_file)

    p = sub.add_parser("recall", help="MQAR: attention / linear / hybrid models, recall vs pairs")
    p.add_argument(
        "--pairs",
        type=in_range(int, 1, evaluate.RECALL_VOCAB // 2),
        nargs="+",
        default=[2, 4, 8],
        help="key-value pair counts (sequence length 4 x pairs)",
    )
    p.add_argument("--seeds", type=in_range(int, 1, 100), default=3)
    p.add_argument(
        "--steps",
        type=in_range(int, 1, 1_000_000),
        default=evaluate.RECALL_STEPS,
        help="training steps per model",
    )
    p.add_argument(
        "--lr",
        type=in_range(float, 0.0, 1.0, low_open=True),
        nargs="+",
        default=list(evaluate.RECALL_LRS),
        help="learning rates swept per kind on seed 0 (the best one trains the rest)",
    )
    p.add_argument(
        "--width",
        type=in_range(int, 4, 1024),
        default=evaluate.RECALL_WIDTH,
        help="n_embd, in evaluate.RECALL_HEADS heads",
    )
    p.add_argument(
        "--workers",
        type=in_range(int, 1, 256),
        help="processes training models at once (default: one per model)",
    )
    # a 4-layer attention model at width 1,024 holds 64 KiB of KV cache a token: 2**20 tokens
    # are 64 GiB, so the bound stays far below what the prompt's forward would allocate
    p.add_argument(
        "--contexts",
        type=in_range(int, 1, 65_536),
        nargs="+",
        default=[256, 2048, 16_384],
        help="prompt lengths at which decoding is timed",
    )
    p.add_argument(
        "--out",
        type=writable("dir"),
        help="where REPORT.md, recall.png, recall.json go (default: a fresh folder "
        "in the system's temporary folder; docs/recall holds the committed run)",
    )

    p = sub.add_parser(
        "sample", parents=[device], help="generate from a checkpoint, streaming to stdout"
    )
    p.add_argument("--ckpt", default="out")
    p.add_argument("--prompt", default="")
    p.add_argument("--max-new-tokens", type=in_range(int, 0, 1_000_000), default=200)
    p.add_argument(
        "--temperature", type=in_range(float, 0.0, 100.0), default=0.8, help="0 = greedy"
    )
    p.add_argument("--top-k", type=in_range(int, 0), default=50, help="0 = all tokens")
    p.add_argument("--seed", type=seed, default=0)
    return parser


def checkpoint(args) -> dict:
    """The default command: a checkpoint's held-out scores and exact match (evaluate_checkpoint),
    its table printed; the JSON goes to --json, else eval_STEP.json beside the checkpoint."""
    # a bad task file fails before any work
    tasks = read_tasks(args.tasks, args.max_tasks) if args.tasks else None
    model, tokenizer, ckpt = load_model(args.ckpt, args.device)
    held = checkpoint_held_out(ckpt, tokenizer, args.data)
    try:
        last_word = evaluate.last_word_tasks(
            held.documents, args.last_word_items, args.min_words, args.seed
        )
    except EvalError as e:
        raise EvalError(f"{e} (--data, --min-words)") from None
    result = evaluate.evaluate_checkpoint(
        model,
        tokenizer,
        ckpt,
        held,
        last_word,
        tasks,
        args.stride,
        args.max_tokens,
        ticker=eval_report.Progress,
    )
    if tasks is not None:
        result["tasks"]["file"] = str(args.tasks)
    print(eval_report.format_evaluation(result))
    step = result["step"] or 0
    args.json = args.json or pathlib.Path(result["checkpoint"]).parent / f"eval_{step:07d}.json"
    return result


def bpb(args) -> None:
    if len(args.tokens) != len(args.ppl):
        raise EvalError("give one --ppl per --tokens entry")
    names = [chr(ord("A") + i) for i in range(len(args.tokens))]
    print(eval_report.bpb_table(list(zip(names, args.tokens, args.ppl)), args.bytes))


def emergence(args) -> list[dict] | None:
    print(evaluate.emergence_table(k=args.k))
    if not args.ckpt:
        return None
    paths = expand_runs(args.ckpt)
    if not paths:
        raise EvalError(
            "give the sweep's checkpoints: "
            "emergence --ckpt RUN1 --ckpt RUN2 ... (or --ckpt SWEEP_DIR)"
        )
    # the first checkpoint's held-out documents are every model's text
    first = load_model(paths[0], args.device)
    documents = checkpoint_held_out(first[2], first[1], args.data).documents
    loaded = itertools.chain([first], load_each(paths[1:], args.device))
    rows = evaluate.emergence_sweep(
        loaded, documents, args.data or "held-out text", args.k, args.max_tokens
    )
    print("\n" + eval_report.format_emergence_sweep(rows, args.k))
    figure = eval_report.emergence_figure(rows, args.k)
    print(f"plot: {save_figure(figure, args.plot or 'emergence.png', '--plot')}")
    return rows


def contamination(args) -> dict:
    documents = list(read_documents(args.eval, "val"))
    train_documents = (doc for spec in args.train for doc in read_documents(spec, "train"))
    report = evaluate.contamination_report(
        train_documents, documents, args.n, args.min_overlap, args.index
    )
    report["train"], report["eval"] = args.train, args.eval
    print(eval_report.format_contamination(report, args.show))
    if args.drop:
        print(
            f"kept {len(documents) - report['contaminated']:,} clean documents: "
            f"{write_kept(documents, report, args.drop)}"
        )
    return report


def compare(args) -> list[dict]:
    """Without --data, the first checkpoint's held-out documents are every model's text."""
    if len(args.ckpt) < 2:
        raise EvalError("compare needs at least two checkpoints: --ckpt A --ckpt B")
    first = load_model(args.ckpt[0], args.device)
    documents = checkpoint_held_out(first[2], first[1], args.data).documents
    name = args.data or f"held-out text of {first[2]['path']}"
    loaded = itertools.chain([first], load_each(args.ckpt[1:], args.device))
    rows = evaluate.compare_checkpoints(loaded, documents[: args.max_documents], name, args.stride)
    print(eval_report.format_comparison(rows))
    return rows


def recall(args) -> None:
    step = 2 * evaluate.RECALL_HEADS  # RoPE turns pairs of a head's channels
    if args.width % step:
        raise EvalError(
            f"--width {args.width}: {evaluate.RECALL_HEADS} head(s) need an even head size; use a "
            f"multiple of {step}"
        )
    result = recall_report.run_recall(
        args.pairs, args.seeds, args.steps, args.contexts, args.width, args.lr, args.workers
    )
    report = recall_report.recall_report(result)
    print(report)
    # never into the repository unless asked: a trial run would overwrite docs/recall
    out = pathlib.Path(args.out or tempfile.mkdtemp(prefix="recall-"))
    save_figure(recall_report.recall_figure(result), out / "recall.png", "--out")
    write_json(result, out / "recall.json")
    print(f"report: {write_whole(out / 'REPORT.md', report, '--out')}")


def sample(args) -> None:
    model, tokenizer, _ = load_model(args.ckpt, args.device)
    print(args.prompt, end="", flush=True)
    pieces = evaluate.stream_sample(
        model,
        tokenizer,
        args.prompt,
        args.max_new_tokens,
        args.temperature,
        args.top_k or None,
        args.seed,
    )
    try:
        for piece in pieces:
            print(piece, end="", flush=True)
    except EvalError as e:
        raise EvalError(f"{e}: give --prompt") from None
    print()


COMMANDS = {
    None: checkpoint,
    "bpb": bpb,
    "emergence": emergence,
    "contamination": contamination,
    "compare": compare,
    "recall": recall,
    "sample": sample,
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def command():
        # once, before any work, for every command that takes it
        args.device = resolve_device(args.device)
        # what a command writes to its --json, once its output is shown
        to_json = COMMANDS[args.command](args)
        if to_json is not None and args.json:
            print(f"json: {write_json(to_json, args.json)}")

    return run_cli(command, (EvalError,), "evaluate.py")
