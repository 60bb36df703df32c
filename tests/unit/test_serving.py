"""The serving side: a light install, the example server, and the image that ships it."""

from __future__ import annotations

import email
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tunectl.core.keys import make_key
from tunectl.runtime import Entry
from tunectl.store.bundle import LocalStore, TaskTable, build_files, promote, publish_local

ROOT = Path(__file__).resolve().parents[2]
SERVING = ROOT / "deploy" / "serving"
MODEL = {"dtype": "float32", "num_q_heads": 8, "num_kv_heads": 2, "head_dim": 64, "page_size": 16}
HEAVY = ("ray", "pyarrow", "torch", "typer", "rich", "numpy")


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """A decode_attention bundle for the server's model, promoted to stable."""
    entries = tuple(
        Entry.from_json(
            {
                "static": MODEL,
                "shape": {"batch": b, "kv_len": 2048},
                "config": {"num_splits": s, "gqa": "grouped"},
            }
        )
        for b, s in ((1, 1), (4, 4), (16, 8))
    )
    shapes = {
        "batch": {"policy": "pow2", "points": [1, 4, 16]},
        "kv_len": {"policy": "ceil", "points": [2048]},
    }
    table = TaskTable("decode_attention", tuple(MODEL), shapes, entries)
    root = tmp_path / "bundles"
    publish_local(root, "serve", "1", build_files("serve", "1", [table], ["r1"], {"device_kind": "cpu"}))
    promote(LocalStore(root), "serve", "1", "stable")
    return root


def serve(bundle: str, policy: str = "warn", *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "TUNECTL_BUNDLE": bundle, "TUNECTL_ENV_POLICY": policy, **env}
    cmd = [sys.executable, str(SERVING / "serve.py"), "--steps", "6", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=environ, cwd=ROOT, timeout=120)


def test_the_server_loads_the_channel_logs_it_and_decodes_with_it(store: Path) -> None:
    done = serve(f"{store}/serve@stable")
    assert done.returncode == 0, done.stderr
    log = done.stderr
    assert "loaded bundle serve/1 (channel stable)" in log and "task decode_attention: 3 entries" in log
    assert "step 1 batch=3 kv_len=1001 tuned {'num_splits': 4, 'gather': 'index', 'gqa': 'grouped'}" in log
    assert "served 6 steps: 5 tuned, 1 on defaults" in log  # batch 2 has no pow2 bucket: default


def _with_lists(tmp_path: Path) -> Path:
    """A bundle for the server's model whose entries (batch 1, 4, 16) each list a second config."""
    listed = tuple(make_key({"num_splits": s, "gqa": "grouped"}) for s in (1, 8))
    entries = tuple(
        Entry(make_key(MODEL), make_key({"batch": b, "kv_len": 2048}), listed[0], candidates=listed)
        for b in (1, 4, 16)
    )
    shapes = {
        "batch": {"policy": "pow2", "points": [1, 4, 16]},
        "kv_len": {"policy": "ceil", "points": [2048]},
    }
    table = TaskTable("decode_attention", tuple(MODEL), shapes, entries)
    return publish_local(tmp_path, "lists", "1", build_files("lists", "1", [table], ["r1"], {}))


def test_the_server_confirms_the_candidates_at_its_batch_sizes_before_serving(tmp_path: Path) -> None:
    """Each entry lists a second config; confirming times both at each batch size the server runs
    (the KV length left to its cell) on this CPU, and the server then serves what it installed."""
    path = _with_lists(tmp_path)
    done = serve(str(path), "off", "--confirm-s", "30")
    assert done.returncode == 0, done.stderr
    said = r"confirmed the candidates at (\d) of (\d) shape\(s\) in [0-9.]+ s: (\d) cell"
    line = re.search(said, done.stderr)
    assert line is not None and line.groups()[:2] == ("5", "6"), done.stderr  # batch 2: no entry
    served = re.findall(r"batch=\d+ kv_len=\d+ tuned \{'num_splits': (\d)", done.stderr)
    assert len(served) == 5 and set(served) <= {"1", "8"}
    assert (line.group(3) == "0") == (set(served) == {"1"})  # what it installed is what it serves


def _server() -> Any:
    """The example server as a module, to call its start-up steps in this process."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("serve_example", SERVING / "serve.py")
    assert spec is not None and spec.loader is not None
    server = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(server)
    return server


def test_a_server_keeps_what_it_confirmed_and_the_next_one_applies_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first start confirms and saves the picks; the next applies them, timing nothing; one whose
    budget ran out before every cell was timed saves what it reached, and the next start goes on from
    there to the same picks; one that cannot write the file serves what it confirmed. The kernels'
    times are fixed (8 splits faster at batch 4 and over)."""
    import tunectl.measure.confirm as confirming
    from tunectl.runtime import load_bundle

    def fixed(task: Any, static: Any, shape: dict[str, Any], configs: Any, **how: Any) -> list[float]:
        return [10.0, 5.0 if shape["batch"] >= 4 else 20.0]

    monkeypatch.setattr(confirming, "time_configs", fixed)
    path = _with_lists(tmp_path)
    server, bundle = _server(), load_bundle(path, env_policy="off")
    partial = tmp_path / "partial.json"
    assert server.confirmed(bundle, 1e-9, str(partial)) is bundle
    assert json.loads(partial.read_text())["not_reached"] > 0, "a part is kept, with what is left"
    resumed = server.confirmed(load_bundle(path, env_policy="off"), 30.0, str(partial))
    assert json.loads(partial.read_text())["not_reached"] == 0
    unwritable = tmp_path / "a-file"
    unwritable.write_text("")
    assert server.confirmed(bundle, 30.0, str(unwritable / "picks.json")) is not bundle  # served anyway
    saved = tmp_path / "confirmed.json"
    first = server.confirmed(bundle, 30.0, str(saved))
    assert len(json.loads(saved.read_text())["picks"]) == 3  # batch 4, 9 and 16

    def timing(*args: object, **kwargs: object) -> None:
        raise AssertionError("a server with confirmed picks to apply timed candidates")

    monkeypatch.setattr(confirming, "confirm", timing)
    again = server.confirmed(load_bundle(path, env_policy="off"), 30.0, str(saved))
    steps = [(b, kv) for b in (1, 3, 4, 9, 16) for kv in (1000, 2048, 3000)]
    answers = [(first.lookup("decode_attention", **MODEL, batch=b, kv_len=kv)) for b, kv in steps]
    assert [again.lookup("decode_attention", **MODEL, batch=b, kv_len=kv) for b, kv in steps] == answers
    assert [resumed.lookup("decode_attention", **MODEL, batch=b, kv_len=kv) for b, kv in steps] == answers


def test_a_failure_while_confirming_never_stops_the_server(
    store: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import tunectl.measure.confirm as confirming
    from tunectl.runtime import load_bundle

    server = _server()

    def broken(*args: object, **kwargs: object) -> None:  # a kernel library failing mid-way
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(confirming, "confirm", broken)
    bundle = load_bundle(store / "serve" / "1", env_policy="off")
    with caplog.at_level("ERROR"):
        assert server.confirmed(bundle, 30.0) is bundle
    assert "could not confirm the candidates (RuntimeError: CUDA error" in caplog.text
    assert "serving the bundle's picks" in caplog.text


def test_a_corrupt_bundle_never_stops_the_server(store: Path) -> None:
    (store / "serve/1/tables/decode_attention.json").write_text("[]")
    done = serve(f"{store}/serve@stable")
    assert done.returncode == 0, done.stderr
    assert (
        "does not match its checksum" in done.stderr and "decoding with the kernel's defaults" in done.stderr
    )
    assert "served 6 steps: 0 tuned, 6 on defaults" in done.stderr


def test_strict_refuses_a_bundle_from_another_machine_before_serving(store: Path) -> None:
    done = serve(f"{store}/serve@stable", policy="strict", TUNECTL_DEVICE_NAME="NVIDIA H200")
    assert done.returncode == 3
    assert "refusing to serve" in done.stderr and "step 0" not in done.stderr


def test_the_base_install_is_the_runtime_and_the_standard_library(tmp_path: Path, store: Path) -> None:
    """`pip install .` without extras, as the serving image does, in a copy of the sources."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "tunectl", src / "tunectl", ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(src),
        ],
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    meta = email.message_from_string(
        next(target.glob("tunectl-*.dist-info")).joinpath("METADATA").read_text()
    )
    base = [r for r in meta.get_all("Requires-Dist") or [] if "extra ==" not in r]
    assert base == [], f"the base install pulls in {base}"
    importable = sorted(p.stem for p in target.iterdir() if (p / "__init__.py").exists() or p.suffix == ".py")
    assert importable == ["tunectl"], f"top-level packages beside tunectl in a serving image: {importable}"
    code = f"""
import json, sys
sys.path.insert(0, {str(target)!r})
from tunectl.runtime import load_bundle
from tunectl.runtime import adapters
b = load_bundle({f"{store}/serve@stable"!r})
call = adapters.call(b, "decode_attention", **{MODEL!r}, batch=3, kv_len=100)
print(json.dumps({{"kwargs": call.kwargs, "from": b.__class__.__module__.split(".")[0],
                  "modules": sorted({{m.split(".")[0] for m in sys.modules}})}}))
"""
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["kwargs"] == {"num_splits": 4, "gather": "index", "gqa": "grouped"}
    assert [m for m in got["modules"] if m not in sys.stdlib_module_names and m != "__main__"] == ["tunectl"]


def test_the_image_installs_the_base_package_and_runs_the_server() -> None:
    dockerfile = (SERVING / "Dockerfile").read_text()
    steps = [
        line.split(None, 1)
        for line in dockerfile.replace("\\\n", " ").splitlines()
        if line and line[0] != "#"
    ]
    runs = " ".join(arg for op, arg in steps if op == "RUN")
    installs = [set(args.split()) for args in re.findall(r"pip install ([^&]*)", runs)]
    assert {"."} in [i & {".", ".[tune]", ".[dev]"} for i in installs]  # tunectl itself, without extras
    assert not any(pkg.split("=")[0] in ("ray", "pyarrow", "typer", "rich") for i in installs for pkg in i)
    for op, arg in steps:
        if op == "COPY":
            *sources, _ = arg.split()
            assert all((ROOT / s).exists() for s in sources), arg
    entry = json.loads(next(arg for op, arg in steps if op == "ENTRYPOINT"))
    assert entry[-1] == "/srv/serve.py" and "COPY deploy/serving/serve.py ./serve.py" in dockerfile
