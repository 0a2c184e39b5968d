"""Programmatic dependent launch (lesson 8) off, early and late, side by side: bs=1 decode.

    python -m benchmarks pdl [--rounds 1] [--shapes qwen3-0.6b,llama-3.1-8b] [--moe]
    python -m benchmarks pdl --collect DIR     # the same summary from runs already made

Each round runs, in a child process per mode (``MINISGL_PDL=0``, ``early``, ``late``; the
order rotates from round to round), ``python -m benchmarks graphs`` on the shapes (bs=1 decode
with CUDA graphs, no yardstick) and, with ``--moe``, ``python -m benchmarks moe --decode
--skip-layer`` (the Qwen3-30B-A3B shape). The result lists every round's ms/token per mode
and shape, the medians, and each mode's speed-up over ``0`` (median over median). The graph's
arithmetic is the same in every mode (``tests/test_decode_kernels.py`` checks bit-equal logits),
so only the timing differs.

``--collect DIR`` summarises runs made by hand instead (``MINISGL_PDL=<mode> python -m benchmarks
graphs|moe ... --out DIR/<name>_<mode>.json``, the mode last in each file name): every such file
of ``DIR`` in the order of its date, one round per file; the summary keeps the runs' commit and
hardware (they must agree), not this machine's.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.cli import REPO, benchmark_parser, child_env, write_result

MODES = ("0", "early", "late")


def _run(args: list[str], mode: str, out: Path) -> dict:
    env = child_env()
    env["MINISGL_PDL"] = mode
    subprocess.run([sys.executable, "-m", "benchmarks", *args, "--out", str(out)], cwd=REPO, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())["results"]


def collect(folder: Path) -> tuple[dict[str, dict[str, list[float]]], list[str], dict]:
    """The runs of ``folder``'s ``<name>_<mode>.json`` files (see the module's docstring):
    ``(runs, file names in date order, the runs' shared commit and hardware)``."""
    runs: dict[str, dict[str, list[float]]] = {mode: {} for mode in MODES}
    files = [(json.loads(p.read_text()), p) for p in folder.glob("*.json") if p.stem.rsplit("_", 1)[-1] in MODES]
    files.sort(key=lambda item: item[0]["date"])
    if not files:
        raise SystemExit(f"no <name>_<mode>.json files (mode one of {', '.join(MODES)}) in {folder}")
    origins = {json.dumps({"commit": data["commit"], "hardware": data["hardware"]}, sort_keys=True) for data, _ in files}
    if len(origins) != 1:
        raise SystemExit(f"the runs in {folder} come from {len(origins)} different commits or machines")
    for data, path in files:
        mode, results = path.stem.rsplit("_", 1)[-1], data["results"]
        if data["benchmark"] == "moe":
            runs[mode].setdefault("qwen3-30b-a3b", []).append(results["decode_bs1"]["ms_per_token"])
        else:
            for shape, d in results["decode"].items():
                runs[mode].setdefault(shape, []).append(d["graphs_on"])
    return runs, [p.name for _, p in files], json.loads(origins.pop())


def main(argv: list[str] | None = None) -> None:
    parser = benchmark_parser("pdl", __doc__, seed=False, threads=False,
                              out="benchmarks/results/pdl_modes_<device>.json")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--shapes", default="qwen3-0.6b,llama-3.1-8b", help="graphs' shapes ('' to skip)")
    parser.add_argument("--decode-tokens", type=int, default=256)
    parser.add_argument("--moe", action="store_true", help="also the Qwen3-30B-A3B shape's bs=1 decode")
    parser.add_argument("--collect", default=None, help="summarise the <name>_<mode>.json runs of this folder")
    args = parser.parse_args(argv)
    config = {"rounds": args.rounds, "shapes": args.shapes, "decode_tokens": args.decode_tokens, "moe": args.moe,
              "modes": list(MODES), "ms_per_token": "bs=1 decode with CUDA graphs, median of each child's runs"}
    if args.collect:
        runs, names, origin = collect(Path(args.collect))
        config = {"collected": names, "modes": list(MODES), "ms_per_token": config["ms_per_token"]}
        return summarise(runs, config, args.out, origin)
    if args.device != "cuda":
        raise SystemExit("PDL is a GPU feature (Hopper or later): run with --device cuda")
    runs: dict[str, dict[str, list[float]]] = {mode: {} for mode in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            order = MODES[round_ % len(MODES):] + MODES[:round_ % len(MODES)]
            for mode in order:
                if args.shapes:
                    decode = _run(["graphs", "--shapes", args.shapes, "--yardstick-requests", "0", "--decode-tokens",
                                   str(args.decode_tokens)], mode, Path(tmp) / "graphs.json")["decode"]
                    for shape, d in decode.items():
                        runs[mode].setdefault(shape, []).append(d["graphs_on"])
                if args.moe:
                    moe = _run(["moe", "--decode", "--skip-layer"], mode, Path(tmp) / "moe.json")["decode_bs1"]
                    runs[mode].setdefault("qwen3-30b-a3b", []).append(moe["ms_per_token"])
                print(f"round {round_ + 1}, MINISGL_PDL={mode}: "
                      + ", ".join(f"{s} {v[-1]:.3f} ms" for s, v in runs[mode].items()), flush=True)
    return summarise(runs, config, args.out)


def summarise(runs: dict[str, dict[str, list[float]]], config: dict, out: str | None,
              origin: dict | None = None) -> None:
    """Print and write each mode's median ms/token per shape and its speed-up over ``0``
    (``origin``: the collected runs' commit and hardware)."""
    medians = {mode: {s: statistics.median(v) for s, v in by_shape.items()} for mode, by_shape in runs.items()}
    speedup = {mode: {s: medians["0"][s] / m for s, m in by_shape.items()} for mode, by_shape in medians.items()}
    for mode in MODES:
        print(f"MINISGL_PDL={mode:<5} " + ", ".join(f"{s} {m:.3f} ms ({speedup[mode][s]:.3f}x)"
                                                   for s, m in medians[mode].items()))
    path = write_result(out or "benchmarks/results/pdl_modes_gpu.json", "pdl", config,
                        {"runs": runs, "median_ms": medians, "speedup_vs_off": speedup}, origin)
    print(f"wrote {path}")
