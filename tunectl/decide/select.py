"""Choosing winners from results, honestly.

Per (task, device, static key, shape): only configs with status ``ok`` compete, and only those a
server with that static key can use as they are (a task may measure others for reference, such as
a kernel run on a re-paged cache; ``selectable``).

Where the point had finals (its best configs timed against the default in interleaved rounds on one
device, ``phase == "final"``), the latest finals decide: a non-default config wins only when the
whole 95 % interval of its paired speedup lies above ``1 + margin``, the practical-equivalence
margin (default 2 %, ``[select] margin`` or ``export bundle --margin``): a gain smaller than that
does not hold from one GPU of a model to the next, so the default keeps its place. Among those, every config
within ``tie`` of the best speedup is a near-tie, and noise alone would decide between them. The
near-tie that holds up best at the neighbouring points wins (the nearest tuned points below and
above along each shape dimension: the geometric mean of its single timing there over the fastest
config's there), then the first in canonical order (by option name, then value), so two runs on the
same GPU, or two ranks of one server, choose the same config even when noise reorders near-ties. A
point serves the shapes between it and its neighbours: of configs equal at the point, the one that
is also good beside it serves them better (on the H200's decode grids, fixed-split kernels tied at
round batch sizes and lost 5-25 % between them to a kernel that plans its split per shape;
``benchmarks/results/holdout_h200.md``). Otherwise the default keeps its place.

Without finals, single measurements decide: a non-default config wins only when its median beats the
default's by more than the noise of both and the margin (``median * (1 + noise + margin) < default
median``); the lowest
median among those wins, ties in canonical order. Where a config was measured several times, the
latest measurement at the highest fidelity counts (a full measurement over a screening look).

Rows timed by different methods (``Record.timing``: a single-launch replay reads a few microseconds
above the difference method) are never compared: per point, only rows of the method of its latest
row count (``one_timing``), so a point measured again by a newer method is decided by those rows
alone, and rows of the older method there are set aside rather than mixed in.

Each winner says why it won: its speedup, the interval, and what it rests on.

``select_winners`` is a pure function of its records: the order they come in changes nothing, and
whether a config may win (``selectable``) is a fact the caller passes in, read from the runs'
plan-time facts (``tunectl.core.plan.RunFacts``), never from a task.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from tunectl.core.keys import Key, key_text, value_order
from tunectl.core.record import SELECTED_PHASES, Phase, Point, Record, Status, latest
from tunectl.core.shapes import line_neighbours
from tunectl.core.spec import DEFAULT_MARGIN
from tunectl.runtime.rules import WaveRule

__all__ = [
    "SELECTED_PHASES",
    "LostRows",
    "Selectable",
    "Winner",
    "fidelity",
    "latest_comparisons",
    "one_timing",
    "select_winners",
]


@dataclass(frozen=True)
class LostRows:
    """Rows of run ``run_id`` at a point, lost to parts of the results that cannot be read (or, where
    which points a part held cannot be told, perhaps lost: ``certain`` False)."""

    run_id: str
    certain: bool = True

    def __str__(self) -> str:
        if self.certain:
            return f"run {self.run_id} lost rows here to an unreadable part: chosen from what remains"
        return f"run {self.run_id} has unreadable parts, and rows here may be among what it lost"


@dataclass(frozen=True)
class Winner:
    task: str
    device_name: str
    static: Key
    shape: Key
    config: Key
    is_default: bool
    median_us: float
    p20_us: float
    p80_us: float
    rel_noise: float
    num_samples: int
    default_median_us: float | None
    run_id: str
    num_configs: int
    num_failed: int
    speedup: float | None = None  # over the default (1.0 when the default won); None without one
    speedup_lo: float | None = None  # its 95 % interval (finals), or the p20-p80 bands' ratio
    speedup_hi: float | None = None
    basis: str = "measure"  # final: interleaved rounds against the default; measure: single timings
    rounds: int | None = None
    served_by: Key | None = None  # a filled entry: the tuned point whose winner serves this shape
    served_why: str = ""  # why this shape has no result of its own
    near_ties: int = 0  # finalists within the tie tolerance of the best, besides this one
    tie_by: str = ""  # what chose among them: "neighbours" or "canonical order"
    region: str = ""  # how the config held over the cell's region, where probes measured it
    lost: tuple[LostRows, ...] = ()  # runs whose rows here (or at the serving point) cannot be read
    rule: WaveRule | None = None  # a rule entry: the split count computed from the shape (decide/rules)

    @property
    def point(self) -> Point:
        """Where it was chosen, as a record names its point (``Record.point``)."""
        return (self.task, self.device_name, key_text(self.static), key_text(self.shape))

    @property
    def reason(self) -> str:
        """Why this config is the entry, in a line."""
        caveat = "".join(f"; {lost}" for lost in self.lost)
        if self.basis in ("region", "rule"):  # chosen by the probes of its region (decide/probes, rules)
            return self.region + caveat
        held = f"; {self.region}" if self.region else ""
        if self.served_by is None:
            return self._reason + held + caveat
        source = key_text(self.served_by)
        there = f"there: {self._reason}{held}"
        return f"served by the tuned point {source} ({self.served_why} here); {there}{caveat}"

    @property
    def _reason(self) -> str:
        if self.speedup is None:
            return "fastest; the default failed here"
        interval = f"[{self.speedup_lo:.3f}, {self.speedup_hi:.3f}]"
        if self.basis == "final":
            how = f"in {self.rounds} interleaved rounds"
            if self.is_default:
                return f"default: no finalist beat it beyond noise {how} (best {interval} lower bound <= 1)"
            ties = f"; of {self.near_ties + 1} near-ties, chosen by {self.tie_by}" if self.near_ties else ""
            return f"{self.speedup:.3f}x over the default, 95% interval {interval}, {how}{ties}"
        if self.is_default:
            return "default: no config beat it by more than the measured noise"
        return f"{self.speedup:.3f}x over the default (p20-p80 band {interval}), beyond both configs' noise"


Selectable = Callable[[str, Key, Key], bool]  # (task, static, config) -> may it win?


def every_config(task: str, static: Key, config: Key) -> bool:
    """The selectable rule of a task that measures nothing for reference only."""
    return True


def fidelity(record: Record) -> tuple[int, tuple[float, str, str]]:
    """A full measurement counts over a screening look; then the later one (then a fixed order)."""
    return (0 if record.phase is Phase.SCREEN else 1, _order(record))


def is_timing(record: Record) -> bool:
    """Whether ``record`` is a single timing the selection counts: an ok full measurement or
    screening look with a median."""
    return bool(record.ok and record.median_us and record.phase in (Phase.MEASURE, Phase.SCREEN))


def select_winners(
    records: Iterable[Record],
    *,
    selectable: Selectable = every_config,
    margin: float = DEFAULT_MARGIN,
    tie: float = 0.02,
) -> list[Winner]:
    """One winner per (task, device, static, shape) that has at least one ok, selectable measurement.

    Pure: the same records in any order give the same winners, ordered by point in value order.
    """
    records = one_timing(records)
    finals = latest_comparisons(records, Phase.FINAL)
    singles: dict[Point, list[Record]] = {}
    for record in records:
        if record.phase is not Phase.FINAL and record.phase in SELECTED_PHASES:
            singles.setdefault(record.point, []).append(record)
    groups = {
        at: list(latest(rows, key=lambda r: r.config_key, rank=fidelity).values())
        for at, rows in singles.items()
    }
    lines = _Lines(groups, {at: rows[0].shape for at, rows in [*groups.items(), *finals.items()] if rows})
    winners = []
    for point in singles.keys() | finals.keys():
        group = groups.get(point, [])
        final = finals.get(point, [])

        def eligible(r: Record) -> bool:
            return r.ok and selectable(r.task, r.static, r.config)

        choice = _from_finals(final, eligible, margin, tie, lines.loss(point)) if final else None
        choice = choice or _from_singles(group, eligible, margin)
        if choice is not None:
            winners.append(_winner(choice, group or final))
    return sorted(winners, key=lambda w: (w.task, w.device_name, value_order(w.static), value_order(w.shape)))


Choice = tuple[Record, Record | None, dict[str, Any]]  # (winner, default, statistics fields)


def one_timing(records: Iterable[Record]) -> list[Record]:
    """``records`` less the selected-phase rows timed by another method than their point's latest
    selected-phase row (the last finished; on a tie, the later run and item). Other phases pass."""
    records = list(records)
    selected = [r for r in records if r.phase in SELECTED_PHASES]
    method = {at: r.timing for at, r in latest(selected, key=lambda r: r.point, rank=_order).items()}
    return [r for r in records if r.phase not in SELECTED_PHASES or r.timing is method[r.point]]


def _winner(choice: Choice, group: Sequence[Record]) -> Winner:
    best, default, fields = choice
    return Winner(
        task=best.task,
        device_name=best.device_name,
        static=best.static,
        shape=best.shape,
        config=best.config,
        is_default=best.is_default,
        median_us=best.median_us,  # type: ignore[arg-type]  # an ok record has its times
        p20_us=best.p20_us,  # type: ignore[arg-type]
        p80_us=best.p80_us,  # type: ignore[arg-type]
        rel_noise=best.rel_noise,  # type: ignore[arg-type]
        num_samples=best.num_samples,  # type: ignore[arg-type]
        default_median_us=default.median_us if default else None,
        run_id=best.run_id,
        num_configs=len(group),
        num_failed=sum(r.failed for r in group),
        **fields,
    )


def latest_comparisons(records: Iterable[Record], phase: Phase) -> dict[Point, list[Record]]:
    """Per point, the arms of its latest comparison (finals, or a validation) of ``phase``."""
    groups: dict[Point, dict[str, list[Record]]] = {}
    for record in records:
        if record.phase == phase:
            by_id = groups.setdefault(record.point, {})
            by_id.setdefault(record.group_id or record.run_id, []).append(record)
    newest = {
        at: by_id[max(by_id, key=lambda gid: _finished(by_id[gid], gid))] for at, by_id in groups.items()
    }
    return {at: _arms(group) for at, group in newest.items()}


def _arms(group: list[Record]) -> list[Record]:
    """One record per config of a comparison: its latest (a retried arm counts once), in config order."""
    arms = latest(group, key=lambda r: r.config_key, rank=_order)
    return [arms[c] for c in sorted(arms)]


def _order(record: Record) -> tuple[float, str, str]:
    return (record.finished_at, record.run_id, record.item_id)


def _finished(arms: list[Record], group_id: str) -> tuple[float, str]:
    return (max(r.finished_at for r in arms), group_id)


class _Lines:
    """Each point's neighbours (the nearest points below and above along each shape dimension, the
    other values equal, of the same task, device and static key) and the single timings there."""

    def __init__(self, groups: dict[Point, list[Record]], shapes: dict[Point, Key]) -> None:
        self.times = {
            at: {r.config_key: r.median_us for r in rows if r.ok and r.median_us}
            for at, rows in groups.items()
        }
        self.shapes = shapes
        self.by_static: dict[tuple[str, str, str], list[Point]] = {}
        for at in self.shapes:
            self.by_static.setdefault(at[:3], []).append(at)

    def neighbours(self, point: Point) -> list[Point]:
        here = self.shapes.get(point)
        if here is None:
            return []
        at = {self.shapes[p]: p for p in self.by_static[point[:3]]}
        return [at[s] for s in line_neighbours(here, at)]

    def loss(self, point: Point) -> Callable[[str], float]:
        """Per config: the geometric mean, over the neighbours that timed it, of its time there over
        the fastest config's there (1.0: fastest at every one); infinity where none timed it."""
        near = [self.times[n] for n in self.neighbours(point) if self.times.get(n)]

        def of(config_key: str) -> float:
            ratios = [t[config_key] / min(t.values()) for t in near if config_key in t]
            return math.prod(ratios) ** (1.0 / len(ratios)) if ratios else math.inf

        return of


def _from_finals(
    group: list[Record],
    eligible: Callable[[Record], bool],
    margin: float,
    tie: float,
    loss: Callable[[str], float],
) -> Choice | None:
    """The finals' verdict, or None where they cannot give one (the default failed in them)."""
    default = next((r for r in group if r.is_default), None)
    if default is None or default.status is not Status.OK:
        return None
    basis = {"basis": "final", "rounds": default.rounds}
    beat = [r for r in group if not r.is_default and eligible(r) and _lo(r) > 1.0 + margin]
    if not beat:
        others = [r for r in group if not r.is_default and r.ok]
        best_other = max(others, key=_speedup, default=None)
        lo, hi = (best_other.speedup_lo, best_other.speedup_hi) if best_other else (1.0, 1.0)
        return default, default, {"speedup": 1.0, "speedup_lo": lo, "speedup_hi": hi, **basis}
    top = max(map(_speedup, beat))
    tied = [r for r in beat if _speedup(r) * (1.0 + tie) >= top]
    held_up = {r.config_key: loss(r.config_key) for r in tied}
    best = min(tied, key=lambda r: (held_up[r.config_key], value_order(r.config)))  # by value: 64 before 128
    by = (
        "neighbours"
        if sum(v == held_up[best.config_key] for v in held_up.values()) == 1
        else "canonical order"
    )
    spread = {"speedup": best.speedup, "speedup_lo": best.speedup_lo, "speedup_hi": best.speedup_hi}
    return best, default, {**spread, "near_ties": len(tied) - 1, "tie_by": by, **basis}


def _speedup(record: Record) -> float:
    return record.speedup or 0.0


def _lo(record: Record) -> float:
    return record.speedup_lo or 0.0


def _median(record: Record) -> float:
    return record.median_us if record.median_us is not None else float("inf")


def _from_singles(group: list[Record], eligible: Callable[[Record], bool], margin: float) -> Choice | None:
    ok = sorted((r for r in group if eligible(r)), key=lambda r: (_median(r), r.config_key))
    if not ok:
        return None
    default = next((r for r in ok if r.is_default), None)
    if default is None:
        return ok[0], None, {}
    best = next((r for r in ok if not r.is_default and _beats(r, default, margin)), default)
    d, b = _times(default), _times(best)
    fields = {"speedup": d[1] / b[1], "speedup_lo": d[0] / b[2], "speedup_hi": d[2] / b[0]}
    return best, default, fields


def _times(record: Record) -> tuple[float, float, float]:
    """(p20, median, p80) of an ok record (an imported time is all three)."""
    median = _median(record)
    return (record.p20_us or median, median, record.p80_us or median)


def _beats(record: Record, default: Record, margin: float) -> bool:
    noise = max(record.rel_noise or 0.0, default.rel_noise or 0.0)
    return _median(record) * (1.0 + noise + margin) < _median(default)
