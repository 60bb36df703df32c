"""The measurement harness: adaptive sampling into statistics that survive noise.

A sampler runs the kernel once and returns its time in microseconds. ``measure`` warms up, then
samples until at least ``min_samples`` were taken and the relative noise is at or under the target,
or ``max_samples`` or ``max_seconds`` is reached. Noise is the half-width of the p20-p80 band over
the median: robust to the odd preempted sample that a mean and standard deviation are not.
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tunectl.core.spec import MeasureSpec

Sampler = Callable[[], float]


@dataclass(frozen=True)
class Stats:
    median_us: float
    p20_us: float
    p80_us: float
    mean_us: float
    min_us: float
    max_us: float
    num_samples: int
    rel_noise: float
    seconds: float


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of already sorted values."""
    if not sorted_values:
        raise ValueError("no samples")
    pos = (len(sorted_values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarise(samples_us: Sequence[float], seconds: float = 0.0) -> Stats:
    s = sorted(samples_us)
    median = quantile(s, 0.5)
    p20, p80 = quantile(s, 0.2), quantile(s, 0.8)
    # A median at or under zero (a difference method's call lost in the flush's jitter) has no
    # relative noise: infinite, so sampling goes on to its caps rather than stopping on it.
    noise = (p80 - p20) / (2 * median) if median > 0 else math.inf
    return Stats(median, p20, p80, statistics.fmean(s), s[0], s[-1], len(s), noise, seconds)


def measure(sample: Sampler, settings: MeasureSpec, clock: Callable[[], float] = time.perf_counter) -> Stats:
    """Warm up, then sample adaptively (see module doc). ``clock`` bounds the wall time."""
    samples, seconds = collect(sample, settings, clock)
    return summarise(samples, seconds)


def collect(
    sample: Sampler, settings: MeasureSpec, clock: Callable[[], float] = time.perf_counter
) -> tuple[list[float], float]:
    """The samples ``measure`` summarises, and the seconds they took."""
    for _ in range(settings.warmup):
        sample()
    start = clock()
    samples: list[float] = []
    while True:
        samples.append(sample())
        n = len(samples)
        elapsed = clock() - start
        if n >= settings.max_samples or elapsed >= settings.max_seconds:
            break
        # Checking the noise costs a sort; do it on a geometric schedule past the minimum.
        check_now = n == settings.min_samples or n & (n - 1) == 0 or n % 64 == 0
        if n >= settings.min_samples and check_now and summarise(samples).rel_noise <= settings.noise_target:
            break
    return samples, clock() - start


def scaled(settings: MeasureSpec, fraction: float) -> MeasureSpec:
    """A cheaper look (a screening rung): ``fraction`` of the time and sample caps, at least 3 samples
    (never more than the full measurement takes)."""
    if fraction >= 1.0:
        return settings
    min_samples = min(settings.min_samples, max(3, round(settings.min_samples * fraction)))
    return dataclasses.replace(
        settings,
        min_samples=min_samples,
        max_samples=min(settings.max_samples, max(min_samples, round(settings.max_samples * fraction))),
        max_seconds=settings.max_seconds * fraction,
    )


def interleave(
    samplers: Sequence[Sampler],
    rounds: int,
    settings: MeasureSpec,
    seed: int,
    clock: Callable[[], float] = time.perf_counter,
    warmups: Sequence[int] | None = None,
) -> list[list[list[float]]]:
    """Time every sampler in ``rounds`` rounds, each in a fresh random order (seeded): per sampler,
    per round, the samples. A round is a short adaptive measurement with 1/rounds of the time cap.
    ``warmups``: each sampler's warm-up samples (``settings.warmup`` each where not given)."""
    share = scaled(settings, 1.0 / rounds)
    min_samples = max(3, settings.min_samples // 2)
    per_round = dataclasses.replace(
        share, warmup=0, min_samples=min_samples, max_samples=max(min_samples, share.max_samples)
    )
    for sample, warmup in zip(samplers, warmups or [settings.warmup] * len(samplers), strict=True):
        for _ in range(warmup):
            sample()
    order = list(range(len(samplers)))
    rng = random.Random(seed)
    out: list[list[list[float]]] = [[] for _ in samplers]
    for _ in range(rounds):
        rng.shuffle(order)
        for i in order:
            out[i].append(collect(samplers[i], per_round, clock)[0])
    return out


def cpu_sampler(fn: Callable[[], object]) -> Sampler:
    """Times one synchronous call with the monotonic high-resolution clock. A simulated kernel's call
    (one with a ``simulated_us`` attribute, ``tunectl.tasks.cost_model``) is run and timed by the cost it
    reports instead."""
    simulated_us = getattr(fn, "simulated_us", None)
    if simulated_us is not None:

        def reported() -> float:
            fn()
            return float(simulated_us)

        return reported

    def sample() -> float:
        t0 = time.perf_counter_ns()
        fn()
        return (time.perf_counter_ns() - t0) / 1e3

    return sample
