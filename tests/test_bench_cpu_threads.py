"""The CPU thread policy (``minisgl.cpu_threads``): one thread by default, a second core for decode
steps only while it is free and faster, and every way a user chooses otherwise wins. The
measurements behind it are ``python -m benchmarks.threads``."""

from __future__ import annotations

import pytest

from minisgl import cpu_threads
from minisgl.cpu_threads import (
    DEFAULT_THREADS,
    AdaptiveThreadForward,
    AdaptiveThreads,
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


def _run(chooser, steps: int, step_s: dict[int, float], rows: int = 1, decode: bool = True) -> list[int]:
    """``steps`` steps; a step at ``t`` threads takes ``step_s[t]``. The thread counts chosen."""
    chosen = []
    for _ in range(steps):
        t = chooser.choose(rows, decode)
        chooser.record(rows, decode, t, step_s[t])
        chosen.append(t)
    return chosen


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    """What other processes keep busy, in cores (``machine["others"]``), as /proc/stat would say."""
    state = {"others": 0.0}
    monkeypatch.setattr(cpu_threads, "other_busy_cores", lambda previous: (state["others"], (0.0, 0.0, 0.0)))
    return state


def test_adaptive_threads_use_a_free_core_when_it_helps(machine) -> None:
    chooser = AdaptiveThreads(most=2, trial_steps=3, retry_steps=50, recheck_s=0.0)
    chosen = _run(chooser, 40, {1: 1.5, 2: 1.0})
    assert chosen[:6] == [2, 2, 2, 1, 1, 1], "a trial: three steps at two threads, three at one"
    assert set(chosen[6:]) == {2}, "two threads won the trial"
    # a prefill or mixed step keeps the current choice and is not measured
    assert chooser.choose(1, decode=False) == 2


def test_adaptive_threads_stay_at_one_when_it_is_faster_and_retry_less_often(machine) -> None:
    chooser = AdaptiveThreads(most=2, trial_steps=3, retry_steps=50, recheck_s=0.0)
    chosen = _run(chooser, 400, {1: 1.0, 2: 1.2})
    trials = [i for i in range(1, len(chosen)) if chosen[i] == 2 and chosen[i - 1] == 1]
    assert chosen[:6] == [2, 2, 2, 1, 1, 1] and chosen.count(2) < 20
    gaps = [b - a for a, b in zip(trials, trials[1:])]
    assert gaps == sorted(gaps) and gaps[-1] > gaps[0], f"retries should back off: trials at {trials}"


def test_adaptive_threads_go_back_to_one_when_another_process_wants_the_core(machine) -> None:
    chooser = AdaptiveThreads(most=2, trial_steps=3, retry_steps=50, recheck_s=0.0)
    assert set(_run(chooser, 10, {1: 1.5, 2: 1.0})[6:]) == {2}
    machine["others"] = 0.9  # a busy process appears
    assert set(_run(chooser, 20, {1: 1.5, 2: 10.0})) == {1}, "no trial while no core is free"
    machine["others"] = 0.0
    assert _run(chooser, 6, {1: 1.5, 2: 1.0}) == [2, 2, 2, 1, 1, 1], "a free core again: a new trial"


def test_adaptive_threads_drop_a_verdict_when_steps_turn_slow(machine) -> None:
    """The busy process may not show in /proc/stat yet (it is sampled every recheck_s): a step at
    two threads slower than 1.5x the trial's one-thread time is enough to go back to one."""
    chooser = AdaptiveThreads(most=2, trial_steps=3, retry_steps=50, recheck_s=0.0)
    _run(chooser, 10, {1: 1.5, 2: 1.0})
    assert _run(chooser, 3, {1: 1.5, 2: 9.0}) == [2, 1, 1]


def test_adaptive_threads_set_torch_in_the_thread_that_runs_the_step(machine) -> None:
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()

    class Batch:
        reqs, mode = [object()], "decode"

    forward = AdaptiveThreadForward(lambda batch: torch.get_num_threads(),
                                    AdaptiveThreads(most=2, trial_steps=1, recheck_s=0.0))
    try:
        assert [forward(Batch()) for _ in range(2)] == [2, 1]
    finally:
        torch.set_num_threads(before)


def test_the_policys_own_setting_is_not_taken_for_the_users(monkeypatch: pytest.MonkeyPatch) -> None:
    """Applied twice (the bench, then LLM), the default stays the default: the adaptive runner
    is only for runs where nobody chose a count."""
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
