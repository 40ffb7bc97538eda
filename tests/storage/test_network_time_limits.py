"""Every wait on a store or server has a time limit and ends in one line naming the address and the fix.

A server that accepts connections and never answers (a black hole on 127.0.0.1) stands in for a store that
hangs, and a name that does not resolve for a machine with no network. Each command runs as a subprocess
with `--network-timeout 2`; the subprocess's own timeout is only there to catch a hang, not to time it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def black_hole():
    """127.0.0.1:PORT that accepts every connection and never sends a byte."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                held.append(conn)
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield server.getsockname()[1]
    stop.set()
    t.join(2)
    for c in held:
        c.close()
    server.close()


def _cli(args: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "niels_gpt.cache.cli", "--network-timeout", "2", *args],
                          capture_output=True, text=True, timeout=120, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(REPO), **env})


def _one_line(r: subprocess.CompletedProcess) -> str:
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 1 and lines and lines[-1].startswith("error: "), r.stderr[-2000:]
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    return lines[-1]


def test_an_s3_store_that_never_answers_ends_in_one_line(black_hole, tokenizer, tmp_path):
    env = {"FSSPEC_S3_ENDPOINT_URL": f"http://127.0.0.1:{black_hole}", "AWS_ACCESS_KEY_ID": "x",
           "AWS_SECRET_ACCESS_KEY": "x"}
    r = _cli(["build", "s3://bucket/corpus.jsonl", "--out", "out", "--tokenizer", tokenizer.model_path,
              "--no-progress"], env, tmp_path)
    line = _one_line(r)
    assert "s3://bucket/corpus.jsonl" in line and "--network-timeout" in line
    assert not (tmp_path / "out").exists()
    r = _cli(["inspect", "s3://bucket/cache"], env, tmp_path)
    assert "s3://bucket/cache" in _one_line(r)


def test_a_gcs_store_that_never_answers_ends_in_one_line(black_hole, tokenizer, tmp_path):
    pytest.importorskip("gcsfs")
    env = {"STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{black_hole}"}
    r = _cli(["build", "gs://bucket/corpus.jsonl", "--out", "out", "--tokenizer", tokenizer.model_path,
              "--no-progress"], env, tmp_path)
    line = _one_line(r)
    assert "gs://bucket/corpus.jsonl" in line and "--network-timeout" in line


def test_a_host_that_does_not_resolve_is_not_retried(tokenizer, tmp_path):
    env = {"FSSPEC_S3_ENDPOINT_URL": "http://no-such-host.invalid:9000", "AWS_ACCESS_KEY_ID": "x",
           "AWS_SECRET_ACCESS_KEY": "x"}
    r = _cli(["build", "s3://bucket/corpus.jsonl", "--out", "out", "--tokenizer", tokenizer.model_path,
              "--no-progress"], env, tmp_path)
    line = _one_line(r)
    assert "s3://bucket/corpus.jsonl" in line and ("does not resolve" in line or "--network-timeout" in line)


def test_the_network_timeout_flag_is_checked(tmp_path):
    r = subprocess.run([sys.executable, "-m", "niels_gpt.cache.cli", "--network-timeout", "0", "inspect", "x"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 1 and "--network-timeout 0: must be a positive number of seconds" in r.stderr


def test_a_flag_given_to_main_in_a_python_process_ends_with_it(tmp_path, monkeypatch, capsys):
    """main() run inside Python (a notebook, a test) leaves the process's settings as it found them: a
    --network-timeout or --local-cache of one call does not bound the next call's downloads."""
    from niels_gpt.cli import main
    from niels_gpt.storage.settings import local_cache_dir, network_timeout_s, reset

    monkeypatch.delenv("NIELS_GPT_NETWORK_TIMEOUT_S", raising=False)
    reset()
    before_timeout, before_cache = network_timeout_s(), local_cache_dir()
    missing = tmp_path / "no-such-cache"
    assert main(["--network-timeout", "5", "verify", str(missing)]) == 1
    assert main(["verify", str(missing), "--network-timeout", "7"]) == 1
    assert network_timeout_s() == before_timeout == 30.0
    assert local_cache_dir() == before_cache
    assert "no-such-cache" in capsys.readouterr().out


def test_configure_changes_only_the_settings_it_is_given_and_reset_gives_them_back(tmp_path, monkeypatch):
    from niels_gpt.storage import configure, local_cache_dir, max_cache_bytes, reset
    from niels_gpt.storage.settings import DEFAULT_MAX_BYTES, DEFAULT_TIMEOUT_S, network_timeout_s

    for name in ("NIELS_GPT_CACHE", "NIELS_GPT_CACHE_MAX_BYTES", "NIELS_GPT_NETWORK_TIMEOUT_S"):
        monkeypatch.delenv(name, raising=False)
    reset()
    try:
        configure(timeout_s=120)
        configure(cache_dir=tmp_path / "downloads")
        configure(max_bytes="2GB")  # the two set before stay
        assert (network_timeout_s(), local_cache_dir(), max_cache_bytes()) == (120.0, tmp_path / "downloads", 2 << 30)
        reset()
        assert network_timeout_s() == DEFAULT_TIMEOUT_S and max_cache_bytes() == DEFAULT_MAX_BYTES
        assert local_cache_dir() != tmp_path / "downloads"
    finally:
        reset()
