"""Tables for the terminal."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table

from tunectl.keys import Key
from tunectl.select import Winner


def _compact(key: Key, skip: set[str] = frozenset()) -> str:  # type: ignore[assignment]
    return " ".join(f"{k}={v}" for k, v in key if k not in skip)


def winners_table(winners: Sequence[Winner], title: str = "winners") -> Table:
    """Per point: the chosen config, its median, the default's median, the speedup."""
    statics = {w.static for w in winners}
    table = Table(title=title, title_justify="left")
    if len(statics) > 1:
        table.add_column("static")
    for col in ("shape", "winner config", "median µs", "default µs", "speedup", "noise", "n"):
        table.add_column(col, justify="right" if col not in ("shape", "winner config") else "left")
    for w in winners:
        default = f"{w.default_median_us:,.1f}" if w.default_median_us is not None else "failed"
        speedup = f"{w.speedup:.2f}x" if w.speedup is not None else "-"
        row = [
            _compact(w.shape),
            _compact(w.config) + (" (default)" if w.is_default else ""),
            f"{w.median_us:,.1f}",
            default,
            speedup,
            f"{w.rel_noise:.1%}",
            str(w.num_samples),
        ]
        table.add_row(*([_compact(w.static)] if len(statics) > 1 else []), *row)
    if len(statics) == 1:
        table.caption = _compact(next(iter(statics)))
    return table
