"""``tunectl validate``: a bundle against the untuned defaults, each point run as an L-layer stack."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from tunectl.cli._common import DEFAULT_RESULTS, ResultsOption, fail, library_errors
from tunectl.cli.quality import print_quality
from tunectl.cli.render import compact, holdout_table, standings_table, validation_table
from tunectl.cli.submit import RunBar, connect_trapping_cancel, run_events
from tunectl.decide.validate import DEFAULT_LAYERS, DEFAULT_ROUNDS

LayersOption = Annotated[
    int, typer.Option(help="Layers per stack: calls in a row, a cache-thrashing kernel between each two.")
]
RoundsOption = Annotated[int, typer.Option(help="Interleaved rounds of bundle against default.")]
R = TypeVar("R")
AddressOption = Annotated[str | None, typer.Option(help="Ray cluster to join. Default: a local instance.")]
NumGpusOption = Annotated[int | None, typer.Option(help="Local instance only: GPUs to offer Ray.")]


def validate_cmd(
    bundle: Annotated[str, typer.Argument(help="The bundle: a directory, archive or URI.")],
    spec: Annotated[Path, typer.Option(help="The spec whose points to validate on (TOML).")],
    layers: LayersOption = DEFAULT_LAYERS,
    rounds: RoundsOption = DEFAULT_ROUNDS,
    results: ResultsOption = DEFAULT_RESULTS,
    address: AddressOption = None,
    num_gpus: NumGpusOption = None,
    holdout: Annotated[
        int | None,
        typer.Option(
            help="Instead: draw this many shapes inside SPEC's ranges that were not measured for the bundle "
            "(tuned, refined or probed in its source runs), and time the "
            "bundle's pick against the default and every selectable config at each (single calls)."
        ),
    ] = None,
    seed: Annotated[
        int, typer.Option(help="With --holdout: the draw's seed (the same seed, the same shapes).")
    ] = 0,
    margin: Annotated[
        float, typer.Option(help="With --holdout: the pick loses where it is slower than the best by more.")
    ] = 0.02,
    resume: Annotated[
        str | None,
        typer.Option(
            help="Finish this stopped validation run (the same BUNDLE, SPEC and options) instead of "
            "starting one; a finished run's verdict is printed from its records.",
            metavar="RUN_ID",
        ),
    ] = None,
) -> None:
    """Run every point of SPEC as a stack of layers with BUNDLE's config and with the default,
    interleaved; report per-point and geometric-mean speedup with 95 % intervals. Exits 1 when the
    bundle is slower than the defaults beyond noise at any point. With --holdout N: pick / oracle at
    N untuned shapes (median, p95, worst, geometric mean); exits 1 when the pick loses by more than
    the margin at more than 5 % of them.

    Example:
    \b
        tunectl validate bundles/quickstart/1 --spec configs/quickstart.toml --layers 36
        tunectl validate bundles/refine/1 --spec configs/refine_example.toml --holdout 24 --seed 1
    """
    if holdout is not None:
        _holdout(bundle, spec, results, holdout, seed=seed, margin=margin, rounds=rounds, address=address,
                 num_gpus=num_gpus, resume=resume)  # fmt: skip
        return
    from tunectl.orchestrator.validate import validate

    console = Console()
    run = measured(console, "validation", results, lambda bar: validate(
        bundle, spec, results, layers=layers, rounds=rounds, progress=bar, resume=resume,
        address=address, num_gpus=num_gpus, connect_fn=connect_trapping_cancel,
    ))  # fmt: skip
    print_validation(console, [run], results)
    if run.validation.losers:
        raise typer.Exit(1)


def _holdout(
    bundle: str, spec: Path, results: Path, num_shapes: int, *, seed: int, margin: float, rounds: int,
    address: str | None, num_gpus: int | None, resume: str | None,
) -> None:  # fmt: skip
    from tunectl.orchestrator.validate import validate_holdout

    console = Console()
    run = measured(console, "holdout", results, lambda bar: validate_holdout(
        bundle, spec, results, num_shapes=num_shapes, seed=seed, rounds=rounds, margin=margin,
        progress=bar, resume=resume, address=address, num_gpus=num_gpus, connect_fn=connect_trapping_cancel,
    ))  # fmt: skip
    print_holdout(console, run, results)
    if run.holdout.failed or not run.holdout.ratios:
        raise typer.Exit(1)


def measured(console: Console, what: str, results: Path, measure: Callable[[RunBar], R]) -> R:
    """``measure(bar)`` with a progress bar and library errors as one line; Ctrl-C says what is kept."""
    bar = RunBar(console)
    try:
        with library_errors(), run_events(console):
            return measure(bar)
    except KeyboardInterrupt as exc:
        run_id = getattr(exc, "run_id", None)
        if run_id:
            raise fail(f"{what} run {run_id} stopped; what was measured is kept in {results}; finish it "
                       f"with the same command and --resume {run_id}", 130) from None  # fmt: skip
        raise fail(f"stopped before the {what} run started; validate again", 130) from None
    finally:
        bar.stop()


def print_holdout(console: Console, run: Any, results: Path) -> None:
    held = run.holdout
    title = f"held-out shapes of {run.spec}" + (f" (run {run.run_id})" if run.run_id else "")
    console.print(holdout_table(held, title))
    for why, n in sorted(Counter(s.why for s in run.skipped).items()):
        console.print(f"not measured: {n} shape(s): {why}")
    failed = Counter(s.status for s in held.shapes if s.ratio is None)
    if failed:
        counts = ", ".join(f"{n} {status}" for status, n in sorted(failed.items()))
        where = f" --run {run.run_id}" if run.run_id else ""
        console.print(f"not compared: {counts}; `tunectl failures{where} --results {results}` lists why")
    if not held.ratios:
        console.print("[red]no held-out shape was measured[/]")
        return
    stats = f"median {held.quantile(0.5):.3f}, p95 {held.quantile(0.95):.3f}, worst {held.ratios[-1]:.3f}"
    console.print(f"pick / oracle over {len(held.ratios)} shape(s): {stats}, geomean {held.geomean:.3f}")
    losing = (
        f"the pick loses by more than {held.margin:.0%} at {len(held.losers)} of {len(held.ratios)} shape(s)"
    )
    console.print(f"[red]{losing}[/]" if held.failed else losing)
    console.print(standings_table(held))


def print_validation(console: Console, runs: Sequence[Any], results: Path) -> None:
    """Each run's table, what it did not validate and why, and its measurement quality."""
    from tunectl.decide.quality import Quality, run_quality

    for run in runs:
        title = f"stacked validation of {run.spec}" + (f" (run {run.run_id})" if run.run_id else "")
        with library_errors():
            quality = run_quality(results, run.run_id) if run.run_id else Quality()
        console.print(validation_table(run.validation, title, quality))
        for why, n in sorted(Counter(s.why for s in run.skipped).items()):
            console.print(f"not validated: {n} point(s): {why}")
        for p in run.validation.failures:
            console.print(f"[yellow]{p.status}[/] at {compact(p.shape)}: {p.message.splitlines()[0][:200]}")
        losers = run.validation.losers
        if losers:
            console.print(f"[red]slower than the defaults beyond noise at {len(losers)} point(s)[/]")
        print_quality(console, quality, results, noun="point", again="validate")
