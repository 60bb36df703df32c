"""From results to a published bundle: select winners, build tables, publish."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunectl.bundle import TaskTable, build_files, check_name, publish
from tunectl.errors import UserError
from tunectl.keys import Key, key_from_text
from tunectl.results import read_results
from tunectl.runs import load_run
from tunectl.select import SELECTED_PHASES, Winner, select_winners
from tunectl.spec import parse_spec
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


def _json_key(key: Key) -> dict[str, Any]:
    return {name: list(v) if isinstance(v, tuple) else v for name, v in key}


def entry_of(winner: Winner) -> dict[str, Any]:
    return {
        "static": _json_key(winner.static),
        "shape": _json_key(winner.shape),
        "config": _json_key(winner.config),
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


def _bucketing(results: Path, run_ids: Sequence[str], task: str) -> dict[str, dict[str, Any]]:
    """The bucket policy each shape dimension was tuned with; runs must agree. Runs without a spec
    (imported from another tuner's log) bucket nothing: their dimensions are ``exact``."""
    policies: dict[str, str] = {}
    for run_id in run_ids:
        info = load_run(results, run_id)
        if info.task != task or not info.spec_text:
            continue
        spec = parse_spec(info.spec_text, info.spec_path, info.name, stored=True)
        for dim in spec.shapes:
            if policies.setdefault(dim.name, dim.bucket) != dim.bucket:
                raise UserError(
                    f"runs disagree on how {task}'s {dim.name} is bucketed "
                    f"({policies[dim.name]} vs {dim.bucket}); export them separately with --run"
                )
    return {name: {"policy": policy, "points": []} for name, policy in policies.items()}


def _bucketable(rows: list[dict[str, Any]], *, asked_for_runs: bool) -> list[dict[str, Any]]:
    """The rows whose sizes a lookup can bucket. Symbolic sizes (a dynamic-shape log's ``s37``) are
    an error in runs asked for by id; otherwise those rows are left out with a warning."""
    kept: list[dict[str, Any]] = []
    odd: list[dict[str, Any]] = []
    for row in rows:
        (kept if all(isinstance(v, int) for _, v in key_from_text(row["shape_key"])) else odd).append(row)
    if not odd:
        return kept
    dim_name, value = next((n, v) for n, v in key_from_text(odd[0]["shape_key"]) if not isinstance(v, int))
    why = f"{dim_name}={value!r} is not a size a lookup can bucket (a symbolic size from a dynamic-shape log)"
    if asked_for_runs:
        raise UserError(
            f"task {odd[0]['task']}, run {odd[0]['run_id']}: {why}; export the other runs with --run"
        )
    runs = ", ".join(sorted({r["run_id"] for r in odd}))
    log.warning("left out %d row(s) with symbolic sizes (runs %s): %s", len(odd), runs, why)
    return kept


def _environment(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    latest = max(rows, key=lambda r: r["finished_at"])
    env = json.loads(latest["env_json"] or "{}")
    return {k: env[k] for k in _ENV_FIELDS if k in env}


def export_bundle(
    results: str | Path,
    name: str,
    version: str,
    out: str | Path,
    run_ids: Sequence[str] | None = None,
    task: str | None = None,
    device: str | None = None,
) -> ExportResult:
    """Select winners from ``results`` and publish them as bundle ``name/version`` in store ``out``.

    ``out`` is a local directory or a store URI (``s3://bucket/prefix``, see ``tunectl.stores``).
    """
    store = open_store(out)
    prepared = prepare_bundle(results, name, version, run_ids, task, device)
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
    results: str | Path,
    name: str,
    version: str,
    run_ids: Sequence[str] | None = None,
    task: str | None = None,
    device: str | None = None,
) -> PreparedBundle:
    """The files of bundle ``name/version``: the winners selected from ``results``."""
    check_name("name", name)
    check_name("version", version)
    results = Path(results)
    rows = [r for r in read_results(results, run_ids=run_ids, task=task) if r["phase"] in SELECTED_PHASES]
    rows = _bucketable(rows, asked_for_runs=run_ids is not None)
    if device is not None:
        rows = [r for r in rows if r["device_name"] == device]
    if not rows:
        raise UserError(f"no results to export in {results} for the runs, task and device asked for")
    devices = sorted({r["device_name"] for r in rows if r["device_name"]})  # a crash names no device
    if len(devices) > 1:
        raise UserError(
            f"results span several devices ({'; '.join(devices)}); a bundle is for one: pick --device"
        )
    winners = select_winners(rows)
    if not winners:
        raise UserError("no configuration finished with status ok; nothing to export")
    source_runs = tuple(sorted({r["run_id"] for r in rows}))
    tables = []
    for task_name in sorted({w.task for w in winners}):
        task_winners = [w for w in winners if w.task == task_name]
        shapes = _bucketing(results, source_runs, task_name)
        for w in task_winners:
            for dim_name, value in w.shape:
                shapes.setdefault(dim_name, {"policy": "exact", "points": []})["points"].append(value)
        for dim in shapes.values():
            dim["points"] = sorted(set(dim["points"]))
        static_params = tuple(param for param, _ in task_winners[0].static)
        entries = tuple(entry_of(w) for w in task_winners)
        tables.append(TaskTable(task_name, static_params, shapes, entries))
    files = build_files(name, version, tables, source_runs, _environment(rows))
    return PreparedBundle(name, version, files, tuple(winners), source_runs)
