"""Choosing winners from results, honestly.

Per (task, device, static key, shape): only configs with status ``ok`` compete, and only those a
server with that static key can use as they are (a task may measure others for reference, such as
a kernel run on a re-paged cache; ``selectable``).

Where the point had finals (its best configs timed against the default in interleaved rounds on one
device, ``phase == "final"``), the latest finals decide: a non-default config wins only when the
whole 95 % interval of its paired speedup lies above ``1 + margin``. Among those, every config
within ``tie`` of the best speedup is a near-tie, and the first of them in canonical order (by
option name, then value) wins, so two runs on the same GPU, or two ranks of one server, choose the
same config even when noise reorders near-ties. Otherwise the default keeps its place.

Without finals, single measurements decide: a non-default config wins only when its median beats the
default's by more than the noise of both (``median * (1 + noise) < default median``); the lowest
median among those wins, ties in canonical order. Where a config was measured several times, the
latest measurement at the highest fidelity counts (a full measurement over a screening look).

Each winner says why it won: its speedup, the interval, and what it rests on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from tunectl.keys import Key, key_from_text, value_order

#: Rows that measured configs one call at a time (``validate`` rows time whole stacks: not selected on).
SELECTED_PHASES = ("measure", "screen", "final", "import")


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
    speedup: float | None = None  # over the default (1.0 when the default won); None without one
    speedup_lo: float | None = None  # its 95 % interval (finals), or the p20-p80 bands' ratio
    speedup_hi: float | None = None
    basis: str = "measure"  # final: interleaved rounds against the default; measure: single timings
    rounds: int | None = None

    @property
    def reason(self) -> str:
        """Why this config is the entry, in a line."""
        if self.speedup is None:
            return "fastest; the default failed here"
        interval = f"[{self.speedup_lo:.3f}, {self.speedup_hi:.3f}]"
        if self.basis == "final":
            how = f"in {self.rounds} interleaved rounds"
            if self.is_default:
                return f"default: no finalist beat it beyond noise {how} (best {interval} lower bound <= 1)"
            return f"{self.speedup:.3f}x over the default, 95% interval {interval}, {how}"
        if self.is_default:
            return "default: no config beat it by more than the measured noise"
        return f"{self.speedup:.3f}x over the default (p20-p80 band {interval}), beyond both configs' noise"


def _latest(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, ...], Mapping[str, Any]]:
    """Per (task, device, static, shape, config): the latest row at the highest fidelity."""
    latest: dict[tuple[str, ...], Mapping[str, Any]] = {}
    for row in rows:
        key = (row["task"], row["device_name"], row["static_key"], row["shape_key"], row["config_key"])
        old = latest.get(key)
        if old is None or (_fidelity(row), row["finished_at"]) >= (_fidelity(old), old["finished_at"]):
            latest[key] = row
    return latest


def _fidelity(row: Mapping[str, Any]) -> int:
    return 0 if row.get("phase") == "screen" else 1


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
    rows: Iterable[Mapping[str, Any]],
    selectable: Selectable = task_selectable,
    margin: float = 0.0,
    tie: float = 0.02,
) -> list[Winner]:
    """One winner per (task, device, static, shape) that has at least one ok, selectable measurement."""
    rows = list(rows)
    finals = latest_comparisons(rows, "final")
    singles: dict[Point, list[Mapping[str, Any]]] = {}
    for row in rows:
        phase = row.get("phase") or "measure"  # rows from before phases were full measurements
        if phase != "final" and phase in SELECTED_PHASES:
            singles.setdefault(_point(row), []).append(row)
    winners = []
    for point in sorted(singles.keys() | finals.keys()):
        task, device, static_text, shape_text = point
        static = key_from_text(static_text)

        def eligible(r: Mapping[str, Any], static: Key = static, task: str = task) -> bool:
            return r["status"] == "ok" and selectable(task, static, key_from_text(r["config_key"]))

        group = list(_latest(singles.get(point, [])).values())
        final = finals.get(point, [])
        winner = _from_finals(final, eligible, margin, tie) if final else None
        if winner is None:
            winner = _from_singles(group, eligible)
        if winner is None:
            continue
        best, default, fields = winner
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
                num_configs=len(group) or len(final),
                num_failed=sum(r["status"] != "ok" for r in group or final),
                **fields,
            )
        )
    return sorted(winners, key=lambda w: (w.task, w.device_name, value_order(w.static), value_order(w.shape)))


Choice = tuple[Mapping[str, Any], Mapping[str, Any] | None, dict[str, Any]]  # (winner, default, fields)


Point = tuple[str, str, str, str]  # (task, device name, static key, shape key)


def _point(row: Mapping[str, Any]) -> Point:
    return (row["task"], row["device_name"], row["static_key"], row["shape_key"])


def latest_comparisons(rows: Iterable[Mapping[str, Any]], phase: str) -> dict[Point, list[Mapping[str, Any]]]:
    """Per point, the arms of its latest comparison (finals, or a validation) of ``phase``."""
    groups: dict[Point, dict[str, list[Mapping[str, Any]]]] = {}
    for row in rows:
        if row.get("phase") == phase:
            groups.setdefault(_point(row), {}).setdefault(row["group_id"] or row["run_id"], []).append(row)
    return {
        at: max(by_id.values(), key=lambda g: (max(r["finished_at"] for r in g), g[0]["group_id"] or ""))
        for at, by_id in groups.items()
    }


def _from_finals(
    group: list[Mapping[str, Any]], eligible: Callable[[Mapping[str, Any]], bool], margin: float, tie: float
) -> Choice | None:
    """The finals' verdict, or None where they cannot give one (the default failed in them)."""
    default = next((r for r in group if r["is_default"]), None)
    if default is None or default["status"] != "ok":
        return None
    rounds = default["rounds"]
    beat = [r for r in group if not r["is_default"] and eligible(r) and r["speedup_lo"] > 1.0 + margin]
    if not beat:
        others = [r for r in group if not r["is_default"] and r["status"] == "ok"]
        best_other = max(others, key=lambda r: r["speedup"], default=None)
        lo, hi = (best_other["speedup_lo"], best_other["speedup_hi"]) if best_other else (1.0, 1.0)
        return default, default, {"speedup": 1.0, "speedup_lo": lo, "speedup_hi": hi,
                                  "basis": "final", "rounds": rounds}  # fmt: skip
    top = max(r["speedup"] for r in beat)
    tied = [r for r in beat if r["speedup"] * (1.0 + tie) >= top]
    best = min(tied, key=lambda r: value_order(key_from_text(r["config_key"])))  # by value: 64 before 128
    return best, default, {"speedup": best["speedup"], "speedup_lo": best["speedup_lo"],
                           "speedup_hi": best["speedup_hi"], "basis": "final", "rounds": rounds}  # fmt: skip


def _from_singles(
    group: list[Mapping[str, Any]], eligible: Callable[[Mapping[str, Any]], bool]
) -> Choice | None:
    ok = sorted((r for r in group if eligible(r)), key=lambda r: (r["median_us"], r["config_key"]))
    if not ok:
        return None
    default = next((r for r in ok if r["is_default"]), None)
    if default is None:
        return ok[0], None, {}
    best = next((r for r in ok if not r["is_default"] and _beats(r, default)), default)
    fields = {
        "speedup": default["median_us"] / best["median_us"],
        "speedup_lo": default["p20_us"] / best["p80_us"],
        "speedup_hi": default["p80_us"] / best["p20_us"],
    }
    return best, default, fields
