"""Every network wait takes the one retry and time-limit path (storage.fs): shard downloads (`download`), input
files at URLs copied down (Parquet) and input files at URLs read as a stream (JSON Lines).

A real HTTP server on 127.0.0.1 misbehaves on purpose, per GET: "stall" (half the body, then nothing until the
client hangs up), "slow" (the body in small pieces, 0.1 s apart, for longer than the limit) or "flaky" (two
HTTP 503 answers, then the file). The limit is 0.5 s, so each case takes a second or two."""

from __future__ import annotations

import functools
import json
import select
import threading
import time
from http.server import ThreadingHTTPServer

import pytest

from niels_gpt.errors import StorageError
from niels_gpt.loading.download import download_shards, hub_path
from niels_gpt.sources.records import Piece, records
from niels_gpt.storage import configure, reset
from niels_gpt.storage import fs as storage_fs

from ..conftest import _QuietHandler
from ..loading.conftest import write_parquet

LIMIT_S = 0.5
SHARD = "shard_00000.parquet"


class Misbehaving:
    def __init__(self, directory, mode: str):
        self.mode, self.gets, self.hung_up = mode, 0, threading.Event()
        outer = self

        class Handler(_QuietHandler):
            def do_GET(self):
                outer.gets += 1
                data = (directory / self.path.lstrip("/")).read_bytes()
                if outer.mode == "flaky" and outer.gets <= 2:
                    self.send_error(503, "busy")
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if outer.mode == "slow":
                    step = max(1, len(data) // 12)
                    for i in range(0, len(data), step):
                        self.wfile.write(data[i:i + step])
                        self.wfile.flush()
                        time.sleep(0.1)
                elif outer.mode == "stall":
                    self.wfile.write(data[:len(data) // 2])
                    self.wfile.flush()
                    while not select.select([self.connection], [], [], 0.05)[0]:
                        pass  # readable: the client closed its end
                    outer.hung_up.set()
                    self.close_connection = True
                else:
                    self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(directory)))
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def serve(tmp_path, monkeypatch, download_cache, real_docs):
    monkeypatch.setattr(storage_fs, "BACKOFF_S", 0.01)
    storage_fs.filesystem("http://127.0.0.1/")  # the http backend imported under the default limit, not 0.5 s
    configure(timeout_s=LIMIT_S)
    root = tmp_path / "served"
    write_parquet(root / SHARD, real_docs[:40], 8)
    (root / "docs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in real_docs[:200]))
    made = []

    def make(mode):
        made.append(Misbehaving(root, mode))
        return made[-1]

    yield make, root
    reset()
    for s in made:
        s.server.shutdown()
        s.server.server_close()


def _download(server, out):
    [r] = download_shards(server.url, out, [0], backoff_s=0.01, progress=False)
    return r


def _parquet_input(server, _out):
    return [row["text"] for _, row in records(Piece(item=f"{server.url}/{SHARD}", kind=".parquet"), ["text"])]


def _jsonl_input(server, _out):
    return [row["text"] for _, row in records(Piece(item=f"{server.url}/docs.jsonl", kind=".jsonl"))]


PATHS = {"download": (_download, SHARD), "parquet input": (_parquet_input, SHARD),
         "jsonl input": (_jsonl_input, "docs.jsonl")}


def _outcome(path, server, out):
    """(ok, the one line) of a path's wait."""
    fn, _ = PATHS[path]
    try:
        got = fn(server, out)
    except StorageError as exc:
        return False, str(exc)
    if path == "download":
        return got.status == "downloaded", got.error
    return bool(got), ""


@pytest.mark.parametrize("path", list(PATHS))
def test_a_stall_mid_body_ends_in_one_line_naming_the_address_within_the_limit(serve, tmp_path, path):
    make, _ = serve
    server = make("stall")
    t0 = time.monotonic()
    ok, line = _outcome(path, server, tmp_path / "out")
    took = time.monotonic() - t0
    assert not ok and "\n" not in line and f"{server.url}/{PATHS[path][1]}" in line and "--network-timeout" in line
    assert "stalled" in line
    assert took < LIMIT_S + 4, f"{path}: a stall of a {LIMIT_S} s limit took {took:.1f} s"
    assert server.gets == 1  # a stall is not retried: nothing came, nothing will
    assert server.hung_up.wait(3)  # the connection is closed, nothing reads on behind the error
    assert not list((tmp_path / "out").glob("*")) if (tmp_path / "out").exists() else True


@pytest.mark.parametrize("path", list(PATHS))
def test_a_slow_transfer_that_keeps_moving_is_never_cut(serve, tmp_path, path):
    make, root = serve
    server = make("slow")
    t0 = time.monotonic()
    ok, line = _outcome(path, server, tmp_path / "out")
    assert ok, line
    assert time.monotonic() - t0 > 2 * LIMIT_S and server.gets == 1  # longer than the limit, one attempt
    if path == "download":
        assert (tmp_path / "out" / SHARD).read_bytes() == (root / SHARD).read_bytes()


@pytest.mark.parametrize("path", list(PATHS))
def test_a_server_that_fails_twice_then_answers_is_retried(serve, tmp_path, path, real_docs):
    make, root = serve
    server = make("flaky")
    ok, line = _outcome(path, server, tmp_path / "out")
    assert ok, line
    assert server.gets == 3
    if path == "download":
        assert (tmp_path / "out" / SHARD).read_bytes() == (root / SHARD).read_bytes()


def test_hub_urls_are_read_through_huggingface_hub_and_other_urls_as_they_are():
    assert hub_path("https://huggingface.co/datasets/karpathy/fineweb-edu-100b-shuffle/resolve/main/shard_00001.parquet") \
        == "hf://datasets/karpathy/fineweb-edu-100b-shuffle@main/shard_00001.parquet"
    assert hub_path("https://huggingface.co/owner/model/resolve/v1.0/sub/x.parquet") == "hf://owner/model@v1.0/sub/x.parquet"
    assert hub_path("http://127.0.0.1:8000/data/shard_00000.parquet") is None
    assert hub_path("https://huggingface.co/datasets/karpathy/fineweb-edu-100b-shuffle") is None  # not a file
    assert hub_path("s3://bucket/resolve/main/x.parquet") is None


def test_ctrl_c_ends_every_download_at_once_and_leaves_no_temporary(serve, tmp_path, sigint_delivered):
    import os
    import signal
    import subprocess
    import sys

    from ..conftest import REPO

    make, _ = serve
    server = make("stall")
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path])}
    proc = subprocess.Popen([sys.executable, "-m", "niels_gpt", "--network-timeout", "60", "download", "--base-url",
                             server.url, "--out-dir", str(out), "-n", "1"], env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while server.gets == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.gets == 1, proc.stderr.read() if proc.poll() is not None else "no request"
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=30)
    assert proc.returncode == 130 and time.monotonic() - t0 < 10  # not the 60 s a stall would take
    assert server.hung_up.wait(3)  # its connection was closed
    assert not list(out.iterdir())


def test_no_retries_still_makes_the_one_attempt():
    calls = []
    assert storage_fs.with_retries(lambda: calls.append(1) or "ok", "reading x", retries=0, bounded=True) == "ok"
    with pytest.raises(StorageError, match=r"reading x: failed 1 time in .* last with ConnectionError: reset"):
        storage_fs.with_retries(lambda: (_ for _ in ()).throw(ConnectionError("reset")), "reading x", retries=0,
                                bounded=True)
    assert calls == [1]
