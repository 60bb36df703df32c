"""A comparison's interleaved rounds made into each arm's statistics.

A comparison times its arms in rounds (``tunectl.measure.harness.interleave``); per arm and round the
median of one call is kept, and each arm's speedup over the baseline (the first arm) is the paired
estimate over the rounds (``tunectl.core.stats.paired_speedup``).

*Racing* (``racing``): after ``RACE_AFTER`` rounds, an arm slower than the round's fastest arm by more
than ``RACE_MARGIN`` in every round so far is timed no further. Such an arm is out of the running for
any decision made with a margin of a few percent; the rounds it was timed in give its time and its
paired speedup (over those rounds: a wider interval, as its ``rounds`` say), and the comparison ends
sooner. The baseline is never retired: every arm's speedup is paired with it round by round. In the
accurate page-128 bundle's probes 42 % of the arms ended more than 5 % behind their point's fastest;
racing, its probes took 17 % less time and its finals 24 % on an H200, its held-out figures the same
within 0.001 (``benchmarks/results/throughput.md``).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from tunectl.core.record import Phase
from tunectl.core.stats import Speedup, paired_speedup
from tunectl.measure.harness import Stats, summarise

NOT_MEASURABLE = (
    "not measurable: the call took no measurable time beside the cache flush by the difference "
    "method; time it with measure.timing = 'replay', or at a larger shape"
)


#: rounds every arm is timed in before one may be retired, and how far behind it must be in each
RACE_AFTER = 3
RACE_MARGIN = 0.05
#: the comparisons that race: finals and probes. Held-out shapes (every config timed there is the oracle
#: a bundle is scored against) and validation stacks time every arm in every round.
RACED = (Phase.FINAL, Phase.PROBE)


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
    """One arm's statistics over the rounds (``times``: its per-round times), and the paired speedup
    over the rounds it was timed in (all of the baseline's, or the first ones where it was retired).

    The median, quantiles, extremes and noise are the rounds' (each round counts once); the mean is
    per call over all the arm's samples, each round's at its time: ``num_samples`` times it is the
    kernel time the arm's samples took (a round slowed by a neighbour stops early on its time cap,
    and counting it once per round would make its few samples weigh as much as a quiet round's)."""
    counts = [len(r) for r in rounds[: len(times)]]
    mean = math.fsum(n * t for n, t in zip(counts, times, strict=True)) / max(1, sum(counts))
    stats = dataclasses.replace(summarise(times), mean_us=mean, num_samples=sum(counts))
    return ArmStats(stats, paired_speedup(baseline[: len(times)], times))


def racing_for(phase: str, *, stacked: bool) -> Callable[[list[list[list[float]]]], set[int]] | None:
    """The ``retire`` rule of a comparison of ``phase`` (``stacked``: its arms are layer stacks)."""
    return racing() if phase in RACED and not stacked else None


def racing() -> Callable[[list[list[list[float]]]], set[int]]:
    """The ``retire`` rule of ``interleave`` (module doc): given each arm's samples per round so far,
    the arms (never the baseline, the first) to time no further."""

    def retire(rounds: list[list[list[float]]]) -> set[int]:
        done = max(len(arm) for arm in rounds)
        if done < RACE_AFTER:
            return set()
        running = [i for i, arm in enumerate(rounds) if len(arm) == done]
        medians = {i: [statistics.median(samples) for samples in rounds[i]] for i in running}
        fastest = [min(medians[i][r] for i in running) for r in range(done)]
        if min(fastest) <= 0:  # a call lost in the flush's jitter: nothing to race on
            return set()
        limit = [(1 + RACE_MARGIN) * f for f in fastest]
        behind = {i for i in running if all(t > m for t, m in zip(medians[i], limit, strict=True))}
        return behind - {0}

    return retire
