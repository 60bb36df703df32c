#!/usr/bin/env bash
# benchmarks/results/orchestration.md's fleet measurements on the two-GPU H200 host, in steps that each
# fit one 10-minute command (run from the project root there, after stage.sh's bootstrap):
#   bash benchmarks/fleet_h200.sh decode         # page-256 decode grid: 2 GPUs and 1, cold caches then warm
#   bash benchmarks/fleet_h200.sh prefill        # the flex_prefill grid, the same way
#   bash benchmarks/fleet_h200.sh interference   # decode configs timed with compile processes idle / busy
# Each step leaves its table, its JSON and its results datasets (without the caches) in $OUT.
set -uo pipefail
source /tmp/tunectl-site/env.sh
export PYTHONPATH="$PWD:${PYTHONPATH:-}"
OUT=${OUT:-/tmp/fleet-out}
mkdir -p "$OUT"
step=${1:?step}
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader 2>&1 | head -n 4
case "$step" in
  decode|prefill)
    python benchmarks/fleet.py sweeps --out "/tmp/fleet-$step" --grids "$step" 2>&1 | tee "$OUT/$step.md"
    cp "/tmp/fleet-$step/sweeps.json" "$OUT/$step.json"
    (cd /tmp && tar czf "$OUT/$step-results.tar.gz" fleet-$step/results-*)
    ;;
  interference)
    python benchmarks/fleet.py interference --out /tmp/fleet-interference 2>&1 | tee "$OUT/interference.md"
    (cd /tmp && tar czf "$OUT/interference-results.tar.gz" fleet-interference/results-*)
    ;;
esac
