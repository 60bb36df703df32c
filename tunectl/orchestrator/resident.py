"""Resident workers: one per GPU of a cluster, started once and kept between runs.

A run that starts its own workers pays each one's start-up, a CUDA context and the kernel libraries
(20-24 s on an H100 for the decode spec), before its first measurement, and its driver's local Ray
instance besides. On a cluster that tunes again and again, ``tunectl workers up SPEC --address A``
starts them once, detached from any driver: named actors of the ``tunectl`` namespace, held by
placement groups named alike (``tunectl.orchestrator.cluster.resident_name``). A run that joins the
cluster finds them and measures on them at once; when it ends it gives them back (``release``),
keeping their processes, libraries and what they built; ``tunectl workers down`` stops them.

A run takes a pool's resident workers only where (1) they were started as the run would start its
own (the compile caches, the forwarded environment, compile-ahead, a CPU worker's threads): where
not, the run is refused in one line, since they hold the GPUs it would need; and (2) no other run
holds them (``Lease``): a holder whose driver job has ended (a driver killed outright gives nothing
back) is taken over; a live one refuses the run.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

import ray

from tunectl.core.errors import UserError
from tunectl.orchestrator.cluster import (
    CPU_POOL,
    NAMESPACE,
    RESIDENT_PREFIX,
    Pool,
    WorkerSetup,
    cpu_threads,
    resident_name,
    start_pools,
)
from tunectl.orchestrator.notes import Note
from tunectl.tasks.compile import CACHE_ENV, PASSED_ON, cache_env

#: how long a run waits for resident workers to answer its claim (one Ray is restarting comes back
#: after its start-up)
CLAIM_TIMEOUT_S = 300.0
_DOWN = "`tunectl workers down --address ADDRESS` stops them"


@dataclass
class Lease:
    """Which run holds a resident worker, and how many runs it has served (kept by the worker)."""

    run_id: str | None = None
    job: str | None = None
    runs: int = 0
    ready_at: float = field(default_factory=time.time)

    def take(self, run_id: str, job: str, take_from: str | None = None) -> dict[str, str] | None:
        """Hold the worker for ``run_id`` unless another run holds it (one of driver job
        ``take_from`` is taken over); that holder, else None."""
        if self.run_id not in (None, run_id) and (take_from is None or self.job != take_from):
            return {"run": self.run_id or "", "job": self.job or ""}
        if self.run_id != run_id:
            self.runs += 1
        self.run_id, self.job = run_id, job
        return None

    def hold(self, run_id: str) -> None:
        """A call of ``run_id`` arrived: it holds the worker if nobody does (a process that Ray
        restarted mid-run has forgotten its holder)."""
        if self.run_id is None:
            self.run_id = run_id

    def give_back(self, run_id: str) -> None:
        if self.run_id == run_id:
            self.run_id = self.job = None

    def summary(self) -> dict[str, Any]:
        """For a worker that has served runs: how many, and since when it is up (else nothing)."""
        return {"resident": {"runs": self.runs, "up_s": time.time() - self.ready_at}} if self.runs else {}


def differences(wants: Mapping[str, Any], has: Mapping[str, Any]) -> str | None:
    """What a resident worker ``has`` that is not what the run ``wants`` (its environment compared
    name by name), in words; None where they agree."""
    lines = [
        f"{k} {has.get(k)!r} (this run: {v!r})" for k, v in wants.items() if k != "env" and has.get(k) != v
    ]
    env, wanted = has.get("env", {}), wants.get("env", {})
    differ = [n for n, v in wanted.items() if env.get(n) != v]
    caches = set(cache_env("")) - set(PASSED_ON)  # one compile cache's variables: said as its root
    if CACHE_ENV in differ:
        lines.append(
            f"the compile cache {_root(env.get(CACHE_ENV))!r} (this run: {_root(wanted[CACHE_ENV])!r})"
        )
        differ = [n for n in differ if n not in caches]
    lines += [f"{n}={env.get(n)!r} (this run: {wanted[n]!r})" for n in differ]
    return "; ".join(lines) or None


def _root(cache: str | None) -> str | None:
    """The compile cache root a process's ``TUNECTL_COMPILE_CACHE`` lies in (``cache_env``)."""
    return None if cache is None else str(PurePath(cache).parent)


def wants(setup: WorkerSetup, pool: str) -> dict[str, Any]:
    """What a run asks of a resident worker of ``pool`` (``differences``): the environment it would
    start its own with, the forwarded names it does not set included (as unset)."""
    env: dict[str, str | None] = {name: None for name in setup.forwarded}
    env.update(dict(setup.env))
    out: dict[str, Any] = {"compile_ahead": setup.compile_ahead, "env": env}
    if pool == CPU_POOL:
        out["threads_asked"] = setup.cpu_threads
    return out


def for_worker(asked: Mapping[str, Any], cpus: int) -> dict[str, Any]:
    """What a run ``asked`` (``wants``) as a worker holding ``cpus`` cores would have been started
    with: the threads a CPU worker times with, from the cores it holds (``cluster.cpu_threads``)."""
    out = {k: v for k, v in asked.items() if k != "threads_asked"}
    if "threads_asked" in asked:
        out["threads"] = cpu_threads(cpus, asked["threads_asked"])
    return out


def listed() -> dict[str, list[Any]]:
    """The cluster's resident workers by pool, each pool's in order (no entries: none are up)."""
    names: dict[str, list[tuple[int, str]]] = {}
    for actor in ray.util.list_named_actors(all_namespaces=True):
        name = str(actor.get("name", ""))
        if actor.get("namespace") != NAMESPACE or not name.startswith(RESIDENT_PREFIX + "-"):
            continue
        pool, _, index = name[len(RESIDENT_PREFIX) + 1 :].rpartition("-")
        if pool and index.isdigit():
            names.setdefault(pool, []).append((int(index), name))
    return {
        pool: [ray.get_actor(name, namespace=NAMESPACE) for _, name in sorted(found)]
        for pool, found in names.items()
    }


def take(names: Sequence[str], num_gpus: int | None, setup: WorkerSetup, run_id: str) -> list[Pool]:
    """The pools of ``names`` that have resident workers, held for run ``run_id`` (at most
    ``num_gpus`` workers each; the run starts its own for the other pools). ``UserError`` where they
    are not this run's to take (module doc); then nothing is held."""
    found = listed()
    job = ray.get_runtime_context().get_job_id() if found else ""
    pools = [Pool(n, workers=found[n][: num_gpus or None], held_for=run_id) for n in names if n in found]
    try:
        for pool in pools:
            _claim(pool, wants(setup, pool.name), job)
    except BaseException:
        release(pools)
        raise
    return pools


def _claim(pool: Pool, asked: dict[str, Any], job: str) -> None:
    """Hold each of ``pool``'s workers for its run, taking over from a holder whose driver is gone;
    the nodes they run on into ``pool``."""
    run = pool.held_for or ""
    answers = _answers([w.claim.remote(run, job, asked) for w in pool.workers])
    for index, answer in enumerate(answers):
        if answer["differs"]:
            raise UserError(
                f"the cluster's resident {pool.name} workers were started otherwise than this run would "
                f"start its own: {answer['differs']}; {_DOWN}, or run as they were started"
            )
        holder = answer["held_by"]
        if holder and _job_ended(holder["job"]):
            answers[index] = _answers([pool.workers[index].claim.remote(run, job, asked, holder["job"])])[0]
            holder = answers[index]["held_by"]
        if holder:
            raise UserError(
                f"the cluster's resident {pool.name} workers are measuring run {holder['run']} of another "
                f"driver; wait for it to end, or cancel it (`tunectl cancel {holder['run']}`)"
            )
    pool.node_ids = {a["node_id"] for a in answers}


def ask_settled(pools: Sequence[Pool]) -> None:
    """The kernels (compile keys) whose build the compile cache of each resident worker's node
    settles for it (``TuneWorker.settled``), into ``Pool.settled``: none for a compile process."""
    for pool in (p for p in pools if p.held_for):
        for node, found in _answers([w.settled.remote() for w in pool.workers]):
            pool.settled.setdefault(node, set()).update(found)


def _answers(refs: list[Any]) -> list[Any]:
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=CLAIM_TIMEOUT_S)
    if len(ready) < len(refs):
        raise UserError(
            f"the cluster's resident workers did not answer within {CLAIM_TIMEOUT_S:.0f} s; {_DOWN}"
        )
    return list(ray.get(refs))


def _job_ended(job: str) -> bool:
    """Whether Ray knows driver job ``job`` has ended (where it cannot say: not known to have)."""
    with contextlib.suppress(Exception):  # Ray's job table is not a public interface
        from ray._private import state

        return any(j.get("JobID") == job and j.get("IsDead") for j in state.jobs())
    return False


def release(pools: Sequence[Pool]) -> list[Note]:
    """Give back what ``pools``' run held of them (``TuneWorker.release``); their notes."""
    from tunectl.orchestrator.notes import drained

    notes: list[Note] = []
    for pool in pools:
        if pool.held_for:
            run = pool.held_for
            notes += drained(pool.workers, lambda w: w.release.remote(run))  # noqa: B023 (called at once)
    return notes


def up(names: Sequence[str], num_gpus: int | None, setup: WorkerSetup) -> dict[str, list[dict[str, Any]]]:
    """Start resident workers for the pools ``names`` (at most ``num_gpus`` each) and wait until each
    has started: their ``status``. ``UserError`` where some are up already."""
    found = listed()
    if found:
        count = sum(len(w) for w in found.values())
        raise UserError(f"{count} resident worker(s) are up already on {', '.join(sorted(found))}; {_DOWN}")
    pools, _ = start_pools(names, num_gpus, setup, resident=True)
    return {p.name: list(ray.get([w.status.remote() for w in p.workers])) for p in pools}


def statuses() -> dict[str, list[dict[str, Any]]]:
    """Each resident worker's ``status``, by pool (one that does not answer within 10 s: its error)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for pool, workers in listed().items():
        refs = [w.status.remote() for w in workers]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=10.0)
        out[pool] = [_answer(ref) if ref in ready else {"error": "no answer within 10 s"} for ref in refs]
    return out


def _answer(ref: Any) -> dict[str, Any]:
    try:
        return dict(ray.get(ref))
    except Exception as exc:  # a worker gone or restarting: said, not raised
        return {"error": str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}


def down(force: bool = False) -> int:
    """Stop every resident worker and give their GPUs back: how many there were. ``UserError``, with
    nothing stopped, where a run is measuring on them, unless ``force``."""
    from ray.util.placement_group import get_placement_group, remove_placement_group

    found = listed()
    busy = sorted({s["run"] for pool in statuses().values() for s in pool if s.get("run")})
    if busy and not force:
        raise UserError(
            f"run(s) {', '.join(busy)} are measuring on the resident workers; cancel them first "
            "(`tunectl cancel RUN`), or stop the workers anyway with --force"
        )
    for pool, workers in found.items():
        for worker in workers:
            with contextlib.suppress(Exception):  # gone already
                ray.kill(worker, no_restart=True)
        with contextlib.suppress(Exception):  # a CPU pool has no group; a group removed already
            remove_placement_group(get_placement_group(resident_name(pool)))
    return sum(len(w) for w in found.values())
