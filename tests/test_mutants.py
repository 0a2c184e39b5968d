"""The lessons' mutants (``lessons/lNN/mutants/*.py``) and their runner, ``tests.tools.mutants``.

Running every mutant is CI's job (``python -m tests.tools.mutants``, its own step of
``.ci/run``); these tests stay fast: every mutant file has the format the runner relies on
(a docstring saying the mistake and the promise it breaks, only definitions of its lesson's
exercise functions with their signatures, a body that differs from the package's, a source
that composes with the solved exercise and compiles), each lesson's README says how many there
are, and the runner's verdicts are right on a tiny made-up example: a mutant killed, one that
survives, broken ones (an import error, a syntax error, a hang).
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.tools import mutants as mt
from tests.tools.exercises import EXERCISES, REPO, _resolve, exercise_file

MUTANTS = mt.discover()
LESSONS_WITH_MUTANTS = sorted({m.lesson for m in MUTANTS} | {
    int(p.parent.name[1:]) for p in (REPO / "lessons").glob("l[0-9][0-9]/mutants")})


def exercise_defs(lesson: int) -> dict[str, ast.FunctionDef]:
    tree = ast.parse(exercise_file(lesson).read_text())
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def signature(fn: ast.FunctionDef) -> tuple:
    """Parameter names, kinds and defaults (annotations left out)."""
    a = fn.args
    return ([p.arg for p in a.posonlyargs], [p.arg for p in a.args], a.vararg and a.vararg.arg,
            [p.arg for p in a.kwonlyargs], a.kwarg and a.kwarg.arg,
            [ast.unparse(d) for d in a.defaults], [d and ast.unparse(d) for d in a.kw_defaults])


def test_lessons_1_to_5_have_at_least_six_mutants_each() -> None:
    for lesson in range(1, 6):
        assert sum(m.lesson == lesson for m in MUTANTS) >= 6, f"lesson {lesson} needs at least 6 mutants"


@pytest.mark.parametrize("lesson", LESSONS_WITH_MUTANTS, ids=[f"l{n:02d}" for n in LESSONS_WITH_MUTANTS])
def test_every_lesson_with_mutants_has_six_and_its_readme_counts_them(lesson: int) -> None:
    count = sum(m.lesson == lesson for m in MUTANTS)
    assert count >= 6, f"lesson {lesson} has {count} mutants; at least 6"
    readme = (REPO / "lessons" / f"l{lesson:02d}" / "README.md").read_text()
    section = re.search(r"^## Exercise\b.*?(?=^## |\Z)", readme, re.M | re.S)
    assert section, f"lessons/l{lesson:02d}/README.md has no '## Exercise' section"
    said = re.findall(r"(\d+) wrong versions", section.group(0))
    assert said == [str(count)], (
        f"lessons/l{lesson:02d}/README.md's Exercise section must say once how many wrong versions "
        f"lessons/l{lesson:02d}/mutants/ keeps ('{count} wrong versions'); it says {said}")
    assert f"lessons/l{lesson:02d}/mutants/" in section.group(0)


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.key for m in MUTANTS])
def test_mutant_format(mutant: mt.Mutant) -> None:
    source = mutant.source
    tree = ast.parse(source)
    doc = ast.get_docstring(tree, clean=False)
    assert doc, "a mutant starts with a docstring"
    lines = doc.strip("\n").splitlines()
    assert len(lines) >= 3 and lines[0].strip() and not lines[1].strip() and lines[2].strip(), (
        "docstring: the mistake on its first line, a blank line, then the promise it breaks")

    wanted = {e.name for e in EXERCISES[mutant.lesson]}
    exercise = exercise_defs(mutant.lesson)
    defined = []
    for node in tree.body[1:]:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            assert not (isinstance(node, ast.ImportFrom) and node.module == "__future__"), (
                "no `from __future__` import: the mutant is appended to the solved exercise file")
            continue
        assert isinstance(node, ast.FunctionDef), (
            f"line {node.lineno}: only imports and definitions of exercise functions ({ast.unparse(node)[:60]})")
        assert node.name in wanted and node.name in exercise, (
            f"{node.name}() is not an exercise function of lesson {mutant.lesson} ({sorted(wanted)})")
        assert signature(node) == signature(exercise[node.name]), (
            f"{node.name}(): the signature must be the exercise's, def {node.name}({ast.unparse(exercise[node.name].args)})")
        defined.append(node.name)
    assert defined, "a mutant defines at least one exercise function"
    assert len(defined) == len(set(defined)), f"defined twice: {defined}"

    # Not the package's own body in disguise (an equivalent copy proves nothing).
    by_name = {e.name: e for e in EXERCISES[mutant.lesson]}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            owner, attr = _resolve(by_name[node.name])
            original = vars(owner)[attr]
            original = getattr(original, "__func__", original)
            solved = ast.parse(textwrap.dedent(inspect.getsource(original))).body[0]
            body = [b for b in node.body if not (isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant))]
            solved_body = [b for b in solved.body
                           if not (isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant))]
            assert ast.dump(ast.Module(body, [])) != ast.dump(ast.Module(solved_body, [])), (
                f"{node.name}() is the package's own body")

    compile(mt.compose(mutant), str(mutant.path), "exec")  # composes with the solved exercise
    for node in mutant.first:
        path = node.split("::")[0]
        assert path.startswith(f"lessons/l{mutant.lesson:02d}/") and (REPO / path).is_file(), (
            f"# first: {node}: not a test file of lesson {mutant.lesson}")
        if "::" in node:
            name = node.split("::")[1].split("[")[0]
            assert re.search(rf"^def {re.escape(name)}\(", (REPO / path).read_text(), re.M), f"# first: no test {name}"


def test_discover_and_select(tmp_path: Path) -> None:
    for rel in ("lessons/l02/mutants/b.py", "lessons/l02/mutants/a.py", "lessons/l05/mutants/c.py",
                "lessons/l05/mutants/_helper.py", "lessons/l05/other/d.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text('"""x.\n\ny.\n"""\n# first: lessons/l02/test_a.py::test_b\n')
    assert [m.key for m in mt.discover(tmp_path)] == ["l02/a", "l02/b", "l05/c"]
    assert [m.key for m in mt.discover(tmp_path, ["l05"])] == ["l05/c"]
    assert [m.key for m in mt.discover(tmp_path, ["l02/b", "lessons/l05/mutants/c.py"])] == ["l02/b", "l05/c"]
    a = mt.discover(tmp_path, ["l02/a"])[0]
    assert (a.title, a.first) == ("x.", ["lessons/l02/test_a.py::test_b"])


def test_classify() -> None:
    failed = "....F\n=== short test summary info ===\nFAILED lessons/l02/test_x.py::test_y[a b] - AssertionError: no\n"
    assert mt.classify(1, failed) == ("killed", "lessons/l02/test_x.py::test_y[a b]", "AssertionError: no")
    assert mt.classify(1, "ERROR lessons/l02/test_x.py::test_z\n")[:2] == ("killed", "lessons/l02/test_x.py::test_z")
    assert mt.classify(0, "33 passed in 9s")[0] == "SURVIVED"
    for rc in (2, 3, 4, 5, -9, None):
        assert mt.classify(rc, "ERROR lessons/l02/test_x.py - ImportError\nsomething")[0] == "BROKEN", rc
    verdict, _, detail = mt.classify(None, "", timed_out=True, timeout=7)
    assert verdict == "BROKEN" and "timed out after 7 s" in detail


def test_first_tests_run_first_and_nothing_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    ids = ["lessons/l02/test_a.py::test_1", "lessons/l02/test_a.py::test_2[x]", "lessons/l02/test_b.py::test_3",
           "lessons/l02/test_b.py::test_4[1]", "lessons/l02/test_b.py::test_4[2]", "lessons/l02/test_b.py::test_40"]
    items = [SimpleNamespace(nodeid=i) for i in ids]
    monkeypatch.setenv(mt.FIRST_ENV, '["lessons/l02/test_b.py::test_4", "lessons/l02/test_a.py::test_2"]')
    mt.pytest_collection_modifyitems(None, None, items)
    assert [i.nodeid for i in items] == [ids[3], ids[4], ids[1], ids[0], ids[2], ids[5]]
    monkeypatch.setenv(mt.FIRST_ENV, '["lessons/l02/test_b.py"]')
    mt.pytest_collection_modifyitems(None, None, items)
    assert sorted(i.nodeid for i in items) == sorted(ids) and [i.nodeid for i in items][:4] == [
        ids[3], ids[4], ids[2], ids[5]]


# --- the runner on a made-up example: one pytest process per mutant, as in CI ------------------------

TEST = "lessons/l02/test_l02_blocks.py::test_slot_is_block_id_times_block_size_plus_offset"
MADE_UP = {
    # slots() is what TEST checks: killed by it.
    "killed": '''"""slots() ignores the block table.\n\nBreaks the slot formula.\n"""\nimport torch\n\n\n'''
              '''def slots(self, start, end, device="cpu"):\n    return torch.arange(start, end)\n''',
    # alloc() is not used by TEST: this wrong alloc survives it.
    "survives": '''"""alloc() from the back.\n\nBreaks FIFO.\n"""\n\n\ndef alloc(self, n):\n'''
                '''    blocks = [self._free.pop() for _ in range(n)]\n    self._allocated.update(blocks)\n    return blocks\n''',
    # An error while the learner's file is imported: pytest never runs a test.
    "import_error": '''"""An import that fails.\n\nNothing.\n"""\nimport no_such_module_anywhere  # noqa\n''',
    "syntax_error": '''"""Does not parse.\n\nNothing.\n"""\n\n\ndef slots(self, start, end, device="cpu")\n    return 1\n''',
}


def made_up(tmp_path: Path, name: str, source: str) -> mt.Mutant:
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return mt.Mutant(2, name, path)


def test_runner_verdicts_on_a_made_up_example(tmp_path: Path) -> None:
    mutants = [made_up(tmp_path, name, src) for name, src in MADE_UP.items()]
    lines: list[str] = []
    outcomes = {o.mutant.name: o for o in mt.run_all(mutants, workers=2, timeout=240, report=lines.append, tests=[TEST])}
    killed = outcomes["killed"]
    assert (killed.verdict, killed.killed_by) == ("killed", TEST), killed.output[-2000:]
    assert "killed by test_l02_blocks.py::test_slot_is_block_id_times_block_size_plus_offset" in mt.row(killed)
    assert outcomes["survives"].verdict == "SURVIVED", outcomes["survives"].output[-2000:]
    broken = outcomes["import_error"]
    assert broken.verdict == "BROKEN" and "no_such_module_anywhere" in broken.output, broken.output[-2000:]
    syntax = outcomes["syntax_error"]
    assert syntax.verdict == "BROKEN" and "does not compose" in syntax.detail and syntax.seconds < 5
    assert len(lines) == 4 and all(o.mutant.name in " ".join(lines) for o in outcomes.values())


def test_runner_stops_a_hanging_mutant_at_its_timeout(tmp_path: Path) -> None:
    hang = made_up(tmp_path, "hang", '"""Hangs.\n\nNothing.\n"""\nimport time\n\ntime.sleep(600)\n')
    outcome = mt.run_mutant(hang, timeout=2, tests=[TEST])
    assert outcome.verdict == "BROKEN" and "timed out after 2 s" in outcome.detail
    assert outcome.seconds < 30


def test_ci_runs_the_mutants_right_after_the_breakits() -> None:
    ci = (REPO / ".ci" / "run").read_text()
    breakits = ci.index("python -m tests.tools.breakits\n")
    mutants = ci.index("python -m tests.tools.mutants\n")
    sections = [m.start() for m in re.finditer(r'^section "', ci, re.M)]
    assert breakits < mutants
    after_breakits = [s for s in sections if s > breakits]
    assert after_breakits and after_breakits[0] < mutants < (after_breakits[1:] or [len(ci)])[0], (
        "the mutants run in their own section, right after the break-its'")
