"""``dev.py``, the README's two commands: the whole suite's worker processes."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_dev():
    spec = importlib.util.spec_from_file_location("minisgl_dev_script", ROOT / "dev.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_whole_suite_runs_one_worker_per_core_up_to_the_cap() -> None:
    dev = load_dev()
    assert dev.test_worker_args(1) == []  # one core: one process, no xdist
    assert dev.test_worker_args(2) == ["-n", "2", "--dist", "loadfile"]
    assert dev.test_worker_args(64) == ["-n", str(dev.MAX_TEST_WORKERS), "--dist", "loadfile"]


def test_the_dev_extras_install_the_worker_plugin() -> None:
    """``-n`` is pytest-xdist's: without it in the dev extras a fresh set-up would fail."""
    dev_extras = re.search(r"^dev = \[(.*?)^\]", (ROOT / "pyproject.toml").read_text(), re.M | re.S).group(1)
    assert re.search(r'^\s*"pytest-xdist\b', dev_extras, re.M)
