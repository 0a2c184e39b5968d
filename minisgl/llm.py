"""The offline API: ``LLM(model).generate(prompts, sampling_params)``.

    from minisgl import LLM, SamplingParams
    llm = LLM("Qwen/Qwen3-0.6B")            # or a local checkpoint directory
    outs = llm.generate(["Hello"], SamplingParams(max_tokens=32))
    print(outs[0].text)
"""

from __future__ import annotations

import dataclasses

import os
from dataclasses import dataclass
from typing import Sequence

import torch
from tqdm.auto import tqdm

from minisgl.attention.paged import ATTENTION_BACKENDS, make_paged_backend
from minisgl.config import ModelConfig
from minisgl.core import Req, ReqStatus
from minisgl.detokenizer import TextStream
from minisgl.engine.engine import Engine
from minisgl.distributed.launcher import RankCommandError, RankProcesses, TPRankError
from minisgl.distributed.symmetric import SymmetricAllReduce, symmetric_all_reduce_available
from minisgl.distributed.tp import get_tp, set_tp
from minisgl.engine.graph import GraphRunner, RunnerMemory, measure_runner_memory
from minisgl.kvcache.paged_pool import PagedKVPool
from minisgl.kvcache.sizing import num_blocks_for_budget
from minisgl.models.loader import load_model, resolve_model_path
from minisgl.sampling_params import SamplingParams
from minisgl.scheduler.scheduler import Scheduler, SchedulerConfig
from minisgl.scheduler.streaming import RequestEvent, StreamingScheduler
from minisgl.tokenizer import Prompt, encode_prompt, load_tokenizer, prompt_kind
from minisgl.utils import cdiv, is_int, is_number, require_int


class RequestFailedError(RuntimeError):
    """A request failed while it ran (e.g. a kernel or sampler error). Its KV has been freed
    and the engine is ready for the next ``generate``; the message says what went wrong."""


@dataclass
class GenerationOutput:
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (lesson 5)


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


class LLM:
    """A model, its tokenizer and a continuous-batching scheduler, driven offline.

    Precision: float32 on the CPU (exact parity with HF); on CUDA the checkpoint's bf16/fp16,
    or bf16 for float32 checkpoints. ``max_seq_len`` (prompt + max_tokens of one request)
    defaults to the model's context length and may not exceed it. KV pool size: ``num_pages``
    if given; on CUDA otherwise ``kv_memory_fraction`` of the GPU memory still free after
    loading the model; on CPU enough pages for ``max_running`` requests of ``max_seq_len``
    tokens, capped at ``cpu_kv_bytes`` (default 2 GiB).

    ``prefix_cache`` (lesson 5, on by default) shares the KV of common prefixes through a radix
    tree and takes decode pages on demand; off, every request reserves its whole life's pages.
    ``chunked_prefill_size`` (lesson 6) caps the tokens of a step: every decoding request's
    next token, then new prompts and the next chunk of a long one share each batch; ``None``
    prefills whole prompts in steps of their own (lesson 4's schedule). ``overlap`` (lesson 7)
    launches each step before processing the previous one's results, so that the host's work
    hides behind the device's; ``False`` gives the synchronous loop. Tokens are identical.
    ``cuda_graph_max_bs`` (lesson 8) captures the decode step as CUDA graphs for batches of up
    to that many requests (0: no graphs). Default: 256 on CUDA; 0 on the CPU, where there is
    nothing to capture (a value runs the same runner eagerly, with its static buffers and
    padding, which is how the tests check it). ``tp_size`` (lesson 9) splits the model over that
    many rank processes (one GPU each over NCCL, or CPU processes over gloo), started here and
    stopped by ``close()`` (or a ``with`` block, or when the ``LLM`` is collected); this process
    keeps only the tokenizer. ``tp_all_reduce``: ``"auto"`` sends small all-reduces between GPUs
    that reach each other (NVLink) through symmetric memory, the rest through NCCL (gloo on the
    CPU); ``"nccl"`` sends all through ``torch.distributed``. ``rank_init``
    (``"module:function"``) is called in every rank before its model is built (tests use it to
    inject bugs).

    Every setting is checked before the model loads; a bad one raises ``ValueError`` naming it.
    """

    def __init__(
        self,
        model: str | os.PathLike,
        *,
        device: str | None = None,
        dtype: torch.dtype | None = None,
        page_size: int = 16,
        num_pages: int | None = None,
        max_running: int = 256,
        max_prefill_tokens: int = 8192,
        max_seq_len: int | None = None,
        prefix_cache: bool = True,
        chunked_prefill_size: int | None = 8192,
        overlap: bool = True,
        cuda_graph_max_bs: int | None = None,
        kv_memory_fraction: float = 0.8,
        cpu_kv_bytes: int = 2 << 30,
        attention_backend: str = "auto",
        dummy_weights: bool = False,
        tp_size: int = 1,
        tp_all_reduce: str = "auto",
        rank_init: str | None = None,
        _tp_rank: int | None = None,
    ) -> None:
        if not (is_int(tp_size) and tp_size >= 1):
            raise ValueError(f"LLM.tp_size must be an integer >= 1, got {tp_size!r}")
        self.tp_size = tp_size
        self._ranks: RankProcesses | None = None
        _check_settings(page_size=page_size, num_pages=num_pages, max_running=max_running,
                        max_prefill_tokens=max_prefill_tokens, max_seq_len=max_seq_len,
                        kv_memory_fraction=kv_memory_fraction, cpu_kv_bytes=cpu_kv_bytes,
                        attention_backend=attention_backend, dtype=dtype, prefix_cache=prefix_cache,
                        chunked_prefill_size=chunked_prefill_size, overlap=overlap,
                        cuda_graph_max_bs=cuda_graph_max_bs, tp_all_reduce=tp_all_reduce)
        self.device = _check_device(device or default_device())
        path = resolve_model_path(model)
        self.model_path = path  # the checkpoint directory ("demo" and hub ids resolved)
        checkpoint = ModelConfig.from_dir(path)
        if tp_size > 1 and _tp_rank is None:  # lesson 9: this process only talks to the ranks
            settings = dict(device=self.device, dtype=str(dtype).replace("torch.", "") if dtype else None,
                            page_size=page_size, num_pages=num_pages, max_running=max_running,
                            max_prefill_tokens=max_prefill_tokens, max_seq_len=max_seq_len, prefix_cache=prefix_cache,
                            chunked_prefill_size=chunked_prefill_size, overlap=overlap,
                            cuda_graph_max_bs=cuda_graph_max_bs, kv_memory_fraction=kv_memory_fraction,
                            cpu_kv_bytes=cpu_kv_bytes, attention_backend=attention_backend, dummy_weights=dummy_weights,
                            tp_all_reduce=tp_all_reduce)
            self.max_seq_len = max_seq_len or checkpoint.max_position_embeddings
            self._start_ranks(path, checkpoint, settings, rank_init)
            return
        context = checkpoint.max_position_embeddings
        if max_seq_len is not None and max_seq_len > context:
            raise ValueError(f"LLM.max_seq_len={max_seq_len} exceeds the model's context length "
                             f"(max_position_embeddings={context})")
        max_seq_len = max_seq_len or context
        self.max_seq_len = max_seq_len  # prompt + max_tokens of one request, at most
        self._streaming: StreamingScheduler | None = None  # lesson 10, made by the first serve_step
        if dtype is None:
            checkpoint_dtype = checkpoint.dtype
            if self.device == "cpu":
                dtype = torch.float32  # CPU: exact parity with HF in float32
            else:  # GPU kernels want 16-bit: keep bf16/fp16 checkpoints, run float32 ones in bf16
                dtype = checkpoint_dtype if checkpoint_dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
        if tp_all_reduce == "auto" and symmetric_all_reduce_available(self.device, tp_size):
            # Lesson 9 on GPUs: small all-reduces through symmetric memory (a collective: every
            # rank gets here, and the check above answers alike on all of them)
            set_tp(dataclasses.replace(get_tp(), symmetric=SymmetricAllReduce(self.device)))
        self.model = load_model(path, dtype=dtype, device=self.device, dummy_weights=dummy_weights, tp_size=tp_size)
        self.config = self.model.config
        self.tokenizer = load_tokenizer(path)
        self.dtype = next(self.model.parameters()).dtype
        if cuda_graph_max_bs is None:
            cuda_graph_max_bs = 256 if self.device.startswith("cuda") else 0
        cuda_graph_max_bs = min(cuda_graph_max_bs, max_running)  # no decode batch is larger
        self.graph_memory = RunnerMemory(0, 0)  # what the runner and its graphs take (measured on CUDA)
        if cuda_graph_max_bs and self.device.startswith("cuda"):
            self.graph_memory = measure_runner_memory(lambda: self._graph_runner(
                PagedKVPool.for_model(self.config, 1, page_size, self.dtype, self.device, scratch_page=True),
                attention_backend, cuda_graph_max_bs, max_seq_len))
        self.graph_memory_bytes = self.graph_memory.total
        if num_pages is None:
            if self.device.startswith("cuda"):
                free, _ = torch.cuda.mem_get_info()
                budget = int((free - self.graph_memory_bytes) * kv_memory_fraction)
                num_pages = num_blocks_for_budget(self.config, budget, page_size, self.dtype)
                if num_pages < 1:
                    raise ValueError(f"no GPU memory left for the KV cache: {free / 2**30:.2f} GiB free "
                                     f"after loading the model, kv_memory_fraction={kv_memory_fraction}")
            else:  # what max_running full-length requests can use, and no more than the budget
                usable = cdiv(max_running * max_seq_len, page_size)
                budget_pages = num_blocks_for_budget(self.config, cpu_kv_bytes, page_size, self.dtype)
                if budget_pages < 1:
                    raise ValueError(f"LLM.cpu_kv_bytes={cpu_kv_bytes} does not hold one page of "
                                     f"{page_size} tokens ({self.config.kv_bytes_per_token(self.dtype)} B per token)")
                num_pages = min(usable, budget_pages)
            # Lesson 9: every rank must schedule exactly alike, so all take the smallest pool.
            num_pages = get_tp().min_int(num_pages)
        self.pool = PagedKVPool.for_model(self.config, num_pages, page_size, self.dtype, self.device, scratch_page=True)
        self.page_size, self.num_pages = page_size, self.pool.num_pages
        graphs = self._graph_runner(self.pool, attention_backend, cuda_graph_max_bs, max_seq_len) if cuda_graph_max_bs else None
        backend = graphs.backend if graphs is not None else make_paged_backend(self.pool, self.config.num_heads, attention_backend)
        if graphs is not None:
            graphs.capture()
        self.engine = Engine(self.model, backend, graphs=graphs)
        self.scheduler = Scheduler(  # page size and count: taken from the pool behind the engine
            self.engine,
            SchedulerConfig(max_running, max_prefill_tokens, max_seq_len, prefix_cache, chunked_prefill_size, overlap),
            eos_token_ids=self.config.eos_token_ids,
            vocab_size=self.config.vocab_size,
        )

    def _start_ranks(self, path, checkpoint: ModelConfig, settings: dict, rank_init: str | None) -> None:
        """Lesson 9: start one process per rank (each builds its slice of this LLM) and keep
        only the tokenizer here. Fails, with no process left, if any rank fails to start."""
        checkpoint.shard(self.tp_size)  # a model the ranks cannot split fails here, before any process starts
        if self.device.startswith("cuda") and torch.cuda.device_count() < self.tp_size:
            raise ValueError(f"LLM.tp_size={self.tp_size} needs {self.tp_size} GPUs, "
                             f"this machine has {torch.cuda.device_count()}")
        self.config = checkpoint
        self.tokenizer = load_tokenizer(path)
        seed = int.from_bytes(os.urandom(4), "little")  # one seed for every rank
        self._ranks = RankProcesses(self.tp_size, "minisgl.llm:serve_rank", {"model": str(path), **settings},
                                    rank_init=rank_init, seed=seed)
        self.page_size, self.num_pages = settings["page_size"], self._ranks.ready[0]["num_pages"]
        self.all_reduce = self._ranks.ready[0]["all_reduce"]  # how the ranks all-reduce (see tp_all_reduce)

    def close(self) -> None:
        """Stop the rank processes (tensor parallelism); nothing to do for one process."""
        if self._ranks is not None:
            self._ranks.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        ranks = getattr(self, "_ranks", None)
        if ranks is not None:
            ranks.close()

    def _generate_on_ranks(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[GenerationOutput]:
        """Lesson 9: every rank runs the same requests; rank 0's outputs, checked against the others'."""
        assert self._ranks is not None
        try:
            replies = self._ranks.call({"cmd": "generate", "prompts": prompts,
                                        "params": [dataclasses.asdict(p) for p in params]})
        except RankCommandError as exc:  # the same error on every rank: a bad request, ranks still up
            raise {"ValueError": ValueError, "TypeError": TypeError}.get(exc.kind, RequestFailedError)(str(exc)) from None
        outputs = replies[0]["outputs"]
        for rank, reply in enumerate(replies[1:], start=1):
            for i, (a, b) in enumerate(zip(outputs, reply["outputs"])):
                if a["token_ids"] != b["token_ids"]:
                    self._ranks.close()
                    raise TPRankError(f"ranks 0 and {rank} produced different tokens for request {i} "
                                      f"({a['token_ids'][:6]}... vs {b['token_ids'][:6]}...): every rank must "
                                      f"sample the same token (same seed, same logits); all ranks stopped")
        return [GenerationOutput(o["prompt_token_ids"], o["token_ids"], o["text"], o["finish_reason"],
                                 o["num_cached_tokens"]) for o in outputs]

    def _graph_runner(self, pool: PagedKVPool, attention_backend: str, max_bs: int, max_context: int) -> GraphRunner:
        """A graph runner (lesson 8) over ``pool``, with the eager backend it shares the pool with."""
        return GraphRunner(self.model, make_paged_backend(pool, self.config.num_heads, attention_backend),
                           max_bs, max_context)

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        progress: bool = True,
    ) -> list[GenerationOutput]:
        """Generate for each prompt (text, chat messages, or token ids); outputs in input order.

        All or nothing: a bad prompt or setting raises before anything runs; a request that
        fails while running raises :class:`RequestFailedError`; an interrupt (Ctrl-C) propagates.
        In every case the requests of this call are aborted and their KV freed first, so the
        ``LLM`` is ready (and correct) for the next call.
        """
        if prompt_kind(prompts) is not None:
            prompts = [prompts]  # one prompt given bare
        params = SamplingParams() if sampling_params is None else sampling_params
        params_list = list(params) if isinstance(params, Sequence) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params_list)} sampling params")
        if self._ranks is not None:
            for p in params_list:
                if not isinstance(p, SamplingParams):
                    raise TypeError(f"sampling_params must be SamplingParams, got {type(p).__name__}")
            return self._generate_on_ranks([encode_prompt(self.tokenizer, p) for p in prompts], params_list)
        reqs: list[Req] = []
        streams: dict[int, TextStream] = {}  # lesson 10: requests with stop strings, by id(req)
        bar = tqdm(total=len(prompts), desc="generating", disable=not progress, unit="req")
        try:
            for prompt, p in zip(prompts, params_list):
                if not isinstance(p, SamplingParams):
                    raise TypeError(f"sampling_params must be SamplingParams, got {type(p).__name__}")
                reqs.append(self.scheduler.add_request(encode_prompt(self.tokenizer, prompt), p))
                if p.stop:
                    streams[id(reqs[-1])] = TextStream(self.tokenizer, p.stop)
            index = {id(r): i for i, r in enumerate(reqs)}
            pending = set(index)
            while pending:
                finished = self.scheduler.step()
                for req in reqs:  # stop strings: a match finishes the request now
                    stream = streams.get(id(req))
                    if stream is not None and not stream.stopped:
                        stream.add(req.output_ids[len(stream.detokenizer.ids):])
                        if stream.stopped and req.status != ReqStatus.FINISHED:
                            self.scheduler.stop(req)
                            finished.append(req)
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
                    self.scheduler.abort(r)
            self.scheduler.flush()  # lesson 7: the batch still in flight; its extra tokens are dropped
            bar.close()
        return [GenerationOutput(r.prompt_ids, r.output_ids, self._output_text(r, streams.get(id(r))),
                                 r.finish_reason or "abort", r.num_cached_tokens or 0) for r in reqs]

    def serve_step(self, add: Sequence[tuple[str, list[int], dict]] = (),
                   abort: Sequence[str] = ()) -> tuple[list[RequestEvent], dict[str, int], bool]:
        """Lesson 10, the server's engine loop: queue ``add`` (``(rid, prompt ids, sampling
        params as a dict)``), abort the ``abort`` ids, run one scheduler step, and return the
        :class:`RequestEvent` of every request that got tokens or finished, the engine's stats,
        and whether work remains. With ``tp_size > 1`` every rank does the same, in lock step.

        Not to be mixed with ``generate`` on the same ``LLM``: each owns the requests it made."""
        if self._ranks is not None:
            try:
                replies = self._ranks.call({"cmd": "step", "add": [list(a) for a in add], "abort": list(abort)})
            except RankCommandError as exc:
                raise RequestFailedError(f"the ranks failed a step: {exc}") from None
            first = replies[0]
            for rank, reply in enumerate(replies[1:], start=1):
                if [e["token_ids"] for e in reply["events"]] != [e["token_ids"] for e in first["events"]]:
                    self._ranks.close()
                    raise TPRankError(f"ranks 0 and {rank} produced different tokens in a step; all ranks stopped")
            return [RequestEvent(**e) for e in first["events"]], first["stats"], first["has_work"]
        if self._streaming is None:
            self._streaming = StreamingScheduler(self.scheduler)
        for rid, prompt_ids, params in add:
            self._streaming.add(rid, list(prompt_ids), params)
        for rid in abort:
            self._streaming.abort(rid)
        events = self._streaming.step()
        return events, self._streaming.stats(), self._streaming.has_work

    def _output_text(self, req: Req, stream: TextStream | None) -> str:
        if stream is None:
            return self.tokenizer.decode(req.output_ids, skip_special_tokens=True)
        stream.add(req.output_ids[len(stream.detokenizer.ids):])  # tokens of its last step
        stream.finish()
        return stream.text


def rank_llm(settings: dict, rank: int, size: int) -> "LLM":
    """Lesson 9, in a rank process: this rank's slice of the LLM the caller's settings describe."""
    settings = dict(settings)
    if settings.get("dtype"):
        settings["dtype"] = getattr(torch, settings["dtype"])
    return LLM(settings.pop("model"), **settings, tp_size=size, _tp_rank=rank)


def serve_rank(settings: dict, rank: int, size: int):
    """Lesson 9, in a rank process (see :mod:`minisgl.distributed.launcher`): build this rank's
    slice of the LLM and return the command handler and what the caller learns at start."""
    llm = rank_llm(settings, rank, size)

    def handle(command: dict) -> dict:
        if command["cmd"] == "step":  # lesson 10: the server's loop, one step at a time
            events, stats, has_work = llm.serve_step(command["add"], command["abort"])
            return {"events": [dataclasses.asdict(e) for e in events], "stats": stats, "has_work": has_work}
        if command["cmd"] != "generate":
            raise ValueError(f"unknown command {command['cmd']!r}")
        params = [SamplingParams(**p) for p in command["params"]]
        outs = llm.generate(command["prompts"], params, progress=False)
        return {"outputs": [{"prompt_token_ids": o.prompt_token_ids, "token_ids": o.token_ids, "text": o.text,
                             "finish_reason": o.finish_reason, "num_cached_tokens": o.num_cached_tokens}
                            for o in outs]}

    tp = get_tp()
    all_reduce = (f"symmetric memory, NCCL above {tp.symmetric.buffer_bytes >> 20} MiB" if tp.symmetric is not None
                  else "NCCL" if llm.device.startswith("cuda") else "gloo")
    return handle, {"num_pages": llm.pool.num_pages, "all_reduce": all_reduce}


def _check_settings(**settings) -> None:
    """Reject bad ``LLM(...)`` settings before anything is loaded, naming the setting."""
    for name in ("page_size", "max_running", "max_prefill_tokens", "cpu_kv_bytes"):
        require_int("LLM", name, settings[name])
    for name in ("num_pages", "max_seq_len", "chunked_prefill_size"):
        if settings[name] is not None:
            require_int("LLM", name, settings[name])
    graph_bs = settings["cuda_graph_max_bs"]
    if graph_bs is not None and not (is_int(graph_bs) and graph_bs >= 0):
        raise ValueError(f"LLM.cuda_graph_max_bs must be an integer >= 0 (0: no CUDA graphs), got {graph_bs!r}")
    fraction = settings["kv_memory_fraction"]
    if not is_number(fraction) or not 0 < fraction <= 1:
        raise ValueError(f"LLM.kv_memory_fraction must be in (0, 1], got {fraction!r}")
    if settings["tp_all_reduce"] not in ("auto", "nccl"):
        raise ValueError(f"LLM.tp_all_reduce must be 'auto' or 'nccl', got {settings['tp_all_reduce']!r}")
    if settings["attention_backend"] not in ATTENTION_BACKENDS:
        raise ValueError(f"LLM.attention_backend must be one of {ATTENTION_BACKENDS}, got {settings['attention_backend']!r}")
    for name in ("prefix_cache", "overlap"):
        if not isinstance(settings[name], bool):
            raise ValueError(f"LLM.{name} must be True or False, got {settings[name]!r}")
    dtype = settings["dtype"]
    if dtype is not None and dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"LLM.dtype must be None, torch.float32, torch.bfloat16 or torch.float16, got {dtype!r}")


def _check_device(device: str) -> str:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"LLM.device: {device!r} is not a device ({exc})") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"LLM.device must be a CPU or CUDA device, got {device!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"LLM.device={device!r} but CUDA is not available on this machine")
    return str(device)
