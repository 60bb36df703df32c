"""What limits the probed bundles at held-out shapes, read from the recorded H200 decode runs (no GPU).

    git show 45ad4e3:benchmarks/results/h200_results.tar.gz > /tmp/h200_results.tar.gz
    tar xzf /tmp/h200_results.tar.gz -C /tmp
    PYTHONPATH=. python benchmarks/studies/holdout_offline.py rules  # other rules for choosing a probed cell
    PYTHONPATH=. python benchmarks/studies/holdout_offline.py denser # every other seed's shapes as probes too
    PYTHONPATH=. python benchmarks/studies/holdout_offline.py waves  # the Triton default's second wave

Each bundle is exported from the page's refined dense grid and its probe run, as
``h200-decode-dense-refined-probed-p{128,16}`` was, then scored on the holdout runs of seeds 1-7
(``benchmarks/studies/holdout_table.py``'s reading: pick / oracle from each run's interleaved comparison).

- ``rules``: the probed cells chosen by another rule than the least worst loss over the cell's sites:
  the least geometric-mean loss, the least product of the two, each with and without the point's winner kept
  where it is within the margin of the best score.
- ``denser``: for each seed, the held-out shapes of the six other seeds added as probes: about 135
  shapes more per page beside the probe run's 562-567, each a comparison of every selectable config.
- ``waves``: at every recorded shape with every config timed (the grid's points, the held-out shapes),
  the default Triton kernel (``{"backend": "triton"}``, its split count from ``heuristic_splits``)
  against the fastest config there, by whether the programs it launches with work to do fit one wave
  (``PROGRAMS_PER_SM`` per SM of the H200's 132) and how full its last split is. Only shapes where
  the split count is the heuristic's occupancy bound, so the groups differ in the rounding alone.
  Then ``split_rule = "one_wave"`` where its count differs and the spec timed that count as a fixed
  config with the default's other options: the very launch it makes, so its time there is measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import tunectl.decide.probes as probes
import tunectl.formats.task_tables as task_tables
from benchmarks.studies.h200_archive import RESULTS, require
from benchmarks.studies.holdout_table import holdout_of
from tunectl.cli import app
from tunectl.core.keys import Key, key_dict, make_key, value_order
from tunectl.core.record import Phase, Record
from tunectl.decide.select import Winner, latest_comparisons
from tunectl.store.results import read_results
from tunectl.tasks import _adapters_triton as triton

# per page: the refined dense grid and its probe run; the holdout runs of seeds 1-7
RUNS = {
    128: (
        ["r20261202-191150-e17cb1", "r20261203-050725-e7cd09"],
        ["r20261203-000300-a1a324", "r20261203-000721-6b2bf8", "r20261203-012133-8b0f32",
         "r20261203-012604-f39932", "r20261203-014839-a89e73", "r20261203-052032-7e0f67",
         "r20261203-052436-0262ea"],
    ),
    16: (
        ["r20261202-171426-ec8a44", "r20261203-051420-5a7ff0"],
        ["r20261203-000524-8546ce", "r20261203-000917-3c94e2", "r20261203-012346-904d88",
         "r20261203-012812-0ee234", "r20261203-014340-09a72d", "r20261203-052231-d612b4",
         "r20261203-052630-7804a0"],
    ),
}  # fmt: skip
H200_SMS = 132
DEFAULT_TRITON = make_key({"backend": "triton"})


def ratios_of(page: int, holdout_runs: Sequence[str], margin: float = 0.02) -> list[float]:
    """Export the page's bundle with today's rules (as patched), score it on ``holdout_runs``."""
    grid, _ = RUNS[page]
    with tempfile.TemporaryDirectory() as out:
        args = ["export", "bundle", "--results", str(RESULTS), "--name", "b", "--version", "1", "--out", out]
        res = CliRunner().invoke(app, [*args, *(a for run in grid for a in ("--run", run))])
        if res.exit_code:
            raise SystemExit(res.output)
        bundle = str(Path(out) / "b" / "1")
        return [
            h.ratio
            for run in holdout_runs
            for h in holdout_of(RESULTS, bundle, run, margin).shapes
            if h.ratio
        ]


def summary(ratios: Sequence[float]) -> str:
    r = sorted(ratios)
    geo = math.exp(sum(map(math.log, r)) / len(r))
    within = sum(x <= 1.03 for x in r)
    return (
        f"{len(r)} | {geo:.4f} | {r[int(0.95 * len(r))]:.3f} | {r[-1]:.3f} | {within} ({within / len(r):.0%})"
    )


HEADER = ["| page | bundle | shapes | geomean | p95 | worst | within 3 % |", "|---|---|---|---|---|---|---|"]


def _chooser(score: str, keep: bool) -> Callable[[Winner, Sequence[probes.Site], float], Winner]:
    """A stand-in for ``probes._choose``: ``score`` is worst, mean (geometric) or their product."""

    def choose(w: Winner, sites: Sequence[probes.Site], margin: float) -> Winner:
        common = set.intersection(*(set(s.losses) for s in sites))
        if not common:
            return w
        worst = {c: max(s.losses[c] for s in sites) for c in common}
        mean = {c: math.exp(statistics.fmean(math.log(s.losses[c]) for s in sites)) for c in common}
        scored = {"worst": worst, "mean": mean, "product": {c: worst[c] * mean[c] for c in common}}[score]
        least = min(scored.values())
        default = next((r.config for s in sites for r in s.arms if r.is_default), None)
        kept = [c for c in (w.config, default) if keep and c in scored and scored[c] <= least * (1 + margin)]
        choice = kept[0] if kept else min(common, key=lambda c: (scored[c], value_order(c)))
        return w if choice == w.config else probes._replaced(w, choice, sites, score)

    return choose


def rules() -> list[str]:
    lines = list(HEADER)
    variants: list[tuple[str, tuple[str, bool] | None]] = [
        ("least worst loss, the point's winner kept within the margin (as exported)", None)
    ]
    for score in ("worst", "mean", "product"):
        for keep in (True, False) if score != "worst" else (False,):
            name = "worst x mean" if score == "product" else score
            variants.append((f"least {name} loss{'' if keep else ', nothing kept'}", (score, keep)))
    original = probes._choose
    try:
        for label, args in variants:
            probes._choose = original if args is None else _chooser(*args)  # type: ignore[assignment]
            for page, (_, held) in RUNS.items():
                lines.append(f"| {page} | {label} | {summary(ratios_of(page, held))} |")
    finally:
        probes._choose = original
    return lines


def denser() -> list[str]:
    lines = list(HEADER)
    original = task_tables.regional
    extra: list[Record] = []

    def with_extra(winners: Sequence[Winner], found: Iterable[Record], *args: object) -> list[Winner]:
        return original(winners, [*found, *extra], *args)  # type: ignore[arg-type]

    task_tables.regional = with_extra  # type: ignore[assignment]
    try:
        for page, (_, held) in RUNS.items():
            as_probes = {
                run: [dataclasses.replace(r, phase=Phase.PROBE) for r in read_results(RESULTS, [run])
                      if r.phase == Phase.HOLDOUT]
                for run in held
            }  # fmt: skip
            ratios = []
            for run in held:
                extra[:] = [r for other, rs in as_probes.items() if other != run for r in rs]
                ratios += ratios_of(page, [run])
            lines.append(f"| {page} | probed, plus the other six seeds' shapes | {summary(ratios)} |")
    finally:
        task_tables.regional = original
    return lines


@dataclasses.dataclass(frozen=True)
class Layout:
    """How the default Triton config cuts one decode point (4 query heads a KV head: one row block)."""

    occupancy_bound: bool  # the split count is the heuristic's occupancy bound (not the length's)
    active: int  # splits with tokens to read
    programs: int  # programs with work: sequences x KV heads x active splits
    last_share: float  # the last split's tokens over a full split's

    @property
    def over_one_wave(self) -> bool:
        return self.programs > triton.PROGRAMS_PER_SM * H200_SMS


def layout(batch: int, kv_len: int, num_kv_heads: int = 8) -> Layout:
    programs, block = batch * num_kv_heads, triton.DEFAULTS["BLOCK_N"]
    args = dict(batch=batch, num_kv_heads=num_kv_heads, head_blocks=1, kv_len=kv_len, num_sms=H200_SMS)
    splits = triton.heuristic_splits(**args)  # type: ignore[arg-type]
    per_split = triton.split_tokens(kv_len, splits, block)
    active = triton.active_splits(kv_len, splits, block)
    last = (kv_len - (active - 1) * per_split) / per_split
    # the count never exceeds the occupancy bound, and reaches it only if its programs fill the slots
    bound = splits * programs >= triton.PROGRAMS_PER_SM * H200_SMS
    return Layout(bound, active, programs * active, last)


def _batch_kv(shape: Key) -> tuple[int, int]:
    s = key_dict(shape)
    return int(s["batch"]), int(s["kv_len"])  # type: ignore[arg-type]


def _batch5_near_8k(shape: Key) -> bool:
    batch, kv_len = _batch_kv(shape)
    return batch == 5 and 6000 <= kv_len <= 9000


@functools.cache
def _relative_times(page: int) -> dict[Key, dict[Key, float]]:
    """Per shape of the page's grid and holdout runs, each config's time over the fastest's: paired
    where compared, else single timings."""
    grid, held = RUNS[page]
    records = read_results(RESULTS, [grid[0], *held])
    out: dict[Key, dict[Key, float]] = {}
    for arms in latest_comparisons(records, Phase.HOLDOUT).values():
        speedups = {r.config: 1.0 if r.is_default else float(r.speedup or 0) for r in arms if r.ok}
        if all(speedups.values()):
            out[arms[0].shape] = {c: max(speedups.values()) / s for c, s in speedups.items()}
    for (_, _, shape), times in probes.point_timings(records, lambda *_: True).items():
        out.setdefault(shape, {c: t / min(times.values()) for c, t in times.items()})
    return out


def waves() -> list[str]:
    lines = ["| page | programs with work | last split | shapes | default Triton / fastest: median | > 3 % |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    series: dict[int, list[tuple[Key, dict[Key, float]]]] = {}
    for page in RUNS:
        groups: dict[tuple[str, str], list[float]] = {}
        times = _relative_times(page)
        for shape, rel in times.items():
            if DEFAULT_TRITON not in rel or len(rel) < 20:  # every config timed there
                continue
            cut = layout(*_batch_kv(shape))
            if cut.occupancy_bound:
                key = (
                    "over one wave" if cut.over_one_wave else "one wave",
                    "half or more" if cut.last_share >= 0.5 else "under half",
                )
                groups.setdefault(key, []).append(rel[DEFAULT_TRITON])
        for (fit, last_split), xs in sorted(groups.items()):
            losing = sum(x > 1.03 for x in xs)
            lines.append(f"| {page} | {fit} | {last_split} | {len(xs)} | {statistics.median(xs):.3f} "
                         f"| {losing} ({losing / len(xs):.0%}) |")  # fmt: skip
        series[page] = sorted(
            ((s, rel) for s, rel in times.items() if DEFAULT_TRITON in rel and _batch5_near_8k(s)),
            key=lambda sr: value_order(sr[0]),
        )
    lines += ["", "| page | batch x kv_len | active splits x programs | last split | Triton default / best |",
              "|---|---|---|---|---|"]  # fmt: skip
    for page, rows in series.items():
        for shape, rel in rows:
            batch, kv_len = _batch_kv(shape)
            cut = layout(batch, kv_len)
            split = f"{cut.active} x {batch * 8} = {cut.programs} | {cut.last_share:.2f}"
            lines.append(f"| {page} | {batch} x {kv_len} | {split} | {rel[DEFAULT_TRITON]:.3f} |")
    return [*lines, "", *one_wave()]


def one_wave() -> list[str]:
    """``split_rule = "one_wave"`` where its count differs from the occupancy count and the spec timed
    that count as a fixed config with the default's other options: the same kernel launch, measured."""
    lines = ["| page | shapes | one_wave / occupancy: median | min | max | faster at "
             "| / fastest, occupancy: median | one_wave: median |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for page in RUNS:
        pairs = []
        for shape, rel in _relative_times(page).items():
            batch, kv_len = _batch_kv(shape)
            args = dict(batch=batch, num_kv_heads=8, head_blocks=1, kv_len=kv_len, num_sms=H200_SMS)
            occupancy = triton.heuristic_splits(**args)  # type: ignore[arg-type]
            wave = triton.heuristic_splits(**args, rule="one_wave")  # type: ignore[arg-type]
            same = {k: triton.DEFAULTS[k] for k in ("BLOCK_N", "num_warps", "num_stages")}  # BLOCK_H left out
            twin = make_key({"backend": "triton", "num_kv_splits": wave, **same})  # as the spec names it
            if wave != occupancy and DEFAULT_TRITON in rel and twin in rel:
                pairs.append((rel[DEFAULT_TRITON], rel[twin]))
        ratios = sorted(w / o for o, w in pairs)
        lines.append(
            f"| {page} | {len(pairs)} | {statistics.median(ratios):.3f} | {ratios[0]:.3f} | {ratios[-1]:.3f} "
            f"| {sum(r < 1 for r in ratios)} | {statistics.median(o for o, _ in pairs):.3f} "
            f"| {statistics.median(w for _, w in pairs):.3f} |"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("rules", "denser", "waves"))
    args = parser.parse_args(argv)
    require(RESULTS)
    print("\n".join({"rules": rules, "denser": denser, "waves": waves}[args.what]()))


if __name__ == "__main__":
    main()
