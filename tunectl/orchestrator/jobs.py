"""Runs submitted as Ray jobs (the Job Submission API): the driver runs on the cluster.

A job runs ``tunectl submit`` on the cluster with the run id chosen here, so the run and its job
are found by the same id: the job's submission id is the run id (a resumed run's job adds a
suffix) and its metadata names the run. The spec travels as the job's working directory. The
results directory is a path on the cluster (the node the driver runs on, or a shared volume).

Token authentication: the Job Submission client sends the token when ``RAY_AUTH_MODE=token`` and
the token is in ``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``; the token is
never put into a job, its metadata or an error message.
"""

from __future__ import annotations

import asyncio
import secrets
import shlex
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunectl.core.errors import TunectlError, UserError
from tunectl.core.spec import load_spec
from tunectl.store.runs import new_run_id

RUN_METADATA_KEY = "tunectl_run"
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
_AUTH_HELP = (
    "the cluster refused the request: it uses token authentication. Set RAY_AUTH_MODE=token and give "
    "the cluster's token in RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token "
    "(`ray get-auth-token` on the head prints it)"
)


@dataclass(frozen=True)
class JobRef:
    run_id: str
    submission_id: str
    address: str


def dashboard_address(address: str | None) -> str:
    """``http://head:8265`` from what a user may type (``head:8265``); ray:// addresses are refused."""
    if not address:
        raise UserError("give the cluster's dashboard address with --address http://HEAD:8265")
    if address.startswith("ray://"):
        raise UserError(
            f"{address} is a Ray Client address; jobs go to the dashboard: --address http://HEAD:8265"
        )
    return address if "://" in address else f"http://{address}"


def client(address: str | None) -> Any:
    """A Job Submission client for the cluster at ``address``; errors become one clear line."""
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    from tunectl.orchestrator.reach import check_reachable, connect_timeout_s

    url = dashboard_address(address)
    check_reachable(url, connect_timeout_s())  # the client itself retries an unreachable host for minutes
    try:
        return JobSubmissionClient(url)
    except AuthenticationError:
        raise TunectlError(_AUTH_HELP) from None
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise TunectlError(f"cannot reach the Ray dashboard at {url}: {_first_line(exc)}") from None


def submit_job(
    address: str | None,
    spec_path: str | None,
    results: str,
    *,
    resume: str | None = None,
    compile_ahead: bool | None = None,
    extra_args: Sequence[str] = (),
) -> JobRef:
    """Submit ``tunectl submit`` as a job: a new run of ``spec_path``, or the rest of run ``resume``."""
    if not Path(results).is_absolute() and "://" not in results:
        raise UserError(
            f"with --job, --results is a directory on the cluster; give an absolute path, not {results!r}"
        )
    if resume is None:
        if spec_path is None:
            raise UserError("give a SPEC file, or --resume RUN_ID")
        load_spec(spec_path)  # a bad spec fails here, not minutes later on the cluster
    run_id = resume or new_run_id()
    args = ["tunectl", "submit"]
    args += ["--resume", run_id] if resume else [Path(spec_path or "").name, "--run-id", run_id]
    args += ["--results", results]
    if compile_ahead is not None:
        args.append("--compile-ahead" if compile_ahead else "--no-compile-ahead")
    args += list(extra_args)
    submission_id = run_id if resume is None else f"{run_id}-resume-{secrets.token_hex(3)}"
    jobs = client(address)
    with tempfile.TemporaryDirectory(prefix="tunectl-job-") as tmp:
        runtime_env = None
        if spec_path is not None and resume is None:
            shutil.copy(spec_path, Path(tmp) / Path(spec_path).name)
            runtime_env = {"working_dir": tmp}
        _call(
            jobs.submit_job,
            entrypoint=shlex.join(args),
            submission_id=submission_id,
            runtime_env=runtime_env,
            metadata={RUN_METADATA_KEY: run_id},
        )
    return JobRef(run_id, submission_id, dashboard_address(address))


def find_job(jobs: Any, run_id: str) -> str:
    """The submission id of the latest job of ``run_id``."""
    mine = [j for j in _call(jobs.list_jobs) if (j.metadata or {}).get(RUN_METADATA_KEY) == run_id]
    if not mine:
        raise UserError(f"no job of run {run_id} on this cluster")
    return str(max(mine, key=lambda j: j.start_time or 0).submission_id)


def job_logs(address: str | None, run_id: str) -> str:
    jobs = client(address)
    return str(_call(jobs.get_job_logs, find_job(jobs, run_id)))


def follow_job_logs(address: str | None, run_id: str, write: Callable[[str], None]) -> str:
    """Write the job's log as it grows until the job ends; return its final status."""
    jobs = client(address)
    submission_id = find_job(jobs, run_id)

    async def tail() -> None:
        async for chunk in jobs.tail_job_logs(submission_id):
            write(chunk)

    try:
        asyncio.run(tail())
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # the log stream broke; the job itself may still run
        raise TunectlError(f"lost the log stream of run {run_id}: {_first_line(exc)}") from None
    return str(_call(jobs.get_job_status, submission_id).value)


def cancel_job(address: str | None, run_id: str, wait_s: float = 20.0) -> str:
    """Stop the run's job (its driver records what it has and stops); return the job's status."""
    jobs = client(address)
    submission_id = find_job(jobs, run_id)
    _call(jobs.stop_job, submission_id)
    deadline = time.monotonic() + wait_s
    status = str(_call(jobs.get_job_status, submission_id).value)
    while status not in TERMINAL and time.monotonic() < deadline:
        time.sleep(0.2)
        status = str(_call(jobs.get_job_status, submission_id).value)
    return status


def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    from ray.exceptions import AuthenticationError

    try:
        return fn(*args, **kwargs)
    except AuthenticationError:
        raise TunectlError(_AUTH_HELP) from None
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise TunectlError(f"the Ray job API failed: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return lines[0] if lines else type(exc).__name__
