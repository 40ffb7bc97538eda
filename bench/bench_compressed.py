"""Compressed shards (`--compress zstd`) against uncompressed ones on real tokens: size, and random windows.

The shared real corpora (bench/real_tokens.py: ~18 M tokens of a 16k sentencepiece) built twice by the
library's builder, uncompressed and compressed, in the same shards. Reported:
- size: bytes of the uncompressed cache / bytes of the compressed one (meta.json's records);
- warm random windows: `PretrainTokenStreamDataset.get_batch(B=32, T=1024)` batches/s of each, timed in
  turns (best of --repeat x --batches), the compressed reader after a pass that leaves the frames its batches
  reach in its frame cache (the default 64 MiB holds the whole split here): the analogue of a warm page cache;
- frame-cache misses: the same with a frame cache of a quarter of the split, where most batches decompress
  frames (~25 us each here): what random windows over a split larger than the frame cache cost;
- batches equal bit for bit (checked on every timed contender's first batches).

    .venv/bin/python bench/bench_compressed.py                 # ~1 min on 2 cores (the builds included)
    .venv/bin/python bench/bench_compressed.py --work /tmp/w   # keep the caches for the next run
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
from bench_cache_common import best_rate, table
from real_tokens import real_cache

from niels_gpt.cache.pretrain_dataset import PretrainTokenStreamDataset


def cache_bytes(cache: Path) -> int:
    return sum(r["bytes"] for r in json.loads((cache / "meta.json").read_text())["files"].values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default=None, help="directory for the caches (default: a temporary one, removed)")
    ap.add_argument("--shard-mb", type=int, default=8, help="shard size in MiB of uncompressed tokens (default 8)")
    ap.add_argument("--batches", type=int, default=2000, help="batches per timed run (default 2000)")
    ap.add_argument("--repeat", type=int, default=5, help="timed runs, best kept (default 5)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_compressed_") as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        raw = real_cache(work, shard_bytes=args.shard_mb << 20)
        zst = real_cache(work, shard_bytes=args.shard_mb << 20, compress="zstd")
        ratio = cache_bytes(raw) / cache_bytes(zst)
        a = PretrainTokenStreamDataset(str(raw / "train"), T=1024, device="cpu")
        b = PretrainTokenStreamDataset(str(zst / "train"), T=1024, device="cpu")
        split_bytes = a.num_tokens * 2
        c = PretrainTokenStreamDataset(str(zst / "train"), T=1024, device="cpu", frame_cache_bytes=split_bytes // 4)
        ga, gb, gc = (torch.Generator().manual_seed(0) for _ in range(3))
        for _ in range(50):
            x = a.get_batch(B=32, generator=ga)[0]
            assert torch.equal(x, b.get_batch(B=32, generator=gb)[0]) and torch.equal(x, c.get_batch(B=32, generator=gc)[0])
        warm = torch.Generator().manual_seed(1)
        for _ in range(3000):  # the frames of random windows, until (nearly) all are resident
            b.get_batch(B=32, generator=warm)
        rates = dict.fromkeys(("raw", "zst", "zst-quarter"), 0.0)
        fns = {"raw": lambda: a.get_batch(B=32, generator=ga), "zst": lambda: b.get_batch(B=32, generator=gb),
               "zst-quarter": lambda: c.get_batch(B=32, generator=gc)}
        for _ in range(args.repeat):
            for name, fn in fns.items():
                n = args.batches if name != "zst-quarter" else max(50, args.batches // 20)
                rates[name] = max(rates[name], best_rate(fn, n=n, repeat=1))
        fc = b.core.frames
        rows = [["uncompressed", cache_bytes(raw), 1.0, rates["raw"], 1.0, "-"],
                ["zstd, frame cache 64 MiB", cache_bytes(zst), ratio, rates["zst"], rates["zst"] / rates["raw"],
                 f"{fc.count}/{fc.total_frames}"],
                [f"zstd, frame cache {split_bytes // 4 >> 20} MiB", cache_bytes(zst), ratio, rates["zst-quarter"],
                 rates["zst-quarter"] / rates["raw"], f"{c.core.frames.count}/{c.core.frames.total_frames}"]]
        print(table(f"real tokens: {a.num_tokens:,} train tokens in {len(a.shard_names)} shards of {args.shard_mb} MiB "
                    f"(frames of {b.frame_tokens} tokens); random windows B=32 T=1024, batches/s best of "
                    f"{args.repeat} timed in turns; batches equal bit for bit",
                    ["cache", "bytes", "x smaller", "batches/s", "x uncompressed", "frames resident"], rows))


if __name__ == "__main__":
    main()
