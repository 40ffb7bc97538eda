"""Shared builders for the tests: a tokenizer trained in-process, hand-written caches, and real storage
servers (moto's S3 server in a subprocess on 127.0.0.1, an HTTP server in a thread).

s3fs is pointed at the S3 endpoint through fsspec's configuration (what `FSSPEC_S3_*` environment
variables set in a subprocess); every test of `s3` gets its own bucket. `download_cache` gives a test its
own local download cache (tests/storage uses it in every test).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from niels_gpt.cache.meta import file_record, write_meta
from niels_gpt.tokenizer import SPECIAL_TOKENS, TrainSettings, train_tokenizer

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
SAMPLE_DIR = REPO / "niels_gpt" / "sources" / "sample"
needs_shared = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="../shared/data is absent")

# Ids used by hand-written caches (the layout of a trained sentencepiece model: specials at 3..6).
SPECIALS = {"sys": 3, "usr": 4, "asst": 5, "eot": 6}


def process_alive(pid: int) -> bool:
    """Whether process `pid` is running (Linux /proc); a zombie has ended, only its status is uncollected."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def kill_and_check_workers_end(proc: subprocess.Popen, pids: list[int], message: str) -> None:
    """SIGKILL `proc` (the parent alone), then fail with `message` unless every one of `pids` ends within 20 s."""
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 20
    while any(process_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [p for p in pids if process_alive(p)]
    for p in left:  # do not leave them to the rest of the suite
        os.kill(p, signal.SIGKILL)
    assert left == [], message


@contextlib.contextmanager
def ctrl_c_delivered():
    """For the block's length SIGINT raises KeyboardInterrupt here and reaches the processes started here.

    A suite run as a background job (`make test &`) inherits SIGINT ignored: Python then installs no
    KeyboardInterrupt handler, and every process it starts ignores SIGINT too (an ignored signal survives
    exec; a handled one is reset to the default, and Python then installs its own). Where no handler can be
    installed (a thread other than the main one) the test is skipped, saying why."""
    try:
        before = signal.signal(signal.SIGINT, signal.default_int_handler)
    except ValueError as e:
        pytest.skip(f"SIGINT cannot be handled outside the main thread ({e}): a Ctrl-C test cannot run here")
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.fixture
def sigint_delivered():
    """A Ctrl-C test's fixture: SIGINT is delivered even where the suite runs with it ignored (see above)."""
    with ctrl_c_delivered():
        yield


def sample_texts() -> list[str]:
    """Real text from the bundled sample corpus (its books and notes)."""
    files = sorted(SAMPLE_DIR.rglob("*.txt")) + sorted(SAMPLE_DIR.rglob("*.md"))
    texts = [p.read_text(encoding="utf-8-sig") for p in files if p.name.upper() != "LICENSES.MD"]
    assert texts, f"sample corpus missing under {SAMPLE_DIR}"
    return texts


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory):
    """A small (2,004-id) sentencepiece model trained on the sample corpus, once per session."""
    out = tmp_path_factory.mktemp("tokenizer")
    return train_tokenizer(sample_texts(), out, settings=TrainSettings(vocab_size=2000))


@pytest.fixture(scope="session")
def real_docs() -> list[str]:
    return [t for t in sample_texts() if t.strip()]


def _meta(kind: str, dtype: str, extra: dict) -> dict:
    base = {"kind": kind, "format_version": 1, "built": True, "dataset_name": "handmade", "dataset_config": None,
            "split_rule": "by hand", "seed": 0, "token_dtype": dtype, "tokenizer_sha256": "0" * 64,
            "vocab_size": 2004, "special_token_ids": dict(SPECIALS), "streaming": False}
    base.update(extra)
    return base


def write_pretrain_cache(out: Path, shards: dict[str, list[np.ndarray]], *, dtype: str = "uint16-le",
                         vocab_size: int = 2004, eot: int = SPECIALS["eot"]) -> Path:
    """A pretraining cache whose shards hold exactly the given token arrays."""
    np_dtype = np.dtype("<u2" if dtype == "uint16-le" else "<u4")
    files, totals = {}, {}
    for split in ("train", "val"):
        (out / split).mkdir(parents=True, exist_ok=True)
        arrays = shards.get(split, [])
        for i, arr in enumerate(arrays):
            rel = f"{split}/shard_{i:05d}.bin"
            np.asarray(arr, dtype=np_dtype).tofile(out / rel)
            files[rel] = file_record(out / rel, len(arr))
        totals[f"{split}_tokens"] = int(sum(len(a) for a in arrays))
    write_meta(str(out), _meta("pretrain", dtype, {
        "totals": totals, "files": files, "shard_bytes": 1 << 27, "vocab_size": vocab_size,
        "special_token_ids": {**SPECIALS, "eot": eot}, "tokenizer": {"bos_id": 1},
        "document_separator": {"token": "eot", "id": eot, "position": "after every document"}}))
    return out


def write_sft_cache(out: Path, train: list[list[int]], val: list[list[int]] | None = None, *,
                    dtype: str = "uint16-le") -> Path:
    """An SFT cache holding exactly the given examples (lists of token ids)."""
    np_dtype = np.dtype("<u2" if dtype == "uint16-le" else "<u4")
    out.mkdir(parents=True, exist_ok=True)
    files, totals = {}, {}
    for split, examples in (("train", train), ("val", val or [])):
        lengths = [len(e) for e in examples]
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype("<i8") if examples else np.zeros(0, "<i8")
        tokens = np.concatenate([np.asarray(e, dtype=np_dtype) for e in examples]) if examples else np.zeros(0, np_dtype)
        tokens.tofile(out / f"{split}_tokens.bin")
        np.save(out / f"{split}_idx.npy", offsets)
        files[f"{split}_tokens.bin"] = file_record(out / f"{split}_tokens.bin", len(tokens))
        files[f"{split}_idx.npy"] = {**file_record(out / f"{split}_idx.npy", None), "examples": len(examples)}
        totals.update({f"{split}_examples": len(examples), f"{split}_tokens": len(tokens)})
    write_meta(str(out), _meta("sft", dtype, {"totals": totals, "files": files}))
    return out


@pytest.fixture
def special_tokens():
    return dict(SPECIAL_TOKENS)


# ---------------------------------------------------------------------------------------------
# Storage servers

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server(module_args: list[str], url: str, probe: str, name: str, env: dict | None = None):
    """Run `python -m <module_args>` until the caller is done; yields `url` once GET url+probe answers."""
    proc = subprocess.Popen([sys.executable, "-m", *module_args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(url + probe, timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"{name} did not start on {url}")
            time.sleep(0.1)
    try:
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="session")
def s3_endpoint():
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    port = free_port()
    yield from _server(["moto.server", "-H", "127.0.0.1", "-p", str(port)], f"http://127.0.0.1:{port}",
                       "/moto-api/", "moto server", env={**os.environ, **CREDENTIALS})


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


# gcsfs (2025.10 and later) asks Google's gRPC control plane for a bucket's layout before each operation and
# waits 60 s for an answer that a local emulator cannot give; the plain JSON-API filesystem is what it then
# falls back to. Set before gcsfs is first imported (it reads this at import).
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


@pytest.fixture(scope="session")
def gcs_endpoint():
    """A Google Cloud Storage JSON-API server (gcp-storage-emulator, in memory) in a subprocess on 127.0.0.1."""
    pytest.importorskip("gcsfs")
    pytest.importorskip("gcp_storage_emulator")
    port = free_port()
    yield from _server(["gcp_storage_emulator", "start", "--host", "127.0.0.1", "--port", str(port), "--in-memory"],
                       f"http://127.0.0.1:{port}", "/storage/v1/b?project=test", "gcp-storage-emulator")


@pytest.fixture
def gcs(gcs_endpoint, monkeypatch):
    """A fresh bucket; returns (gcsfs filesystem, "gs://bucket") with fsspec configured for the endpoint."""
    import fsspec
    import gcsfs

    conf = {"endpoint_url": gcs_endpoint, "token": "anon", "project": "test"}
    for k, v in conf.items():  # for subprocesses (the CLI)
        monkeypatch.setenv(f"FSSPEC_GS_{k.upper()}", v)
    monkeypatch.setitem(fsspec.config.conf, "gs", conf)
    gcsfs.GCSFileSystem.clear_instance_cache()
    fs = gcsfs.GCSFileSystem(**conf)
    bucket = f"b-{uuid.uuid4().hex[:12]}"
    fs.mkdir(bucket)
    yield fs, f"gs://{bucket}"
    gcsfs.GCSFileSystem.clear_instance_cache()


@pytest.fixture
def download_cache(tmp_path, monkeypatch):
    """A local download cache directory of this test's own (tests/storage uses one in every test)."""
    from niels_gpt.storage import reset

    d = tmp_path / "download-cache"
    monkeypatch.setenv("NIELS_GPT_CACHE", str(d))
    reset()
    yield d
    reset()


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
