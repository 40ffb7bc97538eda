"""A run on 2 gloo ranks resumes on 1 with the default sampling, and val bpb does not depend on the ranks."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from niels_gpt.errors import StateError
from niels_gpt.loading import evaluate_bpb
from niels_gpt.train.checkpoint import save_checkpoint
from niels_gpt.train.data import TrainData
from niels_gpt.train.model import GPT, GPTConfig
from niels_gpt.train.train import TrainConfig, load_checkpoint, train

from ..loading.test_ddp import free_port

WORKER = Path(__file__).with_name("_world_worker.py")
ONES = torch.ones(2004, dtype=torch.int64)
QUIET = {"log": lambda *a: None}
# 128 tokens a step: 2 ranks x 4 rows x 16, or 1 rank x 2 micro-batches of 4 rows x 16
RUN = {"steps": 4, "depth": 1, "n_embd": 32, "n_head": 2, "sequence_len": 16, "device_batch_size": 4,
       "total_batch_size": 128, "eval_steps": 3, "log_every": 0}


def two_ranks(tmp_path, **config) -> list[dict]:
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2"}
    procs = [subprocess.Popen([sys.executable, str(WORKER), json.dumps(config), str(tmp_path / f"rank{r}.json")],
                              env={**env, "RANK": str(r)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for r in range(2)]
    try:
        outs = [p.communicate(timeout=120)[0].decode() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], outs
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory, pretrain_cache):
    tmp = tmp_path_factory.mktemp("world")
    ranks = two_ranks(tmp, data=str(pretrain_cache), out_dir=str(tmp / "run"), stop_at=2, **RUN)
    return tmp, ranks


def test_the_default_sampling_resumes_two_ranks_on_one_as_a_one_rank_run(two_rank_run, pretrain_cache, tmp_path):
    _, (r0, r1) = two_rank_run
    fresh = train(TrainConfig(data=str(pretrain_cache), out_dir=str(tmp_path / "one"), **RUN), token_bytes=ONES,
                  record_rows=True, **QUIET)
    # the 2-rank steps are the 1-rank steps: rank 0 the first micro-batch, rank 1 the second
    assert [r for pair in zip(r0["rows"], r1["rows"], strict=True) for r in pair] == fresh.rows[:4]
    resumed = train(TrainConfig(data=str(pretrain_cache), out_dir=str(Path(r0["checkpoint"]).parent),
                                resume=r0["checkpoint"], **RUN), token_bytes=ONES, record_rows=True, **QUIET)
    assert resumed.rows == fresh.rows[4:]  # the same rows from the same sample position
    torch.testing.assert_close(torch.tensor(resumed.losses), torch.tensor(fresh.losses[2:]), atol=1e-4, rtol=1e-4)


def test_a_resume_on_fewer_ranks_keeps_the_tokens_of_a_step(tmp_path, pretrain_cache):
    run = {k: v for k, v in RUN.items() if k != "total_batch_size"}  # one micro-batch per rank, as the run had
    path = Path(train(TrainConfig(data=str(pretrain_cache), out_dir=str(tmp_path / "run"), stop_at=1, **run),
                      token_bytes=ONES, **QUIET).checkpoint)
    ckpt = load_checkpoint(path)
    ckpt["loader"] = ckpt["loader"] * 2  # as 2 ranks save it: 2 x 4 rows x 16 = 128 tokens a step
    save_checkpoint(path, {k: v for k, v in ckpt.items() if k != "verified"})
    with pytest.raises(StateError, match=r"--total-batch-size 64 \(the run has 128\).* resume with "
                                         r"--total-batch-size 128"):
        train(TrainConfig(data=str(pretrain_cache), out_dir=str(tmp_path / "run"), resume="latest", **run),
              token_bytes=ONES, **QUIET)


def test_val_bpb_of_the_same_weights_is_the_same_on_one_and_two_ranks(two_rank_run, pretrain_cache):
    _, (r0, r1) = two_rank_run
    assert r0["val_bpb"] == r1["val_bpb"] and r0["val_bpb"][-1][0] == 2
    ckpt = load_checkpoint(r0["checkpoint"])
    model = GPT(GPTConfig(**ckpt["model_config"]))
    model.load_state_dict(ckpt["model"])
    model.eval()
    data = TrainData(pretrain_cache, T=16, batch_size=4, seed=0, device="cpu")
    one_rank = evaluate_bpb(model, data.val_batches(RUN["eval_steps"]), ONES)
    assert abs(one_rank - r0["val_bpb"][-1][1]) < 1e-5


def test_a_random_window_run_resumed_on_another_number_of_ranks_names_the_flag_that_does(tmp_path, pretrain_cache):
    cfg = TrainConfig(data=str(pretrain_cache), out_dir=str(tmp_path / "run"), sampling="random", stop_at=1, **RUN)
    path = Path(train(cfg, token_bytes=ONES, **QUIET).checkpoint)
    ckpt = load_checkpoint(path)
    ckpt["loader"] = ckpt["loader"] * 2  # as 2 ranks save it: one random-window position each
    save_checkpoint(path, {k: v for k, v in ckpt.items() if k != "verified"})
    with pytest.raises(StateError) as err:
        train(TrainConfig(data=str(pretrain_cache), out_dir=str(tmp_path / "run"), resume="latest",
                          sampling="random", **RUN), token_bytes=ONES, **QUIET)
    msg = str(err.value)
    assert "2 rank(s)" in msg and "this resume has 1" in msg and "--nproc_per_node 2" in msg
    assert "--sampling indexed" in msg and "any number of ranks" in msg and "\n" not in msg
