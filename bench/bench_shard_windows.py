"""What shard-window sampling costs in batch statistics: batches from K shards at a time vs the global order.

On the shared real corpora (bench/real_tokens.py: debian-docs, then the Gutenberg books, wikitext and
tinyshakespeare, in that order, as one unshuffled stream: the hard case, shards differ by source and topic)
in shards of --shard-mb MiB, windows of T=1024, global batches of B=32, for K in --k and the global order:
- excess KL: the mean over --batches batches of KL(batch's token histogram || the split's), minus the same
  for the global random order (which is pure sampling noise): how far a batch's tokens stray from the
  corpus because it reads K shards only (0 = indistinguishable from global random batches);
- shards per batch (mean) and shards held at once (the most shards between their first and last window).

    .venv/bin/python bench/bench_shard_windows.py --work /tmp/w      # ~1 min (the cache build included)
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
from bench_cache_common import table
from real_tokens import real_cache

from niels_gpt.loading.order import epoch_permutation
from niels_gpt.loading.shard_windows import shard_window_order
from niels_gpt.loading.windows import IndexedWindowDataset


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default=None, help="directory for the cache (default: a temporary one)")
    ap.add_argument("--shard-mb", type=float, default=1.0, help="shard size in MiB (default 1)")
    ap.add_argument("--k", type=int, nargs="+", default=[1, 2, 4, 8, 16], help="shards at a time to try")
    ap.add_argument("--batches", type=int, default=300, help="batches per order (default 300)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_shard_windows_") as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        ds = IndexedWindowDataset(real_cache(work, shard_bytes=int(args.shard_mb * (1 << 20))), 1024)
        vocab = 1 << 16
        corpus = np.zeros(vocab, dtype=np.float64)
        for k in range(len(ds.paths)):
            corpus += np.bincount(ds.core.shard(k), minlength=vocab)
        corpus = (corpus + 1e-9) / corpus.sum()

        def kl(order) -> tuple[float, float]:
            out, shards = [], []
            step = max(1, len(order) // 32 // args.batches)
            for b in range(0, args.batches * step, step):
                idx = order[b * 32:(b + 1) * 32]
                if len(idx) < 32:
                    break
                h = np.bincount(np.concatenate([ds[i]["input_ids"].numpy() for i in idx]), minlength=vocab) / (32 * 1024)
                nz = h > 0
                out.append(float((h[nz] * np.log(h[nz] / corpus[nz])).sum()))
                shards.append(len(ds.shard_files(idx)))
            return float(np.mean(out)), float(np.mean(shards))

        def held(order) -> int:
            shard = np.searchsorted(ds.cumulative, order, side="right") - 1
            first = {s: i for i, s in reversed(list(enumerate(shard.tolist())))}
            last = {s: i for i, s in enumerate(shard.tolist())}
            events = np.zeros(len(order) + 1, dtype=np.int64)
            for s in first:
                events[first[s]] += 1
                events[last[s] + 1] -= 1
            return int(np.cumsum(events).max())

        base = epoch_permutation(len(ds), 0, 0).numpy()
        base_kl, base_shards = kl(base)
        rows = [["global random", 0.0, base_shards, held(base)]]
        for K in args.k:
            order = shard_window_order(ds.shard_counts(), K, 0, 0).numpy()
            k_kl, k_shards = kl(order)
            rows.append([f"K={K}", k_kl - base_kl, k_shards, held(order)])
        print(table(f"{len(ds):,} windows of T=1024 in {len(ds.paths)} shards of {args.shard_mb:g} MiB (real corpora, "
                    f"unshuffled build); B=32; {args.batches} batches spread over the epoch; global random KL "
                    f"{base_kl:.3f} nats", ["order", "excess KL (nats)", "shards per batch", "shards held at once"], rows))


if __name__ == "__main__":
    main()
