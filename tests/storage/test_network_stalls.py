"""The network limit bounds connecting and stalls, never a transfer that keeps moving; no attempt outlives its call.

Each test serves a small cache over HTTP on 127.0.0.1 from a thread whose shard responses misbehave on purpose:
slow but steady, stalling mid-transfer, dying mid-transfer, or sending wrong bytes. The limit is 0.5 s and every
shard is 24 KiB, so each test takes a few seconds."""

from __future__ import annotations

import functools
import os
import select
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from niels_gpt.errors import CacheMismatchError, StorageError
from niels_gpt.storage import RemoteCache, configure, reset
from niels_gpt.storage import fs as storage_fs

from ..conftest import REPO, _QuietHandler, write_pretrain_cache

REL = "train/shard_00000.bin"
LIMIT_S = 0.5


class Behaving:
    """An HTTP server over `directory` whose .bin responses do `mode`: "slow" (24 KiB at ~12 KiB/s, a piece every
    0.1 s; "slow marker": meta.json alone, 64 bytes a piece), "stall" (half, then nothing until the client hangs up), "die" (half, then the connection closes), or
    "wrong" (the right size, one byte changed). `gets` counts .bin requests; `hung_up` is set when a stalled
    client closed its connection."""

    def __init__(self, directory, mode: str):
        from http.server import ThreadingHTTPServer

        self.mode, self.gets, self.hung_up = mode, 0, threading.Event()
        outer = self

        class Handler(_QuietHandler):
            def do_GET(self):
                marker = outer.mode == "slow marker" and self.path.endswith("/meta.json")
                if not (marker or outer.mode != "slow marker" and self.path.endswith((".bin", ".parquet"))):
                    return super().do_GET()
                outer.gets += 1
                data = open(os.path.join(str(directory), self.path.lstrip("/")), "rb").read()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if outer.mode in ("slow", "slow marker"):
                    piece = 64 if marker else 1200
                    for i in range(0, len(data), piece):
                        self.wfile.write(data[i:i + piece])
                        self.wfile.flush()
                        time.sleep(0.1)
                elif outer.mode == "wrong":
                    self.wfile.write(data[:100] + bytes([data[100] ^ 1]) + data[101:])
                else:
                    self.wfile.write(data[:len(data) // 2])
                    self.wfile.flush()
                    if outer.mode == "stall":
                        while not select.select([self.connection], [], [], 0.05)[0]:
                            pass  # readable: the client closed its end
                        outer.hung_up.set()
                    self.close_connection = True

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(directory)))
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def serve(tmp_path, monkeypatch):
    monkeypatch.setattr(storage_fs, "BACKOFF_S", 0.01)
    configure(timeout_s=LIMIT_S)
    cache = write_pretrain_cache(tmp_path / "c", {"train": [np.arange(12_288) % 2000], "val": [np.arange(100)]})
    made = []

    def make(mode):
        made.append(Behaving(cache, mode))
        return made[-1]

    yield make, cache
    reset()
    for s in made:
        s.server.shutdown()
        s.server.server_close()


def test_a_slow_but_steady_transfer_longer_than_the_limit_succeeds(serve):
    make, cache = serve
    server = make("slow")
    t0 = time.monotonic()
    assert RemoteCache(server.url).fetch(REL).read_bytes() == (cache / REL).read_bytes()
    assert time.monotonic() - t0 > 3 * LIMIT_S and server.gets == 1  # longer than the limit, one attempt


def test_a_slow_but_steady_marker_longer_than_the_limit_is_read(serve):
    make, cache = serve
    server = make("slow marker")
    assert (cache / "meta.json").stat().st_size > 6 * 64  # more than the limit's worth of pieces
    t0 = time.monotonic()
    assert RemoteCache(server.url).fetch(REL).read_bytes() == (cache / REL).read_bytes()
    assert time.monotonic() - t0 > 2 * LIMIT_S and server.gets == 1  # meta.json, in one attempt


def test_a_transfer_that_stalls_ends_in_one_line_and_closes_its_connection(serve, download_cache):
    make, _ = serve
    server = make("stall")
    rc = RemoteCache(server.url)
    with pytest.raises(StorageError) as err:
        rc.fetch(REL)
    line = str(err.value)
    assert "\n" not in line and f"{server.url}/{REL}" in line and "--network-timeout" in line
    assert "stalled" in line and server.gets == 1  # a stall is not retried
    assert server.hung_up.wait(2)  # the attempt ended with the call: its connection is closed
    assert not list(download_cache.rglob("*.tmp-*"))


def test_a_transfer_that_dies_is_retried_then_ends_in_one_line(serve, download_cache):
    make, _ = serve
    server = make("die")
    with pytest.raises(StorageError) as err:
        RemoteCache(server.url).fetch(REL)
    line = str(err.value)
    assert f"{server.url}/{REL}" in line and f"failed {storage_fs.RETRIES} times" in line
    assert server.gets == storage_fs.RETRIES
    assert not list(download_cache.rglob("*.tmp-*"))


def test_wrong_bytes_are_refused_by_their_checksum_naming_the_file(serve, download_cache):
    make, _ = serve
    server = make("wrong")
    with pytest.raises(CacheMismatchError, match=rf"{server.url}/{REL}: sha256 .* differs from meta.json"):
        RemoteCache(server.url).fetch(REL)
    assert not (download_cache / "remote").exists() or not list(download_cache.rglob("shard_00000.bin"))


def test_ctrl_c_during_a_stalled_download_stops_at_once_in_one_line(serve, tokenizer, tmp_path, sigint_delivered):
    """`train` from a URL whose shards stall: the prefetcher's downloads (on their own threads) end with the
    first Ctrl-C too, instead of holding the exit until the stall limit; no temporary is left."""
    make, _ = serve
    server = make("stall")
    downloads = tmp_path / "downloads"
    proc = subprocess.Popen([sys.executable, "-m", "niels_gpt.cache.cli", "--network-timeout", "60", "train",
                             server.url, "--out-dir", str(tmp_path / "run"), "--local-cache", str(downloads),
                             "--tokenizer", tokenizer.model_path, "--depth", "1", "--n-embd", "32", "--n-head", "2",
                             "--sequence-len", "32", "--device-batch-size", "2", "--steps", "2", "--eval-steps", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    deadline = time.monotonic() + 60
    while server.gets == 0 and proc.poll() is None and time.monotonic() < deadline:  # a shard's transfer started
        time.sleep(0.05)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)  # only catches a hang: the stall alone would last 60 s
    lines = [x for x in err.splitlines() if x.strip()]
    assert proc.returncode == 130 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert "interrupted" in lines[0] and "Traceback" not in err
    assert server.hung_up.wait(2)  # the transfer was cancelled, its connection closed
    assert not list(downloads.rglob("*.tmp-*"))


def test_ctrl_c_during_a_stalled_shard_download_stops_at_once(serve, tmp_path, sigint_delivered):
    """`download` (numbered Parquet shards on 4 threads): the first Ctrl-C ends every transfer, none left."""
    make, cache = serve
    for i in range(2):
        (cache / f"shard_{i:05d}.parquet").write_bytes(b"PAR1" + bytes(24_000) + b"PAR1")
    server = make("stall")
    out = tmp_path / "shards"
    proc = subprocess.Popen([sys.executable, "-m", "niels_gpt.cache.cli", "download", "--base-url", server.url,
                             "--out-dir", str(out), "-n", "2", "--timeout", "60"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    deadline = time.monotonic() + 60
    while server.gets < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)  # only catches a hang: the stall alone would last 60 s per attempt
    lines = [x for x in err.splitlines() if x.strip()]
    assert proc.returncode == 130 and lines[-1].startswith("error: interrupted") and "Traceback" not in err, err
    assert server.hung_up.wait(2)
    assert sorted(p.name for p in out.iterdir()) == []  # no temporary, no partial shard
