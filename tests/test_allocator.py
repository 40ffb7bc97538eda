"""While a command, a build or a CPU training run works, glibc's malloc keeps freed memory for reuse
(niels_gpt/allocator.py): checked through glibc's own accounting of the blocks it maps, in a process of its own
(the setting is the process's); a run's log line is checked in tests/train/test_progress.py."""

from __future__ import annotations

import ctypes
import json
import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
pytestmark = pytest.mark.skipif(not GLIBC or not hasattr(ctypes.CDLL(None), "mallinfo2"),
                                reason="mallopt is glibc's; mallinfo2 (the check's count) glibc >= 2.33's")
ROOT = Path(__file__).resolve().parents[2]

# A 64 MiB block: mapped on its own by default (above glibc's mmap threshold), from the heap inside kept().
MAPPED = textwrap.dedent("""
    import ctypes, json, sys
    from niels_gpt import allocator

    class Info(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                   "fsmblks", "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = Info
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]

    def mapped():
        before = libc.mallinfo2().hblkhd
        block = libc.malloc(64 << 20)
        grew = libc.mallinfo2().hblkhd - before
        libc.free(block)
        return grew
""")
PROBE = MAPPED + textwrap.dedent("""
    with allocator.kept() as on:
        with allocator.kept() as inner:  # nested: the outer block's setting holds after the inner one ends
            pass
        inside = mapped()
    after = mapped()

    from niels_gpt.builders.pretrain import build_pretrain_cache
    from niels_gpt.tokenizer import load_tokenizer

    seen = []

    def texts():  # read by the builder: what a block costs while it works
        seen.append(mapped())
        yield "a document of a few words"

    build_pretrain_cache(texts(), sys.argv[1], tokenizer=load_tokenizer(sys.argv[2]), max_train_tokens=100,
                         max_val_tokens=0, shard_bytes=1 << 20, seed=0, shuffle_buffer=None)
    print(json.dumps({"on": on, "inner": inner, "inside": inside, "after": after, "building": seen[0],
                      "built": mapped()}))
""")


# One task run on its own, as a Ray worker runs it (a process that is no fork of a build's).
TASK = MAPPED + textwrap.dedent("""
    from niels_gpt.builders import tasks
    from niels_gpt.builders.plan import make_plan
    from niels_gpt.tokenizer import load_tokenizer

    tok = load_tokenizer(sys.argv[2])
    plan = make_plan([sys.argv[3]], tokenizer=tok)
    seen, opened = [], tasks._tokenizer

    def tokenizer(*args):  # called as the task starts
        seen.append(mapped())
        return opened(*args)

    tasks._tokenizer = tokenizer
    spec = {"rules": plan.rules._asdict(), "chat": False}
    receipt = tasks.run_task(plan.tasks[0].to_json(), spec, tok.model_path, tok.sha256, sys.argv[1])
    print(json.dumps({"running": seen[0], "after": mapped(), "tokens": receipt["tokens"]}))
""")


def probe(tmp_path, tokenizer, *more, code: str = PROBE, **env) -> dict:
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "cache"), str(tokenizer), *map(str, more)],
                         capture_output=True, text=True, check=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT), **env})
    return json.loads(out.stdout)


def test_inside_kept_large_blocks_come_from_the_heap_and_after_it_glibcs_defaults_are_back(tmp_path, tokenizer):
    got = probe(tmp_path, tokenizer._path)
    assert got["on"] is True and got["inner"] is True
    assert got["inside"] == 0
    assert got["after"] >= 64 << 20  # a block this large is a mapping of its own again
    assert got["building"] == 0  # the builder works inside kept()
    assert got["built"] >= 64 << 20  # and leaves glibc's defaults behind


def test_a_task_run_on_its_own_as_in_a_ray_worker_keeps_freed_memory_too(tmp_path, tokenizer):
    (tmp_path / "a.txt").write_text("some text of a task\n\nand more of it\n", encoding="utf-8")
    got = probe(tmp_path, tokenizer._path, tmp_path / "a.txt", code=TASK)
    assert got["tokens"] > 0
    assert got["running"] == 0 and got["after"] >= 64 << 20
    assert probe(tmp_path, tokenizer._path, tmp_path / "a.txt", code=TASK, NIELS_GPT_MALLOC="system")["running"] \
        >= 64 << 20


def test_niels_gpt_malloc_system_leaves_the_allocator_as_it_is(tmp_path, tokenizer):
    got = probe(tmp_path, tokenizer._path, NIELS_GPT_MALLOC="system")
    assert got["on"] is False
    assert got["inside"] >= 64 << 20 and got["building"] >= 64 << 20


def test_a_command_with_niels_gpt_malloc_of_no_known_value_stops_with_one_line(tmp_path, monkeypatch, capsys):
    from niels_gpt.cli import main

    (tmp_path / "a.txt").write_text("some text\n")
    monkeypatch.setenv("NIELS_GPT_MALLOC", "off")
    assert main(["build", str(tmp_path / "a.txt"), "--out", str(tmp_path / "out"), "--tokenizer", "gpt2"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: NIELS_GPT_MALLOC='off' in the environment: expected 'system'")
    assert not (tmp_path / "out").exists()
