"""Where the lessons are put together: an engine built from an :class:`EngineConfig`.

This is the course's assembly point: it may import every lesson (the layering check allows it,
see :mod:`tests.tools.layering`). Each lesson adds a module and plugs it into a seam an
earlier lesson defined; this file is where the plugging happens. The seams, with lesson 4's
part and the later lessons' (each chosen by one setting):

* who owns KV pages: ``KVManager``, a whole life reserved (l04) -> ``CacheManager``, radix
  cache and retraction (l05, ``prefix_cache``);
* what goes into a step: ``WholePrompts`` (l04) -> ``ChunkedPrefill`` (l06, ``chunked_prefill_size``);
* how steps are driven: ``SyncLoop`` with ``Engine`` (l04) -> ``OverlapLoop`` with
  ``OverlapEngine`` (l07, ``overlap``); or ``SpeculativeLoop``, drafts from the ``NgramProposer``
  or a ``DraftModelProposer`` (a small model with its own KV pool) checked by one verify forward
  per step (l12, ``speculative``; synchronous: overlap and CUDA graphs off, see
  ``EngineConfig.resolve``);
* how the forward runs: ``EagerRunner`` (l04) -> ``GraphRunner`` (l08, ``cuda_graph_max_bs``);
* how layers are built: ``Layers`` (l01) -> ``DecodeLayers``, fused decode kernels (l08, with
  ``cuda_graph_max_bs``) -> ``ParallelLayers``, split across ranks (l09, ``tp_size``);
* the front: ``LLM`` over a ``LocalEngine`` (l04) -> over a ``RankClient`` (l09); the server (l10);
* stop strings: refused (l04) -> watched in the text by ``TextStream`` (l10);
* a mixture-of-experts model: ``MoELayers`` around the layers above (l11, by the checkpoint),
  experts split whole across the ranks with ``ep_size`` (l11); CUDA graphs only where its
  experts run without a host sync, the fused path (:func:`moe_cuda_graphs`).
"""

from __future__ import annotations

__lesson__ = "assembly"

import dataclasses
import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from minisgl.attention.factory import make_paged_backend
from minisgl.config import ModelConfig
from minisgl.cpu_threads import apply_cpu_thread_policy
from minisgl.engine.config import EngineConfig
from minisgl.engine.engine import Engine, ForwardRunner
from minisgl.engine.local import LocalEngine
from minisgl.kvcache.paged_pool import PagedKVPool
from minisgl.kvcache.sizing import num_blocks_for_budget
from minisgl.models.loader import load_model, resolve_model_path
from minisgl.models.model import CausalLM, Layers
from minisgl.sampling_params import SamplingParams
from minisgl.scheduler.kv_manager import KVManager
from minisgl.scheduler.scheduler import Scheduler, SyncLoop, WholePrompts
from minisgl.tokenizer import load_tokenizer
from minisgl.utils import cdiv

if TYPE_CHECKING:
    from minisgl.distributed.client import RankClient
    from minisgl.engine.graph import RunnerMemory

# Lessons 5-10 are imported in the branch that uses them, never above: with the settings that
# switch a lesson off, none of its modules is loaded or run (tests/test_layering.py checks it).

def make_engine(model: CausalLM, backend, config: EngineConfig, runner: ForwardRunner | None = None) -> Engine:
    """The engine for ``config``: lesson 7's :class:`OverlapEngine` with ``overlap``, else lesson
    4's :class:`Engine`; ``runner`` (lesson 8's graph runner) if given, else eager."""
    if config.overlap:  # (off under lesson 12's speculation: EngineConfig.resolve)
        from minisgl.engine.overlap import OverlapEngine

        return OverlapEngine(model, backend, runner=runner)
    return Engine(model, backend, runner=runner)


def make_scheduler(engine: Engine, config: EngineConfig, eos_token_ids=(), vocab_size: int | None = None,
                   cls: type[Scheduler] = Scheduler, proposer=None) -> Scheduler:
    """A scheduler (``cls``, a subclass in tests) over ``engine``, its parts chosen by ``config``
    (resolved: ``max_seq_len`` set). Page size and count are read from the engine's pool.
    ``proposer``: lesson 12's draft source (default: the n-gram proposer; ``speculative='draft'``
    needs the :class:`~minisgl.scheduler.draft.DraftModelProposer` built by :func:`build_local`)."""
    pool = engine.backend.pool
    if config.prefix_cache:
        from minisgl.scheduler.cache_manager import CacheManager

        kv = CacheManager(pool.num_pages, pool.page_size, config.max_running, config.max_seq_len)
    else:
        kv = KVManager(pool.num_pages, pool.page_size, config.max_running, config.max_seq_len)
    if config.chunked_prefill_size:
        from minisgl.scheduler.chunked import ChunkedPrefill

        batching = ChunkedPrefill(config.chunked_prefill_size)
    else:
        batching = WholePrompts(config.max_prefill_tokens)
    if config.speculative:  # lesson 12: draft-and-verify steps (no overlap: see EngineConfig.resolve)
        from minisgl.scheduler.speculative import SpeculativeLoop

        if proposer is None:
            if config.speculative == "draft":
                raise ValueError("speculative='draft' needs the draft model's proposer (build_local makes it)")
            from minisgl.scheduler.ngram import NgramProposer

            proposer = NgramProposer()
        loop = SpeculativeLoop(kv, proposer, config.num_speculative_tokens, config.max_seq_len)
    elif config.overlap:
        from minisgl.scheduler.overlap import OverlapLoop

        loop = OverlapLoop(engine, config.max_running)
    else:
        loop = SyncLoop()
    return cls(engine, config, kv, batching, loop, eos_token_ids, vocab_size)


def build(model: str | os.PathLike, config: EngineConfig, tp_rank: int | None = None) -> LocalEngine | RankClient:
    """What ``LLM(model, **settings)`` runs on: an engine in this process, or, with
    ``tp_size > 1`` (and not already inside a rank), the client of the rank processes."""
    path = resolve_model_path(model)
    checkpoint = ModelConfig.from_dir(path)
    if checkpoint.num_experts:
        config = moe_cuda_graphs(config, checkpoint)
    if config.tp_size > 1 and tp_rank is None:
        config = config.resolve(checkpoint.max_position_embeddings)
        checkpoint.shard(config.tp_size, config.ep_size)  # a model the ranks cannot split fails here, before any process starts
        from minisgl.distributed.client import RankClient

        return RankClient(path, checkpoint, load_tokenizer(path), config, "minisgl.engine.builder:serve_rank")
    return build_local(path, checkpoint, config, tp_rank or 0)


def moe_cuda_graphs(config: EngineConfig, checkpoint: ModelConfig, cuda_available: bool | None = None,
                    fused_available: bool | None = None) -> EngineConfig:
    """Lesson 11: ``config`` with CUDA graphs off where the mixture-of-experts model (``checkpoint``)
    would run its reference path on CUDA, which asks the host which experts were chosen (a
    ``.tolist()`` no graph can capture): without the fused path (``fused_available``: Triton and
    a GPU). ``cuda_graph_max_bs`` not given becomes 0 there; a value above 0 is refused, naming
    the setting. On the CPU, or with the fused path (expert parallelism included: it serves a
    rank's own experts), nothing changes."""
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    device = config.device or ("cuda" if cuda_available else "cpu")
    if not device.startswith("cuda"):
        return config
    if fused_available is None:
        from minisgl.layers.fused_moe import fused_moe_available

        fused_available = fused_moe_available()
    if fused_available:
        return config  # the fused path: no host sync, graphs capture it
    if config.cuda_graph_max_bs is None:
        return dataclasses.replace(config, cuda_graph_max_bs=0)
    if config.cuda_graph_max_bs > 0:
        raise ValueError(f"EngineConfig.cuda_graph_max_bs={config.cuda_graph_max_bs}: this mixture-of-experts model "
                         "runs its reference path on CUDA (no fused MoE path here: it needs Triton), which reads the "
                         "chosen experts on the host and cannot be captured in a CUDA graph; pass cuda_graph_max_bs=0 "
                         "(or leave it unset)")
    return config


def default_dtype(device: str, checkpoint: ModelConfig) -> torch.dtype:
    """float32 on the CPU (exact parity with HF); on CUDA the checkpoint's bf16/fp16, or bf16
    for a float32 checkpoint (the GPU kernels want 16-bit)."""
    if device == "cpu":
        return torch.float32
    return checkpoint.dtype if checkpoint.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16


# What lesson 8's graph runner takes (measured), per process: model config, dtype, device and the
# settings the runner's buffers and graphs depend on -> RunnerMemory.
_RUNNER_MEMORY: dict[tuple, RunnerMemory] = {}


def build_local(path: Path, checkpoint: ModelConfig, config: EngineConfig, tp_rank: int = 0) -> LocalEngine:
    """Load the model (this rank's slice under TP), size the KV pool, build the backend, the
    graph runner (lesson 8) and the scheduler."""
    config = config.resolve(checkpoint.max_position_embeddings)
    device = config.device
    if device == "cpu":
        apply_cpu_thread_policy(config.cpu_threads)  # once, before the model is built: torch's default crawls here
    layers = with_experts(model_layers(config), checkpoint)
    model = load_model(path, dtype=config.dtype or default_dtype(device, checkpoint), device=device,
                       dummy_weights=config.dummy_weights, tp_size=config.tp_size, tp_rank=tp_rank, layers=layers,
                       ep_size=config.ep_size)
    dtype = next(model.parameters()).dtype
    config = dataclasses.replace(config, dtype=dtype)
    draft = load_draft_model(config, checkpoint) if config.speculative == "draft" else None  # lesson 12
    graph_bs = config.cuda_graph_max_bs

    def graph_runner(pool: PagedKVPool):
        from minisgl.engine.graph import GraphRunner

        backend = make_paged_backend(pool, model.config.num_heads, config.attention_backend)
        return GraphRunner(model, backend, graph_bs, config.max_seq_len)

    graph_memory = None  # what lesson 8's runner and its graphs take (measured on CUDA)
    if graph_bs:
        from minisgl.engine.graph import RunnerMemory, measure_runner_memory

        graph_memory = RunnerMemory(0, 0)
        if device.startswith("cuda"):
            # Measured once per process and runner shape: a second engine of the same model and
            # settings (benchmarks build many) skips the measuring capture.
            key = (repr(model.config), str(dtype), device, graph_bs, config.max_seq_len, config.page_size,
                   config.attention_backend, config.tp_size, tp_rank, config.ep_size)
            if key not in _RUNNER_MEMORY:
                _RUNNER_MEMORY[key] = measure_runner_memory(lambda: graph_runner(
                    PagedKVPool.for_model(model.config, 1, config.page_size, dtype, device, scratch_page=True)))
            graph_memory = _RUNNER_MEMORY[key]
    num_pages = config.num_pages or pool_pages(model.config, config, graph_memory.total if graph_memory else 0,
                                               draft.config if draft is not None else None)
    pool = PagedKVPool.for_model(model.config, num_pages, config.page_size, dtype, device, scratch_page=True)
    runner = graph_runner(pool) if graph_bs else None
    backend = runner.backend if runner is not None else make_paged_backend(pool, model.config.num_heads,
                                                                             config.attention_backend)
    if runner is not None:
        runner.capture()
    engine = make_engine(model, backend, config, runner)
    proposer = draft_proposer(draft, config, num_pages) if draft is not None else None
    scheduler = make_scheduler(engine, config, model.config.eos_token_ids, model.config.vocab_size, proposer=proposer)
    return LocalEngine(path, model, functools.partial(load_tokenizer, path), config, pool, engine, scheduler, graph_memory,
                       stop_watch=watch_stop_strings)


def load_draft_model(config: EngineConfig, checkpoint: ModelConfig) -> CausalLM:
    """Lesson 12: the draft model ``config.draft_model``, whole (never split across ranks), on the
    target's device in its dtype. It must share the target's (``checkpoint``) vocabulary: its
    token ids are the drafts."""
    path = resolve_model_path(config.draft_model)
    draft = ModelConfig.from_dir(path)
    if draft.vocab_size != checkpoint.vocab_size:
        raise ValueError(f"draft model {config.draft_model!r} has a vocabulary of {draft.vocab_size} tokens, the "
                         f"model {checkpoint.vocab_size}: a draft must share the model's tokenizer")
    return load_model(path, dtype=config.dtype, device=config.device, dummy_weights=config.dummy_weights,
                      layers=with_experts(Layers(), draft))


def draft_proposer(draft: CausalLM, config: EngineConfig, target_pages: int):
    """Lesson 12: the draft model's proposer, with its own KV pool: on CUDA as many tokens as the
    target's pool holds plus a page per request (the bytes were set aside by :func:`pool_pages`),
    on the CPU what ``pool_pages`` gives the draft's own shape."""
    from minisgl.scheduler.draft import DraftModelProposer

    if config.device.startswith("cuda"):
        num_pages = target_pages + config.max_running
    else:
        num_pages = pool_pages(draft.config, config, 0)
    pool = PagedKVPool.for_model(draft.config, num_pages, config.page_size, config.dtype, config.device)
    engine = Engine(draft, make_paged_backend(pool, draft.config.num_heads, config.attention_backend))
    return DraftModelProposer(engine, config.max_running, config.max_seq_len)


def with_experts(layers: Layers, checkpoint: ModelConfig) -> Layers:
    """``layers``, wrapped in lesson 11's ``MoELayers`` (mixture-of-experts MLPs, the rest built by
    ``layers``) if the checkpoint has experts."""
    if not checkpoint.num_experts:
        return layers
    from minisgl.layers.moe import MoELayers

    return MoELayers(layers)


def model_layers(config: EngineConfig) -> Layers:
    """How the model builds its layers (resolved ``config``): lesson 9's ``ParallelLayers`` under
    tensor parallelism, lesson 8's ``DecodeLayers`` (fused one-row kernels) when CUDA graphs are
    on, else lesson 1's plain ``Layers``. Under TP on GPUs with ``tp_all_reduce="auto"`` each
    row-parallel sum, and each mixture-of-experts layer's (lesson 11's ``SparseMoE``), is
    all-reduced by the pre-norm step after it, in one kernel with the residual add and RMSNorm."""
    if config.tp_size > 1:
        from minisgl.distributed.symmetric import SymmetricAllReduce, symmetric_all_reduce_available
        from minisgl.distributed.tp import get_tp, set_tp
        from minisgl.layers.parallel import ParallelLayers

        if config.tp_all_reduce != "nccl" and symmetric_all_reduce_available(config.device, config.tp_size):
            # Lesson 9 on GPUs: small all-reduces through symmetric memory (a collective: every
            # rank gets here, and the checks answer alike on all of them) and, with "auto", each
            # row-parallel layer's all-reduce fused with the residual add + RMSNorm after it
            from minisgl.distributed.all_gather import SymmetricAllGather
            from minisgl.distributed.all_reduce_norm import AllReduceAddNorm, all_reduce_add_norm_available

            kernels = all_reduce_add_norm_available(config.device, config.tp_size)
            fuse = config.tp_all_reduce == "auto"
            add_norm = AllReduceAddNorm(config.device) if fuse and kernels else None
            gather = SymmetricAllGather(config.device) if kernels else None  # the logits' (bits as NCCL's)
            set_tp(dataclasses.replace(get_tp(), symmetric=SymmetricAllReduce(config.device), add_norm=add_norm,
                                       gather=gather))
        return ParallelLayers()  # lesson 8's kernels inside
    if config.cuda_graph_max_bs:
        from minisgl.layers.decode_kernels import DecodeLayers

        return DecodeLayers()
    return Layers()


def watch_stop_strings(tokenizer, stop: list[str]):
    """Lesson 10's detokenizer watches a request's stop strings in its text (imported only when a
    request has some)."""
    from minisgl.detokenizer import TextStream

    return TextStream(tokenizer, stop)


def pool_pages(model_config: ModelConfig, config: EngineConfig, graph_bytes: int,
               draft_config: ModelConfig | None = None) -> int:
    """KV pages when ``num_pages`` is not given. CUDA: ``kv_memory_fraction`` of the memory
    still free (after the model and ``graph_bytes`` for the graphs), shared with lesson 12's
    draft model (``draft_config``) token for token: the draft's pool holds as many tokens. CPU:
    what ``max_running`` requests of ``max_seq_len`` tokens can use, capped at ``cpu_kv_bytes``.
    Under TP every rank takes the smallest (they must schedule exactly alike)."""
    dtype, page_size = config.dtype, config.page_size
    if config.device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info()
        budget = int((free - graph_bytes) * config.kv_memory_fraction)
        if draft_config is not None:  # the draft's pages (its own pool, one page more per request) first
            budget -= config.max_running * page_size * draft_config.kv_bytes_per_token(dtype)
            share = model_config.kv_bytes_per_token(dtype)
            budget = budget * share // (share + draft_config.kv_bytes_per_token(dtype))
        num_pages = num_blocks_for_budget(model_config, budget, page_size, dtype)
        if num_pages < 1:
            raise ValueError(f"no GPU memory left for the KV cache: {free / 2**30:.2f} GiB free "
                             f"after loading the model, kv_memory_fraction={config.kv_memory_fraction}")
    else:
        usable = cdiv(config.max_running * config.max_seq_len, page_size)
        budget_pages = num_blocks_for_budget(model_config, config.cpu_kv_bytes, page_size, dtype)
        if budget_pages < 1:
            raise ValueError(f"EngineConfig.cpu_kv_bytes={config.cpu_kv_bytes} does not hold one page of "
                             f"{page_size} tokens ({model_config.kv_bytes_per_token(dtype)} B per token)")
        num_pages = min(usable, budget_pages)
    if config.tp_size > 1:
        from minisgl.distributed.tp import get_tp

        num_pages = get_tp().min_int(num_pages)  # lesson 9: every rank the same
    return num_pages


# --- inside a tensor-parallel rank (lesson 9) ---------------------------------------------------


def rank_engine(settings: dict, rank: int, size: int) -> LocalEngine:
    """In a rank process: this rank's slice of the engine the caller's settings describe."""
    settings = dict(settings)
    model = settings.pop("model")
    config = EngineConfig(**settings)
    if config.tp_size != size:  # each rank would build a whole model of its own and never talk to the others
        raise ValueError(f"rank {rank} of {size} processes was given tp_size={config.tp_size}; "
                         f"the settings' tp_size must equal the number of rank processes")
    return build(model, config, tp_rank=rank)


def serve_rank(settings: dict, rank: int, size: int):
    """In a rank process (see :mod:`minisgl.distributed.launcher`): build this rank's slice and
    return the command handler and what the caller learns at start. Commands: ``generate``
    (lesson 9), ``step`` (lesson 10's server loop, one step at a time) and ``flush_cache``
    (lesson 10's ``/flush_cache``)."""
    from minisgl.distributed.tp import get_tp
    from minisgl.scheduler.streaming import StreamingScheduler

    local = rank_engine(settings, rank, size)
    streaming: list[StreamingScheduler] = []  # made by the first step

    def handle(command: dict) -> dict:
        if command["cmd"] in ("step", "flush_cache") and not streaming:
            streaming.append(StreamingScheduler(local.scheduler))
        if command["cmd"] == "step":
            events, stats, has_work = streaming[0].serve_step(command["add"], command["abort"])
            return {"events": [dataclasses.asdict(e) for e in events], "stats": stats, "has_work": has_work}
        if command["cmd"] == "flush_cache":
            result = streaming[0].flush_cache()
            return {**result, "flushed": result.pop("ok")}  # "ok" is the rank protocol's own key
        if command["cmd"] != "generate":
            raise ValueError(f"unknown command {command['cmd']!r}")
        outs = local.generate(command["prompts"], [SamplingParams(**p) for p in command["params"]], progress=False,
                              decode=False)  # the caller decodes: no tokenizer in the ranks for plain requests
        return {"outputs": [dataclasses.asdict(o) for o in outs]}

    tp = get_tp()
    all_reduce = (f"symmetric memory, NCCL above {tp.symmetric.buffer_bytes >> 20} MiB" if tp.symmetric is not None
                  else "NCCL" if local.device.startswith("cuda") else "gloo")
    if tp.add_norm is not None:
        all_reduce += "; fused with the residual add and RMSNorm after it"
    return handle, {"num_pages": local.pool.num_pages, "all_reduce": all_reduce}
