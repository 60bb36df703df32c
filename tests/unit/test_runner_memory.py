"""A point's set-up that runs out of device memory held by other processes (compile processes building
beside the worker) waits for it and tries again, for a bounded time, instead of failing every item
of the point. The allocation failure is faked (this machine has no GPU); the waiting is the runner's."""

from __future__ import annotations

from typing import Any

import pytest

from tunectl.core.keys import make_key
from tunectl.core.plan import WorkItem
from tunectl.core.record import Status
from tunectl.core.spec import MeasureSpec
from tunectl.measure import memory
from tunectl.measure import runner as runner_module
from tunectl.measure.runner import ItemRunner
from tunectl.tasks.registry import get_task

SETTINGS = MeasureSpec(warmup=1, min_samples=3, max_samples=5, max_seconds=0.2)
SOME_HELD_ELSEWHERE = "CUDA out of memory. Tried to allocate 2.00 GiB. Process 10511 has 42.76 GiB"


def _torch_says(asked: str, free: str, ours: str, others: tuple[str, ...] = ("614.00 MiB",)) -> str:
    """torch's allocator's report of a failed request on an 80 GB H100 (the form its message takes),
    listing ``others``, the other processes' holdings."""
    listed = "".join(f" Process {5490 + i} has {held} memory in use." for i, held in enumerate(others))
    return (
        f"CUDA out of memory. Tried to allocate {asked}. GPU 0 has a total capacity of 79.18 GiB of which"
        f" {free} is free. Including non-PyTorch memory, this process has {ours} memory in use.{listed}"
        " Of the allocated memory 36.42 GiB is allocated by PyTorch"
    )


#: the decode spec's SDPA config at batch 64 x 32768 on an H100: other processes held 2.43 GiB
NEVER_FITS = _torch_says("16.00 GiB", "3.57 GiB", "73.18 GiB")


class OutOfMemoryError(RuntimeError):
    """Named as torch's: the runner tells a device allocation failure by its type's name."""


class ShortOfMemory:
    """The fault-injection task, whose inputs fail to allocate the first ``failures`` times."""

    def __init__(
        self, failures: int, error: type[Exception] = OutOfMemoryError, message: str = SOME_HELD_ELSEWHERE
    ) -> None:
        self.inner, self.failures, self.error, self.calls = get_task("fault_injection"), failures, error, 0
        self.message = message

    def build_inputs(self, static: Any, shape: Any, device: str) -> Any:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error(self.message)
        return self.inner.build_inputs(static, shape, device)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _run(task: ShortOfMemory, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[float]]:
    pauses: list[float] = []
    monkeypatch.setattr(runner_module.time, "sleep", pauses.append)
    runner = ItemRunner("cpu")
    runner._tasks["fault_injection"] = task  # type: ignore[assignment]
    item = WorkItem(
        "a", "fault_injection", make_key({}), make_key({"n": 64}), make_key({"fault": "none"}), True
    )
    [record] = runner.run("r", item, SETTINGS)
    return record, pauses


def test_a_point_waits_for_device_memory_others_hold_then_measures(monkeypatch: pytest.MonkeyPatch) -> None:
    task = ShortOfMemory(failures=3)
    record, pauses = _run(task, monkeypatch)
    assert record.status is Status.OK and record.median_us
    assert task.calls == 4 and pauses == [0.25, 0.5, 1.0]


def test_memory_that_never_frees_fails_the_item_after_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "MEMORY_WAIT_S", 5.0)
    task = ShortOfMemory(failures=1000)
    record, pauses = _run(task, monkeypatch)
    assert record.status is Status.ERROR and "OutOfMemoryError" in record.message
    assert pauses == [0.25, 0.5, 1.0, 2.0, 4.0] and task.calls == len(pauses) + 1


def test_other_failures_are_not_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    task = ShortOfMemory(failures=1, error=RuntimeError)
    record, pauses = _run(task, monkeypatch)
    assert record.status is Status.ERROR and pauses == [] and task.calls == 1


def test_a_set_up_out_of_memory_lets_the_kept_points_go_before_it_tries_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pauses: list[float] = []
    monkeypatch.setattr(runner_module.time, "sleep", pauses.append)
    task = ShortOfMemory(failures=0)
    runner = ItemRunner("cpu")
    runner._tasks["fault_injection"] = task  # type: ignore[assignment]

    def look(n: int) -> WorkItem:
        return WorkItem(
            f"a{n}", "fault_injection", make_key({}), make_key({"n": n}), make_key({"fault": "none"}), True
        )

    for n in (64, 128):
        runner.run("r", look(n), SETTINGS)
    assert len(runner._points) == 2
    task.failures = task.calls + 1  # the next point's inputs fail to allocate once
    [record] = runner.run("r", look(256), SETTINGS)
    assert record.status is Status.OK
    assert len(runner._points) == 1, "the points it kept were let go for the one it needs"
    assert pauses == [], "having let something go, it tried again at once"


def test_a_capture_out_of_memory_lets_the_kept_points_go_and_the_config_is_timed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pauses: list[float] = []
    monkeypatch.setattr(runner_module.time, "sleep", pauses.append)
    real, failures = runner_module.make_sampler, [1]

    def short_once(*args: Any, **kwargs: Any) -> Any:
        if failures and failures.pop():
            raise OutOfMemoryError("CUDA out of memory. Tried to allocate 16.00 GiB")
        return real(*args, **kwargs)

    runner = ItemRunner("cpu")
    configs = [make_key({"fault": "none", "variant": v}) for v in (1, 2)]
    for n, config in zip((64, 128), configs, strict=True):
        if n == 128:
            monkeypatch.setattr(runner_module, "make_sampler", short_once)
        item = WorkItem(f"b{n}", "fault_injection", make_key({}), make_key({"n": n}), config, False)
        [record] = runner.run("r", item, SETTINGS)
        assert record.status is Status.OK, record.message
    assert not failures and len(runner._points) == 1, "the other point let go, the one it is at kept"
    assert pauses == [], "having let something go, it tried again at once"


def test_a_first_call_out_of_memory_lets_the_kept_points_go_and_the_config_is_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pauses: list[float] = []
    monkeypatch.setattr(runner_module.time, "sleep", pauses.append)
    task, failures = ShortOfMemory(failures=0), [1]

    def prepare(static: Any, shape: Any, config: Any, inputs: Any) -> Any:
        fn = task.inner.prepare(static, shape, config, inputs)

        def call() -> Any:
            if failures and failures.pop():
                raise OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB")
            return fn()

        return call

    runner = ItemRunner("cpu")
    runner._tasks["fault_injection"] = task  # type: ignore[assignment]
    for n in (64, 128):
        if n == 128:
            monkeypatch.setattr(task, "prepare", prepare, raising=False)
        item = WorkItem(f"c{n}", "fault_injection", make_key({}), make_key({"n": n}), make_key({}), True)
        [record] = runner.run("r", item, SETTINGS)
        assert record.status is Status.OK, record.message
    assert not failures and len(runner._points) == 1, "the other point let go, the one it is at kept"
    assert pauses == [], "having let something go, it tried again at once"


def test_a_request_no_other_process_could_make_room_for_fails_now(monkeypatch: pytest.MonkeyPatch) -> None:
    task = ShortOfMemory(failures=1000, message=NEVER_FITS)
    record, pauses = _run(task, monkeypatch)
    assert record.status is Status.ERROR and "Tried to allocate 16.00 GiB" in record.message
    assert pauses == [] and task.calls == 1, "no wait: the others' 2.43 GiB and 3.57 GiB free are not 16"


def test_a_request_others_could_make_room_for_is_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    task = ShortOfMemory(failures=2, message=_torch_says("16.00 GiB", "3.57 GiB", "40.00 MiB"))
    record, pauses = _run(task, monkeypatch)
    assert record.status is Status.OK and pauses == [0.25, 0.5] and task.calls == 3


def test_a_request_beyond_others_lets_the_kept_points_go_and_tries_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pauses: list[float] = []
    monkeypatch.setattr(runner_module.time, "sleep", pauses.append)
    task = ShortOfMemory(failures=0, message=NEVER_FITS)
    runner = ItemRunner("cpu")
    runner._tasks["fault_injection"] = task  # type: ignore[assignment]
    for n in (64, 128, 256):
        if n == 256:
            task.failures = task.calls + 1  # this point's inputs fail once, as no wait would mend
        item = WorkItem(
            f"d{n}", "fault_injection", make_key({}), make_key({"n": n}), make_key({"fault": "none"}), True
        )
        [record] = runner.run("r", item, SETTINGS)
        assert record.status is Status.OK, record.message
    assert len(runner._points) == 1 and pauses == [], "what it kept went, and it tried again at once"


@pytest.mark.parametrize(
    ("asked", "free", "ours", "hopeless"),
    [
        ("16.00 GiB", "3.57 GiB", "73.18 GiB", True),  # others 2.43 GiB
        ("2.00 GiB", "3.57 GiB", "73.18 GiB", False),  # it was free: fragmentation, which waiting may mend
        ("512.00 MiB", "100.00 MiB", "78.70 GiB", True),  # others ~0.38 GiB
        ("512.00 MiB", "100.00 MiB", "70.00 GiB", False),  # others ~9 GiB
    ],
)
def test_beyond_others_reads_torchs_report(asked: str, free: str, ours: str, hopeless: bool) -> None:
    assert bool(memory.beyond_others(_torch_says(asked, free, ours))) is hopeless
    assert memory.beyond_others(SOME_HELD_ELSEWHERE) == "", "a report it cannot read is waited for"


def test_the_other_processes_contexts_are_not_waited_for() -> None:
    """On an H100, the worker holding 75.87 GiB asked 1 GiB with 0.88 free while four compile processes
    held their contexts alone (614 MiB each): a minute's wait, twice, in one run. With one of them
    holding a point's inputs, the request is waited for."""
    contexts = ("614.00 MiB", "614.00 MiB", "612.00 MiB", "614.00 MiB")
    why = memory.beyond_others(_torch_says("1024.00 MiB", "897.81 MiB", "75.87 GiB", contexts))
    assert why.startswith("it asks 1.00 GiB where 0.88 GiB is free and 4 other processes, contexts included,")
    building = ("614.00 MiB", "9.08 GiB", "612.00 MiB", "614.00 MiB")
    assert memory.beyond_others(_torch_says("1024.00 MiB", "897.81 MiB", "67.40 GiB", building)) == ""


def test_a_capture_beyond_others_lets_this_points_samplers_go_then_builds_them_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pauses: list[float] = []
    monkeypatch.setattr(runner_module.time, "sleep", pauses.append)
    real, failures, made = runner_module.make_sampler, [1], []

    def short_once(*args: Any, **kwargs: Any) -> Any:
        made.append(args[0])
        if len(made) == 2 and failures and failures.pop():  # the second config's capture
            raise OutOfMemoryError(NEVER_FITS)
        return real(*args, **kwargs)

    monkeypatch.setattr(runner_module, "make_sampler", short_once)
    runner = ItemRunner("cpu")
    configs = [make_key({"fault": "none", "variant": v}) for v in (1, 2, 1)]
    for n, config in enumerate(configs):
        item = WorkItem(f"e{n}", "fault_injection", make_key({}), make_key({"n": 64}), config, False)
        [record] = runner.run("r", item, SETTINGS)
        assert record.status is Status.OK, record.message
    assert not failures and pauses == [], "no other point was kept: this one's samplers went, at once"
    assert len(made) == 4, "the first config's sampler, let go, was built again for its second look"


def _waiting(
    monkeypatch: pytest.MonkeyPatch, free: Any, failures: list[Exception]
) -> tuple[Any, list[float]]:
    """A build that raises ``failures`` (the last first) and then succeeds, with the device's free memory
    read from ``free()``; and the list the waits' sleeps go to, instead of being slept."""
    sleeps: list[float] = []
    monkeypatch.setattr(memory.time, "sleep", sleeps.append)
    monkeypatch.setattr(memory, "release", lambda device: None)
    monkeypatch.setattr(memory, "free_bytes", lambda device: free())

    def build() -> str:
        if failures:
            raise failures.pop()
        return "built"

    return build, sleeps


def test_a_wait_tries_again_as_soon_as_the_request_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compile processes give back a point's inputs when they move on: the wait reads the device's free
    memory every ``POLL_S`` and tries again once the 13 GiB the request lacked have come free, not at its
    pause's end."""
    gib, reads = 2**30, []
    free = iter([3 * gib, 3 * gib, 3 * gib, 3 * gib, 16 * gib])  # the others let go before the fifth read
    failure = OutOfMemoryError(_torch_says("16.00 GiB", "3.00 GiB", "20.00 GiB"))
    build, sleeps = _waiting(monkeypatch, lambda: reads.append(1) or next(free), [failure])
    assert memory.when_memory_frees(build, "cuda:0") == "built"
    assert sleeps == [memory.POLL_S] * 3 and len(reads) == 5, "tried again at the first read that fits"


def test_the_failed_attempts_own_tensors_coming_back_are_not_a_reason_to_try_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The expanding config builds K (16 GiB), then fails to get V with 13.26 GiB free; letting go of K
    leaves 29.26 GiB free, more than asked, but only another process letting go makes V fit. On an
    H100 a wait that took those 29.26 GiB for room tried 20 times in 2 s and gave up before the others
    let go: each failed try must wait for more, and a wait ends by the seconds it really waited."""
    monkeypatch.setattr(memory, "MEMORY_WAIT_S", 5.0)
    failures = [OutOfMemoryError(_torch_says("16.00 GiB", "13.26 GiB", "29.12 GiB", ("36.78 GiB",)))] * 100
    build, sleeps = _waiting(monkeypatch, lambda: 29.26 * 2**30, failures)
    with pytest.raises(OutOfMemoryError):
        memory.when_memory_frees(build, "cuda:0")
    assert len(failures) == 100 - 6 and sum(sleeps) == pytest.approx(0.25 + 0.5 + 1 + 2 + 4)


def test_what_a_wait_logs_is_read_back_for_the_runs_console(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The console's line on memory (``tunectl.orchestrator.notes``) reads the lines a wait logs."""
    lacked = OutOfMemoryError(_torch_says("16.00 GiB", "3.00 GiB", "20.00 GiB", ("9.06 GiB",)))
    build, _ = _waiting(monkeypatch, lambda: 3 * 2**30, [OutOfMemoryError(NEVER_FITS), lacked, lacked])
    with caplog.at_level("WARNING", logger="tunectl.worker"), pytest.raises(OutOfMemoryError):
        memory.when_memory_frees(build, "cuda:0")
    said = [memory.logged(r.getMessage()) for r in caplog.records]
    assert said == [memory.Logged(0.25, False), memory.Logged(0.5, False), memory.Logged(0.0, True)]
    assert memory.logged("out of device memory, or not") is None


def test_a_wait_without_a_size_to_read_sleeps_its_whole_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    failures: list[Exception] = [OutOfMemoryError(SOME_HELD_ELSEWHERE), OutOfMemoryError(SOME_HELD_ELSEWHERE)]
    build, sleeps = _waiting(monkeypatch, lambda: pytest.fail("nothing to compare it with"), failures)
    assert memory.when_memory_frees(build, "cuda:0") == "built" and sleeps == [0.25, 0.5]


def test_a_request_that_failed_with_room_enough_sleeps_whole_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    """A request that failed with more free than it asked (a fragmented device) lacked nothing that
    another process could give: each wait is a whole pause, as before, never a busy loop."""
    monkeypatch.setattr(memory, "MEMORY_WAIT_S", 5.0)
    failures = [OutOfMemoryError(_torch_says("2.00 GiB", "3.00 GiB", "20.00 GiB"))] * 100
    build, sleeps = _waiting(monkeypatch, lambda: pytest.fail("nothing to wait for"), failures)
    with pytest.raises(OutOfMemoryError):
        memory.when_memory_frees(build, "cuda:0")
    assert len(failures) == 100 - 6 and sleeps == [0.25, 0.5, 1, 2, 4], "six tries, five whole pauses"
