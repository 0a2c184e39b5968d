"""``python -m benchmarks all``: every GPU results file again, at this commit, on this card.

    python -m benchmarks all --dry-run                 # the plan: commands, files, estimates (any machine)
    python -m benchmarks all --part 1                  # one GPU, < 10 minutes: lessons 3-8 and 10 on the Qwen3-0.6B shape
    python -m benchmarks all --part 2                  # two GPUs, < 10 minutes: lessons 9 and 11 on two GPUs, then on one
                                                       # GPU the decode kernels, lesson 11 and the serving curve
    python -m benchmarks all --part 3                  # one GPU, < 5 minutes: lesson 12, the Llama-3.1-8B shape's yardstick
    python -m benchmarks all --stale                   # which results files are superseded, and by what

:data:`PLAN` lists one entry per results file: the runner and its arguments, the file it writes
(``<card>`` is the GPU's short name, e.g. ``h200``: :func:`card_slug`), the GPUs it needs and the
seconds it is expected to take, with where that figure comes from. Each part runs its entries in
order, each as ``python -m benchmarks NAME ... --out benchmarks/results/FILE`` in a process of its
own (``MINISGL_COMMIT`` passes through as it is, so a copy of the tree without its ``.git`` still
stamps the right commit), and writes ``all_<card>_part<N>.json``: each entry's command, file,
status (``ok``, ``failed``, ``skipped``, ``timeout``) and seconds, and the GPUs' memory in use
just before it started (``nvidia-smi``; a warning where another process already held more than
5% of a GPU, as a process left over from earlier tests once did). An entry that needs more GPUs
than the machine has is skipped; one that runs past twice its estimate is stopped (its process
group killed) and the next one starts. The summary is rewritten after every entry, so a part cut
short by an outside limit still says how far it got. With ``--only`` the summary keeps the other
entries of the part's summary already there when it comes from the same commit (each marked with
that run's date), so the entries a ``--deadline`` skipped can run afterwards into one summary;
``--deadline S`` skips the entries that no longer fit in S seconds of the part and shortens the
last one's limit to what is left.

**The budget.** Each part's estimates add up to at most ten minutes (:data:`PART_SECONDS`), a
command's limit on the GPU machines. Every estimate is the seconds the entry took in a recorded
run (its ``basis`` names the run) plus about 5%; a summary records the seconds of every entry, to
correct them with. On H200s the whole plan took 1,241 s at d9c69ba on one two-H200 machine: 1,188 s
at ff85617 in the same machine kind (the tp entry 169 s against 153 s, chunked 86 s against 76 s;
the spread between machines of one kind), 1,315 s at 2ef1385. Two parts would hold it if the entries
took no more than at ff85617 and the speculative entry stopped counting FlashInfer's compiles: of its
163 s, about 76 s went to compiling the demo draft model's head_dim-64 attention kernels (two gaps in
its log, 60 s and 16 s, where the draft first ran; the GPU kit precompiles head_dim 128 only, and the
kernels appeared in ``FLASHINFER_WORKSPACE_BASE`` after the entry; every later process on the machine
loads them). The d9c69ba run tried those two parts, one call of ten minutes each: part 1 took 525 s
and its last entry (the Llama-3.1-8B yardstick, 59 s) no longer fitted its ``--deadline``, part 2
506 s without the speculative entry, and the two ran afterwards with ``--only`` into those parts'
summaries. Measured that way the entries need three runs, and the plan says so: part 3 holds those
two.

Where an entry's seconds go (``--log-dir`` at 67701fc and ae4c7a7, and a profile of the
radix-short-answers entry on a two-H200 machine): mostly not into its measurements but into what
every process and engine pays first. In the profiled process (33 s, about 4 s of it measuring):
Python compiled about 1,900 modules from source, 6 s, because the GPU machine's packages are
read-only and no ``.pyc`` could be kept (``PYTHONPYCACHEPREFIX`` pointing at a writable folder
keeps them: part 2 of ae4c7a7 ran with it, and since then every entry gets one unless it is
set); registering 128 custom ops with ``torch.library``, inside FlashInfer's set-up, 5.5 s;
transformers' import, 3.6 s, came only from building the tokenizer of the real-shape checkpoints.
Two fixes went in at 67701fc: those checkpoints used to build the whole tiny test
model to borrow its tokenizer (7 to 10 s a process) and now build the tokenizer alone, once per
part (a part's entries share one tiny-checkpoint folder, ``MINISGL_TINY_CHECKPOINTS``); and an
engine no longer measures its CUDA graphs' memory by capturing them all a second time when the
process has measured the same runner shape already, nor warms up its second graph slot (the first
slot's warm-ups ran the same kernels on the same shapes): qwen3-0.6b's start-up with capture went
from 3.1 s (b721247) to 2.2 s (67701fc, on the slower host below). The savings hardly show in the
totals because the host changed as well: the two-H200 machine's host runs host-bound work slower
than the one-H200 machine's (graphs' yardstick without graphs 4,809 against 7,421 out tok/s at
b721247), so part 1's first seven entries took 478 s at 67701fc against 466 s at b721247, and the tp entry 228 s against 166 s at
9fcc2a4 (whose machine had two H200s too).

Running the one-GPU entries of two parts at once on the two GPUs of one host was tried (9fcc2a4): wrong
numbers: each entry had its own GPU, but the engines' host loops shared the CPU, and host-bound
throughputs fell by about 70% (the chunked prefill yardstick: about 7,100 against 23,900 tok/s
alone; the run's summaries, ``all_h200_part1_side-by-side_9fcc2a4.json`` and ``_part2_``, show
every entry slower, by up to 1.7x). Its files were not kept. Measurements here run one at a time.
The workloads already run less than the files they supersede did where that was cheap to give up:
an entry's ``note`` says where (mostly Hugging Face's static-batch baselines, minutes per shape
and independent of this repository's commit, and repeats of the yardsticks). ``--log-dir DIR``
keeps each entry's output with the seconds since its start on every line (``DIR/NAME.log``).

**Supersession.** Nothing here deletes or rewrites an old results file. ``--stale`` lists the GPU
results files that are not the plan's latest naming (an old ``_gpu`` suffix, another file merged
into an entry, a retired kind, see :data:`RETIRED`) or whose commit is not the newest among the
files of the plan's naming on the same card, with what supersedes each. Cards are kept apart: an
H100 file is superseded by an H100 run only.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.cli import REPO, child_env, git_commit, write_result
from minisgl.testing.checkpoints import SHARED_CACHE_ENV

RESULTS = REPO / "benchmarks" / "results"
PART_SECONDS = 600  # one run's limit on the GPU machines: ten minutes
PARTS = (1, 2, 3)  # part 1: one GPU; part 2: two GPUs, then one; part 3: one GPU
CARD = "<card>"  # in an entry's file name: the GPU's short name (card_slug)


@dataclass(frozen=True)
class Entry:
    """One run of the plan: ``python -m benchmarks RUNNER ARGV... --out benchmarks/results/OUT``."""

    name: str  # what --only calls it
    runner: str  # benchmarks/RUNNER.py
    argv: tuple[str, ...]
    out: str  # file name, with CARD for the GPU's short name
    kind: str  # the results' "benchmark" key
    part: int
    estimate_s: int
    basis: str  # where estimate_s comes from: the seconds the entry took in a recorded run
    gpus: int = 1
    covers: tuple[str, ...] = ()  # older results files this entry's file supersedes
    note: str = ""  # how this run differs from the files it supersedes

    @property
    def timeout_s(self) -> int:
        return 2 * self.estimate_s

    def file(self, card: str) -> str:
        return self.out.replace(CARD, card)

    def command(self, out_arg: str) -> list[str]:
        return [sys.executable, "-m", "benchmarks", self.runner, *self.argv, "--out", out_arg]


PLAN: tuple[Entry, ...] = (
    # Part 1: one GPU: lessons 3 to 8 and 10 on the Qwen3-0.6B shape.
    Entry("offline-qwen3-0.6b", "offline", ("--shape", "qwen3-0.6b", "--hf-requests", "1", "--hf-batched-requests", "0"),
          "offline_qwen3-0.6b_<card>.json", "offline", 1, 49,
          "measured: 46.1 s on an H200 of a two-H200 machine at d9c69ba (all_h200_part1.json); before: 51.8 s at "
          "ff85617 (its all_h200_part1.json, in git history), 62.5 s at 2ef1385 (its all_h200_part1.json, in git "
          "history)",
          covers=("offline_qwen3-0.6b_gpu.json", "offline_qwen3-0.6b_all-features_gpu.json"),
          note="HF in static batches left out (its untimed warm-up batch of 64 alone took 75 s on an H200, then 43 s "
               "a batch; HF does not change with this repository's commit, and the old files keep those figures); "
               "HF one at a time on 1 request (the old files: 2 and 4)"),
    Entry("radix", "radix", ("--shape", "qwen3-0.6b"), "radix_qwen3-0.6b_<card>.json", "radix", 1, 38,
          "measured: 35.1 s on an H200 of a two-H200 machine at d9c69ba (all_h200_part1.json); before: 34.7 s at "
          "ff85617 (its all_h200_part1.json, in git history), 35.2 s at 2ef1385 (its all_h200_part1.json, in git "
          "history)",
          covers=("radix_qwen3-0.6b_gpu.json",)),
    Entry("radix-short-answers", "radix", ("--shape", "qwen3-0.6b", "--output-len", "16"),
          "radix_qwen3-0.6b_short-answers_<card>.json", "radix", 1, 29,
          "measured: 27.2 s on an H200 of a two-H200 machine at d9c69ba (all_h200_part1.json); before: 26.2 s at "
          "ff85617 (its all_h200_part1.json, in git history), 30.5 s at 2ef1385 (its all_h200_part1.json, in git "
          "history)",
          covers=("radix_qwen3-0.6b_short-answers_gpu.json",)),
    Entry("chunked", "chunked", ("--shape", "qwen3-0.6b"), "chunked_qwen3-0.6b_<card>.json", "chunked", 1, 91,
          "measured: 85.9 s on an H200 of a two-H200 machine at d9c69ba (all_h200_part1.json); before: 75.9 s at "
          "ff85617 (its all_h200_part1.json, in git history), 83.3 s at 2ef1385 (its all_h200_part1.json, in git "
          "history)",
          covers=("chunked_qwen3-0.6b_gpu.json",)),
    Entry("overlap", "overlap", ("--yardstick-repeats", "1"), "overlap_<card>.json", "overlap", 1, 66,
          "measured: 61.9 s on an H200 of a two-H200 machine at d9c69ba (all_h200_part1.json); before: 55.8 s at "
          "ff85617 (its all_h200_part1.json, in git history), 59.0 s at 2ef1385 (its all_h200_part1.json, in git "
          "history)",
          covers=("overlap_gpu.json",), note="the yardstick once (the old file: 3 repeats)"),
    Entry("graphs", "graphs", ("--attention-sweep", "--timeline-processes", "3", "--yardstick-repeats", "1"),
          "graphs_<card>.json", "graphs", 1, 149,
          "measured: 140.7 s on an H200 of a two-H200 machine at d9c69ba (all_h200_part1.json); before: 137.3 s at "
          "ff85617 (its all_h200_part1.json, in git history), 160.9 s at 2ef1385 (its all_h200_part1.json, in git "
          "history)",
          covers=("graphs_gpu.json", "graphs_bs1_timeline_h100.json"),
          note="the yardstick once (graphs_gpu.json: 3 repeats); the bs=1 timeline in 3 fresh processes "
               "(graphs_bs1_timeline_h100.json: 6, in a run of its own); no --compare-kernels-with (graphs_gpu.json "
               "counted the kernels of a checkout of d6784c0 too, which needs that checkout)"),
    Entry("host", "host", ("--shape", "qwen3-0.6b"), "host_<card>.json", "host", 1, 34,
          "measured: 32.1 s on an H200 of a two-H200 machine at d9c69ba (all_h200_part1.json); before: 31.9 s at "
          "ff85617 (its all_h200_part1.json, in git history), 34.5 s at 2ef1385 (its all_h200_part1.json, in git "
          "history)",
          covers=("host_gpu.json",),
          note="no --compare-with (host_gpu.json measured a checkout of the lesson-6 commit a09cff5 beside this tree, "
               "which needs that checkout)"),
    Entry("attention", "attention", (), "attention_decode_<card>.json", "attention_decode", 1, 10,
          "measured: 8.6 s on an H200 of a two-H200 machine at d9c69ba (all_h200_part1.json); before: 10.2 s at "
          "ff85617 (its all_h200_part1.json, in git history), 11.0 s at 2ef1385 (its all_h200_part1.json, in git "
          "history)"),
    Entry("steps", "steps", ("--shape", "qwen3-0.6b"), "steps_qwen3-0.6b_<card>.json", "steps", 1, 30,
          "measured: 27.6 s on an H200 of a two-H200 machine at d9c69ba (all_h200_part1.json); before: 27.0 s at "
          "ff85617 (its all_h200_part2.json, in git history), 29.2 s at 2ef1385 (its all_h200_part2.json, in git "
          "history)"),
    Entry("http", "http", ("--shape", "qwen3-0.6b"), "http_qwen3-0.6b_<card>.json", "http", 1, 58,
          "measured: 54.5 s on an H200 of a two-H200 machine at d9c69ba (all_h200_part1.json); before: 51.5 s at "
          "ff85617 (its all_h200_part2.json, in git history), 53.3 s at 2ef1385 (its all_h200_part2.json, in git "
          "history)",
          covers=("http_qwen3-0.6b_gpu.json",)),
    # Part 2: the two-GPU runs (lessons 9 and 11; skipped at once on a machine with one GPU), then on one GPU the
    # decode kernels, lesson 11's mixture of experts and the serving benchmark.
    Entry("tp", "tp", ("--yardstick-repeats", "1"), "tp_<card>.json", "tp", 2, 151,
          "measured: 144 s on two H200s at 9c1bb14, its ranks forked from the rank starter (minisgl.distributed."
          "starter; that run's files were not kept, the committed ones are d9c69ba's); before: 169.1 s at d9c69ba "
          "(all_h200_part2.json, ranks started as new interpreters), 153.0 s at ff85617 (its all_h200_part3.json, in "
          "git history), 219.8 s at 2ef1385 (its all_h200_part3.json, in git history)",
          gpus=2, covers=("tp_gpu.json", "tp_gpu_h100.json"),
          note="no --profile (the old files' kernel profiles and decode traces take three more engines); the "
               "yardstick once (tp_gpu.json: 3 repeats; tp_gpu_h100.json had none: two 8B engines side by side do "
               "not fit an 80 GB H100, so on one the entry fails and the old file stays the H100's)"),
    Entry("moe-parallel", "moe", ("--parallel", "2", "--skip-layer", "--yardstick-requests", "64"),
          "moe_parallel_<card>.json", "moe", 2, 176,
          "measured: 165.9 s on two H200s at d9c69ba (all_h200_part2.json); before: 162.9 s at ff85617 (its "
          "all_h200_part3.json, in git history), 179.8 s at 2ef1385 (its all_h200_part3.json, in git history)",
          gpus=2, note="the yardstick on 64 requests (the old file: 128)"),
    Entry("kernels", "kernels", (), "decode_kernels_<card>.json", "kernels", 2, 22,
          "measured: 20.5 s on an H200 of a two-H200 machine at d9c69ba (all_h200_part2.json); before: 22.6 s at "
          "ff85617 (its all_h200_part2.json, in git history), 20.8 s at 2ef1385 (its all_h200_part2.json, in git "
          "history)"),
    Entry("offline-qwen3-30b-a3b", "offline",
          ("--shape", "qwen3-30b-a3b", "--num-requests", "64", "--min-len", "64", "--max-len", "256",
           "--hf-requests", "0", "--hf-batched-requests", "0"),
          "offline_qwen3-30b-a3b_<card>.json", "offline", 2, 38,
          "measured: 35.8 s on an H200 of a two-H200 machine at d9c69ba (all_h200_part2.json); before: 29.7 s at "
          "ff85617 (its all_h200_part2.json, in git history), 31.0 s at 2ef1385 (its all_h200_part2.json, in git "
          "history)",
          note="HF in static batches left out (the old file: 64 requests in 44.6 s, after an untimed warm-up of the "
               "same batch)"),
    Entry("moe", "moe", ("--decode",), "moe_<card>.json", "moe", 2, 36,
          "measured: 33.9 s on an H200 of a two-H200 machine at d9c69ba (all_h200_part2.json); before: 33.0 s at "
          "ff85617 (its all_h200_part2.json, in git history), 30.7 s at 2ef1385 (its all_h200_part2.json, in git "
          "history)"),
    Entry("serving", "serving", ("--shape", "qwen3-0.6b", "--parts", "curve,radix"), "serving_qwen3-0.6b_<card>.json",
          "serving", 2, 79,
          "measured: 74.6 s on an H200 of a two-H200 machine at d9c69ba (all_h200_part2.json); before: 71.9 s at "
          "ff85617 (its all_h200_part2.json, in git history), 74.1 s at 2ef1385 (its all_h200_part2.json, in git "
          "history)",
          covers=("serving_qwen3-0.6b_gpu.json", "serving_qwen3-0.6b_full-suite_gpu.json"),
          note="the curve on 256 prompts, today's default (the old files: 512); the chunked part left out (three "
               "more servers and 3 x 34 s in serving_qwen3-0.6b_full-suite_gpu.json; the chunked entry measures "
               "chunked prefill in the engine)"),
    # Part 3: one GPU: lesson 12's speculative decoding and the Llama-3.1-8B shape's yardstick.
    Entry("speculative", "speculative", ("--repeats", "2", "--verify-reps", "10", "--throughput-repeats", "1"),
          "speculative_<card>.json", "speculative", 3, 172,
          "measured: 162.6 s on an H200 of a two-H200 machine at d9c69ba (all_h200_part2.json, run with --only "
          "after the part), about 76 s of it waiting on FlashInfer compiling the demo draft model's head_dim-64 "
          "kernels (60 s and 16 s gaps in its log where the draft first ran; the GPU kit precompiles head_dim 128 "
          "only, and the compiled kernels appeared in FLASHINFER_WORKSPACE_BASE after the entry): about 85 s on a "
          "machine that has compiled them; before: 156.6 s at ff85617 (its all_h200_part2.json, in git history, "
          "with the same compiles), 144.3 s at 2ef1385 (its all_h200_part2.json, in git history), 183.3 s on an "
          "H200 at b721247 (its all_h200_part2.json, in git history)",
          note="speedup repeats 2 (the old file: 3), throughput repeats 1 (the old file: 2)"),
    Entry("offline-llama-3.1-8b", "offline",
          ("--shape", "llama-3.1-8b", "--hf-requests", "1", "--hf-batched-requests", "0"),
          "offline_llama-3.1-8b_<card>.json", "offline", 3, 62,
          "measured: 58.7 s on an H200 of a two-H200 machine at d9c69ba (all_h200_part1.json, run with --only after"
          " the part); before: 52.9 s at ff85617 (its all_h200_part2.json, in git history), 52.2 s at 2ef1385 (its "
          "all_h200_part2.json, in git history)",
          covers=("offline_llama-3.1-8b_gpu.json",),
          note="HF in static batches left out (the old file: 128 requests in 167 s, after an untimed warm-up batch); "
               "HF one at a time on 1 request (the old file: 2)"),
)

# GPU results files no entry regenerates, and why. They stay; --stale lists them.
RETIRED: dict[str, str] = {
    "tp_64ec243_h200.json": "the tp entry's file as it was at 64ec243, before the embedding's all-reduce went into "
    "the first layer's fused norm and the logits' all-gather over symmetric memory (70c959f): lesson 9's before/after",
    "tp_9fcc2a4_h200.json": "the tp entry's file as it was at 9fcc2a4, before each row-parallel all-reduce was fused "
    "with the residual add and RMSNorm after it (64ec243): lesson 9's before/after",
    "tp_eba9bb0_h200.json": "the tp entry's file as it was at eba9bb0, before the symmetric all-reduce took its copy "
    "inside PyTorch's one-shot kernel and the row-parallel down projection lesson 8's fused SwiGLU GEMV (9fcc2a4): "
    "lesson 9's before/after",
    "moe_18e63cb_h200.json": "the moe entry's file as it was at 18e63cb, before programmatic dependent launch (PDL) "
    "and the router's pre-norm step: its kernel profile adds up to the step (with PDL kernels launch early and "
    "their recorded times overlap), so lesson 11 and the Benchmarks page take the per-kernel breakdown from it",
    "moe_bs1_pdl-off_6064f21_h200.json": "a one-off run of the moe entry's bs=1 parts (the layer at bs=1 and bs=1 "
    "decode) at 6064f21 with programmatic dependent launch off (MINISGL_PDL=0): with every kernel waiting for the one "
    "before it, the profiled kernel times add up to the step, so lesson 11 breaks the current kernels' step down "
    "from it; rerun by hand with `MINISGL_PDL=0 python -m benchmarks moe --decode --batch-sizes 1 --latency` when a decode "
    "kernel changes",
    "moe_bs1_pdl-early_6064f21_h200.json": "the same run with PDL early (the default), one process after "
    "moe_bs1_pdl-off_6064f21_h200.json's on the same H200: what PDL takes off that step",
    "graphs_18e63cb_h200.json": "the graphs entry's file as it was at 18e63cb, before PDL: the bs=1 kernel profile "
    "that adds up to the step, lesson 8's before/after of round five",
    "decode_kernels_18e63cb_h200.json": "the kernels entry's file as it was at 18e63cb, before PDL: each fused kernel "
    "against what it replaces with every launch waiting for the previous one to finish (with PDL a loop of "
    "launches overlaps, which changes what the micro-benchmark measures)",
    "steps_qwen3-0.6b_18e63cb_h200.json": "the steps entry's file as it was at 18e63cb, before PDL: the yardstick's "
    "own bound, before and after",
    "pdl_modes_h200.json": "lesson 8's programmatic dependent launch off, early and late side by side (bs=1 decode "
    "of the Qwen3-0.6B, Llama-3.1-8B and 30B-A3B shapes, a child process per mode and round): it chose the default "
    "mode; rerun by hand with `python -m benchmarks pdl --rounds 2 --moe` when a decode kernel changes",
    "moe_gemv_tiles_c8dbf5a_h200.json": "the moe entry's file as it was at c8dbf5a, run with --gemv-tiles: the sweep "
    "of the decode MoE's GEMV and router tiles that chose their defaults (the entry runs without it, minutes of "
    "Triton compiles): rerun by hand with `python -m benchmarks moe --decode --gemv-tiles` when those kernels change",
    "offline_qwen3-30b-a3b_hf_de0f6b5_h200.json": "the offline-qwen3-30b-a3b entry's file as it was at de0f6b5+, with "
    "Hugging Face's static batches on the same workload (lesson 11's 10x target, measured side by side); the entry "
    "leaves HF out (its static batches do not change with this repository's commit): rerun by hand with "
    "`python -m benchmarks offline --shape qwen3-30b-a3b --num-requests 64 --min-len 64 --max-len 256 "
    "--hf-requests 0 --hf-batched-requests 64`",
    "graphs_bs1_39fbe29_h200.json": "a one-off rerun of the graphs entry's Qwen3-0.6B bs=1 parts alone (decode and "
    "the three-process timeline, no Llama, no yardstick) at 39fbe29, after graphs_h200.json, to see the host's "
    "spread; the graphs entry regenerates the whole file",
    "decode_kernels_swiglu_sweep_h200.json": "a one-off sweep of the SwiGLU GEMV's tiles (60b6100) that chose "
    "gemv_blocks' rule for silu_and_mul (about 512 programs): rerun by hand with `python -m benchmarks kernels "
    "--sweep --sweep-parts swiglu` when that kernel changes",
    "decode_kernels_sweep_h200.json": "a one-off sweep of the tiles of lesson 8's fused decode attention and SwiGLU "
    "GEMV on a work-in-progress tree (3290823 plus their first versions) that chose their default tiles: rerun by "
    "hand with `python -m benchmarks kernels --sweep --attention-sweep` when those kernels change",
    "decode_kernels_moe_sweep_2678e4f_h200.json": "a one-off sweep (2678e4f) of the GEMV tiles of the Qwen3-30B-A3B "
    "shape's dense projections (QKV, o, LM head; the pre-norm QKV's rows) and of the fused decode attention's tiles "
    "with its heads (32 over 4): it chose gemv_blocks' rule for LM heads of one-chunk rows and the pre-norm GEMV's "
    "rows; rerun by hand with `python -m benchmarks kernels --shapes qwen3-30b-a3b --sweep --sweep-parts "
    "matmuls,norm --attention-sweep --attention-shapes qwen3-30b-a3b`",
    "decode_kernels_moe_sweep_f3065e3_h200.json": "the same sweep of the Qwen3-30B-A3B shape's GEMV and pre-norm GEMV "
    "tiles repeated at f3065e3 (no attention sweep), to tell the tiles' differences from noise",
    "guard_gemv_tiles_moe_h200.json": "a regression guard between two fixed trees (8ad740f against 2678e4f: lesson "
    "8's GEMV tiles for LM heads of one-chunk rows and the pre-norm GEMV's rows), bs=1 decode of the Qwen3-30B-A3B "
    "shape, interleaved",
    "guard_down_sum_in_program_moe_h200.json": "a regression guard between two fixed trees (9291c42 against 519c355): "
    "a decode down kernel that sums a token's slots in one program instead of the last arrival's sum; it was slower "
    "and reverted",
    "steps_qwen3-0.6b_windows_h200.json": "the steps entry run once more (a7315de, with bf16 logits) with profiled "
    "windows as the batch shrinks (`--profile mixed:1:3 decode:50:10 \"decode<=192:0:10\" \"decode<=128:0:10\" "
    "\"decode<=64:0:10\" \"decode<=16:0:10\"`): where a decode step's time goes at 256, 192, 128, 64 and 16 rows",
    "guard_logits_bf16_h200.json": "a regression guard between two fixed trees (compare_trees.sh steps, 0ad1a87 "
    "against 726dfd6): the logits kept in the model's dtype (bf16) instead of a float32 copy, the offline yardstick "
    "step by step and a profiled 256-row decode step, interleaved",
    "guard_l2_warm_moe_h200.json": "one fixed tree (1450e87) with its MINISGL_L2_WARM modes interleaved: lesson 8's "
    "fused decode attention prefetching the o projection's weights into L2 while it attends, bs=1 decode of the "
    "Qwen3-30B-A3B and Qwen3-0.6B shapes; it was slower and reverted",
    "guard_pdl_prefetch_moe_h200.json": "a regression guard between two fixed trees (b320d27 against 573814d): "
    "the fused decode attention's and the decode down kernel's loads before the PDL wait, bs=1 decode of the "
    "Qwen3-30B-A3B shape, interleaved with guard_pdl_prefetch_attention_moe_h200.json's runs",
    "guard_pdl_prefetch_attention_moe_h200.json": "a regression guard between two fixed trees (6b0c03e against "
    "573814d): the fused decode attention's loads before the PDL wait alone, from the same interleaved runs as "
    "guard_pdl_prefetch_moe_h200.json",
    "guard_detokenizer_http_h200.json": "a regression guard between two fixed trees (compare_trees.sh http, b721247 "
    "against 06351db): the server against the offline engine before and after the detokenizer's direct backend decode",
    "guard_pdl_prefetch_h200.json": "a regression guard between two fixed trees (compare_trees.sh graphs, b320d27 "
    "against 573814d, no yardstick): bs=1 decode of the Qwen3-0.6B and Llama-3.1-8B shapes",
    "decode_kernels_sweep_h100.json": "a one-off sweep of GEMV tiles on a work-in-progress tree (5b977ca plus the first "
    "decode_kernels.py) that chose gemv's default tile; minutes of Triton compiles: rerun by hand with "
    "`python -m benchmarks kernels --sweep` when the kernel changes",
    "guard_24a4bc4_vs_aa26436_h100.json": "a regression guard between two fixed trees (benchmarks/compare_trees.sh, "
    "24a4bc4 against aa26436): it compares those commits, not the current one",
    "guard_decode_kernels_h100.json": "a regression guard between two fixed trees (compare_trees.sh, 5b977ca against "
    "f09e169/b3d615a)",
    "guard_fused_decode_h200.json": "a regression guard between two fixed trees (compare_trees.sh, 3290823 against "
    "95971de) and the bs=1 timeline of 95971de",
    "guard_strided_qkv_h100.json": "a regression guard between two fixed trees (compare_trees.sh, 9575e60 against 846a8b9)",
    "layering_refactor_compare_h100.json": "a comparison of the trees before and after the layering refactor "
    "(compare_trees.sh, 24a4bc4 against 22d0b7a)",
    "package_refactor_compare_h100.json": "a comparison of the trees before and after the package refactor "
    "(compare_trees.sh, 96a929b against 8e76bb6)",
    "steps_qwen3-0.6b_before_h100.json": "the 'before' picture of lesson 8's kernel work: the engine of 9575e60 with the "
    "steps benchmark added; the steps entry writes the current one",
}

STATUSES = ("ok", "failed", "skipped", "timeout")
_VENDOR_WORDS = {"nvidia", "geforce", "tesla", "quadro", "amd", "radeon", "instinct"}


def card_slug(gpu_name: str) -> str:
    """The short name of a GPU for file names: the words of its name up to the first that holds a
    digit, without the vendor's ("NVIDIA H100 80GB HBM3" -> ``h100``, "NVIDIA GeForce RTX 4090"
    -> ``rtx-4090``, "NVIDIA A100-SXM4-80GB" -> ``a100``)."""
    words = [w for w in re.sub(r"[^a-z0-9]+", " ", gpu_name.lower()).split() if w not in _VENDOR_WORDS]
    for i, word in enumerate(words):
        if any(c.isdigit() for c in word):
            return "-".join(words[: i + 1])
    return "-".join(words) or "unknown-gpu"


def plan(part: int | None = None, only: list[str] | None = None) -> list[Entry]:
    """The entries of ``part`` (all with None), in order, narrowed to ``only`` (names)."""
    entries = [e for e in PLAN if part is None or e.part == part]
    if only:
        names = {e.name: e for e in PLAN}
        unknown = [n for n in only if n not in names]
        if unknown:
            raise SystemExit(f"unknown entr{'ies' if len(unknown) > 1 else 'y'} {', '.join(unknown)}; "
                             f"the plan's: {', '.join(names)}")
        elsewhere = [f"{n} (part {names[n].part})" for n in only if part is not None and names[n].part != part]
        if elsewhere:
            raise SystemExit(f"not in part {part}: {', '.join(elsewhere)}")
        entries = [e for e in entries if e.name in only]
    return entries


def entry_command(entry: Entry, out_arg: str) -> list[str]:
    """The process that runs ``entry`` (a function of its own so that tests can stand in for it)."""
    return entry.command(out_arg)


def _out_arg(results_dir: Path, file: str) -> str:
    path = (results_dir / file).resolve()
    try:
        return path.relative_to(REPO).as_posix()  # benchmarks/results/FILE, as the runners are run from the root
    except ValueError:
        return str(path)


def _shell(argv: list[str]) -> str:
    return shlex.join(["python" if i == 0 and a == sys.executable else a for i, a in enumerate(argv)])


# --- the plan, printed ---------------------------------------------------------------------------------------


def print_plan(entries: list[Entry], card: str, gpus: int | None, results_dir: Path) -> None:
    on = f"{gpus} GPU{'s' * (gpus != 1)}" if gpus else "no GPU here"
    print(f"python -m benchmarks all: {len(entries)} entries, card {card!r} ({on}); timeouts are twice the estimates\n")
    for part in sorted({e.part for e in entries}):
        rows = [e for e in entries if e.part == part]
        total = sum(e.estimate_s for e in rows)
        one = sum(e.estimate_s for e in rows if e.gpus == 1)
        print(f"part {part}: {total} s estimated ({one} s of it on one GPU); the budget is {PART_SECONDS} s")
        for i, e in enumerate(rows, 1):
            gpu = f"{e.gpus} GPUs" if e.gpus > 1 else "1 GPU "
            skip = "  [would be skipped here]" if gpus is not None and 0 < gpus < e.gpus else ""
            print(f"  {i:2d}. {e.name:<22} {gpu}  ~{e.estimate_s:4d} s (limit {e.timeout_s:4d} s)  -> {e.file(card)}{skip}")
            print(f"      {_shell(entry_command(e, _out_arg(results_dir, e.file(card))))}")
            print(f"      estimate: {e.basis}")
            if e.note:
                print(f"      less than before: {e.note}")
        print()


# --- which files are superseded ------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuFile:
    name: str
    benchmark: str
    card: str
    gpu_count: Any
    commit: str
    date: str


def gpu_files(results_dir: Path = RESULTS) -> list[GpuFile]:
    """Every results file whose hardware has a GPU, but this runner's own summaries."""
    found = []
    for path in sorted(results_dir.glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            continue
        hw = data.get("hardware") if isinstance(data, dict) else None
        if not isinstance(hw, dict) or not hw.get("gpu") or data.get("benchmark") == "all":
            continue
        found.append(GpuFile(path.name, str(data.get("benchmark")), card_slug(str(hw["gpu"])), hw.get("gpu_count"),
                             str(data.get("commit") or "unknown"), str(data.get("date") or "")))
    return found


def latest_entry(f: GpuFile) -> Entry | None:
    """The entry whose file ``f`` is, under the plan's naming for ``f``'s own card, if any."""
    return next((e for e in PLAN if e.file(f.card) == f.name), None)


def owner(f: GpuFile) -> Entry | None:
    """The entry that regenerates ``f``: by the plan's naming, or by its list of older files."""
    return latest_entry(f) or next((e for e in PLAN if f.name in e.covers), None)


def _base_commit(commit: str) -> str:
    m = re.match(r"[0-9a-f]{7,40}", commit or "")
    return m.group(0) if m else ""


def same_commit(a: str, b: str) -> bool:
    """Whether two recorded commits name the same one (``de0f6b5+``, ``de0f6b5-dirty`` and a longer hash do)."""
    x, y = _base_commit(a), _base_commit(b)
    return bool(x and y) and (x.startswith(y) or y.startswith(x))


def _when(date: str) -> dt.datetime:
    try:
        when = dt.datetime.fromisoformat(date)
    except ValueError:
        return dt.datetime.min.replace(tzinfo=dt.timezone.utc)
    return when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc)


@dataclass(frozen=True)
class StaleRow:
    file: GpuFile
    superseded_by: str
    why: str  # "naming" (not the plan's latest naming) or "commit" (not the newest commit)


def stale(results_dir: Path = RESULTS) -> tuple[list[StaleRow], dict[str, GpuFile], list[GpuFile]]:
    """The superseded GPU results files (oldest first), each card's newest file of the plan's
    naming (its commit is the one that card's other files are measured against) and the files
    that are current. Cards are separate: an H100 file is superseded only by an H100 file."""
    files = gpu_files(results_dir)
    named = [f for f in files if latest_entry(f) is not None]
    newest: dict[str, GpuFile] = {}
    for f in named:
        if f.card not in newest or _when(f.date) > _when(newest[f.card].date):
            newest[f.card] = f
    rows, current = [], []
    for f in sorted(files, key=lambda f: (_when(f.date), f.name)):
        entry = latest_entry(f)
        if entry is not None and same_commit(f.commit, newest[f.card].commit):
            current.append(f)
            continue
        why = "commit" if entry is not None else "naming"
        e = owner(f)
        successor = next((g for g in named if e is not None and g.name == e.file(f.card)), None)
        if f.name in RETIRED:
            by = f"nothing: retired, {RETIRED[f.name]}"
        elif e is None:
            by = "nothing: no plan entry covers it (add one, or retire it in benchmarks/all.py)"
        elif why == "naming" and successor is not None:
            by = successor.name
        else:
            by = (f"{e.file(f.card)} at the {f.card}'s newest commit "
                  f"(python -m benchmarks all --part {e.part} --only {e.name})")
        rows.append(StaleRow(f, by, why))
    return rows, newest, current


def print_stale(results_dir: Path = RESULTS) -> None:
    rows, newest, current = stale(results_dir)
    total = len(rows) + len(current)
    print(f"{total} GPU results files: {len(rows)} superseded, {len(current)} current")
    if not newest:
        print("none has the plan's naming yet, so every one is superseded by its entry")
    for card, f in sorted(newest.items()):
        print(f"  {card}: the newest file of the plan's naming is {f.name} at {f.commit} ({f.date})")
    if rows:
        table = [("file", "card", "GPUs", "commit", "date", "why", "superseded by")]
        notes: list[str] = []
        for r in rows:
            by = r.superseded_by
            if by.startswith("nothing: retired"):
                notes.append(f"[{len(notes) + 1}] {r.file.name}: {RETIRED[r.file.name]}")
                by = f"nothing (retired [{len(notes)}])"
            table.append((r.file.name, r.file.card, str(r.file.gpu_count), r.file.commit, r.file.date[:16], r.why, by))
        widths = [max(len(row[i]) for row in table) for i in range(len(table[0]) - 1)]
        print()
        for i, row in enumerate(table):
            print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1])
            if i == 0:
                print("  ".join("-" * w for w in widths) + "  " + "-" * len(row[-1]))
        if notes:
            print("\nretired:\n" + "\n".join(notes))
    if current:
        print("\ncurrent: " + ", ".join(f.name for f in current))
    print("\nwhy: naming = not a file the plan writes now (an old _gpu suffix, merged into an entry, retired); "
          "commit = the plan's naming, but not the newest commit among those files of its card")


# --- running a part --------------------------------------------------------------------------------------------


def _stop(proc: subprocess.Popen) -> None:
    """End the entry's process group (the runner and the servers or ranks it started): TERM, then KILL."""
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


BUSY_GPU_FRACTION = 0.05  # memory in use before an entry starts, above which the summary warns


def gpu_memory_in_use() -> list[dict[str, int]] | None:
    """Each GPU's memory in use, as ``nvidia-smi`` reports it (MiB): ``[{"gpu", "used_mib",
    "total_mib"}]``, only the GPUs ``CUDA_VISIBLE_DEVICES`` names where it names some by index;
    None where ``nvidia-smi`` is missing or fails. Read from outside: this process never
    touches CUDA while it runs entries."""
    query = ["nvidia-smi", "--query-gpu=index,memory.used,memory.total", "--format=csv,noheader,nounits"]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    if re.fullmatch(r"\d+(,\d+)*", visible):  # only the GPUs this run may use
        query.append(f"--id={visible}")
    try:
        out = subprocess.run(query, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    rows = []
    for line in out.stdout.strip().splitlines():
        try:
            index, used, total = (int(field) for field in line.split(","))
        except ValueError:
            return None
        rows.append({"gpu": index, "used_mib": used, "total_mib": total})
    return rows


def busy_gpus(memory: list[dict[str, int]] | None) -> str | None:
    """A warning naming the GPUs on which something else already holds memory (an entry that
    then runs out of memory failed for that, not for its own code), or None."""
    busy = [m for m in memory or [] if m["used_mib"] > BUSY_GPU_FRACTION * m["total_mib"]]
    if not busy:
        return None
    return "before this entry, " + "; ".join(f"GPU {m['gpu']} had {m['used_mib']:,} of {m['total_mib']:,} MiB in use"
                                            for m in busy) + " (a process left by an earlier run?)"


def run_one(cmd: list[str], timeout_s: float, log: Path | None = None,
            checkpoints: str | None = None) -> tuple[str, int | None, float, list[str]]:
    """Run ``cmd`` from the clone's root, its output passed through (and into ``log``, each line
    after the seconds since the start), its built tiny checkpoints in the folder ``checkpoints``
    (``MINISGL_TINY_CHECKPOINTS``, unless set already); ``(status, returncode, seconds, last
    lines)``, status ``ok``/``failed``/``timeout`` (``ok``: exit status 0)."""
    tail: deque[str] = deque(maxlen=40)
    start = time.perf_counter()
    env = dict(child_env(), PYTHONUNBUFFERED="1")  # each line when printed: the log's seconds are when it happened
    if checkpoints is not None:
        env.setdefault(SHARED_CACHE_ENV, checkpoints)
    # Compiled bytecode kept where it can be written: on a machine whose packages are read-only
    # every process would compile ~1,900 modules from source again (6 s each on the GPU machine).
    env.setdefault("PYTHONPYCACHEPREFIX", str(Path(tempfile.gettempdir()) / "minisgl-pycache"))
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", bufsize=1, start_new_session=True)
    log_file = log.open("w", encoding="utf-8") if log is not None else None

    def pump() -> None:
        for line in proc.stdout:
            tail.append(line.rstrip("\n"))
            sys.stdout.write(line)
            sys.stdout.flush()
            if log_file is not None:
                log_file.write(f"[{time.perf_counter() - start:8.2f}] {line}")
                log_file.flush()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=timeout_s)
        status = "ok" if rc == 0 else "failed"
    except subprocess.TimeoutExpired:
        _stop(proc)
        rc, status = proc.returncode, "timeout"
    except BaseException:  # Ctrl-C: take the entry's processes down with us
        _stop(proc)
        raise
    reader.join(timeout=5)  # a process the runner left behind may hold the pipe open
    if log_file is not None:
        log_file.close()
    return status, rc, time.perf_counter() - start, list(tail)


def earlier_entries(summary: Path, only: list[str] | None) -> dict[str, Any] | None:
    """With ``--only``, the part's summary already there from the same commit (a run the
    deadline cut short, say): its date and config as ``run``, and its ``entries`` (each marked
    with that date) but those about to run again. None without ``--only`` or such a summary."""
    if not only or not summary.exists():
        return None
    old = json.loads(summary.read_text())
    if old.get("commit") != git_commit():
        return None
    kept = [dict(r, run=r.get("run", old.get("date"))) for r in old.get("results", {}).get("entries", [])
            if r["name"] not in only]
    return {"run": {"date": old.get("date"), "only": old.get("config", {}).get("only"),
                    "deadline_s": old.get("config", {}).get("deadline_s")}, "entries": kept}


def merged_entries(earlier: list[dict[str, Any]], done: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The earlier run's entries and this run's, in the plan's order (this run's first where a
    name is in both)."""
    order = {e.name: i for i, e in enumerate(PLAN)}
    names = {r["name"] for r in done}
    rows = done + [r for r in earlier if r["name"] not in names]
    return sorted(rows, key=lambda r: order.get(r["name"], len(order)))


def run_entries(entries: list[Entry], *, part: int, card: str, gpus: int, results_dir: Path,
                deadline_s: float | None = None, only: list[str] | None = None,
                log_dir: Path | None = None) -> dict[str, Any]:
    """Run ``entries`` one after the other; write the summary after each; return its results.
    The entries share one folder of built tiny checkpoints, removed at the end."""
    with tempfile.TemporaryDirectory(prefix="minisgl-all-checkpoints-") as checkpoints:
        return _run_entries(entries, part=part, card=card, gpus=gpus, results_dir=results_dir,
                            deadline_s=deadline_s, only=only, log_dir=log_dir, checkpoints=checkpoints)


def _run_entries(entries: list[Entry], *, part: int, card: str, gpus: int, results_dir: Path,
                 deadline_s: float | None, only: list[str] | None, log_dir: Path | None,
                 checkpoints: str) -> dict[str, Any]:
    summary = results_dir / f"all_{card}_part{part}.json"
    config = {"part": part, "card": card, "gpus": gpus, "only": only, "deadline_s": deadline_s,
              "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
              "estimates_s": sum(e.estimate_s for e in entries), "budget_s": PART_SECONDS,
              "plan": [{"name": e.name, "runner": e.runner, "argv": list(e.argv), "file": e.file(card), "gpus": e.gpus,
                        "estimate_s": e.estimate_s, "timeout_s": e.timeout_s, "note": e.note} for e in entries]}
    done: list[dict[str, Any]] = []
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
    earlier = earlier_entries(summary, only)
    if earlier:
        config["earlier_run"] = earlier["run"]
    t0 = time.perf_counter()

    def write(finished: bool) -> None:
        rows = merged_entries(earlier["entries"] if earlier else [], done)
        counts = {s: sum(r["status"] == s for r in rows) for s in STATUSES}
        write_result(summary, "all", config, {"finished": finished, "wall_s": round(time.perf_counter() - t0, 1),
                                              "counts": counts, "entries": rows})

    for i, e in enumerate(entries, 1):
        file = e.file(card)
        cmd = entry_command(e, _out_arg(results_dir, file))
        row: dict[str, Any] = {"name": e.name, "command": _shell(cmd), "file": file, "gpus": e.gpus,
                               "estimate_s": e.estimate_s, "timeout_s": e.timeout_s}
        left = None if deadline_s is None else deadline_s - (time.perf_counter() - t0)
        head = f"[{i}/{len(entries)}] {e.name}"
        if e.gpus > gpus:
            row.update(status="skipped", seconds=0.0, reason=f"needs {e.gpus} GPUs, this machine has {gpus}")
        elif left is not None and left < e.estimate_s:
            row.update(status="skipped", seconds=0.0,
                       reason=f"--deadline: {max(left, 0):.0f} s of the part left, the entry is estimated at {e.estimate_s} s")
        else:
            limit = e.timeout_s if left is None else min(e.timeout_s, left)
            row["timeout_s"] = round(limit, 1)
            print(f"\n== {head}: {row['command']}  (estimate {e.estimate_s} s, limit {limit:.0f} s)", flush=True)
            memory = gpu_memory_in_use()
            if memory is not None:
                row["gpu_memory_before"] = memory
            warning = busy_gpus(memory)
            if warning:
                row["warning"] = warning
                print(f"   warning: {warning}", flush=True)
            out = results_dir / file
            before = out.stat().st_mtime if out.exists() else None
            status, rc, seconds, tail = run_one(cmd, limit, log_dir / f"{e.name}.log" if log_dir is not None else None,
                                                checkpoints)
            written = out.exists() and (before is None or out.stat().st_mtime > before)
            if status == "ok" and not written:
                status = "failed"
                row["reason"] = f"exit status 0 but {file} was not written"
            elif status == "failed":
                row["reason"] = f"exit status {rc}"
            elif status == "timeout":
                row["reason"] = f"stopped after {limit:.0f} s (twice the estimate of {e.estimate_s} s, or the deadline)"
            row.update(status=status, seconds=round(seconds, 1), returncode=rc)
            if status != "ok":
                row["tail"] = tail[-20:]
        if row["status"] == "skipped":
            print(f"\n== {head}: skipped, {row['reason']}", flush=True)
        else:
            print(f"== {head}: {row['status']} in {row['seconds']:.0f} s (estimate {e.estimate_s} s)"
                  + (f", {row['reason']}" if row.get("reason") else "")
                  + (f"; {row['warning']}" if row.get("warning") else ""), flush=True)
        done.append(row)
        write(finished=False)
    write(finished=True)
    print(f"\npart {part} on {card}: {time.perf_counter() - t0:.0f} s; summary {_out_arg(results_dir, summary.name)}")
    for row in done:
        print(f"  {row['status']:<8} {row['seconds']:6.0f} s  {row['name']:<22} {row['file']}"
              + (f"  ({row['reason']})" if row.get("reason") else ""))
    return {"summary": summary, "entries": done}


def _machine() -> tuple[str | None, int]:
    """The card's short name and the number of GPUs (None, 0 without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return None, 0
    return card_slug(torch.cuda.get_device_name(0)), torch.cuda.device_count()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks all", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", type=int, choices=PARTS, help="which part of the plan to run (a real run needs one)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan with its estimates and run nothing")
    parser.add_argument("--only", type=lambda t: [n for n in t.split(",") if n], default=None,
                        help="comma-separated entry names (of the part)")
    parser.add_argument("--stale", action="store_true", help="list the superseded GPU results files and what supersedes them")
    parser.add_argument("--deadline", type=float, default=None, metavar="SECONDS",
                        help="skip the entries that no longer fit in this many seconds of the part (e.g. 570 in a "
                             "ten-minute call), and cut the last one's limit to what is left")
    parser.add_argument("--card", default=None, help="the card's short name in file names (default: from the GPU)")
    parser.add_argument("--results-dir", type=Path, default=RESULTS, help="where the files go (default benchmarks/results)")
    parser.add_argument("--log-dir", type=Path, default=None,
                        help="also write each entry's output into DIR/NAME.log, every line after the seconds since "
                             "the entry started")
    args = parser.parse_args(argv)

    if args.stale:
        print_stale(args.results_dir)
        return 0
    if args.part is None and args.only:  # --only names of one part: that part
        parts = {e.part for e in plan(None, args.only)}
        args.part = parts.pop() if len(parts) == 1 else None
    entries = plan(args.part, args.only)
    card, gpus = _machine()
    if args.dry_run:
        print_plan(entries, args.card or card or CARD, gpus, args.results_dir)
        return 0
    if card is None:
        raise SystemExit("python -m benchmarks all regenerates the GPU results files, and this machine has no CUDA GPU "
                         "(torch.cuda.is_available() is False). --dry-run prints the plan, --stale lists the superseded "
                         "files; both work anywhere.")
    if args.part is None:
        raise SystemExit("which part? --part 1, 2 or 3 (each fits ten minutes by the estimates; --dry-run shows them)")
    card = args.card or card
    print(f"part {args.part} on {gpus} x {card}, commit {os.environ.get('MINISGL_COMMIT') or 'from git'}: "
          f"{len(entries)} entries, {sum(e.estimate_s for e in entries)} s estimated", flush=True)
    result = run_entries(entries, part=args.part, card=card, gpus=gpus, results_dir=args.results_dir,
                         deadline_s=args.deadline, only=args.only, log_dir=args.log_dir)
    return 1 if any(r["status"] in ("failed", "timeout") for r in result["entries"]) else 0

if __name__ == "__main__":
    raise SystemExit(main())
