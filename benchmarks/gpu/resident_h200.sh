#!/usr/bin/env bash
# The shipped decode spec (configs/h200/flash_decode.toml) on resident workers: a Ray head on this host,
# `tunectl workers up` once (its wall timed), then RUNS submits that join the cluster, each timed whole
# (wall-after-residentN.txt, res-after-residentN, submit-after-residentN.log in $W), then `workers down`.
# The compile cache is throughput_h200.sh's ($W/cache-after), so run its cold and warm runs first, on the
# same machine, for the plain figures beside these (SUBMIT_ARGS: more submit options; TAG names those runs):
#   ENGINES=after bash benchmarks/gpu/throughput_h200.sh . cold warm && bash benchmarks/gpu/resident_h200.sh 2
set -uo pipefail
source /tmp/tunectl-site/env.sh
python -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "editable install failed"
W=${W:-/tmp/tp}
RUNS=${1:-2}
cache="$W/cache-after"
export RAY_USAGE_STATS_ENABLED=0 COLUMNS=160
mkdir -p "$W"
# Ray's command line, where its script is not on PATH (the staged site installs the package only)
command -v ray > /dev/null || ray() { python -c 'import sys; from ray.scripts.scripts import main; sys.argv[0] = "ray"; main()' "$@"; }
seconds_since() { python -c "import sys; print(round($(date +%s.%N) - $1, 1))"; }
ray start --head --include-dashboard=false > "$W/ray-start.log" 2>&1 || { tail -n 5 "$W/ray-start.log"; exit 1; }
start=$(date +%s.%N)
python -m tunectl workers up configs/h200/flash_decode.toml --address auto --compile-cache "$cache" > "$W/workers-up.log" 2>&1
echo "workers up: rc $?, $(seconds_since "$start") s" | tee "$W/wall-workers-up.txt"
cat "$W/workers-up.log"
for i in $(seq 1 "$RUNS"); do
  rm -rf "$W/res-after-resident$i${TAG:-}"
  start=$(date +%s.%N)
  timeout -k 15 "${LIMIT:-420}" python -m tunectl submit configs/h200/flash_decode.toml --address auto \
    --results "$W/res-after-resident$i${TAG:-}" --compile-cache "$cache" --yes ${SUBMIT_ARGS:-} \
    > "$W/submit-after-resident$i${TAG:-}.log" 2>&1
  rc=$?
  seconds_since "$start" > "$W/wall-after-resident$i${TAG:-}.txt"
  echo "after resident$i${TAG:-}: rc $rc, $(cat "$W/wall-after-resident$i${TAG:-}.txt") s"
  grep -v '^[│┃┏┡└]' "$W/submit-after-resident$i${TAG:-}.log" | tail -n 4
  # how many compile processes it started, and the kernels its workers' cache settled (kept)
  cat "$W/res-after-resident$i${TAG:-}"/_runs/*.json 2>/dev/null | python -c "import json, sys
c = json.load(sys.stdin).get('compile', {}); print({k: c.get(k) for k in ('compile_processes', 'built', 'kept', 'keys')})"
done
python -m tunectl workers list --address auto
python -m tunectl workers down --address auto
ray stop --force > /dev/null 2>&1
