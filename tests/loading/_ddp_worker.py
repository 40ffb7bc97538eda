"""One rank of the two-process gloo run in test_ddp.py (not a test module: no test_ prefix).

argv: out_dir. Env: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT.
"""

import json
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from niels_gpt.loading import GlobalBatchSampler, evaluate_bpb

N, G, V, T = 103, 10, 11, 5


def main(out_dir: str) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    sampler = GlobalBatchSampler(range(N), G, seed=13)  # rank and world size from torch.distributed
    batches = list(sampler)
    torch.manual_seed(0)
    model = torch.nn.Embedding(V, V)  # same weights on both ranks: logits = row of the input id
    token_bytes = torch.tensor([0, 1, 2, 3, 1, 1, 2, 4, 1, 1, 3])
    g = torch.Generator().manual_seed(100 + rank)  # each rank scores different data
    data = [(torch.randint(V, (2, T), generator=g), torch.randint(V, (2, T), generator=g)) for _ in range(3)]
    bpb = evaluate_bpb(model, data, token_bytes)
    result = {"rank": rank, "world_size": dist.get_world_size(), "batches": batches, "bpb": bpb,
              "data": [[x.tolist(), y.tolist()] for x, y in data]}
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
