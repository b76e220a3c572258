"""Tests for the book (book/build.py, book/check.py): built from the real chapter files, every definition on its
page, every internal link and anchor resolving, nothing loaded from the network, and every page opened in headless
Chromium at desktop and phone widths with no console error and the layout checked (skipped without chromium)."""

import ast
import html.parser
import math
import pathlib
import re
import struct
import subprocess
import sys

import pytest

pytest.importorskip(
    "markdown_it", reason="the book needs markdown-it-py: pip install -r requirements-test.txt"
)
pytest.importorskip(
    "mdit_py_plugins", reason="the book needs mdit-py-plugins: pip install -r requirements-test.txt"
)
pytest.importorskip(
    "pygments", reason="the book needs Pygments: pip install -r requirements-test.txt"
)

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "book"))

import build as book  # noqa: E402  (book/build.py)
import check as book_check  # noqa: E402  (book/check.py)


class PageParser(html.parser.HTMLParser):
    """ids, links (href/src) and visible text of one page."""

    def __init__(self):
        super().__init__()
        self.ids: list[str] = []
        self.links: list[tuple[str, str]] = []  # (tag, url)
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.append(attrs["id"])
        for key in ("href", "src"):
            if attrs.get(key) is not None:
                self.links.append((tag, attrs[key]))

    def handle_data(self, data):
        self.text.append(data)


def parse(path: pathlib.Path) -> PageParser:
    parser = PageParser()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser


def whole(site: pathlib.Path, stem: str) -> str:
    """All the pages of one file, its parts in order (a file longer than one sitting has data.html,
    data-2.html)."""
    return "".join((site / name).read_text(encoding="utf-8") for name in part_names(site, stem))


def part_names(site: pathlib.Path, stem: str) -> list[str]:
    more = sorted(
        (p.name for p in site.glob(f"{stem}-*.html")), key=lambda n: int(n[len(stem) + 1 : -5])
    )
    return [f"{stem}.html", *more]


def parse_whole(site: pathlib.Path, stem: str) -> PageParser:
    parser = PageParser()
    parser.feed(whole(site, stem))
    return parser


def book_files() -> list[tuple[pathlib.Path, str]]:
    """Every file the book shows, with its module name (the page's name): the chapters at the root, then
    machinery/'s files."""
    paths = sorted(ROOT.glob("*.py"))
    paths += sorted(p for p in (ROOT / "machinery").rglob("*.py") if p.name != "__init__.py")
    return [(path, book.module_name(path, ROOT)) for path in paths]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("book") / "site"
    assert book.main(["--out", str(out)]) == 0
    return out


# ---------------------------------------------------------------- the build on the real files


def test_one_page_per_top_level_file_and_an_index_in_reading_order(site):
    pages = {book_check.stem_of(p.name) for p in site.glob("*.html")}
    assert pages == {stem for _, stem in book_files()} | {"index"}
    index = (site / "index.html").read_text(encoding="utf-8")
    chapter_links = re.findall(r'<tr><td>\d+</td><td><a href="(\w+)\.html">', index)
    assert chapter_links == [stem for stem, _ in book.CHAPTERS if (ROOT / f"{stem}.py").exists()]
    index_words = " ".join(re.findall(r"\w+", "".join(parse(site / "index.html").text)))
    for stem in chapter_links:  # what each teaches: its docstring opens with the first line
        first = ast.get_docstring(
            ast.parse((ROOT / f"{stem}.py").read_text(encoding="utf-8"))
        ).split("\n")[0]
        assert " ".join(re.findall(r"\w+", re.sub(rf"^{stem}\.py:", "", first))) in index_words, (
            stem
        )
    machinery = [(path, stem) for path, stem in book_files() if stem not in dict(book.CHAPTERS)]
    assert machinery and all(stem.startswith("machinery.") for _, stem in machinery)
    for path, stem in machinery:  # after the chapters, in the appendix, marked as machinery
        name = path.relative_to(ROOT).as_posix()
        assert (
            f'<a href="{stem}.html"><code>{name}</code></a></td><td>'
            in index.split('id="companions"')[1]
        )
        assert "Machinery:" in whole(site, stem)


def test_every_top_level_function_and_class_is_on_its_page_with_its_code_and_docstring(site):
    for path, stem in book_files():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        page = whole(site, stem)
        parsed = parse_whole(site, stem)
        words = " ".join(re.findall(r"\w+", "".join(parsed.text)))
        shown = {int(n) for n in re.findall(r'<span class="line" data-n="(\d+)"', page)}
        definitions = [
            node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))
        ]
        # a chapter teaches in functions and classes; a machinery file may be values alone (presets.py)
        assert definitions or path.parent.name == "machinery", path.name
        for node in definitions:
            assert node.name in parsed.ids, f"{path.name}: {node.name} has no anchor"
            row = page.split(f'id="{node.name}"', 1)[1].split("</section>", 1)[0]
            assert f'data-n="{node.lineno}"' in row, (
                f"{path.name}: the def line of {node.name} is not in its row"
            )
            doc = ast.get_docstring(node)
            if doc:  # its first words, as words (Markdown changes the punctuation, not the words)
                assert " ".join(re.findall(r"\w+", doc)[:8]) in words, (
                    f"{path.name}: {node.name}'s docstring"
                )
        # Nothing is lost: every line that is code (not blank, not a comment, not in a docstring) is shown.
        docstring_lines = set()
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if (
                isinstance(body, list)
                and body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                docstring_lines.update(range(body[0].lineno, body[0].end_lineno + 1))
        lines = path.read_text(encoding="utf-8").splitlines()
        code_lines = {
            n
            for n, line in enumerate(lines, 1)
            if line.strip() and not line.lstrip().startswith("#") and n not in docstring_lines
        }
        assert code_lines - shown == set(), f"{path.name}: code lines missing from the page"


def test_section_banners_are_headings_with_anchors_in_the_table_of_contents(site):
    banners = 0
    for path, stem in book_files():
        lines = path.read_text(encoding="utf-8").splitlines()
        titles, k = [], 0
        while k < len(lines) - 1:  # dashes, "# title", any comment lines, dashes
            if re.match(r"^# -{20,}$", lines[k]) and re.match(r"^# \S", lines[k + 1]):
                end = k + 1
                while (
                    end < len(lines)
                    and lines[end].startswith("#")
                    and not re.match(r"^# -{20,}$", lines[end])
                ):
                    end += 1
                if end < len(lines) and re.match(r"^# -{20,}$", lines[end]):
                    titles.append(lines[k + 1][2:].strip())
                    k = end
            k += 1
        banners += len(titles)
        page = whole(site, stem)
        headings = [
            (anchor, re.sub(r"<[^>]+>", "", title))
            for anchor, title in re.findall(
                r'<h2 class="banner" id="([^"]+)"><a href="#\1">(.+?)</a></h2>', page
            )
        ]
        assert [h[1].split(" ")[0] for h in headings] == [t.split(" ")[0] for t in titles], (
            path.name
        )
        for anchor, _ in headings:
            assert re.search(rf'<li><a href="{stem}(-\d+)?\.html#{re.escape(anchor)}">', page), (
                anchor
            )
    assert banners >= 40  # the chapters have dozens; none found would mean the parser broke


def test_every_internal_link_and_anchor_resolves_and_nothing_loads_from_the_network(site):
    ids = {page.name: parse(page).ids for page in site.glob("*.html")}
    for page, page_ids in ids.items():
        assert len(page_ids) == len(set(page_ids)), f"{page}: duplicate ids"
    checked = 0
    for page in site.glob("*.html"):
        for tag, url in parse(page).links:
            if re.match(r"^[a-z]+:", url) or url.startswith("//"):
                assert tag == "a" and not url.startswith("data:") or url == "data:,", (
                    f"{page.name} loads {url}"
                )
                continue  # a link out in prose, never a load
            target, _, anchor = url.partition("#")
            target_page = target or page.name
            assert (site / target_page).is_file(), f"{page.name}: {url} points at a missing file"
            if anchor:
                assert anchor in ids[target_page], f"{page.name}: {url} points at a missing anchor"
            checked += 1
    assert checked > 1000


def test_names_from_another_chapter_link_to_their_definition(site):
    """Every `alias.name` (import data as data_lib; data_lib.prepare) and every `from model import GPT` whose
    name the other file defines at top level is a link to that definition."""
    modules = {stem for _, stem in book_files()}
    expected = 0
    for path, stem in book_files():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        aliases = {
            a.asname or a.name: a.name
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for a in node.names
            if a.name in modules
        }
        aliases |= {  # from machinery import fileio: fileio is the module machinery.fileio
            a.asname or a.name: f"{node.module}.{a.name}"
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
            for a in node.names
            if f"{node.module}.{a.name}" in modules
        }
        imported = {
            (node.module, a.name)
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module in modules
            for a in node.names
        }
        used = {
            (aliases[node.value.id], node.attr)
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
        }
        page = whole(site, stem)
        for module, name in used | imported:
            target_path = ROOT / (module.replace(".", "/") + ".py")
            target = ast.parse(target_path.read_text(encoding="utf-8"))
            if name in {
                n.name for n in target.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))
            }:
                assert re.search(rf'href="({module}(-\d+)?\.html)?#{name}"', page), (
                    f"{path.name}: {module}.{name}"
                )
                expected += 1
    assert expected >= 20
    # In prose too: a module docstring that names another file (`train.py`, or plain train.py) links to its page,
    # and a `module.name` it mentions to that definition.
    mentions = 0
    for path, stem in book_files():
        intro = (site / f"{stem}.html").read_text(encoding="utf-8").split('<nav class="toc">')[0]
        docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        for stem in set(re.findall(r"(?<![\w./-])(\w+)\.py\b", docstring)) & modules - {stem}:
            assert f'href="{stem}.html"' in intro, (
                f"{path.name}'s introduction names {stem}.py without a link"
            )
            mentions += 1
    assert mentions >= 10
    if "bpe.Tokenizer" in (ROOT / "model.py").read_text(encoding="utf-8"):
        assert re.search(
            r'<a class="xref" href="bpe(-\d+)?\.html#Tokenizer">bpe.Tokenizer</a>',
            whole(site, "model"),
        )


def test_prose_keeps_the_docstrings_blocks_doctests_and_aligned_comments(site):
    chapters = "".join(whole(site, stem) for stem, _ in book.CHAPTERS)
    # Indented commands under a line of prose (no blank line between): a block of commands, not one
    # run-on sentence (parallel.py's "Demos:").
    assert re.search(r'<pre class="block">python parallel.py demo +# each layout', chapters)
    # A doctest becomes a highlighted pycon block (the prompt is a Generic.Prompt token: class "gp").
    assert re.search(
        r'<pre class="block code-pycon"><span class="gp">&gt;&gt;&gt; </span>', chapters
    )
    # Aligned comment columns survive as a monospace block (dedup.py's hashes).
    assert re.search(r'<pre class="block code-text">  word: +a polynomial hash', chapters)


def test_figures_are_on_the_page_of_the_chapter_that_makes_them(site):
    for figure in book.FIGURES:
        page = whole(site, figure.chapter)
        assert f'id="figure-{figure.name}"' in page
        assert (ROOT / figure.output).is_file(), (
            f"{figure.output} is not committed: run {figure.command}"
        )
        assert figure.command in page
        if figure.output.endswith(".png"):
            name = pathlib.Path(figure.output).name
            assert f'<img src="figures/{name}"' in page
            assert (site / "figures" / name).read_bytes() == (ROOT / figure.output).read_bytes()
    assert "<table>" in whole(site, "dedup").split('id="figure-lsh-demo"')[1]
    # Every chapter shows a figure, in the section that discusses it (right after the row of its
    # first anchor there), and a PNG opens full size.
    for stem, _ in book.CHAPTERS:
        assert 'id="figure-' in whole(site, stem), stem
    dedup = whole(site, "dedup")
    after = dedup.split('id="candidate_probability"', 1)[1].split('<section class="row', 1)[0]
    assert 'id="figure-s-curve"' in after and '<a href="figures/dedup-s-curve.png"' in after
    assert "python book/figures.py s-curve" in after


def test_formulas_dividers_serves_lines_and_reading_order_read_as_written(site):
    for path, stem in book_files():
        text = "".join(parse_whole(site, stem).text)
        assert [f for f in book_check.formulas(path) if f not in text] == [], path.name
        assert not re.search(r"<p>[^<]*-{8,}", whole(site, stem)), path.name
    bpe_page = whole(site, "bpe")
    if "# -- encoding --" in (ROOT / "bpe.py").read_text(encoding="utf-8"):
        assert re.search(r"<h4[^>]*>encoding</h4>", bpe_page)
    index = re.sub(r"<[^>]+>", "", (site / "index.html").read_text(encoding="utf-8"))
    assert "Serves: Serves" not in index and not re.search(
        r"Serves: the chapter data\.(?!py)", index
    )
    model_parallel = (site / "model_parallel.html").read_text(encoding="utf-8")
    assert 'rel="prev">← parallel.py</a>' in model_parallel
    for stem in ("data", "dedup", "train"):  # a sections menu on every chapter
        page = whole(site, stem)
        assert (
            '<nav class="top">' in page
            and '<details class="sections"><summary>Sections</summary>' in page
        )
    folded = 0
    for path, stem in book_files():  # a file's command line (its main) folded
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if "main" in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}:
            page = whole(site, stem)
            assert page.count('<details class="cli">') == 1, stem
            assert 'id="main"' in page.split('<details class="cli">')[1], stem
            folded += 1
    assert folded >= 3


def test_a_file_longer_than_one_sitting_is_cut_into_parts_of_at_most_45_minutes(site):
    """At 200 words of prose and 10 lines of code a minute, each part reads in one sitting (45
    minutes)."""
    sources, chapters, companions = book.discover()
    linker = book.Linker(sources)
    split = 0
    for stem, src in sources.items():
        cuts = linker.cuts[stem]
        minutes = book.part_minutes(src, linker.items[stem], cuts)
        assert max(minutes) <= book.SITTING_MINUTES + 5, (stem, minutes)
        assert part_names(site, stem) == linker.parts(stem), stem
        if sum(minutes) > book.SITTING_MINUTES:
            assert len(cuts) == math.ceil(sum(minutes) / book.SITTING_MINUTES) - 1, (stem, minutes)
        split += len(cuts) > 0
        for number, name in enumerate(linker.parts(stem), 1):
            page = (site / name).read_text(encoding="utf-8")
            assert f"about {minutes[number - 1]:.0f} minutes" in page, name
    assert split >= 5
    if (
        len(linker.parts("data")) > 1
    ):  # the second part opens with its heading, and the first links to it
        assert 'rel="next">data.py (2) →</a>' in (site / "data.html").read_text(encoding="utf-8")


def test_a_cut_falls_at_the_section_start_nearest_its_share(tmp_path):
    """Sections of 38, 20 and 22 minutes: the halves' share is 40 minutes, and the start of the
    20-minute section (38 minutes in) is nearer it than the next start (58): parts 38 and 42, not
    58 and 22."""
    src = book.Source("x", tmp_path, [], "", range(0), {}, {}, {}, {}, set(), {}, {})
    items, line = [], 1
    for name, minutes in (("a", 38), ("b", 20), ("c", 22)):
        items.append(book.Heading(name, name, line))
        code_lines = minutes * 60 // book.SECONDS_PER_CODE_LINE
        items.append(book.Row(f"f_{name}", [], list(range(line + 2, line + 2 + code_lines))))
        line += code_lines + 4
    cuts = book.part_cuts(src, items)
    assert cuts == [items[2].line]
    assert book.part_minutes(src, items, cuts) == pytest.approx([38, 42])


def test_a_formula_keeps_its_stars_and_a_divider_is_a_heading(tmp_path):
    md = book.make_markdown(book.Linker({}), set())
    src = book.Source("x", tmp_path, [], "", range(0), {}, {}, {}, {}, set(), {}, {})
    out = md.render(
        "cost 3*C*H per B*T tokens in train_*.bin, 2**32; *stress* and **bold.**", {"source": src}
    )
    assert "3*C*H" in out and "B*T" in out and "train_*.bin" in out and "2**32" in out
    assert "<em>stress</em>" in out and "<strong>bold.</strong>" in out
    assert book.divider_headings("-- encoding -------\nx\n---------") == "\n#### encoding\n\nx"


# ---------------------------------------------------------------- a made-up repository: classification, errors


def _fake_repository(root: pathlib.Path) -> None:
    (root / "data.py").write_text(
        '"""data.py: clean text.\n\nMore."""\n\n\ndef prepare(x):\n    """Clean x."""\n'
        "    return x\n"
    )
    (root / "model.py").write_text(
        '"""The model."""\nfrom data import prepare\nimport data as data_lib\n\n\n'
        "class GPT:\n    def forward(self):\n        return data_lib.prepare(1)\n"
    )
    (root / "machinery").mkdir()
    (root / "machinery" / "__init__.py").write_text('"""Not a page."""\n')
    (root / "machinery" / "store.py").write_text(
        '"""Object-store I/O.\n\nServes: data.py (its s3:// inputs). Owns: the bytes.\n"""\nX = 1\n'
    )
    (root / "machinery" / "alpha.py").write_text(
        '"""Alpha helper; it serves model.py only."""\nfrom machinery import store\n\n\n'
        "def z():\n    return store.X\n"
    )


def test_companions_are_classified_by_table_and_docstring_and_missing_figures_name_their_command(
    tmp_path,
):
    _fake_repository(tmp_path)
    out = tmp_path / "site"
    book.build(out, root=tmp_path)
    index = (out / "index.html").read_text(encoding="utf-8")
    assert re.findall(r'<tr><td>\d+</td><td><a href="(\w+)\.html">', index) == ["data", "model"]
    appendix = index.split('id="companions"')[1]
    assert appendix.index("machinery/alpha.py") < appendix.index("machinery/store.py")
    assert "engine (object-store I/O)" in appendix and "<td>machinery</td>" in appendix
    assert not (out / "machinery.__init__.html").exists()
    assert (
        "Machinery: engine (object-store I/O). Serves: data.py (its s3:// inputs).</p>"
        in re.sub(r"<(?!/p)[^>]+>", "", (out / "machinery.store.html").read_text())
    )
    alpha = (out / "machinery.alpha.html").read_text(encoding="utf-8")
    assert 'href="machinery.store.html#X"' in alpha
    assert "Serves: model.py only." in re.sub(r"<[^>]+>", "", alpha)
    model = (out / "model.html").read_text(encoding="utf-8")
    assert 'href="data.html#prepare"' in model and 'href="data.html"' in model
    assert 'id="GPT.forward"' in model
    data = (out / "data.html").read_text(encoding="utf-8")
    assert (
        "Not built yet: run <code>python data.py prepare --data pydocs" in data
    )  # no docs/figures here


def test_bad_input_is_one_line_exit_2_and_touches_nothing(tmp_path):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    a_file = tmp_path / "file.html"
    a_file.write_text("x")
    cases = [
        (["--out", str(foreign)], "--out"),
        (["--out", str(a_file)], "--out"),
        (["--refresh-figures", "nope", "--out", str(tmp_path / "new")], "--refresh-figures nope"),
    ]
    for args, flag in cases:
        result = subprocess.run(
            [sys.executable, str(ROOT / "book" / "build.py"), *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 2, result.stderr
        assert (
            result.stderr.count("\n") == 1
            and flag in result.stderr
            and "Traceback" not in result.stderr
        )
    assert (foreign / "notes.txt").read_text() == "keep me" and a_file.read_text() == "x"
    assert not (tmp_path / "new").exists()
    broken = tmp_path / "repo"
    broken.mkdir()
    (broken / "data.py").write_text("def f(:\n")
    with pytest.raises(book.BookError, match=r"data\.py: cannot parse line 1"):
        book.build(tmp_path / "site2", root=broken)
    assert not (tmp_path / "site2").exists()


def test_an_unwritable_or_full_output_is_one_line_and_keeps_the_old_site(tmp_path, monkeypatch):
    result = subprocess.run(
        [sys.executable, str(ROOT / "book" / "build.py"), "--out", "/proc/x/site"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        result.returncode == 2
        and result.stderr.count("\n") == 1
        and "--out /proc/x/site" in result.stderr
    )
    assert "Traceback" not in result.stderr
    _fake_repository(tmp_path)
    out = tmp_path / "site"
    book.build(out, root=tmp_path)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    real_write, calls = pathlib.Path.write_text, []

    def full_disk(self, *args, **kwargs):  # the third file of the new site hits a full disk
        calls.append(self)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real_write(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "write_text", full_disk)
    with pytest.raises(
        book.BookError, match=r"--out .*site: cannot write the site \(No space left on device\)"
    ):
        book.build(out, root=tmp_path)
    monkeypatch.undo()
    assert {
        p.name: p.read_bytes() for p in out.iterdir() if p.is_file()
    } == before  # the old site, whole
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".site")] == []


def test_a_rebuild_replaces_the_site_whole(tmp_path):
    _fake_repository(tmp_path)
    out = tmp_path / "site"
    book.build(out, root=tmp_path)
    (tmp_path / "machinery" / "alpha.py").unlink()
    book.build(out, root=tmp_path)
    assert not (out / "machinery.alpha.html").exists() and (out / "machinery.store.html").exists()
    assert [
        p.name for p in tmp_path.iterdir() if p.name.startswith(".site")
    ] == []  # no staging left behind


# ---------------------------------------------------------------- in a real browser


def test_the_browser_check_says_how_far_it_is_on_stderr(tmp_path, monkeypatch, capsys):
    """A whole book is 133 checks and minutes: main() prints count, rate and ETA every
    PROGRESS_EVERY_S seconds and at the end (a fake clock and a fake check_site: no browser)."""
    clock = iter([0.0, 4.0, 10.0, 12.0, 15.0])  # start, then one reading per page and width
    monkeypatch.setattr(book_check.time, "monotonic", lambda: next(clock))
    progress = book_check.ProgressLines()
    for done in (1, 4, 5, 6):
        progress(done, 6)
    assert capsys.readouterr().err.splitlines() == [
        "checked 4 of 6 pages and widths, 0.4/s, ETA 0m05s",  # 10 s in
        "checked 6 of 6 pages and widths, 0.4/s, ETA 0m00s",  # the end, 5 s after the last
    ]

    def fake_check_site(site, shots, executable, only, root, progress):
        for done in (1, 2, 3):
            progress(done, 3)
        return []

    (tmp_path / "index.html").write_text("<html></html>")
    monkeypatch.setattr(book_check, "find_chromium", lambda: "chromium")
    monkeypatch.setattr(book_check, "check_site", fake_check_site)
    monkeypatch.setattr(book_check.time, "monotonic", lambda: 0.0)
    assert book_check.main([str(tmp_path)]) == 0
    assert capsys.readouterr().err.startswith("checked 3 of 3 pages and widths")


def _png_size(path: pathlib.Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def _chromium() -> str:
    executable = book_check.find_chromium()
    if executable is None:
        pytest.skip(
            "no chromium on PATH (Debian: apt-get install -y chromium; .ci/run installs it)"
        )
    return executable


def _assert_reads_well(results, pages):
    assert {(r["page"], r["width"]) for r in results} == {
        (p, w) for p in pages for w in book_check.WIDTHS
    }
    for r in results:
        where = f"{r['page']} at {r['width']}"
        assert r["console"] == [], where
        assert r["layout"]["problems"] == [], where
        assert r["layout"]["scrollWidth"] <= r["layout"]["width"], where
        assert r["layout"]["twoColumns"] == (r["width"] != "phone"), where
        if r["page"] != "index.html":
            assert r["layout"]["rows"] > 0 and r["layout"]["aligned"] == r["layout"]["rows"], where
        if r["screenshot"] is not None:
            assert _png_size(r["screenshot"]) == book_check.WIDTHS[r["width"]], where


_BAD_PAGE = """<!DOCTYPE html><html><head><meta charset="utf-8"><link rel="stylesheet" href="book.css">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="pygments.css"></head><body><main>
<header class="intro"><p>Cost 3CH per token.</p></header>
<section class="row"><div class="prose"><div class="table"><table><tr><td><code>%s</code></td></tr></table></div>
<p>-- encoding -----------------------------</p></div>
<div class="code"><pre style="white-space: pre"><span class="line" data-n="1">%s</span></pre></div></section>
<div class="figures"><figure><img src="figures/tiny.png" style="width: 40px"></figure></div>
<p><a href="missing.html">gone</a> <a href="#nowhere">here</a></p>
<script>console.error("boom")</script></main></body></html>"""


@pytest.mark.slow
def test_the_browser_check_finds_each_fault_a_reader_sees_and_passes_a_real_chapter(site, tmp_path):
    """One browser: a made-up chapter page with one of each fault (the faults of the book before
    issue 34: a clipped table, a cut code line, a paragraph of dashes, `3*C*H` shown as "3CH", a
    figure too small and not linked, no chapter figure for the unlinked one, broken links, a console
    error); then dedup.html, built, clean."""
    bad_site, bad_root = tmp_path / "site", tmp_path / "repo"
    bad_site.mkdir()
    bad_root.mkdir()
    (bad_root / "dedup.py").write_text('"""Cost 3*C*H per token."""\n')
    for name in ("book.css", "pygments.css"):
        (bad_site / name).write_bytes((site / name).read_bytes())
    (bad_site / "figures").mkdir()
    (bad_site / "figures" / "tiny.png").write_bytes(
        (site / "figures" / "dedup-s-curve.png").read_bytes()
    )
    (bad_site / "dedup.html").write_text(_BAD_PAGE % ("wide_" * 400, "x = 1  # " + "why " * 400))
    reported = []
    results = book_check.check_site(
        bad_site, None, _chromium(), root=bad_root, progress=lambda *n: reported.append(n)
    )
    assert reported == [(done, 3) for done in (1, 2, 3)]  # one page, three widths
    kinds = {r["width"]: " | ".join(r["layout"]["problems"] + r["console"]) for r in results}
    for width in ("desktop", "wide"):
        for kind in (
            "clipped prose",
            "dash paragraph",
            "damaged formula: '3*C*H'",
            "figure too small",
            "figure not openable full size",
            "broken link: file:",
            "missing.html (no such file)",
            "#nowhere (no such anchor)",
            "console.error: boom",
        ):
            assert kind in kinds[width], (width, kind)
    assert "cut code line" in kinds["desktop"] and "cut code line" not in kinds["phone"]
    assert "clipped prose: div" not in kinds["phone"]  # a phone may scroll a table sideways
    good = book_check.check_site(site, tmp_path / "shots", _chromium(), only=["dedup"], root=ROOT)
    _assert_reads_well(good, part_names(site, "dedup"))


@pytest.mark.long
def test_every_page_reads_well_in_headless_chromium_at_1280_1920_and_390_px(site, tmp_path):
    results = book_check.check_site(site, tmp_path / "shots", _chromium(), root=ROOT)
    _assert_reads_well(results, [p.name for p in site.glob("*.html")])
