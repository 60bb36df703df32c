"""From results to a published bundle: select winners, build tables, publish.

What selection needs from a task (which configs may win, how shapes bucket) comes from the source
runs' plan-time facts (``tunectl.plan.RunFacts``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunectl.bundle import TaskTable, build_files, check_name, publish
from tunectl.errors import UserError
from tunectl.keys import key_json
from tunectl.plan import RunFacts, selectable_in
from tunectl.record import SELECTED_PHASES, Record
from tunectl.results import read_results
from tunectl.runs import load_run, run_exists, run_facts
from tunectl.select import Winner, select_winners
from tunectl.stores import open_store

log = logging.getLogger("tunectl.export")

_ENV_FIELDS = ("device_kind", "device_name", "compute_capability", "sm_count", "cuda", "packages")


@dataclass(frozen=True)
class ExportResult:
    location: str  # the published version: a directory, or a URI in object storage
    winners: tuple[Winner, ...]
    source_runs: tuple[str, ...]

    @property
    def path(self) -> Path:
        """The published version's directory (for a local store)."""
        return Path(self.location)


def entry_of(winner: Winner) -> dict[str, Any]:
    return {
        "static": key_json(winner.static),
        "shape": key_json(winner.shape),
        "config": key_json(winner.config),
        "is_default": winner.is_default,
        "median_us": winner.median_us,
        "p20_us": winner.p20_us,
        "p80_us": winner.p80_us,
        "rel_noise": winner.rel_noise,
        "num_samples": winner.num_samples,
        "default_median_us": winner.default_median_us,
        "speedup": winner.speedup,
        "speedup_lo": winner.speedup_lo,
        "speedup_hi": winner.speedup_hi,
        "basis": winner.basis,
        "rounds": winner.rounds,
        "reason": winner.reason,
        "run_id": winner.run_id,
    }


def facts_of(results: str | Path, run_ids: Iterable[str]) -> dict[str, RunFacts]:
    """The plan-time facts of each run that has them (runs imported from a log have none)."""
    out = {}
    for run_id in sorted(set(run_ids)):
        facts = run_facts(load_run(results, run_id)) if run_exists(results, run_id) else None
        if facts is not None:
            out[run_id] = facts
    return out


def select_from(records: Sequence[Record], facts: Mapping[str, RunFacts]) -> list[Winner]:
    """The winners among ``records``; a config its run's task measured for reference only never wins."""
    return select_winners(records, selectable=selectable_in(facts.values()))


def winners_in(
    results: str | Path, run_ids: Sequence[str] | None = None, task: str | None = None
) -> list[Winner]:
    """The winners the results of ``run_ids`` (default: every run) hold, as ``tunectl winners`` shows."""
    records = read_results(results, run_ids=run_ids, task=task)
    return select_from(records, facts_of(results, (r.run_id for r in records)))


def _bucketing(facts: Mapping[str, RunFacts], task: str) -> dict[str, dict[str, Any]]:
    """The bucket policy each shape dimension was tuned with; runs must agree. Runs without a spec
    (imported from another tuner's log) bucket nothing: their dimensions are ``exact``."""
    policies: dict[str, str] = {}
    for run_facts_ in facts.values():
        if run_facts_.task != task:
            continue
        for dim, bucket in run_facts_.buckets:
            if policies.setdefault(dim, bucket) != bucket:
                raise UserError(
                    f"runs disagree on how {task}'s {dim} is bucketed "
                    f"({policies[dim]} vs {bucket}); export them separately with --run"
                )
    return {name: {"policy": policy, "points": []} for name, policy in policies.items()}


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


def export_bundle(
    results: str | Path, name: str, version: str, out: str | Path, scope: Scope = ALL_RESULTS
) -> ExportResult:
    """Select winners from ``results`` and publish them as bundle ``name/version`` in store ``out``.

    ``out`` is a local directory or a store URI (``s3://bucket/prefix``, see ``tunectl.stores``).
    """
    store = open_store(out)
    prepared = prepare_bundle(results, name, version, scope)
    location = publish(store, name, version, prepared.files)
    return ExportResult(location, prepared.winners, prepared.source_runs)


@dataclass(frozen=True)
class PreparedBundle:
    """A bundle's files, built and not yet published, with the winners they hold."""

    name: str
    version: str
    files: Mapping[str, bytes]
    winners: tuple[Winner, ...]
    source_runs: tuple[str, ...]


def prepare_bundle(
    results: str | Path, name: str, version: str, scope: Scope = ALL_RESULTS
) -> PreparedBundle:
    """The files of bundle ``name/version``: the winners selected from ``results``."""
    check_name("name", name)
    check_name("version", version)
    records = _exported(results, scope)
    source_runs = tuple(sorted({r.run_id for r in records}))
    facts = facts_of(results, source_runs)
    winners = select_from(records, facts)
    if not winners:
        raise UserError("no configuration finished with status ok; nothing to export")
    tables = [
        _table(task_name, [w for w in winners if w.task == task_name], facts)
        for task_name in sorted({w.task for w in winners})
    ]
    files = build_files(name, version, tables, source_runs, _environment(records))
    return PreparedBundle(name, version, files, tuple(winners), source_runs)


def _exported(results: str | Path, scope: Scope) -> list[Record]:
    """The records a bundle is selected from: one device's single-call measurements."""
    records = read_results(results, run_ids=scope.run_ids, task=scope.task)
    records = [r for r in records if r.phase in SELECTED_PHASES]
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
    return records


def _table(task: str, winners: Sequence[Winner], facts: Mapping[str, RunFacts]) -> TaskTable:
    """One task's table: its winners, and each shape dimension's policy and tuned points."""
    shapes = _bucketing(facts, task)
    for w in winners:
        for dim_name, value in w.shape:
            shapes.setdefault(dim_name, {"policy": "exact", "points": []})["points"].append(value)
    for dim in shapes.values():
        dim["points"] = sorted(set(dim["points"]))
    static_params = tuple(param for param, _ in winners[0].static)
    return TaskTable(task, static_params, shapes, tuple(entry_of(w) for w in winners))
