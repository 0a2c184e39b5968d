"""Lesson 9: the caller's side of tensor parallelism: start the ranks, send them work, check them.

With ``tp_size > 1`` the ``LLM`` (and the server's scheduler process) keeps only the tokenizer
and a :class:`RankClient`. The client starts one process per rank
(:class:`~minisgl.distributed.launcher.RankProcesses`); each builds its slice of the engine.
Every command goes to every rank; the ranks must produce the same tokens, and the client stops
them all if they ever do not.
"""

from __future__ import annotations

__lesson__ = 9

import dataclasses
import os
from pathlib import Path
from typing import Any

import torch

from minisgl.config import ModelConfig
from minisgl.core import TokenLogprobs
from minisgl.distributed.launcher import RankCommandError, RankProcesses, TPRankError
from minisgl.engine.config import EngineConfig
from minisgl.engine.local import GenerationOutput, RequestFailedError
from minisgl.sampling_params import SamplingParams


class RankClient:
    """``config.tp_size`` rank processes, each running ``worker`` (``"module:function"``) on
    the checkpoint at ``path``. ``config`` is resolved. Stopped by :meth:`close`."""

    def __init__(self, path: Path, model_config: ModelConfig, tokenizer: Any, config: EngineConfig, worker: str) -> None:
        if config.device.startswith("cuda") and torch.cuda.device_count() < config.tp_size:
            raise ValueError(f"LLM.tp_size={config.tp_size} needs {config.tp_size} GPUs, "
                             f"this machine has {torch.cuda.device_count()}")
        self.path, self.model_config, self.tokenizer, self.engine_config = path, model_config, tokenizer, config
        seed = int.from_bytes(os.urandom(4), "little")  # one seed for every rank
        self.ranks = RankProcesses(config.tp_size, worker, {"model": str(path), **config.to_dict()},
                                   rank_init=config.rank_init, seed=seed)
        self.num_pages = self.ranks.ready[0]["num_pages"]
        self.all_reduce = self.ranks.ready[0]["all_reduce"]  # how the ranks all-reduce (see tp_all_reduce)

    @property
    def device(self) -> str:
        return self.engine_config.device

    @property
    def max_seq_len(self) -> int:
        return self.engine_config.max_seq_len

    @property
    def page_size(self) -> int:
        return self.engine_config.page_size

    def close(self) -> None:
        self.ranks.close()

    def generate(self, prompts: list[list[int]], params: list[SamplingParams], progress: bool = True) -> list[GenerationOutput]:
        """Every rank runs the same requests; rank 0's outputs, checked against the others'."""
        try:
            replies = self.ranks.call({"cmd": "generate", "prompts": prompts,
                                       "params": [dataclasses.asdict(p) for p in params]})
        except RankCommandError as exc:  # the same error on every rank: a bad request, ranks still up
            raise {"ValueError": ValueError, "TypeError": TypeError}.get(exc.kind, RequestFailedError)(str(exc)) from None
        outputs = replies[0]["outputs"]
        for rank, reply in enumerate(replies[1:], start=1):
            for i, (a, b) in enumerate(zip(outputs, reply["outputs"])):
                if a["token_ids"] != b["token_ids"]:
                    self.ranks.close()
                    raise TPRankError(f"ranks 0 and {rank} produced different tokens for request {i} "
                                      f"({a['token_ids'][:6]}... vs {b['token_ids'][:6]}...): every rank must "
                                      f"sample the same token (same seed, same logits); all ranks stopped")
        return [output_from_json(o, self.tokenizer) for o in outputs]

    def step(self, add: list, abort: list[str]) -> dict:
        """Lesson 10's server loop under TP: every rank runs the same step; rank 0's reply
        (``events``, ``stats``, ``has_work``), checked against the others' tokens."""
        try:
            replies = self.ranks.call({"cmd": "step", "add": [list(a) for a in add], "abort": list(abort)})
        except RankCommandError as exc:
            raise RequestFailedError(f"the ranks failed a step: {exc}") from None
        first = replies[0]
        for rank, reply in enumerate(replies[1:], start=1):
            if [e["token_ids"] for e in reply["events"]] != [e["token_ids"] for e in first["events"]]:
                self.ranks.close()
                raise TPRankError(f"ranks 0 and {rank} produced different tokens in a step; all ranks stopped")
        return first

    def flush_cache(self) -> dict:
        """Lesson 10's ``/flush_cache`` under TP: every rank empties its own radix cache (or
        refuses, if requests run); rank 0's reply, checked against the others'."""
        try:
            replies = self.ranks.call({"cmd": "flush_cache"})
        except RankCommandError as exc:
            raise RequestFailedError(f"the ranks failed to flush their caches: {exc}") from None
        first = replies[0]
        for rank, reply in enumerate(replies[1:], start=1):
            if (reply["flushed"], reply["freed_pages"]) != (first["flushed"], first["freed_pages"]):
                self.ranks.close()
                raise TPRankError(f"ranks 0 and {rank} flushed their caches differently; all ranks stopped")
        return {"ok": first["flushed"], "message": first["message"], "freed_pages": first["freed_pages"],
                "stats": first["stats"]}


def output_from_json(fields: dict[str, Any], tokenizer: Any) -> GenerationOutput:
    """A rank's :class:`GenerationOutput` back from its JSON form: its log-probabilities, lists
    there, as :class:`~minisgl.core.TokenLogprobs` again, and its text decoded here where the
    rank left it None (the ranks decode only the text they watched for stop strings)."""
    logprobs = fields.get("logprobs")
    if logprobs is not None:
        logprobs = [TokenLogprobs(lp, [(token, value) for token, value in top]) for lp, top in logprobs]
    text = fields["text"]
    if text is None:
        text = tokenizer.decode(fields["token_ids"], skip_special_tokens=True)
    return GenerationOutput(**{**fields, "logprobs": logprobs, "text": text})
