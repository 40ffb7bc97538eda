"""Two real gloo processes train together: disjoint rows per rank, identical weights, the 1-process result."""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from niels_gpt.train.train import TrainConfig, train

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
    one = train(TrainConfig(data=str(pretrain_cache), out_dir=str(tmp_path / "one"), steps=3, depth=1, n_embd=32,
                            n_head=2, sequence_len=16, device_batch_size=8, sampling="indexed", eval_steps=2,
                            log_every=0), token_bytes=torch.ones(2004, dtype=torch.int64), log=lambda *a: None,
                record_rows=True)
    for a, b, both in zip(r0["rows"], r1["rows"], one.rows, strict=True):
        assert not {tuple(x) for x in a} & {tuple(x) for x in b}
        assert a + b == both
    # DDP averaged the gradients: both ranks hold the same weights, equal to one process's up to fp order
    assert r0["params"] == r1["params"]
    ref = torch.cat([p.detach().flatten() for p in one.model.parameters()])
    torch.testing.assert_close(torch.tensor(r0["params"]), ref, atol=1e-5, rtol=1e-4)
    assert r0["losses"] == r1["losses"]  # the logged loss is all-reduced
    torch.testing.assert_close(torch.tensor(r0["losses"]), torch.tensor(one.losses), atol=1e-5, rtol=1e-5)
    # bpb is all-reduced: both ranks report the union of their val rows, which is the 1-process figure
    assert r0["val_bpb"] == r1["val_bpb"]
    assert abs(r0["val_bpb"][-1][1] - one.val_bpb[-1][1]) < 1e-5
    assert r0["checkpoint"] and Path(r0["checkpoint"]).is_file() and r1["checkpoint"] is None
