"""``tunectl validate`` and ``tunectl export bundle --validate`` as library calls.

A validation is a run like any other (its rows land in the results dataset, phase ``validate``, and
``tunectl runs`` lists it), whose work is fixed up front: one stacked comparison per point where
the bundle chose a config other than the default (``tunectl.validate``).
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.submit import Progress, submit
from tunectl.bundle import MANIFEST, publish, publish_local
from tunectl.errors import TunectlError, UserError
from tunectl.export import ExportResult, PreparedBundle, prepare_bundle
from tunectl.results import read_results
from tunectl.runs import load_run
from tunectl.spec import load_spec
from tunectl.stores import open_store, read_bundle
from tunectl.validate import (
    DEFAULT_LAYERS,
    DEFAULT_ROUNDS,
    FixedItems,
    Skipped,
    Validation,
    describe_point,
    plan_validation,
    read_validation,
)  # fmt: skip


class ValidationFailed(TunectlError):
    """The bundle loses to the untuned defaults beyond noise somewhere; it was not published."""


@dataclass(frozen=True)
class ValidationRun:
    run_id: str | None  # None when there was nothing to measure
    spec: str
    validation: Validation
    skipped: tuple[Skipped, ...]


def validate(
    bundle: str | Path,
    spec_path: str | Path,
    results: str | Path = "tunectl-results",
    layers: int = DEFAULT_LAYERS,
    rounds: int = DEFAULT_ROUNDS,
    progress: Progress | None = None,
    **run_options: Any,
) -> ValidationRun:
    """Run ``spec_path``'s points as ``layers``-layer stacks, ``bundle``'s configs against the defaults.

    ``run_options`` go to ``orchestrator.submit.submit`` (address, num_gpus, connect_fn, ...).
    """
    if layers < 1 or rounds < 2:
        raise UserError("--layers must be at least 1 and --rounds at least 2")
    spec = load_spec(spec_path)
    loaded = read_bundle(bundle)
    items, skipped = plan_validation(spec, loaded, layers, rounds)
    if not items:
        return ValidationRun(None, str(spec_path), Validation((), layers, rounds), tuple(skipped))
    out = submit(
        str(spec_path), results, progress=progress, kind="validate",
        work_for=lambda pool: FixedItems(items, pool), **run_options,
    )  # fmt: skip
    rows = read_results(results, run_ids=[out.run_id])
    return ValidationRun(out.run_id, str(spec_path), read_validation(rows), tuple(skipped))


def export_validated(
    results: str | Path,
    name: str,
    version: str,
    out: str | Path,
    run_ids: Sequence[str] | None = None,
    task: str | None = None,
    device: str | None = None,
    specs: Sequence[str | Path] = (),
    layers: int = DEFAULT_LAYERS,
    rounds: int = DEFAULT_ROUNDS,
    **run_options: Any,
) -> tuple[ExportResult, list[ValidationRun]]:
    """Build the bundle, validate it (on ``specs``, default the specs of its source runs), and publish it
    only if no point loses to the defaults beyond noise. Raises ``ValidationFailed`` otherwise."""
    store = open_store(out)
    if _exists(store, name, version):
        raise UserError(f"bundle {name}/{version} already exists in {out}; versions are immutable")
    prepared = prepare_bundle(results, name, version, run_ids, task, device)
    with tempfile.TemporaryDirectory(prefix="tunectl-validate-") as tmp:
        candidate = publish_local(Path(tmp) / "bundles", name, version, prepared.files)
        runs = [
            validate(candidate, spec, results, layers, rounds, **run_options)
            for spec in (specs or _source_specs(results, prepared, Path(tmp)))
        ]
    losers = [p for run in runs for p in run.validation.losers]
    if losers:
        where = "; ".join(f"{describe_point(p)}: {p.speedup}" for p in losers[:5])
        raise ValidationFailed(
            f"not published: the bundle is slower than the defaults beyond noise at {len(losers)} point(s): "
            f"{where}{' ...' if len(losers) > 5 else ''}"
        )
    location = publish(store, name, version, prepared.files)
    return ExportResult(location, prepared.winners, prepared.source_runs), runs


def _source_specs(results: str | Path, prepared: PreparedBundle, directory: Path) -> list[Path]:
    """The distinct specs of the bundle's source runs, written out as files."""
    texts: dict[str, str] = {}
    for run_id in prepared.source_runs:
        info = load_run(results, run_id)
        if info.kind == "tune" and info.spec_text:
            texts.setdefault(info.spec_text, info.name)
    paths = []
    for i, (text, run_name) in enumerate(texts.items()):
        path = directory / f"{run_name}-{i}.toml"
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    if not paths:
        raise UserError("the bundle's source runs have no specs to validate on; give --spec")
    return paths


def _exists(store: Any, name: str, version: str) -> bool:
    """Whether the version is published (a store that cannot be read is found out by ``publish``)."""
    try:
        store.read(f"{name}/{version}/{MANIFEST}")
    except (FileNotFoundError, TunectlError):
        return False
    return True
