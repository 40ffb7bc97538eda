"""Soak: one epoch from S3 through a throttled proxy at 10,000 shards under a bound of 5% of the split; and the
two window readers' batch cost over the same shards.

    .venv/bin/python bench/bench_soak.py soak      # 2 ranks x 2 DataLoader workers, IndexedWindowDataset
    .venv/bin/python bench/bench_soak.py readers   # IndexedWindowDataset batches against get_batch's

soak: a synthetic pretraining cache of --shards shards (--shard-tokens uint16 tokens each; build's own
shard writer, bench_cache_common.py) is uploaded to a moto S3 server started here, read through a proxy
(remote_servers.ProxyProcess) that holds each request --latency-ms and lets all bodies together through at
--mbps MB/s, counting the bytes it serves. Two processes play two ranks of one host (rank/world_size
arguments, one shared download cache bounded at --bound of the split's bytes); each reads its half of one
epoch of IndexedWindowDataset windows (T = --T) with ShardWindowSampler (--k shards at a time) through a
ResumableDataLoader with --workers workers, each batch followed by a simulated --step-ms training step.
Printed: time to first batch, wait % of the steps (time inside next(loader) after the first batch), bytes
the proxy served / token bytes the windows needed, the peak held disk of the download cache (its mirrored
files' bytes, as the bound counts them, plus deleted files either rank or its workers still map:
niels_gpt.readers.held, sampled every 10 ms) against the bound, and each rank's peak RSS (its own and its
workers' summed, sampled every 50 steps).

readers: the same B x T batches through IndexedWindowDataset.__getitems__ + collate_windows (the exact-resume
reader, random indices) and PretrainTokenStreamDataset.get_batch (random windows) over one local synthetic
cache, warm page cache, one thread; best of --repeats timings of --batches batches each; prints both and
the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from bench_cache_common import table, write_synthetic_pretrain_cache


def best_us(fns, batches: int, repeats: int) -> list[float]:
    """Best time per call of each of `fns`, timed in turns (a busy machine slows both alike)."""
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            for _ in range(batches):
                fn()
            best[i] = min(best[i], (time.perf_counter() - t0) / batches)
    return [b * 1e6 for b in best]


def readers(args) -> None:
    from niels_gpt.cache.pretrain_dataset import PretrainTokenStreamDataset
    from niels_gpt.loading.windows import IndexedWindowDataset, collate_windows

    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_soak_") as tmp:
        cache = write_synthetic_pretrain_cache(Path(args.work or tmp) / "readers", int(args.tokens),
                                               shard_bytes=int(args.shard_mb * (1 << 20)))
        for B, T in ((32, 1024), (8, 4096), (64, 256)):
            stream = PretrainTokenStreamDataset(str(cache / "train"), T=T, device="cpu")
            indexed = IndexedWindowDataset(cache, T)
            g = torch.Generator().manual_seed(0)
            rng = np.random.default_rng(0)
            picks = [rng.integers(0, len(indexed), B).tolist() for _ in range(256)]
            it = iter(range(1 << 62))
            stream.get_batch(B=B, generator=g)
            collate_windows(indexed.__getitems__(picks[0]))
            for _ in range(3):  # warm the page cache over every shard
                for p in picks:
                    collate_windows(indexed.__getitems__(p))
            t_stream, t_index = best_us(
                [lambda s=stream, b=B, g=g: s.get_batch(B=b, generator=g),
                 lambda d=indexed, p=picks, it=it: collate_windows(d.__getitems__(p[next(it) % len(p)]))],
                args.batches, args.repeats)
            rows.append([f"{B}x{T}", t_stream, t_index, t_index / t_stream])
    print(table(f"{args.tokens:,.0f} synthetic tokens in shards of {args.shard_mb:g} MiB, one thread, warm page cache, "
                f"best of {args.repeats} x {args.batches} batches",
                ["B x T", "get_batch us", "__getitems__+collate us", "ratio"], rows))


def rank_main(args) -> None:
    """One rank of the soak: its half of one epoch, timed; prints one JSON line."""
    import resource

    from niels_gpt.loading.sampler import ResumableDataLoader
    from niels_gpt.loading.shard_windows import ShardWindowSampler
    from niels_gpt.loading.windows import IndexedWindowDataset
    from niels_gpt.storage import configure

    configure(cache_dir=args.download_cache, max_bytes=args.bound_bytes)
    t0 = time.perf_counter()
    ds = IndexedWindowDataset(args.url, args.T)
    sampler = ShardWindowSampler(ds, args.B * 2, seed=0, shards_at_once=args.k, rank=args.rank, world_size=2)
    steps = len(ds) // (args.B * 2)
    sampler.end_after(steps)
    loader = ResumableDataLoader(ds, sampler, num_workers=args.workers)
    it = iter(loader)
    next(it)
    first_s = time.perf_counter() - t0
    waits, rss_peak = [], 0
    for _ in range(steps - 1):
        time.sleep(args.step_ms / 1000)
        t = time.perf_counter()
        next(it)
        waits.append(time.perf_counter() - t)
        if len(waits) % 50 == 0:
            rss_peak = max(rss_peak, rss_tree(os.getpid()))
    rss_peak = max(rss_peak, rss_tree(os.getpid()))
    sampler.prefetcher.close()
    print(json.dumps({"rank": args.rank, "first_s": first_s, "steps": steps, "wait_s": sum(waits),
                      "wait_pct": 100 * sum(waits) / (args.step_ms / 1000 * max(1, len(waits))),
                      "needed": steps * args.B * (args.T + 1) * 2, "rss_peak": rss_peak,
                      "maxrss_self": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}), flush=True)


def rss_tree(pid: int) -> int:
    """Resident bytes of `pid` and its descendants (its DataLoader workers)."""
    from niels_gpt.readers.held import descendants

    total = 0
    for p in [pid, *descendants(pid)]:
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            pass
    return total


def soak(args) -> None:
    from remote_servers import CREDS, DiskPeak, ProxyProcess, moto_server

    os.environ.update(CREDS)
    with tempfile.TemporaryDirectory(prefix="bench_soak_") as tmp:
        work = Path(args.work or tmp)
        shard_bytes = args.shard_tokens * 2
        cache = work / f"soak-{args.shards}x{args.shard_tokens}"
        if not (cache / "meta.json").is_file():
            write_synthetic_pretrain_cache(cache, args.shards * args.shard_tokens, shard_bytes=shard_bytes)
        split_bytes = sum(p.stat().st_size for p in (cache / "train").glob("shard_*.bin"))
        bound = int(split_bytes * args.bound) + (cache / "meta.json").stat().st_size
        with moto_server() as s3_url:
            import fsspec
            import s3fs

            fsspec.config.conf["s3"] = {"endpoint_url": s3_url, "key": "testing", "secret": "testing"}
            s3fs.S3FileSystem.clear_instance_cache()
            fs = s3fs.S3FileSystem()
            fs.mkdir("soak")
            t = time.perf_counter()
            # NOTE: fsspec's batched put, many files in flight (upload_tree sends one at a time);
            # the marker last, as upload_tree does
            for split in ("train", "val"):
                files = sorted(str(p) for p in (cache / split).iterdir())
                if files:
                    fs.put(files, f"s3://soak/c/{split}/")
            fs.put_file(str(cache / "meta.json"), "s3://soak/c/meta.json")
            print(f"uploaded {args.shards:,} shards ({split_bytes / 1e6:.1f} MB) in {time.perf_counter() - t:.0f} s",
                  flush=True)
            proxy = ProxyProcess(s3_url, args.latency_ms / 1000, args.mbps * 1e6)
            local = work / "download-cache"
            env = {**os.environ, "LOCAL_WORLD_SIZE": "2",  # as torchrun tells two ranks of one host
                   "FSSPEC_S3": json.dumps({"endpoint_url": proxy.url, "key": "testing", "secret": "testing"})}
            proxy.reset()
            ranks = [subprocess.Popen([sys.executable, __file__, "rank", "--rank", str(r), "--url", "s3://soak/c",
                                       "--download-cache", str(local), "--bound-bytes", str(bound),
                                       *forward(args)], stdout=subprocess.PIPE, text=True, env=env)
                     for r in range(2)]
            disk = DiskPeak(local, [p.pid for p in ranks], whole=False)
            outs = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in ranks]
            peak = disk.stop()
            fetched = proxy.bytes
            proxy.close()
    needed = sum(o["needed"] for o in outs)
    rows = [[o["rank"], o["first_s"], o["wait_pct"], o["rss_peak"] / 2**20] for o in outs]
    print(table(f"{args.shards:,} shards of {args.shard_tokens:,} tokens ({split_bytes / 1e6:.1f} MB), bound "
                f"{bound / 1e6:.2f} MB ({args.bound:.0%} of the split + marker); 2 ranks x {args.workers} workers, "
                f"B={args.B} T={args.T} K={args.k}, {args.step_ms:g} ms step; proxy {args.latency_ms:g} ms a request, "
                f"{args.mbps:g} MB/s",
                ["rank", "first batch s", "wait % of step", "peak RSS MiB (rank + workers)"], rows))
    print(f"fetched / needed: {fetched / needed:.3f} ({fetched / 1e6:.1f} MB / {needed / 1e6:.1f} MB)")
    print(f"peak held disk: {peak / 1e6:.2f} MB against a bound of {bound / 1e6:.2f} MB ({peak / bound:.2f}x)")


def forward(args) -> list[str]:
    return ["--T", str(args.T), "--B", str(args.B), "--k", str(args.k), "--workers", str(args.workers),
            "--step-ms", str(args.step_ms)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["soak", "readers", "rank"])
    ap.add_argument("--work", default=None, help="directory for caches (default: temporary)")
    ap.add_argument("--shards", type=int, default=10_000, help="soak: shards in the split (default 10,000)")
    ap.add_argument("--shard-tokens", type=int, default=4_097, help="soak: tokens a shard (default 4,097)")
    ap.add_argument("--bound", type=float, default=0.05, help="soak: the bound, a share of the split (default 0.05)")
    ap.add_argument("--latency-ms", type=float, default=20.0, help="soak: added per request (default 20)")
    ap.add_argument("--mbps", type=float, default=50.0, help="soak: bandwidth cap in MB/s (default 50)")
    ap.add_argument("--T", type=int, default=256, help="window length (default 256)")
    ap.add_argument("--B", type=int, default=16, help="soak: per-rank batch (default 16)")
    ap.add_argument("--k", type=int, default=8, help="soak: shards at a time (default 8)")
    ap.add_argument("--workers", type=int, default=2, help="soak: DataLoader workers per rank (default 2)")
    ap.add_argument("--step-ms", type=float, default=10.0, help="soak: simulated step (default 10)")
    ap.add_argument("--tokens", type=float, default=48e6, help="readers: tokens (default 48M)")
    ap.add_argument("--shard-mb", type=float, default=32, help="readers: shard size in MiB (default 32)")
    ap.add_argument("--batches", type=int, default=2000, help="readers: batches a timing (default 2000)")
    ap.add_argument("--repeats", type=int, default=5, help="readers: timings, best kept (default 5)")
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--url", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--download-cache", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--bound-bytes", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    {"soak": soak, "readers": readers, "rank": rank_main}[args.mode](args)


if __name__ == "__main__":
    main()
