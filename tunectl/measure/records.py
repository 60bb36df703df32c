"""A worker call's records, made from small frozen values: what every record of the call shares
(``CallContext``), which item a record is for (``Member``), and what became of it. Two constructors:
``measured`` (checked, and timed where it passed) and ``failed`` (a status and a message, nothing
measured). A call's records are always a list: one per plain item, per batch member, per arm.

The driver makes records the same way for items that got no answer from a worker (a crash, a
timeout: ``tunectl.orchestrator.workqueue.failure_records``), from the item alone.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tunectl.core.keys import key_text
from tunectl.core.plan import WorkItem, member_id
from tunectl.core.record import Phase, Record, Status, Timing, TimingMethod
from tunectl.measure.harness import Stats
from tunectl.measure.rounds import NOT_MEASURABLE


@dataclass(frozen=True)
class CallContext:
    """The fields every record of one call shares: the run, the point, the kind of look, and where
    and how it was measured (the device's fields stay empty where no worker measured it)."""

    run_id: str
    task: str
    static_key: str
    shape_key: str
    phase: Phase
    rung: int | None
    group_id: str = ""
    rounds: int | None = None
    layers: int | None = None
    measure_mode: TimingMethod = TimingMethod.NONE
    timing: Timing = Timing.REPLAY
    l2: str = ""
    bytes_moved: int | None = None
    device_name: str = ""
    device_kind: str = ""
    host: str = ""
    worker: str = ""
    env_json: str = "{}"
    started_at: float = 0.0

    @classmethod
    def of(cls, run_id: str, item: WorkItem, **measured_on: Any) -> CallContext:
        """The context of ``item``'s call; ``measured_on``: the device's fields, where a worker ran it."""
        return cls(
            run_id=run_id,
            task=item.task,
            static_key=key_text(item.static),
            shape_key=key_text(item.shape),
            phase=Phase(item.phase),
            rung=item.rung,
            group_id=item.item_id if item.arms else "",
            rounds=(item.rounds or None) if item.arms else None,
            layers=(item.layers or None) if item.arms else None,
            **measured_on,
        )


@dataclass(frozen=True)
class Member:
    """One record's item: its id, its config, and whether that config is the point's default."""

    item_id: str
    config_key: str
    is_default: bool


def members_of(item: WorkItem) -> list[Member]:
    """The records ``item`` gets, in order: one per arm of a comparison (the default first), one per
    member of a batch, or one."""
    if item.arms:
        return [Member(member_id(item.item_id, a), key_text(a), i == 0) for i, a in enumerate(item.arms)]
    return [Member(m.item_id, key_text(m.config), m.is_default) for m in item.unbatched()]


def measured(context: CallContext, member: Member, fields: Mapping[str, Any]) -> Record:
    """The record of a member the worker checked and, where its check passed, timed: ``fields`` are
    what it found: its status, and the check's, the measurement's, the guard's and the device state's
    fields, or a message where a step failed."""
    return Record(
        **dataclasses.asdict(context),
        item_id=member.item_id,
        config_key=member.config_key,
        is_default=member.is_default,
        **fields,
        finished_at=time.time(),
    )


def check_fields(
    max_abs_err: float, failed_at: tuple[float, float] | None, compile_ms: float
) -> dict[str, Any]:
    """A correctness check's record fields; ``failed_at``: the (atol, rtol) the output missed, where it
    did (``wrong_result``: never timed, never a winner)."""
    fields: dict[str, Any] = {"max_abs_err": max_abs_err, "compile_ms": compile_ms}
    if failed_at is None:
        return fields
    atol, rtol = failed_at
    message = f"max abs error {max_abs_err:.3g} exceeds atol={atol:g} rtol={rtol:g}"
    return {**fields, "status": Status.WRONG_RESULT, "message": message}


def stat_fields(stats: Stats, num_calls: int, extra: Mapping[str, Any]) -> dict[str, Any]:
    """A measurement's record fields: its statistics, K (``num_calls``), and ``extra`` (the drift
    guard's); an ``error`` where the method could not tell the call from the flush (a median at or
    below zero)."""
    if stats.median_us <= 0:
        return {"status": Status.ERROR, "message": f"{NOT_MEASURABLE} (median {stats.median_us:.3g} us)"}
    guard_ms = extra.get("guard_ms") or 0.0
    return {
        "status": Status.OK,
        "median_us": stats.median_us,
        "p20_us": stats.p20_us,
        "p80_us": stats.p80_us,
        "mean_us": stats.mean_us,
        "min_us": stats.min_us,
        "max_us": stats.max_us,
        "num_samples": stats.num_samples,
        "calls_per_sample": num_calls,
        "rel_noise": stats.rel_noise,
        "measure_ms": stats.seconds * 1e3 + guard_ms,
        **extra,
    }


def failed(context: CallContext, member: Member, status: Status | str, message: str) -> Record:
    """The record of a member that got no measurement: ``status`` and why."""
    return measured(context, member, {"status": Status(status), "message": message})
