"""The builder's encode workers: forked processes for tiktoken, threads for the other backends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from niels_gpt.builders.encode_pool import THREADS_ENV, EncodePool, uses_processes
from niels_gpt.cache.build_cache import build_pretrain_cache
from niels_gpt.errors import TokenizerError
from niels_gpt.long_documents import encode_documents
from niels_gpt.tokenizer import load_tokenizer
from niels_gpt.tokenizer.tiktoken_backend import TiktokenTokenizer

from ..conftest import kill_and_check_workers_end, process_alive, sample_texts

pytest.importorskip("tiktoken")
pytest.importorskip("tokenizers")
FORK = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forked encode workers are for Linux")


def build(tok, out: Path, workers: int, docs=None) -> bytes:
    build_pretrain_cache(docs or sample_texts() * 2, str(out), tokenizer=tok, max_train_tokens=10**7,
                         max_val_tokens=500, shard_bytes=1 << 20, seed=0, shuffle_buffer=None,
                         num_workers=workers, dataset_name="d")
    return b"".join(p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file())


@FORK
def test_tiktoken_encodes_on_forked_processes_the_others_on_threads(tokenizer, bpe_json, tiktoken_file,
                                                                  monkeypatch):
    monkeypatch.setenv("NIELS_GPT_ENCODER", "reference")  # tiktoken's own encoder (the fast one runs on threads)
    assert not uses_processes(tokenizer) and not uses_processes(load_tokenizer(bpe_json))
    tok = load_tokenizer(tiktoken_file)
    pool = EncodePool(tok, 2)
    try:
        assert pool.processes
        pids = {pool.pool.submit(os.getpid).result() for _ in range(8)}
        assert os.getpid() not in pids
        docs = sample_texts()
        got = pool.encode(docs).result()
        want = encode_documents(tok, docs, 1, None, True)
        assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    finally:
        pool.shutdown()


@FORK
def test_tiktoken_build_is_the_same_on_processes_threads_and_one_worker(tmp_path, tiktoken_file, monkeypatch):
    tok = load_tokenizer(tiktoken_file)
    one = build(tok, tmp_path / "one", 1)
    processes = build(tok, tmp_path / "processes", 2)
    monkeypatch.setenv(THREADS_ENV, "1")
    assert not uses_processes(tok)
    threads = build(tok, tmp_path / "threads", 2)
    assert one == processes == threads and len(one) > 10_000


class _Refuses(TiktokenTokenizer):
    """The real tiktoken tokenizer, failing on one document as a broken encoder would."""

    def encode_batch_arrays(self, texts):
        for t in texts:
            if "POISON" in t:
                raise TokenizerError(f"cannot encode the document starting {t[:12]!r}")
        return super().encode_batch_arrays(texts)


@FORK
def test_an_encode_error_in_a_worker_process_fails_the_build_with_its_message(tmp_path, tiktoken_file):
    tok = _Refuses(tiktoken_file)
    docs = sample_texts() + ["POISON pill document"] + sample_texts()
    with pytest.raises(TokenizerError, match="cannot encode the document starting 'POISON pill '"):
        build(tok, tmp_path / "c", 2, docs)
    assert not (tmp_path / "c").exists()
    assert [p.name for p in tmp_path.iterdir()] == []  # no staging directory, lock or temporary left


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers die with their parent on Linux")
def test_encode_workers_die_with_a_killed_builder(tmp_path, tiktoken_file):
    script = textwrap.dedent(f"""
        import json, os, sys, time
        from niels_gpt.builders.encode_pool import EncodePool
        from niels_gpt.tokenizer import load_tokenizer
        pool = EncodePool(load_tokenizer({str(tiktoken_file)!r}), 2)
        pids = sorted({{pool.pool.submit(os.getpid).result() for _ in range(16)}} | set(pool.pool._processes))
        print(json.dumps(pids), flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
                                 "NIELS_GPT_ENCODER": "reference"})  # tiktoken's own encoder: on processes
    try:
        pids = json.loads(proc.stdout.readline())
        assert len(pids) == 2 and all(process_alive(p) for p in pids)
    except BaseException:
        proc.kill()
        proc.wait(timeout=30)
        raise
    kill_and_check_workers_end(proc, pids, "encode workers outlived the builder that forked them")


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


@FORK
@pytest.mark.parametrize("executor", ["inline", "processes"])  # encode workers of the one-process build; task workers
def test_ctrl_c_during_a_tiktoken_build_is_one_message_and_no_worker_traceback(tmp_path, tiktoken_file, executor,
                                                                               sigint_delivered):
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in sample_texts() * 60))
    proc = subprocess.Popen([sys.executable, "-m", "niels_gpt", "build", str(src), "--out", str(tmp_path / "c"),
                             "--tokenizer", str(tiktoken_file), "--workers", "2", "--executor", executor,
                             "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
                                 "NIELS_GPT_ENCODER": "reference"})  # tiktoken's own encoder, on worker processes
    deadline = time.monotonic() + 60
    while len(_children(proc.pid)) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    workers = _children(proc.pid)
    assert proc.poll() is None and len(workers) >= 2, "the build ended before its workers could be seen"
    time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground group
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    lines = err.strip().splitlines()
    if executor == "processes":  # the parallel build says where it runs, then stops with the same one line
        assert lines[0].startswith("build: ") and " on processes (2 workers)" in lines[0], err
        lines = lines[1:]
    assert lines == ["error: interrupted; finished caches are intact, the unfinished one has no meta.json"]
    assert not (tmp_path / "c").exists()
    deadline = time.monotonic() + 20
    while any(process_alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(process_alive(p) for p in workers)
