"""Where a bundle's bytes come from: local directories, archives, and URIs through pluggable fetchers.

This module reads local files only. Any other scheme is read by a fetcher, ``fetcher(uri) -> bytes``
raising FileNotFoundError for a missing object: one passed to ``load_bundle(fetcher=...)``, one
registered with ``register_fetcher``, or one a package declares under the entry-point group
``tunectl.fetchers`` (named for its scheme). Standard library only.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import io
import re
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from tunectl.core.errors import BundleError, UserError
from tunectl.runtime.format import (
    ARCHIVE_SUFFIXES,
    CHANNELS,
    MANIFEST,
    BundleCorruptError,
    BundleNotFoundError,
    BundleReadError,
    check_member,
    load_json,
    parse_manifest,
    safe_member,
)

Fetcher = Callable[[str], bytes]

_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_fetchers: dict[str, Fetcher] = {}


def register_fetcher(scheme: str, fetcher: Fetcher | None) -> None:
    """Use ``fetcher`` for ``scheme://`` URIs loaded without ``fetcher=`` (None: forget the scheme's)."""
    if fetcher is None:
        _fetchers.pop(scheme.lower(), None)
    else:
        _fetchers[scheme.lower()] = fetcher


def uri_scheme(source: str) -> str | None:
    match = _URI.match(source)
    return match.group(1).lower() if match else None


def join_uri(base: str, *parts: str) -> str:
    """``base`` with ``parts`` appended to its path; a query string (endpoint options) stays last."""
    split = urlsplit(base)
    path = "/".join([split.path.rstrip("/"), *parts])
    return urlunsplit((split.scheme, split.netloc, path, split.query, ""))


def _fetcher_for(uri: str, fetcher: Fetcher | None) -> Fetcher:
    if fetcher is not None:
        return fetcher
    scheme = uri_scheme(uri) or ""
    if scheme in _fetchers:
        return _fetchers[scheme]
    for point in importlib.metadata.entry_points(group="tunectl.fetchers", name=scheme):
        try:
            found: Fetcher = point.load()
        except Exception as exc:  # a broken plug-in is a read error, not a crash
            why = f"the {scheme}:// fetcher {point.value} cannot be loaded: {exc}"
            raise BundleReadError(uri, why) from None
        _fetchers[scheme] = found
        return found
    raise BundleReadError(
        uri,
        f"no fetcher for {scheme}:// URIs: pass fetcher=tunectl.store.stores.fetch (needs pyarrow), "
        f"call register_fetcher({scheme!r}, ...), or copy the bundle to a local directory",
    )


def _fetch(fetcher: Fetcher, uri: str) -> bytes:
    try:
        return fetcher(uri)
    except (FileNotFoundError, BundleError):
        raise
    except Exception as exc:  # any transport's failure, reported as one typed error
        raise BundleReadError(uri, f"{type(exc).__name__}: {exc}") from None


def read_local(path: Path) -> bytes:
    """A local file's bytes; FileNotFoundError if it is absent, BundleReadError if unreadable."""
    try:
        return path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        raise FileNotFoundError(str(path)) from None
    except OSError as exc:
        raise BundleReadError(str(path), str(exc)) from None


def _local_path(where: str) -> Path | None:
    """The local path of a plain path or a file:// URI; None for any other URI."""
    scheme = uri_scheme(where)
    if scheme is None:
        return Path(where)
    return Path(unquote(urlsplit(where).path)) if scheme == "file" else None


def read_location(where: str, fetcher: Fetcher | None = None) -> bytes:
    """The bytes at a path or URI; FileNotFoundError if there is nothing there."""
    local = _local_path(where)
    return read_local(local) if local is not None else _fetch(_fetcher_for(where, fetcher), where)


def _archive_members(data: bytes, where: str) -> dict[str, bytes]:
    """The regular files of a tar archive; a link, a device or an escaping name refuses the archive."""
    members: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for info in tar:
                if info.isdir():
                    continue
                if not info.isfile():
                    raise BundleCorruptError(where, "not a regular file", info.name)
                name = check_member(info.name.removeprefix("./"))
                extracted = tar.extractfile(info)
                assert extracted is not None, "a regular file always extracts"
                members[name] = extracted.read()
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise BundleCorruptError(where, f"the archive is unreadable: {exc}") from None
    return members


class Source:
    """Reads the members of one bundle version: a directory, an archive, or a URI prefix."""

    def __init__(self, where: str, fetcher: Fetcher | None = None) -> None:
        self.where = where
        self._local = _local_path(where)
        self._fetcher = _fetcher_for(where, fetcher) if self._local is None else None
        self._members: dict[str, bytes] | None = None
        if str(self._local or urlsplit(where).path).endswith(ARCHIVE_SUFFIXES):
            try:
                data = read_location(where, fetcher)
            except FileNotFoundError:
                raise BundleNotFoundError(where, "no such archive") from None
            self._members = _archive_members(data, where)

    def read(self, member: str) -> bytes:
        """A member's bytes; FileNotFoundError if it is missing."""
        member = check_member(member)
        if self._members is not None:
            if member not in self._members:
                raise FileNotFoundError(member)
            return self._members[member]
        if self._local is not None:
            return read_local(safe_member(self._local, member))
        assert self._fetcher is not None
        return _fetch(self._fetcher, join_uri(self.where, member))


def join_location(base: str, *parts: str) -> str:
    """``parts`` appended to a path or URI."""
    return join_uri(base, *parts) if uri_scheme(base) else str(Path(base).joinpath(*parts))


def _split_ref(source: str) -> tuple[str, str, str] | None:
    """``STORE/NAME@CHANNEL`` as (store, name, channel); None for anything else."""
    split = urlsplit(source) if uri_scheme(source) else None
    head, _, last = (split.path if split else source).rstrip("/").rpartition("/")
    if "@" not in last:
        return None
    name, _, channel = last.partition("@")
    if not name or not channel:
        raise BundleNotFoundError(source, "not STORE/NAME@CHANNEL")
    return (urlunsplit(split._replace(path=head)) if split else head or "."), name, channel


def resolve(
    source: str, name: str | None, version: str | None, channel: str | None, fetcher: Fetcher | None
) -> tuple[str, dict[str, Any] | None]:
    """The location of the version asked for, and the channel pointer that named it (if any)."""
    if name is None:
        ref = _split_ref(source)
        if ref is None:
            if version is not None or channel is not None:
                raise UserError("version= and channel= need name= (or a STORE/NAME@CHANNEL source)")
            return source, None
        source, name, channel = ref
    if (version is None) == (channel is None):
        raise UserError(f"bundle {name}: give exactly one of version= and channel=")
    if version is not None:
        return join_location(source, check_member(name), check_member(version)), None
    assert channel is not None
    pointer_at = join_location(source, check_member(name), CHANNELS, f"{check_member(channel)}.json")
    try:
        raw = read_location(pointer_at, fetcher)
    except FileNotFoundError:
        raise BundleNotFoundError(source, name=name, channel=channel) from None
    pointer = load_json(raw, pointer_at)
    if not isinstance(pointer, dict) or not isinstance(pointer.get("version"), str):
        raise BundleCorruptError(pointer_at, "the channel pointer names no version")
    return join_location(source, name, check_member(pointer["version"])), pointer


def read_verified(source: Source) -> tuple[dict[str, Any], bytes, dict[str, bytes]]:
    """The manifest, its bytes, and every file it lists, each checked against its sha256."""
    try:
        raw = source.read(MANIFEST)
    except FileNotFoundError:
        raise BundleNotFoundError(source.where, f"it has no {MANIFEST}") from None
    manifest = parse_manifest(raw, source.where)
    files: dict[str, bytes] = {}
    for member, digest in sorted(manifest["files"].items()):
        try:
            data = source.read(member)
        except FileNotFoundError:
            raise BundleCorruptError(source.where, "listed but missing", member) from None
        if hashlib.sha256(data).hexdigest() != digest:
            raise BundleCorruptError(source.where, "does not match its checksum: it was changed", member)
        files[member] = data
    for task, spec in manifest["tasks"].items():
        for key in ("table", "stats"):
            member = spec.get(key) if isinstance(spec, dict) else None
            if (member is not None or key == "table") and member not in files:
                raise BundleCorruptError(source.where, "not checksummed", key, task)
    return manifest, raw, files
