"""A real S3-compatible server for the tests: moto's standalone server on 127.0.0.1.

The tests start it themselves (CI runs only ``pytest``). The endpoint and fake credentials go
into this process's environment (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...), where s3fs and
botocore read them, and which Dask worker processes started afterwards inherit.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from contextlib import contextmanager
from typing import Iterator

ENV = {
    "AWS_ACCESS_KEY_ID": "tfooc-test",
    "AWS_SECRET_ACCESS_KEY": "tfooc-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def s3_server(bucket: str | None = None) -> Iterator[str]:
    """Start moto's server on a free loopback port, point the AWS variables at it, create a
    bucket; yields ``s3://<bucket>``. The server stops and the variables are restored after."""
    from moto.server import ThreadedMotoServer

    # werkzeug logs every request on stderr
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = dict(ENV, AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}")
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        import boto3

        bucket = bucket or f"tfooc-{uuid.uuid4().hex[:12]}"
        boto3.client("s3").create_bucket(Bucket=bucket)
        _forget_filesystems()
        yield f"s3://{bucket}"
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _forget_filesystems()


def _forget_filesystems() -> None:
    """s3fs keeps file system instances (and their listings) per process: a new server is a new
    endpoint, so drop them."""
    try:
        import s3fs

        s3fs.S3FileSystem.clear_instance_cache()
    except ImportError:  # pragma: no cover
        pass
