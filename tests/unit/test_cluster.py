"""Joining a cluster: what is refused before anything connects."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.conftest import TINY_SPEC
from tunectl.core.errors import UserError
from tunectl.orchestrator.cluster import connect, connect_timeout_s


def test_num_gpus_applies_to_a_local_instance_only(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    if ray.is_initialized():
        pytest.skip("a Ray instance from another test is connected")
    with pytest.raises(UserError, match="--num-gpus applies to a local instance only"):
        connect("ray://head:10001", num_gpus=2)
    monkeypatch.setenv("RAY_ADDRESS", "head:6379")  # a job's driver: joining, never a new instance
    with pytest.raises(UserError, match="--num-gpus applies to a local instance only"):
        connect(None, num_gpus=2)


@pytest.fixture
def web_server() -> Iterator[int]:
    """A port on this machine that answers TCP, and HTTP/1, but is no Ray cluster."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_joining_a_web_server_fails_within_the_timeout_in_one_line(web_server: int, tmp_path: Path) -> None:
    spec = tmp_path / "tiny.toml"
    spec.write_text(TINY_SPEC)
    address = f"127.0.0.1:{web_server}"
    command = [sys.executable, "-m", "tunectl", "submit", str(spec), "--address", address]
    env = {**os.environ, "TUNECTL_CONNECT_TIMEOUT_S": "5"}
    started = time.monotonic()
    done = subprocess.run(  # Ray's own client would retry for minutes, printing its warnings
        [*command, "--results", str(tmp_path / "r")], capture_output=True, text=True, timeout=15, env=env
    )
    assert time.monotonic() - started < 12
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: cannot connect to {address}: ")
    assert "does not speak Ray's protocol" in lines[0] and "HOST:6379" in lines[0]


def test_a_port_that_takes_connections_but_never_answers_is_bounded_by_the_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # listens; nothing ever reads
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        monkeypatch.setenv("TUNECTL_CONNECT_TIMEOUT_S", "1.5")
        started = time.monotonic()
        with pytest.raises(UserError, match=r"gave no Ray answer within 1\.\d s"):
            connect(address)
        assert time.monotonic() - started < 4


@pytest.mark.parametrize("setting", ["ten", "0", "-3", "inf"])
def test_a_connect_timeout_that_is_not_seconds_is_refused(
    setting: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TUNECTL_CONNECT_TIMEOUT_S", setting)
    with pytest.raises(UserError, match="TUNECTL_CONNECT_TIMEOUT_S must be a number of seconds"):
        connect_timeout_s()


def test_a_cpu_worker_leaves_a_core_to_the_driver_and_ray_unless_the_spec_says() -> None:
    from tunectl.core.spec import parse_spec
    from tunectl.orchestrator.cluster import cpu_threads

    assert [cpu_threads(n) for n in (1, 2, 16)] == [1, 1, 15]
    spec = parse_spec(TINY_SPEC.replace("[measure]", "[resources]\ncpu_threads = 2\n[measure]"))
    assert spec.resources.cpu_threads == 2 and cpu_threads(16, spec.resources.cpu_threads) == 2
    assert parse_spec(TINY_SPEC).resources.cpu_threads is None
