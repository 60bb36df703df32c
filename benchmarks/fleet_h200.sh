#!/usr/bin/env bash
# benchmarks/results/orchestration.md's fleet measurements on the H200 hosts, in steps that each fit one
# 10-minute command (run from the project root there, after stage.sh's bootstrap):
#   bash benchmarks/fleet_h200.sh decode           # two-GPU host: page-256 decode grid on 2 GPUs and 1, cold then warm
#   bash benchmarks/fleet_h200.sh prefill          # two-GPU host: the flex_prefill grid, the same way
#   bash benchmarks/fleet_h200.sh one-prefill      # one GPU: compile processes against workers compiling themselves
#   bash benchmarks/fleet_h200.sh one-decode       # the same for the decode grid
#   bash benchmarks/fleet_h200.sh interference     # decode configs timed with compile processes idle / busy
# Each step leaves its tables, its JSON and its results datasets (without the caches) in $OUT.
set -uo pipefail
source /tmp/tunectl-site/env.sh
export PYTHONPATH="$PWD:${PYTHONPATH:-}"
OUT=${OUT:-/tmp/fleet-out}
mkdir -p "$OUT"
step=${1:?step}
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader 2>&1 | head -n 4
sweep() {  # name, limit seconds, fleet.py sweeps arguments...
  local name=$1 limit=$2
  shift 2
  timeout "$limit" python benchmarks/fleet.py sweeps --out "/tmp/fleet-$name" "$@" 2>&1 | grep '^|' | tee "$OUT/$name.md"
  cp "/tmp/fleet-$name/sweeps.json" "$OUT/$name.json"
  (cd /tmp && tar czf "$OUT/$name-results.tar.gz" fleet-"$name"/results-*)
}
case "$step" in
  decode|prefill) sweep "$step" 540 --grids "$step" --gpus 2 1 ;;
  one-decode|one-prefill)
    grid=${step#one-}
    sweep "now-$grid" 240 --grids "$grid" --gpus 1
    sweep "before-$grid" 300 --grids "$grid" --gpus 1 --compile-workers 0
    ;;
  interference)
    timeout 300 python benchmarks/fleet.py interference --out /tmp/fleet-interference 2>&1 | tee "$OUT/interference.md"
    (cd /tmp && tar czf "$OUT/interference-results.tar.gz" fleet-interference/results-*)
    ;;
esac
