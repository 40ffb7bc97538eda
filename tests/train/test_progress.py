"""The step log says how far a run is (elapsed, ETA, epoch), and --keep-last prunes the run's older checkpoints."""

import json
import re
import shutil
from pathlib import Path

import torch

from niels_gpt.train.checkpoint import checkpoints, latest_checkpoint
from niels_gpt.train.clock import RunClock, duration
from niels_gpt.train.data import TrainData
from niels_gpt.train.train import TrainConfig, train

from .conftest import TINY

ONES = torch.ones(2004, dtype=torch.int64)


def run(data, out, log=None, **kw):
    cfg = TrainConfig(data=str(data), out_dir=str(out), **{**TINY, "log_every": 1, "steps": 3, **kw})
    return train(cfg, token_bytes=ONES, log=log or (lambda *a: None))


def test_durations_and_the_time_left_at_the_pace_so_far():
    assert [duration(s) for s in (0, 45.4, 187, 7500)] == ["0s", "45s", "3m07s", "2h05m"]
    now = iter([100.0, 130.0])
    clock = RunClock(0, 10, clock=lambda: next(now))
    assert clock.fields(3, 1.25) == " | elapsed 30s | eta 1m10s | epoch 1.25"  # 10 s a step, 7 steps left
    now = iter([0.0, 10.0])  # a resumed run: its pace from the steps this process ran
    assert RunClock(5, 10, clock=lambda: next(now)).fields(6) == " | elapsed 10s | eta 40s"


def test_the_step_log_shows_elapsed_eta_and_the_epoch(tmp_path, pretrain_cache):
    lines: list[str] = []
    run(pretrain_cache, tmp_path / "run", log=lines.append)
    steps = [x for x in lines if x.startswith("step 0") and "loss" in x]
    assert len(steps) == 3 and all(re.search(r"\| elapsed \d+s \| eta \d+s \| epoch \d\.\d\d$", x) for x in steps)
    usable = TrainData(pretrain_cache, T=16, batch_size=4, seed=0, device="cpu").source.loader.batch_sampler.usable
    assert steps[-1].endswith(f"epoch {3 * 4 / usable:.2f}")  # 3 steps of 4 windows
    lines.clear()
    run(pretrain_cache, tmp_path / "random", log=lines.append, sampling="random")
    tokens = json.loads((pretrain_cache / "meta.json").read_text())["totals"]["train_tokens"]
    assert [x for x in lines if "loss" in x][-1].endswith(f"epoch {3 * 4 * 16 / tokens:.2f}")


def test_keep_last_removes_the_runs_older_checkpoints_and_keeps_the_newest(tmp_path, pretrain_cache):
    lines: list[str] = []
    out = tmp_path / "run"
    run(pretrain_cache, out, log=lines.append, steps=5, save_every=1, keep_last=2)
    assert [p.name for p in checkpoints(out)] == ["ckpt_000004.pt", "ckpt_000005.pt"]
    assert sorted(json.loads((out / "run.json").read_text())["checkpoints"]) == ["ckpt_000004.pt", "ckpt_000005.pt"]
    assert any("--keep-last 2: removed ckpt_000002.pt" in x for x in lines)
    # a file the run did not record is not its to remove; resuming keeps the newest one only
    shutil.copy(out / "ckpt_000004.pt", out / "ckpt_000001.pt")
    run(pretrain_cache, out, steps=7, save_every=1, keep_last=1, resume="latest")
    assert [p.name for p in checkpoints(out)] == ["ckpt_000001.pt", "ckpt_000007.pt"]
    assert latest_checkpoint(out).name == "ckpt_000007.pt"
    assert list(json.loads((out / "run.json").read_text())["checkpoints"]) == ["ckpt_000007.pt"]


def test_keep_last_never_removes_the_checkpoint_it_just_saved(tmp_path, pretrain_cache):
    """Resumed from an earlier checkpoint, below a later one: the pruning kept the highest step and removed the
    checkpoint the run had just written (its result and log named a file that was gone). The later ones now go
    first (--overwrite)."""
    out = tmp_path / "run"
    run(pretrain_cache, out, steps=6, save_every=2)
    result = run(pretrain_cache, out, steps=6, keep_last=1, stop_at=3, resume=str(out / "ckpt_000002.pt"),
                 overwrite=True)
    assert result.checkpoint.endswith("ckpt_000003.pt") and Path(result.checkpoint).is_file()


def test_keep_last_keeps_the_checkpoint_a_run_beside_it_started_from(tmp_path, pretrain_cache):
    base, sft = tmp_path / "runs" / "base", tmp_path / "runs" / "sft"
    run(pretrain_cache, base, steps=4, save_every=1, stop_at=2)
    run(pretrain_cache, sft, steps=1, init_from=str(base / "ckpt_000002.pt"))
    run(pretrain_cache, base, steps=4, save_every=1, keep_last=1, resume="latest")
    assert [p.name for p in checkpoints(base)] == ["ckpt_000002.pt", "ckpt_000004.pt"]  # 1 and 3 went


def test_keep_last_keeps_the_base_checkpoint_of_a_run_beside_it_after_that_run_resumed(tmp_path, pretrain_cache):
    """The resumed SFT run (no --init-from on its command) wrote init_from null into its run.json, so the base
    run's --keep-last no longer saw the checkpoint it started from, and removed it."""
    base, sft = tmp_path / "runs" / "base", tmp_path / "runs" / "sft"
    run(pretrain_cache, base, steps=4, save_every=1, stop_at=2)
    run(pretrain_cache, sft, steps=2, stop_at=1, init_from=str(base / "ckpt_000002.pt"))
    run(pretrain_cache, sft, steps=2, resume="latest")
    assert json.loads((sft / "run.json").read_text())["init_from"] == str(base / "ckpt_000002.pt")
    run(pretrain_cache, base, steps=4, save_every=1, keep_last=1, resume="latest")
    assert [p.name for p in checkpoints(base)] == ["ckpt_000002.pt", "ckpt_000004.pt"]


def test_keep_last_keeps_a_base_checkpoint_named_by_a_relative_path_from_another_directory(tmp_path, pretrain_cache,
                                                                                          monkeypatch):
    """run.json recorded --init-from as typed (relative to where that run was started): pruning from another
    directory resolved it elsewhere and removed the checkpoint."""
    base, sft = tmp_path / "runs" / "base", tmp_path / "runs" / "sft"
    run(pretrain_cache, base, steps=4, save_every=1, stop_at=2)
    monkeypatch.chdir(tmp_path / "runs")
    run(pretrain_cache, sft, steps=1, init_from="base/ckpt_000002.pt")
    monkeypatch.chdir(tmp_path)
    run(pretrain_cache, base, steps=4, save_every=1, keep_last=1, resume="latest")
    assert [p.name for p in checkpoints(base)] == ["ckpt_000002.pt", "ckpt_000004.pt"]


def test_a_cpu_run_says_so_in_its_log(tmp_path, pretrain_cache, monkeypatch):
    lines: list[str] = []
    run(pretrain_cache, tmp_path / "run", log=lines.append, steps=1)
    assert any(x.startswith("cpu: malloc keeps freed memory") for x in lines)
    monkeypatch.setenv("NIELS_GPT_MALLOC", "system")
    lines.clear()
    run(pretrain_cache, tmp_path / "system", log=lines.append, steps=1)
    assert not any(x.startswith("cpu: malloc") for x in lines)


def test_eval_steps_0_skips_val_bpb_and_says_so(tmp_path, pretrain_cache):
    lines: list[str] = []
    result = run(pretrain_cache, tmp_path / "run", log=lines.append, eval_steps=0, eval_every=1)
    assert result.val_bpb == [] and result.step == 3
    assert "--eval-steps 0: val bpb is skipped" in lines
