"""The README's quick start, kept honest: two commands (``python3 dev.py serve`` and ``python3
dev.py test``) that set everything up, CI running the same test command, and the rough edges a
new learner met on the way.

Run: pytest lessons/l10/test_l10_quickstart.py

These tests read the files and drive ``dev.py`` with a fake ``pip`` (nothing is installed); the
real thing, from a clean clone, is what ``.ci/run`` does.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def readme_section(name: str) -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(rf"<!-- {name}:begin -->\n(.*?)<!-- {name}:end -->", text, re.S)
    assert m, f"README.md has no {name} section"
    return m.group(1)


def code_blocks(markdown: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", markdown, re.S)


@pytest.fixture()
def dev(monkeypatch, tmp_path):
    """``dev.py`` imported as a module, its venv in ``tmp_path`` and ``pip`` faked: every command
    it would run is recorded in ``dev.calls``; ``-m venv`` creates an empty python file."""
    spec = importlib.util.spec_from_file_location("dev_under_test", ROOT / "dev.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.calls = []

    def fake_run(cmd: list[str]) -> None:
        module.calls.append(cmd)
        if cmd[1:3] == ["-m", "venv"]:
            python = module.venv_python(Path(cmd[3]))
            python.parent.mkdir(parents=True)
            python.write_text("")

    monkeypatch.setattr(module, "run", fake_run)
    monkeypatch.setenv("MINISGL_VENV", str(tmp_path / "venv"))
    for name in ("MINISGL_TORCH_INDEX_URL", "MINISGL_EXTRAS"):
        monkeypatch.delenv(name, raising=False)
    return module


def test_readme_quick_start_opens_with_the_two_commands():
    first = code_blocks(readme_section("quickstart"))[0]
    commands = [line.split("#")[0].strip() for line in first.splitlines() if line.strip()]
    assert commands == ["python3 dev.py serve", "python3 dev.py test"]
    assert "127.0.0.1:1919" in readme_section("quickstart") and "curl" in readme_section("quickstart")


def test_ci_installs_and_tests_with_the_readme_commands():
    ci = (ROOT / ".ci/run").read_text(encoding="utf-8")
    steps = [line.strip() for line in ci.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert "python3 dev.py setup" in steps
    assert any(s.endswith("python3 dev.py test") for s in steps), "CI's test step must be the README's command"
    assert not [s for s in steps if s.startswith("pip install")], "CI installs through dev.py, as the README does"
    assert any(s.startswith('export MINISGL_VENV="$VENV"') for s in steps), "CI's own fresh venv, through dev.py's variable"


def test_dev_installs_like_ci_once_and_again_when_pyproject_changes(dev, monkeypatch, tmp_path):
    python = dev.ensure_env()
    venv = tmp_path / "venv"
    assert python == dev.venv_python(venv)
    create, torch, package, sglang = dev.calls
    assert create[1:] == ["-m", "venv", str(venv)]
    assert torch == [str(python), "-m", "pip", "install", "torch==2.13.0"], "CPU torch first, as .ci/run did"
    assert package == [str(python), "-m", "pip", "install", "-e", ".[dev]"]
    assert sglang == [str(python), "-m", "pip", "install", "--no-deps", dev.SGLANG], "SGLang's client, alone"

    dev.calls.clear()
    assert dev.ensure_env() == python and dev.calls == [], "a second run must not install anything"

    monkeypatch.setattr(dev, "install_key", lambda: "pyproject.toml changed")
    dev.ensure_env()
    assert [c[4:] for c in dev.calls] == [["torch==2.13.0"], ["-e", ".[dev]"], ["--no-deps", dev.SGLANG]], \
        "reinstalled, venv kept"


def test_dev_torch_index_variable_and_stamp_key(dev, monkeypatch):
    key = dev.install_key()
    monkeypatch.setenv("MINISGL_TORCH_INDEX_URL", "https://download.pytorch.org/whl/cpu")
    assert dev.install_key() != key, "another torch index means another install"
    dev.ensure_env()
    assert dev.calls[1][-3:] == ["torch==2.13.0", "--index-url", "https://download.pytorch.org/whl/cpu"]


def test_dev_refuses_an_unknown_verb(dev, capsys):
    assert dev.main([]) == 2 and dev.main(["deploy"]) == 2
    assert "serve|test" in capsys.readouterr().err
    assert dev.calls == [], "nothing installed for a typo"


def test_transformers_is_pinned_to_the_range_ci_tests():
    """Every parity test compares tokens with transformers: an untested major release must not
    arrive by itself. The pin's range must hold the version installed here."""
    from importlib.metadata import version

    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    installed = version("transformers")
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    spec = re.search(r'"transformers([^"]*)"', pyproject).group(1)
    assert "<" in spec, f"transformers needs an upper bound, got {spec!r}"
    assert Version(installed) in SpecifierSet(spec), (installed, spec)


def test_mkdocs_commands_hide_the_end_of_life_banner():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = next(b for b in code_blocks(readme) if "mkdocs serve" in b)
    assert block.splitlines()[0].startswith("export NO_MKDOCS_2_WARNING=1")
    assert 'NO_MKDOCS_2_WARNING="1"' in (ROOT / "dev.py").read_text(encoding="utf-8")
    assert "export NO_MKDOCS_2_WARNING=1" in (ROOT / ".ci/run").read_text(encoding="utf-8")


def test_readme_says_how_to_stop_a_background_server():
    quick = readme_section("quickstart")
    assert "python -m minisgl &" in quick and "kill %1" in quick
    assert "Ctrl-C" in quick


def test_readme_states_the_suite_time():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "a few minutes" not in readme and "SUITE_TIME" not in readme
    assert re.search(r"python3 dev.py test` runs every test, which takes about \d+ minutes", readme)


def test_the_tokenizer_process_starts_without_torch():
    """The tokenizer worker (a process of every server) never needs a tensor: importing torch
    cost it seconds at every start, in every test that starts a server too. The HTTP module and
    the tokenizer loader are torch-free as well (the launcher's process imports torch for the
    engine settings)."""
    import subprocess

    code = ("import sys, minisgl.server.tokenizer_worker, minisgl.server.api; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "[]", out


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
