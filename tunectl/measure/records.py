"""A worker call's records, made from small frozen values: what every record of the call shares
(``CallContext``), which item a record is for (``Member``), and what became of it. Two constructors:
``measured`` (checked, and timed where it passed: an ``Outcome``, ``tunectl.measure.outcome``) and
``failed`` (a status and a message, nothing measured). A call's records are always a list: one per
plain item, per batch member, per arm.

The driver makes records the same way for items that got no answer from a worker (a crash, a
timeout: ``tunectl.orchestrator.workqueue.failure_records``), from the item alone.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from tunectl.core.keys import key_text
from tunectl.core.plan import WorkItem, member_id
from tunectl.core.record import Phase, Record, Status, Timing, TimingMethod
from tunectl.measure.outcome import Outcome, Verdict


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


def measured(context: CallContext, member: Member, outcome: Outcome) -> Record:
    """The record of a member the worker checked and, where its check passed, timed: ``outcome`` is
    what became of it (``tunectl.measure.outcome``), each of its parts made the record's columns here."""
    verdict, check, timed, speedup = outcome.verdict, outcome.check, outcome.timed, outcome.speedup
    stats, guard, device = timed.stats if timed else None, outcome.guard, outcome.device
    shared = dataclasses.asdict(context)
    if speedup is not None:  # the rounds this arm was timed in (a retired arm: fewer than the item's)
        shared["rounds"] = speedup.rounds
    return Record(
        **shared,
        item_id=member.item_id,
        config_key=member.config_key,
        is_default=member.is_default,
        status=verdict.status,
        message=verdict.message,
        median_us=stats.median_us if stats else None,
        p20_us=stats.p20_us if stats else None,
        p80_us=stats.p80_us if stats else None,
        mean_us=stats.mean_us if stats else None,
        min_us=stats.min_us if stats else None,
        max_us=stats.max_us if stats else None,
        num_samples=stats.num_samples if stats else None,
        calls_per_sample=timed.calls_per_sample if timed else None,
        rel_noise=stats.rel_noise if stats else None,
        max_abs_err=check.max_abs_err if check else None,
        compile_ms=check.compile_ms if check else None,
        setup_ms=outcome.setup_ms,
        measure_ms=timed.measure_ms if timed else None,
        guard_ms=guard.guard_s * 1e3 if guard else None,
        speedup=speedup.estimate if speedup else None,
        speedup_lo=speedup.lo if speedup else None,
        speedup_hi=speedup.hi if speedup else None,
        sm_clock_mhz=device.sm_clock_mhz if device else None,
        temperature_c=device.temperature_c if device else None,
        power_w=device.power_w if device else None,
        throttled=device.throttled if device else None,
        throttle_reasons=device.throttle_reasons if device else None,
        reference_us=guard.reference_us if guard else None,
        reference_ratio=guard.reference_ratio if guard else None,
        drift=guard.drift if guard else None,
        remeasured=guard.remeasured if guard else None,
        finished_at=time.time(),
    )


def failed(context: CallContext, member: Member, status: Status | str, message: str) -> Record:
    """The record of a member that got no measurement: ``status`` and why."""
    return measured(context, member, Outcome(failure=Verdict(Status(status), message)))
