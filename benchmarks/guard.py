"""The regression guard's summary: two source trees measured in turn by ``benchmarks/compare_trees.sh``.

    bash benchmarks/compare_trees.sh OTHER_TREE OUT_DIR [ROUNDS] [graphs|moe|http|steps] [extra flags...]   # GPU
    python -m benchmarks guard OUT_DIR [--out FILE]       # the script ends with this

The script runs one benchmark (``graphs``: bs=1 decode of the Qwen3-0.6B and Llama-3.1-8B
shapes, graphs on and off, and the offline yardstick; ``moe``: bs=1 decode of the
Qwen3-30B-A3B shape; ``http``: the server against the offline engine on one burst, lesson
10; ``steps``: the offline yardstick step by step, its busy time against its own bound and the
kernels of a profiled 256-row decode step, lesson 8) once per tree and round, alternating which tree goes first, and writes
``OUT_DIR/<bench>_{this,other}_<round>.json``. This summary prints a table of every run's
figures, then each metric's ratio, this tree's speed over the other's (other / this for times,
this / other for throughputs: above 1, this tree is faster), as the median and the range over
the rounds. With ``--out`` it also writes them as a results file stamped with the runs' commits
and machine (``guard_<what>_<card>.json`` under ``benchmarks/results/``, one-off files that
:mod:`benchmarks.all` lists as retired).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from benchmarks.cli import write_result

BENCHES = ("graphs", "moe", "http", "steps")


def metrics(bench: str, results: dict) -> dict[str, float]:
    """The figures a guard compares from one run's ``results``: keys ending in `` ms`` are
    times (lower is better), the others throughputs (higher is better)."""
    row: dict[str, float] = {}
    if bench == "graphs":
        for shape, d in results.get("decode", {}).items():
            for mode, label in (("graphs_on", "graphs"), ("graphs_off", "eager")):
                if isinstance(d.get(mode), (int, float)):
                    row[f"{shape} {label} ms"] = float(d[mode])
        for mode in ("graphs_on", "graphs_off"):
            runs = (results.get("yardstick") or {}).get(mode) or []
            if runs:
                row[f"yardstick {mode} out tok/s (median)"] = statistics.median(r["output_tok_s"] for r in runs)
    elif bench == "moe":
        decode = results.get("decode_bs1") or {}
        if isinstance(decode.get("ms_per_token"), (int, float)):
            row["qwen3-30b-a3b bs=1 decode ms"] = float(decode["ms_per_token"])
        for layer in results.get("layer") or []:
            if layer.get("batch_size") == 1 and isinstance(layer.get("fused_us"), (int, float)):
                row["layer bs=1 fused ms"] = layer["fused_us"] / 1e3
    elif bench == "http":
        for side in ("offline", "server_no_stream", "server_stream"):
            if isinstance((results.get(side) or {}).get("output_tok_s"), (int, float)):
                row[f"{side.replace('_', ' ')} out tok/s"] = float(results[side]["output_tok_s"])
        for mode, ratio in (results.get("server_over_offline") or {}).items():
            row[f"server/offline {mode.replace('_', '-')}"] = float(ratio)
    elif bench == "steps":
        row["yardstick out tok/s"] = float(results["output_tok_s"])
        for group in ("decode 193-256 rows", "all steps"):
            if group in results.get("groups", {}):
                row[f"{group} busy ms"] = float(results["groups"][group]["busy_ms"])
        decode = next((w for w in results.get("profiled_windows", []) if w.get("mode") == "decode"), None)
        if decode:
            row["profiled decode step ms"] = decode["us_per_step"] / 1e3
            for kind, d in decode["by_kind"].items():
                row[f"decode step: {kind} ms"] = d["us_per_step"] / 1e3
    else:
        raise ValueError(f"the guard compares runs of {', '.join(BENCHES)}, not {bench!r}")
    return row


def summarise(out_dir: Path) -> dict:
    """Every ``<bench>_{this,other}_<round>.json`` in ``out_dir`` (one benchmark): the runs'
    figures, and per metric the ratios of the rounds where both trees have it."""
    files = sorted(out_dir.glob("*_this_*.json")) + sorted(out_dir.glob("*_other_*.json"))
    benches = {f.name.split("_")[0] for f in files}
    if len(benches) != 1:
        raise SystemExit(f"{out_dir}: expected the runs of one benchmark, found {sorted(benches) or 'none'}")
    bench = benches.pop()
    runs: dict[str, dict] = {}
    commits: dict[str, str] = {}
    hardware = None
    for f in files:
        data = json.loads(f.read_text())
        _, tree, round_ = f.stem.rsplit("_", 2)
        runs[f"{tree}_{round_}"] = metrics(bench, data["results"])
        commits.setdefault(tree, data.get("commit", "unknown"))
        hardware = hardware or data.get("hardware")
    guard: dict[str, dict] = {}
    for key in dict.fromkeys(k for row in runs.values() for k in row):
        ratios = []
        for name, row in runs.items():
            if not name.startswith("this_"):
                continue
            other = runs.get(name.replace("this_", "other_", 1), {})
            a, b = row.get(key), other.get(key)
            if a and b:
                ratios.append(b / a if key.endswith(" ms") else a / b)
        if ratios:
            guard[key] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
                          "rounds": len(ratios)}
    return {"bench": bench, "commits": commits, "hardware": hardware, "runs": runs, "this_over_other": guard}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks guard", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path, help="the folder compare_trees.sh wrote its runs to")
    parser.add_argument("--out", default=None, help="also write the summary as a results file here")
    args = parser.parse_args(argv)
    s = summarise(args.out_dir)
    keys = list(dict.fromkeys(k for row in s["runs"].values() for k in row))
    print(" | ".join(["run", *keys]))
    for name, row in sorted(s["runs"].items(), key=lambda item: (item[0].split("_")[1], item[0])):
        print(" | ".join([name, *(f"{row[k]:.4g}" if k in row else "-" for k in keys)]))
    print(f"\nthis tree ({s['commits'].get('this')}) vs the other ({s['commits'].get('other')}), >1: this is faster; "
          "median [min, max] over rounds")
    for key, g in s["this_over_other"].items():
        print(f"  {key:45s} {g['median']:.3f}x [{g['min']:.3f}, {g['max']:.3f}]  ({g['rounds']} rounds)")
    if args.out:
        origin = {"commit": s["commits"].get("this", "unknown"), "hardware": s["hardware"]}
        config = {"bench": s["bench"], "this": s["commits"].get("this"), "other": s["commits"].get("other"),
                  "command": f"bash benchmarks/compare_trees.sh OTHER_TREE OUT_DIR ROUNDS {s['bench']}"}
        print(f"wrote {write_result(args.out, 'guard', config, s, origin=origin)}")


if __name__ == "__main__":
    main()
