"""train --batch-ramp START:END:SAMPLES: the global batch grows from START to END rows over the first SAMPLES
samples (the loaders' batch schedule); a run stopped mid-ramp and resumed takes the rows and losses of the
straight run."""

from __future__ import annotations

import pytest

from niels_gpt.errors import ConfigError, StateError
from niels_gpt.train.train import TrainConfig, train

from .conftest import TINY
from .test_resume import TOKEN_BYTES

STEPS = 6
RAMP = "4:16:48"  # rows 4 from sample 0, 8 from 12, 12 from 24, 16 from 36


def run(data, out, **kw):
    cfg = TrainConfig(data=str(data), out_dir=str(out), steps=STEPS, **{**TINY, **kw})
    return train(cfg, token_bytes=TOKEN_BYTES, log=lambda *a: None, record_rows=True)


@pytest.mark.parametrize("sampling", ["indexed", "shards", "random"])
def test_a_run_resumed_mid_ramp_takes_the_straight_runs_rows(tmp_path, pretrain_cache, sampling):
    straight = run(pretrain_cache, tmp_path / "straight", batch_ramp=RAMP, sampling=sampling)
    assert [len(rows) for rows in straight.rows] == [4, 4, 4, 8, 8, 12]
    run(pretrain_cache, tmp_path / "split", batch_ramp=RAMP, sampling=sampling, stop_at=4)
    second = run(pretrain_cache, tmp_path / "split", batch_ramp=RAMP, sampling=sampling, resume="latest")
    assert second.rows == straight.rows[4:] and second.losses == straight.losses[4:]


def test_a_resume_with_another_ramp_is_refused_naming_the_flag(tmp_path, pretrain_cache):
    run(pretrain_cache, tmp_path / "run", batch_ramp=RAMP, stop_at=2)
    with pytest.raises(StateError, match=r"--batch-ramp 4:32:48 \(the run has 4:16:48\).* resume with --batch-ramp "
                                         r"4:16:48"):
        run(pretrain_cache, tmp_path / "run", batch_ramp="4:32:48", resume="latest")


@pytest.mark.parametrize("kw,match", [({"batch_ramp": "4:16"}, r"--batch-ramp 4:16: expected START:END:SAMPLES"),
                                      ({"batch_ramp": "4:16:48", "total_batch_size": 256},
                                       r"--batch-ramp 4:16:48 with --total-batch-size")])
def test_a_bad_ramp_is_refused_in_one_line(tmp_path, pretrain_cache, kw, match):
    with pytest.raises(ConfigError, match=match):
        run(pretrain_cache, tmp_path / "run", **kw)
    assert not (tmp_path / "run").exists()


def test_a_mixture_keeps_one_batch_size(tmp_path, mixture_file):
    with pytest.raises(ConfigError, match=r"--batch-ramp: mixture data keeps one batch size"):
        run(mixture_file, tmp_path / "run", batch_ramp=RAMP)
