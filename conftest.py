"""Project-wide pytest setup: one torch thread; GPU tests skip themselves without CUDA;
``--mine`` runs a lesson's tests on the learner's ``lessons/lNN/exercise.py`` (minisgl.testing.exercises)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never download anything
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("minisgl exercises")
    group.addoption("--mine", action="store_true",
                    help="run the named lesson's tests with your lessons/lNN/exercise.py in place of the package's functions")
    group.addoption("--mine-file", action="append", default=None, metavar="[lNN=]PATH",
                    help="with --mine: use this file instead of lessons/lNN/exercise.py (PATH alone: the one "
                         "lesson named; lNN=PATH, repeatable: per lesson)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "exercises: the exercise harness check (tests/test_exercises.py; ~2-3 min)")
    if config.getoption("--mine"):
        from minisgl.testing.exercises import MinePlugin

        config.pluginmanager.register(MinePlugin(config), "minisgl-mine")
    import torch

    # The tiny test models run microsecond-sized ops: one thread is faster than two, and much
    # faster when another process holds the second core (two threads must meet at every op).
    torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
