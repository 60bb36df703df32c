"""Configs timed side by side at one shape, as confirming at start-up times a cell's candidates.

Each config runs through the task's own path (inputs, reference, ``prepare``, output check) and the
project's samplers (``tunectl.measure.timing``), in ``ROUNDS`` interleaved rounds
(``tunectl.measure.harness.interleave``: a slowdown meanwhile falls on every config alike).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from tunectl.core.spec import MeasureSpec
from tunectl.measure.harness import Sampler, interleave
from tunectl.measure.rounds import round_times
from tunectl.measure.timing import make_sampler
from tunectl.tasks.base import TuningTask, compare_outputs

#: rounds a shape's candidates are timed in, each round in a fresh random order
ROUNDS = 4
#: each candidate's timing: short, since a list is a handful of configs per shape at start-up
DEFAULT_SETTINGS = MeasureSpec(warmup=2, min_samples=10, max_samples=200, noise_target=0.02, max_seconds=0.2)


def time_configs(
    task: TuningTask,
    static: dict[str, Any],
    shape: dict[str, Any],
    configs: Sequence[Mapping[str, Any]],
    *,
    device: str = "cpu",
    mode: str = "eager",
    settings: MeasureSpec = DEFAULT_SETTINGS,
) -> list[float | None]:
    """Each of ``configs`` timed at one shape (µs, the median over ``ROUNDS`` interleaved rounds) on
    fresh inputs, through the task's own path and output check; None where a config fails to run, its
    output is wrong, or its time could not be taken."""
    inputs = task.build_inputs(static, shape, device)
    reference = task.reference(static, shape, inputs)
    how = (device, mode, settings)
    samplers = [sampler_of(task, static, shape, config, inputs, reference, how) for config in configs]
    found = iter(interleaved([s for s in samplers if s is not None], settings))
    return [None if s is None else next(found) for s in samplers]


def sampler_of(
    task: TuningTask,
    static: dict[str, Any],
    shape: dict[str, Any],
    config: Mapping[str, Any],
    inputs: Any,
    reference: Any,
    how: tuple[str, str, MeasureSpec],
) -> Sampler | None:
    """One candidate's sampler at the shape; None where it fails to run or its output is wrong."""
    device, mode, settings = how
    try:
        fn = task.prepare(static, shape, task.complete_config(dict(config)), inputs)
        _, ok = compare_outputs(fn(), reference, *task.tolerance(static))
        return make_sampler(fn, device, mode, str(settings.l2), str(settings.timing)) if ok else None
    except Exception:  # a candidate that cannot run here is left out, as tuning leaves it out
        return None


def interleaved(samplers: list[Sampler], settings: MeasureSpec) -> list[float | None]:
    """Each sampler's time (µs): the median over ``ROUNDS`` interleaved rounds, each round in a fresh
    order, so that a slowdown while confirming falls on every candidate alike; None where a
    candidate's time could not be taken."""
    if not samplers:
        return []
    try:
        per_round = round_times(interleave(samplers, ROUNDS, settings, seed=0), 0)
    except Exception:  # a sampler that fails mid-way (or a time lost in the flush): none is trusted
        return [None] * len(samplers)
    return [statistics.median(times) for times in per_round]
