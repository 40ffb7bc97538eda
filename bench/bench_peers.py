"""Training from object storage: ours against MosaicML Streaming (MDS) and litdata, same tokens, same server.

Setup (not timed): the shared real corpora (bench/real_tokens.py, ~18.7 M tokens of a 16k sentencepiece)
in our cache (shards of --shard-mb MiB, uncompressed and `--compress zstd`); the same windows (T+1 = 1025
tokens at stride T, IndexedWindowDataset's) written as MDS shards (MDSWriter, size_limit --shard-mb MiB,
no compression) and litdata chunks (BinaryWriter, chunk_bytes --shard-mb MiB); all uploaded to one moto S3
server on 127.0.0.1. Every read goes through a proxy in this script that holds each request --latency-ms
before forwarding it and lets all response bodies together through at --mbps MB/s, counting the bytes.

Each contender starts with an empty local cache bounded by --limit-mb (ours: --cache-limit; MDS:
cache_limit; litdata: max_cache_size) and reads --epochs epochs of B=32 windows, each batch followed by a
simulated 30 ms training step (time.sleep), through a DataLoader with --workers workers. Reported:
- first batch: seconds from constructing the dataset to the first batch in hand (cold cache);
- wait % of step: time spent inside next(loader) after the first batch, over the steps' 30 ms;
- batches/s over the steps after the first (33.3 is the step's own limit);
- fetched / needed: bytes the proxy served / token bytes of the windows read (uint16: B x 1025 x 2 a batch);
- peak held disk: the largest disk the local cache holds, sampled every 10 ms (and its bound): its files'
  allocated blocks plus the deleted files under it that the bench or its DataLoader workers still map
  (niels_gpt.readers.held.held_disk; a directory listing misses those).
Shuffles: ours ShardWindowSampler (K = --k shards at a time); MDS py1e with shuffle_block_size = K shards
of samples (its shard-aware shuffle, the same span); litdata shuffle=True (chunk order and items within a
chunk shuffled). Compressed rows: ours `--compress zstd` (frames), the peers' own zstd (MDS: each shard a
zstd file, decompressed whole on arrival; litdata: compression="zstd").

    # the peers, without letting pip touch torch (MDS imports transformers and torchvision at import; this
    # script stubs the two torchvision names MDS's vision datasets import when torchvision is missing):
    echo torch==2.13.0 > /tmp/c.txt
    .venv/bin/pip install -c /tmp/c.txt --no-deps mosaicml-streaming==0.13.0 litdata==0.2.76 transformers \\
        lightning-utilities safetensors brotli python-snappy cramjam zstd catalogue xxhash
    .venv/bin/python bench/bench_peers.py                 # ~4 min on 2 cores
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from bench_cache_common import table
from real_tokens import real_cache
from remote_servers import CREDS, DiskPeak, ProxyProcess, moto_server

B, T, STEP_S = 32, 1024, 0.030


def import_peers():
    """mosaicml-streaming and litdata, or None with the reason; torchvision stubbed where it is missing."""
    import importlib.machinery
    import types

    try:
        import torchvision  # noqa: F401
    except Exception:  # missing, or a build for another torch
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]
        mods = {}
        for name in ("torchvision", "torchvision.datasets", "torchvision.transforms", "torchvision.transforms.functional"):
            mods[name] = types.ModuleType(name)
            mods[name].__spec__ = importlib.machinery.ModuleSpec(name, None)
        mods["torchvision.datasets"].VisionDataset = type("VisionDataset", (), {})
        mods["torchvision.transforms.functional"].to_tensor = lambda x: x
        sys.modules.update(mods)
    try:
        import litdata
        import streaming
    except ImportError as exc:
        return None, f"{exc} (see this script's docstring for the install command)"
    return (streaming, litdata), None


def write_peers(ds, work: Path, shard_bytes: int, compression: str | None = None) -> tuple[Path, Path]:
    """Every window of `ds` as MDS shards and as litdata chunks (T+1 uint16 tokens a sample), each
    shard/chunk holding at most `shard_bytes` of samples; `compression`: both peers' own zstd."""
    from litdata.streaming.writer import BinaryWriter
    from streaming import MDSWriter

    tag = f"-{compression}" if compression else ""
    mds, lit = work / f"mds{tag}", work / f"lit{tag}"
    if not (mds / "index.json").is_file():
        shutil.rmtree(mds, ignore_errors=True)
        with MDSWriter(out=str(mds), columns={"tokens": "ndarray:uint16"}, compression=compression,
                       size_limit=shard_bytes) as w:
            for i in range(len(ds)):
                w.write({"tokens": window(ds, i)})
    if not (lit / "index.json").is_file():
        shutil.rmtree(lit, ignore_errors=True)
        w = BinaryWriter(str(lit), chunk_bytes=shard_bytes, compression=compression)
        for i in range(len(ds)):
            w[i] = window(ds, i)
        w.done()
        w.merge()
    return mds, lit


def window(ds, i: int) -> np.ndarray:
    item = ds[i]
    return np.concatenate([item["input_ids"][:1].numpy(), item["labels"].numpy()]).astype(np.uint16)


def upload(local: Path, url: str) -> None:
    from niels_gpt.storage import upload_tree

    upload_tree(local, url)


def run(make_loader, local_dir: Path, proxy: ProxyProcess, steps: int) -> dict:
    """Time to first batch, the steps' waits, bytes through the proxy and peak disk of one contender."""
    shutil.rmtree(local_dir, ignore_errors=True)
    local_dir.mkdir(parents=True)
    proxy.reset()
    disk = DiskPeak(local_dir)
    t0 = time.perf_counter()
    loader = make_loader()
    it = iter(loader)
    first = next(it)
    first_s = time.perf_counter() - t0
    waits, n = [], 1
    t_start = time.perf_counter()
    while n < steps:
        time.sleep(STEP_S)
        t = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            it = iter(loader)
            batch = next(it)
        waits.append(time.perf_counter() - t)
        n += 1
    total = time.perf_counter() - t_start
    fetched = proxy.bytes
    peak = disk.stop()
    del first, batch
    w = np.sort(np.asarray(waits)) * 1000
    return {"first_s": first_s, "wait_pct": 100 * sum(waits) / (STEP_S * len(waits)), "bps": len(waits) / total,
            "fetched": fetched, "needed": steps * B * (T + 1) * 2, "peak": peak,
            "wait_ms_p50_p99_max": (round(float(w[len(w) // 2]), 2), round(float(w[int(len(w) * .99)]), 2),
                                    round(float(w[-1]), 2))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default=None, help="directory for caches and peer shards (default: temporary)")
    ap.add_argument("--shard-mb", type=float, default=1.0, help="shard / chunk size in MiB (default 1)")
    ap.add_argument("--limit-mb", type=float, default=12.0, help="local cache bound in MiB (default 12)")
    ap.add_argument("--k", type=int, default=4, help="shards at a time for our sampler (default 4)")
    ap.add_argument("--latency-ms", type=float, default=50.0, help="added per request (default 50)")
    ap.add_argument("--mbps", type=float, default=100.0, help="bandwidth cap in MB/s (default 100)")
    ap.add_argument("--epochs", type=float, default=1.0, help="epochs to read (default 1)")
    ap.add_argument("--workers", type=int, default=0, help="DataLoader workers (default 0)")
    ap.add_argument("--only", nargs="*", default=None,
                    help="contenders to run (ours, ours-zstd, mds, litdata, mds-zstd, litdata-zstd; default: all)")
    args = ap.parse_args()
    os.environ.update(CREDS)
    peers, why = import_peers()
    shard_bytes, limit = int(args.shard_mb * (1 << 20)), int(args.limit_mb * (1 << 20))
    with tempfile.TemporaryDirectory(prefix="bench_peers_") as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        raw = real_cache(work, shard_bytes=shard_bytes)
        zst = real_cache(work, shard_bytes=shard_bytes, compress="zstd")
        from niels_gpt.loading.windows import IndexedWindowDataset

        local = IndexedWindowDataset(raw, T)
        steps = int(len(local) // B * args.epochs)
        mds = lit = mds_z = lit_z = None
        if peers is not None:
            mds, lit = write_peers(local, work, shard_bytes)
            mds_z, lit_z = write_peers(local, work, shard_bytes, "zstd")
        with moto_server() as s3_url:
            import fsspec
            import s3fs

            fsspec.config.conf["s3"] = {"endpoint_url": s3_url, "key": "testing", "secret": "testing"}
            s3fs.S3FileSystem.clear_instance_cache()
            s3fs.S3FileSystem().mkdir("bench")
            for path, name in ((raw, "ours"), (zst, "ours-zstd"), (mds, "mds"), (lit, "lit"), (mds_z, "mds-zstd"),
                               (lit_z, "lit-zstd")):
                if path is not None:
                    upload(path, f"s3://bench/{name}")
            proxy = ProxyProcess(s3_url, args.latency_ms / 1000, args.mbps * 1e6)
            fsspec.config.conf["s3"] = {"endpoint_url": proxy.url, "key": "testing", "secret": "testing"}
            s3fs.S3FileSystem.clear_instance_cache()
            os.environ["S3_ENDPOINT_URL"] = proxy.url  # MDS's boto3 client
            rows = []
            contenders = contenders_for(args, work, limit, peers, proxy)
            for name, (make, local_dir) in contenders.items():
                if args.only and name not in args.only:
                    continue
                r = run(make, local_dir, proxy, steps)
                rows.append([name, r["first_s"], r["wait_pct"], r["bps"], r["fetched"] / r["needed"],
                             r["peak"] / (1 << 20), limit / (1 << 20)])
                print(f"{name}: {r}", flush=True)
            proxy.close()
        print()
        print(table(f"{local.num_tokens if hasattr(local, 'num_tokens') else len(local) * T:,} tokens, {len(local):,} "
                    f"windows of {T + 1}; {steps} steps of B={B} with a {STEP_S * 1000:.0f} ms step; shards "
                    f"{args.shard_mb:g} MiB; S3 (moto) behind a proxy: {args.latency_ms:g} ms a request, "
                    f"{args.mbps:g} MB/s; {args.workers} DataLoader worker(s)" + (f"; peers skipped: {why}" if why else ""),
                    ["contender", "first batch s", "wait % of step", "batches/s", "fetched / needed", "peak held disk MiB",
                     "bound MiB"], rows))


def contenders_for(args, work: Path, limit: int, peers, proxy) -> dict:
    from niels_gpt.loading.sampler import ResumableDataLoader
    from niels_gpt.loading.shard_windows import ShardWindowSampler
    from niels_gpt.loading.windows import IndexedWindowDataset
    from niels_gpt.storage import configure

    def ours(name: str, local_dir: Path):
        def make():
            configure(cache_dir=local_dir, max_bytes=limit)
            ds = IndexedWindowDataset(f"s3://bench/{name}", T)
            sampler = ShardWindowSampler(ds, B, seed=0, shards_at_once=args.k, rank=0, world_size=1)
            sampler.end_after(int(len(ds) // B * args.epochs))  # where the run ends, as `train --steps` says
            return ResumableDataLoader(ds, sampler, num_workers=args.workers)
        return make, local_dir

    out = {"ours": ours("ours", work / "local-ours"), "ours-zstd": ours("ours-zstd", work / "local-ours-zstd")}
    if peers is None:
        return out
    _, litdata = peers

    def mds(name: str):
        def make():
            from streaming import StreamingDataset
            from streaming.base.util import clean_stale_shared_memory

            clean_stale_shared_memory()
            per_shard = max(1, int(args.shard_mb * (1 << 20)) // ((T + 1) * 2))
            ds = StreamingDataset(remote=f"s3://bench/{name}", local=str(work / f"local-{name}"), shuffle=True,
                                  batch_size=B, cache_limit=limit, shuffle_block_size=args.k * per_shard,
                                  predownload=8 * B)
            return torch.utils.data.DataLoader(ds, batch_size=B, num_workers=args.workers)
        return make, work / f"local-{name}"

    def lit(name: str):
        def make():
            ds = litdata.StreamingDataset(f"s3://bench/{name}", cache_dir=str(work / f"local-{name}"), shuffle=True,
                                          max_cache_size=limit,
                                          storage_options={"endpoint_url": proxy.url, "aws_access_key_id": "testing",
                                                           "aws_secret_access_key": "testing"})
            return litdata.StreamingDataLoader(ds, batch_size=B, num_workers=args.workers)
        return make, work / f"local-{name}"

    out.update({"mds": mds("mds"), "litdata": lit("lit"), "mds-zstd": mds("mds-zstd"), "litdata-zstd": lit("lit-zstd")})
    return out


if __name__ == "__main__":
    main()
