"""``tunectl bundle confirm``: what a serving process confirming the bundle's candidates at its own
shapes at start-up would choose, and how long it takes here."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console

from tunectl import api
from tunectl.api.errors import OptionError
from tunectl.cli._common import library_errors

ShapeOption = Annotated[
    list[str],
    typer.Option(
        "--shape",
        help="A shape dimension and its values, NAME=V1,V2,... (repeat per dimension); a dimension "
        "left out is confirmed cell by cell, timed at each cell's edges, a pick serving each quarter of it.",
    ),
]
StaticOption = Annotated[
    list[str] | None,
    typer.Option("--static", help="NAME=VALUE of the entries' static key (where the bundle holds several)."),
]


def confirm_cmd(
    source: Annotated[str, typer.Argument(help="A bundle: directory, archive, URI, or STORE/NAME@CHANNEL.")],
    task: Annotated[str, typer.Option("--task", help="The bundle's task to confirm.")],
    shape: ShapeOption,
    static: StaticOption = None,
    device: Annotated[
        str, typer.Option(help="auto (the first GPU, else the CPU), cpu, cuda:0, ...")
    ] = "auto",
    budget_s: Annotated[float, typer.Option("--budget-s", help="Seconds for every shape together.")] = 60.0,
    cell_span: Annotated[
        float,
        typer.Option("--cell-span", help="The widest a cell confirmed along a dimension left out may span."),
    ] = api.CELL_SPAN,
    every: Annotated[
        bool, typer.Option("--all", help="A line for every shape, not only those whose config would change.")
    ] = False,
    plan_only: Annotated[
        bool, typer.Option("--plan", help="Say what would be timed (cells, points, configs); time nothing.")
    ] = False,
    save: Annotated[
        str | None,
        typer.Option(
            "--save",
            help="Write what was chosen to this file, for serving processes on machines like this one to "
            "apply at start-up without timing (tunectl.runtime.apply_confirmed). Where the file holds picks "
            "confirmed for this bundle, go on from them: what they reached is not timed again.",
        ),
    ] = None,
) -> None:
    """Time each shape's candidates (export's short list per entry) and say which is fastest where.

    Give the batch sizes a serving process runs, and leave out the lengths it cannot know: each is
    then confirmed at the edges of each of the bundle's cells along it, as start-up confirming does,
    and each quarter of a cell gets the candidate fastest there on the line between its edge times.

    With --save, a confirmation cut short by --budget-s goes on where it stopped when the same
    command is run again (the summary says how many cells are left).

    Example:
    \b
        tunectl bundle confirm bundles/quickstart/1 --task decode_attention --shape batch=1,2,3,4
        tunectl bundle confirm bundles/quickstart/1 --task decode_attention \
          --shape batch=4,16 --shape kv_len=2048
        tunectl bundle confirm bundles/quickstart/1 --task decode_attention --shape batch=1,2,3,4 \
          --save confirmed.json
    """
    console = Console()
    with library_errors():
        bundle = api.read_bundle(source)
        shapes = api.shape_grid({k: v for k, v in (_assignment(s, "shape") for s in shape)})
        given = dict(_assignment(s, "static", many=False) for s in static or [])
        static_values = {k: v[0] for k, v in given.items()}
        options = api.ConfirmOptions(static_values, device, budget_s, cell_span=cell_span)
        if plan_only:
            console.print(api.plan_confirm(bundle, task, shapes, options).line(), highlight=False)
            return
        done = api.confirm_candidates(bundle, task, shapes, options, resume=save)
        saved = api.save_confirmed(done, bundle, save) if save else None
    changed = [r for r in done.reports if r.timed and _changes(r, bundle, task, done.static)]
    for report in done.reports if every else changed:
        console.print(report.line(), highlight=False, soft_wrap=True)
    console.print(_summary(done, len(changed), budget_s, every))
    if saved is not None:
        line = f"saved {len(done.picks)} confirmed pick(s) to {saved}"
        if done.resumed:
            line += f" ({done.resumed} shape(s) or cell(s) confirmed before, kept)"
        console.print(line, highlight=False, soft_wrap=True)


def _changes(report: Any, bundle: api.Bundle, task: str, static: dict[str, Any]) -> bool:
    """Whether confirming would run another config than the bundle's pick at ``report``'s shape, or
    in any part of its cell."""
    return any(
        dict(config) != bundle.lookup(task, **{**static, **shape}) for shape, config, _ in report.parts
    )


def _summary(done: api.Confirmed, changed: int, budget_s: float, every: bool) -> str:
    reports = done.reports
    timed = [r for r in reports if r.timed]
    others = {
        "with one candidate": sum(
            1 for r in reports if r.chosen is not None and not r.timed and not r.skipped
        ),
        "without an entry": sum(r.chosen is None for r in reports),
        f"not reached within {budget_s:g} s": sum(r.skipped for r in reports),
    }
    rest = "".join(f"; {n} {what}" for what, n in others.items() if n)
    return (
        f"timed the candidates at {len(timed)} of {len(reports)} shape(s) on {done.device} ({done.how}) in "
        f"{done.seconds:.1f} s: {changed} would run another config than the bundle's pick{rest}"
        + ("" if every or changed == len(reports) else " (--all: a line for every shape)")
    )


def _assignment(text: str, option: str, many: bool = True) -> tuple[str, list[Any]]:
    """``NAME=V1,V2`` as (name, values), each value an int, a float, true/false or else text."""
    name, sep, values = text.partition("=")
    parts = values.split(",") if many else [values]
    if not sep or not name.strip() or not all(p.strip() for p in parts):
        raise OptionError(option, text, "must be NAME=VALUE" + (",VALUE..." if many else ""))
    return name.strip(), [_value(p.strip()) for p in parts]


def _value(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return {"true": True, "false": False}.get(text.lower(), text)
