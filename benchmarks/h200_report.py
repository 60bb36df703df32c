"""Turn H200 tuning results into benchmarks/results/h200.md: winners, speedups, bandwidth, how to redo it.

    PYTHONPATH=. python benchmarks/h200_report.py --results RESULTS_DIR [--out benchmarks/results/h200.md]

Winners are the ones ``tunectl export bundle`` publishes (tunectl.select). For flash_decode every
backend's untuned call is in the spec (tasks.flash_decode.BACKEND_DEFAULTS), so each winner is
compared with each backend's default; achieved bandwidth is the task's bytes_moved over the median,
against the ~4.3 TB/s device-to-device copy roof measured on the same machine.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tasks.flash_decode import BACKEND_DEFAULTS
from tasks.flex_prefill import flops
from tunectl.export import winners_in
from tunectl.keys import key_dict, key_from_text, key_text, make_key
from tunectl.results import read_results
from tunectl.select import Winner

ROOF_TBPS = 4.3
DECODE_BACKENDS = ("fa4", "sdpa", "flex")  # the backends that run on the cache's own pages here
REPAGED = "fa2"  # needs 256-token pages: measured on a re-paged copy, for reference only
REPRODUCE = """\
```bash
# on the H200 host (Python 3.12, torch 2.11 + CUDA 13): ray 2.60, flash-attn-4 4.0.0b36 with
# nvidia-cutlass-dsl 4.8.1, and flash-attn 2.8.3 built from source for SM90 (FLASH_ATTN_CUDA_ARCHS=90)
# importable; then, from the project root:
export PYTHONPATH=$PWD:$PYTHONPATH
python -m pytest -m gpu tests/test_gpu_harness.py tests/test_gpu_kernels.py -s      # ~2 min smoke
python -m tunectl submit configs/h200/flash_decode.toml --results RESULTS --no-compile-ahead  # ~3 min
python -m tunectl submit configs/h200/flash_decode_page256.toml --results RESULTS        # ~1.5 min
python -m tunectl submit configs/h200/flex_prefill.toml --results RESULTS --no-compile-ahead  # ~2 min
python -m tunectl export bundle --name h200-attention --version 2 --results RESULTS --out bundles
python benchmarks/h200_report.py --results RESULTS --out benchmarks/results/h200.md
```
Serving side: `tunectl.runtime.load_bundle("bundles/h200-attention/2").lookup("flash_decode",
causal=True, dtype="bfloat16", head_dim=128, num_kv_heads=8, num_q_heads=32, page_size=128,
sinks=False, softcap=0.0, window=None, batch=1, kv_len=30000, q_len=1)` gives
`{'backend': 'flex', 'num_stages': 3}` (batch and kv_len bucket up to the next tuned point)."""
NOTES = """\
How it was measured:
- decode: each config is captured into a CUDA graph after a warm-up and timed by replays with CUDA
  events, one call per replay, the L2 flushed (a 2x-L2 write) before each replay, a short spin kernel
  queued ahead of the start event so the host's launch latency stays out; prefill: eager calls, same
  flush and spin. Samples until the p20-p80 half-width is within 1 % of the median (at least 10, at
  most 400 / 200 samples or 0.25 s / 0.5 s); the median is reported, p20-p80 beside it.
- every config's output was checked against a float32 reference before it was timed (bf16 tolerance).
- winners are what `tunectl export bundle` publishes: a non-default config wins only by beating the
  task's default (flash-attn-4 untuned) by more than the measured noise of both.
- bandwidth is the bytes a kernel must move (K/V it may attend to, Q, O, the page table) over the
  median. The ~4.3 TB/s roof is a device-to-device copy (reads + writes); a read-only stream such as
  decode can pass it slightly (HBM3e peaks at 4.8 TB/s), which is why a few points show > 100 %.
- measurements run with `--no-compile-ahead`: with the next config prepared in a background thread
  while the current one was timed, the background work (a flash-attn-4 compile holding the
  interpreter lock, block-mask and probe kernels on the device) stretched a few timed calls up to
  1000x in a first run; preparation is now host-only (kernels are built on their first call), and
  these numbers come from a run without it.

Caveats:
- fa2 (flash-attn 2 `flash_attn_with_kvcache`) pages must hold a multiple of 256 tokens; at page
  sizes 16 and 128 it ran on a copy of the same cache re-paged into 256-token pages
  (`kv_page_size=256` in its config). A server with 16- or 128-token pages cannot call it as it
  is, so it never wins there (`FlashDecode.selectable`); its best time is shown for reference: where
  the winner takes longer, a server free to choose its page size would gain by 256-token pages.
  The page-256 grid (`configs/h200/flash_decode_page256.toml`, run on a two-GPU H200 host) is where
  fa2 runs on the cache as it is, and competes.
- SDPA has no paged path: its time includes gathering the pages into contiguous K/V on every call.
- Flex runs over the page pool in place (one block per page); at 2^21 pooled tokens (64 x 32768,
  256 x 8192) Inductor's flex-decoding Triton kernel failed to compile (recorded as `error`).
- flash-attn-4 4.0.0b36 has no split-KV on SM90: `num_splits=0` (its heuristic) is rejected
  wherever the heuristic asks for more than one split, which is why fa4 is 2-8x off the best at
  batch 1-4 from 8k tokens, where fa2's split-KV and Flex's SPLIT_KV win.
- not run: flash-attn 3 and sgl-kernel (no FA3 kernels on this image; sgl-kernel 0.3.21 needs
  torch 2.9 / CUDA 12); their adapters are checked for argument mapping on CPU only.

The results (Parquet) and the bundle they were exported to are in benchmarks/results/h200_results.tar.gz.
"""


def describe(config: Mapping[str, Any]) -> str:
    """A config in a table cell: the backend, then its options."""
    config = dict(config)
    head = config.pop("backend", None)
    rest = ", ".join(f"{k}={_short(v)}" for k, v in sorted(config.items()))
    if head is None:
        return rest or "default (no options)"
    return f"{head} ({rest})" if rest else str(head)


def _short(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _by_point(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], dict[str, Mapping[str, Any]]]:
    points: dict[tuple[str, str], dict[str, Mapping[str, Any]]] = defaultdict(dict)
    for row in rows:
        points[(row["static_key"], row["shape_key"])][row["config_key"]] = row
    return points


def _ok_median(row: Mapping[str, Any] | None) -> float | None:
    return row["median_us"] if row is not None and row["status"] == "ok" else None


def _ratio(slow: float | None, fast: float) -> str:
    return f"{slow / fast:.2f}x" if slow else "—"


def _geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def decode_section(rows: list[dict[str, Any]], winners: list[Winner]) -> list[str]:
    points = _by_point(rows)
    ratios: dict[str, list[float]] = defaultdict(list)
    winners_by_static: dict[str, list[Winner]] = defaultdict(list)
    for w in winners:
        winners_by_static[key_text(w.static)].append(w)
    lines: list[str] = []
    for static_text, group in winners_by_static.items():
        page = key_dict(key_from_text(static_text))["page_size"]
        lines += [
            f"### page_size {page}",
            "",
            "| batch x kv_len | winner | median µs (p20–p80) | TB/s | % roof | vs fa4 default | "
            "vs SDPA default | vs Flex default | best fa4 / SDPA / Flex µs | "
            "reference: best fa2 on 256-token pages, µs (winner's time over it) |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        lines += [_decode_row(w, points[(static_text, key_text(w.shape))], page, ratios) for w in group]
        lines.append("")
    lines += ["Geometric mean over all points:", ""]
    for backend in DECODE_BACKENDS:
        g, b = _geomean(ratios[backend]), _geomean(ratios[f"best {backend}"])
        lines.append(
            f"- winner vs {backend}'s untuned default: "
            + (f"**{g:.2f}x** faster" if g else "no default measured")
            + (f"; the best {backend} config per shape takes {b:.2f}x the winner's time" if b else "")
        )
    g = _geomean(ratios[REPAGED])
    if g:
        lines.append(
            f"- reference: the winner takes {g:.2f}x the time of the best fa2 call on a cache re-paged "
            "into 256-token pages (where the cache has 256-token pages, that call is itself a candidate)"
        )
    return [*lines, ""]


def _decode_row(
    w: Winner, by_config: Mapping[str, Mapping[str, Any]], page: int, ratios: dict[str, list[float]]
) -> str:
    """One shape: the winner, its bandwidth, its speedup over each backend's default, the bests."""
    defaults = {b: by_config.get(key_text(make_key(BACKEND_DEFAULTS[b]))) for b in DECODE_BACKENDS}
    tbps = by_config[key_text(w.config)]["bytes_moved"] / (w.median_us * 1e-6) / 1e12
    cells, bests = [], []
    for backend in DECODE_BACKENDS:
        base = _ok_median(defaults[backend])
        cells.append(_ratio(base, w.median_us))
        if base:
            ratios[backend].append(base / w.median_us)
        meds = [
            r["median_us"]
            for r in by_config.values()
            if r["status"] == "ok" and json.loads(r["config_key"]).get("backend") == backend
        ]
        bests.append(f"{min(meds):.0f}" if meds else "—")
        if meds:
            ratios[f"best {backend}"].append(min(meds) / w.median_us)
    repaged = [
        r["median_us"]
        for r in by_config.values()
        if r["status"] == "ok" and json.loads(r["config_key"]).get("backend") == REPAGED
    ]
    own = "—"
    if repaged:
        own = f"{min(repaged):.1f} ({w.median_us / min(repaged):.2f}x)"
        ratios[REPAGED].append(w.median_us / min(repaged))
    shape = key_dict(w.shape)
    return (
        f"| {shape['batch']} x {shape['kv_len']} | {describe(key_dict(w.config))} | "
        f"{w.median_us:.1f} ({w.p20_us:.1f}–{w.p80_us:.1f}) | {tbps:.2f} | {100 * tbps / ROOF_TBPS:.0f} % | "
        f"{' | '.join(cells)} | {' / '.join(bests)} | {own} |"
    )


def prefill_section(rows: list[dict[str, Any]], winners: list[Winner]) -> list[str]:
    points = _by_point(rows)
    lines = [
        "| mask | batch x seq_len | default µs | winner | winner µs | speedup | TFLOP/s (winner) | "
        "options measured (ok / failed) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for w in winners:
        static, shape = key_dict(w.static), key_dict(w.shape)
        group = points[(key_text(w.static), key_text(w.shape))]
        failed = sum(r["status"] != "ok" for r in group.values())
        tflops = flops(static, shape) / (w.median_us * 1e-6) / 1e12
        mask = static["mask"] + (
            f" ({static['num_docs']} docs)" if static["mask"] == "document_causal" else ""
        )
        mask += f" (window {static['window'][0]})" if static["mask"] == "sliding_window" else ""
        default = f"{w.default_median_us:.1f}" if w.default_median_us else "—"
        speedup = f"{w.speedup:.2f}x" if w.speedup else "—"
        lines.append(
            f"| {mask} | {shape['batch']} x {shape['seq_len']} | {default} | "
            f"{describe(key_dict(w.config))} | "
            f"{w.median_us:.1f} | {speedup} | {tflops:.0f} | {len(group) - failed} / {failed} |"
        )
    lines.append("")
    return lines


def failures_section(rows: list[dict[str, Any]]) -> list[str]:
    counts: Counter[tuple[str, str, str, str]] = Counter()
    for row in rows:
        if row["status"] != "ok":
            message = (row["message"] or "").splitlines()[0][:140] if row["message"] else ""
            counts[(row["task"], describe(json.loads(row["config_key"])), row["status"], message)] += 1
    if not counts:
        return ["Every measured config ran and matched the reference.", ""]
    lines = ["| task | config | status | points | first line of the message |", "|---|---|---|---|---|"]
    for (task, config, status, message), n in sorted(counts.items()):
        lines.append(f"| {task} | {config} | {status} | {n} | {message.replace('|', '/')} |")
    return [*lines, ""]


def environment_section(rows: list[dict[str, Any]]) -> list[str]:
    env = json.loads(rows[0]["env_json"]) if rows else {}
    clocks = [r["sm_clock_mhz"] for r in rows if r.get("sm_clock_mhz")]
    temps = [r["temperature_c"] for r in rows if r.get("temperature_c")]
    throttled = sum(bool(r.get("throttled")) for r in rows if r["status"] == "ok")
    lines = [
        f"- device: {env.get('device_name')} (SM {env.get('compute_capability')}, "
        f"{env.get('sm_count')} SMs), driver {env.get('driver')}, CUDA {env.get('cuda')}",
        f"- packages: {', '.join(f'{k} {v}' for k, v in sorted(env.get('packages', {}).items()))}",
    ]
    if clocks:
        lines.append(
            f"- SM clock after each measurement {min(clocks):.0f}–{max(clocks):.0f} MHz, temperature "
            f"{min(temps):.0f}–{max(temps):.0f} °C; {throttled} of {sum(r['status'] == 'ok' for r in rows)} "
            "measurements flagged throttled (NVML slowdown reasons or violation counters)"
        )
    return [*lines, ""]


def render(results: Path) -> str:
    rows = [r.to_row() for r in read_results(results)]
    winners = winners_in(results)
    out = ["# H200 attention tuning", ""]
    out += environment_section(rows)
    out += [NOTES]
    for task, section in (("flash_decode", decode_section), ("flex_prefill", prefill_section)):
        task_rows = [r for r in rows if r["task"] == task]
        if not task_rows:
            continue
        modes = sorted({f"{r['measure_mode']}, L2 {r['l2']}" for r in task_rows if r["status"] == "ok"})
        runs = sorted({r["run_id"] for r in task_rows})
        out += [f"## {task}", "", f"Runs {', '.join(runs)}; timed as {'; '.join(modes)}.", ""]
        out += section(task_rows, [w for w in winners if w.task == task])
    out += ["## Configs that did not run", "", *failures_section(rows)]
    out += ["## Reproduce", "", REPRODUCE, ""]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    text = render(args.results)
    if args.out is None:
        print(text)
    else:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
