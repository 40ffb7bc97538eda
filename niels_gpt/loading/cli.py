"""`download`: fetch numbered Parquet text shards (niels_gpt.loading.download).

    niels-gpt-data download --out-dir data/fineweb -n 8 -w 4
"""

from __future__ import annotations

import argparse
import sys

from niels_gpt.args import hidden_alias
from niels_gpt.errors import StorageError
from niels_gpt.loading import download as dl
from niels_gpt.storage.settings import network_timeout_s

OUT_DIR = "data/parquet"
NUM_FILES = 8


def register(subparsers) -> None:
    p = subparsers.add_parser("download")
    p.add_argument("--base-url", default=dl.BASE_URL, help="URL of the folder holding the shards")
    p.add_argument("--out-dir", default=OUT_DIR, help="local folder for the shards")
    p.add_argument("-n", "--num-files", type=int, default=NUM_FILES, help="number of shards")
    p.add_argument("--first", type=int, default=0, help="index of the first shard")
    workers = p.add_argument("-w", "--workers", dest="num_workers", type=int, default=dl.NUM_WORKERS,
                             help="parallel downloads")
    hidden_alias(p, "--num-workers", workers)
    p.add_argument("--max-attempts", type=int, default=dl.MAX_ATTEMPTS, help="tries per shard")
    p.add_argument("--backoff", type=float, default=dl.BACKOFF_S, help="seconds before the 2nd try, doubling after")
    # NOTE: the earlier spelling of --network-timeout (added to every command), the one time limit
    p.add_argument("--timeout", dest="network_timeout_after", type=float, default=argparse.SUPPRESS,
                   help=argparse.SUPPRESS)
    p.add_argument("--filename", default=dl.FILENAME, help="shard name pattern ({index} is the number)")
    p.set_defaults(func=run_download)


def run_download(args) -> int:
    indices = range(args.first, args.first + args.num_files)
    print(f"download: {len(indices)} shard(s) {args.filename.format(index=args.first)}.. from {args.base_url} "
          f"to {args.out_dir} with {args.num_workers} workers, {args.max_attempts} attempts, "
          f"backoff {args.backoff}s, network time limit {network_timeout_s():g}s", file=sys.stderr)
    results = dl.download_shards(args.base_url, args.out_dir, indices, num_workers=args.num_workers,
                                 max_attempts=args.max_attempts, backoff_s=args.backoff, filename=args.filename)
    counts = {s: sum(r.status == s for r in results) for s in ("downloaded", "skipped", "failed")}
    failed = [r for r in results if r.status == "failed"]
    for r in failed[1:]:
        print(f"failed: {r.error}", file=sys.stderr)
    print(f"download: {counts['downloaded']} downloaded, {counts['skipped']} already complete, "
          f"{counts['failed']} failed -> {args.out_dir}", file=sys.stderr)
    if failed:
        more = f" ({len(failed) - 1} more above)" if len(failed) > 1 else ""
        raise StorageError(f"{failed[0].error}{more}; the complete shards are kept: the same command fetches "
                           "the rest")
    return 0
