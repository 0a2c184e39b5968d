"""The CPU thread policy (``minisgl.cpu_threads``): one thread by default, chosen once when the
engine is built, and every way a user chooses otherwise wins. The
measurements behind it are ``python -m benchmarks threads``."""

from __future__ import annotations

import pytest

from minisgl import cpu_threads
from minisgl.cpu_threads import (
    DEFAULT_THREADS,
    apply_cpu_thread_policy,
    child_env,
    choose_cpu_threads,
    torch_default_threads,
)

DEFAULT = torch_default_threads()


def test_default_is_one_thread_when_nobody_chose():
    assert DEFAULT_THREADS == 1
    choice = choose_cpu_threads(environ={}, current=DEFAULT)
    assert (choice.threads, choice.source) == (1, "default")
    assert "MINISGL_CPU_THREADS" in choice.describe(), "the message says how to change it"


@pytest.mark.parametrize("environ, threads, source", [
    ({"OMP_NUM_THREADS": "3"}, DEFAULT, "OMP_NUM_THREADS"),  # torch obeyed it already: left alone
    ({"MKL_NUM_THREADS": "3"}, DEFAULT, "MKL_NUM_THREADS"),
    ({"MINISGL_CPU_THREADS": "3", "OMP_NUM_THREADS": "2"}, 3, "MINISGL_CPU_THREADS"),
])
def test_the_environment_wins(environ, threads, source):
    choice = choose_cpu_threads(environ=environ, current=DEFAULT)
    assert (choice.threads, choice.source) == (threads, source)


def test_a_setting_wins_over_everything_and_a_torch_call_is_kept():
    assert choose_cpu_threads(4, environ={"OMP_NUM_THREADS": "2", "MINISGL_CPU_THREADS": "3"}).threads == 4
    kept = choose_cpu_threads(environ={}, current=DEFAULT + 1)  # somebody called torch.set_num_threads
    assert (kept.threads, kept.source) == (DEFAULT + 1, "torch.set_num_threads")


@pytest.mark.parametrize("bad", ["0", "-1", "two"])
def test_bad_numbers_are_refused_by_name(bad):
    with pytest.raises(ValueError, match="MINISGL_CPU_THREADS"):
        choose_cpu_threads(environ={"MINISGL_CPU_THREADS": bad}, current=DEFAULT)
    with pytest.raises(ValueError, match="cpu_threads"):
        choose_cpu_threads(bad)


def test_children_get_the_policy_unless_the_user_chose():
    assert child_env({})["OMP_NUM_THREADS"] == "1"
    assert child_env({"MINISGL_CPU_THREADS": "2"})["OMP_NUM_THREADS"] == "2"
    assert child_env({"OMP_NUM_THREADS": "3"})["OMP_NUM_THREADS"] == "3"
    assert "OMP_NUM_THREADS" not in child_env({"MKL_NUM_THREADS": "3"}), "the user's MKL setting is passed on as is"
    assert child_env({"OMP_NUM_THREADS": "3"}, threads=2)["OMP_NUM_THREADS"] == "2"


def test_apply_sets_torch_and_is_idempotent():
    import torch

    before = torch.get_num_threads()  # the suite runs with one thread (conftest.py)
    try:
        first = apply_cpu_thread_policy(2)
        assert torch.get_num_threads() == 2 and first.source == "setting"
        again = apply_cpu_thread_policy()  # now 2 != torch's default only if the machine has another count
        assert torch.get_num_threads() == again.threads
    finally:
        torch.set_num_threads(before)


def test_the_policys_own_setting_is_not_taken_for_the_users(monkeypatch: pytest.MonkeyPatch) -> None:
    """Applied twice (the bench, then LLM), the default stays the default: the policy's own
    setting is not mistaken for a user's ``torch.set_num_threads``."""
    torch = pytest.importorskip("torch")
    for name in ("MINISGL_CPU_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    before = torch.get_num_threads()
    monkeypatch.setattr(cpu_threads, "_set_by_policy", None)
    try:
        torch.set_num_threads(DEFAULT)
        assert apply_cpu_thread_policy().source == "default"
        assert apply_cpu_thread_policy().source == "default"
        if DEFAULT > 2:
            torch.set_num_threads(2)  # a user's own call still wins
            assert apply_cpu_thread_policy().source == "torch.set_num_threads"
    finally:
        torch.set_num_threads(before)
