"""A real two-process run over gloo: ranks see disjoint data covering the epoch; bpb is all-reduced."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import torch

from niels_gpt.loading import evaluate_bpb, global_batches

WORKER = Path(__file__).with_name("_ddp_worker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_gloo_ranks_see_disjoint_batches_covering_the_epoch(tmp_path):
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2"}
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(tmp_path)], env={**env, "RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for r in range(2)]
    try:
        outs = [p.communicate(timeout=90)[0].decode() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], outs
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert r0["world_size"] == r1["world_size"] == 2
    a = [i for b in r0["batches"] for i in b]
    b = [i for b in r1["batches"] for i in b]
    assert not set(a) & set(b) and len(a) == len(b) == 50
    expected = global_batches(103, 10, seed=13, epoch=0)
    assert [x + y for x, y in zip(r0["batches"], r1["batches"], strict=True)] == expected
    # every rank returns the bpb of the union of both ranks' data
    torch.manual_seed(0)
    model = torch.nn.Embedding(11, 11)
    token_bytes = torch.tensor([0, 1, 2, 3, 1, 1, 2, 4, 1, 1, 3])
    union = [(torch.tensor(x), torch.tensor(y)) for r in (r0, r1) for x, y in r["data"]]
    assert r0["bpb"] == r1["bpb"]
    assert abs(r0["bpb"] - evaluate_bpb(model, union, token_bytes)) < 1e-12
