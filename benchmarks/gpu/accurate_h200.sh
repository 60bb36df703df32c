#!/usr/bin/env bash
# The accurate page-128 decode bundle (benchmarks/gpu/accurate_p128.toml: a dense grid, refinement, then
# probes) in one `tunectl submit` on one H200, timed end to end; the recorded runs of the same spec took
# three steps under the earlier engine (benchmarks/results/throughput.md). From the project root on the
# GPU host, after stage.sh's bootstrap (flashinfer-python==0.7.2.post1 and nvidia-cudnn-frontend staged):
#   bash benchmarks/gpu/accurate_h200.sh build cold   # an empty compile cache ($W/cache emptied first)
#   bash benchmarks/gpu/accurate_h200.sh build warm   # again, into a fresh results folder, the cache kept
# A build stopped at its limit (LIMIT, default 540 s) resumes when called again with the same caches
# word; each call's wall is appended to $W/walls-CACHES.txt, and the results are packed into $OUT.
# ARGS adds options to the submit (e.g. ARGS="--compile-workers 7"). SKIP_DOMINATED sets the spec's
# [search] skip_dominated (0: every first look taken, as before looks not taken; use another W for it).
# RESIDENT=1: a Ray head on this host and `tunectl workers up` for the spec first (its wall timed apart,
# in $W/wall-workers-up-CACHES.txt), the submit joining it, then `workers down`: the build's wall without
# the worker's start-up, as a cluster with resident workers runs it (e.g. RESIDENT=1 W=/tmp/accurate-r
# after `build cold` into that W, or with ARGS="--compile-workers 0" on a warm cache).
# Then, on any machine (no GPU), the bundles of both runs and of the recorded three-step runs, scored at
# the recorded held-out seeds 1-7 (holdout_h200.md), from the archives:
#   ARCHIVE=benchmarks/results/accurate_h200_2026-12-04.tar.gz bash benchmarks/gpu/accurate_h200.sh score
set -uo pipefail
[ -f /tmp/tunectl-site/env.sh ] && source /tmp/tunectl-site/env.sh
[ "${1:-}" = score ] || python -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "editable install failed"
W=${W:-/tmp/accurate}
OUT=${OUT:-/tmp/accurate-out}
SPEC=${SPEC:-benchmarks/gpu/accurate_p128.toml}  # another spec: a quick rehearsal of the steps (e.g. the CPU quickstart)
mkdir -p "$W" "$OUT"
if [ -n "${SKIP_DOMINATED:-}" ]; then
  sed "s/^strategy = \"halving\"$/&\nskip_dominated = $SKIP_DOMINATED/" "$SPEC" > "$W/accurate_p128.toml"
  SPEC="$W/accurate_p128.toml"
fi
[ "${1:-}" = score ] || nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader 2>&1 | head -n 1
unfinished() {  # the run of $1 that has not finished, if any
  tunectl runs --results "$1" --json 2>/dev/null | python -c "
import json, sys
text = sys.stdin.read()
print(next((r['run_id'] for r in (json.loads(text) if text.strip() else []) if r['state'] != 'finished'), ''))"
}
case "${1:?step}" in
  build)
    caches=${2:?cold or warm}
    res="$W/res-$caches"
    run=$([ -d "$res" ] && unfinished "$res")
    if [ -n "$run" ]; then args=(--resume "$run"); else
      [ -d "$res" ] && { echo "$res holds a finished run"; exit 0; }
      [ "$caches" = cold ] && rm -rf "$W/cache"
      args=("$SPEC")
    fi
    address=()
    if [ -n "${RESIDENT:-}" ]; then
      command -v ray > /dev/null || ray() { python -c 'import sys; from ray.scripts.scripts import main; sys.argv[0] = "ray"; main()' "$@"; }
      ray start --head --include-dashboard=false > "$W/ray-start-$caches.log" 2>&1 || { tail -n 5 "$W/ray-start-$caches.log"; exit 1; }
      up=$(date +%s.%N)
      RAY_USAGE_STATS_ENABLED=0 tunectl workers up "$SPEC" --address auto --compile-cache "$W/cache" > "$W/workers-up-$caches.log" 2>&1
      echo "workers up: rc $?, $(python -c "print(round($(date +%s.%N) - $up, 1))") s" | tee -a "$W/wall-workers-up-$caches.txt"
      address=(--address auto)
    fi
    start=$(date +%s.%N)
    # --foreground: the limit's SIGTERM goes to tunectl alone, which stops its run (cancelled) and Ray in
    # seconds; sent to the whole process group it also stops Ray's own processes under the driver,
    # whose shutdown then waits on them for longer than the 15 s before the SIGKILL.
    RAY_USAGE_STATS_ENABLED=0 COLUMNS=160 timeout --foreground -k 15 "${LIMIT:-540}" tunectl submit "${args[@]}" ${ARGS:-} \
      --results "$res" --compile-cache "$W/cache" --yes "${address[@]}" > "$W/submit-$caches.log" 2>&1
    rc=$?
    wall=$(python -c "print(round($(date +%s.%N) - $start, 1))")
    if [ -n "${RESIDENT:-}" ]; then
      tunectl workers down --address auto --force > /dev/null 2>&1
      ray stop --force > /dev/null 2>&1
    fi
    echo "${args[*]}: rc $rc, $wall s" | tee -a "$W/walls-$caches.txt"
    [ $rc -eq 124 ] || [ $rc -eq 137 ] && { echo "stopped at the limit: run this step again to resume"; ray stop --force > /dev/null 2>&1; }
    n=$(ls "$W"/console-"$caches"-*.txt 2>/dev/null | wc -l)
    cp "$W/submit-$caches.log" "$W/console-$caches-$n.txt"
    grep -v '^[│┃┏┡└]' "$W/submit-$caches.log" | tail -n 8
    (cd "$(dirname "$W")" && tar czf "$OUT/accurate-results.tar.gz" --exclude=cache "$(basename "$W")")
    ;;
  score)
    [ -d /tmp/res2 ] || { git show 45ad4e3:benchmarks/results/h200_results.tar.gz > /tmp/h200_results.tar.gz \
      && tar xzf /tmp/h200_results.tar.gz -C /tmp; }
    [ -n "${ARCHIVE:-}" ] && tar xzf "$ARCHIVE" -C "$(dirname "$W")"
    bundles=/tmp/accurate-bundles
    rm -rf "$bundles"
    tunectl export bundle --results /tmp/res2 --run r20261202-191150-e17cb1 --run r20261203-050725-e7cd09 \
      --name recorded --version 1 --out "$bundles" | tail -n 1
    for caches in cold warm; do
      run=$(tunectl runs --results "$W/res-$caches" --json | python -c "import json, sys; print(json.load(sys.stdin)[0]['run_id'])")
      tunectl export bundle --results "$W/res-$caches" --run "$run" --name "$caches" --version 1 --out "$bundles" | tail -n 1
    done
    args=()
    for seed_run in 1:r20261203-000300-a1a324 2:r20261203-000721-6b2bf8 3:r20261203-012133-8b0f32 \
        4:r20261203-012604-f39932 5:r20261203-014839-a89e73 6:r20261203-052032-7e0f67 7:r20261203-052436-0262ea; do
      for b in recorded cold warm; do args+=(--holdout "$b@s${seed_run%%:*}=$bundles/$b/1:${seed_run#*:}"); done
    done
    PYTHONPATH=.:${PYTHONPATH:-} python benchmarks/studies/holdout_table.py --results /tmp/res2 "${args[@]}" --pool --common \
      | tail -n 12
    ;;
esac
