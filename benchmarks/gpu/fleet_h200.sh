#!/usr/bin/env bash
# benchmarks/results/orchestration.md's fleet measurements on the H200 hosts, in steps that each fit one
# 10-minute command (run from the project root there, after stage.sh's bootstrap):
#   bash benchmarks/gpu/fleet_h200.sh decode           # two-GPU host: page-256 decode grid on 2 GPUs and 1, cold then warm
#   bash benchmarks/gpu/fleet_h200.sh prefill          # two-GPU host: the flex_prefill grid, the same way
#   bash benchmarks/gpu/fleet_h200.sh one-prefill      # one GPU: compile processes against workers compiling themselves
#   bash benchmarks/gpu/fleet_h200.sh one-decode       # the same for the decode grid
#   bash benchmarks/gpu/fleet_h200.sh interference     # decode configs timed with compile processes idle / busy
#   bash benchmarks/gpu/fleet_h200.sh ahead-decode     # one GPU, warm caches: loading ahead against runs without it
#   bash benchmarks/gpu/fleet_h200.sh ahead-prefill    # the same for the flex_prefill grid
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
  timeout "$limit" python benchmarks/costs/fleet.py sweeps --out "/tmp/fleet-$name" "$@" 2>&1 | grep '^|' | tee "$OUT/$name.md"
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
  ahead-decode|ahead-prefill)
    grid=${step#ahead-}
    sweep "ahead-$grid" 240 --grids "$grid" --gpus 1   # cold, then warm: the caches the runs below use
    spec=$(python -c "import sys; sys.path.insert(0, 'benchmarks/costs'); import fleet; print(fleet.GRIDS['$grid'])")
    dir=/tmp/fleet-ahead-$grid
    for run in ahead again; do
      extra=(); [ "$run" = ahead ] && extra=(--compile-ahead)
      timeout 200 tunectl submit "$spec" --results "$dir/results-$grid-1-$run" \
        --compile-cache "$dir/cache-$grid-1" "${extra[@]}" > /dev/null 2>&1 || echo "$run: submit failed"
    done
    python benchmarks/costs/fleet.py agree --grid "$grid" --first "$dir/results-$grid-1-warm" \
      --test "$dir/results-$grid-1-ahead" --again "$dir/results-$grid-1-again" | tee "$OUT/ahead-$grid.md"
    (cd /tmp && tar czf "$OUT/ahead-$grid-results.tar.gz" "fleet-ahead-$grid"/results-*)
    ;;
  interference)
    timeout 300 python benchmarks/costs/fleet.py interference --out /tmp/fleet-interference 2>&1 | tee "$OUT/interference.md"
    (cd /tmp && tar czf "$OUT/interference-results.tar.gz" fleet-interference/results-*)
    ;;
esac
