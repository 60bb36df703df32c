"""Inspect and check published bundles."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from tunectl.cli._common import library_errors

app = typer.Typer(help="Inspect and check published bundles.", no_args_is_help=True)


@app.command("verify")
def verify_cmd(path: Annotated[Path, typer.Argument(help="A bundle directory (<store>/<name>/<version>).")]) -> None:
    """Check a bundle's schema version and every file's checksum."""
    from tunectl.runtime import load_bundle

    with library_errors():
        bundle = load_bundle(path, env_policy="off")
    typer.echo(f"ok: {bundle.name}/{bundle.version}, {len(bundle)} entries, tasks: {', '.join(bundle.tasks)}")


@app.command("show")
def show_cmd(path: Annotated[Path, typer.Argument(help="A bundle directory (<store>/<name>/<version>).")]) -> None:
    """Print a verified bundle's manifest."""
    from tunectl.runtime import load_bundle

    with library_errors():
        bundle = load_bundle(path, env_policy="off")
    typer.echo(json.dumps(bundle.manifest, indent=2, sort_keys=True))
