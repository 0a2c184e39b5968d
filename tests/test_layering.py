"""The package is layered by lesson (see :mod:`tests.tools.layering`), with no import circles,
and each lesson's README names exactly the modules that declare that lesson."""

from __future__ import annotations

import functools
import re
import shutil
from pathlib import Path

import pytest

from tests.tools import layering
from tests.tools.layering import ASSEMBLY, TOOLING, check, cycles, lesson_modules, scan, violations

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "minisgl"


@functools.cache
def package_modules() -> dict:
    """The package scanned once for the tests that only read it (a scan parses every module)."""
    return scan(PACKAGE)


def test_every_module_declares_its_lesson_and_imports_nothing_later() -> None:
    problems = check(PACKAGE)
    assert problems == [], "\n".join(problems)


def test_assembly_points_are_a_short_named_list() -> None:
    """The few places where lessons are put together; anything else that wants a later lesson
    must plug into a seam instead."""
    modules = package_modules()
    assembly = sorted(m.name for m in modules.values() if m.lesson == ASSEMBLY)
    assert assembly == ["minisgl", "minisgl.__main__", "minisgl.cpu_threads", "minisgl.engine.builder"]
    tooling = {m.name.split(".")[1] for m in modules.values() if m.lesson == TOOLING}
    assert tooling == {"testing"}  # benchmarks, CI tools and demo training live outside the package


def test_every_lesson_has_modules_of_its_own() -> None:
    modules = package_modules()
    for lesson in range(1, 13):
        assert lesson_modules(modules, lesson), f"lesson {lesson} declares no module"


def _plant(tmp_path: Path, module: str, line: str) -> Path:
    copy = tmp_path / "minisgl"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "model"))
    path = copy / module
    path.write_text(path.read_text() + "\n" + line + "\n")
    return copy


def test_teeth_an_upward_import_is_caught(tmp_path: Path) -> None:
    """Lesson 4's scheduler importing lesson 7's loop (the layering this replaced) fails the check."""
    copy = _plant(tmp_path, "scheduler/scheduler.py", "from minisgl.scheduler.overlap import OverlapLoop")
    problems = check(copy)
    assert problems == ["minisgl.scheduler.scheduler (lesson 4) imports minisgl.scheduler.overlap (lesson 7)"] + [
        p for p in problems if p.startswith("import circle")]
    assert any(p.startswith("import circle") for p in problems), "the planted import also closes a circle"


def test_teeth_a_function_level_import_counts_and_tooling_is_off_limits(tmp_path: Path) -> None:
    copy = _plant(tmp_path, "models/model.py", "def _later():\n    from minisgl.testing import tiny_model\n")
    assert violations(scan(copy)) == ["minisgl.models.model (lesson 1) imports tooling module minisgl.testing"]


def test_teeth_an_undeclared_module_and_a_circle_are_caught(tmp_path: Path) -> None:
    copy = _plant(tmp_path, "attention/paged.py", "from minisgl.attention.factory import make_paged_backend")
    (copy / "kvcache" / "extra.py").write_text('"""An undeclared module."""\n')
    modules = scan(copy)
    assert violations(modules) == ["minisgl.kvcache.extra: no valid __lesson__ (an int 1-10, 'assembly' or 'tooling')"]
    assert any({"minisgl.attention.factory", "minisgl.attention.paged"} <= set(c) for c in cycles(modules))


# --- each README's "The code this lesson adds" names exactly its lesson's modules -----------------


def readme_modules(lesson: int) -> set[str]:
    """The minisgl modules the README's code section links to (``../../minisgl/x/y.py``)."""
    text = (ROOT / "lessons" / f"l{lesson:02d}" / "README.md").read_text()
    match = re.search(r"^## The code this lesson adds\n(.*?)(?=^## )", text, re.S | re.M)
    assert match, f"lessons/l{lesson:02d}/README.md has no '## The code this lesson adds' section"
    paths = re.findall(r"\(\.\./\.\./(minisgl/[\w/]+\.py)\)", match.group(1))
    names = set()
    for p in paths:
        parts = p.removesuffix(".py").split("/")
        names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


@pytest.mark.parametrize("lesson", range(1, 13))
def test_each_readme_names_exactly_the_modules_of_its_lesson(lesson: int) -> None:
    """Links to tooling (benchmarks, test helpers) and assembly points may be there too."""
    modules = package_modules()
    declared = set(lesson_modules(modules, lesson))
    named = {m for m in readme_modules(lesson) if m not in modules or isinstance(modules[m].lesson, int)}
    assert named == declared, (f"lesson {lesson}: README names but does not declare {sorted(named - declared)}; "
                               f"declares but README does not name {sorted(declared - named)}")


# --- at run time -----------------------------------------------------------------------------

# A module each lesson's settings must load: the settings really turn the lesson on.
OWN_MODULE = {4: "minisgl.scheduler.kv_manager", 5: "minisgl.kvcache.radix_cache", 6: "minisgl.scheduler.chunked",
              7: "minisgl.scheduler.overlap", 8: "minisgl.engine.graph"}


@pytest.fixture(scope="module")
def loaded_by_lesson() -> dict[int, list[str]]:
    """Every lesson's generate, each in a fresh process (forked from one warm interpreter)."""
    return layering.modules_loaded_by_generates(sorted(layering.LESSON_SETTINGS))


@pytest.mark.parametrize("lesson", sorted(layering.LESSON_SETTINGS))
def test_a_lessons_settings_run_no_later_lesson(lesson: int, loaded_by_lesson: dict[int, list[str]]) -> None:
    """With the settings that switch off lessons N+1..10, a generate imports (so runs) no module
    of a later lesson, and does load the lesson's own."""
    loaded = loaded_by_lesson[lesson]
    assert layering.runtime_violations(package_modules(), lesson, loaded) == []
    assert OWN_MODULE[lesson] in loaded


def test_runtime_check_names_a_later_lessons_module() -> None:
    found = layering.runtime_violations(package_modules(), 4, ["minisgl.scheduler.kv_manager", "minisgl.engine.graph"])
    assert found == ["lesson-4 settings loaded minisgl.engine.graph (lesson 8)"]


# --- what the wheel ships ----------------------------------------------------------------------


def test_the_package_is_the_engine_not_the_course_tooling() -> None:
    """``pip install .`` ships ``minisgl`` only (pyproject's package list), and nothing in it
    imports the course's tooling (benchmarks, plots, the CI tools) or matplotlib."""
    import ast

    from setuptools.config.pyprojecttoml import read_configuration  # Python 3.10 has no tomllib

    root = Path(__file__).resolve().parents[1]
    shipped = read_configuration(root / "pyproject.toml")["tool"]["setuptools"]["packages"]  # found, as pip finds them
    assert shipped and all(p == "minisgl" or p.startswith("minisgl.") for p in shipped), shipped
    assert not {"minisgl.bench", "minisgl.bench.plots"} & set(shipped)
    banned = ("matplotlib", "benchmarks", "tests")
    offenders = []
    for path in sorted((root / "minisgl").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            offenders += [f"{path.relative_to(root)}: {n}" for n in names if n.split(".")[0] in banned]
    assert offenders == []
