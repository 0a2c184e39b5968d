#!/usr/bin/env bash
# Compare two source trees of minisgl on one GPU, interleaved in one run: bs=1 decode (Qwen3-0.6B
# and Llama-3.1-8B shapes, CUDA graphs on and off) and the offline yardstick (every feature on),
# i.e. `python -m benchmarks graphs` once per tree and round, alternating the order.
#
#   bash benchmarks/compare_trees.sh OTHER_TREE OUT_DIR [ROUNDS] [extra bench graphs flags...]
#
# OTHER_TREE is a folder holding another commit's `minisgl/` package, e.g. made with
#   mkdir -p .bench-trees/old && git archive COMMIT minisgl | tar -x -C .bench-trees/old \
#       && echo COMMIT > .bench-trees/old/COMMIT
# (.bench-trees/ is git-ignored; carry it to the GPU machine with the working tree). Both trees
# are measured by this tree's benchmarks/ (only `minisgl` comes from OTHER_TREE). Each run
# writes OUT_DIR/graphs_{this,other}_<round>.json; a table of the figures is printed at the end,
# then the regression guard: each metric's ratio (this tree's speed over the other's) as the
# median and the range over the rounds. Use it before and after every engine change.
set -euo pipefail
other="$(cd "$1" && pwd)"
out="$2"
rounds="${3:-1}"
shift $(( $# < 3 ? $# : 3 ))
here="$PWD"
mkdir -p "$out"
for round in $(seq 1 "$rounds"); do
    order=("this" "other")
    if (( round % 2 == 0 )); then order=("other" "this"); fi
    for name in "${order[@]}"; do
        tree="$here"
        if [[ "$name" == "other" ]]; then tree="$other"; fi
        echo "== round $round: $name ($tree)"
        commit="${MINISGL_COMMIT:-}"  # each result file records its tree's commit (OTHER_TREE/COMMIT, if written)
        if [[ "$name" == "other" && -f "$other/COMMIT" ]]; then commit="$(cat "$other/COMMIT")"; fi
        (cd "$tree" && MINISGL_COMMIT="$commit" PYTHONPATH="$tree:$here${PYTHONPATH:+:$PYTHONPATH}" python3 -m benchmarks graphs \
            --out "$out/graphs_${name}_${round}.json" "$@" > "$out/graphs_${name}_${round}.log" 2>&1) \
            || { tail -30 "$out/graphs_${name}_${round}.log"; exit 1; }
    done
done
python3 - "$out" <<'PY'
import json, statistics, sys
from pathlib import Path

rows = []
for path in sorted(Path(sys.argv[1]).glob("graphs_*_*.json")):
    r = json.loads(path.read_text())["results"]
    row = {"run": path.stem}
    for shape, d in r.get("decode", {}).items():
        row[f"{shape} graphs ms"] = d.get("graphs_on")
        row[f"{shape} eager ms"] = d.get("graphs_off")
    for mode in ("graphs_on", "graphs_off"):
        runs = (r.get("yardstick") or {}).get(mode) or []
        if runs:
            row[f"yardstick {mode} out tok/s (median)"] = statistics.median(run["output_tok_s"] for run in runs)
    rows.append(row)
keys = list(dict.fromkeys(k for row in rows for k in row))
print(" | ".join(keys))
for row in rows:
    print(" | ".join(f"{row[k]:.4g}" if isinstance(row.get(k), float) else str(row.get(k)) for k in keys))
# The guard: per metric and round, how much faster this tree is (other/this for times, this/other
# for throughputs), then the median ratio and its spread over the rounds.
by_run = {row["run"]: row for row in rows}
print("\nthis tree vs the other (>1: this is faster): median [min, max] over rounds")
for key in keys[1:]:
    ratios = []
    for name, row in by_run.items():
        if not name.startswith("graphs_this_"):
            continue
        other = by_run.get(name.replace("graphs_this_", "graphs_other_"), {})
        a, b = row.get(key), other.get(key)
        if isinstance(a, float) and isinstance(b, float) and a > 0 and b > 0:
            ratios.append(b / a if key.endswith(" ms") else a / b)
    if ratios:
        ratios.sort()
        print(f"  {key:45s} {statistics.median(ratios):.3f}x [{ratios[0]:.3f}, {ratios[-1]:.3f}]  ({len(ratios)} rounds)")
PY
