"""``tunectl validate``: a bundle against the untuned defaults, each point run as an L-layer stack."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from tunectl.cli._common import DEFAULT_RESULTS, ResultsOption, fail, library_errors
from tunectl.cli.render import compact, validation_table
from tunectl.cli.submit import RunBar, connect_trapping_cancel, run_events
from tunectl.validate import DEFAULT_LAYERS, DEFAULT_ROUNDS

LayersOption = Annotated[
    int, typer.Option(help="Layers per stack: calls in a row, a cache-thrashing kernel between each two.")
]
RoundsOption = Annotated[int, typer.Option(help="Interleaved rounds of bundle against default.")]
AddressOption = Annotated[str | None, typer.Option(help="Ray cluster to join. Default: a local instance.")]


def validate_cmd(
    bundle: Annotated[str, typer.Argument(help="The bundle: a directory, archive or URI.")],
    spec: Annotated[Path, typer.Option(help="The spec whose points to validate on (TOML).")],
    layers: LayersOption = DEFAULT_LAYERS,
    rounds: RoundsOption = DEFAULT_ROUNDS,
    results: ResultsOption = DEFAULT_RESULTS,
    address: AddressOption = None,
    num_gpus: Annotated[int | None, typer.Option(help="Local instance only: GPUs to offer Ray.")] = None,
) -> None:
    """Run every point of SPEC as a stack of layers with BUNDLE's config and with the default,
    interleaved; report per-point and geometric-mean speedup with 95 % intervals. Exits 1 when the
    bundle is slower than the defaults beyond noise at any point.

    Example:
    \b
        tunectl validate bundles/quickstart/1 --spec configs/quickstart.toml --layers 36
    """
    from orchestrator.validate import validate

    console = Console()
    bar = RunBar(console)
    try:
        with library_errors(), run_events(console):
            run = validate(
                bundle, spec, results, layers=layers, rounds=rounds, progress=bar,
                address=address, num_gpus=num_gpus, connect_fn=connect_trapping_cancel,
            )  # fmt: skip
    except KeyboardInterrupt as exc:
        run_id = getattr(exc, "run_id", None)
        stopped = f"validation run {run_id} stopped" if run_id else "stopped before the run started"
        raise fail(f"{stopped}; what was measured is kept in {results}; validate again", 130) from None
    finally:
        bar.stop()
    print_validation(console, [run])
    if run.validation.losers:
        raise typer.Exit(1)


def print_validation(console: Console, runs: Sequence[Any]) -> None:
    for run in runs:
        title = f"stacked validation of {run.spec}" + (f" (run {run.run_id})" if run.run_id else "")
        console.print(validation_table(run.validation, title))
        for why, n in sorted(Counter(s.why for s in run.skipped).items()):
            console.print(f"not validated: {n} point(s): {why}")
        for p in run.validation.failures:
            console.print(f"[yellow]{p.status}[/] at {compact(p.shape)}: {p.message.splitlines()[0][:200]}")
        losers = run.validation.losers
        if losers:
            console.print(f"[red]slower than the defaults beyond noise at {len(losers)} point(s)[/]")
