"""Two real gloo processes train together: disjoint rows per rank, identical weights, the 1-process result."""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from niels_gpt.train.model import GPT
from niels_gpt.train.train import TrainConfig, model_config, train

from ..loading.test_ddp import free_port

WORKER = Path(__file__).with_name("_train_worker.py")


def test_two_gloo_ranks_train_on_disjoint_rows_and_match_one_process(tmp_path, pretrain_cache):
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2"}
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(pretrain_cache), str(tmp_path / "run"),
                               str(tmp_path / f"rank{r}.json")], env={**env, "RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for r in range(2)]
    try:
        outs = [p.communicate(timeout=120)[0].decode() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], outs
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert (r0["world"], r1["world"]) == (2, 2)
    # each step: the ranks' rows are disjoint, and together they are the 1-process run's global batch
    cfg = TrainConfig(data=str(pretrain_cache), out_dir=str(tmp_path / "one"), steps=3, depth=1, n_embd=32, n_head=2,
                      sequence_len=16, device_batch_size=8, sampling="indexed", eval_steps=1, log_every=0)
    one = train(cfg, token_bytes=torch.ones(2004, dtype=torch.int64), log=lambda *a: None, record_rows=True)
    for a, b, both in zip(r0["rows"], r1["rows"], one.rows, strict=True):
        assert not {tuple(x) for x in a} & {tuple(x) for x in b}
        assert a + b == both
    # DDP averaged the gradients: both ranks hold the same weights, equal to one process's up to fp order
    assert r0["params"] == r1["params"]
    init = GPT(model_config(cfg, 2004))
    init.init_weights(torch.Generator().manual_seed(cfg.seed))
    ddp = torch.tensor(r0["params"])
    start = 0
    for (name, p), p0 in zip(one.model.named_parameters(), init.parameters(), strict=True):
        got, want = ddp[start:start + p.numel()].view_as(p), p.detach()
        start += p.numel()
        # NOTE: gloo sums the two ranks' gradients in another order than one process sums its batch, so
        # gradients differ in their last bits; Adam's m / sqrt(v) (and Muon's orthogonalisation) scale
        # every element to a step of ~lr whatever its size, so an element whose gradient cancels to
        # rounding noise moves by a visibly different amount (seen: 3e-4 on an embedding element that
        # moved ~1). The honest bound is against the size of the updates: each tensor lands within 1% of
        # its largest update. A rank stepping on its own half-batch instead of the average misses this
        # by 100x (every element's step changes by ~lr).
        moved, off = float((want - p0.detach()).abs().max()), float((got - want).abs().max())
        assert moved > 0 and off <= 0.01 * moved, (name, off, moved)
    assert r0["losses"] == r1["losses"]  # the logged loss is all-reduced
    torch.testing.assert_close(torch.tensor(r0["losses"]), torch.tensor(one.losses), atol=1e-5, rtol=1e-5)
    # bpb is all-reduced: both ranks report the union of their val rows (2 batches of 4), which the 1-process
    # run scores as 1 batch of 8
    assert r0["val_bpb"] == r1["val_bpb"]
    assert abs(r0["val_bpb"][-1][1] - one.val_bpb[-1][1]) < 1e-5
    assert r0["checkpoint"] and Path(r0["checkpoint"]).is_file() and r1["checkpoint"] is None
