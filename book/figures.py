"""book/figures.py: the book's drawn figures, made by the chapters' own functions.

    python book/figures.py s-curve     # docs/figures/dedup-s-curve.png (dedup.candidate_probability)
    python book/figures.py all         # every figure below, in a few seconds

Each figure calls the lesson's code (no number is typed here), so a figure changes when the chapter
does, and `python book/build.py --refresh-figures NAME` reruns the command printed under it in the
book. The PNGs are committed in docs/figures/ so the build needs neither matplotlib nor the time to
draw them.

* s-curve: P(candidate | J) = 1 - (1 - J^r)^b for the two LSH settings dedup.py teaches, with their
  thresholds.
* bpe-merges: tokens per word as merges are added, for BPE trained by bpe.train_bpe on the committed
  docs/*.md, measured on held-out English (README.md) and on Python (model.py): where the merges
  come from matters.
* model-cost: each preset's parameters (embedding vs the rest, scaling.count_params) and the
  attention share of its training FLOPs per token as the context grows
  (scaling.count_flops_per_token).
* zero-memory: bytes per rank of a 7e9-parameter model under DP and ZeRO-1/2/3 as ranks are added
  (parallel.zero_memory_per_rank).
* emergence: exact match of k steps, p^k (evaluate.exact_match_from_per_step), against per-step
  accuracy p.
* languages: one sentence in twelve languages and each of its words alone, as classify.py's shipped
  language model reads them (classify.identify_language): a sentence is easy, a lone word is not.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "figures"


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise SystemExit(
            "book/figures.py: error: the figures need matplotlib: pip install matplotlib"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 12, "axes.grid": True, "grid.alpha": 0.3, "figure.dpi": 100})
    return plt


def _save(fig, name: str) -> pathlib.Path:
    """Write through a temp name and rename, so a killed run leaves the old PNG whole."""
    path = OUT / name
    OUT.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    fig.savefig(temp, format="png", bbox_inches="tight", metadata={"Software": None})
    os.replace(temp, path)
    return path


def s_curve(plt) -> pathlib.Path:
    import numpy as np
    import dedup

    j = np.linspace(0.0, 1.0, 201)
    fig, ax = plt.subplots(figsize=(9, 5))
    for (bands, rows), y in (((32, 4), 0.45), ((16, 8), 0.3)):
        threshold = dedup.lsh_threshold(bands, rows)
        (line,) = ax.plot(
            j,
            dedup.candidate_probability(j, bands, rows),
            lw=2.5,
            label=f"{bands} bands x {rows} rows",
        )
        ax.axvline(threshold, color=line.get_color(), ls=":", lw=1.5)
        ax.annotate(
            f"threshold (1/b)^(1/r) = {threshold:.2f}",
            (threshold, y),
            xytext=(6, 0),
            textcoords="offset points",
            color=line.get_color(),
        )
    for jj in (0.2, 0.5):
        p = dedup.candidate_probability(jj, 32, 4)
        ax.plot([jj], [p], "o", color="C0")
        ax.annotate(
            f"P({jj}) = {p:.2f}", (jj, p), xytext=(-70, 8), textcoords="offset points", color="C0"
        )
    ax.set(
        xlabel="Jaccard similarity J of two documents",
        ylabel="P(the pair becomes an LSH candidate)",
        title="The LSH S-curve: 1 - (1 - J^r)^b",
        xlim=(0, 1),
        ylim=(-0.02, 1.02),
    )
    ax.legend(loc="lower right")
    return _save(fig, "dedup-s-curve.png")


def bpe_merges(plt) -> pathlib.Path:
    import bpe

    train = [str(p) for p in sorted((ROOT / "docs").glob("*.md"))]
    held_out = {
        "English (README.md)": (ROOT / "README.md").read_text(encoding="utf-8"),
        "Python (model.py)": (ROOT / "model.py").read_text(encoding="utf-8"),
    }
    merges = [0, 64, 128, 256, 512, 1024, 2048]
    fig, ax = plt.subplots(figsize=(9, 5))
    for label, text in held_out.items():
        words = len(text.split())
        ratios = [len(bpe.train_bpe(train, 256 + 1 + m).encode(text)) / words for m in merges]
        ax.plot(merges, ratios, "o-", lw=2.5, label=label)
        ax.annotate(
            f"{ratios[-1]:.2f}", (merges[-1], ratios[-1]), xytext=(6, 0), textcoords="offset points"
        )
    ax.set(
        xlabel="merges learned (vocabulary = 256 bytes + 1 special + merges)",
        ylabel="tokens per word",
        title="BPE trained on docs/*.md: tokens per word of held-out text",
        ylim=(0, None),
    )
    ax.set_xscale("symlog", linthresh=64)
    ax.legend()
    return _save(fig, "bpe-merges.png")


def model_cost(plt) -> pathlib.Path:
    from machinery.presets import PRESETS
    from scaling import count_flops_per_token, count_params

    names = list(PRESETS)
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    total = [count_params(PRESETS[n]) for n in names]
    body = [count_params(PRESETS[n], non_embedding=True) for n in names]
    left.barh(names, body, label="blocks (attention, MLP, norms)")
    left.barh(
        names, [t - b for t, b in zip(total, body)], left=body, label="embedding (+ untied head)"
    )
    left.set(
        xscale="log",
        xlabel="parameters (log scale)",
        title="Parameters per preset (count_params)",
        xlim=(min(body) / 2, max(total) * 2),
    )
    left.legend(loc="lower right", fontsize=10)
    for name in names:
        config = PRESETS[name]
        context = [2**k for k in range(6, 18) if 2**k <= max(config.block_size, 1 << 15)]
        share = [
            1 - count_flops_per_token(config, 0) / count_flops_per_token(config, t) for t in context
        ]
        right.plot(context, share, "o-", ms=3, label=name)
    right.set(
        xscale="log",
        xlabel="context length T (tokens)",
        ylabel="attention share of FLOPs per token",
        title="12·L·T·C of count_flops_per_token(T), as T grows",
        ylim=(0, 1),
    )
    right.set_xscale("log", base=2)
    right.legend(fontsize=9)
    return _save(fig, "model-cost.png")


def zero_memory(plt) -> pathlib.Path:
    import parallel

    worlds = [1, 2, 4, 8, 16, 32, 64]
    fig, ax = plt.subplots(figsize=(9, 5))
    for stage, label in enumerate(
        ("DP (ZeRO-0)", "ZeRO-1: optimizer", "ZeRO-2: + gradients", "ZeRO-3: + weights")
    ):
        gb = [parallel.zero_memory_per_rank(7e9, w, stage) / 1e9 for w in worlds]
        ax.plot(worlds, gb, "o-", lw=2.5, label=label)
        ax.annotate(f"{gb[3]:.1f} GB", (8, gb[3]), xytext=(6, 4), textcoords="offset points")
    ax.axhline(80, color="k", ls=":", lw=1.5)
    ax.annotate("one 80 GB GPU", (1, 80), xytext=(4, 4), textcoords="offset points")
    ax.set(
        xlabel="ranks (world size)",
        ylabel="GB per rank (weights + grads + AdamW state)",
        yscale="log",
        title="A 7e9-parameter model's training state per rank (zero_memory_per_rank)",
    )
    ax.set_xscale("log", base=2)
    ax.legend()
    return _save(fig, "parallel-zero-memory.png")


def emergence(plt) -> pathlib.Path:
    import numpy as np
    import evaluate

    p = np.linspace(0, 1, 101)
    fig, ax = plt.subplots(figsize=(9, 5))
    ax.plot(p, p, "k--", lw=1.5, label="per-step accuracy p (k = 1)")
    for k in (2, 5, 10, 20):
        ax.plot(
            p,
            evaluate.exact_match_from_per_step(p, k),
            lw=2.5,
            label=f"exact match of {k} steps, p^{k}",
        )
    lecture = np.array(evaluate.LECTURE_PER_STEP)
    ax.plot(
        lecture,
        evaluate.exact_match_from_per_step(lecture, 5),
        "o",
        color="C1",
        label="the lecture's table (k = 5)",
    )
    ax.set(
        xlabel="per-step accuracy p (improves smoothly with scale)",
        ylabel="score",
        title="Emergence from a metric: exact match p^k jumps where p grows smoothly",
        xlim=(0, 1),
        ylim=(0, 1),
    )
    ax.legend(loc="upper left")
    return _save(fig, "evaluate-emergence.png")


# "The weather is nice today, so we are going for a walk in the park." in twelve languages
LANGUAGE_SAMPLES = {
    "en": "The weather is nice today, so we are going for a walk in the park.",
    "fr": "Il fait beau aujourd'hui, alors nous allons nous promener dans le parc.",
    "de": "Das Wetter ist heute schön, also gehen wir im Park spazieren.",
    "es": "Hoy hace buen tiempo, así que vamos a dar un paseo por el parque.",
    "it": "Oggi il tempo è bello, quindi andiamo a fare una passeggiata nel parco.",
    "pt": "O tempo está bom hoje, então vamos dar um passeio no parque.",
    "nl": "Het weer is vandaag mooi, dus we gaan wandelen in het park.",
    "pl": "Dzisiaj jest ładna pogoda, więc idziemy na spacer do parku.",
    "ru": "Сегодня хорошая погода, поэтому мы идём гулять в парк.",
    "tr": "Bugün hava güzel, bu yüzden parkta yürüyüşe çıkıyoruz.",
    "ja": "今日は天気がいいので、公園へ散歩に行きます。",
    "zh": "今天天气很好，所以我们去公园散步。",
}


def languages(plt) -> pathlib.Path:
    import classify

    names, sentence, word = [], [], []
    for code, text in LANGUAGE_SAMPLES.items():
        label, probability = classify.identify_language(text)
        names.append(f"{code} -> {label}")
        sentence.append(probability if label == code else 0.0)
        # each whitespace word alone (CJK text has none: its characters in twos), right or not
        pieces = text.split() if " " in text else [text[i : i + 2] for i in range(0, len(text), 2)]
        right = [classify.identify_language(piece)[0] == code for piece in pieces]
        word.append(sum(right) / len(right))
    fig, ax = plt.subplots(figsize=(10, 5))
    at = range(len(names))
    ax.bar([x - 0.2 for x in at], sentence, 0.4, label="the sentence: P(its language)")
    ax.bar([x + 0.2 for x in at], word, 0.4, label="its words alone: share identified right")
    ax.axhline(0.65, color="k", ls="--", lw=1, label="data.py's --lang-threshold (0.65)")
    ax.set_xticks(list(at), names, rotation=45, ha="right")
    ax.set(
        ylim=(0, 1.05),
        ylabel="probability / share",
        title="Language identification: a sentence is easy, a lone word is not",
    )
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=2)
    return _save(fig, "classify-languages.png")


FIGURES = {
    "s-curve": s_curve,
    "bpe-merges": bpe_merges,
    "model-cost": model_cost,
    "zero-memory": zero_memory,
    "emergence": emergence,
    "languages": languages,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="+", choices=[*FIGURES, "all"], help="the figures to draw")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    plt = _pyplot()
    for name in FIGURES if "all" in args.names else args.names:
        path = FIGURES[name](plt)
        plt.close("all")
        print(f"{name}: {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
