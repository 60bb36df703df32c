"""Export results in the formats serving reads: tunectl bundles, and layouts other engines read."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from tunectl import api
from tunectl.cli._common import DEFAULT_RESULTS, ResultsOption, library_errors
from tunectl.cli.validate import AddressOption, LayersOption, RoundsOption

app = typer.Typer(
    help=(
        "Export results in the formats serving reads.\n\n"
        "Example:\n\b\n"
        "    tunectl export bundle --name quickstart --version 1 --out bundles\n"
        "    tunectl export lightllm bundles/quickstart/1 --out lightllm/autotune_kernel_configs"
    ),
    no_args_is_help=True,
)

SourceArg = Annotated[str, typer.Argument(help="A bundle: directory, archive, URI, or STORE/NAME@CHANNEL.")]
OutDir = Annotated[Path, typer.Option("--out", help="Directory to write into (created if missing).")]


@app.command("bundle")
def export_bundle_cmd(
    name: Annotated[str, typer.Option(help="Bundle name.")],
    version: Annotated[str, typer.Option(help="Bundle version (immutable once published).")],
    out: Annotated[
        str, typer.Option(help="Bundle store: a directory, or a URI such as s3://bucket/bundles.")
    ] = "bundles",
    results: ResultsOption = DEFAULT_RESULTS,
    run: Annotated[list[str] | None, typer.Option(help="Only these runs (repeatable). Default: all.")] = None,
    task: Annotated[str | None, typer.Option(help="Only this task.")] = None,
    device: Annotated[str | None, typer.Option(help="Only rows measured on this device name.")] = None,
    validate: Annotated[
        bool,
        typer.Option(
            "--validate",
            help="Before publishing, run the bundle against the defaults as layer stacks (see "
            "`tunectl validate`); refuse to publish if it is slower beyond noise at any point.",
        ),
    ] = False,
    spec: Annotated[
        list[Path] | None, typer.Option(help="With --validate: specs to validate on. Default: the runs' own.")
    ] = None,
    layers: LayersOption = api.DEFAULT_LAYERS,
    rounds: RoundsOption = api.DEFAULT_ROUNDS,
    address: AddressOption = None,
    margin: Annotated[
        float | None,
        typer.Option(
            help="A config other than the default wins only if its whole speedup interval clears 1 + "
            "MARGIN. Default: the runs' [select] margin (0.02 unless the spec says otherwise)."
        ),
    ] = None,
    fill: Annotated[
        bool,
        typer.Option(
            help="Serve each bucket cell that has no result of its own (not run, or refined elsewhere) "
            "from a tuned point beside it; --no-fill leaves it answering None."
        ),
    ] = True,
    strict: Annotated[
        bool,
        typer.Option(
            "--strict", help="Publish nothing (exit 2) if any region inside the ranges answers None."
        ),
    ] = False,
    skip_damaged: Annotated[
        bool,
        typer.Option(
            "--skip-damaged",
            help="Publish even though some results files of the runs cannot be read (`tunectl doctor` "
            "lists them): without their rows, each entry whose point lost rows saying so in its reason.",
        ),
    ] = False,
    rules: Annotated[
        bool,
        typer.Option(
            help="Serve a cell a split rule (a count computed from the shape by a wave model fitted to "
            "the runs' rows) where its probes measured the rule better than its config; --no-rules "
            "publishes configs only."
        ),
    ] = True,
    candidates: Annotated[
        int,
        typer.Option(
            "--candidates",
            min=0,
            help="Give each entry up to K ranked configs measured around its cell, for a serving "
            "process to confirm at its own shapes at start-up (tunectl.runtime: Bundle.candidates); "
            "0 writes none.",
            metavar="K",
        ),
    ] = api.DEFAULT_CANDIDATES,
) -> None:
    """Pick the winners from RESULTS and publish them as an immutable, checksummed bundle. Every region
    inside the declared ranges that lookup would answer None in is listed, one line each. Exits 1,
    publishing nothing, when a results file of the runs cannot be read, unless --skip-damaged.

    Example:
    \b
        tunectl export bundle --name quickstart --version 1 --out bundles
        tunectl export bundle --name quickstart --version 2 --validate
        tunectl export bundle --name decode --version 3 --margin 0.02 --strict
        tunectl export bundle --name decode --version 4 --skip-damaged
        tunectl export bundle --name decode --version 5 --no-rules
    """
    with library_errors():
        choices = api.Choices(margin, fill, strict, skip_damaged, rules, candidates)
        scope = api.Scope(run, task, device)
        validation = api.ValidateOptions(layers, rounds, cluster=api.Cluster(address, cancel_on_sigterm=True))
        on = tuple(api.load_spec(path) for path in spec or ()) if validate else None
        options = api.ExportOptions(scope, choices, on, validation)
    if validate:
        _export_validated(name, version, out, results, options)
        return
    with library_errors():
        res = api.export_bundle(results, name, version, out, options).result
    filled = sum(w.served_by is not None for w in res.winners)
    regional = sum(w.basis == "region" for w in res.winners)
    ruled = sum(w.rule is not None for w in res.winners)
    typer.echo(
        f"published {name}/{version} at {res.location}: {len(res.winners)} entries "
        f"from {len(res.source_runs)} run(s)"
        + (f", {filled} served by a tuned point beside them" if filled else "")
        + (f", {regional} chosen over their regions by probes" if regional else "")
        + (f", {ruled} served a split rule" if ruled else "")
    )
    for line in res.notes():
        typer.echo(line)


def _export_validated(name: str, version: str, out: str, results: Path, options: api.ExportOptions) -> None:
    from rich.console import Console

    from tunectl.cli.progress import RunBar, run_events
    from tunectl.cli.validate import print_validation

    console = Console()
    bar = RunBar(console)
    try:
        with library_errors(lambda run_id: "run the command again"), run_events(console):
            done = api.export_bundle(results, name, version, out, options, bar)
    finally:
        bar.stop()
    print_validation(console, done.validations, results)
    res = done.result
    typer.echo(
        f"validated and published {name}/{version} at {res.location}: {len(res.winners)} entries "
        f"from {len(res.source_runs)} run(s)"
    )
    for line in res.notes():
        typer.echo(line)


def report_files(what: str, res: Any) -> None:
    typer.echo(f"wrote {res.num_entries} {what} in {len(res.files)} file(s) under {res.out}")
    for reason, count in sorted(res.skipped.items()):
        typer.echo(f"left out {count} point(s): {reason}")


@app.command("flex-options")
def export_flex_cmd(
    source: SourceArg,
    out: OutDir,
    task: Annotated[
        list[str] | None, typer.Option(help="Only these tasks. Default: flex_prefill, flash_decode.")
    ] = None,
) -> None:
    """Write a bundle's FlexAttention winners as kernel_options JSON (fwd_* keys), one file per point.

    Example:
    \b
        tunectl export flex-options bundles/h200-attention/2 --out flex-options
    """
    with library_errors():
        res = api.export_flex_options(api.read_bundle(source), out, task)
    report_files("kernel_options", res)


@app.command("lightllm")
def export_lightllm_cmd(
    source: SourceArg,
    out: Annotated[Path, typer.Option("--out", help="LightLLM's autotune_kernel_configs directory.")],
    task: Annotated[str, typer.Option(help="The decode task to export.")] = "flash_decode",
    kernel_name: Annotated[str, typer.Option(help="LightLLM's kernel name.")] = "sgl_fa3_kvcache_ns:v1",
    backend: Annotated[
        list[str] | None, typer.Option(help="Backends that kernel runs (default: sgl).")
    ] = None,
    triton_version: Annotated[str | None, typer.Option(help="Default: the bundle's triton version.")] = None,
    sgl_version: Annotated[str | None, typer.Option(help="Default: the bundle's sgl-kernel version.")] = None,
) -> None:
    """Write a bundle's flash_attn_with_kvcache decode winners in LightLLM's autotune layout.

    Example:
    \b
        tunectl export lightllm bundles/h200-attention/2 --out lightllm/autotune_kernel_configs
    """
    with library_errors():
        bundle = api.read_bundle(source)
        res = api.export_lightllm(
            bundle,
            out,
            task,
            kernel_name=kernel_name,
            backends=backend or ("sgl",),
            triton_version=triton_version,
            sgl_version=sgl_version,
        )
    report_files("run keys", res)
