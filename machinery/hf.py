r"""The Hugging Face bridge: a model.py network out to a `LlamaForCausalLM` directory, and one back
into a checkpoint.

Serves: model.py (`python model.py export` and `python model.py import-hf`, whose flags live in
machinery/commands/model.py, call `export_checkpoint` and `import_hf_checkpoint`) and
train.py (its checkpoints are what gets exported; `train.py --init-from` starts a run from an
imported one).
Owns: the name map and the RoPE permutation between the two layouts, config.json in both
directions, the export directory, the import into a train.py checkpoint, and `--verify`
(transformers as the oracle).

Depends on: model.py (the network), bpe.py (tokenizer.json), train.py (the checkpoint format: its
loader for export, its writer for import) and fileio.py; safetensors and transformers, imported
inside the features that need them (`pip install safetensors transformers`). It sits above train.py
in the layers; model.py never imports it, only machinery/commands/model.py does, to run these two
commands.

The same network, another RoPE layout
-------------------------------------
A dense model here is Hugging Face's LlamaForCausalLM up to names (wq/wk/wv/wo = q/k/v/o_proj, w1 =
gate_proj, w3 = up_proj, w2 = down_proj, attn_norm = input_layernorm, ffn_norm =
post_attention_layernorm) and one real difference: which features RoPE rotates together. We rotate
adjacent pairs (x_2i, x_2i+1), as RoFormer and Meta's Llama code do; HF rotates the two halves (x_i,
x_i+d/2) (`rotate_half`). With head_dim d = 4, pair 0 turning by angle a and pair 1 by angle b:

    ours: [q0, q1, q2, q3]   rotates (q0, q1) by a and (q2, q3) by b
    HF:   [q0, q2, q1, q3]   rotates its features (0, 2) = (q0, q1) by a and (1, 3) = (q2, q3) by b

So HF's feature j must be our feature [0, 2, 1, 3][j] (the even ones, then the odd ones): permute
the output rows of wq and wk that way inside every head and HF rotates exactly our pairs by exactly
our angles. q and k then hold the same numbers in another order, and q.k, a sum over features, does
not care about the order; v and wo are not rotated and need nothing. Skip the permutation and the
export still loads and runs, just wrong: q0 turns with q2 instead of q1, and the logits drift away
from ours. The rest is configuration HF would otherwise default differently: rms_norm_eps (HF 1e-6,
ours 1e-5), rope_theta, tie_word_embeddings (HF False, ours True); silu is the SwiGLU gate in both.
`python model.py export` writes the directory (`export_hf`) and `python model.py import-hf` reads
one back (`load_hf`); tests/test_hf.py checks the logits against transformers'. A Mixture of Experts
is refused: we weigh the top-k experts by their full-softmax probabilities, Mixtral renormalises
them over the k, so no Mixtral config computes our logits.

The tokenizer goes along as tokenizer.json (`bpe.Tokenizer.to_hf`), and its regex must cut text as
ours does in another engine: Oniguruma, the one of HF `tokenizers`, reads GPT-4's `\p{N}{1,3}+` as
one or more runs of 1-3 digits, so "2000" would stay one piece there ([20][00]) and be [200][0]
here. `bpe.hf_regex` writes it `(?>\p{N}{1,3})`, which both engines read alike; a custom regex is
checked piece by piece or refused.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib
import json
import math
import os
import pathlib
import shutil
import sys
import tempfile

import regex
import torch

import bpe
from machinery import checkpoints, fileio, tokenizer_files
import train
from model import GPT, ConfigError, GPTConfig


class HFError(ConfigError):
    """Bad input to the bridge (a checkpoint, a Hugging Face directory): one line that names the
    file and the fix. A ConfigError, so the command line reports it like model.py's own.
    `argument`: the parameter whose value is at fault (e.g. "out_dir"), for the command line to
    name the flag that gave it."""

    def __init__(self, message: str, argument: str | None = None):
        super().__init__(message)
        self.argument = argument


# Our parameter names -> Hugging Face LlamaForCausalLM's: inside block i (HF's "model.layers.{i}."),
# and the others. wq and wk also need `interleaved_to_halves`; lm_head is absent from the file when
# the embeddings are tied.
HF_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn.wq.weight": "self_attn.q_proj.weight",
    "attn.wk.weight": "self_attn.k_proj.weight",
    "attn.wv.weight": "self_attn.v_proj.weight",
    "attn.wo.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn.w1.weight": "mlp.gate_proj.weight",
    "ffn.w3.weight": "mlp.up_proj.weight",
    "ffn.w2.weight": "mlp.down_proj.weight",
}
HF_GLOBAL_NAMES = {
    "tok_emb.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "lm_head.weight": "lm_head.weight",
}
INSTALL_HINT = "pip install safetensors transformers"
FIX_HF_DIR = "export the model again, or download the file again"


def require(module: str, feature: str):
    """Import `module` (safetensors.torch, transformers), or an HFError that says what to
    install."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise HFError(
            f"{feature} needs the {module.split('.')[0]} package: {INSTALL_HINT}"
        ) from None


def hf_name(name: str) -> str:
    """Our parameter name -> HF's.

    >>> hf_name("blocks.3.attn.wq.weight")
    'model.layers.3.self_attn.q_proj.weight'
    """
    if name.startswith("blocks."):
        _, i, rest = name.split(".", 2)
        return f"model.layers.{i}.{HF_LAYER_NAMES[rest]}"
    return HF_GLOBAL_NAMES[name]


def rope_heads(name: str, config: GPTConfig) -> int | None:
    """The number of heads whose rows RoPE rotates in parameter `name` (wq: n_head, wk: n_kv_head),
    else None."""
    return {"attn.wq.weight": config.n_head, "attn.wk.weight": config.n_kv_head}.get(
        name.split(".", 2)[-1]
    )


def rope_halves_order(head_dim: int) -> torch.Tensor:
    """Which of our features each of HF's features is, inside one head: the even ones, then the odd
    ones.

    >>> rope_halves_order(4)       # HF's [x_0, x_1 | x_2, x_3] are our [x_0, x_2 | x_1, x_3]
    tensor([0, 2, 1, 3])
    """
    return torch.cat((torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)))


def interleaved_to_halves(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Reorder the output rows of wq or wk (n_heads * head_dim, C) from our RoPE pairs to HF's, head
    by head."""
    head_dim = weight.shape[0] // n_heads
    return weight.view(n_heads, head_dim, -1)[:, rope_halves_order(head_dim)].reshape(weight.shape)


def halves_to_interleaved(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The inverse of interleaved_to_halves: HF's q_proj / k_proj rows back to our pair layout."""
    head_dim = weight.shape[0] // n_heads
    inverse = torch.argsort(rope_halves_order(head_dim))
    return weight.view(n_heads, head_dim, -1)[:, inverse].reshape(weight.shape)


def hf_config(config: GPTConfig, bos_eos_id: int | None) -> dict:
    """config.json of the equivalent LlamaForCausalLM. Every field HF would otherwise default is
    written out: HF's defaults differ from ours (rms_norm_eps 1e-6 vs our 1e-5, tie_word_embeddings
    False vs our True). rope_theta is written both the classic way (vLLM, llama.cpp, transformers 4)
    and as transformers 5's rope_parameters. bos/eos are <|endoftext|>: data.py starts every
    document with it."""
    refusals = [  # (Llama cannot hold it, why)
        (
            "L" in config.layer_kinds,
            f"layer_pattern={config.layer_pattern!r}: Llama has no "
            f"linear-attention layers; export an all-attention model (layer_pattern='')",
        ),
        (
            config.n_expert,
            "a Mixture of Experts: model.py weighs the top-k experts by their full-softmax "
            "probabilities while Mixtral renormalises them over the k, so the logits would differ; "
            "export a dense model (n_expert=0)",
        ),
        (
            config.qk_norm or config.logit_softcap,
            "qk_norm or logit_softcap: Llama has neither a QK-norm nor a logit soft-cap; export a "
            "model trained without them",
        ),
    ]
    for cannot, why in refusals:
        if cannot:
            raise HFError(f"cannot export {why}")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.n_embd,
        "intermediate_size": config.ffn_dim,
        "num_hidden_layers": config.n_layer,
        "num_attention_heads": config.n_head,
        "num_key_value_heads": config.n_kv_head,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.block_size,
        "rms_norm_eps": config.norm_eps,
        "rope_theta": config.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        "rope_scaling": None,
        "tie_word_embeddings": config.tie_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "bos_token_id": bos_eos_id,
        "eos_token_id": bos_eos_id,
        "torch_dtype": "float32",
        "use_cache": True,
    }


def hf_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """Our weights under HF's names, q/k rows permuted to the halves layout, fp32, contiguous."""
    cfg, out = model.config, {}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_embeddings:
            # tied: HF re-ties it to embed_tokens on load
            continue
        if rope_heads(name, cfg):
            tensor = interleaved_to_halves(tensor, rope_heads(name, cfg))
        out[hf_name(name)] = tensor.detach().to("cpu", torch.float32).contiguous()
    return out


def check_new_directory(out_dir) -> pathlib.Path:
    """out_dir as a Path, if it does not exist or is an empty directory (export never mixes into old
    files)."""
    out_dir = pathlib.Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise HFError(
            f"{out_dir} already exists and is not an empty directory; choose a new directory",
            "out_dir",
        )
    return out_dir


def hf_tokenizer_files(tokenizer, block_size: int) -> dict[str, dict]:
    """tokenizer.json (bpe.Tokenizer.to_hf) and tokenizer_config.json, what AutoTokenizer reads. No
    BOS is added to encoded text (GPT-2's convention, and ours: ids equal `tokenizer.encode(text,
    allowed_special="all")`); decoding keeps spaces as they are."""
    eot = tokenizer.eot_id
    eot_text = None if eot is None else tokenizer.vocab[eot].decode("utf-8")
    try:
        tokenizer_json = tokenizer_to_hf(tokenizer)
    # a custom regex Hugging Face would read otherwise
    except bpe.TokenizerError as e:
        raise HFError(f"cannot export the tokenizer: {e}") from None
    return {
        "tokenizer.json": tokenizer_json,
        "tokenizer_config.json": {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": eot_text,
            "eos_token": eot_text,
            "model_max_length": block_size,
            "clean_up_tokenization_spaces": False,
        },
    }


def export_hf(model: GPT, tokenizer, out_dir) -> pathlib.Path:
    """Write a Hugging Face LlamaForCausalLM directory: config.json, model.safetensors,
    generation_config.json, tokenizer.json (tokenizer: a bpe.Tokenizer, via its to_hf) and
    tokenizer_config.json. All files go to a temporary directory that is renamed to out_dir at the
    end, so out_dir is complete or absent."""
    save_file = require("safetensors.torch", "export").save_file
    safetensor_error = require("safetensors", "export").SafetensorError
    out_dir = check_new_directory(out_dir)
    if len(tokenizer) > model.config.vocab_size:
        raise HFError(
            f"the tokenizer has {len(tokenizer)} ids but the model only {model.config.vocab_size}"
        )
    eot = tokenizer.eot_id
    files = {
        "config.json": hf_config(model.config, eot),
        "generation_config.json": {
            "bos_token_id": eot,
            "eos_token_id": eot,
            "max_length": model.config.block_size,
        },
        **hf_tokenizer_files(tokenizer, model.config.block_size),
    }
    tmp = None
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        remove_dead_exports(out_dir)
        tmp = pathlib.Path(
            tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.tmp-{os.getpid()}-")
        )
        for name, doc in files.items():
            (tmp / name).write_text(
                json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
            )
        save_file(hf_state_dict(model), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        # mkdtemp made it private: give it the umask's modes
        fileio.publish_tree(tmp)
        if out_dir.exists():
            out_dir.rmdir()
        os.replace(tmp, out_dir)
    # safetensors' writer reports a full disk as any of these
    except (OSError, RuntimeError, safetensor_error) as e:
        if fileio.is_no_space(e):
            raise HFError(fileio.no_space_message(out_dir, "export elsewhere"), "out_dir") from None
        if isinstance(e, OSError):
            raise HFError(
                f"{out_dir}: cannot write it ({e.strerror or e}); choose another directory",
                "out_dir",
            ) from None
        raise
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def remove_dead_exports(out_dir: pathlib.Path) -> None:
    """Remove the temp folders that exports to out_dir killed mid-way (SIGKILL, a power cut) left
    beside it: the writer's pid is in the name (.NAME.tmp-PID-xxxx), and a folder whose writer is
    gone is garbage. A live writer's folder stays."""
    for stale in out_dir.parent.glob(f".{glob.escape(out_dir.name)}.tmp-*-*"):
        pid = stale.name.rsplit(".tmp-", 1)[1].split("-")[0]
        try:
            # signal 0: only asks whether the process exists
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(stale, ignore_errors=True)
        # not our name, or another user's live process
        except (ValueError, PermissionError, OverflowError):
            pass


VERIFY_TEXT = (
    "Once upon a time, a naïve café served Ελληνικά, русский, 中文 and 日本語 🙂👩‍👩‍👧 "
    "at 12:34.<|endoftext|>"
    "def f(x):\n    return x ** 2  # it's done\n"
)


def verify_hf(model: GPT, tokenizer, hf_dir, new_tokens: int = 16) -> dict:
    """Load hf_dir with transformers and compare it with (model, tokenizer), the oracle of
    tests/test_hf.py: the largest |logit difference| on random ids and on VERIFY_TEXT (fp32),
    whether greedy decoding gives the same tokens, and whether AutoTokenizer gives our ids for
    VERIFY_TEXT and tokenizer_files.PROBE_TEXT (long numbers, contractions in every case, CRLF,
    NBSP: what regex engines disagree on)."""
    transformers = require("transformers", "verifying an export")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
    same_ids = all(
        hf_tokenizer(text, verbose=False)["input_ids"]
        == tokenizer.encode(text, allowed_special="all")
        for text in (VERIFY_TEXT, tokenizer_files.PROBE_TEXT)
    )
    T = model.config.block_size
    random_ids = torch.randint(
        0, model.config.vocab_size, (2, T), generator=torch.Generator().manual_seed(0)
    )
    text_ids = torch.tensor([tokenizer.encode(VERIFY_TEXT, allowed_special="all")[:T]])
    model = model.eval()
    with torch.no_grad():
        diff = max(
            (model(x)[0] - theirs(x).logits).abs().max().item() for x in (random_ids, text_ids)
        )
    prompt = text_ids[:, :8]
    n = min(new_tokens, T - prompt.shape[1])
    # compare n tokens even past an <|endoftext|>
    theirs.generation_config.eos_token_id = None
    theirs.generation_config.pad_token_id = 0
    hf_greedy = theirs.generate(prompt, max_new_tokens=n, do_sample=False, max_length=None)
    return {
        "max_abs_logit_diff": diff,
        "logit_positions": random_ids.numel() + text_ids.numel(),
        "greedy_tokens": n,
        "greedy_equal": torch.equal(model.generate(prompt, n, temperature=0), hf_greedy),
        "tokenizer_ids_equal": same_ids,
    }


def config_from_hf(hf: dict, source: str = "config.json") -> GPTConfig:
    """GPTConfig of a LlamaForCausalLM config.json, refusing in one line what model.py cannot
    express.

    Every size must be a JSON integer and rope_theta, rms_norm_eps finite positive numbers:
    `int("64")` or `int(float("nan"))` would either accept a config transformers itself rejects or
    fail deep inside.

    >>> try:
    ...     config_from_hf({"model_type": "llama", "vocab_size": 300, "hidden_size": 64,
    ...                     "num_attention_heads": 4, "num_hidden_layers": 2,
    ...                     "intermediate_size": "wide"})
    ... except HFError as e:
    ...     print(e)
    config.json: intermediate_size is 'wide', not a positive integer; fix that field of config.json
    """

    def refuse(what: str):
        raise HFError(
            f"{source}: {what}, which model.py cannot express; it loads plain LlamaForCausalLM only"
        )

    def field(key: str, kind: type, default=None, settings: dict | None = None):
        """settings[key] (hf's by default; the default when absent): a positive int, or a positive
        finite float."""
        value = (hf if settings is None else settings).get(key)
        value = default if value is None else value
        if value is None:
            raise HFError(f"{source} lacks {key!r}; it is not a LlamaForCausalLM config")
        number = (
            isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        )
        if not number or value <= 0 or kind is int and value != int(value):
            raise HFError(
                f"{source}: {key} is {value!r}, not a positive "
                f"{'integer' if kind is int else 'number'}; fix that field of config.json"
            )
        return kind(value)

    if not isinstance(hf, dict):
        raise HFError(
            f"{source}: a JSON {type(hf).__name__}, not an object of model settings; give a "
            f"Hugging Face model directory"
        )
    rope = hf.get("rope_parameters") or {}
    # transformers 4 writes rope_scaling, 5 rope_parameters
    scaling = hf.get("rope_scaling") or rope
    if not isinstance(rope, dict) or not isinstance(scaling, dict):
        raise HFError(
            f"{source}: rope_parameters and rope_scaling must be objects (or null); fix config.json"
        )
    architectures = hf.get("architectures")
    scaling_type = scaling.get("rope_type", scaling.get("type", "default"))
    refusals = [  # (model.py cannot express it, what)
        (
            architectures != ["LlamaForCausalLM"]
            and (architectures or hf.get("model_type") != "llama"),
            f"architecture {architectures or hf.get('model_type')}",
        ),
        (scaling_type != "default", f"RoPE scaling {scaling_type!r}"),
        (hf.get("attention_bias") or hf.get("mlp_bias"), "biases in the linear layers"),
        (
            hf.get("hidden_act", "silu") != "silu",
            f"activation {hf.get('hidden_act')!r} (model.py's SwiGLU uses silu)",
        ),
    ]
    for cannot, what in refusals:
        if cannot:
            refuse(what)
    if not isinstance(hf.get("tie_word_embeddings", False), bool):
        raise HFError(
            f"{source}: tie_word_embeddings is {hf['tie_word_embeddings']!r}, not true or false; "
            f"fix that field of config.json"
        )
    n_embd, n_head = field("hidden_size", int), field("num_attention_heads", int)
    if hf.get("head_dim") not in (None, n_embd // n_head):
        refuse(
            f"head_dim {hf['head_dim']} != hidden_size / num_attention_heads = {n_embd // n_head}"
        )
    sizes = dict(
        vocab_size=field("vocab_size", int),
        block_size=fileio.expect(
            field("max_position_embeddings", int, 2048),
            int,
            f"{source}: max_position_embeddings",
            f"a context of at most {train.MAX_BLOCK_SIZE:,} positions",
            HFError,
            "fix that field of config.json",
            lambda size: size <= train.MAX_BLOCK_SIZE,
        ),
        n_layer=field("num_hidden_layers", int),
        n_head=n_head,
        n_embd=n_embd,
        n_kv_head=field("num_key_value_heads", int, n_head),
        ffn_hidden=_explicit_ffn_hidden(field("intermediate_size", int), n_embd),
        rope_theta=field("rope_theta", float, 10000.0, rope if "rope_theta" in rope else hf),
        # an epsilon of 1e300 would flatten every activation to about zero
        norm_eps=fileio.expect(
            field("rms_norm_eps", float, 1e-6),
            float,
            f"{source}: rms_norm_eps",
            "an epsilon below 1",
            HFError,
            "fix that field of config.json",
            lambda eps: eps < 1,
        ),
    )
    try:
        return GPTConfig(**sizes, tie_embeddings=hf.get("tie_word_embeddings", False))
    except ConfigError as e:
        raise HFError(f"{source}: {e}") from None


def _explicit_ffn_hidden(intermediate_size: int, n_embd: int) -> int:
    """0 (auto) when HF's intermediate_size is what GPTConfig would derive, so a round trip gives
    the same config.

    >>> _explicit_ffn_hidden(384, 128), _explicit_ffn_hidden(8192, 2048)
    (0, 8192)
    """
    return (
        0
        if intermediate_size == GPTConfig(n_embd=n_embd, n_head=1, n_kv_head=1).ffn_dim
        else intermediate_size
    )


def _read_safetensors(hf_dir: pathlib.Path) -> dict[str, torch.Tensor]:
    """Every tensor of model.safetensors, or of the shards listed in
    model.safetensors.index.json."""
    load_file = require("safetensors.torch", "reading a Hugging Face model").load_file
    index = hf_dir / "model.safetensors.index.json"
    if index.is_file():
        doc = fileio.expect(
            fileio.read_json(index, HFError, FIX_HF_DIR),
            dict,
            str(index),
            "an object",
            HFError,
            FIX_HF_DIR,
        )
        weight_map = fileio.expect(
            doc.get("weight_map"),
            dict,
            f"{index}: weight_map",
            "an object of tensor name -> file",
            HFError,
            FIX_HF_DIR,
        )
    else:
        weight_map = {"": "model.safetensors"}
    # a shard is a file beside the index: "../x" or "/etc/passwd" would read outside the folder
    files = sorted(
        {
            fileio.expect(
                name,
                str,
                f"{index}: weight_map[{key!r}]",
                "a file name in that folder",
                HFError,
                FIX_HF_DIR,
                lambda name: pathlib.PurePath(name).name == name != "..",
            )
            for key, name in weight_map.items()
        }
    )
    tensors = {}
    for name in files:
        if not (hf_dir / name).is_file():
            raise HFError(
                f"{hf_dir / name} not found; the directory must hold the weights as safetensors"
            )
        try:
            tensors.update(load_file(str(hf_dir / name)))
        # safetensors' own error type: a truncated or foreign file
        except Exception as e:
            raise HFError(f"{hf_dir / name} is not a readable safetensors file ({e})") from None
    return tensors


def load_hf(hf_dir) -> tuple[GPT, object]:
    """(GPT in eval mode, bpe.Tokenizer or None) from a Hugging Face LlamaForCausalLM directory (one
    `export_hf` wrote, or any Llama checkpoint on disk in safetensors). Weights become fp32; q/k
    rows go back to our RoPE layout. What model.py cannot express (another architecture, RoPE
    scaling, biases, tensors whose shapes disagree with config.json) fails with one ConfigError
    line. The tokenizer (bpe.py, imported here) comes from tokenizer.json when present and must be
    byte-level BPE."""
    hf_dir = pathlib.Path(hf_dir)
    if not (hf_dir / "config.json").is_file():
        raise HFError(
            f"{hf_dir / 'config.json'} not found; give a Hugging Face model directory", "hf_dir"
        )
    config = config_from_hf(
        fileio.read_json(hf_dir / "config.json", HFError, FIX_HF_DIR), str(hf_dir / "config.json")
    )
    tensors = {
        k: v for k, v in _read_safetensors(hf_dir).items() if not k.endswith("rotary_emb.inv_freq")
    }
    with torch.device("meta"):
        model = GPT(config)
    state = {}
    for name, ours in model.state_dict().items():
        if name == "lm_head.weight" and config.tie_embeddings:
            continue
        theirs = hf_name(name)
        if theirs not in tensors:
            raise HFError(
                f"{hf_dir}: the weights lack {theirs}, which config.json implies; "
                f"the directory is incomplete or not a LlamaForCausalLM"
            )
        tensor = tensors.pop(theirs)
        # an I64 or BOOL tensor would become float32 weights without a word
        fileio.expect(
            tensor.dtype,
            torch.dtype,
            f"{hf_dir}: {theirs}'s dtype",
            "a floating-point dtype",
            HFError,
            FIX_HF_DIR,
            lambda d: d.is_floating_point,
        )
        fileio.expect(
            tensor,
            torch.Tensor,
            f"{hf_dir}: {theirs}",
            "finite weights (no NaN or inf)",
            HFError,
            FIX_HF_DIR,
            lambda t: bool(torch.isfinite(t).all()),
        )
        if tuple(tensor.shape) != tuple(ours.shape):
            raise HFError(
                f"{hf_dir}: {theirs} has shape {tuple(tensor.shape)} but config.json implies "
                f"{tuple(ours.shape)}; the weights and config.json disagree"
            )
        if rope_heads(name, config):
            tensor = halves_to_interleaved(tensor, rope_heads(name, config))
        state[name] = tensor.to(torch.float32)
    if config.tie_embeddings:
        # some tied checkpoints store the copy anyway
        tensors.pop("lm_head.weight", None)
        state["lm_head.weight"] = state["tok_emb.weight"]
    if tensors:
        raise HFError(
            f"{hf_dir}: tensor {sorted(tensors)[0]} (and {len(tensors) - 1} more) has no place in "
            f"model.py's Llama (a bias, an extra module), which model.py cannot express"
        )
    model = GPT(config)
    model.load_state_dict(state)
    tokenizer = None
    if (hf_dir / "tokenizer.json").is_file():
        try:
            tokenizer = tokenizer_from_hf(
                fileio.read_json(hf_dir / "tokenizer.json", bpe.TokenizerError, FIX_HF_DIR),
                str(hf_dir / "tokenizer.json"),
            )
        except bpe.TokenizerError as e:
            raise HFError(str(e)) from None
        if len(tokenizer) > config.vocab_size:
            raise HFError(
                f"{hf_dir}: tokenizer.json has {len(tokenizer)} ids but vocab_size is "
                f"{config.vocab_size}; the tokenizer belongs to another model"
            )
    return model.eval(), tokenizer


def save_imported_checkpoint(model: GPT, tokenizer, path, source: str) -> pathlib.Path:
    """Write a checkpoint in train.py's format (version 1: model, model_config, tokenizer_json, step
    0), which evaluate.py samples from and `train.py --init-from` starts a run from. The run's own
    writer does it (train.py's atomic write, machinery/checkpoints.py's checksum)."""
    path = pathlib.Path(path)
    ckpt = {
        "version": 1,
        "step": 0,
        "model": model.state_dict(),
        "model_config": dataclasses.asdict(model.config),
        "tokenizer_json": tokenizer.to_json(),
        "imported_from": source,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    checkpoints.save(ckpt, path)
    return path


# --------------------------------------------------------------------------------------------------
# Command line: `python model.py export` and `python model.py import-hf` (or `python hf.py ...`)
# --------------------------------------------------------------------------------------------------


def export_checkpoint(
    ckpt_path: str, out_dir: str, verify: bool = False, tokenizer_path: str | None = None
) -> str:
    """`python model.py export`: a train.py checkpoint (or run directory) -> a Hugging Face
    directory.

    The checkpoint is read by train.py's own loader (newest good checkpoint of a run directory,
    weights_only torch.load): the format belongs to train.py, and a second reader would drift from
    it. A checkpoint that holds no tokenizer (train.py always stores one) takes it from
    `tokenizer_path`. An HFError about one of the three paths names it in `argument`."""
    check_new_directory(out_dir)
    if not pathlib.Path(ckpt_path).exists():
        raise HFError(
            f"{ckpt_path} not found; pass a checkpoint file or a run directory of train.py",
            "ckpt_path",
        )
    try:
        ckpt = checkpoints.load(ckpt_path, log=lambda message: print(message, file=sys.stderr))
    except train.TrainError as e:
        first_line = str(e).splitlines()[0]
        raise HFError(f"{ckpt_path}: cannot load it ({first_line})", "ckpt_path") from None
    if tokenizer_path is not None:
        try:
            given = tokenizer_files.read_tokenizer(tokenizer_path).to_json()
        except bpe.TokenizerError as e:
            raise HFError(str(e), "tokenizer_path") from None
        if ckpt.get("tokenizer_json", given) != given:
            raise HFError(
                f"{tokenizer_path} is not the tokenizer stored in {ckpt['path']}; leave it out "
                f"(the checkpoint's own is exported)",
                "tokenizer_path",
            )
        ckpt["tokenizer_json"] = given
    if "tokenizer_json" not in ckpt:
        raise HFError(
            f"{ckpt['path']} holds no tokenizer ('tokenizer_json'); pass the one it was trained "
            f"with, the DATA_DIR/tokenizer.json that data.py prepare wrote beside the shards",
            "tokenizer_path",
        )
    try:
        model, tokenizer = train.model_from_checkpoint(ckpt)
    except (train.TrainError, bpe.TokenizerError, KeyError, ValueError, RuntimeError) as e:
        raise HFError(
            f"{ckpt_path}: cannot load it ({str(e).splitlines()[0]}); pass a checkpoint that "
            f"train.py wrote",
            "ckpt_path",
        ) from None
    export_hf(model, tokenizer, out_dir)
    report = (
        f"wrote {out_dir}: LlamaForCausalLM, {model.num_params():,} parameters, "
        f"vocab {len(tokenizer)}, from {ckpt['path']} (step {ckpt.get('step')})"
    )
    if verify:
        v = verify_hf(model, tokenizer, out_dir)
        report += (
            f"\nverified with transformers: max |logit diff| {v['max_abs_logit_diff']:.2e} over "
            f"{v['logit_positions']} positions (fp32); greedy {v['greedy_tokens']} tokens "
            f"{'identical' if v['greedy_equal'] else 'DIFFERENT'}; AutoTokenizer ids "
            f"{'identical' if v['tokenizer_ids_equal'] else 'DIFFERENT'}"
        )
    return report


def import_hf_checkpoint(hf_dir: str, ckpt_path: str) -> str:
    """`python model.py import-hf`: a Hugging Face Llama directory -> a train.py-format
    checkpoint. An HFError about one of the two paths names it in `argument`."""
    # the output is checked before the Hugging Face directory is read
    to = pathlib.Path(ckpt_path)
    if to.is_dir():
        raise HFError(
            f"{ckpt_path} is a directory; give a checkpoint file name such as {to / 'imported.pt'}",
            "ckpt_path",
        )
    if not to.parent.is_dir():
        raise HFError(
            f"{ckpt_path} is in a folder that does not exist; create {to.parent} first",
            "ckpt_path",
        )
    model, tokenizer = load_hf(hf_dir)
    if tokenizer is None:
        raise HFError(
            f"{pathlib.Path(hf_dir) / 'tokenizer.json'} not found; a checkpoint needs its tokenizer"
        )
    save_imported_checkpoint(model, tokenizer, ckpt_path, str(hf_dir))
    return (
        f"wrote {ckpt_path}: {model.num_params():,} parameters, vocab {len(tokenizer)}, "
        f"from {hf_dir}"
    )


# ==================================================================================================
# bpe.py's tokenizer as Hugging Face tokenizer.json: written (tokenizer_to_hf), read back
# (tokenizer_from_hf), and the regex written in Hugging Face's dialect (hf_regex).
# ==================================================================================================


def tokenizer_to_hf(tokenizer: bpe.Tokenizer) -> dict:
    """bpe.py's tokenizer as Hugging Face `tokenizers` JSON (a tokenizer.json document), giving the
    same ids.

    byte-level BPE in HF's terms: the pre-tokenizer first cuts text with our regex (`Split`,
    "Isolated": every match is a piece), then `ByteLevel` writes each piece's UTF-8 bytes in
    GPT-2's printable alphabet (`bpe.gpt2_bytes_to_unicode`: " the" -> "Ġthe", "é" = bytes C3 A9
    -> "Ã©"), so the `BPE` model works on characters that stand one-for-one for bytes, with
    our vocab (token -> id) and merges written in that alphabet. Two details make HF's BPE
    reproduce our (tiktoken's) rule:
    * `ignore_merges: true`: a piece that is itself a token becomes that one id without merging
      (tiktoken's shortcut; Llama 3 sets the same flag);
    * HF merges the adjacent pair listed earliest, we merge the pair whose concatenation has the
      lowest id, so the merges are listed in the order of the ids they make.
    Special tokens are `added_tokens` with `special: true`: HF cuts them out of any text, which
    is our `encode(text, allowed_special="all")`. The regex is written the way HF's engine reads
    it as ours (`hf_regex`: GPT-4's `\\p{N}{1,3}+` becomes `(?>\\p{N}{1,3})`); a custom one is
    also cut both ways on PROBE_TEXT (`_check_hf_regex`, which needs the tokenizers package) and
    refused if the pieces differ. For gpt2 and gpt4 it is plain JSON: writing it needs no
    library.

    One difference no pattern can remove: each engine has its own Unicode tables, and `regex`'s
    are newer, so the few thousand letters and digits assigned in the newest Unicode versions
    (U+0C5C, U+11DE0, ...) are \\p{L} or \\p{N} here and unassigned in HF. tests/test_hf.py
    checks every character that Python's unicodedata knows (Unicode 14) in every pattern's
    pieces.
    """
    theirs = hf_regex(tokenizer.pattern)
    if tokenizer.pattern not in (bpe.GPT2_PATTERN, bpe.GPT4_PATTERN):
        _check_hf_regex(tokenizer.pattern, theirs)
    merges = sorted(tokenizer.merges, key=lambda m: tokenizer.ranks[m[0] + m[1]])
    byte_level = {
        "type": "ByteLevel",
        "add_prefix_space": False,
        "trim_offsets": True,
        "use_regex": False,
    }
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": s,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for s, i in sorted(tokenizer.special_tokens.items(), key=lambda kv: kv[1])
        ],
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": theirs},
                    "behavior": "Isolated",
                    "invert": False,
                },
                byte_level,
            ],
        },
        "post_processor": None,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": True,
            **bpe.written_vocab_and_merges(tokenizer.ranks, merges),
        },
    }


def tokenizer_from_hf(doc: dict, source: str = "tokenizer.json") -> bpe.Tokenizer:
    """Read a Hugging Face tokenizer.json document (already parsed) that is byte-level BPE: ours
    (`tokenizer_to_hf`), Llama 3's or GPT-2's. Anything bpe.py does not do (a normalizer,
    SentencePiece or WordPiece, byte fallback, a prefix space) is refused with one line, rather
    than loaded to give other ids.
    """

    def refuse(what: str):
        raise bpe.TokenizerError(
            f"{source}: {what}, which bpe.py cannot reproduce; only byte-level BPE "
            f"tokenizers (GPT-2, Llama 3, ours) can be read"
        )

    def field(value, kind, name: str, shape: str, ok=lambda value: True):
        """value if it is a `kind` (a JSON object, list, ...) and ok(value), else one line
        naming the field (fileio.expect)."""
        return fileio.expect(
            value,
            kind,
            f"{source}: {name}",
            shape,
            bpe.TokenizerError,
            "damaged tokenizer.json (take the model's own)",
            ok,
        )

    field(doc, dict, "the document", "an object")
    model, normalizer, pre = (
        field(doc.get(k) or {}, dict, k, "an object")
        for k in ("model", "normalizer", "pre_tokenizer")
    )
    if model.get("type") != "BPE":
        refuse(f"model type {model.get('type')!r} is not BPE")
    if normalizer:
        refuse(f"it has a normalizer ({normalizer.get('type')})")
    if (
        model.get("byte_fallback")
        or model.get("continuing_subword_prefix")
        or model.get("end_of_word_suffix")
        or model.get("dropout")
    ):
        # dropout: HF would skip merges at random, so no fixed ids to reproduce
        refuse("its BPE uses byte fallback, subword prefixes/suffixes or dropout")
    pattern = _hf_pattern(pre, refuse, field)
    # to_hf's forms back
    pattern = {hf_regex(p): p for p in (bpe.GPT2_PATTERN, bpe.GPT4_PATTERN)}.get(pattern, pattern)
    vocab = field(model.get("vocab"), dict, "model.vocab", "an object of token -> id")
    ids = [
        field(i, int, f"model.vocab[{t!r}]", "an id from 0 to 2**31 - 1") for t, i in vocab.items()
    ]
    # "a b" (older files) or ["a", "b"] (newer ones); "a b c" splits into three: refused
    merges = [
        field(
            m.split(" ") if isinstance(m, str) else m,
            list,
            f"model.merges[{k}]",
            "two tokens",
            lambda m: len(m) == 2 and all(isinstance(x, str) for x in m),
        )
        for k, m in enumerate(field(model.get("merges"), list, "model.merges", "a list"))
    ]
    added = [
        field(t, dict, f"added_tokens[{k}]", "an object with content and id")
        for k, t in enumerate(field(doc.get("added_tokens", []), list, "added_tokens", "a list"))
    ]
    specials = {
        field(t.get("content"), str, f"added_tokens[{k}].content", "a string"): field(
            t.get("id"), int, f"added_tokens[{k}].id", "an id"
        )
        for k, t in enumerate(added)
    }
    try:
        ranks = {bpe.from_gpt2_text(t): i for t, i in zip(vocab, ids)}
        merges = [(bpe.from_gpt2_text(a), bpe.from_gpt2_text(b)) for a, b in merges]
    except KeyError as e:
        refuse(f"its vocabulary is not written in GPT-2's byte alphabet (character {e})")
    try:
        specials = {s: i for s, i in specials.items() if i not in set(ids)}
        return tokenizer_files.check_ids(bpe.Tokenizer(ranks, specials, pattern, merges))
    except bpe.TokenizerError as e:
        raise bpe.TokenizerError(f"{source}: {e}") from None


# HF's ByteLevel pre-tokenizer with use_regex=true cuts with this GPT-2 regex of its own
# (tokenizers' byte_level.rs).
HF_BYTE_LEVEL_PATTERN = (
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
)


_COUNTED_REPEAT = regex.compile(r"\{\d*(?:,\d*)?\}")


def hf_regex(pattern: str) -> str:
    r"""`pattern` written the way Oniguruma, the regex engine of Hugging Face `tokenizers`, reads it
    as `regex` does.

    Both read `?+`, `*+` and `++` as possessive (take the most, never give back). A counted repeat
    followed by a plus is where they part: `regex` reads `\p{N}{1,3}+` as possessive, Oniguruma
    (Ruby syntax) as `(?:\p{N}{1,3})+`, one or more runs of 1-3 digits, so GPT-4's pattern would
    keep "2000" whole where ours cuts [200][0]. An atomic group `(?>...)` means "possessive" in both
    engines, so each `X{m,n}+` becomes `(?>X{m,n})`:

    >>> hf_regex(r"\p{N}{1,3}+| ?\p{L}++|[a-z]{2}+|(?:ab){1,}+")
    '(?>\\p{N}{1,3})| ?\\p{L}++|(?>[a-z]{2})|(?>(?:ab){1,})'
    """
    # the pattern in atoms: an escape, a [class], a (group) or one character each
    out: list[str] = []
    opened: list[int] = []  # where in `out` each open group started
    atom, i = 0, 0  # atom: the index in `out` where the last complete atom starts
    while i < len(pattern):
        c = pattern[i]
        repeat = _COUNTED_REPEAT.match(pattern, i) if c == "{" else None
        if repeat and repeat.end() < len(pattern) and pattern[repeat.end()] == "+":
            out[atom:] = ["(?>" + "".join(out[atom:]) + repeat.group() + ")"]
            i = repeat.end() + 1
            continue
        if repeat:  # a counted repeat: not an atom
            end = repeat.end()
        elif c == "\\":
            end = i + 2
            if pattern[i + 1 : i + 2] in ("p", "P", "x", "N") and pattern[end : end + 1] == "{":
                end = pattern.index("}", end) + 1
            atom = len(out)
        elif c == "[":
            end = i + 1 + (pattern[i + 1 : i + 2] == "^")
            end += pattern[end : end + 1] == "]"  # a ] right after [ or [^ is a literal
            while pattern[end] != "]":
                end += (
                    2
                    if pattern[end] == "\\"
                    else (
                        pattern.index(":]", end) + 2 - end if pattern.startswith("[:", end) else 1
                    )
                )
            end += 1
            atom = len(out)
        elif c == "(":
            opened.append(len(out))
            end = i + 1
        elif c == ")" and opened:
            atom, end = opened.pop(), i + 1
        elif c in "*+?|":
            end = i + 1
        else:
            atom, end = len(out), i + 1
        out.append(pattern[i:end])
        i = end
    return "".join(out)


def _check_hf_regex(pattern: str, theirs: str) -> None:
    """Cut tokenizer_files.PROBE_TEXT with `theirs` in HF `tokenizers` and with `pattern` here: the
    pieces must be the same."""
    try:
        from tokenizers import Regex, pre_tokenizers
    except ImportError:
        raise bpe.TokenizerError(
            f"exporting the custom pattern {pattern!r} needs the tokenizers package to check that "
            f"Hugging Face cuts text the same way: pip install tokenizers"
        ) from None
    try:
        split = pre_tokenizers.Split(Regex(theirs), "isolated")
    # tokenizers' own error type: Oniguruma cannot compile it
    except Exception as e:
        raise bpe.TokenizerError(
            f"pattern {pattern!r} cannot be exported: Hugging Face's regex engine rejects "
            f"{theirs!r} ({e}); use 'gpt2', 'gpt4' or a pattern without that construct"
        ) from None
    ours = regex.compile(pattern).findall(tokenizer_files.PROBE_TEXT)
    hf = [piece for piece, _ in split.pre_tokenize_str(tokenizer_files.PROBE_TEXT)]
    if ours != hf:
        k = next(k for k, (a, b) in enumerate(zip(ours + [""], hf + [""])) if a != b)
        raise bpe.TokenizerError(
            f"pattern {pattern!r} cannot be exported: Hugging Face's regex engine cuts "
            f"tokenizer_files.PROBE_TEXT otherwise (piece {k}: {hf[k : k + 1]} there, "
            f"{ours[k : k + 1]} here); use 'gpt2', 'gpt4' or a pattern both engines read alike"
        )


def _hf_pattern(pre_tokenizer: dict, refuse, field) -> str:
    """The regex of a tokenizer.json pre-tokenizer: Split(regex) then ByteLevel (ours, Llama 3), or
    a lone ByteLevel with its built-in GPT-2 regex (GPT-2). `refuse(reason)` raises for any other
    shape, `field` for a damaged one."""
    steps = (
        pre_tokenizer.get("pretokenizers", [])
        if pre_tokenizer.get("type") == "Sequence"
        else [pre_tokenizer]
    )
    steps = [
        field(step, dict, "a pre_tokenizer step", "an object")
        for step in field(steps, list, "pretokenizers", "a list")
    ]
    *splits, byte_level = steps or [{}]
    if byte_level.get("type") != "ByteLevel" or byte_level.get("add_prefix_space"):
        refuse("its pre-tokenizer does not end in ByteLevel without a prefix space")
    if not splits and byte_level.get("use_regex", True):
        return HF_BYTE_LEVEL_PATTERN
    split = splits[0] if len(splits) == 1 else {}
    if (
        split.get("type") != "Split"
        or "Regex"
        not in field(
            split.get("pattern", {}),
            dict,
            "the Split step's pattern",
            'an object such as {"Regex": "..."}',
        )
        or split.get("invert")
        or split.get("behavior") != "Isolated"
        or byte_level.get("use_regex", True)
    ):
        refuse(
            f"its pre-tokenizer {[step.get('type') for step in steps]} is not one regex Split then "
            f"ByteLevel"
        )
    return split["pattern"]["Regex"]
