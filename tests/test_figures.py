"""Every measured figure in the course text is backed by a results file or a named command.

The check itself is ``tests/tools/figures.py``; these tests run it over every file in its
scope and show it has teeth: a figure edited away from its results file, an unmarked figure, a
command that is not shown or does not exist, each make it fail.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.tools import figures


def _problems(tmp_path: Path, markdown: str) -> list[str]:
    page = tmp_path / "page.md"
    page.write_text(markdown, encoding="utf-8")
    return [f.problem for f in figures.check_file(page)]


@pytest.mark.parametrize("path", figures.files_in_scope(), ids=lambda p: p.relative_to(figures.REPO).as_posix())
def test_every_figure_is_backed(path: Path) -> None:
    bad = [str(f) for f in figures.check_file(path) if f.problem]
    assert not bad, "figures without a backing (see tests/tools/figures.py):\n" + "\n".join(bad)


def test_scope_covers_every_lesson_and_the_site() -> None:
    rel = {p.relative_to(figures.REPO).as_posix() for p in figures.files_in_scope()}
    assert {f"lessons/l{n:02d}/README.md" for n in range(1, 12)} <= rel
    assert {"README.md", "site/benchmarks.md"} <= rel


@pytest.fixture
def one_result(monkeypatch: pytest.MonkeyPatch) -> None:
    """``R["demo"]`` is a known results file for the tests below."""
    data = {"demo": {"results": {"ms": 1.7698, "tok_s": [21621.0, 21288.0, 22210.0], "ratio": 0.25}}}
    monkeypatch.setattr(figures, "_results", lambda: data)


def test_a_figure_matching_its_results_passes(tmp_path: Path, one_result: None) -> None:
    text = (
        "<!-- figs: demo -->\n"
        "A step takes **1.77 ms**<!-- fig: D['ms'] --> and the median run makes "
        "21,621 tok/s<!-- fig: median(D['tok_s']) -->, about 21.6k<!-- fig: median(D['tok_s']) --> "
        "(about 21,600<!-- fig ±50: median(D['tok_s']) -->), busy 25%<!-- fig: 100 * D['ratio'] -->.\n"
    )
    assert _problems(tmp_path, text) == ["", "", "", "", ""]


def test_a_figure_edited_away_from_its_results_fails(tmp_path: Path, one_result: None) -> None:
    problems = _problems(tmp_path, "<!-- figs: demo -->\nA step takes **1.78 ms**<!-- fig: D['ms'] -->.\n")
    assert problems == ["the results say 1.7698 (D['ms'])"]
    # Rounded further than printed: 1.8 stands for [1.75, 1.85], so it passes; 1.7 does not.
    assert _problems(tmp_path, "1.8 ms<!-- fig: R['demo']['results']['ms'] -->") == [""]
    assert _problems(tmp_path, "1.7 ms<!-- fig: R['demo']['results']['ms'] -->") != [""]
    assert "fails: KeyError" in _problems(tmp_path, "1.77 ms<!-- fig: R['demo']['results']['nope'] -->")[0]


def test_an_unmarked_figure_fails(tmp_path: Path, one_result: None) -> None:
    problems = _problems(tmp_path, "The server makes 21,600 tok/s and a step takes 1.77 ms.\n")
    assert len(problems) == 2 and all(p.startswith("no marker") for p in problems)
    # Code, rendered break-its and settings marked as such are not figures.
    quiet = (
        "```\n1.77 ms\n```\n`1.77 ms` in code\n<!-- breakit: l01/x -->\n3.05×\n<!-- /breakit -->\n"
        "a 5 s<!-- given --> timeout\n"
    )
    assert _problems(tmp_path, quiet) == []


def test_a_named_command_must_be_shown_and_exist(tmp_path: Path) -> None:
    shown = "Measured with `python -m benchmarks graphs --profile-decode`: "
    assert _problems(tmp_path, shown + "1.4 ms<!-- run: python -m benchmarks graphs --profile-decode -->") == [
        "--profile-decode is not a flag of benchmarks.graphs"
    ]
    hidden = "1.4 ms<!-- run: python -m benchmarks graphs -->"
    assert "does not appear in backticks" in _problems(tmp_path, hidden)[0]
    ok = "Measured with `python -m benchmarks graphs`: 1.4 ms<!-- run: python -m benchmarks graphs -->"
    assert _problems(tmp_path, ok) == [""]
    missing = "`pytest lessons/l99`: 3 s<!-- run: pytest lessons/l99 -->"
    assert _problems(tmp_path, missing) == ["lessons/l99 does not exist"]
    # a notebook's saved outputs: the notebook must exist, and run
    nb = "jupyter nbconvert --to notebook --execute --inplace notebooks/l01_kv_cache.ipynb"
    assert _problems(tmp_path, f"`{nb}`: 0.5 ms<!-- run: {nb} -->") == [""]
    gone = nb.replace("l01_kv_cache", "l01_nothing")
    assert "do not all exist" in _problems(tmp_path, f"`{gone}`: 0.5 ms<!-- run: {gone} -->")[0]


def test_expressions_see_the_results_inside_comprehensions(tmp_path: Path, one_result: None) -> None:
    text = "<!-- figs: demo -->\nfastest 22,210 tok/s<!-- fig: max(v for v in D['tok_s'] if v > D['ratio']) -->\n"
    assert _problems(tmp_path, text) == [""]
    # units that read "per token", and KiB, are figures too
    assert len(_problems(tmp_path, "a step of 6.00 ms/token and 112 KiB per token\n")) == 2


def test_every_results_file_is_json_with_results(tmp_path: Path) -> None:
    for path in sorted(figures.RESULTS.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        assert "results" in data, f"{path.name} has no 'results' object"


def test_printed_like_keeps_the_figures_format() -> None:
    assert figures.printed_like("1.77", 1.7698) == "1.77"
    assert figures.printed_like("1.2", 1.26) == "1.3"
    assert figures.printed_like("21,600", 23412.4) == "23,412"
    assert figures.printed_like("21600", 23412.4) == "23412"
    assert figures.printed_like("21.6k", 23412.0) == "23.4k"
    assert figures.printed_like("3", 2.6) == "3"
    assert figures.printed_like("2.5", -1.0) is None and figures.printed_like("2.5", float("nan")) is None


def test_update_rewrites_stale_figures_in_their_format_and_leaves_the_rest(tmp_path: Path, one_result: None) -> None:
    """After a rerun: each figure whose results changed is rewritten to them (same format, other
    text untouched) and the changed lines are returned to read again; a widened tolerance (prose
    that rounds further) and an unmarked figure are left and listed; the page then passes."""
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- figs: demo -->\n"
        "A step takes **1.91 ms**<!-- fig: D['ms'] -->, then 19,000 tok/s<!-- fig: median(D['tok_s']) -->"
        " or 19.0k<!-- fig: median(D['tok_s']) -->.\n"
        "Busy 25%<!-- fig: 100 * D['ratio'] --> of the time.\n"
        "About 19,000<!-- fig ±50: median(D['tok_s']) --> tokens, and 3.5 ms with no marker.\n",
        encoding="utf-8")
    changes, left = figures.update_file(page)
    assert [(n, new) for n, _, new in changes] == [
        (2, "A step takes **1.77 ms**<!-- fig: D['ms'] -->, then 21,621 tok/s<!-- fig: median(D['tok_s']) -->"
            " or 21.6k<!-- fig: median(D['tok_s']) -->.")]
    assert changes[0][1].startswith("A step takes **1.91 ms**")
    assert sorted(f.problem.split(" (")[0] for f in left) == ["no marker: add <!-- fig: … -->, <!-- run: … --> or "
                                                                 "<!-- given -->", "the results say 21621"]
    lines = page.read_text(encoding="utf-8").split("\n")
    assert lines[2] == "Busy 25%<!-- fig: 100 * D['ratio'] --> of the time." and lines[3].startswith("About 19,000")
    assert [f.line for f in figures.check_file(page) if f.problem] == [4, 4]  # only what was left
