#!/usr/bin/env bash
# Bundles with split rules on one H200, checked at held-out shapes of seeds never used before
# (benchmarks/results/holdout.md). From the project root on the GPU host, after stage.sh's bootstrap;
# each step fits one 10-minute command and resumes its run when called again:
#   bash benchmarks/gpu/holdout_h200.sh build 128   # grid + refinement + probes (rules measured at the probes)
#   bash benchmarks/gpu/holdout_h200.sh build 16
#   bash benchmarks/gpu/holdout_h200.sh check 128   # export, then draw and time held-out shapes per seed
#   bash benchmarks/gpu/holdout_h200.sh check 16
#   bash benchmarks/gpu/holdout_h200.sh write       # holdout.json and holdout.md from the records (no GPU)
#   bash benchmarks/gpu/holdout_h200.sh restore     # the records (seeds 101-118) into $RES instead of building
#   bash benchmarks/gpu/holdout_h200.sh confirm 128 # export with candidates, new seeds, confirmed picks scored
#   bash benchmarks/gpu/holdout_h200.sh keep 128    # confirm once at CONFIRM_BATCHES sizes, every KV cell; save
#   bash benchmarks/gpu/holdout_h200.sh pack NAME   # runs no restored archive holds, into $OUT/NAME.tar.gz
# `confirm` exports the built run again with candidates (version VERSION, default 2), draws CONFIRM_SEEDS (default
# 104 105 106, never used before), times every config there (`tunectl validate --holdout`), then confirms
# the candidates on this GPU as a serving process would at start-up (at those shapes' batch sizes, every
# KV cell of the bundle at its edges, cells cut to CELL_SPAN at most, default 2) and scores what the
# confirmed bundle answers at the held-out shapes against that run's oracle, and times confirming at
# CONFIRM_BATCHES (default 32; 0: not timed) batch sizes over every KV cell: $OUT/confirm-pP.json
# (confirm-pP-spanS.json under another CELL_SPAN); then confirms at the
# held-out shapes themselves, KV lengths included, which no serving process can (an upper bound):
# $OUT/confirm-exact-pP.json (benchmarks/studies/confirm_holdout.py). BUDGET: the seconds confirming may
# take per held-out run (default 120), BATCH_BUDGET at the CONFIRM_BATCHES sizes (default none);
# DRAW_ONLY=1 stops once the seeds are drawn and timed; EXACT=0 leaves out the upper bound.
# `keep` times what a serving image build (or a fleet's first process) pays once: `tunectl bundle confirm`
# of bundle version VERSION at CONFIRM_BATCHES batch sizes spread over its batches, every KV cell at its edges,
# within BATCH_BUDGET seconds (default 540), saved with --save to $OUT/confirmed-pP.json (the picks a
# serving process then applies, tunectl.runtime.apply_confirmed); its console, with the seconds and the
# cells reached, in $OUT/keep-pP.txt.
# The held-out seeds (SEEDS, default 101 102 103; seeds 0-7 were used before) are drawn only by `check`,
# after the bundle is built; SHAPES per seed (default 8). Results accumulate in $RES, outputs in $OUT.
# PROBES (default 2): probes a cell in the tuning spec (benchmarks/studies/table_bound.py plays denser
# probes from the records).
# The tuning spec is configs/h200/flash_decode.toml at one page size, spans batch 1-256 x 1k-32k tokens,
# a grid of 9 batches x 4 lengths, refine_budget 12, 2 probes a cell; flash-attn 2 is left out (it runs
# on a re-paged cache: measured for reference only, it can never be chosen nor be the oracle).
# Device time measured 2026-12-04: build ~3 min a page, check ~2.5 min a page, write ~10 s: ~12 min in all;
# confirm's three new seeds ~3.5 min at page 128 with DRAW_ONLY=1 (5.4 min in a fresh machine's first call,
# restore included); then confirming by cell at them with BUDGET=100 BATCH_BUDGET=110 EXACT=0 6.0 min (2026-12-05);
# with no budgets it does not finish in one 540 s command; restore seconds.
set -uo pipefail
[ -f /tmp/tunectl-site/env.sh ] && source /tmp/tunectl-site/env.sh
python -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "editable install failed"
RES=${RES:-/tmp/holdout-results}
OUT=${OUT:-/tmp/holdout-out}
SEEDS=${SEEDS:-"101 102 103"}
SHAPES=${SHAPES:-8}
PROBES=${PROBES:-2}  # probes a cell; another count names the run (and its bundles) h200-rules-pP-probesN
mkdir -p "$RES" "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader 2>&1 | head -n 1
name_of() {  # the tuning run's name at page $1
  if [ "$PROBES" = 2 ]; then echo "h200-rules-p$1"; else echo "h200-rules-p$1-probes$PROBES"; fi
}
spec_for() {  # the tuning spec of page $1, written to /tmp; its path
  local copy="/tmp/holdout_h200_p$1.toml"
  python - "$1" "$copy" "$PROBES" "$(name_of "$1")" <<'PY'
import re, sys
page, out, probes, name = sys.argv[1:5]
text = open("configs/h200/flash_decode.toml").read()
text = re.sub(r"(?m)^name = .*$", f'name = "{name}"', text)
text = re.sub(r"(?m)^page_size = .*$", f"page_size = {page}", text)
text = text.replace("[shapes.batch]\nvalues = [1, 4, 16, 64, 256]",
                    "[shapes.batch]\nrange = [1, 256]\nvalues = [1, 2, 4, 8, 16, 32, 64, 128, 256]")
text = text.replace("[shapes.kv_len]\nvalues = [1024, 8192, 32768]",
                    f"[shapes.kv_len]\nrange = [1024, 32768]\nstep = {page}\nvalues = [1024, 4096, 16384, 32768]")
text = re.sub(r"(?m)^\[\[configs\]\]\nbackend = \"fa2\"\n(?:[a-z_]+ = .*\n)*\n", "", text)
text = text.replace('strategy = "halving"', f'strategy = "halving"\nrefine_budget = 12\nprobes = {probes}')
open(out, "w").write(text)
PY
  echo "$copy"
}
run_of() {  # the newest run named $1 of kind $2 whose state is finished (==) or not (!=) $3
  tunectl runs --results "$RES" --json 2>/dev/null | python -c "
import json, sys
text = sys.stdin.read()
runs = [r for r in (json.loads(text) if text.strip() else []) if r['name'] == '$1' and r['kind'] == '$2'
        and (r['state'] == 'finished') == ('$3' == '==')]
print(sorted(runs, key=lambda r: r['created_at'])[-1]['run_id'] if runs else '')"
}
page=${2:-}
name=$(name_of "$page")
case "${1:?step}" in
  build)
    spec=$(spec_for "${page:?page}")
    [ -n "$(run_of "$name" tune ==)" ] && { echo "$name is built"; exit 0; }
    unfinished=$(run_of "$name" tune !=)
    if [ -n "$unfinished" ]; then args=(--resume "$unfinished"); else args=("$spec"); fi
    started=$(date +%s)
    timeout -k 15 "${BUILD_TIMEOUT:-560}" tunectl submit "${args[@]}" --results "$RES" --yes > /tmp/build.log 2>&1
    [ $? -eq 124 ] && { echo "stopped at the limit: run this step again to resume"; ray stop --force > /dev/null 2>&1; }
    n=$(ls "$OUT"/console-build-p"$page"-*.txt 2>/dev/null | wc -l)
    cp /tmp/build.log "$OUT/console-build-p$page-$n.txt"  # the whole console of this submit (or resume)
    echo "submit ${args[*]}: $(( $(date +%s) - started )) s, console $(wc -l < /tmp/build.log) lines" \
      | tee -a "$OUT/build-p$page-walls.txt"
    grep -v '^[│┃┏┡└]' /tmp/build.log | tail -n 8 | tee "$OUT/build-p$page.txt"
    ;;
  check)
    spec=$(spec_for "${page:?page}")
    run=$(run_of "$name" tune ==)
    [ -n "$run" ] || { echo "$name is not built yet: run the build step"; exit 1; }
    [ -d "$RES/bundles/$name/1" ] || tunectl export bundle --results "$RES" --run "$run" --name "$name" \
      --version 1 --out "$RES/bundles" 2>&1 | tail -n 3 | tee "$OUT/export-p$page.txt"
    for seed in $SEEDS; do  # drawn now, after the bundle was built
      grep -q "^$page $seed " "$RES/holdout-runs.txt" 2>/dev/null && continue
      timeout -k 15 "${CHECK_TIMEOUT:-280}" tunectl validate "$RES/bundles/$name/1" --spec "$spec" \
        --holdout "$SHAPES" --seed "$seed" --results "$RES" > /tmp/check.log 2>&1
      held=$(grep -o 'held-out shapes of .* (run r[0-9a-f-]*)' /tmp/check.log | grep -o 'r[0-9]\{8\}-[0-9a-f-]*' | tail -n 1)
      grep -v '^\(compile process\|flash_decode:\)' /tmp/check.log | tail -n 16 > "$OUT/holdout-p$page-seed$seed.txt"
      [ -n "$held" ] && echo "$page $seed $RES/bundles/$name/1 $held" >> "$RES/holdout-runs.txt"
      [ -n "$held" ] || { echo "seed $seed not finished: run this step again"; ray stop --force > /dev/null 2>&1; exit 1; }
    done
    cat "$RES/holdout-runs.txt"
    ;;
  restore)
    archives=(holdout_h200_2026-12-04.tar.gz holdout_h200_2026-12-04b.tar.gz holdout_h200_2026-12-04c.tar.gz
      holdout_h200_2026-12-04d.tar.gz holdout_h200_2026-12-04e.tar.gz holdout_h200_2026-12-05.tar.gz
      holdout_h200_2026-12-05b.tar.gz holdout_h200_2026-12-05c.tar.gz holdout_h200_2026-12-05d.tar.gz)
    for a in "${archives[@]}"; do tar xzf "benchmarks/results/$a" -C "$(dirname "$RES")"; done
    for a in "${archives[@]}"; do  # each archive holds the list as it stood: their lines together
      tar xzOf "benchmarks/results/$a" holdout-results/confirm-runs.txt 2>/dev/null
    done | sort -u -k1,1n -k2,2n > "$RES/confirm-runs.txt"
    ls "$RES/_runs" | wc -l
    ;;
  pack)  # what in $RES no archive of `restore` holds (runs, confirm-* folders), the lists, bundles: $OUT/$2.tar.gz
    ls benchmarks/results/holdout_h200_*.tar.gz | xargs -n 1 tar tzf > /tmp/archived-paths.txt
    sed -n 's|^holdout-results/_runs/\(.*\)\.json$|\1|p' /tmp/archived-paths.txt | sort -u > /tmp/archived-runs.txt
    new=$(ls "$RES/_runs" | sed -n 's/\.json$//p' | sort | comm -23 - /tmp/archived-runs.txt)
    paths=()
    for r in $new; do paths+=("_runs/$r.json" "_runs/$r.log" "task=flash_decode/run_id=$r"); done
    for d in "$RES"/confirm-*/; do  # a session's confirming outputs, where no archive holds them yet
      d=$(basename "$d"); grep -q "^holdout-results/$d/" /tmp/archived-paths.txt || paths+=("$d")
    done
    (cd "$RES" && ls -d "${paths[@]}" confirm-runs.txt holdout-runs.txt bundles 2>/dev/null) \
      | sed 's|^|holdout-results/|' > /tmp/pack-list.txt
    tar czf "$OUT/${2:?name}.tar.gz" -C "$(dirname "$RES")" -T /tmp/pack-list.txt
    echo "packed $(echo $new | wc -w) new run(s): $OUT/$2.tar.gz"
    ;;
  confirm)
    spec=$(spec_for "${page:?page}")
    run=$(run_of "$name" tune ==)
    [ -n "$run" ] || { echo "$name is not built yet: run the build (or restore) step"; exit 1; }
    version=${VERSION:-2}  # the restored records hold version 2, exported with 3 candidates an entry
    bundle="$RES/bundles/$name/$version"
    [ -d "$bundle" ] || tunectl export bundle --results "$RES" --run "$run" --name "$name" --version "$version" \
      --out "$RES/bundles" 2>&1 | tail -n 3 | tee "$OUT/export-p$page-v$version.txt"
    args=()
    for seed in ${CONFIRM_SEEDS:-104 105 106}; do  # drawn now, after the bundle was exported
      held=$(grep "^$page $seed $bundle " "$RES/confirm-runs.txt" 2>/dev/null | cut -d' ' -f4)
      if [ -z "$held" ]; then
        timeout -k 15 "${CHECK_TIMEOUT:-280}" tunectl validate "$bundle" --spec "$spec" --holdout "$SHAPES" \
          --seed "$seed" --results "$RES" > /tmp/check.log 2>&1
        held=$(grep -o 'held-out shapes of .* (run r[0-9a-f-]*)' /tmp/check.log | grep -o 'r[0-9]\{8\}-[0-9a-f-]*' | tail -n 1)
        [ -n "$held" ] || { echo "seed $seed not finished: run this step again"; ray stop --force > /dev/null 2>&1; exit 1; }
        echo "$page $seed $bundle $held" >> "$RES/confirm-runs.txt"
      fi
      args+=(--holdout "$page:$seed=$bundle:$held")
    done
    [ "${DRAW_ONLY:-0}" = 1 ] && exit 0
    # as a serving process can: at the held-out batch sizes, every KV cell at its edges (the lengths
    # to come are unknown at start-up); then at the held-out shapes themselves, the upper bound
    span=${CELL_SPAN:-2}  # another span's scores go beside the default's: confirm-pP-spanS.json
    out="$OUT/confirm-p$page$([ "$span" = 2 ] || echo "-span$span").json"
    python benchmarks/studies/confirm_holdout.py --results "$RES" "${args[@]}" --json "$out" \
      --time-batches "${CONFIRM_BATCHES:-32}" --cell-span "$span" --budget-s "${BUDGET:-120}" \
      --batch-budget-s "${BATCH_BUDGET:-1e9}"
    [ "${EXACT:-1}" = 1 ] || exit 0
    python benchmarks/studies/confirm_holdout.py --results "$RES" "${args[@]}" --by-cell '' \
      --json "$OUT/confirm-exact-p$page.json"
    ;;
  keep)
    bundle="$RES/bundles/$name/${VERSION:-2}"
    [ -d "$bundle" ] || { echo "no bundle $bundle: run the confirm (or restore) step"; exit 1; }
    batches=$(PYTHONPATH=benchmarks/studies python -c "import sys; from tunectl import api; from confirm_holdout \
import batch_sizes; print(','.join(map(str, batch_sizes(api.read_bundle(sys.argv[1]), 'flash_decode', int(sys.argv[2])))))" \
      "$bundle" "${CONFIRM_BATCHES:-32}")  # the sizes confirm_holdout.py --time-batches times
    started=$(date +%s)
    tunectl bundle confirm "$bundle" --task flash_decode --shape "batch=$batches" --shape q_len=1 \
      --budget-s "${BATCH_BUDGET:-540}" --save "$OUT/confirmed-p$page.json" --all > "$OUT/keep-p$page.txt" 2>&1
    echo "rc $?, $(( $(date +%s) - started )) s in all" >> "$OUT/keep-p$page.txt"
    tail -n 3 "$OUT/keep-p$page.txt"
    ;;
  write)
    args=()
    while read -r p s bundle held; do args+=(--holdout "$p:$s=$bundle:$held"); done < "$RES/holdout-runs.txt"
    sed -n '/^#   bash/p' "$0" | sed 's/^#   //; s/  *#.*$//' > "$OUT/commands.txt"
    echo "SEEDS=\"$SEEDS\" SHAPES=$SHAPES" >> "$OUT/commands.txt"
    python benchmarks/studies/holdout_json.py --results "$RES" "${args[@]}" --commands "$OUT/commands.txt" \
      --json benchmarks/results/holdout.json --markdown benchmarks/results/holdout.md
    cp benchmarks/results/holdout.json benchmarks/results/holdout.md "$OUT/"
    (cd "$(dirname "$RES")" && tar czf "$OUT/holdout-results.tar.gz" "$(basename "$RES")")
    ;;
esac
