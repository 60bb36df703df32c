"""From winners to a bundle's task tables: entries, each dimension's bucketing, and the choices made
over regions and by rules once the tables' cells are known.

What a table needs from a task (how shapes bucket) comes from the source runs' plan-time facts
(``tunectl.core.plan.RunFacts``).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from tunectl.core.buckets import Bucketer, make_bucketer
from tunectl.core.errors import UserError
from tunectl.core.plan import RunFacts, selectable_in
from tunectl.core.record import Record, Status
from tunectl.decide.candidates import DEFAULT_CANDIDATES, candidate_lists
from tunectl.decide.probes import cell_of, point_timings, regional
from tunectl.decide.rules import fit_rules, rule_sites, with_rules
from tunectl.decide.select import Winner
from tunectl.runtime.entries import Entry
from tunectl.store.bundle import TaskTable


def entry_of(winner: Winner) -> Entry:
    """The bundle entry a winner becomes."""
    return Entry(
        winner.static,
        winner.shape,
        winner.config,
        winner.rule,
        is_default=winner.is_default,
        median_us=winner.median_us,
        p20_us=winner.p20_us,
        p80_us=winner.p80_us,
        rel_noise=winner.rel_noise,
        num_samples=winner.num_samples,
        default_median_us=winner.default_median_us,
        speedup=winner.speedup,
        speedup_lo=winner.speedup_lo,
        speedup_hi=winner.speedup_hi,
        basis=winner.basis,
        rounds=winner.rounds,
        reason=winner.reason,
        run_id=winner.run_id,
        served_by=winner.served_by,
    )


def bucketing(facts: Mapping[str, RunFacts], task: str) -> dict[str, dict[str, Any]]:
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


def policies(facts: Mapping[str, RunFacts], task: str) -> dict[str, str]:
    return {dim: spec["policy"] for dim, spec in bucketing(facts, task).items()}


def table_of(task: str, winners: Sequence[Winner], facts: Mapping[str, RunFacts]) -> TaskTable:
    """One task's table: its winners, and each shape dimension's policy and tuned points."""
    shapes = bucketing(facts, task)
    for w in winners:
        for dim_name, value in w.shape:
            shapes.setdefault(dim_name, {"policy": "exact", "points": []})["points"].append(value)
    for dim in shapes.values():
        dim["points"] = sorted(set(dim["points"]))
    static_params = tuple(param for param, _ in winners[0].static)
    return TaskTable(task, static_params, shapes, tuple(entry_of(w) for w in winners))


def over_regions(
    winners: list[Winner],
    records: Sequence[Record],
    probes: Sequence[Record],
    facts: Mapping[str, RunFacts],
    tables: Mapping[str, TaskTable],
    margin: float,
    *,
    rules: bool,
) -> list[Winner]:
    """Each probed cell's config chosen over its region (``tunectl.decide.probes``), then each cell
    served a split rule where its sites measured the rule better (``tunectl.decide.rules``; fitted to
    the tuning rows alone, as probe planning fitted it, so the probes measured these very rules)."""
    bucketers = _bucketers(tables)
    timings = point_timings(records, selectable_in(facts.values()))
    if probes:
        winners = regional(winners, probes, timings, bucketers, margin)
    fitted = fit_rules(timings, {f.task: f for f in facts.values()}.values()) if rules else []
    if not fitted:
        return winners
    sites = rule_sites(winners, probes, timings, lambda task, shape: cell_of(shape, bucketers.get(task, {})))
    return with_rules(winners, sites, fitted)


def _bucketers(tables: Mapping[str, TaskTable]) -> dict[str, dict[str, Bucketer]]:
    """Per task, each shape dimension's bucketer over the table's points."""
    return {
        t: {dim: make_bucketer(s["policy"], s["points"]) for dim, s in table.shape_params.items()}
        for t, table in tables.items()
    }


def task_tables(
    winners: list[Winner],
    records: Sequence[Record],
    probes: Sequence[Record],
    facts: Mapping[str, RunFacts],
    margin: float,
    *,
    rules: bool,
    candidates: int = DEFAULT_CANDIDATES,
) -> tuple[list[Winner], list[TaskTable]]:
    """The winners as each task's table holds them (``over_regions``), and those tables, each entry
    with up to ``candidates`` ranked configs to confirm (``tunectl.decide.candidates``; 0: none)."""
    tasks = sorted({w.task for w in winners})
    tables = {t: table_of(t, [w for w in winners if w.task == t], facts) for t in tasks}
    winners = over_regions(winners, records, probes, facts, tables, margin, rules=rules)
    listed = candidate_lists(
        winners,
        point_timings(records, selectable_in(facts.values())),
        probes,
        _bucketers(tables),
        {t: {dim: s["policy"] for dim, s in table.shape_params.items()} for t, table in tables.items()},
        candidates,
    )
    entries = {
        t: tuple(
            dataclasses.replace(entry_of(w), candidates=listed.get((w.task, w.static, w.shape), ()))
            for w in winners
            if w.task == t
        )
        for t in tasks
    }
    return winners, [
        dataclasses.replace(table, entries=entries[t], measured=measured_as(records, t))
        for t, table in tables.items()
    ]


def measured_as(records: Sequence[Record], task: str) -> dict[str, str]:
    """How most of ``task``'s measured rows were timed: L2 state, mode and timing method (``{}``: none
    say), so that confirming a candidate at start-up times it as tuning did."""
    ways = Counter(
        (str(r.l2), str(r.measure_mode), str(r.timing))
        for r in records
        if r.task == task and r.status == Status.OK and r.l2 and r.measure_mode and r.timing
    )
    if not ways:
        return {}
    (l2, mode, timing), _ = ways.most_common(1)[0]
    return {"l2": l2, "mode": mode, "timing": timing}
