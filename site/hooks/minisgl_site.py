"""mkdocs hook of the course site (``hooks:`` in ``mkdocs.yml``). The site copies nothing; at build time it:

* adds ``lessons/lNN/README.md`` and ``notebooks/lNN_*.ipynb`` as pages from where they live, and
  builds the "Course" navigation from the lessons that exist (the ``lessons/*`` nav entry);
* rewrites relative links: to another page, a site link; to any other repository file
  (``../../minisgl/generate.py``), ``{repo_url}/blob/main/<path>`` (notebook pages: in their HTML);
* fills the generated parts of the hand-written pages, marked ``<!-- minisgl:NAME -->`` (lesson
  table and quick start from the README, package map and code by lesson from the modules'
  ``__lesson__``, engine options from ``EngineConfig``, benchmark results by ``benchmarks.plots``);
* writes the benchmark charts (light and dark SVGs from ``benchmarks.plots``) into the built
  site, and serves the vendored mermaid only on pages with a diagram (no CDN).
"""

from __future__ import annotations

import ast
import html as htmllib
import logging
import posixpath
import re
import sys
from pathlib import Path
from typing import Any
from urllib.parse import unquote

# The site's plots and checks live beside the package, not in it (benchmarks/, tests/tools/):
# import them from the clone's root, which the `mkdocs` command does not put on sys.path.
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from mkdocs.plugins import event_priority  # noqa: E402
from mkdocs.structure.files import File, Files, InclusionLevel  # noqa: E402
from mkdocs.structure.toc import get_toc  # noqa: E402
from mkdocs.utils import get_relative_url  # noqa: E402

from benchmarks import plots  # noqa: E402
from tests.tools import figures, layering  # noqa: E402

log = logging.getLogger("mkdocs.hooks.minisgl_site")

BRANCH = "main"
LESSON_DIR_RE = re.compile(r"^l(\d\d)$")
NOTEBOOK_RE = re.compile(r"^l(\d\d)_.*\.ipynb$")
NAV_LESSONS_MARKER = "lessons/*"
ASSET_SUFFIXES = {".png", ".svg", ".jpg", ".jpeg", ".gif", ".webp"}
MERMAID_JS = "vendor/mermaid/mermaid.min.js"

# Filled by on_config / on_files, read by the later events of the same build.
_state: dict[str, Any] = {}


# --- Discovering lessons and notebooks ----------------------------------------


def _repo_root(config) -> Path:
    return Path(config.config_file_path).resolve().parent


def _lesson_readmes(root: Path) -> list[tuple[int, Path]]:
    """``(lesson number, README path)`` for every ``lessons/lNN/README.md``, in lesson order."""
    found = [(LESSON_DIR_RE.match(p.parent.name), p) for p in sorted(root.glob("lessons/*/README.md"))]
    return [(int(m.group(1)), p) for m, p in found if m]


def _notebooks(root: Path) -> list[tuple[int | None, Path]]:
    """``(lesson number or None, path)`` for every notebook in ``notebooks/``."""
    found = [(NOTEBOOK_RE.match(p.name), p) for p in sorted(root.glob("notebooks/*.ipynb"))]
    return [(int(m.group(1)) if m else None, p) for m, p in found]


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


# --- Events ----------------------------------------


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

    # The benchmark charts are drawn now, so the Benchmarks page can link them like any file.
    _state["benchmarks"] = plots.load_results(root)
    for res in _state["benchmarks"]:
        for theme, svg in plots.svgs(res).items():
            res.plots[theme] = f"{plots.PLOT_DIR}/{Path(res.rel).stem}-{theme}.svg"
            files.append(File.generated(config, res.plots[theme], content=svg))

    # repository path -> site file, for the link rewriter
    _state["by_repo_path"] = {_repo_path_of(f): f for f in files}
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
            entries.append({titles[num]: [readme_by_num[num], *nb_entries] if nb_entries else readme_by_num[num]})
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
    # The figures check's markers (<!-- fig: R['x']['y'] -->): read by a test, not by readers,
    # and their brackets would look like reference links to the cross-reference plugin.
    markdown = figures.MARKER_RE.sub("", markdown)

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


# --- Links ----------------------------------------

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


# --- Lesson pages ----------------------------------------


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
    parts.append(f"its code [by lesson]({get_relative_url('code.md', src_uri)}#lesson-{lesson})")
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


# --- Generated sections of the hand-written pages ----------------------------------------

_MARKER_RE = re.compile(r"<!-- minisgl:(?P<name>[a-z-]+) -->")


def _fill_generated_sections(markdown: str, src_uri: str) -> str:
    generators = {
        "lesson-table": lambda: _readme_lesson_table(src_uri),
        "quickstart": lambda: _readme_section("quickstart", src_uri),
        "package-map": _package_map,
        "module-index": _module_index,
        "code-by-lesson": _code_by_lesson,
        "engine-settings": _engine_settings,
        "benchmark-results": lambda: plots.results_markdown(_state["benchmarks"]),
        "radix-comparison": lambda: plots.radix_comparison(_state["benchmarks"]),
        "chunked-comparison": lambda: plots.chunked_comparison(_state["benchmarks"]),
        "speculative-comparison": lambda: plots.speculative_comparison(_state["benchmarks"]),
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
    """Every module of ``minisgl/``: path, first docstring line, and the lesson it declares
    (``__lesson__``: 1-10, ``"assembly"`` or ``"tooling"``, read by :mod:`tests.tools.layering`)."""
    root: Path = _state["root"]
    modules = []
    for mod in layering.scan(root / "minisgl").values():
        rel = mod.path.relative_to(root).as_posix()
        doc = ast.get_docstring(ast.parse(mod.path.read_text(encoding="utf-8"))) or ""
        first = doc.strip().split("\n\n")[0].replace("\n", " ").strip()
        modules.append({"path": rel, "summary": first, "lesson": mod.lesson})
    return sorted(modules, key=lambda m: m["path"])


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|")


def _module_link(rel: str) -> str:
    shown = rel[:-len("/__init__.py")] + "/" if rel.endswith("/__init__.py") else rel
    return f"[`{shown}`]({_state['repo_url']}/blob/{BRANCH}/{rel})"


def _grouped_module_links(paths: list[str]) -> str:
    """``attention/`` [base] · [dense]<br>... : the modules of a lesson, grouped by subpackage."""
    groups: dict[str, list[str]] = {}
    for rel in paths:
        inner = rel[len("minisgl/"):]
        package, _, name = inner.rpartition("/")
        groups.setdefault(package, []).append(f"[{name[:-3]}]({_state['repo_url']}/blob/{BRANCH}/{rel})")
    lines = []
    for package in sorted(groups):
        label = f"`{package}/`" if package else "`minisgl/`"
        lines.append(f"{label} " + " · ".join(groups[package]))
    return "<br>".join(lines) or "—"


def _package_map() -> str:
    modules = [m for m in _scan_modules() if not m["path"].endswith("__init__.py")]
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
    for kind, what in (("assembly", "where the lessons are plugged together (the builder, the CLI)"),
                       ("tooling", "benchmarks, test helpers, the demo model's training")):
        out.append(f"| {kind} | {what} | {_grouped_module_links([m['path'] for m in modules if m['lesson'] == kind])} |")
    return (
        "\n".join(out)
        + "\n\nEvery module declares its lesson (`__lesson__ = 5`); a module of lesson N imports "
        "nothing from a later lesson, only the assembly modules may, and nothing imports tooling. "
        "`python -m tests.tools.layering` checks it (in CI, through `tests/test_layering.py`).\n"
    )


def _code_by_lesson() -> str:
    """One section per lesson (then the assembly points): a mkdocstrings ``:::`` block for every
    module that declares the lesson, so a learner browses exactly the code of lessons <= N."""
    by_lesson: dict[Any, list[str]] = {}
    for m in _scan_modules():
        if not m["path"].endswith("__init__.py"):
            by_lesson.setdefault(m["lesson"], []).append(m["path"][:-3].replace("/", "."))
    titles = {int(row["id"][1:]): _strip_links(row["topic"]) for row in readme_lessons()}
    out = []
    for lesson in [*sorted(n for n in by_lesson if isinstance(n, int)), "assembly"]:
        heading = f"Lesson {lesson}: {titles.get(lesson, '')}".rstrip(": ") if lesson != "assembly" else "Assembly points"
        out += [f"## {heading} {{ #lesson-{lesson} }}", ""] + [f"::: {name}\n" for name in by_lesson.get(lesson, [])]
    return "\n".join(out) + "\n"


def _engine_settings() -> str:
    """The engine's settings as command-line options, read from ``EngineConfig`` in
    ``minisgl/engine/config.py`` (each field is ``setting(default, help, lesson, flag=...)``):
    the one place they are declared, so this table cannot drift from the code."""
    path = _state["root"] / "minisgl" / "engine" / "config.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "EngineConfig")
    out = ["| option | default | lesson | what |", "|---|---|---|---|"]
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.value, ast.Call)
                and getattr(node.value.func, "id", None) == "setting"):
            continue
        name = node.target.id
        default, help_text, lesson = (ast.literal_eval(a) if not isinstance(a, ast.BinOp) else ast.unparse(a)
                                      for a in node.value.args[:3])
        flag = next((ast.literal_eval(k.value) for k in node.value.keywords if k.arg == "flag"), True)
        if not flag:
            continue
        option = "--" + name.replace("_", "-")
        if default is True:
            option, shown = "--no-" + name.replace("_", "-"), "on"
        elif default is False:
            shown = "off"
        else:
            shown = "see →" if default is None else f"`{default}`"
        out.append(f"| `{option}` | {shown} | {lesson} | {_md_cell(help_text)} |")
    return "\n".join(out) + "\n"


def _module_index() -> str:
    out = ["| Module | What it is |", "|---|---|"]
    for m in _scan_modules():
        if m["path"] == "minisgl/__init__.py":
            continue
        out.append(f"| {_module_link(m['path'])} | {_md_cell(m['summary']) or '—'} |")
    return "\n".join(out) + "\n"
