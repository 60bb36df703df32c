"""The bundle's on-disk format as the runtime reads it: constants, typed errors, member names, the manifest.

Standard library only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from tunectl.core.errors import BundleError, Fielded, UserError

#: 3: an entry may be a rule (``tunectl.runtime.rules``): tables hold ``rules`` and a rule column
SCHEMA_VERSION = 3
READABLE_SCHEMAS = (1, 2, 3)
MANIFEST = "manifest.json"
CHANNELS = "_channels"  # <store>/<name>/_channels/<channel>.json; "_" cannot start a version
ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz")


@dataclass(eq=False)
class BundleCorruptError(Fielded, BundleError):
    """A file does not match its checksum, a member escapes the bundle, or a file is malformed.
    ``where``: the bundle's directory, archive or URI, or a channel pointer ("" where not known);
    ``task`` and ``member``: what in it is at fault, where one is; ``reason``: what is wrong."""

    where: str
    reason: str
    member: str = ""
    task: str = ""

    def problem(self) -> str:
        at = [f"bundle {self.where}" if self.where else "bundle"]
        at += [f"task {self.task!r}"] if self.task else []
        return ": ".join([*at, *([self.member] if self.member else []), self.reason])


@dataclass(eq=False)
class BundleSchemaError(Fielded, BundleError):
    """The bundle at ``where`` was written in schema ``version``, not one of the ``readable`` ones."""

    where: str
    version: object
    readable: tuple[int, ...] = READABLE_SCHEMAS

    def problem(self) -> str:
        readable = ", ".join(map(str, self.readable))
        schema = f"schema version {self.version!r}"
        return f"bundle {self.where} has {schema}; this tunectl reads versions {readable}"

    def advice(self) -> str:
        return "upgrade tunectl to load it"


@dataclass(eq=False)
class BundleEnvironmentError(Fielded, BundleError):
    """The bundle (``where``: name/version) was tuned for another environment: each of ``problems``
    is a device or library version that differs."""

    where: str
    problems: tuple[str, ...]

    def problem(self) -> str:
        return f"bundle {self.where} does not fit this environment: " + "; ".join(self.problems)


@dataclass(eq=False)
class BundleNotFoundError(Fielded, BundleError, UserError):
    """No bundle where the caller pointed (``where``; "" where nothing was given), with ``reason``;
    or no ``channel`` of bundle ``name`` in the store at ``where``."""

    where: str
    reason: str = ""
    name: str = ""
    channel: str = ""

    def problem(self) -> str:
        if self.channel:
            return f"no channel {self.channel!r} for bundle {self.name} in {self.where}"
        at = f"no bundle at {self.where}" if self.where else "no bundle given"
        return f"{at} ({self.reason})" if self.reason else at


@dataclass(eq=False)
class BundleReadError(Fielded, BundleError):
    """The bundle's storage could not be read (permissions, network, no fetcher for a scheme):
    ``where`` (a path or URI) and the ``reason``."""

    where: str
    reason: str

    def problem(self) -> str:
        return f"cannot read {self.where}: {self.reason}"


@dataclass(eq=False)
class ConfirmedPicksError(Fielded, BundleError, UserError):
    """The confirmed picks at ``where`` cannot be applied to the bundle given (``reason``): not such
    a file, a version this tunectl does not read, or confirmed for another bundle."""

    where: str
    reason: str

    def problem(self) -> str:
        return f"confirmed picks {self.where}: {self.reason}"


def check_member(name: object) -> str:
    """``name`` if it is a relative POSIX path that stays inside the bundle; BundleCorruptError otherwise."""
    if not isinstance(name, str) or "\\" in name or ":" in name:
        raise BundleCorruptError("", "escapes the bundle directory", repr(name))
    rel = PurePosixPath(name)
    if not rel.parts or rel.is_absolute() or ".." in rel.parts:
        raise BundleCorruptError("", "escapes the bundle directory", repr(name))
    return str(rel)


def safe_member(root: Path, name: str) -> Path:
    """``root / name`` for a member that stays inside ``root``, links followed; BundleCorruptError
    otherwise (a symlink in a bundle pointing outside it would make a foreign file verify)."""
    path = root.joinpath(*PurePosixPath(check_member(name)).parts)
    try:
        inside = path.resolve().is_relative_to(root.resolve())
    except (OSError, RuntimeError):  # a link loop
        inside = False
    if not inside:
        raise BundleCorruptError(str(root), "a link to a file outside the bundle", name)
    return path


def load_json(raw: bytes, where: str, member: str = "", task: str = "") -> Any:
    """``raw`` parsed; a ``BundleCorruptError`` naming the file (``BundleCorruptError``'s fields) if it
    is not JSON."""
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise BundleCorruptError(where, f"unreadable (truncated or not JSON): {exc}", member, task) from None


def parse_manifest(raw: bytes, where: str) -> dict[str, Any]:
    """The manifest's fields, checked for schema version and shape."""
    manifest = load_json(raw, where, MANIFEST)
    if not isinstance(manifest, dict):
        raise BundleCorruptError(where, "not a JSON object", MANIFEST)
    version = manifest.get("schema_version")
    if version not in READABLE_SCHEMAS:
        raise BundleSchemaError(where, version)
    for fld, kind in (
        ("name", str),
        ("version", str),
        ("tasks", dict),
        ("files", dict),
        ("environment", dict),
    ):
        if not isinstance(manifest.get(fld), kind):
            raise BundleCorruptError(where, f"lacks {fld!r} (or it is not a {kind.__name__})", MANIFEST)
    for member, digest in manifest["files"].items():
        check_member(member)
        if not isinstance(digest, str):
            raise BundleCorruptError(where, f"the checksum of {member!r} is not a string", MANIFEST)
    return manifest
