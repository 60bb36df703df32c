"""What became of one config in a worker's call, as small frozen values: its check (``Check``), its
measurement (``Timed``, with the drift guard's reading, ``Guarded``, and the device's state around it,
``DeviceState``), a comparison arm's speedup, the point's set-up it paid for, and how it ended
(``Verdict``), gathered in one ``Outcome`` per config. ``tunectl.measure.records.measured`` makes it
a Record's columns, in one place.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tunectl.core.record import Status
from tunectl.core.stats import Speedup
from tunectl.measure.drift import Guarded
from tunectl.measure.harness import Stats
from tunectl.measure.nvml import DeviceState
from tunectl.measure.rounds import NOT_MEASURABLE


@dataclass(frozen=True)
class Verdict:
    """How a config's look ended: its status, and why where that is not ``ok``."""

    status: Status
    message: str = ""


OK = Verdict(Status.OK)
#: the arms of a comparison whose default failed at the point: checked, not timed
NO_BASELINE = Verdict(Status.ERROR, "not compared: the default failed at this point")
CRASHED_ARM = Verdict(
    Status.CRASH,
    "the worker process died while this config was checked at this point; the comparison went on without it",
)


@dataclass(frozen=True)
class Check:
    """A config's output checked against the point's reference: its largest error, the time loading
    (compiling) and first running it took, and the (atol, rtol) it missed, where it did."""

    max_abs_err: float
    compile_ms: float
    missed: tuple[float, float] | None = None

    @property
    def verdict(self) -> Verdict | None:
        """``wrong_result`` where the output missed its tolerance (never timed, never a winner)."""
        if self.missed is None:
            return None
        atol, rtol = self.missed
        message = f"max abs error {self.max_abs_err:.3g} exceeds atol={atol:g} rtol={rtol:g}"
        return Verdict(Status.WRONG_RESULT, message)

    def again(self) -> Check:
        """The check a later look at the point carries: its error, nothing loaded or compiled."""
        return dataclasses.replace(self, compile_ms=0.0)


@dataclass(frozen=True)
class Timed:
    """A measurement as its record keeps it: the statistics, the calls one sample timed (K), and the
    wall time it took (warm-up, samples, re-measures and the drift guard's own; a comparison's arms
    share all its rounds')."""

    stats: Stats
    calls_per_sample: int
    measure_ms: float


#: a measurement's statistics, and the drift guard's reading where it was guarded
Measured = tuple[Stats, Guarded | None]


@dataclass(frozen=True)
class Outcome:
    """What became of one config in a call; a part it never reached is None. ``failure``: how it
    ended where a step failed (else its check's verdict, else ``ok``). ``setup_ms``: building the
    point's inputs and reference (a batch's first member carries it, a comparison's every arm);
    ``speedup``: a comparison arm's over the default; ``device``: the GPU's state around the samples."""

    check: Check | None = None
    setup_ms: float | None = None
    timed: Timed | None = None
    speedup: Speedup | None = None
    guard: Guarded | None = None
    device: DeviceState | None = None
    failure: Verdict | None = None

    @property
    def verdict(self) -> Verdict:
        """The record's status and message."""
        return self.failure or (self.check and self.check.verdict) or OK

    def measured(self, found: Measured, calls: int) -> Outcome:
        """With its measurement (``found``) of ``calls`` calls a sample; an ``error`` where the method
        could not tell the call from the flush (a median at or below zero)."""
        stats, guard = found
        if stats.median_us <= 0:
            return self.failed(Verdict(Status.ERROR, f"{NOT_MEASURABLE} (median {stats.median_us:.3g} us)"))
        guard_ms = guard.guard_s * 1e3 if guard is not None else 0.0
        timed = Timed(stats, calls, stats.seconds * 1e3 + guard_ms)
        return dataclasses.replace(self, timed=timed, guard=guard)

    def failed(self, verdict: Verdict) -> Outcome:
        """Ended as ``verdict`` says; what it got before that (its check, the device's state) stays."""
        return dataclasses.replace(self, failure=verdict)
