"""Tests for evaluate.py: the lecture's numbers, window evaluation against a full pass, exact match against greedy
decoding, contamination against a plain set of n-gram tuples, and the command line on real checkpoints."""

import dataclasses
import json
import math
import os
import pathlib
import random
import re
import tempfile

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import evaluate as ev
import scaling
from machinery import eval_report, recall_report
from machinery import devices
from machinery.commands import evaluate as cmd


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """These models are tiny: a second intra-op thread only adds synchronisation (100x slower on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ---------------------------------------------------------------------------------------------------------------
# Small causal language models of our own (any model mapping ids (B, T) to logits (B, T, V) can be evaluated)
# ---------------------------------------------------------------------------------------------------------------


class UniformLM(nn.Module):
    """Every token equally likely: loss ln V per token, perplexity exactly V."""

    def __init__(self, vocab_size):
        super().__init__()
        self.vocab_size = vocab_size

    def forward(self, idx):
        return torch.zeros(*idx.shape, self.vocab_size)


class TinyTransformerLM(nn.Module):
    """One causal self-attention layer with learned positions; refuses inputs longer than its block."""

    def __init__(self, vocab_size=13, dim=16, block_size=8, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.block_size = block_size
        self.tok = nn.Embedding(vocab_size, dim)
        self.pos = nn.Embedding(block_size, dim)
        self.attn = nn.MultiheadAttention(dim, 2, batch_first=True)
        self.out = nn.Linear(dim, vocab_size)

    def forward(self, idx):
        T = idx.shape[1]
        assert T <= self.block_size
        x = self.tok(idx) + self.pos(torch.arange(T))
        future = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
        a, _ = self.attn(x, x, x, attn_mask=future)
        return self.out(x + a), None  # like model.GPT: (logits, loss)


class ConvLM(nn.Module):
    """Logits at position t depend on ids[t-2..t] only (a causal convolution of width 3), at any length."""

    def __init__(self, vocab_size=13, dim=8, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.tok = nn.Embedding(vocab_size, dim)
        self.conv = nn.Conv1d(dim, vocab_size, 3)

    def forward(self, idx):
        x = self.tok(idx).transpose(1, 2)  # (B, C, T)
        return self.conv(F.pad(x, (2, 0))).transpose(1, 2)


class NextCharLM(nn.Module):
    """A character model that strongly predicts successor[c] after c (logit 10, others 0)."""

    def __init__(self, alphabet, successor):
        super().__init__()
        self.alphabet = alphabet
        table = torch.zeros(len(alphabet), len(alphabet))
        for c, nxt in successor.items():
            table[alphabet.index(c), alphabet.index(nxt)] = 10.0
        self.table = table

    def forward(self, idx):
        return self.table[idx]


class CharTokenizer:
    def __init__(self, alphabet):
        self.alphabet = alphabet
        self.eot_id = None

    def encode(self, text):
        return [self.alphabet.index(c) for c in text]

    def decode(self, ids):
        return "".join(self.alphabet[i] for i in ids)


# ---------------------------------------------------------------------------------------------------------------
# 1. Perplexity and bits-per-byte
# ---------------------------------------------------------------------------------------------------------------


def test_bits_per_byte_of_the_lecture_example():
    a = ev.bits_per_byte(250 * math.log(18), 1000)
    b = ev.bits_per_byte(400 * math.log(12), 1000)
    assert round(a, 2) == 1.04 and round(b, 2) == 1.43
    assert ev.bpb_from_perplexity(250, 18, 1000) == pytest.approx(a)
    table = eval_report.bpb_table([("A", 250, 18), ("B", 400, 12)], 1000)
    assert "1.04" in table and "1.43" in table and table.endswith(": A")
    with pytest.raises(ev.EvalError):
        ev.bits_per_byte(1.0, 0)


def test_python_evaluate_py_runs_the_command_line_through_its_stub():
    """`python evaluate.py ...` hands argv to machinery/commands/evaluate.py: the table, and a bad flag named."""
    import subprocess
    import sys

    root = pathlib.Path(ev.__file__).resolve().parent
    done = subprocess.run(
        [sys.executable, "evaluate.py", "bpb"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        done.returncode == 0 and "lower bits-per-byte predicts the text better: A" in done.stdout
    ), done.stderr
    done = subprocess.run(
        [sys.executable, "evaluate.py", "bpb", "--tokens", "3", "--ppl", "2", "4"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        done.returncode == 2
        and done.stderr == "evaluate.py: error: give one --ppl per --tokens entry\n"
    )


def test_perplexity_of_a_uniform_model_is_the_vocabulary_size():
    ids = torch.randint(0, 50, (300,), generator=torch.Generator().manual_seed(0))
    scores = ev.score_tokens(UniformLM(50), ids, block_size=32, stride=16)
    assert scores.n_tokens == 299
    assert ev.perplexity(scores.mean_nats) == pytest.approx(50.0, rel=1e-6)  # float32 logits


# ---------------------------------------------------------------------------------------------------------------
# 2. Sliding window
# ---------------------------------------------------------------------------------------------------------------


def test_window_plan_scores_every_target_once_with_enough_context():
    assert ev.window_plan(10, 4, 2) == [(0, 4, 0), (2, 6, 4), (4, 8, 6), (5, 9, 8)]
    for n_ids in range(2, 40):
        for block in (1, 3, 8):
            for stride in range(1, block + 1):
                plan = ev.window_plan(n_ids, block, stride)
                scored = [t for _, end, first in plan for t in range(first, end)]
                assert scored == list(range(n_ids - 1))
                for start, end, first in plan:
                    assert 0 <= start <= first < end and end - start <= block
                    if (
                        start > 0
                    ):  # every later window gives its new targets >= block - stride context
                        assert first - start >= block - stride
    with pytest.raises(ev.EvalError):
        ev.window_plan(10, 4, 5)


def test_sliding_window_equals_full_evaluation_when_the_text_fits():
    model = TinyTransformerLM(block_size=8)
    ids = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6, 5])  # 9 ids: 8 targets, one full window
    logits, _ = model(ids[None, :-1])
    full = F.cross_entropy(logits[0], ids[1:], reduction="none").detach().numpy()
    for stride in (1, 3, 8):
        scores = ev.score_tokens(model, ids, block_size=8, stride=stride)
        np.testing.assert_allclose(scores.nll, full, rtol=1e-6)


def test_sliding_window_equals_one_full_pass_for_a_short_memory_model():
    """ConvLM sees 2 previous tokens, so any window that keeps >= 2 tokens of context must match a single pass
    over the whole 200-token text; disjoint blocks (stride = block) must not."""
    model = ConvLM()
    ids = torch.randint(0, 13, (200,), generator=torch.Generator().manual_seed(1))
    full = F.cross_entropy(model(ids[None, :-1])[0], ids[1:], reduction="none").detach().numpy()
    for stride in (1, 2, 5, 6):
        scores = ev.score_tokens(model, ids, block_size=8, stride=stride, batch_size=3)
        np.testing.assert_allclose(scores.nll, full, rtol=1e-5, atol=1e-6)
    disjoint = ev.score_tokens(model, ids, block_size=8, stride=8)
    assert not np.allclose(disjoint.nll, full)
    assert disjoint.n_tokens == 199


def test_score_tokens_rejects_too_short_texts():
    with pytest.raises(ev.EvalError, match="at least 2"):
        ev.score_tokens(UniformLM(5), [1], block_size=4)


# ---------------------------------------------------------------------------------------------------------------
# 3. Exact match
# ---------------------------------------------------------------------------------------------------------------


def test_exact_match_normalisation():
    assert ev.normalize_answer("  The Eiffel Tower! ") == "eiffel tower"
    assert ev.normalize_answer("ＰＡＲＩＳ.") == "paris"  # NFKC folds full-width letters
    assert ev.normalize_answer("Straße") == ev.normalize_answer(
        "STRASSE"
    )  # case-folding, not just lower()
    assert ev.exact_match(" paris .", "Paris")
    assert ev.exact_match("an apple", "apple")
    assert not ev.exact_match("Paris, France", "Paris")
    assert not ev.exact_match("Lyon", "Paris")
    assert ev.leading_words(" Paris is big\nNext", 1) == "Paris"
    assert ev.leading_words(" New York City", 2) == "New York"


def test_read_tasks_names_the_malformed_line(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text('{"prompt": "2+2=", "answer": " 4"}\n\n{"prompt": "x", "answer": "y"}\n')
    assert [t.answer for t in cmd.read_tasks(good)] == [" 4", "y"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "answer": "b"}\n{"prompt": "a" "answer": "b"}\n')
    with pytest.raises(ev.EvalError, match="line 2"):
        cmd.read_tasks(bad)
    bad.write_text(
        '{"prompt": "a", "answer": "b"}\n{"prompt": "a", "answer": ""}\n{"prompt": "a"}\n'
    )
    with pytest.raises(ev.EvalError, match="line 2"):
        cmd.read_tasks(bad)
    bad.write_text("\n")
    with pytest.raises(ev.EvalError, match="no tasks"):
        cmd.read_tasks(bad)


def test_greedy_exact_match_and_answer_probability():
    alphabet = list("capitl: ryonsPL\n")
    successor = {":": " ", " ": "p", "p": "a", "a": "r", "r": "i", "i": "s", "s": "\n", "\n": "c"}
    model, tok = NextCharLM(alphabet, successor), CharTokenizer(alphabet)
    tasks = [
        ev.Task("capital:", " paris"),
        ev.Task("capital:", " Paris"),
        ev.Task("capital:", " lyon"),
    ]
    result = ev.evaluate_tasks(model, tok, tasks, block_size=16)
    assert result["items"] == 3
    assert result["exact_match"] == pytest.approx(2 / 3)  # " paris" and " Paris" (case-folded)
    # p(" paris"): 6 characters, each the favourite at logit 10 among 16 symbols
    p_right = (math.exp(10) / (math.exp(10) + 15)) ** 6
    right, wrong = result["examples"]  # the first right answer, then the wrong ones (only one here)
    assert right["p_answer"] == pytest.approx(p_right, rel=1e-5) and right["prediction"] == "paris"
    assert right["exact_match"] and wrong["answer"] == " lyon" and not wrong["exact_match"]
    assert wrong["p_answer"] < 1e-6


def test_teacher_forced_top1_is_greedy_decoding():
    """All answer tokens top-1 (teacher-forced) <=> greedy decoding produces the answer."""
    model = TinyTransformerLM(block_size=8, seed=3)
    rng = random.Random(0)
    for _ in range(20):
        prompt = [rng.randrange(13) for _ in range(rng.randrange(1, 6))]
        greedy = ev.greedy_continue(model, prompt, 3, block_size=8)
        _, top = ev.score_answer(model, prompt, greedy, block_size=8)
        assert top == 3
        wrong = greedy[:2] + [(greedy[2] + 1) % 13]
        _, top = ev.score_answer(model, prompt, wrong, block_size=8)
        assert top == 2


def test_split_paragraphs():
    assert cmd.split_paragraphs("a\nb\n \nc") == ["a\nb", "c"]
    assert cmd.split_paragraphs("\n\n") == []


def test_last_word_tasks_from_documents():
    wiki = (
        'Homarus gammarus\n\nIn life , the lobsters are blue , only becoming " lobster red " on cooking .\n'
        "Too short to use .\nThe year was 1999 and nothing ended in a word here 2000 .\n"
        "Wrapped prose that\ncontinues over lines ends here ."
    )
    tasks = ev.last_word_tasks([wiki], min_words=6)
    assert tasks == [
        ev.Task(
            'Homarus gammarus\n\nIn life , the lobsters are blue , only becoming " lobster red " on',
            " cooking",
        ),
        ev.Task(wiki[: wiki.rindex(" here")], " here"),  # a 7-word paragraph wrapped over two lines
    ]
    cropped = ev.last_word_tasks([wiki], min_words=6, max_prompt_chars=30)
    assert cropped[0].prompt == 'becoming " lobster red " on' and cropped[0].answer == " cooking"
    many = [f"word{i} " * 30 + f"end {chr(97 + i % 26)}x ." for i in range(50)]
    picked = ev.last_word_tasks(many, n_items=10, seed=1)
    assert len(picked) == 10 and picked == ev.last_word_tasks(many, n_items=10, seed=1)
    assert picked != ev.last_word_tasks(many, n_items=10, seed=2)
    with pytest.raises(ev.EvalError, match="no held-out paragraph"):
        ev.last_word_tasks(["too short ."])


# ---------------------------------------------------------------------------------------------------------------
# 4. Emergence
# ---------------------------------------------------------------------------------------------------------------


def test_emergence_table_matches_the_lecture():
    lecture = [0.03, 0.08, 0.17, 0.33, 0.59, 0.77]
    assert [round(ev.exact_match_from_per_step(p, 5), 2) for p in ev.LECTURE_PER_STEP] == lecture
    table = ev.emergence_table()
    assert table.splitlines()[1].split()[-6:] == [f"{x:.2f}" for x in lecture]


def test_k_token_exact_match_is_greedy_reproduction():
    """The fraction of positions whose next k tokens are all top-1 equals the fraction of positions from which
    greedy decoding reproduces the next k tokens exactly."""
    assert ev.k_token_exact_match(np.array([1, 1, 0, 1, 1, 1], bool), 2) == pytest.approx(3 / 5)
    model = TinyTransformerLM(block_size=16, seed=5)
    rng = random.Random(2)
    ids = [1] + ev.greedy_continue(model, [1], 15, block_size=16)
    for i in rng.sample(range(1, 16), 3):  # a mostly-predictable text with a few surprises
        ids[i] = (ids[i] + 1) % 13
    scores = ev.score_tokens(model, ids, block_size=16)
    k = 3
    reproduced = [
        ev.greedy_continue(model, ids[: t + 1], k, block_size=16) == ids[t + 1 : t + 1 + k]
        for t in range(len(ids) - k)
    ]
    assert 0 < sum(reproduced) < len(reproduced)
    assert ev.k_token_exact_match(scores.correct, k) == pytest.approx(np.mean(reproduced))


# ---------------------------------------------------------------------------------------------------------------
# 5. Contamination
# ---------------------------------------------------------------------------------------------------------------

FILLER = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma".split()


def _sentence(rng, n):
    return " ".join(rng.choice(FILLER) + str(rng.randrange(10**6)) for _ in range(n))


@pytest.mark.parametrize("index", ["hashed", "set"])
def test_contamination_finds_a_planted_13gram_and_ignores_a_12gram(index):
    rng = random.Random(0)
    secret = (
        "the quick brown fox jumps over the lazy dog while the cat sleeps soundly today".split()
    )
    train = [
        _sentence(rng, 200) + " " + " ".join(secret[:13]) + " " + _sentence(rng, 50)
        for _ in range(3)
    ]
    planted13 = (
        _sentence(rng, 40)
        + " The QUICK brown fox, jumps over the lazy dog -- while the cat sleeps. "
        + _sentence(rng, 40)
    )
    planted12 = _sentence(rng, 40) + " " + " ".join(secret[:12]) + " " + _sentence(rng, 40)
    clean = _sentence(rng, 80)
    report = ev.contamination_report(train, [planted13, planted12, clean, "too short"], index=index)
    docs = report["documents"]
    assert [d["contaminated"] for d in docs] == [True, False, False, False]
    assert docs[0]["overlapping"] == 1 and docs[0]["example"] == " ".join(secret[:13])
    assert docs[1]["overlapping"] == 0 and docs[3]["ngrams"] == 0
    assert report["contaminated"] == 1 and report["eval_checkable"] == 3
    text = eval_report.format_contamination(report)
    assert "1 documents (25.0%)" in text and " ".join(secret[:13]) in text


def test_hashed_ngram_index_agrees_with_a_set_of_tuples():
    """Random texts over 3 words have many shared 6-grams; counts per document must equal the exact answer."""
    rng = random.Random(4)
    vocab = ["a", "b", "c"]
    train = [" ".join(rng.choice(vocab) for _ in range(rng.randrange(0, 60))) for _ in range(20)]
    evals = [
        " ".join(rng.choice(vocab + ["d"]) for _ in range(rng.randrange(0, 40))) for _ in range(30)
    ]
    n = 6
    truth = set()
    for doc in train:
        w = doc.split()
        truth.update(tuple(w[i : i + n]) for i in range(len(w) - n + 1))
    for index in ("hashed", "set"):
        report = ev.contamination_report(train, evals, n=n, min_overlap=2, index=index)
        for doc, row in zip(evals, report["documents"]):
            w = doc.split()
            grams = [tuple(w[i : i + n]) for i in range(len(w) - n + 1)]
            hits = sum(g in truth for g in grams)
            assert (row["ngrams"], row["overlapping"], row["contaminated"]) == (
                len(grams),
                hits,
                hits >= 2,
            )
        assert report["train_ngrams"] == len(truth)


def test_contamination_reads_task_files(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        '{"prompt": "Q: capital of France? A:", "answer": " Paris"}\n\n{"text": "plain document"}\n'
    )
    assert list(cmd.read_documents(str(tasks), "val")) == [
        "Q: capital of France? A: Paris",
        "plain document",
    ]
    tasks.write_text('{"text": "fine"}\n{"prompt": "no answer"}\n')
    with pytest.raises(ev.EvalError, match="line 2"):
        list(cmd.read_documents(str(tasks), "val"))


def test_contamination_rejects_empty_sets():
    with pytest.raises(ev.EvalError, match="evaluation set has no documents"):
        ev.contamination_report(["a b c"], [])
    with pytest.raises(ev.EvalError, match="training corpus has no documents"):
        ev.contamination_report([], ["a b c"])


# ---------------------------------------------------------------------------------------------------------------
# 6. Real checkpoints: data.py shards, bpe.py tokenizers, model.GPT, train.py's checkpoint format
# ---------------------------------------------------------------------------------------------------------------

NOUNS = "cat dog bird fox horse river garden house mountain city ship king queen child teacher farmer".split()
VERBS = "sees finds likes follows paints carries watches feeds visits remembers".split()
ADJS = "small old green quiet brave bright cold happy tall slow".split()


def synthetic_corpus(seed: int, n_paragraphs: int) -> str:
    """Blank-line separated paragraphs of simple sentences (30-60 words), each ending in a word and a period."""
    rng = random.Random(seed)
    paragraphs = []
    for _ in range(n_paragraphs):
        words = []
        while len(words) < rng.randrange(30, 60):
            words += f"the {rng.choice(ADJS)} {rng.choice(NOUNS)} {rng.choice(VERBS)} the {rng.choice(NOUNS)} .".split()
        paragraphs.append(" ".join(words[:-1]) + " today .")
    return "\n\n".join(paragraphs) + "\n"


def save_checkpoint(path, model, tokenizer, data_dir, step=7):
    """A checkpoint with the fields train.py writes and evaluate.py reads (CONTRACTS.md)."""
    torch.save(
        {
            "version": 1,
            "step": step,
            "model": model.state_dict(),
            "model_config": dataclasses.asdict(model.config),
            "tokenizer_json": tokenizer.to_json(),
            "data_dir": str(data_dir),
        },
        path,
    )
    return path


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A prepared dataset (data.py, a 300-token BPE) and two GPT checkpoints of different sizes beside it."""
    import data
    from machinery import dataset
    import model

    root = tmp_path_factory.mktemp("evaluate")
    (root / "corpus.txt").write_text(
        synthetic_corpus(0, 120)
    )  # cleaning="web": one document per paragraph
    data_dir = dataset.prepare(
        [str(root / "corpus.txt")],
        out_dir=root / "data",
        vocab_size=300,
        val_fraction=0.2,
        clean_settings=data.CleanSettings(cleaning="web", filters="none", near_dup_threshold=0),
    )
    tokenizer = data.TokenData(data_dir).tokenizer
    for name, width in (("small", 32), ("large", 64)):
        torch.manual_seed(0)
        config = model.GPTConfig(
            vocab_size=len(tokenizer), block_size=32, n_layer=1, n_head=2, n_kv_head=1, n_embd=width
        )
        (root / name).mkdir()
        save_checkpoint(root / name / "ckpt_0000007.pt", model.GPT(config), tokenizer, data_dir)
    return root


def run_cli(argv, capsys):
    try:
        code = cmd.main([str(a) for a in argv])
    except SystemExit as e:  # argparse rejects a flag itself
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_evaluates_a_checkpoint_on_its_held_out_split(run_dir, capsys):
    import data

    code, out, err = run_cli(
        ["--ckpt", run_dir / "small", "--min-words", "10", "--stride", "32"], capsys
    )
    assert code == 0, err
    assert "bits per byte" in out and "last word: exact match" in out
    result = json.loads((run_dir / "small" / "eval_0000007.json").read_text())
    held = result["held_out"]
    manifest = data.load_manifest(run_dir / "data")["splits"]["val"]
    assert (
        held["whole_split"]
        and held["tokens"] == manifest["tokens"] - 1
        and held["bytes"] == manifest["bytes"]
    )
    assert held["bits_per_byte"] == pytest.approx(
        held["loss"] * held["tokens"] / math.log(2) / held["bytes"]
    )
    # Oracle: with stride = block, the mean loss is model(x, targets) over consecutive disjoint windows.
    model, tokenizer, ckpt = ev.load_model(run_dir / "small")
    shards = data.TokenData(run_dir / "data").shards["val"]
    ids = torch.from_numpy(np.concatenate([np.asarray(s, np.int64) for s in shards]))
    total, count = 0.0, 0
    for start in range(0, len(ids) - 1, 32):
        x, y = ids[start : start + 32], ids[start + 1 : start + 33]
        x = x[: len(y)]
        _, loss = model(x[None], y[None])
        total, count = total + loss.item() * len(y), count + len(y)
    assert held["loss"] == pytest.approx(total / count, rel=1e-5)
    assert 0 <= result["last_word"]["exact_match"] <= 1 and result["last_word"]["items"] > 10


def test_progress_lines_give_count_rate_and_eta_at_most_every_interval(monkeypatch, capsys):
    clock = iter([100.0, 105.0, 110.0, 112.0, 130.0])  # start, then one reading per update
    monkeypatch.setattr(eval_report.time, "perf_counter", lambda: next(clock))
    ticker = eval_report.Progress("held-out text", "windows")
    ticker(10, 100)  # 5 s in: too soon to say anything
    ticker(25, 100, " (so far)")  # 10 s: 2.5 windows/s, 75 left -> 30 s
    ticker(30, 100)  # 2 s after the last line: quiet
    ticker(100, 100)  # 30 s: done
    assert capsys.readouterr().err.splitlines() == [
        "held-out text: 25 of 100 windows (so far), 2.5/s, ETA 0m30s",
        "held-out text: 100 of 100 windows, 3.3/s, ETA 0m00s",
    ]


def test_evaluating_a_checkpoint_shows_progress_on_stderr_only(run_dir, capsys, monkeypatch):
    """`evaluate.py --ckpt` scores windows, then last-word tasks, for minutes on a busy CPU: both say
    where they are on stderr (here every update: the interval set to 0), stdout keeps the table."""
    monkeypatch.setattr(eval_report, "PROGRESS_EVERY_S", 0.0)
    code, out, err = run_cli(
        [
            "--ckpt",
            run_dir / "small",
            "--min-words",
            "10",
            "--stride",
            "32",
            "--max-tokens",
            "600",
            "--last-word-items",
            "5",
            "--json",
            run_dir / "progress.json",
        ],
        capsys,
    )
    assert code == 0, err
    windows = [line for line in err.splitlines() if line.startswith("held-out text: ")]
    tasks = [line for line in err.splitlines() if line.startswith("last-word tasks: ")]
    assert re.fullmatch(r"held-out text: (\d+) of \1 windows, [\d,.]+/s, ETA 0m00s", windows[-1])
    assert re.fullmatch(
        r"last-word tasks: (\d+) of \1 scored \(exact match so far [01]\.\d{3}\), "
        r"[\d,.]+/s, ETA 0m00s",
        tasks[-1],
    )
    assert len(windows) > 1 and not re.search(r"^(held-out text|last-word tasks): ", out, re.M)


def test_cli_scores_a_task_file_on_any_text_and_names_the_flags_when_no_paragraph_fits(
    run_dir, capsys, tmp_path
):
    text = tmp_path / "text.txt"
    text.write_text(synthetic_corpus(5, 20))
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        '{"prompt": "the red fox", "answer": " jumps"}\n{"prompt": "", "answer": " the"}\n'
    )
    code, out, err = run_cli(
        [
            "--ckpt",
            run_dir / "small",
            "--data",
            text,
            "--tasks",
            tasks,
            "--min-words",
            "10",
            "--json",
            tmp_path / "r.json",
        ],
        capsys,
    )
    assert code == 0, err
    assert "tasks: exact match (2 items)" in out
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["tasks"]["file"] == str(tasks) and result["tasks"]["items"] == 2
    assert result["held_out"]["data"] == str(text) and result["last_word"]["items"] > 5
    # the library says what is wrong; the command adds the flags that change it
    code, out, err = run_cli(
        ["--ckpt", run_dir / "small", "--data", text, "--min-words", "1000"], capsys
    )
    assert (
        code == 2
        and "no held-out paragraph has 1000+ words" in err
        and "(--data, --min-words)" in err
    ), err


def test_held_out_documents_retokenize_to_the_shards(run_dir):
    import data

    tokenizer = data.TokenData(run_dir / "data").tokenizer
    from_shards = cmd.held_out_from_data_dir(run_dir / "data", tokenizer, tokenizer.to_json())
    from_text = ev.held_out_from_documents("text", from_shards.documents, tokenizer)
    np.testing.assert_array_equal(from_text.ids, from_shards.ids)
    assert from_text.n_bytes == from_shards.n_bytes


def test_decode_documents_across_shards():
    tok = CharTokenizer(list("abc|"))
    eot = 3
    shards = [np.array([3, 0, 1, 3, 2]), np.array([2, 0]), np.array([3, 1])]  # "|ab|c" "ca" "|b"
    assert list(cmd.decode_documents(shards, eot, tok)) == ["ab", "cca", "b"]
    assert list(cmd.decode_documents([np.array([0, 1])], None, tok)) == ["ab"]


def test_tokenizer_fair_comparison_by_bits_per_byte(run_dir, capsys):
    """A model with all-zero logits spends ln V nats per token: bytes-level (V = 257, about one token per byte)
    and BPE (V = 300, fewer tokens) checkpoints get exactly tokens * log2(V) / bytes bits per byte."""
    import bpe
    import model

    text = synthetic_corpus(1, 8)
    (run_dir / "compare.txt").write_text(text)
    paths = []
    for name, tokenizer in (
        ("bytes", bpe.Tokenizer.from_merges([])),
        ("bpe", ev.load_model(run_dir / "small")[1]),
    ):
        config = model.GPTConfig(
            vocab_size=len(tokenizer), block_size=32, n_layer=1, n_head=2, n_kv_head=1, n_embd=16
        )
        gpt = model.GPT(config)
        torch.nn.init.zeros_(gpt.lm_head.weight)  # logits 0: the uniform model
        paths.append(
            save_checkpoint(run_dir / f"uniform_{name}.pt", gpt, tokenizer, run_dir / "data")
        )
    code, out, err = run_cli(
        [
            "compare",
            "--ckpt",
            paths[0],
            "--ckpt",
            paths[1],
            "--data",
            run_dir / "compare.txt",
            "--json",
            run_dir / "compare.json",
        ],
        capsys,
    )
    assert code == 0, err
    rows = json.loads((run_dir / "compare.json").read_text())
    n_bytes = sum(
        len(p.encode()) for p in cmd.split_paragraphs(text)
    )  # data.py: one document per paragraph
    for row, vocab in zip(rows, (257, 300)):
        assert row["bytes"] == n_bytes and row["vocab_size"] == vocab
        assert row["perplexity"] == pytest.approx(vocab, rel=1e-5)
        assert row["bits_per_byte"] == pytest.approx(
            row["tokens"] * math.log2(vocab) / n_bytes, rel=1e-5
        )
    assert (
        rows[1]["tokens"] < rows[0]["tokens"]
        and rows[1]["bits_per_byte"] < rows[0]["bits_per_byte"]
    )
    assert f"fewest bits per byte (predicts this text best): {paths[1]}" in out


def test_sample_streams_what_generate_produces(run_dir, capsys):
    model, tokenizer, _ = ev.load_model(run_dir / "small")
    prompt = "the old cat"
    for temperature in (0.0, 1.0):
        pieces = list(ev.stream_sample(model, tokenizer, prompt, 40, temperature, top_k=20, seed=3))
        idx = torch.tensor([tokenizer.encode(prompt)])
        ref = model.generate(
            idx, 40, temperature=temperature, top_k=20, generator=torch.Generator().manual_seed(3)
        )[0, idx.shape[1] :].tolist()
        if tokenizer.eot_id in ref:
            ref = ref[: ref.index(tokenizer.eot_id)]
        assert "".join(pieces) == tokenizer.decode(ref)
    code, out, _ = run_cli(
        ["sample", "--ckpt", run_dir / "small", "--prompt", prompt, "--max-new-tokens", "5"], capsys
    )
    assert code == 0 and out.startswith(prompt)


def test_emergence_from_sweep_checkpoints(run_dir, capsys, tmp_path):
    code, out, err = run_cli(
        [
            "emergence",
            "--ckpt",
            run_dir / "large",
            "--ckpt",
            run_dir / "small",
            "--k",
            "2",
            "--plot",
            tmp_path / "e.png",
            "--json",
            tmp_path / "e.json",
            "--max-tokens",
            "500",
        ],
        capsys,
    )
    assert code == 0, err
    assert "0.03   0.08   0.17   0.33   0.59   0.77" not in out  # k = 2 here
    rows = json.loads((tmp_path / "e.json").read_text())
    assert [r["checkpoint"].split("/")[-2] for r in rows] == ["small", "large"]  # sorted by size
    for r in rows:
        assert 0 <= r["exact_match_2"] <= r["per_token_accuracy"] <= 1 and r["tokens"] == 500
    assert (tmp_path / "e.png").stat().st_size > 10_000
    assert cmd.expand_runs([run_dir]) == [run_dir / "large", run_dir / "small"]  # a sweep directory
    code, out, _ = run_cli(["emergence"], capsys)
    assert "0.03   0.08   0.17   0.33   0.59   0.77" in out


def test_contamination_cli_on_token_shards_and_drop(run_dir, capsys, tmp_path):
    """Train split of the packed corpus vs its val split (cut after dedup: nothing shared), then an eval file with
    one paragraph copied from the training corpus: that one is flagged and dropped."""
    import data

    train_docs = list(cmd.read_documents(str(run_dir / "data"), "train"))
    copied = train_docs[3].split("\n")[0]
    eval_file = tmp_path / "eval.txt"
    eval_file.write_text(synthetic_corpus(5, 3).replace("\n\n", f"\n\nNew text : {copied}\n\n", 1))
    code, out, err = run_cli(
        [
            "contamination",
            "--train",
            run_dir / "data",
            "--eval",
            eval_file,
            "--drop",
            tmp_path / "clean.jsonl",
            "--json",
            tmp_path / "c.json",
        ],
        capsys,
    )
    assert code == 0, err
    report = json.loads((tmp_path / "c.json").read_text())
    assert [d["contaminated"] for d in report["documents"]] == [False, True, False, False]
    assert (
        report["train_documents"]
        == data.load_manifest(run_dir / "data")["splits"]["train"]["documents"]
    )
    kept = [
        json.loads(line)["text"] for line in (tmp_path / "clean.jsonl").read_text().splitlines()
    ]
    assert len(kept) == 3 and all(copied not in k for k in kept)


def test_bad_inputs_get_one_line_and_exit_code_2(run_dir, capsys, tmp_path):
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "ckpt_0000001.pt").write_bytes(b"not a zip file at all")
    gpt, tokenizer, ckpt = ev.load_model(run_dir / "small")
    no_tokenizer = tmp_path / "ckpt_0000002.pt"
    torch.save(
        {
            "version": 1,
            "step": 2,
            "model": gpt.state_dict(),
            "model_config": dataclasses.asdict(gpt.config),
            "data_dir": ckpt["data_dir"],
        },
        no_tokenizer,
    )
    bad_tasks = tmp_path / "tasks.jsonl"
    bad_tasks.write_text(
        '{"prompt": "a", "answer": " b"}\n{"prompt": "a", "answer": " b"}\n{oops}\n'
    )
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n   \n")
    eval_text = (
        tmp_path / "eval.txt"
    )  # its own file: the case must not depend on another test's output
    eval_text.write_text("The quick brown fox jumps over the lazy dog near the river bank today.\n")
    cases = [
        (["--ckpt", tmp_path / "missing"], "not found"),
        (["--ckpt", damaged], "no loadable checkpoint"),
        (["--ckpt", no_tokenizer], "has no tokenizer"),
        (["--ckpt", run_dir / "small", "--tasks", bad_tasks], "line 3"),
        (["--ckpt", run_dir / "small", "--data", empty], "empty"),
        (
            ["contamination", "--train", empty, "--eval", eval_text],
            "training corpus has no documents",
        ),
        (
            ["--ckpt", run_dir / "small", "--max-tokens", 100, "--json", empty / "out.json"],
            "cannot write",
        ),
        (
            [
                "contamination",
                "--train",
                eval_text,
                "--eval",
                eval_text,
                "--drop",
                empty / "kept.jsonl",
            ],
            "cannot write",
        ),
        (
            [
                "emergence",
                "--ckpt",
                run_dir / "small",
                "--max-tokens",
                100,
                "--plot",
                empty / "e.png",
            ],
            "cannot write",
        ),
    ]
    for argv, needle in cases:
        code, out, err = run_cli(argv, capsys)
        assert code == 2, (argv, out, err)
        assert needle in err and len(err.strip().splitlines()) == 1, err


# --- issue 24: --device checked once, task files read through fileio --------------------------------------------


def test_docstring_examples():
    import doctest

    assert doctest.testmod(ev).failed == 0 and doctest.testmod(cmd).failed == 0


@pytest.mark.parametrize(
    "argv",
    [
        ["--device", "meta"],
        ["sample", "--device", "meta"],
        ["compare", "--ckpt", "a", "--ckpt", "b", "--device", "meta"],
        ["emergence", "--ckpt", "a", "--device", "meta"],
        ["--device", "nosuch"],
        ["sample", "--device", "xla"],
        ["--device", "cuda:3"],
    ],
)
def test_a_bad_device_is_one_line_naming_it_before_any_work(argv, tmp_path, capsys, monkeypatch):
    """meta used to reach the model and fail inside torch (a RuntimeError traceback)."""
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(
        argv + ["--ckpt", str(tmp_path / "nosuch")] if argv[0].startswith("--") else argv, capsys
    )
    assert code == 2 and not out and len(err.strip().splitlines()) == 1, err
    assert f"--device {argv[-1]}" in err and "Traceback" not in err
    assert not list(tmp_path.iterdir())


def test_the_device_check_knows_what_this_machine_has(monkeypatch):
    """devices.resolve_device, the one check every CLI uses: cuda:N must exist; auto picks CUDA, then MPS, then CPU."""

    assert devices.resolve_device("auto") == torch.device(
        "cuda"
        if torch.cuda.is_available()
        else "mps"
        if torch.backends.mps.is_available()
        else "cpu"
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert devices.resolve_device("cuda:1") == torch.device("cuda", 1)
    assert (
        devices.resolve_device("cuda") == torch.device("cuda", 0) == devices.resolve_device("auto")
    )
    monkeypatch.setenv("LOCAL_RANK", "1")  # under torchrun: this rank's GPU
    assert devices.resolve_device("cuda") == torch.device("cuda", 1)
    with pytest.raises(ValueError, match="`device` cuda:2: this machine has 2 CUDA device"):
        devices.resolve_device("cuda:2")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ev.EvalError, match="--device cuda:0: no CUDA device here"):
        cmd.resolve_device("cuda:0")


def test_a_task_file_nested_thousands_deep_is_one_line(tmp_path):
    deep = tmp_path / "tasks.jsonl"
    deep.write_text('{"prompt": "a", "answer": "b"}\n' + "[" * 5000 + "\n")
    with pytest.raises(
        ev.EvalError, match="tasks.jsonl line 2: JSON nested more than 1,000 levels deep"
    ):
        cmd.read_tasks(deep)
    deep.write_bytes(b'{"prompt": "\xff", "answer": "b"}\n')
    with pytest.raises(ev.EvalError, match="tasks.jsonl line 1: "):
        cmd.read_tasks(deep)


def test_reports_are_written_whole_with_the_umask_modes(tmp_path):
    """--json and --drop outputs are for others to read: 0644 under umask 022 (a bare mkstemp leaves 0600)."""
    old = os.umask(0o022)
    try:
        path = cmd.write_json({"a": 1}, tmp_path / "r.json")
    finally:
        os.umask(old)
    assert json.loads(path.read_text()) == {"a": 1} and oct(path.stat().st_mode & 0o777) == "0o644"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


# ------------------------------------------------------------------------------ associative recall (MQAR)


def test_mqar_rows_ask_every_listed_key_for_its_value():
    idx, targets = ev.mqar_batch(6, 5, vocab_size=32, generator=torch.Generator().manual_seed(3))
    assert idx.shape == targets.shape == (5, 24)
    for row, target in zip(idx.tolist(), targets.tolist()):
        pairs = dict(zip(row[:12:2], row[1:12:2]))
        assert len(pairs) == 6 and all(k < 16 <= v < 32 for k, v in pairs.items())  # distinct keys
        assert sorted(row[12::2]) == sorted(pairs)  # each key asked once
        assert [t for t in target if t >= 0] == [
            pairs[k] for k in row[12::2]
        ]  # answered by its value
        assert target[:12] == [-1] * 12 and target[13::2] == [-1] * 6
    with pytest.raises(ev.EvalError, match="17 key-value pairs need 17 distinct keys"):
        ev.mqar_batch(17, 1, vocab_size=32)


def test_recall_accuracy_is_one_for_a_model_that_looks_the_key_up():
    class LookUp(nn.Module):
        """Predicts after each token the token that followed its previous occurrence (an ideal induction head)."""

        config = type("C", (), {"vocab_size": 64})

        def forward(self, idx):
            logits = torch.zeros(*idx.shape, 64)
            for b, row in enumerate(idx.tolist()):
                for t, token in enumerate(row):
                    seen = [s for s in range(t) if row[s] == token]
                    if seen:
                        logits[b, t, row[seen[-1] + 1]] = 1
            return logits, None

    assert ev.recall_accuracy(LookUp(), 5, n_rows=8) == 1.0


def test_attention_learns_the_two_pair_task_far_above_a_uniform_guess():
    # Chance is 1/32 for a uniform guess among the values. 0.75 is NOT recall: every key is asked
    # once, so answering the second question by elimination is always right (the plateau every
    # model of docs/recall sits on). What this checks is that training learns the task's format.
    torch.manual_seed(0)
    net = ev.train_recall("attention", 0, [2], steps=500, lr=3e-3)
    assert ev.recall_accuracy(net, 2, n_rows=256, seed=1) >= 0.7


def test_recall_command_writes_its_report_outside_the_repository_unless_asked(
    tmp_path, capsys, monkeypatch
):
    # no --out: a fresh folder in the temporary folder; docs/recall (the committed run) untouched
    root = pathlib.Path(ev.__file__).resolve().parent
    committed = {p.name: p.read_bytes() for p in (root / "docs" / "recall").iterdir()}
    top = sorted(p.name for p in root.iterdir())
    monkeypatch.chdir(root)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert (
        cmd.main(
            [
                "recall",
                "--steps",
                "2",
                "--seeds",
                "2",
                "--pairs",
                "2",
                "3",
                "--width",
                "16",
                "--lr",
                "1e-3",
                "3e-3",
                "--workers",
                "3",
                "--contexts",
                "32",
                "64",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    out = pathlib.Path(printed.rsplit("report: ", 1)[1].strip()).parent
    assert out.parent == tmp_path and out.name.startswith("recall-")
    assert {p.name: p.read_bytes() for p in (root / "docs" / "recall").iterdir()} == committed
    assert sorted(p.name for p in root.iterdir()) == top
    report = (out / "REPORT.md").read_text()
    assert report in printed
    for kind in ("attention", "linear", "hybrid"):
        # accuracy, sweep, 2 costs
        assert sum(line.startswith(f"| {kind} |") for line in report.splitlines()) == 4
    assert (
        "| model | params | 2 pairs | 3 pairs |" in report
        and "![recall vs pairs](recall.png)" in report
    )
    result = json.loads((out / "recall.json").read_text())
    assert (
        len(result["rows"]) == 6
        and len(result["sweep"]) == 6
        and (out / "recall.png").stat().st_size > 1000
    )
    assert all(row["lr"] == result["lr"][row["kind"]] for row in result["rows"])
    costs = {(c["kind"], c["context"]): c["state_bytes"] for c in result["costs"]}
    assert (
        costs["attention", 64] == 2 * costs["attention", 32]
        and costs["linear", 64] == costs["linear", 32]
    )
    assert cmd.main(["recall", "--width", "7", "--out", str(tmp_path / "r")]) == 2


@pytest.mark.parametrize("kind", ["attention", "hybrid"])
def test_attention_and_hybrid_recall_every_pair_with_the_recall_recipe(kind):
    """The lesson's property, not only its code: `AAAA` and `LLLA` from train_recall (one head of
    64, recall_init) answer >= 0.95 of fresh questions at 2, 4 and 8 pairs after 400 steps. With
    GPT-2's N(0, 0.02) init, or heads of 16, attention still answers with any value of the row;
    with the gates at model.py's retention 0.95, so does the hybrid."""
    net = ev.train_recall(kind, 0, [2, 4, 8], steps=400)
    accuracy = {n: ev.recall_accuracy(net, n, seed=10_000) for n in (2, 4, 8)}
    assert min(accuracy.values()) >= 0.95, accuracy


def _recall_table(attention, linear, hybrid):
    """A result holding only the accuracy table: per kind, one {pairs: accuracy} per seed."""
    rows = [
        {"kind": kind, "accuracy": dict(zip((2, 4, 8), seed))}
        for kind, seeds in (("attention", attention), ("linear", linear), ("hybrid", hybrid))
        for seed in seeds
    ]
    return {"pair_counts": [2, 4, 8], "rows": rows}


def test_recall_verdict_is_computed_from_the_table_seed_by_seed():
    attention, linear, hybrid = (
        [(1.0, 0.99, 0.97)] * 3,
        [(0.8, 0.5, 0.3)] * 3,
        [(1.0, 0.9, 0.8)] * 3,
    )
    assert ev.recall_verdict(_recall_table(attention, linear, hybrid))["shown"]
    # one attention seed left on the 1 / pairs plateau at 8 pairs
    verdict = ev.recall_verdict(_recall_table(attention[:2] + [(1.0, 0.99, 0.13)], linear, hybrid))
    assert verdict["attention"] == [True, True, False] and not verdict["shown"]
    # one hybrid seed less than half-way from linear (0.3) to attention (0.97) at 8 pairs
    verdict = ev.recall_verdict(_recall_table(attention, linear, hybrid[:2] + [(1.0, 0.9, 0.6)]))
    assert verdict["hybrid"] == [True, True, False] and not verdict["shown"]
    # linear that does not lose recall as pairs grow; two seeds are not enough
    assert not ev.recall_verdict(_recall_table(attention, [(0.8, 0.8, 0.75)] * 3, hybrid))["shown"]
    assert not ev.recall_verdict(_recall_table(attention[:2], linear[:2], hybrid[:2]))["shown"]


def test_decode_cost_counts_the_kv_cache_and_the_state_each_token_reads():
    from model import GPTConfig

    # (kind -> a token's KV bytes in its attention layers, its layers' fixed state bytes), fp32
    head_dim, kv_per_token, state = 16, 2 * 2 * 16 * 4, 2 * 16 * 16 * 4
    for pattern, n_attention in (("AAAA", 4), ("LLLL", 0), ("LLLA", 1)):
        config = GPTConfig(
            vocab_size=64,
            block_size=8,
            n_layer=4,
            n_head=2,
            n_kv_head=2,
            n_embd=32,
            layer_pattern=pattern,
        )
        assert config.head_dim == head_dim
        for context in (100, 1000):
            state_bytes, weight_bytes = ev.decode_bytes_per_token(config, context)
            assert state_bytes == n_attention * kv_per_token * context + (4 - n_attention) * state
            assert weight_bytes == 4 * scaling.count_params(config)
    # the timed decode reports the same bytes, and gives the thread count back
    import model as model_lib

    net = model_lib.GPT(
        GPTConfig(
            vocab_size=64,
            block_size=8,
            n_layer=4,
            n_head=2,
            n_kv_head=2,
            n_embd=32,
            layer_pattern="LLLA",
        )
    ).eval()
    threads = torch.get_num_threads()
    cost = recall_report.decode_cost(net, 40, threads=1)
    assert cost["state_bytes"] == kv_per_token * 40 + 3 * state and cost["ms_per_token"] > 0
    assert torch.get_num_threads() == threads
