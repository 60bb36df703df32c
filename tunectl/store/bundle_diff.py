"""What changed between two bundles: per task and point, entries added, removed or given another config.

Standard library only: it reads two loaded bundles (``tunectl.runtime.Bundle``), wherever they are stored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tunectl.core.keys import Key, key_text, value_order
from tunectl.runtime import Bundle, Entry


@dataclass(frozen=True)
class EntryChange:
    """One (task, static, shape) point compared across two bundles."""

    task: str
    static: Key
    shape: Key
    kind: str  # added | removed | changed (another config) | same (the config, maybe another median)
    old_config: Key | None
    new_config: Key | None
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


def _by_point(bundle: Bundle, task: str) -> dict[tuple[str, str], Entry]:
    """``task``'s entries by point, as their keys' texts (``causal=1`` and ``causal=true`` stay apart)."""
    return {(key_text(e.static), key_text(e.shape)): e for e in bundle.entries(task)}


def _change(task: str, a: Entry | None, b: Entry | None) -> EntryChange:
    """The point of ``a`` (in the old bundle) and ``b`` (in the new) compared; one may be None."""
    kind = "added" if a is None else "removed" if b is None else "same"
    if a is not None and b is not None and a.config != b.config:
        kind = "changed"
    either = a or b
    assert either is not None
    return EntryChange(
        task,
        either.static,
        either.shape,
        kind,
        a.config if a else None,
        b.config if b else None,
        a.median_us if a else None,
        b.median_us if b else None,
    )


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
        merged = [(before.get(p), after.get(p)) for p in set(before) | set(after)]
        changes += sorted((_change(task, a, b) for a, b in merged), key=_order)
    return BundleDiff(f"{old.name}/{old.version}", f"{new.name}/{new.version}", tuple(changes), tuple(notes))


def _order(change: EntryChange) -> tuple[Any, ...]:
    """Points in table order: by static key, then shape (batch 4 before 16)."""
    return value_order(change.static), value_order(change.shape)
