"""The storage servers and the download cache of tests/conftest.py; every test here gets its own download cache."""

from __future__ import annotations

import os
import time

import pytest

from niels_gpt.cache.build_cache import build_pretrain_cache

from ..conftest import CREDENTIALS, _QuietHandler, free_port, http_server, sample_texts  # noqa: F401  (imported from here by tests)

SHARD_BYTES = 16_384


def build_sample_cache(tokenizer, out):
    """The sample corpus as a pretraining cache at `out` (a path or a URL), in several small shards."""
    build_pretrain_cache(sample_texts(), str(out), tokenizer=tokenizer, max_train_tokens=40_000,
                         max_val_tokens=4_000, shard_bytes=SHARD_BYTES, seed=3, shuffle_buffer=None,
                         progress=False)


def file_tree(root):
    """relative path -> bytes of every file under `root`."""
    return {os.path.relpath(os.path.join(d, n), root): open(os.path.join(d, n), "rb").read()
            for d, _, names in os.walk(root) for n in names}


@pytest.fixture(autouse=True)
def own_download_cache(download_cache):
    """Each test downloads into its own local cache directory."""
    return download_cache


class CountingServer:
    """Python's http.server over a directory (a thread on 127.0.0.1) that counts GETs per path; `delay_s`
    slows every .bin/.zst response (so concurrent readers overlap); `corrupt[path] = n` flips a byte in the
    next n responses for that path."""

    def __init__(self, directory, delay_s: float = 0.0):
        import collections
        import threading
        from http.server import ThreadingHTTPServer

        self.gets: collections.Counter = collections.Counter()
        self.corrupt: dict[str, int] = {}
        self.delay_s = delay_s
        outer = self

        class Handler(_QuietHandler):
            def do_GET(self):
                outer.gets[self.path] += 1
                if self.path.endswith((".bin", ".zst")):
                    time.sleep(outer.delay_s)
                if outer.corrupt.get(self.path, 0) > 0:
                    outer.corrupt[self.path] -= 1
                    data = bytearray(open(os.path.join(str(directory), self.path.lstrip("/")), "rb").read())
                    data[len(data) // 2] ^= 0x01
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(bytes(data))
                    return
                super().do_GET()

        import functools

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(directory)))
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def shard_gets(self) -> dict[str, int]:
        return {p.rsplit("/", 1)[1]: n for p, n in self.gets.items() if p.endswith((".bin", ".zst"))}

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def counting_server():
    """CountingServer(directory, delay_s) factory; every server is shut down after the test."""
    made = []

    def make(directory, delay_s: float = 0.0):
        made.append(CountingServer(directory, delay_s))
        return made[-1]

    yield make
    for s in made:
        s.close()
