"""Byte-level BPE: the tokenizer every other file eats tokens from.

A language model does not read characters, it reads token ids. Byte-pair encoding (BPE) builds the
vocabulary with an algorithm simple enough for homework: start from the 256 possible bytes, find the
most frequent pair of adjacent tokens in the corpus, make that pair a new token, and repeat until
the vocabulary has the size you want.

The lecture's corpus "low lower lowest" (run `python bpe.py demo` to watch it):

    pre-tokens (the regex splits text into words first):  "low"  " lower"  " lowest"
    round 1: (l, o) and (o, w) both occur 3 times   -> a tie; the lecture takes (l, o), we (o, w)
    round 2: (l, ow) occurs 3 times                 -> new token "low"
    round 3: (low, e) and ( , low) both occur twice -> (low, e) wins the tie -> "lowe"
    ... until |V| = target

The highest count wins; among equal counts, the greatest pair of byte strings (b"o" > b"l"), as
in Stanford CS336, so merges compare across implementations.

Three facts shape the code:
1. Byte-level: ids 0-255 are the raw bytes, so nothing is ever "unknown". Special tokens such as
   "<|endoftext|>" get their own ids after the merges; the text is cut at them before anything else.
2. Pre-tokenization: a regex (GPT-2's or GPT-4's) cuts text into pieces (" lower", "123", "!!\n")
   and merges never cross a piece. Counting each distinct piece once is what makes training cheap:
   TinyStories' first 2 MiB is 479,933 pieces but only 7,372 distinct ones.
3. Encoding the way tiktoken does it: inside a piece, merge the adjacent pair whose concatenation
   has the lowest rank (id), until none is in the vocabulary. Same ranks, same ids as tiktoken.

docs/bpe.md has the "LLM quirks" `python bpe.py show` prints, streaming and the benchmarks.

Depends on: the standard library, `regex` (installed with tiktoken; needed for \\p{L}) and tiktoken.
"""

from __future__ import annotations

import heapq
import json
import os
import re
from collections import Counter, defaultdict
from functools import lru_cache
from pathlib import Path
from typing import Iterable

import regex
import tiktoken

FORMAT_NAME = "bpe.py tokenizer"
FORMAT_VERSION = 1
EOT = "<|endoftext|>"


class TokenizerError(ValueError):
    """Bad input to the tokenizer: the message is one line that names the problem and the fix."""


REMAKE_TOKENIZER = "the file is damaged: re-create it with `python bpe.py train`"

# 1. The idea in a few lines: count adjacent pairs, merge the best one, repeat.


def count_pairs(word_counts: dict[tuple[int, ...], int]) -> Counter:
    """Count adjacent token pairs over words, each word weighted by how often it occurs.

    >>> count_pairs({(1, 2, 3): 1, (1, 2): 2})
    Counter({(1, 2): 3, (2, 3): 1})
    """
    pairs = Counter()
    for word, count in word_counts.items():
        for pair in zip(word, word[1:]):
            pairs[pair] += count
    return pairs


def merge_pair(word: tuple[int, ...], pair: tuple[int, int], new_id: int) -> tuple[int, ...]:
    """Replace each occurrence of `pair` in `word` by `new_id`, scanning left to right.

    >>> merge_pair((1, 2, 3, 1, 2), (1, 2), 256)
    (256, 3, 256)
    >>> merge_pair((7, 7, 7), (7, 7), 256)   # non-overlapping: the leftmost occurrence wins
    (256, 7)
    """
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and word[i] == pair[0] and word[i + 1] == pair[1]:
            out.append(new_id)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def best_pair(pair_counts: dict[tuple[int, int], int], token_bytes: list[bytes]) -> tuple[int, int]:
    """The pair to merge next: highest count, ties to the greatest (bytes, bytes) pair.

    >>> tb = [bytes([i]) for i in range(256)]
    >>> best_pair({(108, 111): 3, (111, 119): 3, (32, 108): 2}, tb)   # (l,o) vs (o,w): b"o" > b"l"
    (111, 119)
    """
    return max(pair_counts, key=lambda p: (pair_counts[p], token_bytes[p[0]], token_bytes[p[1]]))


def train_bpe_naive(
    word_counts: dict[bytes, int], num_merges: int, trace=None
) -> list[tuple[bytes, bytes]]:
    """The textbook trainer: recount every pair after every merge (O(merges x corpus)).

    `word_counts` maps each pre-token's bytes to its frequency. After each merge it calls
    `trace(step, pair_counts, pair, words, token_bytes)` if given (the demo prints the rounds with
    it). Returns the merges as byte pairs, in order.

    >>> train_bpe_naive({b"low": 1, b" lower": 1, b" lowest": 1}, 2)
    [(b'o', b'w'), (b'l', b'ow')]
    """
    token_bytes = [bytes([i]) for i in range(256)]
    words = {tuple(w): c for w, c in word_counts.items()}
    merges = []
    for step in range(num_merges):
        pair_counts = count_pairs(words)
        if not pair_counts:
            break
        pair = best_pair(pair_counts, token_bytes)
        new_id = len(token_bytes)
        token_bytes.append(token_bytes[pair[0]] + token_bytes[pair[1]])
        merges.append((token_bytes[pair[0]], token_bytes[pair[1]]))
        words = {merge_pair(w, pair, new_id): c for w, c in words.items()}
        if trace is not None:
            trace(step, pair_counts, pair, words, token_bytes)
    return merges


# 2. Pre-tokenization: special tokens cut first, then a regex cuts pieces that merges never cross.

# GPT-2's pattern as tiktoken writes it (r50k/gpt2): contractions, optional space + letters,
# optional space + digits, optional space + punctuation, whitespace runs (the last space of a run
# sticks to the next word).
GPT2_PATTERN = (
    r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
)
# GPT-4's cl100k_base pattern: case-insensitive contractions, digits in groups of at most 3,
# newlines glued to punctuation, one leading non-letter allowed before a word.
GPT4_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
PATTERNS = {"gpt2": GPT2_PATTERN, "gpt4": GPT4_PATTERN, "cl100k": GPT4_PATTERN}
# Neither pattern's pieces go on past a space that follows a printable ASCII character ("a b" is
# always "a", " b"), so text cut before such spaces encodes part by part to the same ids, and the
# parts (words with their punctuation) repeat: "The cat, the cat." -> "The", "cat,", "the", "cat."
WORD_CUT = re.compile(r" (?<=[!-~] )")  # a space (split drops it) after "!" ... "~"


def resolve_pattern(pattern: str) -> str:
    """A pattern name ("gpt2", "gpt4") becomes its regex; any other string must be a regex whose
    matches, joined, give the text back (machinery/tokenizer_files.py checks a custom one)."""
    if not isinstance(pattern, str) or not pattern:
        raise TokenizerError(f"pattern must be 'gpt2', 'gpt4' or a regex string, got {pattern!r}")
    pattern = PATTERNS.get(pattern, pattern)
    try:
        regex.compile(pattern)
    except regex.error as e:
        raise TokenizerError(f"pattern {pattern!r} is not a valid regex ({e})") from None
    return pattern


@lru_cache(maxsize=64)
def special_splitter(specials: frozenset[str]) -> regex.Pattern:
    """A regex that finds any of `specials`, longest first ("<|a|><|a|>" before "<|a|>")."""
    return regex.compile("|".join(regex.escape(s) for s in sorted(specials, key=len, reverse=True)))


def pretokenize(
    text: str, pattern: str = GPT2_PATTERN, special_tokens: Iterable[str] = ()
) -> list[str]:
    """Cut text into the pieces BPE works inside; special tokens are cut out and dropped.

    >>> pretokenize("low lower<|endoftext|> lowest!!", GPT2_PATTERN, ["<|endoftext|>"])
    ['low', ' lower', ' lowest', '!!']
    """
    pat = regex.compile(pattern)
    specials = frozenset(special_tokens)
    segments = special_splitter(specials).split(text) if specials else [text]
    return [piece for segment in segments for piece in pat.findall(segment)]


# 3. The fast trainer: train_bpe_naive's merges, without recounting the corpus after each merge.

# Python's heap pops the *smallest* item, but ties must go to the *greatest* byte pair. So each
# token gets a sort key that reverses byte order: byte b becomes chr(256 - b), and a terminator
# chr(257), larger than all of them, ends the token. So a longer token sorts before its own prefix,
# as b"ab" > b"a" requires, and the key of a pair, key(left) + key(right), compares left tokens
# first and right tokens only when the left ones are equal.
_REVERSE_BYTES = {b: chr(256 - b) for b in range(256)}
_END = chr(257)


def _descending_key(token: bytes) -> str:
    """A string whose ascending order is the descending order of the bytes.

    >>> key = _descending_key
    >>> key(b"b") < key(b"a"), key(b"ab") < key(b"a")
    (True, True)
    """
    return token.decode("latin-1").translate(_REVERSE_BYTES) + _END


def _merge_words(
    word_counts: dict[bytes, int], num_merges: int, progress=None
) -> list[tuple[bytes, bytes]]:
    """BPE merges with incremental pair counts and a max-heap with lazy invalidation.

    State: `words[i]`, one character per token (id t is chr(t): str.replace merges a pair in C),
    occurring `freqs[i]` times; `where[pair]`, the words that hold the pair, once per occurrence;
    `pair_counts[pair]`, the sum of their frequencies. A merge rewrites only these words: counts
    change by the merged word's pairs minus the old word's. A count that falls keeps its heap entry,
    now too high: popped, it goes back with the count of now ("lazy invalidation"), so the best pair
    costs O(log #entries), not a scan over all pairs. `progress(done, wanted)` follows each merge.
    """
    words = [w.decode("latin-1") for w in word_counts]  # latin-1: byte b is chr(b)
    freqs = list(word_counts.values())
    token_bytes = [bytes([i]) for i in range(256)]
    keys = [_descending_key(t) for t in token_bytes]
    where: dict[str, list[int]] = defaultdict(list)
    for i, word in enumerate(words):
        for j in range(len(word) - 1):
            where[word[j : j + 2]].append(i)
    pair_counts = {pair: sum(freqs[i] for i in held_by) for pair, held_by in where.items()}
    # heap entry: (-count, descending key of the pair, pair): the smallest entry is the best pair
    heap = [(-c, keys[ord(p[0])] + keys[ord(p[1])], p) for p, c in pair_counts.items()]
    heapq.heapify(heap)
    merges: list[tuple[bytes, bytes]] = []
    while len(merges) < num_merges and heap:
        neg_count, key, pair = heapq.heappop(heap)
        if pair_counts[pair] != -neg_count:  # stale entry: the count fell after it was pushed
            if pair_counts[pair] > 0:
                heapq.heappush(heap, (-pair_counts[pair], key, pair))
            continue
        merges.append((token_bytes[ord(pair[0])], token_bytes[ord(pair[1])]))
        token_bytes.append(b"".join(merges[-1]))
        keys.append(_descending_key(token_bytes[-1]))
        delta = _rewrite_words(words, freqs, where, pair, chr(len(token_bytes) - 1))
        for pair, change in delta.items():
            count = pair_counts.get(pair, 0) + change
            pair_counts[pair] = count
            if count <= 0:  # gone for good: a pair of old tokens never reappears
                where.pop(pair, None)
            elif change > 0:  # only the (new) pairs with the new token grow: their first entry
                heapq.heappush(heap, (-count, keys[ord(pair[0])] + keys[ord(pair[1])], pair))
        if progress is not None:
            progress(len(merges), num_merges)
    return merges


def _rewrite_words(words, freqs, where, pair: str, new_token: str) -> dict[str, int]:
    """Merge `pair` into `new_token` in the words that hold it; return each pair's count change,
    counted only from the character before the first occurrence to the one after the last."""
    delta: dict[str, int] = defaultdict(int)
    for i in where.pop(pair):
        word = words[i]
        if pair not in word:
            continue  # this word lost the pair in an earlier merge, or was listed twice
        merged = word.replace(pair, new_token)  # leftmost first, as merge_pair does
        freq = freqs[i]
        first, end = word.find(pair), word.rfind(pair) + 3
        start = first - 1 if first else 0  # the character before the first occurrence, if any
        old, new = word[start:end], merged[start : end - len(word) + len(merged)]
        for j in range(len(old) - 1):
            delta[old[j : j + 2]] -= freq
        for j in range(len(new) - 1):
            new_pair = new[j : j + 2]
            delta[new_pair] += freq
            where[new_pair].append(i)  # the pairs with the new token are among these
        words[i] = merged
    return delta


def train_bpe(
    text_or_paths,
    vocab_size: int,
    special_tokens: Iterable[str] = (EOT,),
    pattern: str = "gpt4",
    errors: str = "strict",
) -> "Tokenizer":
    """Train a byte-level BPE tokenizer of `vocab_size` ids (fewer if the corpus runs out of pairs).

    `text_or_paths`: a str of text, a path, or a list of paths (files are read as UTF-8;
    `errors="replace"` accepts invalid bytes). Ids: 0-255 bytes, then one id per merge in order,
    then the special tokens. (machinery/bpe_at_scale.py counts a big corpus in parallel first.)

    >>> tok = train_bpe("low lower lowest", 256 + 3 + 1, pattern="gpt2")
    >>> tok.merges
    [(b'o', b'w'), (b'l', b'ow'), (b'low', b'e')]
    >>> tok.encode(" lowest"), tok.special_tokens
    ([32, 258, 115, 116], {'<|endoftext|>': 259})
    """
    specials = check_specials(special_tokens)
    check_vocab_size(vocab_size, specials)
    pattern = resolve_pattern(pattern)
    word_counts = count_pretokens(text_or_paths, pattern, specials, errors)
    return train_on_counts(word_counts, vocab_size, specials, pattern)


def train_on_counts(
    word_counts: dict[bytes, int],
    vocab_size: int,
    specials: tuple[str, ...],
    pattern: str,
    progress=None,
) -> "Tokenizer":
    """The tokenizer of `vocab_size` ids that BPE learns from pre-token counts (count_pretokens)."""
    if not word_counts:
        raise TokenizerError("the training input is empty (no text besides special tokens)")
    merges = _merge_words(word_counts, vocab_size - 256 - len(specials), progress)
    return Tokenizer.from_merges(merges, specials, pattern)


def count_pretokens(
    text_or_paths, pattern: str, special_tokens: Iterable[str] = (), errors: str = "strict"
) -> Counter:
    """Frequency of every distinct pre-token, as bytes, over a text or files read one by one.

    >>> count_pretokens("a a a<|endoftext|>b", GPT2_PATTERN, ["<|endoftext|>"])
    Counter({b' a': 2, b'a': 1, b'b': 1})
    """
    if isinstance(text_or_paths, str):
        texts = [text_or_paths]
    else:  # one path or a list of paths, each file read whole as UTF-8 ("\r\n" kept)
        paths = [text_or_paths] if isinstance(text_or_paths, os.PathLike) else text_or_paths
        texts = (Path(path).read_bytes().decode("utf-8", errors=errors) for path in paths)
    counts = Counter()
    for text in texts:
        counts.update(pretokenize(text, pattern, special_tokens))
    return Counter({piece.encode("utf-8"): c for piece, c in counts.items()})


def check_specials(special_tokens) -> tuple[str, ...]:
    """The special tokens in order, without repeats."""
    specials = tuple(dict.fromkeys(special_tokens))
    if isinstance(special_tokens, str) or not all(isinstance(s, str) and s for s in specials):
        raise TokenizerError(f"special tokens must be non-empty strings, got {special_tokens!r}")
    return specials


def check_vocab_size(vocab_size: int, specials: tuple[str, ...]) -> None:
    if not isinstance(vocab_size, int) or vocab_size < 256 + len(specials):
        raise TokenizerError(
            f"vocab_size must be at least 256 + {len(specials)}, got {vocab_size!r}"
        )


# 4. The tokenizer: encode by merge rank (tiktoken's rule), decode by joining bytes.


def bpe_parts(
    piece: bytes, ranks: dict[bytes, int], max_rank: float = float("inf"), steps: list | None = None
) -> list[bytes]:
    """Split one piece into tokens as tiktoken does: merge the adjacent pair whose concatenation has
    the lowest rank (leftmost on ties), repeat. `max_rank` allows only tokens ranked below it (to
    recover which pair made a token); `steps` receives the parts after each merge.

    >>> ranks = {bytes([i]): i for i in range(256)} | {b"lo": 256, b"low": 257, b"er": 258}
    >>> bpe_parts(b"lower", ranks)   # l o w e r -> lo w e r -> low e r -> low er
    [b'low', b'er']
    """
    parts = [piece[i : i + 1] for i in range(len(piece))]
    # pair_ranks[i]: the rank of parts[i] + parts[i + 1]; a pair that is no token (or ranks too
    # high) has max_rank and never wins
    pair_ranks = [ranks.get(left + right, max_rank) for left, right in zip(parts, parts[1:])]
    while pair_ranks:
        best_rank = min(pair_ranks)
        if best_rank >= max_rank:
            break
        i = pair_ranks.index(best_rank)  # the leftmost of the lowest
        merged = parts[i] + parts[i + 1]
        parts[i] = merged
        del parts[i + 1]
        del pair_ranks[i]
        # only the pairs that hold the new part change (tiktoken's bookkeeping: a long piece costs
        # two look-ups a merge, not a pass over all its pairs)
        if i > 0:
            pair_ranks[i - 1] = ranks.get(parts[i - 1] + merged, max_rank)
        if i < len(pair_ranks):
            pair_ranks[i] = ranks.get(merged + parts[i + 1], max_rank)
        if steps is not None:
            steps.append(list(parts))
    return parts


class Tokenizer:
    """Byte-level BPE: mergeable ranks (bytes -> id), special tokens (str -> id) and a regex.

    `vocab` (id -> bytes, specials included), `merges` (byte pairs in merge order), `len(tok)`
    (largest id + 1, the model's vocab_size). Ids need not start at the bytes: GPT-2's "!" is 0.
    """

    CACHE_LIMIT = 200_000  # pieces the pure-Python encoder remembers before it clears its cache

    def __init__(
        self,
        ranks: dict[bytes, int],
        special_tokens: dict[str, int] | None = None,
        pattern: str = "gpt4",
        merges: list[tuple[bytes, bytes]] | None = None,
        name: str = "bpe",
    ):
        self.ranks = dict(ranks)
        self.special_tokens = dict(special_tokens or {})
        self.pattern = resolve_pattern(pattern)
        self.splitter = regex.compile(self.pattern)  # cuts text into the pieces BPE works inside
        self.name = name
        missing = [b for b in range(256) if bytes([b]) not in self.ranks]
        if missing:
            raise TokenizerError(f"ranks lack {len(missing)} single bytes; BPE needs all 256")
        self.vocab = {i: t for t, i in self.ranks.items()}
        self.vocab.update({i: s.encode("utf-8") for s, i in self.special_tokens.items()})
        if len(self.vocab) != len(self.ranks) + len(self.special_tokens):
            raise TokenizerError("two tokens share one id; every token needs its own id")
        self._merges = list(merges) if merges is not None else None
        # text may be cut into words (WORD_CUT) under the built-in patterns, not under a custom one
        self.cuts_words = self.pattern in (GPT2_PATTERN, GPT4_PATTERN)
        self._word_ids: dict[str, list[int]] = {}  # "cat," -> the ids of " cat,"
        self._piece_ids: dict[str, list[int]] = {}  # " cat" -> its ids
        self._tiktoken = None

    @classmethod
    def from_merges(
        cls,
        merges: list[tuple[bytes, bytes]],
        special_tokens: Iterable[str] = (EOT,),
        pattern: str = "gpt4",
        name: str = "bpe",
    ) -> "Tokenizer":
        """Ids 0-255 for the bytes, 256 + k for merge k, then the special tokens in order."""
        ranks = {bytes([i]): i for i in range(256)}
        for left, right in merges:
            # rare: (a, bc) and (ab, c) can both make "abc"; it keeps its first id (tiktoken's rule)
            ranks.setdefault(left + right, len(ranks))
        specials = {s: len(ranks) + k for k, s in enumerate(check_specials(special_tokens))}
        return cls(ranks, specials, pattern, merges, name)

    @property
    def merges(self) -> list[tuple[bytes, bytes]]:
        """Merge list in order. Ranks that came without one (tiktoken): a token of rank r, split by
        BPE with the tokens ranked below r, ends in two parts, the pair that made it."""
        if self._merges is None:
            merges = []
            for token, rank in sorted(self.ranks.items(), key=lambda kv: kv[1]):
                if len(token) > 1:
                    parts = bpe_parts(token, self.ranks, max_rank=rank)
                    if len(parts) != 2:
                        raise TokenizerError(f"token {token!r} is no merge of lower-ranked tokens")
                    merges.append((parts[0], parts[1]))
            self._merges = merges
        return self._merges

    def __len__(self) -> int:
        return max(self.vocab) + 1

    @property
    def eot_id(self) -> int | None:
        return self.special_tokens.get(EOT)

    # -- encoding ----------

    def encode_piece(self, piece: bytes) -> list[int]:
        """Ids of one pre-token. A piece that is itself a token is one id (tiktoken's shortcut)."""
        rank = self.ranks.get(piece)
        if rank is not None:
            return [rank]
        return [self.ranks[p] for p in bpe_parts(piece, self.ranks)]

    def encode_ordinary(self, text: str) -> list[int]:
        """Encode text, special-token strings as ordinary text. Real text repeats its words, so the
        text is cut into words (WORD_CUT), each distinct word is encoded once and cached, and most
        of the work is one look-up per word.

        >>> tok = Tokenizer.from_merges([(b"a", b"t"), (b"c", b"at")])
        >>> tok.encode_ordinary("cat at cat")  # "cat", ["at", "cat"]: " at" is [32, 256]
        [257, 32, 256, 32, 257]
        """
        if not isinstance(text, str):
            raise TokenizerError(f"encode expects a str, got {type(text).__name__}")
        if len(self._word_ids) + len(self._piece_ids) > self.CACHE_LIMIT:
            self._word_ids.clear()
            self._piece_ids.clear()
        first, words = text, []
        if self.cuts_words:
            first, *words = WORD_CUT.split(text)  # each word after the first had a space before it
        ids = self.encode_text(first)
        for word in set(words).difference(self._word_ids):  # the words not seen before
            if word.isascii() and word.isalpha():  # " cat" is one piece under both patterns
                self._word_ids[word] = self.encode_piece(b" " + word.encode("ascii"))
            else:
                self._word_ids[word] = self.encode_text(" " + word)
        for word in words:
            ids += self._word_ids[word]
        return ids

    def encode_text(self, text: str) -> list[int]:
        """The regex's pieces of text, each distinct piece merged once and cached."""
        ids: list[int] = []
        for piece in self.splitter.findall(text):
            if piece not in self._piece_ids:
                self._piece_ids[piece] = self.encode_piece(piece.encode("utf-8"))
            ids += self._piece_ids[piece]
        return ids

    def special_sets(self, allowed_special, disallowed_special) -> tuple[frozenset, frozenset]:
        """tiktoken's options as sets ("all" disallowed: every special token not allowed)."""
        names = frozenset(self.special_tokens)
        allowed = names if allowed_special == "all" else frozenset(allowed_special)
        unknown = allowed - names
        if unknown:
            raise TokenizerError(f"allowed_special has {sorted(unknown)}, not special tokens")
        if disallowed_special == "all":
            return allowed, names - allowed
        return allowed, frozenset(disallowed_special)

    def encode(self, text: str, allowed_special=(), disallowed_special="all") -> list[int]:
        """Encode text like tiktoken: a special token in the text raises unless allowed.
        `allowed_special`: special-token strings (a set, or "all") encoded as their own ids;
        `disallowed_special`: those that raise when found ("all": all not allowed; (): none)."""
        if not isinstance(text, str):
            raise TokenizerError(f"encode expects a str, got {type(text).__name__}")
        allowed, disallowed = self.special_sets(allowed_special, disallowed_special)
        if disallowed:
            found = special_splitter(disallowed).search(text)
            if found:
                how = "allowed_special to encode it as one id, disallowed_special=() as text"
                raise TokenizerError(f"text holds the special token {found.group()!r}; pass {how}")
        if not allowed:
            return self.encode_ordinary(text)
        ids, start = [], 0
        for found in special_splitter(allowed).finditer(text):
            ids += self.encode_ordinary(text[start : found.start()])
            ids.append(self.special_tokens[found.group()])
            start = found.end()
        return ids + self.encode_ordinary(text[start:])

    # -- decoding ----------

    def decode_tokens(self, ids) -> list[bytes]:
        """The bytes of each id. An unknown id raises one clear error."""
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)  # numpy, torch, generators
        try:
            return [self.vocab[i] for i in ids]
        except (KeyError, TypeError):
            bad = next(i for i in ids if not isinstance(i, int) or i not in self.vocab)
            raise TokenizerError(f"token id {bad!r} is not in the vocabulary") from None

    def decode(self, ids, errors: str = "replace") -> str:
        """Join the bytes and read them as UTF-8 (invalid bytes become U+FFFD by default). A token
        can end inside a character (Chinese characters are 3 bytes): decode whole sequences, not
        ids one at a time."""
        return b"".join(self.decode_tokens(ids)).decode("utf-8", errors=errors)

    # -- interop ----------

    def to_tiktoken(self):
        """A cached `tiktoken.Encoding` of our ranks, pattern and specials: same ids, Rust speed."""
        if self._tiktoken is None:
            self._tiktoken = tiktoken.Encoding(
                name=self.name,
                pat_str=self.pattern,
                mergeable_ranks=self.ranks,
                special_tokens=self.special_tokens,
            )
        return self._tiktoken

    @classmethod
    def from_tiktoken(cls, encoding) -> "Tokenizer":
        """Wrap a tiktoken.Encoding (GPT-2, cl100k): it has no getters, so read its constructor's
        arguments, stored under these names since tiktoken's first release."""
        ranks, specials = encoding._mergeable_ranks, encoding._special_tokens
        return cls(ranks, specials, encoding._pat_str, None, encoding.name)

    # -- files ----------

    def to_json(self) -> str:
        """The tokenizer as a JSON document; `from_json` reads it back. The format (version 1):

            {"format": "bpe.py tokenizer", "version": 1, "name": "bpe", "pattern": "<the regex>",
             "special_tokens": {"<|endoftext|>": 499},
             "vocab": {"Ā": 0, ..., "Ġ": 32, ..., "Ġt": 256, ...},   token -> id, in id order
             "merges": ["Ġ t", "Ġ a", ...]}                          merge order, left and right

        Tokens are written in GPT-2's printable alphabet (gpt2_bytes_to_unicode: a space is "Ġ"), as
        in GPT-2's and Hugging Face's files, so a merge is two tokens joined by one real space.
        """
        doc = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "name": self.name,
            "pattern": self.pattern,
            "special_tokens": self.special_tokens,
            **written_vocab_and_merges(self.ranks, self.merges),
        }
        return json.dumps(doc, ensure_ascii=False, indent=1)

    @classmethod
    def from_json(cls, text: str | bytes, source: str = "tokenizer JSON") -> "Tokenizer":
        """Read what `to_json` wrote; damage is one line naming `source`."""
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError) as e:
            reason = f"not valid JSON ({str(e).splitlines()[0]})"
            raise TokenizerError(f"{source}: {reason}; {REMAKE_TOKENIZER}") from None
        return cls.from_document(doc, source)

    @classmethod
    def from_document(cls, doc, source: str = "tokenizer JSON") -> "Tokenizer":
        """from_json for a parsed document (machinery/tokenizer_files.py checks a foreign one)."""
        if not isinstance(doc, dict) or doc.get("format") != FORMAT_NAME:
            raise TokenizerError(f"{source}: not a {FORMAT_NAME} file; {REMAKE_TOKENIZER}")
        if doc.get("version") != FORMAT_VERSION:
            version = doc.get("version")
            raise TokenizerError(f"{source}: format version {version!r}, not {FORMAT_VERSION}")
        try:
            ranks = {from_gpt2_text(t): i for t, i in doc["vocab"].items()}
            merges = [tuple(from_gpt2_text(x) for x in m.split(" ")) for m in doc["merges"]]
            return cls(ranks, doc["special_tokens"], doc["pattern"], merges, doc.get("name", "bpe"))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise TokenizerError(f"{source}: {type(e).__name__}: {e}; {REMAKE_TOKENIZER}") from None

    def save(self, path) -> None:
        """Write the JSON whole or not at all: into a temporary file beside it, then renamed over
        `path` (a crash or a full disk never leaves half a tokenizer)."""
        path = Path(path)
        temporary = path.with_name(f".{path.name}.tmp")
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            temporary.write_text(self.to_json(), encoding="utf-8")
            os.replace(temporary, path)
        finally:
            temporary.unlink(missing_ok=True)

    @classmethod
    def load(cls, path) -> "Tokenizer":
        return cls.from_json(Path(path).read_bytes(), str(path))


# 5. GPT-2's map of bytes to printable characters: how the JSON files write tokens.


@lru_cache(maxsize=1)
def gpt2_bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from each byte to a printable character, so tokens can be written as text:
    printable bytes stand for themselves, the 68 others (space, control bytes) become chr(256),
    chr(257), ... in byte order, so the space byte 32 is "Ġ" (chr(288)) and " the" is "Ġthe".

    >>> gpt2_bytes_to_unicode()[ord(" ")], gpt2_bytes_to_unicode()[ord("a")]
    ('Ġ', 'a')
    """
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping = {b: chr(b) for b in printable}
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + len(mapping) - len(printable))
    return mapping


_GPT2_CHAR_TO_BYTE = {c: b for b, c in gpt2_bytes_to_unicode().items()}


def gpt2_text(token: bytes) -> str:
    """A token's bytes written in GPT-2's printable alphabet: b" the" -> "Ġthe"."""
    return token.decode("latin-1").translate(gpt2_bytes_to_unicode())  # latin-1: byte b is chr(b)


def from_gpt2_text(text: str) -> bytes:
    """The bytes a token written in GPT-2's alphabet stands for: "Ġthe" -> b" the"."""
    return bytes(_GPT2_CHAR_TO_BYTE[c] for c in text)


def written_vocab_and_merges(ranks: dict[bytes, int], merges: list[tuple[bytes, bytes]]) -> dict:
    """ "vocab" (token -> id, in id order) and "merges" ("left right") in GPT-2's alphabet, as both
    JSON formats (ours, Hugging Face's) write them."""
    vocab = {gpt2_text(t): i for t, i in sorted(ranks.items(), key=lambda kv: kv[1])}
    return {"vocab": vocab, "merges": [f"{gpt2_text(a)} {gpt2_text(b)}" for a, b in merges]}


if __name__ == "__main__":
    from machinery.commands import bpe as command

    raise SystemExit(command.main())
