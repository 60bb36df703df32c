"""Export results in the formats serving reads: tunectl bundles, and layouts other engines read."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from tunectl.cli._common import DEFAULT_RESULTS, ResultsOption, library_errors

app = typer.Typer(help="Export results in the formats serving reads.", no_args_is_help=True)

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
) -> None:
    """Pick the winners from RESULTS and publish them as an immutable, checksummed bundle."""
    from tunectl.export import export_bundle

    with library_errors():
        res = export_bundle(results, name, version, out, run_ids=run, task=task, device=device)
    typer.echo(
        f"published {name}/{version} at {res.location}: {len(res.winners)} entries "
        f"from {len(res.source_runs)} run(s)"
    )


def _bundle(source: str) -> Any:
    from tunectl.runtime import load_bundle, uri_scheme
    from tunectl.stores import fetch

    return load_bundle(
        source, env_policy="off", fetcher=fetch if uri_scheme(source) not in (None, "file") else None
    )


def _report(what: str, res: Any) -> None:
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
    """Write a bundle's FlexAttention winners as kernel_options JSON (fwd_* keys), one file per point."""
    from tunectl.formats import export_flex_options

    with library_errors():
        res = export_flex_options(_bundle(source), out, task)
    _report("kernel_options", res)


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
    """Write a bundle's flash_attn_with_kvcache decode winners in LightLLM's autotune layout."""
    from tunectl.formats import export_lightllm

    with library_errors():
        res = export_lightllm(
            _bundle(source), out, task, kernel_name, backend or ("sgl",), triton_version, sgl_version
        )
    _report("run keys", res)
