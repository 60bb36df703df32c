"""Whether an address is a Ray cluster, found out within a bound and quietly, before Ray is asked.

``ray.init`` given an address that answers TCP but speaks no Ray (a web server, a wrong port) retries
its GCS client for minutes, printing Ray's own warnings on the console all along. So a join is
checked first, within ``TUNECTL_CONNECT_TIMEOUT_S`` (10 s) in all: a TCP connection to the host and
port, then one gRPC call that every Ray GCS answers (``GetClusterId``), made through Ray's own channel
set-up (TLS and token authentication as Ray configures them). Either failing is one ``UserError``
naming the address and what to do.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from tunectl.core.errors import UserError

DEFAULT_CONNECT_TIMEOUT_S = 10.0
_WHAT_TO_DO = "give the head's address (HOST:6379, auto, or ray://HEAD:10001) and check that Ray runs there"


def connect_timeout_s() -> float:
    """``TUNECTL_CONNECT_TIMEOUT_S`` (seconds, > 0), else 10; a ``UserError`` if it is not a number."""
    text = os.environ.get("TUNECTL_CONNECT_TIMEOUT_S", "").strip()
    if not text:
        return DEFAULT_CONNECT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise UserError(f"TUNECTL_CONNECT_TIMEOUT_S must be a number of seconds above 0, not {text!r}")
    return value


def host_port(address: str) -> tuple[str, int] | None:
    """``address``'s host and port (``ray://``, ``http://`` and a path taken off; IPv6 brackets
    kept off the host), or None where it names no one host and port (``auto``, ``local``, a host alone)."""
    target = address.split("://", 1)[-1].split("/", 1)[0]
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or not host:
        return None
    return host.strip("[]"), int(port)


def check_reachable(address: str, timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S) -> None:
    """Open (and close) a TCP connection to ``address``'s host and port; a ``UserError`` if none comes.

    ``auto``, ``local`` and addresses without a port are left to Ray (they name no one host to try).
    """
    found = host_port(address)
    if found is None:
        return
    host, port = found
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except TimeoutError:
        raise UserError(
            f"cannot connect to {address}: no answer from {host}:{port} within {timeout_s:g} s; "
            "check that the cluster is up and the address is right"
        ) from None
    except OSError as exc:
        raise UserError(f"cannot connect to {address}: {host}:{port}: {exc.strerror or exc}") from None


def check_ray(address: str, timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S) -> None:
    """A ``UserError`` unless ``address`` answers, within ``timeout_s`` in all, as Ray does: TCP first,
    then a GCS call (a Ray Client address, ``ray://``, need only answer gRPC). Addresses that name no
    host and port are left to Ray."""
    found = host_port(address)
    if found is None:
        return
    deadline = time.monotonic() + timeout_s
    check_reachable(address, timeout_s)
    host, port = found
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    remaining = max(0.1, deadline - time.monotonic())
    problem = _gcs_problem(target, remaining, client=address.startswith("ray://"))
    if problem:
        raise UserError(f"cannot connect to {address}: {problem}; {_WHAT_TO_DO}")


def _gcs_problem(target: str, timeout_s: float, *, client: bool) -> str:
    """What keeps ``target`` from being a Ray GCS (or, ``client``, a gRPC server), or "" if nothing."""
    import grpc
    from ray._private.grpc_utils import init_grpc_channel
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    messages: Any = gcs_service_pb2  # generated code: its names are made at import, unseen by mypy
    channel = init_grpc_channel(target)
    try:
        stub: Any = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        stub.GetClusterId(messages.GetClusterIdRequest(), timeout=timeout_s)
        return ""
    except grpc.RpcError as exc:
        return _rpc_problem(exc.code(), exc.details() or "", timeout_s, client=client)
    finally:
        channel.close()


def _rpc_problem(code: Any, details: str, timeout_s: float, *, client: bool) -> str:
    import grpc

    if code == grpc.StatusCode.UNIMPLEMENTED:
        return "" if client else "it answers gRPC but is not a Ray cluster's GCS"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"it takes connections but gave no Ray answer within {timeout_s:.1f} s"
    if code == grpc.StatusCode.UNAVAILABLE:
        reason = details.rsplit(": ", 1)[-1].split(" (", 1)[0]  # "Failed parsing HTTP/2", say
        return f"it takes connections but does not speak Ray's protocol ({reason})"
    return ""  # it answered as a Ray server does (a refused token too); ray.init says the rest
