"""`download` against a real HTTP server on 127.0.0.1 serving Parquet files made here."""

import http.server
import threading
from functools import partial
from pathlib import Path

import pytest

from niels_gpt.cache.cli import main
from niels_gpt.loading.download import download_shards
from niels_gpt.loading.parquet import list_parquet_files

from .conftest import write_parquet


class Handler(http.server.SimpleHTTPRequestHandler):
    faults: dict[str, list[str]] = {}  # file name -> faults to serve first, one per request
    requests: list[str] = []

    def do_GET(self):
        name = self.path.rsplit("/", 1)[-1]
        type(self).requests.append(name)
        fault = self.faults.get(name, [])
        kind = fault.pop(0) if fault else None
        if kind == "503":
            self.send_error(503, "busy")
        elif kind == "truncate":
            self.send_response(200)
            self.send_header("Content-Length", "100000")
            self.end_headers()
            self.wfile.write(b"PAR1 only the start")
            self.close_connection = True
        elif kind == "garbage":
            body = b"<html>rate limited</html>"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            super().do_GET()

    def log_message(self, *args):
        pass


@pytest.fixture
def server(tmp_path, doc_texts):
    root = tmp_path / "remote" / "data"
    for i in range(4):
        write_parquet(root / f"shard_{i:05d}.parquet", doc_texts[i * 20:(i + 1) * 20], 8)
    Handler.faults, Handler.requests = {}, []
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=str(root.parent)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/data", root
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=5)


def test_downloads_every_shard_byte_identical_and_leaves_no_tmp(server, tmp_path):
    url, root = server
    out = tmp_path / "local"
    results = download_shards(url, out, range(4), num_workers=3, backoff_s=0.01, timeout_s=5)
    assert [r.status for r in results] == ["downloaded"] * 4
    assert [p.name for p in list_parquet_files(out)] == [f"shard_{i:05d}.parquet" for i in range(4)]
    for i in range(4):
        name = f"shard_{i:05d}.parquet"
        assert (out / name).read_bytes() == (root / name).read_bytes()
    assert not list(out.glob("*.tmp"))


def test_transient_failures_are_retried_with_backoff(server, tmp_path):
    url, root = server
    Handler.faults = {"shard_00001.parquet": ["503", "truncate"], "shard_00002.parquet": ["garbage"]}
    results = download_shards(url, tmp_path / "local", range(3), num_workers=2, backoff_s=0.01, timeout_s=5)
    assert [(r.status, r.attempts) for r in results] == [("downloaded", 1), ("downloaded", 3), ("downloaded", 2)]
    assert (tmp_path / "local" / "shard_00001.parquet").read_bytes() == (root / "shard_00001.parquet").read_bytes()


def test_gives_up_after_max_attempts_and_keeps_nothing(server, tmp_path):
    url, _ = server
    Handler.faults = {"shard_00000.parquet": ["503"] * 3}
    [r] = download_shards(url, tmp_path / "local", [0], max_attempts=3, backoff_s=0.01, timeout_s=5)
    assert r.status == "failed" and r.attempts == 3 and "HTTP 503" in r.error and "failed 3 times" in r.error
    assert f"{url}/shard_00000.parquet" in r.error
    assert not list((tmp_path / "local").iterdir())


def test_missing_shard_fails_at_once(server, tmp_path):
    url, _ = server
    [r] = download_shards(url, tmp_path / "local", [9], backoff_s=0.01, timeout_s=5)
    assert (r.status, r.attempts) == ("failed", 1) and "HTTP 404" in r.error


def test_complete_shards_are_skipped_without_a_request(server, tmp_path):
    url, _ = server
    download_shards(url, tmp_path / "local", [0, 1], backoff_s=0.01, timeout_s=5)
    Handler.requests = []
    results = download_shards(url, tmp_path / "local", [0, 1, 2], backoff_s=0.01, timeout_s=5)
    assert [r.status for r in results] == ["skipped", "skipped", "downloaded"]
    assert Handler.requests == ["shard_00002.parquet"]


def test_cli_download_exit_codes(server, tmp_path, capsys):
    url, _ = server
    args = ["download", "--base-url", url, "--out-dir", str(tmp_path / "cli"), "--backoff", "0.01", "--timeout", "5"]
    assert main(args + ["-n", "2", "-w", "2"]) == 0
    assert "2 downloaded, 0 already complete, 0 failed" in capsys.readouterr().err
    assert main(args + ["-n", "1", "--first", "7", "--max-attempts", "1"]) == 1
    assert "HTTP 404" in capsys.readouterr().err
    # --timeout is the earlier spelling of the one network time limit, --network-timeout
    assert main(args[:-2] + ["-n", "1", "--network-timeout", "5"]) == 0


def test_hub_urls_are_fetched_through_huggingface_hub(tmp_path, monkeypatch):
    from huggingface_hub import HfFileSystem

    from niels_gpt.loading.download import BASE_URL

    asked = []

    def get_file(self, rpath, lpath, callback=None, **kwargs):  # the hub's answer, without the network
        asked.append(rpath)
        # one streamed GET, read and counted a MiB at a time: a slow transfer is told from a stall
        assert (self.block_size, self.blocksize) == (0, 1 << 20)
        (tmp_path / "got").write_bytes(b"PAR1" + bytes(100) + b"PAR1")
        Path(lpath).write_bytes((tmp_path / "got").read_bytes())
        callback.relative_update(108)

    monkeypatch.setattr(HfFileSystem, "get_file", get_file)
    results = download_shards(BASE_URL, tmp_path / "local", [3], backoff_s=0.01, progress=False)
    assert [(r.status, r.attempts) for r in results] == [("downloaded", 1)]
    assert asked == ["datasets/karpathy/fineweb-edu-100b-shuffle@main/shard_00003.parquet"]
    assert (tmp_path / "local" / "shard_00003.parquet").stat().st_size == 108


def test_max_attempts_of_zero_is_refused_before_anything_is_made(server, tmp_path, capsys):
    """--max-attempts 0 made no try at all and ended in an AssertionError's traceback; it is refused in one line, and
    no output folder is made."""
    url, _ = server
    assert main(["download", "--base-url", url, "--out-dir", str(tmp_path / "o"), "-n", "1", "--max-attempts", "0"]) != 0
    assert "max_attempts=0 is not a number of tries: it must be at least 1" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
