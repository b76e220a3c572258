"""Tests for the Hugging Face bridge (hf.py: export_hf / load_hf and the `model.py export` / `import-hf` commands;
oracle: transformers' LlamaForCausalLM, its generate, and AutoTokenizer. The models are trained a few steps here
with train.py (2 layers, width 32, GQA 4/2, rope_theta 500), tied and untied; transformers is imported once."""

import json
import pathlib
import random
import shutil
import unicodedata

import pytest
import torch

transformers = pytest.importorskip(
    "transformers",
    reason="the HF bridge tests need transformers (pip install -r requirements-test.txt)",
)
pytest.importorskip(
    "safetensors",
    reason="the HF bridge tests need safetensors (pip install -r requirements-test.txt)",
)

import bpe  # noqa: E402
from machinery import hf, tokenizer_files  # noqa: E402
from machinery.commands import evaluate as evaluate_command  # noqa: E402
from machinery.commands import model as model_command  # noqa: E402
import model  # noqa: E402
import train  # noqa: E402
from machinery import run as train_run  # noqa: E402
from machinery.commands import train as train_command  # noqa: E402
from test_bpe import EMBEDDED, corpus_texts  # noqa: E402
from test_train import make_corpus, prepare_corpus  # noqa: E402

GQA_ARGS = [
    "--model",
    "tiny",
    "--batch-size",
    "4",
    "--block-size",
    "32",
    "--lr",
    "3e-3",
    "--warmup-steps",
    "5",
    "--eval-batches",
    "2",
    "--eval-interval",
    "1000",
    "--log-interval",
    "1000",
    "--num-samples",
    "0",
    "--peak-flops",
    "1e12",
]
SHAPE = "n_layer=2,n_head=4,n_kv_head=2,n_embd=32,block_size=32,rope_theta=500.0"


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory):
    return prepare_corpus(tmp_path_factory.mktemp("hf-data"), make_corpus())


@pytest.fixture(scope="module", params=["tied", "untied"])
def run(request, dataset_dir, tmp_path_factory):
    """A train.py run of 30 steps and its export: (run dir, exported dir, our model, tokenizer, val ids)."""
    out = tmp_path_factory.mktemp(f"hf-run-{request.param}")
    shape = SHAPE + (",tie_embeddings=false" if request.param == "untied" else "")
    cfg = train_command.parse_config(
        [
            "--data",
            str(dataset_dir),
            "--out-dir",
            str(out / "run"),
            *GQA_ARGS,
            "--model-args",
            shape,
            "--max-steps",
            "30",
            "--ckpt-interval",
            "30",
        ]
    )
    train_run.train(cfg, log=lambda *a, **k: None)
    assert model_command.main(["export", "--ckpt", str(out / "run"), "--to", str(out / "hf")]) == 0
    ours, tokenizer = train.model_from_checkpoint(train.load_checkpoint(out / "run"))
    val = "\n\n".join(make_corpus(4, seed=7))
    return out / "run", out / "hf", ours, tokenizer, tokenizer.encode(val)


@pytest.fixture(scope="module")
def theirs(run):
    return transformers.AutoModelForCausalLM.from_pretrained(run[1], dtype=torch.float32).eval()


def logits_both(ours, theirs, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        return ours(ids)[0], theirs(ids).logits


def test_config_says_what_the_model_is(run, theirs):
    _, hf_dir, ours, _, _ = run
    c = theirs.config
    assert type(theirs).__name__ == "LlamaForCausalLM"
    assert (c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.hidden_size) == (
        2,
        4,
        2,
        32,
    )
    assert (
        c.intermediate_size == ours.config.ffn_dim
        and c.rms_norm_eps == ours.config.norm_eps == 1e-5
    )
    assert c.rope_parameters["rope_theta"] == 500.0 and c.max_position_embeddings == 32
    assert c.tie_word_embeddings == ours.config.tie_embeddings
    names = set(json.loads((hf_dir / "config.json").read_text()))
    assert {"rope_theta", "bos_token_id", "eos_token_id", "vocab_size"} <= names
    assert sorted(p.name for p in hf_dir.iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]


def test_logits_equal_transformers_on_random_and_real_ids(run, theirs):
    _, _, ours, _, val_ids = run
    random_ids = torch.randint(
        0, ours.config.vocab_size, (3, 32), generator=torch.Generator().manual_seed(0)
    )
    real_ids = torch.tensor([val_ids[i : i + 32] for i in (0, 40, 80)])
    for ids in (random_ids, real_ids, real_ids[:, :7]):
        a, b = logits_both(ours, theirs, ids)
        assert (a - b).abs().max().item() < 1e-4
    assert a.std().item() > 0.5  # trained logits, not a near-constant output


def test_greedy_generation_equals_transformers_generate(run, theirs):
    _, _, ours, _, val_ids = run
    prompt = torch.tensor([val_ids[:6], val_ids[50:56]])
    theirs.generation_config.eos_token_id = None  # EOT is an ordinary token here: never stop early
    theirs.generation_config.pad_token_id = 0
    expected = theirs.generate(prompt, max_new_tokens=24, do_sample=False, max_length=None)
    assert torch.equal(ours.generate(prompt, 24, temperature=0), expected)


def test_import_reproduces_the_weights_and_evaluate_samples_from_it(run, tmp_path, capsys):
    run_dir, hf_dir, ours, tokenizer, _ = run
    assert (
        model_command.main(
            ["import-hf", "--from", str(hf_dir), "--to", str(tmp_path / "imported.pt")]
        )
        == 0
    )
    ckpt = train.load_checkpoint(tmp_path / "imported.pt")
    original = train.load_checkpoint(run_dir)
    assert (
        ckpt["model_config"] == original["model_config"]
        and ckpt["tokenizer_json"] == original["tokenizer_json"]
    )
    assert ckpt["model"].keys() == original["model"].keys()
    assert all(torch.equal(ckpt["model"][k], original["model"][k]) for k in ckpt["model"])
    reloaded, reloaded_tokenizer = hf.load_hf(hf_dir)
    assert reloaded.config == ours.config and reloaded_tokenizer.to_json() == tokenizer.to_json()
    assert (
        tokenizer_files.read_tokenizer(hf_dir / "tokenizer.json").to_json() == tokenizer.to_json()
    )  # --tokenizer
    capsys.readouterr()
    assert evaluate_command.main(
        [
            "sample",
            "--ckpt",
            str(tmp_path / "imported.pt"),
            "--prompt",
            "the parser",
            "--max-new-tokens",
            "8",
            "--device",
            "cpu",
        ]
    ) in (None, 0)
    assert capsys.readouterr().out.startswith("the parser")


def test_train_init_from_an_imported_checkpoint(run, dataset_dir, tmp_path):
    _, hf_dir, ours, _, _ = run
    model_command.main(["import-hf", "--from", str(hf_dir), "--to", str(tmp_path / "imported.pt")])
    cfg = train_command.parse_config(
        [
            "--data",
            str(dataset_dir),
            "--out-dir",
            str(tmp_path / "more"),
            *GQA_ARGS,
            "--init-from",
            str(tmp_path / "imported.pt"),
            "--max-steps",
            "2",
        ]
    )
    trainer = train_run.Trainer(cfg, log=lambda *a, **k: None)
    start = trainer.raw_model.state_dict()
    assert all(torch.equal(start[k], v) for k, v in ours.state_dict().items())
    assert trainer.run()["step"] == 2
    other = bpe.train_bpe("an unrelated corpus " * 30, 300)
    hf.save_imported_checkpoint(ours, other, tmp_path / "other.pt", "test")
    cfg = train_command.parse_config(
        [
            "--data",
            str(dataset_dir),
            "--out-dir",
            str(tmp_path / "other"),
            *GQA_ARGS,
            "--init-from",
            str(tmp_path / "other.pt"),
        ]
    )
    with pytest.raises(
        train.TrainError, match="`init_from` .* has another tokenizer"
    ):  # the CLI shows --init-from
        train_run.Trainer(cfg, log=lambda *a, **k: None)


def test_export_verify_reports_the_comparison(run, tmp_path, capsys):
    run_dir = run[0]
    capsys.readouterr()
    assert (
        model_command.main(
            ["export", "--ckpt", str(run_dir), "--to", str(tmp_path / "hf"), "--verify"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "greedy 16 tokens identical; AutoTokenizer ids identical" in out
    assert float(out.split("max |logit diff| ")[1].split()[0]) < 1e-4


def test_import_of_a_model_saved_by_transformers(tmp_path):
    """The other direction with nothing of ours in the weights: a random LlamaForCausalLM saved by transformers."""
    config = transformers.LlamaConfig(
        vocab_size=300,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=3,
        max_position_embeddings=16,
        rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
    )
    torch.manual_seed(0)
    theirs = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_(0.0, 0.3)  # large weights, so any layout error shows
    theirs.save_pretrained(tmp_path)
    ours, tokenizer = hf.load_hf(tmp_path)
    assert tokenizer is None and ours.config.norm_eps == 1e-6 and not ours.config.tie_embeddings
    ids = torch.randint(0, 300, (2, 16), generator=torch.Generator().manual_seed(1))
    a, b = logits_both(ours, theirs, ids)
    assert (a - b).abs().max().item() < 1e-4


# ----------------------------------------------------------------------------------------------------------------
# The tokenizer: AutoTokenizer must give our ids, on every corpus and for every pattern
# ----------------------------------------------------------------------------------------------------------------

SPECIALS = "a<|endoftext|>b <|endoftext|><|endoftext|>\n<|endoftext|> end"


def auto_tokenizer(tokenizer, directory: pathlib.Path):
    directory.mkdir()
    for name, doc in hf.hf_tokenizer_files(tokenizer, 1 << 20).items():
        (directory / name).write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    return transformers.AutoTokenizer.from_pretrained(directory)


@pytest.mark.parametrize("pattern", ["gpt4", "gpt2", r"\p{L}+|\p{N}|[^\p{L}\p{N}]+"])
def test_autotokenizer_ids_equal_ours_on_the_corpora(pattern, shared_data, tmp_path):
    tokenizer = bpe.train_bpe(
        [shared_data / "tinystories" / "TinyStories-train-head-2MiB.txt"], 1024, pattern=pattern
    )
    theirs = auto_tokenizer(tokenizer, tmp_path / "tok")
    texts = corpus_texts(shared_data)
    for name in ("wikitext-test", "tinystories", "c4", "embedded", "german.txt", "address.txt"):
        text = texts[name][:40_000]
        ids = tokenizer.encode(text, allowed_special="all")
        assert theirs(text)["input_ids"] == ids, name
        assert theirs.decode(ids) == text
    assert theirs(SPECIALS)["input_ids"] == tokenizer.encode(SPECIALS, allowed_special="all")
    assert theirs.eos_token == "<|endoftext|>" and theirs.eos_token_id == tokenizer.eot_id


# A custom pattern with counted possessive repeats: to_hf must write each X{m,n}+ as an atomic group.
CUSTOM_POSSESSIVE = r"\p{L}{2}+|\p{N}{1,2}+|\s+|[^\p{L}\p{N}\s]+|\p{L}"


def hard_text(seed: int, n: int = 400) -> str:
    """What regex engines disagree on, shuffled: numbers of 1-12 digits (ASCII, Arabic-Indic, full-width, mixed),
    contractions in every case, runs of spaces/tabs/newlines, CRLF, NBSP, ideographic space, emoji, other scripts."""
    rng = random.Random(seed)
    digits = ["0123456789", "٠١٢٣٤٥٦٧٨٩", "０１２３４５６７８９", "0١２3"]
    contractions = [
        "".join(rng.choice((c.lower(), c.upper())) for c in "'" + end)
        for end in ("s", "t", "re", "ve", "m", "ll", "d")
        for _ in range(4)
    ]
    spaces = [
        " ",
        "  ",
        "   ",
        "\t",
        "\t\t ",
        "\n",
        "\n\n\n",
        "\r\n",
        " \r\n",
        "\r\n\r\n",
        "\u00a0",
        " \u00a0\u00a0",
        "\u3000",
        "\u2028",
        "\x0b",
        "\x85 ",
    ]
    words = [
        "the",
        " year",
        " It",
        "DON",
        "we",
        " naïve",
        "Ελληνικά",
        " русский",
        "中文",
        "🙂",
        "👩‍👩‍👧",
        "!!",
        "$",
        "(x)",
    ]
    parts = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.35:
            alphabet = rng.choice(digits)
            parts.append(
                rng.choice(["", " "])
                + "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12)))
            )
        elif kind < 0.5:
            parts.append(rng.choice(contractions))
        elif kind < 0.75:
            parts.append(rng.choice(spaces))
        else:
            parts.append(rng.choice(words))
    return "".join(parts) + rng.choice(spaces)


def hf_split(tokenizer):
    """The Split step of the exported pre-tokenizer, run by tokenizers itself (Oniguruma)."""
    from tokenizers import Regex, pre_tokenizers

    exported = hf.tokenizer_to_hf(tokenizer)["pre_tokenizer"]["pretokenizers"][0]["pattern"][
        "Regex"
    ]
    return pre_tokenizers.Split(Regex(exported), "isolated")


@pytest.mark.parametrize("pattern", ["gpt4", "gpt2", CUSTOM_POSSESSIVE])
def test_autotokenizer_ids_equal_ours_on_numbers_contractions_and_odd_whitespace(pattern, tmp_path):
    r"""Issue 24: " 2000" was [20][00] in HF and [200][0] here: the exported `\p{N}{1,3}+` is not possessive in
    Oniguruma. A tokenizer trained on such text, so that number tokens exist, must give the same ids."""
    tokenizer = bpe.train_bpe(EMBEDDED + hard_text(1), 700, pattern=pattern)
    theirs = auto_tokenizer(tokenizer, tmp_path / "tok")
    for text in (
        hard_text(2),
        hard_text(3),
        tokenizer_files.PROBE_TEXT,
        "in 2000 and 1234567, 12345678901 or ١٢٣٤٥٦٧",
    ):
        assert [p for p, _ in hf_split(tokenizer).pre_tokenize_str(text)] == bpe.pretokenize(
            text, tokenizer.pattern
        ), text[:80]
        ids = tokenizer.encode(text, allowed_special="all")
        assert theirs(text)["input_ids"] == ids, text[:80]
        assert theirs.decode(ids) == text


@pytest.mark.parametrize("pattern", ["gpt4", "gpt2", CUSTOM_POSSESSIVE])
def test_exported_regex_cuts_every_known_character_like_ours(pattern):
    """Every character of Python's Unicode tables (14.0), each between neighbours that patterns treat differently
    (digits, letters, apostrophes, spaces, newlines): the pieces of HF's engine are ours."""
    tokenizer = bpe.train_bpe("a b 1 2", 260, pattern=pattern)
    context = "0'sS \n\r\u00a0a.1"
    known = [chr(c) for c in range(0x110000) if unicodedata.category(chr(c)) not in ("Cn", "Cs")]
    text = "".join(c + context[i % len(context)] for i, c in enumerate(known))
    assert [p for p, _ in hf_split(tokenizer).pre_tokenize_str(text)] == bpe.pretokenize(
        text, tokenizer.pattern
    )


@pytest.mark.parametrize(
    "pattern, message",
    [
        (
            r"\w+$|\w|\W",
            "cuts tokenizer_files.PROBE_TEXT otherwise",
        ),  # Ruby's $ also matches before every newline
        (r"\p{L}+|(?s:.)", "rejects"),  # (?s) is Ruby's (?m): Oniguruma has no s flag
    ],
)
def test_a_custom_pattern_hf_reads_otherwise_is_refused_in_one_line(pattern, message, tmp_path):
    tokenizer = bpe.train_bpe("hello world 1234 " * 20, 270, pattern=pattern)
    with pytest.raises(bpe.TokenizerError, match=message):
        hf.tokenizer_to_hf(tokenizer)
    tiny = model.GPT(model.GPTConfig(vocab_size=300, n_layer=1, n_head=2, n_kv_head=2, n_embd=16))
    with pytest.raises(
        hf.HFError, match="cannot export the tokenizer: pattern .*; use 'gpt2', 'gpt4'"
    ) as info:
        hf.export_hf(tiny, tokenizer, tmp_path / "out")
    assert "\n" not in str(info.value) and not (tmp_path / "out").exists()


def test_gpt2s_own_tokenizer_survives_the_trip(shared_data, tmp_path):
    """GPT-2's files give ids that are not in merge order ('!' is 0): tokenizer.json must keep them."""
    gpt2 = tokenizer_files.load_gpt2_bpe(
        shared_data / "gpt2-bpe" / "encoder.json", shared_data / "gpt2-bpe" / "vocab.bpe"
    )
    theirs = auto_tokenizer(gpt2, tmp_path / "gpt2")
    text = EMBEDDED + corpus_texts(shared_data)["wikitext-test"][:20_000]
    assert theirs(text)["input_ids"] == gpt2.encode(text)
    back = json.loads(hf.tokenizer_from_hf(hf.tokenizer_to_hf(gpt2)).to_json())
    assert back == {**json.loads(gpt2.to_json()), "name": "bpe"}  # tokenizer.json has no name field


# ----------------------------------------------------------------------------------------------------------------
# Bad input: one line, exit 2, nothing written
# ----------------------------------------------------------------------------------------------------------------


def cli_error(capsys, args) -> str:
    capsys.readouterr()
    assert model_command.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    return err


def edited_copy(hf_dir: pathlib.Path, target: pathlib.Path, **config_changes) -> pathlib.Path:
    shutil.copytree(hf_dir, target)
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, **config_changes}))
    return target


def test_bad_input_gets_one_line_and_exit_2(run, tmp_path, capsys):
    run_dir, hf_dir, _, _, _ = run
    ckpt = str(tmp_path / "x.pt")
    (tmp_path / "empty").mkdir()
    assert "config.json" in cli_error(
        capsys, ["import-hf", "--from", str(tmp_path / "empty"), "--to", ckpt]
    )
    mistral = edited_copy(
        hf_dir, tmp_path / "mistral", architectures=["MistralForCausalLM"], model_type="mistral"
    )
    assert "MistralForCausalLM" in cli_error(
        capsys, ["import-hf", "--from", str(mistral), "--to", ckpt]
    )
    scaled = edited_copy(
        hf_dir, tmp_path / "scaled", rope_scaling={"rope_type": "llama3", "factor": 8.0}
    )
    assert "RoPE scaling" in cli_error(capsys, ["import-hf", "--from", str(scaled), "--to", ckpt])
    biased = edited_copy(hf_dir, tmp_path / "biased", attention_bias=True)
    assert "biases" in cli_error(capsys, ["import-hf", "--from", str(biased), "--to", ckpt])
    quoted = edited_copy(
        hf_dir, tmp_path / "quoted", tie_word_embeddings="false"
    )  # bool("false") is True
    assert "tie_word_embeddings is 'false', not true or false" in cli_error(
        capsys, ["import-hf", "--from", str(quoted), "--to", ckpt]
    )
    wider = edited_copy(hf_dir, tmp_path / "wider", intermediate_size=200)
    assert "shape" in cli_error(capsys, ["import-hf", "--from", str(wider), "--to", ckpt])
    truncated = edited_copy(hf_dir, tmp_path / "truncated")
    (truncated / "model.safetensors").write_bytes(
        (hf_dir / "model.safetensors").read_bytes()[:1000]
    )
    assert "safetensors" in cli_error(capsys, ["import-hf", "--from", str(truncated), "--to", ckpt])
    normalized = edited_copy(hf_dir, tmp_path / "nfc")
    doc = json.loads((normalized / "tokenizer.json").read_text())
    (normalized / "tokenizer.json").write_text(json.dumps({**doc, "normalizer": {"type": "NFC"}}))
    assert "normalizer" in cli_error(capsys, ["import-hf", "--from", str(normalized), "--to", ckpt])
    assert "is a directory" in cli_error(
        capsys, ["import-hf", "--from", str(hf_dir), "--to", str(tmp_path)]
    )
    assert "(--from)" in cli_error(
        capsys, ["import-hf", "--from", str(tmp_path / "empty"), "--to", ckpt]
    )
    assert not (tmp_path / "x.pt").exists()
    assert "not an empty directory" in cli_error(
        capsys, ["export", "--ckpt", str(run_dir), "--to", str(hf_dir)]
    )
    assert cli_error(
        capsys, ["export", "--ckpt", str(tmp_path / "nope"), "--to", str(tmp_path / "o")]
    ).endswith("nope not found; pass a checkpoint file or a run directory of train.py (--ckpt)")
    # issue 24: a checkpoint without its tokenizer names the fix, --tokenizer, which then exports it
    ckpt = train.load_checkpoint(run_dir)
    train.atomic_save(
        {k: v for k, v in ckpt.items() if k not in ("path", "tokenizer_json")}, tmp_path / "bare.pt"
    )
    bare = ["export", "--ckpt", str(tmp_path / "bare.pt"), "--to", str(tmp_path / "o")]
    no_tokenizer = cli_error(capsys, bare)
    assert "holds no tokenizer ('tokenizer_json'); pass the one it was trained with" in no_tokenizer
    assert no_tokenizer.endswith(
        "(--tokenizer)"
    )  # the library names the input, the command its flag
    bpe.train_bpe("an unrelated corpus " * 30, 300).save(tmp_path / "other.json")
    assert "is not the tokenizer stored in" in cli_error(
        capsys,
        [
            "export",
            "--ckpt",
            str(run_dir),
            "--to",
            str(tmp_path / "o"),
            "--tokenizer",
            str(tmp_path / "other.json"),
        ],
    )
    assert not (tmp_path / "o").exists()
    bpe.Tokenizer.from_json(ckpt["tokenizer_json"]).save(tmp_path / "own.json")
    assert model_command.main([*bare, "--tokenizer", str(tmp_path / "own.json")]) == 0
    assert (tmp_path / "o" / "tokenizer.json").read_text() == (
        hf_dir / "tokenizer.json"
    ).read_text()


def test_a_mixture_of_experts_is_refused_in_one_line(tmp_path):
    moe = model.GPT(
        model.GPTConfig(vocab_size=300, n_layer=1, n_head=2, n_kv_head=2, n_embd=16, n_expert=4)
    )
    tokenizer = bpe.train_bpe("one two three " * 20, 260)
    with pytest.raises(model.ConfigError, match="Mixture of Experts.*Mixtral renormalises"):
        hf.export_hf(moe, tokenizer, tmp_path / "moe")
    assert not (tmp_path / "moe").exists()


@pytest.mark.parametrize("overrides", [dict(qk_norm=True), dict(logit_softcap=30.0)])
def test_qk_norm_or_a_logit_softcap_is_refused_in_one_line(tmp_path, overrides):
    net = model.GPT(
        model.GPTConfig(vocab_size=300, n_layer=1, n_head=2, n_kv_head=2, n_embd=16, **overrides)
    )
    tokenizer = bpe.train_bpe("one two three " * 20, 260)
    with pytest.raises(model.ConfigError, match="^cannot export qk_norm or logit_softcap: ") as e:
        hf.export_hf(net, tokenizer, tmp_path / "out")
    assert "\n" not in str(e.value) and not (tmp_path / "out").exists()
    assert hf.hf_config(model.GPTConfig(z_loss=1e-4), 0)["model_type"] == "llama"  # a loss only


def test_permutation_example_of_the_docstring():
    assert hf.rope_halves_order(4).tolist() == [0, 2, 1, 3]
    w = torch.arange(2 * 8 * 3, dtype=torch.float32).view(16, 3)  # 2 heads of width 8
    assert torch.equal(hf.halves_to_interleaved(hf.interleaved_to_halves(w, 2), 2), w)
    q = torch.randn(1, 5, 2, 8)
    cos, sin = model.rope_angles(torch.arange(5), 8, 10000.0)
    ours = model.apply_rope(q, cos, sin)
    hf_q = q[..., hf.rope_halves_order(8)]  # HF's feature order
    hf_cos, hf_sin = (
        torch.cat((cos, cos), -1)[None, :, None],
        torch.cat((sin, sin), -1)[None, :, None],
    )
    rotated = (
        hf_q * hf_cos + torch.cat((-hf_q[..., 4:], hf_q[..., :4]), -1) * hf_sin
    )  # HF's rotate_half
    assert torch.allclose(rotated, ours[..., hf.rope_halves_order(8)], atol=1e-6)


def test_a_hybrid_with_linear_layers_is_refused_in_one_line(tmp_path):
    hybrid = model.GPT(
        model.GPTConfig(
            vocab_size=300, n_layer=2, n_head=2, n_kv_head=2, n_embd=16, layer_pattern="LA"
        )
    )
    tokenizer = bpe.train_bpe("one two three " * 20, 260)
    with pytest.raises(
        model.ConfigError, match="layer_pattern='LA': Llama has no linear-attention layers"
    ):
        hf.export_hf(hybrid, tokenizer, tmp_path / "hybrid")
    assert not (tmp_path / "hybrid").exists()
