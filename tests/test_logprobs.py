"""Log-probabilities (issue 30) below the HTTP layer: the offline ``LLM`` against Hugging Face,
the lagged loop, tensor parallelism, the streaming scheduler, the tokenizer worker's naming and
placing of each token's logprobs, and the API's two response formats.

Run: pytest tests/test_logprobs.py

Parity is exact up to float32 rounding: each generated token's logprob and its top-5 must be
HF's ``log_softmax`` of HF's own logits at that step (float32, CPU) within 1e-4.
"""

from __future__ import annotations

import functools

import pytest
import torch

from minisgl import LLM, SamplingParams
from minisgl.core import TokenLogprobs
from minisgl.scheduler.streaming import RequestEvent, StreamingScheduler, make_stepper
from minisgl.server.api import ChunkQueue, chat_logprobs, completion_logprobs
from minisgl.server.messages import GenerateRequest, Stats, StepOutput, TextChunk, TextLogprobs, decode, encode, pack
from minisgl.server.tokenizer_worker import TokenizerWorker
from minisgl.testing import TEST_PROMPTS, HFReference, tiny_checkpoint

ARCH = "qwen3"
NUM_TOKENS = 20
CONFIGS = {
    "lesson4": dict(overlap=False, chunked_prefill_size=None, prefix_cache=False),
    # The defaults (overlap, prefix cache, chunked prefill), with chunks small enough to split prompts.
    "defaults_chunked": dict(chunked_prefill_size=8),
}


@functools.cache
def llm(config: str) -> LLM:
    return LLM(tiny_checkpoint(ARCH), max_seq_len=128, page_size=4, max_running=8, **CONFIGS[config])


def prompts() -> list[list[int]]:
    """Three prompts of 5 to 40 tokens (the longest spans five 8-token chunks)."""
    tok = llm("lesson4").tokenizer
    return [tok.encode(p) for p in TEST_PROMPTS[1:4]]


def hf_log_softmax(prompt: list[int], output: list[int]) -> torch.Tensor:
    """``[len(output), vocab]``: HF's log-softmax at each step that chose ``output`` (one forward
    of the whole sequence)."""
    logits = HFReference(tiny_checkpoint(ARCH)).logits(prompt + output)
    return torch.log_softmax(logits[len(prompt) - 1 : len(prompt) - 1 + len(output)], dim=-1)


def chosen_and_top(entries: list[TokenLogprobs]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Our logprobs as tensors: chosen ``[N]``, top ids ``[N, k]``, top values ``[N, k]``."""
    return (torch.tensor([e.logprob for e in entries]), torch.tensor([[t for t, _ in e.top] for e in entries]),
            torch.tensor([[v for _, v in e.top] for e in entries]))


# --- the offline engine against HF -----------------------------------------------------------------


@pytest.mark.parametrize("config", CONFIGS)
def test_greedy_logprobs_and_top5_are_hf_log_softmax_at_every_step(config: str) -> None:
    ps = prompts()
    asks = [5, None, 5]  # the middle request does not ask: its row must get nothing, the others theirs
    params = [SamplingParams(max_tokens=NUM_TOKENS, ignore_eos=True, logprobs=k) for k in asks]
    outs = llm(config).generate(ps, params, progress=False)
    assert outs[1].logprobs is None
    for prompt, out in zip(ps[0::2], outs[0::2]):
        hf_tokens, hf_logits = HFReference(tiny_checkpoint(ARCH)).greedy_with_logits(prompt, NUM_TOKENS)
        assert out.token_ids == hf_tokens
        ref = torch.log_softmax(hf_logits, dim=-1)
        assert out.logprobs is not None and len(out.logprobs) == NUM_TOKENS
        chosen, top_ids, top_values = chosen_and_top(out.logprobs)
        ref_values, ref_ids = ref.topk(5, dim=-1)
        assert (chosen - ref.gather(1, torch.tensor(hf_tokens)[:, None])[:, 0]).abs().max() < 1e-4
        assert torch.equal(top_ids, ref_ids)
        assert (top_values - ref_values).abs().max() < 1e-4
        assert torch.equal(chosen, top_values[:, 0]), "greedy: the chosen token is the best one"


def test_sampled_tokens_get_raw_logprobs_not_the_temperature_scaled_ones() -> None:
    """Temperature 0.7 and top-p 0.9 decide the draw, not the logprobs: each is HF's raw
    log-softmax, which differs from the scaled one by far more than the tolerance."""
    prompt = prompts()[1]
    params = SamplingParams(temperature=0.7, top_p=0.9, seed=3, max_tokens=16, ignore_eos=True, logprobs=3)
    (out,) = llm("defaults_chunked").generate([prompt], params, progress=False)
    raw = hf_log_softmax(prompt, out.token_ids)
    hf_logits = HFReference(tiny_checkpoint(ARCH)).logits(prompt + out.token_ids)
    scaled = torch.log_softmax(hf_logits[len(prompt) - 1 : -1] / 0.7, dim=-1)
    ids = torch.tensor(out.token_ids)[:, None]
    chosen, top_ids, top_values = chosen_and_top(out.logprobs)
    assert (chosen - raw.gather(1, ids)[:, 0]).abs().max() < 1e-4
    assert (chosen - scaled.gather(1, ids)[:, 0]).abs().max() > 1e-2, "the test must tell raw from scaled apart"
    assert torch.equal(top_ids, raw.topk(3, dim=-1).indices)
    assert (top_values - raw.topk(3, dim=-1).values).abs().max() < 1e-4


def test_logprobs_stay_with_their_tokens_when_a_request_stops() -> None:
    """With overlap, a request that stops at step N is already in the batch of step N+1: that
    extra token is dropped, and so are its logprobs. A stop string keeps every generated token
    (the one completing it included), each with its logprobs."""
    engine = llm("defaults_chunked")
    for prompt in prompts():
        greedy = HFReference(tiny_checkpoint(ARCH)).greedy(prompt, 12)
        if greedy[3] not in greedy[:3]:
            break
    else:
        pytest.fail("no prompt whose 4th greedy token is new")
    params = SamplingParams(max_tokens=12, stop_token_ids=[greedy[3]], logprobs=1)
    (out,) = engine.generate([prompt], params, progress=False)
    assert out.token_ids == greedy[:4] and out.finish_reason == "stop"
    assert len(out.logprobs) == 4
    chosen, _, _ = chosen_and_top(out.logprobs)
    assert (chosen - hf_log_softmax(prompt, greedy[:4]).gather(1, torch.tensor(greedy[:4])[:, None])[:, 0]).abs().max() < 1e-4

    text = engine.tokenizer.decode(greedy)
    stop = next(c for c in text[len(engine.tokenizer.decode(greedy[:2])):] if c.isascii() and c.isalnum())
    (out,) = engine.generate([prompt], SamplingParams(max_tokens=12, stop=[stop], logprobs=0), progress=False)
    assert out.finish_reason == "stop" and len(out.logprobs) == len(out.token_ids) < 12
    assert all(e.top == [] for e in out.logprobs)


def test_tensor_parallel_logprobs_match_one_process() -> None:
    """Under TP the ranks' outputs cross a pipe as JSON: they come back as TokenLogprobs, equal
    to one process's (the ranks gather the full logits, so the log-softmax is the same); the
    server's step through the ranks carries them in its events too."""
    ps, params = prompts()[:2], SamplingParams(max_tokens=8, ignore_eos=True, logprobs=3)
    one = llm("lesson4").generate(ps, params, progress=False)
    with LLM(tiny_checkpoint(ARCH), tp_size=2, max_seq_len=128) as tp:
        outs = tp.generate(ps, params, progress=False)
        step = make_stepper(tp.core).serve_step
        events, has_work = [], True
        step([("r", ps[0], {"max_tokens": 8, "ignore_eos": True, "logprobs": 3})], [])
        while has_work:
            new, _, has_work = step([], [])
            events += new
    for a, b in zip(one, outs):
        assert a.token_ids == b.token_ids
        assert all(isinstance(e, TokenLogprobs) and all(isinstance(p, tuple) for p in e.top) for e in b.logprobs)
        for x, y in zip(chosen_and_top(a.logprobs), chosen_and_top(b.logprobs)):
            assert x.shape == y.shape and (x.double() - y.double()).abs().max() < 1e-4
    stepped = [TokenLogprobs(lp, [tuple(p) for p in top]) for e in events for lp, top in e.logprobs]
    assert [t for e in events for t in e.token_ids] == outs[0].token_ids
    for x, y in zip(chosen_and_top(outs[0].logprobs), chosen_and_top(stepped)):
        assert x.shape == y.shape and (x.double() - y.double()).abs().max() < 1e-4


# --- the server's side, without a server ---------------------------------------------------------


def test_streaming_events_carry_each_tokens_logprobs_over_msgpack() -> None:
    engine = llm("defaults_chunked")
    ps = prompts()
    streaming = StreamingScheduler(engine.scheduler)
    streaming.add("asks", ps[0], {"max_tokens": 6, "ignore_eos": True, "logprobs": 2})
    streaming.add("quiet", ps[1], {"max_tokens": 4, "ignore_eos": True})
    got: dict[str, list[RequestEvent]] = {"asks": [], "quiet": []}
    while streaming.has_work:
        events, stats, _ = streaming.serve_step()
        wire = decode(encode(StepOutput([pack(e) for e in events], list(stats.values()))))
        for fields in wire.events:
            event = RequestEvent(*fields)
            got[event.rid].append(event)
    assert all(e.logprobs is None for e in got["quiet"])
    assert all(len(e.logprobs) == len(e.token_ids) for e in got["asks"])
    (offline,) = engine.generate([ps[0]], SamplingParams(max_tokens=6, ignore_eos=True, logprobs=2), progress=False)
    streamed = [TokenLogprobs(lp, [tuple(p) for p in top]) for e in got["asks"] for lp, top in e.logprobs]
    assert [t for e in got["asks"] for t in e.token_ids] == offline.token_ids
    # (the batch around it differs from the offline run's: float32 rounding may too)
    for x, y in zip(chosen_and_top(offline.logprobs), chosen_and_top(streamed)):
        assert x.shape == y.shape and (x.double() - y.double()).abs().max() < 1e-4


class Outbox:
    """A socket's send side: the messages, decoded."""

    def __init__(self) -> None:
        self.messages: list = []

    def send(self, data: bytes) -> None:
        self.messages.append(decode(data))


SENTENCE = "The cat sat on the mat."
PIECES = ["The", " c", "at", " s", "at", " o", "n", " the", " ", "m", "at", "."]


def worker_chunks(stop: list[str]) -> list[TextChunk]:
    """Feed the tokens of SENTENCE, one event each with made-up logprobs (token ``i``: ``-i``), to
    a tokenizer worker for a request with ``stop`` strings; the chunks it sends the API."""
    tok = llm("lesson4").tokenizer
    ids = tok.encode(SENTENCE)
    assert [tok.decode([t]) for t in ids] == PIECES, "the test's tokenizer changed"
    to_api, to_scheduler = Outbox(), Outbox()
    worker = TokenizerWorker(tok, 128, to_api, to_scheduler)
    worker.on_generate(GenerateRequest("r", "Hi", {"max_tokens": len(ids), "stop": stop, "logprobs": 1}))
    for i, token in enumerate(ids):
        if "r" not in worker.live:
            break
        event = RequestEvent("r", [token], "length" if i == len(ids) - 1 else None, 1,
                             logprobs=[TokenLogprobs(-float(i), [(token, -float(i)), (ids[0], -9.0)])])
        worker.on_step(StepOutput([pack(event)], pack(Stats())))
    return [TextChunk(*fields) for message in to_api.messages for fields in message.chunks]


def test_worker_lists_held_back_tokens_with_the_text_that_shows_them() -> None:
    """``stop=["the cow"]`` holds back every final "t" (until the next token rules the stop string
    out), and " the" and " " until "m" does: their logprobs come in the chunk that shows their
    text, and the answer's tokens spell its text."""
    chunks = worker_chunks(["the cow"])
    assert [[e[0] for e in c.logprobs] for c in chunks] == [
        ["The"], [" c"], [], ["at", " s"], [], ["at", " o"], ["n"], [], [], [" the", " ", "m"], [], ["at", "."]]
    entries = [e for c in chunks for e in c.logprobs]
    assert "".join(c.text for c in chunks) == SENTENCE == "".join(e[0] for e in entries)
    assert all(e[3] == e[0] for e in entries), "each token named by the text it added"
    assert [e[1] for e in entries] == [-float(i) for i in range(len(PIECES))]
    assert all(e[2] == [[e[0], e[1]], ["The", -9.0]] for e in entries), "alternatives named by the text they add"
    assert chunks[-1].finish_reason == "length"


def test_worker_lists_no_token_that_lies_inside_a_stop_string() -> None:
    """``stop=["t o"]`` cuts "sat on" inside "at": that token runs into the stop string and is
    listed (with its whole text); " o", all inside it, is not, nor is anything after it."""
    chunks = worker_chunks(["t o"])
    assert "".join(c.text for c in chunks) == "The cat sa" and chunks[-1].finish_reason == "stop"
    assert [[e[0] for e in c.logprobs] for c in chunks] == [["The"], [" c"], [], ["at", " s"], [], ["at"]]
    assert [e[1] for c in chunks for e in c.logprobs] == [0.0, -1.0, -2.0, -3.0, -4.0]


def test_worker_names_special_tokens_literally_and_pieces_of_characters_by_their_bytes() -> None:
    """Issue 43: the chosen token and its alternatives each get a name no other token has. A
    special token (which adds no text) is its literal text, a piece of a character (whose text
    alone would be U+FFFD, or nothing) its own bytes; any other token the text it adds. The text
    each token added is kept beside its name: those texts spell the answer."""
    tok = llm("lesson4").tokenizer
    assert tok.convert_ids_to_tokens([0, 1, 2]) == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    e_acute, ni = tok.encode("é"), tok.encode("你")  # b"\xc3" b"\xa9"; b"\xe4" b"\xbd" b"\xa0"
    assert len(e_acute) == 2 and len(ni) == 3, "the test's tokenizer changed"
    ids = tok.encode("The") + e_acute + [2] + tok.encode(" the")
    pool = [0, 1, 2, *e_acute, *ni]  # the alternatives: every special token, every piece
    to_api = Outbox()
    worker = TokenizerWorker(tok, 128, to_api, Outbox())
    worker.on_generate(GenerateRequest("r", "Hi", {"max_tokens": len(ids), "logprobs": 8}))
    for i, token in enumerate(ids):
        top = [(token, -0.5)] + [(t, -1.0 - j) for j, t in enumerate(t for t in pool if t != token)]
        event = RequestEvent("r", [token], "length" if i == len(ids) - 1 else None, 1,
                             logprobs=[TokenLogprobs(-0.5, top)])
        worker.on_step(StepOutput([pack(event)], pack(Stats())))
    chunks = [TextChunk(*fields) for message in to_api.messages for fields in message.chunks]
    entries = [e for c in chunks for e in c.logprobs]
    assert [e[0] for e in entries] == ["The", "bytes:\\xc3", "bytes:\\xa9", "<|im_end|>", " the"]
    assert [e[3] for e in entries] == ["The", "", "é", "", " the"], "the text each token added"
    assert "".join(c.text for c in chunks) == "Theé the" == "".join(e[3] for e in entries)
    pool_names = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "bytes:\\xc3", "bytes:\\xa9", "bytes:\\xe4",
                  "bytes:\\xbd", "bytes:\\xa0"]  # the same at every step, pending piece or not
    for entry in entries:
        names = [name for name, _ in entry[2]]
        assert names[0] == entry[0], "the chosen token is named as it is among the alternatives"
        assert sorted(names[1:] + [entry[0]]) == sorted(set(pool_names) | {entry[0]})


def test_every_token_has_a_name_of_its_own_at_every_step() -> None:
    """All 512 tokens of the tiny vocabulary as the next token, after whole text and after the
    first piece of a character: 512 different names, none empty, none with U+FFFD; a piece's
    name gives back its own bytes (``token_bytes``, the chat format's ``bytes``)."""
    from tokenizers import pre_tokenizers

    from minisgl.detokenizer import IncrementalDetokenizer
    from minisgl.server.api import token_bytes
    from minisgl.server.tokenizer_worker import TokenNames, byte_level_alphabet

    assert set(byte_level_alphabet()) == set(pre_tokenizers.ByteLevel.alphabet())
    tok = llm("lesson4").tokenizer
    names = TokenNames(tok)
    vocab = list(range(len(tok)))
    for before in (tok.encode("The"), tok.encode("The 你")[:-2]):  # the second ends inside "你"
        detokenizer = IncrementalDetokenizer(tok)
        detokenizer.add(before)
        got = names(detokenizer, vocab)
        assert len(set(got)) == len(vocab) and all(n and "\ufffd" not in n for n in got)
        for token, name in zip(vocab, got):
            if name.startswith("bytes:"):
                assert bytes(token_bytes(name)).decode("utf-8", "replace") == tok.decode([token]), name


def test_worker_sends_no_logprobs_unless_asked() -> None:
    tok = llm("lesson4").tokenizer
    to_api = Outbox()
    worker = TokenizerWorker(tok, 128, to_api, Outbox())
    worker.on_generate(GenerateRequest("r", "Hi", {"max_tokens": 1}))
    worker.on_step(StepOutput([pack(RequestEvent("r", [tok.encode("The")[0]], "length", 1))], pack(Stats())))
    (chunk,) = [TextChunk(*f) for m in to_api.messages for f in m.chunks]
    assert chunk.text == "The" and chunk.logprobs is None


# --- the API's formats ----------------------------------------------------------------------------


ENTRIES = [TextLogprobs("Hé", -0.5, [("Hé", -0.5), ("A", -1.5)], "Hé"),
           TextLogprobs(" b", -2.0, [("x", -0.25), ("y", -1.0)], " b"),
           TextLogprobs("bytes:\\xe4", -0.125, [("bytes:\\xe4", -0.125), ("<|im_end|>", -3.0)], ""),
           TextLogprobs("bytes:\\xbd\\xa0", -0.25, [("bytes:\\xbd\\xa0", -0.25), ("!", -2.0)], "你"),
           TextLogprobs("<|im_end|>", -1.0, [("bytes: \\xe4", -0.5), ("<|im_end|>", -1.0)], "")]


def test_completion_format_lists_the_chosen_token_among_the_top_and_offsets_into_the_text() -> None:
    """Each token by its name; its ``text_offset`` where the text it added starts (a piece of a
    character adds none, the piece that completes it the whole character)."""
    out = completion_logprobs(ENTRIES, offset=4)
    assert out == {
        "tokens": ["Hé", " b", "bytes:\\xe4", "bytes:\\xbd\\xa0", "<|im_end|>"],
        "token_logprobs": [-0.5, -2.0, -0.125, -0.25, -1.0],
        # " b" is not among its top 2: added (OpenAI: up to logprobs + 1)
        "top_logprobs": [{"Hé": -0.5, "A": -1.5}, {"x": -0.25, "y": -1.0, " b": -2.0},
                         {"bytes:\\xe4": -0.125, "<|im_end|>": -3.0}, {"bytes:\\xbd\\xa0": -0.25, "!": -2.0},
                         {"bytes: \\xe4": -0.5, "<|im_end|>": -1.0}],
        "text_offset": [4, 6, 8, 8, 9],
    }


def test_chat_format_has_bytes_and_exactly_the_top_asked() -> None:
    """``bytes``: the UTF-8 of a token's name, but a piece of a character's own bytes, so that
    the pieces' bytes join into the character."""
    out = chat_logprobs(ENTRIES)
    assert out["content"][0] == {"token": "Hé", "logprob": -0.5, "bytes": [72, 195, 169], "top_logprobs": [
        {"token": "Hé", "logprob": -0.5, "bytes": [72, 195, 169]}, {"token": "A", "logprob": -1.5, "bytes": [65]}]}
    assert [t["token"] for t in out["content"][1]["top_logprobs"]] == ["x", "y"]
    assert [t["bytes"] for t in out["content"][2:4]] == [[0xE4], [0xBD, 0xA0]]
    assert bytes(out["content"][2]["bytes"] + out["content"][3]["bytes"]).decode() == "你"
    assert [t["bytes"] for t in out["content"][4]["top_logprobs"]] == [[32, 0xE4], list(b"<|im_end|>")]


def test_a_stalled_streams_merged_chunks_keep_every_logprob() -> None:
    queue = ChunkQueue()
    n = 300  # past MAX_PENDING_CHUNKS: the last ones are merged
    for i in range(n):
        queue.put_nowait(TextChunk("r", str(i % 10), [i], logprobs=[TextLogprobs(str(i % 10), -float(i), [], str(i % 10))]))
    chunks = [queue.get_nowait() for _ in range(queue.qsize())]
    assert len(chunks) < n
    assert [e[1] for c in chunks for e in c.logprobs] == [-float(i) for i in range(n)]
    assert "".join(c.text for c in chunks) == "".join(e[0] for c in chunks for e in c.logprobs)


@pytest.mark.gpu
def test_logprobs_on_gpu_through_graphs_and_overlap_match_hf_in_bf16() -> None:
    """CUDA, bf16, the defaults (FlashInfer, CUDA graphs, overlap): the logprobs come from the
    graph's logits buffer and reach the host through the pinned copies of the lagged loop. While
    our tokens are HF's (the same prefix), each chosen token's logprob and the top-5 are HF's
    ``log_softmax`` within half the bf16 logit tolerance (the rule lets each side's logits be off
    by that much; on two H100s a 20th token was 0.1005 off); the first token that differs must be
    one where HF's top-2 logit gap is within the tolerance (either may be picked), and the
    comparison ends there."""
    from minisgl.testing import GPU_CHECKPOINT_KWARGS, LOGIT_GAP_TOLERANCE

    tolerance = LOGIT_GAP_TOLERANCE / 2
    path = tiny_checkpoint(ARCH, **GPU_CHECKPOINT_KWARGS)
    hf = HFReference(path, dtype=torch.bfloat16, device="cuda")
    gpu = LLM(path, device="cuda", max_seq_len=256, num_pages=256, cuda_graph_max_bs=8)
    assert gpu.engine_config.overlap and gpu.engine.runner.buckets, "graphs and overlap on"
    replays_before = len(gpu.engine.runner.stats.replays)
    outs = gpu.generate(TEST_PROMPTS, SamplingParams(max_tokens=NUM_TOKENS, ignore_eos=True, logprobs=5), progress=False)
    assert len(gpu.engine.runner.stats.replays) > replays_before, "no decode step replayed a graph"
    checked = 0
    for prompt, out in zip(TEST_PROMPTS, outs):
        tokens, logits = hf.greedy_with_logits(out.prompt_token_ids, NUM_TOKENS)
        reference = torch.log_softmax(logits, dim=-1)
        for step, (ours, theirs) in enumerate(zip(out.token_ids, tokens)):
            if ours != theirs:
                top2 = logits[step].topk(2).values
                assert float(top2[0] - top2[1]) < LOGIT_GAP_TOLERANCE, f"{prompt!r}: confident token {step} differs"
                break  # another prefix from here on
            mine = out.logprobs[step]
            assert abs(mine.logprob - float(reference[step, ours])) < tolerance, (prompt, step)
            assert mine.top[0][0] == ours
            for (token, value), ref_value in zip(mine.top, reference[step].topk(5).values.tolist()):
                assert abs(value - ref_value) < tolerance, (prompt, step, token)
            checked += 1
    assert checked >= NUM_TOKENS, f"only {checked} steps compared"
