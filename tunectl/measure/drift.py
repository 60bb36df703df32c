"""The drift guard: notice when the device changes under a point's measurements, and measure again.

A GPU can slow down in the middle of a worker's life (a software power cap pulling the SM clock from
1980 to 1515 MHz, a neighbour's load): an H200 read one kernel at 1943 µs, then 2277 and 2479 µs
later in the same process. A config measured once, stopping at ten quiet samples, cannot show it.

The guard times a fixed *reference*: a copy of twice the L2 and a matrix product (on a GPU; a small copy
and product on a CPU), so a slower memory clock and a slower SM clock both move it. On an H200 the copy
is about a quarter of it (``benchmarks/gpu/reference_parts.py``: a 120 MiB copy took 62 µs, a 2048
product 23 µs; the 4096 one ~8 times that, by estimate). A reference mostly of copy (a 2048 product:
73 % copy) was tried there, to feel memory-side slowdowns as the memory-bound decode kernels do: over
two runs of the decode spec it flagged nothing more, read 1.6 % from its level at the median where this
one reads 0.6 %, and cost the guard twice the time. It is one kernel for the whole worker life, not the
point's default config: it is the same at every point and on every worker (a report can set one worker's
life beside another's), it runs where a point's default fails, and it needs no compiling. The reference
is timed:

- when a worker starts on a point (its first item there, or the first after another point's), which
  is the point's *level*: at least ten samples, to half a percent of noise where 50 ms allow it
  (``LEVEL_SETTINGS``); and
- before and after every measurement at the point, and, inside a measurement, every ``LOOK_EVERY_S``
  between its chunks of samples (``tunectl.measure.harness``; a chunk ends by the time a look is
  due): a *check* of at least five samples, to 1 % of noise, at most 30 ms
  (``CHECK_SETTINGS``). The check after one measurement is the check before the next where it is
  younger than ``CHECK_REUSE_S`` and found the reference at its level: items follow each other
  within tens of milliseconds, and a fresh check there saw the same device (the checks stay spaced
  as the looks inside a long measurement are). A check is held to the level's precision
  where it counts: a shift is only called past 3 % (below), and a check whose noise is at most 1 %
  leaves that limit where it is; a noisier one stops at 30 ms and widens the limit, as a longer one
  would have to. Checks as long as the level (up to 50 ms each side, on an H200 twice a short
  config's own measurement) bought nothing the 3 % limit could use. A measurement is judged by the
  reading that strayed furthest: a shift that ends inside a measurement shows in the check before
  it, one that starts inside it in the check after, and one that comes and goes inside a long
  measurement in a look (on an H200 a neighbour's burst that ended mid-measurement, seen only after
  it, read a config 2.3x slow with no flag; a 3 s burst inside a 15 ms kernel's measurement read
  2.07x with clean checks on both sides). The sample after a look is run and dropped: the look's
  copy has evicted what a warm-L2 measurement keeps in the cache.

A sample of the reference lasts as long as the measurement's samples (``calls`` reference calls in
one timed window, up to ``REFERENCE_SPAN_MAX_US``; its reading is per call). A neighbour process
shares the GPU in time slices: a window shorter than a slice rarely meets a switch, so a single
~200 µs reference call read clean through a burst that doubled a 15 ms kernel (an H200, cuDNN SDPA
at 64 x 8192, 2.09x with no flag). A window as long as the measured sample meets as many switches
as it does. The looks and the check after a measurement are sized by its samples' pace so far (a
chunk's wall time over its samples), the check before it by the previous measurement's at the point
(one call at a point's first item, which is the level; readings per call compare across sizes).

The reference *moved* when a reading's median and the level's lie each outside the other's p20-p80 band
and differ by more than ``max(MIN_SHIFT, NOISE_FACTOR x the larger relative noise)``: 3 % or three times
the noise; and whenever they differ by more than ``MAX_EXCUSED_SHIFT`` (25 %), however noisy the reading.
Noise excuses a few percent: a check whose median is 25 % off saw a device that changed, and one whose
band reaches back to the level besides saw it in two states (an H100 read one at 2.49 times its level, its
spread wide enough to excuse it, and a 245 µs kernel measured beside it 13 % slow went unflagged:
benchmarks/results/drift_demo_2026-12-05c.md). Then the measurement just made is made again, up to
``MAX_REMEASURES`` times, each followed by another check. In a batch, where the check after it is the one
reading that moved, and slower, the measurements with no look after them are made again from the last
backwards until one comes out as it first did: the slowdown began after that one, so it and those before
it stand (making every one of them again was 57-73 % of the guard's time in three H200 runs of the decode
spec: batches of looks at 2-60 ms kernels, whose check after read slow and whose remeasures read as
before). A shift still there after the re-measurements may be a neighbour's burst of work or a passing
power cap: the guard waits for the device to come back, timing the reference after ``WAIT_FIRST_S``, then
after twice as long each time up to ``WAIT_STEP_S`` apart, for up to ``MAX_WAIT_S`` in all, and when it is
back within noise of the level, measures once more (in the warm H200 runs recorded, every shift waited for
was gone at the first look a second later: 3.5 of the warm accurate page-128 run's 13.3 s of guard were
those seconds). A reference that reads *faster* than the level is not waited for (waiting cannot slow it
back down): the row is flagged and the next measurement's check times the level again. A shift that
outlasts the wait is lasting: the row keeps its flag, and the rest of the point's items on this worker are
flagged without being measured again or waited for (they would meet the same device). Every row says what
happened: ``reference_us`` (the reference's reading that judged it), ``reference_ratio`` (that reading
over the point's level), ``drift`` (the reference had moved at the measurement the row keeps) and
``remeasured`` (how many times it was measured again).

Comparisons (finals, validation) are not guarded: their arms are timed in interleaved rounds, so a
shift touches every arm alike and the paired ratios cancel it. The guard lives in the worker because
records leave it item by item; an item is measured again inside its own call, so every planned item
still gets exactly one row.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from tunectl.core.spec import MeasureSpec
from tunectl.measure.harness import Sampler, Stats, measure, take
from tunectl.measure.reference import Reference

T = TypeVar("T")

MIN_SHIFT = 0.03
NOISE_FACTOR = 3.0
MAX_EXCUSED_SHIFT = 0.25  # a reading this far from the level moved, however noisy (module doc)
MAX_REMEASURES = 2
LOOK_EVERY_S = 0.5  # inside a measurement: a look (a check of the reference) at most this often
CHECK_REUSE_S = 0.25  # a clean check after a measurement stands for the next one's check before it
LEVEL_MAX_AGE_S = 30.0  # a level carried from point to point is timed again past this age
MAX_WAIT_S = 30.0  # how long a worker waits for a shifted device to come back (well under a deadline)
WAIT_FIRST_S = 0.05  # the first look at a shifted device, each next one twice as late ...
WAIT_STEP_S = 1.0  # ... up to this far apart
#: a point's level: 10-200 samples of the reference (module doc)
LEVEL_SETTINGS = MeasureSpec(warmup=1, min_samples=10, max_samples=200, noise_target=0.005, max_seconds=0.05)
#: a check before, inside (a look) and after each measurement, against the level (module doc)
CHECK_SETTINGS = MeasureSpec(warmup=0, min_samples=5, max_samples=20, noise_target=0.01, max_seconds=0.03)
REFERENCE_SPAN_MAX_US = 20_000.0  # a reference sample spans a measured sample up to this long (module doc)


def moved(level: Stats, now: Stats) -> bool:
    """Whether the reference moved beyond noise between ``level`` and ``now`` (see module doc)."""
    if level.median_us <= 0 or now.median_us <= 0:
        return False
    shift = abs(now.median_us / level.median_us - 1.0)
    if shift > MAX_EXCUSED_SHIFT:
        return True
    outside = not level.p20_us <= now.median_us <= level.p80_us and not (
        now.p20_us <= level.median_us <= now.p80_us
    )
    limit = max(MIN_SHIFT, NOISE_FACTOR * max(level.rel_noise, now.rel_noise))
    return outside and shift > limit


@dataclass(frozen=True)
class Guarded:
    """A guarded measurement: the statistics kept, and what its record says of the reference."""

    stats: Stats
    reference_us: float
    reference_ratio: float
    drift: bool
    remeasured: int
    guard_s: float  # spent timing the reference (levels, checks, looks) and waiting


class DriftGuard:
    """Times the reference around a worker's measurements and measures again what a shift touched.

    ``reference(calls)``: the reference's sampler for ``calls`` calls in one timed window. ``action``:
    ``remeasure`` (flag and measure again) or ``flag`` (flag only). ``max_wait_s``: how long a shift is
    waited out (0 on a CPU, whose neighbours come and go with no clock to recover). ``settings`` and
    ``check``: how a level and a check sample the reference (module doc). One per worker.
    """

    def __init__(
        self,
        reference: Reference,
        *,
        action: str = "remeasure",
        settings: MeasureSpec = LEVEL_SETTINGS,
        check: MeasureSpec = CHECK_SETTINGS,
        max_wait_s: float = MAX_WAIT_S,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if action not in ("remeasure", "flag"):
            raise ValueError(f"unknown drift action {action!r}; expected remeasure or flag")
        self.reference, self.action, self.settings, self.check_settings = reference, action, settings, check
        self._sleep, self._clock = sleep, clock
        self.max_wait_s = max_wait_s
        self._samplers: dict[int, Sampler] = {}
        self._calls = 1  # reference calls per sample of the reference (module doc)
        self._point: Hashable = None
        self._level: Stats | None = None
        self._lasting = False  # a shift at this point outlived the re-measurements
        self._spent = 0.0  # seconds timing the reference and waiting during the current measurement
        self._last_check: tuple[float, Stats] | None = None  # (when it ended, the check) after a measurement
        self._level_at = -math.inf  # when the level was timed
        self._readings: list[Stats] = []  # the reference's readings around the measurements under way
        self._last_look = -math.inf  # when the latest of them was taken

    def measure(self, point: Hashable, sample: Sampler, settings: MeasureSpec) -> Guarded:
        """``sample`` measured as ``settings`` say at ``point``, checked against the point's level of the
        reference (and measured again while the reference had moved, within the module doc's limits)."""
        [guarded] = self.measure_many(point, [(sample, settings)])
        return guarded

    def measure_many(
        self, point: Hashable, measurements: Sequence[tuple[Sampler, MeasureSpec]]
    ) -> list[Guarded]:
        """Each of ``measurements`` (a sampler and its settings) made in turn at ``point``, between one
        check before them all and one after, with looks every ``LOOK_EVERY_S`` across them: each is
        judged by the check before it, the looks inside it and the first check after it, and made
        again as ``measure`` would where one of those moved (module doc)."""
        self._spent = 0.0
        fresh = self._enter(point)
        assert self._level is not None
        level: Stats = self._level
        before = level if fresh else self._recent_check(level) or self._check()
        self._readings, self._last_look = [before], self._clock()
        spans: list[tuple[Stats, int, int]] = []  # each measurement, and the looks taken inside it
        for sample, settings in measurements:
            first = len(self._readings)
            spans.append((self._looked_at(sample, settings), first, len(self._readings)))
        after = self._check()
        self._readings.append(after)
        self._last_check = (self._clock(), after)
        judged = [(stats, self._furthest(self._readings[first - 1 : end + 1])) for stats, first, end in spans]
        shared = self._spent / max(1, len(measurements))
        out: dict[int, Guarded] = self._onset(measurements, spans, shared)
        retime = True
        for i, ((sample, settings), (stats, reading)) in enumerate(zip(measurements, judged, strict=True)):
            if i in out:
                continue
            self._spent = 0.0
            out[i] = self._settle(sample, settings, stats, reading, retime=retime, shared_s=shared)
            retime = retime and self._level is level  # the level is timed again at most once
        return [out[i] for i in range(len(measurements))]

    def _onset(
        self,
        measurements: Sequence[tuple[Sampler, MeasureSpec]],
        spans: Sequence[tuple[Stats, int, int]],
        shared_s: float,
    ) -> dict[int, Guarded]:
        """Where the check after a batch is the one reading that moved, and slower: its last
        measurements (those with no look after them) made again from the last backwards, until one
        comes out as it first did; the slowdown began after that one, so it and those before it
        stand (module doc). By index: those settled here."""
        level, after = self._level, self._readings[-1]
        assert level is not None
        slower = moved(level, after) and after.median_us > level.median_us
        if self.action == "flag" or self._lasting or not slower:
            return {}
        tail = [i for i, (_, _, end) in enumerate(spans) if end == len(self._readings) - 1]
        clean = self._furthest(self._readings[spans[tail[0]][1] - 1 : -1]) if tail else after
        if moved(level, clean):
            return {}
        out: dict[int, Guarded] = {}
        for i in reversed(tail):
            (sample, settings), first = measurements[i], spans[i][0]
            self._spent = 0.0
            out[i] = again = self._settle(sample, settings, first, after, retime=False, shared_s=shared_s)
            if not again.drift and not moved(again.stats, first):
                kept = Guarded(first, clean.median_us, clean.median_us / level.median_us, False, 0, shared_s)
                return out | {j: dataclasses.replace(kept, stats=spans[j][0]) for j in tail if j < i}
        return out

    def _settle(
        self,
        sample: Sampler,
        settings: MeasureSpec,
        stats: Stats,
        reading: Stats,
        *,
        retime: bool,
        shared_s: float,
    ) -> Guarded:
        """A measurement judged by ``reading``: kept, or made again (within the module doc's limits)."""
        assert self._level is not None
        level = self._level
        retries, remeasured = (0 if self.action == "flag" or self._lasting else MAX_REMEASURES), 0
        if retime and retries and moved(level, reading) and reading.median_us < level.median_us:
            # Faster than the level: the level caught a slower device (a passing slowdown, or compile
            # processes busy on the GPU when it was timed), not a slowdown now. Timed again, and the
            # measurement made again against it, instead of waiting for a device that will not slow
            # down to match it.
            self._level = level = self._time_level()
            (stats, reading), remeasured = self._bracketed(level, sample, settings), 1
        while moved(level, reading) and remeasured < retries:
            (stats, reading), remeasured = self._bracketed(level, sample, settings), remeasured + 1
        # Only a slower device is waited for: one that reads faster than its level (clocks still rising
        # from idle, a level timed while something else ran) will not come back to it by waiting.
        slower = reading.median_us > level.median_us
        if moved(level, reading) and retries and slower and self._came_back(level):
            (stats, reading), remeasured = self._bracketed(level, sample, settings), remeasured + 1
        shifted = moved(level, reading)
        if shifted and retries and slower:
            self._lasting = True
        ratio = reading.median_us / level.median_us
        return Guarded(stats, reading.median_us, ratio, shifted, remeasured, shared_s + self._spent)

    def _enter(self, point: Hashable) -> bool:
        """Make ``point`` the current one; whether a level was timed for it just now. A new point keeps
        the level where the last check after a measurement is recent and clean and the level younger
        than ``LEVEL_MAX_AGE_S`` (the same device, seen milliseconds ago)."""
        if point == self._point and self._level is not None:
            return False
        carried = (
            self._level is not None
            and self._clock() - self._level_at <= LEVEL_MAX_AGE_S
            and self._recent_check(self._level) is not None
        )
        self._point, self._lasting = point, False
        if carried:
            return False
        self._calls, self._last_check = 1, None
        self._level = self._time_level()
        self._level_at = self._clock()
        return True

    def _bracketed(self, level: Stats, sample: Sampler, settings: MeasureSpec) -> tuple[Stats, Stats]:
        """One measurement between two checks, with looks inside it, and the reading that strayed
        furthest from ``level`` (module doc)."""
        before = self._recent_check(level) or self._check()
        self._readings, self._last_look = [before], self._clock()
        stats = self._looked_at(sample, settings)
        after = self._check()
        self._readings.append(after)
        self._last_check = (self._clock(), after)
        return stats, self._furthest(self._readings)

    def _furthest(self, readings: Sequence[Stats]) -> Stats:
        """Of ``readings`` of the reference, the one that strayed furthest from the level."""
        level = self._level
        assert level is not None
        return max(readings, key=lambda r: (moved(level, r), abs(r.median_us / level.median_us - 1)))

    def _recent_check(self, level: Stats) -> Stats | None:
        """The check after the last measurement at this point, if it is young and clean (module doc)."""
        if self._last_check is None:
            return None
        ended, check = self._last_check
        if self._clock() - ended > CHECK_REUSE_S or moved(level, check):
            return None
        return check

    def _looked_at(self, sample: Sampler, settings: MeasureSpec) -> Stats:
        """``sample`` measured with a look at the reference (into the readings) between chunks of
        samples every LOOK_EVERY_S since the last reading; a chunk ends by the time the next look is
        due."""

        def look(pace_s: float | None) -> None:
            if pace_s is not None:
                self._size_reference(pace_s)
            if self._clock() - self._last_look >= LOOK_EVERY_S:
                self._readings.append(self._check())
                self._timed(lambda: take(sample, 1))  # run and dropped (module doc)
                self._last_look = self._clock()

        def until_look() -> float:
            return max(LOOK_EVERY_S - (self._clock() - self._last_look), 0.0)

        stats = measure(sample, settings, self._clock, between=look, chunk_s=until_look)
        if stats.num_samples:
            self._size_reference(stats.seconds / stats.num_samples)
        return stats

    def _size_reference(self, sample_s: float) -> None:
        """Samples of the reference of as many calls as span ``sample_s`` (up to
        ``REFERENCE_SPAN_MAX_US``)."""
        assert self._level is not None
        span_us = min(sample_s * 1e6, REFERENCE_SPAN_MAX_US)
        self._calls = max(1, math.ceil(span_us / max(self._level.median_us, 1e-3)))

    def _reference_sampler(self) -> Sampler:
        if self._calls not in self._samplers:
            self._samplers[self._calls] = self.reference(self._calls)
        sampler = self._samplers[self._calls]
        if self._level is not None:  # a sample's length, for the harness's first chunk
            sampler.expected_us = self._level.median_us * self._calls  # type: ignore[attr-defined]
        return sampler

    def _time_level(self) -> Stats:
        """The reference timed for a level (``settings``)."""
        return self._timed(lambda: measure(self._reference_sampler(), self.settings, self._clock))

    def _check(self) -> Stats:
        """The reference timed for a check against the level (``check_settings``)."""
        return self._timed(lambda: measure(self._reference_sampler(), self.check_settings, self._clock))

    def _timed(self, guard_work: Callable[[], T]) -> T:
        """``guard_work()``, its time counted as the guard's."""
        start = self._clock()
        try:
            return guard_work()
        finally:
            self._spent += self._clock() - start

    def _came_back(self, level: Stats) -> bool:
        """Wait (up to max_wait_s in all, timing the reference after WAIT_FIRST_S, then after steps
        doubling up to WAIT_STEP_S) for it to be back at ``level``."""
        waited, step = 0.0, WAIT_FIRST_S
        while waited < self.max_wait_s:
            pause = min(step, self.max_wait_s - waited)
            self._timed(functools.partial(self._sleep, pause))
            waited, step = waited + pause, min(2 * step, WAIT_STEP_S)
            if not moved(level, self._time_level()):
                return True
        return False
