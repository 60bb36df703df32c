"""The bundle's on-disk format as the runtime reads it: constants, typed errors, member names, the manifest.

Standard library only.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any

from tunectl.core.errors import BundleError, UserError

#: 3: an entry may be a rule (``tunectl.runtime.rules``): tables hold ``rules`` and a rule column
SCHEMA_VERSION = 3
READABLE_SCHEMAS = (1, 2, 3)
MANIFEST = "manifest.json"
CHANNELS = "_channels"  # <store>/<name>/_channels/<channel>.json; "_" cannot start a version
ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz")


class BundleCorruptError(BundleError):
    """A file does not match its checksum, a member escapes the bundle, or a file is malformed."""


class BundleSchemaError(BundleError):
    """The bundle was written in a schema this runtime does not read."""


class BundleEnvironmentError(BundleError):
    """The bundle was tuned for another environment (device or library versions)."""


class BundleNotFoundError(BundleError, UserError):
    """No bundle (or channel) where the caller pointed."""


class BundleReadError(BundleError):
    """The bundle's storage could not be read (permissions, network, no fetcher for a scheme)."""


def check_member(name: object) -> str:
    """``name`` if it is a relative POSIX path that stays inside the bundle; BundleCorruptError otherwise."""
    if not isinstance(name, str) or "\\" in name or ":" in name:
        raise BundleCorruptError(f"bundle member {name!r} escapes the bundle directory")
    rel = PurePosixPath(name)
    if not rel.parts or rel.is_absolute() or ".." in rel.parts:
        raise BundleCorruptError(f"bundle member {name!r} escapes the bundle directory")
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
        raise BundleCorruptError(f"bundle {root}: {name} is a link to a file outside the bundle")
    return path


def load_json(raw: bytes, what: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise BundleCorruptError(f"{what} is unreadable (truncated or not JSON): {exc}") from None


def parse_manifest(raw: bytes, where: str) -> dict[str, Any]:
    """The manifest's fields, checked for schema version and shape."""
    manifest = load_json(raw, f"manifest of {where}")
    if not isinstance(manifest, dict):
        raise BundleCorruptError(f"manifest of {where} is not a JSON object")
    version = manifest.get("schema_version")
    if version not in READABLE_SCHEMAS:
        raise BundleSchemaError(
            f"bundle {where} has schema version {version!r}; this tunectl reads versions "
            f"{', '.join(map(str, READABLE_SCHEMAS))}: upgrade tunectl to load it"
        )
    for fld, kind in (
        ("name", str),
        ("version", str),
        ("tasks", dict),
        ("files", dict),
        ("environment", dict),
    ):
        if not isinstance(manifest.get(fld), kind):
            raise BundleCorruptError(f"manifest of {where} lacks {fld!r} (or it is not a {kind.__name__})")
    for member, digest in manifest["files"].items():
        check_member(member)
        if not isinstance(digest, str):
            raise BundleCorruptError(f"manifest of {where}: checksum of {member!r} is not a string")
    return manifest
