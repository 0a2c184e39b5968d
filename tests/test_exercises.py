"""The exercise harness (``pytest lessons/lNN --mine``, :mod:`tests.tools.exercises`), checked.

For every lesson, a small subset of the lesson's tests (``HARNESS_TESTS``) runs under ``pytest
--mine`` in fresh processes (forked from one interpreter that imported torch, transformers and
pytest once: :mod:`tests.tools.forkrun`):

* **teeth**: with the untouched stubs of ``lessons/lNN/exercise.py`` the subset fails, and it
  fails because of the stubs (their ``NotImplementedError`` naming the exercise). One process
  per lesson: with every lesson's stubs in at once, a lesson's test could fail on an earlier
  lesson's stub (lesson 9's model runs lesson 4's scheduler), which would prove nothing.
* **swap**: with the package's own bodies put into each exercise file (``solution_source``: the
  learner's file, each stub's body replaced by the original's source) every subset passes, with
  nothing skipped. One process for all the lessons together (``--mine-file lNN=PATH`` each):
  the package's bodies are the package, so they cannot get in each other's way.

The runs share the two cores (the swap run beside the teeth runs), once per session for the
lessons selected. Marked ``exercises`` (``pytest -m "not exercises"`` leaves it out). Plus
quick checks of the swap itself and of the stubs' purity.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.tools import exercises
from tests.tools.exercises import EXERCISES, HARNESS_TESTS, REPO, exercise_file, solution_source
from tests.tools.forkrun import Run, run_forked

LESSONS = sorted(EXERCISES)


def test_every_lesson_has_an_exercise_and_a_subset() -> None:
    assert LESSONS == list(range(1, 13))
    assert sorted(HARNESS_TESTS) == LESSONS
    for lesson in LESSONS:
        assert exercise_file(lesson).is_file(), f"lesson {lesson} has no exercise file"
        for node in HARNESS_TESTS[lesson]:
            assert (REPO / node.split("::")[0]).is_file(), node


@pytest.mark.parametrize("lesson", LESSONS, ids=[f"l{n:02d}" for n in LESSONS])
def test_stubs_are_pure_learner_code(lesson: int) -> None:
    """Each exercise function is a docstring and a ``raise NotImplementedError`` naming the
    exercise, nothing else (no copy of the solution in the learner's file); every exercise
    target exists in the package."""
    tree = ast.parse(exercise_file(lesson).read_text())
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    for exercise in EXERCISES[lesson]:
        exercises._resolve(exercise)  # the target is where the table says
        fn = functions[exercise.name]
        body = fn.body
        assert isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant), f"{exercise.name}: docstring"
        assert len(body) == 2 and isinstance(body[1], ast.Raise), f"{exercise.name}: the stub must only raise"
        message = body[1].exc.args[0].value
        assert f"exercise l{lesson:02d} {exercise.name}()" in message and "exercise.py" in message


def test_lessons_are_read_from_the_arguments() -> None:
    root = REPO
    assert exercises.lessons_in(["lessons/l05"], root) == [5]
    assert exercises.lessons_in(["lessons/l08/test_l08_graphs.py::test_bucket_ladder", "lessons/l10/"], root) == [8, 10]
    assert exercises.lessons_in(["tests", str(root / "lessons" / "l01")], root) == [1]


def test_swap_reaches_by_name_imports_and_undo_restores(tmp_path: Path) -> None:
    """A module-level function is swapped in its module and in modules that imported it by name;
    a method on its class; ``undo`` puts every original back."""
    import minisgl.engine.graph as graph
    from minisgl.kvcache.radix_cache import RadixCache

    alias = type(sys)("minisgl_exercise_alias_probe")
    alias.__file__ = str(REPO / "tests" / "probe.py")
    alias.bucket_sizes = graph.bucket_sizes
    sys.modules[alias.__name__] = alias
    file = tmp_path / "mine.py"
    file.write_text(solution_source(8) + "\n\ndef bucket_sizes(max_bs):\n    return [42]\n")
    original_bucket_sizes, original_insert = graph.bucket_sizes, RadixCache.insert
    swapper = exercises.Swapper()
    try:
        swapper.install(8, file)
        assert graph.bucket_sizes(3) == [42] and alias.bucket_sizes(3) == [42]
        swapper.install(5, exercise_file(5))
        with pytest.raises(NotImplementedError, match="exercise l05 insert"):
            RadixCache(2).insert([1, 2], [0])
    finally:
        swapper.undo()
        del sys.modules[alias.__name__]
    assert graph.bucket_sizes is original_bucket_sizes and alias.bucket_sizes is original_bucket_sizes
    assert RadixCache.insert is original_insert


# --- --mine says whose code runs, and the smoke scripts take it too --------------------------------


def test_the_header_names_the_file_by_its_absolute_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A learner whose environment imported another checkout must see which file ran."""
    monkeypatch.chdir(REPO)
    swapper = exercises.Swapper()
    try:
        swapper.install(2, Path("lessons/l02/exercise.py"))
        (line,) = exercises.describe({2: Path("lessons/l02/exercise.py")}, swapper)
    finally:
        swapper.undo()
    assert line.startswith(f"--mine: lesson 2 runs YOUR code from {REPO / 'lessons' / 'l02' / 'exercise.py'}: ")
    assert "alloc() -> minisgl.kvcache.allocator:BlockAllocator.alloc" in line


def test_code_under_test_says_whose_code_ran(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(exercises.ENV, raising=False)
    assert exercises.code_under_test(5) == "the package's code (no --mine)"
    monkeypatch.setenv(exercises.ENV, json.dumps({"5": "/somewhere/exercise.py"}))
    assert exercises.code_under_test(5) == "YOUR code (--mine: /somewhere/exercise.py)"
    assert exercises.code_under_test(4) == "the package's code (no --mine)"


def test_no_control_run_claims_to_have_run_the_package() -> None:
    """Under --mine a control run runs the learner's code: its message must not say otherwise."""
    for path in sorted((REPO / "lessons").glob("l*/test_*.py")):
        assert "passes on the real code" not in path.read_text(), path


def test_script_options() -> None:
    parse = exercises.parse_mine_args
    assert parse(["smoke.py", "--arch", "qwen3"]) == (False, None, ["smoke.py", "--arch", "qwen3"])
    assert parse(["smoke.py", "--mine", "--arch", "x"]) == (True, None, ["smoke.py", "--arch", "x"])
    assert parse(["s", "--mine-file", "a.py", "-v"]) == (True, "a.py", ["s", "-v"])
    assert parse(["s", "--mine", "--mine-file=b.py"]) == (True, "b.py", ["s"])
    with pytest.raises(SystemExit):
        parse(["s", "--mine-file"])
    assert exercises.mine_for_script(3, ["smoke.py", "--arch", "x"]) == ["smoke.py", "--arch", "x"], "no --mine: no swap"


@pytest.mark.parametrize("lesson", LESSONS, ids=[f"l{n:02d}" for n in LESSONS])
def test_every_smoke_script_takes_mine(lesson: int) -> None:
    text = (REPO / "lessons" / f"l{lesson:02d}" / "smoke.py").read_text()
    assert f"sys.argv = mine_for_script({lesson})" in text, "the smoke script swaps in the learner's functions"
    assert f"python lessons/l{lesson:02d}/smoke.py --mine" in ast.get_docstring(ast.parse(text)), "its usage says so"


def test_smoke_and_pytest_under_mine_run_and_name_the_learners_file(tmp_path: Path) -> None:
    """``smoke.py --mine`` with the stubs fails on the learner's first stub; ``--mine-file`` with
    a relative path runs that file (the solved exercise: MATCH) and names it by its absolute
    path, in the smoke and in pytest's header. (Without ``--mine`` the smoke scripts run as
    before: the break-its run them from the clone's root.)"""
    (tmp_path / "solved.py").write_text(solution_source(1))
    env = {k: v for k, v in os.environ.items() if k not in (exercises.ENV, "PYTHONPATH")}
    smoke = str(REPO / "lessons" / "l01" / "smoke.py")
    runs = {
        "stubs": ([sys.executable, "lessons/l01/smoke.py", "--arch", "qwen3", "--mine"], REPO),
        "file": ([sys.executable, smoke, "--arch", "qwen3", "--mine-file", "solved.py"], tmp_path),
        "pytest": ([sys.executable, "-m", "pytest", HARNESS_TESTS[2][0] + "::test_slot_is_block_id_times_block_size_plus_offset",
                    "--mine", "--mine-file", "lessons/l02/exercise.py", "-q", "-p", "no:cacheprovider"], REPO),
    }

    def run(args_cwd):
        args, cwd = args_cwd
        proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
        return proc.returncode, proc.stdout + proc.stderr

    with ThreadPoolExecutor(2) as pool:
        out = dict(zip(runs, pool.map(run, runs.values())))
    rc, text = out["stubs"]
    assert rc != 0 and "NotImplementedError: exercise l01 step()" in text, text[-2000:]
    assert f"--mine: lesson 1 runs YOUR code from {REPO / 'lessons' / 'l01' / 'exercise.py'}: step()" in text
    rc, text = out["file"]
    assert rc == 0 and text.strip().endswith("MATCH"), text[-2000:]
    assert f"--mine: lesson 1 runs YOUR code from {tmp_path / 'solved.py'}: " in text
    rc, text = out["pytest"]
    assert rc == 1 and "NotImplementedError: exercise l02 slots()" in text, text[-2000:]
    assert f"--mine: lesson 2 runs YOUR code from {REPO / 'lessons' / 'l02' / 'exercise.py'}: " in text


# --- the harness check: teeth and swap, for every lesson -------------------------------------------


def mine_run(lessons: list[int], mine_files: dict[int, Path] | None) -> Run:
    """``pytest <the lessons' subsets> --mine [--mine-file lNN=F ...]`` (``-rA``: a line per
    test, PASSED or FAILED)."""
    tests = [t for lesson in lessons for t in HARNESS_TESTS[lesson]]
    args = ["-m", "pytest", *tests, "--mine", "-q", "-rA", "-p", "no:cacheprovider", "-p", "no:nbmake",
            "-p", "no:schemathesis", "-o", "addopts=--import-mode=importlib",
            "-W", "ignore::pytest.PytestAssertRewriteWarning"]  # (plugins the warm interpreter imported)
    if mine_files is not None:
        args += [f"--mine-file=l{lesson:02d}={path}" for lesson, path in mine_files.items()]
    else:
        args += ["-x"]  # the first failure is enough
    return Run(args)


@pytest.fixture(scope="module")
def harness_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The teeth runs (one per lesson) and the swap run (all lessons), for the lessons whose
    harness test is selected: each a fresh process forked from one interpreter that imported
    torch, transformers and pytest once (:mod:`tests.tools.forkrun`; none of this repository's
    modules is loaded before a run starts), two at a time."""
    selected = sorted({item.callspec.params["lesson"] for item in request.session.items
                       if item.originalname == "test_stubs_fail_and_the_package_bodies_pass"})
    folder = tmp_path_factory.mktemp("solutions")
    files = {lesson: folder / f"solution_l{lesson:02d}.py" for lesson in selected}
    for lesson, path in files.items():
        path.write_text(solution_source(lesson))
    env = {k: v for k, v in os.environ.items() if k != exercises.ENV}
    env.pop("PYTHONPATH", None)
    runs = [mine_run(selected, files)] + [mine_run([lesson], None) for lesson in selected]
    swap, *teeth = run_forked(runs, preload=("torch", "transformers", "pytest"), parallel=2, env=env)
    return {"files": files, "swap": (swap.returncode, swap.output),
            "teeth": {lesson: (r.returncode, r.output) for lesson, r in zip(selected, teeth)}}


@pytest.mark.exercises
@pytest.mark.parametrize("lesson", LESSONS, ids=[f"l{n:02d}" for n in LESSONS])
def test_stubs_fail_and_the_package_bodies_pass(lesson: int, harness_runs: dict) -> None:
    stub_rc, stub_out = harness_runs["teeth"][lesson]
    sol_rc, sol_out = harness_runs["swap"]
    solution = harness_runs["files"][lesson]

    # Teeth: tests ran and failed, because of a stub of this lesson.
    assert stub_rc == 1, f"the stubs did not make lesson {lesson}'s tests fail (rc {stub_rc}):\n{stub_out[-3000:]}"
    assert re.search(rf"NotImplementedError: exercise l{lesson:02d} \w+\(\)", stub_out), stub_out[-3000:]
    assert f"--mine: lesson {lesson} runs YOUR code" in stub_out

    # Swap: the package's bodies in the exercise file pass, every test of the subset, nothing skipped.
    assert f"--mine: lesson {lesson} runs YOUR code from {solution}" in sol_out, "the run must use the given file"
    mine = [line for line in sol_out.splitlines() if line.startswith(("PASSED ", "FAILED ", "ERROR ", "SKIPPED "))
            and line.split()[1].startswith(f"lessons/l{lesson:02d}/")]
    assert mine and all(line.startswith("PASSED ") for line in mine), (
        f"the package's own bodies failed lesson {lesson}'s tests:\n" + "\n".join(mine) + "\n" + sol_out[-3000:])
    for node in HARNESS_TESTS[lesson]:
        assert any(line.split()[1].startswith(node) for line in mine), f"{node} did not run"
    summary = sol_out.strip().splitlines()[-1]  # (a failure of another lesson shows in that lesson's test)
    assert "passed" in summary and "skipped" not in summary and "deselected" not in summary, summary
    assert sol_rc in (0, 1), f"the swap run did not run its tests (rc {sol_rc}):\n{sol_out[-3000:]}"
