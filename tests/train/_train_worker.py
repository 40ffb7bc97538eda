"""One rank of the two-process gloo training run in test_ddp.py (not a test module: no test_ prefix).

argv: data, out_dir, result json. Env: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT.
"""

import json
import sys

import torch
import torch.distributed as dist

from niels_gpt.train.train import TrainConfig, train


def main(data: str, out_dir: str, result_path: str) -> None:
    cfg = TrainConfig(data=data, out_dir=out_dir, steps=3, depth=1, n_embd=32, n_head=2, sequence_len=16,
                      device_batch_size=4, sampling="indexed", eval_steps=2, log_every=0)
    token_bytes = torch.ones(2004, dtype=torch.int64)
    r = train(cfg, token_bytes=token_bytes, log=lambda *a: None, record_rows=True)
    result = {"rank": dist.get_rank(), "world": dist.get_world_size(), "losses": r.losses, "rows": r.rows,
              "val_bpb": r.val_bpb, "checkpoint": r.checkpoint,
              "params": torch.cat([p.detach().flatten() for p in r.model.parameters()]).tolist()}
    with open(result_path, "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
