"""Ctrl-C and SIGTERM during training: the step ends, is saved, and the printed command resumes the run.

Issue 22: Ctrl-C with the default --save-every 0 left nothing (the whole run lost), and printed the cache
builder's message."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from niels_gpt.train.data import TrainData
from niels_gpt.train.interrupt import resume_command
from niels_gpt.train.train import TrainConfig, train

from .conftest import TINY, VOCAB

TOKEN_BYTES = torch.ones(VOCAB, dtype=torch.int64)
# SIGINT reaches these tests and their commands even in a suite run with it ignored (a background job)
pytestmark = pytest.mark.usefixtures("sigint_delivered")
REPO = Path(__file__).resolve().parents[2]


class SignalAt:
    """The trainer's own loader, which sends this process signals while fetching given batches
    ({call: [signals]}; call 1 is the batch taken before the loop): a signal that arrives in the middle
    of a step, at a step the test knows."""

    def __init__(self, data: TrainData, when: dict[int, list[int]]):
        self.data, self.when, self.calls = data, when, 0

    def __getattr__(self, name):
        return getattr(self.data, name)

    def __next__(self):
        self.calls += 1
        for s in self.when.get(self.calls, []):
            os.kill(os.getpid(), s)
        return next(self.data)


def test_sigterm_mid_run_saves_that_step_and_the_resumed_run_matches_a_straight_one(tmp_path, pretrain_cache):
    cfg = dict(data=str(pretrain_cache), steps=6, **TINY)
    straight = train(TrainConfig(**cfg, out_dir=str(tmp_path / "straight")), token_bytes=TOKEN_BYTES,
                     log=lambda *a: None)
    data = SignalAt(TrainData(pretrain_cache, T=16, batch_size=4, seed=TrainConfig.seed, device="cpu"), {3: [signal.SIGTERM]})
    before = signal.getsignal(signal.SIGTERM)  # SIG_DFL, or the handler another library installed (ray.init does)
    first = train(TrainConfig(**cfg, out_dir=str(tmp_path / "run")), token_bytes=TOKEN_BYTES, log=lambda *a: None,
                  data=data)
    # the signal came while step 2 fetched the batch of step 3: step 2 ended, was saved, and the run returned
    assert first.interrupted == "SIGTERM" and first.step == 2 and first.checkpoint.endswith("ckpt_000002.pt")
    assert signal.getsignal(signal.SIGTERM) is before  # the run's handler is gone with the run
    second = train(TrainConfig(**cfg, out_dir=str(tmp_path / "run"), resume=first.checkpoint),
                   token_bytes=TOKEN_BYTES, log=lambda *a: None)
    assert first.losses + second.losses == straight.losses


def test_a_signal_in_the_last_step_stops_the_run_there_without_the_final_evaluations(tmp_path, pretrain_cache):
    """It was noticed only between steps, so in the last step it was dropped: val bpb and CORE (minutes, a
    download) ran on, and the run ended as if nothing had been asked."""
    data = SignalAt(TrainData(pretrain_cache, T=16, batch_size=4, seed=TrainConfig.seed, device="cpu"),
                    {4: [signal.SIGINT]})  # call 4: the second micro-batch of step 2, the last
    cfg = TrainConfig(data=str(pretrain_cache), out_dir=str(tmp_path / "run"), steps=2, total_batch_size=2 * 4 * 16,
                      **TINY)
    result = train(cfg, token_bytes=TOKEN_BYTES, log=lambda *a: None, data=data)
    assert (result.interrupted, result.step, result.val_bpb) == ("SIGINT", 2, [])
    assert result.checkpoint.endswith("ckpt_000002.pt")


def test_the_resume_command_repeats_every_flag_that_differs_from_its_default():
    cfg = TrainConfig(data="c d/x", out_dir="runs/a", depth=2, compile=False, overwrite=True, init_from="b.pt")
    cmd = shlex.split(resume_command(cfg, "runs/a/ckpt_000007.pt", 1))
    assert cmd[1:] == ["-m", "niels_gpt.cli", "train", "c d/x", "--out-dir", "runs/a", "--depth", "2", "--no-compile",
                       "--resume", "runs/a/ckpt_000007.pt"]
    assert resume_command(cfg, "x.pt", 8).startswith("torchrun --nproc_per_node=8 -m niels_gpt.cli train")


def _cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "niels_gpt.cli", *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_ctrl_c_in_the_cli_saves_prints_the_command_and_running_it_finishes_the_run(tmp_path, pretrain_cache,
                                                                                    capsys):
    args = ["train", str(pretrain_cache), "--out-dir", str(tmp_path / "run"), "--depth", "1", "--n-embd", "32",
            "--seq-len", "16", "--device-batch-size", "4", "--steps", "400", "--eval-steps", "1"]
    p = _cli(*args)
    for line in p.stdout:  # the loop is running once a step is logged
        if line.startswith("step 00002/"):
            p.send_signal(signal.SIGINT)
            break
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: interrupted (SIGINT) after step "), err
    step = int(re.search(r"after step (\d+) of 400", lines[0]).group(1))
    saved = tmp_path / "run" / f"ckpt_{step:06d}.pt"
    assert saved.is_file() and f"saved {saved}" in lines[0]
    command = shlex.split(lines[0].split("continue with: ", 1)[1])
    assert command[:3] == [sys.executable, "-m", "niels_gpt.cli"] and command[3:-2] == args
    assert command[-2:] == ["--resume", str(saved)]
    from niels_gpt.cli import main

    capsys.readouterr()
    assert main([*command[3:-4], "--steps", str(step + 2), *command[-2:]]) == 0  # the run goes on from there
    assert len(re.findall(r"\| loss \S+ \|", capsys.readouterr().out)) == 2


def test_ctrl_c_before_the_first_step_gets_trains_own_message(tmp_path, pretrain_cache):
    p = _cli("train", str(pretrain_cache), "--out-dir", str(tmp_path / "run"), "--depth", "1", "--n-embd", "32",
             "--sequence-len", "16", "--device-batch-size", "4", "--steps", "100000")
    for line in p.stdout:
        if line.startswith("data: "):  # set up, about to take its first batch
            p.send_signal(signal.SIGINT)
            break
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "interrupted" in lines[0], err
    assert "caches are intact" not in err  # the cache builder's message, which train used to print
    assert not list((tmp_path / "run").glob("*.tmp-*"))


class InterruptAt(io.StringIO):
    """stdout that raises KeyboardInterrupt, as a Ctrl-C would, when the run prints a line starting `prefix`."""

    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def write(self, s: str) -> int:
        if s.startswith(self.prefix):
            raise KeyboardInterrupt
        return super().write(s)


def test_ctrl_c_before_an_overwriting_run_saved_never_offers_the_replaced_runs_checkpoint(tmp_path, pretrain_cache,
                                                                                        capsys):
    """It printed "the last checkpoint is .../ckpt_000002.pt; continue with: ... --resume" of the run being
    replaced, with this run's flags."""
    from niels_gpt.cli import main

    args = ["train", str(pretrain_cache), "--out-dir", str(tmp_path / "run"), "--depth", "1", "--n-embd", "32",
            "--seq-len", "16", "--device-batch-size", "4", "--steps", "2", "--eval-steps", "0", "--log-every", "0"]
    assert main(args) == 0
    with contextlib.redirect_stdout(InterruptAt("data: ")):  # set up, before its first step
        assert main([*args, "--seed", "7", "--overwrite"]) == 130
    err = capsys.readouterr().err
    assert "no checkpoint of this run was written" in err and "--resume" not in err, err
    assert (tmp_path / "run" / "ckpt_000002.pt").is_file()  # the replaced run is whole


def test_a_second_ctrl_c_stops_inside_the_step_and_writes_nothing(tmp_path, pretrain_cache):
    # step 1 has two micro-batches: it fetches batches 2 and 3; a Ctrl-C at each
    data = SignalAt(TrainData(pretrain_cache, T=16, batch_size=4, seed=TrainConfig.seed, device="cpu"),
                    {2: [signal.SIGINT], 3: [signal.SIGINT]})
    cfg = TrainConfig(data=str(pretrain_cache), out_dir=str(tmp_path / "run"), steps=6, total_batch_size=2 * 4 * 16,
                      **TINY)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, token_bytes=TOKEN_BYTES, log=lambda *a: None, data=data)
    assert not (tmp_path / "run").exists()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
