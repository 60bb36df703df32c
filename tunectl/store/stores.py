"""Bundle stores beyond a local directory: object storage and remote filesystems through pyarrow.fs.

    open_store("/srv/bundles")                      # a LocalStore
    open_store("s3://bucket/bundles")               # S3, or any S3-compatible service
    open_store("s3://bucket/bundles?endpoint_override=127.0.0.1:9000&scheme=http")
    open_store("gs://bucket/bundles"), open_store("hdfs://namenode:8020/bundles")   # where pyarrow has them

S3 options come the way pyarrow takes them: the URI's query (``endpoint_override``, ``scheme``,
``region``, ...), or the standard AWS variables (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
``AWS_PROFILE``, ...). ``fetch`` is the runtime's fetcher for these URIs: pass it as
``load_bundle(uri, fetcher=tunectl.store.stores.fetch)``, or call ``register_fetchers()`` once.

Publishing writes every table first and the manifest last. On object storage each object appears
whole when its upload completes, and a reader never sees a version without its manifest. Object
stores offer no "create if absent" through pyarrow, so two publishers racing on one version cannot
both be stopped up front: each re-reads the manifest after writing it, and the loser fails with
BundleExistsError; a reader in that window sees a checksum mismatch and refuses the version, never a
silent mix. On filesystems (HDFS, or any pyarrow filesystem that is not object storage) a version is
written to a hidden staging directory and renamed into place, as on a local disk, and a channel is
written beside its pointer and renamed over it.

pyarrow is imported where it is used; this module imports without it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from tunectl.core.errors import BundleError, BundleExistsError, Fielded, UserError
from tunectl.runtime import Bundle, BundleReadError, register_fetcher
from tunectl.runtime.sources import Fetcher, join_uri, uri_scheme
from tunectl.store.bundle import MANIFEST, LocalStore, check_name

#: schemes pyarrow.fs.FileSystem.from_uri understands (each only where the installed pyarrow has it)
SCHEMES = ("s3", "gs", "gcs", "hdfs", "viewfs", "abfs", "abfss")
#: filesystems whose single-object writes are atomic (an upload appears whole when it completes)
_OBJECT_STORES = ("s3", "gcs", "abfs")


@dataclass(eq=False)
class StoreWriteError(Fielded, BundleError):
    """A store could not be written (permissions, network, a full disk): ``where`` (a path or URI)
    and the ``reason``."""

    where: str
    reason: str

    def problem(self) -> str:
        return f"cannot write {self.where}: {self.reason}"


_ENV_OPTIONS = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_REGION")
_filesystems: dict[tuple[str, ...], Any] = {}
_filesystems_lock = threading.Lock()


def _filesystem(uri: str) -> tuple[Any, str]:
    """The pyarrow filesystem for ``uri`` (one per scheme, host and options) and the path in it."""
    try:
        import pyarrow.fs as pafs
    except ImportError:
        why = "reading it needs pyarrow: pip install pyarrow (or 'tunectl[tune]')"
        raise BundleReadError(uri, why) from None
    split = urlsplit(uri)
    # pyarrow reads endpoints and credentials from the environment when it builds a filesystem
    env = tuple(os.environ.get(v, "") for v in _ENV_OPTIONS)
    key = (split.scheme.lower(), split.netloc, split.query, *env)
    with _filesystems_lock:
        fs = _filesystems.get(key)
        if fs is None:
            try:
                fs, _ = pafs.FileSystem.from_uri(uri)
            except (ValueError, OSError) as exc:  # an unknown option, a filesystem this pyarrow lacks
                raise BundleReadError(uri, f"cannot open it: {exc}") from None
            _filesystems[key] = fs
    return fs, _path_of(split)


def _path_of(split: Any) -> str:
    """The path inside the filesystem, as pyarrow names it: ``bucket/key`` on object stores."""
    path = unquote(split.path).rstrip("/")
    if split.scheme in ("s3", "gs", "gcs"):
        return f"{split.netloc}{path}"
    if split.scheme in ("abfs", "abfss"):
        return f"{split.netloc.split('@', 1)[0]}{path}"
    return path or "/"


def fetch(uri: str) -> bytes:
    """The bytes of one object (the runtime's fetcher); FileNotFoundError if it does not exist."""
    fs, path = _filesystem(uri)
    with fs.open_input_stream(path) as stream:
        return bytes(stream.readall())


def register_fetchers() -> None:
    """Make ``load_bundle`` read every scheme in SCHEMES through ``fetch``."""
    for scheme in SCHEMES:
        register_fetcher(scheme, fetch)


class ArrowStore:
    """A bundle store on any pyarrow filesystem, rooted at ``url``."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.fetcher: Fetcher | None = fetch
        self.fs, self.root = _filesystem(self.url)
        self._atomic_puts = self.fs.type_name in _OBJECT_STORES

    def location(self, *parts: str) -> str:
        return join_uri(self.url, *parts)

    def _path(self, rel: str) -> str:
        return f"{self.root}/{rel}" if rel else self.root

    def read(self, rel: str) -> bytes:
        try:
            with self.fs.open_input_stream(self._path(rel)) as stream:
                return bytes(stream.readall())
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise BundleReadError(self.location(rel), str(exc)) from None

    def list_dir(self, rel: str) -> list[str]:
        import pyarrow.fs as pafs

        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self._path(rel), allow_not_found=True))
        except OSError as exc:
            raise BundleReadError(self.location(rel), f"cannot list it: {exc}") from None
        return sorted(info.base_name for info in infos)

    def _write(self, path: str, data: bytes) -> None:
        with self.fs.open_output_stream(path) as out:
            out.write(data)

    def _put(self, rel: str, data: bytes) -> None:
        """Write one member so that readers see the old bytes or the new ones, never a part."""
        target = self._path(rel)
        if self._atomic_puts:  # an object appears whole when its upload completes
            self._write(target, data)
            return
        parent = target.rsplit("/", 1)[0]
        self.fs.create_dir(parent, recursive=True)
        temp = f"{parent}/.{secrets.token_hex(4)}.tmp"
        self._write(temp, data)
        try:
            self.fs.move(temp, target)  # a rename: atomic where the filesystem replaces on rename
        except OSError:
            self.fs.delete_file(target)  # one that refuses to rename over a file (HDFS): a short gap
            self.fs.move(temp, target)

    def replace(self, rel: str, data: bytes) -> None:
        try:
            self._put(rel, data)
        except OSError as exc:
            raise StoreWriteError(self.location(rel), str(exc)) from None

    def _exists(self, rel: str) -> bool:
        import pyarrow.fs as pafs

        return bool(self.fs.get_file_info(self._path(rel)).type != pafs.FileType.NotFound)

    def publish_version(self, name: str, version: str, files: Mapping[str, bytes]) -> str:
        base = f"{check_name('name', name)}/{check_name('version', version)}"
        taken = BundleExistsError(name, version, self.location(name, version))
        order = sorted(files, key=lambda r: r == MANIFEST)  # the manifest last
        try:
            if self._exists(f"{base}/{MANIFEST}"):
                raise taken
            if self._atomic_puts:
                for rel in order:
                    if rel == MANIFEST and self._exists(f"{base}/{MANIFEST}"):
                        raise taken  # someone published this version while the tables were written
                    self._write(self._path(f"{base}/{rel}"), files[rel])
                if self.read(f"{base}/{MANIFEST}") != files[MANIFEST]:
                    raise taken  # a concurrent publisher wrote its manifest over ours
            else:
                self._publish_by_rename(base, order, files, taken)
        except OSError as exc:
            raise StoreWriteError(self.location(name, version), str(exc)) from None
        return self.location(name, version)

    def _publish_by_rename(
        self, base: str, order: list[str], files: Mapping[str, bytes], taken: BundleExistsError
    ) -> None:
        """On a filesystem: write a hidden staging directory, then rename it into place."""
        name, version = base.split("/")
        staging = self._path(f"{name}/.{version}.{secrets.token_hex(4)}.staging")
        try:
            for rel in order:
                self.fs.create_dir(f"{staging}/{rel}".rsplit("/", 1)[0], recursive=True)
                self._write(f"{staging}/{rel}", files[rel])
            if self._exists(base):
                raise taken  # leftovers of a failed publish are not a version, but are not ours to remove
            self.fs.move(staging, self._path(base))
        finally:
            with contextlib.suppress(OSError):
                self.fs.delete_dir(staging)


def open_store(url: str | os.PathLike[str]) -> LocalStore | ArrowStore:
    """The store at ``url``: a local directory (a path or file://), or a pyarrow filesystem URI."""
    text = os.fspath(url)
    scheme = uri_scheme(text)
    if scheme is None:
        return LocalStore(text)
    if scheme == "file":
        return LocalStore(unquote(urlsplit(text).path))
    if scheme not in SCHEMES:
        raise UserError(
            f"{text}: tunectl stores are local paths or {', '.join(s + '://' for s in SCHEMES)} URIs"
        )
    return ArrowStore(text)


def fetcher_for(source: str) -> Fetcher | None:
    """The fetcher that reads ``source`` (a store URI), or None for a local path."""
    return fetch if uri_scheme(source) not in (None, "file") else None


def read_bundle(source: str | os.PathLike[str], *, env_policy: str = "off") -> Bundle:
    """A bundle from a directory, archive, store URI or STORE/NAME@CHANNEL, for tools: the one way
    commands and reports load one (``env_policy``: whether to check this machine's environment)."""
    from tunectl.runtime import load_bundle

    text = os.fspath(source)
    return load_bundle(text, env_policy=env_policy, fetcher=fetcher_for(text))
