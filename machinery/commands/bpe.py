"""`python bpe.py ...`: the command line of bpe.py (demo, show, train, encode, decode), and the
teaching views it prints: the lecture's BPE rounds, and the pieces a text becomes."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import bpe
from machinery import bpe_at_scale, tokenizer_files
from machinery.cli import Parser, add_commands, in_range, run, writable


def load_tokenizer(spec: str) -> bpe.Tokenizer:
    """tokenizer_files.load_tokenizer, with the flag named when cl100k or GPT-2 is not here."""
    try:
        return tokenizer_files.load_tokenizer(spec)
    except bpe.TokenizerError as e:
        if spec in ("cl100k", "gpt2"):
            raise bpe.TokenizerError(f"--tokenizer {spec}: {e}") from None
        raise


DEMO_TEXT = "low lower lowest"
SHOW_TEXTS = [
    "strawberry",
    "How many r's are in strawberry?",
    "1234 + 5678 = 6912",
    "The quick brown fox jumps over the lazy dog.",
    "敏捷的棕色狐狸跳过了懒狗。",
]


def _show_token(token: bytes) -> str:
    """A token as readable text; bytes that are not whole UTF-8 characters are shown as \\xNN."""
    try:
        return token.decode("utf-8")
    except UnicodeDecodeError:
        return "".join(chr(b) if 32 <= b < 127 else f"\\x{b:02x}" for b in token)


def demo(
    text: str = DEMO_TEXT, num_merges: int = 4, pattern: str = "gpt2"
) -> list[tuple[bytes, bytes]]:
    """Print the lecture's BPE rounds: the pair counts, the winner (and any tie), the words after
    the merge."""
    if num_merges < 0:
        raise bpe.TokenizerError(f"the number of merges must be 0 or more, got {num_merges}")
    pieces = Counter(p.encode("utf-8") for p in bpe.pretokenize(text, bpe.resolve_pattern(pattern)))
    print(f"text: {text!r}")
    print("pre-tokens: " + "  ".join(f"{_show_token(p)!r} x{c}" for p, c in pieces.items()))

    def trace(step, pair_counts, pair, words, token_bytes):
        def pair_str(p):
            return f"({_show_token(token_bytes[p[0]])!r}, {_show_token(token_bytes[p[1]])!r})"

        top = pair_counts[pair]
        ranked = sorted(pair_counts.items(), key=lambda kv: -kv[1])
        print(
            f"\nround {step + 1}: pair counts "
            + ", ".join(f"{pair_str(p)}:{c}" for p, c in ranked[:6])
        )
        tied = [p for p, c in pair_counts.items() if c == top and p != pair]
        note = (
            f" (tie at {top} with {', '.join(map(pair_str, tied))}: the greatest byte pair wins)"
            if tied
            else ""
        )
        print(
            f"  merge {pair_str(pair)} -> new token {len(token_bytes) - 1} = "
            f"{_show_token(token_bytes[-1])!r}{note}"
        )
        print(
            "  words: "
            + "  ".join("[" + "|".join(_show_token(token_bytes[t]) for t in w) + "]" for w in words)
        )

    merges = bpe.train_bpe_naive(pieces, num_merges, trace)
    if text == DEMO_TEXT and num_merges >= 3:
        print(
            "\nThe lecture breaks round 1's tie the other way, (l, o) -> 'lo', then (lo, w) -> "
            "'low'; either way 'low' is\nthe 2nd new token and 'lowe' the 3rd. A fixed tie rule "
            "makes merges reproducible across implementations."
        )
    return merges


def show(texts: list[str], tok: bpe.Tokenizer, steps: bool = False) -> None:
    """Print the pieces each text becomes and what a token costs per character, per byte and per
    word.

    With `steps`, also print how BPE builds each pre-token from its bytes, one merge (lowest rank
    first) per line.
    """
    print(f"== {tok.name} ({len(tok):,} ids)")
    for text in texts:
        ids = tok.encode(text, disallowed_special=())
        pieces = "".join(f"[{_show_token(t)}]" for t in tok.decode_tokens(ids))
        n_bytes, n_words = len(text.encode("utf-8")), len(text.split())
        per_word = f", {len(ids) / n_words:.2f} tokens/word" if n_words > 1 else ""
        print(f"{text!r}\n  {len(ids)} tokens: {pieces}\n  ids {ids}")
        print(
            f"  {len(text)} chars, {n_bytes} bytes: "
            f"{len(ids) / max(len(text), 1):.2f} tokens/char, "
            f"{len(ids) / max(n_bytes, 1):.2f} tokens/byte{per_word}"
        )
        for piece in bpe.pretokenize(text, tok.pattern) if steps else []:
            data = piece.encode("utf-8")
            history = [[data[i : i + 1] for i in range(len(data))]]
            bpe.bpe_parts(data, tok.ranks, steps=history)
            print(
                f"  {piece!r}: "
                + " -> ".join("".join(f"[{_show_token(p)}]" for p in parts) for parts in history)
            )


def _cmd_show(args) -> None:
    loaded = []
    for spec in args.tokenizer or ["cl100k", "gpt2"]:
        try:
            loaded.append(load_tokenizer(spec))
        except bpe.TokenizerError as e:
            if args.tokenizer:
                raise
            print(f"== {spec}: skipped ({e})")
    # the main install alone, offline: a small BPE trained here instead
    if not loaded:
        print(
            "== showing a 1,000-token BPE trained now on bpe.py's own text (--tokenizer "
            "DATA_DIR/tokenizer.json shows the one data.py prepare trained)"
        )
        loaded = [bpe.train_bpe(Path(bpe.__file__).read_text(encoding="utf-8"), 1000)]
    for tok in loaded:
        show(args.text or SHOW_TEXTS, tok, args.steps)


def _cmd_train(args) -> None:
    # every flag checked before the corpus is read
    try:
        tokenizer_files.checked_pattern(args.pattern)
    except bpe.TokenizerError as e:
        raise bpe.TokenizerError(f"--pattern: {e}") from None
    out = Path(args.out)
    # the tokenizer would be written over its own training text
    for given in args.input:
        if (
            Path(given).resolve() == out.resolve()
            or out.exists()
            and Path(given).exists()
            and os.path.samefile(given, out)
        ):
            raise bpe.TokenizerError(
                f"--out {args.out} is also an --input file: writing the tokenizer would "
                f"replace that training text; give --out another path"
            )
    if not all(args.special):
        raise bpe.TokenizerError(
            f"--special: special tokens must be non-empty strings, got {args.special}"
        )
    if args.vocab_size < 256 + len(args.special):
        raise bpe.TokenizerError(
            f"--vocab-size {args.vocab_size} leaves no room: 256 byte tokens + "
            f"{len(args.special)} --special tokens need at least {256 + len(args.special)}"
        )
    try:
        tok = bpe_at_scale.train_bpe_parallel(
            args.input,
            args.vocab_size,
            args.special,
            args.pattern,
            args.workers,
            args.errors,
            verbose=True,
        )
    except bpe.TokenizerError as e:
        if "invalid UTF-8" in str(e):
            raise bpe.TokenizerError(f"{e} (--errors replace)") from None
        raise
    tok.save(args.out)
    print(
        f"wrote {args.out}: {len(tok)} ids ({len(tok.merges)} merges, "
        f"specials {tok.special_tokens})"
    )


def _cmd_encode(args) -> None:
    tok = load_tokenizer(args.tokenizer)
    allowed = "all" if args.allow_special else ()
    if args.input:
        for ids in bpe_at_scale.encode_file(tok, args.input, allowed_special=allowed, fast=True):
            if ids:
                print(" ".join(map(str, ids)))
    elif args.text is not None:
        print(" ".join(map(str, tok.encode(args.text, allowed_special=allowed))))
    else:
        raise bpe.TokenizerError("give a text or --input FILE to encode")


def main(argv: list[str] | None = None) -> int:
    parser = Parser(
        prog="bpe.py",
        description="Byte-level BPE: train, encode, decode, and the lecture's lessons.",
    )
    tokenizer = ("--tokenizer", {"default": "cl100k", "help": "cl100k, gpt2 or a tokenizer .json"})
    add_commands(
        parser.add_subparsers(dest="cmd", required=True, parser_class=Parser),
        {
            "demo": (
                "the lecture's 'low lower lowest' merges, step by step",
                lambda args: demo(args.text, args.merges),
                [
                    ("--text", {"default": DEMO_TEXT}),
                    ("--merges", {"type": in_range(int, 0, 10_000), "default": 4}),
                ],
            ),
            "show": (
                "the tokens a text becomes (strawberry, digits, English vs Chinese)",
                _cmd_show,
                [
                    ("text", {"nargs": "*", "help": f"texts to show (default: {SHOW_TEXTS})"}),
                    (
                        "--tokenizer",
                        {
                            "nargs": "+",
                            "default": None,
                            "help": "cl100k, gpt2 or tokenizer .json files (default: cl100k and, "
                            "if its files are found, gpt2)",
                        },
                    ),
                    (
                        "--steps",
                        {
                            "action": "store_true",
                            "help": "also show the merges that build each pre-token",
                        },
                    ),
                ],
            ),
            "train": (
                "train a tokenizer on UTF-8 text files",
                _cmd_train,
                [
                    ("--input", {"nargs": "+", "required": True, "help": "text files"}),
                    ("--vocab-size", {"type": in_range(int, 256, 2**32), "required": True}),
                    (
                        "--out",
                        {
                            "type": writable("file"),
                            "required": True,
                            "help": "tokenizer .json to write",
                        },
                    ),
                    (
                        "--pattern",
                        {"default": "gpt4", "help": "gpt2, gpt4 or a regex (default gpt4)"},
                    ),
                    (
                        "--special",
                        {
                            "nargs": "*",
                            "default": [bpe.EOT],
                            "help": f"special tokens (default {bpe.EOT})",
                        },
                    ),
                    (
                        "--workers",
                        {
                            "type": in_range(int, 1, 1024),
                            "default": None,
                            "help": "pre-tokenization processes (default: all cores)",
                        },
                    ),
                    (
                        "--errors",
                        {
                            "default": "strict",
                            "choices": ["strict", "replace", "ignore"],
                            "help": "what to do with invalid UTF-8 (default: stop with an error)",
                        },
                    ),
                ],
            ),
            "encode": (
                "print the ids of a text or a file",
                _cmd_encode,
                [
                    ("text", {"nargs": "?", "help": "text to encode (or use --input)"}),
                    ("--input", {"help": "a UTF-8 file, streamed"}),
                    tokenizer,
                    (
                        "--allow-special",
                        {
                            "action": "store_true",
                            "help": "encode special tokens in the text as their ids",
                        },
                    ),
                ],
            ),
            "decode": (
                "print the text of ids",
                lambda args: print(load_tokenizer(args.tokenizer).decode(args.ids)),
                [("ids", {"nargs": "+", "type": in_range(int, 0, 2**32 - 1)}), tokenizer],
            ),
        },
    )
    args = parser.parse_args(argv)

    def command():
        args.run(args)  # a command prints; what it returns (demo's merges) is no exit code

    # a TokenizerError, or an OSError (unreadable input, full disk): one line and exit code 2
    return run(command, (bpe.TokenizerError, OSError))
