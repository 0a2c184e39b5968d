"""The lessons' "Break it" exercises as data (tests.tools.breakits): every lesson has them,
their patches apply to today's code, the READMEs show them rendered from the data, and the
check has teeth (a wrong prediction fails it). Running the real break-its is `.ci/run`'s job
(`python -m tests.tools.breakits`); these tests stay fast."""

from __future__ import annotations

import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.tools import breakits as bk

REPO = Path(__file__).resolve().parents[1]
LESSONS = [f"l{i:02d}" for i in range(1, 12)]


def _section(text: str) -> str:
    """The README's ``## Break it`` section."""
    m = re.search(r"^## Break it\b.*?(?=^## |\Z)", text, re.M | re.S)
    assert m, "no '## Break it' section"
    return m.group(0)


@pytest.mark.parametrize("lesson", LESSONS)
def test_every_lesson_has_its_breakits_in_its_readme(lesson: str) -> None:
    found = bk.discover(REPO, [lesson])
    assert found, f"{lesson} has no lessons/{lesson}/breakit/*.toml"
    section = _section((REPO / "lessons" / lesson / "README.md").read_text())
    assert bk.readme_keys(section) == [b.key for b in found], (
        "the '## Break it' section must show each break-it once, in order, as a "
        "<!-- breakit: lNN/<name> --> block"
    )
    # Counts live in the rendered blocks only: prose that repeats them could drift.
    prose = bk._BLOCK.sub("", section)
    stray = re.findall(r"\b\d+ (?:failed|passed|skipped)\b", prose)
    assert not stray, f"{lesson}: counts outside the rendered blocks: {stray}"


def test_readme_blocks_are_rendered_from_the_data() -> None:
    stale = bk.render_all(REPO, write=False)
    assert not stale, f"out of date: {stale}; run python -m tests.tools.breakits --render"


def test_rendered_block_shows_the_patch_and_the_prediction_verbatim() -> None:
    for b in bk.discover(REPO):
        text = (REPO / "lessons" / b.lesson / "README.md").read_text()
        block = next(m.group(0) for m in bk._BLOCK.finditer(text) if m["key"] == b.key)
        flat = "\n".join(line.strip() for line in block.splitlines())
        for line in b.patch.splitlines():
            assert line.strip() in flat
        for run in b.runs:
            assert f"`{run.command}`" in block
            if run.is_pytest:
                assert f"{run.failed} failed" in block
            for p in run.prints:
                assert f"`{p}`" in block


@pytest.mark.parametrize("b", bk.discover(REPO), ids=lambda b: b.key)
def test_every_patch_applies_to_todays_code(b: bk.BreakIt, tmp_path: Path) -> None:
    touched = re.findall(r"^\+\+\+ b/(\S+)", b.patch, re.M)
    assert touched, "a patch names the files it changes (+++ b/<path>)"
    for rel in touched:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, tmp_path / rel)  # a scratch copy: never the real tree
    assert bk.apply_patch(b.patch, tmp_path) is None
    assert [(tmp_path / rel).read_text() != (REPO / rel).read_text() for rel in touched] == [True] * len(touched)


def test_pytest_output_is_parsed() -> None:
    out = textwrap.dedent(
        """\
        FAILED lessons/l01/test_x.py::test_a[qwen3] - AssertionError: boom
        FAILED lessons/l05/test_y.py::test_c[full prefix hit computes zero tokens] - assert [1, 13] == []
        ERROR lessons/l01/test_x.py::test_b
        ==== 3 failed, 3 passed, 1 skipped, 1 error in 4.20s ====
        """
    )
    counts, failing = bk.parse_pytest(out)
    assert counts == {"failed": 3, "passed": 3, "skipped": 1, "errors": 1}
    assert failing == ["test_a[qwen3]", "test_c[full prefix hit computes zero tokens]", "test_b"]
    assert bk.parse_pytest("13 passed in 51.42s")[0]["passed"] == 13


# --- teeth: a tiny fake lesson, its patch and prediction ---------------------------------------
PREDICTION = """\
title = "subtract instead of add"

[[run]]
command = "pytest lessons/l01"
failed = 2
passed = 1
failing = ["test_add", "test_add_negative"]
prints = ["assert -1 == 5"]

[[run]]
command = "python lessons/l01/smoke.py"
prints = ["2 + 3 = -1"]
"""


@pytest.fixture
def fake_repo(tmp_path: Path) -> Path:
    root = tmp_path / "fake"
    (root / "fakecalc").mkdir(parents=True)
    (root / "fakecalc" / "__init__.py").write_text("def add(a, b):\n    return a + b\n")
    lesson = root / "lessons" / "l01"
    (lesson / "breakit").mkdir(parents=True)
    (lesson / "test_calc.py").write_text(
        "from fakecalc import add\n\n"
        "def test_add():\n    assert add(2, 3) == 5\n\n"
        "def test_add_negative():\n    assert add(-2, -3) == -5\n\n"
        "def test_unrelated():\n    assert 1 + 1 == 2\n"
    )
    (lesson / "smoke.py").write_text("from fakecalc import add\nprint('2 + 3 =', add(2, 3))\n")
    # As the real repository's pytest settings do: two slow-to-import plugins off (pyproject.toml).
    (root / "pytest.ini").write_text("[pytest]\naddopts = -p no:nbmake -p no:schemathesis\n")
    (lesson / "breakit" / "subtract.patch").write_text(
        "--- a/fakecalc/__init__.py\n+++ b/fakecalc/__init__.py\n@@ -1,2 +1,2 @@\n"
        " def add(a, b):\n-    return a + b\n+    return a - b\n"
    )
    (lesson / "breakit" / "subtract.toml").write_text(PREDICTION)
    (lesson / "README.md").write_text(
        "# Lesson 1\n\n## Break it\n\nSubtract.\n\n<!-- breakit: l01/subtract -->\n<!-- /breakit -->\n\n## Next\n"
    )
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "."], cwd=root, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "fake"], cwd=root, check=True)
    return root


def _check(root: Path, capsys) -> tuple[int, str]:
    """``python -m tests.tools.breakits`` on ``root``, in this process (no second torch import)."""
    code = bk.main(["--root", str(root), "-j", "1"])
    return code, capsys.readouterr().out


def test_a_true_prediction_passes_and_a_wrong_one_fails(fake_repo: Path, capsys) -> None:
    assert bk.main(["--root", str(fake_repo), "--render"]) == 0
    readme = (fake_repo / "lessons" / "l01" / "README.md").read_text()
    assert "-    return a + b" in readme and "**2 failed, 1 passed**" in readme

    code, out = _check(fake_repo, capsys)
    assert code == 0, out
    assert "1/1 break-its as predicted" in out
    assert (fake_repo / "fakecalc" / "__init__.py").read_text().endswith("a + b\n"), "the real tree is untouched"

    # The check, end to end, with a count edited to be wrong (the README follows the data, so
    # only the run can object).
    toml = fake_repo / "lessons" / "l01" / "breakit" / "subtract.toml"
    toml.write_text(PREDICTION.replace("failed = 2\npassed = 1", "failed = 1\npassed = 2"))
    bk.render_all(fake_repo)
    code, out = _check(fake_repo, capsys)
    assert code == 1 and "MISMATCH" in out and "predicted 1 failed, got 2" in out, out

    # Every other kind of wrong prediction, against the same real output.
    result = bk.run_breakit(bk.discover(fake_repo)[0], fake_repo)
    for wrong, complaint in [
        (PREDICTION.replace('"test_add", ', ""), "failed unpredicted ['test_add']"),
        (PREDICTION.replace("assert -1 == 5", "assert 0 == 5"), "does not contain 'assert 0 == 5'"),
        (PREDICTION.replace("2 + 3 = -1", "2 + 3 = 5"), "does not contain '2 + 3 = 5'"),
        (PREDICTION.replace("passed = 1", "passed = 1\nskipped = 1"), "predicted 1 skipped, got 0"),
    ]:
        toml.write_text(wrong)
        b = bk.load(toml)
        problems = [p for run, output in zip(b.runs, result.outputs) for p in bk.compare(run, output)]
        assert any(complaint in p for p in problems), (complaint, problems)


def test_a_stale_readme_or_a_patch_that_no_longer_applies_fails(fake_repo: Path, capsys) -> None:
    bk.render_all(fake_repo)
    readme = fake_repo / "lessons" / "l01" / "README.md"
    readme.write_text(readme.read_text().replace("**2 failed, 1 passed**", "**1 failed, 2 passed**"))
    assert bk.render_all(fake_repo, write=False) == [readme]

    bk.render_all(fake_repo)
    (fake_repo / "fakecalc" / "__init__.py").write_text("def add(a, b):\n    return b + a\n")  # the code moved on
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "moved"], cwd=fake_repo, check=True)
    code, out = _check(fake_repo, capsys)
    assert code == 1 and "the patch does not apply" in out, out
