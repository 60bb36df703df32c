"""Building and publishing bundles. Standard library only.

A bundle is ``<store>/<name>/<version>/`` holding ``tables/<task>.json`` and ``manifest.json``, which
lists the sha256 of every other file. Publishing writes everything into a hidden staging directory
beside the target, tables first and the manifest last, then renames the directory into place: a
reader sees the whole version or none of it. An existing version is never touched.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunectl import __version__
from tunectl.errors import BundleExistsError, UserError
from tunectl.runtime import MANIFEST, SCHEMA_VERSION

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@dataclass(frozen=True)
class TaskTable:
    """One task's winners, with what lookup needs to key and bucket them."""

    task: str
    static_params: tuple[str, ...]
    shape_params: Mapping[str, Mapping[str, Any]]  # name -> {"policy": ..., "points": [...]}
    entries: tuple[Mapping[str, Any], ...]  # {"static", "shape", "config", and statistics}


def check_name(kind: str, value: str) -> str:
    if not _NAME.match(value) or value in (".", ".."):
        raise UserError(f"bundle {kind} {value!r} must be letters, digits, '.', '_' or '-' (not starting with one)")
    return value


def _dump(obj: Any) -> bytes:
    return (json.dumps(obj, indent=1, sort_keys=True, allow_nan=False) + "\n").encode()


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
        rel = f"tables/{check_name('task', table.task)}.json"
        files[rel] = _dump({"schema_version": SCHEMA_VERSION, "task": table.task, "entries": list(table.entries)})
        tasks[table.task] = {
            "table": rel,
            "static_params": list(table.static_params),
            "shape_params": {k: dict(v) for k, v in sorted(table.shape_params.items())},
            "num_entries": len(table.entries),
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
    files[MANIFEST] = _dump(manifest)
    return files


def publish_local(store: str | Path, name: str, version: str, files: Mapping[str, bytes]) -> Path:
    """Publish ``files`` as ``store/name/version``; BundleExistsError if that version exists."""
    target = Path(store) / check_name("name", name) / check_name("version", version)
    if target.exists():
        raise BundleExistsError(f"bundle {name}/{version} already exists at {target}; versions are immutable, "
                                "publish a new version")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".{version}.{secrets.token_hex(4)}.staging"
    try:
        for rel in sorted(files, key=lambda r: r == MANIFEST):  # the manifest last
            path = staging.joinpath(*rel.split("/"))
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "wb") as f:
                f.write(files[rel])
                f.flush()
                os.fsync(f.fileno())
        try:
            os.rename(staging, target)  # fails on a non-empty target: a concurrent publish lost the race
        except OSError:
            raise BundleExistsError(f"bundle {name}/{version} already exists at {target}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
