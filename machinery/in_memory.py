"""The in-memory engine's wiring around data.py's lesson: the recipe an engine builds from
(`Recipe`), what it hands back (`Built`), the tokenizer it trains or loads (`tokenizer_for`), the
--val-data contamination check (`val_overlap`), and `build_in_memory`, the reference engine:
machinery/cleaning.py's `clean` (data.py's steps), the split after dedup, the tokenizer, encoding
and the mix, on Python lists in the order of the lesson. machinery/dataset.py's `prepare` runs it
for small inputs; the streaming engine (machinery/data_at_scale.py) must write the same bytes.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Callable, Iterable

import numpy as np

import bpe
import data
import dedup
from machinery import cleaning


def tokenizer_for(
    recipe: "Recipe", draw_sample: Callable[[], str], log: Callable
) -> tuple[bpe.Tokenizer, int]:
    """(the tokenizer, bytes it trained on): the --tokenizer file (loaded by prepare), or BPE
    trained on the drawn sample."""
    if recipe.tokenizer is not None:
        return recipe.tokenizer, 0
    sample = draw_sample()
    trained_on = len(sample.encode("utf-8"))
    log(
        f"training a {recipe.vocab_size:,}-token BPE tokenizer on {trained_on / 1e6:.2f} MB of "
        "train text ..."
    )
    return check_eot(
        bpe.train_bpe(sample, recipe.vocab_size, special_tokens=(data.EOT,), pattern=recipe.pattern)
    ), trained_on


def check_eot(tok: bpe.Tokenizer) -> bpe.Tokenizer:
    if tok.eot_id is None:
        eot = data.EOT
        raise data.DataError(
            f"the tokenizer has no {eot} special token; train it with special_tokens=({eot!r},)"
        )
    return tok


@dataclasses.dataclass
class Recipe:
    """Everything that decides a dataset's contents: prepare's checked arguments."""

    sources: list[data.Source]
    settings: data.CleanSettings
    vocab_size: int
    seed: int
    val_fraction: float
    weights: list[float] | None
    train_tokens: float | None
    tokenizer_path: pathlib.Path | None
    tokenizer: bpe.Tokenizer | None  # the --tokenizer file, loaded before any work
    tokenizer_train_bytes: int
    pattern: str
    shard_tokens: int
    read_options: tuple  # (text_field, txt_split, skip_bad_lines, max_documents)
    # --val-data: the val split as is
    val_files: list[pathlib.Path] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Built:
    """What an engine hands back: the funnel, the tokenizer, per-source counts, and a writer of the
    shards."""

    funnel: data.Funnel
    tokenizer: bpe.Tokenizer
    trained_on: int
    # each source's documents and tokens in the shards (`kept_per_source`)
    kept: dict[str, dict]
    mixture: dict | None
    encoded_bytes: int
    write_splits: Callable[[pathlib.Path, np.dtype], dict]  # directory -> manifest["splits"]
    # --val-data's n-gram overlap with train (`val_overlap`)
    overlap: dict | None = None


OVERLAP_N = 13


def val_overlap(train_docs: list[str], val_docs: list[str], n: int = OVERLAP_N) -> dict:
    """How much of a held-out file also occurs in train: evaluate.py's contamination check (13-grams
    of lowercased words), with dedup.py's index of the train side. {"n", "ngrams", "shared",
    "documents", "contaminated", "example"}."""
    index = dedup.NgramIndex(n)
    for doc in train_docs:
        index.add(doc)
    index.freeze()
    return overlap_summary([dedup.document_overlap(index, doc) for doc in val_docs], n)


def overlap_summary(rows: list[dict], n: int) -> dict:
    """The totals of dedup.document_overlap's rows, one per val document (shared: n-gram positions
    found in train)."""
    return {
        "n": n,
        "ngrams": sum(r["ngrams"] for r in rows),
        "shared": sum(r["overlapping"] for r in rows),
        "documents": len(rows),
        "contaminated": sum(r["overlapping"] > 0 for r in rows),
        "example": next((r["example"] for r in rows if r["example"]), None),
    }


def train_val_split(
    docs: list[str], val_texts: list[str] | None, seed: int, val_fraction: float
) -> tuple[list[str], list[tuple[int, int, int]], list[int], list[int]]:
    """(documents, their keys, train indices, val indices). With held-out texts every cleaned
    document trains and the texts, appended, are the val split; else each document's split key
    decides (`data.split_documents`)."""
    if val_texts:
        train, val = list(range(len(docs))), list(range(len(docs), len(docs) + len(val_texts)))
        docs = docs + val_texts
        return docs, [data.document_keys(d, seed) for d in docs], train, val
    keys = [data.document_keys(d, seed) for d in docs]
    is_val = data.split_documents(np.array([k[0] for k in keys], dtype=np.uint64), val_fraction)
    train = [i for i in range(len(docs)) if not is_val[i]]
    val = [i for i in range(len(docs)) if is_val[i]]
    return docs, keys, train, val


def kept_per_source(sources: list[data.Source], rows: Iterable[tuple[int, str, int, int]]) -> dict:
    """What each source put in the shards, each document once: {name: {"train": {"documents",
    "tokens"}, "val": {...}}}, the sums of rows (source index, split, documents, tokens). Tokens
    count the <|endoftext|> before each document."""
    names = [s.spec for s in sources]
    kept = {
        name: {split: {"documents": 0, "tokens": 0} for split in ("train", "val")} for name in names
    }
    for source, split, documents, tokens in rows:
        kept[names[source]][split]["documents"] += documents
        kept[names[source]][split]["tokens"] += tokens
    return kept


def mix_train(
    recipe: Recipe, kept: dict, origin: list[int], mix_keys: list[int], ids: list[np.ndarray]
) -> tuple[dict | None, list[int]]:
    """(the mixture, how many times each train document is read): the mix of the train documents
    (origin: each one's source; mix_keys: their mixing keys)."""
    bucket_tokens = [np.zeros(data.MIX_BUCKETS) for _ in kept]
    buckets = data.mix_bucket(np.array(mix_keys, dtype=np.uint64))
    for k, source in enumerate(origin):
        # + 1: the <|endoftext|> before each document
        bucket_tokens[source][buckets[k]] += len(ids[k]) + 1
    mixture, rules = plan_mix(recipe, kept, bucket_tokens)
    reads = [
        int(data.document_reads(*rules[source], buckets[k])) for k, source in enumerate(origin)
    ]
    return mixture, reads


def plan_mix(recipe: Recipe, kept: dict, bucket_tokens: list[np.ndarray]) -> tuple:
    """data.plan_mixture from each source's train tokens, each document once (`kept_per_source`)."""
    unique = {name: splits["train"]["tokens"] for name, splits in kept.items()}
    return data.plan_mixture(list(kept), recipe.weights, recipe.train_tokens, unique, bucket_tokens)


def build_in_memory(
    recipe: Recipe, clock, log: Callable, threads: int | None, val_texts: list[str] | None = None
) -> Built:
    """The reference engine, for small corpora and as the tests' oracle: every step on Python lists,
    in the order of the lesson. The streaming engine must give byte-identical output. clock times
    each step (`with clock.phase("clean"): ...`); val_texts: the documents of recipe.val_files,
    the val split as they are."""
    with clock.phase("clean"):
        docs, origin, funnel = cleaning.clean(recipe.sources, recipe.settings, log)
    cleaned, cleaned_chars, overlap = len(docs), sum(map(len, docs)), None
    # every cleaned document trains; the files are the val split
    if recipe.val_files:
        with clock.phase("overlap"):
            overlap = val_overlap(docs, val_texts)
    docs, keys, train, val = train_val_split(docs, val_texts, recipe.seed, recipe.val_fraction)
    funnel.add_counts(
        "train/val split" + (" (--val-data)" if recipe.val_files else ""),
        cleaned,
        len(train),
        cleaned_chars,
        sum(len(docs[i]) for i in train),
        {"val": len(val)},
    )
    with clock.phase("tokenizer"):
        tok, trained_on = tokenizer_for(
            recipe,
            lambda: data.tokenizer_sample(
                [docs[i] for i in train], [keys[i][1] for i in train], recipe.tokenizer_train_bytes
            ),
            log,
        )
    with clock.phase("encode"):
        ids = data.encode_documents(tok, [docs[i] for i in train + val], threads)
    # --val-data's documents (after the cleaned ones) are no source's
    kept = kept_per_source(
        recipe.sources,
        [
            (origin[i], "train" if k < len(train) else "val", 1, len(ids[k]) + 1)
            for k, i in enumerate(train + val)
            if i < len(origin)
        ],
    )
    train_origin = [origin[i] for i in train]
    train_mix_keys = [keys[i][2] for i in train]
    mixture, reads = mix_train(recipe, kept, train_origin, train_mix_keys, ids[: len(train)])
    sizes = [len(d.encode("utf-8")) for d in docs]

    def write_splits(directory: pathlib.Path, dtype: np.dtype) -> dict:
        splits = {}
        for split, members, documents, reads_of in (
            ("train", train, ids[: len(train)], reads),
            ("val", val, ids[len(train) :], [1] * len(val)),
        ):
            writer = data.ShardWriter(directory, split, dtype, recipe.shard_tokens)
            sizes_of = [sizes[i] for i in members]
            splits[split] = data.pack_split(writer, tok.eot_id, documents, reads_of, sizes_of)
        return splits

    return Built(funnel, tok, trained_on, kept, mixture, sum(sizes), write_splits, overlap)
