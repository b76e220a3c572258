"""`python model.py`: the table of presets (the default), the KV-cache demo, and the Hugging Face
bridge's two commands, `export` and `import-hf` (machinery/hf.py does the work).

Every flag lives here; model.py's library raises ConfigError in its own terms and this file adds the
flag the user typed.
"""

from __future__ import annotations

import dataclasses
import time

import torch

import model
import scaling
from scaling import count_flops_per_token, count_params
from machinery.cli import Parser, add_commands, in_range, run
from machinery.presets import PRESETS


def human(n: int) -> str:
    """1234567 -> '1.23M'."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(n)


def preset_table(presets: dict[str, model.GPTConfig]) -> str:
    """The presets as a text table: shape, parameters (total / non-embedding / active), FLOPs/token,
    memory."""
    header = (
        f"{'preset':<11} {'layers':>6} {'heads':>5} {'kv':>3} {'width':>5} {'ffn':>5} {'vocab':>6} "
        f"{'ctx':>5} {'params':>9} {'non-emb':>9} {'active':>9} {'FLOPs/tok':>10} {'train mem':>10}"
    )
    rows = [header, "-" * len(header)]
    for name, c in presets.items():
        shape = (
            f"{name:<11} {c.n_layer:>6} {c.n_head:>5} {c.n_kv_head:>3} {c.n_embd:>5} "
            f"{c.ffn_dim:>5} {c.vocab_size:>6} {c.block_size:>5}"
        )
        params = (
            f"{human(count_params(c)):>9} {human(count_params(c, non_embedding=True)):>9} "
            f"{human(count_params(c, active=True)):>9}"
        )
        memory = scaling.training_memory(count_params(c)).total  # 16 bytes a parameter
        cost = f"{count_flops_per_token(c):>10.3g} {memory / 1e9:>8.2f}GB"
        rows.append(f"{shape} {params} {cost}")
    return "\n".join(rows)


def print_presets(args) -> None:
    """The presets table, then (with --moe E) the same presets as Mixtures of Experts."""
    print(preset_table(PRESETS))
    if args.moe:
        print(
            f"\nThe same presets as Mixtures of Experts: every FFN becomes {args.moe} experts, "
            f"{args.top_k} active per token (memory of all, compute of the active):"
        )
        as_moe = {
            f"{name}-moe": dataclasses.replace(c, n_expert=args.moe, expert_top_k=args.top_k)
            for name, c in PRESETS.items()
        }
        print(preset_table(as_moe))
    print(
        "\nparams counts a tied LM head once; non-emb leaves out the token embedding and an untied "
        "head;\nFLOPs/tok = 6 x (active matmul params) + 12 L T C, training, at T = ctx; train mem "
        "= 16 B/param\n(AdamW, mixed precision), activations excluded."
    )


def demo_kv_cache(name: str, new_tokens: int, seed: int) -> str:
    """Greedy decoding from an untrained preset, with the KV cache and without it (a full forward
    over the last block_size tokens at every step): the time each took and where their ids agree.
    Within block_size they must be equal; past it the cache slides its window (see KVCache), so a
    deeper model may pick other tokens."""
    torch.manual_seed(seed)
    gpt = model.GPT(PRESETS[name]).eval()
    prompt_len, window = 8, gpt.config.block_size
    seeded = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, gpt.config.vocab_size, (1, prompt_len), generator=seeded)
    start = time.perf_counter()
    cached = gpt.generate(prompt, new_tokens, temperature=0)
    cached_s = time.perf_counter() - start
    start = time.perf_counter()
    idx = prompt
    with torch.no_grad():
        for _ in range(new_tokens):
            logits, _ = gpt(idx[:, -window:])
            idx = torch.cat((idx, logits[:, -1].argmax(-1, keepdim=True)), dim=1)
    full_s = time.perf_counter() - start
    # tokens predicted from a window that is not full
    inside = min(new_tokens, window - prompt_len)
    known = prompt_len + inside
    past = new_tokens - inside
    lines = [
        f"{name}: {gpt.num_params():,} parameters, {new_tokens} greedy tokens, block_size {window}",
        f"  with KV cache   {cached_s:6.2f} s",
        f"  without cache   {full_s:6.2f} s  ({full_s / cached_s:.1f}x the cached time)",
        f"  same ids within block_size: {torch.equal(cached[:, :known], idx[:, :known])}",
    ]
    if past:
        agree = int((cached[0, -past:] == idx[0, -past:]).sum())
        lines.append(
            f"  past block_size (sliding window vs cropped recompute): {agree} of {past} ids agree"
        )
    return "\n".join(lines)


def naming_flags(call, flags: dict[str, str]):
    """call(); an HFError about one of its inputs (`argument`, a parameter name of the bridge's
    function) is told again with the flag that gave that input."""
    from machinery import hf

    try:
        return call()
    except hf.HFError as e:
        if e.argument in flags:
            raise model.ConfigError(f"{e} ({flags[e.argument]})") from None
        raise


def export(args) -> None:
    from machinery import hf  # the bridge loads train.py and bpe.py: only these two commands

    flags = {"ckpt_path": "--ckpt", "out_dir": "--to", "tokenizer_path": "--tokenizer"}
    print(
        naming_flags(
            lambda: hf.export_checkpoint(args.ckpt, args.to, args.verify, args.tokenizer), flags
        )
    )


def import_hf(args) -> None:
    from machinery import hf

    flags = {"hf_dir": "--from", "ckpt_path": "--to"}
    print(naming_flags(lambda: hf.import_hf_checkpoint(args.hf_dir, args.to), flags))


PRESETS_FLAGS = [
    (
        "--moe",
        {
            "type": in_range(int, 0, 4096),
            "default": 8,
            "metavar": "E",
            "help": "also show each preset as a Mixture of Experts with E experts (0: don't)",
        },
    ),
    (
        "--top-k",
        {"type": in_range(int, 1, 4096), "default": 2, "help": "experts per token in that table"},
    ),
]
DEMO_FLAGS = [
    ("--model", {"choices": list(PRESETS), "default": "tiny"}),
    (
        "--tokens",
        {
            "type": in_range(int, 1, 10_000),
            "default": 100,
            "help": "new tokens (the uncached side recomputes the window per token: 1e4 is "
            "minutes on a CPU)",
        },
    ),
    ("--seed", {"type": in_range(int, 0, 2**32 - 1), "default": 0}),
]
EXPORT_FLAGS = [
    (
        "--ckpt",
        {"required": True, "help": "a train.py checkpoint file, or a run directory (its newest)"},
    ),
    ("--to", {"required": True, "help": "the directory to create (must not exist, or be empty)"}),
    (
        "--tokenizer",
        {
            "help": "a tokenizer .json, only for a checkpoint that holds none (train.py's always "
            "hold theirs)"
        },
    ),
    (
        "--verify",
        {
            "action": "store_true",
            "help": "load the result with transformers and compare logits, greedy tokens and "
            "tokenizer ids with ours",
        },
    ),
]
IMPORT_FLAGS = [
    (
        "--from",
        {
            "dest": "hf_dir",
            "required": True,
            "help": "directory with config.json, model.safetensors and tokenizer.json",
        },
    ),
    ("--to", {"required": True, "help": "the checkpoint file to write"}),
]
COMMANDS = {
    "presets": (
        "table of presets (the default): shape, parameters, FLOPs, memory",
        print_presets,
        PRESETS_FLAGS,
    ),
    "demo": (
        "greedy generation from an untrained preset, with and without the KV cache",
        lambda args: print(demo_kv_cache(args.model, args.tokens, args.seed)),
        DEMO_FLAGS,
    ),
    "export": (
        "write a checkpoint as a Hugging Face LlamaForCausalLM directory (machinery/hf.py)",
        export,
        EXPORT_FLAGS,
    ),
    "import-hf": (
        "read a Hugging Face Llama directory into a train.py checkpoint (machinery/hf.py)",
        import_hf,
        IMPORT_FLAGS,
    ),
}


def main(argv: list[str] | None = None) -> int:
    parser = Parser(
        prog="model.py",
        description="The model: print the presets, time generation with a KV cache, "
        "export to / import from the Hugging Face Llama layout.",
    )
    parser.set_defaults(moe=8, top_k=2, run=print_presets)
    add_commands(parser.add_subparsers(dest="command", parser_class=Parser), COMMANDS)
    args = parser.parse_args(argv)
    if args.moe and args.top_k > args.moe:
        parser.error(
            f"argument --top-k: {args.top_k} experts per token, but --moe gives only {args.moe}"
        )
    errors = (model.ConfigError,)
    if args.command in ("export", "import-hf"):
        errors = (model.ConfigError, OSError)  # an unwritable --to, a full disk
    return run(lambda: args.run(args), errors)
