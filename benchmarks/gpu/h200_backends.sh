#!/usr/bin/env bash
# The H200 measurements behind benchmarks/results/h200.md (decode backends at page 16 and 128),
# timing.md (samplers) and lightllm.md, in steps that each fit one 10-minute command on the GPU host
# (run from the project root there, after stage.sh's bootstrap with flashinfer-python==0.7.2.post1 and
# nvidia-cudnn-frontend staged). Results accumulate in $RES; each step leaves its output in $OUT. A session's
# runs are committed as a file of their own, never into an earlier archive (benchmarks/results/DATA.md).
#   bash benchmarks/gpu/h200_backends.sh smoke       # GPU tests of the backends, the samplers side by side
#   bash benchmarks/gpu/h200_backends.sh drift       # the drift guard against an induced load
#   bash benchmarks/gpu/h200_backends.sh grid 16     # the decode grid at one page size (16, then 128)
#   bash benchmarks/gpu/h200_backends.sh holdout 128 # export, then random untuned shapes measured
#     (HOLDOUT_SEED=s: other shapes; NAME=bundle: a bundle already in $RES/bundles; HOLDOUT_STEP=128:
#     lengths on whole pages only)
#   bash benchmarks/gpu/h200_backends.sh odd 128     # every config, item by item, at a length off the page
#   bash benchmarks/gpu/h200_backends.sh refined 128 # the grid with refinement (again to resume), then holdout
#     (REFINE_BUDGET points, 16; REFINE_SHORTLIST=k: refined points measure their neighbours' k fastest)
#   bash benchmarks/gpu/h200_backends.sh dense 128   # a dense grid (16 batches x 6 lengths), then holdout
#     (REFINE_BUDGET=n: refined from the dense grid, n points at most)
#   bash benchmarks/gpu/h200_backends.sh probe 128   # a finished grid's cells probed inside their regions,
#     then exported with the probes (RUN: the grid, default the newest finished dense grid of the page;
#     PER_CELL, SHORTLIST: tunectl probe's options; PROBE_RESUME=RUN_ID finishes a stopped probe run)
#   bash benchmarks/gpu/h200_backends.sh memory      # device memory of compile processes' builds, alone
#     (benchmarks/gpu/compile_memory.py) and in a page-16 run at large points, polled per process
#   bash benchmarks/gpu/h200_backends.sh tables      # h200.md and lightllm.md from everything in $RES
# VALIDATE_TIMEOUT bounds a holdout check; VALIDATE_RESUME=RUN_ID finishes one that a limit stopped.
# DEADLINE (epoch seconds) bounds the refined and dense steps' tuning and every check together instead.
set -uo pipefail
source /tmp/tunectl-site/env.sh
python -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "editable install failed"
RES=${RES:-/tmp/h200-results}
OUT=${OUT:-/tmp/h200-out}
mkdir -p "$RES" "$OUT"
SPEC=configs/h200/flash_decode.toml
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader 2>&1 | head -n 2
page_spec() {  # the decode spec at one page size
  local copy="/tmp/flash_decode_page$1.toml"
  sed -E "s/^page_size = \[[0-9, ]+\]/page_size = $1/" "$SPEC" > "$copy"
  echo "$copy"
}
spans() {  # declare the spans serving meets in a decode spec copy: batch 1-256, 1k-32k tokens
  sed -i -E 's/^\[shapes.batch\]$/[shapes.batch]\nrange = [1, 256]/; s/^\[shapes.kv_len\]$/[shapes.kv_len]\nrange = [1024, 32768]/' "$1"
}
save() { (cd "$(dirname "$RES")" && tar czf "$OUT/h200-results.tar.gz" "$(basename "$RES")"); }
submit() {  # tunectl submit within $1 seconds; its output to a file, not a pipe: a submit stopped at the
  # limit can leave Ray processes holding a pipe open (a 60 s wait for a dead GCS), so they are stopped.
  # Every process's device memory is polled each second meanwhile (memory_peaks prints the peaks).
  local limit=$1 poller; shift
  ( while sleep 1; do nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits \
      | while IFS=', ' read -r pid mib; do echo "$(date +%s) $mib $(ps -o args= -p "$pid" | cut -c1-40)"; done
    done ) >> "$OUT/memory-poll.txt" 2>/dev/null &
  poller=$!
  timeout -k 15 "$limit" tunectl submit "$@" --results "$RES" --yes > /tmp/submit.log 2>&1
  [ $? -eq 124 ] && { echo "submit stopped at ${limit} s"; ray stop --force > /dev/null 2>&1; }
  kill "$poller"
  grep -v '^[│┃┏┡└]' /tmp/submit.log | tail -n 12
  memory_peaks
}
memory_peaks() {  # the most device memory each kind of process held in the polls so far
  [ -s "$OUT/memory-poll.txt" ] || return 0
  python - "$OUT/memory-poll.txt" <<'PY'
import collections, sys
most = collections.defaultdict(int)
for line in open(sys.argv[1]):
    _, mib, *name = line.split()
    most[" ".join(name)] = max(most[" ".join(name)], int(mib))
print("device memory, most held:", "; ".join(f"{name} {mib / 1024:.1f} GiB" for name, mib in
      sorted(most.items(), key=lambda kv: -kv[1])[:5]))
PY
}
left() {  # seconds a step may take: $1, or what is left before DEADLINE where one is set
  if [ -n "${DEADLINE:-}" ]; then echo $(( DEADLINE - $(date +%s) > 1 ? DEADLINE - $(date +%s) : 1 )); else echo "$1"; fi
}
finished_run() {  # the newest tuning run named $1 whose state is (==) or is not (!=) finished, if any
  tunectl runs --results "$RES" --json 2>/dev/null | python -c "
import json, sys
text = sys.stdin.read()
runs = [r for r in (json.loads(text) if text.strip() else []) if (r['state'] == 'finished') == ('$2' == '==') and r['name'] == '$1' and r['kind'] == 'tune']
print(sorted(runs, key=lambda r: r['created_at'])[-1]['run_id'] if runs else '')"
}
tune_step() {  # the tuning run named $1 (spec $2) resumed, or started, within $3 seconds; none once finished
  [ -n "$(finished_run "$1" "==")" ] && return
  local unfinished
  unfinished=$(finished_run "$1" "!=")
  if [ -n "$unfinished" ]; then submit "$3" --resume "$unfinished"; else submit "$3" "$2"; fi
}
check_bundle() {  # run $2 exported as bundle $1 (unless $RES/bundles holds it already), timed at 24
  # held-out shapes of page $3 (seed HOLDOUT_SEED, 0 unless set: the same shapes for every bundle of
  # the page), within VALIDATE_TIMEOUT or what is left before DEADLINE
  local name=$1 run=$2 seed=${HOLDOUT_SEED:-0} holdout
  holdout=$(page_spec "$3")
  spans "$holdout"  # held-out shapes are drawn inside the spans serving meets: batch 1-256, 1k-32k
  sed -i -E 's/^strategy = "halving"$/strategy = "halving"\nrefine_budget = 0/' "$holdout"
  # HOLDOUT_STEP=n: lengths drawn on multiples of n (the page: no ragged last page), else any length
  [ -n "${HOLDOUT_STEP:-}" ] && sed -i -E "s/^(range = \[1024, 32768\])$/\1\nstep = $HOLDOUT_STEP/" "$holdout"
  [ -d "$RES/bundles/$name/1" ] ||
    tunectl export bundle --results "$RES" --run "$run" --name "$name" --version 1 --out "$RES/bundles" 2>&1 | tail -n 3
  timeout -k 15 "$(left "${VALIDATE_TIMEOUT:-480}")" tunectl validate "$RES/bundles/$name/1" --spec "$holdout" \
    --holdout 24 --seed "$seed" ${VALIDATE_RESUME:+--resume "$VALIDATE_RESUME"} --results "$RES" 2>&1 \
    | grep -v '^\(compile process\|flash_decode:\|\"num_q_heads\|supported on\)' | tail -n 80 | tee "$OUT/holdout-$name-seed$seed${HOLDOUT_STEP:+-step$HOLDOUT_STEP}.txt"
  save
}
tune_then_check() {  # tune_step $1 $2 $3, then check_bundle once the run finished (page $4)
  tune_step "$1" "$2" "$3"
  local run
  run=$(finished_run "$1" "==")
  save
  [ -n "$run" ] || { echo "$1 not finished: run this step again to resume it"; return 0; }
  check_bundle "$1" "$run" "$4"
}
case "${1:?step}" in
  smoke)
    timeout 300 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_gpu_kernels.py \
      tests/gpu/test_gpu_sampler_methods.py tests/gpu/test_gpu_harness.py tests/gpu/test_gpu_comparisons.py 2>&1 | tail -n 25 | tee "$OUT/gpu-tests.txt"
    timeout 200 python benchmarks/gpu/sampler_methods.py 2>&1 | tail -n 60 | tee "$OUT/sampler_methods.md"
    ;;
  drift)
    timeout 280 python benchmarks/gpu/drift_demo.py --out /tmp/drift-demo 2>&1 | tail -n 50 | tee "$OUT/drift_demo.md"
    ;;
  grid)
    spec=$(page_spec "${2:?page}")
    echo "== submit $spec"
    submit 560 "$spec"
    save
    ;;
  holdout)
    # The grid's bundle as tuned (RUN, else the newest finished decode grid), checked at 24 shapes;
    # NAME: another bundle's name (one in $RES/bundles is checked as it is, exported elsewhere).
    page=${2:?page}
    check_bundle "${NAME:-h200-decode-p$page}" "${RUN:-$(finished_run h200-flash-decode "==")}" "$page"
    ;;
  refined)
    # The "after" of the held-out table: the same grid with the spans declared and refinement on
    # (REFINE_BUDGET extra points per static key), resumed by the next call when it outlasts one;
    # once finished, its bundle is checked at the same 24 held-out shapes as the holdout step's.
    page=${2:?page}
    spec=$(page_spec "$page")
    spans "$spec"
    name="h200-decode-refined-p$page${REFINE_SHORTLIST:+-short$REFINE_SHORTLIST}"
    sed -i -E "s/^name = .*/name = \"$name\"/; s/^(range = \[1024, 32768\])$/\1\nstep = $page/; s/^strategy = \"halving\"$/strategy = \"halving\"\nrefine_budget = ${REFINE_BUDGET:-16}\nrefine_shortlist = ${REFINE_SHORTLIST:-0}/" "$spec"
    tune_then_check "$name" "$spec" "$(left "${REFINE_TIMEOUT:-540}")" "$page"
    ;;
  dense)
    # The "after" measured everywhere instead of refined: 16 batch values (1-256, each at most twice
    # the one below) x 6 lengths (1k-32k, ratio 2); with REFINE_BUDGET set, refined from there (named
    # ...-dense-refined-...); resumed by the next call when it outlasts one; then checked at the
    # holdout step's 24 shapes.
    page=${2:?page}
    spec=$(page_spec "$page")
    spans "$spec"
    name="h200-decode-dense${REFINE_BUDGET:+-refined}-p$page"
    sed -i -E "s/^name = .*/name = \"$name\"/; s/^values = \[1, 4, 16, 64, 256\]/values = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256]/; s/^values = \[1024, 8192, 32768\]/values = [1024, 2048, 4096, 8192, 16384, 32768]/; s/^(range = \[1024, 32768\])$/\1\nstep = $page/; s/^strategy = \"halving\"$/strategy = \"halving\"\nrefine_budget = ${REFINE_BUDGET:-0}/" "$spec"
    tune_then_check "$name" "$spec" "$(left "${DENSE_TIMEOUT:-540}")" "$page"
    ;;
  probe)
    # Bundle $NAME (default h200-decode-dense-probed-p$page) exported from the grid and its probes;
    # the holdout step then checks it (NAME=... RUN=- HOLDOUT_SEED=s bash ... holdout $page).
    page=${2:?page}
    run=${RUN:-$(finished_run "h200-decode-dense-p$page" "==")}
    timeout -k 15 "$(left "${PROBE_TIMEOUT:-540}")" tunectl probe "$run" --per-cell "${PER_CELL:-2}" \
      --shortlist "${SHORTLIST:-4}" ${PROBE_RESUME:+--resume "$PROBE_RESUME"} --results "$RES" > /tmp/probe.log 2>&1
    [ $? -eq 124 ] && { echo "probe stopped by its limit"; ray stop --force > /dev/null 2>&1; }
    grep -v '^\(compile process\|flash_decode:\|"num_q_heads\|supported on\)' /tmp/probe.log | tail -n 8 | tee "$OUT/probe-$run.txt"
    probe_run=$(grep -o 'probe run r[0-9a-f-]*' /tmp/probe.log | tail -n 1 | cut -d' ' -f3)
    [ -n "$probe_run" ] && tunectl export bundle --results "$RES" --run "$run" --run "$probe_run" \
      --name "${NAME:-h200-decode-dense-probed-p$page}" --version 1 --out "$RES/bundles" 2>&1 | tail -n 3
    save
    ;;
  odd)
    # Every config of the grid at one point whose length is not a whole number of pages (as held-out
    # shapes are), one item each, so a config that kills its worker is named by its own crash row.
    spec=$(page_spec "${2:?page}")
    sed -i -E 's/^name = .*/name = "h200-odd-shapes"/; s/^values = \[1, 4, 16, 64, 256\]/values = [14]/; s/^values = \[1024, 8192, 32768\]/values = [1452]/; s/^strategy = "halving"$/strategy = "grid"/' "$spec"
    submit "${ODD_TIMEOUT:-280}" "$spec"
    tunectl failures --results "$RES" --json > "$OUT/odd-p$2.json"
    python -c "import json, sys
for f in json.load(open(sys.argv[1])): print(f['status'], f['config_key'], (f.get('message') or '')[:160])" \
      "$OUT/odd-p$2.json" | grep -v '^invalid' | tee "$OUT/odd-p$2.txt"
    save
    ;;
  memory)
    # Builds one after another at growing points, as one compile process makes them; then a real run
    # at the large page-16 points (every process's device memory polled each second, as in each submit).
    timeout 150 python benchmarks/gpu/compile_memory.py --page 16 --out "$OUT/compile-mem" \
      --points 16x16384,32x16384,64x16384,96x16384,128x16384 --configs '[{"backend": "flex"}]' 2>&1 | grep '^{'
    spec=$(page_spec 16)
    sed -i -E 's/^name = .*/name = "h200-memory-p16"/; s/^values = \[1, 4, 16, 64, 256\]/values = [32, 64, 96, 128]/; s/^values = \[1024, 8192, 32768\]/values = [8192, 16384]/' "$spec"
    submit "$(left 300)" "$spec"
    tunectl failures --results "$RES" --json | python -c "import json, sys, collections
print(collections.Counter((f['status'], (f.get('message') or '')[:60]) for f in json.load(sys.stdin)).most_common(8))"
    save
    ;;
  tables)
    python benchmarks/studies/h200_report.py --results "$RES" --out "$OUT/h200.md"
    save
    ;;
esac
