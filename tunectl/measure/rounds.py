"""A comparison's interleaved rounds made into each arm's statistics.

A comparison times its arms in rounds (``tunectl.measure.harness.interleave``); per arm and round the
median of one call is kept, and each arm's speedup over the baseline (the first arm) is the paired
estimate over the rounds (``tunectl.core.stats.paired_speedup``).
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass

from tunectl.core.stats import Speedup, paired_speedup
from tunectl.measure.harness import Stats, summarise

NOT_MEASURABLE = (
    "not measurable: the call took no measurable time beside the cache flush by the difference "
    "method; time it with measure.timing = 'replay', or at a larger shape"
)


class NotMeasurable(RuntimeError):
    """A difference-method median at or under zero: the call is lost in the flush's jitter."""


def round_times(rounds: list[list[list[float]]], layers: int) -> list[list[float]]:
    """Per arm, per round, the median time of one call. For stacks (``layers`` > 0) the last entry
    of ``rounds`` is the thrash-only stack, whose time is taken out of each arm's in the same round."""
    medians = [[statistics.median(samples) for samples in arm] for arm in rounds]
    if not layers:
        if min(min(arm) for arm in medians) <= 0:
            raise NotMeasurable(NOT_MEASURABLE)
        return medians
    thrash = medians[-1]  # 0 where the stack timed its calls alone (CPU)
    net = [[(t - z) / layers for t, z in zip(arm, thrash, strict=True)] for arm in medians[:-1]]
    if min(min(arm) for arm in net) <= 0:
        raise RuntimeError(
            "the stack's calls took no measurable time beside its cache-thrashing kernels; "
            "validate this point with more layers or a larger shape"
        )
    return net


@dataclass(frozen=True)
class ArmStats:
    """One arm's per-call times over the rounds (``stats``: its samples are all the rounds'), and its
    paired speedup over the baseline."""

    stats: Stats
    speedup: Speedup


def arm_stats(baseline: list[float], times: list[float], rounds: list[list[float]]) -> ArmStats:
    """One arm's statistics over the rounds (``times``: its per-round times), and the paired speedup."""
    stats = dataclasses.replace(summarise(times), num_samples=sum(map(len, rounds)))
    return ArmStats(stats, paired_speedup(baseline, times))
