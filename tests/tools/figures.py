"""Every measured figure quoted in the course text is backed: ``python -m tests.tools.figures``.

A figure (a number with a unit of time, speed, size or ratio: ``1.77 ms``, ``21,600 tok/s``,
``3.05×``, ``85%``) in a lesson README, the top README or a site page carries one of two
invisible markers right after it:

* ``<!-- fig: EXPR -->`` — the figure comes from a committed results file. ``EXPR`` is a Python
  expression over ``R`` (``R["graphs_gpu"]`` is ``benchmarks/results/graphs_gpu.json``, whole)
  and ``D`` (the ``results`` object of the file named by the last ``<!-- figs: STEM -->`` above
  it in the same file), with ``min``, ``max``, ``sum``, ``len``, ``abs``, ``round``, ``sorted``
  and ``median``. The check evaluates it and compares it with the number printed just before the
  marker, within the printed rounding (``1.77`` stands for [1.765, 1.775]); ``fig ±T:`` widens
  that to ``T`` (for prose that rounds further, "about 21,600"). A ``k`` right after the number
  means thousands (``21.6k``).
* ``<!-- run: COMMAND -->`` — the figure comes from a run that no results file keeps (a
  profile, a one-off CPU measurement). ``COMMAND`` must appear in the same file in backticks,
  where a reader sees it, and must exist: its script or module, and each of its ``--flags`` in
  that module's source (for ``jupyter nbconvert --execute … notebooks/X.ipynb``, the notebook:
  its saved outputs are the figures, and CI runs every notebook).

``<!-- given -->`` marks a number with a unit that is a setting or a definition, not a
measurement ("a 5 s timeout"). Fenced code blocks, break-it blocks and generated sections are
not scanned (they are rendered from their own sources and checked there).

    python -m tests.tools.figures            # check every file, list what fails
    python -m tests.tools.figures lessons/l08/README.md --all   # every figure and its backing
    python -m tests.tools.figures --update   # after a rerun: each stale figure rewritten, each line shown
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import statistics
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"

#: A number followed by a unit that makes it a measurement or a ratio. ``s`` alone is a unit
#: only after a number with a decimal point or before "per"/"of"/","… (``5 s`` is often a
#: setting); the scan errs on the side of asking for a marker.
UNIT = (r"(?:(?:ms|µs|us)/(?:token|step)|(?:out |output )?(?:tok/s|tokens/s)|token/s|req/s|requests/s|"
        r"TFLOP/s|GB/s|TB/s|MB/s|ms|µs|us|ns|s|GiB|GB|MB|MiB|KiB|KB|×|x|%)")
FIGURE_RE = re.compile(
    r"(?<![\w.\-/#=^])(?P<num>\d[\d,]*(?:\.\d+)?)(?P<k>k)?(?P<sp>\s?)(?P<unit>" + UNIT + r")(?![\w/])"
)
NUMBER_RE = re.compile(r"(?P<num>\d[\d,]*(?:\.\d+)?)(?P<k>k)?")
MARKER_RE = re.compile(r"<!--\s*(?P<kind>figs|fig|run|given)(?P<tol>\s*±\s*[\d.]+)?\s*(?::\s*(?P<body>.*?))?\s*-->")
SKIP_BLOCKS = [
    (re.compile(r"<!-- breakit: [\w/]+ -->"), re.compile(r"<!-- /breakit -->")),
    (re.compile(r"<!-- (\w+):begin -->"), re.compile(r"<!-- \w+:end -->")),
    (re.compile(r"<!-- exercise: [\w/]+ -->"), re.compile(r"<!-- /exercise -->")),
]
NO_MARKER = "no marker: add <!-- fig: … -->, <!-- run: … --> or <!-- given -->"
#: Files whose figures must be backed.
SCOPE = ("README.md", "lessons/l*/README.md", "site/*.md")


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    text: str
    problem: str  # "" when the figure is backed
    # A "fig:" figure whose printed number differs from its results: where the number is in its
    # line (start, end), what the results say, and whether the marker widened the tolerance
    # (prose that rounds further: --update leaves those to the author).
    number_span: tuple[int, int] | None = None
    source: float | None = None
    widened: bool = False

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}"
        return f"{where}: {self.text!r}: {self.problem}" if self.problem else f"{where}: {self.text!r}: ok"


@cache
def _results() -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in sorted(RESULTS.glob("*.json"))}


def printed_value(text: str) -> tuple[float, float] | None:
    """The last number in ``text`` (a figure's text, up to its marker) and its rounding step.

    ``"**1.77 ms**"`` → (1.77, 0.01); ``"21,600 tok/s"`` → (21600, 1); ``"21.6k"`` → (21600, 100).
    """
    matches = list(NUMBER_RE.finditer(text))
    if not matches:
        return None
    m = matches[-1]
    digits = m.group("num").replace(",", "")
    decimals = len(digits.split(".")[1]) if "." in digits else 0
    value, step = float(digits), 10.0 ** -decimals
    if m.group("k"):
        value, step = value * 1000, step * 1000
    return value, step


def _command_problem(command: str, text: str) -> str:
    """Why ``command`` is not a valid "run:" backing in a file whose text is ``text`` ("" if it is)."""
    if f"`{command}" not in text:
        return f"the command {command!r} does not appear in backticks in this file"
    words = shlex.split(command)
    while words and "=" in words[0] and not words[0].startswith("-"):  # VAR=value prefixes
        words = words[1:]
    if not words:
        return "empty command"
    source, name = "", words[1] if len(words) > 1 else words[0]
    if words[0] in ("python", "python3") and len(words) >= 3 and words[1] == "-m":
        module = words[2]
        if module == "benchmarks" and len(words) >= 4:
            module = f"benchmarks.{words[3]}"
        name = module
        path = REPO / (module.replace(".", "/") + ".py")
        if not path.is_file():
            path = REPO / module.replace(".", "/") / "__main__.py"
        if not path.is_file():
            return f"no module {module!r} in this repository"
        source = path.read_text(encoding="utf-8")
        if module.startswith("benchmarks."):  # the flags every runner shares come from benchmarks/cli.py
            source += (REPO / "benchmarks" / "cli.py").read_text(encoding="utf-8")
    elif words[0] == "jupyter" and words[1:2] == ["nbconvert"]:  # a notebook's saved outputs
        notebooks = [w for w in words if w.endswith(".ipynb")]
        if not notebooks:
            return "a jupyter nbconvert command names no notebook"
        if not all((REPO / nb).is_file() for nb in notebooks):
            return f"{notebooks} do not all exist"
        if "--execute" not in words:
            return "a notebook's figures come from running it: add --execute"
        return ""
    elif words[0] in ("python", "python3", "pytest", "bash") and len(words) >= 2:
        target = next((w for w in words[1:] if not w.startswith("-")), words[1]).split("::")[0]
        if not (REPO / target).exists():
            return f"{target} does not exist"
        if (REPO / target).is_file():
            source = (REPO / target).read_text(encoding="utf-8")
    else:
        return f"unknown kind of command {words[0]!r} (python/pytest/bash/jupyter nbconvert)"
    if source:
        for word in words:
            flag = word.split("=")[0]
            if flag.startswith("--") and f'"{flag}"' not in source and f"'{flag}'" not in source:
                return f"{flag} is not a flag of {name}"
    return ""


def _visible_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) for the lines a figure scan looks at: outside code fences and rendered blocks."""
    out: list[tuple[int, str]] = []
    fence: str | None = None
    end_re: re.Pattern | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.lstrip()
        if end_re is not None:
            if end_re.search(line):
                end_re = None
            continue
        if fence is not None:
            if stripped.startswith(fence):
                fence = None
            continue
        if stripped.startswith("```") or stripped.startswith("~~~"):
            fence = stripped[:3]
            continue
        for start, end in SKIP_BLOCKS:
            if start.search(line):
                end_re = end
                break
        if end_re is not None:
            continue
        out.append((number, line))
    return out


def _strip_inline_code(line: str) -> str:
    """The line with `inline code` blanked out (same length, so positions still match)."""
    return re.sub(r"`[^`]*`", lambda m: " " * len(m.group(0)), line)


def check_file(path: Path) -> list[Finding]:
    """Every figure and every marker of one markdown file, each with its problem ("" if backed)."""
    text = path.read_text(encoding="utf-8")
    rel = path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else str(path)
    findings: list[Finding] = []
    default: dict | None = None
    results = _results()
    for number, line in _visible_lines(text):
        markers = list(MARKER_RE.finditer(line))
        covered: list[tuple[int, int]] = []  # spans of text that a marker backs
        prev_end = 0
        for m in markers:
            kind, body = m.group("kind"), (m.group("body") or "").strip()
            before = line[prev_end : m.start()]
            span = (prev_end, m.start())
            prev_end = m.end()
            if kind == "figs":
                data = results.get(body)
                if data is None:
                    findings.append(Finding(rel, number, m.group(0), f"no results file benchmarks/results/{body}.json"))
                else:
                    default = data.get("results", data)
                continue
            # The figure a marker backs: the last figure (or number) in the text since the last marker.
            figure_matches = list(FIGURE_RE.finditer(_strip_inline_code(before)))
            shown = before[figure_matches[-1].start() :] if figure_matches else before.strip()[-24:]
            shown_at = span[0] + (figure_matches[-1].start() if figure_matches else before.rfind(shown))
            covered.append((span[0] + figure_matches[-1].start(), span[1]) if figure_matches else span)
            if kind == "given":
                continue
            if kind == "run":
                findings.append(Finding(rel, number, shown, _command_problem(body, text)))
                continue
            printed = printed_value(shown)
            if printed is None:
                findings.append(Finding(rel, number, shown, "no number before this marker"))
                continue
            value, step = printed
            tolerance = float(m.group("tol").strip().lstrip("±")) if m.group("tol") else step / 2
            try:
                env = {"__builtins__": {}, "R": results, "D": default, "median": statistics.median, "min": min,
                       "max": max, "sum": sum, "len": len, "abs": abs, "round": round, "sorted": sorted, "zip": zip,
                       "range": range}
                # names as globals, so that comprehensions and lambdas see them too
                source = float(eval(body, env))  # noqa: S307 - the course's own text
            except Exception as exc:  # noqa: BLE001 - reported as a finding
                findings.append(Finding(rel, number, shown, f"{body!r} fails: {type(exc).__name__}: {exc}"))
                continue
            if not math.isfinite(source) or abs(source - value) > tolerance * (1 + 1e-9) + 1e-12:
                last = list(NUMBER_RE.finditer(shown))[-1]
                findings.append(Finding(rel, number, shown, f"the results say {source:.6g} ({body})",
                                        number_span=(shown_at + last.start(), shown_at + last.end()),
                                        source=source, widened=m.group("tol") is not None))
            else:
                findings.append(Finding(rel, number, shown, ""))
        # Figures no marker backs.
        visible = _strip_inline_code(MARKER_RE.sub(lambda m: " " * len(m.group(0)), line))
        for fm in FIGURE_RE.finditer(visible):
            if any(start <= fm.start() and fm.end() <= end for start, end in covered):
                continue
            if fm.group("unit") in ("x", "s") and not ("." in fm.group("num") or fm.group("sp") == ""):
                continue  # "3 x 4", "5 s" without a decimal: too often not a measurement
            if fm.group("unit") == "x" and fm.group("sp"):
                continue
            findings.append(Finding(rel, number, fm.group(0), NO_MARKER))
    return findings


def printed_like(printed: str, value: float) -> str | None:
    """``value`` written as ``printed`` writes its number: the same decimals, thousands
    separators if it has them, a ``k`` if it has one (``printed_like("21.6k", 23412)`` is
    ``"23.4k"``). None for a value that has no such form (negative, not finite)."""
    m = NUMBER_RE.fullmatch(printed)
    if m is None or not math.isfinite(value) or value < 0:
        return None
    digits = m.group("num")
    decimals = len(digits.split(".")[1]) if "." in digits else 0
    shown = value / 1000 if m.group("k") else value
    text = f"{shown:,.{decimals}f}" if "," in digits else f"{shown:.{decimals}f}"
    return text + (m.group("k") or "")


def update_file(path: Path) -> tuple[list[tuple[int, str, str]], list[Finding]]:
    """Rewrite, in ``path``, every "fig:" figure whose results changed to what they say now, in
    the figure's own format (:func:`printed_like`). Returns the changes (line, old line, new line)
    and what it left: figures under a widened tolerance (prose that rounds further), and every
    other problem (no marker, a failing expression, a command). Each changed line is for the
    author to read again: the number is the results', the words around it are not checked."""
    lines = path.read_text(encoding="utf-8").split("\n")
    edits: dict[int, list[tuple[int, int, str]]] = {}
    left: list[Finding] = []
    for f in check_file(path):
        if not f.problem:
            continue
        new = None
        if f.number_span is not None and f.source is not None and not f.widened:
            new = printed_like(lines[f.line - 1][f.number_span[0]:f.number_span[1]], f.source)
        if new is None:
            left.append(f)
        else:
            edits.setdefault(f.line, []).append((*f.number_span, new))
    changes = []
    for number, spans in sorted(edits.items()):
        old = line = lines[number - 1]
        for start, end, new in sorted(spans, reverse=True):  # right to left: earlier spans stay put
            line = line[:start] + new + line[end:]
        lines[number - 1] = line
        changes.append((number, old, line))
    if changes:
        path.write_text("\n".join(lines), encoding="utf-8")
    return changes, left


def files_in_scope(root: Path = REPO) -> list[Path]:
    out: list[Path] = []
    for pattern in SCOPE:
        out += sorted(root.glob(pattern))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.tools.figures", description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="*", help="markdown files (default: every lesson README, README.md, site/*.md)")
    parser.add_argument("--all", action="store_true", help="list backed figures too")
    parser.add_argument("--update", action="store_true",
                        help="rewrite each figure whose results file changed to what it says now (same format), "
                             "print every changed line to read again, and list what is left")
    args = parser.parse_args(argv)
    paths = [Path(p).resolve() for p in args.paths] or files_in_scope()
    if args.update:
        left_total = 0
        for path in paths:
            changes, left = update_file(path)
            for number, old, new in changes:
                print(f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}:{number}:\n  - {old.strip()}\n"
                      f"  + {new.strip()}")
            for finding in left:
                print(f"left: {finding}")
            left_total += len(left)
        print(f"{left_total} figure(s) left to fix by hand" if left_total else "every figure is backed",
              file=sys.stderr)
        return 1 if left_total else 0
    bad = 0
    for path in paths:
        for finding in check_file(path):
            bad += bool(finding.problem)
            if finding.problem or args.all:
                print(finding)
    print(f"{bad} figure(s) not backed" if bad else "every figure is backed", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
