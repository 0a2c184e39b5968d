"""The exercises: ``pytest lessons/lNN --mine`` runs a lesson's tests on the learner's code.

Every lesson has a learner's file, ``lessons/lNN/exercise.py``: the lesson's key functions as
stubs (signature, docstring, hints, ``raise NotImplementedError``). :data:`EXERCISES` says which
package function each stub replaces. With ``--mine`` (the root ``conftest.py`` registers the
option and this module's :class:`MinePlugin`), the package's implementation of exactly those
functions is swapped for the learner's before the tests are collected; everything else stays the
package's. Without ``--mine`` nothing here runs.

How the swap works:

* a method is replaced on the class that defines it (``setattr(RadixCache, "insert", learner)``),
  so every instance and every subclass that does not override it runs the learner's code; a
  ``classmethod`` stays one;
* a module-level function is replaced in its module *and* in every module of the repository
  that imported it by name (``from minisgl.engine.graph import bucket_sizes``): those hold their
  own reference, found by identity in ``sys.modules`` and in the collected test modules;
* **child processes** (lesson 9's rank processes, lesson 10's server and its children) are fresh
  interpreters that import ``minisgl`` anew, so a swap in the pytest process does not reach them.
  ``--mine`` therefore puts a folder with a ``sitecustomize.py`` first on ``sys.path`` and on
  ``PYTHONPATH`` (both the rank launcher and the server pass ``sys.path`` on as ``PYTHONPATH``)
  and describes the swap in the ``MINISGL_EXERCISES`` environment variable; every child Python
  runs ``sitecustomize`` at start-up and makes the same swap (:func:`install_from_env`) before it
  runs anything else. A rank's ``rank_init`` (the tests' injected bugs) runs after it, so an
  injected bug still overrides the learner's function, as it overrides the package's.

Failures point at the learner: the stubs' ``NotImplementedError`` names the exercise and the
file, the report header lists the swapped functions and the absolute path of the file they came
from, and a failing test's report gets a section saying which of the learner's functions ran in
that process. A test that runs a control (the workload on the code under test, before it
injects a bug) says whose code that was: :func:`code_under_test`.

``python lessons/lNN/smoke.py --mine [--mine-file PATH]`` makes the same swap for the smoke run
(:func:`mine_for_script`, called by every smoke script when its command line has ``--mine``).

The lessons' mutants (``lessons/lNN/mutants/``, wrong solutions the tests must reject) run
through this harness too: :mod:`tests.tools.mutants`.

``tests/test_exercises.py`` checks the harness for every lesson: the untouched stubs fail a
subset of the lesson's tests (:data:`HARNESS_TESTS`), and the package's own bodies placed in the
exercise file (:func:`solution_source`) pass it.
"""

from __future__ import annotations

import ast
import atexit
import importlib
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
import textwrap
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
ENV = "MINISGL_EXERCISES"


@dataclass(frozen=True)
class Exercise:
    """The learner's function ``name`` in ``lessons/lNN/exercise.py`` replaces ``target``,
    written ``"package.module:Name"`` (a function) or ``"package.module:Class.method"``."""

    name: str
    target: str

    @property
    def module(self) -> str:
        return self.target.partition(":")[0]

    @property
    def qualname(self) -> str:
        return self.target.partition(":")[2]


def _ex(name: str, target: str) -> Exercise:
    return Exercise(name, target)


EXERCISES: dict[int, list[Exercise]] = {
    1: [_ex("step", "minisgl.generate:SequenceGenerator.step"),
        _ex("store", "minisgl.attention.contiguous:ContiguousBackend.store"),
        _ex("forward", "minisgl.attention.contiguous:ContiguousBackend.forward")],
    2: [_ex("alloc", "minisgl.kvcache.allocator:BlockAllocator.alloc"),
        _ex("free", "minisgl.kvcache.allocator:BlockAllocator.free"),
        _ex("reserve", "minisgl.kvcache.block_table:BlockTable.reserve"),
        _ex("slots", "minisgl.kvcache.block_table:BlockTable.slots")],
    3: [_ex("from_requests", "minisgl.attention.metadata:BatchMetadata.from_requests"),
        _ex("attend_row", "minisgl.attention.paged:ReferencePagedBackend._attend_row")],
    4: [_ex("next_batch", "minisgl.scheduler.scheduler:WholePrompts.next_batch"),
        _ex("build_batch", "minisgl.scheduler.scheduler:Scheduler.build_batch")],
    5: [_ex("match_prefix", "minisgl.kvcache.radix_cache:RadixCache.match_prefix"),
        _ex("insert", "minisgl.kvcache.radix_cache:RadixCache.insert"),
        _ex("evict", "minisgl.kvcache.radix_cache:RadixCache.evict")],
    6: [_ex("next_batch", "minisgl.scheduler.chunked:ChunkedPrefill.next_batch")],
    7: [_ex("step", "minisgl.scheduler.overlap:OverlapLoop.step"),
        _ex("flush", "minisgl.scheduler.overlap:OverlapLoop.flush"),
        _ex("row_done", "minisgl.scheduler.overlap:OverlapLoop.row_done"),
        _ex("release", "minisgl.scheduler.overlap:OverlapLoop.release")],
    8: [_ex("bucket_sizes", "minisgl.engine.graph:bucket_sizes"),
        _ex("bucket_for", "minisgl.engine.graph:GraphRunner.bucket_for"),
        _ex("padded", "minisgl.attention.metadata:BatchMetadata.padded")],
    9: [_ex("row_parallel_forward", "minisgl.layers.parallel:RowParallelLinear.forward"),
        _ex("vocab_parallel_embedding_forward", "minisgl.layers.parallel:VocabParallelEmbedding.forward"),
        _ex("parallel_lm_head_forward", "minisgl.layers.parallel:ParallelLMHead.forward")],
    10: [_ex("feed", "minisgl.detokenizer:StopStringFilter.feed"),
         _ex("partial_match_len", "minisgl.detokenizer:StopStringFilter._partial_match_len")],
    11: [_ex("router_forward", "minisgl.layers.moe:Router.forward"),
         _ex("group_by_expert", "minisgl.layers.fused_moe:group_by_expert")],
    12: [_ex("accept_greedy", "minisgl.engine.verify:accept_greedy"),
         _ex("greedy_tokens", "minisgl.engine.verify:greedy_tokens"),
         _ex("accept_sampled", "minisgl.engine.verify:accept_sampled"),
         _ex("release_unverified_pages", "minisgl.scheduler.speculative:release_unverified_pages")],
}

# The harness check (tests/test_exercises.py) runs these tests of each lesson twice: with the
# stubs (must fail) and with the package's bodies in the exercise file (must pass). Each is a
# small, quick subset of the lesson's tests that runs every exercise of the lesson.
HARNESS_TESTS: dict[int, list[str]] = {
    1: ["lessons/l01/test_l01_parity.py::test_without_cache_gives_same_tokens",
        "lessons/l01/test_l01_parity.py::test_cache_overflow_is_a_clear_error"],
    2: ["lessons/l02/test_l02_blocks.py"],
    3: ["lessons/l03/test_l03_paged.py::test_readme_worked_example",
        "lessons/l03/test_l03_paged.py::test_from_requests_rejects_bad_input",
        "lessons/l03/test_l03_paged.py::test_equality_check_catches_injected_bugs"],
    4: ["lessons/l04/test_l04_batching.py::test_tiny_kv_pool_makes_requests_wait_and_still_matches"],
    5: ["lessons/l05/test_l05_radix.py::test_scripted_hit_counts_are_exactly_as_predicted",
        "lessons/l05/test_l05_radix.py::test_eviction_under_pressure_stays_identical"],
    6: ["lessons/l06/test_l06_chunked.py::test_a_short_request_is_not_stuck_behind_a_long_prompt",
        "lessons/l06/test_l06_chunked.py::test_chunked_prefill_matches_hf_alone[qwen3-3]"],
    7: ["lessons/l07/test_l07_overlap.py::test_aborts_in_flight_free_everything_exactly_once",
        "lessons/l07/test_l07_overlap.py::test_overlap_with_whole_prompts_and_cache_off"],
    8: ["lessons/l08/test_l08_graphs.py::test_bucket_ladder",
        "lessons/l08/test_l08_graphs.py::test_every_bucket_boundary_matches_hf[qwen3]"],
    9: ["lessons/l09/test_l09_tp.py::test_tp2_matches_hf[qwen3]"],
    10: ["lessons/l10/test_l10_server.py::test_teeth_a_filter_that_emits_a_stop_prefix_is_caught"],
    11: ["lessons/l11/test_l11_model.py::test_router_picks_the_top_k_of_a_float32_softmax",
         "lessons/l11/test_l11_model.py::test_greedy_tokens_identical_to_hf[sparse_step]",
         "lessons/l11/test_l11_fused_moe.py::test_slots_are_grouped_by_expert_in_whole_blocks"],
    12: ["lessons/l12/test_l12_verify.py::test_greedy_accepts_the_matching_prefix_then_adds_the_targets_token",
         "lessons/l12/test_l12_verify.py::test_speculative_sampling_keeps_the_target_distribution",
         "lessons/l12/test_l12_engine.py::test_alone_and_batched_match_hf[llama]"],
}


def exercise_file(lesson: int) -> Path:
    return REPO / "lessons" / f"l{lesson:02d}" / "exercise.py"


def lessons_in(args: list[str], rootdir: Path) -> list[int]:
    """The lessons named by pytest's arguments (``lessons/l05``, ``lessons/l05/test_x.py::t``)."""
    found = set()
    for arg in args:
        path = Path(arg.split("::")[0])
        path = (path if path.is_absolute() else Path(rootdir) / path).resolve()
        match = re.search(r"(?:^|/)lessons/l(\d\d)(?:/|$)", path.as_posix())
        if match and int(match.group(1)) in EXERCISES:
            found.add(int(match.group(1)))
    return sorted(found)


def load_learner_module(lesson: int, path: Path) -> types.ModuleType:
    """Import a learner's file (by path: lesson folders are not packages)."""
    name = f"minisgl_exercise_l{lesson:02d}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _resolve(exercise: Exercise) -> tuple[Any, str]:
    """The object that owns the target (a class or the module) and the attribute's name."""
    owner: Any = importlib.import_module(exercise.module)
    *path, attr = exercise.qualname.split(".")
    for part in path:
        owner = getattr(owner, part)
    if attr not in vars(owner):
        raise AttributeError(f"{exercise.target}: not defined there (the exercise table is out of date)")
    return owner, attr


@dataclass
class Swap:
    lesson: int
    exercise: Exercise
    owner: Any
    attr: str
    original: Any  # as stored on the owner (a classmethod object stays one)
    learner: Any
    aliases: list[tuple[Any, str]]  # other modules that hold the original by name


class Swapper:
    """Replaces the package's functions by the learner's; :meth:`undo` puts them back."""

    def __init__(self) -> None:
        self.swaps: list[Swap] = []

    def install(self, lesson: int, path: Path) -> None:
        learner_module = load_learner_module(lesson, path)
        for exercise in EXERCISES[lesson]:
            fn = getattr(learner_module, exercise.name, None)
            if not callable(fn):
                raise AttributeError(f"{path}: no function {exercise.name}() (it replaces {exercise.target})")
            owner, attr = _resolve(exercise)
            original = vars(owner)[attr]
            learner = classmethod(fn) if isinstance(original, classmethod) else fn
            setattr(owner, attr, learner)
            self.swaps.append(Swap(lesson, exercise, owner, attr, original, learner, []))
        self.patch_aliases(_repo_modules())

    def patch_aliases(self, modules) -> None:
        """Point every by-name import of a swapped module-level function at the learner's."""
        for swap in self.swaps:
            if not isinstance(swap.owner, types.ModuleType):
                continue
            for module in modules:
                namespace = vars(module)
                for name, value in list(namespace.items()):
                    if value is swap.original and module is not swap.owner:
                        namespace[name] = swap.learner
                        swap.aliases.append((module, name))

    def undo(self) -> None:
        for swap in reversed(self.swaps):
            setattr(swap.owner, swap.attr, swap.original)
            for module, name in swap.aliases:
                vars(module)[name] = swap.original
        self.swaps.clear()


def _repo_modules() -> list[types.ModuleType]:
    """Loaded modules whose file is in this repository (the package, the lessons' tests)."""
    out = []
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if file and Path(file).resolve().is_relative_to(REPO) and module.__name__ != __name__:
            out.append(module)
    return out


def install_from_env() -> Swapper | None:
    """In a child process: make the swap that ``MINISGL_EXERCISES`` describes (if set)."""
    spec = os.environ.get(ENV)
    if not spec:
        return None
    swapper = Swapper()
    for lesson, path in json.loads(spec).items():
        swapper.install(int(lesson), Path(path))
    return swapper


_SITECUSTOMIZE = '''\
"""Written by tests.tools.exercises for a --mine run: the learner's functions in child processes."""
import os

if os.environ.get("MINISGL_EXERCISES"):
    from tests.tools.exercises import install_from_env

    install_from_env()
'''


class ChildSwap:
    """Make child processes (lesson 9's ranks, lesson 10's server) swap in the same files at
    start-up: a ``sitecustomize.py`` folder first on ``sys.path`` and ``PYTHONPATH``, and the swap
    described in ``MINISGL_EXERCISES``. :meth:`undo` puts the environment back."""

    def __init__(self, files: dict[int, Path]) -> None:
        self._saved_env = {k: os.environ.get(k) for k in (ENV, "PYTHONPATH")}
        self.site_dir = tempfile.mkdtemp(prefix="minisgl-mine-")
        Path(self.site_dir, "sitecustomize.py").write_text(_SITECUSTOMIZE)
        sys.path.insert(0, self.site_dir)
        os.environ[ENV] = json.dumps({str(k): str(v) for k, v in files.items()})
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (self.site_dir, str(REPO), os.environ.get("PYTHONPATH"))
                                                   if p)

    def undo(self) -> None:
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if self.site_dir in sys.path:
            sys.path.remove(self.site_dir)
        shutil.rmtree(self.site_dir, ignore_errors=True)


def describe(files: dict[int, Path], swapper: Swapper) -> list[str]:
    """The ``--mine`` header: whose code runs, from which file (an absolute path: a learner whose
    environment imported another checkout sees it), in place of what."""
    lines = []
    for lesson, path in files.items():
        names = ", ".join(f"{s.exercise.name}() -> {s.exercise.target}" for s in swapper.swaps if s.lesson == lesson)
        lines.append(f"--mine: lesson {lesson} runs YOUR code from {Path(path).resolve()}: {names}")
    return lines


def code_under_test(lesson: int) -> str:
    """Whose code a test of ``lesson`` is running, for messages such as a control run's: the
    learner's file under ``--mine`` (here or in a child process), else the package's."""
    spec = json.loads(os.environ.get(ENV) or "{}")
    if str(lesson) in spec:
        return f"YOUR code (--mine: {spec[str(lesson)]})"
    return "the package's code (no --mine)"


def parse_mine_args(argv: list[str]) -> tuple[bool, str | None, list[str]]:
    """``(mine, file, rest)`` of a script's command line: whether ``--mine`` or ``--mine-file``
    is given, the file (``--mine-file PATH`` or ``--mine-file=PATH``; ``None``: the lesson's own
    exercise file), and the other arguments in order."""
    rest: list[str] = []
    mine, file = False, None
    args = iter(argv)
    for arg in args:
        if arg == "--mine":
            mine = True
        elif arg == "--mine-file":
            mine, file = True, next(args, None)
            if file is None:
                raise SystemExit("--mine-file needs a PATH")
        elif arg.startswith("--mine-file="):
            mine, file = True, arg.partition("=")[2]
        else:
            rest.append(arg)
    return mine, file, rest


def mine_for_script(lesson: int, argv: list[str] | None = None) -> list[str]:
    """``python lessons/lNN/smoke.py --mine [--mine-file PATH]``: the smoke run with the
    learner's functions (``lessons/lNN/exercise.py``, or ``PATH``) in place of the package's, in
    this process and in its children, as ``pytest --mine`` swaps them. Prints the header and
    returns ``argv`` (default ``sys.argv``) without those options; without ``--mine`` (or
    ``--mine-file``) it changes nothing and returns ``argv`` as it is."""
    argv = list(sys.argv if argv is None else argv)
    mine, file, rest = parse_mine_args(argv)
    if not mine:
        return argv
    path = Path(file).resolve() if file else exercise_file(lesson)
    swapper = Swapper()
    swapper.install(lesson, path)
    children = ChildSwap({lesson: path})
    atexit.register(children.undo)
    for line in describe({lesson: path}, swapper):
        print(line, flush=True)
    return rest


def mine_files(values: list[str], lessons: list[int]) -> dict[int, Path]:
    """The ``--mine-file`` values: ``lNN=PATH`` for a lesson, or one bare ``PATH`` when the run
    names exactly one lesson."""
    import pytest

    files: dict[int, Path] = {}
    for value in values:
        m = re.fullmatch(r"l(\d\d)=(.+)", value)
        if m:
            lesson, path = int(m.group(1)), m.group(2)
        elif len(lessons) == 1 and len(values) == 1:
            lesson, path = lessons[0], value
        else:
            raise pytest.UsageError(f"--mine-file {value}: with several lessons, say which: --mine-file lNN=PATH")
        if lesson not in lessons:
            raise pytest.UsageError(f"--mine-file {value}: lesson {lesson} is not among the tests run")
        files[lesson] = Path(path).resolve()
    return files


class MinePlugin:
    """The ``--mine`` run: swap before collection, say so in the report, undo at the end."""

    def __init__(self, config) -> None:
        self.config = config
        lessons = lessons_in(list(config.args), config.rootpath)
        if not lessons:
            import pytest

            raise pytest.UsageError("--mine runs a lesson's tests on your code: name the lesson, "
                                    "e.g. pytest lessons/l05 --mine")
        self.files = {lesson: exercise_file(lesson) for lesson in lessons}
        self.files.update(mine_files(config.getoption("--mine-file") or [], lessons))
        self.swapper = Swapper()
        for lesson, path in self.files.items():
            self.swapper.install(lesson, path)
        self.children = ChildSwap(self.files)  # TP ranks, the server: the same swap at start-up

    def describe(self) -> list[str]:
        return describe(self.files, self.swapper)

    def pytest_report_header(self, config) -> list[str]:
        return self.describe()

    def pytest_collection_finish(self, session) -> None:
        modules = {id(m): m for m in _repo_modules()}
        for item in session.items:
            module = getattr(item, "module", None)
            if module is not None:
                modules[id(module)] = module
        self.swapper.patch_aliases(list(modules.values()))

    def pytest_runtest_makereport(self, item, call) -> None:
        if call.excinfo is None or call.when != "call":
            return
        files = {str(p) for p in self.files.values()}
        ran = [entry.name for entry in call.excinfo.traceback if str(entry.path) in files]
        where = f" The error passed through YOUR {', '.join(dict.fromkeys(ran))}()." if ran else ""
        item.add_report_section("call", "exercise", " ".join(self.describe()) + where)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        terminalreporter.write_sep("-", "exercises")
        for line in self.describe():
            terminalreporter.write_line(line)

    def pytest_unconfigure(self, config) -> None:
        self.swapper.undo()
        self.children.undo()


# --- the harness check's helper ------------------------------------------------------------------


def solution_source(lesson: int, path: Path | None = None) -> str:
    """The learner's file for ``lesson`` with every stub's body replaced by the package's own
    body (``inspect.getsource`` of the original): what a perfect learner would hand in. The
    exercise file's own imports must be enough for it, as they must be for the learner."""
    import inspect

    path = path or exercise_file(lesson)
    tree = ast.parse(path.read_text())
    wanted = {e.name: e for e in EXERCISES[lesson]}
    done = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in wanted:
            owner, attr = _resolve(wanted[node.name])
            original = vars(owner)[attr]
            original = original.__func__ if isinstance(original, (classmethod, staticmethod)) else original
            source = textwrap.dedent(inspect.getsource(original))
            body = ast.parse(source).body[0].body
            if isinstance(owner, type):  # zero-argument super() needs a class body: name the class
                first = node.args.args[0].arg
                for call in ast.walk(ast.Module(body=body, type_ignores=[])):
                    if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "super" \
                            and not call.args:
                        call.args = [ast.Name(owner.__name__, ast.Load()), ast.Name(first, ast.Load())]
            node.body = body
            done.add(node.name)
    missing = set(wanted) - done
    if missing:
        raise AttributeError(f"{path}: no top-level function(s) {sorted(missing)}")
    return ast.unparse(tree) + "\n"
