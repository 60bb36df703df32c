"""From results to a published bundle: select winners, cover the grid, build tables
(``tunectl.formats.task_tables``), publish.

What selection needs from a task (which configs may win, how shapes bucket) comes from the source
runs' plan-time facts (``tunectl.core.plan.RunFacts``).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunectl.core.errors import Fielded, ResultsError, UserError
from tunectl.core.keys import Key, value_order
from tunectl.core.plan import RunFacts, selectable_in
from tunectl.core.record import SELECTED_PHASES, Phase, Record
from tunectl.core.spec import DEFAULT_MARGIN
from tunectl.decide.candidates import DEFAULT_CANDIDATES
from tunectl.decide.coverage import Coverage, Hole, cover
from tunectl.decide.quality import Quality, assess_winners, targets_of
from tunectl.decide.select import Winner, select_winners
from tunectl.decide.work import shortfalls, with_shortfalls
from tunectl.formats.task_tables import policies, task_tables
from tunectl.store.bundle import build_files, check_name, publish
from tunectl.store.results import DamagedPart, Dataset, read_dataset, read_results
from tunectl.store.runs import effective_state, load_run, run_exists, run_facts
from tunectl.store.stores import open_store

log = logging.getLogger("tunectl.formats.export")

_ENV_FIELDS = ("device_kind", "device_name", "compute_capability", "sm_count", "cuda", "packages")


@dataclass(frozen=True)
class ExportResult:
    location: str  # the published version: a directory, or a URI in object storage
    winners: tuple[Winner, ...]
    source_runs: tuple[str, ...]
    holes: tuple[Hole, ...] = ()  # regions inside the declared ranges where lookup answers None
    unfinished: tuple[tuple[str, str], ...] = ()  # (run id, state) of source runs that did not finish
    damaged: tuple[DamagedPart, ...] = ()  # unreadable parts left out (``Choices.skip_damaged``)

    def notes(self) -> list[str]:
        """One line per region that answers None, per source run that did not finish, and per run
        whose unreadable parts were left out."""
        return (
            [h.line() for h in self.holes]
            + [
                f"run {run_id} is {state}, not finished: its entries come from what it measured; "
                f"`tunectl submit --resume {run_id}` measures the rest (then export a new version)"
                for run_id, state in self.unfinished
            ]
            + [self._damage_note(run_id) for run_id in sorted({p.run_id for p in self.damaged})]
        )

    def _damage_note(self, run_id: str) -> str:
        parts = [p for p in self.damaged if p.run_id == run_id]
        lost = sum(any(lost.run_id == run_id for lost in w.lost) for w in self.winners)
        return (
            f"run {run_id}: left out {len(parts)} unreadable part(s) ({parts[0].path}"
            f"{', ...' if len(parts) > 1 else ''}); {lost} entr{'y' if lost == 1 else 'ies'} chosen without "
            "rows lost there, each saying so in its reason"
        )

    @property
    def path(self) -> Path:
        """The published version's directory (for a local store)."""
        return Path(self.location)


def facts_of(results: str | Path, run_ids: Iterable[str]) -> dict[str, RunFacts]:
    """The plan-time facts of each run that has them (runs imported from a log have none)."""
    out = {}
    for run_id in sorted(set(run_ids)):
        facts = run_facts(load_run(results, run_id)) if run_exists(results, run_id) else None
        if facts is not None:
            out[run_id] = facts
    return out


def margin_of(facts: Mapping[str, RunFacts], margin: float | None = None) -> float:
    """``margin`` if given; else the ``[select] margin`` the runs were planned with (they must agree)."""
    if margin is not None:
        if not 0.0 <= margin < 1.0:
            raise UserError(f"--margin must be at least 0 and below 1, not {margin}")
        return margin
    margins = sorted({DEFAULT_MARGIN if f.margin is None else f.margin for f in facts.values()})
    if len(margins) > 1:
        raise UserError(
            f"the runs were planned with different [select] margins ({', '.join(map(str, margins))}); "
            "give --margin"
        )
    return margins[0] if margins else DEFAULT_MARGIN


def select_from(
    records: Sequence[Record], facts: Mapping[str, RunFacts], *, margin: float | None = None
) -> list[Winner]:
    """The winners among ``records``; a config its run's task measured for reference only never wins;
    a config wins only by more than the margin (``margin_of``)."""
    return select_winners(records, selectable=selectable_in(facts.values()), margin=margin_of(facts, margin))


def winners_in(
    results: str | Path, run_ids: Sequence[str] | None = None, task: str | None = None
) -> list[Winner]:
    """The winners the results of ``run_ids`` (default: every run) hold, as ``tunectl winners`` shows."""
    records = read_results(results, run_ids=run_ids, task=task)
    return select_from(records, facts_of(results, (r.run_id for r in records)))


def assessed_winners(results: str | Path, dataset: Dataset) -> tuple[list[Winner], Quality]:
    """The winners ``dataset``'s records hold (as ``tunectl winners`` and ``submit`` show them), each
    whose point lost rows to an unreadable part saying so, and the quality of the rows they rest on."""
    records = dataset.records
    winners = select_from(records, facts_of(results, (r.run_id for r in records)))
    if dataset.damaged:
        winners = with_shortfalls(winners, shortfalls(results, dataset))
    return winners, assess_winners(records, winners, targets_of(results, (r.run_id for r in records)))


@dataclass(eq=False)
class DamagedResultsError(Fielded, ResultsError):
    """Results a bundle would be chosen from include parts that cannot be read: nothing is published.
    ``parts``: each unreadable part of the ``results`` dataset (at least one); ``path`` and ``reason``
    are the first one's, ``run_ids`` the runs that lost rows."""

    results: Path
    parts: tuple[DamagedPart, ...]

    @property
    def path(self) -> Path:
        return self.parts[0].path

    @property
    def reason(self) -> str:
        return self.parts[0].why

    @property
    def run_ids(self) -> tuple[str, ...]:
        return tuple(sorted({p.run_id for p in self.parts}))

    def problem(self) -> str:
        more = f" (and {len(self.parts) - 1} more)" if len(self.parts) > 1 else ""
        runs = ", ".join(self.run_ids)
        return f"not published: {self.path} cannot be read ({self.reason}){more}, so run {runs} lacks rows"

    def advice(self) -> str:
        return "doctor(results) lists such files, skip_damaged=True publishes without them"


def _bucketable(records: list[Record], *, asked_for_runs: bool) -> list[Record]:
    """The records whose sizes a lookup can bucket. Symbolic sizes (a dynamic-shape log's ``s37``) are
    an error in runs asked for by id; otherwise those records are left out with a warning."""
    kept: list[Record] = []
    odd: list[Record] = []
    for record in records:
        (kept if all(isinstance(v, int) for _, v in record.shape) else odd).append(record)
    if not odd:
        return kept
    dim_name, value = next((n, v) for n, v in odd[0].shape if not isinstance(v, int))
    why = f"{dim_name}={value!r} is not a size a lookup can bucket (a symbolic size from a dynamic-shape log)"
    if asked_for_runs:
        raise UserError(f"task {odd[0].task}, run {odd[0].run_id}: {why}; export the other runs with --run")
    runs = ", ".join(sorted({r.run_id for r in odd}))
    log.warning("left out %d row(s) with symbolic sizes (runs %s): %s", len(odd), runs, why)
    return kept


def _environment(records: Sequence[Record]) -> dict[str, Any]:
    latest = max(records, key=lambda r: r.finished_at)
    env = json.loads(latest.env_json or "{}")
    return {k: env[k] for k in _ENV_FIELDS if k in env}


@dataclass(frozen=True)
class Scope:
    """Which results a bundle is selected from: some runs (None: every run), one task, one device."""

    run_ids: Sequence[str] | None = None
    task: str | None = None
    device: str | None = None


ALL_RESULTS = Scope()


@dataclass(frozen=True)
class Choices:
    """How winners become entries: the margin (None: the runs' own), filling cells that have no
    result of their own from a tuned point beside them, and refusing a bundle that leaves holes."""

    margin: float | None = None
    fill: bool = True
    strict: bool = False
    skip_damaged: bool = False  # publish without the rows of unreadable parts (else DamagedResultsError)
    rules: bool = True  # serve a cell a split rule where its probes measured it better (decide/rules)
    candidates: int = DEFAULT_CANDIDATES  # ranked configs per entry to confirm at start-up (0: none)


DEFAULT_CHOICES = Choices()


def export_bundle(
    results: str | Path,
    name: str,
    version: str,
    out: str | Path,
    scope: Scope = ALL_RESULTS,
    choices: Choices = DEFAULT_CHOICES,
) -> ExportResult:
    """Select winners from ``results`` and publish them as bundle ``name/version`` in store ``out``.

    ``out`` is a local directory or a store URI (``s3://bucket/prefix``, see ``tunectl.store.stores``).
    With ``choices.strict``, a bundle where some region inside the declared ranges answers None is
    not published (``UserError`` naming the regions).
    """
    store = open_store(out)
    prepared = prepare_bundle(results, name, version, scope, choices)
    if choices.strict and prepared.holes:
        lines = "; ".join(h.line() for h in prepared.holes[:5])
        more = f" (and {len(prepared.holes) - 5} more)" if len(prepared.holes) > 5 else ""
        raise UserError(f"not published: {len(prepared.holes)} region(s) would answer None: {lines}{more}")
    location = publish(store, name, version, prepared.files)
    return prepared.result(location)


@dataclass(frozen=True)
class PreparedBundle:
    """A bundle's files, built and not yet published, with the winners they hold."""

    name: str
    version: str
    files: Mapping[str, bytes]
    winners: tuple[Winner, ...]
    source_runs: tuple[str, ...]
    holes: tuple[Hole, ...] = ()
    unfinished: tuple[tuple[str, str], ...] = ()
    damaged: tuple[DamagedPart, ...] = ()

    def result(self, location: str) -> ExportResult:
        """What publishing these files at ``location`` gives."""
        return ExportResult(
            location, self.winners, self.source_runs, self.holes, self.unfinished, self.damaged
        )


def prepare_bundle(
    results: str | Path,
    name: str,
    version: str,
    scope: Scope = ALL_RESULTS,
    choices: Choices = DEFAULT_CHOICES,
) -> PreparedBundle:
    """The files of bundle ``name/version``: the winners selected from ``results``, every grid cell
    without a result of its own filled from a tuned point beside it (``choices.fill``)."""
    check_name("name", name)
    check_name("version", version)
    dataset = _readable(results, scope, choices)
    records, probes = _exported(results, scope, dataset.records)
    source_runs = tuple(sorted({r.run_id for r in [*records, *probes]}))
    facts = facts_of(results, source_runs)
    coverage = _covered(records, facts, choices)
    winners = sorted(coverage.winners, key=lambda w: (w.task, value_order(w.static), value_order(w.shape)))
    if dataset.damaged:
        winners = with_shortfalls(winners, shortfalls(results, dataset))
    margin = margin_of(facts, choices.margin)
    winners, tables = task_tables(
        winners, records, probes, facts, margin, rules=choices.rules, candidates=choices.candidates
    )
    files = build_files(name, version, tables, source_runs, _environment(records))
    unfinished = unfinished_runs(results, source_runs)
    return PreparedBundle(
        name, version, files, tuple(winners), source_runs, coverage.holes, unfinished, dataset.damaged
    )


def _covered(records: Sequence[Record], facts: Mapping[str, RunFacts], choices: Choices) -> Coverage:
    """The winners among ``records``, and every cell inside the declared ranges served or listed as
    a hole (``tunectl.decide.coverage``)."""
    selected = select_from(records, facts, margin=choices.margin)
    if not selected:
        raise UserError("no configuration finished with status ok; nothing to export")
    return cover(
        selected,
        policies={t: policies(facts, t) for t in {w.task for w in selected}},
        ranges={f.task: {d: (lo, hi) for d, lo, hi in f.ranges} for f in facts.values()},
        unmeasured=_failed_points(records, selected),
        fill=choices.fill,
    )


def unfinished_runs(results: str | Path, run_ids: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """(run id, state) of the tuning runs among ``run_ids`` that did not finish (stopped, cancelled,
    failed, interrupted, or still running): their later rounds and points may be missing."""
    tuning = [load_run(results, r) for r in sorted(set(run_ids)) if run_exists(results, r)]
    states = [(info.run_id, effective_state(info)) for info in tuning if info.kind == "tune"]
    return tuple((run_id, state) for run_id, state in states if state != "finished")


def _failed_points(records: Sequence[Record], winners: Sequence[Winner]) -> dict[tuple[str, Key, Key], str]:
    """Why each measured point without a winner has none: its configs' statuses."""
    won = {(w.task, w.static, w.shape) for w in winners}
    statuses: dict[tuple[str, Key, Key], Counter[str]] = {}
    for r in records:
        at = (r.task, r.static, r.shape)
        if at not in won:
            statuses.setdefault(at, Counter())[str(r.status)] += 1
    return {
        at: "no config ran ok (" + ", ".join(f"{n} {s}" for s, n in sorted(c.items())) + ")"
        for at, c in statuses.items()
    }


def _readable(results: str | Path, scope: Scope, choices: Choices) -> Dataset:
    """``scope``'s results; ``DamagedResultsError`` if a part cannot be read, unless skipped."""
    dataset = read_dataset(results, run_ids=scope.run_ids, task=scope.task)
    if dataset.damaged and not choices.skip_damaged:
        raise DamagedResultsError(Path(results), dataset.damaged)
    return dataset


def _exported(results: str | Path, scope: Scope, rows: list[Record]) -> tuple[list[Record], list[Record]]:
    """The records a bundle is selected from (one device's single-call measurements), and the
    probes of its cells' regions (``tunectl probe``) on that device, of ``rows`` (``scope``'s)."""
    records = [r for r in rows if r.phase in SELECTED_PHASES]
    records = _bucketable(records, asked_for_runs=scope.run_ids is not None)
    if scope.device is not None:
        records = [r for r in records if r.device_name == scope.device]
    if not records:
        raise UserError(f"no results to export in {results} for the runs, task and device asked for")
    devices = sorted({r.device_name for r in records if r.device_name})  # a crash names no device
    if len(devices) > 1:
        raise UserError(
            f"results span several devices ({'; '.join(devices)}); a bundle is for one: pick --device"
        )
    probes = [r for r in rows if r.phase is Phase.PROBE and r.device_name in devices]
    return records, probes
