"""Every lesson's "Break it" exercise, as data, checked: ``python -m tests.tools.breakits``.

A break-it is two files beside its lesson, ``lessons/lNN/breakit/<name>.patch`` (the bug, a
unified diff a learner can apply with ``git apply`` and undo with ``git apply -R``) and
``lessons/lNN/breakit/<name>.toml`` (what it predicts)::

    title = "write K one row too far"
    order = 1                                   # its place in the lesson (default: by name)

    [[run]]                                     # one or more commands, in order
    command = "pytest lessons/l01/test_l01_parity.py"
    failed = 10                                 # exact counts from pytest's summary line
    passed = 3
    skipped = 0                                 # optional, default 0
    failing = ["test_greedy_tokens_identical_to_hf[qwen3]", ...]  # optional: exactly these fail
    prints = ["mismatch for prompt 'Hello'"]    # optional: each appears in the output

    [[run]]
    command = "python lessons/l01/smoke.py --arch qwen3"
    prints = ["first difference at new token 0", "MISMATCH"]

The check copies the tracked files of the repository (as they are in the working tree) to a
scratch folder per break-it, applies the patch there (never to the real tree), runs each
command with that copy first on ``PYTHONPATH`` and compares: counts, the set of failing tests,
the messages. Pytest commands get ``-q -rfE -p no:cacheprovider`` added (none changes a count).
Break-its run in parallel, one per core by default. The exit status is 1 on any mismatch.

The README of each lesson shows each break-it's patch and prediction rendered from these files,
between ``<!-- breakit: lNN/<name> -->`` and ``<!-- /breakit -->``:
``python -m tests.tools.breakits --render`` rewrites those blocks, and the tests check that
they are up to date, so the text and the check cannot disagree.

    python -m tests.tools.breakits               # every break-it of l01..l10
    python -m tests.tools.breakits l05 l06       # those lessons only
    python -m tests.tools.breakits l06/every_chunk_samples
    python -m tests.tools.breakits --render      # rewrite the README blocks
    python -m tests.tools.breakits --show l06    # run, print every output in full
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[2]
COUNT_KEYS = ("failed", "passed", "skipped", "errors")


@dataclass
class Run:
    command: str
    failed: int | None = None
    passed: int | None = None
    skipped: int | None = None
    errors: int | None = None
    failing: list[str] | None = None
    prints: list[str] = field(default_factory=list)

    @property
    def is_pytest(self) -> bool:
        return shlex.split(self.command)[0] == "pytest"


@dataclass
class BreakIt:
    lesson: str  # "l01"
    name: str  # file stem
    title: str
    order: int
    patch: str  # the unified diff, as text
    runs: list[Run]
    toml_path: Path

    @property
    def key(self) -> str:
        return f"{self.lesson}/{self.name}"


def load(path: Path) -> BreakIt:
    """Read ``<name>.toml`` and its ``<name>.patch``."""
    data = tomllib.loads(path.read_text())
    unknown = set(data) - {"title", "order", "run", "patch"}
    if unknown:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)}")
    runs = []
    for r in data.get("run", []):
        bad = set(r) - {"command", "failing", "prints", *COUNT_KEYS}
        if bad:
            raise ValueError(f"{path}: unknown keys in [[run]]: {sorted(bad)}")
        run = Run(**r)
        if run.is_pytest and run.skipped is None:
            run.skipped = 0
        if run.is_pytest and run.errors is None:
            run.errors = 0
        runs.append(run)
    if not runs:
        raise ValueError(f"{path}: no [[run]]")
    patch_file = path.with_name(data.get("patch", path.stem + ".patch"))
    return BreakIt(
        lesson=path.parent.parent.name, name=path.stem, title=data["title"], order=data.get("order", 0),
        patch=patch_file.read_text(), runs=runs, toml_path=path,
    )


def discover(root: Path = REPO, selectors: list[str] | None = None) -> list[BreakIt]:
    """Every break-it under ``root/lessons``, in lesson order, filtered by ``selectors``
    (``l05`` or ``l05/<name>``)."""
    found = [load(p) for p in sorted((root / "lessons").glob("l*/breakit/*.toml"))]
    found.sort(key=lambda b: (b.lesson, b.order, b.name))
    if selectors:
        found = [b for b in found if any(s.rstrip("/") in (b.lesson, b.key) for s in selectors)]
    return found


# --- running ---------------------------------------------------------------------------------
def tracked_files(root: Path) -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
    return [p for p in out.decode().split("\0") if p and (root / p).is_file()]


def scratch_copy(root: Path, dest: Path, files: list[str]) -> None:
    """The tracked files of ``root`` as they are in its working tree, copied under ``dest``."""
    for rel in files:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, target)


def apply_patch(patch: str, where: Path, check_only: bool = False) -> str | None:
    """Apply ``patch`` in ``where`` (a scratch copy); the error text if it does not apply."""
    args = ["git", "apply", "--whitespace=nowarn"] + (["--check"] if check_only else [])
    proc = subprocess.run(args, cwd=where, input=patch.encode(), capture_output=True)
    return proc.stderr.decode() if proc.returncode else None


_SUMMARY = re.compile(r"^=*\s*(?P<body>(?:\d+ \w+(?:, )?)+) in [\d.]+s", re.M)
_FAILED_LINE = re.compile(r"^(?:FAILED|ERROR) (?P<id>\S+?::.+?)(?: - .*)?$", re.M)  # ids may hold spaces


def parse_pytest(output: str) -> tuple[dict[str, int], list[str]]:
    """The counts of pytest's last summary line, and the failing tests' names (``-ra`` lines,
    without the file path: ``test_x[qwen3]``)."""
    counts = dict.fromkeys(COUNT_KEYS, 0)
    matches = list(_SUMMARY.finditer(output))
    if matches:
        for part in matches[-1]["body"].split(", "):
            num, word = part.split(" ", 1)
            word = {"error": "errors", "warning": "warnings", "warnings": "warnings"}.get(word, word)
            if word in counts:
                counts[word] = int(num)
    failing = [m["id"].split("::", 1)[-1] for m in _FAILED_LINE.finditer(output)]
    return counts, failing


def compare(run: Run, output: str) -> list[str]:
    """What in ``output`` disagrees with ``run``'s prediction (empty: it all came true)."""
    problems = []
    if run.is_pytest:
        counts, failing = parse_pytest(output)
        got = ", ".join(f"{counts[k]} {k}" for k in COUNT_KEYS if counts[k])
        for key in COUNT_KEYS:
            want = getattr(run, key)
            if want is not None and counts[key] != want:
                problems.append(f"predicted {want} {key}, got {counts[key]} ({got or 'no summary line'})")
        if run.failing is not None and sorted(set(failing)) != sorted(set(run.failing)):
            missing = sorted(set(run.failing) - set(failing))
            extra = sorted(set(failing) - set(run.failing))
            problems.append(f"failing tests differ: predicted but passed {missing}, failed unpredicted {extra}")
    for text in run.prints:
        if text not in output:
            problems.append(f"the output does not contain {text!r}")
    return problems


@dataclass
class Result:
    breakit: BreakIt
    problems: list[str]
    seconds: float
    outputs: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems


def command_args(run: Run) -> list[str]:
    args = shlex.split(run.command)
    if run.is_pytest:
        return [sys.executable, "-m", "pytest", *args[1:], "-q", "-rfE", "-p", "no:cacheprovider"]
    if args[0] == "python":
        return [sys.executable, *args[1:]]
    return args


def run_breakit(b: BreakIt, root: Path = REPO, files: list[str] | None = None, timeout: float = 900) -> Result:
    """Apply ``b`` in a fresh scratch copy of ``root`` and run its commands."""
    start = time.monotonic()
    outputs: list[str] = []
    with tempfile.TemporaryDirectory(prefix=f"breakit-{b.lesson}-{b.name}-") as tmp:
        where = Path(tmp) / "repo"
        scratch_copy(root, where, files if files is not None else tracked_files(root))
        error = apply_patch(b.patch, where)
        if error:
            return Result(b, [f"the patch does not apply: {error.strip()}"], time.monotonic() - start, outputs)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(where), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
        env.pop("PYTEST_ADDOPTS", None)
        problems = []
        for run in b.runs:
            try:
                proc = subprocess.run(command_args(run), cwd=where, env=env, capture_output=True, text=True, timeout=timeout)
                output = proc.stdout + proc.stderr
            except subprocess.TimeoutExpired as exc:
                output = f"{exc.stdout or ''}{exc.stderr or ''}\n[timed out after {timeout} s]"
            outputs.append(output)
            problems += [f"`{run.command}`: {p}" for p in compare(run, output)]
        _kill_leftovers(where)
    return Result(b, problems, time.monotonic() - start, outputs)


def _kill_leftovers(where: Path) -> None:
    """Kill what a broken run left behind in the scratch copy (e.g. server children whose parent
    died): every process whose working directory is inside ``where`` (Linux only)."""
    import signal

    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        if cwd == str(where) or cwd.startswith(str(where) + os.sep):
            try:
                os.kill(int(proc.name), signal.SIGKILL)
            except OSError:
                pass


def run_all(breakits: list[BreakIt], root: Path = REPO, jobs: int | None = None, report=print,
            save: Path | None = None) -> list[Result]:
    files = tracked_files(root)
    jobs = max(1, jobs or os.cpu_count() or 1)
    # The slowest first, so that two long ones do not end up last on one core.
    slow_first = sorted(breakits, key=lambda b: -sum(len(r.command) + 200 * ("lessons/l10" in r.command) for r in b.runs))
    results = []

    def one(b: BreakIt) -> Result:
        result = run_breakit(b, root, files)
        if save is not None:
            save.mkdir(parents=True, exist_ok=True)
            for i, out in enumerate(result.outputs):
                (save / f"{b.lesson}-{b.name}-{i}.txt").write_text(out)
        verdict = "ok" if result.ok else "MISMATCH"
        report(f"{verdict:8s} {b.key:40s} {result.seconds:6.1f} s")
        for p in result.problems:
            report(f"         {p}")
        return result

    with ThreadPoolExecutor(jobs) as pool:
        results = list(pool.map(one, slow_first))
    order = {b.key: i for i, b in enumerate(breakits)}
    return sorted(results, key=lambda r: order[r.breakit.key])


# --- the README blocks -------------------------------------------------------------------------
_BLOCK = re.compile(
    r"^(?P<indent>[ \t]*)<!-- breakit: (?P<key>\S+) -->\n.*?^[ \t]*<!-- /breakit -->$", re.M | re.S
)


def render(b: BreakIt) -> str:
    """The markdown a README shows for ``b``: the patch, then each command's prediction."""
    lines = [
        f"[`breakit/{b.name}.patch`](breakit/{b.name}.patch)"
        f" (`git apply lessons/{b.lesson}/breakit/{b.name}.patch` puts the bug in, `git apply -R` takes it out):",
        "",
        "```diff",
        *b.patch.rstrip("\n").splitlines(),
        "```",
        "",
        f"Predicted, and checked by CI (`python -m tests.tools.breakits {b.key}`):",
        "",
    ]
    for run in b.runs:
        item = f"* `{run.command}`"
        if run.is_pytest:
            counts = [f"{getattr(run, k)} {k}" for k in COUNT_KEYS if getattr(run, k)]
            item += ": **" + (", ".join(counts) or "nothing runs") + "**"
            if run.failing is not None and run.failing:
                item += "; failing: " + ", ".join(f"`{t}`" for t in run.failing)
        if run.prints:
            item += ("; the output contains " if run.is_pytest else " prints ") + ", ".join(f"`{p}`" for p in run.prints)
        lines.append(item)
    return "\n".join(lines)


def render_readme(text: str, breakits: dict[str, BreakIt]) -> str:
    """``text`` with every ``<!-- breakit: KEY -->`` block rendered from ``breakits``."""

    def replace(m: re.Match) -> str:
        indent, key = m["indent"], m["key"]
        if key not in breakits:
            raise KeyError(f"README block for unknown break-it {key}")
        body = render(breakits[key])
        body_lines = [(indent + line) if line else "" for line in body.splitlines()]
        # Blank lines around the body: markdown must not read it as part of the HTML comments.
        return "\n".join([f"{indent}<!-- breakit: {key} -->", "", *body_lines, "", f"{indent}<!-- /breakit -->"])

    return _BLOCK.sub(replace, text)


def readme_keys(text: str) -> list[str]:
    return [m["key"] for m in _BLOCK.finditer(text)]


def render_all(root: Path = REPO, write: bool = True) -> list[Path]:
    """Rewrite (or, ``write=False``, only find) the READMEs whose blocks are out of date."""
    by_key = {b.key: b for b in discover(root)}
    stale = []
    for readme in sorted((root / "lessons").glob("l*/README.md")):
        text = readme.read_text()
        new = render_readme(text, by_key)
        if new != text:
            stale.append(readme)
            if write:
                readme.write_text(new)
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.tools.breakits", description=__doc__.split("\n")[0])
    parser.add_argument("select", nargs="*", help="lessons (l05) or break-its (l05/<name>); default: all")
    parser.add_argument("-j", "--jobs", type=int, default=None, help="break-its at a time (default: one per core)")
    parser.add_argument("--render", action="store_true", help="rewrite the README blocks from the data and exit")
    parser.add_argument("--show", action="store_true", help="print every command's output")
    parser.add_argument("--list", action="store_true", help="list the break-its and exit")
    parser.add_argument("--root", type=Path, default=REPO, help=argparse.SUPPRESS)  # the tests' fake repositories
    parser.add_argument("--save", metavar="DIR", help="write every command's output to DIR/<lesson>-<name>-<i>.txt")
    args = parser.parse_args(argv)
    if args.render:
        for path in render_all(args.root):
            print(f"rewrote {path.relative_to(args.root)}")
        return 0
    breakits = discover(args.root, args.select)
    if args.list:
        for b in breakits:
            print(f"{b.key:40s} {b.title}")
        return 0
    if not breakits:
        print(f"no break-its match {args.select}", file=sys.stderr)
        return 2
    stale = render_all(args.root, write=False)
    start = time.monotonic()
    jobs = args.jobs or os.cpu_count() or 1
    print(f"{len(breakits)} break-its, {jobs} at a time, each in a scratch copy of {args.root}", flush=True)
    results = run_all(breakits, args.root, jobs, report=lambda s: print(s, flush=True),
                      save=Path(args.save) if args.save else None)
    if args.show:
        for r in results:
            for run, out in zip(r.breakit.runs, r.outputs):
                print(f"\n===== {r.breakit.key}: {run.command}\n{out}")
    bad = [r for r in results if not r.ok]
    print(f"\n{len(results) - len(bad)}/{len(results)} break-its as predicted in {time.monotonic() - start:.0f} s")
    for path in stale:
        print(f"README out of date with its break-its: {path.relative_to(args.root)} "
              "(python -m tests.tools.breakits --render)")
    return 1 if bad or stale else 0


if __name__ == "__main__":
    sys.exit(main())
