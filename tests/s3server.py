"""A real S3-compatible server on loopback for tests: moto in server mode, in a thread of this process.

Requests go over HTTP to 127.0.0.1 exactly as they would to S3 or MinIO; nothing is patched in-process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class S3:
    endpoint: str  # http://127.0.0.1:PORT
    bucket: str

    def uri(self, *parts: str) -> str:
        return "/".join([f"s3://{self.bucket}", *parts])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def s3_server(bucket: str = "tunectl-test") -> Iterator[S3]:
    """Start the server, point the AWS variables at it (restored after), create ``bucket``."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        import pyarrow.fs as pafs

        pafs.S3FileSystem(endpoint_override=endpoint, allow_bucket_creation=True).create_dir(bucket)
        yield S3(endpoint, bucket)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()
