"""``tunectl probe`` as a library call: a tuning run's cells measured inside their regions.

A probe run is a run like a validation (its rows land in the results dataset, phase ``probe``, and
``tunectl runs`` lists it) whose work is fixed up front from the tuning run's records
(``tunectl.decide.probes``); export reads its rows beside the tuning run's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunectl.core.errors import UserError
from tunectl.core.plan import default_of, selectable_in
from tunectl.core.record import SELECTED_PHASES
from tunectl.core.registry import get_task
from tunectl.core.spec import parse_spec
from tunectl.decide.probes import DEFAULT_PER_CELL, DEFAULT_SHORTLIST, ProbePlan, probes_of
from tunectl.decide.validate import DEFAULT_ROUNDS
from tunectl.orchestrator.submit import Progress
from tunectl.orchestrator.validate import run_fixed
from tunectl.store.results import read_results
from tunectl.store.runs import effective_state, load_run, run_exists, run_facts


@dataclass(frozen=True)
class ProbeRun:
    run_id: str | None  # None when there was nothing to measure
    source: str  # the tuning run probed
    plan: ProbePlan


def probe(
    results: str | Path,
    source: str,
    *,
    per_cell: int = DEFAULT_PER_CELL,
    shortlist: int = DEFAULT_SHORTLIST,
    rounds: int = DEFAULT_ROUNDS,
    progress: Progress | None = None,
    resume: str | None = None,
    **options: Any,
) -> ProbeRun:
    """Measure ``per_cell`` shapes inside the region of every cell of tuning run ``source``'s grid, the
    default against the cell's short list (``shortlist`` fastest), as a run of its own. ``resume``: a
    stopped probe run of the same source and options to finish.

    ``options``: ``tunectl.orchestrator.submit.RunOptions`` fields (address, num_gpus, connect_fn, ...).
    """
    if per_cell < 1 or shortlist < 1 or rounds < 2:
        raise UserError("--per-cell and --shortlist must be at least 1, --rounds at least 2")
    if not run_exists(results, source):
        raise UserError(f"no run {source} in {results}")
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
    task = get_task(spec.task)
    plan = probes_of(
        spec, [r for r in read_results(results, run_ids=[source]) if r.phase in SELECTED_PHASES],
        selectable_in([facts]), lambda static: default_of(task, static, spec.default),
        lambda static, shape: task.check_point(dict(static), dict(shape)),
        per_cell=per_cell, shortlist=shortlist, rounds=rounds, facts=facts,
    )  # fmt: skip
    if not plan.items:
        return ProbeRun(None, source, plan)
    planned = sum(len(item.arms) for item in plan.items)
    run_id, _ = run_fixed(spec, plan.items, Path(results), "probe", planned, progress, options, resume)
    return ProbeRun(run_id, source, plan)
