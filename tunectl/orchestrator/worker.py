"""The worker actor: owns one device (one GPU, or a GPU-less node's cores) and measures items on it.

Before and after each item the worker writes down, in a small journal on its node, what it is
running and what it is preparing in the background (and, inside a comparison, which arm it is
checking). If the process dies, the process Ray starts in
its place (same actor, same node) reads the journal and reports it with ``describe`` as its
predecessor's *last words*, so the driver knows which item killed it (``tunectl.orchestrator.blame``).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import secrets
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray

from tunectl.core.files import canonical_json
from tunectl.core.keys import key_text
from tunectl.core.plan import WorkItem
from tunectl.core.record import Record
from tunectl.core.spec import MeasureSpec
from tunectl.orchestrator.resident import Lease, differences, for_worker

#: exit status of a worker that leaves on purpose because its CUDA context is unusable
POISONED_EXIT_CODE = 70
JOURNAL_DIR = "tunectl-workers"
#: a folder: each worker profiles its calls (cProfile) and writes ``worker-PID.pstats`` there at the end
PROFILE_ENV = "TUNECTL_PROFILE"


def journal_path(actor_id: str) -> Path:
    return Path(tempfile.gettempdir()) / JOURNAL_DIR / f"{actor_id}.json"


@ray.remote(max_restarts=-1, max_task_retries=0)
class TuneWorker:
    """One per device. A crash restarts it (Ray); the driver decides what happens to the item.

    ``run`` calls execute one at a time, in the order they were sent; the dispatcher relies on it.
    """

    def __init__(
        self,
        num_threads: int,
        compile_ahead: bool = False,
        warm_up: tuple[str, ...] = (),
        uses: tuple[Any, ...] = (),
    ) -> None:
        began = time.perf_counter()
        self.startup: dict[str, Any] = {"process_s": _process_age_s()}  # before this constructor ran
        from tunectl.measure.runner import ItemRunner
        from tunectl.orchestrator.notes import install
        from tunectl.orchestrator.pipeline import CompileAheadRunner
        from tunectl.tasks.registry import get_task

        self.startup["imports_s"] = time.perf_counter() - began
        self.notes = install(output=True)  # warnings, library logs, prints: the run's log, not the console
        self.incarnation = secrets.token_hex(8)  # calls sent to an earlier process are not run by this one
        self.journal = journal_path(ray.get_runtime_context().get_actor_id() or f"pid-{os.getpid()}")
        self.last_words = _read_last_words(self.journal)
        self.notebook = Notebook(self.journal)
        runner_cls = CompileAheadRunner if compile_ahead else ItemRunner
        started = time.perf_counter()
        self.runner = runner_cls.for_process(bool(ray.get_gpu_ids()), num_threads)
        self.device = self.runner.device
        if self.device == "cpu":
            self.startup["threads"] = max(1, num_threads)  # what it times with (``cluster.cpu_threads``)
        self.compile_ahead = compile_ahead
        self.startup["device_s"] = time.perf_counter() - started
        libraries: dict[str, float] = {}
        for name in warm_up:  # before the first item: the driver sends work once this answers
            libraries.update(get_task(name).warm_up(self.device, [dict(c) for c in uses]))
        self.startup["libraries"] = libraries
        self.startup["total_s"] = self.startup["process_s"] + time.perf_counter() - began
        self.profile = _CallProfile.from_env()
        self.lease = Lease()  # which run holds this worker, where it is resident

    def describe(self) -> dict[str, Any]:
        """Where this worker runs, and its predecessor's last words (reported once)."""
        ctx = ray.get_runtime_context()
        words, self.last_words = self.last_words, None
        return {
            "node_id": ctx.get_node_id(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "device": self.device,
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "accelerator_ids": {k: list(v) for k, v in ctx.get_accelerator_ids().items()},
            "compile_ahead": self.compile_ahead,
            "last_words": words,
            "incarnation": self.incarnation,
            "startup": {**self.startup, **self.lease.summary()},
        }

    def claim(
        self, run_id: str, job: str, wants: dict[str, Any], take_from: str | None = None
    ) -> dict[str, Any]:
        """Take this resident worker for run ``run_id`` of driver job ``job``, where it was started as
        the run wants and no other run holds it (one held by driver job ``take_from``, which is gone,
        is taken over): what stood in the way, if anything, and where the worker runs
        (``tunectl.orchestrator.resident``)."""
        has = {"compile_ahead": self.compile_ahead, "threads": self.startup.get("threads")}
        has["env"] = {name: os.environ.get(name) or None for name in wants.get("env", {})}
        ctx = ray.get_runtime_context()
        differs = differences(for_worker(wants, int(ctx.get_assigned_resources().get("CPU", 1))), has)
        held_by = None if differs else self.lease.take(run_id, job, take_from)
        return {"node_id": ctx.get_node_id(), "differs": differs, "held_by": held_by}

    def settled(self) -> tuple[str, list[str]]:
        """This worker's node, and the compile keys whose build its compile cache settles for it
        (``tunectl.measure.build_memory.settled_here``): a resident worker asked by a run."""
        from tunectl.measure.build_memory import settled_here

        return ray.get_runtime_context().get_node_id(), settled_here(self.device)

    def release(self, run_id: str) -> list[Any]:
        """Give this resident worker back after run ``run_id``: it keeps its process, its libraries and
        the kernels it loaded, not the points it built (their memory would be short to the next run);
        what it noted on the side during the run."""
        notes = self.close()
        self.runner.let_go()
        self.lease.give_back(run_id)
        return notes

    def status(self) -> dict[str, Any]:
        """Where this worker runs, its start-up, and which run holds it (``tunectl workers list``)."""
        return {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "device": self.device,
            "startup": self.startup,
            **self.lease.summary(),
            "run": self.lease.run_id,
        }

    def run(
        self,
        run_id: str,
        item: WorkItem,
        settings: MeasureSpec,
        lookahead: WorkItem | None = None,
        incarnation: str = "",
    ) -> list[Record] | None:
        """Measure ``item``. ``lookahead`` is the item this worker gets next, if the dispatcher knows it.

        Returns None, doing nothing, for a call sent to an earlier process of this actor: Ray hands
        calls it had not yet delivered when a process died to the next one, but the driver has
        already given those items to other workers.
        """
        from tunectl.measure.runner import CudaContextPoisoned

        if incarnation and incarnation != self.incarnation:
            return None
        self.lease.hold(run_id)  # a process Ray restarted mid-run is still that run's
        preparing = self.runner.preparing() if self.compile_ahead else None  # type: ignore[attr-defined]
        if self.compile_ahead:
            self.runner.next_item = lookahead
            if lookahead is not None and lookahead.point == item.point:
                preparing = lookahead.item_id
        self._note(item.item_id, preparing)
        # In a batch, name the member being checked or timed: a death there is charged to it alone
        # (and, with compile-ahead, the member prepared beside it: the next one, or the lookahead).
        self.runner.on_member = self._member_notes(item, preparing) if item.members else _nothing
        if item.arms:  # name the arm being checked, so a death there is charged to that config alone
            self.runner.on_arm = lambda i: self._note(
                item.item_id, preparing, None if i is None else key_text(item.arms[i])
            )
        try:
            with self.profile:
                records = self.runner.run(run_id, item, settings)
        except CudaContextPoisoned:
            # Every later call on this context would fail: leave, and let Ray start a fresh process.
            os._exit(POISONED_EXIT_CODE)
        self._note(None, self.runner.preparing() if self.compile_ahead else None)  # type: ignore[attr-defined]
        return records

    def _member_notes(self, item: WorkItem, last: str | None) -> Callable[[str], None]:
        """What a batch notes as each member starts: it, and the item prepared beside it."""
        ids = [m.item_id for m in item.members]
        after = dict(itertools.pairwise(ids)) if self.compile_ahead else {}
        return lambda iid: self._note(iid, after.get(iid, last))

    def close(self) -> list[Any]:
        """Remove the journal (the run is over; nobody will ask for last words); what this process
        noted on the side (``tunectl.orchestrator.notes``)."""
        self.notebook.close()
        self.journal.unlink(missing_ok=True)
        self.profile.write(f"worker-{os.getpid()}")
        return self.notes.drain(f"worker pid {os.getpid()} on {socket.gethostname()} ({self.device})")

    def _note(self, running: str | None, preparing: str | None, arm: str | None = None) -> None:
        self.notebook.write(
            canonical_json({"pid": os.getpid(), "running": running, "preparing": preparing, "arm": arm})
        )


class Notebook:
    """The journal's writer: one file kept open and written in place, from its start, padded with
    spaces to the longest note so far (the JSON stays whole; a write is a single system call, which a
    killed process does not leave half done). A note costs microseconds, not a file's creation: a
    worker notes every member of every batch."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._longest = 0

    def write(self, note: str) -> None:
        data = note.encode()
        self._longest = max(self._longest, len(data))
        with contextlib.suppress(OSError):  # without a journal, blame falls back to Ray's order
            if self._fd is None:
                self.path.parent.mkdir(exist_ok=True)
                self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.pwrite(self._fd, data.ljust(self._longest), 0)

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


class _CallProfile:
    """cProfile around a worker's calls where ``TUNECTL_PROFILE`` names a folder (else it does nothing):
    where a call's time goes on the real device, in a real run (``benchmarks/costs/item_cost.py
    --stats`` reads the file)."""

    def __init__(self, folder: str) -> None:
        import cProfile

        self.folder = folder
        self.profile = cProfile.Profile() if folder else None

    @classmethod
    def from_env(cls) -> _CallProfile:
        return cls(os.environ.get(PROFILE_ENV, ""))

    def __enter__(self) -> None:
        if self.profile is not None:
            self.profile.enable()

    def __exit__(self, *_: object) -> None:
        if self.profile is not None:
            self.profile.disable()

    def write(self, name: str) -> None:
        if self.profile is not None:
            with contextlib.suppress(OSError):
                Path(self.folder).mkdir(parents=True, exist_ok=True)
                self.profile.dump_stats(str(Path(self.folder) / f"{name}.pstats"))


def _read_last_words(path: Path) -> dict[str, Any] | None:
    """What a dead predecessor of this actor was doing, if it wrote it down (then forget it)."""
    try:
        words = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    path.unlink(missing_ok=True)
    if not isinstance(words, dict) or words.get("pid") == os.getpid():
        return None
    return {"running": words.get("running"), "preparing": words.get("preparing"), "arm": words.get("arm")}


def _process_age_s() -> float:
    """Seconds since this process started (0.0 where the system does not say)."""
    try:
        import psutil

        return max(0.0, time.time() - psutil.Process().create_time())
    except Exception:  # psutil comes with Ray; without it the start-up is counted from the constructor
        return 0.0


def _nothing(*_: Any) -> None:
    return None
