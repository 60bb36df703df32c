"""Choosing winners from results, honestly.

Per (task, device, static key, shape): only configs with status ``ok`` compete, and only those a
server with that static key can use as they are (a task may measure others for reference, such as
a kernel run on a re-paged cache; ``selectable``). A non-default
config wins only when its median beats the default's by more than the measured noise of both
(``median * (1 + noise) < default median``); otherwise the default keeps its place. Among those
that clear the bar the lowest median wins, ties broken by the config's canonical text, so two
selections over the same data always agree. Where a config was measured in several runs, the
latest measurement counts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from tunectl.keys import Key, key_from_text


@dataclass(frozen=True)
class Winner:
    task: str
    device_name: str
    static: Key
    shape: Key
    config: Key
    is_default: bool
    median_us: float
    p20_us: float
    p80_us: float
    rel_noise: float
    num_samples: int
    default_median_us: float | None
    run_id: str
    num_configs: int
    num_failed: int

    @property
    def speedup(self) -> float | None:
        """Default median over winner median (1.0 when the default won)."""
        if self.default_median_us is None:
            return None
        return self.default_median_us / self.median_us


def _latest(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, ...], Mapping[str, Any]]:
    latest: dict[tuple[str, ...], Mapping[str, Any]] = {}
    for row in rows:
        key = (row["task"], row["device_name"], row["static_key"], row["shape_key"], row["config_key"])
        if key not in latest or row["finished_at"] >= latest[key]["finished_at"]:
            latest[key] = row
    return latest


def _sort_key(key: Key) -> tuple[Any, ...]:
    """Order keys by value (batch 4 before 16), values of different types apart by type name."""
    return tuple((name, type(v).__name__, v if not isinstance(v, tuple) else repr(v)) for name, v in key)


Selectable = Callable[[str, Key, Key], bool]  # (task, static, config) -> may it win?


@cache
def _task_rule(task: str) -> Callable[[Mapping[str, Any], Mapping[str, Any]], bool] | None:
    from tasks.registry import get_task, task_names

    return getattr(get_task(task), "selectable", None) if task in task_names() else None


def task_selectable(task: str, static: Key, config: Key) -> bool:
    """The task's own rule (``TuningTask.selectable``), where it declares one."""
    rule = _task_rule(task)
    return True if rule is None else bool(rule(dict(static), dict(config)))


def _beats(row: Mapping[str, Any], default: Mapping[str, Any]) -> bool:
    margin = max(row["rel_noise"] or 0.0, default["rel_noise"] or 0.0)
    return bool(row["median_us"] * (1.0 + margin) < default["median_us"])


def select_winners(
    rows: Iterable[Mapping[str, Any]], selectable: Selectable = task_selectable
) -> list[Winner]:
    """One winner per (task, device, static, shape) that has at least one ok, selectable measurement."""
    groups: dict[tuple[str, ...], list[Mapping[str, Any]]] = {}
    for key, row in _latest(rows).items():
        groups.setdefault(key[:4], []).append(row)
    winners = []
    for (task, device, static_text, shape_text), group in groups.items():
        static = key_from_text(static_text)
        ok = sorted(
            (
                r
                for r in group
                if r["status"] == "ok" and selectable(task, static, key_from_text(r["config_key"]))
            ),
            key=lambda r: (r["median_us"], r["config_key"]),
        )
        if not ok:
            continue
        default = next((r for r in ok if r["is_default"]), None)
        if default is None:
            best = ok[0]
        else:
            best = next((r for r in ok if not r["is_default"] and _beats(r, default)), default)
        winners.append(
            Winner(
                task=task,
                device_name=device,
                static=static,
                shape=key_from_text(shape_text),
                config=key_from_text(best["config_key"]),
                is_default=bool(best["is_default"]),
                median_us=best["median_us"],
                p20_us=best["p20_us"],
                p80_us=best["p80_us"],
                rel_noise=best["rel_noise"],
                num_samples=best["num_samples"],
                default_median_us=default["median_us"] if default else None,
                run_id=best["run_id"],
                num_configs=len(group),
                num_failed=sum(r["status"] != "ok" for r in group),
            )
        )
    return sorted(winners, key=lambda w: (w.task, w.device_name, _sort_key(w.static), _sort_key(w.shape)))
