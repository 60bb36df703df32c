"""Tasks by name, found through the ``tunectl.tasks`` entry-point group.

A package adds a task by declaring an entry point (``pyproject.toml``)::

    [project.entry-points."tunectl.tasks"]
    my_kernel = "my_package.tasks:MyKernel"

The value names a class (or any callable) that returns the task object. The shipped tasks are
declared the same way, so nothing here names them. Loading a task must not import torch: a task
module imports its kernel libraries inside its methods.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from typing import Any, ClassVar, Protocol

from tunectl.core.params import Rule

GROUP = "tunectl.tasks"
Params = Mapping[str, Any]


class PlannedTask(Protocol):
    """What planning and spec validation ask of a task (``tunectl.tasks.base.Task`` gives the defaults)."""

    name: str
    param_rules: ClassVar[Mapping[str, Rule]]

    # read-only: a task's own tuples (``("batch", "kv_len")``) are narrower types, which a protocol's
    # settable attribute would refuse
    @property
    def static_params(self) -> tuple[str, ...]: ...

    @property
    def shape_params(self) -> tuple[str, ...]: ...

    @property
    def config_params(self) -> tuple[str, ...]: ...

    def default_config(self, static: Params) -> dict[str, Any]: ...

    def complete_config(self, config: Params) -> dict[str, Any]: ...

    def selectable(self, static: Params, config: Params) -> bool: ...

    def check_point(self, static: Params, shape: Params) -> str | None: ...


@cache
def _entry_points() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def task_names() -> list[str]:
    """The names of every task installed."""
    return sorted(_entry_points())


def get_task(name: str) -> Any:
    """A new instance of the task registered as ``name``; KeyError if there is none."""
    factory: Callable[[], Any] = _entry_points()[name].load()
    return factory()
