"""Building, publishing and promoting bundles. Standard library only.

A store holds ``<name>/<version>/`` directories and ``<name>/_channels/<channel>.json`` pointers::

    <store>/<name>/<version>/manifest.json        schema version, environment, tasks, sha256 of every file
    <store>/<name>/<version>/tables/<task>.json   static keys, configs, and one row per entry (lookup)
    <store>/<name>/<version>/stats/<task>.json    per-entry statistics, by column (parsed on first use)
    <store>/<name>/_channels/<channel>.json       {"version", "manifest_sha256", "previous", ...}

Publishing writes every table first and the manifest last; a version without a manifest does not
exist. Versions are immutable: publishing an existing one fails and changes nothing. A channel is
replaced atomically (a local temp file, fsync, ``os.replace``; on object storage, one PUT of a small
object), and names the sha256 of the manifest it promoted, so a version replaced behind its back is
refused at load. ``BundleStore`` is the seam: ``LocalStore`` here, pyarrow.fs stores in
``tunectl.store.stores``.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import logging
import os
import secrets
import shutil
import tarfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tunectl import __version__
from tunectl.core.errors import BundleError, BundleExistsError, UserError
from tunectl.core.files import atomic_write, json_bytes, name_problem, sync_dir, write_synced
from tunectl.runtime import load_bundle
from tunectl.runtime.entries import Entry, LayoutError, stat_columns, table_layout
from tunectl.runtime.format import (
    ARCHIVE_SUFFIXES,
    CHANNELS,
    MANIFEST,
    SCHEMA_VERSION,
    BundleCorruptError,
    safe_member,
)
from tunectl.runtime.sources import Fetcher, Source, read_local, read_verified, resolve

log = logging.getLogger("tunectl.store.bundle")


@dataclass(frozen=True)
class TaskTable:
    """One task's winners, with what lookup needs to key and bucket them."""

    task: str
    static_params: tuple[str, ...]
    shape_params: Mapping[str, Mapping[str, Any]]  # name -> {"policy": ..., "points": [...]}
    entries: tuple[Entry, ...]
    #: how the entries were measured ({"l2", "mode", "timing"}): confirming at start-up times the same way
    measured: Mapping[str, str] = field(default_factory=dict)


def check_name(kind: str, value: str) -> str:
    """``value`` if it may be a bundle's ``kind`` (name or version; ``NAME_RULE``), else a ``UserError``."""
    problem = name_problem(value)
    if problem:
        raise UserError(f"bundle {kind} {value!r} {problem}")
    return value


def _columns(table: TaskTable) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """The table (static keys, configs, rules, flat rows) and its statistics by column, for one task."""
    shape_params = sorted(table.shape_params)
    _check_entries(table)
    try:
        layout = table_layout(table.entries, table.static_params, shape_params)
    except LayoutError as exc:
        raise UserError(f"task {table.task}: {exc}") from None
    doc = {
        "schema_version": SCHEMA_VERSION,
        "task": table.task,
        "static_params": list(table.static_params),
        "shape_params": shape_params,
        **layout,
    }
    return doc, stat_columns(table.entries)


def _check_entries(table: TaskTable) -> None:
    """``UserError`` for an entry at a shape the table does not declare, or with a rule that names
    something other than two of its shape dimensions."""
    points = {p: set(dim["points"]) for p, dim in table.shape_params.items()}
    for i, entry in enumerate(table.entries):
        for p, value in entry.shape:
            if p in points and value not in points[p]:
                raise UserError(f"task {table.task}: entry {i} has {p}={value!r}, not a declared point")
        rule = entry.rule
        if rule is not None and {rule.across, rule.along} - set(points):
            raise UserError(f"a rule names {rule.across!r} and {rule.along!r}, not both shape dimensions")


def build_files(
    name: str,
    version: str,
    tables: Sequence[TaskTable],
    source_runs: Sequence[str],
    environment: Mapping[str, Any],
) -> dict[str, bytes]:
    """The bundle's files by relative path, the manifest last."""
    check_name("name", name)
    check_name("version", version)
    files: dict[str, bytes] = {}
    tasks: dict[str, Any] = {}
    for table in sorted(tables, key=lambda t: t.task):
        check_name("task", table.task)
        doc, stats = _columns(table)
        table_at, stats_at = f"tables/{table.task}.json", f"stats/{table.task}.json"
        files[table_at] = json_bytes(doc)
        files[stats_at] = json_bytes({"schema_version": SCHEMA_VERSION, "task": table.task, "columns": stats})
        tasks[table.task] = {
            "table": table_at,
            "stats": stats_at,
            "static_params": list(table.static_params),
            "shape_params": {k: dict(v) for k, v in sorted(table.shape_params.items())},
            "num_entries": len(table.entries),
            **({"measured": dict(table.measured)} if table.measured else {}),
        }
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "name": name,
        "version": version,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "tunectl_version": __version__,
        "source_runs": sorted(source_runs),
        "environment": dict(environment),
        "tasks": tasks,
        "files": {rel: hashlib.sha256(data).hexdigest() for rel, data in files.items()},
    }
    files[MANIFEST] = json_bytes(manifest, indent=1)
    return files


class BundleStore(Protocol):
    """Where bundles live. Member paths are POSIX and relative to the store's root."""

    url: str
    #: how the runtime reads this store's URIs (None: local paths, read by the runtime itself)
    fetcher: Fetcher | None

    def location(self, *parts: str) -> str:
        """The path or URI of a member, as ``load_bundle`` takes it."""

    def read(self, rel: str) -> bytes:
        """A member's bytes; FileNotFoundError if it does not exist."""

    def list_dir(self, rel: str) -> list[str]:
        """Names directly under ``rel`` ("" is the root), sorted; empty if there is nothing."""

    def publish_version(self, name: str, version: str, files: Mapping[str, bytes]) -> str:
        """Write a new version, the manifest last; BundleExistsError if it exists. Returns its location."""

    def replace(self, rel: str, data: bytes) -> None:
        """Replace a small member atomically: readers see the old bytes or the new, never a mix."""


class LocalStore:
    """A store in a local directory (or a mounted volume)."""

    fetcher: Fetcher | None = None

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.url = str(self.root)

    def location(self, *parts: str) -> str:
        return str(self.root.joinpath(*parts))

    def read(self, rel: str) -> bytes:
        return read_local(safe_member(self.root, rel))

    def list_dir(self, rel: str) -> list[str]:
        path = safe_member(self.root, rel) if rel else self.root
        return sorted(p.name for p in path.iterdir()) if path.is_dir() else []

    def publish_version(self, name: str, version: str, files: Mapping[str, bytes]) -> str:
        return str(publish_local(self.root, name, version, files))

    def replace(self, rel: str, data: bytes) -> None:
        atomic_write(safe_member(self.root, rel), data, make_parents=True)


def publish_local(store: str | Path, name: str, version: str, files: Mapping[str, bytes]) -> Path:
    """Publish ``files`` as ``store/name/version``; BundleExistsError if that version exists."""
    target = Path(store) / check_name("name", name) / check_name("version", version)
    if target.exists():
        raise BundleExistsError(name, version, str(target))
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".{version}.{secrets.token_hex(4)}.staging"
    try:
        for rel in sorted(files, key=lambda r: r == MANIFEST):  # the manifest last
            path = safe_member(staging, rel)
            path.parent.mkdir(parents=True, exist_ok=True)
            write_synced(path, files[rel])  # the directory is renamed into place whole, below
        try:
            # a directory, renamed whole; fails on a non-empty target: a concurrent publish lost the race
            os.rename(staging, target)  # noqa: TID251
        except OSError:
            raise BundleExistsError(name, version, str(target)) from None
        sync_dir(target.parent)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def publish(store: BundleStore, name: str, version: str, files: Mapping[str, bytes]) -> str:
    """Publish a built bundle to any store; returns its location."""
    return store.publish_version(check_name("name", name), check_name("version", version), files)


@dataclass(frozen=True)
class ChannelPointer:
    name: str
    channel: str
    version: str
    manifest_sha256: str
    previous: str | None
    promoted_at: str


def channel_member(name: str, channel: str) -> str:
    return f"{check_name('name', name)}/{CHANNELS}/{check_name('channel', channel)}.json"


def read_channel(store: BundleStore, name: str, channel: str) -> ChannelPointer | None:
    """What ``channel`` of ``name`` points at, or None if it was never promoted."""
    try:
        raw = json.loads(store.read(channel_member(name, channel)))
        return ChannelPointer(**{k: raw.get(k) for k in ChannelPointer.__dataclass_fields__})
    except FileNotFoundError:
        return None
    except (ValueError, TypeError) as exc:
        raise BundleCorruptError(store.url, f"unreadable: {exc}", channel_member(name, channel)) from None


def promote(store: BundleStore, name: str, version: str, channel: str) -> ChannelPointer:
    """Point ``channel`` of ``name`` at ``version``, after verifying that version in full."""
    member = channel_member(name, channel)
    bundle = load_bundle(
        store.location(name, check_name("version", version)), env_policy="off", fetcher=store.fetcher
    )
    bundle.check_statistics()
    before = read_channel(store, name, channel)
    previous = None if before is None else before.previous if before.version == version else before.version
    pointer = ChannelPointer(
        name=name,
        channel=channel,
        version=version,
        manifest_sha256=bundle.manifest_sha256,  # the bytes just verified, not a second read
        previous=previous,
        promoted_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    store.replace(member, json_bytes(pointer.__dict__, indent=1))
    return pointer


@dataclass(frozen=True)
class VersionListing:
    name: str
    version: str
    created_at: str
    num_entries: int
    device_name: str
    tasks: tuple[str, ...]


def list_bundles(store: BundleStore) -> tuple[list[VersionListing], list[ChannelPointer]]:
    """Every published version (one with a readable manifest) and every channel in ``store``."""
    versions, channels = [], []
    for name in store.list_dir(""):
        if name_problem(name):
            continue
        for version in store.list_dir(name):
            if name_problem(version):
                continue  # staging directories, channels
            try:
                manifest = json.loads(store.read(f"{name}/{version}/{MANIFEST}"))
                tasks = manifest.get("tasks", {})
                versions.append(
                    VersionListing(
                        name,
                        version,
                        str(manifest.get("created_at", "")),
                        sum(int(t.get("num_entries", 0)) for t in tasks.values()),
                        str(manifest.get("environment", {}).get("device_name", "")),
                        tuple(sorted(tasks)),
                    )
                )
            except (FileNotFoundError, ValueError, AttributeError, TypeError):
                continue  # no manifest (an unfinished publish) or not a bundle: not a version
        for file in store.list_dir(f"{name}/{CHANNELS}"):
            pointer = _channel_or_none(store, name, file)
            if pointer is not None:
                channels.append(pointer)
    return versions, channels


def _channel_or_none(store: BundleStore, name: str, file: str) -> ChannelPointer | None:
    """The pointer in a channel file; None (with a warning) for one that cannot be read."""
    if not file.endswith(".json"):
        return None
    try:
        return read_channel(store, name, file.removesuffix(".json"))
    except BundleError as exc:  # one bad pointer must not hide the rest of the store
        log.warning("skipped %s", exc)
        return None


def pack(
    source: str, out: str | os.PathLike[str], fetcher: Fetcher | None = None, *, overwrite: bool = False
) -> Path:
    """Write the verified bundle at ``source`` as one ``.tar.gz`` (deterministic, written atomically).

    An existing ``out`` is a ``UserError`` unless ``overwrite``.
    """
    out = Path(out)
    if not out.name.endswith(ARCHIVE_SUFFIXES):
        raise UserError(f"{out}: an archive's name ends with {' or '.join(ARCHIVE_SUFFIXES)}")
    if out.exists() and not overwrite:
        raise UserError(f"{out} already exists; choose another name, or pass --force to replace it")
    where, _ = resolve(source, None, None, None, fetcher)
    _, raw, files = read_verified(Source(where, fetcher))
    out.parent.mkdir(parents=True, exist_ok=True)

    def write(f: Any) -> None:
        compress = out.name.endswith(("gz", "tgz"))
        # gzip records a file name and a time in its header: blank both, so equal bundles pack equal
        stream: Any = gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0) if compress else f
        with tarfile.open(fileobj=stream, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for rel, data in sorted({**files, MANIFEST: raw}.items(), key=lambda kv: kv[0] == MANIFEST):
                info = tarfile.TarInfo(rel)
                info.size, info.mode, info.mtime = len(data), 0o644, 0
                tar.addfile(info, io.BytesIO(data))
        if compress:
            stream.close()

    atomic_write(out, write)
    return out
