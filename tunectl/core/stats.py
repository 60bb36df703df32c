"""Paired comparisons: how much faster one config is than another, with an interval. Standard library only.

Configs compared on one device are timed in interleaved rounds (each round a short measurement of
every config, in a fresh random order), so slow drift in clocks, temperature or neighbours hits all of
them alike. Each round gives one paired ratio, default time over config time; the estimate is the
geometric mean of those ratios and its 95 % interval a Student-t interval on their logarithms. A
round's time is itself a median of many samples, so the log-ratios are close to normal.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# Two-sided 95 % Student-t quantiles by degrees of freedom; past 30 the normal's 1.96 is close enough.
_T975 = (
    *(12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228),  # 1-10
    *(2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086),  # 11-20
    *(2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042),  # 21-30
)


def t975(dof: int) -> float:
    if dof < 1:
        raise ValueError("an interval needs at least two rounds")
    return _T975[dof - 1] if dof <= len(_T975) else 1.96


@dataclass(frozen=True)
class Speedup:
    """``estimate`` x faster than the baseline, 95 % interval [lo, hi], from ``rounds`` pairs."""

    estimate: float
    lo: float
    hi: float
    rounds: int

    @property
    def log_se(self) -> float:
        """Standard error of log(estimate) (0 when the interval is a point)."""
        return math.log(self.hi / self.estimate) / t975(self.rounds - 1) if self.rounds > 1 else math.inf

    def beats(self, margin: float = 0.0) -> bool:
        """Faster than the baseline beyond noise: the whole interval above 1 + margin."""
        return self.lo > 1.0 + margin

    def loses(self, margin: float = 0.0) -> bool:
        """Slower than the baseline beyond noise: the whole interval below 1 - margin."""
        return self.hi < 1.0 - margin

    def __str__(self) -> str:
        return f"{self.estimate:.3f}x [{self.lo:.3f}, {self.hi:.3f}]"


def paired_speedup(baseline: Sequence[float], other: Sequence[float]) -> Speedup:
    """Baseline time over ``other``'s time, round by round (times positive, same length, >= 2 rounds)."""
    if len(baseline) != len(other):
        raise ValueError(f"rounds differ: {len(baseline)} against {len(other)}")
    if len(baseline) < 2:
        raise ValueError("an interval needs at least two rounds")
    if min(*baseline, *other) <= 0:
        raise ValueError("times must be positive")
    logs = [math.log(b / o) for b, o in zip(baseline, other, strict=True)]
    return _interval(logs)


def _interval(logs: Sequence[float]) -> Speedup:
    n = len(logs)
    mean = math.fsum(logs) / n
    var = math.fsum((x - mean) ** 2 for x in logs) / (n - 1)
    half = t975(n - 1) * math.sqrt(var / n)
    return Speedup(math.exp(mean), math.exp(mean - half), math.exp(mean + half), n)


def geomean_speedup(speedups: Sequence[Speedup]) -> Speedup:
    """Geometric mean over independent shapes; its interval from the shapes' standard errors combined."""
    if not speedups:
        raise ValueError("no speedups")
    logs = [math.log(s.estimate) for s in speedups]
    mean = math.fsum(logs) / len(logs)
    finite = [s.log_se for s in speedups if math.isfinite(s.log_se)]
    if len(finite) < len(speedups):
        return Speedup(math.exp(mean), 0.0, math.inf, min(s.rounds for s in speedups))
    half = 1.96 * math.sqrt(math.fsum(se * se for se in finite)) / len(speedups)
    rounds = min(s.rounds for s in speedups)
    return Speedup(math.exp(mean), math.exp(mean - half), math.exp(mean + half), rounds)


def geomean(values: Sequence[float]) -> float:
    return math.exp(math.fsum(math.log(v) for v in values) / len(values))
