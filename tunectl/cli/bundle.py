"""Inspect, check, compare, promote and pack published bundles.

A SOURCE is a bundle directory (``bundles/quickstart/1``), an archive (``quickstart-1.tar.gz``), a URI
(``s3://bucket/bundles/quickstart/1``), or what a channel points at (``bundles/quickstart@stable``).
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from tunectl import api
from tunectl.api.types import Entry, EntryChange
from tunectl.cli._common import library_errors
from tunectl.cli.confirm import confirm_cmd
from tunectl.core.files import canonical_json
from tunectl.core.keys import Key, key_json

app = typer.Typer(
    help=(
        "Inspect, check, compare, promote and pack published bundles.\n\n"
        "Example:\n\b\n"
        "    tunectl bundle list bundles\n"
        "    tunectl bundle promote quickstart 1 --channel stable --store bundles"
    ),
    no_args_is_help=True,
)

SourceArg = Annotated[str, typer.Argument(help="A bundle: directory, archive, URI, or STORE/NAME@CHANNEL.")]
StoreOption = Annotated[str, typer.Option("--store", help="Bundle store: a directory or a URI (s3://...).")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
DEFAULT_STORE = "bundles"


@app.command("list")
def list_cmd(
    store: Annotated[str, typer.Argument(help="Bundle store: a directory or a URI.")] = DEFAULT_STORE,
    as_json: JsonOption = False,
) -> None:
    """List every published version in STORE, and the channels that point at them.

    Example:
    \b
        tunectl bundle list bundles --json
    """
    with library_errors():
        versions, channels = api.list_bundles(store)
    if as_json:
        typer.echo(
            canonical_json(
                {"versions": [v.__dict__ for v in versions], "channels": [c.__dict__ for c in channels]},
                indent=2,
            )
        )
        return
    if not versions:
        typer.echo(f"no bundles in {store}")
        return
    table = Table(title=f"bundles in {store}", title_justify="left")
    for col in ("name", "version", "channels", "created", "entries", "device", "tasks"):
        table.add_column(col, justify="right" if col == "entries" else "left", overflow="fold")
    for v in versions:
        marks = ", ".join(c.channel for c in channels if c.name == v.name and c.version == v.version)
        table.add_row(
            v.name, v.version, marks, v.created_at, str(v.num_entries), v.device_name, ", ".join(v.tasks)
        )
    Console().print(table)


@app.command("verify")
def verify_cmd(
    source: SourceArg,
    env_policy: Annotated[
        str,
        typer.Option(help="Also check this machine against the bundle's environment: off | warn | strict."),
    ] = "off",
) -> None:
    """Check a bundle's schema version, every file's checksum and every table; exit 1 if anything is wrong.

    Example:
    \b
        tunectl bundle verify bundles/quickstart@stable --env-policy warn
    """
    with library_errors():
        bundle = api.verify_bundle(source, env_policy=env_policy)
    via = f" (channel {bundle.channel})" if bundle.channel else ""
    tasks = ", ".join(bundle.tasks)
    typer.echo(f"ok: {bundle.name}/{bundle.version}{via}, {len(bundle)} entries, tasks: {tasks}")


@app.command("show")
def show_cmd(
    source: SourceArg,
    entries: Annotated[bool, typer.Option("--entries", help="Also list every entry.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Print a verified bundle's manifest: environment, source runs, tasks and their bucketing.

    Example:
    \b
        tunectl bundle show bundles/quickstart/1 --entries
    """
    with library_errors():
        bundle = api.read_bundle(source)
        rows = {task: list(bundle.entries(task)) for task in bundle.tasks} if entries else {}
    if as_json:
        listing = {"entries": {t: [e.to_json() for e in listed] for t, listed in rows.items()}}
        typer.echo(canonical_json({**bundle.manifest, **(listing if entries else {})}, indent=2))
        return
    m = bundle.manifest
    typer.echo(
        f"{bundle.name}/{bundle.version}  created {m.get('created_at')}  tunectl {m.get('tunectl_version')}"
    )
    typer.echo(f"location: {bundle.location}" + (f"  (channel {bundle.channel})" if bundle.channel else ""))
    typer.echo(f"environment: {canonical_json(m['environment'])}")
    typer.echo(f"source runs: {', '.join(m.get('source_runs', [])) or '-'}")
    for task in bundle.tasks:
        info = bundle.task_info(task)
        dims = ", ".join(f"{p} {d['policy']} {d['points']}" for p, d in info["shape_params"].items())
        typer.echo(
            f"task {task}: {m['tasks'][task].get('num_entries')} entries; static "
            f"{', '.join(info['static_params'])}; shapes {dims}"
        )
    for task, listed in rows.items():
        Console().print(_entries_table(task, listed))


def _entries_table(task: str, listed: list[Entry]) -> Table:
    table = Table(title=task, title_justify="left")
    for col in ("static", "shape", "config", "median µs", "speedup", "why"):
        table.add_column(col, justify="right" if col in ("median µs", "speedup") else "left")
    for e in listed:
        speedup = f"{e.speedup:.2f}x" if e.speedup else "-"
        cells = (_kv(e.static), _kv(e.shape), _kv(e.config), _us(e.median_us), speedup)
        table.add_row(*cells, e.reason or "-")
    return table


def _kv(key: Key | None) -> str:
    """A key as ``name=value`` words, values as JSON spells them (a window as [-1, -1])."""
    return "-" if key is None else " ".join(f"{k}={v}" for k, v in key_json(key).items())


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


@app.command("diff")
def diff_cmd(
    old: Annotated[str, typer.Argument(help="The bundle to compare from (a SOURCE).")],
    new: Annotated[str, typer.Argument(help="The bundle to compare to (a SOURCE).")],
    show_all: Annotated[
        bool, typer.Option("--all", help="Also list points whose config is the same.")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Per task and point: configs added, removed or changed between OLD and NEW, and the median change.

    Example:
    \b
        tunectl bundle diff bundles/quickstart/1 bundles/quickstart/2
    """
    with library_errors():
        diff = api.diff_bundles(api.read_bundle(old), api.read_bundle(new))
    shown = [c for c in diff.changes if show_all or c.kind != "same"]
    if as_json:
        doc = {
            "old": diff.old,
            "new": diff.new,
            "notes": list(diff.notes),
            "changes": [_change_json(c) for c in shown],
        }
        typer.echo(canonical_json(doc, indent=2))
        return
    for note in diff.notes:
        typer.echo(note)
    counts = ", ".join(f"{diff.count(k)} {k}" for k in ("added", "removed", "changed", "same"))
    typer.echo(f"{diff.old} -> {diff.new}: {counts}")
    if shown:
        Console(width=200).print(_changes_table(shown))


def _change_json(change: EntryChange) -> dict[str, Any]:
    """One change as ``bundle diff --json`` prints it: keys as JSON objects."""
    keys = ("static", "shape", "old_config", "new_config")
    as_json = {k: None if (v := getattr(change, k)) is None else key_json(v) for k in keys}
    return {**change.__dict__, **as_json, "median_change": change.median_change}


def _changes_table(shown: list[EntryChange]) -> Table:
    table = Table(title_justify="left")
    for col in ("task", "static", "shape", "", "old config", "new config", "old µs", "new µs", "median"):
        table.add_column(col, justify="right" if col in ("old µs", "new µs", "median") else "left")
    for c in shown:
        change = "-" if c.median_change is None else f"{c.median_change:+.1%}"
        table.add_row(
            c.task,
            _kv(c.static),
            _kv(c.shape),
            c.kind,
            _kv(c.old_config),
            _kv(c.new_config),
            _us(c.old_median_us),
            _us(c.new_median_us),
            change,
        )
    return table


@app.command("promote")
def promote_cmd(
    name: Annotated[str, typer.Argument(help="Bundle name.")],
    version: Annotated[str, typer.Argument(help="The version the channel will point at.")],
    channel: Annotated[str, typer.Option(help="Channel to move (stable, canary, ...).")] = "stable",
    store: StoreOption = DEFAULT_STORE,
) -> None:
    """Point CHANNEL of NAME at VERSION (verified first); the pointer is replaced atomically.

    Example:
    \b
        tunectl bundle promote quickstart 2 --channel stable --store bundles
    """
    with library_errors():
        pointer = api.promote(store, name, version, channel)
    was = f" (was {pointer.previous})" if pointer.previous else ""
    typer.echo(f"{name}@{channel} -> {version}{was} in {store}")


@app.command("pack")
def pack_cmd(
    source: SourceArg,
    out: Annotated[str, typer.Argument(help="The archive to write (.tar.gz, .tgz or .tar).")],
    force: Annotated[bool, typer.Option("--force", help="Replace OUT if it exists.")] = False,
) -> None:
    """Write a verified bundle as one archive, which load_bundle and TUNECTL_BUNDLE accept as is.

    Example:
    \b
        tunectl bundle pack bundles/quickstart/1 quickstart-1.tar.gz
    """
    with library_errors():
        path = api.pack(source, out, overwrite=force)
    typer.echo(f"packed {source} into {path}")


app.command("confirm")(confirm_cmd)
