"""Lesson 9: tensor parallelism over two CPU processes (gloo) gives Hugging Face's tokens.

Run: pytest lessons/l09

``LLM(tp_size=2)`` starts two rank processes; each holds half of every weight matrix and the
ranks add their partial results with all-reduces. These tests compare every request with HF
alone, check seeded sampling against one process, inject the three classic TP bugs (each caught),
and check that no rank process outlives its ``LLM``: after ``close``, after an error, after Ctrl-C.

The injected bugs run inside the rank processes: ``LLM(rank_init="test_l09_tp:<function>")``
calls a function of this module in every rank before the model is built.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import torch.nn.functional as F

from minisgl import LLM, SamplingParams
from minisgl.distributed.launcher import TPRankError
from minisgl.testing import distinct_fraction, hf_greedy_tokens, multi_file_checkpoint, process_alive, tiny_checkpoint
from minisgl.testing.processes import descendant_pids, library_loaded, process_name
from minisgl.testing.tp import fused_add_norm_in_torch

MODULE = os.path.splitext(os.path.basename(__file__))[0]


@pytest.fixture(autouse=True)
def importable_from_the_ranks(monkeypatch) -> None:
    """Rank processes inherit ``sys.path``: put this folder on it, so ``rank_init`` can name
    this module's bug functions."""
    monkeypatch.syspath_prepend(os.path.dirname(os.path.abspath(__file__)))


def jobs(arch: str, n: int = 8) -> tuple[list[list[int]], list[int]]:
    rng = random.Random(f"l09-{arch}")
    prompts = [[rng.randrange(8, 512) for _ in range(rng.randint(1, 40))] for _ in range(n)]
    return prompts, [rng.randint(4, 32) for _ in prompts]


def expected(arch: str, prompts: list[list[int]], max_tokens: list[int]) -> list[list[int]]:
    return [list(hf_greedy_tokens(arch, tuple(p), n)) for p, n in zip(prompts, max_tokens)]


def run_tp(arch: str, prompts, max_tokens, **kw) -> tuple[list[list[int]], list[int]]:
    """Tokens of every request through ``LLM(tp_size=2)``; the rank pids (all gone afterwards)."""
    kw = {"tp_size": 2, "max_running": 4, "max_seq_len": 96, "chunked_prefill_size": 16, **kw}
    with LLM(tiny_checkpoint(arch), **kw) as llm:
        pids = list(llm.core.ranks.pids)
        params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in max_tokens]
        outs = llm.generate(prompts, params, progress=False)
    assert not any(process_alive(p) for p in pids), "a rank process survived close()"
    return [o.token_ids for o in outs], pids


@pytest.mark.parametrize("arch", ["qwen3", "llama", "qwen2"])
def test_tp2_matches_hf(arch: str) -> None:
    """Eight requests, at most four running (requests join as others leave), prompts in chunks
    of 16 tokens, overlap and the radix cache on: every request equals HF alone."""
    prompts, max_tokens = jobs(arch)
    tokens, _ = run_tp(arch, prompts, max_tokens)
    assert tokens == expected(arch, prompts, max_tokens)
    assert distinct_fraction([t for out in tokens for t in out]) > 0.3


def test_seeded_sampling_matches_one_process() -> None:
    """Seeded sampling gives one process's tokens and text. The caller decodes the text: the
    ranks load a tokenizer only when a request has stop strings to watch (it cost each rank
    about 3 s of CPU on its first request), and then stop where one process stops."""
    arch = "llama"
    prompts, _ = jobs(arch, 4)
    params = [SamplingParams(temperature=0.9, top_k=50, max_tokens=16, ignore_eos=True, seed=100 + i)
              for i in range(len(prompts))]
    stopping = SamplingParams(max_tokens=16, ignore_eos=True, stop=["e"])
    single = LLM(tiny_checkpoint(arch), max_seq_len=96)
    one = single.generate(prompts, params, progress=False)
    one_stopped = single.generate(prompts[:1], stopping, progress=False)[0]
    with LLM(tiny_checkpoint(arch), tp_size=2, max_seq_len=96) as llm:
        two = llm.generate(prompts, params, progress=False)
        assert not any(library_loaded(pid, "tokenizers") for pid in llm.core.ranks.pids), (
            "a rank loaded a tokenizer it never needs")
        two_stopped = llm.generate(prompts[:1], stopping, progress=False)[0]
        assert all(library_loaded(pid, "tokenizers") for pid in llm.core.ranks.pids), "stop strings are watched in every rank"
    assert [o.token_ids for o in one] == [o.token_ids for o in two]
    assert [o.text for o in one] == [o.text for o in two]
    assert len({tuple(o.token_ids) for o in two}) == len(two), "sampling should make the requests differ"
    assert (two_stopped.token_ids, two_stopped.text, two_stopped.finish_reason) == (
        one_stopped.token_ids, one_stopped.text, one_stopped.finish_reason)
    assert two_stopped.finish_reason == "stop", "the stop string should end the request early"


def test_a_bad_request_fails_alone_and_the_ranks_stay_up() -> None:
    arch = "qwen3"
    with LLM(tiny_checkpoint(arch), tp_size=2, max_seq_len=32) as llm:
        with pytest.raises(ValueError, match="exceeds the maximum sequence length 32"):
            llm.generate([[5] * 30], SamplingParams(max_tokens=8), progress=False)
        prompts, max_tokens = [[5, 6, 7]], [8]
        out = llm.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True), progress=False)
        assert [o.token_ids for o in out] == expected(arch, prompts, max_tokens)


@pytest.mark.parametrize("arch", ["qwen3", "qwen2"])
def test_each_rank_loads_only_its_slice_of_a_multi_file_checkpoint(arch: str, tmp_path) -> None:
    """In this process, as rank 0 and then rank 1 of 2 (no collectives run while loading): every
    parameter is this rank's slice of the full model's, by the layer's rule; norms are whole."""
    from minisgl.distributed.tp import TPGroup, get_tp, set_tp
    from minisgl.layers.parallel import ParallelLayers
    from minisgl.models.loader import load_model

    path = multi_file_checkpoint(arch, tmp_path / "multi")
    whole = load_model(path)
    full = dict(whole.named_parameters())
    shard = whole.config.shard(2)
    q, kv, inter = shard.q_size, shard.kv_size, shard.intermediate_size
    saved = get_tp()
    try:
        for rank in range(2):
            set_tp(TPGroup(rank, 2))
            model = load_model(path, tp_size=2, tp_rank=rank, layers=ParallelLayers())
            for name, p in model.named_parameters():
                f = full[name]
                if name.endswith("qkv_proj.weight") or name.endswith("qkv_proj.bias"):
                    fq, fk, fv = f.split([2 * q, 2 * kv, 2 * kv])
                    want = torch.cat([fq[rank * q:(rank + 1) * q], fk[rank * kv:(rank + 1) * kv],
                                      fv[rank * kv:(rank + 1) * kv]])
                elif name.endswith("gate_up_proj.weight"):
                    gate, up = f.split([2 * inter, 2 * inter])
                    want = torch.cat([gate[rank * inter:(rank + 1) * inter], up[rank * inter:(rank + 1) * inter]])
                elif name.endswith(("o_proj.weight", "down_proj.weight")):
                    want = f.chunk(2, dim=1)[rank]
                elif name.endswith(("embed_tokens.weight", "lm_head.weight")):
                    want = f.chunk(2, dim=0)[rank]
                else:  # norms (and anything else) are whole on every rank
                    want = f
                assert p.shape == want.shape and torch.equal(p, want), f"rank {rank}: {name}"
    finally:
        set_tp(saved)


def test_tp2_on_a_multi_file_checkpoint_matches_hf(tmp_path) -> None:
    arch = "llama"
    path = multi_file_checkpoint(arch, tmp_path / "multi")
    prompts, max_tokens = jobs(arch, n=4)
    with LLM(path, tp_size=2, max_running=4, max_seq_len=96) as llm:
        outs = llm.generate(prompts, [SamplingParams(max_tokens=n, ignore_eos=True) for n in max_tokens],
                            progress=False)
    assert [o.token_ids for o in outs] == expected(arch, prompts, max_tokens)


def test_settings_are_checked_before_any_process_starts() -> None:
    for bad in (0, -1, 1.5, "2"):
        with pytest.raises(ValueError, match="tp_size"):
            LLM(tiny_checkpoint("qwen3"), tp_size=bad)
    with pytest.raises(ValueError, match="tp_size=3 does not divide"):
        LLM(tiny_checkpoint("qwen3"), tp_size=3)
    with pytest.raises(ValueError, match="tp_all_reduce must be 'auto', 'symmetric' or 'nccl'"):
        LLM(tiny_checkpoint("qwen3"), tp_size=2, tp_all_reduce="mpi")


def test_a_rank_refuses_settings_for_another_number_of_ranks() -> None:
    """Settings without ``tp_size`` (or with the wrong one) made every rank build a whole model
    of its own that never talked to the others (the TP benchmark's kernel profile once did)."""
    from minisgl.engine.builder import rank_engine

    for given in ({}, {"tp_size": 1}, {"tp_size": 4}):
        with pytest.raises(ValueError, match="tp_size must equal the number of rank processes"):
            rank_engine({"model": str(tiny_checkpoint("qwen3")), **given}, 0, 2)


# --- each layer on two ranks against the whole layer in one process ----------------------------

VOCAB = 11  # odd: the last rank's slice of the vocabulary has a padding row


def whole_layers() -> dict[str, torch.Tensor]:
    """The whole weights and inputs, the same in every process: a row-parallel linear with a bias
    (8 -> 5 features), an embedding and an LM head of an 11-id vocabulary (hidden size 4)."""
    g = torch.Generator().manual_seed(9)
    return {"w": torch.randn(5, 8, generator=g), "b": torch.randn(5, generator=g), "x": torch.randn(3, 8, generator=g),
            "embed": torch.randn(VOCAB, 4, generator=g), "head": torch.randn(VOCAB, 4, generator=g),
            "h": torch.randn(3, 4, generator=g), "ids": torch.tensor([*range(VOCAB), 5, 6, 0, 10])}


def parallel_layers_rank(settings: dict, rank: int, size: int):
    """A ``RankProcesses`` worker: this rank's slice of each layer (by the loader's rules: the
    linear's input columns, the vocabulary's rows, zero padding past the vocabulary), run on
    this rank's slice of the input."""
    from minisgl.layers.parallel import ParallelLMHead, RowParallelLinear, VocabParallelEmbedding

    def handle(command: dict) -> dict:
        t = whole_layers()
        row = RowParallelLinear(8 // size, 5, bias=True)
        row.weight.data = t["w"].chunk(size, dim=1)[rank].clone()
        row.bias.data = t["b"].clone()
        embed, head = VocabParallelEmbedding(VOCAB, 4), ParallelLMHead(4, VOCAB)
        for layer, whole in ((embed, t["embed"]), (head, t["head"])):
            padded = torch.cat([whole, torch.zeros(layer.weight.shape[0] * size - VOCAB, 4)])
            layer.weight.data = padded.chunk(size, dim=0)[rank].clone()
        with torch.no_grad():
            return {"row": row(t["x"].chunk(size, dim=1)[rank].contiguous()).tolist(),
                    "embed": embed(t["ids"]).tolist(), "head": head(t["h"]).tolist()}

    return handle, {}


def test_each_parallel_layer_equals_the_whole_layer_on_two_ranks() -> None:
    """The three forward passes on two ranks (gloo), each against the whole layer in this
    process: the row-parallel linear adds its bias once, the embedding of every id (both sides
    of the ranks' boundary) comes from exactly one rank, and the LM head's logits are exactly
    the vocabulary's 11 columns, in order, although 11 does not divide by 2. The parity tests
    cannot see the first and the last: the tiny models have no bias on a row-parallel layer
    and an even vocabulary."""
    from minisgl.distributed.launcher import RankProcesses

    ranks = RankProcesses(2, f"{MODULE}:parallel_layers_rank", {"device": "cpu"})
    try:
        replies = ranks.call({"cmd": "run"})
    finally:
        ranks.close()
    t = whole_layers()
    want = {"row": F.linear(t["x"], t["w"], t["b"]), "embed": F.embedding(t["ids"], t["embed"]),
            "head": F.linear(t["h"], t["head"])}
    for rank, reply in enumerate(replies):
        for name, expected_out in want.items():
            got = torch.tensor(reply[name])
            assert got.shape == expected_out.shape, f"rank {rank}, {name}: shape {list(got.shape)}"
            torch.testing.assert_close(got, expected_out, msg=lambda m, r=rank, n=name: f"rank {r}, {n}: {m}")


# --- teeth: the classic TP bugs, injected in the rank processes --------------------------------

def bug_layers_fused_step_without_the_all_reduce(rank: int) -> None:
    fused_add_norm_in_torch(rank, forget="layers")


def bug_embeddings_fused_step_without_the_all_reduce(rank: int) -> None:
    fused_add_norm_in_torch(rank, forget="embedding")


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_sums_left_to_the_pre_norm_step_give_hfs_tokens(arch: str) -> None:
    """Every row-parallel layer's sum, and the embedding's, is all-reduced by the pre-norm step
    after it (a ``PendingSum``; lesson 1's ``add_and_norm`` takes it, the final norm's too):
    HF's tokens. The same step without its all-reduce, for the layers' sums or for the
    embedding's, gives other tokens: so both pending paths did run."""
    prompts, max_tokens = jobs(arch, 4)
    tokens, _ = run_tp(arch, prompts, max_tokens, rank_init="minisgl.testing.tp:fused_add_norm_in_torch")
    assert tokens == expected(arch, prompts, max_tokens)
    broken, _ = run_tp(arch, prompts, max_tokens, rank_init=f"{MODULE}:bug_layers_fused_step_without_the_all_reduce")
    assert broken != tokens, ("the pre-norm step's all-reduce never ran: without a bias, "
                              "RowParallelLinear.forward leaves its sum to self.tp.reduce_later")
    broken, _ = run_tp(arch, prompts, max_tokens, rank_init=f"{MODULE}:bug_embeddings_fused_step_without_the_all_reduce")
    assert broken != tokens, ("the first pre-norm step's all-reduce never ran: VocabParallelEmbedding.forward "
                              "leaves its sum to self.tp.reduce_later")


def bug_missing_all_reduce(rank: int) -> None:
    """Row-parallel layers return this rank's partial sum, never added to the other rank's."""
    from minisgl.layers.decode_kernels import decode_linear
    from minisgl.layers.parallel import RowParallelLinear

    RowParallelLinear.forward = lambda self, x, silu_and_mul=False: decode_linear(x, self.weight, silu_and_mul=silu_and_mul)


def bug_lm_head_gather_layout(rank: int) -> None:
    """The gathered logits ``[tp, T, vocab/tp]`` reshaped to ``[T, vocab]`` instead of moving the
    rank dimension last: right for one row, rows mixed up for more."""
    from minisgl.distributed.tp import TPGroup

    original = TPGroup.all_gather_last_dim

    def wrong(self, x):
        stacked = torch.stack(original(self, x).split(x.shape[-1], dim=-1))  # [tp, T, n]
        return stacked.reshape(*x.shape[:-1], stacked.shape[0] * x.shape[-1])

    TPGroup.all_gather_last_dim = wrong


def bug_different_seeds(rank: int) -> None:
    torch.manual_seed(1234 + rank)


def test_missing_all_reduce_is_caught() -> None:
    arch = "qwen3"
    prompts, max_tokens = jobs(arch, 4)
    tokens, _ = run_tp(arch, prompts, max_tokens, rank_init=f"{MODULE}:bug_missing_all_reduce")
    assert tokens != expected(arch, prompts, max_tokens)


def test_lm_head_gather_with_the_wrong_layout_is_caught_at_bs_above_one() -> None:
    arch = "llama"
    prompts, max_tokens = jobs(arch, 4)
    one, _ = run_tp(arch, prompts[:1], max_tokens[:1], rank_init=f"{MODULE}:bug_lm_head_gather_layout",
                    max_running=1)
    assert one == expected(arch, prompts[:1], max_tokens[:1]), "one row at a time, the wrong layout is right"
    tokens, _ = run_tp(arch, prompts, max_tokens, rank_init=f"{MODULE}:bug_lm_head_gather_layout")
    assert tokens != expected(arch, prompts, max_tokens)


def test_different_seeds_on_different_ranks_are_caught() -> None:
    prompts, _ = jobs("qwen3", 2)
    llm = LLM(tiny_checkpoint("qwen3"), tp_size=2, max_seq_len=96, rank_init=f"{MODULE}:bug_different_seeds")
    pids = list(llm.core.ranks.pids)
    with pytest.raises(TPRankError, match="different tokens"):
        llm.generate(prompts, SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True), progress=False)
    assert not any(process_alive(p) for p in pids)


# --- shutdown: no rank outlives its LLM -------------------------------------------------------

def fail_on_start_in_rank_1(rank: int) -> None:
    if rank == 1:
        raise RuntimeError("rank 1 cannot start: injected")


def fail_mid_forward_in_rank_1(rank: int) -> None:
    if rank != 1:
        return
    from minisgl.layers.parallel import RowParallelLinear

    original, calls = RowParallelLinear.forward, {"n": 0}

    def forward(self, x, silu_and_mul=False):
        calls["n"] += 1
        if calls["n"] == 40:
            raise RuntimeError("injected failure in rank 1's forward")
        return original(self, x, silu_and_mul)

    RowParallelLinear.forward = forward


def rank_pids_of_children() -> set[int]:
    """Live processes running a minisgl rank that this test process started: its children, or
    (forked by its rank starter, see minisgl.distributed.starter) its starter's. A rank names
    itself ``minisgl-rank<N>``; one started as a fresh interpreter also shows it in its command."""
    found = set()
    for pid in descendant_pids(os.getpid()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            name = process_name(pid)
        except OSError:
            continue
        if name.startswith("minisgl-rank") or b"minisgl.distributed.launcher" in cmd:
            found.add(pid)
    return found


def test_a_rank_that_fails_to_start_surfaces_and_leaves_no_process() -> None:
    with pytest.raises(TPRankError, match="rank 1 cannot start: injected"):
        LLM(tiny_checkpoint("qwen3"), tp_size=2, max_seq_len=64, rank_init=f"{MODULE}:fail_on_start_in_rank_1")
    assert rank_pids_of_children() == set()


def test_a_rank_that_fails_mid_run_stops_every_rank() -> None:
    """Rank 1 fails alone in the middle of a forward pass while rank 0 waits in an all-reduce:
    the caller gets rank 1's message and both processes are gone."""
    llm = LLM(tiny_checkpoint("qwen3"), tp_size=2, max_seq_len=64, rank_init=f"{MODULE}:fail_mid_forward_in_rank_1")
    pids = list(llm.core.ranks.pids)
    with pytest.raises(TPRankError, match="injected failure in rank 1's forward"):
        llm.generate([[5, 6, 7]] * 3, SamplingParams(max_tokens=16, ignore_eos=True), progress=False)
    assert not any(process_alive(p) for p in pids)
    with pytest.raises(TPRankError, match="stopped"):
        llm.generate([[5, 6, 7]], SamplingParams(max_tokens=4), progress=False)


def test_ctrl_c_stops_every_rank(tmp_path) -> None:
    """A script generating with tp_size=2 gets SIGINT (Ctrl-C) mid-run: it exits with
    KeyboardInterrupt within seconds and no rank process is left."""
    script = tmp_path / "tp_ctrl_c.py"
    script.write_text(textwrap.dedent(f"""
        import signal
        # A process started from a background job inherits SIGINT *ignored*, and Python then
        # keeps ignoring it; a user's terminal script has Python's handler. Give it that.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from minisgl import LLM, SamplingParams
        llm = LLM({str(tiny_checkpoint("qwen3"))!r}, tp_size=2, max_seq_len=2048, max_running=64)
        print(" ".join(map(str, llm.core.ranks.pids)), flush=True)
        llm.generate([[5, 6, 7]] * 64, SamplingParams(max_tokens=2000, ignore_eos=True), progress=False)
        print("finished: the interrupt came too late", flush=True)
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 2, proc.stderr.read()
    time.sleep(1.0)  # generating now
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("the script did not stop within 15 s of Ctrl-C") from None
    assert "KeyboardInterrupt" in err, err[-2000:]
    deadline = time.monotonic() + 5
    while any(process_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(process_alive(p) for p in pids), "a rank process survived Ctrl-C"


def stall_at_exit(rank: int) -> None:
    """A rank whose exit hangs (as a GPU rank's can, in its driver's teardown)."""
    import atexit

    atexit.register(time.sleep, 120)


def test_ranks_die_with_the_process_that_started_them(tmp_path) -> None:
    """The process that owns the ranks is killed (SIGKILL: no handler, no ``close``), as a
    server's launcher kills a scheduler process that does not stop in time. Ranks that would
    hang on their way out must not linger, orphaned, holding memory: the kernel kills them."""
    script = tmp_path / "tp_killed.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
        from minisgl import LLM
        llm = LLM({str(tiny_checkpoint("qwen3"))!r}, tp_size=2, max_seq_len=64, rank_init="{MODULE}:stall_at_exit")
        print(" ".join(map(str, llm.core.ranks.pids)), flush=True)
        time.sleep(120)
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2, proc.stderr.read()
        proc.kill()
        proc.wait(10)
        deadline = time.monotonic() + 5
        while any(process_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [p for p in pids if process_alive(p)]
        for p in left:  # do not leave them for the rest of the session, whatever the outcome
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        assert not left, f"rank processes {left} outlived the process that started them"
    finally:
        if proc.poll() is None:
            proc.kill()
