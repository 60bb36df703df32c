"""Validation stacks: a config timed as ``layers`` calls in a row, a cache-thrashing kernel between each
two, as a model's other kernels evict the cache between its attention layers
(``tunectl.measure.timing.stack_sampler``). Each layer reads an input set of its own where memory
allows, so no layer finds the previous one's data in the cache."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tunectl.core.plan import WorkItem
from tunectl.measure.harness import Sampler
from tunectl.measure.timing import stack_sampler
from tunectl.tasks.base import TuningTask

_STACK_MEMORY_SHARE = 0.3  # of the free device memory, for a stack's extra input sets
_CPU_STACK_BYTES = 1 << 30


def layer_inputs(task: TuningTask, item: WorkItem, inputs: Any, device: str) -> list[Any]:
    """Input sets for a stack of ``item.layers`` layers: one per layer, as many as fit in memory
    (then layers reuse them in turn); the point's own ``inputs`` are the first."""
    static, shape = dict(item.static), dict(item.shape)
    per_set = max(1, task.bytes_moved(static, shape))
    if device.startswith("cuda"):
        import torch

        budget = torch.cuda.mem_get_info(device)[0] * _STACK_MEMORY_SHARE
    else:
        budget = _CPU_STACK_BYTES
    num_sets = max(1, min(item.layers, int(budget // per_set)))
    return [inputs] + [task.build_inputs(static, shape, device) for _ in range(num_sets - 1)]


def stack_of(
    task: TuningTask,
    item: WorkItem,
    arm: Any,
    call: Callable[[], Any],
    stacks: list[Any],
    device: str,
    mode: str,
) -> Sampler:
    """The sampler of ``arm`` as a stack of ``item.layers`` calls: ``call`` on the point's inputs, the
    same config prepared on each other input set in turn."""
    static, shape = dict(item.static), dict(item.shape)
    calls = [call] + [task.prepare(static, shape, dict(arm), inputs) for inputs in stacks[1:]]
    return stack_sampler([calls[j % len(calls)] for j in range(item.layers)], device, mode)


def thrash_only(item: WorkItem, device: str, mode: str) -> Sampler:
    """The stack's cache-thrashing kernels alone, whose time each round takes out."""
    return stack_sampler([_nothing] * item.layers, device, mode, with_calls=False)


def _nothing() -> None:
    return None
