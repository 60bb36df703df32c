"""Tables for the terminal."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from rich.table import Table

from tunectl.api.types import Quality, Winner, noise_known
from tunectl.cli.quality import legend, mark
from tunectl.core.keys import Key, Value, key_text


def compact(key: Key, skip: Iterable[str] = ()) -> str:
    hidden = set(skip)
    return " ".join(f"{k}={v}" for k, v in key if k not in hidden) or "-"


def _constant(keys: Iterable[Key]) -> dict[str, Value]:
    """The parameters that take one value across ``keys`` (shown once, not on every row)."""
    dicts = [dict(k) for k in keys]
    if len(dicts) < 2:
        return {}
    return {n: v for n, v in dicts[0].items() if all(n in d and d[n] == v for d in dicts)}


def winners_table(winners: Sequence[Winner], title: str = "winners", quality: Quality | None = None) -> Table:
    """Per point: the chosen config, its median, the default's median, the speedup and its interval;
    with ``quality``, a ``!`` column marking the points whose decision rests on flagged rows."""
    same_static = _constant(w.static for w in winners) if len({w.static for w in winners}) > 1 else {}
    one_static = len({w.static for w in winners}) == 1
    same_config = _constant(w.config for w in winners)
    marks = {w.point: mark(quality.of(w.point)) for w in winners} if quality else {}
    table = Table(
        title=title, title_justify="left", padding=(0, 1, 0, 0)
    )  # fits 80 columns with its ! column
    if not one_static:
        table.add_column("static", overflow="fold")
    table.add_column("shape", overflow="fold", min_width=11)
    table.add_column("winner config", overflow="fold", min_width=11)
    for col in (
        "median µs",
        "default µs",
        "speedup",
        "95% CI|noise",
        *(["!"] if any(marks.values()) else []),
    ):
        table.add_column(col, justify="right", no_wrap=True)
    for w in winners:
        row = [
            compact(w.shape),
            compact(w.config, same_config) + (" (default)" if w.is_default else ""),
            f"{w.median_us:,.1f}",
            f"{w.default_median_us:,.1f}" if w.default_median_us is not None else "failed",
            f"{w.speedup:.2f}x" if w.speedup is not None else "-",
            _spread(w),
            *([marks[w.point]] if any(marks.values()) else []),
        ]
        table.add_row(*([] if one_static else [compact(w.static, same_static)]), *row)
    table.caption = "\n".join(_winner_notes(winners, one_static, same_static, same_config, quality)) or None
    return table


def _spread(w: Winner) -> str:
    """The finals' interval, or the winner's noise (unknown from one sample)."""
    if w.basis == "final":
        return f"{w.speedup_lo:.2f}-{w.speedup_hi:.2f}"
    return f"±{w.rel_noise:.1%}" if noise_known(w) else "±?"


def _winner_notes(
    winners: Sequence[Winner],
    one_static: bool,
    same_static: dict[str, Value],
    same_config: dict[str, Value],
    quality: Quality | None,
) -> list[str]:
    notes = []
    if one_static and winners:
        notes.append(compact(winners[0].static))
    elif same_static:
        notes.append("all: " + " ".join(f"{k}={v}" for k, v in same_static.items()))
    if same_config:
        notes.append("every winner: " + " ".join(f"{k}={v}" for k, v in same_config.items()))
    if any(w.basis == "final" for w in winners):
        notes.append("95% CI: the paired speedup's, from the finals; ±: the winner's p20-p80 noise")
    if any(w.basis != "final" and not noise_known(w) for w in winners):
        notes.append("±?: one sample, its noise unknown")
    key = legend(quality) if quality else None
    return [*notes, key] if key else notes


RUN_COLUMNS = ("run", "name", "task", "state", "started", "planned", "done", "failed")
#: the columns that give way, with an ellipsis, when the terminal is narrow; the others stay whole
_GIVING = ("name", "task", "failed")
_LEAST = 6  # a column that gives way keeps this many characters ("quick…")


def runs_table(rows: Sequence[tuple[str, ...]], title: str, width: int) -> Table:
    """The runs, one row each (``RUN_COLUMNS``), within ``width`` columns: ids, states and counts stay
    whole (an id cut short cannot be resumed); a long name, task or failure list ends in an ellipsis
    rather than being split mid-word; the start time (the run id holds it too, in UTC) is left out
    where it does not fit. ``runs --json`` has everything whole."""
    natural = {c: max([len(c), *(len(r[i]) for r in rows)]) for i, c in enumerate(RUN_COLUMNS)}
    columns = list(RUN_COLUMNS)
    if _room(columns, natural, width) < _LEAST * len(_GIVING):
        columns.remove("started")
    widths = _shrunk({c: natural[c] for c in _GIVING}, _room(columns, natural, width))
    table = Table(title=title, title_justify="left", padding=(0, 1, 0, 0))  # a space after each cell
    for column in columns:
        numeric = column in ("planned", "done")
        width_ = widths.get(column, natural[column])
        table.add_column(column, justify="right" if numeric else "left", no_wrap=True, width=width_)
    for row in rows:
        table.add_row(*(cell for column, cell in zip(RUN_COLUMNS, row, strict=True) if column in columns))
    return table


def _room(columns: Sequence[str], natural: dict[str, int], width: int) -> int:
    """What is left for the columns that give way: ``width`` less borders, padding and the others."""
    return width - (2 * len(columns) + 1) - sum(natural[c] for c in columns if c not in _GIVING)


def _shrunk(widths: dict[str, int], room: int) -> dict[str, int]:
    """``widths`` narrowed, the widest first, until they fit in ``room`` or each is ``_LEAST``."""
    out = dict(widths)
    while sum(out.values()) > room:
        widest = max(out, key=lambda c: out[c])
        if out[widest] <= _LEAST:
            break
        out[widest] -= 1
    return out


def validation_table(validation: Any, title: str, quality: Quality | None = None) -> Table:
    """Per point: the bundle's config, per-layer times of default and bundle, speedup and interval;
    with ``quality``, a ``!`` column marking the points whose comparison rests on flagged rows."""
    flagged = {(p[2], p[3]): mark(flags) for p, flags in quality.flags.items()} if quality else {}
    marks = [
        flagged.get((key_text(p.static), key_text(p.shape)), "") if flagged else "" for p in validation.points
    ]
    table = Table(title=title, title_justify="left")
    for col in ("shape", "bundle config"):
        table.add_column(col, overflow="fold", min_width=8)
    for col in ("default µs", "bundle µs", "speedup", "95% CI"):
        table.add_column(col, justify="right", overflow="fold")
    table.add_column("verdict", justify="right", no_wrap=True, min_width=6)  # the column a reader needs whole
    if any(marks):
        table.add_column("!", justify="right", no_wrap=True)
    style = {"faster": "green", "slower": "red", "tie": "default"}
    for p, marked in zip(validation.points, marks, strict=True):
        s = p.speedup
        table.add_row(
            compact(p.shape),
            compact(p.config),
            f"{p.default_us:,.1f}" if p.default_us is not None else "-",
            f"{p.bundle_us:,.1f}" if p.bundle_us is not None else "-",
            f"{s.estimate:.3f}x" if s else "-",
            f"{s.lo:.3f}-{s.hi:.3f}" if s else "-",
            f"[{style.get(p.verdict, 'yellow')}]{p.verdict}[/]",
            *([marked] if any(marks) else []),
        )
    g = validation.geomean
    notes = [f"{validation.layers} layers per stack, {validation.rounds} interleaved rounds; µs per layer"]
    if g is not None:
        notes.append(f"geometric mean: {g.estimate:.3f}x, 95% CI {g.lo:.3f}-{g.hi:.3f}")
    key = legend(quality) if quality else None
    table.caption = "\n".join([*notes, key] if key else notes)
    return table


def standings_table(holdout: Any) -> Table:
    """The picks against the baselines over the held-out shapes: geomean, share within 3 %, worst."""
    table = Table(title="against the baselines", title_justify="left")
    for col in ("choosing by", "shapes", "geomean", "within 3 %", "worst"):
        table.add_column(col, overflow="fold", justify="left" if col == "choosing by" else "right")
    for st in holdout.standings():
        if st.ratios:
            table.add_row(
                st.label, str(len(st.ratios)), f"{st.geomean:.3f}", f"{st.within_3pct:.0%}", f"{st.worst:.3f}"
            )
        else:
            table.add_row(st.label, "0", "-", "-", "-")
    return table


def holdout_table(holdout: Any, title: str) -> Table:
    """Per held-out shape: the bundle's pick, the fastest config there, and pick / oracle. A static key
    or shape parameter that is the same on every row is said once, under the table."""
    shapes = holdout.shapes
    one_static = len({h.static for h in shapes}) == 1
    same_shape = _constant(h.shape for h in shapes)
    table = Table(title=title, title_justify="left")
    for col in ("shape", *([] if one_static else ["static"]), "pick", "oracle"):
        table.add_column(col, overflow="fold", min_width=8)
    table.add_column("pick / oracle", justify="right", no_wrap=True)
    for h in shapes:
        ratio = "-" if h.ratio is None else f"{h.ratio:.3f}"
        if h.loses(holdout.margin):
            ratio = f"[red]{ratio}[/]"
        oracle = "-" if h.oracle is None else ("(pick)" if h.oracle == h.pick else compact(h.oracle))
        static = [] if one_static else [compact(h.static)]
        table.add_row(
            compact(h.shape, same_shape), *static, compact(h.pick), oracle, ratio if h.ratio else h.status
        )
    notes = [compact(shapes[0].static)] if one_static and shapes else []
    if same_shape:
        notes.append("every shape: " + " ".join(f"{k}={v}" for k, v in same_shape.items()))
    notes.append("pick / oracle: the pick's time over the fastest config's (1.000: the pick was the fastest)")
    table.caption = "\n".join(notes)
    return table
