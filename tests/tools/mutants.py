"""Every lesson's mutants, run: ``python -m tests.tools.mutants``.

A mutant is a learner-plausible *wrong* solution of a lesson's exercise, kept beside the lesson
as ``lessons/lNN/mutants/<short_name>.py``: a module docstring whose first line says the
mistake and, after a blank line, which promise it breaks; then one or more function
definitions with exactly the names and signatures of functions of ``lessons/lNN/exercise.py``,
with a wrong body (imports at the top of the file if it needs any)::

    \"\"\"free() puts the freed blocks at the front of the free list (LIFO).

    Breaks FIFO reuse: a just-freed block must be reused last (BlockAllocator.free's docstring).
    \"\"\"
    # first: lessons/l02/test_l02_blocks.py::test_free_list_is_fifo

    def free(self, blocks):
        ...

The lesson's tests must *kill* every one: the package's bodies put into the exercise file
(:func:`tests.tools.exercises.solution_source`), then the mutant's source appended (a later
definition shadows the solved one), run as the learner's file::

    pytest lessons/lNN --mine --mine-file lNN=<that file> -x -q -p no:cacheprovider

It is **killed** iff pytest exits with 1 (a test failed). Exit 0 is a **survivor** (the tests
let a wrong solution through); anything else (the file does not compile, a usage or collection
error, a crash, the time limit) is a **broken** mutant: it proves nothing and is reported too.

Speed: each run stops at its first failure (``-x``); the tests named by the mutant's
``# first: NODEID`` lines (a test file or a test, any number of lines) run before the rest of
the lesson's (the order is the only change: every test of the lesson still runs if the mutant
survives them); mutants run in parallel, one pytest process each.

    python -m tests.tools.mutants                    # every mutant of every lesson
    python -m tests.tools.mutants l02 l05            # those lessons
    python -m tests.tools.mutants l02/lifo_free      # one mutant
    python -m tests.tools.mutants --workers 2 --timeout 300 --show
    python -m tests.tools.mutants --list

The exit status is 1 if any mutant survived or is broken. ``tests/test_mutants.py`` checks the
format of every mutant file and this runner's verdicts; CI runs the mutants themselves.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIRST_ENV = "MINISGL_MUTANT_FIRST"  # the node ids to run first, as JSON (read by the hook below)
DEFAULT_TIMEOUT = 300.0
_FIRST_LINE = re.compile(r"^#\s*first:\s*(?P<node>\S+)\s*$", re.M)


@dataclass
class Mutant:
    lesson: int
    name: str
    path: Path

    @property
    def key(self) -> str:
        return f"l{self.lesson:02d}/{self.name}"

    @property
    def source(self) -> str:
        return self.path.read_text()

    @property
    def title(self) -> str:
        """The docstring's first line: the mistake."""
        doc = ast.get_docstring(ast.parse(self.source)) or ""
        return doc.strip().splitlines()[0] if doc.strip() else ""

    @property
    def first(self) -> list[str]:
        """The ``# first: NODEID`` lines: tests that run before the rest of the lesson's."""
        return [m["node"] for m in _FIRST_LINE.finditer(self.source)]


def discover(root: Path = REPO, selectors: list[str] | None = None) -> list[Mutant]:
    """Every ``lessons/lNN/mutants/*.py`` under ``root``, in lesson and name order, filtered by
    ``selectors`` (``l05`` or ``l05/<name>``)."""
    found = []
    for path in sorted((root / "lessons").glob("l[0-9][0-9]/mutants/*.py")):
        if path.name.startswith("_"):
            continue
        found.append(Mutant(int(path.parent.parent.name[1:]), path.stem, path))
    if selectors:
        wanted = [s.strip("/").removeprefix("lessons/").replace("/mutants/", "/").removesuffix(".py")
                  for s in selectors]
        found = [m for m in found if any(s in (m.key[:3], m.key) for s in wanted)]
    return found


def compose(mutant: Mutant) -> str:
    """The learner's file this mutant stands for: the solved exercise, then the wrong bodies."""
    from tests.tools.exercises import solution_source

    return solution_source(mutant.lesson) + "\n\n" + mutant.source


# --- one run -----------------------------------------------------------------------------------


@dataclass
class Outcome:
    mutant: Mutant
    verdict: str  # "killed" | "SURVIVED" | "BROKEN"
    seconds: float
    killed_by: str = ""  # the first failing test's node id
    detail: str = ""  # why it is broken; the failure's first line when killed
    output: str = field(default="", repr=False)

    @property
    def ok(self) -> bool:
        return self.verdict == "killed"


_FAILED = re.compile(r"^(?P<kind>FAILED|ERROR) (?P<id>\S+?::\S.*?)(?: - (?P<why>.*))?$", re.M)


def classify(rc: int | None, output: str, timed_out: bool = False, timeout: float = 0) -> tuple[str, str, str]:
    """``(verdict, killed_by, detail)`` of a finished pytest run."""
    if timed_out:
        return "BROKEN", "", f"timed out after {timeout:.0f} s (not a kill: a test must fail)"
    if rc == 0:
        return "SURVIVED", "", "every test of the lesson passed"
    if rc == 1:
        failed = _FAILED.search(output)
        if failed:
            return "killed", failed["id"], (failed["why"] or failed["kind"]).strip()
        return "killed", "?", "pytest exited 1 without a FAILED line"
    meaning = {2: "interrupted (a collection error?)", 3: "internal error (the --mine swap failed?)",
               4: "usage error", 5: "no tests collected"}
    if rc is not None and rc < 0:
        what = f"killed by signal {-rc}"
    else:
        what = meaning.get(rc, f"exit status {rc}")
    last = [line for line in output.strip().splitlines() if line.strip()][-1:] or [""]
    return "BROKEN", "", f"pytest {what}: {last[0][:200]}"


def command_for(mutant: Mutant, learner_file: Path, tests: list[str] | None = None) -> list[str]:
    """The command that runs ``mutant``'s lesson (or ``tests``) on ``learner_file``."""
    lesson = f"l{mutant.lesson:02d}"
    targets = tests if tests is not None else [f"lessons/{lesson}"]
    return [sys.executable, "-m", "pytest", *targets, "--mine", f"--mine-file={lesson}={learner_file}",
            "-x", "-q", "-rfE", "-p", "no:cacheprovider", "-p", "tests.tools.mutants"]


def run_mutant(mutant: Mutant, timeout: float = DEFAULT_TIMEOUT, tests: list[str] | None = None,
               root: Path = REPO) -> Outcome:
    """Compose ``mutant``, run its lesson's tests on it (or ``tests``) and classify the result."""
    start = time.monotonic()
    try:
        source = compose(mutant)
        compile(source, str(mutant.path), "exec")
    except Exception as exc:  # noqa: BLE001  (a SyntaxError, a stale exercise table...)
        return Outcome(mutant, "BROKEN", time.monotonic() - start, detail=f"does not compose: {exc!r}")
    with tempfile.TemporaryDirectory(prefix=f"mutant-{mutant.lesson:02d}-{mutant.name}-") as tmp:
        learner = Path(tmp) / f"exercise_l{mutant.lesson:02d}_{mutant.name}.py"
        learner.write_text(source)
        env = {k: v for k, v in os.environ.items()
               if k not in ("MINISGL_EXERCISES", "PYTHONPATH", "PYTEST_ADDOPTS")}
        env[FIRST_ENV] = json.dumps(mutant.first)
        env["HYPOTHESIS_STORAGE_DIRECTORY"] = str(Path(tmp) / "hypothesis")  # no shared example database
        proc = subprocess.Popen(command_for(mutant, learner, tests), cwd=root, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        timed_out = False
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            output, _ = proc.communicate()
        _kill_group(proc)  # what the run left behind (a server's children, a rank process)
    verdict, killed_by, detail = classify(proc.returncode, output or "", timed_out, timeout)
    return Outcome(mutant, verdict, time.monotonic() - start, killed_by, detail, output or "")


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the process group this runner started for one mutant (its pytest and its children)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# --- the pytest hook: the mutant's first tests first ------------------------------------------


def pytest_collection_modifyitems(session, config, items) -> None:
    """Loaded with ``-p tests.tools.mutants``: move the tests ``MINISGL_MUTANT_FIRST`` names
    (node ids or their prefixes: a file, a test, a parametrized case) to the front, in the
    order named; the rest keep pytest's order. Nothing is deselected."""
    first = json.loads(os.environ.get(FIRST_ENV) or "[]")
    if not first:
        return

    def rank(item) -> int:
        for i, node in enumerate(first):
            if item.nodeid == node or item.nodeid.startswith((node + "::", node + "[")):
                return i
        return len(first)

    items.sort(key=rank)  # stable


# --- many runs ----------------------------------------------------------------------------------


def default_workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def run_all(mutants: list[Mutant], workers: int | None = None, timeout: float = DEFAULT_TIMEOUT,
            report=print, tests: list[str] | None = None) -> list[Outcome]:
    """Run every mutant, ``workers`` at a time; ``report`` gets a line per finished mutant."""
    workers = workers or default_workers()
    # Later lessons first: their runs are the longest (processes, servers), so that the short
    # ones fill the gaps at the end instead of one long run ending alone.
    order = sorted(mutants, key=lambda m: -m.lesson)

    def one(m: Mutant) -> Outcome:
        outcome = run_mutant(m, timeout, tests)
        report(row(outcome))
        return outcome

    with ThreadPoolExecutor(workers) as pool:
        outcomes = list(pool.map(one, order))
    index = {m.key: i for i, m in enumerate(mutants)}
    return sorted(outcomes, key=lambda o: index[o.mutant.key])


def row(o: Outcome) -> str:
    """One line of the table: lesson, mutant, verdict (the killing test), seconds."""
    if o.verdict == "killed":
        what = "killed by " + re.sub(r"^lessons/l\d\d/", "", o.killed_by)
    else:
        what = f"{o.verdict}: {o.detail}"
    return f"l{o.mutant.lesson:02d}  {o.mutant.name:34s} {o.seconds:6.1f} s  {what}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.tools.mutants", description=__doc__.split("\n")[0])
    parser.add_argument("select", nargs="*", help="lessons (l05) or mutants (l05/<name>); default: all")
    parser.add_argument("--workers", "-j", type=int, default=None,
                        help=f"mutants at a time (default: one per core, at most 4; here {default_workers()})")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per mutant (default: %(default)s)")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--show", action="store_true", help="print the whole pytest output of survivors and broken ones")
    parser.add_argument("--root", type=Path, default=REPO, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    mutants = discover(args.root, args.select)
    if args.list:
        for m in mutants:
            print(f"{m.key:40s} {m.title}")
        return 0
    if not mutants:
        print(f"no mutants match {args.select}", file=sys.stderr)
        return 2
    workers = args.workers or default_workers()
    lessons = sorted({m.lesson for m in mutants})
    print(f"{len(mutants)} mutants of {len(lessons)} lesson(s), {workers} at a time, "
          f"each stopped at its first failing test (timeout {args.timeout:.0f} s)", flush=True)
    start = time.monotonic()
    outcomes = run_all(mutants, workers, args.timeout, report=lambda s: print(s, flush=True))
    wall = time.monotonic() - start

    print("\nlesson  mutant                             seconds  verdict")
    for o in outcomes:
        print(row(o))
    bad = [o for o in outcomes if not o.ok]
    for o in bad:
        print(f"\n===== {o.mutant.key} ({o.mutant.path.relative_to(args.root)}): {o.verdict}\n{o.mutant.title}")
        print(o.output if args.show else "\n".join(o.output.strip().splitlines()[-15:]))
    per_lesson = ", ".join(f"l{n:02d} {sum(o.ok for o in outcomes if o.mutant.lesson == n)}/"
                           f"{sum(o.mutant.lesson == n for o in outcomes)}" for n in lessons)
    print(f"\n{len(outcomes) - len(bad)}/{len(outcomes)} mutants killed ({per_lesson}) in {wall:.0f} s "
          f"with {workers} workers")
    survived = [o.mutant.key for o in outcomes if o.verdict == "SURVIVED"]
    broken = [o.mutant.key for o in outcomes if o.verdict == "BROKEN"]
    if survived:
        print(f"SURVIVED (the lesson's tests let them through): {', '.join(survived)}")
    if broken:
        print(f"BROKEN (no verdict; fix the mutant or the run): {', '.join(broken)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
