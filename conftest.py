"""Project-wide pytest setup: one torch thread; the GPU hidden unless the run selects GPU tests
(``-m gpu``), and GPU tests skip themselves without CUDA;
``--mine`` runs a lesson's tests on the learner's ``lessons/lNN/exercise.py`` (tests.tools.exercises)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

# The course's tools (tests/tools, benchmarks/) are not part of the installed package: they import
# from the clone's root, which plain `pytest` (unlike `python -m pytest`) does not put on sys.path.
ROOT = str(Path(__file__).resolve().parent)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never download anything
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Set when this run hid the GPU (see pytest_configure); an environment variable, so that the
# worker processes of `pytest -n` (which inherit the hidden GPU) know it too.
GPU_HIDDEN_ENV = "MINISGL_TESTS_HID_GPU"
TINY_CHECKPOINTS_ENV = "MINISGL_TINY_CHECKPOINTS"  # minisgl.testing.checkpoints.SHARED_CACHE_ENV


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("minisgl exercises")
    group.addoption("--mine", action="store_true",
                    help="run the named lesson's tests with your lessons/lNN/exercise.py in place of the package's functions")
    group.addoption("--mine-file", action="append", default=None, metavar="[lNN=]PATH",
                    help="with --mine: use this file instead of lessons/lNN/exercise.py (PATH alone: the one "
                         "lesson named; lNN=PATH, repeatable: per lesson)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "exercises: the exercise harness check (tests/test_exercises.py; ~2-3 min)")
    # The CPU tests build engines on the default device. On a machine with a GPU that would be
    # CUDA, where the tiny test models (head_dim 16) have no FlashInfer kernels. So unless the run
    # asks for GPU tests (`-m gpu`), the GPU is hidden (before anything initialises CUDA; child
    # processes inherit it) and every test runs as it does on a laptop or in CI.
    expr = config.getoption("markexpr") or ""
    selects_gpu_tests = "gpu" in expr and "not gpu" not in expr
    if not selects_gpu_tests and "CUDA_VISIBLE_DEVICES" not in os.environ:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        os.environ[GPU_HIDDEN_ENV] = "1"
    if not hasattr(config, "workerinput") and not os.environ.get(TINY_CHECKPOINTS_ENV):
        # One folder of built tiny checkpoints for the whole run: pytest-xdist's workers, the
        # servers, TP ranks and runs that tests start inherit it, and build each checkpoint once.
        folder = tempfile.mkdtemp(prefix="minisgl-tiny-run-")
        os.environ[TINY_CHECKPOINTS_ENV] = folder
        config.add_cleanup(lambda: (os.environ.pop(TINY_CHECKPOINTS_ENV, None), shutil.rmtree(folder, True)))
    if config.getoption("--mine"):
        from tests.tools.exercises import MinePlugin

        config.pluginmanager.register(MinePlugin(config), "minisgl-mine")
    import torch

    # The tiny test models run microsecond-sized ops: one thread is faster than two, and much
    # faster when another process holds the second core (two threads must meet at every op).
    torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    if torch.cuda.is_available():
        return
    hidden = os.environ.get(GPU_HIDDEN_ENV) == "1" and os.environ.get("CUDA_VISIBLE_DEVICES") == ""
    skip_gpu = pytest.mark.skip(reason="GPU tests run with `pytest -m gpu` (on a CUDA machine)" if hidden else "needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
