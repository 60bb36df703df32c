"""A point's checked kernels and their samplers, built once and reused while the worker keeps the point.

A config is measured at a point several times: a screening look per halving rung, then once more in
the point's finals beside the default. Each of those needs the same things: the kernel loaded, its
output checked against the reference, a sampler (for the difference method, two CUDA graphs captured
and the calls per sample, K, chosen from a first estimate). Building them again for every look cost
more than the look itself on an H200 (graph capture and K's estimate: ~15 ms a row, a 20 µs kernel).

So a worker keeps, per config at a point, what it built: the call, its check (a later look's record
carries it again, nothing compiled: ``Check.again``), and its samplers by how they time (mode, cache
state, timing method), beside the point's inputs and reference output, which its graphs read (a
graph replays the addresses it was captured with: ``tunectl.measure.difference``, module doc).

A worker leaves a point between its rungs: while the driver decides a point's next rung from the
last one's looks, the worker measures another point's, and it comes back for the next rung and the
finals after one to a few other points (on an H200 run of the decode spec, most often 3; the
dispatcher hands it its recent points first). So it keeps its last ``KEEP_POINTS`` points (``RecentPoints``),
not only the current one, while the device keeps ``FREE_SHARE_MIN`` of its memory free or cached
unallocated; the oldest go first, and all but the current one where a point's set-up, a config's
first call or a capture runs out of device memory; where that is still short, the current point's
samplers go too (``Point.let_samplers_go``), its inputs and checked calls kept.

A sampler that has already run samples needs no warm-up; a fresh graph sampler was warmed by its
capture (three calls on a side stream), so one sample settles the clocks.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from tunectl.core.spec import MeasureSpec
from tunectl.measure.harness import Sampler
from tunectl.measure.outcome import Check

#: warm-up samples of a fresh sampler whose build already ran its call (a graph's capture)
FRESH_GRAPH_WARMUP = 1
#: the points a worker keeps built, the one it is at included (module doc)
KEEP_POINTS = 4
#: ... while the device has this share of its memory free or cached unallocated
FREE_SHARE_MIN = 0.4


@dataclass
class Built:
    """One config checked at the current point: its call, its check, its samplers."""

    call: Callable[[], Any]
    checked: Check
    samplers: dict[Hashable, Sampler] = field(default_factory=dict)
    warm: set[Hashable] = field(default_factory=set)  # samplers that have run samples

    def sampler(self, how: Hashable, make: Callable[[], Sampler]) -> Sampler:
        """The sampler timing this call ``how`` (mode, cache state, method): built once."""
        if how not in self.samplers:
            self.samplers[how] = make()
        return self.samplers[how]

    def warmup(self, how: Hashable, settings: MeasureSpec, *, graph: bool) -> int:
        """Warm-up samples the sampler ``how`` needs before its next measurement, then marks it warm."""
        if how in self.warm:
            return 0
        self.warm.add(how)
        return min(settings.warmup, FRESH_GRAPH_WARMUP) if graph else settings.warmup


@dataclass
class Point:
    """A point's inputs, its reference output and the configs checked there (``Built``)."""

    inputs: Any = None
    reference: Any = None
    built: dict[Hashable, Built] = field(default_factory=dict)

    def get(self, config: Hashable) -> Built | None:
        return self.built.get(config)

    def keep(self, config: Hashable, call: Callable[[], Any], checked: Check) -> Built:
        built = self.built[config] = Built(call, checked)
        return built

    def let_samplers_go(self) -> bool:
        """Drop every config's samplers here (their graphs hold device memory: a capture keeps what its
        call allocates), each built again, and warmed again, when next timed; whether any went."""
        holding = [built for built in self.built.values() if built.samplers]
        for built in holding:
            built.samplers.clear()
            built.warm.clear()
        return bool(holding)


class RecentPoints:
    """The points a worker was at last, the newest last (module doc). ``short_of_memory`` says whether
    the device is short of memory now."""

    def __init__(self, keep: int = KEEP_POINTS, short_of_memory: Callable[[], bool] = lambda: False) -> None:
        self.keep = keep
        self.short_of_memory = short_of_memory
        self._points: OrderedDict[Hashable, Point] = OrderedDict()

    def get(self, key: Hashable) -> Point | None:
        """The point kept under ``key``, now the newest; None where it is not kept."""
        point = self._points.get(key)
        if point is not None:
            self._points.move_to_end(key)
        return point

    def add(self, key: Hashable, point: Point) -> Point:
        """Keep ``point`` as the newest (``make_room`` first, before its inputs are made)."""
        self._points[key] = point
        return point

    def make_room(self) -> None:
        """Drop the oldest points until one more fits in ``keep`` and the device is not short of memory."""
        while self._points and (len(self._points) >= self.keep or self.short_of_memory()):
            self._points.popitem(last=False)

    def clear(self, but: Hashable = None) -> bool:
        """Let every point go, ``but`` the one named (the one the worker is at); whether any went."""
        gone = [k for k in self._points if k != but]
        for key in gone:
            del self._points[key]
        return bool(gone)

    def __len__(self) -> int:
        return len(self._points)


def with_warmup(settings: MeasureSpec, warmup: int) -> MeasureSpec:
    return settings if settings.warmup == warmup else dataclasses.replace(settings, warmup=warmup)
