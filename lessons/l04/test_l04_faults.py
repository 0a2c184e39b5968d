"""Lesson 4: one bad request never poisons the engine.

Run: pytest lessons/l04

Three kinds of trouble, and what the engine promises for each:

* **Bad input** (NaN or infinite numbers, ``max_tokens=2.5``, ``True`` as a token id, a seed
  outside 64 bits, nonsense ``LLM(...)`` settings) is rejected before any work, with an error
  that names the parameter, and leaves nothing queued or reserved.
* **A failure while a request runs** (a kernel error at prefill or decode, a sampler error)
  finishes the requests of that batch with ``finish_reason == "error"`` and frees their KV;
  everything else goes on. ``LLM.generate`` turns it into :class:`RequestFailedError`.
* **An interrupt** (Ctrl-C) during ``generate`` aborts the call's requests and frees their KV.

After each scenario every page and every page-table row is back, and the next ``generate``
gives Hugging Face's tokens.
"""

from __future__ import annotations

import functools

import pytest
import torch

from minisgl import LLM, SamplingParams
from minisgl.attention.paged import ReferencePagedBackend
from minisgl.core import ReqStatus
from minisgl.engine.builder import make_engine, make_scheduler
from minisgl.engine.config import EngineConfig
from minisgl.kvcache.paged_pool import PagedKVPool
from minisgl.llm import RequestFailedError
from minisgl.models import load_model
from minisgl.testing import hf_greedy_tokens, tiny_checkpoint
from minisgl.utils import cdiv

ARCH = "qwen3"
NUM_PAGES, PAGE_SIZE, MAX_RUNNING, MAX_SEQ_LEN = 64, 4, 8, 128
PROMPTS = [[300, 301, 17, 250, 99, 42], [11, 12, 13], list(range(40, 61))]
NEW_TOKENS = 24


def hf_greedy(prompt: tuple[int, ...], n: int) -> list[int]:
    return list(hf_greedy_tokens(ARCH, prompt, n))


def fresh_llm() -> LLM:
    return LLM(tiny_checkpoint(ARCH), num_pages=NUM_PAGES, page_size=PAGE_SIZE, max_running=MAX_RUNNING,
               max_seq_len=MAX_SEQ_LEN, prefix_cache=False, chunked_prefill_size=None, overlap=False)  # lesson 4's engine;
    # lessons 5 and 6 test faults with the radix cache and with chunked prefill


def assert_nothing_left(llm: LLM) -> None:
    """Every page and every page-table row is free, and no request is queued or running."""
    sched = llm.scheduler
    assert not sched.waiting and not sched.running, "requests left behind"
    assert sched.kv.allocator.num_free == NUM_PAGES, f"{NUM_PAGES - sched.kv.allocator.num_free} pages leaked"
    assert sched.kv.page_table.num_free_rows == MAX_RUNNING, "page-table rows leaked"
    assert int(sched.kv.page_table.num_pages.sum()) == 0


def assert_still_correct(llm: LLM) -> None:
    """The next generate on the same engine gives HF's tokens and cleans up after itself."""
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True), progress=False)
    assert [o.token_ids for o in outs] == [hf_greedy(tuple(p), NEW_TOKENS) for p in PROMPTS]
    assert_nothing_left(llm)


# --------------------------------------------------------------------------------------------
# Bad input: rejected up front, naming the parameter
# --------------------------------------------------------------------------------------------

BAD_SAMPLING = [
    ("temperature", float("nan")),
    ("temperature", float("inf")),
    ("temperature", -0.5),
    ("temperature", True),
    ("temperature", "0.7"),
    ("top_p", float("nan")),
    ("top_p", 0.0),
    ("top_p", 1.5),
    ("top_k", 2.5),
    ("top_k", -2),
    ("max_tokens", 2.5),
    ("max_tokens", True),
    ("max_tokens", 0),
    ("max_tokens", float("inf")),
    ("seed", -(2**63) - 1),  # any int64 is a seed (negative ones too), nothing past it
    ("seed", 2**64),
    ("seed", 1.5),
    ("stop_token_ids", [True]),
    ("stop_token_ids", [-3]),
    ("stop_token_ids", 7),
    ("ignore_eos", "yes"),
]


@pytest.mark.parametrize("name, value", BAD_SAMPLING, ids=[f"{n}={v!r}" for n, v in BAD_SAMPLING])
def test_bad_sampling_params_are_rejected_naming_the_parameter(name: str, value) -> None:
    with pytest.raises(ValueError, match=name):
        SamplingParams(**{name: value})
    params = SamplingParams()
    setattr(params, name, value)  # mutated after construction: generate checks again
    llm = shared_llm()
    with pytest.raises(ValueError, match=name):
        llm.generate([PROMPTS[0]], params, progress=False)
    assert_nothing_left(llm)


@functools.cache
def shared_llm() -> LLM:
    return fresh_llm()


def test_nan_temperature_no_longer_poisons_the_engine() -> None:
    """The original report: NaN passed validation, the sampler raised, and every later call failed."""
    llm = fresh_llm()
    bad = SamplingParams(temperature=0.7)
    bad.temperature = float("nan")
    with pytest.raises(ValueError, match="temperature must be finite"):
        llm.generate(PROMPTS, bad, progress=False)
    assert_nothing_left(llm)
    assert_still_correct(llm)


def test_tiny_temperatures_act_as_greedy_instead_of_overflowing() -> None:
    llm = shared_llm()
    for t in (1e-45, 1e-30, 9e-6):  # logits / 1e-45 would be inf in float32
        params = SamplingParams(temperature=t, max_tokens=NEW_TOKENS, ignore_eos=True, seed=3)
        assert params.greedy
        out = llm.generate([PROMPTS[0]], params, progress=False)[0]
        assert out.token_ids == hf_greedy(tuple(PROMPTS[0]), NEW_TOKENS)
    assert_nothing_left(llm)


def test_fractional_max_tokens_leaks_nothing_even_after_max_running_calls() -> None:
    """The original report: each ``max_tokens=2.5`` call leaked a page-table row, and after
    ``max_running`` calls the scheduler stalled with every page free."""
    llm = fresh_llm()
    params = SamplingParams()
    params.max_tokens = 2.5
    for _ in range(MAX_RUNNING + 2):
        with pytest.raises(ValueError, match="max_tokens must be an integer"):
            llm.generate([PROMPTS[1]], params, progress=False)
        assert_nothing_left(llm)
    assert_still_correct(llm)


@pytest.mark.parametrize("bad", [[True, 5, 6], [5, 6.0], [5, None]], ids=["bool", "float", "none"])
def test_prompts_that_are_not_token_ids_are_rejected(bad) -> None:
    llm = shared_llm()
    with pytest.raises((TypeError, ValueError), match="token ids"):
        llm.generate([PROMPTS[0], bad], SamplingParams(max_tokens=4), progress=False)
    with pytest.raises(ValueError, match="bools are not token ids|integers"):
        llm.scheduler.add_request(bad, SamplingParams(max_tokens=4))
    assert_nothing_left(llm)


def test_stop_token_ids_outside_the_vocabulary_are_rejected() -> None:
    llm = shared_llm()
    with pytest.raises(ValueError, match="stop_token_ids"):
        llm.generate([PROMPTS[0]], SamplingParams(stop_token_ids=[llm.config.vocab_size]), progress=False)
    assert_nothing_left(llm)


BAD_SETTINGS = [
    ({"page_size": 0}, "page_size"),
    ({"page_size": 2.5}, "page_size"),
    ({"num_pages": 0}, "num_pages"),
    ({"num_pages": -4}, "num_pages"),
    ({"max_running": 0}, "max_running"),
    ({"max_prefill_tokens": True}, "max_prefill_tokens"),
    ({"max_seq_len": 0}, "max_seq_len"),
    ({"max_seq_len": 10**9}, "max_seq_len=1000000000 exceeds the model's context length"),
    ({"kv_memory_fraction": 0.0}, "kv_memory_fraction"),
    ({"kv_memory_fraction": 1.5}, "kv_memory_fraction"),
    ({"cpu_kv_bytes": 0}, "cpu_kv_bytes"),
    ({"cpu_kv_bytes": 64}, "cpu_kv_bytes=64 does not hold one page"),
    ({"attention_backend": "fast"}, "attention_backend"),
    ({"device": "tpu"}, "device"),
    ({"dtype": torch.int8}, "dtype"),
]


@pytest.mark.parametrize("settings, message", BAD_SETTINGS,
                         ids=[next(iter(s)) + "=" + repr(next(iter(s.values()))) for s, _ in BAD_SETTINGS])
def test_bad_llm_settings_are_named_errors(settings: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LLM(tiny_checkpoint(ARCH), **settings)


# --------------------------------------------------------------------------------------------
# One source of truth for the KV geometry; a CPU pool sized by what can be used
# --------------------------------------------------------------------------------------------


def test_scheduler_takes_page_size_and_count_from_the_pool() -> None:
    model = load_model(tiny_checkpoint(ARCH), dtype=torch.float32)
    pool = PagedKVPool.for_model(model.config, 37, 16, torch.float32, "cpu")
    # The config's page_size and num_pages say how to build a pool; the scheduler never reads
    # them: it reads the pool it serves (here built by hand with other numbers).
    config = EngineConfig(max_running=4, max_seq_len=64, prefix_cache=False, page_size=4, num_pages=99)
    sched = make_scheduler(make_engine(model, ReferencePagedBackend(pool), config), config)
    assert (sched.kv.page_size, sched.num_pages, sched.kv.allocator.num_blocks) == (16, 37, 37)
    assert sched.kv.page_table.page_size == 16
    with pytest.raises(TypeError):
        EngineConfig(pages=37)  # type: ignore[call-arg]


def test_cpu_pool_is_sized_by_what_can_be_used() -> None:
    llm = LLM(tiny_checkpoint(ARCH), max_running=4, max_seq_len=256, page_size=16)
    assert llm.pool.num_pages == cdiv(4 * 256, 16) == 64
    assert llm.scheduler.num_pages == llm.pool.num_pages
    # The README's default settings: 256 running requests of the full context, capped at 2 GiB.
    default = LLM(tiny_checkpoint(ARCH))
    per_token = default.config.kv_bytes_per_token(torch.float32)
    usable = 256 * default.config.max_position_embeddings
    assert default.pool.num_pages == min(cdiv(usable, 16), (2 << 30) // per_token // 16)
    assert default.pool.nbytes <= max(usable, 16) * per_token + 16 * per_token
    # A budget smaller than that wins.
    capped = LLM(tiny_checkpoint(ARCH), max_running=4, max_seq_len=256, page_size=16, cpu_kv_bytes=20 * 16 * per_token)
    assert capped.pool.num_pages == 20


# --------------------------------------------------------------------------------------------
# Failures while requests run: they fail alone, their KV is freed, the engine stays correct
# --------------------------------------------------------------------------------------------


class InjectedFault(RuntimeError):
    pass


def inject(monkeypatch, llm: LLM, where: str, exc: BaseException, after: int = 0) -> list[int]:
    """Make the ``after``-th batch of kind ``where`` raise ``exc``: "prefill" or "decode" fail
    inside the forward pass (like a kernel error); "sampler" fails after the forward pass.
    Returns a list that records how many times the fault fired."""
    fired: list[int] = []
    seen = {"n": 0}
    engine = llm.engine
    if where == "sampler":
        sample = engine.sampler.sample

        def broken_sampler(logits, reqs):
            seen["n"] += 1
            if seen["n"] > after and not fired:
                fired.append(len(reqs))
                raise exc
            return sample(logits, reqs)

        monkeypatch.setattr(engine.sampler, "sample", broken_sampler)
        return fired
    forward = engine.forward

    def broken_forward(batch):
        if batch.mode == where:
            seen["n"] += 1
            if seen["n"] > after and not fired:
                fired.append(batch.size)
                raise exc
        return forward(batch)

    monkeypatch.setattr(engine, "forward", broken_forward)
    return fired


@pytest.mark.parametrize("where, after", [("prefill", 0), ("decode", 5), ("sampler", 3)])
def test_a_failing_step_frees_its_requests_and_the_engine_stays_correct(monkeypatch, where: str, after: int) -> None:
    llm = fresh_llm()
    fired = inject(monkeypatch, llm, where, InjectedFault(f"injected {where} failure"), after)
    with pytest.raises(RequestFailedError, match=f"InjectedFault: injected {where} failure"):
        llm.generate(PROMPTS, SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True), progress=False)
    assert fired, "the fault must have fired"
    assert_nothing_left(llm)
    monkeypatch.undo()
    assert_still_correct(llm)


def test_ctrl_c_during_generate_frees_everything(monkeypatch) -> None:
    """The original report: after Ctrl-C the interrupted call's requests kept their pages and
    were silently decoded inside the next call."""
    llm = fresh_llm()
    fired = inject(monkeypatch, llm, "decode", KeyboardInterrupt(), after=4)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(PROMPTS, SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True), progress=False)
    assert fired
    assert_nothing_left(llm)
    monkeypatch.undo()
    batches: list[int] = []
    run_batch = llm.engine.step  # lesson 4's engine runs each batch with step()
    monkeypatch.setattr(llm.engine, "step", lambda batch: batches.append(batch.size) or run_batch(batch))
    assert_still_correct(llm)
    assert max(batches) == len(PROMPTS), "no request of the interrupted call may ride along"


def test_a_failed_batch_fails_alone_inside_the_scheduler(monkeypatch) -> None:
    """Driving the scheduler directly (as a server does): the failing batch's requests come back
    finished with an error and freed; requests added before and after are unaffected."""
    llm = fresh_llm()
    sched = llm.scheduler
    survivor = sched.add_request(PROMPTS[0], SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True))
    sched.step()  # survivor's prefill
    fired = inject(monkeypatch, llm, "prefill", InjectedFault("boom"))
    victim = sched.add_request(PROMPTS[1], SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True))
    failed = sched.step()  # victim's prefill fails
    assert fired == [1] and failed == [victim]
    assert victim.status == ReqStatus.FINISHED and victim.finish_reason == "error" and "boom" in victim.error
    assert victim.table_row == -1 and survivor.status == ReqStatus.RUNNING
    latecomer = sched.add_request(PROMPTS[2], SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True))
    while sched.has_work:
        sched.step()
    for req, prompt in ((survivor, PROMPTS[0]), (latecomer, PROMPTS[2])):
        assert req.finish_reason == "length" and req.output_ids == hf_greedy(tuple(prompt), NEW_TOKENS)
    assert_nothing_left(llm)
    sched.abort(victim)  # aborting a failed request again frees nothing twice
    assert_nothing_left(llm)


def test_interrupt_at_any_point_of_a_step_leaves_a_clean_engine(monkeypatch) -> None:
    """Ctrl-C may land anywhere; a few other places than the forward pass."""
    for target in ("schedule", "process"):
        llm = fresh_llm()
        original = getattr(llm.scheduler, target)
        calls = {"n": 0}

        def interrupted(*args, _original=original, _calls=calls, **kwargs):
            _calls["n"] += 1
            result = _original(*args, **kwargs)
            if _calls["n"] == 3:
                raise KeyboardInterrupt  # after the real work: state is mid-step
            return result

        monkeypatch.setattr(llm.scheduler, target, interrupted)
        with pytest.raises(KeyboardInterrupt):
            llm.generate(PROMPTS, SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True), progress=False)
        assert calls["n"] == 3, target
        assert_nothing_left(llm)
        monkeypatch.undo()
        assert_still_correct(llm)
