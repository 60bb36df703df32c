"""Reading a spec's task-declared parts: its task, the ``[static]``, ``[shapes]`` and ``[configs]``
grids, and the one-config tables (``[default]``, ``[baselines]``), each value checked against the rules
the task declares (``TuningTask.param_rules``). ``tunectl.core.spec`` reads the rest of a spec (its own
tables) and puts the two together.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tunectl.core.errors import SpecError
from tunectl.core.keys import InvalidKeyError, Key, Value, make_key, normalise_value, product
from tunectl.core.params import Rule
from tunectl.core.registry import PlannedTask, get_task, task_names
from tunectl.core.shapes import ShapeDim, read_dim


class GridReader:
    """Reads the parts of spec ``path`` that the task declares; every error is a ``SpecError`` naming the
    field. ``check_values``: check each value against its rule (off for a stored spec, which the
    version that ran it checked)."""

    def __init__(self, path: str, *, check_values: bool = True) -> None:
        self.path, self.check_values = path, check_values

    def fail(self, fld: str, message: str) -> SpecError:
        return SpecError(self.path, fld, message)

    def task(self, name: object) -> PlannedTask:
        if name is None:
            raise self.fail("task", "missing")
        if not task_names():
            raise self.fail("task", "no tasks are installed (entry points 'tunectl.tasks'); reinstall")
        if not isinstance(name, str) or name not in task_names():
            raise self.fail("task", f"unknown task {name!r}; known tasks: {', '.join(task_names())}")
        return get_task(name)

    def table(self, value: object, fld: str) -> dict[str, Any]:
        if value is None:
            raise self.fail(fld, "missing")
        if not isinstance(value, dict):
            raise self.fail(fld, f"must be a table, not {type(value).__name__}")
        return value

    def names(self, table: Mapping[str, Any], allowed: tuple[str, ...], fld: str, required: bool) -> None:
        for name in table:
            if name not in allowed:
                raise self.fail(f"{fld}.{name}", f"unknown parameter; expected one of {', '.join(allowed)}")
        missing = [n for n in allowed if n not in table] if required else []
        if missing:
            raise self.fail(f"{fld}.{missing[0]}", "missing")

    def checked(self, values: tuple[Value, ...], rule: Rule | None, fld: str) -> tuple[Value, ...]:
        """``values`` if ``rule`` allows each of them; else the field and what it allows."""
        for value in values if self.check_values else ():
            problem = None if rule is None else rule.problem(value)
            if problem is not None:
                raise self.fail(fld, problem)
        return values

    def value_list(self, value: object, fld: str) -> tuple[Value, ...]:
        values = value if isinstance(value, list) else [value]
        if not values:
            raise self.fail(fld, "empty list; give at least one value")
        if any(isinstance(v, dict) for v in values):
            raise self.fail(fld, "values must be scalars or arrays, not tables")
        name = fld.rsplit(".", 1)[-1]
        try:
            normalised = tuple(normalise_value(name, v) for v in values)
        except InvalidKeyError as exc:
            raise self.fail(fld, str(exc)) from None
        if len(set(map(repr, normalised))) != len(normalised):
            raise self.fail(fld, "values repeat")
        return normalised

    def static(
        self, value: object, allowed: tuple[str, ...], rules: Mapping[str, Rule]
    ) -> tuple[tuple[str, tuple[Value, ...]], ...]:
        if not allowed and value not in (None, {}):
            raise self.fail("static", "this task has no static parameters; leave [static] out")
        table = self.table(value, "static") if allowed else {}
        self.names(table, allowed, "static", required=True)
        return tuple(
            (n, self.checked(self.value_list(table[n], f"static.{n}"), rules.get(n), f"static.{n}"))
            for n in sorted(table)
        )

    def shapes(self, value: object, allowed: tuple[str, ...]) -> tuple[ShapeDim, ...]:
        table = self.table(value, "shapes")
        self.names(table, allowed, "shapes", required=True)
        return tuple(read_dim(n, self.table(table[n], f"shapes.{n}"), path=self.path) for n in sorted(table))

    def configs(self, value: object, allowed: tuple[str, ...], rules: Mapping[str, Rule]) -> tuple[Key, ...]:
        grids = value if isinstance(value, list) else [self.table(value, "configs")]
        if not grids:
            raise self.fail("configs", "empty list; give at least one grid")
        keys: dict[Key, None] = {}
        for i, grid in enumerate(grids):
            fld = "configs" if isinstance(value, dict) else f"configs[{i}]"
            grid = self.table(grid, fld)
            if not grid:
                raise self.fail(fld, "empty grid")
            self.names(grid, allowed, fld, required=False)
            expanded = {
                n: self.checked(self.value_list(v, f"{fld}.{n}"), rules.get(n), f"{fld}.{n}")
                for n, v in grid.items()
            }
            for combo in product(expanded):
                keys[make_key(combo)] = None
        return tuple(keys)

    def one_config(self, value: object, task: PlannedTask, where: str) -> Key:
        """``[default]`` or a baseline: one config (every value a single one), checked as the configs are."""
        table = self.table(value, where)
        self.names(table, task.config_params, where, required=False)
        for name, v in table.items():
            if isinstance(v, list):
                raise self.fail(f"{where}.{name}", "one value: this is one config, not a grid")
            self.checked(self.value_list(v, f"{where}.{name}"), task.param_rules.get(name), f"{where}.{name}")
        return make_key(table)
