"""What a serving process imports: load a tuned bundle, answer lookups. Standard library only.

    from tunectl.runtime import load_bundle, load_bundle_or_none
    bundle = load_bundle("/opt/bundles/decode/7")              # a bundle directory
    bundle = load_bundle("/opt/bundles", name="decode", channel="stable")    # what a channel points at
    bundle = load_bundle("/opt/bundles/decode@stable")         # the same, as one string
    bundle = load_bundle("s3://b/bundles/decode/7", fetcher=tunectl.store.stores.fetch)   # object storage
    bundle = load_bundle()                                     # $TUNECTL_BUNDLE: any of the above
    bundle = load_bundle_or_none() or empty_bundle()           # never raises on a bad bundle
    config = bundle.lookup("decode_attention", dtype="float32", num_q_heads=8, num_kv_heads=2,
                           head_dim=64, page_size=16, batch=3, kv_len=1500)

**Loading** reads the manifest, refuses a schema it does not know, reads every file the manifest
lists and checks its sha256, and refuses a member name that would leave the bundle (absolute, ``..``,
a link in an archive). A source is a directory, a ``.tar``/``.tar.gz`` of one, ``file://``, or any
other URI, read through a *fetcher*: ``fetcher(uri) -> bytes`` raising FileNotFoundError for a missing
object. This module reads local files only; for other schemes pass ``fetcher=``, call
``register_fetcher(scheme, fetcher)``, or install a package that declares one under the entry-point
group ``tunectl.fetchers`` (``tunectl.store.stores.fetch`` reads everything pyarrow.fs reads: s3://, gs://,
hdfs://). A channel (``name@stable``) is a small pointer file naming a version and the sha256 of its
manifest; a version replaced after promotion is refused.

**The environment** is checked per ``env_policy`` (``strict`` raises BundleEnvironmentError, ``warn``
logs, ``off`` skips; default ``$TUNECTL_ENV_POLICY``, else ``warn``) against ``environment=`` or what
``current_environment()`` finds: device name (compared whole after normalising, so "NVIDIA H200" is
"H200" but "H200 NVL" is not), compute capability, SM count and library versions. The rules are in
``tunectl.runtime.environment``.

**Lookup** normalises the static parameters (as tuning did), buckets each shape dimension with the
policy the bundle records, and returns a fresh dict of the tuned config, or None on any miss
(unknown task, static key or shape, a missing parameter; extra parameters are ignored). Values
compare as Python values, so ``causal=1`` finds ``causal=True`` and ``batch=4.0`` finds ``batch=4``.
An entry may be a rule rather than a config (schema 3): its split count is computed from the shape
by a fitted wave model (``tunectl.runtime.rules.WaveRule``), and the config returned is the entry's
with that count filled in. ``bundle.entry(task, **params)`` finds the same way and returns the whole
``Entry`` (``tunectl.runtime.entries``): its keys, config and rule, and why it won (``reason``,
``median_us``, ``speedup``, ``served_by``, ...). Lookup does no I/O and takes no lock: the tables are
immutable after load, and results are remembered by value in bounded dicts, so any number of threads
may call it (see ``tunectl.runtime.tables``).

**Confirmed picks** (``apply_confirmed(bundle, path)``): what ``tunectl bundle confirm ... --save
FILE`` chose on a machine like this one, applied without timing anything; refused where FILE was
confirmed for another bundle, and checked against this process's environment as a bundle is
(``tunectl.runtime.confirmed``).
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Mapping
from typing import Any

from tunectl.core.errors import BundleError
from tunectl.runtime.confirmed import apply_confirmed
from tunectl.runtime.entries import Entry
from tunectl.runtime.environment import ENV_POLICIES, check_environment
from tunectl.runtime.format import (
    SCHEMA_VERSION,
    BundleCorruptError,
    BundleEnvironmentError,
    BundleNotFoundError,
    BundleReadError,
    BundleSchemaError,
)
from tunectl.runtime.rules import WaveRule
from tunectl.runtime.sources import Fetcher, Source, read_verified, register_fetcher, resolve
from tunectl.runtime.tables import Bundle, task_index

ENV_VAR = "TUNECTL_BUNDLE"
log = logging.getLogger("tunectl.runtime")

#: what a serving process uses; the other names here are importable from the submodules that own them
__all__ = [
    "ENV_VAR",
    "Bundle",
    "BundleCorruptError",
    "BundleEnvironmentError",
    "BundleError",
    "BundleNotFoundError",
    "BundleReadError",
    "BundleSchemaError",
    "Entry",
    "WaveRule",
    "apply_confirmed",
    "empty_bundle",
    "load_bundle",
    "load_bundle_or_none",
    "register_fetcher",
]


def load_bundle(
    source: str | os.PathLike[str] | None = None,
    *,
    name: str | None = None,
    version: str | None = None,
    channel: str | None = None,
    env_policy: str | None = None,
    environment: Mapping[str, Any] | None = None,
    fetcher: Fetcher | None = None,
) -> Bundle:
    """Load and verify a bundle; raise a BundleError subclass saying what is wrong.

    ``source`` is a bundle (directory, archive or URI), or a store with ``name`` and one of
    ``version``/``channel``, or ``STORE/NAME@CHANNEL``; None reads ``$TUNECTL_BUNDLE``.
    """
    if env_policy is not None and env_policy not in ENV_POLICIES:
        raise ValueError(f"env_policy must be one of {', '.join(ENV_POLICIES)}, not {env_policy!r}")
    if source is None:
        source = os.environ.get(ENV_VAR)
        if not source:
            raise BundleNotFoundError("", f"${ENV_VAR} is not set")
    where, pointer = resolve(os.fspath(source), name, version, channel, fetcher)
    src = Source(where, fetcher)
    manifest, raw, files = read_verified(src)
    digest = hashlib.sha256(raw).hexdigest()
    pinned = (pointer or {}).get("manifest_sha256", digest), (pointer or {}).get("name", manifest["name"])
    if pinned != (digest, manifest["name"]):
        channel = (pointer or {}).get("channel")
        changed = f"channel {channel!r} points here, but this version changed after it was promoted"
        raise BundleCorruptError(where, f"{changed}: check it, then promote it again")
    problems = check_environment(manifest, env_policy, environment)
    schema = manifest["schema_version"]
    tasks = {task: task_index(task, spec, files, schema) for task, spec in manifest["tasks"].items()}
    bundle = Bundle(
        where, manifest, tasks, pointer.get("channel") if pointer else None, tuple(problems), digest
    )
    log.info("tunectl: loaded bundle %s", bundle.summary())
    return bundle


def load_bundle_or_none(source: str | os.PathLike[str] | None = None, **kwargs: Any) -> Bundle | None:
    """``load_bundle``, but a bad, missing or foreign bundle logs an error and returns None.

    For serving: the caller keeps its libraries' defaults (``load_bundle_or_none() or empty_bundle()``
    gives an object whose lookups all miss). With ``env_policy="strict"`` a foreign bundle is refused
    the same way: None, not a crash. Wrong arguments still raise.
    """
    try:
        return load_bundle(source, **kwargs)
    except BundleError as exc:
        log.error("tunectl: no tuned configs loaded, lookups fall back to defaults: %s", exc)
        return None


def empty_bundle(reason: str = "no bundle") -> Bundle:
    """A bundle with no tasks: every lookup misses."""
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "name": "(empty)",
        "version": "0",
        "tasks": {},
        "files": {},
        "environment": {},
        "reason": reason,
    }
    return Bundle("(empty)", manifest, {})
