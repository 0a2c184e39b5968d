"""The course site: every internal link and anchor resolves; opened in a real browser, diagrams
render, search finds the lessons, long code lines stay readable.

The link checker runs on every page of a built site. Its own teeth (a small made-up site with
a broken link, a broken anchor on another page, a missing image...) are tested in every plain
``pytest`` run; the check of the real site runs when ``MINISGL_SITE_DIR`` names a finished build
or ``MINISGL_BROWSER=1`` (``.ci/run`` does both, right after ``mkdocs build --strict`` and again
with the browser tests). External (http/https) links are not followed: no network.

The browser tests are skipped unless ``MINISGL_BROWSER=1`` (``.ci/run`` sets it). They need
Debian's Chromium at ``/usr/bin/chromium`` (``apt-get install chromium``); nothing is downloaded.

The site is built with ``mkdocs build --strict`` into a temporary folder, or taken from
``MINISGL_SITE_DIR`` when that points at a finished build (CI reuses its ``site-build/``). It
is served on 127.0.0.1 by a thread of this process and driven over the Chrome DevTools
Protocol. The browser resolves no host name except 127.0.0.1, so the test also proves that
the site works offline (no CDN for mermaid, KaTeX, fonts or search).

Screenshots of the home page and of lesson 1 are written to ``MINISGL_SCREENSHOT_DIR`` (or
to the test's temporary folder).

Also here, with no site build: a check that ``DRAWN_BENCHMARKS`` is the list of kinds
``benchmarks.plots`` draws; the drawing of each benchmark is tested in
``tests/test_bench_plots.py``.
"""

from __future__ import annotations

import functools
import html.parser
import http.server
import json
import math
import os
import posixpath
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

BROWSER = os.environ.get("MINISGL_BROWSER") == "1"
needs_site = pytest.mark.skipif(
    not (BROWSER or os.environ.get("MINISGL_SITE_DIR")),
    reason="needs the built site: set MINISGL_SITE_DIR to a `mkdocs build --strict` output, or MINISGL_BROWSER=1",
)


def browser_test(fn):
    """Marks a test that drives Chromium: skipped unless ``MINISGL_BROWSER=1``."""
    skip = pytest.mark.skipif(not BROWSER, reason="browser test: set MINISGL_BROWSER=1 (needs /usr/bin/chromium)")
    return pytest.mark.browser(skip(fn))

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("MINISGL_CHROMIUM", "/usr/bin/chromium")
LESSON_RE = re.compile(r"^l(\d\d)$")


# --------------------------------------------------------------------------------------------
# A minimal Chrome DevTools Protocol client
# --------------------------------------------------------------------------------------------


class CDPError(RuntimeError):
    pass


class Browser:
    """Headless Chromium with one tab, driven over CDP (websocket-client)."""

    def __init__(self, profile_dir: Path) -> None:
        import websocket  # websocket-client

        self.proc = subprocess.Popen(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-extensions",
                "--disable-dev-shm-usage",
                "--hide-scrollbars",
                f"--user-data-dir={profile_dir}",
                "--remote-debugging-port=0",
                "--window-size=1280,1000",
                # Offline on purpose: any host but 127.0.0.1 fails to resolve at once.
                "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        port_file = profile_dir / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and len(port_file.read_text().splitlines()) >= 2):
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with code {self.proc.returncode}")
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeError("chromium did not open its DevTools port within 30 s")
            time.sleep(0.05)
        port, path = port_file.read_text().splitlines()[:2]
        self.ws = websocket.create_connection(f"ws://127.0.0.1:{port}{path}", timeout=60, suppress_origin=True)
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Network", "DOM"):
            self.send(f"{domain}.enable", session=self.session)

    def send(self, method: str, params: dict | None = None, *, session: str | None = None, timeout: float = 60) -> Any:
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        self.ws.send(json.dumps(msg))
        deadline = time.monotonic() + timeout
        while True:
            self.ws.settimeout(max(0.1, deadline - time.monotonic()))
            reply = json.loads(self.ws.recv())
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise CDPError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def cmd(self, method: str, params: dict | None = None, **kw: Any) -> Any:
        """A command for the tab."""
        return self.send(method, params, session=self.session, **kw)

    def eval(self, expression: str) -> Any:
        res = self.cmd("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in res:
            raise CDPError(f"{expression!r} threw: {res['exceptionDetails']}")
        return res["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 20, what: str = "") -> Any:
        """Poll ``expression`` until it is truthy; fail with ``what`` and its last value."""
        deadline = time.monotonic() + timeout
        value = None
        while time.monotonic() < deadline:
            value = self.eval(expression)
            if value:
                return value
            time.sleep(0.1)
        raise AssertionError(f"timed out after {timeout} s waiting for {what or expression} (last value: {value!r})")

    def goto(self, url: str) -> None:
        self.events.clear()
        self.cmd("Page.navigate", {"url": url})
        self.wait_for(
            f"location.href.startsWith({json.dumps(url.split('?')[0])}) && document.readyState === 'complete'",
            what=f"{url} to load",
        )

    def screenshot(self, path: Path, full_page: bool = False) -> None:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            width, height = self.eval("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
            params.update(captureBeyondViewport=True, clip={"x": 0, "y": 0, "width": width, "height": min(height, 6000), "scale": 1})
        data = self.cmd("Page.captureScreenshot", params)["data"]
        import base64

        path.write_bytes(base64.b64decode(data))

    def exceptions(self) -> list[str]:
        out = []
        for e in self.events:
            if e.get("method") == "Runtime.exceptionThrown":
                d = e["params"]["exceptionDetails"]
                out.append(d.get("exception", {}).get("description") or d.get("text", "?"))
        return out

    def external_requests(self, types: tuple[str, ...] = ("Script", "Stylesheet", "Font")) -> list[str]:
        """URLs of scripts, styles and fonts this page tried to load from outside 127.0.0.1."""
        urls = []
        for e in self.events:
            if e.get("method") == "Network.requestWillBeSent" and e["params"].get("type") in types:
                url = e["params"]["request"]["url"]
                host = urllib.parse.urlsplit(url).hostname
                if url.startswith(("http:", "https:")) and host not in ("127.0.0.1", "localhost"):
                    urls.append(url)
        return urls

    def close(self) -> None:
        try:
            self.ws.close()
        except Exception:
            pass
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# --------------------------------------------------------------------------------------------
# Fixtures: the built site, a local server, the browser
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def site_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("MINISGL_SITE_DIR")
    if given:
        path = (REPO / given).resolve()
        assert (path / "index.html").is_file(), f"MINISGL_SITE_DIR={given} holds no built site"
        return path
    out = tmp_path_factory.mktemp("site-build")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(REPO / "mkdocs.yml"), "-d", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    return out


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def base_url(site_dir: Path) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(site_dir)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} not found: install Debian's chromium (apt-get install -y chromium)")
    profile = Path(tempfile.mkdtemp(prefix="minisgl-chromium-"))
    b = Browser(profile)
    try:
        yield b
    finally:
        b.close()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def screenshot_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("MINISGL_SCREENSHOT_DIR")
    path = Path(given) if given else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


# --------------------------------------------------------------------------------------------
# What the site must contain
# --------------------------------------------------------------------------------------------


def repo_lessons() -> list[str]:
    """``["l01", ...]``: every lesson folder that has a README (each must have a page)."""
    root = REPO / "lessons"
    return sorted(d.name for d in root.iterdir() if LESSON_RE.match(d.name) and (d / "README.md").is_file())


def repo_notebooks() -> list[Path]:
    return sorted((REPO / "notebooks").glob("*.ipynb")) if (REPO / "notebooks").is_dir() else []


def pages_with_mermaid(site_dir: Path) -> dict[str, int]:
    """Site path -> number of mermaid diagrams in its HTML (before any JavaScript runs)."""
    found = {}
    for page in sorted(site_dir.rglob("index.html")):
        n = page.read_text(encoding="utf-8").count('<pre class="mermaid">')
        if n:
            found[page.parent.relative_to(site_dir).as_posix() + "/" if page.parent != site_dir else ""] = n
    return found


def _shadow_svgs(node: dict, inside: bool = False) -> list[dict]:
    """The ``svg`` nodes inside the (closed) shadow roots of ``div.mermaid`` hosts, in order."""
    out = []
    attrs = node.get("attributes", [])
    is_host = node.get("nodeName") == "DIV" and "mermaid" in dict(zip(attrs[::2], attrs[1::2])).get("class", "").split()
    if is_host:
        for root in node.get("shadowRoots", []):
            out += [n for n in _walk(root) if n.get("nodeName", "").lower() == "svg"][:1]
    for child in node.get("children", []):
        out += _shadow_svgs(child)
    for root in node.get("shadowRoots", []) if not is_host else []:
        out += _shadow_svgs(root)
    return out


def _walk(node: dict) -> Iterator[dict]:
    yield node
    for child in node.get("children", []):
        yield from _walk(child)
    for root in node.get("shadowRoots", []):
        yield from _walk(root)


def _text_of(node: dict) -> str:
    return " ".join(n.get("nodeValue", "") for n in _walk(node) if n.get("nodeType") == 3).strip()


def check_mermaid(browser: Browser, url: str, expected: int) -> list[str]:
    """Open ``url`` and check that its ``expected`` diagrams became non-empty SVGs."""
    browser.goto(url)
    try:
        browser.wait_for(
            f"document.querySelectorAll('pre.mermaid').length === 0 && "
            f"document.querySelectorAll('div.mermaid').length === {expected}",
            timeout=30,
            what=f"{expected} mermaid diagram(s) on {url} to render",
        )
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}\nJavaScript errors: {browser.exceptions()}\nnetwork loads: {browser.external_requests()}"
        ) from None
    # Material renders each diagram into a *closed* shadow root: only CDP can look inside.
    doc = browser.cmd("DOM.getDocument", {"depth": -1, "pierce": True})["root"]
    svgs = _shadow_svgs(doc)
    assert len(svgs) == expected, f"{url}: {expected} diagrams, {len(svgs)} SVGs"
    texts = []
    for svg in svgs:
        box = browser.cmd("DOM.getBoxModel", {"nodeId": svg["nodeId"]})["model"]
        assert box["width"] > 50 and box["height"] > 20, f"{url}: a diagram rendered at {box['width']}x{box['height']}"
        text = _text_of(svg)
        assert text, f"{url}: a diagram SVG without any text"
        assert "Syntax error" not in text, f"{url}: mermaid reported a syntax error"
        texts.append(text)
    return texts


def search(browser: Browser, base_url: str, query: str) -> list[str]:
    """Result links (site-relative) for ``query`` in the site's own search."""
    browser.goto(f"{base_url}?q={urllib.parse.quote(query)}")
    links = browser.wait_for(
        "Array.from(document.querySelectorAll('.md-search-result__item > a.md-search-result__link'))"
        ".map(a => a.getAttribute('href'))",
        timeout=30,
        what=f"search results for {query!r}",
    )
    return [urllib.parse.urljoin(base_url, h)[len(base_url) :] for h in links]


# --------------------------------------------------------------------------------------------
# Link check: every internal link of every built page, anchors included
# --------------------------------------------------------------------------------------------

# Elements whose URL attribute the browser loads or follows.
LINK_ATTRS = {"a": "href", "area": "href", "link": "href", "img": "src", "script": "src", "source": "src", "iframe": "src"}


class _PageLinks(html.parser.HTMLParser):
    """The ids (anchor targets) of one HTML page and the URLs it links to, with line numbers."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[tuple[int, str, str]] = []  # (line, tag, url)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v for k, v in attrs if v is not None}
        if a.get("id"):
            self.ids.add(a["id"])
        if tag == "a" and a.get("name"):
            self.ids.add(a["name"])
        attr = LINK_ATTRS.get(tag)
        if attr and attr in a:
            self.links.append((self.getpos()[0], tag, a[attr]))

    handle_startendtag = handle_starttag


def broken_links(site: Path) -> tuple[list[str], int, int]:
    """``(problems, pages, links)``: every internal link of every ``*.html`` under ``site`` that
    points at no file, or at an ``#anchor`` that its target page does not have.

    URLs resolve as a browser resolves them on a server rooted at ``site`` (a folder means its
    ``index.html``; ``/x`` is ``site/x``). Links with a scheme (``https:``, ``mailto:``,
    ``data:``) or ``//host`` are external and not checked.
    """
    pages: dict[str, _PageLinks] = {}
    for path in sorted(site.rglob("*.html")):
        parsed = _PageLinks()
        parsed.feed(path.read_text(encoding="utf-8"))
        parsed.close()
        pages[path.relative_to(site).as_posix()] = parsed
    problems, checked = [], 0
    for page, parsed in pages.items():
        for line, tag, url in parsed.links:
            parts = urllib.parse.urlsplit(url)
            if parts.scheme or url.startswith("//"):
                continue
            checked += 1
            where = f"{page}:{line}: <{tag}> {url!r}"
            path = urllib.parse.unquote(parts.path)
            if not path:
                target = page
            else:
                base = "" if path.startswith("/") else posixpath.dirname(page)
                target = posixpath.normpath(posixpath.join(base, path.lstrip("/")))
                if target == ".." or target.startswith("../"):
                    problems.append(f"{where}: points outside the site")
                    continue
                if target == ".":
                    target = ""
                if path.endswith("/") or (site / target).is_dir():
                    target = posixpath.join(target, "index.html")
                if not (site / target).is_file():
                    problems.append(f"{where}: no such file {target}")
                    continue
            anchor = urllib.parse.unquote(parts.fragment)
            if anchor and target in pages and anchor not in pages[target].ids:
                problems.append(f"{where}: {target} has no id {anchor!r}")
    return problems, len(pages), checked


# --------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------


@needs_site
def test_every_lesson_has_a_page_with_a_diagram(site_dir: Path) -> None:
    lessons = repo_lessons()
    assert lessons, "no lessons/lNN/README.md found: the course has no lesson yet?"
    diagrams = pages_with_mermaid(site_dir)
    for lesson in lessons:
        page = f"lessons/{lesson}/"
        assert (site_dir / page / "index.html").is_file(), f"lessons/{lesson}/README.md has no page on the site"
        assert diagrams.get(page, 0) >= 1, f"lesson {lesson} has no mermaid diagram (every lesson text has one)"


@browser_test
def test_every_page_renders_its_mermaid_diagrams(browser: Browser, base_url: str, site_dir: Path) -> None:
    diagrams = pages_with_mermaid(site_dir)
    assert "architecture/" in diagrams, "the Architecture page lost its diagrams"
    for page, expected in diagrams.items():
        texts = check_mermaid(browser, base_url + page, expected)
        assert not browser.exceptions(), f"{page}: JavaScript errors {browser.exceptions()}"
        assert not browser.external_requests(), f"{page}: loads from the network {browser.external_requests()}"
        if page == "architecture/":
            assert any("Scheduler" in t for t in texts), "the request-lifecycle diagram is not on the Architecture page"


@browser_test
@pytest.mark.parametrize(
    ("query", "must_find"),
    [("cache", "lessons/"), ("prefill", "lessons/l01/"), ("radix", "lessons/l05/")],
)
def test_search_finds_lessons(browser: Browser, base_url: str, query: str, must_find: str) -> None:
    lesson = re.match(r"lessons/(l\d\d)/", must_find)
    assert lesson is None or lesson.group(1) in repo_lessons(), f"{must_find}README.md is missing"
    links = search(browser, base_url, query)
    assert any(link.startswith(must_find) for link in links), f"search {query!r} found {links}, no {must_find}"


@browser_test
def test_lesson_pages_link_their_notebooks(browser: Browser, base_url: str, site_dir: Path) -> None:
    lessons = set(repo_lessons())
    for nb in repo_notebooks():
        page = f"notebooks/{nb.stem}/"
        assert (site_dir / page / "index.html").is_file(), f"{nb.name} has no page on the site"
        lesson = nb.name[:3]
        if lesson in lessons:
            browser.goto(f"{base_url}lessons/{lesson}/")
            hrefs = browser.eval("Array.from(document.querySelectorAll('article a')).map(a => a.href)")
            assert any(h.rstrip("/").endswith(f"notebooks/{nb.stem}") for h in hrefs), f"lessons/{lesson} does not link {nb.name}"


@browser_test
def test_notebook_pages_show_their_plots(browser: Browser, base_url: str) -> None:
    """Every image output saved in a notebook is on its page, loaded; CI also demands one plot."""
    notebooks = repo_notebooks()
    if not notebooks:
        pytest.skip("no notebooks yet")
    executed = os.environ.get("MINISGL_NOTEBOOKS_EXECUTED") == "1"
    for nb in notebooks:
        cells = json.loads(nb.read_text(encoding="utf-8")).get("cells", [])
        images = sum(
            1
            for c in cells
            for o in c.get("outputs", [])
            if any(k.startswith("image/") for k in o.get("data", {}))
        )
        if executed:
            assert images >= 1, f"{nb.name} was executed but draws no plot (every notebook draws its numbers)"
        browser.goto(f"{base_url}notebooks/{nb.stem}/")
        shown = browser.wait_for(
            f"(() => {{ const imgs = Array.from(document.querySelectorAll('.jupyter-wrapper img'));"
            f" return imgs.length >= {images} && imgs.every(i => i.complete && i.naturalWidth > 0) ? imgs.length : 0; }})()"
            if images
            else "document.querySelector('.jupyter-wrapper') ? 1 : 0",
            timeout=20,
            what=f"{images} plot(s) of {nb.name}",
        )
        assert shown >= (images or 1)
        assert not browser.exceptions(), f"{nb.name}: JavaScript errors {browser.exceptions()}"


# Benchmarks with a chart (benchmarks.plots.KINDS); others are tables.
DRAWN_BENCHMARKS = ("attention_decode", "offline", "radix", "chunked", "overlap", "host", "graphs", "tp", "serving", "steps", "moe",
                    "speculative")


@browser_test
def test_benchmark_page_draws_the_results(browser: Browser, base_url: str, site_dir: Path, screenshot_dir: Path) -> None:
    """Each committed result is on the Benchmarks page: its file linked, its plot loaded in the
    variant of the current colour scheme, an attention run's every point in the fold-out table, a
    serving run's every point in its curve table."""
    results = sorted((REPO / "benchmarks" / "results").glob("*.json"))
    browser.goto(f"{base_url}benchmarks/")
    if not results:
        assert "No results yet" in browser.eval("document.querySelector('article').innerText")
        return
    hrefs = browser.eval("Array.from(document.querySelectorAll('article a')).map(a => a.href)")
    data = {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in results}
    for stem in data:
        assert any(h.endswith(f"benchmarks/results/{stem}.json") for h in hrefs), f"{stem}.json is not linked"
    drawn = [stem for stem, d in data.items() if d.get("benchmark") in DRAWN_BENCHMARKS]
    for stem in drawn:
        for scheme in ("light", "dark"):
            assert (site_dir / "assets" / "benchmarks" / f"{stem}-{scheme}.svg").is_file(), f"no {scheme} plot of {stem}"

    visible_plots = """Array.from(document.querySelectorAll('img.minisgl-plot'))
        .filter(i => getComputedStyle(i).display !== 'none')
        .map(i => [new URL(i.src).pathname.split('/').pop(), i.complete && i.naturalWidth > 0, i.width])"""
    for scheme, color_scheme in (("light", "default"), ("dark", "slate")):
        browser.eval(f"document.body.setAttribute('data-md-color-scheme', '{color_scheme}')")
        plots = browser.wait_for(
            f"(() => {{ const p = {visible_plots}; return p.length === {len(drawn)} && p.every(x => x[1]) ? p : null; }})()",
            what=f"{len(drawn)} loaded {scheme} plot(s)",
        )
        assert sorted(name for name, _, _ in plots) == sorted(f"{stem}-{scheme}.svg" for stem in drawn)
        assert all(width > 400 for _, _, width in plots), f"plots drawn too small: {plots}"
    browser.eval("document.body.setAttribute('data-md-color-scheme', 'default')")

    tables = browser.eval(
        "Array.from(document.querySelectorAll('details')).filter(d => d.querySelector('summary').innerText.trim()"
        " === 'All measured points').map(d => d.querySelectorAll('tbody tr').length)"
    )
    expected = [len(d["results"]["rows"]) for d in data.values() if d.get("benchmark") == "attention_decode"]
    assert tables == expected, f"fold-out tables of measured points: {tables} rows, expected {expected}"
    # Offline results: minisgl's speed-up over each Hugging Face baseline the file has (one
    # request at a time, and static batches in newer files), in the row under the numbers; a file
    # without a baseline (the `all` runner's engine-only 30B-A3B run) has no such row.
    ratios = browser.eval(
        "Array.from(document.querySelectorAll('article tr')).filter(r => r.cells[0].innerText.trim() === 'minisgl speed-up')"
        ".map(r => Array.from(r.cells).slice(1).filter(c => c.innerText.trim().endsWith('×')).length)"
    )
    baselines = [n for d in data.values() if d.get("benchmark") == "offline"
                 if (n := sum(k in d["results"] for k in ("hf", "hf_batched")))]
    assert ratios == baselines, f"speed-up rows with {ratios} ratio(s), expected {baselines}"
    # Radix results: the cache-on speed-up under each file's numbers, and one row per file in
    # the side-by-side table of the workloads.
    radix = [stem for stem, d in data.items() if d.get("benchmark") == "radix"]
    radix_ratios = browser.eval(
        "Array.from(document.querySelectorAll('article tr')).filter(r => r.cells[0].innerText.trim() === 'speed-up, cache on over off')"
        ".map(r => r.cells[r.cells.length - 1].innerText.trim())"
    )
    assert len(radix_ratios) == len(radix) and all(r.endswith("×") for r in radix_ratios), f"radix speed-up rows: {radix_ratios}"
    compared = browser.eval(
        "Array.from(document.querySelectorAll('article table')).filter(t => t.tHead && t.tHead.innerText.includes('output tok/s, cache off'))"
        ".map(t => Array.from(t.tBodies[0].rows).map(r => r.cells[r.cells.length - 1].innerText.trim()))"
    )
    assert compared == [sorted(f"{stem}.json" for stem in radix)], f"radix comparison table lists {compared}"
    # Graphs results: the batch-size-1 decode table with a row per shape, and a kernel table per
    # shape that has profiled steps.
    graphs = [d for d in data.values() if d.get("benchmark") == "graphs"]
    graph_tables = browser.eval(
        "Array.from(document.querySelectorAll('article table')).filter(t => t.tHead && /speed-up with graphs|^kind\\b/.test(t.tHead.innerText.trim())"
        " && !t.tHead.innerText.includes('costliest kernels'))"
        ".map(t => t.tHead.innerText.trim().startsWith('kind') ? 'kernels' : t.tBodies[0].rows.length)"
    )
    expected_tables = []
    for d in graphs:
        expected_tables.append(len(d["results"]["decode"]))
        expected_tables += ["kernels"] * sum(any(k.startswith("kernels_") for k in run) for run in d["results"]["decode"].values())
    # Tensor-parallel results: one kernel table (TP=1, TP=2, TP=2 through NCCL) per profiled file.
    expected_tables += ["kernels"] * sum(bool(d["results"].get("kernels_per_decode_step"))
                                         for d in data.values() if d.get("benchmark") == "tp")
    assert graph_tables == expected_tables, f"graphs tables: {graph_tables}, expected {expected_tables}"
    # MoE results: a bs=1 decode step's kernels by kind (with the costliest kernels) per file that profiled one.
    moe_kinds = browser.eval(
        "Array.from(document.querySelectorAll('article table')).filter(t => t.tHead && /^kind\\b/.test(t.tHead.innerText.trim())"
        " && t.tHead.innerText.includes('costliest kernels')).map(t => t.tBodies[0].rows.length)"
    )
    assert moe_kinds == [len(d["results"]["decode_bs1"]["kernels"]["by_kind"]) for d in data.values()
                         if d.get("benchmark") == "moe" and "kernels" in d["results"].get("decode_bs1", {})], moe_kinds
    # Serving results: the curve's table has a row per point with a TTFT (by rate, all at once last).
    curve_rows = browser.eval(
        "Array.from(document.querySelectorAll('article table')).filter(t => t.tHead && t.tHead.innerText.trim().startsWith('arrivals'))"
        ".map(t => Array.from(t.tBodies[0].rows).map(r => r.cells[0].innerText.trim()))"
    )
    expected_rows = []
    for d in data.values():
        if d.get("benchmark") == "serving":
            points = [p for p in d["results"]["curve"]["points"] if _finite_number(p.get("ttft_ms", {}).get("p50"))]
            expected_rows.append(sorted(p["request_rate"] is None for p in points))  # False (a rate) first
    assert [[cell.startswith("all at once") for cell in rows] for rows in curve_rows] == expected_rows, (
        f"serving curve tables: {curve_rows}")
    assert not browser.exceptions(), f"benchmarks/: JavaScript errors {browser.exceptions()}"
    browser.screenshot(screenshot_dir / "benchmarks.png", full_page=True)


def _finite_number(v: Any) -> bool:
    """A JSON number that is not NaN (the serving benchmark writes NaN for an empty sample)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def test_drawn_benchmarks_are_the_kinds_with_a_chart() -> None:
    """DRAWN_BENCHMARKS (what the browser test expects a plot of) is the list of kinds drawn."""
    from benchmarks.plots import KINDS

    assert set(DRAWN_BENCHMARKS) == set(KINDS)


CODE_BLOCKS = ".md-typeset pre > code, .jupyter-wrapper .highlight-ipynb, .jupyter-wrapper .highlight-ipynb pre, .jupyter-wrapper .jp-OutputArea-output pre"
HIDDEN_CODE_JS = """(() => {
  const column = document.querySelector('.md-content').getBoundingClientRect().right;
  return Array.from(document.querySelectorAll(%s))
    .filter(e => !e.closest('.mermaid') && e.getClientRects().length)
    .filter(e => e.scrollWidth > e.clientWidth + 1 || e.getBoundingClientRect().right > column + 1)
    .map(e => [e.tagName + '.' + e.className, e.scrollWidth, e.clientWidth, e.textContent.split('\\n').reduce((a, b) => a.length >= b.length ? a : b).slice(0, 80)]);
})()""".replace("%s", json.dumps(CODE_BLOCKS))


@browser_test
def test_long_code_lines_stay_readable(browser: Browser, base_url: str, site_dir: Path, screenshot_dir: Path) -> None:
    """No code line runs past the content column or hides behind a scroll bar (extra.css wraps them), on
    every lesson, notebook and hand-written page, at desktop and at phone width. Teeth: with
    ``white-space: pre`` forced back, the same check finds lines that would be cut off."""
    pages = [p.parent.relative_to(site_dir).as_posix() + "/" for p in sorted(site_dir.glob("*/**/index.html"))]
    pages = [p for p in pages if p.startswith(("lessons/", "notebooks/", "architecture/", "reference/", "benchmarks/"))]
    assert any(p.startswith("notebooks/") for p in pages) and any(p.startswith("lessons/") for p in pages)
    nowrap = "document.head.insertAdjacentHTML('beforeend', '<style>' + %s + ' { white-space: pre !important; }</style>')"
    would_hide = 0
    try:
        for width in (1280, 420):
            browser.cmd("Emulation.setDeviceMetricsOverride", {"width": width, "height": 1000, "deviceScaleFactor": 1, "mobile": width < 600})
            for page in pages:
                browser.goto(base_url + page)
                hidden = browser.eval(HIDDEN_CODE_JS)
                assert not hidden, f"{page} at {width} px: code cut off at the right edge {hidden}"
                if width == 1280:
                    browser.eval(nowrap % json.dumps(json.dumps(CODE_BLOCKS)[1:-1]))
                    would_hide += len(browser.eval(HIDDEN_CODE_JS))
            if width == 420:
                browser.goto(base_url + next(p for p in pages if p.startswith("notebooks/")))
                browser.screenshot(screenshot_dir / "notebook-narrow.png")
    finally:
        browser.cmd("Emulation.clearDeviceMetricsOverride")
    assert would_hide > 0, "no code line is long enough to test the wrapping: the check has no teeth"


@browser_test
def test_screenshots(browser: Browser, base_url: str, screenshot_dir: Path) -> None:
    """Home page and lesson 1, for a human to look at (CI keeps them as artifacts)."""
    browser.goto(base_url)
    browser.wait_for("document.querySelectorAll('div.mermaid').length > 0 || !document.querySelector('pre.mermaid')")
    time.sleep(0.3)
    browser.screenshot(screenshot_dir / "home.png")
    lessons = repo_lessons()
    if lessons:
        browser.goto(f"{base_url}lessons/{lessons[0]}/")
        browser.wait_for("document.querySelectorAll('pre.mermaid').length === 0")
        time.sleep(0.3)
        browser.screenshot(screenshot_dir / f"{lessons[0]}.png")
        browser.screenshot(screenshot_dir / f"{lessons[0]}-full.png", full_page=True)
    for png in screenshot_dir.glob("*.png"):
        assert png.stat().st_size > 10_000, f"{png} looks blank"


# --------------------------------------------------------------------------------------------
# Link check
# --------------------------------------------------------------------------------------------


def _write(root: Path, rel: str, body: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"<!doctype html><html><head><title>t</title></head><body>{body}</body></html>", encoding="utf-8")


def test_link_check_catches_broken_links_and_anchors(tmp_path: Path) -> None:
    """Teeth: a made-up site with one of each kind of breakage, next to the same links done right."""
    _write(tmp_path, "index.html", '<h1 id="top">Home</h1><a href="lessons/l01/">ok</a> <a href="lessons/l01/#setup">ok</a>'
           ' <a href="/lessons/l01/index.html#setup">ok</a> <a href="#top">ok</a> <a href="#">ok</a>'
           ' <a href="https://example.org/missing#x">external</a> <a href="mailto:a@b.c">mail</a>'
           ' <img src="data:image/png;base64,AAAA"> <img src="assets/plot.svg#only-light">'
           ' <a href="lessons/l02/">broken page</a>')
    _write(tmp_path, "lessons/l01/index.html", '<h2 id="setup">Setup</h2><a name="old-name"></a>'
           '<a href="../../#top">ok</a> <a href="../../#nowhere">broken anchor on another page</a>'
           ' <a href="#old-name">ok</a> <a href="#missing">broken anchor here</a>'
           ' <img src="fig.png"> <script src="../../js/app.js"></script> <a href="../../../up.html">escapes</a>'
           ' <a href="../../index.html?q=cache#top">ok</a>')
    (tmp_path / "assets").mkdir()
    (tmp_path / "assets" / "plot.svg").write_text("<svg/>")
    problems, pages, checked = broken_links(tmp_path)
    assert pages == 2 and checked == 15  # the three external links are not counted
    expected = [
        ("index.html", "'lessons/l02/'", "no such file lessons/l02/index.html"),
        ("lessons/l01/index.html", "'../../#nowhere'", "index.html has no id 'nowhere'"),
        ("lessons/l01/index.html", "'#missing'", "lessons/l01/index.html has no id 'missing'"),
        ("lessons/l01/index.html", "'fig.png'", "no such file lessons/l01/fig.png"),
        ("lessons/l01/index.html", "'../../js/app.js'", "no such file js/app.js"),
        ("lessons/l01/index.html", "'../../../up.html'", "points outside the site"),
    ]
    assert len(problems) == len(expected), "\n".join(problems)
    for (page, url, why), problem in zip(expected, problems):
        assert problem.startswith(f"{page}:") and url in problem and problem.endswith(why), problem

    # Repair every breakage: the same site passes.
    _write(tmp_path, "lessons/l02/index.html", "<p>lesson 2</p>")
    _write(tmp_path, "index.html", (tmp_path / "index.html").read_text().replace("<h1", '<span id="nowhere"></span><h1'))
    page = tmp_path / "lessons/l01/index.html"
    page.write_text(page.read_text().replace('href="#missing"', 'href="#setup"').replace("../../../up.html", "../../"))
    (tmp_path / "lessons/l01/fig.png").write_bytes(b"png")
    (tmp_path / "js").mkdir()
    (tmp_path / "js/app.js").write_text("")
    assert broken_links(tmp_path)[0] == []


@needs_site
def test_every_internal_link_and_anchor_resolves(site_dir: Path) -> None:
    """Every page of the built site: links to pages, files, assets and #anchors (on the same page
    or another one) all exist. The notebook pages, whose links the hook rewrites, are included."""
    problems, pages, checked = broken_links(site_dir)
    assert not problems, f"{len(problems)} broken internal link(s) in {site_dir}:\n" + "\n".join(problems)
    notebook_pages = [nb for nb in repo_notebooks() if (site_dir / "notebooks" / nb.stem / "index.html").is_file()]
    assert len(notebook_pages) == len(repo_notebooks()), "a notebook has no page: the check would not see its links"
    assert pages >= 5 + len(repo_lessons()) and checked > 20 * pages, f"only {checked} links on {pages} pages?"

