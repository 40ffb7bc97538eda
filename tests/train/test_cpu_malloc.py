"""While a command or a CPU training run works, glibc's malloc keeps freed memory for reuse
(niels_gpt/allocator.py): checked through glibc's own accounting of the blocks it maps, in a process of its own
(the setting is the process's), and through a run's log."""

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

# A 64 MiB block: mapped on its own by default (above glibc's mmap threshold), from the heap inside kept().
PROBE = textwrap.dedent("""
    import ctypes, json
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

    with allocator.kept() as on:
        with allocator.kept() as inner:  # nested: the outer block's setting holds after the inner one ends
            pass
        inside = mapped()
    print(json.dumps({"on": on, "inner": inner, "inside": inside, "after": mapped()}))
""")


def probe(**env) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT), **env})
    return json.loads(out.stdout)


def test_inside_kept_large_blocks_come_from_the_heap_and_after_it_glibcs_defaults_are_back():
    got = probe()
    assert got["on"] is True and got["inner"] is True
    assert got["inside"] == 0
    assert got["after"] >= 64 << 20  # a block this large is a mapping of its own again


def test_niels_gpt_malloc_system_leaves_the_allocator_as_it_is():
    got = probe(NIELS_GPT_MALLOC="system")
    assert got["on"] is False
    assert got["inside"] >= 64 << 20


def test_a_cpu_run_says_so_in_its_log(tmp_path, pretrain_cache, monkeypatch):
    lines: list[str] = []
    run(pretrain_cache, tmp_path / "run", log=lines.append, steps=1)
    assert any(x.startswith("cpu: malloc keeps freed memory") for x in lines)
    monkeypatch.setenv("NIELS_GPT_MALLOC", "system")
    lines.clear()
    run(pretrain_cache, tmp_path / "system", log=lines.append, steps=1)
    assert not any(x.startswith("cpu: malloc") for x in lines)
