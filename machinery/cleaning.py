"""Each source's own steps of data.py's funnel, as both engines run them, and `clean`, the in-memory
engine's cleaning: per source, read the documents, extract text (HTML), judge them by the quality
rule (`quality_rule`: data.py's Gopher or code rules, with classify.py's language and quality
classifiers when asked), or cut a source kept whole into pieces; a funnel row for each step with
its reasons (`source_steps`, `filter_rows`); then data.clean_corpus across sources. The streaming
engine (machinery/data_at_scale.py) calls the same per-source pieces on chunks and sums the counts.
"""

from __future__ import annotations

import collections
import re
from typing import Callable, Iterable, Iterator

import classify
import data
from data import CleanSettings, DataError, Funnel, Source


def load_classifiers(settings: CleanSettings) -> None:
    """Read (or train, once) the classifiers the settings ask for, before any work: a bad file fails
    first, and the workers of an engine only read them."""
    try:
        if settings.quality_model:
            classify.model_at(settings.quality_model)
        for task, on in (("language", settings.lang), ("quality", settings.quality_threshold)):
            if on and not (task == "quality" and settings.quality_model):
                classify.default_model(task)
    except ValueError as e:
        raise DataError(f"quality_model {e}" if settings.quality_model else str(e)) from None


def keeps_whole(source: Source, settings: CleanSettings) -> bool:
    """Whether `clean` keeps this source's text whole (see CleanSettings.cleaning)."""
    return settings.cleaning == "keep" or (settings.cleaning == "auto" and source.curated)


def chunk_document(text: str, max_chars: int) -> list[str]:
    """A long document cut into pieces of at most max_chars characters, each at the last blank line
    before the limit (else the last line break, else at the limit), so one novel or one-file corpus
    can still be shuffled and split into train and val. Only the separators at the cuts are lost.

    >>> chunk_document("aa bb\\n\\ncc dd\\nee", 8)
    ['aa bb', 'cc dd', 'ee']
    """
    pieces, start = [], 0
    while len(text) - start > max_chars:
        cut = cut_position(text[start : start + max_chars + 1], max_chars)
        pieces.append(text[start : start + cut])
        start += cut
    pieces.append(text[start:])
    return [p.strip() for p in pieces if p.strip()]


def cut_position(window: str, max_chars: int) -> int:
    """Where a piece ends in the next max_chars + 1 characters: at the last blank line, else the
    last line break (not at the window's first character), else at max_chars.

    >>> cut_position("aa bb\\n\\ncc", 8), cut_position("aaaa\\nbbbb", 8)
    (5, 4)
    >>> cut_position("abcdefghi", 8)
    8
    """
    cut = window.rfind("\n\n")
    if cut <= 0:
        cut = window.rfind("\n")
    return cut if cut > 0 else max_chars


def quality_rule(
    kind: str, settings: CleanSettings
) -> tuple[str, Callable[[str], str | None] | None]:
    """(name, document -> rejection reason or None) for a source kind; "auto" picks Gopher for
    prose."""
    choice = settings.filters
    if choice == "auto":
        choice = {"prose": "gopher", "html": "gopher", "code": "code"}[kind]
    rules = {
        "gopher": lambda d, code="en": data.gopher_rejection(
            d, settings.min_words, settings.max_words, language=code
        ),
        "gopher-handout": lambda d, code="en": data.gopher_rejection(
            d, settings.min_words, settings.max_words, "handout", language=code
        ),
        "code": lambda d, code="en": data.code_rejection(d),
        "none": lambda d, code="en": None,
    }
    judged = classifier_rejection(settings)
    if judged is None:
        return choice, None if choice == "none" else rules[choice]
    rule = rules[choice]
    if not settings.lang:
        return choice, lambda d: rule(d) or judged(d)
    lid = classify.default_model("language")

    # the language is identified first, so that the rules that know only some skip the others
    def judge(doc: str) -> str | None:
        identified = lid.predict(doc)
        return rule(doc, identified[0]) or judged(doc, identified)

    return choice, judge


def filter_rows(
    rule_name: str, label: str, settings: CleanSettings
) -> list[tuple[str, Callable[[str], bool]]]:
    """The funnel rows of a source's filters, in the order they judge a document: (row name, which
    rejection reasons are its). The rules' reasons ("too_few_words"), the language identifier's
    ("language_fr", "language_en_below_0.65") and the quality classifier's ("low_quality") never
    overlap, so one count of reasons per source splits into the three rows.

    >>> settings = CleanSettings(filters="none", lang=("en",), quality_threshold=0.5)
    >>> [name for name, _ in filter_rows("none", "web.jsonl", settings)]
    ['language (en, score >= 0.65, web.jsonl)', 'quality classifier (P(high) >= 0.5, web.jsonl)']
    """
    # (row, its reasons, whether it runs)
    rows = [
        (
            f"quality filters ({rule_name}{language_note(rule_name, settings.lang)}, {label})",
            lambda r: not r.startswith(("language_", "low_quality")),
            rule_name != "none",
        ),
        (
            f"language ({' '.join(settings.lang)}, score >= {settings.lang_threshold}, {label})",
            lambda r: r.startswith("language_"),
            bool(settings.lang),
        ),
        (
            f"quality classifier (P(high) >= {settings.quality_threshold}, {label})",
            lambda r: r == "low_quality",
            bool(settings.quality_threshold),
        ),
    ]
    return [(name, mine) for name, mine, runs in rows if runs]


def language_note(rule_name: str, lang: tuple[str, ...]) -> str:
    """What the funnel row of the rules adds under --lang: which rules ran for which languages.

    >>> language_note("gopher", ("fr", "zh"))
    '; stop_words on en documents only; too_few_words, too_many_words, mean_word_length not on zh'
    >>> language_note("gopher", ()), language_note("code", ("fr",))
    ('', '')
    """
    if not lang or rule_name not in ("gopher", "gopher-handout"):
        return ""
    notes = []
    if rule_name == "gopher":
        notes.append(f"{', '.join(data.ENGLISH_ONLY_RULES)} on en documents only")
    unspaced = sorted(data.UNSPACED_LANGUAGES.intersection(lang))
    if unspaced:
        notes.append(f"{', '.join(data.WORD_COUNT_RULES)} not on {' '.join(unspaced)}")
    return "".join(f"; {note}" for note in notes)


def classifier_rejection(settings: CleanSettings) -> Callable[[str], str | None] | None:
    """classify.py's language and quality classifiers as one rule: why a document goes (its detected
    language, a low score, low quality) or None; None when both are off. The reasons are the
    funnel's per-document record."""
    if not settings.lang and not settings.quality_threshold:
        return None
    lid = classify.default_model("language") if settings.lang else None
    quality = None
    if settings.quality_threshold and settings.quality_model:
        quality = classify.model_at(settings.quality_model)
    elif settings.quality_threshold:
        quality = classify.default_model("quality")

    # identified: (code, score) when the caller already asked the identifier
    def reject(doc: str, identified: tuple[str, float] | None = None) -> str | None:
        if lid is not None:
            code, score = identified or lid.predict(doc)
            if code not in settings.lang:
                return f"language_{code}"
            if score < settings.lang_threshold:
                return f"language_{code}_below_{settings.lang_threshold}"
        if (
            quality is not None
            and quality.probabilities(doc)[quality.labels.index("high")]
            < settings.quality_threshold
        ):
            return "low_quality"
        return None

    return reject


# a small file kept whole is cut finer, so that a 5% validation split still holds one
KEPT_MIN_PIECES = 20
# a source that loses more than this share of its characters gets a one-line notice
HEAVY_CLEANING = 0.25


def kept_piece_size(chars_read: int, chunk_chars: int) -> int:
    """The piece size of a source kept whole: chunk_chars, or less for a small source, so that it
    still makes KEPT_MIN_PIECES pieces. Tiny Shakespeare's 1,115,393 characters: 16,384; a
    6,000-character note: 300.

    >>> kept_piece_size(1_115_393, 16_384), kept_piece_size(6_000, 16_384)
    (16384, 300)
    """
    return min(chunk_chars, -(-chars_read // KEPT_MIN_PIECES))


def heavy_cleaning_note(source: Source, removed: float) -> str:
    """The line printed when a source's own steps (quality filters) removed more than a quarter of
    its text (extracted text for HTML: markup is not text), naming the way out. Both engines count
    the same steps."""
    return (
        f"note: cleaning removed {removed:.0%} of the characters of {source.label} (web-crawl "
        "rules, see the funnel); --cleaning keep keeps its text whole"
    )


# half of a UTF-16 pair: JSON's grammar lets "\ud800" stand alone, and json.loads gives a code point
# that UTF-8 cannot encode (every later step, hashing and encoding, would fail on it)
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def read_documents(
    docs: Iterable[str],
    kind: str,
    rule: Callable[[str], str | None] | None,
    counts: collections.Counter,
    reasons: collections.Counter,
) -> Iterator[str]:
    """A source's own steps, one document at a time, as both engines run them: skip documents of
    whitespace, extract text (HTML), then the quality rule (None: none). Counts into `counts`
    (read_docs, read_chars, read_bytes, no_text, text_chars, kept_chars) and the rule's rejections
    into `reasons`. A lone surrogate (a .jsonl's "\\ud800") becomes U+FFFD, as a UTF-8 decoder
    writes a byte it cannot read, and is counted (lone_surrogates): both engines pass here, so
    both write the same bytes.

    >>> counts, reasons = collections.Counter(), collections.Counter()
    >>> list(read_documents(["a b", " ", "c"], "prose", lambda d: "short" if len(d) < 2 else None,
    ...                     counts, reasons)), counts["read_docs"], dict(reasons)
    (['a b'], 2, {'short': 1})
    """
    for doc in docs:
        if not doc.strip():
            continue
        counts["read_docs"] += 1
        counts["read_chars"] += len(doc)
        try:
            counts["read_bytes"] += len(doc.encode("utf-8"))
        except UnicodeEncodeError:
            doc, replaced = LONE_SURROGATE.subn("\ufffd", doc)
            counts["lone_surrogates"] += replaced
            counts["read_bytes"] += len(doc.encode("utf-8"))
        if kind == "html":
            doc = data.html_to_text(doc)
            if not doc:
                counts["no_text"] += 1
                continue
            counts["text_chars"] += len(doc)
        reason = rule(doc) if rule is not None else None
        if reason:
            reasons[reason] += 1
            # the characters each reason removed: the funnel's rows (`filter_rows`) add them up
            counts[f"removed_chars_{reason}"] += len(doc)
            continue
        counts["kept_chars"] += len(doc)
        yield doc


def source_steps(
    funnel: Funnel,
    source: Source,
    settings: CleanSettings,
    counts: collections.Counter,
    reasons: dict,
    kept: int,
    log: Callable[[str], None],
) -> None:
    """The funnel's rows for one source's own steps from its counts (`read_documents`'s, summed over
    chunks by the streaming engine), with the checks both engines make: a source with no documents,
    or none left, is an error; one whose quality filters removed more than HEAVY_CLEANING of its
    characters gets a notice. kept: its documents (or pieces, when kept whole) after these steps;
    reasons: the rejections (or the piece size)."""
    read, chars = counts["read_docs"], counts["read_chars"]
    if not read:
        raise DataError(
            f"source {source.spec!r} has no documents (empty file or wrong text_field?)"
        )
    funnel.bytes_read += counts["read_bytes"]
    funnel.add_counts(f"read {source.label}", read, read, chars, chars)
    docs = read
    # markup is not text: counted after extraction
    if source.kind == "html":
        docs, chars = read - counts["no_text"], counts["text_chars"]
        funnel.add_counts(
            f"extract text ({source.label})",
            read,
            docs,
            counts["read_chars"],
            chars,
            {"no_text": counts["no_text"]},
        )
    rule_name, rule = quality_rule(source.kind, settings)
    if keeps_whole(source, settings):
        funnel.add_counts(
            f"kept whole ({source.label}; --cleaning web filters it)",
            docs,
            kept,
            chars,
            counts["kept_chars"],
            reasons,
        )
    elif rule is not None:
        # each row starts from what the one before it kept
        left, left_chars = docs, chars
        for name, mine in filter_rows(rule_name, source.label, settings):
            out = {r: n for r, n in reasons.items() if mine(r)}
            out_docs = left - sum(out.values())
            out_chars = left_chars - sum(counts[f"removed_chars_{r}"] for r in out)
            funnel.add_counts(name, left, out_docs, left_chars, out_chars, out)
            if not out_docs:
                raise funnel.empty_error(f"source {source.spec!r}")
            left, left_chars = out_docs, out_chars
        removed = 1 - counts["kept_chars"] / max(1, chars)
        if removed > HEAVY_CLEANING:
            funnel.notices.append(heavy_cleaning_note(source, removed))
    log(f"  {source.label}: {kept:,} documents after the per-source steps")


def clean(
    sources: list[Source],
    settings: CleanSettings | None = None,
    log: Callable[[str], None] = lambda s: None,
) -> tuple[list[str], list[int], Funnel]:
    """Run the funnel over all sources. Returns (documents, source index of each, funnel);
    funnel.notices holds a line for each source whose quality filters removed more than a quarter of
    its characters. Per source: read, extract text (HTML), then quality filters, or, for a source
    kept whole (`keeps_whole`), cutting long documents into pieces; then data.clean_corpus. This is
    the in-memory reference: the streaming engine computes the same result without holding the
    corpus.
    """
    settings = settings or CleanSettings()
    funnel = Funnel()
    docs, origin = [], []
    whole = [keeps_whole(source, settings) for source in sources]
    for s_index, source in enumerate(sources):
        counts, reasons = collections.Counter(), collections.Counter()
        rule = None if whole[s_index] else quality_rule(source.kind, settings)[1]
        raw = list(read_documents(source.documents(), source.kind, rule, counts, reasons))
        if whole[s_index]:
            size = kept_piece_size(sum(map(len, raw)), settings.chunk_chars)
            raw = [piece for d in raw for piece in chunk_document(d, size)]
            counts["kept_chars"] = sum(map(len, raw))
            reasons = {f"pieces_of_at_most_{size}_chars": len(raw)}
        source_steps(funnel, source, settings, counts, reasons, len(raw), log)
        docs += raw
        origin += [s_index] * len(raw)
    docs, origin = data.clean_corpus(docs, origin, sources, whole, settings, funnel, log)
    return docs, origin, funnel
