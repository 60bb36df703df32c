"""Bundles: publish one from results (validated first if asked), read, verify, list, compare,
promote and pack them, and write their winners in the layouts other engines read."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tunectl.api.checks import ValidationRun, export_validated
from tunectl.api.options import ExportOptions
from tunectl.formats.engines import FormatExport
from tunectl.formats.export import ExportResult
from tunectl.runtime import Bundle
from tunectl.store.bundle import ChannelPointer, VersionListing
from tunectl.store.bundle_diff import BundleDiff

if TYPE_CHECKING:
    from tunectl.orchestrator.submit import Progress


@dataclass(frozen=True)
class Exported:
    result: ExportResult
    validations: list[ValidationRun] = field(default_factory=list)  # empty unless validated


def export_bundle(
    results: str | Path,
    name: str,
    version: str,
    store: str,
    options: ExportOptions | None = None,
    progress: Progress | None = None,
) -> Exported:
    """Choose the winners of ``results`` and publish them as the immutable bundle ``name/version`` in
    ``store`` (a directory or a URI such as ``s3://bucket/bundles``). With ``options.validate_on``,
    the bundle is validated against the defaults first and published only if it never loses."""
    from tunectl.formats.export import export_bundle as publish_winners

    options = options or ExportOptions()
    if options.validate_on is not None:
        return Exported(*export_validated(results, name, version, store, options, progress))
    return Exported(publish_winners(results, name, version, store, options.scope, options.choices))


def read_bundle(source: str | os.PathLike[str], *, env_policy: str = "off") -> Bundle:
    """The verified bundle at ``source``: a directory, an archive, a URI, or STORE/NAME@CHANNEL.
    ``env_policy``: also check this machine against the bundle's environment (off, warn, strict)."""
    from tunectl.store.stores import read_bundle as read

    return read(source, env_policy=env_policy)


def verify_bundle(source: str, *, env_policy: str = "off") -> Bundle:
    """``read_bundle``, then every table's statistics checked too."""
    bundle = read_bundle(source, env_policy=env_policy)
    bundle.check_statistics()
    return bundle


def list_bundles(store: str) -> tuple[list[VersionListing], list[ChannelPointer]]:
    """Every published version in ``store``, and every channel there."""
    from tunectl.store.bundle import list_bundles as listed
    from tunectl.store.stores import open_store

    return listed(open_store(store))


def diff_bundles(old: Bundle, new: Bundle) -> BundleDiff:
    """Per task and point: entries added, removed, given another config, or kept (both medians)."""
    from tunectl.store.bundle_diff import diff_bundles as diff

    return diff(old, new)


def promote(store: str, name: str, version: str, channel: str = "stable") -> ChannelPointer:
    """Point ``channel`` of ``name`` at ``version`` (verified first); the pointer replaced atomically."""
    from tunectl.store.bundle import promote as point
    from tunectl.store.stores import open_store

    return point(open_store(store), name, version, channel)


def pack(source: str, out: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
    """Write the verified bundle at ``source`` as one archive, which ``load_bundle`` takes as is."""
    from tunectl.store.bundle import pack as archive
    from tunectl.store.stores import fetcher_for

    return archive(source, out, fetcher=fetcher_for(source), overwrite=overwrite)


def export_flex_options(bundle: Bundle, out: str | Path, tasks: Sequence[str] | None = None) -> FormatExport:
    """Write ``bundle``'s FlexAttention winners as kernel_options JSON, one file per point."""
    from tunectl.formats.engines import export_flex_options as write

    return write(bundle, out, tasks)


def export_lightllm(
    bundle: Bundle,
    out: str | Path,
    task: str = "flash_decode",
    *,
    kernel_name: str | None = None,
    backends: Iterable[str] = ("sgl",),
    triton_version: str | None = None,
    sgl_version: str | None = None,
) -> FormatExport:
    """Write ``bundle``'s ``task`` winners on ``backends`` in LightLLM's autotune layout under ``out``
    (``kernel_name``: LightLLM's name of the kernel; the versions: default the bundle's)."""
    from tunectl.formats.engines import LIGHTLLM_KERNEL
    from tunectl.formats.engines import export_lightllm as write

    return write(
        bundle,
        out,
        task,
        kernel_name=kernel_name or LIGHTLLM_KERNEL,
        backends=backends,
        triton_version=triton_version,
        sgl_version=sgl_version,
    )
