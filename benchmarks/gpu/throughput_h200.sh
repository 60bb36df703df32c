#!/usr/bin/env bash
# The shipped decode spec (configs/h200/flash_decode.toml) on one H200 under two measuring engines, back to
# back: the tree at OLD_TREE (before) and this one (after), each with an empty compile cache (cold), then
# again with the cache its cold run left (warm). Runs land in $W/res-ENGINE-CACHES, wall seconds beside
# them; benchmarks/gpu/throughput.py compare reads them. Run from the project root on the GPU host after
# stage.sh's bootstrap (flashinfer-python==0.7.2.post1 and nvidia-cudnn-frontend staged).
#   bash benchmarks/gpu/throughput_h200.sh OLD_TREE [cold|warm|profile ...]
# "profile" is a warm run whose workers profile their calls (TUNECTL_PROFILE): $W/prof-ENGINE/*.pstats, read
# by `python benchmarks/costs/item_cost.py --stats DIR` (its wall is not comparable: cProfile slows calls).
# ENGINES="after" runs one engine only; SHARED_CACHE=1 gives both engines one compile cache (they build the
# same kernels), so one cold run leaves both warm. TAG names the runs apart (res-ENGINE-CACHES$TAG), as for
# runs under another allocator setting, which the workers take from this environment:
#   TAG=-expandable PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True ENGINES=after bash ... . warm
set -uo pipefail
source /tmp/tunectl-site/env.sh
# Entry points (tasks by name) come from an install; which tree's code runs is PYTHONPATH's choice.
python -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "editable install failed"
OLD=$(cd "${1:?old tree}" && pwd); shift
W=${W:-/tmp/tp}
NEW=$(pwd)
mkdir -p "$W"
[ $# -gt 0 ] || set -- cold warm
for caches in "$@"; do
  for engine in ${ENGINES:-before after}; do
    root=$([ "$engine" = before ] && echo "$OLD" || echo "$NEW")
    cache="$W/cache-$([ -n "${SHARED_CACHE:-}" ] && echo shared || echo "$engine")"
    [ "$caches" = cold ] && rm -rf "$cache"
    rm -rf "$W/res-$engine-$caches${TAG:-}"
    start=$(date +%s.%N)
    profile=$([ "$caches" = profile ] && echo "$W/prof-$engine" || echo "")
    (cd "$root" && TUNECTL_PROFILE="$profile" PYTHONPATH="$root:$PYTHONPATH" RAY_USAGE_STATS_ENABLED=0 COLUMNS=160 timeout -k 15 "${LIMIT:-420}" \
      python -m tunectl submit configs/h200/flash_decode.toml --results "$W/res-$engine-$caches${TAG:-}" \
      --compile-cache "$cache" --yes > "$W/submit-$engine-$caches${TAG:-}.log" 2>&1)
    rc=$?
    python -c "import sys; print(round($(date +%s.%N) - $start, 1))" > "$W/wall-$engine-$caches${TAG:-}.txt"
    echo "$engine $caches${TAG:-}: rc $rc, $(cat "$W/wall-$engine-$caches${TAG:-}.txt") s; $(cd "$root" && python -c "import tunectl; print(tunectl.__file__)")"
    grep -v '^[│┃┏┡└]' "$W/submit-$engine-$caches${TAG:-}.log" | tail -n 4
    ray stop --force > /dev/null 2>&1
  done
done
