"""convert killed at any moment (SIGKILL: no cleanup of any kind) never strands its user: running the same command
again succeeds, leaves nothing of the killed run behind and writes exactly the bytes of an uninterrupted run."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest

from niels_gpt.formats.convert import convert

# Runs convert and SIGKILLs itself just before the n-th call (from 0) of one step, or ("done") once it returned.
KILLER = textwrap.dedent("""
    import os, signal, sys
    from niels_gpt import staging
    from niels_gpt.formats import convert as module
    src, dst, to, where, n = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
    if where != "done":
        owner, name = {"receipt": (module, "write_receipt"), "rename": (staging.os, "rename")}[where]
        real, calls = getattr(owner, name), [0]
        def step(*args, **kwargs):
            if calls[0] == n:
                os.kill(os.getpid(), signal.SIGKILL)
            calls[0] += 1
            return real(*args, **kwargs)
        setattr(owner, name, step)
    module.convert(src, dst, to=to, max_tokens_per_file=4096)
    os.kill(os.getpid(), signal.SIGKILL)  # complete, but the command never reported it
""")
LEFTOVER = re.compile(r"\.(tmp|old)-\d+$|\.lock$")


def _tree(path):
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("over, where, n", [
    (False, "receipt", 0),  # every data file written, the commit marker not yet
    (True, "rename", 1),  # over an earlier conversion: between the two renames of the swap
    (False, "done", 0),  # after the swap: the output is complete
])
def test_a_killed_convert_reruns_to_the_bytes_of_an_uninterrupted_run(real_cache, tmp_path, over, where, n):
    convert(real_cache, tmp_path / "clean", to="nanogpt", max_tokens_per_file=4096)
    work = tmp_path / "work"
    work.mkdir()
    out = work / "conv"
    if over:
        convert(real_cache, out, to="raw", not_for_kempnerforge=True)
    r = subprocess.run([sys.executable, "-c", KILLER, str(real_cache), str(out), "nanogpt", where, str(n)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == -9, r.stderr[-2000:]
    convert(real_cache, out, to="nanogpt", max_tokens_per_file=4096)
    assert _tree(out) == _tree(tmp_path / "clean")
    assert sorted(p.name for p in work.iterdir() if LEFTOVER.search(p.name)) == []
