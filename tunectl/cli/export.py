"""Export results in the formats serving reads."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tunectl.cli._common import DEFAULT_RESULTS, ResultsOption, library_errors

app = typer.Typer(help="Export results in the formats serving reads.", no_args_is_help=True)


@app.command("bundle")
def export_bundle_cmd(
    name: Annotated[str, typer.Option(help="Bundle name.")],
    version: Annotated[str, typer.Option(help="Bundle version (immutable once published).")],
    out: Annotated[Path, typer.Option(help="Bundle store: a local directory.")] = Path("bundles"),
    results: ResultsOption = DEFAULT_RESULTS,
    run: Annotated[list[str] | None, typer.Option(help="Only these runs (repeatable). Default: all.")] = None,
    task: Annotated[str | None, typer.Option(help="Only this task.")] = None,
    device: Annotated[str | None, typer.Option(help="Only rows measured on this device name.")] = None,
) -> None:
    """Pick the winners from RESULTS and publish them as an immutable, checksummed bundle."""
    from tunectl.export import export_bundle

    with library_errors():
        res = export_bundle(results, name, version, out, run_ids=run, task=task, device=device)
    typer.echo(f"published {name}/{version} at {res.path}: {len(res.winners)} entries "
               f"from {len(res.source_runs)} run(s)")
