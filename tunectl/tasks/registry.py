"""Task names to task objects, through the ``tunectl.tasks`` entry points (``tunectl.core.registry``)."""

from __future__ import annotations

from tunectl.core import registry
from tunectl.tasks.base import TuningTask


def task_names() -> list[str]:
    return registry.task_names()


def get_task(name: str) -> TuningTask:
    """The task registered as ``name``; KeyError if there is none."""
    task: TuningTask = registry.get_task(name)
    return task
