"""Confirmed picks kept beside a bundle: confirm once on a kind of machine, apply them at every start.

Confirming a bundle's candidates at a serving process's batch sizes (``tunectl bundle confirm``,
``tunectl.measure.confirm``) times configs on the device: seconds to minutes, most of it the
candidates' first loads. Every process of a fleet that runs one bundle on one kind of device with
the same libraries would time the same thing. ``tunectl bundle confirm ... --save FILE`` writes
what confirming chose; a serving process applies FILE at start-up (``apply_confirmed``: no timing,
standard library only) and its lookup answers as the confirming process's did. The file also keeps
the shapes and cells confirming reached and how many it did not within its budget: a later run
given the same file times only what is left (``tunectl.api.confirm_candidates(..., resume=FILE)``).

The file names the bundle it was confirmed for by its manifest's sha256 (a bundle version is
immutable: another version, or this one changed, is refused), and the environment it was timed in
(device, libraries), checked against this process as a bundle's own is (``env_policy``, else
``TUNECTL_ENV_POLICY``: ``strict`` refuses a mismatch, ``warn`` logs it and applies, ``off``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tunectl.core.files import atomic_write, json_bytes
from tunectl.runtime.environment import check_environment, current_environment, installed
from tunectl.runtime.format import BundleReadError, ConfirmedPicksError
from tunectl.runtime.tables import Bundle

CONFIRMED_FORMAT = "tunectl-confirmed"
#: 1: picks keyed by their parameters, with the cells of the dimensions confirmed by cell
CONFIRMED_VERSION = 1


def save_confirmed(
    path: str | os.PathLike[str],
    bundle: Bundle,
    task: str,
    picks: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]],
    by_cell: Mapping[str, Sequence[int]],
    how: str = "",
    not_reached: int = 0,
    reached: Sequence[Mapping[str, Any]] = (),
) -> Path:
    """Write the picks (parameters, config) confirmed for ``task`` of ``bundle`` to ``path``, with the
    cells of ``by_cell``'s dimensions, how they were timed, the shapes or cells confirming reached
    (``reached``: where a later run resumes) and how many it did not within its budget (they keep the
    bundle's picks), and this process's environment: its device and its versions of the libraries the
    bundle records. Written whole or not at all."""
    recorded = (bundle.manifest.get("environment") or {}).get("packages") or {}
    versions = {package: installed(package) for package in sorted(recorded)}
    doc = {
        "format": CONFIRMED_FORMAT,
        "version": CONFIRMED_VERSION,
        "bundle": {"name": bundle.name, "version": bundle.version, "manifest_sha256": bundle.manifest_sha256},
        "task": task,
        "by_cell": {dim: sorted(points) for dim, points in by_cell.items()},
        "picks": [{"params": dict(params), "config": dict(config)} for params, config in picks],
        "environment": {**current_environment(), "packages": {k: v for k, v in versions.items() if v}},
        "how": how,
        "reached": [dict(shape) for shape in reached],
        "not_reached": not_reached,
    }
    return atomic_write(path, json_bytes(doc, indent=1), make_parents=True)


def apply_confirmed(
    bundle: Bundle,
    path: str | os.PathLike[str],
    *,
    env_policy: str | None = None,
    environment: Mapping[str, Any] | None = None,
) -> Bundle:
    """``bundle`` answering the picks confirmed in the file at ``path`` (module doc); raises a
    BundleError saying why where the file cannot be read, is not such a file, was confirmed for
    another bundle, or (under ``strict``) in another environment."""
    where = os.fspath(path)
    doc = read_confirmed(bundle, where, env_policy=env_policy, environment=environment)
    picks = [(pick["params"], pick["config"]) for pick in doc["picks"]]
    try:
        return bundle.with_confirmed(doc["task"], picks, by_cell=doc["by_cell"]) if picks else bundle
    except (ValueError, TypeError) as exc:  # a pick or cell this bundle has no place for
        raise ConfirmedPicksError(where, f"they do not fit the bundle: {exc}") from exc


def read_confirmed(
    bundle: Bundle,
    path: str | os.PathLike[str],
    *,
    env_policy: str | None = None,
    environment: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The file at ``path`` as written by ``save_confirmed``, checked as ``apply_confirmed`` checks it
    (the same errors); ``"reached"`` is empty in a file written before it was kept."""
    where = os.fspath(path)
    try:
        with open(where, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as exc:
        raise BundleReadError(where, exc.strerror or str(exc)) from exc
    except ValueError as exc:
        raise ConfirmedPicksError(where, f"not JSON ({exc})") from exc
    _check(doc, bundle, where)
    named = {"name": f"confirmed picks {where} for {bundle.name}", "version": bundle.version}
    check_environment({**named, "environment": doc["environment"]}, env_policy, environment)
    reached = doc.get("reached", [])
    if not isinstance(reached, list) or not all(isinstance(shape, dict) for shape in reached):
        raise ConfirmedPicksError(where, '"reached" must be a list of shapes')
    return {**doc, "picks": [{**p, "params": _tuples(p["params"])} for p in doc["picks"]], "reached": reached}


def _tuples(params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` as read from JSON, a list value (a window's two sides) back into the tuple it was."""
    return {name: tuple(value) if isinstance(value, list) else value for name, value in params.items()}


def _check(doc: Any, bundle: Bundle, where: str) -> None:
    """Raise where ``doc`` is not confirmed picks this version reads, for ``bundle``."""
    if not isinstance(doc, dict) or doc.get("format") != CONFIRMED_FORMAT:
        raise ConfirmedPicksError(where, f'not such a file (no "format": "{CONFIRMED_FORMAT}")')
    if doc.get("version") != CONFIRMED_VERSION:
        reason = f"written as version {doc.get('version')!r}; this tunectl reads version {CONFIRMED_VERSION}"
        raise ConfirmedPicksError(where, reason)
    named = doc.get("bundle") or {}
    if not bundle.manifest_sha256 or named.get("manifest_sha256") != bundle.manifest_sha256:
        reason = (
            f"confirmed for bundle {named.get('name')}/{named.get('version')}, not for "
            f"{bundle.name}/{bundle.version} as loaded here (its manifest differs): confirm this one"
        )
        raise ConfirmedPicksError(where, reason)
    if doc.get("task") not in bundle.tasks:
        raise ConfirmedPicksError(where, f"task {doc.get('task')!r} is not a task of the bundle")
    picks = doc.get("picks")
    parts = [doc.get("by_cell"), doc.get("environment")]
    if not isinstance(picks, list) or not all(isinstance(part, dict) for part in parts):
        raise ConfirmedPicksError(where, '"picks", "by_cell" or "environment" is missing')
    for pick in picks:
        if not (isinstance(pick, dict) and all(isinstance(pick.get(k), dict) for k in ("params", "config"))):
            raise ConfirmedPicksError(where, 'each pick needs "params" and "config"')
