"""Random windows from a cold page cache: plain np.memmap vs our mmap + MADV_RANDOM reader.

A synthetic multi-GB pretraining cache (real layout, 128 MB shards) is written under --work (default
/tmp) and deleted at the end. For each reader, the page cache is emptied first (`sync; echo 3 >
/proc/sys/vm/drop_caches` as root, else posix_fadvise(POSIX_FADV_DONTNEED) on every shard), then
B=32,T=1024 batches are drawn for --seconds (or --batches): batches/s and the bytes the process read
from disk per batch (/proc/self/io read_bytes). Then the same on a warm cache (every shard read once
beforehand, every page already mapped by a first pass), where MADV_RANDOM must cost nothing.

Readers (each opens the shards once, as a long training run does):
- plain np.memmap: the kernel's default read-ahead; rows sliced per window, np.stack, int64;
- ours: PretrainTokenStreamDataset.get_batch (mmap + MADV_RANDOM, one gather per batch).

    .venv/bin/python bench/bench_cache_cold.py                  # 4 GB cache, ~3 min on 2 cores
    .venv/bin/python bench/bench_cache_cold.py --gb 1 --batches 100   # quicker
"""

from __future__ import annotations

import argparse
import gc
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from bench_cache_common import evict, proc_read_bytes, table, write_synthetic_pretrain_cache

from niels_gpt.cache.pretrain_dataset import PretrainTokenStreamDataset

GB = 4.0
B, T = 32, 1024
SECONDS = 15.0
MAX_BATCHES = 300  # a cold page cache: before the touched pages cover much of the cache


class PlainMemmap:
    """np.memmap per shard (default read-ahead), a shard per row in proportion to its windows."""

    def __init__(self, ds: PretrainTokenStreamDataset):
        self.maps = [np.memmap(ds.shards_dir / n, dtype=np.uint16, mode="r") for n in ds.shard_names]
        self.ds = ds

    def get_batch(self, *, B: int, generator: torch.Generator):
        shard, local = self.ds.sample_starts(B, generator)
        w = np.stack([self.maps[k][s:s + self.ds.T + 1] for k, s in zip(shard.tolist(), local.tolist(), strict=True)])
        w = torch.from_numpy(w.astype(np.int64))
        return w[:, :-1].contiguous(), w[:, 1:].contiguous()


def run(reader, seconds: float, max_batches: int) -> tuple[int, float, int]:
    g = torch.Generator().manual_seed(0)
    r0, t0, n = proc_read_bytes(), time.perf_counter(), 0
    while n < max_batches and time.perf_counter() - t0 < seconds:
        reader.get_batch(B=B, generator=g)
        n += 1
    return n, time.perf_counter() - t0, proc_read_bytes() - r0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--gb", type=float, default=GB, help="size of the synthetic cache (GB of uint16 tokens)")
    ap.add_argument("--seconds", type=float, default=SECONDS, help="time per reader and state")
    ap.add_argument("--batches", type=int, default=MAX_BATCHES, help="at most this many batches per run")
    ap.add_argument("--work", default="/tmp", help="directory for the synthetic cache")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="bench_cache_cold_", dir=args.work))
    try:
        n_tokens = int(args.gb * 1e9) // 2
        t0 = time.perf_counter()
        cache = write_synthetic_pretrain_cache(work / "c", n_tokens)
        print(f"wrote {n_tokens:,} tokens ({args.gb} GB) in {time.perf_counter() - t0:.0f} s under {work}", flush=True)
        shards = sorted((cache / "train").glob("shard_*.bin"))
        ds = PretrainTokenStreamDataset(str(cache / "train"), T=T, device="cpu")
        readers = {"plain np.memmap": lambda: PlainMemmap(ds),
                   "ours (mmap + MADV_RANDOM)": lambda: PretrainTokenStreamDataset(str(cache / "train"), T=T,
                                                                                   device="cpu")}
        rows, rate = [], {}
        batch_bytes = B * (T + 1) * 2
        reader = None
        for state in ("cold", "warm"):
            for name, make in readers.items():
                # NOTE: pages still mapped by the previous reader survive drop_caches: unmap first
                reader = None
                gc.collect()
                if state == "cold":
                    how = evict(shards)
                else:
                    for p in shards:  # every shard in the page cache
                        with open(p, "rb") as f:
                            while f.read(1 << 24):
                                pass
                    how = "all shards read first"
                reader = make()
                if state == "warm":  # map every page once, as a long run has
                    run(reader, args.seconds / 3, args.batches)
                n, dt, read = run(reader, args.seconds, args.batches)
                rate[state, name] = n / dt
                rows.append([state, name, how, n, n / dt, read / n / 1e6, read / n / batch_bytes])
        for r in rows:
            r.append(rate[r[0], r[1]] / rate[r[0], "plain np.memmap"])
        print(table(f"\nRandom windows B={B} T={T} from a {args.gb} GB cache (1 thread); a batch needs "
                    f"{batch_bytes / 1e3:.0f} kB", ["page cache", "reader", "eviction", "batches", "batches/s",
                                                   "disk MB/batch", "x needed bytes", "x plain memmap"], rows))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
