"""The measurement harness: adaptive sampling into statistics that survive noise.

A sampler runs the kernel once and returns its time in microseconds. ``measure`` warms up, then
samples until at least ``min_samples`` were taken and the relative noise is at or under the target,
or ``max_samples`` or ``max_seconds`` is reached. Noise is the half-width of the p20-p80 band over
the median: robust to the odd preempted sample that a mean and standard deviation are not.

Samples are taken in *chunks*: a sampler that has a ``many(n)`` method (a GPU sampler:
``tunectl.measure.difference``) queues a chunk's launches at once and waits for the device once,
so the host's wait and the spin ahead of each launch are paid per chunk, not per sample. The noise
is checked after each chunk; chunks grow geometrically (to the minimum, then doubling the count,
at most ``MAX_CHUNK``) and never past what the time cap leaves at the pace seen so far. A sampler's
``expected_us`` (its build's estimate of one sample, where known) sizes the first chunk; without
it the first chunk is one sample. Warm-up samples run at the head of the first chunk and are dropped.
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

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


def measure(
    sample: Sampler,
    settings: MeasureSpec,
    clock: Callable[[], float] = time.perf_counter,
    *,
    between: Callable[[float | None], None] | None = None,
    chunk_s: Callable[[], float] | None = None,
) -> Stats:
    """Warm up, then sample adaptively (see module doc). ``clock`` bounds the wall time; ``between``
    and ``chunk_s`` as ``collect`` takes them."""
    samples, seconds = collect(sample, settings, clock, between=between, chunk_s=chunk_s)
    return summarise(samples, seconds)


def collect(
    sample: Sampler,
    settings: MeasureSpec,
    clock: Callable[[], float] = time.perf_counter,
    *,
    between: Callable[[float | None], None] | None = None,
    chunk_s: Callable[[], float] | None = None,
) -> tuple[list[float], float]:
    """The samples ``measure`` summarises, and the seconds they took (module doc: chunks), not counting
    ``between``'s. ``between(pace_s)`` runs before each chunk (the drift guard's looks, whose time is
    the guard's own), told the seconds a sample has taken so far (None before the first); ``chunk_s()``
    says how long the next chunk may last."""
    warmup = settings.warmup  # taken with the first chunk, and dropped
    start = clock()
    expected_us = getattr(sample, "expected_us", None)
    pace_s = expected_us * 1e-6 if expected_us else None  # seconds per sample, once known
    samples: list[float] = []
    sampling_s = 0.0  # in the chunks themselves (not in ``between``)
    between_s = 0.0
    while True:
        if between is not None:
            looked = clock()
            between(pace_s if samples else None)
            between_s += clock() - looked
        left_s = settings.max_seconds - (clock() - start)
        n = next_chunk(len(samples), settings, min(left_s, chunk_s()) if chunk_s else left_s, pace_s)
        chunk_start = clock()
        samples += take(sample, warmup + n)[warmup:]
        sampling_s += clock() - chunk_start
        warmup = 0
        pace_s = sampling_s / len(samples)
        if len(samples) >= settings.max_samples or clock() - start >= settings.max_seconds:
            break
        if len(samples) >= settings.min_samples and summarise(samples).rel_noise <= settings.noise_target:
            break
    return samples, clock() - start - between_s


#: the most samples queued at once (their launches, and one wait for the device)
MAX_CHUNK = 64


def next_chunk(taken: int, settings: MeasureSpec, left_s: float, pace_s: float | None) -> int:
    """How many samples to take next: up to the minimum, then as many again as taken (at most
    ``MAX_CHUNK``), within ``max_samples`` and the ``left_s`` seconds a chunk may last at ``pace_s`` a
    sample (one sample where the pace is not known yet)."""
    goal = settings.min_samples - taken if taken < settings.min_samples else min(taken, MAX_CHUNK)
    n = min(max(1, goal), settings.max_samples - taken)
    if pace_s is None:
        return 1
    if pace_s > 0:
        n = min(n, max(1, math.ceil(left_s / pace_s)))
    return n


def take(sample: Sampler, n: int) -> list[float]:
    """``n`` samples: one chunk where the sampler queues chunks (``many``), else one at a time."""
    if n <= 0:
        return []
    many = getattr(sample, "many", None)
    if many is not None:
        return list(many(n))
    return [sample() for _ in range(n)]


def announced(sample: Sampler, tell: Callable[[], None]) -> Sampler:
    """``sample``, calling ``tell`` once, as its first samples are taken (a worker notes whose
    measurement runs: a death while timing it is charged to it alone); it takes chunks as ``sample``
    does."""
    told = False

    def many(n: int) -> list[float]:
        nonlocal told
        if not told:
            told = True
            tell()
        return take(sample, n)

    return chunked(many, expected_us=getattr(sample, "expected_us", None))


def chunked(many: Callable[[int], list[float]], **attributes: Any) -> Sampler:
    """A sampler made of ``many(n)`` (n samples taken as one chunk): a call is one sample, ``take``
    uses ``many``; ``attributes`` (K, its launches, an estimate of a sample) are set on it."""

    def one() -> float:
        return many(1)[0]

    one.many = many  # type: ignore[attr-defined]
    for name, value in attributes.items():
        setattr(one, name, value)
    return one


def calls_per_sample(sample: Sampler) -> int:
    """How many kernel calls one of ``sample``'s samples times (``tunectl.measure.difference``)."""
    return int(getattr(sample, "num_calls", 1))


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
    retire: Callable[[list[list[list[float]]]], Iterable[int]] | None = None,
) -> list[list[list[float]]]:
    """Time every sampler in ``rounds`` rounds, each in a fresh random order (seeded): per sampler,
    per round, the samples. A round is a short adaptive measurement with 1/rounds of the time cap.
    ``warmups``: each sampler's warm-up samples (``settings.warmup`` each where not given).
    ``retire(samples so far)``, asked after each round: samplers to time in no later round (their
    lists stop there; ``tunectl.measure.rounds.racing``)."""
    share = scaled(settings, 1.0 / rounds)
    min_samples = max(3, settings.min_samples // 2)
    per_round = dataclasses.replace(
        share, warmup=0, min_samples=min_samples, max_samples=max(min_samples, share.max_samples)
    )
    for sample, warmup in zip(samplers, warmups or [settings.warmup] * len(samplers), strict=True):
        take(sample, warmup)
    order = list(range(len(samplers)))
    rng = random.Random(seed)
    out: list[list[list[float]]] = [[] for _ in samplers]
    retired: set[int] = set()
    for r in range(rounds):
        rng.shuffle(order)
        for i in order:
            if i not in retired:
                out[i].append(collect(samplers[i], per_round, clock)[0])
        if retire is not None and r + 1 < rounds:
            retired.update(retire(out))
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
