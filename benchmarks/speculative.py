"""``python -m benchmarks speculative``: lesson 12's speculative decoding, measured.

Four parts (``--parts``, all by default), each against the same engine without speculation:

1. **acceptance**: tokens added per decode step against ``k`` (``--ks``, default 1, 2, 4, 8) for
   each proposer (``--proposers``: ``ngram``, and ``draft`` with the demo's draft model) on the
   demo model's own kinds of text, greedy: *chat* (answers to the course questions the demo was
   trained on, through its chat template) and *prose* (continuations of held-out Austen
   paragraphs, ``heldout.txt``, never trained on). From each output's per-step counts
   (``GenerationOutput.spec_drafted`` / ``spec_accepted``): decode steps, tokens per decode step
   (a step without drafts adds one), drafts accepted, and whether the tokens are the plain
   engine's.
2. **speedup**: wall-clock at batch size 1 with real weights (the demo and its draft), the plain
   engine (the ``LLM`` defaults; on CUDA also with graphs off) and each proposer at ``--k`` alive
   side by side, the prompts run one at a time; ``--repeats`` repeats interleaved (the engines'
   order rotates), the ratio of each repeat, their median, min and max.
3. **verify_cost**: one engine forward (and the read of its tokens) of ``b`` rows, each of
   ``1 + k`` new tokens over a cached context of ``--context`` tokens, against the ``b``-row
   decode forward: eager, as speculation runs (``cuda_graph_max_bs=0``, overlap off), and the
   decode forward through a CUDA graph, as the plain engine runs it (a separate engine with
   graphs). Random weights of the Qwen3-0.6B and Llama-3.1-8B shapes in bf16 (GPU only) and the
   demo (real weights). With acceptance measured (part 1 of this run, or ``--acceptance-from``
   a results file): the **projected** speed-up, step by step: the plain engine's time for the
   tokens (one decode forward each) over the time of the measured steps (a step with ``d``
   drafts costs the verify forward of ``1 + d`` tokens, a step without drafts the eager decode
   forward). The proposer's own cost is left out: nothing for the n-gram lookup's host time, and
   for the draft model its ``k`` forwards per step, so a draft row is a ceiling.
4. **throughput**: output tokens/s of ``max(b, --throughput-requests)`` requests (chat and prose
   in turn for the demo; random prompts for a random-weight shape; the same first ones at every
   ``b``) served with at most ``b`` in flight, for ``b`` in ``--batch-sizes``, without and with
   speculation (each proposer at ``--k``), interleaved over ``--throughput-repeats``. On a random-weight shape
   (``--throughput-shapes``, GPU) the greedy text falls into repeating one token, so nearly
   every n-gram draft is accepted: that run is the ceiling of what speculation gives at that
   shape (the file records the acceptance measured).

    python -m benchmarks speculative --device cpu --threads 1          # CPU: the demo (~5 min)
    python -m benchmarks speculative --quick --device cpu              # smoke run (seconds)
    python -m benchmarks speculative --device cuda                     # GPU: demo + both shapes

Parts that need a GPU (the random-weight shapes) are skipped on the CPU with a message.
Results: ``benchmarks/results/speculative_demo_cpu.json`` or ``speculative_gpu.json``.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from benchmarks.cli import REPO, benchmark_parser, write_result
from benchmarks.offline import SHAPES, empty_cache, shape_checkpoint, sync
from minisgl.llm import LLM
from minisgl.sampling_params import SamplingParams

PARTS = ("acceptance", "speedup", "verify_cost", "throughput")
GPU_SHAPES = ("qwen3-0.6b", "llama-3.1-8b")
WORKLOADS = ("chat", "prose")
QA_FILE = REPO / "tests" / "demo_training" / "qa.jsonl"  # the demo's course questions (trained on)
PROSE_PROMPT_TOKENS = 48  # a prose prompt: the first tokens of a held-out paragraph at least this long
DEMO_PAGES = 4096  # the demo engines' KV pool (64K tokens; unset, a GPU engine would take 80% of the memory)


# --- prompts ------------------------------------------------------------------------------------

def demo_prompts(llm: LLM, n: int, seed: int) -> dict[str, list[list[int]]]:
    """``n`` prompts of each workload as token ids: ``chat``, course questions (shuffled) through
    the chat template; ``prose``, the first :data:`PROSE_PROMPT_TOKENS` tokens of held-out
    paragraphs (shuffled), continued as raw text."""
    from minisgl.tokenizer import encode_prompt

    tok = llm.tokenizer
    questions = [json.loads(line)["question"] for line in QA_FILE.read_text(encoding="utf-8").splitlines() if line.strip()]
    random.Random(seed).shuffle(questions)
    chat = [encode_prompt(tok, [{"role": "user", "content": q}]) for q in questions[:n]]
    text = (Path(llm.model_path) / "heldout.txt").read_text(encoding="utf-8")
    paragraphs = [ids for ids in (tok.encode(p.strip()) for p in text.split("\n\n")) if len(ids) >= PROSE_PROMPT_TOKENS]
    random.Random(seed + 1).shuffle(paragraphs)
    prose = [list(ids[:PROSE_PROMPT_TOKENS]) for ids in paragraphs[:n]]
    if len(chat) < n or len(prose) < n:
        raise SystemExit(f"the demo has {len(chat)} chat and {len(prose)} prose prompts; asked for {n} of each")
    return {"chat": chat, "prose": prose}


def mixed(prompts: dict[str, list[list[int]]], n: int) -> list[list[int]]:
    """``n`` prompts, chat and prose in turn."""
    return [prompts[WORKLOADS[i % 2]][i // 2] for i in range(n)]


def random_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(length)] for _ in range(n)]


# --- engines -------------------------------------------------------------------------------------

class Unavailable(Exception):
    """A proposer this tree cannot build (e.g. the draft model before it exists)."""


def spec_settings(proposer: str | None, k: int, draft_model: str) -> dict[str, Any]:
    if proposer is None:
        return {}
    settings: dict[str, Any] = {"speculative": proposer, "num_speculative_tokens": k}
    if proposer == "draft":
        settings["draft_model"] = draft_model
    return settings


def build(model: str | Path, args, proposer: str | None = None, k: int = 4, dummy: bool = False, **kw) -> LLM:
    """An ``LLM`` of ``model`` on ``args.device`` (bf16 on CUDA, float32 with ``args.threads``
    threads on the CPU), with ``proposer`` at ``k`` if given. A proposer this tree does not
    have raises :class:`Unavailable`."""
    cuda = args.device.startswith("cuda")
    settings = {"device": args.device, "dtype": torch.bfloat16 if cuda else torch.float32, **kw}
    if not cuda:
        settings["cpu_threads"] = args.threads
    if dummy:
        settings["dummy_weights"] = True
    settings.update(spec_settings(proposer, k, args.draft_model))
    try:
        return LLM(model, **settings)
    except (ValueError, FileNotFoundError, OSError, ImportError, TypeError) as exc:
        if proposer is None:
            raise
        raise Unavailable(f"{type(exc).__name__}: {exc}") from exc


def timed(device: str, fn) -> tuple[Any, float]:
    sync(device)
    t0 = time.perf_counter()
    value = fn()
    sync(device)
    return value, time.perf_counter() - t0


# --- per-step counts -----------------------------------------------------------------------------

def step_counts(drafted: list[list[int]], accepted: list[list[int]], outputs: list[list[int]]) -> dict[str, Any]:
    """What the requests' per-step records say. Each request's first record is its prefill's
    token; the others are decode steps, each adding its accepted drafts plus one token (fewer
    only where a stop token cut a run: the tokens are counted from the outputs)."""
    steps = sum(max(len(a) - 1, 0) for a in accepted)
    tokens = sum(max(len(o) - 1, 0) for o in outputs)
    by_drafts: dict[int, int] = {}
    by_accepted: dict[int, int] = {}
    for d_row, a_row in zip(drafted, accepted):
        for d, a in zip(d_row[1:], a_row[1:]):
            by_drafts[d] = by_drafts.get(d, 0) + 1
            if d:
                by_accepted[a] = by_accepted.get(a, 0) + 1
    n_drafted = sum(sum(d[1:]) for d in drafted)
    n_accepted = sum(sum(a[1:]) for a in accepted)
    return {
        "requests": len(outputs), "output_tokens": sum(map(len, outputs)), "decode_steps": steps,
        "decode_tokens": tokens, "tokens_per_step": tokens / steps if steps else None,
        "verify_steps": sum(n for d, n in by_drafts.items() if d), "drafted": n_drafted, "accepted": n_accepted,
        "acceptance_rate": n_accepted / n_drafted if n_drafted else None,
        "steps_by_drafts": {str(d): by_drafts[d] for d in sorted(by_drafts)},
        "verify_steps_by_accepted": {str(a): by_accepted[a] for a in sorted(by_accepted)},
    }


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": values}


# --- part 1: acceptance --------------------------------------------------------------------------

def acceptance_part(args, proposers: list[str], skipped: dict[str, str]) -> dict:
    params = SamplingParams(max_tokens=args.max_tokens)  # greedy; the demo's answers end at <|im_end|>
    plain = build(args.model, args, num_pages=DEMO_PAGES)
    prompts = demo_prompts(plain, args.prompts, args.seed)
    reference = {w: [o.token_ids for o in plain.generate(p, params, progress=False)] for w, p in prompts.items()}
    del plain
    empty_cache(args.device)
    rows = []
    combos = [(p, k) for p in proposers for k in args.ks]
    for proposer, k in tqdm(combos, desc="acceptance (proposer, k)", unit="setting"):
        if proposer in skipped:
            continue
        try:
            llm = build(args.model, args, proposer, k, num_pages=DEMO_PAGES)
        except Unavailable as exc:
            skipped[proposer] = str(exc)
            print(f"  {proposer}: not available in this tree, skipped ({exc})")
            continue
        every: dict[str, list] = {"drafted": [], "accepted": [], "outputs": [], "same": []}
        for workload, wl_prompts in prompts.items():
            outs = llm.generate(wl_prompts, params, progress=False)
            row = {"proposer": proposer, "k": k, "workload": workload,
                   **step_counts([o.spec_drafted for o in outs], [o.spec_accepted for o in outs],
                                 [o.token_ids for o in outs])}
            same = [o.token_ids == ref for o, ref in zip(outs, reference[workload])]
            row["identical_to_plain"] = sum(same)
            rows.append(row)
            every["drafted"] += [o.spec_drafted for o in outs]
            every["accepted"] += [o.spec_accepted for o in outs]
            every["outputs"] += [o.token_ids for o in outs]
            every["same"] += same
        row = {"proposer": proposer, "k": k, "workload": "all",
               **step_counts(every["drafted"], every["accepted"], every["outputs"]), "identical_to_plain": sum(every["same"])}
        rows.append(row)
        print(f"  {proposer} k={k}: {row['tokens_per_step']:.3f} tokens per decode step, "
              f"{row['accepted']}/{row['drafted']} drafts accepted; "
              + ", ".join(f"{r['workload']} {r['tokens_per_step']:.3f}" for r in rows[-3:-1])
              + f"; {row['identical_to_plain']}/{row['requests']} outputs identical to the plain engine's")
        del llm
        empty_cache(args.device)
    return {"workloads": {w: len(p) for w, p in prompts.items()}, "max_tokens": args.max_tokens, "rows": rows}


# --- part 2: bs=1 wall-clock speedup -------------------------------------------------------------

def speedup_part(args, proposers: list[str], skipped: dict[str, str]) -> dict:
    cuda = args.device.startswith("cuda")
    engines: dict[str, LLM] = {"off": build(args.model, args, num_pages=DEMO_PAGES)}
    if cuda:
        engines["off_eager"] = build(args.model, args, cuda_graph_max_bs=0, num_pages=DEMO_PAGES)
    for proposer in proposers:
        if proposer in skipped:
            continue
        try:
            engines[proposer] = build(args.model, args, proposer, args.k, num_pages=DEMO_PAGES)
        except Unavailable as exc:
            skipped[proposer] = str(exc)
            print(f"  {proposer}: not available in this tree, skipped ({exc})")
    prompts = mixed(demo_prompts(engines["off"], args.speedup_prompts, args.seed + 7), 2 * args.speedup_prompts)
    params = SamplingParams(max_tokens=args.max_tokens)
    for llm in engines.values():  # warm-up: every prompt once (the prefix cache then holds each)
        llm.generate(prompts, params, progress=False)
    runs: dict[str, list[dict]] = {key: [] for key in engines}
    tokens: dict[str, list[list[int]]] = {}
    keys = list(engines)
    for rep in tqdm(range(args.repeats), desc="bs=1 speedup (repeats)", unit="repeat"):
        for key in keys[rep % len(keys):] + keys[:rep % len(keys)]:  # rotate the order each repeat
            llm = engines[key]
            outs, elapsed = timed(args.device, lambda llm=llm: [llm.generate([p], params, progress=False)[0]
                                                                 for p in prompts])
            run = {"time_s": elapsed, "output_tokens": sum(len(o.token_ids) for o in outs)}
            run["output_tok_s"] = run["output_tokens"] / elapsed
            if outs[0].spec_accepted is not None:
                run.update(step_counts([o.spec_drafted for o in outs], [o.spec_accepted for o in outs],
                                       [o.token_ids for o in outs]))
            runs[key].append(run)
            tokens.setdefault(key, [o.token_ids for o in outs])
    del engines
    empty_cache(args.device)
    out: dict[str, Any] = {"k": args.k, "prompts": len(prompts), "max_tokens": args.max_tokens,
                           "repeats": args.repeats, "engines": {}}
    for key, key_runs in runs.items():
        entry: dict[str, Any] = {
            "output_tokens": key_runs[0]["output_tokens"],
            "time_s": spread([r["time_s"] for r in key_runs]),
            "output_tok_s": spread([r["output_tok_s"] for r in key_runs]),
            "identical_to_off": sum(a == b for a, b in zip(tokens[key], tokens["off"])),
        }
        if "tokens_per_step" in key_runs[0]:
            entry["tokens_per_step"] = key_runs[0]["tokens_per_step"]
            entry["acceptance_rate"] = key_runs[0]["acceptance_rate"]
        if key != "off":
            # Ratio of times of the same repeat (same tokens, greedy): >1 means this engine is faster.
            entry["speedup_vs_off"] = spread([a["time_s"] / b["time_s"] for a, b in zip(runs["off"], key_runs)])
            if "off_eager" in runs and key != "off_eager":
                entry["speedup_vs_off_eager"] = spread([a["time_s"] / b["time_s"]
                                                        for a, b in zip(runs["off_eager"], key_runs)])
            s = entry["speedup_vs_off"]
            print(f"  bs=1 {key}: {s['median']:.3f}x the plain engine (min {s['min']:.3f}, max {s['max']:.3f}, "
                  f"{len(key_runs)} repeats); {entry['output_tok_s']['median']:.1f} tok/s")
        out["engines"][key] = entry
    return out


# --- part 3: the verify step's cost --------------------------------------------------------------

def cached_rows(llm: LLM, n: int, context: int, extra: int, seed: int) -> list:
    """``n`` requests of ``context`` random prompt tokens, prefilled and sampled once (so each
    decodes next, over ``context`` cached tokens), each with pages for ``extra`` more positions."""
    sched = llm.scheduler
    reqs = [sched.add_request(p, SamplingParams(max_tokens=extra + 8, ignore_eos=True))
            for p in random_prompts(n, context, llm.config.vocab_size, seed)]
    while any(r.num_generated == 0 for r in reqs):
        sched.step()
    sched.flush()
    for r in reqs:
        if not sched.kv.ensure_capacity(r, r.seq_len + extra):
            raise RuntimeError("the KV pool is too small for the verify rows")
    return reqs


def forward_ms(calls: dict, reps: int, device: str) -> dict:
    """Median ms of each of ``calls`` (``{key: (llm, batch, eager)}``): one forward of ``batch``
    through ``llm``'s runner (its eager runner if ``eager``) and the read of its argmax tokens
    (what a step waits for). The calls take turns, one each per round, so a busy machine slows
    all of them alike."""

    def once(llm: LLM, batch, eager: bool) -> None:
        engine = llm.engine
        runner = getattr(engine.runner, "eager", engine.runner) if eager else engine.runner
        logits = runner.forward(batch, *engine.inputs_on_device(batch))
        logits.argmax(dim=-1).tolist()

    for call in calls.values():
        for _ in range(3):
            once(*call)
    times: dict = {key: [] for key in calls}
    for _ in range(reps):
        for key, call in calls.items():
            times[key].append(timed(device, lambda call=call: once(*call))[1] * 1e3)
    return {key: statistics.median(t) for key, t in times.items()}


def verify_shape(args, shape: str, batch_sizes: list[int], ks: list[int], draft: bool = False,
                 skipped: dict[str, str] | None = None) -> dict:
    """Per batch size, taking turns: the eager decode and verify forwards (the engine
    speculation runs); on CUDA the decode forward through a CUDA graph (a second engine, as the
    plain engine runs it); with ``draft``, the draft model's eager decode forward over the same
    context (a third)."""
    from minisgl.scheduler.speculative import add_drafts

    cuda = args.device.startswith("cuda")
    demo = shape == "demo" or shape == args.model
    model, dummy = (args.model, False) if demo else (shape_checkpoint(shape), True)
    b_max, k_max = max(batch_sizes), max(ks)
    probe = 512 if demo else SHAPES[shape]["max_position_embeddings"]
    context = min(args.context, probe - k_max - 16)
    pages = b_max * (-(-(context + k_max + 16) // 16)) + 64
    common = dict(dummy=dummy, max_running=b_max, num_pages=pages, page_size=16, overlap=False,
                  max_seq_len=context + k_max + 16, prefix_cache=False)
    entry: dict[str, Any] = {"model": "demo" if demo else shape, "dummy_weights": dummy, "context": context,
                             "rows": []}
    rng = random.Random(args.seed)
    engines = {"eager": build(model, args, cuda_graph_max_bs=0, **common)}
    if draft:  # the draft model's own decode forward, as the draft proposer runs it (eager)
        try:
            engines["draft"] = build(args.draft_model, args, cuda_graph_max_bs=0, **common)
        except (ValueError, FileNotFoundError, OSError) as exc:
            if skipped is not None:
                skipped["draft"] = f"{type(exc).__name__}: {exc}"
            print(f"  draft: the draft model is not available, its forward not timed ({exc})")
            draft = False
    if cuda:  # the plain engine's decode step: through a CUDA graph (the fused decode layers with it)
        engines["graphs"] = build(model, args, cuda_graph_max_bs=b_max, **common)
    rows = {key: cached_rows(llm, b_max, context, k_max, args.seed) for key, llm in engines.items()}
    eager = engines["eager"]
    replays_before = sum(engines["graphs"].engine.runner.stats.replays.values()) if cuda else 0
    by_bs: dict[int, dict] = {}
    for bs in tqdm(batch_sizes, desc=f"verify cost {entry['model']} (batch sizes)", unit="bs"):
        calls = {"decode_eager": (eager, eager.scheduler.build_batch(rows["eager"][:bs]), True)}
        for k in ks:
            batch = eager.scheduler.build_batch(rows["eager"][:bs])
            add_drafts(batch, [[rng.randrange(eager.config.vocab_size) for _ in range(k)] for _ in range(bs)],
                       eager.scheduler.kv.page_table)
            calls[k] = (eager, batch, True)
        if draft:
            calls["draft_decode"] = (engines["draft"], engines["draft"].scheduler.build_batch(rows["draft"][:bs]), True)
        if cuda:
            calls["decode_graph"] = (engines["graphs"], engines["graphs"].scheduler.build_batch(rows["graphs"][:bs]), False)
        ms = forward_ms(calls, args.verify_reps, args.device)
        by_bs[bs] = {f"{key}_ms": ms.pop(key) for key in list(ms) if isinstance(key, str)}
        by_bs[bs]["verify_ms"] = ms
    if cuda:
        replays = sum(engines["graphs"].engine.runner.stats.replays.values()) - replays_before
        expected = len(batch_sizes) * (args.verify_reps + 3)
        if replays < expected:  # a decode forward that did not go through a graph
            raise RuntimeError(f"the graphed decode forwards replayed CUDA graphs {replays} times, expected {expected}")
    del engines, rows, eager
    empty_cache(args.device)
    for bs, m in by_bs.items():
        for k, ms in m["verify_ms"].items():
            row = {"batch_size": bs, "k": k, "verify_ms": ms, "decode_eager_ms": m["decode_eager_ms"],
                   "cost_vs_eager_decode": ms / m["decode_eager_ms"]}
            if "decode_graph_ms" in m:
                row["decode_graph_ms"] = m["decode_graph_ms"]
                row["cost_vs_graphed_decode"] = ms / m["decode_graph_ms"]
            if "draft_decode_ms" in m:
                row["draft_decode_ms"] = m["draft_decode_ms"]
            entry["rows"].append(row)
    one = [r for r in entry["rows"] if r["batch_size"] == batch_sizes[0]]
    print(f"  {entry['model']} (context {context}, bs={batch_sizes[0]}): decode {one[0]['decode_eager_ms']:.3f} ms eager"
          + (f", {one[0]['decode_graph_ms']:.3f} ms graphed" if cuda else "")
          + (f", the draft model's {one[0]['draft_decode_ms']:.3f} ms" if draft else "") + "; verify/decode (eager) "
          + ", ".join(f"k={r['k']} {r['cost_vs_eager_decode']:.2f}x" for r in one))
    return entry


def project(entry: dict, acceptance_rows: list[dict]) -> list[dict]:
    """Speed-ups these forward costs give at each measured acceptance (workload ``all``), step
    by step: plain time = decode tokens x one decode forward; speculative time = each step's
    forward (``1 + d`` tokens for a step with ``d`` drafts, the eager decode for ``d = 0``), plus,
    for the draft model where its decode forward was timed, ``d`` of those per step (its
    catch-up forward and ``d - 1`` decode forwards, each priced as one decode forward). The
    n-gram lookup's host time is left out; so is the draft's where it was not timed."""
    out = []
    costs = {(r["batch_size"], r["k"]): r for r in entry["rows"]}
    for acc in acceptance_rows:
        if acc["workload"] != "all" or not acc.get("tokens_per_step"):
            continue
        for bs in sorted({r["batch_size"] for r in entry["rows"]}):
            base = costs[(bs, min(k for b, k in costs if b == bs))]
            steps = {int(d): n for d, n in acc["steps_by_drafts"].items()}
            if any(d and (bs, d) not in costs for d in steps):
                continue  # a step with a draft count that was not timed
            draft_ms = base.get("draft_decode_ms") if acc["proposer"] == "draft" else None
            spec_ms = sum(n * (costs[(bs, d)]["verify_ms"] + d * (draft_ms or 0.0) if d else base["decode_eager_ms"])
                          for d, n in steps.items())
            if acc["proposer"] == "ngram":
                cost = "left out (a host lookup)"
            elif draft_ms:
                cost = "counted: d draft decode forwards per step with d drafts"
            else:
                cost = "left out (the draft model's forwards were not timed: a ceiling)"
            row = {"proposer": acc["proposer"], "k": acc["k"], "batch_size": bs, "tokens_per_step": acc["tokens_per_step"],
                   "speedup_vs_eager_decode": acc["decode_tokens"] * base["decode_eager_ms"] / spec_ms,
                   "proposer_cost": cost}
            if "decode_graph_ms" in base:
                row["speedup_vs_graphed_decode"] = acc["decode_tokens"] * base["decode_graph_ms"] / spec_ms
            out.append(row)
    return out


def verify_cost_part(args, acceptance: dict | None, skipped: dict[str, str]) -> dict:
    cuda = args.device.startswith("cuda")
    out: dict[str, Any] = {"ks": args.verify_ks, "reps": args.verify_reps,
                           "measured": "median ms of one forward and the argmax read of its tokens; eager as "
                                       "speculation runs it (cuda_graph_max_bs=0), the graphed decode as the "
                                       "plain engine runs it (CUDA graphs; the CPU has none)",
                           "shapes": {}}
    source = None
    if acceptance is not None:
        source = f"this run's acceptance part ({args.model}, {args.device})"
    elif args.acceptance_from:
        acceptance = json.loads(Path(args.acceptance_from).read_text())["results"].get("acceptance")
        source = f"{args.acceptance_from}" if acceptance else None
    out["acceptance_source"] = source
    for shape in args.verify_shapes:
        if shape in GPU_SHAPES and not cuda:
            print(f"  verify cost on the {shape} shape needs a GPU: skipped on the CPU")
            continue
        demo = shape == "demo" or shape == args.model
        draft = demo and "draft" in args.proposers and "draft" not in skipped
        entry = verify_shape(args, shape, args.verify_batch_sizes, args.verify_ks, draft, skipped)
        if acceptance is not None:
            entry["projected"] = project(entry, acceptance["rows"])
            for row in entry["projected"]:
                if row["batch_size"] == args.verify_batch_sizes[0]:
                    print(f"    projected at the measured acceptance, {row['proposer']} k={row['k']}: "
                          f"{row['speedup_vs_eager_decode']:.2f}x vs eager decode"
                          + (f", {row['speedup_vs_graphed_decode']:.2f}x vs graphed decode"
                             if "speedup_vs_graphed_decode" in row else ""))
        out["shapes"][entry["model"]] = entry
    return out


# --- part 4: throughput against batch size -------------------------------------------------------

def run_pool(llm: LLM, prompts: list[list[int]], params: SamplingParams, in_flight: int) -> list:
    """Serve ``prompts`` with at most ``in_flight`` requests at once (a new one starts as one
    finishes); returns the finished requests in prompt order."""
    sched = llm.scheduler
    todo = list(prompts)
    reqs, live = [], set()
    while todo or live:
        while todo and len(live) < in_flight:
            reqs.append(sched.add_request(todo.pop(0), params))
            live.add(id(reqs[-1]))
        for req in sched.step():
            if req.finish_reason == "error":
                raise RuntimeError(f"a request failed: {req.error}")
            live.discard(id(req))
    sched.flush()
    return reqs


def throughput_shape(args, shape: str, proposers: list[str], skipped: dict[str, str]) -> dict:
    demo = shape == "demo" or shape == args.model
    n = max(*args.batch_sizes, args.throughput_requests)
    if demo:
        model, dummy = args.model, False
        params = SamplingParams(max_tokens=args.throughput_max_tokens)
    else:
        model, dummy = shape_checkpoint(shape), True
        params = SamplingParams(max_tokens=args.throughput_max_tokens, ignore_eos=True)
    kw: dict[str, Any] = dict(dummy=dummy, max_running=n, num_pages=DEMO_PAGES)
    if not demo:
        kw.update(num_pages=n * (-(-(128 + args.throughput_max_tokens + 16) // 16)) + 64, max_seq_len=512)
    engines: dict[str, LLM] = {"off": build(model, args, **kw)}
    for proposer in proposers:
        if proposer in skipped or (proposer == "draft" and not demo):
            continue
        try:
            engines[proposer] = build(model, args, proposer, args.k, **kw)
        except Unavailable as exc:
            skipped[proposer] = str(exc)
            print(f"  {proposer}: not available in this tree, skipped ({exc})")
    if demo:
        prompts = mixed(demo_prompts(engines["off"], -(-n // 2), args.seed + 11), n)
    else:
        prompts = random_prompts(n, 128, engines["off"].config.vocab_size, args.seed + 11)
    for llm in engines.values():  # warm-up (the prefix cache then holds every prompt)
        run_pool(llm, prompts, params, n)
    keys = list(engines)
    runs: dict[int, dict[str, list]] = {bs: {key: [] for key in keys} for bs in args.batch_sizes}
    counts: dict[int, dict[str, dict]] = {bs: {} for bs in args.batch_sizes}
    tokens: dict[int, dict[str, list]] = {bs: {} for bs in args.batch_sizes}
    combos = [(rep, bs) for rep in range(args.throughput_repeats) for bs in args.batch_sizes]
    for rep, bs in tqdm(combos, desc=f"throughput {'demo' if demo else shape} (repeat, bs)", unit="run"):
        order = keys[rep % len(keys):] + keys[:rep % len(keys)]
        work = prompts[:max(bs, args.throughput_requests)]
        for key in order:
            llm = engines[key]
            reqs, elapsed = timed(args.device, lambda llm=llm, work=work, bs=bs: run_pool(llm, work, params, bs))
            produced = sum(len(r.output_ids) for r in reqs)
            runs[bs][key].append({"time_s": elapsed, "output_tokens": produced, "output_tok_s": produced / elapsed})
            if rep == 0:
                tokens[bs][key] = [list(r.output_ids) for r in reqs]
                if key != "off":
                    counts[bs][key] = step_counts([r.spec_drafted for r in reqs], [r.spec_accepted for r in reqs],
                                                  [r.output_ids for r in reqs])
    del engines
    empty_cache(args.device)
    rows = []
    for bs in args.batch_sizes:
        row: dict[str, Any] = {"batch_size": bs, "requests": min(n, max(bs, args.throughput_requests))}
        for key in keys:
            key_runs = runs[bs][key]
            row[key] = {"output_tokens": key_runs[0]["output_tokens"],
                        "output_tok_s": spread([r["output_tok_s"] for r in key_runs])}
            if key != "off":
                c = counts[bs][key]
                row[key].update(tokens_per_step=c["tokens_per_step"], acceptance_rate=c["acceptance_rate"],
                                identical_to_off=sum(a == b for a, b in zip(tokens[bs][key], tokens[bs]["off"])),
                                speedup_vs_off=spread([a["time_s"] / b["time_s"]
                                                       for a, b in zip(runs[bs]["off"], key_runs)]))
        rows.append(row)
        print(f"  bs={bs:3d}: off {row['off']['output_tok_s']['median']:8.1f} tok/s; "
              + "; ".join(f"{key} {row[key]['output_tok_s']['median']:8.1f} tok/s "
                          f"({row[key]['speedup_vs_off']['median']:.2f}x, {row[key]['tokens_per_step']:.2f} tok/step)"
                          for key in keys if key != "off"))
    return {"model": "demo" if demo else shape, "dummy_weights": dummy, "k": args.k,
            "prompt": "half chat, half prose (the demo's own text)" if demo else "128 random tokens",
            "max_tokens": args.throughput_max_tokens, "ignore_eos": not demo, "repeats": args.throughput_repeats,
            "rows": rows}


def throughput_part(args, proposers: list[str], skipped: dict[str, str]) -> dict:
    cuda = args.device.startswith("cuda")
    out: dict[str, Any] = {"measured": "output tok/s of a fixed pool of requests, at most batch_size in flight",
                           "shapes": {}}
    for shape in args.throughput_shapes:
        if shape in GPU_SHAPES and not cuda:
            print(f"  throughput on the {shape} shape needs a GPU: skipped on the CPU")
            continue
        entry = throughput_shape(args, shape, proposers, skipped)
        out["shapes"][entry["model"]] = entry
    return out


# --- the command line ----------------------------------------------------------------------------

def weights_sha256(args) -> dict[str, str]:
    """SHA-256 of the model's and the draft model's ``model.safetensors`` (where they are local
    directories): which weights were measured."""
    import hashlib

    from minisgl.model_path import resolve_model_path

    out = {}
    for key, name in (("model", args.model), ("draft_model", args.draft_model)):
        if name not in ("demo", "demo-draft") and not Path(name).is_dir():
            continue  # a hub id: nothing is fetched for this
        try:
            path = Path(resolve_model_path(name)) / "model.safetensors"
            out[key] = hashlib.sha256(path.read_bytes()).hexdigest()
        except Exception:  # noqa: BLE001 - a hub id, or a draft model this tree does not have
            continue
    return out


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def names(text: str) -> list[str]:
    return [x for x in text.split(",") if x]


QUICK = {"ks": [1, 4], "prompts": 2, "max_tokens": 12, "speedup_prompts": 1, "repeats": 2, "verify_ks": [1, 2],
         "verify_batch_sizes": [1, 2], "verify_reps": 3, "context": 64, "batch_sizes": [1, 2],
         "throughput_max_tokens": 8, "throughput_repeats": 1, "throughput_requests": 2}


def main(argv: list[str] | None = None) -> None:
    parser = benchmark_parser("speculative", __doc__, out="benchmarks/results/speculative_demo_cpu.json (CPU), "
                              "speculative_gpu.json (CUDA)")
    parser.add_argument("--parts", type=names, default=list(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--quick", action="store_true", help="a smoke run: few prompts, short outputs, few k")
    parser.add_argument("--model", default="demo", help="the model of the acceptance, speedup and throughput parts")
    parser.add_argument("--proposers", type=names, default=["ngram", "draft"], help="ngram, draft")
    parser.add_argument("--draft-model", default="demo-draft", help="the draft model of the draft proposer")
    parser.add_argument("--ks", type=ints, default=[1, 2, 4, 8], help="acceptance: num_speculative_tokens values")
    parser.add_argument("--prompts", type=int, default=8, help="acceptance: prompts of each workload (chat, prose)")
    parser.add_argument("--max-tokens", type=int, default=64, help="acceptance and speedup: most new tokens")
    parser.add_argument("--k", type=int, default=4, help="speedup and throughput: num_speculative_tokens")
    parser.add_argument("--speedup-prompts", type=int, default=3, help="speedup: prompts of each workload")
    parser.add_argument("--repeats", type=int, default=5, help="speedup: interleaved repeats")
    parser.add_argument("--verify-shapes", type=names, default=None,
                        help="verify_cost: demo and/or qwen3-0.6b, llama-3.1-8b (GPU); default: all on CUDA, demo on the CPU")
    parser.add_argument("--verify-ks", type=ints, default=list(range(1, 9)))
    parser.add_argument("--verify-batch-sizes", type=ints, default=None,
                        help="verify_cost: rows per forward (default 1..64 in powers of two on CUDA, 1 on the CPU)")
    parser.add_argument("--verify-reps", type=int, default=20, help="verify_cost: timed forwards per point (median)")
    parser.add_argument("--context", type=int, default=512, help="verify_cost: cached tokens per row")
    parser.add_argument("--acceptance-from", default=None,
                        help="verify_cost without the acceptance part: project with this results file's acceptance")
    parser.add_argument("--batch-sizes", type=ints, default=[1, 2, 4, 8, 16, 32, 64], help="throughput: most in flight")
    parser.add_argument("--throughput-shapes", type=names, default=None,
                        help="throughput: demo and/or qwen3-0.6b (GPU, random weights); default: both on CUDA, demo on the CPU")
    parser.add_argument("--throughput-max-tokens", type=int, default=32)
    parser.add_argument("--throughput-requests", type=int, default=16,
                        help="throughput: requests per run, at least (a run at batch size b serves max(b, this))")
    parser.add_argument("--throughput-repeats", type=int, default=3)
    args = parser.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    cuda = args.device.startswith("cuda")
    if args.verify_shapes is None:
        args.verify_shapes = ["demo", *GPU_SHAPES] if cuda else ["demo"]
    if args.verify_batch_sizes is None:
        args.verify_batch_sizes = [1, 2, 4, 8, 16, 32, 64] if cuda else [1]
    if args.throughput_shapes is None:
        args.throughput_shapes = ["demo", "qwen3-0.6b"] if cuda else ["demo"]
    if args.quick:
        args.verify_shapes = [s for s in args.verify_shapes if s not in GPU_SHAPES or cuda][:2]
        args.throughput_shapes = args.throughput_shapes[:1]
    unknown = [p for p in args.parts if p not in PARTS] + [p for p in args.proposers if p not in ("ngram", "draft")]
    if unknown:
        parser.error(f"unknown part(s) or proposer(s): {', '.join(unknown)}")
    for shape in (*args.verify_shapes, *args.throughput_shapes):
        if shape not in ("demo", args.model, *GPU_SHAPES):
            parser.error(f"unknown shape {shape!r}: demo, {', '.join(GPU_SHAPES)}")
    if not cuda:
        torch.set_num_threads(args.threads)

    skipped: dict[str, str] = {}
    results: dict[str, Any] = {}
    t0 = time.perf_counter()
    load_start = os.getloadavg()[0]
    if "acceptance" in args.parts:
        print("acceptance: tokens per decode step against k")
        results["acceptance"] = acceptance_part(args, args.proposers, skipped)
    if "speedup" in args.parts:
        print(f"speedup: bs=1 wall clock, k={args.k}")
        results["speedup"] = speedup_part(args, args.proposers, skipped)
    if "verify_cost" in args.parts:
        print("verify_cost: a verify forward against a decode forward")
        results["verify_cost"] = verify_cost_part(args, results.get("acceptance"), skipped)
    if "throughput" in args.parts:
        print(f"throughput: output tok/s against batch size, k={args.k}")
        results["throughput"] = throughput_part(args, args.proposers, skipped)
    if skipped:
        results["skipped_proposers"] = skipped
    config = {"model": args.model, "device": args.device, "dtype": "bfloat16" if cuda else "float32",
              "parts": args.parts, "quick": args.quick, "proposers": args.proposers, "draft_model": args.draft_model,
              "ks": args.ks, "k": args.k, "prompts_per_workload": args.prompts, "max_tokens": args.max_tokens,
              "speedup_prompts_per_workload": args.speedup_prompts, "repeats": args.repeats,
              "verify_shapes": args.verify_shapes, "verify_ks": args.verify_ks,
              "verify_batch_sizes": args.verify_batch_sizes, "verify_reps": args.verify_reps, "context": args.context,
              "batch_sizes": args.batch_sizes, "throughput_shapes": args.throughput_shapes,
              "throughput_max_tokens": args.throughput_max_tokens, "throughput_repeats": args.throughput_repeats,
              "throughput_requests": args.throughput_requests,
              "greedy": True, "seed": args.seed, "cpu_threads": None if cuda else torch.get_num_threads(),
              "workloads": {"chat": "course questions through the chat template (tests/demo_training/qa.jsonl)",
                            "prose": f"the first {PROSE_PROMPT_TOKENS} tokens of held-out Austen paragraphs "
                                     "(the demo's heldout.txt), continued"},
              "plain_engine": "the LLM defaults (overlap on; CUDA graphs on CUDA); speculation runs without both",
              "wall_s": round(time.perf_counter() - t0, 1),
              "load_average_1min": {"start": load_start, "end": os.getloadavg()[0]}}
    config["weights_sha256"] = weights_sha256(args)
    out = args.out or f"benchmarks/results/speculative_{'gpu' if cuda else 'demo_cpu'}.json"
    print(f"wrote {write_result(out, 'speculative', config, results)} in {config['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
