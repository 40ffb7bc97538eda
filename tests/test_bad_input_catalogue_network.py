"""Bad-input catalogue: network waits (`download` of numbered shards, input files at URLs) against a server on
127.0.0.1 that misbehaves. Each case is checked by check_case (one error line naming the address, what went
wrong and how to fix it; nothing complete-looking left behind)."""

from __future__ import annotations

import functools
import select
import socket
import threading
from http.server import ThreadingHTTPServer

import pytest

from .conftest import _QuietHandler
from .test_bad_input_catalogue import Case, check_case, world  # noqa: F401  (world: a fixture)

SERVERS: list[ThreadingHTTPServer] = []


def _serve(tmp, mode: str) -> str:
    """A server over tmp/served whose GETs do `mode`: "stall" (half the body, then nothing), "busy" (HTTP 503)."""
    root = tmp / "served"
    root.mkdir(exist_ok=True)
    (root / "shard_00000.parquet").write_bytes(b"PAR1" + bytes(4000) + b"PAR1")
    (root / "corpus.jsonl").write_text("".join(f'{{"text": "document {i} about networks"}}\n' for i in range(500)))

    class Handler(_QuietHandler):
        def do_GET(self):
            if mode == "busy":
                self.send_error(503, "busy")
                return
            data = (root / self.path.lstrip("/")).read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[:len(data) // 2])
            self.wfile.flush()
            while not select.select([self.connection], [], [], 0.05)[0]:
                pass  # until the client hangs up
            self.close_connection = True

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    SERVERS.append(server)
    return f"http://127.0.0.1:{server.server_address[1]}"


def _download(tmp, base_url, *extra):
    return ["download", "--base-url", base_url, "--out-dir", str(tmp / "shards"), "-n", "1", "--backoff", "0.01",
            "--network-timeout", "0.5", *extra]


def download_stalls_mid_body(w, tmp):
    return _download(tmp, _serve(tmp, "stall"))


def download_server_stays_busy(w, tmp):
    return _download(tmp, _serve(tmp, "busy"), "--max-attempts", "2")


def download_missing_shard(w, tmp):
    (tmp / "empty").mkdir()
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(tmp / "empty")))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    SERVERS.append(server)
    return _download(tmp, f"http://127.0.0.1:{server.server_address[1]}")


def download_unknown_scheme(w, tmp):
    return ["download", "--base-url", "ftp://example.org/shards", "--out-dir", str(tmp / "shards"), "-n", "1"]


def download_server_down(w, tmp):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return _download(tmp, f"http://127.0.0.1:{port}", "--max-attempts", "2")


def build_from_an_input_url_that_stalls(w, tmp):
    return ["--network-timeout", "0.5", "build", f"{_serve(tmp, 'stall')}/corpus.jsonl", "--out", str(tmp / "out"),
            "--tokenizer", str(w.tokenizer), "--no-progress"]


CASES = [
    Case("download: a server that stalls mid-body", download_stalls_mid_body,
         ("shard_00000.parquet", "http://127.0.0.1", "stalled", "--network-timeout"), out="shards"),
    Case("download: a server that answers 503 every time", download_server_stays_busy,
         ("shard_00000.parquet", "HTTP 503", "failed 2 times", "same command"), out="shards"),
    Case("download: a shard the server does not have", download_missing_shard,
         ("shard_00000.parquet", "HTTP 404", "--base-url"), out="shards"),
    Case("download: a base URL of an unknown scheme", download_unknown_scheme,
         ("ftp://example.org", "not supported"), out="shards"),
    Case("download: a server that is down", download_server_down,
         ("shard_00000.parquet", "127.0.0.1", "failed 2 times"), out="shards"),
    Case("build: an input URL that stalls mid-body", build_from_an_input_url_that_stalls,
         ("corpus.jsonl", "http://127.0.0.1", "stalled", "--network-timeout"), out="out"),
]


@pytest.fixture(scope="module", autouse=True)
def _servers_end():
    from niels_gpt.storage.fs import filesystem

    filesystem("http://127.0.0.1/")  # the http backend imported under the default limit, not the cases' 0.5 s
    yield
    for server in SERVERS:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_network_input_gets_one_clear_line_and_nothing_lost(case, world, tmp_path, capsys):  # noqa: F811
    from niels_gpt.storage import reset

    try:
        check_case(case, world, tmp_path, capsys)
    finally:
        reset()  # the --network-timeout a case set stays in this process otherwise
