"""A kernel its compiler rejected is remembered under the compile cache and not built again, by the
measuring worker or by a compile process; nothing else that fails is remembered. The stand-in
compiler of the fault-injection task is real; only its time is short."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_runner_reuse import Counted, _look
from tunectl.core.keys import make_key
from tunectl.core.record import Status
from tunectl.core.spec import MeasureSpec
from tunectl.measure import build_memory
from tunectl.measure.build_memory import RememberedFailure, compiler_rejected, failure_path, remembered
from tunectl.measure.runner import ItemRunner
from tunectl.tasks import fault_injection
from tunectl.tasks.base import InvalidConfig
from tunectl.tasks.compile import CACHE_ENV
from tunectl.tasks.registry import get_task

SETTINGS = MeasureSpec(warmup=1, min_samples=3, max_samples=5, max_seconds=0.1, drift="off")
REJECTED = {"compile_ms": 30, "compile_fault": "reject"}


class InductorError(RuntimeError):
    """Named as Inductor's error is, around the real cause."""


class OutOfMemoryError(RuntimeError):
    """Named as torch's is."""


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache" / "tunectl"))
    return tmp_path / "cache" / "tunectl"


def test_only_a_compilers_own_error_counts_as_a_rejection() -> None:
    def wrapped(cause: BaseException) -> InductorError:
        try:
            raise InductorError("SubprocException: An exception occurred in a subprocess") from cause
        except InductorError as exc:
            return exc

    assert compiler_rejected(fault_injection.CompilationError("at 194:23: inconsistent types"))
    assert compiler_rejected(wrapped(ValueError("int64 and int32"))), "Inductor's error around the cause"
    assert not compiler_rejected(wrapped(OutOfMemoryError("Tried to allocate 4.00 GiB"))), "memory is not"
    assert not compiler_rejected(InductorError("CUDA out of memory during autotuning")), "said in words"
    assert not compiler_rejected(RuntimeError("injected failure: this config raises"))


def test_a_rejected_build_is_remembered_and_not_built_again(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    task, shape = get_task("fault_injection"), {"n": 4}
    compiler = Counted(fault_injection._compile)
    monkeypatch.setattr(fault_injection, "_compile", compiler)
    with pytest.raises(fault_injection.CompilationError), remembered(task, {}, shape, REJECTED, "cpu"):
        task.prepare({}, shape, REJECTED, task.build_inputs({}, shape, "cpu"))
    path = failure_path(task, {}, shape, REJECTED, "cpu")
    assert path is not None and path.parent == cache / build_memory.FOLDER and path.is_file()

    said = r"rejected by its compiler in an earlier build.*rejects this kernel"
    with pytest.raises(RememberedFailure, match=said), remembered(task, {}, {"n": 64}, REJECTED, "cpu"):
        pytest.fail("built again")  # the same kernel: its key has no shape
    assert compiler.calls == 1
    other = {**REJECTED, "variant": 1}
    with remembered(task, {}, shape, other, "cpu"):
        pass  # another kernel is built as ever


def test_nothing_else_is_remembered(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    task, shape = get_task("fault_injection"), {"n": 4}
    raising = {"compile_ms": 30, "compile_fault": "raise"}
    with pytest.raises(RuntimeError), remembered(task, {}, shape, raising, "cpu"):
        task.prepare({}, shape, raising, task.build_inputs({}, shape, "cpu"))
    with (
        pytest.raises(fault_injection.CompilationError),
        remembered(task, {}, shape, REJECTED, "cpu", remember=False),
    ):
        raise fault_injection.CompilationError("at another point than the item's")
    assert not (cache / build_memory.FOLDER).exists(), "a plain error, or one told not to, is not remembered"
    monkeypatch.delenv(CACHE_ENV)
    assert failure_path(task, {}, shape, REJECTED, "cpu") is None, "no compile cache: nothing remembered"


def test_a_worker_does_not_build_again_what_a_worker_saw_rejected(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiler = Counted(fault_injection._compile)
    monkeypatch.setattr(fault_injection, "_compile", compiler)
    item = _look(make_key({"n": 64}), make_key(REJECTED), 0, 0.25)
    [first] = ItemRunner("cpu").run("r", item, SETTINGS)
    [again] = ItemRunner("cpu").run("r2", item, SETTINGS)  # a new worker process, the same cache
    assert first.status is Status.ERROR and "CompilationError: injected" in first.message
    assert again.status is Status.ERROR and "rejected by its compiler in an earlier build" in again.message
    assert compiler.calls == 1, "the second worker did not compile it"


def test_the_cache_settles_the_kernels_built_here_and_those_rejected_before(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a resident worker tells a run (``settled_here``): the compile keys of its builds that
    did not fail or that the kernel refused as invalid at their point, and of the rejections
    remembered for its libraries and device (by any process on the cache); not a build that failed
    otherwise, nor a remembered file another device's would be."""
    from tunectl.tasks.compile import compile_key

    monkeypatch.setattr(build_memory, "_SETTLED", set())
    task, shape = get_task("fault_injection"), {"n": 4}
    built, failing = {"compile_ms": 1, "variant": 7}, {"compile_ms": 1, "variant": 8}
    refused = {"compile_ms": 1, "variant": 9}
    with remembered(task, {}, shape, built, "cpu"):
        task.prepare({}, shape, built, task.build_inputs({}, shape, "cpu"))
    with pytest.raises(fault_injection.CompilationError), remembered(task, {}, shape, REJECTED, "cpu"):
        task.prepare({}, shape, REJECTED, task.build_inputs({}, shape, "cpu"))
    with pytest.raises(RuntimeError), remembered(task, {}, shape, failing, "cpu"):
        raise RuntimeError("injected failure: not the compiler's")
    with pytest.raises(InvalidConfig), remembered(task, {}, shape, refused, "cpu"):
        raise InvalidConfig("the kernel's own check refuses this point")  # as flash-attn-4's split-KV on SM90
    rejected = failure_path(task, {}, shape, REJECTED, "cpu")
    assert rejected is not None
    (rejected.parent / "elsewhere.txt").write_text(rejected.read_text())  # named for another device
    keys = [compile_key(task, {}, shape, c) for c in (built, REJECTED, refused)]
    assert build_memory.settled_here("cpu") == sorted(keys)
    with (
        pytest.raises(RememberedFailure, match=r"earlier build \(remove .*\): CompilationError"),
        remembered(task, {}, shape, REJECTED, "cpu"),
    ):
        pass  # the message as written, without the line that names the kernel
