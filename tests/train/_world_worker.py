"""One rank of a gloo training run in test_world_size.py (not a test module: no test_ prefix).

argv: the TrainConfig as JSON, result json. Env: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT.
"""

import json
import sys

import torch
import torch.distributed as dist

from niels_gpt.train.train import TrainConfig, train


def main(config: str, result_path: str) -> None:
    r = train(TrainConfig(**json.loads(config)), token_bytes=torch.ones(2004, dtype=torch.int64),
              log=lambda *a: None, record_rows=True)
    with open(result_path, "w") as f:
        json.dump({"losses": r.losses, "rows": r.rows, "val_bpb": r.val_bpb, "checkpoint": r.checkpoint}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:3])
