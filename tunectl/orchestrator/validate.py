"""``tunectl validate`` and ``tunectl export bundle --validate`` as library calls.

A validation is a run like any other (its rows land in the results dataset, phase ``validate``, and
``tunectl runs`` lists it), whose work is fixed up front: one stacked comparison per point where
the bundle chose a config other than the default (``tunectl.decide.validate``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunectl.core.errors import TunectlError, UserError
from tunectl.core.keys import Key, make_key
from tunectl.core.plan import WorkItem
from tunectl.core.record import Record
from tunectl.core.registry import get_task
from tunectl.core.spec import DEFAULT_MARGIN, Spec, load_spec, parse_spec
from tunectl.decide.holdout import Holdout, baselines_of, draw_shapes, plan_holdout, read_holdout
from tunectl.decide.validate import (
    DEFAULT_LAYERS,
    DEFAULT_ROUNDS,
    FixedItems,
    Skipped,
    Validation,
    describe_point,
    plan_validation,
    read_validation,
)  # fmt: skip
from tunectl.formats.export import (
    ALL_RESULTS,
    DEFAULT_CHOICES,
    Choices,
    ExportResult,
    PreparedBundle,
    Scope,
    prepare_bundle,
)
from tunectl.orchestrator.submit import Progress, RunOptions, new_run, run
from tunectl.runtime import Bundle
from tunectl.store.bundle import MANIFEST, publish, publish_local
from tunectl.store.results import read_results
from tunectl.store.runs import RunInfo, load_run, refuse_if_running, run_exists
from tunectl.store.stores import open_store, read_bundle


class ValidationFailed(TunectlError):
    """The bundle loses to the untuned defaults beyond noise somewhere; it was not published."""


@dataclass(frozen=True)
class ValidationRun:
    run_id: str | None  # None when there was nothing to measure
    spec: str
    validation: Validation
    skipped: tuple[Skipped, ...]


def validate(
    bundle: str | Path | Bundle,
    spec: Spec | str | Path,
    results: str | Path = "tunectl-results",
    *,
    layers: int = DEFAULT_LAYERS,
    rounds: int = DEFAULT_ROUNDS,
    progress: Progress | None = None,
    resume: str | None = None,
    **options: Any,
) -> ValidationRun:
    """Run ``spec``'s points as ``layers``-layer stacks, ``bundle``'s configs against the defaults.

    ``bundle``: a loaded bundle, or where to load one; ``spec``: a Spec, or a spec file's path.
    ``resume``: a stopped validation run of the same bundle, spec and options to finish (a finished
    one's verdict is read from its records).
    ``options``: ``tunectl.orchestrator.submit.RunOptions`` fields (address, num_gpus, connect_fn, ...).
    """
    if layers < 1 or rounds < 2:
        raise UserError("--layers must be at least 1 and --rounds at least 2")
    spec = spec if isinstance(spec, Spec) else load_spec(spec)
    loaded = bundle if isinstance(bundle, Bundle) else read_bundle(bundle)
    items, skipped = plan_validation(spec, loaded, layers=layers, rounds=rounds, task=get_task(spec.task))
    if not items:
        return ValidationRun(None, spec.path, Validation((), layers, rounds), tuple(skipped))
    run_id, records = run_fixed(
        spec, items, Path(results), "validate", len(items), progress, options, resume=resume
    )
    return ValidationRun(run_id, spec.path, read_validation(records), tuple(skipped))


def run_fixed(
    spec: Spec,
    items: Sequence[WorkItem],
    results: Path,
    kind: str,
    num_planned: int,
    progress: Progress | None,
    options: Any,
    resume: str | None = None,
) -> tuple[str, list[Record]]:
    """Run ``items`` as they are, as a run of ``kind``: its id and its records. ``resume``: finish that
    stopped run of the same items instead (a finished one is only read)."""
    digest = plan_digest(items)
    if resume is None:
        info = dataclasses.replace(
            new_run(spec, results=results, num_planned=num_planned, kind=kind), plan_digest=digest
        )
    else:
        info = _resumable(results, resume, kind, spec, digest)
        if info.state == "finished":
            return info.run_id, read_results(results, run_ids=[info.run_id])
    out = run(
        lambda pool: FixedItems(items, pool), spec.resources, spec.measure, results=results, info=info,
        resumed=resume is not None, progress=progress, options=RunOptions(**options),
    )  # fmt: skip
    return out.run_id, read_results(results, run_ids=[out.run_id])


def plan_digest(items: Sequence[WorkItem]) -> str:
    """What a run of fixed ``items`` plans, in a few characters: the digest of their record ids."""
    ids = sorted(rid for item in items for rid in item.record_ids())
    return hashlib.sha256("\n".join(ids).encode()).hexdigest()[:16]


def _resumable(results: Path, run_id: str, kind: str, spec: Spec, digest: str) -> RunInfo:
    """Run ``run_id``'s metadata, if a resume with these items may finish it (or read it, finished)."""
    info = load_run(results, run_id)
    if info.kind != kind:
        raise UserError(f"run {run_id} is a {info.kind} run, not a {kind} run; --resume takes a {kind} run")
    if info.spec_text != spec.text:
        raise UserError(f"run {run_id} was started with another spec ({info.spec_path}); give that one")
    if info.plan_digest != digest:
        raise UserError(
            f"run {run_id} planned other items (another bundle or source run, seed, number of shapes, "
            "probes per cell, short list, layers or rounds); give the options it was started with, or "
            "leave out --resume"
        )
    refuse_if_running(info, results)
    return info


@dataclass(frozen=True)
class HoldoutRun:
    run_id: str | None  # None when there was nothing to measure
    spec: str
    holdout: Holdout
    skipped: tuple[Skipped, ...]


def validate_holdout(
    bundle: str | Path | Bundle,
    spec: Spec | str | Path,
    results: str | Path = "tunectl-results",
    *,
    num_shapes: int,
    seed: int = 0,
    rounds: int = DEFAULT_ROUNDS,
    margin: float = DEFAULT_MARGIN,
    progress: Progress | None = None,
    resume: str | None = None,
    **options: Any,
) -> HoldoutRun:
    """Measure ``bundle``'s picks at ``num_shapes`` shapes drawn inside ``spec``'s ranges, none measured
    for it (``measured_shapes``), against the default and every selectable config there
    (``tunectl.decide.holdout``), as a run of its own. ``resume``: as ``validate``'s.

    ``options``: ``tunectl.orchestrator.submit.RunOptions`` fields (address, num_gpus, connect_fn, ...).
    """
    if num_shapes < 1 or rounds < 2:
        raise UserError("--holdout must be at least 1 and --rounds at least 2")
    if not 0.0 <= margin < 1.0:
        raise UserError(f"--margin must be at least 0 and below 1, not {margin}")
    spec = spec if isinstance(spec, Spec) else load_spec(spec)
    if not spec.ranges():
        raise UserError(
            f"{spec.path}: --holdout draws shapes inside ranges; declare range = [lo, hi] in [shapes]"
        )
    loaded = bundle if isinstance(bundle, Bundle) else read_bundle(bundle)
    shapes = draw_shapes(spec, num_shapes, seed, measured_shapes(results, loaded, spec.task))
    task = get_task(spec.task)
    items, picks, skipped = plan_holdout(spec, loaded, shapes, rounds=rounds, task=task)
    if not items:
        return HoldoutRun(None, spec.path, Holdout((), margin), tuple(skipped))
    planned = sum(len(i.arms) for i in items)
    run_id, records = run_fixed(spec, items, Path(results), "holdout", planned, progress, options, resume)
    held = read_holdout(records, picks, margin, baselines_of(spec, task))
    return HoldoutRun(run_id, spec.path, held, tuple(skipped))


def measured_shapes(results: str | Path, bundle: Bundle, task: str) -> set[Key]:
    """The shapes ``bundle``'s choices were measured at, none of them fit to hold out: those of its
    measured entries (not one served from a neighbour) and, where ``results`` holds its source runs,
    every shape they measured (refined points, probes, points that left no entry)."""
    if task not in bundle.tasks:
        return set()
    shapes = {make_key(e["shape"]) for e in bundle.entries(task) if not e.get("served_by")}
    runs = [r for r in bundle.manifest.get("source_runs", ()) if run_exists(results, r)]
    if runs:
        shapes |= {r.shape for r in read_results(results, runs) if r.task == task}
    return shapes


def export_validated(
    results: str | Path,
    name: str,
    version: str,
    out: str | Path,
    scope: Scope = ALL_RESULTS,
    *,
    specs: Sequence[Spec | str | Path] = (),
    layers: int = DEFAULT_LAYERS,
    rounds: int = DEFAULT_ROUNDS,
    choices: Choices = DEFAULT_CHOICES,
    **options: Any,
) -> tuple[ExportResult, list[ValidationRun]]:
    """Build the bundle, validate it (on ``specs``, default the specs of its source runs), and publish it
    only if no point loses to the defaults beyond noise. Raises ``ValidationFailed`` otherwise."""
    store = open_store(out)
    if _exists(store, name, version):
        raise UserError(f"bundle {name}/{version} already exists in {out}; versions are immutable")
    prepared = prepare_bundle(results, name, version, scope, choices)
    if choices.strict and prepared.holes:
        raise UserError(
            f"not published: {len(prepared.holes)} region(s) would answer None: {prepared.holes[0].line()}"
        )
    with tempfile.TemporaryDirectory(prefix="tunectl-validate-") as tmp:
        candidate = read_bundle(publish_local(Path(tmp) / "bundles", name, version, prepared.files))
    runs = [
        validate(candidate, spec, results, layers=layers, rounds=rounds, **options)
        for spec in (specs or _source_specs(results, prepared))
    ]
    losers = [p for run in runs for p in run.validation.losers]
    if losers:
        where = "; ".join(f"{describe_point(p)}: {p.speedup}" for p in losers[:5])
        raise ValidationFailed(
            f"not published: the bundle is slower than the defaults beyond noise at {len(losers)} point(s): "
            f"{where}{' ...' if len(losers) > 5 else ''}"
        )
    location = publish(store, name, version, prepared.files)
    return prepared.result(location), runs


def _source_specs(results: str | Path, prepared: PreparedBundle) -> list[Spec]:
    """The distinct specs of the bundle's source runs, as they were stored with each run."""
    specs: dict[str, Spec] = {}
    for run_id in prepared.source_runs:
        info = load_run(results, run_id)
        if info.kind == "tune" and info.spec_text and info.spec_text not in specs:
            specs[info.spec_text] = parse_spec(info.spec_text, info.spec_path, info.name, stored=True)
    if not specs:
        raise UserError("the bundle's source runs have no specs to validate on; give --spec")
    return list(specs.values())


def _exists(store: Any, name: str, version: str) -> bool:
    """Whether the version is published (a store that cannot be read is found out by ``publish``)."""
    try:
        store.read(f"{name}/{version}/{MANIFEST}")
    except (FileNotFoundError, TunectlError):
        return False
    return True
