"""The report's HTML: ``templates/report.html.j2`` rendered by Jinja2 with autoescape on.

Every value reaches the page through the template, escaped; the filters here only format numbers and
keys. Plots are referred to by their file names, beside ``index.html``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from tunectl.core.keys import Key, key_text
from tunectl.report.gather import ReportData, geomean
from tunectl.report.grids import label


def times(value: float | None) -> str:
    return f"{value:.3f}×" if value is not None else "-"


def interval(bounds: tuple[float | None, float | None] | None) -> str:
    lo, hi = bounds or (None, None)
    return f"{lo:.3f}–{hi:.3f}" if lo is not None and hi is not None else "-"


def _us(value: float | None) -> str:
    return f"{value:,.1f}" if value is not None else "-"


def _slower(ratio: float | None) -> str:
    return f"{ratio:.2f}× slower" if ratio is not None else "failed"


def _keytext(key: Key | None) -> str:
    return key_text(key) if key is not None else ""


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {name}" for name, n in counts.items()) or "none"


def summary(data: ReportData, source: str) -> list[tuple[str, str, Any]]:
    """The summary table's rows: (what, its text, the number behind it or None)."""
    g = geomean(p.speedup for p in data.points)
    validated = geomean(c.speedup for p in data.validation for c in p.checks if c.status == "ok")
    lines: list[tuple[str, str, Any]] = [
        ("results", source, None),
        ("runs", ", ".join(f"{run} ({n} rows)" for run, n in data.runs.items()), None),
        ("measurements by status", _counts(data.statuses), None),
        ("measurements by phase", _counts(data.phases), None),
        ("winners", str(len(data.points)), len(data.points)),
        ("geometric-mean speedup of winners", times(g), g),
        ("geometric-mean speedup validated", times(validated), validated),
    ]
    if data.imported:
        shapes = sum(len(p.points) for p in data.imported)
        lines.append(("imported logs", f"{shapes} shapes in {len(data.imported)} groups", shapes))
    if data.bundle is not None:
        lines.append(("bundle", f"{data.bundle.name} ({len(data.bundle.points)} entries)", None))
    return lines


def render_html(data: ReportData, source: str) -> str:
    """The page, referring to each plot by its file name beside it."""
    from jinja2 import Environment, PackageLoader, StrictUndefined

    env = Environment(
        loader=PackageLoader("tunectl.report", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        label=label, keytext=_keytext, repr=repr, times=times, interval=interval, us=_us, slower=_slower
    )
    page = env.get_template("report.html.j2")
    generated = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    return page.render(data=data, source=source, generated=generated, summary=summary(data, source))
