"""``python -m benchmarks NAME [args]``: run one benchmark (``python -m benchmarks NAME --help``).

Each runner is the module ``benchmarks/NAME.py``; its results go to ``benchmarks/results/`` as
JSON with the hardware, commit and config (:mod:`benchmarks.cli`). Run from the root of a clone.
"""

from __future__ import annotations

import importlib
import sys

RUNNERS = {
    "offline": "the offline yardstick (256 random requests) against Hugging Face",
    "attention": "decode attention: FlashInfer against the torch reference",
    "radix": "the radix cache on and off on a shared-prefix workload",
    "chunked": "chunked prefill: short requests' TTFT behind a long prompt",
    "overlap": "overlap scheduling on and off",
    "host": "the scheduler's host time per step",
    "graphs": "CUDA graphs on and off at bs=1, and where a step's time goes",
    "kernels": "lesson 8's decode kernels against what they replace",
    "steps": "every yardstick step against its byte/FLOP bound",
    "tp": "tensor parallelism: TP=2 against TP=1",
    "http": "the HTTP server's overhead against the offline engine",
    "serving": "serving through the HTTP server (TTFT, TPOT, ITL, E2E)",
    "threads": "the CPU thread policy, idle and beside busy processes",
    "moe": "lesson 11's MoE layer on the Qwen3-30B-A3B shape (fused vs reference), bs=1 decode",
    "speculative": "lesson 12: acceptance against k, bs=1 speedup, verify cost, throughput against batch size",
    "pdl": "lesson 8's programmatic dependent launch off, early and late: bs=1 decode",
    "all": "every GPU results file again at this commit on this card (--part 1|2, --dry-run, --stale)",
    "guard": "the regression guard's summary of two trees measured in turn (benchmarks/compare_trees.sh)",
}


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in RUNNERS:
        lines = "\n".join(f"  {name:<11} {what}" for name, what in RUNNERS.items())
        usage = f"usage: python -m benchmarks NAME [--help]\n\n{lines}"
        if sys.argv[1:2] in (["-h"], ["--help"]):
            print(usage)
            raise SystemExit(0)
        raise SystemExit(usage)
    name = sys.argv[1]
    result = importlib.import_module(f"benchmarks.{name}").main(sys.argv[2:])
    raise SystemExit(result if isinstance(result, int) else 0)


if __name__ == "__main__":
    main()
