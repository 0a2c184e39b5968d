"""mkdocs hook for the minisgl course site (registered under ``hooks:`` in ``mkdocs.yml``).

The site has no copies of the lesson texts or notebooks. At build time this hook:

* adds every ``lessons/lNN/README.md`` as the page ``lessons/lNN/`` and every
  ``notebooks/lNN_*.ipynb`` as a notebook page (mkdocs-jupyter renders it), straight from
  where they live in the repository, so each text has exactly one source;
* builds the "Course" navigation from whatever lessons exist (the ``lessons/*`` entry in the
  nav of ``mkdocs.yml`` marks the spot), so a new lesson appears with no config edit;
* rewrites relative links in those texts: a link to another page of the site stays a site
  link, a link to any other file of the repository (``../../minisgl/generate.py``,
  ``smoke.py``) becomes ``{repo_url}/blob/main/<path>``, so ``mkdocs build --strict`` passes;
  notebook pages get the same rewriting, applied to their rendered HTML (mkdocs does not look
  at links there), and a table of contents taken from their real heading ids;
* fills the generated parts of the hand-written pages (the lesson table and quick start taken
  from the top-level README, the package map scanned from ``minisgl/``, the benchmark results
  read from ``benchmarks/results/*.json``), marked in the page source by HTML comments such as
  ``<!-- minisgl:lesson-table -->``;
* draws the benchmark plots with matplotlib (SVG, a light and a dark variant) straight into
  the built site, so they always show the committed numbers and nothing is written to ``site/``;
* serves the vendored mermaid only on pages that draw a diagram, so the site needs no CDN.
"""

from __future__ import annotations

import ast
import html as htmllib
import io
import json
import logging
import math
import posixpath
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files, InclusionLevel
from mkdocs.structure.toc import get_toc
from mkdocs.utils import get_relative_url

log = logging.getLogger("mkdocs.hooks.minisgl_site")

BRANCH = "main"
LESSON_DIR_RE = re.compile(r"^l(\d\d)$")
NOTEBOOK_RE = re.compile(r"^l(\d\d)_.*\.ipynb$")
NAV_LESSONS_MARKER = "lessons/*"
ASSET_SUFFIXES = {".png", ".svg", ".jpg", ".jpeg", ".gif", ".webp"}
MERMAID_JS = "vendor/mermaid/mermaid.min.js"

# Filled by on_config / on_files, read by the later events of the same build.
_state: dict[str, Any] = {}


# --------------------------------------------------------------------------------------------
# Discovering lessons and notebooks
# --------------------------------------------------------------------------------------------


def _repo_root(config) -> Path:
    return Path(config.config_file_path).resolve().parent


def _lesson_readmes(root: Path) -> list[tuple[int, Path]]:
    """``(lesson number, README path)`` for every ``lessons/lNN/README.md``, in lesson order."""
    found = []
    lessons = root / "lessons"
    if lessons.is_dir():
        for d in sorted(lessons.iterdir()):
            m = LESSON_DIR_RE.match(d.name)
            if m and (d / "README.md").is_file():
                found.append((int(m.group(1)), d / "README.md"))
    return found


def _notebooks(root: Path) -> list[tuple[int | None, Path]]:
    """``(lesson number or None, path)`` for every notebook in ``notebooks/``."""
    found = []
    nb_dir = root / "notebooks"
    if nb_dir.is_dir():
        for p in sorted(nb_dir.glob("*.ipynb")):
            m = NOTEBOOK_RE.match(p.name)
            found.append((int(m.group(1)) if m else None, p))
    return found


def _markdown_h1(text: str) -> str | None:
    in_fence = False
    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            in_fence = not in_fence
        elif not in_fence and line.startswith("# "):
            return line[2:].strip().strip("#").strip()
    return None


def _repo_file(config, root: Path, rel: str) -> File:
    """A site file whose source lives anywhere in the repository (not only in docs_dir)."""
    f = File(
        rel,
        src_dir=str(root),
        dest_dir=config.site_dir,
        use_directory_urls=config.use_directory_urls,
        inclusion=InclusionLevel.INCLUDED,
    )
    f.edit_uri = rel
    return f


# --------------------------------------------------------------------------------------------
# Events
# --------------------------------------------------------------------------------------------


def on_config(config, **kwargs):
    root = _repo_root(config)
    _state.clear()
    _state["root"] = root
    _state["repo_url"] = (config.repo_url or "").rstrip("/")
    _state["docs_prefix"] = Path(config.docs_dir).resolve().relative_to(root).as_posix()
    return config


@event_priority(100)  # before mkdocs-jupyter, which turns the .ipynb files into pages
def on_files(files: Files, config, **kwargs) -> Files:
    root: Path = _state["root"]
    docs_prefix: str = _state["docs_prefix"]

    # "Edit this page" must point at the file's path in the repository, not in docs_dir.
    for f in files:
        if f.is_documentation_page():
            f.edit_uri = f"{docs_prefix}/{f.src_uri}"

    lessons = _lesson_readmes(root)
    notebooks = _notebooks(root)
    lesson_titles: dict[int, str] = {}
    for num, readme in lessons:
        rel = readme.relative_to(root).as_posix()
        files.append(_repo_file(config, root, rel))
        lesson_titles[num] = _markdown_h1(readme.read_text(encoding="utf-8")) or f"Lesson {num}"
        for asset in sorted(readme.parent.rglob("*")):
            if asset.suffix.lower() in ASSET_SUFFIXES and asset.is_file():
                files.append(_repo_file(config, root, asset.relative_to(root).as_posix()))
    for _, nb in notebooks:
        files.append(_repo_file(config, root, nb.relative_to(root).as_posix()))

    _state["lessons"] = {num: readme.relative_to(root).as_posix() for num, readme in lessons}
    _state["notebooks"] = [(num, nb.relative_to(root).as_posix()) for num, nb in notebooks]

    config.nav = _expand_nav(config.nav, _lesson_nav(lessons, notebooks, lesson_titles, root))

    # The benchmark plots are drawn now, so the Benchmarks page can link them like any file.
    _state["benchmarks"] = _load_benchmark_results(root)
    _add_benchmark_plots(_state["benchmarks"], files, config)

    # repository path -> site file, for the link rewriter
    by_repo_path = {}
    for f in files:
        if f.src_dir and Path(f.src_dir).resolve() == root:
            by_repo_path[f.src_uri] = f
        else:
            by_repo_path[f"{docs_prefix}/{f.src_uri}"] = f
    _state["by_repo_path"] = by_repo_path
    _state["by_src_uri"] = {f.src_uri: f for f in files}
    return files


def _lesson_nav(lessons, notebooks, titles: dict[int, str], root: Path) -> list:
    """Nav entries: one section per lesson (its text, then its notebooks), in lesson order."""
    nb_by_lesson: dict[int | None, list[str]] = {}
    for num, nb in notebooks:
        nb_by_lesson.setdefault(num, []).append(nb.relative_to(root).as_posix())
    entries: list = []
    numbers = sorted({n for n, _ in lessons} | {n for n in nb_by_lesson if n is not None})
    readme_by_num = {n: p.relative_to(root).as_posix() for n, p in lessons}
    for num in numbers:
        nbs = nb_by_lesson.get(num, [])
        nb_entries = [
            {("Lesson %d notebook" % num) + ("" if len(nbs) == 1 else f" {i + 1}"): nb}
            for i, nb in enumerate(nbs)
        ]
        if num in readme_by_num:
            if nb_entries:
                entries.append({titles[num]: [readme_by_num[num], *nb_entries]})
            else:
                entries.append({titles[num]: readme_by_num[num]})
        else:
            entries.extend(nb_entries)
    others = nb_by_lesson.get(None, [])
    if others:
        entries.append({"More notebooks": others})
    return entries


def _expand_nav(nav: list | None, lesson_entries: list) -> list | None:
    """Replace the ``lessons/*`` marker anywhere in the nav by the generated lesson entries."""
    if nav is None:
        return None
    out = []
    for item in nav:
        if item == NAV_LESSONS_MARKER:
            out.extend(lesson_entries)
        elif isinstance(item, dict):
            out.append({k: (_expand_nav(v, lesson_entries) if isinstance(v, list) else v) for k, v in item.items()})
        else:
            out.append(item)
    return out


def on_page_markdown(markdown: str, page, config, files, **kwargs) -> str:
    src_uri: str = page.file.src_uri
    if src_uri.endswith(".ipynb"):
        return markdown  # mkdocs-jupyter renders these from the notebook itself
    root: Path = _state["root"]
    repo_path = _repo_path_of(page.file)

    if "<!-- minisgl:" in markdown:
        markdown = _fill_generated_sections(markdown, src_uri)

    is_docs_page = repo_path != src_uri
    markdown = rewrite_links(markdown, source_repo_path=repo_path, page_src_uri=src_uri, docs_relative_ok=is_docs_page)

    lesson = _lesson_number_of(src_uri)
    if lesson is not None:
        markdown = _add_lesson_box(markdown, lesson, src_uri, root)
    return markdown


def on_page_content(html: str, page, config, files, **kwargs) -> str:
    """Notebook pages: links resolved as on lesson pages, a table of contents that matches the
    headings, and under the title links back to the lesson, to the .ipynb and how to run it."""
    src_uri: str = page.file.src_uri
    if not src_uri.endswith(".ipynb"):
        return html
    html = rewrite_html_links(html, source_repo_path=_repo_path_of(page.file), page_url=page.url)
    toc_tokens = html_toc_tokens(html)
    if toc_tokens:
        # mkdocs-jupyter builds the ToC from its own Markdown export of the notebook, which drops
        # inline code from headings ("## Reserving `max_seq_len`" gives the anchor
        # #reserving), so its links can miss the ids of the rendered headings.
        page.toc = get_toc(toc_tokens)
    name = posixpath.basename(src_uri)
    parts = []
    m = NOTEBOOK_RE.match(name)
    lesson = int(m.group(1)) if m else None
    lesson_file = files.get_file_from_path(_state["lessons"][lesson]) if lesson in _state["lessons"] else None
    if lesson_file is not None:
        parts.append(f'<a href="{get_relative_url(lesson_file.url, page.url)}">Lesson {lesson} text</a>')
    parts.append(f'<a href="{name}" download>download {name}</a>')
    parts.append(f"run it: <code>jupyter lab {src_uri}</code>")
    bar = f'<p class="minisgl-notebook-links">{" · ".join(parts)}</p>\n'
    end = html.find("</h1>")
    if end == -1:
        return bar + html
    at = end + len("</h1>")
    return html[:at] + "\n" + bar + html[at:]


def on_post_page(output: str, page, config, **kwargs) -> str:
    if page.file.src_uri.endswith(".ipynb"):
        # nbconvert's MathJax stanza (with an empty URL: it would load the page itself as a
        # script). Notebook math is rendered by the vendored KaTeX instead (katex-init.js).
        output = output.replace('<script src=""> </script>', "")
        output = re.sub(r'<script type="text/x-mathjax-config">.*?</script>', "", output, flags=re.S)
    # mermaid.min.js is 3.5 MB: load the vendored copy only where a diagram is drawn. Material
    # uses a global `mermaid` when one exists and otherwise fetches it from a CDN.
    if 'class="mermaid"' in output and MERMAID_JS not in output:
        src = get_relative_url(MERMAID_JS, page.url)
        output = output.replace("</body>", f'<script src="{src}"></script>\n</body>', 1)
    return output


def on_serve(server, config, builder, **kwargs):
    root: Path = _state.get("root") or _repo_root(config)
    for rel in ("lessons", "notebooks", "benchmarks/results", "minisgl", "README.md"):
        if (root / rel).exists():
            server.watch(str(root / rel))
    return server


# --------------------------------------------------------------------------------------------
# Links
# --------------------------------------------------------------------------------------------

_INLINE_LINK_RE = re.compile(
    r"(?P<head>!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*)(?P<lt><?)(?P<target>[^)\s<>]+)(?P<tail>>?(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\))"
)
_REF_DEF_RE = re.compile(r"^(?P<head> {0,3}\[[^\]]+\]:\s*)(?P<lt><?)(?P<target>[^\s<>]+)(?P<tail>>?.*)$")
_CODE_SPAN_RE = re.compile(r"(`+)(?:(?!\1).)+?\1")
_FENCE_RE = re.compile(r"^\s*(`{3,}|~{3,})")


def _repo_path_of(f: File) -> str:
    if f.src_dir and Path(f.src_dir).resolve() == _state["root"]:
        return f.src_uri
    return f"{_state['docs_prefix']}/{f.src_uri}"


def _is_external(target: str) -> bool:
    return target.startswith(("#", "/", "//")) or re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) is not None


def _resolve(target: str, source_repo_path: str, page_src_uri: str, docs_relative_ok: bool) -> tuple[File | None, str]:
    """``(site file, fragment)`` for a link to a page or file of the site, else ``(None, link)``
    with the link to use instead (the same ``target``, or a URL of the repository's host)."""
    if _is_external(target):
        return None, target
    path, sep, fragment = target.partition("#")
    path = path.split("?", 1)[0]
    fragment = sep + fragment
    if not path:
        return None, target
    by_repo_path: dict[str, File] = _state["by_repo_path"]
    repo_target = posixpath.normpath(posixpath.join(posixpath.dirname(source_repo_path), unquote(path)))
    if repo_target.startswith("../") or repo_target == "..":
        return None, target  # outside the repository: leave it for mkdocs (or the link check) to report
    site_file = by_repo_path.get(repo_target) or by_repo_path.get(posixpath.join(repo_target, "README.md"))
    if site_file is not None:
        return site_file, fragment
    # A hand-written site page may link docs-relative, the way mkdocs reads links.
    docs_target = posixpath.normpath(posixpath.join(posixpath.dirname(page_src_uri), unquote(path)))
    if docs_relative_ok and docs_target in _state["by_src_uri"]:
        return None, target
    kind = "tree" if (_state["root"] / repo_target).is_dir() or path.endswith("/") else "blob"
    return None, f"{_state['repo_url']}/{kind}/{BRANCH}/{repo_target}{fragment}"


def resolve_link(target: str, source_repo_path: str, page_src_uri: str, docs_relative_ok: bool = False) -> str:
    """Where a relative link written in ``source_repo_path`` should point from ``page_src_uri``.

    Links resolve against the repository first (lesson texts and the README are written for
    GitHub); ``docs_relative_ok`` also accepts a link relative to docs_dir (hand-written pages).
    The result is a Markdown link: a site file is named by its source path, which mkdocs then
    turns into the page's URL (and checks).
    """
    site_file, rest = _resolve(target, source_repo_path, page_src_uri, docs_relative_ok)
    return get_relative_url(site_file.src_uri, page_src_uri) + rest if site_file is not None else rest


_HTML_LINK_RE = re.compile(r'(?P<head><(?:a|img)\b[^>]*?\s(?:href|src)=")(?P<target>[^"]*)(?P<tail>")', re.I)


def rewrite_html_links(html: str, *, source_repo_path: str, page_url: str) -> str:
    """:func:`resolve_link` for the ``<a href>`` and ``<img src>`` of rendered HTML (notebook
    pages): a site file becomes its URL relative to ``page_url``, since mkdocs does not convert
    links in HTML it did not render from Markdown."""

    def fix(m: re.Match) -> str:
        target = htmllib.unescape(m.group("target"))
        site_file, rest = _resolve(target, source_repo_path, source_repo_path, False)
        new = get_relative_url(site_file.url or ".", page_url) + rest if site_file is not None else rest
        return m.group("head") + htmllib.escape(new, quote=True) + m.group("tail")

    return _HTML_LINK_RE.sub(fix, html)


_HEADING_RE = re.compile(r'<h(?P<level>[1-6])\b[^>]*?\sid="(?P<id>[^"]+)"[^>]*>(?P<body>.*?)</h(?P=level)>', re.I | re.S)


def html_toc_tokens(html: str) -> list[dict[str, Any]]:
    """Table-of-contents tokens (as ``markdown``'s toc extension makes them) for the headings of
    ``html`` that have an id, nested by level."""
    roots: list[dict[str, Any]] = []
    stack: list[dict[str, Any]] = []
    for m in _HEADING_RE.finditer(html):
        body = re.sub(r'<a\b[^>]*class="[^"]*anchor-link[^"]*"[^>]*>.*?</a>', "", m.group("body"), flags=re.S)
        name = htmllib.unescape(re.sub(r"<[^>]+>", "", body)).strip()
        token = {"level": int(m.group("level")), "id": htmllib.unescape(m.group("id")), "name": name, "children": []}
        while stack and stack[-1]["level"] >= token["level"]:
            stack.pop()
        (stack[-1]["children"] if stack else roots).append(token)
        stack.append(token)
    return roots


def rewrite_links(markdown: str, *, source_repo_path: str, page_src_uri: str, docs_relative_ok: bool = False) -> str:
    """Rewrite the relative links of ``markdown`` (outside code) with :func:`resolve_link`."""

    def fix(m: re.Match) -> str:
        new = resolve_link(m.group("target"), source_repo_path, page_src_uri, docs_relative_ok)
        return f"{m.group('head')}{m.group('lt')}{new}{m.group('tail')}"

    out = []
    fence: str | None = None
    for line in markdown.split("\n"):
        m = _FENCE_RE.match(line)
        if fence is not None:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = None
            out.append(line)
            continue
        if m:
            fence = m.group(1)
            out.append(line)
            continue
        spans: list[str] = []

        def hide(mm: re.Match) -> str:
            spans.append(mm.group(0))
            return f"\x00{len(spans) - 1}\x00"

        masked = _CODE_SPAN_RE.sub(hide, line)
        masked = _INLINE_LINK_RE.sub(fix, masked)
        masked = _REF_DEF_RE.sub(fix, masked)
        out.append(re.sub(r"\x00(\d+)\x00", lambda mm: spans[int(mm.group(1))], masked))
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# Lesson pages
# --------------------------------------------------------------------------------------------


def _lesson_number_of(src_uri: str) -> int | None:
    m = re.match(r"^lessons/l(\d\d)/README\.md$", src_uri)
    return int(m.group(1)) if m else None


def _add_lesson_box(markdown: str, lesson: int, src_uri: str, root: Path) -> str:
    """A short box under the title: the lesson folder, its notebook and how to run it."""
    folder = f"lessons/l{lesson:02d}"
    repo_url = _state["repo_url"]
    parts = [f"[`{folder}/`]({repo_url}/tree/{BRANCH}/{folder})"]
    for num, nb in _state["notebooks"]:
        if num == lesson:
            parts.append(f"notebook [`{posixpath.basename(nb)}`]({get_relative_url(nb, src_uri)})")
    run = f"`pytest {folder}`"
    if (root / folder / "smoke.py").is_file():
        run += f" · `python {folder}/smoke.py`"
    box = (
        f'!!! abstract "Lesson {lesson} at a glance"\n'
        f"    Source: {' · '.join(parts)}  \n"
        f"    Run it: {run}\n"
    )
    lines = markdown.split("\n")
    for i, line in enumerate(lines):
        if line.startswith("# "):
            return "\n".join(lines[: i + 1] + ["", box] + lines[i + 1 :])
    return box + "\n" + markdown


# --------------------------------------------------------------------------------------------
# Generated sections of the hand-written pages
# --------------------------------------------------------------------------------------------

_MARKER_RE = re.compile(r"<!-- minisgl:(?P<name>[a-z-]+) -->")


def _fill_generated_sections(markdown: str, src_uri: str) -> str:
    generators = {
        "lesson-table": lambda: _readme_lesson_table(src_uri),
        "quickstart": lambda: _readme_section("quickstart", src_uri),
        "package-map": _package_map,
        "module-index": _module_index,
        "benchmark-results": _benchmark_results,
        "radix-comparison": _radix_comparison,
        "chunked-comparison": _chunked_comparison,
    }

    def fill(m: re.Match) -> str:
        gen = generators.get(m.group("name"))
        if gen is None:
            log.warning("%s: unknown generated section %r", src_uri, m.group("name"))
            return m.group(0)
        return gen()

    return _MARKER_RE.sub(fill, markdown)


def _readme_section(name: str, page_src_uri: str) -> str:
    """The part of the top-level README between ``<!-- name:begin -->`` and ``<!-- name:end -->``."""
    readme = _state["root"] / "README.md"
    text = readme.read_text(encoding="utf-8") if readme.is_file() else ""
    m = re.search(rf"<!-- {name}:begin -->\n(.*?)<!-- {name}:end -->", text, re.S)
    if not m:
        log.warning("README.md has no '<!-- %s:begin/end -->' section for %s", name, page_src_uri)
        return ""
    return rewrite_links(m.group(1), source_repo_path="README.md", page_src_uri=page_src_uri)


def readme_lessons() -> list[dict[str, str]]:
    """Rows of the README's lesson table: ``{"id": "l01", "topic": ..., "adds": ..., "status": ...}``."""
    readme = _state["root"] / "README.md"
    text = readme.read_text(encoding="utf-8") if readme.is_file() else ""
    m = re.search(r"<!-- lessons:begin -->\n(.*?)<!-- lessons:end -->", text, re.S)
    rows = []
    for line in (m.group(1) if m else "").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        ident = re.search(r"\bl(\d\d)\b", cells[0]) if cells else None
        if ident and len(cells) >= 4:
            rows.append({"id": f"l{ident.group(1)}", "topic": cells[1], "adds": cells[2], "status": cells[-1]})
    return rows


def _strip_links(cell: str) -> str:
    return re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", cell)


def _readme_lesson_table(page_src_uri: str) -> str:
    rows = readme_lessons()
    if not rows:
        log.warning("README.md has no lesson table between <!-- lessons:begin --> and <!-- lessons:end -->")
        return ""
    lessons: dict[int, str] = _state["lessons"]
    notebooks = _state["notebooks"]
    out = ["| Lesson | Topic | What it adds to `minisgl/` | Notebook | Status |", "|---|---|---|---|---|"]
    for row in rows:
        num = int(row["id"][1:])
        topic = _strip_links(row["topic"])
        ident = row["id"]
        if num in lessons:
            link = get_relative_url(lessons[num], page_src_uri)
            ident, topic = f"[{ident}]({link})", f"[{topic}]({link})"
        nbs = [
            f"[{posixpath.basename(nb)[:-6]}]({get_relative_url(nb, page_src_uri)})"
            for n, nb in notebooks
            if n == num
        ]
        out.append(f"| {ident} | {topic} | {row['adds']} | {' '.join(nbs) or '—'} | {row['status']} |")
    return "\n".join(out) + "\n"


def _scan_modules() -> list[dict[str, Any]]:
    """Every module of ``minisgl/``: path, first docstring line, lesson tag (from the docstring)."""
    root: Path = _state["root"]
    modules = []
    for path in sorted((root / "minisgl").rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        rel = path.relative_to(root).as_posix()
        try:
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        except (SyntaxError, UnicodeDecodeError) as exc:  # a half-written file must not break the site
            log.info("cannot parse %s: %s", rel, exc)
            doc = ""
        first = doc.strip().split("\n\n")[0].replace("\n", " ").strip()
        m = re.match(r"^lessons? (\d+)\b", first, re.I) or re.search(r"\(lessons? (\d+)\b", first, re.I)
        modules.append({"path": rel, "summary": first, "lesson": int(m.group(1)) if m else None})
    return modules


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|")


def _module_link(rel: str) -> str:
    shown = rel[:-len("/__init__.py")] + "/" if rel.endswith("/__init__.py") else rel
    return f"[`{shown}`]({_state['repo_url']}/blob/{BRANCH}/{rel})"


# Modules of the foundation built with lesson 1 that carry no "Lesson N" tag in their docstring.
FOUNDATION = (
    "minisgl/config.py",
    "minisgl/tokenizer.py",
    "minisgl/generate.py",
    "minisgl/models/",
    "minisgl/layers/",
    "minisgl/attention/base.py",
    "minisgl/attention/dense.py",
    "minisgl/testing/",
)


def _grouped_module_links(paths: list[str]) -> str:
    """``attention/`` [base] · [dense]<br>... : the modules of a lesson, grouped by subpackage."""
    groups: dict[str, list[str]] = {}
    for rel in paths:
        inner = rel[len("minisgl/"):]
        package, _, name = inner.rpartition("/")
        groups.setdefault(package, []).append(
            f"[{name[:-3]}]({_state['repo_url']}/blob/{BRANCH}/{rel})"
        )
    lines = []
    for package in sorted(groups):
        label = f"`{package}/`" if package else "`minisgl/`"
        lines.append(f"{label} " + " · ".join(groups[package]))
    return "<br>".join(lines) or "—"


def _package_map() -> str:
    modules = [m for m in _scan_modules() if not m["path"].endswith("__init__.py")]
    for m in modules:
        if m["lesson"] is None and m["path"].startswith(FOUNDATION):
            m["lesson"] = 1
    rows = readme_lessons()
    out = ["| Lesson | What the lesson adds | Modules in `minisgl/` today |", "|---|---|---|"]
    for row in rows:
        num = int(row["id"][1:])
        mods = _grouped_module_links([m["path"] for m in modules if m["lesson"] == num])
        out.append(
            f"| **{row['id']}** {_strip_links(row['topic'])} | {_md_cell(_strip_links(row['adds']))} | {mods} |"
        )
    if not rows:
        out.append("| — | (the README has no lesson table) | |")
    shared = [m["path"] for m in modules if m["lesson"] is None]
    if shared:
        out.append(f"| shared | used across lessons (benchmarks, helpers) | {_grouped_module_links(shared)} |")
    return (
        "\n".join(out)
        + "\n\nA module belongs to the lesson its docstring names (`\"\"\"Lesson 2: ...`); the "
        "untagged modules of the model, the layers and the test helpers are lesson 1's foundation.\n"
    )


def _module_index() -> str:
    out = ["| Module | What it is |", "|---|---|"]
    for m in _scan_modules():
        if m["path"] == "minisgl/__init__.py":
            continue
        out.append(f"| {_module_link(m['path'])} | {_md_cell(m['summary']) or '—'} |")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------------------
# Benchmarks
# --------------------------------------------------------------------------------------------


def _fmt(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, float):
        return f"{v:,.1f}" if abs(v) >= 100 else f"{v:.4g}"
    if isinstance(v, int):
        return f"{v:,}" if abs(v) >= 10000 else str(v)
    if isinstance(v, (list, tuple)) and all(not isinstance(x, (dict, list)) for x in v):
        return ", ".join(_fmt(x) for x in v)
    if isinstance(v, (dict, list)):
        text = json.dumps(v, separators=(",", ":"))
        if len(text) > LONG_VALUE_CHARS:  # e.g. a per-step trace: summarised, the file has it all
            return f"{len(v)} entries (in the results file)"
        return "`" + text + "`"
    return _md_cell(str(v))


LONG_VALUE_CHARS = 200  # nested values longer than this are not spelled out in generic tables


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            flat.update(_flatten(v, key + "."))
        else:
            flat[key] = v
    return flat


def _kv_table(d: dict, head: tuple[str, str] = ("", "")) -> list[str]:
    flat = _flatten(d)
    out = [f"| {head[0]} | {head[1]} |", "|---|---|"]
    out += [f"| {_md_cell(k)} | {_fmt(v)} |" for k, v in flat.items()]
    return out


def _rows_table(rows: list[dict]) -> list[str]:
    flat_rows = [_flatten(r) for r in rows]
    cols: list[str] = []
    for r in flat_rows:
        cols += [c for c in r if c not in cols]
    out = ["| " + " | ".join(_md_cell(c) for c in cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(_fmt(r.get(c, "")) for c in cols) + " |" for r in flat_rows]
    return out


def _is_rows(v: Any) -> bool:
    """A list of objects, or an object of objects: one table row per entry."""
    if isinstance(v, list):
        return bool(v) and all(isinstance(r, dict) for r in v)
    return isinstance(v, dict) and bool(v) and all(isinstance(r, dict) for r in v.values())


def _is_record(v: Any) -> bool:
    """An object of plain values (one row of a table)."""
    return isinstance(v, dict) and bool(v) and not any(isinstance(x, (dict, list)) and not _is_scalar_list(x) for x in v.values())


def _is_scalar_list(v: Any) -> bool:
    return isinstance(v, list) and all(not isinstance(x, (dict, list)) for x in v)


def _results_block(results: Any) -> list[str]:
    """Tables for a ``results`` value.

    A list of objects or an object of objects is one table, a row per entry; in a mixed
    object, the entries that are objects become rows of one table, plain values a metric/value
    table, and nested row sets their own tables.
    """
    if _is_rows(results) and (isinstance(results, list) or all(_is_record(v) for v in results.values())):
        rows = results if isinstance(results, list) else [{"case": k, **v} for k, v in results.items()]
        return _rows_table(rows)
    if not isinstance(results, dict):
        return [f"`{json.dumps(results)}`"]
    records = {k: v for k, v in results.items() if _is_record(v)}
    row_sets = {k: v for k, v in results.items() if k not in records and _is_rows(v)}
    scalars = {k: v for k, v in results.items() if k not in records and k not in row_sets}
    out: list[str] = []
    if len(records) >= 2:
        out += _rows_table([{"case": k, **v} for k, v in records.items()])
    else:
        scalars = {**records, **scalars}
    if scalars:
        out += ([""] if out else []) + _kv_table(scalars, ("metric", "value"))
    for key, value in row_sets.items():
        out += ["", f"**{_md_cell(str(key))}**", ""] + _results_block(value)
    return out


def _hardware_summary(hw: Any) -> str:
    if not isinstance(hw, dict):
        return _fmt(hw)
    if hw.get("gpu"):
        count = hw.get("gpu_count")
        return f"{hw['gpu']}" + (f" ×{count}" if isinstance(count, int) and count > 1 else "")
    cpu = hw.get("cpu") or "CPU"
    return f"CPU {cpu}" + (f", {hw['cpu_count']} cores" if hw.get("cpu_count") else "")


@dataclass
class BenchmarkResult:
    """One ``benchmarks/results/*.json`` file, and the site paths of the plot drawn from it."""

    rel: str  # path in the repository
    data: dict[str, Any]
    plots: dict[str, str] = field(default_factory=dict)  # theme ("light"/"dark") -> SVG src_uri

    @property
    def name(self) -> str:
        return str(self.data.get("benchmark") or self.data.get("name") or Path(self.rel).stem)

    @property
    def results(self) -> Any:
        return self.data.get("results")


def _load_benchmark_results(root: Path) -> list[BenchmarkResult]:
    """Every readable ``benchmarks/results/*.json`` (a broken file is reported and skipped)."""
    results_dir = root / "benchmarks" / "results"
    found = []
    for path in sorted(results_dir.glob("*.json")) if results_dir.is_dir() else []:
        rel = path.relative_to(root).as_posix()
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as exc:
            log.warning("benchmark results %s are not valid JSON: %s", rel, exc)
            continue
        if not isinstance(data, dict):
            log.warning("benchmark results %s: expected a JSON object at the top level", rel)
            continue
        found.append(BenchmarkResult(rel, data))
    return found


def _benchmark_title(res: BenchmarkResult) -> str:
    stem = Path(res.rel).stem
    variant = stem[len(res.name):].strip("_-") if stem.startswith(res.name) else stem
    return res.name + (f" · {variant.replace('_', ' ')}" if variant and variant != res.name else "")


def _benchmark_results() -> str:
    """The "Results" section of the Benchmarks page: one subsection per results file."""
    results: list[BenchmarkResult] = _state.get("benchmarks", [])
    if not results:
        return (
            '!!! info "No results yet"\n'
            "    `benchmarks/results/` holds no result files yet, so there is nothing to show. "
            "Numbers appear here when a benchmark run commits its JSON file; this page never "
            "shows a number that is not in such a file.\n"
        )
    out: list[str] = []
    for res in results:
        out.append(f"### {_md_cell(_benchmark_title(res))}\n")
        out += _provenance(res)
        section = BENCHMARK_VIEWS.get(res.name, (None, None))[1]
        body = section(res) if section else None
        out += body if body is not None else _generic_tables(res.data)
        out.append("")
    return "\n".join(out) + "\n"


def _provenance(res: BenchmarkResult) -> list[str]:
    """File link, hardware, commit and date on one line; hardware and config folded away."""
    data = res.data
    meta = [_file_link(res.rel)]
    if data.get("hardware") is not None:
        meta.append(_md_cell(_hardware_summary(data["hardware"])))
    for key in ("commit", "date", "timestamp"):
        if key in data:
            meta.append(f"{key} `{data[key]}`")
    out = [" · ".join(meta), "{ .minisgl-bench-meta }", ""]
    if data.get("description"):
        out.append(_md_cell(str(data["description"])) + "\n")
    setup = []
    if isinstance(data.get("hardware"), dict) and data["hardware"]:
        setup += _kv_table(data["hardware"], ("hardware", "")) + [""]
    if isinstance(data.get("config"), dict) and data["config"]:
        setup += _kv_table(data["config"], ("config", "")) + [""]
    if setup:
        out += ['??? info "Hardware and config"', ""] + _indent(setup)
    return out


def _generic_tables(data: dict) -> list[str]:
    """Tables for any results file: ``results`` (or ``numbers``/``metrics``), then other keys."""
    numbers_key = next((k for k in ("results", "numbers", "metrics") if k in data), None)
    skip = {"name", "benchmark", "hardware", "commit", "date", "timestamp", "description", "config", numbers_key}
    out: list[str] = []
    if numbers_key is not None:
        out += _results_block(data[numbers_key])
    rest = {k: v for k, v in data.items() if k not in skip}
    if rest:
        out.append("")
        out += _results_block(rest)
    return out


def _on_hardware(data: dict) -> str:
    """`` on NVIDIA H200`` for a plot title, or nothing when the file names no hardware."""
    hw = data.get("hardware")
    return f" on {_hardware_summary(hw)}" if hw else ""


def _config(data: dict) -> dict[str, Any]:
    """The ``config`` object of a results file, or ``{}`` when it has none."""
    config = data.get("config")
    return config if isinstance(config, dict) else {}


def _setup_parts(config: dict[str, Any]) -> list[str]:
    """The start of a workload line: the model in bold, then the device and the dtype."""
    parts = [f"**{_md_cell(str(config['model']))}**"] if config.get("model") else []
    return parts + [_md_cell(str(config[k])) for k in ("device", "dtype") if config.get(k)]


def _model_and_hardware(data: dict) -> str:
    """``qwen3-0.6b, NVIDIA H200``: the first cell of a comparison row (``—`` if neither is named)."""
    config = _config(data)
    where = [str(config["model"])] if config.get("model") else []
    where += [_hardware_summary(data["hardware"])] if data.get("hardware") else []
    return _md_cell(", ".join(where) or "—")


def _file_link(rel: str, shown: str | None = None) -> str:
    """A link to the file ``rel`` on the repository's host, shown as code (``shown`` or ``rel``)."""
    return f"[`{shown or rel}`]({_state['repo_url']}/blob/{BRANCH}/{rel})"


def _plot_markdown(res: BenchmarkResult, alt: str) -> list[str]:
    """Image lines for the plot: the light variant in the light scheme, the dark one in the dark."""
    return [
        f"![{alt}]({uri}#only-{theme}){{ .minisgl-plot }}" for theme, uri in res.plots.items()
    ] + [""]


def _indent(lines: list[str]) -> list[str]:
    return [("    " + line) if line else "" for line in lines]


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _number(v: float, unit: str = "") -> str:
    """A measured value for a label: 3 significant digits below 100, thousands separators above."""
    text = f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"
    return f"{text} {unit}".strip()


def _faster(speedup: float, than: str = "") -> str:
    """``1.33× faster`` (``0.76× as fast`` below 1): a ratio of times for a bar's label; with
    ``than``, ``1.33× faster than TP=1`` (``0.76× as fast as TP=1``)."""
    if speedup >= 1:
        return f"{_number(speedup)}× faster" + (f" than {than}" if than else "")
    return f"{_number(speedup)}× as fast" + (f" as {than}" if than else "")


def _short_count(n: int) -> str:
    """``512``, ``1K``, ``8K``, ``1M``: axis labels for powers of two."""
    for size, suffix in ((1 << 20, "M"), (1 << 10, "K")):
        if n >= size and n % size == 0:
            return f"{n // size}{suffix}"
    return f"{n:,}"


# --------------------------------------------------------------------------------------------
# Benchmark plots (matplotlib, drawn into the build output at build time)
# --------------------------------------------------------------------------------------------

PLOT_DIR = "assets/benchmarks"  # a path of the built site only: nothing is written to site/
PLOT_WIDTH_IN = 9.2  # every plot is as wide as the page column (CSS), so fonts keep one size

# One variant of each plot per colour scheme of the site (Material shows ``#only-light`` images
# in the light scheme and ``#only-dark`` ones in the dark scheme); backgrounds stay transparent.
THEMES: dict[str, dict[str, Any]] = {
    "light": {
        "fg": "#3d4250",
        "muted": "#6b7080",
        "grid": "#dcdfe5",
        "series": ["#3f51b5", "#e8710a", "#0f9d58", "#c2185b", "#00838f", "#795548", "#7e57c2"],
        "accent": "#3f51b5",
        "other": "#9aa0ad",
    },
    "dark": {
        "fg": "#d3d6de",
        "muted": "#a4a9b6",
        "grid": "#3a3f4d",
        "series": ["#8c9eff", "#ffab40", "#69f0ae", "#f48fb1", "#4dd0e1", "#bcaaa4", "#b39ddb"],
        "accent": "#8c9eff",
        "other": "#7d8291",
    },
}
MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def _rc(theme: dict[str, Any]) -> dict[str, Any]:
    """matplotlib settings for one theme: readable sizes, theme colours, reproducible SVG."""
    fg, muted = theme["fg"], theme["muted"]
    return {
        "font.size": 10,
        "axes.titlesize": 11,
        "axes.titleweight": "bold",
        "axes.labelsize": 10,
        "figure.titlesize": 12,
        "figure.titleweight": "bold",
        "legend.fontsize": 9,
        "text.color": fg,
        "axes.labelcolor": fg,
        "axes.titlecolor": fg,
        "axes.edgecolor": muted,
        "xtick.color": muted,
        "ytick.color": muted,
        "xtick.labelcolor": fg,
        "ytick.labelcolor": fg,
        "axes.grid": True,
        "grid.color": theme["grid"],
        "grid.linewidth": 0.7,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "legend.frameon": False,
        "figure.facecolor": "none",
        "axes.facecolor": "none",
        "savefig.transparent": True,
        "svg.fonttype": "path",  # text as outlines: the same glyphs with any installed fonts
        "svg.hashsalt": "minisgl",  # stable element ids: the same SVG on every build
    }


def _render_svgs(draw, res: BenchmarkResult) -> dict[str, str]:
    """``{theme: SVG text}``: ``draw(data, theme)`` rendered once per theme, or ``{}`` if no plot."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    svgs = {}
    for name, theme in THEMES.items():
        with matplotlib.rc_context(_rc(theme)):
            fig = draw(res.data, theme)
            if fig is None:
                return {}
            FigureCanvasAgg(fig)
            buf = io.StringIO()
            # "tight" keeps a label that runs past the axes (a long bar's value) in the picture.
            fig.savefig(buf, format="svg", metadata={"Date": None}, bbox_inches="tight", pad_inches=0.05)
            svgs[name] = buf.getvalue()
    return svgs


def _add_benchmark_plots(results: list[BenchmarkResult], files: Files, config) -> None:
    """Draw the plot of every result that has one, as SVG files generated into the build."""
    try:
        import matplotlib  # noqa: F401  (in the dev extra, next to mkdocs)
    except ImportError:
        log.warning("matplotlib is not installed: the Benchmarks page shows tables without plots")
        return
    for res in results:
        draw = BENCHMARK_VIEWS.get(res.name, (None, None))[0]
        if draw is None:
            continue
        for theme, svg in _render_svgs(draw, res).items():
            src_uri = f"{PLOT_DIR}/{Path(res.rel).stem}-{theme}.svg"
            files.append(File.generated(config, src_uri, content=svg))
            res.plots[theme] = src_uri


# --------------------------------------------------------------------------------------------
# attention_decode: KV read bandwidth against context length, per backend and batch size
# --------------------------------------------------------------------------------------------

_ATTENTION_KEYS = ("backend", "batch", "context", "bandwidth_tb_s")


def _attention_rows(data: dict) -> list[dict] | None:
    """The measured rows of an ``attention_decode`` result, or None if they are not there."""
    results = data.get("results")
    rows = results.get("rows") if isinstance(results, dict) else None
    if not isinstance(rows, list) or not rows:
        return None
    for r in rows:
        if not isinstance(r, dict) or any(k not in r for k in _ATTENTION_KEYS):
            return None
        if not all(isinstance(r[k], (int, float)) for k in ("batch", "context", "bandwidth_tb_s")):
            return None
    return rows


def _copy_bandwidth(data: dict) -> float | None:
    value = data["results"].get("copy_bandwidth_tb_s")
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def _draw_attention(data: dict, theme: dict[str, Any]):
    """Small multiples, one panel per backend: a line per batch size, the copy bandwidth on top."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import NullLocator

    rows = _attention_rows(data)
    if rows is None:
        return None
    copy = _copy_bandwidth(data)
    backends = list(dict.fromkeys(str(r["backend"]) for r in rows))
    batches = sorted({r["batch"] for r in rows})
    contexts = sorted({r["context"] for r in rows})
    series = theme["series"]
    style = {b: (series[i % len(series)], MARKERS[i % len(MARKERS)]) for i, b in enumerate(batches)}

    ncols = min(len(backends), 3)
    nrows = -(-len(backends) // ncols)
    fig = Figure(figsize=(PLOT_WIDTH_IN, 0.8 + 3.1 * nrows), layout="constrained")
    grid = fig.subplots(nrows, ncols, sharex=True, sharey=True, squeeze=False)
    axes = grid.flatten()
    for ax in axes[len(backends):]:
        ax.set_visible(False)
    for ax, backend in zip(axes, backends):
        for batch in batches:
            points = sorted(
                (r["context"], r["bandwidth_tb_s"]) for r in rows if str(r["backend"]) == backend and r["batch"] == batch
            )
            if points:
                color, marker = style[batch]
                ax.plot(*zip(*points), color=color, marker=marker, markersize=4.5, linewidth=1.8)
        if copy:
            ax.axhline(copy, color=theme["fg"], linestyle="--", linewidth=1.2)
        ax.set_title(backend)
        ax.tick_params(axis="x", labelsize=9)
        ax.set_xscale("log", base=2)
        ax.set_xticks(contexts, [_short_count(int(c)) for c in contexts])
        ax.xaxis.set_minor_locator(NullLocator())
    top = max([copy or 0.0] + [r["bandwidth_tb_s"] for r in rows])
    axes[0].set_ylim(0, top * 1.08)
    for ax in grid[:, 0]:
        ax.set_ylabel("KV read bandwidth (TB/s)")
    if copy:
        axes[0].annotate("device copy (same run)", (0.03, copy), xycoords=("axes fraction", "data"),
                         xytext=(0, 3), textcoords="offset points", fontsize=9, color=theme["muted"])
    fig.get_layout_engine().set(wspace=0.04)
    fig.supxlabel("context length (tokens per request, log scale)", fontsize=10)
    fig.suptitle(f"Decode attention{_on_hardware(data)}: KV-cache read bandwidth")

    handles = [
        Line2D([], [], color=c, marker=m, markersize=4.5, linewidth=1.8, label=f"batch {b}")
        for b, (c, m) in style.items()
    ]
    if copy:
        handles.append(Line2D([], [], color=theme["fg"], linestyle="--", linewidth=1.2,
                              label=f"device copy\n(same run)\n{_number(copy, 'TB/s')}"))
    fig.legend(handles=handles, loc="outside right upper")
    return fig


def _attention_section(res: BenchmarkResult) -> list[str] | None:
    """Plot, best bandwidth per backend, and every measured point in a fold-out table."""
    rows = _attention_rows(res.data)
    if rows is None:
        return None
    copy = _copy_bandwidth(res.data)
    out = _attention_headline(res.data)
    out += _plot_markdown(res, "KV read bandwidth against context length, per backend and batch size")
    out += ["| backend | best KV read bandwidth | of device copy bandwidth | reached at |", "|---|---|---:|---|"]
    for backend in dict.fromkeys(str(r["backend"]) for r in rows):
        best = max((r for r in rows if str(r["backend"]) == backend), key=lambda r: r["bandwidth_tb_s"])
        fraction = best.get("fraction_of_copy_bw")
        if not isinstance(fraction, (int, float)):
            fraction = best["bandwidth_tb_s"] / copy if copy else None
        share = f"{fraction:.0%}" if fraction is not None else "—"
        where = f"batch {best['batch']}, context {best['context']:,}"
        out.append(f"| {_md_cell(backend)} | {_number(best['bandwidth_tb_s'], 'TB/s')} | {share} | {where} |")
    if copy:
        out += ["", f"Device copy bandwidth measured in the same run: **{_number(copy, 'TB/s')}**."]
    out += ["", '??? note "All measured points"', ""] + _indent(_rows_table(rows)) + [""]
    return out


def _attention_headline(data: dict) -> list[str]:
    config = _config(data)
    parts = [f"**{_md_cell(str(config['shape']))}**"] if config.get("shape") else []
    if config.get("num_qo_heads") and config.get("num_kv_heads") and config.get("head_dim"):
        parts.append(f"{config['num_qo_heads']} query / {config['num_kv_heads']} KV heads × {config['head_dim']}")
    parts += [f"{k.replace('_', ' ')} {_fmt(config[k])}" for k in ("dtype", "page_size") if k in config]
    return [" · ".join(parts), ""] if parts else []


# --------------------------------------------------------------------------------------------
# offline: output tokens per second, minisgl engine against Hugging Face generate
# --------------------------------------------------------------------------------------------


# (results key, label, key of minisgl's speed-up over that run): the engine, then the baselines.
# ``hf_batched`` (static batches) is newer than ``hf`` (one request at a time): a file may lack it.
OFFLINE_RUNS = (
    ("engine", "minisgl engine", None),
    ("hf_batched", "HF generate", "speedup_vs_hf_batched"),
    ("hf", "HF generate", "speedup_vs_hf"),
)


def _offline_runs(results: dict) -> list[tuple[str, str, str | None]]:
    """The runs of :data:`OFFLINE_RUNS` that ``results`` has, each with its output tok/s."""
    return [
        (key, label, speedup_key)
        for key, label, speedup_key in OFFLINE_RUNS
        if isinstance(results.get(key), dict) and isinstance(results[key].get("output_tok_s"), (int, float))
    ]


def _offline_bars(data: dict) -> list[tuple[str, float, bool, float | None]] | None:
    """``(label, output tok/s, is minisgl, minisgl's speed-up over it)`` per run, or None."""
    results = data.get("results")
    if not isinstance(results, dict):
        return None
    bars = []
    for key, label, speedup_key in _offline_runs(results):
        run = results[key]
        detail = ", ".join(([str(run["mode"])] if run.get("mode") else [])
                           + ([f"{run['requests']} requests"] if isinstance(run.get("requests"), int) else []))
        # A long mode ("static batches of 64, left-padded, ...") on lines of its own, so that the
        # labels do not squeeze the bars.
        lines = [label] + textwrap.wrap(detail, 34)
        speedup = _offline_speedup(results, key, speedup_key) if speedup_key else None
        bars.append(("\n".join(lines), float(run["output_tok_s"]), key == "engine", speedup))
    return bars if any(is_engine for _, _, is_engine, _ in bars) else None


def _offline_speedup(results: dict, key: str, speedup_key: str) -> float | None:
    """minisgl's output tok/s over run ``key``'s: the file's ratio, else computed from the runs."""
    value = results.get(speedup_key)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    try:
        return results["engine"]["output_tok_s"] / results[key]["output_tok_s"]
    except (KeyError, TypeError, ZeroDivisionError):
        return None


def _speedup_text(speedup: float) -> str:
    return f"minisgl is {_faster(speedup)}"


def _draw_offline(data: dict, theme: dict[str, Any]):
    """Horizontal bars of output tok/s, each labelled with its value; minisgl's speed-up beside
    each Hugging Face baseline's (one request at a time, and static batches when measured)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import StrMethodFormatter

    bars = _offline_bars(data)
    if bars is None:
        return None
    values = [value for _, value, _, _ in bars]
    label_lines = max(label.count("\n") + 1 for label, _, _, _ in bars)
    fig = Figure(figsize=(PLOT_WIDTH_IN, max(0.65, 0.2 * label_lines + 0.2) * len(bars) + 1.1), layout="constrained")
    ax = fig.subplots()
    y = list(range(len(bars)))
    ax.barh(y, values, height=0.62, color=[theme["accent"] if eng else theme["other"] for _, _, eng, _ in bars])
    ax.set_yticks(y, [label for label, _, _, _ in bars])
    ax.invert_yaxis()
    ax.tick_params(axis="y", length=0)
    ax.grid(axis="y", visible=False)
    ax.spines["left"].set_visible(False)
    ax.set_xlim(0, max(values) * 1.18 or 1.0)
    ax.set_xlabel("output tokens per second (higher is better)")
    ax.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    ax.set_title(f"Output throughput{_on_hardware(data)}", loc="left")
    for yi, (_, value, is_engine, speedup) in zip(y, bars):
        text = _number(value, "tok/s")
        if not is_engine and speedup is not None:
            text += f"   →  {_speedup_text(speedup)}"
        ax.annotate(text, (value, yi), xytext=(6, 0), textcoords="offset points", va="center", fontweight="bold")
    return fig


def _offline_section(res: BenchmarkResult) -> list[str] | None:
    """Headline of the workload, the bar chart and the key numbers (speed-ups included)."""
    if _offline_bars(res.data) is None:
        return None
    out = _offline_headline(res.data)
    out += _plot_markdown(res, "Output tokens per second: minisgl engine against Hugging Face generate")
    return out + _offline_table(res.results)


def _offline_table(results: dict) -> list[str]:
    """The key numbers: one column per run (engine, then the HF baselines), a row of speed-ups,
    then any other values of ``results``."""
    runs = [(key, label) for key, label, _ in OFFLINE_RUNS if isinstance(results.get(key), dict)]
    heads = [label + (f" ({_md_cell(str(results[key]['mode']))})" if results[key].get("mode") else "") for key, label in runs]
    metrics = list(dict.fromkeys(m for key, _ in runs for m in results[key] if m != "mode"))
    out = ["| | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(runs)]
    for m in metrics:
        cells = [_fmt(results[key][m]) if m in results[key] else "—" for key, _ in runs]
        out.append(f"| {_md_cell(m)} | " + " | ".join(cells) + " |")
    speedup_keys = {key: sk for key, _, sk in OFFLINE_RUNS if sk}
    cells = []
    for key, _ in runs:
        speedup = _offline_speedup(results, key, speedup_keys[key]) if key in speedup_keys else None
        cells.append(f"**{_number(speedup)}×**" if speedup is not None else "—")
    if any(c != "—" for c in cells):
        out.append("| minisgl speed-up | " + " | ".join(cells) + " |")
    shown = {key for key, _ in runs} | {speedup_keys[key] for key, _ in runs if key in speedup_keys}
    rest = {k: v for k, v in results.items() if k not in shown}
    return out + ([""] + _results_block(rest) if rest else [])


def _offline_headline(data: dict) -> list[str]:
    config = _config(data)
    parts = _setup_parts(config)
    if config.get("num_requests"):
        parts.append(f"{_fmt(config['num_requests'])} requests")
    lens = config.get("len_range")
    if isinstance(lens, list) and len(lens) == 2:
        parts.append(f"input and output lengths {_fmt(lens[0])}–{_fmt(lens[1])} tokens")
    if config.get("dummy_weights"):
        parts.append("random weights")
    return [" · ".join(parts), ""] if parts else []


# --------------------------------------------------------------------------------------------
# radix: the prefix cache on and off, same shared-prefix requests, same run
# --------------------------------------------------------------------------------------------

RADIX_RUNS = (("cache_off", "cache off"), ("cache_on", "cache on"))  # (results key, label)
RADIX_SPEEDUP_ROW = "speed-up, cache on over off"


def _radix_runs(data: dict) -> dict[str, dict] | None:
    """``{"cache_off": run, "cache_on": run}``, each with a numeric ``output_tok_s``, or None."""
    results = data.get("results")
    if not isinstance(results, dict):
        return None
    runs = {key: results.get(key) for key, _ in RADIX_RUNS}
    if not all(isinstance(run, dict) and _is_number(run.get("output_tok_s")) for run in runs.values()):
        return None
    return runs


def _radix_speedup(results: dict) -> float | None:
    """Output tok/s with the cache over without it: the file's ratio, else computed from the runs."""
    if _is_number(results.get("speedup")):
        return float(results["speedup"])
    try:
        return results["cache_on"]["output_tok_s"] / results["cache_off"]["output_tok_s"]
    except (KeyError, TypeError, ZeroDivisionError):
        return None


def _radix_hit_rate(run: dict) -> float | None:
    """Share of the prompt tokens served from the cache: ``hit_rate``, else computed from the counts."""
    if _is_number(run.get("hit_rate")):
        return float(run["hit_rate"])
    try:
        return run["cached_prompt_tokens"] / run["prompt_tokens"]
    except (KeyError, TypeError, ZeroDivisionError):
        return None


def _radix_answers(data: dict) -> str:
    config = _config(data)
    return f"{config['output_len']:,}-token answers" if _is_number(config.get("output_len")) else ""


def _draw_radix(data: dict, theme: dict[str, Any]):
    """Output tok/s with the cache off and on (the speed-up beside the cache-on bar) and, beside
    them, the share of the prompt tokens each run served from the cache."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator, PercentFormatter, StrMethodFormatter

    runs = _radix_runs(data)
    if runs is None:
        return None
    speedup = _radix_speedup(data["results"])
    rates = [_radix_hit_rate(runs[key]) for key, _ in RADIX_RUNS]
    show_rates = all(r is not None for r in rates)
    fig = Figure(figsize=(PLOT_WIDTH_IN, 2.5), layout="constrained")
    if show_rates:
        ax, ax2 = fig.subplots(1, 2, sharey=True, gridspec_kw={"width_ratios": [3, 2]})
    else:
        ax, ax2 = fig.subplots(), None
    y = list(range(len(RADIX_RUNS)))
    colors = [theme["other"], theme["accent"]]
    values = [float(runs[key]["output_tok_s"]) for key, _ in RADIX_RUNS]
    ax.barh(y, values, height=0.62, color=colors)
    ax.set_yticks(y, [label for _, label in RADIX_RUNS])
    ax.invert_yaxis()
    ax.set_xlim(0, max(values) * 1.6 or 1.0)  # room for the speed-up beside the longer bar
    ax.set_xlabel("output tokens per second (higher is better)")
    ax.xaxis.set_major_locator(MaxNLocator(5))
    ax.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    for yi, (key, _), value in zip(y, RADIX_RUNS, values):
        text = _number(value, "tok/s")
        if key == "cache_on" and speedup is not None:
            text += f"   →  {_faster(speedup)}"
        ax.annotate(text, (value, yi), xytext=(6, 0), textcoords="offset points", va="center", fontweight="bold")
    axes = [ax]
    if ax2 is not None:
        ax2.barh(y, [100 * r for r in rates], height=0.62, color=colors)
        ax2.set_xlim(0, 100)
        ax2.xaxis.set_major_formatter(PercentFormatter(decimals=0))
        ax2.set_xlabel("prompt tokens served from the cache")
        for yi, rate in zip(y, rates):
            ax2.annotate(f"{rate:.1%}", (100 * rate, yi), xytext=(6, 0), textcoords="offset points", va="center")
        axes.append(ax2)
    for a in axes:
        a.set_axisbelow(True)
        a.tick_params(axis="y", length=0)
        a.grid(axis="y", visible=False)
        a.spines["left"].set_visible(False)
    answers = _radix_answers(data)
    fig.suptitle(f"Radix cache off and on{_on_hardware(data)}" + (f": {answers}" if answers else ""), x=0.01, ha="left")
    return fig


def _radix_section(res: BenchmarkResult) -> list[str] | None:
    """The workload in one line, the plot, and the key numbers of both runs with the speed-up."""
    if _radix_runs(res.data) is None:
        return None
    out = _radix_headline(res.data)
    out += _plot_markdown(res, "Output tokens per second and prompt-token hit rate with the radix cache off and on")
    return out + _radix_table(res.results)


def _radix_table(results: dict) -> list[str]:
    """One column per run (cache off, cache on), one row per number, then the speed-up row and
    any other values of ``results``."""
    keys = [key for key, _ in RADIX_RUNS]
    metrics = list(dict.fromkeys(m for key in keys for m in results[key] if m != "prefix_cache"))
    out = ["| | " + " | ".join(label for _, label in RADIX_RUNS) + " |", "|---|" + "---:|" * len(keys)]
    for m in metrics:
        cells = [_fmt(results[key][m]) if m in results[key] else "—" for key in keys]
        out.append(f"| {_md_cell(m)} | " + " | ".join(cells) + " |")
    speedup = _radix_speedup(results)
    if speedup is not None:
        out.append(f"| {RADIX_SPEEDUP_ROW} | — | **{_number(speedup)}×** |")
    rest = {k: v for k, v in results.items() if k not in (*keys, "speedup")}
    return out + ([""] + _results_block(rest) if rest else [])


def _radix_headline(data: dict) -> list[str]:
    config = _config(data)
    parts = _setup_parts(config)
    groups, per_group = config.get("groups"), config.get("per_group")
    if _is_number(groups) and _is_number(per_group):
        parts.append(f"{groups * per_group:,} requests = {groups} groups × {per_group}")
    if _is_number(config.get("system_len")):
        prompt = f"{config['system_len']:,}-token system prompt shared by a group"
        if _is_number(config.get("question_len")):
            prompt += f" + {config['question_len']:,}-token question"
        parts.append(prompt)
    if _radix_answers(data):
        parts.append(_radix_answers(data))
    if _is_number(config.get("page_size")):
        parts.append(f"page size {config['page_size']}")
    if config.get("dummy_weights"):
        parts.append("random weights")
    return [" · ".join(parts), ""] if parts else []


def _radix_workload(data: dict) -> str:
    """``256 requests (16 × 16), prompts 2,048 shared + 128, 256-token answers``, from the config."""
    config = _config(data)
    parts = []
    groups, per_group = config.get("groups"), config.get("per_group")
    if _is_number(groups) and _is_number(per_group):
        parts.append(f"{groups * per_group:,} requests ({groups} × {per_group})")
    if _is_number(config.get("system_len")) and _is_number(config.get("question_len")):
        parts.append(f"prompts {config['system_len']:,} shared + {config['question_len']:,}")
    if _radix_answers(data):
        parts.append(_radix_answers(data))
    return ", ".join(parts) or "—"


def _radix_comparison() -> str:
    """The Benchmarks page's side-by-side table of every radix result (one row per file)."""
    rows = []
    for res in _state.get("benchmarks", []):
        runs = _radix_runs(res.data) if res.name == "radix" else None
        if runs is None:
            continue
        off, on = runs["cache_off"], runs["cache_on"]
        rate = _radix_hit_rate(on)
        speedup = _radix_speedup(res.results)
        cells = [
            _model_and_hardware(res.data),
            _md_cell(_radix_workload(res.data)),
            f"{rate:.1%}" if rate is not None else "—",
            _number(off["output_tok_s"]),
            _number(on["output_tok_s"]),
            f"**{_number(speedup)}×**" if speedup is not None else "—",
            _file_link(res.rel, posixpath.basename(res.rel)),
        ]
        rows.append("| " + " | ".join(cells) + " |")
    if not rows:
        return "_No radix results committed yet._\n"
    head = [
        "| model, hardware | workload | prompt tokens from the cache | output tok/s, cache off"
        " | output tok/s, cache on | speed-up | file |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    return "\n".join(head + rows) + "\n"


# --------------------------------------------------------------------------------------------
# chunked: short requests behind one long prompt, whole prompts against each chunk size
# --------------------------------------------------------------------------------------------

CHUNKED_BASELINE = "whole"  # the key of the setting without chunking (chunked_prefill_size None)


def _chunked_settings(data: dict) -> dict[str, dict] | None:
    """``results.settings`` with whole prompts first, keeping the settings whose short-request
    TTFT has a numeric p50 and p99; None unless whole prompts and one chunk size are there."""
    results = data.get("results")
    settings = results.get("settings") if isinstance(results, dict) else None
    if not isinstance(settings, dict):
        return None
    usable = {
        key: run for key, run in settings.items()
        if isinstance(run, dict) and isinstance(run.get("short_ttft_s"), dict)
        and all(_is_number(run["short_ttft_s"].get(q)) for q in ("p50", "p99"))
    }
    if CHUNKED_BASELINE not in usable or len(usable) < 2:
        return None
    return {CHUNKED_BASELINE: usable.pop(CHUNKED_BASELINE), **usable}


def _chunk_size(key: str, run: dict) -> int | None:
    """A setting's chunk size: ``chunked_prefill_size``, else the number in a ``chunk_<N>`` key."""
    if _is_number(run.get("chunked_prefill_size")):
        return int(run["chunked_prefill_size"])
    m = re.fullmatch(r"chunk_(\d+)", key)
    return int(m.group(1)) if m else None


def _chunk_label(key: str, run: dict, short: bool = False) -> str:
    """``whole`` for the baseline; ``8,192`` (or ``8K`` with ``short``) for a chunk size."""
    size = _chunk_size(key, run)
    if key == CHUNKED_BASELINE or size is None:
        return key
    return _short_count(size) if short else f"{size:,}"


def _chunked_p99_ratio(settings: dict[str, dict], key: str) -> float | None:
    """Whole prompts' short-request p99 TTFT over this setting's: the file's ratio, else computed."""
    if _is_number(settings[key].get("p99_ratio_vs_whole")):
        return float(settings[key]["p99_ratio_vs_whole"])
    try:
        return settings[CHUNKED_BASELINE]["short_ttft_s"]["p99"] / settings[key]["short_ttft_s"]["p99"]
    except (KeyError, TypeError, ZeroDivisionError):
        return None


def _chunked_yardstick(data: dict, key: str) -> tuple[float, float | None] | None:
    """``(output tok/s, ratio over whole prompts)`` of a setting's offline yardstick run (the
    file's ``vs_whole``, else computed), or None when the file has no such run."""
    results = data.get("results")
    yard = results.get("yardstick") if isinstance(results, dict) else None
    run = yard.get(key) if isinstance(yard, dict) else None
    if not isinstance(run, dict) or not _is_number(run.get("output_tok_s")):
        return None
    if _is_number(run.get("vs_whole")):
        return float(run["output_tok_s"]), float(run["vs_whole"])
    try:
        return float(run["output_tok_s"]), run["output_tok_s"] / yard[CHUNKED_BASELINE]["output_tok_s"]
    except (KeyError, TypeError, ZeroDivisionError):
        return float(run["output_tok_s"]), None


def _lower_text(ratio: float) -> str:
    """``5.74× lower`` for a ratio of the baseline's TTFT over a setting's (``2× higher`` below 1)."""
    return f"{_number(1 / ratio)}× higher" if 0 < ratio < 1 else f"{_number(ratio)}× lower"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms"


def _draw_chunked(data: dict, theme: dict[str, Any]):
    """Grouped bars per setting: the short requests' TTFT p50 and p99 (the p99 labelled with its
    ratio to whole prompts) and the long request's TTFT; beside them, the offline yardstick's
    throughput of each setting over whole prompts'."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import StrMethodFormatter

    settings = _chunked_settings(data)
    if settings is None:
        return None
    keys = list(settings)
    yard = [_chunked_yardstick(data, key) for key in keys]
    show_yard = all(y is not None and y[1] is not None for y in yard)
    fig = Figure(figsize=(PLOT_WIDTH_IN, 3.6), layout="constrained")
    if show_yard:
        ax, ax2 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    else:
        ax, ax2 = fig.subplots(), None
    x = list(range(len(keys)))
    ticks = [_chunk_label(key, settings[key], short=True) for key in keys]
    series = [("short requests, p50", [settings[k]["short_ttft_s"]["p50"] for k in keys], theme["series"][0]),
              ("short requests, p99", [settings[k]["short_ttft_s"]["p99"] for k in keys], theme["series"][1])]
    if all(_is_number(settings[k].get("long_ttft_s")) for k in keys):
        series.insert(0, ("the long request", [settings[k]["long_ttft_s"] for k in keys], theme["other"]))
    width = 0.72 / len(series)  # gaps between the groups leave room for the p99 labels
    for i, (label, values, color) in enumerate(series):
        offsets = [xi + (i - (len(series) - 1) / 2) * width for xi in x]
        ax.bar(offsets, [1e3 * v for v in values], width=width * 0.92, color=color, label=label)
    p99_x = [xi + (len(series) - 1) / 2 * width for xi in x]  # the p99 bars are the last series
    for xi, key in zip(p99_x, keys):
        p99 = settings[key]["short_ttft_s"]["p99"]
        ratio = _chunked_p99_ratio(settings, key) if key != CHUNKED_BASELINE else None
        text = f"{1e3 * p99:.1f}" + (f"\n{_lower_text(ratio)}" if ratio is not None else "")
        ax.annotate(text, (xi, 1e3 * p99), xytext=(0, 3), textcoords="offset points", ha="center", va="bottom",
                    fontsize=8.5, fontweight="bold" if ratio is not None else "normal")
    top = max(max(values) for _, values, _ in series)
    ax.set_ylim(0, 1e3 * top * 1.2 or 1.0)
    ax.set_xticks(x, ticks)
    ax.set_xlabel("chunk size (tokens), or whole prompts")
    ax.set_ylabel("time to first token (ms)")
    ax.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    ax.set_title("TTFT (lower is better)", loc="left")
    fig.legend(handles=ax.containers, loc="outside lower center", ncols=len(series))
    axes = [ax]
    if ax2 is not None:
        ratios = [y[1] for y in yard]
        colors = [theme["other"] if key == CHUNKED_BASELINE else theme["accent"] for key in keys]
        ax2.bar(x, ratios, width=0.62, color=colors)
        ax2.set_ylim(0, max(ratios + [1.0]) * 1.15)
        ax2.set_xticks(x, ticks)
        ax2.set_xlabel("chunk size (tokens), or whole prompts")
        ax2.set_ylabel("output tok/s, ratio to whole prompts")
        ax2.set_title("Offline yardstick (higher is better)", loc="left")
        for xi, ratio in zip(x, ratios):
            ax2.annotate(f"{ratio:.3f}×", (xi, ratio), xytext=(0, 3), textcoords="offset points",
                         ha="center", va="bottom", fontsize=8.5)
        axes.append(ax2)
    for a in axes:
        a.set_axisbelow(True)
        a.tick_params(axis="x", length=0)
        a.grid(axis="x", visible=False)
    config = _config(data)
    what = ""
    if _is_number(config.get("long_len")):
        what = f": short requests behind a {config['long_len']:,}-token prompt"
    fig.suptitle(f"Chunked prefill{_on_hardware(data)}{what}", x=0.01, ha="left")
    return fig


def _chunked_section(res: BenchmarkResult) -> list[str] | None:
    """The workload and the ratios in two lines, the plot, one table row per setting, and the
    offline yardstick's runs folded away."""
    if _chunked_settings(res.data) is None:
        return None
    out = _chunked_headline(res.data)
    out += _plot_markdown(res, "Time to first token of the short requests and of the long one, and offline throughput, per chunk size")
    return out + _chunked_table(res.data)


def _chunked_table(data: dict) -> list[str]:
    """One row per setting (whole prompts first), then the yardstick runs in a fold-out and any
    other values of ``results``."""
    settings = _chunked_settings(data) or {}
    out = [
        ("| setting | chunk size | short TTFT p50 | short TTFT p90 | short TTFT p99 | long-request TTFT"
         " | p99 vs whole | yardstick tok/s (vs whole) |"),
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, run in settings.items():
        short = run["short_ttft_s"]
        ratio = _chunked_p99_ratio(settings, key) if key != CHUNKED_BASELINE else None
        yard = _chunked_yardstick(data, key)
        yard_cell = "—"
        if yard is not None:
            yard_cell = _number(yard[0]) + (f" ({yard[1]:.3f}×)" if yard[1] is not None else "")
        size = _chunk_size(key, run)
        cells = [
            f"`{_md_cell(key)}`",
            f"{size:,}" if size is not None else "—",
            _ms(short["p50"]),
            _ms(short["p90"]) if _is_number(short.get("p90")) else "—",
            f"**{_ms(short['p99'])}**",
            _ms(run["long_ttft_s"]) if _is_number(run.get("long_ttft_s")) else "—",
            f"**{_lower_text(ratio)}**" if ratio is not None else "—",
            yard_cell,
        ]
        out.append("| " + " | ".join(cells) + " |")
    results = data["results"]
    if _is_rows(results.get("yardstick")):
        out += ["", '??? note "Offline yardstick runs"', ""] + _indent(_results_block(results["yardstick"])) + [""]
    # The per-request lists are summarised above; the whole-prompt prefill time is in the headline.
    shown = {"settings", "yardstick", "arrivals_s"} | ({"whole_prefill_s"} if _is_number(results.get("whole_prefill_s")) else set())
    rest = {k: v for k, v in results.items() if k not in shown}
    return out + ([""] + _results_block(rest) if rest else [])


def _chunked_workload(data: dict) -> str:
    """``one 32,768-token prompt, then 64 × 128-token requests over its whole prefill (331.6 ms)``."""
    config = _config(data)
    results = data.get("results") if isinstance(data.get("results"), dict) else {}
    parts = []
    if _is_number(config.get("long_len")):
        parts.append(f"one {config['long_len']:,}-token prompt")
    if _is_number(config.get("num_short")) and _is_number(config.get("short_len")):
        short = f"{config['num_short']:,} × {config['short_len']:,}-token requests"
        if _is_number(results.get("whole_prefill_s")):
            short += f" over its whole prefill ({_ms(results['whole_prefill_s'])})"
        parts.append(short)
    return ", then ".join(parts)


def _chunked_headline(data: dict) -> list[str]:
    """The workload on one line; on the next, the ratios against whole prompts: the short
    requests' p99 TTFT per chunk size, and the offline yardstick's throughput."""
    config = _config(data)
    parts = _setup_parts(config)
    if _chunked_workload(data):
        parts.append(_chunked_workload(data))
    if _is_number(config.get("output_len")):
        parts.append(f"{config['output_len']:,}-token answers")
    if _is_number(config.get("repeats")):
        parts.append(f"{config['repeats']} measured repeats")
    if config.get("dummy_weights"):
        parts.append("random weights")
    out = [" · ".join(parts), ""] if parts else []
    settings = _chunked_settings(data)
    if settings is None:
        return out
    chunks = [key for key in settings if key != CHUNKED_BASELINE]
    p99 = []
    for key in chunks:
        ratio = _chunked_p99_ratio(settings, key)
        if ratio is not None:
            p99.append(f"**{_lower_text(ratio)}** at {_chunk_label(key, settings[key])}")
    yards = [(key, _chunked_yardstick(data, key)) for key in chunks]
    line = []
    if p99:
        line.append("short-request p99 TTFT " + ", ".join(p99))
    if yards and all(y is not None and y[1] is not None for _, y in yards):
        line.append("offline yardstick throughput " + ", ".join(
            f"**{y[1]:.3f}×** at {_chunk_label(key, settings[key])}" for key, y in yards))
    return out + (["Against whole prompts: " + "; ".join(line) + ".", ""] if line else [])


def _chunked_comparison() -> str:
    """The Benchmarks page's side-by-side table of every chunked result: one row per chunk size,
    the file's model, hardware, workload and link on its first row."""
    rows = []
    for res in _state.get("benchmarks", []):
        settings = _chunked_settings(res.data) if res.name == "chunked" else None
        if settings is None:
            continue
        whole_p99 = settings[CHUNKED_BASELINE]["short_ttft_s"]["p99"]
        first = [_model_and_hardware(res.data), _md_cell(_chunked_workload(res.data) or "—")]
        link = _file_link(res.rel, posixpath.basename(res.rel))
        for key, run in settings.items():
            if key == CHUNKED_BASELINE:
                continue
            ratio = _chunked_p99_ratio(settings, key)
            yard = _chunked_yardstick(res.data, key)
            cells = first + [
                _chunk_label(key, run),
                f"{whole_p99 * 1e3:,.1f} → {_ms(run['short_ttft_s']['p99'])}",
                f"**{_lower_text(ratio)}**" if ratio is not None else "—",
                f"{yard[1]:.3f}×" if yard is not None and yard[1] is not None else "—",
                link,
            ]
            rows.append("| " + " | ".join(cells) + " |")
            first, link = ["", ""], ""
    if not rows:
        return "_No chunked-prefill results committed yet._\n"
    head = [
        ("| model, hardware | workload | chunk size | short-request p99 TTFT, whole → chunked"
         " | p99 vs whole | yardstick tok/s vs whole | file |"),
        "|---|---|---:|---:|---:|---:|---|",
    ]
    return "\n".join(head + rows) + "\n"


# --------------------------------------------------------------------------------------------
# overlap: overlap scheduling off and on (lesson 7): a traced timeline, batch-size-1 decode and
# the offline yardstick
# --------------------------------------------------------------------------------------------

OVERLAP_RUNS = (("overlap_off", "overlap off"), ("overlap_on", "overlap on"))  # (results key, label)
# (key of a traced step, lane label), top to bottom: the host's three parts of a step, then the
# device's work (traced on CUDA only).
TIMELINE_LANES = (
    ("schedule", "host: schedule"),
    ("launch", "host: launch"),
    ("process", "host: process"),
    ("device", "device"),
)
TIMELINE_MIN_WIDTH = 0.004  # spans shorter than this share of the time axis are drawn this wide


def _span(v: Any) -> tuple[float, float] | None:
    """``(start, end)`` of a ``[start, end]`` pair of numbers, or None."""
    if isinstance(v, (list, tuple)) and len(v) == 2 and all(_is_number(x) for x in v) and v[1] >= v[0]:
        return float(v[0]), float(v[1])
    return None


def _overlap_timeline(data: dict) -> dict[str, list[dict[str, tuple[float, float]]]] | None:
    """``{"overlap_off": steps, "overlap_on": steps}``, each step ``{lane: (start ms, end ms)}``
    with its well-formed spans; None unless both runs have a traced step."""
    results = data.get("results")
    timeline = results.get("timeline") if isinstance(results, dict) else None
    steps = timeline.get("steps") if isinstance(timeline, dict) else None
    if not isinstance(steps, dict):
        return None
    out = {}
    for key, _ in OVERLAP_RUNS:
        traced = steps.get(key)
        kept = []
        for step in traced if isinstance(traced, list) else []:
            if isinstance(step, dict):
                spans = {lane: _span(step.get(lane)) for lane, _ in TIMELINE_LANES}
                if any(spans.values()):
                    kept.append({lane: s for lane, s in spans.items() if s is not None})
        if not kept:
            return None
        out[key] = kept
    return out


def _step_start(step: dict[str, tuple[float, float]]) -> float:
    return min(s[0] for s in step.values())


def _step_period(steps: list[dict[str, tuple[float, float]]]) -> float:
    """ms per step: from the first step's start to the last one's, over the steps in between (the
    last step's end is no measure with overlap on: its process waits for a launch not traced)."""
    if len(steps) >= 2:
        return (_step_start(steps[-1]) - _step_start(steps[0])) / (len(steps) - 1)
    return max(s[1] for s in steps[0].values()) - _step_start(steps[0])


def _timeline_end_per_step(steps: list[dict[str, tuple[float, float]]]) -> float:
    """The last process end (else the last end of any span) over the number of steps."""
    ends = [step["process"][1] for step in steps if "process" in step]
    end = ends[-1] if ends else max(s[1] for step in steps for s in step.values())
    return (end - _step_start(steps[0])) / len(steps)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _timeline_stats(steps: list[dict[str, tuple[float, float]]]) -> dict[str, float | None]:
    """Mean length of each lane's spans, and the device's mean idle gap between two steps."""
    stats = {lane: _mean([step[lane][1] - step[lane][0] for step in steps if lane in step]) for lane, _ in TIMELINE_LANES}
    device = [step["device"] for step in steps if "device" in step]
    stats["device_gap"] = _mean([b[0] - a[1] for a, b in zip(device, device[1:])]) if len(device) >= 2 else None
    return stats


def _timeline_meta(data: dict) -> dict:
    results = data.get("results")
    timeline = results.get("timeline") if isinstance(results, dict) else None
    return timeline if isinstance(timeline, dict) else {}


def _timeline_workload(data: dict) -> str:
    """``32 decoding requests with 256-token prompts (tiny)``, from the timeline's own keys."""
    meta = _timeline_meta(data)
    text = f"{meta['requests']:,} decoding requests" if _is_number(meta.get("requests")) else "decoding requests"
    if _is_number(meta.get("prompt_len")):
        text += f" with {meta['prompt_len']:,}-token prompts"
    if meta.get("shape"):
        text += f" ({meta['shape']})"
    return text


def _draw_overlap(data: dict, theme: dict[str, Any]):
    """The traced timeline: one panel per run (overlap off above, on below) on one time axis,
    a lane per part of a step (the host's schedule, launch and process, the device's work),
    one bar per step in it, every other step in a lighter shade."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    timeline = _overlap_timeline(data)
    if timeline is None:
        return None
    lanes = [(lane, label) for lane, label in TIMELINE_LANES
             if any(lane in step for steps in timeline.values() for step in steps)]
    colors = {lane: theme["series"][i % len(theme["series"])] for i, (lane, _) in enumerate(TIMELINE_LANES)}
    start = min(_step_start(steps[0]) for steps in timeline.values())
    end = max(s[1] for steps in timeline.values() for step in steps for s in step.values())
    min_width = TIMELINE_MIN_WIDTH * (end - start or 1.0)
    fig = Figure(figsize=(PLOT_WIDTH_IN, 1.5 + 2 * (0.34 * len(lanes) + 0.45)), layout="constrained")
    axes = fig.subplots(2, 1, sharex=True)
    for ax, (key, label) in zip(axes, OVERLAP_RUNS):
        steps = timeline[key]
        for row, (lane, _) in enumerate(lanes):
            for i, step in enumerate(steps):
                if lane in step:
                    t0, t1 = step[lane]
                    ax.broken_barh([(t0, max(t1 - t0, min_width))], (row - 0.36, 0.72),
                                   color=colors[lane], alpha=1.0 if i % 2 == 0 else 0.5, linewidth=0)
        _label_rows(ax, [lane_label for _, lane_label in lanes])
        ax.set_title(f"{label}: {_number(_step_period(steps), 'ms')} per step ({len(steps)} traced steps)", loc="left")
    axes[0].set_xlim(start, start + (end - start) * 1.01 or 1.0)
    axes[-1].xaxis.set_major_locator(MaxNLocator(12))
    axes[-1].set_xlabel("time since the first traced step started (ms)")
    fig.suptitle(f"Overlap scheduling{_on_hardware(data)}: {_timeline_workload(data)}", x=0.01, ha="left")
    return fig


def _decode_runs(data: dict, runs: tuple = OVERLAP_RUNS) -> dict[str, dict] | None:
    """``results.decode``: the shapes with a numeric ms per token with both settings of ``runs``
    (``(off key, label), (on key, label)``: overlap's by default)."""
    results = data.get("results")
    decode = results.get("decode") if isinstance(results, dict) else None
    if not isinstance(decode, dict):
        return None
    usable = {shape: run for shape, run in decode.items()
              if isinstance(run, dict) and all(_is_number(run.get(key)) for key, _ in runs)}
    return usable or None


def _overlap_decode(data: dict) -> dict[str, dict] | None:
    """``results.decode``: the shapes with a numeric ms per token with overlap off and on."""
    return _decode_runs(data, OVERLAP_RUNS)


def _decode_speedup(run: dict, runs: tuple = OVERLAP_RUNS) -> float | None:
    """ms per token off over on (above 1: on is faster): the file's, else computed."""
    if _is_number(run.get("speedup")):
        return float(run["speedup"])
    (off, _), (on, _) = runs
    return run[off] / run[on] if run[on] else None


def _decode_fraction(run: dict, runs: tuple = OVERLAP_RUNS) -> float | None:
    """The roofline's ms per token over the measured one with the setting on: the file's, else computed."""
    if _is_number(run.get("fraction_of_roofline")):
        return float(run["fraction_of_roofline"])
    on = runs[1][0]
    if _is_number(run.get("roofline_ms")) and run[on]:
        return run["roofline_ms"] / run[on]
    return None


def _bytes(n: float) -> str:
    """``1.22 GB``, ``698 kB``: a byte count in decimal units."""
    for size, unit in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:,.0f} B"


def _overlap_yardstick(data: dict) -> dict[str, Any] | None:
    """The offline yardstick with overlap off and on (see :func:`_paired_yardstick`)."""
    return _paired_yardstick(data, OVERLAP_RUNS)


def _paired_yardstick(data: dict, runs: tuple) -> dict[str, Any] | None:
    """The offline yardstick of a setting off and on (``runs``: ``(off key, label), (on key,
    label)``): ``{"pairs": [(off run, on run, on/off ratio)], "median": ratio}``.

    Newer files hold a list of runs per setting (repeats interleaved), ``speedups`` (one ratio
    per repeat) and ``speedup`` (their median); older ones a single run per setting and its
    ``speedup``. A ratio the file lacks is computed from ``output_tok_s``. None without runs
    and without a ratio."""
    results = data.get("results")
    yard = results.get("yardstick") if isinstance(results, dict) else None
    if not isinstance(yard, dict):
        return None
    measured = []
    for key, _ in runs:
        value = yard.get(key)
        value = [value] if isinstance(value, dict) else value
        measured.append([r for r in value if isinstance(r, dict)] if isinstance(value, list) else [])
    given = yard.get("speedups") if isinstance(yard.get("speedups"), list) else []
    pairs = []
    for i, (off, on) in enumerate(zip(*measured)):
        ratio = None
        if i < len(given) and _is_number(given[i]):
            ratio = float(given[i])
        elif _is_number(off.get("output_tok_s")) and _is_number(on.get("output_tok_s")) and off["output_tok_s"]:
            ratio = on["output_tok_s"] / off["output_tok_s"]
        pairs.append((off, on, ratio))
    if len(pairs) == 1 and _is_number(yard.get("speedup")) and "speedups" not in yard:
        pairs[0] = (*pairs[0][:2], float(yard["speedup"]))  # an older file: its one ratio
    median = float(yard["speedup"]) if _is_number(yard.get("speedup")) else None
    ratios = sorted(r for _, _, r in pairs if r is not None)
    if median is None and ratios:
        mid = len(ratios) // 2
        median = ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2
    if not pairs and median is None:
        return None
    return {"pairs": pairs, "median": median}


def _ratio(v: float | None, bold: bool = False) -> str:
    """``1.027×``: three decimals, as overlap's effects are often a few per cent (``—`` for None)."""
    if v is None:
        return "—"
    return f"**{v:.3f}×**" if bold else f"{v:.3f}×"


def _overlap_section(res: BenchmarkResult) -> list[str] | None:
    """The workload and the ratios, the timeline with its caption and per-run means, the
    batch-size-1 decode table and the yardstick's repeats; None when the file has none of them."""
    data = res.data
    timeline, decode, yard = _overlap_timeline(data), _overlap_decode(data), _overlap_yardstick(data)
    if timeline is None and decode is None and yard is None:
        return None
    out = _overlap_headline(data)
    if timeline is not None:
        out += _plot_markdown(res, "Timeline of traced decode steps with overlap scheduling off and on: host and device lanes")
        out += _timeline_caption(timeline) + _timeline_table(timeline)
    if decode is not None:
        out += ["", "**Decode at batch size 1**, ms per output token:", ""] + _decode_table(data, decode)
    if yard is not None:
        out += ["", "**Offline yardstick**, output tokens per second with overlap off and on:", ""]
        out += _yardstick_table(yard)
    results = data["results"]
    shown = {"timeline", "copy_bandwidth_bytes_s"}
    shown |= {"decode"} if decode is not None else set()
    shown |= {"yardstick"} if yard is not None else set()
    rest = {k: v for k, v in results.items() if k not in shown}
    return out + ([""] + _results_block(rest) if rest else [])


def _timeline_caption(timeline: dict[str, list]) -> list[str]:
    periods = [f"{label} **{_number(_step_period(timeline[key]), 'ms')}** per step" for key, label in OVERLAP_RUNS]
    device = any("device" in step for steps in timeline.values() for step in steps)
    return [
        "Each bar is one part of one traced decode step, every other step in a lighter shade; "
        + ("the device lane is the GPU's work for the step. " if device else "no device lane: the run traced none (CPU). ")
        + "Measured " + ", ".join(periods) + " (one step's start to the next, averaged). "
        "Spans too short to see are drawn as thin ticks.",
        "",
    ]


def _timeline_table(timeline: dict[str, list]) -> list[str]:
    device = any("device" in step for steps in timeline.values() for step in steps)
    head = "| | traced steps | ms per step | last process end / steps | schedule | launch | process |"
    align = "|---|---:|---:|---:|---:|---:|---:|"
    if device:
        head += " device busy | device idle between steps |"
        align += "---:|---:|"
    out = [head, align]
    for key, label in OVERLAP_RUNS:
        steps = timeline[key]
        stats = _timeline_stats(steps)
        cells = [label, str(len(steps)), f"**{_number(_step_period(steps), 'ms')}**",
                 _number(_timeline_end_per_step(steps), "ms")]
        keys = ["schedule", "launch", "process"] + (["device", "device_gap"] if device else [])
        cells += [_number(stats[k], "ms") if stats[k] is not None else "—" for k in keys]
        out.append("| " + " | ".join(cells) + " |")
    return out + ["", "The lane columns are each part's mean length per step."]


def _decode_table(data: dict, decode: dict[str, dict], runs: tuple = OVERLAP_RUNS, feature: str = "overlap") -> list[str]:
    """One row per shape: ms per token off and on (``runs``), the speed-up with ``feature``, the
    bytes read per step and the roofline."""
    (off, off_label), (on, on_label) = runs
    out = [
        f"| shape | {off_label} | {on_label} | speed-up with {feature} | bytes read per step | roofline | share of the roofline |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for shape, run in decode.items():
        fraction = _decode_fraction(run, runs)
        cells = [
            _md_cell(str(shape)),
            _number(run[off], "ms"),
            _number(run[on], "ms"),
            _ratio(_decode_speedup(run, runs), bold=True),
            _bytes(run["bytes_per_step"]) if _is_number(run.get("bytes_per_step")) else "—",
            _number(run["roofline_ms"], "ms") if _is_number(run.get("roofline_ms")) else "—",
            f"{fraction:.1%}" if fraction is not None else "—",
        ]
        out.append("| " + " | ".join(cells) + " |")
    return out + _roofline_note(data, "bytes read per step", on_label)


def _roofline_note(data: dict, what: str, on_label: str) -> list[str]:
    """The note under a decode table: the roofline is ``what`` over the copy bandwidth of the
    run, its share taken with ``on_label``; or that the run measured no bandwidth."""
    bandwidth = data["results"].get("copy_bandwidth_bytes_s")
    if _is_number(bandwidth) and bandwidth > 0:
        return ["", f"Roofline: {what} over the device copy bandwidth measured in the same run "
                f"({_number(bandwidth / 1e12, 'TB/s')}); the share is the roofline over the time with {on_label}."]
    return ["", "No roofline: the run measured no device copy bandwidth."]


def _yardstick_table(yard: dict[str, Any], runs: tuple = OVERLAP_RUNS, names: tuple[str, str] = ("off", "on")) -> list[str]:
    """One row per repeat (each setting's tok/s and their ratio), the median, and the runs folded
    away (``names``: the two settings' short names in the header)."""
    pairs, median = yard["pairs"], yard["median"]
    (_, off_label), (_, on_label) = runs
    off_name, on_name = names
    out = [f"| repeat | {off_label} | {on_label} | {on_name} / {off_name} | KV pages ({off_name}, {on_name}) |",
           "|---|---:|---:|---:|---:|"]

    def tok_s(run: dict) -> str:
        return _number(run["output_tok_s"], "tok/s") if _is_number(run.get("output_tok_s")) else "—"

    for i, (off, on, ratio) in enumerate(pairs, 1):
        pages = ", ".join(_fmt(run["kv_pages"]) if _is_number(run.get("kv_pages")) else "—" for run in (off, on))
        out.append(f"| {i} | {tok_s(off)} | {tok_s(on)} | {_ratio(ratio, bold=len(pairs) == 1)} | {pages} |")
    if median is not None and len(pairs) != 1:  # one run (an older file): its ratio is the result
        out.append(f"| median | | | {_ratio(median, bold=True)} | |")
    rows = [{"setting": label, "repeat": i, **pair[side]}
            for side, (_, label) in enumerate(runs) for i, pair in enumerate(pairs, 1)]
    if rows:
        out += ["", '??? note "Offline yardstick runs"', ""] + _indent(_rows_table(rows)) + [""]
    return out


def _decode_workload(config: dict[str, Any]) -> str | None:
    """``batch-size-1 decode: 256 tokens after a 128-token prompt``, from a config."""
    if _is_number(config.get("decode_prompt_len")) and _is_number(config.get("decode_tokens")):
        return f"batch-size-1 decode: {config['decode_tokens']:,} tokens after a {config['decode_prompt_len']:,}-token prompt"
    return None


def _yardstick_workload(config: dict[str, Any]) -> str | None:
    """``offline yardstick: 256 requests, input and output lengths 100–1,024 tokens (qwen3-0.6b)``."""
    yard = []
    if _is_number(config.get("yardstick_requests")):
        yard.append(f"{config['yardstick_requests']:,} requests,")
    lens = re.fullmatch(r"\s*(\d+)\s*,\s*(\d+)\s*", str(config.get("yardstick_len", "")))
    if lens:
        yard.append(f"input and output lengths {int(lens.group(1)):,}–{int(lens.group(2)):,} tokens")
    if config.get("yardstick_shape"):
        yard.append(f"({_md_cell(str(config['yardstick_shape']))})")
    return "offline yardstick: " + " ".join(yard) if yard else None


def _on_off_ratios(decode: dict[str, dict] | None, yardstick: dict[str, Any] | None, runs: tuple) -> list[str]:
    """The on/off ratios of a headline: batch-size-1 decode per shape, the yardstick's median."""
    line = []
    if decode is not None:
        speedups = [(shape, _decode_speedup(run, runs)) for shape, run in decode.items()]
        line.append("batch-size-1 decode " + ", ".join(
            f"{_ratio(s, bold=True)} ({_md_cell(str(shape))})" for shape, s in speedups if s is not None))
    if yardstick is not None and yardstick["median"] is not None:
        n = len(yardstick["pairs"])
        line.append(f"offline yardstick {_ratio(yardstick['median'], bold=True)}"
                    + (f" (median of {n} repeats)" if n > 1 else " (one run)" if n == 1 else ""))
    return line


def _overlap_headline(data: dict) -> list[str]:
    """The workloads on one line; on the next, overlap on against off in each measurement."""
    config = _config(data)
    parts = _setup_parts(config)
    if _overlap_timeline(data) is not None:
        parts.append("timeline: " + _timeline_workload(data))
    parts += [w for w in (_decode_workload(config), _yardstick_workload(config)) if w]
    out = [" · ".join(parts), ""] if parts else []

    line = []
    timeline = _overlap_timeline(data)
    if timeline is not None:
        off, on = (_step_period(timeline[key]) for key, _ in OVERLAP_RUNS)
        line.append(f"timeline {_number(off)} → {_number(on, 'ms')} per step")
    line += _on_off_ratios(_overlap_decode(data), _overlap_yardstick(data), OVERLAP_RUNS)
    return out + (["Overlap on against off: " + "; ".join(line) + ".", ""] if line else [])


# --------------------------------------------------------------------------------------------
# host: host time per decode step (lesson 7): the scheduler's, per load and tree, and a profile
# of one decode step at batch size 1
# --------------------------------------------------------------------------------------------

HOST_SETTINGS = {"overlap_off": "overlap off", "overlap_on": "overlap on", "synchronous": "synchronous"}


def _host_scheduler(data: dict) -> list[dict[str, Any]] | None:
    """One entry per measured (tree, load, setting) with a numeric ``schedule_ms`` and
    ``process_ms``: ``{"tree", "path", "load", "setting", "schedule_ms", "process_ms", "run"}``."""
    results = data.get("results")
    scheduler = results.get("scheduler") if isinstance(results, dict) else None
    if not isinstance(scheduler, dict):
        return None
    found = []
    for tree, loads in scheduler.items():
        if not isinstance(loads, dict):
            continue
        path = loads.get("tree") if isinstance(loads.get("tree"), str) else None
        for load, settings in loads.items():
            if load == "tree" or not isinstance(settings, dict):
                continue
            for setting, run in settings.items():
                if isinstance(run, dict) and _is_number(run.get("schedule_ms")) and _is_number(run.get("process_ms")):
                    found.append({"tree": str(tree), "path": path, "load": str(load), "setting": str(setting),
                                  "schedule_ms": float(run["schedule_ms"]), "process_ms": float(run["process_ms"]),
                                  "run": run})
    return found or None


def _load_label(load: str) -> str:
    """``32 × 1,024``: a ``32x1024`` load (requests × prompt length)."""
    m = re.fullmatch(r"(\d+)x(\d+)", load)
    return f"{int(m.group(1)):,} × {int(m.group(2)):,}" if m else load


def _host_series_label(tree: str, setting: str) -> str:
    """``this tree, overlap on``; a compared tree named by the last part of its path."""
    if tree.startswith("compare: "):
        tree = "compare: " + (posixpath.basename(tree[len("compare: "):].rstrip("/")) or tree[len("compare: "):])
    return f"{tree}, {HOST_SETTINGS.get(setting, setting)}"


def _host_profile(data: dict) -> dict[str, Any] | None:
    """``results.bs1_profile`` with its usable rows, each ``(depth, label, ms per step, calls
    per step or None)`` (depth: the label's leading spaces, two per level); None without rows."""
    results = data.get("results")
    profile = results.get("bs1_profile") if isinstance(results, dict) else None
    rows = profile.get("rows") if isinstance(profile, dict) else None
    if not isinstance(rows, list):
        return None
    kept = []
    for row in rows:
        if isinstance(row, dict) and isinstance(row.get("what"), str) and _is_number(row.get("ms_per_step")):
            what = row["what"]
            depth = (len(what) - len(what.lstrip(" "))) // 2
            calls = float(row["calls_per_step"]) if _is_number(row.get("calls_per_step")) else None
            kept.append((depth, what.strip(), float(row["ms_per_step"]), calls))
    if not kept:
        return None
    return {
        "rows": kept,
        "profiled": float(profile["profiled_ms_per_step"]) if _is_number(profile.get("profiled_ms_per_step")) else None,
        "unprofiled": float(profile["unprofiled_ms_per_token"]) if _is_number(profile.get("unprofiled_ms_per_token")) else None,
        "tokens": profile.get("tokens") if _is_number(profile.get("tokens")) else None,
    }


def _draw_host_scheduler(fig, entries: list[dict[str, Any]], theme: dict[str, Any]) -> None:
    """Grouped bars, a group per load and a bar per (tree, setting): schedule below, process
    (lighter) on top, each bar labelled with the sum."""
    from matplotlib.patches import Patch

    loads = list(dict.fromkeys(e["load"] for e in entries))
    series = list(dict.fromkeys((e["tree"], e["setting"]) for e in entries))
    by_key = {(e["load"], e["tree"], e["setting"]): e for e in entries}
    colors = {s: theme["series"][i % len(theme["series"])] for i, s in enumerate(series)}
    ax = fig.subplots()
    width = min(0.76 / len(series), 0.22)  # one load alone does not get bars as wide as the plot
    top = 0.0
    for i, s in enumerate(series):
        for xi, load in enumerate(loads):
            e = by_key.get((load, *s))
            if e is None:
                continue
            x = xi + (i - (len(series) - 1) / 2) * width
            total = e["schedule_ms"] + e["process_ms"]
            ax.bar(x, e["schedule_ms"], width=width * 0.92, color=colors[s])
            ax.bar(x, e["process_ms"], bottom=e["schedule_ms"], width=width * 0.92, color=colors[s], alpha=0.45)
            ax.annotate(_number(total), (x, total), xytext=(0, 3), textcoords="offset points",
                        ha="center", va="bottom", fontsize=8.5)
            top = max(top, total)
    ax.set_ylim(0, top * 1.18 or 1.0)
    ax.set_xlim(-0.5, len(loads) - 0.5)
    ax.set_xticks(range(len(loads)), [_load_label(load) for load in loads])
    ax.set_xlabel("load: decoding requests × prompt tokens")
    ax.set_ylabel("host ms per decode step")
    ax.set_axisbelow(True)
    ax.tick_params(axis="x", length=0)
    ax.grid(axis="x", visible=False)
    ax.set_title("Scheduler host time per decode step (lower is better)", loc="left")
    handles = [Patch(color=colors[s], label=_host_series_label(*s)) for s in series]
    handles += [Patch(color=theme["muted"], label="schedule"), Patch(color=theme["muted"], alpha=0.45, label="process (on top)")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def _draw_host_profile(fig, profile: dict[str, Any], theme: dict[str, Any]) -> None:
    """Horizontal bars of ms per step: the whole step first (profiled, and not profiled when
    the file has it), then one bar per profiled part, its label indented by depth."""
    wholes = [(label, ms) for label, ms in (("whole step, profiled", profile["profiled"]),
                                            ("whole step, not profiled", profile["unprofiled"])) if ms]
    rows = [(0, label, ms, None) for label, ms in wholes] + profile["rows"]
    labels_ax, ax = fig.subplots(1, 2, sharey=True, gridspec_kw={"width_ratios": [1, 1.9], "wspace": 0.0})
    y = list(range(len(rows)))
    values = [ms for _, _, ms, _ in rows]
    bars = ax.barh(y, values, height=0.66, color=theme["accent"])
    for i, (bar, (depth, _, _, _)) in enumerate(zip(bars, rows)):
        if i < len(wholes):
            bar.set_color(theme["other"])
        else:
            bar.set_alpha(max(1.0 - 0.3 * depth, 0.3))  # a part inside another in a lighter shade
    ax.set_ylim(len(rows) - 0.5, -0.5)
    labels_ax.axis("off")
    for i, (yi, (depth, label, _, _)) in enumerate(zip(y, rows)):
        whole = i < len(wholes)
        labels_ax.text(0.02 + 0.07 * depth, yi, label, transform=labels_ax.get_yaxis_transform(), va="center",
                       ha="left", fontweight="bold" if depth == 0 and not whole else "normal",
                       color=theme["muted"] if whole else theme["fg"])
    for yi, value in zip(y, values):
        ax.annotate(_number(value, "ms"), (value, yi), xytext=(4, 0), textcoords="offset points", va="center", fontsize=8.5)
    ax.set_xlim(0, max(values) * 1.14 or 1.0)
    ax.tick_params(axis="y", length=0, labelleft=False)
    ax.grid(axis="y", visible=False)
    ax.spines["left"].set_visible(False)
    ax.set_xlabel("ms per decode step at batch size 1")
    ax.set_axisbelow(True)
    labels_ax.set_title("One decode step at batch size 1, by part (indented: inside the part above)", loc="left")


def _label_rows(ax: Any, labels: list[str]) -> None:
    """A horizontal chart's rows: ``labels`` top to bottom on the y axis (rows at 0, 1, ...),
    no y ticks, grid lines or left spine, the grid behind the bars."""
    ax.set_yticks(range(len(labels)), labels)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.set_axisbelow(True)
    ax.tick_params(axis="y", length=0)
    ax.grid(axis="y", visible=False)
    ax.spines["left"].set_visible(False)


def _stacked_figure(parts: list[tuple[float, Any]], title: str) -> Any:
    """One matplotlib figure of panels stacked top to bottom: ``parts`` is ``[(height in inches,
    draw)]``, each ``draw(panel)`` filling its panel (the figure itself when there is only one)."""
    from matplotlib.figure import Figure

    heights = [height for height, _ in parts]
    fig = Figure(figsize=(PLOT_WIDTH_IN, sum(heights) + 0.4), layout="constrained")
    panels = list(fig.subfigures(len(parts), 1, height_ratios=heights)) if len(parts) > 1 else [fig]
    for panel, (_, draw) in zip(panels, parts):
        draw(panel)
    fig.suptitle(title, x=0.01, ha="left")
    return fig


def _draw_host(data: dict, theme: dict[str, Any]):
    """The scheduler's host ms per decode step per load (above) and the profile of one
    batch-size-1 decode step (below); either alone when the file has only one of them."""
    entries, profile = _host_scheduler(data), _host_profile(data)
    if entries is None and profile is None:
        return None
    parts = []
    if entries is not None:
        parts.append((3.0, lambda panel: _draw_host_scheduler(panel, entries, theme)))
    if profile is not None:
        parts.append((0.9 + 0.27 * len(profile["rows"]), lambda panel: _draw_host_profile(panel, profile, theme)))
    return _stacked_figure(parts, f"Host time per decode step{_on_hardware(data)}")


def _host_section(res: BenchmarkResult) -> list[str] | None:
    """The workload and the totals, the plot, the scheduler table and the profile table."""
    data = res.data
    entries, profile = _host_scheduler(data), _host_profile(data)
    if entries is None and profile is None:
        return None
    out = _host_headline(data)
    out += _plot_markdown(res, "Scheduler host time per decode step per load, and a profile of one batch-size-1 decode step")
    if entries is not None:
        out += ["**Scheduler host time per decode step**, mean over the decode steps of each run:", ""]
        out += _host_scheduler_table(entries)
    if profile is not None:
        out += ([""] if entries is not None else []) + ["**One decode step at batch size 1, profiled by part:**", ""]
        out += _host_profile_table(profile)
    results = data["results"]
    shown = ({"scheduler"} if entries is not None else set()) | ({"bs1_profile"} if profile is not None else set())
    rest = {k: v for k, v in results.items() if k not in shown}
    return out + ([""] + _results_block(rest) if rest else [])


def _host_scheduler_table(entries: list[dict[str, Any]]) -> list[str]:
    out = [
        "| tree | load | setting | decode steps | schedule | process | host total |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for e in entries:
        # "compare: <path>" names the tree already
        shown = e["path"] and posixpath.basename(e["path"].rstrip("/")) not in e["tree"]
        tree = _md_cell(e["tree"]) + (f" (`{_md_cell(e['path'])}`)" if shown else "")
        steps = e["run"].get("decode_steps")
        cells = [
            tree,
            _load_label(e["load"]),
            HOST_SETTINGS.get(e["setting"], _md_cell(e["setting"])),
            _fmt(steps) if _is_number(steps) else "—",
            _number(e["schedule_ms"], "ms"),
            _number(e["process_ms"], "ms"),
            f"**{_number(e['schedule_ms'] + e['process_ms'], 'ms')}**",
        ]
        out.append("| " + " | ".join(cells) + " |")
    return out + ["", "Load: decoding requests × prompt tokens."]


def _host_profile_table(profile: dict[str, Any]) -> list[str]:
    total = profile["profiled"]
    out = ["| part of the step | ms per step | calls per step | share of the profiled step |", "|---|---:|---:|---:|"]
    for depth, label, ms, calls in profile["rows"]:
        indent = "&nbsp;" * 6 * depth + ("└ " if depth else "")
        name = _md_cell(label) if depth else f"**{_md_cell(label)}**"
        share = f"{ms / total:.1%}" if total else "—"
        out.append(f"| {indent}{name} | {_number(ms, 'ms')} | {_number(calls) if calls is not None else '—'} | {share} |")
    if total:
        out.append(f"| whole step, profiled | **{_number(total, 'ms')}** | | 100% |")
    if profile["unprofiled"]:
        out.append(f"| whole step, not profiled (ms per token) | **{_number(profile['unprofiled'], 'ms')}** | | |")
    return out


def _host_headline(data: dict) -> list[str]:
    """The setup and the loads on one line; on the next, the host total of each series per load
    and the batch-size-1 step."""
    config = _config(data)
    parts = [f"**{_md_cell(str(config['shape']))}**"] if config.get("shape") else []
    parts += _setup_parts(config)
    entries, profile = _host_scheduler(data), _host_profile(data)
    if entries is not None:
        parts.append("loads " + ", ".join(_load_label(load) for load in dict.fromkeys(e["load"] for e in entries))
                     + " (decoding requests × prompt tokens)")
    if _is_number(config.get("new_tokens")):
        parts.append(f"{config['new_tokens']:,} new tokens per request")
    if profile is not None and profile["tokens"]:
        parts.append(f"batch-size-1 profile over {profile['tokens']:,} tokens")
    out = [" · ".join(parts), ""] if parts else []
    lines, per_load = [], []
    for load in dict.fromkeys(e["load"] for e in entries or []):
        totals = [f"**{_number(e['schedule_ms'] + e['process_ms'], 'ms')}** ({_host_series_label(e['tree'], e['setting'])})"
                  for e in entries if e["load"] == load]
        per_load.append(f"at {_load_label(load)}, " + ", ".join(totals))
    if per_load:
        lines.append("Scheduler host time per decode step: " + "; ".join(per_load) + ".")
    if profile is not None and profile["unprofiled"]:
        lines.append(f"A decode step at batch size 1: **{_number(profile['unprofiled'], 'ms')}** per token, not profiled.")
    return out + ([" ".join(lines), ""] if lines else [])


# --------------------------------------------------------------------------------------------
# graphs: CUDA graphs off and on (lesson 8): batch-size-1 decode against the roofline, the
# kernels of one decode step by kind, the captured graphs and the offline yardstick
# --------------------------------------------------------------------------------------------

GRAPHS_RUNS = (("graphs_off", "graphs off"), ("graphs_on", "graphs on"))  # (results key, label)
BUCKETS_SHOWN = 8  # a longer list of captured batch sizes is shortened to its first and last ones


def _graphs_decode(data: dict) -> dict[str, dict] | None:
    """``results.decode``: the shapes with a numeric ms per token with graphs off and on."""
    return _decode_runs(data, GRAPHS_RUNS)


def _graphs_yardstick(data: dict) -> dict[str, Any] | None:
    """The offline yardstick with graphs off and on (see :func:`_paired_yardstick`)."""
    return _paired_yardstick(data, GRAPHS_RUNS)


def _kernel_profile(value: Any) -> dict[str, Any] | None:
    """One profiled decode step: ``{"kernels": kernels per step or None, "us": device µs per
    step, "kinds": {kind: (kernels per step or None, µs per step)}}``; None without a kind that
    has a numeric ``us_per_step``."""
    by_kind = value.get("by_kind") if isinstance(value, dict) else None
    if not isinstance(by_kind, dict):
        return None
    kinds = {
        str(kind): (float(v["kernels_per_step"]) if _is_number(v.get("kernels_per_step")) else None, float(v["us_per_step"]))
        for kind, v in by_kind.items() if isinstance(v, dict) and _is_number(v.get("us_per_step"))
    }
    if not kinds:
        return None
    if _is_number(value.get("kernels_per_step")):
        kernels = float(value["kernels_per_step"])
    elif all(n is not None for n, _ in kinds.values()):
        kernels = sum(n for n, _ in kinds.values())
    else:
        kernels = None
    return {"kernels": kernels, "us": sum(us for _, us in kinds.values()), "kinds": kinds}


def _compared_tree(data: dict) -> str | None:
    """The path of the tree whose eager kernels were counted in the same run, if any."""
    results = data.get("results")
    compared = results.get("kernels_compared_tree") if isinstance(results, dict) else None
    tree = compared.get("tree") if isinstance(compared, dict) else None
    return tree if isinstance(tree, str) and tree else None


def _tree_name(path: str) -> str:
    """``d6784c0``: the last part of a tree's path."""
    return posixpath.basename(path.rstrip("/")) or path


COMPARED_EAGER = "compared_eager"  # the key of the compared tree's eager step in _graphs_kernels


def _graphs_kernels(data: dict) -> dict[str, list[tuple[str, str, dict[str, Any]]]] | None:
    """Per shape, ``(key, label, profile)`` of one decode step at batch size 1 (profile: see
    :func:`_kernel_profile`): the compared tree's eager step (key ``compared_eager``: before
    this tree's fused kernels), then this tree's with graphs off and on (``graphs_off``,
    ``graphs_on``); those the file has. None when no shape has one."""
    results = data.get("results")
    if not isinstance(results, dict):
        return None
    decode = results.get("decode") if isinstance(results.get("decode"), dict) else {}
    compared = results.get("kernels_compared_tree")
    eager = compared.get("eager") if isinstance(compared, dict) else None
    eager = eager if isinstance(eager, dict) else {}
    tree = _compared_tree(data)
    found = {}
    for shape in dict.fromkeys([*decode, *eager]):
        profiles = []
        before = _kernel_profile(eager.get(shape))
        if before is not None:
            profiles.append((COMPARED_EAGER, f"{_tree_name(tree) if tree else 'compared tree'}, eager", before))
        run = decode.get(shape) if isinstance(decode.get(shape), dict) else {}
        for key, label in GRAPHS_RUNS:
            profile = _kernel_profile(run.get(f"kernels_{key}"))
            if profile is not None:
                profiles.append((key, f"this tree, {label}", profile))
        if profiles:
            found[str(shape)] = profiles
    return found or None


def _kernel_kinds(kernels: dict[str, list[tuple[str, str, dict[str, Any]]]]) -> list[str]:
    """Every kind of kernel in the profiles, the most device time over all of them first."""
    total: dict[str, float] = {}
    for profiles in kernels.values():
        for _, _, profile in profiles:
            for kind, (_, us) in profile["kinds"].items():
                total[kind] = total.get(kind, 0.0) + us
    return sorted(total, key=lambda kind: -total[kind])


def _binary_bytes(n: float) -> str:
    """``1.15 GiB``, ``512 MiB``: a memory size in binary units."""
    for size, unit in ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:,.0f} B"


def _buckets(v: Any) -> str | None:
    """``1, 2, 4, 8``: the captured batch sizes (a long list shortened), or None."""
    if not isinstance(v, list) or not v or not all(_is_number(b) for b in v):
        return None
    if len(v) > BUCKETS_SHOWN:
        return ", ".join(_fmt(b) for b in v[: BUCKETS_SHOWN - 2]) + f", …, {_fmt(v[-1])} ({len(v)} sizes)"
    return ", ".join(_fmt(b) for b in v)


# A bar of a panel of horizontal bars: (row label, value, colour, label at its end, bold label).
Bar = tuple[str, float, str, str, bool]


def _bar_panels_height(panels: list[tuple[str, list[Bar]]]) -> float:
    """Inches for :func:`_draw_bar_panels`: a title and 0.36 in per bar for each panel."""
    return sum(0.75 + 0.36 * len(bars) for _, bars in panels) + 0.4


def _draw_bar_panels(fig, panels: list[tuple[str, list[Bar]]], xlabel: str) -> None:
    """A panel per ``(title, bars)`` on one shared value axis, each bar horizontal and labelled
    at its end (see :data:`Bar`)."""
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    top = 0.0
    for ax, (title, bars) in zip(axes, panels):
        values = [value for _, value, _, _, _ in bars]
        ax.barh(range(len(bars)), values, height=0.64, color=[color for _, _, color, _, _ in bars])
        for yi, (_, value, _, text, bold) in enumerate(bars):
            ax.annotate(text, (value, yi), xytext=(6, 0), textcoords="offset points", va="center",
                        fontsize=9, fontweight="bold" if bold else "normal")
        top = max(top, *values)
        _label_rows(ax, [label for label, _, _, _, _ in bars])
        ax.set_title(title, loc="left")
    axes[0].set_xlim(0, top * 1.45 or 1.0)  # room for the labels of the longest bars
    axes[-1].set_xlabel(xlabel)


def _roofline_bar(run: dict, fraction: float | None, theme: dict[str, Any], reach: str) -> list[Bar]:
    """The HBM roofline's bar of a decode run, labelled with the ``fraction`` of it that the
    setting named ``reach`` reaches; none without a roofline."""
    if not _is_number(run.get("roofline_ms")):
        return []
    text = _number(run["roofline_ms"], "ms")
    if fraction is not None:
        text += f"   ({reach} reach {fraction:.0%} of it)"
    return [("HBM roofline", float(run["roofline_ms"]), theme["series"][2], text, False)]


def _graphs_decode_panels(decode: dict[str, dict], theme: dict[str, Any]) -> list[tuple[str, list[Bar]]]:
    """A panel per shape: ms per token with graphs off and on (labelled with the speed-up) and
    the roofline (labelled with the share of it that graphs on reach)."""
    panels = []
    for shape, run in decode.items():
        on, speedup = _number(run["graphs_on"], "ms"), _decode_speedup(run, GRAPHS_RUNS)
        if speedup is not None:
            on += f"   →  {_faster(speedup)}"
        bars = [("graphs off (eager)", float(run["graphs_off"]), theme["other"], _number(run["graphs_off"], "ms"), False),
                ("graphs on", float(run["graphs_on"]), theme["accent"], on, True)]
        bars += _roofline_bar(run, _decode_fraction(run, GRAPHS_RUNS), theme, "graphs on")
        panels.append((f"{shape}: decode at batch size 1", bars))
    return panels


def _decode_xlabel(panels: list[tuple[str, list[Bar]]], roofline: str) -> str:
    """The axis label of decode panels; how the roofline is drawn (``roofline``: the bytes) when
    a panel has one."""
    drawn = any(label == "HBM roofline" for _, bars in panels for label, _, _, _, _ in bars)
    return "ms per output token (lower is better)" + (f"; roofline: {roofline} / copy bandwidth" if drawn else "")


def _draw_graphs_kernels(fig, kernels: dict[str, list[tuple[str, str, dict[str, Any]]]], theme: dict[str, Any]) -> None:
    """A panel per shape, a horizontal bar per profiled step (compared tree eager, graphs off,
    graphs on): device µs per step stacked by kind of kernel, labelled with the kernel count."""
    from matplotlib.patches import Patch
    from matplotlib.ticker import StrMethodFormatter

    kinds = _kernel_kinds(kernels)
    palette = list(theme["series"]) + [theme["other"]]
    # more kinds than colours: the colours again, lighter
    styles = {kind: (palette[i % len(palette)], 1.0 if i < len(palette) else 0.45) for i, kind in enumerate(kinds)}
    axes = fig.subplots(len(kernels), 1, squeeze=False)[:, 0]
    for ax, (shape, profiles) in zip(axes, kernels.items()):
        y = list(range(len(profiles)))
        for yi, (_, _, profile) in zip(y, profiles):
            left = 0.0
            for kind in kinds:
                if kind in profile["kinds"]:
                    us = profile["kinds"][kind][1]
                    color, alpha = styles[kind]
                    ax.barh(yi, us, left=left, height=0.64, color=color, alpha=alpha, linewidth=0)
                    left += us
            text = _number(profile["us"], "µs")
            if profile["kernels"] is not None:
                text = f"{_number(profile['kernels'])} kernels, {text}"
            ax.annotate(text, (left, yi), xytext=(5, 0), textcoords="offset points", va="center", fontsize=8.5)
        _label_rows(ax, [label for _, label, _ in profiles])
        ax.set_xlim(0, max(p["us"] for _, _, p in profiles) * 1.3 or 1.0)  # room for the labels
        ax.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
        ax.set_title(f"{shape}: kernels of one decode step at batch size 1, by kind", loc="left")
    axes[-1].set_xlabel("device µs per decode step (kernel time, summed)")
    labels, ncols, _ = _legend_layout(kinds)
    fig.legend(handles=[Patch(color=styles[kind][0], alpha=styles[kind][1], label=label) for kind, label in zip(kinds, labels)],
               loc="outside lower center", ncols=ncols)


LEGEND_WRAP = 36  # legend labels longer than this many characters are wrapped
# A legend entry's width (inches) at the legend's font size: per character, and per column for
# the patch and the gaps (measured on the kernel legends of the committed results).
LEGEND_CHAR_IN, LEGEND_COLUMN_IN = 0.062, 0.64


def _legend_layout(labels: list[str], max_cols: int = 4) -> tuple[list[str], int, float]:
    """A legend as wide as the plot at most: the labels wrapped at :data:`LEGEND_WRAP`, the most
    columns (up to ``max_cols``) whose estimated width fits, and the legend's height in inches."""
    wrapped = ["\n".join(textwrap.wrap(label, LEGEND_WRAP)) or label for label in labels]
    lines = [label.count("\n") + 1 for label in wrapped]
    widths = [max(len(line) for line in label.split("\n")) * LEGEND_CHAR_IN for label in wrapped]
    for ncols in range(min(max_cols, len(labels)), 0, -1):
        # matplotlib fills the columns top to bottom, the first ones one entry longer
        rows, longer = divmod(len(labels), ncols)
        sizes = [rows + 1] * longer + [rows] * (ncols - longer)
        columns = [range(sum(sizes[:c]), sum(sizes[:c + 1])) for c in range(ncols)]
        if ncols == 1 or sum(max(widths[i] for i in col) + LEGEND_COLUMN_IN for col in columns) <= PLOT_WIDTH_IN:
            break
    height = 0.3 * max(sizes) + 0.17 * max(sum(lines[i] - 1 for i in col) for col in columns)
    return wrapped, ncols, height


def _kernels_height(kernels: dict[str, list[tuple[str, str, dict[str, Any]]]]) -> float:
    """Inches for :func:`_draw_graphs_kernels`: 0.36 in per profiled step, and the legend."""
    return sum(0.75 + 0.36 * len(p) for p in kernels.values()) + _legend_layout(_kernel_kinds(kernels))[2] + 0.5


def _draw_graphs(data: dict, theme: dict[str, Any]):
    """Batch-size-1 decode per shape with graphs off and on against the roofline (above), and
    the kernels of one decode step by kind (below); either alone when the file has only one."""
    decode, kernels = _graphs_decode(data), _graphs_kernels(data)
    if decode is None and kernels is None:
        return None
    parts = []
    if decode is not None:
        panels, xlabel = _graphs_decode_panels(decode, theme), "bytes read per step"
        parts.append((_bar_panels_height(panels), lambda panel: _draw_bar_panels(panel, panels, _decode_xlabel(panels, xlabel))))
    if kernels is not None:
        parts.append((_kernels_height(kernels), lambda panel: _draw_graphs_kernels(panel, kernels, theme)))
    return _stacked_figure(parts, f"CUDA graphs off and on{_on_hardware(data)}")


def _graphs_section(res: BenchmarkResult) -> list[str] | None:
    """The workload and the ratios, the plot, the decode table with the captured graphs, the
    kernels per step by kind and the yardstick's repeats; None when the file has none of them."""
    data = res.data
    decode, kernels, yard = _graphs_decode(data), _graphs_kernels(data), _graphs_yardstick(data)
    if decode is None and kernels is None and yard is None:
        return None
    out = _graphs_headline(data)
    if decode is not None or kernels is not None:
        out += _plot_markdown(res, "Batch-size-1 decode with CUDA graphs off and on against the roofline, and the kernels of one decode step by kind")
    if decode is not None:
        out += ["**Decode at batch size 1**, ms per output token:", ""] + _decode_table(data, decode, GRAPHS_RUNS, "graphs")
        out += _captured_graphs_table(decode)
    if kernels is not None:
        out += ["", KERNELS_HEAD.format(settings=""), ""] + _graphs_kernels_table(data, kernels)
    if yard is not None:
        out += ["", "**Offline yardstick**, output tokens per second with graphs off and on:", ""]
        out += _yardstick_table(yard, GRAPHS_RUNS)
    results = data["results"]
    shown = {"copy_bandwidth_bytes_s"}
    shown |= {"decode"} if decode is not None else set()
    shown |= {"kernels_compared_tree"} if kernels is not None else set()
    shown |= {"yardstick"} if yard is not None else set()
    rest = {k: v for k, v in results.items() if k not in shown}
    return out + ([""] + _results_block(rest) if rest else [])


KERNELS_HEAD = ("**Kernels of one decode step at batch size 1**, by kind{settings}: kernels per step · device µs per "
                "step (the kernels' own time, summed; the profiler's mean over the profiled steps):")


def _captured_graphs_table(decode: dict[str, dict]) -> list[str]:
    """One row per shape with the graphs of its graphs-on run: batch sizes, memory, start-up."""
    keys = ("buckets", "graph_memory_bytes", "startup_s_with_capture")
    if not any(k in run for run in decode.values() for k in keys):
        return []
    out = ["", "**The captured graphs** of the graphs-on runs:", "",
           "| shape | captured batch sizes | graph memory | start-up with capture |", "|---|---|---:|---:|"]
    for shape, run in decode.items():
        memory, startup = run.get("graph_memory_bytes"), run.get("startup_s_with_capture")
        cells = [
            _md_cell(str(shape)),
            _buckets(run.get("buckets")) or "—",
            _binary_bytes(memory) if _is_number(memory) else "—",
            _number(startup, "s") if _is_number(startup) else "—",
        ]
        out.append("| " + " | ".join(cells) + " |")
    return out + ["", "Graph memory: the device memory the captures took (measured before the KV pool is sized); "
                  "start-up: the engine's whole start, weights and captures included. A decode batch is padded "
                  "to the next captured batch size."]


def _graphs_kernels_table(data: dict, kernels: dict[str, list[tuple[str, str, dict[str, Any]]]]) -> list[str]:
    """:func:`_kernels_table` of the graphs benchmark (each step's share of the ms per token of
    its shape and setting), then the compared tree."""
    decode = _graphs_decode(data) or {}
    out = _kernels_table(kernels, lambda shape, key: decode.get(shape, {}).get(key))
    tree = _compared_tree(data)
    if tree:
        out += ["", f"`{_md_cell(tree)}`: the tree whose eager decode step was profiled in the same run, "
                f"for the kernels before this tree's fused ones."]
    return out


def _kernels_table(kernels: dict[str, list[tuple[str, str, dict[str, Any]]]], ms_per_token) -> list[str]:
    """A table per shape: a row per kind of kernel (most device time first), a column per
    profiled step, then the totals, and the kernels' share of ``ms_per_token(shape, key)`` (the
    step's unprofiled ms per token, or None)."""
    out: list[str] = []
    kinds = _kernel_kinds(kernels)
    shares = False

    def cell(kernel_count: float | None, us: float, bold: bool = False) -> str:
        text = (f"{_number(kernel_count)} · " if kernel_count is not None else "— · ") + _number(us, "µs")
        return f"**{text}**" if bold else text

    for shape, profiles in kernels.items():
        out += ([""] if out else []) + [f"_{_md_cell(shape)}_", ""]
        out += ["| kind | " + " | ".join(_md_cell(label) for _, label, _ in profiles) + " |", "|---|" + "---:|" * len(profiles)]
        for kind in kinds:
            if any(kind in p["kinds"] for _, _, p in profiles):
                cells = [cell(*p["kinds"][kind]) if kind in p["kinds"] else "—" for _, _, p in profiles]
                out.append(f"| {_md_cell(kind)} | " + " | ".join(cells) + " |")
        out.append("| all kernels | " + " | ".join(cell(p["kernels"], p["us"], bold=True) for _, _, p in profiles) + " |")
        ms = [ms_per_token(shape, key) for key, _, _ in profiles]
        busy = [f"{p['us'] / (1e3 * m):.0%} of {_number(m, 'ms')}" if _is_number(m) and m > 0 else "—"
                for m, (_, _, p) in zip(ms, profiles)]
        if any(b != "—" for b in busy):
            out.append("| kernel time, share of the ms per token | " + " | ".join(busy) + " |")
            shares = True
    if shares:
        out += ["", "The share: the kernels' summed time over the batch-size-1 ms per token measured without "
                "the profiler (the decode table); for the rest of a token's time, none of its kernels runs on the device."]
    return out


def _graphs_headline(data: dict) -> list[str]:
    """The workloads on one line; on the next, graphs on against off, and the kernels per
    eager step before and after this tree's fused kernels."""
    config = _config(data)
    parts = _setup_parts(config)
    parts += [w for w in (_decode_workload(config), _yardstick_workload(config)) if w]
    if config.get("overlap") is True:
        parts.append("overlap scheduling on in every run")
    out = [" · ".join(parts), ""] if parts else []
    lines = []
    ratios = _on_off_ratios(_graphs_decode(data), _graphs_yardstick(data), GRAPHS_RUNS)
    if ratios:
        lines.append("CUDA graphs on against off: " + "; ".join(ratios) + ".")
    kernels = _graphs_kernels(data) or {}
    fused = []
    for shape, profiles in kernels.items():
        by_key = {key: profile for key, _, profile in profiles}
        before, after = by_key.get(COMPARED_EAGER), by_key.get("graphs_off")
        if before is not None and after is not None and before["kernels"] is not None and after["kernels"] is not None:
            fused.append(f"**{_number(before['kernels'])} → {_number(after['kernels'])}** ({_md_cell(shape)})")
    tree = _compared_tree(data)
    if fused and tree:
        lines.append(f"Kernels per eager decode step, `{_md_cell(_tree_name(tree))}` → this tree: " + ", ".join(fused) + ".")
    return out + ([" ".join(lines), ""] if lines else [])


# --------------------------------------------------------------------------------------------
# tp: tensor parallelism (lesson 9), TP=2 against TP=1 in one run: batch-size-1 decode against
# each one's roofline, the kernels of one decode step by kind, the all-reduce TP adds, a trace
# of decode steps of a large batch, and the offline yardstick
# --------------------------------------------------------------------------------------------

# (results key, label) of a TP size's batch-size-1 decode runs; the NCCL run is TP>1's only.
TP_DECODE = (
    ("graphs_off", "graphs off (eager)"),
    ("graphs_on", "graphs on"),
    ("graphs_on_nccl", "graphs on, NCCL all-reduce"),
)
# (key of an all-reduce row, label; ``{comm}``: the run's torch.distributed backend)
TP_ALL_REDUCE = (
    ("eager_us", "{comm}, eager"),
    ("graph_us", "{comm} in a CUDA graph"),
    ("symmetric_eager_us", "symmetric memory, eager"),
    ("symmetric_graph_us", "symmetric memory in a CUDA graph"),
)
TP_TRACE_PARTS = (("schedule_ms", "schedule"), ("launch_ms", "launch"), ("process_ms", "process"), ("device_ms", "device"))


def _tp_size(data: dict) -> int:
    """The TP size compared with TP=1: ``config.tp``, else 2."""
    tp = _config(data).get("tp")
    return int(tp) if _is_number(tp) and tp > 1 else 2


def _tp_runs(data: dict) -> tuple:
    """``(("tp1", "TP=1"), ("tp2", "TP=2"))``: the results keys and labels of the two TP sizes."""
    n = _tp_size(data)
    return (("tp1", "TP=1"), (f"tp{n}", f"TP={n}"))


def _tp_profiled(data: dict) -> list[tuple[str, str, str, str]]:
    """``(key, label, decode key, decode setting)`` of each profiled and traced engine: TP=1,
    TP=2, TP=2 with every all-reduce through NCCL (all with graphs on)."""
    (one, one_label), (two, two_label) = _tp_runs(data)
    return [(one, one_label, one, "graphs_on"), (two, two_label, two, "graphs_on"),
            (f"{two}_nccl", f"{two_label}, NCCL all-reduce", two, "graphs_on_nccl")]


def _tp_results(data: dict, key: str) -> Any:
    results = data.get("results")
    return results.get(key) if isinstance(results, dict) else None


def _tp_decode(data: dict) -> dict[str, dict] | None:
    """``results.decode``: the TP sizes (TP=1 first) with a numeric ms per token in a setting."""
    decode = _tp_results(data, "decode")
    if not isinstance(decode, dict):
        return None
    usable = {key: decode[key] for key, _ in _tp_runs(data)
              if isinstance(decode.get(key), dict) and any(_is_number(decode[key].get(s)) for s, _ in TP_DECODE)}
    return usable or None


def _tp_own_best(run: dict) -> str:
    """A TP size's fastest setting in the benchmark's eyes: graphs on, else graphs off (a CPU run)."""
    return "graphs_on" if _is_number(run.get("graphs_on")) else "graphs_off"


def _tp_fraction(run: dict) -> float | None:
    """The roofline over the ms per token of the run's graphs-on setting (graphs off on the CPU)."""
    best = _tp_own_best(run)
    return _decode_fraction(run, ((best, ""), (best, ""))) if _is_number(run.get(best)) else None


def _tp_speedup(data: dict, decode: dict[str, dict]) -> tuple[str, float] | None:
    """``(setting, TP=1's ms per token over TP=2's)``: graphs on where both have it, else graphs
    off; the file's ``decode_speedup``, else computed. None without both TP sizes."""
    (one, _), (two, _) = _tp_runs(data)
    if one not in decode or two not in decode:
        return None
    setting = next((s for s in ("graphs_on", "graphs_off") if _is_number(decode[one].get(s)) and _is_number(decode[two].get(s))), None)
    if setting is None:
        return None
    given = _tp_results(data, "decode_speedup")
    if _is_number(given):
        return setting, float(given)
    return (setting, decode[one][setting] / decode[two][setting]) if decode[two][setting] else None


def _tp_kernels(data: dict) -> dict[str, list[tuple[str, str, dict[str, Any]]]] | None:
    """``{shape: [(key, label, profile)]}`` (as :func:`_graphs_kernels`) of one batch-size-1
    decode step of each profiled engine (:func:`_tp_profiled`), those the file has."""
    kernels = _tp_results(data, "kernels_per_decode_step")
    if not isinstance(kernels, dict):
        return None
    profiles = [(key, label, _kernel_profile(kernels.get(key))) for key, label, _, _ in _tp_profiled(data)]
    profiles = [p for p in profiles if p[2] is not None]
    shape = _config(data).get("shape")
    return {str(shape) if shape else "decode": profiles} if profiles else None


def _tp_all_reduce(data: dict) -> dict[str, Any] | None:
    """``{"rows": [...], "series": [(key, label)]}``: the all-reduce rows with a positive
    ``bytes`` and a timing, smallest first, and the timings any of them has."""
    rows = _tp_results(data, "all_reduce")
    if not isinstance(rows, list):
        return None
    rows = sorted((r for r in rows if isinstance(r, dict) and _is_number(r.get("bytes")) and r["bytes"] > 0
                   and any(_is_number(r.get(key)) for key, _ in TP_ALL_REDUCE)), key=lambda r: r["bytes"])
    comm = _config(data).get("comm_backend")
    comm = {"nccl": "NCCL"}.get(comm, comm) if isinstance(comm, str) and comm else "torch.distributed"
    series = [(key, label.format(comm=comm)) for key, label in TP_ALL_REDUCE if any(_is_number(r.get(key)) for r in rows)]
    return {"rows": rows, "series": series} if rows else None


def _tp_trace(data: dict) -> dict[str, Any] | None:
    """``{"batch": requests or None, "rows": [(key, label, summary)]}``: the traced engines
    whose ``decode_trace`` summary has a positive ``period_ms``."""
    trace = _tp_results(data, "decode_trace")
    if not isinstance(trace, dict):
        return None
    rows = []
    for key, label, _, _ in _tp_profiled(data):
        entry = trace.get(key)
        summary = entry.get("summary") if isinstance(entry, dict) else None
        if isinstance(summary, dict) and _is_number(summary.get("period_ms")) and summary["period_ms"] > 0:
            rows.append((key, label, summary))
    batch = trace.get("batch") if _is_number(trace.get("batch")) else None
    return {"batch": batch, "rows": rows} if rows else None


def _tp_yardstick(data: dict) -> dict[str, Any] | None:
    """The offline yardstick at TP=1 and TP=2 (see :func:`_paired_yardstick`)."""
    return _paired_yardstick(data, _tp_runs(data))


def _tp_decode_panels(data: dict, decode: dict[str, dict], theme: dict[str, Any]) -> list[tuple[str, list[Bar]]]:
    """A panel per TP size: ms per token in each setting (TP=2's compared one labelled with the
    speed-up over TP=1), and the roofline of one rank's bytes (labelled with the share of it
    that graphs on reach)."""
    colors = {"graphs_off": theme["other"], "graphs_on": theme["accent"], "graphs_on_nccl": theme["series"][1]}
    speedup = _tp_speedup(data, decode)
    (_, one_label), (two, _) = _tp_runs(data)
    panels = []
    for key, label in _tp_runs(data):
        if key not in decode:
            continue
        run, bars = decode[key], []
        for setting, setting_label in TP_DECODE:
            if _is_number(run.get(setting)):
                compared = speedup is not None and key == two and setting == speedup[0]
                text = _number(run[setting], "ms") + (f"   →  {_faster(speedup[1], one_label)}" if compared else "")
                bars.append((setting_label, float(run[setting]), colors[setting], text, compared))
        title = f"{label}: decode at batch size 1"
        if _is_number(run.get("bytes_per_rank_per_step")):
            title += f", {_bytes(run['bytes_per_rank_per_step'])} read per rank per step"
        panels.append((title, bars + _roofline_bar(run, _tp_fraction(run), theme, _tp_own_best(run).replace("_", " "))))
    return panels


def _draw_tp_all_reduce(fig, all_reduce: dict[str, Any], ranks: int, theme: dict[str, Any]) -> None:
    """µs per all-reduce against the message size (both on log scales), a line per way of
    calling it; each size's tick also names the batch size of the activation it carries."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    rows, series = all_reduce["rows"], all_reduce["series"]
    ax = fig.subplots()
    for i, (key, label) in enumerate(series):
        points = [(r["bytes"], r[key]) for r in rows if _is_number(r.get(key))]
        ax.plot(*zip(*points), color=theme["series"][i % len(theme["series"])], marker=MARKERS[i % len(MARKERS)],
                markersize=4.5, linewidth=1.8, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ticks = {r["bytes"]: _binary_bytes(r["bytes"]) + (f"\nbs {_fmt(r['batch_size'])}" if _is_number(r.get("batch_size")) else "")
             for r in rows}
    ax.set_xticks(list(ticks), list(ticks.values()))
    ax.tick_params(axis="x", labelsize=8.5)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: _number(v)))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("message size: one [batch size, hidden] activation (log scale)")
    ax.set_ylabel("µs per all-reduce (log scale)")
    ax.set_title(f"All-reduce between the {ranks} ranks (lower is better)", loc="left")
    ax.legend(loc="upper left")


def _draw_tp(data: dict, theme: dict[str, Any]):
    """Batch-size-1 decode per TP size against its roofline, the kernels of one decode step by
    kind, and the all-reduce's µs against the message size, stacked; those the file has."""
    decode, kernels, all_reduce = _tp_decode(data), _tp_kernels(data), _tp_all_reduce(data)
    if decode is None and kernels is None and all_reduce is None:
        return None
    parts = []
    if decode is not None:
        panels, xlabel = _tp_decode_panels(data, decode, theme), "bytes one rank reads per step"
        parts.append((_bar_panels_height(panels), lambda panel: _draw_bar_panels(panel, panels, _decode_xlabel(panels, xlabel))))
    if kernels is not None:
        parts.append((_kernels_height(kernels), lambda panel: _draw_graphs_kernels(panel, kernels, theme)))
    if all_reduce is not None:
        parts.append((3.6, lambda panel: _draw_tp_all_reduce(panel, all_reduce, _tp_size(data), theme)))
    (_, one), (_, two) = _tp_runs(data)
    return _stacked_figure(parts, f"Tensor parallelism, {two} against {one}{_on_hardware(data)}")


def _tp_section(res: BenchmarkResult) -> list[str] | None:
    """The workloads and the ratios, the plot, then the tables: batch-size-1 decode, the kernels
    by kind, the all-reduce, the traced decode steps and the yardstick; None without any."""
    data = res.data
    decode, kernels, all_reduce = _tp_decode(data), _tp_kernels(data), _tp_all_reduce(data)
    trace, yard = _tp_trace(data), _tp_yardstick(data)
    if decode is None and kernels is None and all_reduce is None and trace is None and yard is None:
        return None
    runs = _tp_runs(data)
    (_, one), (_, two) = runs
    out = _tp_headline(data)
    if decode is not None or kernels is not None or all_reduce is not None:
        out += _plot_markdown(res, f"Batch-size-1 decode at {one} and {two} against each one's roofline, the kernels "
                              "of one decode step by kind, and all-reduce time against message size")
    if decode is not None:
        out += ["**Decode at batch size 1**, ms per output token:", ""] + _tp_decode_table(data, decode)
    if kernels is not None:
        profiled = {key: (decode_key, setting) for key, _, decode_key, setting in _tp_profiled(data)}

        def ms_per_token(_: str, key: str) -> Any:
            decode_key, setting = profiled[key]
            return (decode or {}).get(decode_key, {}).get(setting)

        out += ["", KERNELS_HEAD.format(settings=" (graphs on)"), ""] + _kernels_table(kernels, ms_per_token)
    if all_reduce is not None:
        out += ["", f"**All-reduce between the {_tp_size(data)} ranks**, µs per call:", ""] + _tp_all_reduce_table(data, all_reduce)
    if trace is not None:
        batch = f" of {_fmt(trace['batch'])} requests" if trace["batch"] else ""
        out += ["", f"**Decode steps{batch}**, traced, mean ms per step:", ""] + _tp_trace_table(trace)
    if yard is not None:
        out += ["", f"**Offline yardstick**, output tokens per second at {one} and {two}:", ""]
        out += _yardstick_table(yard, runs, (one, two))
    shown = {"copy_bandwidth_bytes_s"}
    shown |= {"decode", "decode_speedup"} if decode is not None else set()
    shown |= {"kernels_per_decode_step"} if kernels is not None else set()
    shown |= {"all_reduce", "collectives_per_decode_step"} if all_reduce is not None else set()
    shown |= {"decode_trace"} if trace is not None else set()
    shown |= {"yardstick"} if yard is not None else set()
    rest = {k: v for k, v in data["results"].items() if k not in shown}
    return out + ([""] + _results_block(rest) if rest else [])


def _tp_decode_table(data: dict, decode: dict[str, dict]) -> list[str]:
    """A row per TP size: ms per token in each setting the file has, the bytes one rank reads
    per step and the roofline; then TP=2's speed-up over TP=1 in each setting."""
    settings = [(s, label) for s, label in TP_DECODE if any(_is_number(run.get(s)) for run in decode.values())]
    out = ["| | " + " | ".join(label for _, label in settings) + " | bytes read per rank per step | roofline"
           " | share of the roofline |", "|---|" + "---:|" * (len(settings) + 3)]
    for key, label in _tp_runs(data):
        if key in decode:
            run, fraction = decode[key], _tp_fraction(decode[key])
            cells = [_number(run[s], "ms") if _is_number(run.get(s)) else "—" for s, _ in settings] + [
                _bytes(run["bytes_per_rank_per_step"]) if _is_number(run.get("bytes_per_rank_per_step")) else "—",
                _number(run["roofline_ms"], "ms") if _is_number(run.get("roofline_ms")) else "—",
                f"{fraction:.1%}" if fraction is not None else "—"]
            out.append(f"| {label} | " + " | ".join(cells) + " |")
    speedup = _tp_speedup(data, decode)
    if speedup is not None:
        (one, one_label), (two, two_label) = _tp_runs(data)
        cells = []
        for s, _ in settings:
            a, b = decode[one].get(s), decode[two].get(s)
            ratio = speedup[1] if s == speedup[0] else a / b if _is_number(a) and _is_number(b) and b else None
            cells.append(_ratio(ratio, bold=s == speedup[0]))
        out.append(f"| {two_label} speed-up over {one_label} | " + " | ".join(cells) + " | | | |")
    reach = "graphs on" if any(_is_number(run.get("graphs_on")) for run in decode.values()) else "graphs off"
    out += _roofline_note(data, "the bytes one rank reads per step (its share of the weights and of the KV)", reach)
    if any(_is_number(run.get("graphs_on_nccl")) for run in decode.values()):
        out += ["", "NCCL all-reduce: every all-reduce through `torch.distributed` (`tp_all_reduce=\"nccl\"`); "
                "in the other runs (`\"auto\"`), the small ones between GPUs go through symmetric memory."]
    return out


def _tp_all_reduce_table(data: dict, all_reduce: dict[str, Any]) -> list[str]:
    """A row per message size: each timing the file has, the fastest in bold; then what a
    decode step calls."""
    series = all_reduce["series"]
    out = ["| batch size | message | " + " | ".join(_md_cell(label) for _, label in series) + " |",
           "|---:|---:|" + "---:|" * len(series)]
    for r in all_reduce["rows"]:
        times = [r.get(key) if _is_number(r.get(key)) else None for key, _ in series]
        fastest = min(t for t in times if t is not None)
        cells = ["—" if t is None else f"**{_number(t, 'µs')}**" if t == fastest and len(series) > 1 else _number(t, "µs")
                 for t in times]
        batch = _fmt(r["batch_size"]) if _is_number(r.get("batch_size")) else "—"
        out.append(f"| {batch} | {_binary_bytes(r['bytes'])} | " + " | ".join(cells) + " |")
    graphs = any(key.endswith("graph_us") for key, _ in series)
    out += ["", "Rank 0's wall clock per call, over many calls in a row"
            + (" (in a CUDA graph: captured in one graph, replayed)." if graphs else ".")]
    collectives = _tp_results(data, "collectives_per_decode_step")
    if isinstance(collectives, dict) and collectives and all(_is_number(n) for n in collectives.values()):
        calls = " and ".join(f"{_fmt(n)} × {_md_cell(str(kind).replace('_', '-'))}" for kind, n in collectives.items())
        out[-1] += f" A decode step calls {calls}."
    return out


def _tp_trace_table(trace: dict[str, Any]) -> list[str]:
    """A row per traced engine: ms per step, output tokens per second and the ratio to TP=1's
    steps, then each part's mean ms per step."""
    rows, batch = trace["rows"], trace["batch"]
    parts = [(key, label) for key, label in TP_TRACE_PARTS if any(_is_number(s.get(key)) for _, _, s in rows)]
    base = rows[0][2]["period_ms"] if rows[0][0] == "tp1" else None
    out = ["| | ms per step | output tok/s | steps vs TP=1 | " + " | ".join(label for _, label in parts) + " |",
           "|---|" + "---:|" * (3 + len(parts))]
    for _, label, summary in rows:
        period = summary["period_ms"]
        cells = [f"**{_number(period, 'ms')}**", _number(batch * 1e3 / period) if batch else "—",
                 _ratio(base / period) if base else "—"]
        cells += [_number(summary[key], "ms") if _is_number(summary.get(key)) else "—" for key, _ in parts]
        out.append(f"| {_md_cell(label)} | " + " | ".join(cells) + " |")
    return out + ["", "ms per step: from one step's launch to the next, averaged; the parts: the host's schedule, "
                  "launch and process of a step, and the device's work for it (CUDA), each one's mean length."]


def _tp_headline(data: dict) -> list[str]:
    """The setup and the workloads on one line; on the next, TP=2 against TP=1 in each measurement."""
    config = _config(data)
    (_, one), (_, two) = runs = _tp_runs(data)
    parts = [f"**{_md_cell(str(config['shape']))}**"] if config.get("shape") else []
    parts += _setup_parts(config)
    comm = f" over {_md_cell(str(config['comm_backend']))}" if config.get("comm_backend") else ""
    parts.append(f"{two} against {one}{comm}")
    parts += [w for w in (_decode_workload(config), _yardstick_workload(config)) if w]
    out = [" · ".join(parts), ""]
    line = []
    decode = _tp_decode(data)
    speedup = _tp_speedup(data, decode) if decode is not None else None
    if speedup is not None:
        line.append(f"batch-size-1 decode {_ratio(speedup[1], bold=True)} ({speedup[0].replace('_', ' ')})")
    trace = _tp_trace(data)
    if trace is not None and len(trace["rows"]) >= 2 and trace["rows"][0][0] == runs[0][0] and trace["rows"][1][0] == runs[1][0]:
        one_ms, two_ms = trace["rows"][0][2]["period_ms"], trace["rows"][1][2]["period_ms"]
        batch = f" of {_fmt(trace['batch'])} requests" if trace["batch"] else ""
        line.append(f"decode steps{batch} {_ratio(one_ms / two_ms, bold=True)}")
    line += _on_off_ratios(None, _tp_yardstick(data), runs)
    return out + ([f"{two} against {one}: " + "; ".join(line) + ".", ""] if line else [])


# --------------------------------------------------------------------------------------------
# serving: requests arriving over time at the HTTP server, measured with sglang bench_serving's
# metrics: latency percentiles and throughput against the request rate, and the radix cache
# and chunked prefill off and on through the server
# --------------------------------------------------------------------------------------------

SERVING_LATENCIES = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "itl_ms": "ITL", "e2e_ms": "E2E"}
SERVING_THROUGHPUTS = {"output_throughput": "output tok/s", "input_throughput": "input tok/s",
                       "request_throughput": "completed req/s"}
SERVING_PERCENTILES = ("p50", "p90", "p99")
SERVING_CURVE_PANELS = ("ttft", "tpot", "e2e")  # the latency panels of the curve, left to right
# A metric of a run, named the way the benchmark names its on/off ratios: ``output_throughput``,
# ``ttft_p50``, and with a request tag first, ``short_ttft_p99`` (that tag's requests only).
_SERVING_KEY_RE = re.compile(r"(?:(?P<tag>[a-z]+)_)??(?:(?P<latency>ttft|tpot|itl|e2e)_(?P<stat>p\d+|mean)"
                             r"|(?P<throughput>output|input|request)_throughput)")


@dataclass(frozen=True)
class ServingComparison:
    """How a feature's off and on runs through the server (``results[key]``) are shown."""

    key: str
    feature: str  # "Radix cache"
    off: str  # the off run's label
    on: str  # the on run's label (``{size}``: the comparison's chunked_prefill_size)
    panels: tuple[str, ...]  # the metrics drawn, a small panel each (named as in _SERVING_KEY_RE)
    rows: tuple[str, ...]  # the metrics of the table, before any other ratio the file has
    headline: tuple[str, ...]  # the ratios in bold


SERVING_COMPARISONS = (
    ServingComparison("radix", "Radix cache", "cache off", "cache on",
                      panels=("ttft_p50", "ttft_p99", "e2e_p50", "output_throughput"),
                      rows=("output_throughput", "request_throughput", "ttft_p50", "ttft_p99", "tpot_p50",
                            "itl_p99", "e2e_p50", "e2e_p99"),
                      headline=("output_throughput", "ttft_p50")),
    ServingComparison("chunked", "Chunked prefill", "whole prompts", "chunks of {size}",
                      panels=("short_ttft_p50", "short_ttft_p99", "long_ttft_p50", "output_throughput"),
                      rows=("output_throughput", "short_ttft_p50", "short_ttft_p90", "short_ttft_p99",
                            "short_tpot_p50", "short_e2e_p50", "long_ttft_p50", "long_e2e_p50"),
                      headline=("short_ttft_p99",)),
)


def _finite(v: Any) -> float | None:
    """``v`` as a float when it is a finite number (the benchmark writes NaN for an empty sample)."""
    return float(v) if _is_number(v) and math.isfinite(v) else None


def _serving_key(key: str) -> tuple[str | None, str, str | None] | None:
    """``(tag, field, stat)`` of a metric's name: ``short_ttft_p99`` is ``("short", "ttft_ms",
    "p99")``, ``output_throughput`` is ``(None, "output_throughput", None)``; None if unknown."""
    m = _SERVING_KEY_RE.fullmatch(key)
    if m is None:
        return None
    if m.group("latency"):
        return m.group("tag"), f"{m.group('latency')}_ms", m.group("stat")
    return m.group("tag"), f"{m.group('throughput')}_throughput", None


def _serving_value(metrics: Any, key: str) -> float | None:
    """The metric named ``key`` of one run (a tag's from its ``by_tag``), or None."""
    parsed = _serving_key(key)
    if parsed is None or not isinstance(metrics, dict):
        return None
    tag, name, stat = parsed
    if tag is not None:
        by_tag = metrics.get("by_tag")
        metrics = by_tag.get(tag) if isinstance(by_tag, dict) else None
        if not isinstance(metrics, dict):
            return None
    value = metrics.get(name)
    if stat is not None:
        value = value.get(stat) if isinstance(value, dict) else None
    return _finite(value)


def _serving_lower_is_better(key: str) -> bool:
    """Latencies are better lower, throughputs higher."""
    parsed = _serving_key(key)
    return parsed is not None and parsed[2] is not None


def _serving_label(key: str) -> str:
    """``TTFT p99``, ``output tok/s``, ``short-request TTFT p99``: a metric's name for a reader."""
    parsed = _serving_key(key)
    if parsed is None:
        return key.replace("_", " ")
    tag, name, stat = parsed
    text = f"{SERVING_LATENCIES[name]} {stat}" if stat else SERVING_THROUGHPUTS[name]
    return f"{tag}-request {text}" if tag else text


def _serving_run_ok(metrics: Any) -> bool:
    """A run's metrics with a numeric output throughput and TTFT p50: enough to show it."""
    return _serving_value(metrics, "output_throughput") is not None and _serving_value(metrics, "ttft_p50") is not None


def _serving_curve(data: dict) -> dict:
    """``results.curve``, or ``{}``."""
    results = data.get("results")
    curve = results.get("curve") if isinstance(results, dict) else None
    return curve if isinstance(curve, dict) else {}


def _serving_points(data: dict) -> list[dict] | None:
    """The usable points of ``results.curve``: those paced at a positive request rate, by rate,
    then those sent all at once (``request_rate`` null); None without any."""
    points = _serving_curve(data).get("points")
    if not isinstance(points, list):
        return None
    usable = [p for p in points if _serving_run_ok(p)
              and (p.get("request_rate") is None or (_is_number(p["request_rate"]) and p["request_rate"] > 0))]
    paced = sorted((p for p in usable if p.get("request_rate") is not None), key=lambda p: p["request_rate"])
    return paced + [p for p in usable if p.get("request_rate") is None] or None


def _serving_comparisons(data: dict) -> list[tuple[ServingComparison, dict]]:
    """``(spec, results[spec.key])`` for each comparison of the file whose two runs are usable."""
    results = data.get("results")
    found = []
    for spec in SERVING_COMPARISONS:
        comp = results.get(spec.key) if isinstance(results, dict) else None
        if isinstance(comp, dict) and _serving_run_ok(comp.get("on")) and _serving_run_ok(comp.get("off")):
            found.append((spec, comp))
    return found


@dataclass(frozen=True)
class ServingSetting:
    """A run of a comparison with the feature on, compared with the comparison's ``off`` run."""

    label: str  # "cache on", "chunks of 8,192"
    metrics: dict
    ratios: dict  # the file's ratios against off, ``{}`` when it has none


def _serving_settings(spec: ServingComparison, comp: dict) -> list[ServingSetting]:
    """The comparison's runs with the feature on: ``on``, then each usable run of ``variants``
    (chunked prefill at more chunk sizes: ``chunked_prefill_size``, ``metrics``, ``ratios``)."""
    def ratios(v: Any) -> dict:
        return v if isinstance(v, dict) else {}

    settings = [ServingSetting(_serving_on_label(spec, comp.get("chunked_prefill_size")), comp["on"], ratios(comp.get("ratios")))]
    for v in comp.get("variants") if isinstance(comp.get("variants"), list) else []:
        if isinstance(v, dict) and _serving_run_ok(v.get("metrics")):
            label = _serving_on_label(spec, v.get("chunked_prefill_size"))
            settings.append(ServingSetting(label, v["metrics"], ratios(v.get("ratios"))))
    return settings


def _serving_ratio(setting: ServingSetting, off: dict, key: str) -> float | None:
    """A setting against the off run for the metric ``key``, above 1 when on is better
    (throughput on/off, latency off/on): the file's ratio, else computed from the two runs."""
    given = _finite(setting.ratios.get(key))
    if given is not None:
        return given
    on, off = _serving_value(setting.metrics, key), _serving_value(off, key)
    if on is None or off is None:
        return None
    better, worse = (off, on) if _serving_lower_is_better(key) else (on, off)
    return better / worse if worse > 0 else None


def _serving_ratio_text(key: str, ratio: float | None, bold: bool = False) -> str:
    """``5.1× lower`` for a latency, ``2.88×`` (``1.00×``: three digits) for a throughput
    (``—`` for None)."""
    if ratio is None or ratio <= 0:
        return "—"
    if _serving_lower_is_better(key):
        text = _lower_text(ratio)
    else:
        text = f"{ratio:#.3g}×" if ratio < 100 else f"{_number(ratio)}×"
    return f"**{text}**" if bold else text


def _serving_on_label(spec: ServingComparison, size: Any) -> str:
    """An on run's label: ``chunks of 8,192`` with its chunk size (``chunked`` when the file
    names none)."""
    if "{size}" not in spec.on:
        return spec.on
    return spec.on.format(size=f"{int(size):,}") if _is_number(size) and size > 0 else "chunked"


def _serving_cap(point: dict) -> int | None:
    """The run's cap on requests in flight, or None."""
    cap = point.get("max_concurrency")
    return int(cap) if _is_number(cap) and cap > 0 else None


def _serving_rate_label(point: dict, tick: bool = False) -> str:
    """``8 req/s`` or ``all at once``, with ``≤ 32 in flight`` when the run capped the requests
    in flight; ``tick``: the short form for the axis (a paced point's rate alone)."""
    rate = point.get("request_rate")
    if rate is None:
        text = "all\nat once" if tick else "all at once"
    else:
        text = _number(rate) if tick else f"{_number(rate)} req/s"
    cap = _serving_cap(point)
    if cap is not None and not (tick and rate is not None):
        text += f"\n≤ {cap:,} in flight" if tick else f", ≤ {cap:,} in flight"
    return text


def _serving_x(points: list[dict]) -> tuple[list[float], bool, float | None]:
    """Where each point goes on the rate axis, whether the axis is logarithmic (rates spread over
    8× or more), and where the separator between the paced and the all-at-once points goes
    (None unless both kinds are there). An all-at-once point has no rate: it gets a slot right
    of the highest rate, one step further than the rates are apart, and no number on the axis
    (whose ticks are the measured rates)."""
    rates = [float(p["request_rate"]) for p in points if p.get("request_rate") is not None]
    unpaced = len(points) - len(rates)
    if not rates:
        return [float(i + 1) for i in range(unpaced)], False, None
    log = max(rates) / min(rates) >= 8
    if log:
        slots = [max(rates) * 2.0 ** (1 + i) for i in range(unpaced)]
        separator = max(rates) * 2.0 ** 0.5
    else:
        gap = (max(rates) - min(rates)) / (len(rates) - 1) if len(rates) > 1 else max(rates) / 2
        slots = [max(rates) + gap * (1.5 + i) for i in range(unpaced)]
        separator = max(rates) + 0.75 * gap
    return rates + slots, log, separator if unpaced else None


def _serving_tick_labels(points: list[dict], xs: list[float], log: bool) -> list[str]:
    """The rate axis' labels: each point's (:func:`_serving_rate_label`), a rate's left out when
    it would touch the last one shown (it keeps its tick mark)."""
    where = [math.log2(x) for x in xs] if log else xs
    min_gap = 0.1 * (max(where) - min(where))
    labels, last = [], None
    for point, at in zip(points, where):
        crowded = last is not None and at - last < min_gap and point.get("request_rate") is not None
        labels.append("" if crowded else _serving_rate_label(point, tick=True))
        last = last if crowded else at
    return labels


def _number_formatter() -> Any:
    """A tick formatter that writes values as :func:`_number` does (and 0 as ``0``)."""
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda v, _: _number(v) if v else "0")


def _serving_y_scale(ax: Any, values: list[float]) -> None:
    """A latency axis: logarithmic when the values span more than 30×, else linear from 0."""
    from matplotlib.ticker import LogLocator, NullLocator

    positive = [v for v in values if v > 0]
    if positive and max(positive) / min(positive) > 30:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_minor_locator(NullLocator())
    else:
        ax.set_ylim(0, max(values, default=0.0) * 1.12 or 1.0)
    ax.yaxis.set_major_formatter(_number_formatter())


def _plot_serving_series(ax: Any, xs: list[float], values: list[float | None], paced: list[int],
                         unpaced: list[int], color: str, marker: str) -> list[float]:
    """One series of the curve: the paced points joined by a line, the all-at-once ones as lone
    markers; returns the values drawn."""
    for indices, joined in ((paced, True), (unpaced, False)):
        shown = [(xs[i], values[i]) for i in indices if values[i] is not None]
        if shown:
            ax.plot(*zip(*shown), color=color, marker=marker, markersize=4.5, linewidth=1.8,
                    linestyle="-" if joined else "none")
    return [v for v in values if v is not None]


def _draw_serving_curve(panel: Any, points: list[dict], theme: dict[str, Any], title: str) -> None:
    """Six panels on one rate axis: TTFT, TPOT and E2E (a p50, p90 and p99 line each) above
    output tok/s, requests completed per second (against the offered rate) and the mean
    requests in flight. Paced points are joined by lines; an all-at-once point stands alone
    right of a dotted separator, ticked "all at once"."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import NullLocator

    xs, log, separator = _serving_x(points)
    paced = [i for i, p in enumerate(points) if p.get("request_rate") is not None]
    unpaced = [i for i, p in enumerate(points) if p.get("request_rate") is None]
    axes = panel.subplots(2, 3, sharex=True)
    styles = {q: (theme["series"][i], MARKERS[i]) for i, q in enumerate(SERVING_PERCENTILES)}
    for ax, metric in zip(axes[0], SERVING_CURVE_PANELS):
        drawn = []
        for q, (color, marker) in styles.items():
            values = [_serving_value(p, f"{metric}_{q}") for p in points]
            drawn += _plot_serving_series(ax, xs, values, paced, unpaced, color, marker)
        _serving_y_scale(ax, drawn)
        ax.set_title(f"{SERVING_LATENCIES[metric + '_ms']} (ms)", loc="left", fontsize=10)
    lower = (("output_throughput", "output tokens per second"), ("request_throughput", "requests completed per second"),
             ("concurrency", "requests in flight (mean)"))
    for ax, (key, label) in zip(axes[1], lower):
        values = [_finite(p.get(key)) for p in points]
        drawn = _plot_serving_series(ax, xs, values, paced, unpaced, theme["series"][4], "o")
        if key == "request_throughput" and paced:  # a server that keeps up completes what is offered
            rates = [xs[i] for i in paced]
            ax.plot(rates, rates, color=theme["muted"], linestyle="--", linewidth=1.2)
            drawn += rates
        ax.set_ylim(0, max(drawn, default=0.0) * 1.15 or 1.0)
        ax.yaxis.set_major_formatter(_number_formatter())
        ax.set_title(label, loc="left", fontsize=10)
    ticks = _serving_tick_labels(points, xs, log)
    for ax in axes.flat:
        if log:
            ax.set_xscale("log", base=2)
        ax.set_xticks(xs, ticks)
        ax.xaxis.set_minor_locator(NullLocator())
        ax.tick_params(axis="x", labelsize=8.5)
        if separator is not None:
            ax.axvline(separator, color=theme["muted"], linestyle=":", linewidth=1.2)
    lo, hi = min(xs), max(xs)
    if log:
        axes[0][0].set_xlim(lo / 1.4, hi * 1.4)
    else:
        pad = 0.1 * (hi - lo) or 0.5
        axes[0][0].set_xlim(lo - pad, hi + pad)
    handles = [Line2D([], [], color=color, marker=marker, markersize=4.5, linewidth=1.8, label=q)
               for q, (color, marker) in styles.items()]
    if paced:
        handles.append(Line2D([], [], color=theme["muted"], linestyle="--", linewidth=1.2, label="completed = offered"))
    panel.legend(handles=handles, loc="outside lower center", ncols=len(handles))
    if paced:  # on each bottom panel: a figure-wide label would overlap the legend below them
        for ax in axes[1]:
            ax.set_xlabel(f"offered request rate (req/s{', log scale' if log else ''})", fontsize=9)
    _part_title(panel, title)


SERVING_BAR_IN = 0.3  # inches per bar of a comparison panel


def _serving_comparison_height(spec: ServingComparison, comp: dict) -> float:
    """Inches for :func:`_draw_serving_comparison`: its title, and two panels a row."""
    rows = -(-len(_serving_panel_keys(spec, comp)) // 2)
    return 0.55 + rows * (0.6 + SERVING_BAR_IN * (1 + len(_serving_settings(spec, comp))))


def _serving_panel_keys(spec: ServingComparison, comp: dict) -> list[str]:
    """The metrics of ``spec.panels`` that every run of the comparison has."""
    runs = [comp["off"], *(s.metrics for s in _serving_settings(spec, comp))]
    return [k for k in spec.panels if all(_serving_value(run, k) is not None for run in runs)]


def _draw_serving_comparison(panel: Any, spec: ServingComparison, comp: dict, theme: dict[str, Any], title: str) -> None:
    """A panel per metric of ``spec.panels`` that the runs have, two a row: a horizontal bar for
    the off run and one per setting with the feature on, each labelled with its value, an on
    bar also (in bold) with its ratio to off."""
    from matplotlib.ticker import MaxNLocator

    off, settings = comp["off"], _serving_settings(spec, comp)
    keys = _serving_panel_keys(spec, comp)
    grid = panel.subplots(-(-len(keys) // 2), 2, sharey=True, squeeze=False)
    for ax in grid.flat[len(keys):]:
        ax.set_visible(False)
    labels = [spec.off, *(s.label for s in settings)]
    for ax, key in zip(grid.flat, keys):
        values = [_serving_value(run, key) for run in [off, *(s.metrics for s in settings)]]
        y = list(range(len(values)))
        ax.barh(y, values, height=0.64, color=[theme["other"]] + [theme["accent"]] * len(settings))
        ax.annotate(_number(values[0]), (values[0], 0), xytext=(5, 0), textcoords="offset points", va="center", fontsize=8.5)
        for yi, setting, value in zip(y[1:], settings, values[1:]):
            ratio = _serving_ratio(setting, off, key)
            note = _number(value) + (f"   →  {_serving_ratio_text(key, ratio)}" if ratio is not None else "")
            ax.annotate(note, (value, yi), xytext=(5, 0), textcoords="offset points", va="center", fontsize=8.5,
                        fontweight="bold" if ratio is not None else "normal")
        _label_rows(ax, labels)
        ax.set_xlim(0, max(values) * 1.7 or 1.0)  # room for the labels
        ax.xaxis.set_major_locator(MaxNLocator(4))
        ax.xaxis.set_major_formatter(_number_formatter())
        ax.tick_params(axis="x", labelsize=8.5)
        unit = " (ms)" if _serving_lower_is_better(key) else ""
        ax.set_title(_serving_label(key) + unit, loc="left", fontsize=9.5)
    _part_title(panel, title)


def _serving_lengths(full: int, ratio: Any) -> str:
    """``512–1,024`` for lengths uniform in ``[round(full * ratio), full]`` (``1,024`` when
    every request has ``full``: no ratio, or 1)."""
    low = max(1, round(full * ratio)) if _is_number(ratio) and 0 < ratio < 1 else full
    return f"{low:,}–{full:,}" if low != full else f"{full:,}"


def _serving_workload(workload: Any, short: bool = False) -> str:
    """A workload of the benchmark in words (``short``: for a plot title); ``—`` for none."""
    if not isinstance(workload, dict) or not workload:
        return "—"
    w = {k: v for k, v in workload.items() if _is_number(v)}
    kind = workload.get("kind")
    if kind == "random" and {"num_prompts", "input_len", "output_len"} <= set(w):
        ins, outs = (_serving_lengths(w[k], w.get("range_ratio")) for k in ("input_len", "output_len"))
        if short:
            return f"{w['num_prompts']:,} requests, {ins} tokens in, {outs} out"
        spread = " (uniform)" if "–" in ins + outs else ""
        return f"{w['num_prompts']:,} requests of random token ids, input {ins} and output {outs} tokens{spread}"
    if kind == "shared-prefix" and {"groups", "per_group", "system_len", "question_len", "output_len"} <= set(w):
        if short:
            return f"{w['groups']} groups × {w['per_group']} requests sharing {w['system_len']:,}-token prefixes"
        return (f"{w['groups'] * w['per_group']:,} requests = {w['groups']} groups × {w['per_group']}, a "
                f"{w['system_len']:,}-token system prompt shared by a group + a {w['question_len']:,}-token question, "
                f"{w['output_len']:,}-token answers")
    if kind == "long+short" and {"num_short", "short_input_len", "output_len", "num_long", "long_len"} <= set(w):
        if short:
            return f"{w['num_short']:,} short requests and {w['num_long']} long ({w['long_len']:,} tokens)"
        return (f"{w['num_short']:,} short requests ({w['short_input_len']:,}-token prompts) with {w['num_long']} long "
                f"ones ({w['long_len']:,}-token prompts) among them, {w['output_len']:,}-token answers")
    return ", ".join(f"{_md_cell(str(k).replace('_', ' '))} {_fmt(v)}" for k, v in workload.items())


def _serving_arrivals(rate: Any) -> str:
    """``all at once`` or ``Poisson arrivals at 16 req/s``."""
    return f"Poisson arrivals at {_number(rate)} req/s" if _is_number(rate) and rate > 0 else "all at once"


def _and_list(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _serving_curve_arrivals(points: list[dict]) -> str:
    """``Poisson arrivals at 21, 41 and 62 req/s, and all at once``."""
    rates = [_number(p["request_rate"]) for p in points if p.get("request_rate") is not None]
    parts = [f"Poisson arrivals at {_and_list(rates)} req/s"] if rates else []
    if any(p.get("request_rate") is None for p in points):
        parts.append("all at once")
    caps = sorted({_serving_cap(p) for p in points if _serving_cap(p) is not None})
    text = ", and ".join(parts)
    return text + (f"; at most {_and_list([f'{c:,}' for c in caps])} requests in flight" if caps else "")


def _serving_where(data: dict) -> str:
    """The end of the plot's title: `` at http://…`` for a run against a given server (the file's
    hardware is then the client's), else `` on NVIDIA H200``."""
    url = _config(data).get("base_url")
    return f" at {url}" if url else _on_hardware(data)


def _draw_serving(data: dict, theme: dict[str, Any]):
    """The curve (latency percentiles, throughput and requests in flight against the request
    rate) above a row of small on/off panels for each comparison the file has (the radix cache,
    chunked prefill); those the file has, each under a title of its own."""
    from matplotlib.figure import Figure

    points, comparisons = _serving_points(data), _serving_comparisons(data)
    if points is None and not comparisons:
        return None
    parts: list[tuple[float, Any, tuple]] = []  # (height in inches, draw(panel, *args), args)
    if points is not None:
        workload = _serving_workload(_serving_curve(data).get("workload"), short=True)
        paced = any(p.get("request_rate") is not None for p in points)
        title = f"Against the request rate (Poisson arrivals): {workload}" if paced else f"All requests at once: {workload}"
        parts.append((5.4, _draw_serving_curve, (points, theme, title)))
    for spec, comp in comparisons:
        arrivals = _serving_arrivals(comp.get("request_rate")).replace("Poisson arrivals", "Poisson")
        title = f"{spec.feature} off and on: {_serving_workload(comp.get('workload'), short=True)}, {arrivals}"
        parts.append((_serving_comparison_height(spec, comp), _draw_serving_comparison, (spec, comp, theme, title)))
    heights = [height for height, _, _ in parts]
    fig = Figure(figsize=(PLOT_WIDTH_IN, sum(heights) + 0.4), layout="constrained")
    panels = fig.subfigures(len(parts), 1, height_ratios=heights, squeeze=False)[:, 0]
    for panel, (_, draw, args) in zip(panels, parts):
        draw(panel, *args)
    fig.suptitle(f"Serving through HTTP{_serving_where(data)}", x=0.01, ha="left")
    return fig


def _part_title(panel: Any, title: str) -> None:
    """The title of one part of a stacked figure: left, a size below the figure's, wrapped."""
    panel.suptitle("\n".join(textwrap.wrap(title, 95)), x=0.01, ha="left", fontsize=11, fontweight="bold")


def _serving_section(res: BenchmarkResult) -> list[str] | None:
    """The setup and the headline numbers, the plot, the curve's table (every metric of every
    point folded away) and a table per comparison; None when the file has none of them."""
    data = res.data
    points, comparisons = _serving_points(data), _serving_comparisons(data)
    if points is None and not comparisons:
        return None
    out = _serving_headline(data)
    drawn = ["latency percentiles, throughput and requests in flight against the request rate"] if points else []
    drawn += [f"{spec.feature.lower()} off and on" for spec, _ in comparisons]
    out += _plot_markdown(res, "Serving through HTTP: " + _and_list(drawn))
    if points is not None:
        out += [f"**Against the request rate**: {_serving_workload(_serving_curve(data).get('workload'))}; "
                f"{_serving_curve_arrivals(points)}.", ""] + _serving_curve_table(points)
    for spec, comp in comparisons:
        out += ["", f"**{spec.feature} off and on**: {_serving_workload(comp.get('workload'))}; "
                f"{_serving_arrivals(comp.get('request_rate'))}.", ""] + _serving_comparison_table(spec, comp)
    shown = ({"curve"} if points is not None else set()) | {spec.key for spec, _ in comparisons}
    rest = {k: v for k, v in data["results"].items() if k not in shown}
    return out + ([""] + _results_block(rest) if rest else [])


SERVING_CURVE_HEAD = ("| arrivals | completed req/s | output tok/s | in flight (mean) | TTFT p50 | TTFT p99 | TPOT p50 "
                      "| TPOT p99 | ITL p50 | ITL p99 | E2E p50 | E2E p99 | failed |")


def _serving_curve_table(points: list[dict]) -> list[str]:
    """A row per point (by rate, all at once last): throughputs, requests in flight, the p50 and
    p99 of each latency in ms and the failed requests; the definitions under it, then every
    metric of every point in a fold-out table."""
    out = [SERVING_CURVE_HEAD, "|---|" + "---:|" * 12]
    for p in points:
        cells = [_serving_rate_label(p)]
        for key in ("request_throughput", "output_throughput", "concurrency"):
            value = _finite(p.get(key))
            cells.append(_number(value) if value is not None else "—")
        for metric in ("ttft", "tpot", "itl", "e2e"):
            for q in ("p50", "p99"):
                value = _serving_value(p, f"{metric}_{q}")
                cells.append(_number(value) if value is not None else "—")
        failed = p.get("failed")
        cells.append((f"**{failed:,}**" if failed else "0") if _is_number(failed) else "—")
        out.append("| " + " | ".join(cells) + " |")
    out += ["", "Latencies in ms. TTFT: time to first token; TPOT: time per output token after the first, "
            "(E2E − TTFT) / (output tokens − 1); ITL: the gaps between streamed tokens; E2E: the whole request. "
            "In flight: the mean number of requests between sent and answered."]
    out += _serving_errors(points)
    rows = [{"arrivals": _serving_rate_label(p)} for p in points]
    for row, p in zip(rows, points):  # NaN (an empty sample) shown as a dash
        row.update({k: "—" if isinstance(v, float) and not math.isfinite(v) else v
                    for k, v in _flatten(p).items() if k not in ("request_rate", "max_concurrency")})
    return out + ["", '??? note "Every metric of every point"', ""] + _indent(_rows_table(rows)) + [""]


def _serving_errors(runs: list[dict]) -> list[str]:
    """The errors the runs report for their failed requests, each kind once, or nothing."""
    errors = list(dict.fromkeys(str(e) for r in runs for e in (r.get("errors") if isinstance(r.get("errors"), list) else [])))
    if not errors:
        return []
    shown = "; ".join("`" + " ".join(e.replace("`", "'").split()) + "`" for e in errors)
    return ["", f"Errors of the failed requests: {shown}."]


def _serving_comparison_table(spec: ServingComparison, comp: dict) -> list[str]:
    """A row per metric of ``spec.rows`` (then any other ratio of the file) that a run has: the
    off run, each setting with the feature on, and each one's ratio to off (in bold for the
    headline ratios); then the cached prompt tokens, requests in flight and failed requests."""
    off, settings = comp["off"], _serving_settings(spec, comp)
    runs = [off, *(s.metrics for s in settings)]
    given = [k for s in settings for k in s.ratios if _serving_key(k) is not None]
    keys = list(dict.fromkeys([*spec.rows, *given]))
    ratio_heads = ["on against off"] if len(settings) == 1 else [f"{s.label} against {spec.off}" for s in settings]
    out = ["| | " + " | ".join(_md_cell(label) for label in [spec.off, *(s.label for s in settings), *ratio_heads]) + " |",
           "|---|" + "---:|" * (len(runs) + len(settings))]
    blank = " |" * len(settings)
    for key in keys:
        values = [_serving_value(run, key) for run in runs]
        if all(v is None for v in values):
            continue
        unit = " (ms)" if _serving_lower_is_better(key) else ""
        cells = [_number(v) if v is not None else "—" for v in values]
        cells += [_serving_ratio_text(key, _serving_ratio(s, off, key), bold=key in spec.headline) for s in settings]
        out.append(f"| {_md_cell(_serving_label(key))}{unit} | " + " | ".join(cells) + " |")
    if any(_finite(r.get("cached_tokens")) for r in runs):  # some prompt tokens came from a cache
        out.append("| cached prompt tokens | " + " | ".join(_serving_cached(r) or "—" for r in runs) + " |" + blank)
    concurrency = [_finite(r.get("concurrency")) for r in runs]
    if any(c is not None for c in concurrency):
        out.append("| in flight (mean) | " + " | ".join(_number(c) if c is not None else "—" for c in concurrency) + " |" + blank)
    failed = [r.get("failed") for r in runs]
    if any(_is_number(f) for f in failed):
        out.append("| failed requests | " + " | ".join(_fmt(f) if _is_number(f) else "—" for f in failed) + " |" + blank)
    return out + _serving_errors(runs)


def _serving_cached(run: dict) -> str | None:
    """``491,520 (88%)``: the prompt tokens the server answered from its cache, and their share."""
    cached, total = run.get("cached_tokens"), run.get("total_input_tokens")
    if not _is_number(cached):
        return None
    share = f" ({cached / total:.0%})" if _is_number(total) and total > 0 else ""
    return f"{int(cached):,}{share}"


def _serving_headline(data: dict) -> list[str]:
    """The setup on one line (model, server, weights); on the next, the highest output
    throughput of the curve and each comparison's on/off ratios."""
    config = _config(data)
    parts = [f"**{_md_cell(str(config['shape']))}**"] if config.get("shape") else []
    parts += _setup_parts(config)
    if config.get("base_url"):
        parts.append(f"the server at `{_md_cell(str(config['base_url']))}` (the hardware above is the client's)")
    elif "base_url" in config:
        args = config.get("server_args")
        args = " ".join(str(a) for a in args) if isinstance(args, list) else ""
        parts.append("a minisgl server started by the run" + (f" with `{_md_cell(args)}`" if args else ""))
    if config.get("dummy_weights"):
        parts.append("random weights")
    if _is_number(config.get("warmup_requests")) and config["warmup_requests"] > 0:
        parts.append(f"{config['warmup_requests']} uncounted warm-up requests before each run")
    out = [" · ".join(parts), ""] if parts else []
    lines = []
    points = _serving_points(data)
    if points is not None:
        best = max(points, key=lambda p: p["output_throughput"])
        lines.append(f"Highest output throughput **{_number(best['output_throughput'], 'tok/s')}** "
                     f"({_serving_rate_label(best)}).")
    for spec, comp in _serving_comparisons(data):
        settings = _serving_settings(spec, comp)
        for setting in settings:
            keys = [k for k in setting.ratios if _serving_key(k) is not None] or list(spec.headline)
            ratios = [(k, _serving_ratio(setting, comp["off"], k)) for k in keys]
            shown = [f"{_serving_label(k)} {_serving_ratio_text(k, r, bold=k in spec.headline)}" for k, r in ratios if r is not None]
            which = " on against off" if len(settings) == 1 else f", {setting.label} against {spec.off}"
            if shown:
                lines.append(f"{spec.feature}{which}: " + ", ".join(shown) + ".")
    return out + ([" ".join(lines), ""] if lines else [])


# benchmark name -> (draw(data, theme) -> Figure | None, page section(result) -> lines | None).
# A name not listed here, or a file whose numbers do not have the expected shape, gets tables.
BENCHMARK_VIEWS = {
    "attention_decode": (_draw_attention, _attention_section),
    "offline": (_draw_offline, _offline_section),
    "radix": (_draw_radix, _radix_section),
    "chunked": (_draw_chunked, _chunked_section),
    "overlap": (_draw_overlap, _overlap_section),
    "host": (_draw_host, _host_section),
    "graphs": (_draw_graphs, _graphs_section),
    "tp": (_draw_tp, _tp_section),
    "serving": (_draw_serving, _serving_section),
}
