"""README's commands run: every command in the ```bash blocks of README.md and of the docs/ pages is executed, README's
first and then each page's in name order, in a scratch copy of the repository (so `out/`, `tok.json` and `fit.png`
land there, not in the checkout), with ../shared beside it. A command shown on two pages runs once, where it first
appears; so a page may rely on what README's commands wrote (out-hf/ from `model.py export`, the stand-in out/).

The pages are parsed when the tests run, so a command added later, or moved from README to a docs page, is covered
without touching this file. Each command is one of three kinds, matched by the longest prefix in the tables below
(an entry ending in `$` matches only the whole command):
    quick    (the default) a few seconds each: test_readme_quick_commands runs them all;
    SLOW     tens of seconds (or needing a slow one's output): test_readme_slow_commands, marked slow;
    SKIPPED  never run here, each with its reason (the full main job, the 90-minute sweep, installs, benchmarks).
A command passes when it exits 0 and prints no traceback. Commands that read ../shared/data run only when it exists,
and those naming GPT-2's tokenizer only where its ranks can be had (../shared, tiktoken's cache or a network).
"""

from __future__ import annotations

import functools
import os
import pathlib
import re
import subprocess
import sys

import pytest

import mutation_check  # tests/mutation_check.py: copy_repository

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARED = (
    pathlib.Path(os.environ["SHARED_DATA"]).parent
    if os.environ.get("SHARED_DATA")
    else ROOT.parent / "shared"
)

SKIPPED = {
    "pip install": "installs packages (CI's job; the test environment has them)",
    "python -m pytest": "the test suite itself",
    "python bench/": "benchmarks: minutes each, run by hand (tests/test_bench_gpu.py runs bench_gpu.py --smoke)",
    "python train.py$": "the full main job (600 steps, a few minutes); the slow test trains a 20-step stand-in for "
    "the commands that read out/",
    "python train.py --resume": "continues the main job to its 600 steps; test_train's resume tests cover resuming",
    "python train.py --model 10m": "5,000 steps of a 10M model: hours on a CPU",
    "python train.py --data out/shakespeare_train.txt": "2,000 steps of nanoGPT's baby GPT: about an hour on 2 "
    "shared cores; test_train covers --val-data",
    "python train.py --vocab-size 512": "a second full main-job run (minutes) before its comparison",
    "python train.py --data data/pydocs-hf --init-from": "a full main-job-length run (600 steps) from imported "
    "weights; test_hf covers --init-from",
    "torchrun --standalone --nproc_per_node=2 train.py --batch-size 8": "the full main job on 2 ranks (minutes)",
    "torchrun --standalone --nproc_per_node=8 train.py --model 124m": "8 GPUs with nccl (bench_gpu.py's section)",
    "python scaling.py sweep": "36 training runs, about 90 minutes on the 2-core machine",
    "python scaling.py sweep --quick --schedule wsd": "the quick sweep again as trunks and branches (minutes); "
    "tests/test_sweep.py trains a trunk, extends it and checks a branch against one straight run",
    "python scaling.py dedup-effect": "6 training runs and two datasets, about 2 minutes here",
    "python scaling.py recipe": "85 training runs, 117 training-minutes two at a time in the committed run; tests/test_recipe.py runs its "
    "--quick end to end (long)",
    "python dedup.py experiment --data hf": "downloads a Hugging Face dataset (needs `datasets` and a network)",
    "python data.py prepare --data pystdlib --vocab-size 8192": "31 MB of code through every stage: minutes here",
    "python data.py prepare --data pystdlib --vocab-size 512 --out out/pystdlib-512": "the sweep's dataset: 31 MB "
    "through every stage",
    "huggingface-cli download": "downloads FineWeb-Edu's sample-10BT (~28 GB of parquet; needs a network)",
    'python data.py prepare --data "fineweb-edu/': "10B tokens: an hour on a 64-core machine, days here",
    "python evaluate.py recall": "trains 9 small models (5-20 minutes); tests/test_evaluate.py runs it tiny",
    "python evaluate.py contamination --train pystdlib": "reads and indexes the 31 MB pystdlib corpus: minutes here",
    "python data.py prepare --data ../shared/data/c4-sample/c4-en-train-00000-first1000.jsonl pystdlib": "mixes in the 31 MB pystdlib corpus (about a minute); test_data's mixing tests cover --weights",
    "python data.py inspect out/data-mix": "reads the mix that the skipped command above writes",
    "ray start": "starts a Ray cluster node that outlives the command (tried by hand: a head and a worker node on "
    "one machine, then prepare --ray-address on them)",
    "RAY_AUTH_MODE=token": "needs a running Ray cluster at HEAD_IP, storage mounted on every node (/mnt/shared) and "
    "an S3 bucket (test_data_objstore runs prepare on s3:// against moto's server)",
    "python data.py prepare --engine ray --ray-address HEAD_IP:6379": "needs a Ray cluster at HEAD_IP and an S3 "
    "bucket (test_data_objstore: prepare on s3:// "
    "against moto's server, on a local Ray too)",
    "python data.py download s3://": "needs an S3 bucket holding a dataset (test_data_objstore runs download "
    "against moto's server)",
}

SLOW = {
    "python data.py prepare": "cleans, dedups and tokenizes a corpus (tens of seconds)",
    "python dedup.py experiment": "the lecture's exercise over WikiText-2 (tens of seconds)",
    "python bpe.py train": "trains an 8,192-token BPE on 2 MiB",
    "python bpe.py encode --tokenizer tok.json": "needs tok.json from `bpe.py train`",
    "python bpe.py decode --tokenizer tok.json": "needs tok.json from `bpe.py train`",
    "python parallel.py demo": "every layout on 2 processes",
    "python model.py demo --model 10m": "a 10M model decodes 200 tokens twice (tens of CPU-seconds)",
    "python parallel.py schedule --p 2 --m 8 --measure": "times a real 2-process pipeline",
    "torchrun": "data preparation and 20 steps on 2 ranks",
    "python scaling.py sweep --quick": "twelve tiny training runs, about a minute on a quiet machine",
    "python scaling.py dedup-effect --quick": "four tiny training runs, under a minute on a quiet machine",
    "python evaluate.py --ckpt out/": "needs out/ (a trained checkpoint: the stand-in run)",
    "python model.py export --ckpt out": "needs out/ (the stand-in run); --verify loads transformers",
    "python model.py import-hf --from out-hf": "needs out-hf/ from the export above",
    "python evaluate.py sample --ckpt out/": "needs out/ (a trained checkpoint: the stand-in run)",
}

# What the slow test runs first so that commands reading out/ find a checkpoint there (README's `python train.py`
# itself is skipped: it is the same command with 600 steps).
STAND_IN = "python train.py --max-steps 20 --eval-interval 10 --ckpt-interval 10 --num-samples 0"


def strip_comment(line: str) -> str:
    """The command without its trailing `# comment` (a # inside quotes or a word is kept).
    >>> strip_comment('python bpe.py show "a # b" --steps   # merge by merge')
    'python bpe.py show "a # b" --steps'
    """
    quote = None
    for i, c in enumerate(line):
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def readme_commands(text: str) -> list[str]:
    """Every command in the ```bash (or sh, shell, console) blocks, in order, comments stripped, `\\` lines joined."""
    commands = []
    for lang, body in re.findall(r"^```(\w*)[^\n]*\n(.*?)^```", text, re.S | re.M):
        if lang not in ("bash", "sh", "shell", "console"):
            continue
        for line in body.replace("\\\n", " ").splitlines():
            command = strip_comment(line.strip().removeprefix("$ "))
            if command:
                commands.append(" ".join(command.split()))
    return commands


def kind(command: str) -> tuple[str, str]:
    """("skipped" | "slow" | "quick", reason): the longest matching prefix of SKIPPED and SLOW decides."""

    def match(prefix: str) -> bool:
        if prefix.endswith("$"):
            return command == prefix[:-1]
        rest = command[len(prefix) :] if command.startswith(prefix) else None
        return rest is not None and (rest[:1] in ("", " ") or prefix.endswith("/"))

    matches = [(len(p), "skipped", r) for p, r in SKIPPED.items() if match(p)]
    matches += [(len(p), "slow", r) for p, r in SLOW.items() if match(p)]
    if not matches:
        return "quick", "a few seconds"
    _, k, reason = max(matches)
    return k, reason


def documented_pages(root: pathlib.Path = ROOT) -> list[pathlib.Path]:
    """README.md, then every docs/*.md in name order: the order their commands run in."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def documented_text(root: pathlib.Path = ROOT) -> str:
    """README and the docs pages, one after the other: where a quoted figure may stand (the parallel.py demo's
    sentence moved to docs/parallel.md with README's chapter sections)."""
    return "\n".join(page.read_text(encoding="utf-8") for page in documented_pages(root))


def documented_commands(root: pathlib.Path = ROOT) -> list[str]:
    """Every page's commands in page order, each command once (where it first appears)."""
    seen: dict[str, None] = {}
    for page in documented_pages(root):
        seen.update(
            (c, None) for c in readme_commands(page.read_text(encoding="utf-8")) if c not in seen
        )
    return list(seen)


def commands_of(k: str) -> list[str]:
    return [c for c in documented_commands() if kind(c)[0] == k]


def scratch_copy(tmp: pathlib.Path) -> pathlib.Path:
    """tmp/repo (a copy without .git, caches or outputs) and tmp/shared -> the real ../shared, if there is one."""
    repo = mutation_check.copy_repository(tmp / "repo")
    if SHARED.is_dir():
        (tmp / "shared").symlink_to(SHARED.resolve())
    return repo


def needs_missing_shared(command: str, repo: pathlib.Path) -> bool:
    return "../shared" in command and not (repo.parent / "shared").is_dir()


@functools.lru_cache(maxsize=1)
def gpt2_unavailable() -> str:
    """Why GPT-2's ranks cannot be loaded here ("" if they can): bpe.py reads them from ../shared/data/gpt2-bpe or
    tiktoken's cache, else tiktoken downloads them, which a fresh clone without network cannot."""
    import bpe
    from machinery import tokenizer_files

    try:
        tokenizer_files.load_tokenizer("gpt2")
    except bpe.TokenizerError as e:
        return str(e)
    return ""


def needs_missing_gpt2(command: str) -> bool:
    """A command that names GPT-2's tokenizer (`--tokenizer gpt2 ...`) where its ranks cannot be had."""
    named = (
        command.split(" --tokenizer ", 1)[1].split(" -")[0].split()
        if " --tokenizer " in command
        else []
    )
    return "gpt2" in named and bool(gpt2_unavailable())


def run_command(command: str, repo: pathlib.Path) -> str:
    """Run one README command in the scratch repo; fail with its output unless it exits 0 without a traceback;
    return what it printed (stdout, then stderr)."""
    python = os.path.dirname(sys.executable)
    env = {
        **os.environ,
        "PATH": python + os.pathsep + os.environ.get("PATH", ""),
        "PYTHONDONTWRITEBYTECODE": "1",
        "MPLBACKEND": "Agg",
        "OMP_NUM_THREADS": "1",
        "PRETRAIN_CACHE": str(repo / ".cache"),
    }
    done = subprocess.run(
        ["bash", "-c", command], cwd=repo, env=env, capture_output=True, text=True, timeout=900
    )
    output = (done.stdout + done.stderr)[-3000:]
    assert done.returncode == 0 and "Traceback (most recent call last)" not in done.stderr, (
        f"README command failed (exit {done.returncode}): {command}\n{output}"
    )
    return done.stdout + done.stderr


# README quotes some figures "as it prints them": they are compared with what the command printed in the slow test
# (the commands run there anyway). The full `python train.py` is skipped, so of its table only the step-0 column,
# which the 20-step stand-in prints too (the first evaluation comes before any update).
DEMO = "python parallel.py demo"


def readme_step0(readme: str) -> tuple[str, str]:
    """(val loss, val bpb) in the step-0 column of README's default-run table."""
    loss = re.search(r"^\| val loss \(nats/token\) \| ([\d.]+) \|", readme, re.M)
    bpb = re.search(r"^\| val bits-per-byte \| ([\d.]+) \|", readme, re.M)
    assert loss and bpb, "README's default-run table has no val loss / val bits-per-byte row"
    return loss.group(1), bpb.group(1)


def printed_step0(output: str) -> tuple[str, str]:
    found = re.search(r"^step +0 \| val loss ([\d.]+) \| val bpb ([\d.]+)", output, re.M)
    assert found, f"no step-0 evaluation line in:\n{output[-2000:]}"
    return found.group(1), found.group(2)


def readme_demo_differences(readme: str) -> dict[str, float]:
    """Layout -> the largest weight difference README quotes for `python parallel.py demo`:
    '2.52e-6 (DP, ZeRO-1/2/3), 1.94e-6 (PP2 1F1B), ...' -> {'DP': 2.52e-6, 'ZeRO-1': 2.52e-6, ...}."""
    sentence = re.search(r"difference ((?:[\d.]+e-\d+ \([^)]*\),?\s+)+)as it prints them", readme)
    assert sentence, "README's parallel.py demo sentence ('... as it prints them') not found"
    quoted = {}
    for value, layouts in re.findall(r"([\d.]+e-\d+) \(([^)]*)\)", sentence.group(1)):
        for layout in layouts.split(", "):
            name, _, more = layout.partition("/")  # ZeRO-1/2/3 -> ZeRO-1, ZeRO-2, ZeRO-3
            for stage in [name, *(name[:-1] + n for n in more.split("/") if n)]:
                quoted[stage] = float(value)
    return quoted


def printed_demo_differences(output: str) -> dict[str, float]:
    """Layout -> max |diff| from the demo's table rows ('ZeRO-1          2.52e-06   ...')."""
    return {
        name: float(value)
        for name, value in re.findall(r"^(DP|ZeRO-\d|TP2|PP2 1F1B) +(\d\.\d+e-\d+) ", output, re.M)
    }


def quoted_figure_mismatches(readme: str, outputs: dict[str, str]) -> list[str]:
    """What README quotes and the commands (outputs: command -> what it printed) did not print."""
    mismatches = []
    if STAND_IN in outputs and readme_step0(readme) != printed_step0(outputs[STAND_IN]):
        mismatches.append(
            f"README's default run at step 0: {readme_step0(readme)}; "
            f"`python train.py` prints {printed_step0(outputs[STAND_IN])}"
        )
    if DEMO in outputs and readme_demo_differences(readme) != printed_demo_differences(
        outputs[DEMO]
    ):
        mismatches.append(
            f"README's `{DEMO}` differences: {readme_demo_differences(readme)}; "
            f"it prints {printed_demo_differences(outputs[DEMO])}"
        )
    return mismatches


def test_readme_quoted_figures_are_found_and_compared():
    """The parsers find README's figures (a reworded sentence fails here, not silently in the slow test), and a
    figure that differs from the output is reported."""
    readme = documented_text()
    step0 = readme_step0(readme)
    differences = readme_demo_differences(readme)
    assert set(differences) == {"DP", "ZeRO-1", "ZeRO-2", "ZeRO-3", "TP2", "PP2 1F1B"}

    def demo_table(values):
        return "".join(f"{name:<14}{value:9.2e}   82,560\n" for name, value in values.items())

    printed = {
        STAND_IN: f"step      0 | val loss {step0[0]} | val bpb {step0[1]}\n",
        DEMO: demo_table(differences),
    }
    assert quoted_figure_mismatches(readme, printed) == []
    printed = {
        STAND_IN: f"step      0 | val loss {step0[0]} | val bpb 9.9999\n",
        DEMO: demo_table({**differences, "TP2": 2 * differences["TP2"]}),
    }
    assert [m.split(":")[0] for m in quoted_figure_mismatches(readme, printed)] == [
        "README's default run at step 0",
        f"README's `{DEMO}` differences",
    ]


def test_readme_parsing_and_every_command_has_a_kind():
    text = "x\n```bash\npython a.py   # say hi\n\n$ python b.py --x \\\n  --y\n```\n```\nnot a command\n```\n"
    assert readme_commands(text) == ["python a.py", "python b.py --x --y"]
    commands = readme_commands((ROOT / "README.md").read_text())
    assert "python train.py" in commands and kind("python train.py")[0] == "skipped"
    assert set(commands) <= set(documented_commands())
    assert kind("python train.py --help") == ("quick", "a few seconds")
    assert (
        kind("python scaling.py sweep --quick")[0] == "slow"
        and kind("python scaling.py sweep")[0] == "skipped"
    )
    assert all(reason for p, reason in {**SKIPPED, **SLOW}.items())


def test_docs_pages_commands_run_once_after_readme(tmp_path):
    """A command moved from README to a docs page is still run; one shown twice runs once, where it first appears."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("```bash\npython a.py\npython b.py\n```\n")
    (tmp_path / "docs" / "z.md").write_text("```bash\npython z.py\n```\n")
    (tmp_path / "docs" / "m.md").write_text(
        "```bash\npython b.py   # shown again\npython m.py\n```\n```\nout\n```\n"
    )
    assert documented_commands(tmp_path) == [
        "python a.py",
        "python b.py",
        "python m.py",
        "python z.py",
    ]


def heading_anchors(text: str) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation but - and _ dropped, spaces to -.
    >>> sorted(heading_anchors("# data.py: from raw corpora\\n## Export to HF (`tests/test_hf.py`)\\n"))
    ['datapy-from-raw-corpora', 'export-to-hf-teststest_hfpy']
    """
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return {
        re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.*)$", text, re.M)
    }


def broken_links(root: pathlib.Path = ROOT) -> list[str]:
    """Relative links of README and the docs pages whose file or heading anchor does not exist."""
    broken = []
    for page in documented_pages(root):
        text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path) if path else page
            if not linked.exists():
                broken.append(f"{page.relative_to(root)}: {target} (no such file)")
            elif (
                anchor
                and linked.suffix == ".md"
                and anchor not in heading_anchors(linked.read_text(encoding="utf-8"))
            ):
                broken.append(f"{page.relative_to(root)}: {target} (no such heading)")
    return broken


def test_links_between_readme_and_docs_resolve(tmp_path):
    """A heading renamed or moved to a docs page breaks no link (README's map links to every chapter heading)."""
    assert not broken_links(), "\n".join(broken_links())
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(
        "# Top\n[a](docs/a.md#two) [b](docs/b.md) [c](#top) [d](#gone)\n"
    )
    (tmp_path / "docs" / "a.md").write_text("# One\n```bash\n# two\n```\n[up](../README.md#top)\n")
    assert broken_links(tmp_path) == [
        "README.md: docs/a.md#two (no such heading)",
        "README.md: docs/b.md (no such file)",
        "README.md: #gone (no such heading)",
    ]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> pathlib.Path:
    return scratch_copy(tmp_path_factory.mktemp("readme"))


@pytest.mark.parametrize("command", commands_of("quick"))
def test_readme_quick_commands(command, scratch):
    if needs_missing_shared(command, scratch):
        pytest.skip(f"needs ../shared/data: {command}")
    if needs_missing_gpt2(command):
        pytest.skip(f"needs GPT-2's ranks ({gpt2_unavailable()}): {command}")
    run_command(command, scratch)


@pytest.mark.slow
@pytest.mark.long
def test_readme_slow_commands(tmp_path):
    """The slow commands in README order, after a 20-step stand-in for the main job (for the ones reading out/)."""
    repo = scratch_copy(tmp_path)
    outputs = {STAND_IN: run_command(STAND_IN, repo)}
    failures = []
    for command in commands_of("slow"):
        if not needs_missing_shared(command, repo) and not needs_missing_gpt2(command):
            try:
                outputs[command] = run_command(command, repo)
            except AssertionError as e:  # run the rest too: one report names every broken command
                failures.append(str(e))
    failures += quoted_figure_mismatches(documented_text(), outputs)
    assert not failures, "\n\n".join(failures)


def test_reading_table_gives_each_chapters_line_count():
    """README's reading table quotes each chapter's lines: they must be the file's (`wc -l`), or a
    change to a chapter leaves the front page wrong (train.py read 743 after it grew to 744)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| \d+ \| \[`(\w+)\.py`\].*?\| ([\d,]+) \| \d+ \|", readme, re.M)
    assert len(rows) == 10, rows
    for stem, quoted in rows:
        lines = len((ROOT / f"{stem}.py").read_text(encoding="utf-8").splitlines())
        assert int(quoted.replace(",", "")) == lines, (stem, quoted, lines)
