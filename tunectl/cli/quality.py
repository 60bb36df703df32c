"""Measurement quality in words: the closing count line, the marks in the winners table and what to do
about flagged points (the counting is ``tunectl.decide.quality``)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from rich.console import Console

from tunectl.api.types import Dataset, Flag, Quality

#: a flagged point's mark in a table's ``!`` column, and what it means
MARKS = {
    Flag.DRIFT: ("d", "a compared row was drift-flagged"),
    Flag.FEW_SAMPLES: ("s", "fewer samples than min_samples"),
    Flag.NOISY: ("n", "noise over noise_target"),
    Flag.LOST: ("x", "rows lost to an unreadable results file"),
}


def mark(flags: Iterable[Flag]) -> str:
    """A point's letters, in a fixed order ("" for none)."""
    given = set(flags)
    return "".join(letter for flag, (letter, _) in MARKS.items() if flag in given)


def legend(quality: Quality) -> str | None:
    """The ``!`` column's legend: the letters that appear, and their meaning."""
    seen = {flag for flags in quality.flags.values() for flag in flags}
    if not seen:
        return None
    return "!: " + "; ".join(f"{letter} {words}" for flag, (letter, words) in MARKS.items() if flag in seen)


def count_line(quality: Quality) -> str:
    """One line: drift-flagged rows, full measurements under min_samples, noisy points, and configs
    whose looks at a point read far apart with no flag (``tunectl.decide.quality.looks_apart``)."""
    q = quality
    parts = [f"{q.num_drift} of {q.num_rows} ok rows drift-flagged"]
    if q.num_full:
        parts.append(
            f"{q.num_few_samples} of {q.num_full} full measurements and comparison arms under min_samples "
            "(screening looks not counted)"
        )
    parts.append(f"{q.num_noisy} of {q.num_points} points noisier than noise_target")
    if q.num_looked_twice:
        parts.append(
            f"{q.num_looks_apart} of {q.num_looked_twice} configs looked at twice at a point read more than "
            "5 % apart beyond their own noise, unflagged"
        )
    return "measurement quality: " + "; ".join(parts)


def advice_line(quality: Quality, results: Path, noun: str = "winner", again: str = "tune") -> str | None:
    """What a flagged decision means and what to do, in a line; None where nothing is flagged."""
    if not quality.num_flagged:
        return None
    seen = {flag for flags in quality.flags.values() for flag in flags}
    todo = ["measure them again on an idle device (d)"] if Flag.DRIFT in seen else []
    few, noisy = Flag.FEW_SAMPLES in seen, Flag.NOISY in seen
    if few or noisy:
        raise_ = "max_seconds and max_samples" if noisy else "max_seconds"
        reach = " and ".join(["min_samples"] * few + ["the noise target"] * noisy)
        letters = ", ".join(["s"] * few + ["n"] * noisy)
        todo.append(f"raise [measure] {raise_} so measurements reach {reach} ({letters})")
    if Flag.LOST in seen:
        todo.append(f"`tunectl doctor --results {results}` lists the unreadable files (x)")
    return (
        f"{quality.num_flagged} of {quality.num_points} {noun}s rest on flagged rows (column !): "
        f"{'; '.join(todo)}; then {again} those points again"
    )


def print_quality(
    console: Console, quality: Quality, results: Path, noun: str = "winner", again: str = "tune"
) -> None:
    """What to do about flagged decisions (where any are), then the count line."""
    advice = advice_line(quality, results, noun, again)
    if advice:
        console.print(advice, style="yellow", markup=False, highlight=False)
    console.print(count_line(quality), markup=False, highlight=False)


def damaged_lines(dataset: Dataset, results: Path) -> list[str]:
    """One line per run that lost rows to unreadable files: which, and what that means for its points."""
    lines = []
    for run_id in dataset.damaged_runs:
        parts = [p for p in dataset.damaged if p.run_id == run_id]
        more = f" and {len(parts) - 1} more" if len(parts) > 1 else ""
        lines.append(
            f"run {run_id} has {len(parts)} unreadable results file(s) ({parts[0].path}{more}): its points "
            f"that lost rows there are marked x; `tunectl doctor --results {results}` lists such files"
        )
    return lines
