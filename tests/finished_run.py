"""A finished tuning run written without Ray: the run's own search, answered by a simulated device.

The search (``tunectl.decide.work.tuning_work``) hands out items as a dispatcher would; each is answered
with the rows a device would return (the config's time from an oracle, the finals' paired speedups),
and every item lands in a part of its own, so a test can damage the part of one item.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Callable
from pathlib import Path

from tests.unit.test_search import true_time
from tunectl.core.keys import Key, key_text
from tunectl.core.plan import WorkItem, plan
from tunectl.core.record import Record
from tunectl.core.registry import get_task
from tunectl.core.spec import parse_spec
from tunectl.decide.work import tuning_work
from tunectl.store.results import ResultsWriter, part_files, read_part_records
from tunectl.store.runs import RunInfo, save_run

RUN = "r20261201-000000-abcdef"
ENV = json.dumps({"device_name": "cpu: test", "device_kind": "cpu"})
Tweak = Callable[[Record], Record]  # what the device did to a row (drift, few samples, noise)
Oracle = Callable[[WorkItem], float]  # an item's true time (µs): the simulated device's


def _row(item: WorkItem, config: Key, member: int, clock: itertools.count[int], oracle: Oracle) -> Record:
    t = oracle(dataclasses.replace(item, config=config))
    speedup: dict[str, float] = {}
    if item.arms:
        base = oracle(dataclasses.replace(item, config=item.arms[0]))
        speedup = {"speedup": base / t, "speedup_lo": base / t * 0.99, "speedup_hi": base / t * 1.01}
    return Record(
        run_id=RUN,
        item_id=item.record_ids()[member],
        task=item.task,
        static_key=key_text(item.static),
        shape_key=key_text(item.shape),
        config_key=key_text(config),
        status="ok",
        phase=item.phase,
        is_default=member == 0 if item.arms else item.is_default,
        median_us=t,
        p20_us=t * 0.99,
        p80_us=t * 1.01,
        rel_noise=0.01,
        num_samples=10,
        rung=item.rung,
        rounds=item.rounds or None,
        group_id=item.item_id if item.arms else "",
        device_name="cpu: test",
        device_kind="cpu",
        env_json=ENV,
        finished_at=float(next(clock)),
        **speedup,
    )


def answer(
    item: WorkItem, clock: itertools.count[int], tweak: Tweak, oracle: Oracle = true_time
) -> list[Record]:
    """The rows a device returns for ``item``: one, or one per arm of a comparison."""
    arms = item.arms or (item.config,)
    return [tweak(_row(item, config, i, clock, oracle)) for i, config in enumerate(arms)]


def finished_run(
    root: Path,
    spec_text: str,
    tweak: Tweak = lambda r: r,
    oracle: Oracle = true_time,
    rows_per_part: int = 1,
) -> Path:
    """Run ``spec_text``'s search to its end into the results dataset ``root``, one part per item (up
    to ``rows_per_part`` rows a part), and record the run as finished; ``root``."""
    spec = parse_spec(spec_text, "tiny.toml", "tiny")
    work, task = plan(spec), get_task(spec.task)
    lane = tuning_work(work, lambda s, sh: task.check_point(dict(s), dict(sh)), None)
    writer, clock = ResultsWriter(root, max_rows=rows_per_part), itertools.count(1)
    queue = lane.draw(1_000_000)
    num_rows = 0
    while queue:
        rows = answer(queue.pop(0), clock, tweak, oracle)
        writer.append_item(rows)
        num_rows += len(rows)
        queue += lane.follow_up(rows)
    writer.close()
    save_run(
        root,
        RunInfo(
            RUN, "tiny", spec.task, "tiny.toml", spec_text, "finished", num_rows, 0.0, 1.0, facts=work.facts
        ),
    )
    return root


def part_of(root: Path, found: Callable[[Record], bool]) -> Path:
    """The part holding a row ``found`` picks."""
    return next(p for p in part_files(root) if any(map(found, read_part_records(p))))


def damage(path: Path) -> None:
    """Cut the file to half its size, as a full disk or a lost copy leaves it."""
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
