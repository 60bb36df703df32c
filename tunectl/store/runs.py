"""Run metadata: what a run was asked to do and how far it got. Stored as JSON beside the results.

Layout under the results root::

    _runs/<run>.json    the run's metadata (this module), replaced atomically on every change
    _runs/<run>.log     the run's event log: workers starting, dying, items retried or timed out

A run records the host and process of the driver running it, so a run whose driver died without a
word (SIGKILL, a lost machine) shows as interrupted rather than running forever, and ``cancel`` can
stop a driver on this machine.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import socket
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from tunectl.core.errors import NoResultsError, UserError
from tunectl.core.files import atomic_write, json_bytes
from tunectl.core.plan import RunFacts
from tunectl.core.record import Record

RUNS_DIR = "_runs"
#: the results dataset a command reads and writes when not given --results
DEFAULT_RESULTS = Path("tunectl-results")
log = logging.getLogger("tunectl.store.results")
_warned: set[str] = set()
STATES = ("running", "finished", "interrupted", "cancelled", "failed")


@dataclass(frozen=True)
class RunInfo:
    run_id: str
    name: str
    task: str
    spec_path: str
    spec_text: str
    state: str
    num_planned: int
    created_at: float
    updated_at: float
    message: str = ""
    #: the pools (accelerator types, or "cpu") the run is planned for; each measures the whole plan
    pools: tuple[str, ...] = ()
    driver_host: str = ""
    driver_pid: int = 0
    driver_start: int = 0  # the driver process's start time (clock ticks since boot), against pid reuse
    kind: str = "tune"  # tune | validate | holdout | probe
    #: where kernels were built and cached: the cache root, whether every node sees it, the compile
    #: processes per node, the environment pointing each library's cache there, what they built
    compile: dict[str, Any] = field(default_factory=dict)
    #: what selection and export need from the task, fixed at plan time (None: a run written before)
    facts: RunFacts | None = None
    #: a run whose items are fixed up front (a validation): a digest of their record ids, by which a
    #: resume knows it plans the same items ("": a tuning run, or one written before)
    plan_digest: str = ""

    def with_state(self, state: str, message: str = "") -> RunInfo:
        assert state in STATES, state
        return replace(self, state=state, message=message, updated_at=time.time())

    def with_driver(self) -> RunInfo:
        """The same run, driven by this process from now on."""
        pid = os.getpid()
        return replace(
            self, driver_host=socket.gethostname(), driver_pid=pid, driver_start=_process_start(pid) or 0
        )


@dataclass(frozen=True)
class RunSummary:
    """A run with its counts from the results dataset and its state as a user should read it."""

    info: RunInfo
    state: str  # the recorded state, except a 'running' run whose driver is gone reads 'interrupted'
    counts: dict[str, int] = field(default_factory=dict)  # status -> rows

    @property
    def num_done(self) -> int:
        return sum(self.counts.values())

    @property
    def failed(self) -> dict[str, int]:
        return {s: n for s, n in sorted(self.counts.items()) if s != "ok"}


def new_run_id() -> str:
    """Sortable by start time, unique across drivers: r20261129-221300-3fa2c1."""
    return time.strftime("r%Y%m%d-%H%M%S-", time.gmtime()) + secrets.token_hex(3)


def results_option(root: str | Path) -> str:
    """`` --results ROOT`` for a command a user is told to run, "" where ``root`` is the default."""
    return "" if Path(root) == DEFAULT_RESULTS else f" --results {root}"


def run_log_path(root: str | Path, run_id: str) -> Path:
    return Path(root) / RUNS_DIR / f"{run_id}.log"


def save_run(root: str | Path, info: RunInfo) -> None:
    directory = Path(root) / RUNS_DIR
    directory.mkdir(parents=True, exist_ok=True)
    raw = {**asdict(info), "facts": info.facts.to_json() if info.facts else None}
    atomic_write(directory / f"{info.run_id}.json", json_bytes(raw, indent=2))


def run_exists(root: str | Path, run_id: str) -> bool:
    return (Path(root) / RUNS_DIR / f"{run_id}.json").is_file()


def load_run(root: str | Path, run_id: str) -> RunInfo:
    path = Path(root) / RUNS_DIR / f"{run_id}.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        known = {f.name for f in fields(RunInfo)}
        raw = {k: v for k, v in raw.items() if k in known}  # written by a newer tunectl: keep what we know
        raw["pools"] = tuple(raw.get("pools", ()))
        raw["facts"] = RunFacts.from_json(raw["facts"]) if raw.get("facts") else None
        return RunInfo(**raw)
    except FileNotFoundError:
        raise NoResultsError(Path(root), Path(root).is_dir(), run=run_id) from None
    except (ValueError, TypeError, KeyError, AttributeError, OSError) as exc:
        raise UserError(f"run metadata {path} is unreadable: {exc}") from None


def run_facts(info: RunInfo) -> RunFacts | None:
    """The run's plan-time facts; for a run recorded before runs carried them, planned again from its
    spec (None for a run without a spec, such as one imported from another tuner's log)."""
    if info.facts is not None or not info.spec_text:
        return info.facts
    from tunectl.core.plan import plan
    from tunectl.core.spec import parse_spec

    return plan(parse_spec(info.spec_text, info.spec_path, info.name, stored=True)).facts


def list_runs(root: str | Path) -> list[RunInfo]:
    """Every run with readable metadata; an unreadable file is skipped with a warning (``doctor``)."""
    runs = []
    for path in run_files(root):
        try:
            runs.append(load_run(root, path.stem))
        except UserError as exc:
            if str(path) not in _warned:
                _warned.add(str(path))
                log.warning("skipped %s; `tunectl doctor --results %s` lists such files", exc, root)
    return sorted(runs, key=lambda r: r.created_at)


def run_files(root: str | Path) -> list[Path]:
    directory = Path(root) / RUNS_DIR
    return sorted(directory.glob("r*.json")) if directory.is_dir() else []


def check_run_files(root: str | Path) -> list[tuple[Path, UserError]]:
    """Every run metadata file that cannot be read, with why (``tunectl doctor``)."""
    bad = []
    for path in run_files(root):
        try:
            load_run(root, path.stem)
        except UserError as exc:
            bad.append((path, exc))
    return bad


def require_runs(root: str | Path, run_ids: Iterable[str]) -> None:
    """A ``NoResultsError`` naming the first of ``run_ids`` that is not a run of ``root``."""
    known = {r.run_id for r in list_runs(root)}
    known |= {p.name.removeprefix("run_id=") for p in Path(root).glob("task=*/run_id=*")}
    for run_id in run_ids:
        if run_id not in known:
            raise NoResultsError(Path(root), Path(root).is_dir(), run=run_id)


def summarise_runs(root: str | Path, records: list[Record] | None = None) -> list[RunSummary]:
    """Every run under ``root`` with its record counts by status (``records``: the dataset, if read)."""
    runs = list_runs(root)
    if records is None and runs:
        from tunectl.store.results import read_results

        records = read_results(root)
    counts: dict[str, Counter[str]] = {}
    for record in records or []:
        counts.setdefault(record.run_id, Counter())[str(record.status)] += 1
    return [RunSummary(r, effective_state(r), dict(counts.get(r.run_id, Counter()))) for r in runs]


def driver_alive(info: RunInfo) -> bool | None:
    """Whether the run's driver process still runs; None when it ran on another host (cannot tell)."""
    if not info.driver_pid or info.driver_host != socket.gethostname():
        return None
    start = _process_start(info.driver_pid)
    return start is not None and (not info.driver_start or not start or start == info.driver_start)


def effective_state(info: RunInfo) -> str:
    if info.state == "running" and driver_alive(info) is False:
        return "interrupted"
    return info.state


def refuse_if_running(info: RunInfo, results: str | Path) -> None:
    """A resume of ``info`` (a run in ``results``) is refused while the driver that runs it is alive."""
    if info.state == "running" and driver_alive(info):
        raise UserError(
            f"run {info.run_id} is still running (pid {info.driver_pid}); stop it first: "
            f"`tunectl cancel {info.run_id}{results_option(results)}`"
        )


def cancel_local_run(root: str | Path, run_id: str, wait_s: float = 15.0) -> str:
    """Stop the driver of a running run on this machine (SIGTERM: it records what it has and stops).

    Returns what happened, in a sentence. A run whose driver is already gone is marked interrupted.
    """
    info = load_run(root, run_id)
    if info.state != "running":
        raise UserError(f"run {run_id} is not running (it is {info.state})")
    alive = driver_alive(info)
    if alive is None:
        raise UserError(
            f"run {run_id} is driven from host {info.driver_host or '?'} (pid {info.driver_pid}); "
            "cancel it there, "
            "or with `tunectl cancel RUN --address http://HEAD:8265` if it was submitted as a job"
        )
    if not alive:
        save_run(root, info.with_state("interrupted", "its driver was gone"))
        return (
            f"run {run_id} had no driver left; marked interrupted "
            f"(finish it with `tunectl submit --resume {run_id} --results {root}`)"
        )
    os.kill(info.driver_pid, signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if load_run(root, run_id).state != "running" or not driver_alive(info):
            break
        time.sleep(0.1)
    state = effective_state(load_run(root, run_id))
    return (
        f"run {run_id} stopped: {state}; finish it with `tunectl submit --resume {run_id} --results {root}`"
    )


def _process_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), or None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return 0
        return 0  # alive, start time unknown (no /proc)
    after_name = stat.rsplit(")", 1)[1].split()
    if after_name and after_name[0] == "Z":
        return None  # a zombie has finished
    return int(after_name[19]) if len(after_name) > 19 else 0
