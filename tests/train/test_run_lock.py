"""One run per run directory: a second train into a directory another train is writing is refused, naming the
holder's pid; the first run's checkpoints stay its own. A killed run's lock does not block the rerun."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from niels_gpt.errors import OutputLockedError
from niels_gpt.train.checkpoint import load_checkpoint, read_run
from niels_gpt.train.train import TrainConfig, train

from .conftest import TINY, VOCAB

TOKEN_BYTES = torch.ones(VOCAB, dtype=torch.int64)
# SIGINT reaches the trains these tests stop even in a suite run with it ignored (a background job)
pytestmark = pytest.mark.usefixtures("sigint_delivered")
REPO = Path(__file__).resolve().parents[2]


def run(data, out, **kw):
    cfg = TrainConfig(data=str(data), out_dir=str(out), **{**TINY, "steps": 2, **kw})
    return train(cfg, token_bytes=TOKEN_BYTES, log=lambda *a: None)


def start(data, out, *extra: str) -> subprocess.Popen:
    """A train in another process, returned once its loop runs and has saved a checkpoint."""
    p = subprocess.Popen([sys.executable, "-m", "niels_gpt.cli", "train", str(data), "--out-dir", str(out),
                          "--depth", "1", "--n-embd", "32", "--sequence-len", "16", "--device-batch-size", "4",
                          "--steps", "100000", "--save-every", "1", "--seed", "3", *extra],
                         cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
    for line in p.stdout:
        if line.startswith("step 00002/"):  # step 1 saved
            return p
    raise AssertionError(p.communicate()[1])


def test_a_second_train_into_a_directory_being_written_is_refused_naming_the_holder(tmp_path, pretrain_cache):
    out = tmp_path / "run"
    first = start(pretrain_cache, out)
    try:
        for kw in ({"overwrite": True}, {"resume": "latest", "steps": 100000, "seed": 3}):
            with pytest.raises(OutputLockedError, match=rf"--out-dir {out}: another run is writing it \(pid "
                                                        rf"{first.pid} on .* holds {out}.lock\); wait for it"):
                run(pretrain_cache, out, **kw)
    finally:
        first.send_signal(signal.SIGINT)
        _, err = first.communicate(timeout=120)
    assert first.returncode == 130, err
    assert read_run(out)["seed"] == 3  # the first run's record, and its checkpoints
    assert {load_checkpoint(p)["train_config"]["seed"] for p in out.glob("ckpt_*.pt")} == {3}
    assert not (tmp_path / "run.lock").exists()
    assert run(pretrain_cache, tmp_path / "other").step == 2  # and a lock is released when its run ends
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "run"]


def test_a_killed_runs_lock_does_not_block_the_rerun(tmp_path, pretrain_cache):
    out = tmp_path / "run"
    first = start(pretrain_cache, out)
    first.kill()
    first.communicate(timeout=60)
    assert json.loads((tmp_path / "run.lock").read_text())["pid"] == first.pid  # left behind by the kill
    assert run(pretrain_cache, out, overwrite=True).step == 2  # its holder is dead: taken over
    assert not (tmp_path / "run.lock").exists()


def test_a_run_refused_under_its_lock_leaves_no_directory_behind(tmp_path, pretrain_cache):
    from niels_gpt.errors import ConfigError

    with pytest.raises(ConfigError, match="--vocab-size 100: below the 2004 ids"):  # refused once the data is open
        run(pretrain_cache, tmp_path / "a" / "b" / "run", vocab_size=100)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # neither the lock nor the directories it needed
