"""Turn H200 tuning results into benchmarks/results/h200.md: winners, speedups, bandwidth, how to redo it.

    PYTHONPATH=. python benchmarks/studies/h200_report.py --results RESULTS_DIR \
        [--out benchmarks/results/h200.md]

Winners are the ones ``tunectl export bundle`` publishes (tunectl.decide.select). For flash_decode every
backend's untuned call is in the spec (tunectl.tasks.flash_decode.BACKEND_DEFAULTS), so each winner is
compared with each backend's default; achieved bandwidth is the task's bytes_moved over the median,
against the ~4.3 TB/s device-to-device copy roof measured on the same machine.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.studies.h200_archive import require
from tunectl.core.keys import key_dict, key_from_text, key_text, make_key
from tunectl.decide.select import Winner
from tunectl.formats.export import winners_in
from tunectl.store.results import read_results
from tunectl.tasks.flash_decode import BACKEND_DEFAULTS
from tunectl.tasks.flex_prefill import flops

ROOF_TBPS = 4.3
DECODE_BACKENDS = ("fa4", "fa3", "flashinfer", "triton", "sdpa", "flex")  # run on the cache's own pages
ROOF_SLACK_US = 20.0
MIN_ROOF_US = 30.0
REPAGED = "fa2"  # needs 256-token pages: measured on a re-paged copy, for reference only
REPRODUCE = """\
```bash
# on the H200 host (Python 3.12, torch 2.11 + CUDA 13), with ray 2.60, flash-attn-4 4.0.0b36 and the
# CUTLASS DSL 4.8.1, flash-attn 2.8.3 and flash-attn 3 built for SM90, FlashInfer 0.7.2.post1 with the
# cuDNN frontend importable; then, from the project root:
bash benchmarks/gpu/h200_backends.sh smoke        # pytest -m gpu (kernels, samplers); samplers side by side
bash benchmarks/gpu/h200_backends.sh grid 16      # configs/h200/flash_decode.toml at page 16 (~4 min)
bash benchmarks/gpu/h200_backends.sh grid 128     # the same at page 128
bash benchmarks/gpu/h200_backends.sh drift        # the drift guard under an induced load
# earlier runs kept in the same dataset: configs/h200/flash_decode_page256.toml (two-GPU host) and
# configs/h200/flex_prefill.toml, both timed by the replay method
python benchmarks/studies/h200_report.py --results RESULTS --before r20261129-225108-137a41 \\
  --out benchmarks/results/h200.md
```
Serving side: `tunectl.runtime.load_bundle(BUNDLE).lookup("flash_decode", causal=True,
dtype="bfloat16", head_dim=128, num_kv_heads=8, num_q_heads=32, page_size=128, sinks=False,
softcap=0.0, window=None, batch=4, kv_len=30000, q_len=1)` gives the entry tuned at 4 x 32768
(batch and kv_len bucket up to the next tuned point)."""
NOTES = """\
How it was measured:
- decode, pages 16 and 128 (runs of 2026-12-01): each config is captured into CUDA graphs and timed
  by the difference method (`measure.timing = "difference"`, tunectl/measure/difference.py): one graph of
  K x (L2 flush, call) against one graph of the K flushes alone, replayed in alternating order, a
  sample being the difference over K; the flush reads a buffer twice the L2. No per-sample launch or
  event cost is left in a sample (the replay method, one call per replay, read 2-7 µs high: see
  benchmarks/results/timing.md). Searched by successive halving (every config gets a short look at
  every point, the better half a longer one, then each point's best are timed against the default
  in interleaved rounds). Kernels were built by the compile processes; the drift guard timed its
  reference after every measurement.
- decode, page 256, and prefill (runs of 2026-11-29): the replay method: one call per graph replay
  (decode) or eager call (prefill) between CUDA events, the L2 written over before each sample, a
  spin kernel ahead of the start event. Each table names the method of its run, and selection never
  compares rows of different methods.
- samples until the p20-p80 half-width is within 1 % of the median (at least 10, at most 400
  samples or 0.25 s per config); the median is reported, p20-p80 beside it.
- every config's output was checked against a float32 reference before it was timed (bf16 tolerance).
- winners are what `tunectl export bundle` publishes: a non-default config wins only by beating the
  task's default (flash-attn-4 untuned) by more than the measured noise of both.
- bandwidth is the bytes a kernel must move (K/V it may attend to, Q, O, the page table) over the
  median. The ~4.3 TB/s roof is a device-to-device copy (reads + writes); a read-only stream such as
  decode can pass it slightly (HBM3e peaks at 4.8 TB/s), which is why a few points show > 100 %.
  "near roof": within 1.6x of the roof time, or within it + 20 µs (the fixed cost per call of a
  split-KV decode at small sizes), at points whose roof is at least 30 µs.

Caveats:
- fa2 (flash-attn 2 `flash_attn_with_kvcache`) pages must hold a multiple of 256 tokens; at page
  sizes 16 and 128 it runs on a copy of the same cache re-paged into 256-token pages
  (`kv_page_size=256`), for reference only (`FlashDecode.selectable`). In the 2026-12-01 runs its
  42 items per page were the last in the queue and the GPU worker died on each of them without a
  trace (every other backend had run in that process; run alone, fa2 ran): they have no rows, and
  the reference column is empty there. Not yet understood; the page-256 grid is where fa2 competes.
- FlashInfer's `fixed_split_size` is left out of the grid: with its CUDA-graph plan
  (`use_cuda_graph=True`, buffers sized for the batch) a fixed split larger than the plan's buffers
  is refused ("PrefillSplitQOKVIndptr ... new batch size") at these shapes.
- SDPA has no paged path: its time includes gathering the pages into contiguous K/V on every call.
- At page 128, 1 x 32768, FlashInfer's tensor-core path read 41.5 µs in its single measurements (two
  halving rungs, tight) but 28.7 µs in the finals (p20 24.6, 7 % noise), below the copy roof; the
  winner is the same either way (flash-attn 3's best read 43 µs), but that final's time is suspect.
  Not understood yet; FlashInfer launches its kernels with programmatic dependent launch on SM90,
  which lets a kernel start before the one ahead of it (here the L2 flush) has finished.
- Flex runs over the page pool in place (one block per page); at 2^21 pooled tokens (64 x 32768,
  256 x 8192) Inductor's flex-decoding Triton kernel fails to compile (`compile_error`).
- flash-attn-4 4.0.0b36 has no split-KV on SM90: `num_splits=0` (its heuristic) is rejected
  wherever the heuristic asks for more than one split, which is why fa4 is 3-12x off the best at
  batch 1-4 from 8k tokens, where split-KV kernels (FlashInfer, flash-attn 3, the Triton kernel) win.
- sgl-kernel does not run on this image (0.3.21 needs torch 2.9 / CUDA 12): its adapter is checked for
  argument mapping on CPU only; flash-attn 3 is the same kernel family and runs here.

The results (Parquet, every run above) are in `h200_results.tar.gz`, kept in git history:
DATA.md says how to restore it.
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
    """Per (static, shape), each config's fullest single measurement among ``rows`` (``newest_rows``):
    a successive-halving screen stands in only where the config was not measured in full; finals are
    not singles."""
    points: dict[tuple[str, str], dict[str, Mapping[str, Any]]] = defaultdict(dict)
    for row in rows:
        if row.get("phase", "measure") not in ("measure", "screen"):
            continue
        point = (row["static_key"], row["shape_key"])
        held = points[point].get(row["config_key"])
        if held is None or _fidelity(row) > _fidelity(held):
            points[point][row["config_key"]] = row
    return points


def _fidelity(row: Mapping[str, Any]) -> tuple[int, int, float]:
    ok = row["status"] == "ok"
    return (int(ok), int(row.get("phase") == "measure"), float(row.get("num_samples") or 0))


def _ok_median(row: Mapping[str, Any] | None) -> float | None:
    return row["median_us"] if row is not None and row["status"] == "ok" else None


def _ratio(slow: float | None, fast: float) -> str:
    return f"{slow / fast:.2f}x" if slow else "—"


def _geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def roof_us(bytes_moved: float) -> float:
    return bytes_moved / (ROOF_TBPS * 1e12) * 1e6


def near_roof(median_us: float, roof: float) -> bool:
    """The decode target: within 1.6x of the roof, or within the roof + 20 µs (a split-KV kernel's
    fixed cost per call at small sizes is 16-21 µs on an H200)."""
    return median_us <= 1.6 * roof or median_us <= roof + ROOF_SLACK_US


def decode_section(rows: list[dict[str, Any]], winners: list[Winner]) -> list[str]:
    points = _by_point(rows)
    ratios: dict[str, list[float]] = defaultdict(list)
    winners_by_static: dict[str, list[Winner]] = defaultdict(list)
    for w in winners:
        winners_by_static[key_text(w.static)].append(w)
    lines: list[str] = []
    targets: list[bool] = []
    misses: list[str] = []
    for static_text, group in winners_by_static.items():
        page = key_dict(key_from_text(static_text))["page_size"]
        first = points[(static_text, key_text(group[0].shape))]
        timing = sorted({f"{r['measure_mode']}, L2 {r['l2']}, {r.get('timing') or 'replay'} timing"
                         for r in first.values() if r["status"] == "ok"})  # fmt: skip
        backends = [b for b in DECODE_BACKENDS if any(_backend(r) == b for p in group
                    for r in points[(static_text, key_text(p.shape))].values())]  # fmt: skip
        lines += [
            f"### page_size {page}",
            "",
            f"Run {', '.join(sorted({w.run_id for w in group}))}; timed as {'; '.join(timing)}.",
            "",
            "| batch x kv_len | winner | median µs (p20–p80) | TB/s | % roof | roof µs | near roof | "
            + " | ".join(f"vs {b} default" for b in backends)
            + f" | best {' / '.join(backends)} µs | "
            "reference: best fa2 on 256-token pages, µs (winner's time over it) |",
            "|---|---|---|---|---|---|---|" + "---|" * len(backends) + "---|---|",
        ]
        for w in group:
            row, met = _decode_row(w, points[(static_text, key_text(w.shape))], backends, ratios)
            lines.append(row)
            if met is not None:
                targets.append(met)
            if met is False:
                shape = key_dict(w.shape)
                misses.append(f"page {page} {shape['batch']} x {shape['kv_len']} ({w.run_id})")
        lines.append("")
    lines += [
        f"Near the roof (within 1.6x of it, or within it + {ROOF_SLACK_US:.0f} µs) at {sum(targets)} of "
        f"{len(targets)} points whose roof is at least {MIN_ROOF_US:.0f} µs"
        + (f"; not at {', '.join(misses)}." if misses else "."),
        "",
        "Geometric mean over all points:",
        "",
    ]
    for backend in DECODE_BACKENDS:
        g, b = _geomean(ratios[backend]), _geomean(ratios[f"best {backend}"])
        if g is None and b is None:
            continue
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


def _backend(row: Mapping[str, Any]) -> Any:
    return json.loads(row["config_key"]).get("backend")


def _decode_row(
    w: Winner, by_config: Mapping[str, Mapping[str, Any]], backends: list[str], ratios: dict[str, list[float]]
) -> tuple[str, bool | None]:
    """One shape: the winner, its bandwidth, its speedup over each backend's default, the bests; and
    whether it meets the near-roof target (None where the roof is under MIN_ROOF_US)."""
    defaults = {b: by_config.get(key_text(make_key(BACKEND_DEFAULTS[b]))) for b in backends}
    moved = by_config[key_text(w.config)]["bytes_moved"]
    tbps = moved / (w.median_us * 1e-6) / 1e12
    roof = roof_us(moved)
    met = near_roof(w.median_us, roof) if roof >= MIN_ROOF_US else None
    cells, bests = [], []
    for backend in backends:
        base = _ok_median(defaults[backend])
        cells.append(_ratio(base, w.median_us))
        if base:
            ratios[backend].append(base / w.median_us)
        meds = [r["median_us"] for r in by_config.values() if r["status"] == "ok" and _backend(r) == backend]
        bests.append(f"{min(meds):.0f}" if meds else "—")
        if meds:
            ratios[f"best {backend}"].append(min(meds) / w.median_us)
    repaged = [r["median_us"] for r in by_config.values() if r["status"] == "ok" and _backend(r) == REPAGED]
    own = "—"
    if repaged:
        own = f"{min(repaged):.1f} ({w.median_us / min(repaged):.2f}x)"
        ratios[REPAGED].append(w.median_us / min(repaged))
    shape = key_dict(w.shape)
    mark = "—" if met is None else ("yes" if met else "**no**")
    return (
        f"| {shape['batch']} x {shape['kv_len']} | {describe(key_dict(w.config))} | "
        f"{w.median_us:.1f} ({w.p20_us:.1f}–{w.p80_us:.1f}) | {tbps:.2f} | {100 * tbps / ROOF_TBPS:.0f} % | "
        f"{roof:.1f} | {mark} | {' | '.join(cells)} | {' / '.join(bests)} | {own} |"
    ), met


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
        kind = static["mask"]
        assert isinstance(kind, str), kind
        mask = kind + (f" ({static['num_docs']} docs)" if kind == "document_causal" else "")
        if kind == "sliding_window":
            window = static["window"]
            assert isinstance(window, tuple), window  # (left, right)
            mask += f" (window {window[0]})"
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
    env = json.loads(max(rows, key=lambda r: r["run_id"])["env_json"]) if rows else {}
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


def newest_rows(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The rows of the newest run at each (static, shape) point: what a re-measured grid replaced
    stays in the dataset (and in ``before_section``), not in the tables."""
    rows = list(rows)
    newest: dict[tuple[str, str], str] = {}
    for row in rows:
        point = (row["static_key"], row["shape_key"])
        newest[point] = max(newest.get(point, ""), row["run_id"])
    return [dict(r) for r in rows if r["run_id"] == newest[(r["static_key"], r["shape_key"])]]


def newest_winners(results: Path, rows: Iterable[Mapping[str, Any]]) -> list[Winner]:
    """Each point's winner in its newest run (the run whose rows ``newest_rows`` kept), chosen from that
    run's records alone: a winner chosen over every run may rest on a config the newest did not time."""
    newest = {(r["static_key"], r["shape_key"]): r["run_id"] for r in rows}
    return [
        w
        for run in sorted(set(newest.values()))
        for w in winners_in(results, [run])
        if newest.get((key_text(w.static), key_text(w.shape))) == run
    ]


def before_section(results: Path, before: str, after: list[Winner]) -> list[str]:
    """The winner's geometric-mean speedup over flash-attn-4's default, ``before`` run against now, at
    the points both measured."""
    rows = [r.to_row() for r in read_results(results, [before], task="flash_decode")]
    old = {(key_text(w.static), key_text(w.shape)): w for w in winners_in(results, [before], "flash_decode")}
    fa4 = key_text(make_key(BACKEND_DEFAULTS["fa4"]))
    old_default = {
        (r["static_key"], r["shape_key"]): r["median_us"]
        for r in rows
        if r["config_key"] == fa4 and r["status"] == "ok" and r.get("phase", "measure") == "measure"
    }
    now_points = _by_point(newest_rows(r.to_row() for r in read_results(results, task="flash_decode")))
    ratios: dict[str, list[float]] = defaultdict(list)
    for w in after:
        point = (key_text(w.static), key_text(w.shape))
        if point not in old or point not in old_default or old[point].median_us is None:
            continue
        base_now = _ok_median(now_points[point].get(fa4))
        if base_now is None:
            continue
        ratios["before"].append(old_default[point] / old[point].median_us)
        ratios["now"].append(base_now / w.median_us)
    if not ratios["now"]:
        return []
    table = [
        "| page | batch x kv_len | earlier winner | its time now, µs | winner now | µs | speedup |",
        "|---|---|---|---|---|---|---|",
    ]
    for w in after:
        point = (key_text(w.static), key_text(w.shape))
        if point not in old:
            continue
        then = _ok_median(now_points[point].get(key_text(old[point].config)))
        shape, page = key_dict(w.shape), key_dict(w.static)["page_size"]
        table.append(
            f"| {page} | {shape['batch']} x {shape['kv_len']} | {describe(key_dict(old[point].config))} | "
            f"{f'{then:.1f}' if then else '—'} | {describe(key_dict(w.config))} | {w.median_us:.1f} | "
            f"{_ratio(then, w.median_us)} |"
        )
    return [
        "### Before and after the new backends",
        "",
        "Per point, the config run "
        f"{before} chose, timed again in this run (same method), against this run's winner:",
        "",
        *table,
        "",
        f"At the {len(ratios['now'])} points run {before} also measured (flash-attn-4, flash-attn 2, SDPA "
        "and Flex configs, replay timing), the winner was "
        f"**{_geomean(ratios['before']):.2f}x** faster than flash-attn-4's untuned call (geometric mean); "
        f"with flash-attn 3, FlashInfer and the Triton split-KV kernel among the candidates it is "
        f"**{_geomean(ratios['now']):.2f}x** faster (each run's own default time as the base).",
        "",
    ]


def render(results: Path, before: str | None = None) -> str:
    all_rows = [r.to_row() for r in read_results(results)]
    rows = newest_rows(all_rows)
    winners = newest_winners(results, rows)
    out = ["# H200 attention tuning", ""]
    out += environment_section(rows)
    out += [NOTES]
    for task, section in (("flash_decode", decode_section), ("flex_prefill", prefill_section)):
        task_rows = [r for r in rows if r["task"] == task]
        if not task_rows:
            continue
        modes = sorted(
            {f"{r['measure_mode']}, L2 {r['l2']}, {r.get('timing') or 'replay'} timing"
             for r in task_rows if r["status"] == "ok"}
        )  # fmt: skip
        runs = sorted({r["run_id"] for r in task_rows})
        out += [f"## {task}", "", f"Runs {', '.join(runs)}; timed as {'; '.join(modes)}.", ""]
        task_winners = [w for w in winners if w.task == task]
        out += section(task_rows, task_winners)
        if task == "flash_decode" and before:
            out += before_section(results, before, task_winners)
    out += ["## Configs that did not run", "", *failures_section(rows)]
    out += ["## Reproduce", "", REPRODUCE, ""]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--before", default=None, help="an earlier decode run to compare the winners with")
    args = parser.parse_args()
    require(args.results)
    text = render(args.results, args.before)
    if args.out is None:
        print(text)
    else:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
