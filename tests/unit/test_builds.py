"""Compile once per node, ahead, off the measuring path: compile keys, the build book and the work queue's
preference for built kernels. Whole runs whose compile processes build, fail, die and hang:
tests/integration/test_builds_on_ray.py; a real build in a compile process: tests/kernels/test_builder.py."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tunectl.core.keys import make_key
from tunectl.core.plan import WorkItem
from tunectl.orchestrator.compile_schedule import (
    CLAIMABLE,
    READY,
    SHARED,
    WAIT,
    BuildBook,
    BuildScheduler,
    compile_keys,
)
from tunectl.orchestrator.workqueue import WorkQueue
from tunectl.tasks.compile import compile_key
from tunectl.tasks.flash_decode import FlashDecode
from tunectl.tasks.flex_prefill import FlexPrefill

DECODE_STATIC = dict(
    dtype="bfloat16", num_q_heads=32, num_kv_heads=8, head_dim=128, page_size=128, causal=True,
    window=(-1, -1), softcap=0.0, sinks=False,
)  # fmt: skip


def item(n: int, variant: int, compile_ms: int = 100, **config: object) -> WorkItem:
    cfg = {"compile_ms": compile_ms, "variant": variant, **config}
    return WorkItem(
        f"i{n}-{variant}", "fault_injection", make_key({}), make_key({"n": n}), make_key(cfg), False
    )


# -- compile keys -----------------------------------------------------------------------------------


def test_flash_attn_4_builds_one_kernel_for_every_batch_and_length() -> None:
    task = FlashDecode()
    small = compile_key(task, DECODE_STATIC, {"batch": 1, "kv_len": 1024, "q_len": 1}, {"backend": "fa4"})
    large = compile_key(task, DECODE_STATIC, {"batch": 64, "kv_len": 32768, "q_len": 1}, {"backend": "fa4"})
    other = compile_key(task, DECODE_STATIC, {"batch": 1, "kv_len": 1024, "q_len": 1},
                        {"backend": "fa4", "pack_gqa": False})  # fmt: skip
    assert small is not None and small == large
    assert other not in (None, small), "a config option is part of the kernel"
    assert compile_key(task, {**DECODE_STATIC, "head_dim": 64}, {"batch": 1, "kv_len": 1024, "q_len": 1},
                       {"backend": "fa4"}) != small  # fmt: skip


def test_flex_compiles_per_static_shape_and_prebuilt_libraries_build_nothing() -> None:
    task = FlashDecode()
    a = {"batch": 1, "kv_len": 1024, "q_len": 1}
    b = {"batch": 4, "kv_len": 1024, "q_len": 1}
    assert compile_key(task, DECODE_STATIC, a, {"backend": "flex"}) != compile_key(
        task, DECODE_STATIC, b, {"backend": "flex"}
    )
    for backend in ("fa2", "fa3", "sdpa"):
        assert compile_key(task, DECODE_STATIC, a, {"backend": backend}) is None
    prefill = FlexPrefill()
    static = dict(dtype="bfloat16", num_q_heads=32, num_kv_heads=8, head_dim=128, mask="causal",
                  num_docs=1, window=(-1, -1))  # fmt: skip
    keys = {compile_key(prefill, static, {"batch": 2, "seq_len": s}, {"BLOCK_M": 64}) for s in (4096, 16384)}
    assert len(keys) == 2 and all(k and k.startswith("flex_prefill:") for k in keys)


def test_flash_attn_4_is_built_at_the_smallest_point_of_its_key() -> None:
    shape = FlashDecode().build_shape(DECODE_STATIC, {"batch": 64, "kv_len": 32768, "q_len": 1},
                                      {"backend": "fa4"})  # fmt: skip
    assert shape == {"batch": 1, "kv_len": 128, "q_len": 1}
    flex = FlashDecode().build_shape(DECODE_STATIC, {"batch": 64, "kv_len": 32768, "q_len": 1},
                                     {"backend": "flex"})  # fmt: skip
    assert flex == {"batch": 64, "kv_len": 32768, "q_len": 1}


def test_a_comparison_needs_the_kernel_of_each_arm() -> None:
    a, b = item(4, 0), item(4, 1)
    final = WorkItem("f", "fault_injection", a.static, a.shape, make_key({}), False, phase="final",
                     arms=(a.config, b.config, a.config), rounds=4)  # fmt: skip
    assert compile_keys(final) == {**compile_keys(a), **compile_keys(b)}
    assert list(compile_keys(final).values()) == [a.config, b.config], (
        "each arm's kernel, from its own config"
    )
    assert compile_keys(item(4, 0, compile_ms=0)) == {}, "no compile, nothing to build"


# -- the build book -----------------------------------------------------------------------------------


def test_a_comparison_names_the_arms_whose_kernel_failed_to_build() -> None:
    a, b, c = item(4, 0), item(4, 1), item(4, 2)
    final = WorkItem("f", "fault_injection", a.static, a.shape, a.config, True, phase="holdout",
                     arms=(a.config, b.config, c.config), rounds=4)  # fmt: skip
    book = book_for([final])
    keys = {config: key for key, config in compile_keys(final).items()}
    book.finished("node-a", keys[b.config], "invalid", 0.0, "not at this point")
    assert book.unbuilt_arms(final, "node-a") == [(1, "invalid", "not at this point")]
    assert book.failure(final, "node-a") == ("invalid", "not at this point")
    book.finished("node-a", keys[a.config], "compile_error", 0.0, "boom")
    assert [i for i, _, _ in book.unbuilt_arms(final, "node-a")] == [0, 1], "the baseline's too"
    assert book.unbuilt_arms(final, "node-b") == [], "another node's book is its own"


def book_for(items: list[WorkItem], scopes: tuple[str, ...] = ("node-a",)) -> BuildBook:
    book = BuildBook(compile_keys, scopes)
    book.add(items)
    return book


def test_each_kernel_is_built_once_in_the_order_items_want_it() -> None:
    items = [item(n, v) for n in (4, 8) for v in (0, 1)]  # 4 items, 2 kernels (the key has no shape)
    book = book_for(items)
    first, second = book.next_job("node-a"), book.next_job("node-a")
    assert first is not None and second is not None
    assert (first[1].config, second[1].config) == (items[0].config, items[1].config)
    assert book.next_job("node-a") is None, "two kernels, two builds"
    assert book.rank(items[2], "node-a") == WAIT, "a kernel being built is waited for, not compiled again"
    book.finished("node-a", first[0], "ok", 0.1)
    assert book.rank(items[2], "node-a") == READY
    assert book.counts() == (1, 2, 1)


def test_workers_wait_for_the_compile_processes_and_compile_themselves_only_without_any() -> None:
    items = [item(4, 0), item(4, 1), item(4, 2)]
    book = book_for(items)
    assert book.rank(items[0], "node-a") == WAIT, "a crashing compiler must never take down a GPU worker"
    assert book.rank(items[0], "node-a", building=False) == CLAIMABLE
    for taken in items[:2]:  # no compile process left: two workers compile for themselves
        book.taken(taken)
        book.claim(taken, "node-a")
    job = book.next_job("node-a")
    assert job is not None and job[1] is items[2], "claimed kernels are not built again"
    assert book.rank(items[0], "node-a", building=False) == WAIT, "another worker is compiling it"
    book.settled(items[0])
    assert book.rank(items[0], "node-a") == READY


def test_a_claim_lapses_when_its_worker_dies_and_the_item_is_queued_again() -> None:
    (one,) = items = [item(4, 0)]
    book = book_for(items)
    book.taken(one)
    book.claim(one, "node-a")
    assert book.next_job("node-a") is None
    book.returned(one)
    assert book.rank(one, "node-a", building=False) == CLAIMABLE
    assert book.next_job("node-a") is not None, "queued again, so worth building again"


def test_a_build_that_kills_two_compile_processes_is_a_compile_error_and_a_hang_a_timeout() -> None:
    crashing, hanging = item(4, 0), item(4, 1)
    book = book_for([crashing, hanging])
    key, _, _ = book.next_job("node-a") or ("", None, None)
    book.died("node-a", key, "SIGSEGV")
    assert book.failure(crashing, "node-a") is None and book.rank(crashing, "node-a") == WAIT
    assert book.next_job("node-a") is not None  # it is built again, on a fresh process
    book.died("node-a", key, "SIGSEGV")
    status, message = book.failure(crashing, "node-a") or ("", "")
    assert status == "compile_error" and "died" in message and "SIGSEGV" in message
    hang_key, _, _ = book.next_job("node-a") or ("", None, None)
    book.timed_out("node-a", hang_key, 30.0)
    assert book.failure(hanging, "node-a") == (
        "compile_timeout",
        "building this kernel took longer than 30 s; the compile process was killed",
    )
    assert book.rank(hanging, "node-a") == READY, "nothing to wait for: it is recorded, not run"


def test_nodes_build_different_kernels_first_and_a_shared_cache_builds_once_per_cluster() -> None:
    items = [item(4, v) for v in range(4)]
    book = book_for(items, ("node-a", "node-b"))
    a1, a2 = book.next_job("node-a", (0, 2)), book.next_job("node-a", (0, 2))
    b1 = book.next_job("node-b", (1, 2))
    assert a1 and a2 and b1 and (a1[1], a2[1], b1[1]) == (items[0], items[2], items[1])
    a3 = book.next_job("node-a", (0, 2))
    assert a3 is not None and a3[1] is items[1], "its own share done, a node helps with the rest"
    shared = book_for(items, (SHARED,))
    key, _, _ = shared.next_job(SHARED) or ("", None, None)
    shared.finished(SHARED, key, "ok", 1.0)
    assert shared.rank(items[0], SHARED) == READY


# -- the work queue -----------------------------------------------------------------------------------


def test_a_worker_takes_built_kernels_first_and_its_own_point_before_others() -> None:
    items = [item(n, v) for n in (4, 8) for v in (0, 1)]
    built = {items[1].item_id, items[2].item_id}
    queue = WorkQueue(items)

    def rank(i: WorkItem) -> int:
        return READY if i.item_id in built else CLAIMABLE

    assert queue.pop(items[0].point, set(), rank) is items[1], "its point's built item before the unbuilt one"
    assert queue.pop(items[0].point, set(), rank) is items[2], "a built item elsewhere before compiling"
    assert queue.pop(items[2].point, set(), rank) is items[3], "load balance: it compiles rather than idles"
    assert queue.pop(items[2].point, set(), rank) is items[0]
    assert len(queue) == 0


def test_a_worker_waits_rather_than_compile_a_kernel_being_built() -> None:
    items = [item(4, 0), item(8, 1)]
    queue = WorkQueue(items)
    building = {items[0].item_id}

    def rank(i: WorkItem) -> int:
        return WAIT if i.item_id in building else CLAIMABLE

    assert queue.pop(None, set(), rank) is items[1]
    assert queue.pop(None, set(), rank) is None, "only a kernel in the making is left: wait"
    building.clear()
    assert queue.pop(None, set(), rank) is items[0]


def test_a_lookahead_is_only_an_item_whose_kernel_is_built() -> None:
    items = [item(4, v) for v in (0, 1, 2)]
    queue = WorkQueue(items)
    built = {items[2].item_id}

    def rank(i: WorkItem) -> int:
        return READY if i.item_id in built else CLAIMABLE

    assert queue.pop_same_point(items[0].point, rank) is items[2], "the built one, past an unbuilt one"
    assert queue.pop_same_point(items[0].point, rank) is None, "none built: nothing is prepared ahead"
    assert queue.pop_same_point(items[0].point) is items[0], "without compile processes, the next in line"
    assert len(queue) == 1


def test_the_console_gets_the_failed_builds_counted_by_status_and_the_log_each_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import io
    import logging
    from types import SimpleNamespace

    from rich.console import Console

    from tunectl.cli.progress import _ConsoleLog
    from tunectl.orchestrator.compiling import note_builds
    from tunectl.orchestrator.notes import LOG_ONLY
    from tunectl.store.runs import RunInfo

    items = [item(4, v) for v in (0, 1, 2)]
    book = book_for(items)
    jobs = [book.next_job("node-a") for _ in items]
    for job, status in zip(jobs, ("ok", "invalid", "compile_error"), strict=True):
        assert job is not None
        book.finished("node-a", job[0], status, 0.1, "why")
    assert book.failures() == {"invalid": 1, "compile_error": 1}
    info = RunInfo("r1", "n", "fault_injection", "s.toml", "", "running", 3, 0.0, 0.0)
    with caplog.at_level(logging.INFO, logger="tunectl.run"):
        note_builds(info, SimpleNamespace(book=book), tmp_path)  # type: ignore[arg-type]
    assert "(not built: 1 compile_error, 1 invalid; `tunectl logs r1 --results" in caplog.text
    out = io.StringIO()
    console = _ConsoleLog(Console(file=out, force_terminal=False, width=200))
    run_log = logging.getLogger("tunectl.run")
    for extra in (LOG_ONLY, {}):
        console.handle(
            run_log.makeRecord("tunectl.run", logging.INFO, "f", 1, "built %s", ("x",), None, extra=extra)
        )
    assert out.getvalue().count("built x") == 1, "the event meant for the log alone is not on the console"


class Method:
    """An actor method of a fake compile process: each ``remote`` call a new reference, kept."""

    def __init__(self) -> None:
        self.refs: list[object] = []

    def remote(self, *args: object) -> object:
        self.refs.append(object())
        return self.refs[-1]


def test_a_build_whose_process_died_before_the_timeout_was_checked_is_a_death_not_a_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The news of a compile process's death can reach the driver after the build's timeout has
    passed; the answer already waiting decides, not the clock."""
    from ray import exceptions as rex

    from tunectl.orchestrator import compile_schedule

    class Actor:  # a compile process: what the scheduler calls on it
        build, describe = Method(), Method()

    def get(ref: object) -> object:
        if ref in Actor.describe.refs:
            return {"pid": 1, "host": "node-a", "device": "cpu"}
        raise rex.ActorDiedError()  # it died building the kernel

    def kill(*args: object, **kwargs: object) -> None:
        raise AssertionError("a process that died is not killed again")

    monkeypatch.setattr(compile_schedule.ray, "get", get)
    monkeypatch.setattr(compile_schedule.ray, "wait", lambda refs, timeout: (list(refs), []))
    monkeypatch.setattr(compile_schedule.ray, "kill", kill)
    exiting = item(4, 0)
    book = book_for([exiting])
    scheduler = BuildScheduler(book, [(Actor(), "node-a")], timeout_s=4.0)
    scheduler.on_ready(Actor.describe.refs[0])  # up: it gets the kernel to build
    assert Actor.build.refs, "the build was handed out"
    scheduler.check(time.monotonic() + 60.0)  # long past the timeout, its death already in
    assert book.failure(exiting, "node-a") is None, "not a compile_timeout: it is built again"
    assert book.rank(exiting, "node-a") == WAIT


def test_a_compile_process_with_nothing_left_to_build_is_told_to_let_its_point_go(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A compile process keeps its last point's inputs between builds (on a GPU host, up to the
    largest point's KV cache on the measuring workers' device); once its scope has nothing pending it
    is told so, once, and again only after it has built since."""
    from tunectl.orchestrator import compile_schedule
    from tunectl.orchestrator.compile_process import BuildResult

    class Actor:  # a compile process: what the scheduler calls on it
        build, describe, idle = Method(), Method(), Method()

    def get(ref: object) -> object:
        if ref in Actor.describe.refs:
            return {"pid": 1, "host": "node-a", "device": "cpu"}
        return BuildResult("k", "ok", 0.1)

    monkeypatch.setattr(compile_schedule.ray, "get", get)
    book = book_for([item(4, 0)])
    scheduler = BuildScheduler(book, [(Actor(), "node-a")], timeout_s=60.0)
    scheduler.on_ready(Actor.describe.refs[0])
    assert len(Actor.build.refs) == 1 and not Actor.idle.refs, "busy: not idle"
    scheduler.on_ready(Actor.build.refs[0])  # built; nothing else pending
    scheduler.pump()
    assert len(Actor.idle.refs) == 1, "told once, however often the scheduler looks"
    book.add([item(8, 1)])  # the search draws a new point with a kernel of its own
    scheduler.pump()
    scheduler.on_ready(Actor.build.refs[1])
    assert len(Actor.build.refs) == 2 and len(Actor.idle.refs) == 2, "built again, idle again"


def test_kernels_resident_workers_built_in_earlier_runs_are_not_built_again_nor_waited_for() -> None:
    """A resident worker tells the run which kernels it built into its node's cache before
    (``Pool.settled``): on that node (or anywhere, with a shared cache) they are built from the start,
    so its items are ready at once and no compile process is handed them."""
    from tunectl.orchestrator.cluster import Pool
    from tunectl.orchestrator.compiling import settled_before

    items = [item(4, 0), item(4, 1)]
    kept = next(iter(compile_keys(items[0])))
    pools = [Pool("GPU", node_ids={"node-a"}, settled={"node-a": {kept}}), Pool("CPU", node_ids={"node-b"})]
    known = settled_before(pools)
    assert known == {"node-a": {kept}, SHARED: {kept}}
    book = BuildBook(compile_keys, ("node-a", "node-b"), known)
    book.add(items)
    assert book.rank(items[0], "node-a") == READY, "built there in an earlier run"
    assert book.rank(items[0], "node-b") == WAIT, "another node's cache does not have it"
    job = book.next_job("node-a")
    assert job is not None and job[1] is items[1] and book.next_job("node-a") is None
    assert book.counts() == (1, 4, 1), "one kept, one being built, two pending on node-b"


def test_a_run_starts_compile_processes_unless_its_first_kernels_are_settled_on_every_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``start_builds``: none where every kernel of the lanes' first items is settled for the
    resident workers of every node the run measures on (anywhere, with a shared cache)."""
    from tunectl.orchestrator import compiling
    from tunectl.orchestrator.cluster import Pool, WorkerSetup
    from tunectl.orchestrator.control import CompileOptions
    from tunectl.orchestrator.feed import Lane
    from tunectl.store.runs import RunInfo

    items = [item(4, 0), item(4, 1)]
    keys = {key for i in items for key in compile_keys(i)}
    started: list[int] = []
    monkeypatch.setattr(compiling.resident, "ask_settled", lambda pools: None)
    monkeypatch.setattr(compiling, "_builders", lambda pools, options, setup: started.append(1) or [])
    info = RunInfo("r", "n", "fault_injection", "s.toml", "", "running", 2, 0.0, 0.0)
    lanes = [Lane("GPU", (), None, tuple(items))]  # type: ignore[arg-type]

    def builds(settled: dict[str, set[str]], shared: bool = False) -> bool:
        started.clear()
        pools = [Pool("GPU", node_ids=set(settled), held_for="r", settled=settled)]
        options = CompileOptions(2, "/tmp/c", shared)
        setup = WorkerSetup()
        compiling.start_builds(lanes, pools, info=info, options=options, setup=setup, on_compiles=print)
        return bool(started)

    assert not builds({"a": keys}), "all settled on its one node: no compile process"
    assert builds({"a": keys - {min(keys)}}), "one kernel not settled"
    assert builds({"a": keys, "b": set()}), "another node's cache has none of them"
    assert not builds({"a": keys, "b": set()}, shared=True), "one cache for the cluster"
