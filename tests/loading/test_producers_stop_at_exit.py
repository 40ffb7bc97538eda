"""A script that takes one batch and ends (`it = iter(loader); next(it)`) exits 0: every background producer
stops before the interpreter finalises, whatever the script leaves referenced."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from ..conftest import write_pretrain_cache

RUNS = 6  # the abort hit 2-16 runs in 20 before; the exit-hook check below is the deterministic one

ONE_BATCH = """
import sys
from niels_gpt.loading import GlobalBatchSampler, IndexedWindowDataset, ResumableDataLoader
ds = IndexedWindowDataset(sys.argv[1], T=32)
loader = ResumableDataLoader(ds, GlobalBatchSampler(ds, 4, seed=0, rank=0, world_size=1), assemble_ahead=2)
it = iter(loader)
next(it)
"""

# registered before the library is imported, so it runs after the library's own exit hook
LIVE_AT_EXIT = """
import atexit, os, sys, threading
def check():
    live = sorted(t.name for t in threading.enumerate() if t is not threading.main_thread() and t.is_alive())
    print("live at exit:", live, flush=True)
    os._exit(3 if live else 0)
atexit.register(check)
"""

PREFETCHER = """
import torch
from niels_gpt.loading.ahead import Prefetcher
def sums():
    while True:
        yield torch.arange(1000).sum()
p = Prefetcher(depth=2, mode="thread", make_iter=sums)
p.get()
"""


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return write_pretrain_cache(tmp_path_factory.mktemp("exit") / "c",
                                {"train": [np.arange(4000) % 2000], "val": [np.arange(500)]})


def _run(code: str, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_no_producer_thread_outlives_the_exit_hooks(cache):
    proc = _run(LIVE_AT_EXIT + ONE_BATCH + PREFETCHER, str(cache))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    assert "live at exit: []" in out


def test_a_script_that_takes_one_batch_and_ends_exits_0_every_time(cache):
    procs = [_run(ONE_BATCH, str(cache)) for _ in range(RUNS)]
    results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    for p in procs:
        p.stdout.close()
        p.stderr.close()
    assert [rc for rc, _ in results] == [0] * RUNS, [err for rc, err in results if rc]
