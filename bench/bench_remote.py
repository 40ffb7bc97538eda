"""Random-window batches from a cache at a URL vs the same cache on local disk; prints ratios.

One synthetic pretraining cache (real layout and meta.json, `--tokens` uint16 ids in shards of
`--shard-mb`) is read three ways, B x T random windows by `PretrainTokenStreamDataset.get_batch`:
- local: the directory itself (the reference);
- first epoch: through a URL with an empty local download cache, so the time includes fetching
  every shard the draws reach and checking its sha256 (construction included);
- warm: a new dataset on the same URL once every shard is mirrored (what every later run and every
  other rank on the machine sees).
Two stores, both real servers on 127.0.0.1: moto's S3 server (`moto[server]`, a subprocess) and
Python's http.server (a thread). Batches are checked equal to the local ones.

    .venv/bin/python bench/bench_remote.py                      # ~1 min on 2 cores
    .venv/bin/python bench/bench_remote.py --tokens 20e6 --batches 200
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import tempfile
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import torch
from bench_cache_common import best_rate, table, write_synthetic_pretrain_cache
from remote_servers import CREDS, moto_server

from niels_gpt.cache.pretrain_dataset import PretrainTokenStreamDataset
from niels_gpt.storage import configure, upload_tree


@contextlib.contextmanager
def moto_s3():
    """A moto S3 server subprocess; yields its endpoint and sets fsspec's s3 options to use it."""
    import fsspec

    os.environ.update(CREDS)
    with moto_server() as url:
        fsspec.config.conf["s3"] = {"endpoint_url": url, "key": "testing", "secret": "testing"}
        yield url


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@contextlib.contextmanager
def http_server(directory: Path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(directory)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def run_batches(ds, B: int, n: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [ds.get_batch(B=B, generator=g)[0] for _ in range(n)]


def interleaved(fns: dict, args) -> dict:
    """Best batches/s of each contender, timed in turns (the shared machine's noise hits all alike)."""
    best = dict.fromkeys(fns, 0.0)
    for _ in range(args.repeat):
        for name, fn in fns.items():
            best[name] = max(best[name], best_rate(fn, n=args.batches, repeat=1))
    return best


def measure(url: str, local_ds, args, downloads: Path, want: list[torch.Tensor]) -> tuple[float, float, float]:
    """(first-epoch batches/s, warm batches/s, local batches/s timed in turns with warm) through `url`."""
    configure(cache_dir=downloads, max_bytes=1 << 40)
    t0 = time.perf_counter()
    ds = PretrainTokenStreamDataset(f"{url}/train", T=args.T, device="cpu")
    got = run_batches(ds, args.B, args.batches)
    first = args.batches / (time.perf_counter() - t0)
    assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True)), f"{url}: batches differ from local"
    warm_ds = PretrainTokenStreamDataset(f"{url}/train", T=args.T, device="cpu")
    gw, gl = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    rates = interleaved({"warm": lambda: warm_ds.get_batch(B=args.B, generator=gw),
                         "local": lambda: local_ds.get_batch(B=args.B, generator=gl)}, args)
    return first, rates["warm"], rates["local"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=float, default=64e6, help="train tokens in the synthetic cache (default 64e6)")
    ap.add_argument("--shard-mb", type=int, default=32, help="shard size in MB (default 32)")
    ap.add_argument("--B", type=int, default=32, help="batch rows (default 32)")
    ap.add_argument("--T", type=int, default=1024, help="window length (default 1024)")
    ap.add_argument("--batches", type=int, default=500, help="batches per timed run (default 500)")
    ap.add_argument("--repeat", type=int, default=5, help="timed runs, best kept (default 5)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench_remote_") as tmp:
        tmp = Path(tmp)
        cache = write_synthetic_pretrain_cache(tmp / "cache", int(args.tokens), shard_bytes=args.shard_mb << 20)
        local_ds = PretrainTokenStreamDataset(str(cache / "train"), T=args.T, device="cpu")
        want = run_batches(local_ds, args.B, args.batches)
        rows = []
        with moto_s3():
            import s3fs

            s3fs.S3FileSystem(anon=False).mkdir("bench")
            upload_tree(cache, "s3://bench/cache")
            first, warm, local = measure("s3://bench/cache", local_ds, args, tmp / "dl-s3", want)
            rows.append(["s3 (moto server)", local, first, first / local, warm, warm / local])
        with http_server(tmp) as base:
            first, warm, local = measure(f"{base}/cache", local_ds, args, tmp / "dl-http", want)
            rows.append(["http (http.server)", local, first, first / local, warm, warm / local])
        shards = len(list((cache / "train").glob("shard_*.bin")))
        print(table(f"random windows B={args.B} T={args.T}, {args.tokens / 1e6:.0f}M tokens in {shards} shards of "
                    f"{args.shard_mb} MiB; batches/s, best of {args.repeat} x {args.batches} timed in turns",
                    ["store", "local b/s", "first epoch b/s", "x local", "warm b/s", "x local"], rows))


if __name__ == "__main__":
    main()
