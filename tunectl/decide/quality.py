"""How far measurements can be trusted, counted: rows the drift guard flagged, measurements that took
fewer samples than the spec's ``min_samples``, and points whose noise is over the spec's
``noise_target``; and per decided point, which of those its decision rests on.

A point's decision rests on the rows it compared: the chosen config's and the default's (their
finals arms where finals decided, else their latest full measurements; a validation's two arms).
Screening looks take fewer samples by design and are not counted against ``min_samples``; nor are
rows imported from another tuner's log, which carry no samples. A one-sample row has no noise to
speak of: its noise is unknown (``noise_known``), never zero.

A slowdown the guard's reference does not move for (on an H200 not the whole device slowing: a
reference mostly of copy caught none either), or one that falls between two of its readings, leaves
no flag; it shows instead as a config read far apart at one point. So the counts
also say how many configs a worker looked at more than once at a point (screening rungs, a full
measurement, the finals) read more than ``LOOKS_APART`` apart beyond both looks' own spread
(``looks_apart``): on the H200's decode grids, 6 % of the finalists' screening looks read over 5 %
off their finals with no flag (``benchmarks/results/throughput.md``). The search ranks a config by
its better look (``tunectl.decide.search.best_looks``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Protocol

from tunectl.core.errors import UserError
from tunectl.core.record import SELECTED_PHASES, Phase, Point, Record, latest
from tunectl.core.spec import parse_spec
from tunectl.decide.select import Winner, fidelity, latest_comparisons, one_timing
from tunectl.store.runs import load_run, run_exists

#: phases whose rows are timed on purpose with fewer samples, or with none
_UNSAMPLED = (Phase.SCREEN, Phase.IMPORT)
#: two looks of one config at one point further apart than this are counted (``looks_apart``)
LOOKS_APART = 0.05
_LOOKS = (Phase.SCREEN, Phase.MEASURE, Phase.FINAL)


@dataclass(frozen=True)
class Targets:
    """What a run's spec asked of each measurement (``[measure] min_samples`` and ``noise_target``)."""

    min_samples: int
    noise_target: float


class Flag(StrEnum):
    """Why a point's decision is in doubt: a row it rests on drifted, took fewer samples than the
    minimum, or is noisier than the target; or its run lost rows there to an unreadable part."""

    DRIFT = "drift"
    FEW_SAMPLES = "few_samples"
    NOISY = "noisy"
    LOST = "lost"


@dataclass(frozen=True)
class Quality:
    """The counts over some rows, and the flags of each decided point (only points with a flag)."""

    num_rows: int = 0  # ok rows
    num_drift: int = 0  # of them, flagged by the drift guard
    num_full: int = 0  # ok full measurements and comparison arms: the rows min_samples applies to
    num_few_samples: int = 0  # of them, with fewer samples than their run's min_samples
    num_points: int = 0  # decided points
    num_noisy: int = 0  # of them, resting on a row noisier than its run's noise_target
    num_looked_twice: int = 0  # configs a worker looked at more than once at one point
    num_looks_apart: int = 0  # of them, read more than LOOKS_APART apart (``looks_apart``)
    flags: Mapping[Point, frozenset[Flag]] = field(default_factory=dict)

    def of(self, point: Point) -> frozenset[Flag]:
        return self.flags.get(point, frozenset())

    @property
    def num_flagged(self) -> int:
        """Decided points resting on a flagged row."""
        return len(self.flags)


class Sampled(Protocol):
    """A timing with its noise: a record, a winner."""

    @property
    def rel_noise(self) -> float | None: ...

    @property
    def num_samples(self) -> int | None: ...


def noise_known(timing: Sampled) -> bool:
    """Whether its noise says anything: it has one (an imported time has none) from more than one
    sample (one sample's p20-p80 band is zero wide)."""
    return timing.rel_noise is not None and (timing.num_samples or 0) > 1


def targets_of(results: str | Path, run_ids: Iterable[str]) -> dict[str, Targets]:
    """The targets of each run among ``run_ids`` whose spec is recorded (imported runs have none)."""
    out = {}
    for run_id in sorted(set(run_ids)):
        info = load_run(results, run_id) if run_exists(results, run_id) else None
        if info is None or not info.spec_text:
            continue
        try:
            measure = parse_spec(info.spec_text, info.spec_path, info.name, stored=True).measure
        except UserError:
            continue
        out[run_id] = Targets(measure.min_samples, measure.noise_target)
    return out


def assess_winners(
    records: Sequence[Record], winners: Sequence[Winner], targets: Mapping[str, Targets]
) -> Quality:
    """The counts over ``records`` by ``targets`` (per run id), and the flags of each winner's point:
    of the rows its choice compared (``decision_rows``), and ``LOST`` where its run lost rows there."""
    lost = [w.point for w in winners if w.lost]
    return _assess(records, decision_rows(records, winners), targets, lost)


def assess_comparisons(records: Sequence[Record], phase: Phase, targets: Mapping[str, Targets]) -> Quality:
    """The counts over ``records``, and the flags of each point's latest comparison of ``phase`` (a
    validation's arms)."""
    return _assess(records, latest_comparisons(records, phase), targets)


def run_quality(results: str | Path, run_id: str, phase: Phase = Phase.VALIDATE) -> Quality:
    """``assess_comparisons`` of run ``run_id`` in ``results`` (a validation run)."""
    from tunectl.store.results import read_results

    records = read_results(results, run_ids=[run_id])
    return assess_comparisons(records, phase, targets_of(results, [run_id]))


def _assess(
    records: Iterable[Record],
    rests_on: Mapping[Point, Sequence[Record]],
    targets: Mapping[str, Targets],
    lost: Iterable[Point] = (),
) -> Quality:
    ok = [r for r in records if r.ok]
    full = [r for r in ok if r.phase not in _UNSAMPLED and r.run_id in targets]
    flags: dict[Point, set[Flag]] = {point: {Flag.LOST} for point in lost}
    for point, rows in rests_on.items():
        for row in rows:
            flags.setdefault(point, set()).update(_flags(row, targets.get(row.run_id)))
    apart = looks_apart(ok).values()
    return Quality(
        num_rows=len(ok),
        num_drift=sum(bool(r.drift) for r in ok),
        num_full=len(full),
        num_few_samples=sum(_few(r, targets[r.run_id]) for r in full),
        num_points=len(rests_on),
        num_noisy=sum(Flag.NOISY in flags.get(p, ()) for p in rests_on),
        num_looked_twice=sum(seen for _, seen in apart),
        num_looks_apart=sum(far for far, _ in apart),
        flags={p: frozenset(f) for p, f in flags.items() if f},
    )


def _flags(row: Record, target: Targets | None) -> set[Flag]:
    out = {Flag.DRIFT} if row.drift else set()
    if target is None or row.phase in _UNSAMPLED:
        return out
    if _few(row, target):
        out.add(Flag.FEW_SAMPLES)
    if noise_known(row) and (row.rel_noise or 0.0) > target.noise_target:
        out.add(Flag.NOISY)
    return out


def _few(row: Record, target: Targets) -> bool:
    return (row.num_samples or 0) < target.min_samples


def decision_rows(records: Iterable[Record], winners: Iterable[Winner]) -> dict[Point, list[Record]]:
    """Per winner's point, the rows its choice compared: the chosen config's and the default's, from
    its finals where finals decided, else their latest full measurements (``tunectl.decide.select``)."""
    rows = one_timing(records)
    finals = latest_comparisons(rows, Phase.FINAL)
    singles: dict[Point, list[Record]] = {}
    for r in rows:
        if r.phase is not Phase.FINAL and r.phase in SELECTED_PHASES:
            singles.setdefault(r.point, []).append(r)
    out = {}
    for w in winners:
        if w.served_by is not None or w.basis == "region":
            continue  # not decided at a point of its own here
        pool = finals.get(w.point, []) if w.basis == "final" else _latest(singles.get(w.point, []))
        out[w.point] = [r for r in pool if r.ok and (r.is_default or r.config == w.config)]
    return out


def _latest(rows: Sequence[Record]) -> list[Record]:
    return list(latest(rows, key=lambda r: r.config_key, rank=fidelity).values())


def looks_apart(rows: Iterable[Record], apart: float = LOOKS_APART) -> dict[str, tuple[int, int]]:
    """Per worker: how many configs it looked at more than once at one point (by one timing method,
    looks the drift guard flagged left out) read more than ``apart`` apart between their fastest and
    slowest look, the two looks' p20-p80 bands apart too, and of how many."""
    looks: dict[tuple[str, ...], list[Record]] = {}
    for r in rows:
        if (
            r.worker and r.ok and r.median_us and r.phase in _LOOKS and not r.drift
        ):  # flagged: counted already
            key = (str(r.worker), r.run_id, r.static_key, r.shape_key, r.config_key, str(r.timing))
            looks.setdefault(key, []).append(r)
    out: dict[str, tuple[int, int]] = {}
    for (worker, *_), seen in looks.items():
        if len(seen) > 1:
            fast, slow = min(seen, key=_median), max(seen, key=_median)
            # apart beyond both looks' own spread: a noisy look of a short kernel is not a slowdown
            bands_apart = (fast.p80_us or 0.0) < (slow.p20_us or 0.0)
            far = _median(slow) > _median(fast) * (1.0 + apart) and bands_apart
            count, of = out.get(worker, (0, 0))
            out[worker] = (count + far, of + 1)
    return out


def _median(record: Record) -> float:
    return float(record.median_us or 0.0)
