"""Bad input to every CLI: one line naming the flag, exit code 2, and nothing written. One row per bad input.

Each row is (script, arguments, what the one-line message must name). The arguments may use {corpus} (a small
text file), {data} (a prepared dataset), {file} (a plain file, to put paths "under a file") and {dir} (an empty
directory). Every row runs in-process through the script's main(argv) in an empty working directory; the test
then checks exit code 2, exactly one line on stderr (nothing on stdout), the flag named in it, no traceback, and
that neither the working directory nor the fixtures changed. Covering a new flag is one more row.
"""
import contextlib
import importlib
import io
import json
import os
import pathlib
import shlex
import shutil

import pytest

import bpe
import data
import dataset
import hf
import model
import train

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
    ("data", "prepare --data {corpus} --boilerplate-min-documents 1", "--boilerplate-min-documents"),
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
    ("data", "prepare --data {corpus} --engine ray --ray-address 127.0.0.1:99999", "port 99999 is out of range"),
    ("data", "prepare --data {corpus} --engine ray --ray-address ray://head:10001", "not auto or HOST:PORT"),
    ("data", "prepare --data {empty}", "is empty (0 bytes)"),
    ("data", "prepare --data {blank}", "has no documents"),
    ("data", "download {data} d", "train.py --data"),
    ("data", "prepare --data {corpus} --work-dir {file}", "is a file; give a directory"),   # data_at_scale's flags
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
    ("scaling", "budget 1e-300", "compute"),                                   # values that parse but are absurd
    ("scaling", "budget 1e20 --tokens-per-param 1e-300", "--tokens-per-param"),
    ("scaling", "budget 1e6 --tokens-per-param 1e6", "--tokens-per-param"),    # a plan of less than one parameter
    ("scaling", "sweep --quick --budgets 1e15 3e15", "--budgets"),             # sizes the family cannot train well
    ("scaling", "sweep --quick --data nosuch.txt", "--data"),                  # the sweep's helpers' failures
    ("scaling", "sweep --quick --data {dataset_without_manifest}", "--data"),
    ("scaling", "fit {runs_object}", "not a list of runs"),                    # valid JSON, wrong shape
    ("scaling", "fit {deep_json}", "nested"),                                  # JSON nested thousands deep
    ("evaluate", "--device meta", "--device"),                                 # --device, checked once
    ("evaluate", "sample --device meta", "--device"),
    ("evaluate", "--tasks {deep_json}", "--tasks"),
    ("train", "--device meta", "--device"),
    ("train", "--num-samples 1000 --sample-tokens 100000", "--num-samples"),   # hours of sampling, refused
    ("train", "--max-steps 100000000000000000000", "--max-steps"),             # a run that can never finish
    ("train", "--zero-reduce-dtype bf16", "--zero-reduce-dtype"),              # a flag that would be ignored
    ("train", "--config {deep_json}", "--config"),
    ("data", "prepare --data {corpus} --lang xx", "--lang"),                 # issue 35: classify.py's filters
    ("data", "prepare --data {corpus} --lang-threshold 1.5", "--lang-threshold"),
    ("data", "prepare --data {corpus} --quality-threshold -0.1", "--quality-threshold"),
    ("data", "prepare --data {corpus} --quality-threshold 0.5 --quality-model {deep_json}", "--quality-model"),
    ("data", "prepare --data {corpus} --quality-positives {blank} --quality-negatives {corpus}",
     "--quality-positives"),
]


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory) -> dict:
    """The paths rows may name: a small corpus, a dataset prepared from it, a plain file, an empty directory."""
    root = tmp_path_factory.mktemp("cli-fixtures")
    words = "the parser reads a list of tokens and writes every item into the module while this loop counts".split()
    corpus = root / "corpus.txt"
    corpus.write_text("\n\n".join(" ".join(words[(i * 7 + j) % len(words)] for j in range(60)) for i in range(40)))
    prepared = dataset.prepare([str(corpus)], root / "data", vocab_size=300, val_fraction=0.2,
                               clean_settings=data.CleanSettings(filters="none", near_dup_threshold=0, mask_pii=False))
    (root / "file").write_text("a plain file\n")
    (root / "dir").mkdir()
    (root / "bad_config.json").write_text('{"lr": "fast"}')
    # issue 24: Hugging Face configs with a NaN and a text size, a checkpoint without a tokenizer, an imported one
    llama = {"architectures": ["LlamaForCausalLM"], "vocab_size": 300, "hidden_size": 16, "num_attention_heads": 2,
             "num_hidden_layers": 1, "intermediate_size": 64}
    for name, change in (("hf_nan", {"hidden_size": float("nan")}), ("hf_text", {"num_hidden_layers": "two"})):
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps({**llama, **change}))
    tokenizer = bpe.Tokenizer.load(pathlib.Path(prepared) / "tokenizer.json")
    tiny = model.GPT(model.GPTConfig(vocab_size=len(tokenizer), n_layer=1, n_head=2, n_kv_head=2, n_embd=16))
    train.atomic_save({"version": 1, "step": 0, "model": tiny.state_dict(), "model_config": tiny.config.to_dict()},
                      root / "no_tokenizer.pt")
    hf.save_imported_checkpoint(tiny, tokenizer, root / "imported.pt", "test")
    more = {"deep_jsonl": root / "deep.jsonl", "deep_manifest": root / "deep-manifest", "fifo": root / "fifo.txt",
            "empty": root / "empty.txt", "blank": root / "blank.txt"}
    more["deep_jsonl"].write_text('{"text": "fine"}\n' + "[" * 5000 + "]" * 5000 + "\n")
    more["deep_manifest"].mkdir()
    (more["deep_manifest"] / "manifest.json").write_text("[" * 5000 + "]" * 5000)
    os.mkfifo(more["fifo"])
    more["empty"].touch()
    more["blank"].write_text(" \n\n \n")
    # issue 24: deep JSON, a runs file that is an object, a dataset folder without its manifest
    (root / "deep.json").write_text("[" * 5000)
    (root / "object.json").write_text('{\n "runs": [{"parameters": 1e6, "tokens": 2e7, "loss": 4.0}]\n}\n')
    shutil.copytree(prepared, root / "no-manifest")
    (root / "no-manifest" / "manifest.json").unlink()
    return {"root": root, "corpus": corpus, "data": prepared, "file": root / "file", "dir": root / "dir",
            "bad_config": root / "bad_config.json", "hf_nan": root / "hf_nan", "hf_text": root / "hf_text",
            "ckpt_no_tokenizer": root / "no_tokenizer.pt", "imported": root / "imported.pt",
            "deep_json": root / "deep.json", "runs_object": root / "object.json",
            "dataset_without_manifest": root / "no-manifest", **more}


def tree(root: pathlib.Path) -> dict:
    """Every path under root with its size and modification time (to see anything created or changed)."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


def run_main(script: str, argv: list[str]) -> tuple[int, str, str]:
    """script.main(argv) in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = importlib.import_module(script).main(argv)
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("script, args, flag", BAD_INPUT, ids=[f"{s}.py {a}" for s, a, _ in BAD_INPUT])
def test_bad_input_is_one_line_naming_the_flag_exit_2_and_nothing_written(script, args, flag, fixtures, tmp_path,
                                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PRETRAIN_CACHE", str(tmp_path / "cache"))
    before = tree(fixtures["root"])
    code, out, err = run_main(script, shlex.split(args.format(**fixtures)))
    lines = err.strip().splitlines()
    assert code == 2, (code, out[-500:], err[-2000:])
    assert len(lines) == 1 and "Traceback" not in out + err, (out[-500:], err[-2000:])
    assert flag in lines[0], lines[0]
    assert not list(tmp_path.iterdir()) and tree(fixtures["root"]) == before      # nothing created or changed
