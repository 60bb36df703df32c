"""``tunectl validate``: a bundle against the untuned defaults, each point run as an L-layer stack, or
its picks at held-out shapes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from tunectl import api
from tunectl.cli._common import DEFAULT_RESULTS, ResultsOption, library_errors
from tunectl.cli.progress import measured
from tunectl.cli.quality import print_quality
from tunectl.cli.render import compact, holdout_table, standings_table, validation_table

LayersOption = Annotated[
    int, typer.Option(help="Layers per stack: calls in a row, a cache-thrashing kernel between each two.")
]
RoundsOption = Annotated[int, typer.Option(help="Interleaved rounds of bundle against default.")]
AddressOption = Annotated[str | None, typer.Option(help="Ray cluster to join. Default: a local instance.")]
NumGpusOption = Annotated[int | None, typer.Option(help="Local instance only: GPUs to offer Ray.")]
HoldoutOption = Annotated[
    int | None,
    typer.Option(
        help="Instead: draw this many shapes inside SPEC's ranges that were not measured for the bundle "
        "(tuned, refined or probed in its source runs), and time the "
        "bundle's pick against the default and every selectable config at each (single calls)."
    ),
]
SeedOption = Annotated[
    int, typer.Option(help="With --holdout: the draw's seed (the same seed, the same shapes).")
]
MarginOption = Annotated[
    float, typer.Option(help="With --holdout: the pick loses where it is slower than the best by more.")
]
ResumeOption = Annotated[
    str | None,
    typer.Option(
        help="Finish this stopped validation run (the same BUNDLE, SPEC and options) instead of "
        "starting one; a finished run's verdict is printed from its records.",
        metavar="RUN_ID",
    ),
]


def validate_cmd(
    bundle: Annotated[str, typer.Argument(help="The bundle: a directory, archive or URI.")],
    spec: Annotated[Path, typer.Option(help="The spec whose points to validate on (TOML).")],
    layers: LayersOption = api.DEFAULT_LAYERS,
    rounds: RoundsOption = api.DEFAULT_ROUNDS,
    results: ResultsOption = DEFAULT_RESULTS,
    address: AddressOption = None,
    num_gpus: NumGpusOption = None,
    holdout: HoldoutOption = None,
    seed: SeedOption = 0,
    margin: MarginOption = api.DEFAULT_MARGIN,
    resume: ResumeOption = None,
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
    console = Console()
    with library_errors():
        cluster = api.Cluster(address, num_gpus, cancel_on_sigterm=True)
        if holdout is not None:
            options = api.HoldoutOptions(holdout, seed, rounds, margin, resume, cluster)
        checked = api.ValidateOptions(layers, rounds, resume, cluster)
        points = api.load_spec(spec)
        if holdout is not None:
            api.check_holdout(points)
        loaded = api.read_bundle(bundle)
    if holdout is not None:
        held = measured(
            console, "holdout", results, lambda bar: api.holdout(loaded, points, results, options, bar)
        )
        print_holdout(console, held, results)
        if held.holdout.failed or not held.holdout.ratios:
            raise typer.Exit(1)
        return
    run = measured(
        console, "validation", results, lambda bar: api.validate(loaded, points, results, checked, bar)
    )
    print_validation(console, [run], results)
    if run.validation.losers:
        raise typer.Exit(1)


def print_holdout(console: Console, run: api.HoldoutRun, results: Path) -> None:
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


def print_validation(console: Console, runs: Sequence[api.ValidationRun], results: Path) -> None:
    """Each run's table, what it did not validate and why, and its measurement quality."""
    for run in runs:
        title = f"stacked validation of {run.spec}" + (f" (run {run.run_id})" if run.run_id else "")
        with library_errors():
            quality = api.run_quality(results, run.run_id) if run.run_id else None
        console.print(validation_table(run.validation, title, quality))
        for why, n in sorted(Counter(s.why for s in run.skipped).items()):
            console.print(f"not validated: {n} point(s): {why}")
        for p in run.validation.failures:
            console.print(f"[yellow]{p.status}[/] at {compact(p.shape)}: {p.message.splitlines()[0][:200]}")
        losers = run.validation.losers
        if losers:
            console.print(f"[red]slower than the defaults beyond noise at {len(losers)} point(s)[/]")
        if quality is not None:
            print_quality(console, quality, results, noun="point", again="validate")
