"""pack-sft killed at any moment (SIGKILL: no cleanup of any kind) never strands its user: the rerun succeeds,
leaves nothing of the killed run behind and writes exactly the bytes of an uninterrupted run."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest

from niels_gpt.packing import PackedMemmapDataset, pack_sft

from ..conftest import write_sft_cache
from .helpers import chats

# Runs pack_sft and SIGKILLs itself just before the n-th call (from 0) of one step of the write.
KILLER = textwrap.dedent("""
    import os, signal, sys
    from niels_gpt import staging
    from niels_gpt.packing import memmap_format, pack_sft
    cache, out, where, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    owner, name = {"write_bin": (memmap_format.MemmapShardWriter, "write_bin"),
                   "commit": (memmap_format, "commit"),
                   "manifest": (memmap_format, "write_bytes_atomic"),
                   "rename": (staging.os, "rename"),
                   "lock": (staging.json, "dump")}[where]
    real, calls = getattr(owner, name), [0]
    def step(*args, **kwargs):
        if calls[0] == n:
            os.kill(os.getpid(), signal.SIGKILL)
        calls[0] += 1
        return real(*args, **kwargs)
    setattr(owner, name, step)
    pack_sft(cache, out, pack_size=128, algorithm="ffd")
""")
LEFTOVER = re.compile(r"\.(tmp|old)-\d+$|\.lock$")


def _tree(path):
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _leftovers(root):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if LEFTOVER.search(p.name))


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return write_sft_cache(tmp_path_factory.mktemp("sft") / "sft", chats(120, seed=4))


@pytest.mark.parametrize("over, where, n", [
    (False, "lock", 0),  # as it takes OUT.lock: the lock must never be left naming no holder
    (False, "write_bin", 5),  # mid-bins: the arrays half filled
    (False, "commit", 2),  # mid-finalize: two arrays renamed into place, three not, no manifest
    (True, "manifest", 0),  # over an older pack: every array written, its manifest not yet
    (True, "rename", 1),  # over an older pack: between the two renames of the swap, no output at all
])
def test_a_killed_pack_sft_reruns_to_the_bytes_of_an_uninterrupted_run(tmp_path, cache, over, where, n):
    clean = tmp_path / "clean"
    pack_sft(cache, clean, pack_size=128, algorithm="ffd")
    work = tmp_path / "work"
    work.mkdir()
    out = work / "p"
    if over:
        pack_sft(cache, out, pack_size=200, algorithm="bfd")
    r = subprocess.run([sys.executable, "-c", KILLER, str(cache), str(out), where, str(n)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == -9, r.stderr[-2000:]  # killed where asked, not finished or failed
    if out.exists() and (out / "manifest.json").exists():  # what a reader may find: the old pack, whole
        PackedMemmapDataset(out).validate()
    pack_sft(cache, out, pack_size=128, algorithm="ffd")
    assert _tree(out) == _tree(clean)
    assert _leftovers(work) == []
