"""A point's checked kernels and their samplers, built once and reused while the worker stays there.

A config is measured at a point several times: a screening look per halving rung, then once more in
the point's finals beside the default. Each of those needs the same things: the kernel loaded, its
output checked against the reference, a sampler (for the difference method, two CUDA graphs captured
and the calls per sample, K, chosen from a first estimate). Building them again for every look cost
more than the look itself on an H200 (graph capture and K's estimate: ~15 ms a row, a 20 µs kernel).

So a worker keeps, per config at its current point, what it built: the call, its check (a later
look's record carries it again, nothing compiled: ``Check.again``), and its samplers by how they time
(mode, cache state, timing method). Moving to another point drops them all: a graph replays the
addresses it was captured with, and the point's inputs it read are freed with the point
(``tunectl.measure.difference``, module doc).

A sampler that has already run samples needs no warm-up; a fresh graph sampler was warmed by its
capture (three calls on a side stream), so one sample settles the clocks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from tunectl.core.spec import MeasureSpec
from tunectl.measure.harness import Sampler
from tunectl.measure.outcome import Check

#: warm-up samples of a fresh sampler whose build already ran its call (a graph's capture)
FRESH_GRAPH_WARMUP = 1


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


class PointKernels:
    """The ``Built`` configs of the worker's current point (module doc)."""

    def __init__(self) -> None:
        self._point: Hashable = None
        self._built: dict[Hashable, Built] = {}

    def at(self, point: Hashable) -> None:
        """The worker is at ``point`` now; what was built elsewhere is dropped."""
        if point != self._point:
            self._point, self._built = point, {}

    def get(self, config: Hashable) -> Built | None:
        return self._built.get(config)

    def keep(self, config: Hashable, call: Callable[[], Any], checked: Check) -> Built:
        built = self._built[config] = Built(call, checked)
        return built

    def __len__(self) -> int:
        return len(self._built)


def with_warmup(settings: MeasureSpec, warmup: int) -> MeasureSpec:
    return settings if settings.warmup == warmup else dataclasses.replace(settings, warmup=warmup)
