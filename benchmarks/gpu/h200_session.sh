#!/usr/bin/env bash
# The H200 measurements behind benchmarks/results/h200_decisions.md (and the grids search_replay.md
# replays), in steps that each fit one 10-minute command on the GPU host (run from the project root
# there, packages staged as benchmarks/results/h200.md says). Results accumulate in $RES; each step
# copies them to $OUT. A session's runs are committed as a file of their own, never into an earlier
# archive (benchmarks/results/DATA.md).
#   bash benchmarks/gpu/h200_session.sh 1   # the exhaustive grids (decode, prefill), first time
#   bash benchmarks/gpu/h200_session.sh 2   # the same specs again: reproducibility
#   bash benchmarks/gpu/h200_session.sh 3   # successive halving (the model-based sampler it also ran is retired)
#   bash benchmarks/gpu/h200_session.sh 4   # export, and stacked validation against the defaults
#   bash benchmarks/gpu/h200_session.sh 5   # as 4, on a fresh host: results from results.tar.gz, page 128
set -uo pipefail
source /tmp/tunectl-site/env.sh
export PYTHONPATH="$PWD:${PYTHONPATH:-}"
RES=${RES:-/tmp/h200-results}
if [ ! -d "$RES" ] && [ -f "${RESULTS_TAR:-}" ]; then tar xzf "$RESULTS_TAR" -C "$(dirname "$RES")"; fi
mkdir -p "$RES"
tunectl() { python -m tunectl "$@"; }
submit() {  # seconds, spec, [search table lines...]
  local limit=$1 spec=$2
  shift 2
  if [ $# -gt 0 ]; then
    local copy="/tmp/$(basename "$spec" .toml)-$1.toml"
    { cat "$spec"; printf '\n[search]\n'; printf '%s\n' "${@:2}"; } > "$copy"
    spec=$copy
  fi
  echo "== submit $spec"
  timeout "$limit" python -m tunectl submit "$spec" --results "$RES" 2>&1 | grep -v '^[│┃┏┡└]' | tail -n 8
}
first_run() {  # the first finished grid run of a spec name
  python - "$RES" "$1" <<'PY'
import json, sys, pathlib
runs = [json.loads(p.read_text()) for p in pathlib.Path(sys.argv[1], "_runs").glob("*.json")]
runs = [r for r in runs if r["name"] == sys.argv[2] and r["state"] == "finished" and "strategy" not in r["spec_text"]]
print(sorted(runs, key=lambda r: r["created_at"])[0]["run_id"])
PY
}
case "${1:?step}" in
  1|2)
    submit 330 configs/h200/flash_decode.toml
    submit 230 configs/h200/flex_prefill.toml
    ;;
  3)
    submit 170 configs/h200/flash_decode.toml halving 'strategy = "halving"'
    submit 120 configs/h200/flex_prefill.toml halving 'strategy = "halving"'
    ;;
  4)
    decode=$(first_run h200-flash-decode)
    prefill=$(first_run h200-flex-prefill)
    echo "== export --validate decode run $decode"
    timeout 290 python -m tunectl export bundle --results "$RES" --run "$decode" --name h200-decode \
      --version 1 --out "$RES/bundles" --validate --layers 36 --rounds 6 2>&1 | tail -n 60
    echo "== export prefill run $prefill, then validate"
    tunectl export bundle --results "$RES" --run "$prefill" --name h200-prefill --version 1 \
      --out "$RES/bundles" 2>&1 | tail -n 2
    timeout 110 python -m tunectl validate "$RES/bundles/h200-prefill/1" --spec configs/h200/flex_prefill.toml \
      --layers 12 --rounds 4 --results "$RES" 2>&1 | tail -n 30
    ;;
  5)
    decode=$(first_run h200-flash-decode)
    prefill=$(first_run h200-flex-prefill)
    tunectl export bundle --results "$RES" --run "$decode" --name h200-decode --version 1 \
      --out "$RES/bundles" 2>&1 | tail -n 2
    tunectl export bundle --results "$RES" --run "$prefill" --name h200-prefill --version 1 \
      --out "$RES/bundles" 2>&1 | tail -n 2
    sed 's/^page_size = \[16, 128\]/page_size = 128/' configs/h200/flash_decode.toml > /tmp/decode-page128.toml
    timeout 170 python -m tunectl validate "$RES/bundles/h200-decode/1" --spec /tmp/decode-page128.toml \
      --layers 36 --rounds 6 --results "$RES" 2>&1 | tail -n 40
    timeout 80 python -m tunectl validate "$RES/bundles/h200-prefill/1" --spec configs/h200/flex_prefill.toml \
      --layers 12 --rounds 4 --results "$RES" 2>&1 | tail -n 30
    ;;
esac
tunectl runs --results "$RES" 2>&1 | tail -n 30
tar czf "${OUT:-/tmp}/h200-results.tar.gz" -C "$(dirname "$RES")" "$(basename "$RES")"
