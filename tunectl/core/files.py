"""Writing files so that a reader sees the whole file or nothing, and JSON in its one canonical form.

Standard library only: the bundle writer and the serving runtime use it.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

Writer = Callable[[IO[bytes]], object]

#: the rule for a name that becomes part of a path: a spec's name, a bundle's name and version
NAME_RULE = "1 to 128 ASCII letters (A-Z, a-z), digits, '.', '_' or '-', starting with a letter or digit"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def name_problem(value: object) -> str | None:
    """Why ``value`` cannot be a name that becomes part of a path (``NAME_RULE``); None if it can."""
    if isinstance(value, str) and _NAME.match(value):
        return None
    return f"must be {NAME_RULE}"


def atomic_write(path: str | os.PathLike[str], data: bytes | Writer, *, make_parents: bool = False) -> Path:
    """Write ``data`` (bytes, or a ``write(file)`` callable) to ``path`` atomically; return the path.

    The data goes to a hidden temp file beside ``path``, is fsynced and renamed into place, and the
    directory is fsynced so the rename survives a power loss. On any failure the temp file is removed
    and ``path`` is untouched (a reader sees the old file, or none).
    """
    path = Path(path)
    if make_parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "wb") as f:
            if isinstance(data, bytes):
                f.write(data)
            else:
                data(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    sync_dir(path.parent)
    return path


def write_synced(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` and fsync it (for a file in a directory that is renamed into place
    whole, such as a bundle version being staged; anything else goes through ``atomic_write``)."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def move(src: str | os.PathLike[str], dst: str | os.PathLike[str], *, make_parents: bool = False) -> Path:
    """Rename ``src`` to ``dst`` (same filesystem) and fsync both directories; return ``dst``.

    For a whole file set aside under a new name (a damaged results part quarantined); a file being
    written goes through ``atomic_write``.
    """
    src, dst = Path(src), Path(dst)
    if make_parents:
        dst.parent.mkdir(parents=True, exist_ok=True)
    os.replace(src, dst)
    sync_dir(dst.parent)
    if src.parent != dst.parent:
        sync_dir(src.parent)
    return dst


def sync_dir(directory: str | os.PathLike[str]) -> None:
    """fsync a directory, so the names created or renamed in it are durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def canonical_json(
    obj: Any, *, indent: int | None = None, default: Callable[[Any], Any] | None = None
) -> str:
    """JSON with sorted names and no NaN: equal data gives equal text (digests, diffs, stored files).

    ``indent=None`` gives the compact form (no spaces); an indent gives the readable one. ``default``
    turns what JSON has no form for into something it has (``str``, for a compile key's parts).
    """
    separators = (",", ":") if indent is None else (",", ": ")
    return json.dumps(
        obj, sort_keys=True, indent=indent, separators=separators, allow_nan=False, default=default
    )


def json_bytes(obj: Any, *, indent: int | None = None) -> bytes:
    """``canonical_json`` as UTF-8 bytes with a final newline (a file's content)."""
    return (canonical_json(obj, indent=indent) + "\n").encode()
