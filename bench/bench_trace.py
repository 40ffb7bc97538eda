"""The reverse lookup of `trace` (`--document`): a global order's per-epoch scan against the per-step replay.

A run of STEPS steps of 8 rows over a cache of 1,025 windows (T=16), fabricated from a one-step run whose
checkpoint is saved again as step STEPS; the same document looked up in an indexed-window run (one slice and
one np.isin per epoch) and in a random-window run (every step's draws replayed). Prints both times and the
ratio. Then the first question about a pretraining split, which finds its documents: the scan of a 200 MB
split (100 M tokens, two shards) against reading its bytes (np.fromfile), both from the page cache.

    PYTHONPATH=. python bench/bench_trace.py [--steps 10000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import write_pretrain_cache  # noqa: E402  (the test suite's cache writer)

from niels_gpt.trace import trace_document  # noqa: E402
from niels_gpt.trace.documents import CacheDocuments  # noqa: E402
from niels_gpt.train.checkpoint import save_checkpoint  # noqa: E402
from niels_gpt.train.train import TrainConfig, load_checkpoint, train  # noqa: E402


def lookup(root: Path, steps: int, sampling: str) -> tuple[float, int]:
    g = np.random.default_rng(0)
    docs = []
    while sum(map(len, docs)) < 16_401:
        docs.append(np.append(g.integers(10, 2000, g.integers(20, 60)), 6))
    tokens = np.concatenate(docs)
    cache = write_pretrain_cache(root / "cache", {"train": [tokens[:16_401]], "val": [tokens[:600]]})
    run = root / "run"
    train(TrainConfig(data=str(cache), out_dir=str(run), depth=1, n_embd=32, n_head=2, sequence_len=16,
                      device_batch_size=8, steps=1, eval_steps=1, log_every=0, sampling=sampling),
          token_bytes=torch.ones(2004, dtype=torch.int64), log=lambda *a: None)
    ckpt = load_checkpoint(run / "ckpt_000001.pt")
    ckpt.pop("verified")
    ckpt["step"], ckpt["train_config"]["steps"] = steps, steps
    save_checkpoint(run / f"ckpt_{steps:06d}.pt", ckpt)
    (run / "ckpt_000001.pt").unlink()
    t = time.perf_counter()
    found = trace_document(run, "train:7")
    return time.perf_counter() - t, len(found["steps"])


def scan(root: Path, n: int = 100_000_000) -> tuple[float, float]:
    g = np.random.default_rng(0)
    tokens = g.integers(10, 2000, n, dtype=np.uint16)
    tokens[g.integers(0, n, n // 500)] = 6
    cache = write_pretrain_cache(root / "big", {"train": [tokens[:n // 2], tokens[n // 2:]], "val": [tokens[:1000]]})
    best_scan = best_read = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        CacheDocuments(str(cache), "train")
        best_scan = min(best_scan, time.perf_counter() - t)
        t = time.perf_counter()
        for shard in sorted((cache / "train").glob("*.bin")):
            np.fromfile(shard, dtype=np.uint16)
        best_read = min(best_read, time.perf_counter() - t)
    return best_scan, best_read


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        indexed, n_i = lookup(Path(tmp) / "indexed", args.steps, "indexed")
        random, n_r = lookup(Path(tmp) / "random", args.steps, "random")
        scanned, read = scan(Path(tmp))
    print(f"{args.steps:,} steps x 8 rows, 1,025 windows: indexed {indexed:.2f} s ({n_i} sequences), random windows "
          f"{random:.2f} s ({n_r}); the per-epoch scan takes {indexed / random:.3f}x the per-step replay's time")
    print(f"documents of a 200 MB split: {scanned:.2f} s ({0.2 / scanned:.2f} GB/s), {scanned / read:.2f}x reading its "
          "bytes")


if __name__ == "__main__":
    main()
