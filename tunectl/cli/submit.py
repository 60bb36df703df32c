"""Plan SPEC's shape x config work, measure it on every worker of a Ray cluster, stream results."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tunectl.cli._common import DEFAULT_RESULTS, ResultsOption, fail, library_errors
from tunectl.cli.render import winners_table


class _Bar:
    """Progress bar over the items of a run, counting failures as they come."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[failed]} failed"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self.task_id: Any = None
        self.failed = 0

    def start(self, run_id: str, total: int, placement: Any) -> None:
        self.console.print(
            f"run [bold]{run_id}[/]: {total} items on {placement.num_workers} {placement.kind} worker(s) "
            f"across {placement.num_nodes} node(s)"
        )
        self.bar.start()
        self.task_id = self.bar.add_task("measuring", total=total, failed=0)

    def record(self, record: Any) -> None:
        self.failed += record.status != "ok"
        self.bar.update(self.task_id, advance=1, failed=self.failed)

    def stop(self) -> None:
        self.bar.stop()


def submit(
    spec: Annotated[
        Path | None, typer.Argument(help="Tuning spec (TOML). Not needed with --resume.", show_default=False)
    ] = None,
    address: Annotated[
        str | None,
        typer.Option(help="Ray cluster to join (e.g. auto, ray://head:10001). Default: a local instance."),
    ] = None,
    results: ResultsOption = DEFAULT_RESULTS,
    resume: Annotated[
        str | None, typer.Option(help="Finish an interrupted run: measure only what it lacks.")
    ] = None,
    num_gpus: Annotated[
        int | None, typer.Option(help="Local instance only: GPUs to offer Ray (default: detected).")
    ] = None,
) -> None:
    """Plan SPEC's shape x config work, measure it on a Ray cluster, stream results to Parquet."""
    from orchestrator.submit import submit as run_submit
    from tunectl.results import read_results
    from tunectl.select import select_winners

    console = Console()
    bar = _Bar(console)
    try:
        with library_errors():
            out = run_submit(
                str(spec) if spec else None,
                results,
                address=address,
                resume=resume,
                progress=bar,
                num_gpus=num_gpus,
            )
    except KeyboardInterrupt:
        bar.stop()
        raise fail(
            "interrupted; what was measured is kept. Finish it with "
            f"`tunectl submit --resume <RUN_ID> --results {results}` (`tunectl runs` lists runs)",
            130,
        ) from None
    finally:
        bar.stop()
    counts = ", ".join(f"{n} {s}" for s, n in sorted(out.statuses.items()))
    console.print(
        f"run [bold]{out.run_id}[/] finished in {out.seconds:.1f} s: {counts or 'nothing to do'}"
        + (f" ({out.num_skipped_done} already measured)" if out.num_skipped_done else "")
    )
    for static, shape, why in out.plan.skipped_points:
        console.print(f"[yellow]skipped[/] {dict(static)} {dict(shape)}: {why}")
    with library_errors():
        winners = select_winners(read_results(results, run_ids=[out.run_id]))
    console.print(winners_table(winners, title=f"winners of {out.run_id} ({out.plan.spec.task})"))
    console.print(f"results: {results}")
