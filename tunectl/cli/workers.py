"""Resident workers: started once on a cluster, one per GPU, and kept between runs; a run that joins
the cluster measures on them without paying their start-up."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from tunectl import api
from tunectl.cli._common import fail, library_errors
from tunectl.cli.submit import CompileAheadOption, CompileCacheOption

app = typer.Typer(
    help=(
        "Resident workers: one per GPU of a cluster (`ray start --head` makes one of this machine), "
        "started once and kept between runs; `tunectl submit SPEC --address auto` then measures on them "
        "without waiting for their start-up.\n\n"
        "Example:\n\b\n"
        "    tunectl workers up configs/h200/flash_decode.toml --address auto\n"
        "    tunectl workers list --address auto\n"
        "    tunectl workers down --address auto"
    ),
    no_args_is_help=True,
)

AddressOption = Annotated[
    str | None,
    typer.Option(help="The Ray cluster (auto, HOST:6379, ray://HEAD:10001). Default: RAY_ADDRESS."),
]


@app.command("up")
def up_cmd(
    spec: Annotated[Path, typer.Argument(help="A tuning spec: its GPUs, and the libraries its configs use.")],
    address: AddressOption = None,
    compile_ahead: CompileAheadOption = None,
    compile_cache: CompileCacheOption = None,
) -> None:
    """Start a worker on each GPU SPEC's runs would use, and keep it after this command ends: a later
    `tunectl submit --address` on the cluster measures on these workers at once. Give the same
    --compile-cache and --compile-ahead as the runs will (a run started otherwise is refused).

    Example:
    \b
        tunectl workers up configs/h200/flash_decode.toml --address auto
    """
    with library_errors():
        loaded = api.load_spec(spec)
        compile = api.CompileOptions(cache=compile_cache)
        started = api.workers_up(loaded, api.Cluster(address), compile, compile_ahead)
    for pool, workers in started.items():
        for index, status in enumerate(workers):
            typer.echo(f"{pool}#{index}: {_status_line(status)}")


@app.command("list")
def list_cmd(address: AddressOption = None) -> None:
    """The cluster's resident workers: where each runs, how long it took to start, the runs it has
    served, and the run measuring on it now.

    Example:
    \b
        tunectl workers list --address auto
    """
    with library_errors():
        found = api.workers_list(api.Cluster(address))
    if not found:
        typer.echo("no resident workers on this cluster")
    for pool, workers in found.items():
        for index, status in enumerate(workers):
            typer.echo(f"{pool}#{index}: {_status_line(status)}")


@app.command("down")
def down_cmd(
    address: AddressOption = None,
    force: Annotated[
        bool, typer.Option("--force", help="Stop them even while a run measures on them.")
    ] = False,
) -> None:
    """Stop the cluster's resident workers and give their GPUs back. Refused while a run measures on
    them, unless --force.

    Example:
    \b
        tunectl workers down --address auto
    """
    with library_errors():
        count = api.workers_down(api.Cluster(address), force)
    if not count:
        raise fail("no resident workers on this cluster", 1)
    typer.echo(f"stopped {count} resident worker(s)")


def _status_line(status: dict[str, Any]) -> str:
    if "error" in status:
        return f"not answering ({status['error']})"
    startup = status.get("startup", {})
    libraries = sum(startup.get("libraries", {}).values())
    served = status.get("resident", {}).get("runs", 0)
    holder = f"; measuring run {status['run']}" if status.get("run") else ""
    started = f"started in {startup.get('total_s', 0.0):.1f} s (kernel libraries {libraries:.1f} s)"
    where = f"pid {status['pid']} on {status['host']} ({status['device']})"
    return f"{where}, {started}, {served} run(s) served{holder}"
