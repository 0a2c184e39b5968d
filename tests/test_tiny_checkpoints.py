"""The tiny checkpoints' cache: one folder shared by every process of a test run
(``MINISGL_TINY_CHECKPOINTS``, set by the project's conftest.py), each checkpoint built once and
never seen half-written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import conftest
from minisgl.testing import checkpoints
from minisgl.testing.checkpoints import SHARED_CACHE_ENV, _built_once, tiny_checkpoint

REPO = Path(__file__).resolve().parents[1]


def test_this_run_shares_one_folder() -> None:
    assert conftest.TINY_CHECKPOINTS_ENV == SHARED_CACHE_ENV
    shared = Path(os.environ[SHARED_CACHE_ENV])
    assert tiny_checkpoint("qwen3").parent == shared


def test_a_child_process_reuses_the_runs_checkpoint_and_builds_none() -> None:
    path = tiny_checkpoint("qwen3")
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    code = ("import json, minisgl.testing.checkpoints as c\n"
            "c.build_tiny_checkpoint = lambda *a, **k: (_ for _ in ()).throw(AssertionError('rebuilt'))\n"
            "print(json.dumps(str(c.tiny_checkpoint('qwen3'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == str(path)
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp


def test_builds_land_whole_and_a_lost_race_leaves_no_scratch(tmp_path: Path) -> None:
    target = tmp_path / "ckpt"
    calls = []

    def build(out: Path) -> None:
        calls.append(out)
        assert out != target and out.parent == target.parent  # never written in place
        (out / "weights").write_text("w")
        (out / "config.json").write_text("{}")

    assert _built_once(target, build) == target and (target / "weights").read_text() == "w"
    assert _built_once(target, build) == target and len(calls) == 1  # built once

    racer = tmp_path / "race"

    def loses_the_race(out: Path) -> None:  # another process renames its copy first
        other = tmp_path / "other"
        other.mkdir()
        (other / "config.json").write_text('{"first": true}')
        os.rename(other, racer)
        (out / "config.json").write_text('{"first": false}')

    assert _built_once(racer, loses_the_race) == racer
    assert json.loads((racer / "config.json").read_text()) == {"first": True}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "race"], "no scratch folder left"


def test_without_the_variable_each_process_has_its_own_folder(monkeypatch) -> None:
    monkeypatch.delenv(SHARED_CACHE_ENV)
    checkpoints._cache_root.cache_clear()
    try:
        own = checkpoints._cache_root()
        assert own != Path(os.environ.get(SHARED_CACHE_ENV, "/nonexistent")) and own.name.startswith("minisgl-tiny-")
    finally:
        checkpoints._cache_root.cache_clear()


def test_the_tokenizer_alone_is_the_checkpoints_tokenizer() -> None:
    """The benchmarks' real-shape folders take the tiny checkpoint's tokenizer without its model
    (building the model cost every benchmark process seconds): the same files, and no weights."""
    from minisgl.testing.checkpoints import tiny_tokenizer

    for arch in ("qwen3", "llama"):
        alone, whole = tiny_tokenizer(arch), tiny_checkpoint(arch)
        files = {p.name for p in alone.iterdir()}
        assert {"tokenizer.json", "tokenizer_config.json"} <= files and not {"config.json", "model.safetensors"} & files
        for name in files:
            assert (alone / name).read_text() == (whole / name).read_text(), (arch, name)
