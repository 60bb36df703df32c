"""Runs whose work is known up front: a validation, a holdout, region probes.

Such a run is a run like any other (its rows land in the results dataset and ``tunectl runs`` lists
it); its metadata holds a digest of the items it planned, so that a resume finishes it only with
the same items.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from pathlib import Path

from tunectl.core.errors import UserError
from tunectl.core.plan import WorkItem
from tunectl.core.record import Record
from tunectl.core.spec import Spec
from tunectl.decide.work import FixedItems
from tunectl.orchestrator.submit import Progress, RunOptions, new_run, run
from tunectl.store.results import read_results
from tunectl.store.runs import RunInfo, load_run, refuse_if_running


def run_fixed(
    spec: Spec,
    items: Sequence[WorkItem],
    results: Path,
    kind: str,
    *,
    num_planned: int,
    progress: Progress | None = None,
    options: RunOptions | None = None,
    resume: str | None = None,
) -> tuple[str, list[Record]]:
    """Run ``items`` as they are, as a run of ``kind``: its id and its records. ``resume``: finish that
    stopped run of the same items instead (a finished one is only read)."""
    digest = plan_digest(items)
    if resume is None:
        info = new_run(spec, results=results, num_planned=num_planned, kind=kind)
        info = dataclasses.replace(info, plan_digest=digest)
    else:
        info = _resumable(results, resume, kind, spec, digest)
        if info.state == "finished":
            return info.run_id, read_results(results, run_ids=[info.run_id])
    out = run(
        lambda pool: FixedItems(items, pool),
        spec.resources,
        spec.measure,
        results=results,
        info=info,
        resumed=resume is not None,
        progress=progress,
        options=options or RunOptions(),
    )
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
