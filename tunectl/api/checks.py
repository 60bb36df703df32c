"""Checking a bundle before serving trusts it, by measuring: stacked validation against the
defaults, a holdout at shapes nobody tuned, region probes inside the cells a run tuned; and the
export that publishes a bundle only once it is validated.

Each check is a run of its own whose items are known up front (``tunectl.orchestrator.fixed``):
its rows land in the results dataset, ``tunectl runs`` lists it, and a stopped one is finished with
the same call and ``resume``.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tunectl.api._running import run_options
from tunectl.api.options import ExportOptions, HoldoutOptions, ProbeOptions, ValidateOptions
from tunectl.core.errors import BundleExistsError, Fielded, NoResultsError, TunectlError, UserError
from tunectl.core.keys import Key, make_key
from tunectl.core.record import SELECTED_PHASES
from tunectl.core.spec import Spec, parse_spec
from tunectl.decide.holdout import Holdout
from tunectl.decide.probes import ProbePlan
from tunectl.decide.stacked import PointVerdict, Skipped, Validation, describe_point
from tunectl.formats.export import ExportResult, PreparedBundle
from tunectl.runtime import Bundle

if TYPE_CHECKING:
    from tunectl.core.plan import RunFacts
    from tunectl.orchestrator.submit import Progress
    from tunectl.store.bundle import BundleStore


@dataclass(eq=False)
class ValidationFailed(Fielded):
    """Bundle ``name``/``version`` loses to the untuned defaults beyond noise at some point of its
    validation ``runs`` (``losers``); it was not published."""

    name: str
    version: str
    runs: tuple[ValidationRun, ...]

    @property
    def losers(self) -> list[PointVerdict]:
        return [p for run in self.runs for p in run.validation.losers]

    def problem(self) -> str:
        losers = self.losers
        where = "; ".join(f"{describe_point(p)}: {p.speedup}" for p in losers[:5])
        return (
            f"not published: bundle {self.name}/{self.version} is slower than the defaults beyond noise "
            f"at {len(losers)} point(s): {where}{' ...' if len(losers) > 5 else ''}"
        )


@dataclass(frozen=True)
class ValidationRun:
    run_id: str | None  # None when there was nothing to measure
    spec: str
    validation: Validation
    skipped: tuple[Skipped, ...]


@dataclass(frozen=True)
class HoldoutRun:
    run_id: str | None  # None when there was nothing to measure
    spec: str
    holdout: Holdout
    skipped: tuple[Skipped, ...]


@dataclass(frozen=True)
class ProbeRun:
    run_id: str | None  # None when there was nothing to measure
    source: str  # the tuning run probed
    plan: ProbePlan


def validate(
    bundle: Bundle,
    spec: Spec,
    results: str | Path,
    options: ValidateOptions | None = None,
    progress: Progress | None = None,
) -> ValidationRun:
    """Run ``spec``'s points as stacks of ``options.layers`` layers, ``bundle``'s configs against the
    defaults, interleaved; a finished run's verdict (``options.resume``) is read from its records."""
    from tunectl.core.registry import get_task
    from tunectl.decide.stacked import plan_validation, read_validation
    from tunectl.orchestrator.fixed import run_fixed

    options = options or ValidateOptions()
    task = get_task(spec.task)
    layers, rounds = options.layers, options.rounds
    items, skipped = plan_validation(spec, bundle, layers=layers, rounds=rounds, task=task)
    if not items:
        return ValidationRun(None, spec.path, Validation((), layers, rounds), tuple(skipped))
    run_id, records = run_fixed(
        spec,
        items,
        Path(results),
        "validate",
        num_planned=len(items),
        progress=progress,
        options=run_options(options.cluster),
        resume=options.resume,
    )
    return ValidationRun(run_id, spec.path, read_validation(records), tuple(skipped))


def holdout(
    bundle: Bundle,
    spec: Spec,
    results: str | Path,
    options: HoldoutOptions | None = None,
    progress: Progress | None = None,
) -> HoldoutRun:
    """Measure ``bundle``'s picks at ``options.num_shapes`` shapes drawn inside ``spec``'s ranges,
    none measured for it (``measured_shapes``), against the default and every selectable config
    there (``tunectl.decide.holdout``)."""
    from tunectl.core.registry import get_task
    from tunectl.decide.holdout import baselines_of, draw_shapes, plan_holdout, read_holdout
    from tunectl.orchestrator.fixed import run_fixed

    options = options or HoldoutOptions()
    check_holdout(spec)
    shapes = draw_shapes(spec, options.num_shapes, options.seed, measured_shapes(results, bundle, spec.task))
    task = get_task(spec.task)
    items, picks, skipped = plan_holdout(spec, bundle, shapes, rounds=options.rounds, task=task)
    if not items:
        return HoldoutRun(None, spec.path, Holdout((), options.margin), tuple(skipped))
    run_id, records = run_fixed(
        spec,
        items,
        Path(results),
        "holdout",
        num_planned=sum(len(i.arms) for i in items),
        progress=progress,
        options=run_options(options.cluster),
        resume=options.resume,
    )
    held = read_holdout(records, picks, options.margin, baselines_of(spec, task))
    return HoldoutRun(run_id, spec.path, held, tuple(skipped))


def check_holdout(spec: Spec) -> None:
    """``UserError`` unless ``spec`` declares the ranges a holdout draws its shapes in."""
    if not spec.ranges():
        raise UserError(
            f"{spec.path}: --holdout draws shapes inside ranges; declare range = [lo, hi] in [shapes]"
        )


def measured_shapes(results: str | Path, bundle: Bundle, task: str) -> set[Key]:
    """The shapes ``bundle``'s choices were measured at, none of them fit to hold out: those of its
    measured entries (not one served from a neighbour) and, where ``results`` holds its source runs,
    every shape they measured (refined points, probes, points that left no entry)."""
    from tunectl.store.results import read_results
    from tunectl.store.runs import run_exists

    if task not in bundle.tasks:
        return set()
    shapes = {make_key(dict(e.shape)) for e in bundle.entries(task) if e.served_by is None}
    runs = [r for r in bundle.manifest.get("source_runs", ()) if run_exists(results, r)]
    if runs:
        shapes |= {r.shape for r in read_results(results, runs) if r.task == task}
    return shapes


def probe(
    results: str | Path,
    source: str,
    options: ProbeOptions | None = None,
    progress: Progress | None = None,
) -> ProbeRun:
    """Measure ``options.per_cell`` shapes inside the region of every cell of tuning run ``source``'s
    grid, the default against the cell's short list, as a run of its own; ``tunectl export bundle``
    then chooses each probed cell's config over its region."""
    from tunectl.core.plan import default_of, selectable_in
    from tunectl.core.registry import get_task
    from tunectl.decide.probes import probes_of
    from tunectl.orchestrator.fixed import run_fixed
    from tunectl.store.results import read_results

    options = options or ProbeOptions()
    spec, facts = _probed_run(results, source)
    task = get_task(spec.task)
    plan = probes_of(
        spec,
        [r for r in read_results(results, run_ids=[source]) if r.phase in SELECTED_PHASES],
        selectable_in([facts]),
        lambda static: default_of(task, static, spec.default),
        lambda static, shape: task.check_point(dict(static), dict(shape)),
        per_cell=options.per_cell,
        shortlist=options.shortlist,
        rounds=options.rounds,
        facts=facts,
    )
    if not plan.items:
        return ProbeRun(None, source, plan)
    run_id, _ = run_fixed(
        spec,
        plan.items,
        Path(results),
        "probe",
        num_planned=sum(len(item.arms) for item in plan.items),
        progress=progress,
        options=run_options(options.cluster),
        resume=options.resume,
    )
    return ProbeRun(run_id, source, plan)


def _probed_run(results: str | Path, source: str) -> tuple[Spec, RunFacts]:
    """The spec and plan-time facts of tuning run ``source``, once it is known to be one to probe."""
    from tunectl.store.runs import effective_state, load_run, run_exists, run_facts

    if not run_exists(results, source):
        raise NoResultsError(Path(results), Path(results).is_dir(), run=source)
    info = load_run(results, source)
    facts = run_facts(info)
    if info.kind != "tune":
        raise UserError(f"run {source} is a {info.kind} run; probe a tuning run")
    if facts is None:
        raise UserError(f"run {source} has no spec (imported from a log); probe a tuning run with one")
    if effective_state(info) == "running":
        raise UserError(f"run {source} is still running; probe it once it has finished")
    spec = parse_spec(info.spec_text, info.spec_path, info.name, stored=True)
    if not spec.ranges():
        raise UserError(f"run {source}'s spec declares no range = [lo, hi] in [shapes]: no region to probe")
    return spec, facts


def export_validated(
    results: str | Path,
    name: str,
    version: str,
    store: str,
    options: ExportOptions,
    progress: Progress | None = None,
) -> tuple[ExportResult, list[ValidationRun]]:
    """Build the bundle, validate it (on ``options.validate_on``, default the specs of its source
    runs), and publish it only if no point loses to the defaults beyond noise; ``ValidationFailed``
    otherwise."""
    from tunectl.formats.export import prepare_bundle
    from tunectl.store.bundle import publish, publish_local
    from tunectl.store.stores import open_store, read_bundle

    bundles = open_store(store)
    if _exists(bundles, name, version):
        raise BundleExistsError(name, version, bundles.location(name, version))
    prepared = prepare_bundle(results, name, version, options.scope, options.choices)
    if options.choices.strict and prepared.holes:
        raise UserError(
            f"not published: {len(prepared.holes)} region(s) would answer None: {prepared.holes[0].line()}"
        )
    with tempfile.TemporaryDirectory(prefix="tunectl-validate-") as tmp:
        candidate = read_bundle(publish_local(Path(tmp) / "bundles", name, version, prepared.files))
    specs = options.validate_on or _source_specs(results, prepared)
    runs = tuple(validate(candidate, spec, results, options.validation, progress) for spec in specs)
    if any(run.validation.losers for run in runs):
        raise ValidationFailed(name, version, runs)
    return prepared.result(publish(bundles, name, version, prepared.files)), list(runs)


def _source_specs(results: str | Path, prepared: PreparedBundle) -> list[Spec]:
    """The distinct specs of the bundle's source runs, as they were stored with each run."""
    from tunectl.store.runs import load_run

    specs: dict[str, Spec] = {}
    for run_id in prepared.source_runs:
        info = load_run(results, run_id)
        if info.kind == "tune" and info.spec_text and info.spec_text not in specs:
            specs[info.spec_text] = parse_spec(info.spec_text, info.spec_path, info.name, stored=True)
    if not specs:
        raise UserError("the bundle's source runs have no specs to validate on; give --spec")
    return list(specs.values())


def _exists(store: BundleStore, name: str, version: str) -> bool:
    """Whether the version is published (a store that cannot be read is found out by ``publish``)."""
    from tunectl.store.bundle import MANIFEST

    try:
        store.read(f"{name}/{version}/{MANIFEST}")
    except (FileNotFoundError, TunectlError):
        return False
    return True
