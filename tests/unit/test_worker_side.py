"""What a worker keeps on its side: the journal of what it is running (its last words if it dies), and
a profile of its calls where TUNECTL_PROFILE names a folder."""

from __future__ import annotations

import pstats
from pathlib import Path

import pytest


def _busy() -> int:
    return sum(i * i for i in range(20000))


def test_a_profile_covers_the_calls_and_is_written_at_the_end(tmp_path: Path) -> None:
    from tunectl.orchestrator.worker import _CallProfile

    profile = _CallProfile(str(tmp_path / "prof"))
    with profile:
        _busy()
    _busy()  # outside a call: not profiled
    profile.write("worker-1")
    stats = pstats.Stats(str(tmp_path / "prof" / "worker-1.pstats"))
    calls = {func: row[1] for (_, _, func), row in stats.stats.items()}  # type: ignore[attr-defined]
    assert calls["_busy"] == 1


def test_without_the_variable_nothing_is_profiled_or_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tunectl.orchestrator.worker import PROFILE_ENV, _CallProfile

    monkeypatch.delenv(PROFILE_ENV, raising=False)
    profile = _CallProfile.from_env()
    with profile:
        _busy()
    profile.write("worker-1")
    assert profile.profile is None and not list(tmp_path.iterdir())


def test_the_runs_workers_are_started_with_the_profile_folder_and_allocator_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from tunectl.orchestrator.compiling import worker_setup
    from tunectl.orchestrator.control import CompileOptions
    from tunectl.orchestrator.worker import PROFILE_ENV
    from tunectl.tasks.env import ALLOC_CONF_ENV

    monkeypatch.setenv(PROFILE_ENV, str(tmp_path))
    monkeypatch.setenv(ALLOC_CONF_ENV, "expandable_segments:True")
    env = dict(worker_setup(CompileOptions(), "quickstart_attention", False).runtime_env()["env_vars"])
    assert env[PROFILE_ENV] == str(tmp_path) and env[ALLOC_CONF_ENV] == "expandable_segments:True"
    monkeypatch.delenv(PROFILE_ENV)
    monkeypatch.delenv(ALLOC_CONF_ENV)
    env = dict(worker_setup(CompileOptions(), "quickstart_attention", False).runtime_env()["env_vars"])
    assert PROFILE_ENV not in env and ALLOC_CONF_ENV not in env


def test_the_journal_holds_the_latest_note_whole_after_longer_and_shorter_ones(tmp_path: Path) -> None:
    import json
    import os

    from tunectl.orchestrator.worker import Notebook, _read_last_words

    path = tmp_path / "journal" / "actor"
    book = Notebook(path)
    long = {"pid": os.getpid() + 1, "running": "item-" + "x" * 40, "preparing": "next", "arm": None}
    short = {"pid": os.getpid() + 1, "running": "b", "preparing": None, "arm": None}
    book.write(json.dumps(long))
    book.write(json.dumps(short))
    assert json.loads(path.read_text()) == short  # padded with spaces, never a tail of the longer note
    assert _read_last_words(path) == {"running": "b", "preparing": None, "arm": None}
    assert not path.exists()  # read once, then forgotten
    book.close()


def test_a_decode_worker_imports_only_the_libraries_of_the_backends_the_run_measures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tunectl.tasks import flash_decode

    imported: list[tuple[str, ...]] = []
    monkeypatch.setattr(flash_decode, "warm_up_libraries", lambda modules: imported.append(modules) or {})
    task = flash_decode.FlashDecode()
    task.warm_up("cuda:0", [{"backend": "fa3", "num_splits": 8}, {"backend": "triton"}, {"backend": "sdpa"}])
    task.warm_up("cuda:0")  # no configs given: every backend's library, as before
    assert task.warm_up("cpu", [{"backend": "fa4"}]) == {}
    assert imported[0] == ("flash_attn_interface", "tunectl.tasks._triton_decode")
    assert set(imported[1]) >= {"flash_attn.cute", "flashinfer", "flash_attn", "torch._inductor.compile_fx"}


def test_a_submitted_run_starts_its_workers_with_the_plans_configs() -> None:
    from tunectl.core.plan import plan
    from tunectl.core.spec import load_spec
    from tunectl.orchestrator.compiling import worker_setup
    from tunectl.orchestrator.control import CompileOptions

    spec = load_spec("configs/lightllm/flash_decode.toml")  # flash-attn 3 only, its own default too
    setup = worker_setup(CompileOptions(), spec.task, False, plan(spec).all_configs)
    assert {dict(c)["backend"] for c in setup.uses} == {"fa3"}
    shipped = plan(load_spec("configs/h200/flash_decode.toml")).all_configs
    assert {dict(c)["backend"] for c in shipped} == {
        "fa4",
        "fa2",
        "fa3",
        "sdpa",
        "flex",
        "flashinfer",
        "triton",
    }


def test_a_gpu_rows_environment_records_the_allocator_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """The device is faked (this machine has none); what the environment records of it is real."""
    import types

    import torch

    from tunectl.tasks import env as env_module

    props = types.SimpleNamespace(name="NVIDIA H100 80GB HBM3", major=9, minor=0, multi_processor_count=132)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    monkeypatch.setattr(env_module, "_driver_version", lambda: "580.159.04")
    monkeypatch.setenv(env_module.ALLOC_CONF_ENV, "expandable_segments:True")
    found = env_module.environment.__wrapped__("cuda:0")
    assert (
        found["device_name"] == "NVIDIA H100 80GB HBM3"
        and found["cuda_alloc_conf"] == "expandable_segments:True"
    )
    monkeypatch.delenv(env_module.ALLOC_CONF_ENV)
    assert "cuda_alloc_conf" not in env_module.environment.__wrapped__("cuda:0")
