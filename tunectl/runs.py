"""Run metadata: what a run was asked to do and how far it got. Stored as JSON beside the results."""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from tunectl.errors import UserError
from tunectl.results import atomic_write

RUNS_DIR = "_runs"
STATES = ("running", "finished", "interrupted", "failed")


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

    def with_state(self, state: str, message: str = "") -> RunInfo:
        return replace(self, state=state, message=message, updated_at=time.time())


def new_run_id() -> str:
    """Sortable by start time, unique across drivers: r20261129-221300-3fa2c1."""
    return time.strftime("r%Y%m%d-%H%M%S-", time.gmtime()) + secrets.token_hex(3)


def save_run(root: str | Path, info: RunInfo) -> None:
    directory = Path(root) / RUNS_DIR
    directory.mkdir(parents=True, exist_ok=True)
    data = json.dumps(asdict(info), indent=2, sort_keys=True).encode()
    atomic_write(directory / f"{info.run_id}.json", lambda f: f.write(data))


def load_run(root: str | Path, run_id: str) -> RunInfo:
    path = Path(root) / RUNS_DIR / f"{run_id}.json"
    try:
        return RunInfo(**json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise UserError(f"no run {run_id!r} in {root}; `tunectl runs --results {root}` lists them") from None
    except (ValueError, TypeError) as exc:
        raise UserError(f"run metadata {path} is unreadable: {exc}") from None


def list_runs(root: str | Path) -> list[RunInfo]:
    directory = Path(root) / RUNS_DIR
    if not directory.is_dir():
        return []
    runs = [load_run(root, p.stem) for p in sorted(directory.glob("r*.json"))]
    return sorted(runs, key=lambda r: r.created_at)
