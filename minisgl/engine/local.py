"""Lesson 4: an engine in this process, driven offline: requests in, outputs out.

:class:`LocalEngine` holds what the builder made (model, tokenizer, KV pool, engine, scheduler)
and runs a list of requests to the end with the scheduler's step loop. ``LLM.generate`` calls
it after turning prompts into token ids; so does each tensor-parallel rank (lesson 9).
"""

from __future__ import annotations

__lesson__ = 4

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from tqdm.auto import tqdm

from minisgl.config import ModelConfig
from minisgl.core import Req, ReqStatus, TokenLogprobs
from minisgl.engine.config import EngineConfig
from minisgl.engine.engine import Engine
from minisgl.kvcache.paged_pool import PagedKVPool
from minisgl.models.model import CausalLM
from minisgl.sampling_params import SamplingParams
from minisgl.scheduler.scheduler import Scheduler


class RequestFailedError(RuntimeError):
    """A request failed while it ran (e.g. a kernel or sampler error). Its KV has been freed
    and the engine is ready for the next ``generate``; the message says what went wrong."""


@dataclass
class GenerationOutput:
    """One request's result. ``logprobs[i]`` belongs to ``token_ids[i]`` (every generated token,
    the one that completed a stop string included); None unless ``SamplingParams.logprobs``
    asked for them.

    With speculative decoding (lesson 12) ``spec_drafted[i]`` and ``spec_accepted[i]`` are the
    draft tokens verified at the ``i``-th step that gave the request tokens (its prefill first;
    0: a plain step) and how many the target accepted; that step added ``spec_accepted[i] + 1``
    tokens (fewer only where a stop token ended the request). None without speculative decoding."""

    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (lesson 5)
    logprobs: list[TokenLogprobs] | None = None
    spec_drafted: list[int] | None = None  # lesson 12
    spec_accepted: list[int] | None = None  # lesson 12


class StopWatch(Protocol):
    """The text of one request as it grows, watched for its stop strings (lesson 10's
    :class:`~minisgl.detokenizer.TextStream` is one)."""

    stopped: bool  # a stop string appeared: the request ends here
    text: str  # the output text (up to the stop string)

    def add(self, token_ids: Sequence[int]) -> Any: ...  # the next output tokens
    def finish(self) -> Any: ...  # no more tokens: release any text held back
    @property
    def num_tokens(self) -> int: ...  # output tokens seen so far


@dataclass
class LocalEngine:
    """Everything one process needs to serve: built by :func:`minisgl.engine.builder.build`.

    ``engine_config`` is resolved (device, dtype, ``max_seq_len`` and ``cuda_graph_max_bs`` filled in).
    ``graph_memory`` is what lesson 8's graph runner takes (measured on CUDA, 0 on the CPU;
    ``None`` without a graph runner).
    ``stop_watch(tokenizer, stop_strings)`` makes the :class:`StopWatch` of a request with
    ``SamplingParams.stop`` (the builder plugs in lesson 10's detokenizer); without one, stop
    strings are refused. ``load_tokenizer()`` is called when the tokenizer is first needed: a
    server's scheduler process (lesson 10) never needs it, and loading it cost each start a second."""

    path: Path
    model: CausalLM
    load_tokenizer: Callable[[], Any]
    engine_config: EngineConfig
    pool: PagedKVPool
    engine: Engine
    scheduler: Scheduler
    graph_memory: Any = None
    stop_watch: Callable[[Any, list[str]], StopWatch] | None = None

    @functools.cached_property
    def tokenizer(self) -> Any:
        return self.load_tokenizer()

    @property
    def model_config(self) -> ModelConfig:
        return self.model.config

    @property
    def device(self) -> str:
        return self.engine_config.device

    @property
    def dtype(self) -> torch.dtype:
        return self.engine_config.dtype

    @property
    def max_seq_len(self) -> int:
        return self.engine_config.max_seq_len

    @property
    def page_size(self) -> int:
        return self.pool.page_size

    @property
    def num_pages(self) -> int:
        return self.pool.num_pages

    def close(self) -> None:
        """Nothing to stop in this process."""

    def generate(self, prompts: list[list[int]], params: list[SamplingParams], progress: bool = True,
                 decode: bool = True) -> list[GenerationOutput]:
        """Run every request to its end; outputs in input order.

        All or nothing: a bad request raises before anything runs; a request that fails while
        running raises :class:`RequestFailedError`; an interrupt (Ctrl-C) propagates. In every
        case the requests of this call are aborted and their KV freed first, so the engine is
        ready (and correct) for the next call. Stop strings are watched in the text as it
        grows: a match finishes the request at once.

        ``decode=False`` leaves ``text`` None where no stop string had to be watched (a
        tensor-parallel rank's outputs: its caller decodes them with its own tokenizer, so the
        ranks never load one for plain requests)."""
        sched = self.scheduler
        reqs: list[Req] = []
        streams: dict[int, StopWatch] = {}  # requests with stop strings, by id(req)
        bar = tqdm(total=len(prompts), desc="generating", disable=not progress, unit="req")
        try:
            if self.stop_watch is None and any(p.stop for p in params):
                raise ValueError("SamplingParams.stop: this engine has no text stream to watch stop strings in")
            for prompt_ids, p in zip(prompts, params):
                reqs.append(sched.add_request(prompt_ids, p))
                if p.stop:
                    streams[id(reqs[-1])] = self.stop_watch(self.tokenizer, p.stop)
            index = {id(r): i for i, r in enumerate(reqs)}
            pending = set(index)
            while pending:
                finished = sched.step()
                for req in reqs:  # stop strings: a match finishes the request now
                    stream = streams.get(id(req))
                    if stream is not None and not stream.stopped:
                        for token in req.output_ids[stream.num_tokens:]:  # one by one: a step may add several
                            stream.add([token])
                            if stream.stopped:
                                break
                        if stream.stopped and req.status != ReqStatus.FINISHED:
                            sched.finish(req, "stop")
                            finished.append(req)
                        if stream.stopped and len(req.output_ids) > stream.num_tokens:
                            # Lesson 12: a step added tokens past the one that completed the stop
                            # string; the output ends where one token per step would have ended it.
                            del req.output_ids[stream.num_tokens:], req.output_logprobs[stream.num_tokens:]
                            req.finish_reason = "stop"
                for req in finished:
                    if id(req) not in pending:
                        continue
                    pending.discard(id(req))
                    bar.update(1)
                    if req.finish_reason == "error":
                        raise RequestFailedError(f"request {index[id(req)]} failed: {req.error}")
        finally:  # success, a bad prompt, a failed request or Ctrl-C: nothing of this call stays behind
            for r in reqs:
                if r.status != ReqStatus.FINISHED:
                    sched.abort(r)
            sched.flush()  # batches still launched (lesson 7); their extra tokens are dropped
            bar.close()
        spec = self.engine_config.speculative is not None  # lesson 12: report each decode step's drafts
        return [GenerationOutput(r.prompt_ids, r.output_ids, self._output_text(r, streams.get(id(r)), decode),
                                 r.finish_reason or "abort", r.num_cached_tokens or 0,
                                 None if r.params.logprobs is None else list(r.output_logprobs),
                                 list(r.spec_drafted) if spec else None, list(r.spec_accepted) if spec else None)
                for r in reqs]

    def _output_text(self, req: Req, stream: StopWatch | None, decode: bool) -> str | None:
        if stream is None:
            return self.tokenizer.decode(req.output_ids, skip_special_tokens=True) if decode else None
        stream.add(req.output_ids[stream.num_tokens:])  # tokens of its last step
        stream.finish()
        return stream.text
