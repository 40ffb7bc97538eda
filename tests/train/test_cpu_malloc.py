"""On CPU a run has glibc's malloc keep freed memory for the next step (train/setup.py::keep_freed_memory):
checked through glibc's own accounting of the blocks it maps, in a process of its own (the setting is
process-wide), and through the run's log."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .test_progress import run

GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
pytestmark = pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's")
ROOT = Path(__file__).resolve().parents[2]

# A 64 MiB block: mapped on its own by default (above glibc's mmap threshold), from the heap once kept.
PROBE = textwrap.dedent("""
    import ctypes, json, sys
    from niels_gpt.train.setup import keep_freed_memory

    class Info(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                   "fsmblks", "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = Info
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    kept = keep_freed_memory()
    before = libc.mallinfo2().hblkhd
    block = libc.malloc(64 << 20)
    mapped = libc.mallinfo2().hblkhd - before
    libc.free(block)
    again = libc.malloc(64 << 20)  # served from the memory the free kept
    print(json.dumps({"kept": kept, "mapped": mapped, "held": libc.mallinfo2().arena >= 64 << 20}))
""")


def probe(**env) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT), **env})
    return json.loads(out.stdout)


def test_a_cpu_run_serves_large_blocks_from_the_heap_and_keeps_them():
    got = probe()
    assert got == {"kept": True, "mapped": 0, "held": True}


def test_niels_gpt_malloc_system_leaves_the_allocator_as_it_was():
    got = probe(NIELS_GPT_MALLOC="system")
    assert got["kept"] is False
    assert got["mapped"] >= 64 << 20  # glibc's default: a block this large is a mapping of its own


def test_the_run_says_so_in_its_log(tmp_path, pretrain_cache, monkeypatch):
    lines: list[str] = []
    run(pretrain_cache, tmp_path / "run", log=lines.append, steps=1)
    assert any(x.startswith("cpu: malloc keeps freed memory") for x in lines)
    monkeypatch.setenv("NIELS_GPT_MALLOC", "system")
    lines.clear()
    run(pretrain_cache, tmp_path / "system", log=lines.append, steps=1)
    assert not any(x.startswith("cpu: malloc") for x in lines)
