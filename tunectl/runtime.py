"""What a serving process imports: load a tuned bundle, answer lookups. Standard library only.

    from tunectl.runtime import load_bundle
    bundle = load_bundle("/opt/bundles/decode/7")      # or load_bundle() with TUNECTL_BUNDLE set
    config = bundle.lookup("decode_attention", dtype="float32", num_q_heads=8, num_kv_heads=2,
                           head_dim=64, page_size=16, batch=3, kv_len=1500)

Loading verifies the manifest's schema version and every file's sha256, and checks the bundle's
environment against this process's (``env_policy``: strict raises, warn logs, off skips).
``lookup`` normalises the static parameters, buckets the shape as tuning declared, and returns a
fresh dict of the tuned config, or None on any miss (unknown task, static key or shape, or a
missing parameter; extra parameters are ignored). It does no I/O and takes no lock: the tables are
immutable after load, so any number of threads may call it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from tunectl.buckets import make_bucketer
from tunectl.errors import BundleError
from tunectl.keys import InvalidKeyError, normaliser_for

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
ENV_VAR = "TUNECTL_BUNDLE"
ENV_POLICIES = ("strict", "warn", "off")

log = logging.getLogger("tunectl.runtime")


class BundleCorruptError(BundleError):
    """A file does not match its checksum, or the manifest is unreadable or malformed."""


class BundleSchemaError(BundleError):
    """The bundle was written in a schema this runtime does not read."""


class BundleEnvironmentError(BundleError):
    """The bundle was tuned for another environment (device or library versions)."""


def _from_json(value: Any) -> Any:
    return tuple(_from_json(v) for v in value) if isinstance(value, list) else value


def safe_member(root: Path, name: str) -> Path:
    """``root / name`` for a relative POSIX path that stays inside ``root``; BundleCorruptError otherwise."""
    rel = PurePosixPath(name)
    if not name or rel.is_absolute() or ".." in rel.parts or "\\" in name or rel.parts[0] == "":
        raise BundleCorruptError(f"bundle member {name!r} escapes the bundle directory")
    return root.joinpath(*rel.parts)


class _TaskIndex:
    """Lookup structures for one task, built once at load."""

    def __init__(self, name: str, spec: Mapping[str, Any], entries: list[Mapping[str, Any]]) -> None:
        self.name = name
        self.static_params = tuple(spec["static_params"])
        shapes = spec["shape_params"]
        self.shape_params = tuple(sorted(shapes))
        self._normalisers: list[tuple[str, Callable[[object], Any] | None]] = [
            (p, normaliser_for(p)) for p in self.static_params
        ]
        self._bucketers = [
            (p, make_bucketer(shapes[p]["policy"], shapes[p]["points"])) for p in self.shape_params
        ]
        self.table: dict[tuple[Any, ...], Mapping[str, Any]] = {}
        for entry in entries:
            static, shape = entry["static"], entry["shape"]
            key = tuple(_from_json(static[p]) for p in self.static_params) + tuple(
                shape[p] for p in self.shape_params
            )
            self.table[key] = entry

    def entry(self, params: Mapping[str, Any]) -> Mapping[str, Any] | None:
        try:
            key: list[Any] = []
            for name, normalise in self._normalisers:
                value = params[name]
                if normalise is not None:
                    value = normalise(value)
                elif type(value) is list:
                    value = tuple(value)
                key.append(value)
            for name, bucket in self._bucketers:
                point = bucket(params[name])
                if point is None:
                    return None
                key.append(point)
            return self.table.get(tuple(key))
        except (KeyError, TypeError, InvalidKeyError):
            return None


class Bundle:
    """A loaded, verified bundle. Immutable; lookups are thread-safe."""

    def __init__(self, path: Path, manifest: Mapping[str, Any], tasks: dict[str, _TaskIndex]) -> None:
        self.path = path
        self.manifest = manifest
        self.name: str = manifest["name"]
        self.version: str = str(manifest["version"])
        self._tasks = tasks

    @property
    def tasks(self) -> tuple[str, ...]:
        return tuple(sorted(self._tasks))

    def lookup(self, task: str, /, **params: Any) -> dict[str, Any] | None:
        """The tuned config for ``task`` at ``params``, or None on a miss."""
        index = self._tasks.get(task)
        if index is None:
            return None
        entry = index.entry(params)
        return None if entry is None else dict(entry["config"])

    def entry(self, task: str, /, **params: Any) -> dict[str, Any] | None:
        """The whole table entry (config plus its statistics and source run), or None on a miss."""
        index = self._tasks.get(task)
        entry = index.entry(params) if index is not None else None
        return None if entry is None else json.loads(json.dumps(entry))

    def __len__(self) -> int:
        return sum(len(t.table) for t in self._tasks.values())

    def __repr__(self) -> str:
        return f"Bundle({self.name!r}, version={self.version!r}, tasks={list(self.tasks)}, entries={len(self)})"


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_bytes())
    except FileNotFoundError:
        raise BundleCorruptError(f"{what} {path} is missing") from None
    except (ValueError, OSError) as exc:
        raise BundleCorruptError(f"{what} {path} is unreadable: {exc}") from None


def read_manifest(path: Path) -> dict[str, Any]:
    manifest = _read_json(path / MANIFEST, "manifest")
    if not isinstance(manifest, dict):
        raise BundleCorruptError(f"manifest {path / MANIFEST} is not a JSON object")
    version = manifest.get("schema_version")
    if version != SCHEMA_VERSION:
        raise BundleSchemaError(
            f"bundle {path} has schema version {version!r}; this tunectl reads version {SCHEMA_VERSION}"
        )
    for fld in ("name", "version", "tasks", "files", "environment"):
        if fld not in manifest:
            raise BundleCorruptError(f"manifest {path / MANIFEST} lacks {fld!r}")
    return manifest


def verify_files(path: Path, manifest: Mapping[str, Any]) -> None:
    """Check every file the manifest lists against its sha256."""
    for name, digest in sorted(manifest["files"].items()):
        member = safe_member(path, name)
        try:
            actual = hashlib.sha256(member.read_bytes()).hexdigest()
        except OSError as exc:
            raise BundleCorruptError(f"bundle file {member} cannot be read: {exc}") from None
        if actual != digest:
            raise BundleCorruptError(f"bundle file {member} does not match its checksum: it was changed")


def current_environment() -> dict[str, Any]:
    """This process's device name, read without third-party imports (NVIDIA's procfs, or an override)."""
    env: dict[str, Any] = {}
    override = os.environ.get("TUNECTL_DEVICE_NAME")
    if override:
        env["device_name"] = override
        return env
    gpus = sorted(Path("/proc/driver/nvidia/gpus").glob("*/information"))
    for info in gpus[:1]:
        for line in info.read_text(errors="replace").splitlines():
            if line.startswith("Model:"):
                env["device_name"] = line.split(":", 1)[1].strip()
    return env


def check_environment(
    manifest: Mapping[str, Any], policy: str, current: Mapping[str, Any] | None = None
) -> list[str]:
    """Differences between the bundle's environment and ``current``; raise or log per ``policy``."""
    if policy not in ENV_POLICIES:
        raise ValueError(f"env_policy must be one of {', '.join(ENV_POLICIES)}, not {policy!r}")
    if policy == "off":
        return []
    current = current_environment() if current is None else current
    wanted = manifest["environment"]
    problems = []
    for fld in ("device_name", "compute_capability"):
        want, have = wanted.get(fld), current.get(fld)
        if want is not None and have is not None and want != have:
            problems.append(f"{fld}: bundle tuned on {want!r}, this process has {have!r}")
    for package, want in sorted((wanted.get("packages") or {}).items()):
        have = (current.get("packages") or {}).get(package)
        if have is not None and have != want:
            problems.append(f"{package}: bundle tuned with {want}, this process has {have}")
    if problems and policy == "strict":
        raise BundleEnvironmentError(f"bundle {manifest['name']}/{manifest['version']}: " + "; ".join(problems))
    for problem in problems:
        log.warning("tunectl bundle %s/%s: %s", manifest["name"], manifest["version"], problem)
    return problems


def load_bundle(
    source: str | os.PathLike[str] | None = None,
    *,
    env_policy: str = "warn",
    environment: Mapping[str, Any] | None = None,
) -> Bundle:
    """Load and verify the bundle at ``source`` (a directory), or at ``$TUNECTL_BUNDLE``."""
    if source is None:
        source = os.environ.get(ENV_VAR)
        if not source:
            raise BundleError(f"no bundle given and ${ENV_VAR} is not set")
    path = Path(source)
    manifest = read_manifest(path)
    verify_files(path, manifest)
    check_environment(manifest, env_policy, environment)
    tasks = {}
    for name, spec in manifest["tasks"].items():
        if spec.get("table") not in manifest["files"]:
            raise BundleCorruptError(f"table for task {name!r} is not covered by the manifest's checksums")
        table = _read_json(safe_member(path, spec["table"]), "table")
        try:
            tasks[name] = _TaskIndex(name, spec, table["entries"])
        except (KeyError, TypeError, ValueError) as exc:
            raise BundleCorruptError(f"table for task {name!r} is malformed: {exc!r}") from None
    log.info("tunectl: loaded bundle %s/%s from %s (%d entries)", manifest["name"], manifest["version"],
             path, sum(len(t.table) for t in tasks.values()))
    return Bundle(path, manifest, tasks)
