"""Exactly once through kills: stop the driver at random moments, resume, count rows lost and duplicated.

Each cycle starts `tunectl submit SPEC` (or `--resume RUN` while a run is unfinished) in a process
session of its own, waits a random time, and stops it: SIGKILL (the driver and every Ray process it
started, as a lost machine would), SIGINT (Ctrl-C) or `tunectl cancel` (SIGTERM). A run that
finishes before its stop is checked and a new one starts. Every finished run is checked against
the raw Parquet parts with DuckDB (no dedupe) once the last run is finished:

- duplicated: rows beyond one per (run, item id);
- lost: items the plan has without a row, plus comparison items (the finals) that a search rebuilt
  from the run's rows still asks for.

    python benchmarks/costs/faults.py --cycles 50                 # the quickstart spec, local Ray, CPU
    python benchmarks/costs/faults.py --cycles 5 --max-delay 20   # a quick look

It prints a Markdown summary (and each cycle as it goes) and exits 1 if anything was lost or
duplicated.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
STOPS = ("kill", "kill", "kill", "interrupt", "cancel")  # SIGKILL most often: it leaves the most behind


@dataclass
class Tally:
    cycles: int = 0
    stops: Counter[str] = field(default_factory=Counter)
    stops_in_finals: int = 0
    runs_checked: int = 0
    rows: int = 0
    lost: int = 0
    duplicated: int = 0
    failures: list[str] = field(default_factory=list)

    def add(self, rows: int, lost: int, duplicated: int) -> None:
        self.runs_checked += 1
        self.rows, self.lost, self.duplicated = (
            self.rows + rows,
            self.lost + lost,
            self.duplicated + duplicated,
        )


def tunectl(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tunectl", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "COLUMNS": "200"},
    )  # fmt: skip


def stop(proc: subprocess.Popen[str], how: str, results: Path, run_id: str | None) -> None:
    """Stop the driver the way ``how`` says, then make sure nothing it started lives on."""
    if how == "kill":
        proc.send_signal(signal.SIGKILL)
    elif how == "interrupt":
        proc.send_signal(signal.SIGINT)
    elif run_id is not None:
        subprocess.run([sys.executable, "-m", "tunectl", "cancel", run_id, "--results", str(results)],
                       capture_output=True, timeout=60, check=False)  # fmt: skip
    else:
        proc.send_signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # the local Ray instance this driver started
    proc.wait()


def unfinished_run(results: Path) -> str | None:
    from tunectl.store.runs import summarise_runs

    if not (results / "_runs").is_dir():
        return None
    runs = [r for r in summarise_runs(results) if r.state != "finished"]
    return runs[-1].info.run_id if runs else None


def query_rows(query: str) -> list[tuple[Any, ...]]:
    """The rows of a DuckDB select (a relation: only a statement that is no query gives None)."""
    import duckdb

    relation = duckdb.sql(query)
    assert relation is not None
    return relation.fetchall()


def in_finals(results: Path, run_id: str | None) -> bool:
    """Whether the run had started its finals when it was stopped (a final row is on disk)."""
    if run_id is None or not list(results.glob(f"task=*/run_id={run_id}/*.parquet")):
        return False
    glob = str(results / "task=*" / f"run_id={run_id}" / "*.parquet")
    query = f"select count(*) from read_parquet('{glob}', hive_partitioning=true) where phase = 'final'"
    [(n,)] = query_rows(query)
    return bool(n)


def check_run(results: Path, run_id: str, spec: Path) -> tuple[int, int, int]:
    """(rows, lost, duplicated) of a finished run, from the raw parts."""
    from tunectl.core.plan import plan
    from tunectl.core.spec import load_spec
    from tunectl.decide.search import Search
    from tunectl.store.results import read_results

    glob = str(results / "task=*" / f"run_id={run_id}" / "*.parquet")
    [(rows, distinct)] = query_rows(
        f"select count(*), count(distinct item_id) from read_parquet('{glob}', hive_partitioning=true)"
    )
    ids = {r[0] for r in query_rows(f"select distinct item_id from read_parquet('{glob}')")}
    work = plan(load_spec(spec))
    missing_measure = sum(1 for item in work.work_items() if item.item_id not in ids)
    search = Search(work)
    search.start(read_results(results, run_ids=[run_id]))
    still_wanted = search.draw(sys.maxsize)
    return rows, missing_measure + len(still_wanted), rows - distinct


def run(args: argparse.Namespace) -> Tally:
    """Stop and resume runs for ``args.cycles`` stops, finish the last one, then check every run."""
    rng = random.Random(args.seed)
    results = Path(args.results or tempfile.mkdtemp(prefix="tunectl-faults-")) / "results"
    tally = Tally()
    print(f"results: {results}", flush=True)
    while tally.cycles < args.cycles and len(tally.failures) <= 5:
        run_id = unfinished_run(results)
        proc = tunectl(*(["submit", "--resume", run_id] if run_id else ["submit", str(args.spec)]),
                       "--results", str(results))  # fmt: skip
        delay = rng.uniform(args.min_delay, args.max_delay)
        try:
            proc.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            how = rng.choice(STOPS)
            run_id = run_id or unfinished_run(results)
            finals = in_finals(results, run_id) and unfinished_run(results) is not None
            stop(proc, how, results, run_id)
            tally.cycles += 1
            tally.stops[how] += 1
            tally.stops_in_finals += finals
            print(f"cycle {tally.cycles}: {how} after {delay:.1f} s{' (in the finals)' if finals else ''}",
                  flush=True)  # fmt: skip
            continue
        _finished(proc, tally)
    final = unfinished_run(results)
    if final is not None:  # the last run, finished without a stop
        proc = tunectl("submit", "--resume", final, "--results", str(results))
        proc.wait(timeout=1800)
        _finished(proc, tally)
    for run_id in finished_runs(results):
        rows, lost, duplicated = check_run(results, run_id, args.spec)
        tally.add(rows, lost, duplicated)
        print(f"run {run_id}: {rows} rows, {lost} lost, {duplicated} duplicated", flush=True)
    return tally


def _finished(proc: subprocess.Popen[str], tally: Tally) -> None:
    """A driver that exited by itself: it must have exited 0."""
    out = proc.stdout.read() if proc.stdout else ""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    if proc.returncode != 0:
        tally.failures.append(f"exit {proc.returncode}: {out.strip().splitlines()[-1:]}")
        print(f"driver exited {proc.returncode}:\n{out}", flush=True)


def finished_runs(results: Path) -> list[str]:
    from tunectl.store.runs import summarise_runs

    return [r.info.run_id for r in summarise_runs(results) if r.state == "finished"]


def report(tally: Tally, args: argparse.Namespace, seconds: float) -> str:
    stops = ", ".join(f"{n} {how}" for how, n in sorted(tally.stops.items()))
    return "\n".join([
        "| cycles | stops | stops in the finals | runs checked | rows | lost | duplicated | wall |",
        "|---|---|---|---|---|---|---|---|",
        f"| {tally.cycles} | {stops} | {tally.stops_in_finals} | {tally.runs_checked} | {tally.rows} | "
        f"{tally.lost} | {tally.duplicated} | {seconds / 60:.0f} min |",
        "",
        f"spec {args.spec}, stop after {args.min_delay:g}-{args.max_delay:g} s (uniform), seed {args.seed}"
        + (f"; driver failures: {tally.failures}" if tally.failures else ""),
    ])  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=50)
    parser.add_argument("--spec", type=Path, default=ROOT / "configs" / "quickstart.toml")
    parser.add_argument("--min-delay", type=float, default=4.0, help="seconds after the driver starts")
    parser.add_argument("--max-delay", type=float, default=40.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--results", help="a directory to keep the results in (default: a temp dir)")
    parser.add_argument("--json", type=Path, help="also write the tally here")
    args = parser.parse_args()
    # Started as a background job, this process ignores SIGINT and so would every driver it starts: its
    # interrupt stops would do nothing. Caught here, SIGINT is back at its default in each driver.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    started = time.monotonic()
    tally = run(args)
    print(report(tally, args, time.monotonic() - started))
    if args.json:
        args.json.write_text(json.dumps(tally.__dict__, default=dict, indent=2))
    sys.exit(1 if tally.lost or tally.duplicated or tally.failures else 0)


if __name__ == "__main__":
    main()
