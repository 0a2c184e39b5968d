#!/usr/bin/env bash
# Compare two source trees of minisgl on one GPU, interleaved in one run: one benchmark once per
# tree and round, alternating which tree goes first, then the regression guard's summary.
#
#   bash benchmarks/compare_trees.sh OTHER_TREE OUT_DIR [ROUNDS] [graphs|moe|http|steps] [extra flags...]
#
# graphs (the default): `python -m benchmarks graphs`, bs=1 decode of the Qwen3-0.6B and
# Llama-3.1-8B shapes (CUDA graphs on and off) and the offline yardstick (every feature on).
# moe: `python -m benchmarks moe --decode --skip-layer` (unless other flags are given), bs=1
# decode of the Qwen3-30B-A3B shape (~61 GB).
# http: `python -m benchmarks http`, the server (its own processes, from the same tree) against
# the offline engine on one burst of 128 requests, streamed and not.
# steps: `python -m benchmarks steps` (the Qwen3-0.6B shape unless other flags are given), the offline
# yardstick step by step against its own bound, with a profiled 256-row decode step's kernels.
#
# OTHER_TREE is a folder holding another commit's `minisgl/` package, e.g. made with
#   mkdir -p .bench-trees/old && git archive COMMIT minisgl | tar -x -C .bench-trees/old \
#       && echo COMMIT > .bench-trees/old/COMMIT
# (.bench-trees/ is git-ignored; carry it to the GPU machine with the working tree). Both trees
# are measured by this tree's benchmarks/ (only `minisgl` comes from OTHER_TREE; the rest of
# PYTHONPATH, e.g. the GPU kit's, is kept). Each run writes OUT_DIR/<bench>_{this,other}_<round>.json;
# `python -m benchmarks guard OUT_DIR --out OUT_DIR/guard.json` then prints a table of the figures
# and each metric's ratio (this tree's speed over the other's) as the median and the range over
# the rounds, and writes them as a results file. Use it before and after every engine change.
set -euo pipefail
other="$(cd "$1" && pwd)"
out="$2"
rounds="${3:-1}"
shift $(( $# < 3 ? $# : 3 ))
bench="graphs"
if [[ $# -gt 0 && ( "$1" == "graphs" || "$1" == "moe" || "$1" == "http" || "$1" == "steps" ) ]]; then bench="$1"; shift; fi
if [[ "$bench" == "moe" && $# -eq 0 ]]; then set -- --decode --skip-layer; fi
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
        (cd "$tree" && MINISGL_COMMIT="$commit" PYTHONPATH="$tree:$here${PYTHONPATH:+:$PYTHONPATH}" python3 -m benchmarks "$bench" \
            --out "$out/${bench}_${name}_${round}.json" "$@" > "$out/${bench}_${name}_${round}.log" 2>&1) \
            || { tail -30 "$out/${bench}_${name}_${round}.log"; exit 1; }
    done
done
python3 -m benchmarks guard "$out" --out "$out/guard.json"
