"""A real S3-compatible endpoint (moto's server mode, a subprocess on 127.0.0.1) and a real HTTP server.

s3fs is pointed at the endpoint through fsspec's configuration (what `FSSPEC_S3_*` environment
variables set in a subprocess); every test gets its own bucket and its own local download cache.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3_endpoint():
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    port = free_port()
    env = {**os.environ, **CREDENTIALS}
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"moto server did not start on {url}")
            time.sleep(0.1)
    try:
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture
def s3(s3_endpoint, monkeypatch, tmp_path):
    """A fresh bucket; returns (s3fs filesystem, "s3://bucket") with fsspec configured for the endpoint."""
    import fsspec
    import s3fs

    for k, v in CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("FSSPEC_S3_ENDPOINT_URL", s3_endpoint)  # for subprocesses
    monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": s3_endpoint, "key": "testing",
                                                   "secret": "testing"})
    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem(endpoint_url=s3_endpoint, key="testing", secret="testing")
    bucket = f"b-{uuid.uuid4().hex[:12]}"
    fs.mkdir(bucket)
    yield fs, f"s3://{bucket}"
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture(autouse=True)
def download_cache(tmp_path, monkeypatch):
    """Each test downloads into its own local cache directory."""
    from niels_gpt.storage import configure

    d = tmp_path / "download-cache"
    monkeypatch.setenv("NIELS_GPT_CACHE", str(d))
    configure()
    yield d
    configure()


@contextlib.contextmanager
def http_server(directory):
    """Serve `directory` read-only on 127.0.0.1 (a thread); yields the base URL."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass
