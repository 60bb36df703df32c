"""What changed between two bundles: per task and point, entries added, removed or given another config.

Standard library only: it reads two loaded bundles (``tunectl.runtime.Bundle``), wherever they are stored.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tunectl.core.files import canonical_json
from tunectl.core.keys import value_order
from tunectl.runtime import Bundle


@dataclass(frozen=True)
class EntryChange:
    """One (task, static, shape) point compared across two bundles."""

    task: str
    static: Mapping[str, Any]
    shape: Mapping[str, Any]
    kind: str  # added | removed | changed (another config) | same (the config, maybe another median)
    old_config: Mapping[str, Any] | None
    new_config: Mapping[str, Any] | None
    old_median_us: float | None
    new_median_us: float | None

    @property
    def median_change(self) -> float | None:
        """New median over old, minus one (-0.25: 25 % faster); None where either is missing."""
        if not self.old_median_us or self.new_median_us is None:
            return None
        return self.new_median_us / self.old_median_us - 1.0


@dataclass(frozen=True)
class BundleDiff:
    old: str
    new: str
    changes: tuple[EntryChange, ...]
    notes: tuple[str, ...]  # task-level differences: tasks added or removed, bucketing changed

    def count(self, kind: str) -> int:
        return sum(c.kind == kind for c in self.changes)


def _by_point(bundle: Bundle, task: str) -> dict[str, dict[str, Any]]:
    return {canonical_json([e["static"], e["shape"]]): e for e in bundle.entries(task)}


def _order(point: str) -> tuple[Any, ...]:
    """Points in table order: by static key, then shape (batch 4 before 16)."""
    static, shape = json.loads(point)
    return value_order(static), value_order(shape)


def diff_bundles(old: Bundle, new: Bundle) -> BundleDiff:
    """Per task and point: entries added, removed, given another config, or kept (with both medians)."""
    notes, changes = [], []
    for task in sorted(set(old.tasks) | set(new.tasks)):
        if task not in new.tasks or task not in old.tasks:
            notes.append(f"task {task} {'removed' if task in old.tasks else 'added'}")
        elif old.task_info(task) != new.task_info(task):
            notes.append(f"task {task}: static parameters or bucketing changed")
        before = _by_point(old, task) if task in old.tasks else {}
        after = _by_point(new, task) if task in new.tasks else {}
        for point in sorted(set(before) | set(after), key=_order):
            a, b = before.get(point), after.get(point)
            kind = "added" if a is None else "removed" if b is None else "same"
            if a is not None and b is not None and a["config"] != b["config"]:
                kind = "changed"
            either = a or b
            assert either is not None
            old_config, old_median = (a["config"], a.get("median_us")) if a else (None, None)
            new_config, new_median = (b["config"], b.get("median_us")) if b else (None, None)
            changes.append(
                EntryChange(
                    task,
                    either["static"],
                    either["shape"],
                    kind,
                    old_config,
                    new_config,
                    old_median,
                    new_median,
                )
            )
    return BundleDiff(f"{old.name}/{old.version}", f"{new.name}/{new.version}", tuple(changes), tuple(notes))
