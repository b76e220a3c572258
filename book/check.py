"""book/check.py: open every page of a built book in headless Chromium, at a desktop and a phone width, and check it.

    python book/check.py book/site --shots /tmp/book-shots     # prints one line per page and width

One browser is started for all pages and driven over its DevTools protocol on a pipe (`--remote-debugging-pipe`:
JSON messages separated by NUL bytes on file descriptors 3 and 4), so nothing listens on a port and the standard
library is enough. For each page and width it records:

* console errors, uncaught exceptions and failed loads (a missing stylesheet or image is a logged error);
* layout facts measured by LAYOUT_JS in the page: whether the document scrolls sideways, whether any prose block is
  wider than its column, whether each row's prose and code start at the same height (desktop) or the code follows
  the prose at the same left edge (phone), whether the stylesheets applied and every image decoded;
* a screenshot of the first screen, to look at.

The check fails nothing itself; it returns the facts (tests/test_book.py asserts on them) and prints them.
"""

from __future__ import annotations

import argparse
import base64
import collections
import fcntl
import html
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse

WIDTHS = {"desktop": (1280, 900), "wide": (1920, 1080), "phone": (390, 844)}
TWO_COLUMNS_FROM = 861  # book.css: one column at max-width 860px, two above
CODE_UNCUT_AT = (
    "desktop",
    "wide",
)  # where a code line must wrap, never be cut (a phone scrolls sideways)
MIN_FIGURE_PX = 600  # a drawn figure at least this wide on a desktop (its labels stay legible)
PROGRESS_EVERY_S = 10.0  # main() says how far the check is this often (a whole book takes minutes)

# Runs inside the page; returns a JSON-able summary. Tolerances: 2 px (sub-pixel rounding of grid tracks).
# Each problem starts with its kind ("clipped prose", "cut code line", ...), which the tests count
# by.
LAYOUT_JS = r"""
(() => {
  const W = document.documentElement.clientWidth;
  const desktop = W >= %(two)d, codeUncut = %(uncut)s;
  const problems = [];
  const describe = el => (el.closest('[id]') ? '#' + el.closest('[id]').id : el.tagName.toLowerCase());
  const add = text => { if (problems.length < 60) problems.push(text); };
  if (document.documentElement.scrollWidth > W + 1)
    add(`page scrolls sideways: ${document.documentElement.scrollWidth} > ${W}`);
  for (const p of document.querySelectorAll('.prose, .intro, .figures')) {
    if (p.scrollWidth > p.clientWidth + 2)
      add(`clipped prose: wider than its column at ${describe(p)}: ${p.scrollWidth} > ${p.clientWidth}`);
    const box = p.getBoundingClientRect();
    if (box.right > W + 2) add(`clipped prose: past the window at ${describe(p)}: right ${box.right} > ${W}`);
  }
  // A table or block of the prose that scrolls inside its box is clipped on a desktop: the reader sees a part.
  if (desktop)
    for (const b of document.querySelectorAll(
        '.prose pre, .prose .table, .intro pre, .intro .table, .figures pre, .figures .table'))
      if (b.scrollWidth > b.clientWidth + 2 && b.getClientRects().length)
        add(`clipped prose: ${b.tagName.toLowerCase()} at ${describe(b)}: ${b.scrollWidth} > ${b.clientWidth}`);
  if (codeUncut)
    for (const pre of document.querySelectorAll('.code pre'))
      if (pre.scrollWidth > pre.clientWidth + 2 && pre.getClientRects().length)
        add(`cut code line at ${describe(pre)}: ${pre.scrollWidth} > ${pre.clientWidth}`);
  for (const p of document.querySelectorAll('main p, main hr'))
    if (p.tagName === 'HR' || /-{8,}/.test(p.textContent))
      add(`dash paragraph at ${describe(p)}: ${p.textContent.trim().slice(0, 40)}`);
  let rows = 0, aligned = 0;
  for (const row of document.querySelectorAll('section.row')) {
    const prose = row.querySelector(':scope > .prose'), code = row.querySelector(':scope > .code');
    if (!prose || !code || !prose.textContent.trim() || !code.textContent.trim() || !row.getClientRects().length)
      continue;
    rows++;
    const p = prose.getBoundingClientRect(), c = code.getBoundingClientRect();
    const stacked = !desktop || row.classList.contains('wide');
    const ok = stacked ? c.top >= p.bottom - 2 && Math.abs(p.left - c.left) <= 2
                       : Math.abs(p.top - c.top) <= 2 && p.right <= c.left + 2;
    if (ok) aligned++; else
      add(`row ${describe(row)} not aligned: prose ${Math.round(p.left)},${Math.round(p.top)} ` +
          `code ${Math.round(c.left)},${Math.round(c.top)}`);
  }
  // Both stylesheets applied: book.css sets the body's margin to 0, pygments.css colours keywords (.k).
  if (getComputedStyle(document.body).marginTop !== '0px') add('book.css not applied');
  const probe = document.createElement('div');
  probe.className = 'code';
  probe.innerHTML = '<span class="k">def</span>';
  document.body.appendChild(probe);
  const keyword = getComputedStyle(probe.firstChild).color, plain = getComputedStyle(probe).color;
  probe.remove();
  if (keyword === plain) add('pygments.css not applied');
  for (const img of document.images) {
    const src = img.getAttribute('src'), shown = img.getBoundingClientRect().width;
    if (!img.complete || img.naturalWidth === 0) { add(`figure not loaded: ${src}`); continue; }
    const least = Math.min(img.naturalWidth, desktop ? %(minpx)d : W - 40);
    if (shown + 1 < least) add(`figure too small: ${src} shown ${Math.round(shown)} px < ${least}`);
    const link = img.closest('a[href]');
    if (!link || link.href !== img.src) add(`figure not openable full size: ${src}`);
  }
  const figures = document.querySelectorAll('main figure').length;
  const links = [...document.querySelectorAll('[href], [src]')].map(
    el => [el.tagName.toLowerCase(), el.href || el.src]);
  const ids = [...document.querySelectorAll('[id]')].map(el => el.id);
  const prose = [...document.querySelectorAll('.prose, .intro, figcaption')].map(el => el.textContent).join('\n');
  return {width: W, scrollWidth: document.documentElement.scrollWidth, rows, aligned, twoColumns: desktop,
          problems, figures, links, ids, prose};
})()
""".replace("%(two)d", str(TWO_COLUMNS_FROM)).replace("%(minpx)d", str(MIN_FIGURE_PX))


SCROLL_TO_CODE_JS = """
(() => {
  const banner = document.querySelectorAll('h2.banner')[1] || document.querySelector('h2.banner');
  if (!banner) return false;
  window.scrollTo(0, banner.getBoundingClientRect().top + window.scrollY - 40);
  return true;
})()
"""


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    """A headless Chromium driven over --remote-debugging-pipe (fd 3: our commands in, fd 4: its answers out)."""

    def __init__(self, executable: str, timeout: float = 30.0):
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="book-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        # Chromium reads commands from fd 3 and writes answers to fd 4. In the child, before exec, move our pipe
        # ends out of the way (to fds >= 10, so neither can be one of 3 and 4) and then onto 3 and 4; dup2 makes
        # them inheritable, and close_fds=False leaves them open (every other fd of ours is close-on-exec).
        def onto_fds_3_and_4() -> None:
            read_end = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 10)
            write_end = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 10)
            os.dup2(read_end, 3)
            os.dup2(write_end, 4)
            os.close(read_end)
            os.close(write_end)

        self.process = subprocess.Popen(
            [
                executable,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-extensions",
                "--disable-default-apps",
                "--mute-audio",
                "--hide-scrollbars",
                f"--user-data-dir={self.profile}",
                "--remote-debugging-pipe",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            close_fds=False,
            preexec_fn=onto_fds_3_and_4,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []

    def _read_message(self, deadline: float) -> dict:
        import select

        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise ConnectionError("Chromium closed its DevTools pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error'].get('message')}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, session: str) -> dict:
        deadline = time.monotonic() + self.timeout
        for k, event in enumerate(self.events):
            if event.get("method") == method and event.get("sessionId") == session:
                return self.events.pop(k)
        while True:
            event = self._read_message(deadline)
            if event.get("method") == method and event.get("sessionId") == session:
                return event
            self.events.append(event)

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except (TimeoutError, ConnectionError, RuntimeError, OSError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)
        shutil.rmtree(self.profile, ignore_errors=True)


def _problems_from_events(events: list[dict], session: str) -> list[str]:
    found = []
    for event in events:
        if event.get("sessionId") != session:
            continue
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown":
            found.append(f"exception: {params['exceptionDetails'].get('text')}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in (
            "error",
            "warning",
            "assert",
        ):
            found.append(
                f"console.{params['type']}: "
                + " ".join(
                    str(a.get("value", a.get("description"))) for a in params.get("args", [])
                )
            )
        elif method == "Log.entryAdded" and params["entry"].get("level") in ("error", "warning"):
            entry = params["entry"]
            found.append(f"log {entry['level']}: {entry.get('text')} {entry.get('url', '')}")
    return found


def check_site(
    site: pathlib.Path,
    shots: pathlib.Path | None,
    executable: str,
    only: list[str] | None = None,
    root: pathlib.Path | None = None,
    progress=None,
) -> list[dict]:
    """Every *.html of `site` (or those named in `only`) at every width in WIDTHS: [{page, width,
    console, layout, screenshot, seconds}]; `root`: the repository, for the formula check;
    `progress(done, total)` is called after each page and width."""
    pages = sorted(p for p in site.glob("*.html") if not only or stem_of(p.name) in only)
    results = []
    browser = Browser(executable)
    try:
        target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        for domain in ("Page", "Runtime", "Log"):
            browser.send(f"{domain}.enable", session=session)
        for label, (width, height) in WIDTHS.items():
            browser.send(
                "Emulation.setDeviceMetricsOverride",
                {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 600},
                session=session,
            )
            for page in pages:
                browser.events.clear()
                started = time.monotonic()
                browser.send("Page.navigate", {"url": page.resolve().as_uri()}, session=session)
                browser.wait_for("Page.loadEventFired", session)
                script = LAYOUT_JS.replace(
                    "%(uncut)s", "true" if label in CODE_UNCUT_AT else "false"
                )
                layout = browser.send(
                    "Runtime.evaluate",
                    {"expression": script, "returnByValue": True},
                    session=session,
                )["result"]["value"]
                shot_path = None
                if shots is not None:
                    shots.mkdir(parents=True, exist_ok=True)
                    data = browser.send(
                        "Page.captureScreenshot", {"format": "png"}, session=session
                    )["data"]
                    shot_path = shots / f"{page.stem}-{label}.png"
                    shot_path.write_bytes(base64.b64decode(data))
                    # A second screen where the code starts: the first row after the first section banner.
                    scroll = {"expression": SCROLL_TO_CODE_JS, "returnByValue": True}
                    scrolled = browser.send("Runtime.evaluate", scroll, session=session)["result"][
                        "value"
                    ]
                    if scrolled:
                        data = browser.send(
                            "Page.captureScreenshot", {"format": "png"}, session=session
                        )["data"]
                        (shots / f"{page.stem}-{label}-code.png").write_bytes(
                            base64.b64decode(data)
                        )
                browser.send(
                    "Runtime.evaluate", {"expression": "0", "returnByValue": True}, session=session
                )
                results.append(
                    {
                        "page": page.name,
                        "width": label,
                        "layout": layout,
                        "screenshot": shot_path,
                        "console": _problems_from_events(browser.events, session),
                        "seconds": round(time.monotonic() - started, 2),
                    }
                )
                if progress:
                    progress(len(results), len(pages) * len(WIDTHS))
    finally:
        browser.close()
    site_problems(results, site, root)
    return results


class ProgressLines:
    """check_site's `progress`: on stderr, at most every PROGRESS_EVERY_S seconds and at the end,
    'checked 40 of 133 pages and widths, 1.9/s, ETA 0m49s' (the results print only when all end)."""

    def __init__(self):
        self.start = self.last = time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self.last < PROGRESS_EVERY_S and done < total:
            return
        self.last = now
        rate = done / max(now - self.start, 1e-9)
        left = round((total - done) / rate)
        print(
            f"checked {done} of {total} pages and widths, {rate:.1f}/s, "
            f"ETA {left // 60}m{left % 60:02d}s",
            file=sys.stderr,
            flush=True,
        )


def stem_of(page: str) -> str:
    """The file a page shows: data.html and data-2.html (its part 2) are data.py's."""
    return re.sub(r"-\d+$", "", page.removesuffix(".html"))


def formulas(path: pathlib.Path) -> set[str]:
    """What a reader must see as written: every `*`-formula or glob (3*C*H, B*T, train_*.bin, 2**32)
    in the prose of a source file (its docstrings and full-line comments), which Markdown would turn
    into emphasis."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import build

    src = build.read_source(path, set())
    text = "\n".join(
        [src.docstring, *src.comments.values(), *(d.doc for d in src.definitions.values() if d.doc)]
    )
    found = re.findall(r"[^\s`'\"]*[\w)\]]\*+[\w(\[.][^\s`'\"]*", text)
    return {f.rstrip(".,;:!?") for f in found}


def site_problems(results: list[dict], site: pathlib.Path, root: pathlib.Path | None) -> None:
    """The checks that need more than one page: every internal link and anchor resolves, nothing
    loads from the network, every chapter shows a drawn figure, and no formula of the source lost
    its `*` (when `root`, the repository the site was built from, is given). Adds to each result's
    problems; drops the bulky facts."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import build

    chapters = {stem for stem, _ in build.CHAPTERS}
    ids = {(r["width"], r["page"]): set(r["layout"]["ids"]) for r in results}
    expected, prose, figures = {}, collections.defaultdict(str), collections.Counter()
    for r in results:  # a file's parts together: its prose and its figures
        prose[r["width"], stem_of(r["page"])] += r["layout"]["prose"]
        figures[r["width"], stem_of(r["page"])] += r["layout"]["figures"]
    for r in results:
        layout, problems = r["layout"], r["layout"]["problems"]
        for tag, url in layout["links"]:
            if url.startswith("file:"):
                parts = urllib.parse.urlsplit(url)
                target, anchor = (
                    pathlib.Path(urllib.parse.unquote(parts.path)),
                    urllib.parse.unquote(parts.fragment),
                )
                if not target.is_file():
                    problems.append(f"broken link: {url} (no such file)")
                elif anchor and target.suffix == ".html":
                    if (
                        r["width"],
                        target.name,
                    ) not in ids:  # a page not opened (--only): its ids as written
                        ids[r["width"], target.name] = set(
                            re.findall(r' id="([^"]+)"', target.read_text("utf-8"))
                        )
                    if html.unescape(anchor) not in ids[r["width"], target.name]:
                        problems.append(f"broken link: {url} (no such anchor)")
            elif not url.startswith(("data:", "about:")) and tag != "a":
                problems.append(f"external load: {tag} {url}")
        stem = stem_of(r["page"])
        first_part = r["page"] == f"{stem}.html"  # a file's own checks are reported on its part 1
        if first_part and stem in chapters and not figures[r["width"], stem]:
            problems.append("no figure: a chapter without a figure")
        if first_part and root is not None and (root / f"{stem}.py").is_file():
            if stem not in expected:
                expected[stem] = formulas(root / f"{stem}.py")
            shown = prose[r["width"], stem]
            problems += [
                f"damaged formula: {f!r} is not in the page's prose"
                for f in sorted(expected[stem])
                if f not in shown
            ][:20]
        for key in ("links", "ids", "prose"):
            layout.pop(key)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("site", type=pathlib.Path, help="a folder built by book/build.py")
    parser.add_argument(
        "--shots",
        type=pathlib.Path,
        default=None,
        help="write a screenshot per page and width here",
    )
    parser.add_argument(
        "--only", nargs="+", metavar="PAGE", help="check only these pages (e.g. dedup index)"
    )
    parser.add_argument(
        "--root",
        type=pathlib.Path,
        default=pathlib.Path(__file__).resolve().parent.parent,
        help="the repository the site was built from, for the formula check (default: this one)",
    )
    args = parser.parse_args(argv)
    executable = find_chromium()
    if executable is None:
        print(
            "book/check.py: error: no chromium on PATH: apt-get install -y chromium",
            file=sys.stderr,
        )
        return 2
    if not (args.site / "index.html").is_file():
        print(
            f"book/check.py: error: {args.site} has no index.html: run python book/build.py --out {args.site}",
            file=sys.stderr,
        )
        return 2
    failed = False
    results = check_site(
        args.site, args.shots, executable, args.only, args.root, progress=ProgressLines()
    )
    for result in results:
        problems = result["console"] + result["layout"]["problems"]
        failed |= bool(problems)
        kinds = collections.Counter(p.split(":")[0].split(" at ")[0] for p in problems)
        summary = ", ".join(f"{n} {kind}" for kind, n in kinds.most_common())
        print(
            f"{result['page']:<20} {result['width']:<8} rows aligned {result['layout']['aligned']}/"
            f"{result['layout']['rows']}  {result['seconds']:5.2f} s  {summary or 'ok'}"
            + (f"\n    first: {problems[0]}" if problems else "")
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
